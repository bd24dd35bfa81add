//! Which namespaces an operator serves: one notion for the builder, the command line and `rbac`.

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
