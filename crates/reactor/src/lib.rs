//! kactor's domain, with no actors in it: what the cluster serves and how users name it
//! ([`resources`], `discovery`), which namespaces are served (`namespaces`), the handlers and their
//! contexts ([`handlers`]), the settings ([`settings`]), and the watch stream of one resource in one
//! namespace ([`watching`]), which turns list and watch requests into an ordered stream of events.
//!
//! It is not for: running anything concurrently (that is `kactor-actors`), or parsing arguments.
//!
//! Start with [`watching::Watcher`] and [`handlers::Registry`].

pub mod api;
pub mod causes;
pub mod context;
pub mod daemons;
pub mod diffbase;
pub mod diffs;
pub mod discovery;
pub mod execution;
pub mod filters;
pub mod finalizers;
pub mod handlers;
pub mod keys;
pub mod lifecycles;
pub mod logging;
pub mod metered;
pub mod names;
pub mod namespaces;
pub mod observe;
pub mod patches;
pub mod pausing;
pub mod posting;
pub mod processing;
pub mod progress;
pub mod progression;
pub mod resources;
pub mod settings;
pub mod stopping;
pub mod watching;
