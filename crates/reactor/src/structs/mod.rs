//! The vocabulary, with no I/O: names shared by every layer (event types, verdicts, restart reasons),
//! resources and how users name them, causes and diffs, Kopf's annotation keys and finalizer, the
//! served namespaces, settings, the pause switch, and how daemons are told to stop.

pub mod causes;
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
pub mod stopping;
