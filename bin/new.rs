//! `kactor new NAME`: a ready operator crate, from the templates in `templates/new/`.
//!
//! It builds and its test passes right after generation, with no edit: a typed CRD with a status,
//! create/update/delete handlers (or, with `--actor`, an actor per object), a test against the
//! embedded API server, a Dockerfile and a README with its two commands. The dependency on kactor
//! is a path to the checkout this `kactor` was built from (or `--kactor-path`), and the crate starts
//! from kactor's own `Cargo.lock`, so that it builds with the versions kactor is tested with.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// The options of `kactor new`.
#[derive(clap::Args)]
pub struct NewArgs {
    /// The operator's name: the crate, the program, its Deployment and service account
    /// (lowercase letters, digits and `-`, a letter first, at most 55 characters).
    name: String,
    /// Where to write it (default: ./NAME); it must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    path: Option<PathBuf>,
    /// The kind of its custom resource (default: from the name, `shop-operator` gives `Shop`).
    #[arg(long, value_name = "KIND")]
    kind: Option<String>,
    /// The API group of its custom resource.
    #[arg(long, value_name = "GROUP", default_value = "example.com")]
    group: String,
    /// Write the operator as an actor per object (`ObjectActor`) instead of closure handlers.
    #[arg(long)]
    actor: bool,
    /// The kactor checkout to depend on (default: the one this program was built from).
    #[arg(long, value_name = "PATH")]
    kactor_path: Option<PathBuf>,
}

/// A file of the new crate: its path, and its template.
const FILES: [(&str, &str); 7] = [
    ("Cargo.toml", include_str!("../templates/new/Cargo.toml")),
    (".gitignore", include_str!("../templates/new/.gitignore")),
    ("README.md", include_str!("../templates/new/README.md")),
    ("Dockerfile", include_str!("../templates/new/Dockerfile")),
    ("src/main.rs", include_str!("../templates/new/src/main.rs")),
    ("src/lib.rs", include_str!("../templates/new/src/lib.rs")),
    (
        "tests/operator.rs",
        include_str!("../templates/new/tests/operator.rs"),
    ),
];
const HANDLERS: &str = include_str!("../templates/new/handlers.rs.in");
const ACTOR: &str = include_str!("../templates/new/actor.rs.in");
/// kactor's own lock file: the new crate starts from the versions kactor is tested with.
const LOCK: &str = include_str!("../Cargo.lock");

/// Writes the crate and says what to do next.
pub fn run(args: &NewArgs) -> anyhow::Result<()> {
    let values = Values::new(args)?;
    let dir = args
        .path
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} exists and is not empty: choose another --path",
                dir.display()
            );
        }
    }
    for (path, template) in FILES {
        write(&dir.join(path), &values.fill(template))?;
    }
    write(&dir.join("Cargo.lock"), LOCK)?;
    println!(
        "Created the operator `{}` in {}: a {} ({}/v1) with {}.\n\nNext:\n  cd {}\n  cargo run -- --emulator     # try it without a cluster\n  cargo test                  # its test, on the embedded API server",
        args.name,
        dir.display(),
        values.kind,
        values.group,
        if args.actor {
            "an actor per object"
        } else {
            "create, update and delete handlers"
        },
        dir.display()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// What the templates' `{{...}}` become.
struct Values {
    name: String,
    kind: String,
    group: String,
    actor: bool,
    kactor: PathBuf,
}

impl Values {
    fn new(args: &NewArgs) -> anyhow::Result<Values> {
        let name = &args.name;
        // It names the crate and the program, and what `manifests` makes for it.
        kactor::deploy::check_operator_name(name)
            .map_err(|reason| anyhow::anyhow!("cannot name an operator: {reason}"))?;
        let kind = match &args.kind {
            Some(kind) => kind.clone(),
            None => kind_from(name),
        };
        if !(kind.starts_with(|c: char| c.is_ascii_uppercase())
            && kind.chars().all(|c| c.is_ascii_alphanumeric()))
        {
            bail!("--kind {kind:?} is not a Kubernetes kind: letters and digits, a capital first (`Widget`)");
        }
        let group = args.group.clone();
        let valid_group = group.contains('.')
            && group.split('.').all(|label| {
                !label.is_empty()
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            });
        if !valid_group {
            bail!("--group {group:?} is not an API group: a domain with at least one dot (`example.com`)");
        }
        let kactor = match &args.kactor_path {
            Some(path) => path.clone(),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        };
        if !kactor.join("Cargo.toml").is_file() {
            bail!(
                "no kactor checkout at {}: give one with --kactor-path",
                kactor.display()
            );
        }
        let kactor = kactor
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", kactor.display()))?;
        Ok(Values {
            name: name.clone(),
            kind,
            group,
            actor: args.actor,
            kactor,
        })
    }

    /// The template with every `{{...}}` filled.
    fn fill(&self, template: &str) -> String {
        let lower = self.kind.to_lowercase();
        let (operator, imports, create, update) = if self.actor {
            (
                ACTOR,
                "use kactor::actors::{ActorCtx, ActorOptions, ActorRef, ObjectActor};\nuse serde_json::Value;\n",
                format!("{lower}/create"),
                format!("{lower}/update"),
            )
        } else {
            (HANDLERS, "", "create".to_string(), "update".to_string())
        };
        let dependency = format!(
            "kactor = {{ path = {:?} }}",
            self.kactor.display().to_string()
        );
        let text = template
            .replace("{{operator}}", operator)
            .replace("{{imports}}", imports)
            .replace("{{kactor_dependency}}", &dependency)
            .replace("{{create_id}}", &create)
            .replace("{{update_id}}", &update)
            .replace("{{name}}", &self.name)
            .replace("{{crate}}", &self.name.replace('-', "_"))
            .replace("{{Kind}}", &self.kind)
            .replace("{{kind}}", &lower)
            .replace("{{group}}", &self.group);
        debug_assert!(!text.contains("{{"), "a placeholder is left in:\n{text}");
        text
    }
}

/// `shop-operator` gives `Shop`, `memcached` `Memcached`, `cache-controller` `Cache`; a name that is
/// only a suffix gives `Widget`.
fn kind_from(name: &str) -> String {
    let stem = ["-operator", "-controller"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    let kind: String = stem
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or(String::new(), |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    if kind.starts_with(|c: char| c.is_ascii_uppercase())
        && !matches!(stem, "operator" | "controller")
    {
        kind
    } else {
        "Widget".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_names() {
        for (name, kind) in [
            ("shop-operator", "Shop"),
            ("memcached", "Memcached"),
            ("cache-controller", "Cache"),
            ("my-db-operator", "MyDb"),
            ("operator", "Widget"),
        ] {
            assert_eq!(kind_from(name), kind, "{name}");
        }
    }
}
