//! The command line, carried out: [`Operator::run_from_args`] parses it and runs the operator or one
//! of the manifest commands ([`Manifests::execute`]: `rbac generate`, `rbac verify`, `crds`,
//! `manifests`, `olm bundle`). The top
//! of the crate: it knows the command line ([`crate::cli`]), the operator and `rbac`, which know
//! nothing of it.

use std::io::{Read, Write};

use kactor_peering::lease::LeaseSettings;
use kactor_peering::sharding::RingSettings;

use crate::cli::{Command, Manifests, OlmCommand, OperatorCli, RbacCommand};
use crate::error::{Error, Result};
use crate::operator::Operator;

impl Operator {
    /// Parses the command line and does what it says: `run` (the default subcommand; see
    /// [`crate::cli::RunArgs`] for every option and its `KACTOR_...` environment variable) sets up
    /// logging and runs until SIGINT or SIGTERM; `rbac generate`, `rbac verify`, `crds` and `manifests`
    /// print what the operator needs in a cluster, and `olm bundle` writes it as an OLM bundle
    /// ([`crate::cli::Manifests`]). A usage error prints clap's
    /// message and exits with status 2, as command lines do; `rbac verify` returns an error (exit
    /// status 1 from `main`) when a permission is missing.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// # async fn example() -> kactor::Result<()> {
    /// Operator::new().on_event("pods", "log", |ctx: Ctx| async move { Ok(()) }).run_from_args().await
    /// # }
    /// ```
    pub async fn run_from_args(self) -> Result<()> {
        let cli = OperatorCli::parse_from(std::env::args_os()).unwrap_or_else(|error| error.exit());
        let args = match cli.command() {
            Command::Run(args) => args,
            Command::Manifests(manifests) => {
                return manifests
                    .execute(
                        &self,
                        &mut std::io::stdin(),
                        &mut std::io::stdout(),
                        &mut std::io::stderr(),
                    )
                    .await;
            }
        };
        match crate::logging::init(&args.log_settings()) {
            Ok(()) | Err(crate::logging::LoggingError::AlreadyInitialized) => {}
            Err(error) => return Err(error.into()),
        }
        if let Some(warning) = args.scope_warning() {
            tracing::warn!("{warning}");
        }
        if args.emulator {
            return self
                .with_args(&args)
                .run_on_emulator(args.emulator_state.as_deref())
                .await;
        }
        self.with_args(&args).run().await
    }

    /// `--emulator` in a build without kactor's `emulator` feature: a clear error.
    #[cfg(not(feature = "emulator"))]
    async fn run_on_emulator(self, _state: Option<&std::path::Path>) -> Result<()> {
        Err(Error::Emulator(
            "this program was built without kactor's `emulator` feature (default-features = false); \
             build it with the feature, or run it against a cluster"
                .to_string(),
        ))
    }

    /// `--emulator`: runs on kactor's embedded API server, with the operator's CRDs installed, a
    /// kubeconfig for kubectl, health on a free port (or `--liveness`) and, with
    /// `--emulator-state FILE`, what was created kept across restarts; until SIGINT or SIGTERM.
    #[cfg(feature = "emulator")]
    async fn run_on_emulator(self, state: Option<&std::path::Path>) -> Result<()> {
        let program = crate::cli::program_name().unwrap_or_else(|| crate::cli::DEFAULT_NAME.into());
        let (operator, emulated) = self.on_emulator(state).await?;
        println!("{program} on kactor's embedded Kubernetes API server (--emulator), in memory:");
        println!("{}", emulated.summary());
        println!("Ctrl-C to stop.");
        let result = operator.run().await;
        let closed = emulated.close().await;
        result.and(closed)
    }

    /// Applies the options of `run` (scope, peering, priority, object threads, leader election,
    /// liveness), as [`run_from_args`](Self::run_from_args) does, for a program that parses its own
    /// command line with [`RunArgs`](crate::cli::RunArgs) flattened into it. Logging is the
    /// program's to set up.
    pub fn with_args(self, args: &crate::cli::RunArgs) -> Self {
        let mut operator = self.scope(args.scope());
        if args.standalone {
            operator = operator.standalone();
        } else if let Some(name) = &args.peering {
            operator = operator.peering(name);
        }
        if args.create_peering {
            operator = operator.peering_settings(|peering| peering.create_missing = true);
        }
        operator = operator.priority(if args.dev { 666 } else { args.priority });
        if let Some(threads) = args.object_threads {
            operator = operator.settings(|settings| settings.execution.object_threads = threads);
        }
        if let Some(url) = &args.liveness {
            operator = operator.liveness(url);
        }
        if operator.identity.is_none() {
            // One identity for the process, shared by peering and the lease (Kopf's, by default).
            operator = operator.identity(&kactor_peering::peering::identity());
        }
        if args.leader_election {
            // The same default name as `rbac generate`'s, so the generated RBAC grants this Lease.
            let identity = operator
                .identity
                .clone()
                .unwrap_or_else(kactor_peering::peering::identity);
            operator = operator.leader_election(LeaseSettings::new(
                args.lease_name_or_default(),
                args.lease_namespace_or_default(),
                identity,
            ));
        }
        if let Some(ring) = args.ring() {
            let identity = operator
                .identity
                .clone()
                .unwrap_or_else(kactor_peering::peering::identity);
            let member = kactor_reactor::sharding::member_name(&identity);
            operator = operator.shards(RingSettings::new(
                ring,
                args.lease_namespace_or_default(),
                member,
            ));
        }
        operator
    }
}

