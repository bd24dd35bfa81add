//! Talking to the API server and telling observers: retried requests, discovery, the metered client,
//! patches, Kubernetes Events, the watch stream of one resource, and the observer hooks.

pub mod api;
pub mod cache;
pub mod discovery;
pub mod metered;
pub mod observe;
pub mod patches;
pub mod posting;
pub mod slim;
pub mod watching;
