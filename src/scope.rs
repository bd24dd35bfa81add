//! Which namespaces an operator serves: one notion for the builder, the command line and `rbac`,
//! decided once ([`Scope::served`]) the same way for what the operator watches, what it peers
//! through, and what `rbac` grants.

use kactor_reactor::namespaces::{NamespacePatterns, PatternError};

/// Which namespaces the operator serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// All namespaces, with cluster-wide list and watch requests (`-A`, or no option at all).
    ClusterWide,
    /// The namespaces matching these patterns, one string per `-n` option, each possibly a
    /// comma-separated list of globs and negations (Kopf's syntax), matched against the namespaces
    /// that exist, which the operator then watches one by one.
    Namespaces(Vec<String>),
}

/// How a scope is served.
#[derive(Debug, Clone)]
pub(crate) enum Served {
    /// All namespaces, with cluster-wide requests.
    ClusterWide,
    /// Exactly these namespaces (`-n` with plain names, each once, in the order given): watched one
    /// by one, with no need to follow the namespaces.
    Fixed(Vec<String>),
    /// The namespaces matching patterns with globs or negations, known only at run time: followed
    /// as they come and go.
    Patterns {
        /// The patterns.
        patterns: NamespacePatterns,
        /// As given, for messages.
        given: Vec<String>,
    },
}

impl Scope {
    /// How this scope is served; an error for a pattern that is not valid.
    pub(crate) fn served(&self) -> Result<Served, PatternError> {
        let Scope::Namespaces(given) = self else {
            return Ok(Served::ClusterWide);
        };
        let patterns = NamespacePatterns::parse(given)?;
        Ok(match patterns.exact_names() {
            Some(names) => {
                let mut seen = std::collections::HashSet::new();
                Served::Fixed(
                    names
                        .into_iter()
                        .filter(|n| seen.insert(n.clone()))
                        .collect(),
                )
            }
            None => Served::Patterns {
                patterns,
                given: given.clone(),
            },
        })
    }
}