impl Manifests {
    /// Carries out the command for `operator`, as [`Operator::run_from_args`] does with the process's
    /// stdin, stdout and stderr:
    /// * `rbac generate` writes the manifests to `-o FILE`, or to `output`;
    /// * `rbac verify` reads the manifests from `-f FILE`, or from `input` (no `-f`, or `-f -`),
    ///   writes a line per needed permission to `output`, and returns [`RbacError::Missing`] when one
    ///   is missing (so that `main` exits with status 1);
    /// * `crds` writes the CRDs declared with [`Operator::crd`] to `output` as YAML documents, or
    ///   says on `messages` that there are none;
    /// * `manifests` writes everything the operator needs in a cluster ([`crate::deploy`]) to `-o FILE`,
    ///   or to `output`;
    /// * `olm bundle` writes an OLM bundle ([`crate::olm`]) into `--output-dir`, and says on
    ///   `messages` what it wrote.
    ///
    /// ```no_run
    /// # async fn example() -> kactor::Result<()> {
    /// use kactor::cli::{Command, OperatorCli};
    /// use kactor::prelude::*;
    ///
    /// let operator = Operator::new().on_create(("example.com", "v1", "widgets"), "create_fn", |_: Ctx| async { Ok(()) });
    /// let cli = OperatorCli::parse_from(["my-operator", "rbac", "verify", "-A", "-f", "rbac.yaml"]).unwrap();
    /// if let Command::Manifests(command) = cli.command() {
    ///     command.execute(&operator, &mut std::io::stdin(), &mut std::io::stdout(), &mut std::io::stderr()).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`RbacError::Missing`]: crate::rbac::RbacError::Missing
    pub async fn execute(
        &self,
        operator: &Operator,
        input: &mut (dyn Read + Send),
        output: &mut (dyn Write + Send),
        messages: &mut (dyn Write + Send),
    ) -> crate::Result<()> {
        match self {
            Manifests::Rbac(RbacCommand::Generate(args)) => {
                let yaml = crate::rbac::generate(operator, &args.rbac).await?;
                write_to(
                    args.output.as_deref(),
                    "RBAC manifests",
                    output,
                    messages,
                    &yaml,
                )
            }
            Manifests::Rbac(RbacCommand::Verify(args)) => {
                let (what, manifests) = match &args.file {
                    Some(path) if path.as_os_str() != "-" => {
                        let what = path.display().to_string();
                        let text = std::fs::read_to_string(path).map_err(|e| Error::Input {
                            what: what.clone(),
                            reason: e.to_string(),
                        })?;
                        (what, text)
                    }
                    _ => {
                        let mut text = String::new();
                        input.read_to_string(&mut text).map_err(|e| Error::Input {
                            what: "stdin".to_string(),
                            reason: e.to_string(),
                        })?;
                        ("stdin".to_string(), text)
                    }
                };
                let verification = crate::rbac::verify(operator, &args.rbac, &manifests)
                    .await
                    .map_err(|error| match error {
                        Error::Rbac(crate::rbac::RbacError::Manifests(reason)) => Error::Input {
                            what,
                            reason: format!("not RBAC manifests ({reason})"),
                        },
                        other => other,
                    })?;
                write_all(output, "stdout", format!("{verification}\n").as_bytes())?;
                verification.into_result().map(|_| ())
            }
            Manifests::All(args) => {
                let yaml = crate::deploy::manifests(operator, args).await?;
                write_to(args.output.as_deref(), "manifests", output, messages, &yaml)
            }
            Manifests::Olm(OlmCommand::Bundle(args)) => {
                let bundle = crate::olm::bundle(operator, args).await?;
                let written = bundle.write(&args.output_dir)?;
                let csv = bundle.csv();
                let modes: Vec<&str> = csv["spec"]["installModes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|mode| mode["supported"] == true)
                    .filter_map(|mode| mode["type"].as_str())
                    .collect();
                let _ = writeln!(
                    messages,
                    "wrote the OLM bundle of {} (install modes: {}) to {}:",
                    csv["metadata"]["name"].as_str().unwrap_or_default(),
                    modes.join(", "),
                    args.output_dir.display()
                );
                for path in written {
                    let _ = writeln!(messages, "  {}", path.display());
                }
                Ok(())
            }
            Manifests::Crds => {
                let crds = operator.blueprint().crds;
                if crds.is_empty() {
                    let _ = writeln!(
                        messages,
                        "this operator declares no CRDs (declare them with Operator::crd)"
                    );
                    return Ok(());
                }
                let yaml = serde_saphyr::to_string_multiple(crds).map_err(|e| Error::Output {
                    what: "the CRDs as YAML".to_string(),
                    reason: e.to_string(),
                })?;
                write_all(output, "stdout", yaml.as_bytes())
            }
        }
    }
}

/// Writes manifests to `path` (saying so on `messages`), or to `output` when there is none.
fn write_to(
    path: Option<&std::path::Path>,
    what: &str,
    output: &mut (dyn Write + Send),
    messages: &mut (dyn Write + Send),
    yaml: &str,
) -> crate::Result<()> {
    match path {
        Some(path) => {
            std::fs::write(path, yaml).map_err(|e| Error::Output {
                what: path.display().to_string(),
                reason: e.to_string(),
            })?;
            let _ = writeln!(messages, "wrote the {what} to {}", path.display());
            Ok(())
        }
        None => write_all(output, "stdout", yaml.as_bytes()),
    }
}

fn write_all(output: &mut (dyn Write + Send), what: &str, bytes: &[u8]) -> crate::Result<()> {
    output
        .write_all(bytes)
        .and_then(|()| output.flush())
        .map_err(|e| Error::Output {
            what: what.to_string(),
            reason: e.to_string(),
        })
}
