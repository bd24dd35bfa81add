//! The layers hold: no module of any crate of the workspace depends, through others, on itself.
//!
//! A module's dependencies are the `crate::<module>` paths in its code (comments and its test module
//! left out); a cycle among them is printed with its members. A folder of modules counts as one
//! module at its crate's top level (a layer, as the reactor's `structs/` ... `actions/`), and its own
//! modules are checked among themselves (`crate::<folder>::<module>` and `super::<module>`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The source folders of the workspace's crates.
fn crates() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut folders = vec![root.join("src")];
    let members = std::fs::read_dir(root.join("crates")).expect("the crates folder");
    for member in members.flatten() {
        let src = member.path().join("src");
        if src.is_dir() {
            folders.push(src);
        }
    }
    folders.sort();
    folders
}

/// Each module of a folder (`name.rs`, or `name/` with its files) and the modules of the same
/// folder its code names: by `path` (`crate::` for a crate's top level, `crate::structs::` for the
/// folder `structs/`), or by `super::` from inside the folder.
fn graph(folder: &Path, path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(folder)
        .expect("a source folder")
        .flatten()
    {
        let file = entry.path();
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        if name == "lib" || name == "main" || name == "mod" {
            continue;
        }
        let text = texts.entry(name).or_default();
        if file.is_dir() {
            for file in walk(&file) {
                text.push_str(&code_of(&file));
            }
        } else if file.extension().is_some_and(|e| e == "rs") {
            text.push_str(&code_of(&file));
        }
    }
    let names: BTreeSet<String> = texts.keys().cloned().collect();
    let prefixes: Vec<&str> = if path == "crate::" {
        vec![path]
    } else {
        vec![path, "super::"]
    };
    texts
        .iter()
        .map(|(module, text)| {
            let uses = prefixes
                .iter()
                .flat_map(|prefix| {
                    text.match_indices(prefix)
                        .map(move |(at, _)| at + prefix.len())
                })
                .filter_map(|at| {
                    let rest = &text[at..];
                    let end = rest
                        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let name = &rest[..end];
                    (name != module && names.contains(name)).then(|| name.to_string())
                })
                .collect();
            (module.clone(), uses)
        })
        .collect()
}

/// Every folder of modules in a crate's source folder, with the path its modules are named by.
fn folders(src: &Path) -> Vec<(PathBuf, String)> {
    let mut found = vec![(src.to_path_buf(), "crate::".to_string())];
    let mut at = 0;
    while at < found.len() {
        let (folder, path) = found[at].clone();
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let sub = entry.path();
            if sub.is_dir() {
                let name = sub
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                found.push((sub, format!("{path}{name}::")));
            }
        }
        at += 1;
    }
    found
}

fn walk(folder: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// A file's code: without comments, and without its test module (tests may use anything).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a source file");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, module: &'a str) {
            let n = self.index.len();
            self.index.insert(module, n);
            self.low.insert(module, n);
            self.stack.push(module);
            for next in &self.graph[module] {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[module].min(self.low[next]);
                    self.low.insert(module, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[module].min(self.index[next]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    component.push(member.to_string());
                    if member == module {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for module in graph.keys() {
        if !search.index.contains_key(module.as_str()) {
            search.visit(module);
        }
    }
    search.found
}

#[test]
fn no_crate_has_an_import_cycle_among_its_modules() {
    let mut found = Vec::new();
    for src in crates() {
        // The crate's top level (a folder of modules counts as one: a layer), then each folder's
        // own modules.
        for (folder, path) in folders(&src) {
            for cycle in cycles(&graph(&folder, &path)) {
                found.push(format!("{}: {}", folder.display(), cycle.join(", ")));
            }
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn a_cycle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, uses)| (m.to_string(), uses.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(cycles(&graph), [["a", "b", "c"]]);
}
