//! kactor: Kubernetes operators in Rust, with Kopf's ergonomics on an actor model.
//!
//! This is the public face of the framework. Today it carries the embedded Kubernetes API emulator
//! ([`emulator`]), which every test, benchmark and demo runs against; the operator builder, the
//! handlers and the actors arrive crate by crate (see `design.md`).
//!
//! Start with [`emulator::Emulator`].

/// The in-memory Kubernetes API server (re-exported from `kactor-emulator`).
#[cfg(feature = "emulator")]
pub use kactor_emulator as emulator;
