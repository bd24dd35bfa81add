//! kactor's domain, with no actors in it: what the cluster serves and how users name it
//! ([`resources`], `discovery`), which namespaces are served (`namespaces`), the handlers and their
//! contexts ([`handlers`]), the settings ([`settings`]), and the watch stream of one resource in one
//! namespace ([`watching`]), which turns list and watch requests into an ordered stream of events.
//!
//! It is not for: running anything concurrently (that is `kactor-actors`), or parsing arguments.
//!
//! Start with [`watching::Watcher`] and [`handlers::Registry`].

// The layers, from the bottom up: a layer's modules use those of the layers below it and of their
// own, never those above (`tests/layers.rs` at the workspace's root checks it).
pub mod actions;
pub mod clients;
pub mod intents;
pub mod storage;
pub mod structs;

// Each module by its own name too, as the other crates name them.
pub use actions::{execution, processing};
pub use clients::{api, cache, discovery, metered, observe, patches, posting, slim, watching};
pub use intents::{
    admission, context, daemons, filters, handlers, indexes, reconcile, subhandlers,
};
pub use storage::{diffbase, progress, progression};
pub use structs::{
    causes, conditions, diffs, finalizers, hierarchies, keys, lifecycles, logging, names,
    namespaces, pausing, resources, settings, sharding, stopping, triggers,
};
