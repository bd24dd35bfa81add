//! The layers hold: no module of any crate of the workspace depends, through others, on itself.
//!
//! A module's dependencies are the `crate::<module>` paths in its code (comments and its test module
//! left out); a cycle among them is printed with its members.

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

/// Each top-level module of a crate (`name.rs`, or `name/` with its files) and the modules of the
/// same crate its code names.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("a source folder").flatten() {
        let path = entry.path();
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        if name == "lib" || name == "main" {
            continue;
        }
        let text = texts.entry(name).or_default();
        if path.is_dir() {
            for file in walk(&path) {
                text.push_str(&code_of(&file));
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&code_of(&path));
        }
    }
    let names: BTreeSet<String> = texts.keys().cloned().collect();
    texts
        .iter()
        .map(|(module, text)| {
            let uses = text
                .match_indices("crate::")
                .filter_map(|(at, _)| {
                    let rest = &text[at + "crate::".len()..];
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
        for cycle in cycles(&graph(&src)) {
            found.push(format!("{}: {}", src.display(), cycle.join(", ")));
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
