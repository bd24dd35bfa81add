//! What users ask for: the handlers and their registry, their filters and options, daemons and timers,
//! and the context a handler is given (`Ctx`).

pub mod admission;
pub mod context;
pub mod daemons;
pub mod filters;
pub mod handlers;
pub mod indexes;
pub mod reconcile;
pub mod subhandlers;
