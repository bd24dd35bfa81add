//! kactor's actors: a [`supervisor::ResourceSupervisor`] per watched (resource, namespace) and an
//! [`worker::ObjectWorker`] per object, on a dedicated actor thread ([`system::ActorSystem`]), with
//! every handler running as a task on the operator's own runtime ([`tracker::Tracker`] follows them).
//!
//! It is not for: deciding what to watch (the operator in the root crate does that), or the domain
//! rules (`kactor-reactor`).
//!
//! Start with [`supervisor::ResourceSupervisor`] and [`worker::ObjectWorker`]; the users' own
//! actors of objects are in [`objects`].

pub mod daemons;
mod keys;
pub mod memory;
pub mod objects;
pub mod phase;
pub mod related;
pub mod supervisor;
pub mod system;
pub mod tracker;
pub mod worker;
