//! The vocabulary, with no I/O: names shared by every layer (event types, verdicts, restart reasons),
//! resources and how users name them, causes and diffs, Kopf's annotation keys and finalizer, the
//! served namespaces, settings, the pause switch, how daemons are told to stop, object hierarchies,
//! status conditions, and what triggers reconcile handlers.

pub mod causes;
pub mod conditions;
pub mod diffs;
pub mod finalizers;
pub mod hierarchies;
pub mod keys;
pub mod lifecycles;
pub mod logging;
pub mod names;
pub mod namespaces;
pub mod pausing;
pub mod resources;
pub mod settings;
pub mod sharding;
pub mod stopping;
pub mod triggers;
