//! kactor: Kubernetes operators in Rust, with Kopf's ergonomics on an actor model.
//!
//! This is the public face of the framework: the [`Operator`] builder with its handlers, `run()` and
//! `run_from_args()` (the command line of every kactor operator, [`cli`]), Kopf-like logging
//! ([`logging`]), and the embedded Kubernetes API emulator ([`emulator`]) that tests, benchmarks and
//! demos run against. The domain lives in `kactor-reactor`, the actors in `kactor-actors`.
//!
//! Start with [`Operator`] and the [`prelude`].

/// The in-memory Kubernetes API server (re-exported from `kactor-emulator`).
#[cfg(feature = "emulator")]
pub use kactor_emulator as emulator;

pub mod cli;
mod command;
mod error;
mod liveness;
pub mod logging;
mod operator;
pub mod rbac;
mod scope;

pub use error::{Error, Result};
pub use operator::Operator;
pub use scope::Scope;

/// What an operator's `main` needs: `use kactor::prelude::*;`.
pub mod prelude {
    pub use crate::operator::Operator;
    pub use crate::scope::Scope;
    pub use kactor_reactor::causes::Reason;
    pub use kactor_reactor::daemons::{Daemon, StopReason, StopReasons, Stopped, Timer};
    pub use kactor_reactor::filters::{MetaFilter, ValueFilter};
    pub use kactor_reactor::handlers::{
        ActivityCtx, Ctx, ErrorsMode, HandlerError, HandlerResult, Memo, On,
    };
    pub use kactor_reactor::lifecycles::Lifecycle;
    pub use kactor_reactor::resources::{Resource, Selector};
    pub use kactor_reactor::settings::Settings;
    pub use kactor_reactor::watching::EventType;
    pub use serde_json::json;
}

pub use kactor_reactor::{
    causes, daemons, diffs, filters, handlers, lifecycles, observe, patches, pausing, posting,
    resources, settings,
};

/// Health checks, probes and Prometheus metrics (re-exported from `kactor-health`).
pub use kactor_health as health;

/// The Prometheus client kactor's metrics are made with, to register the application's own.
pub use prometheus;

/// Peering with other operators (Kopf-compatible) and Lease-based leader election.
pub use kactor_peering as peering;

/// The README's examples, compiled as doc tests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The documentation's examples (`docs/`), compiled as doc tests so that they stay true.
#[cfg(doctest)]
pub mod docs {
    #[doc = include_str!("../docs/health-and-metrics.md")]
    pub struct HealthAndMetrics;
    #[doc = include_str!("../docs/migrating-from-kopf.md")]
    pub struct MigratingFromKopf;
    #[doc = include_str!("../docs/errors-and-retries.md")]
    pub struct ErrorsAndRetries;
    #[doc = include_str!("../docs/testing.md")]
    pub struct Testing;
    #[doc = include_str!("../docs/handlers.md")]
    pub struct Handlers;
    #[doc = include_str!("../docs/daemons-and-timers.md")]
    pub struct DaemonsAndTimers;
    #[doc = include_str!("../docs/peering-and-leader-election.md")]
    pub struct PeeringAndLeaderElection;
    #[doc = include_str!("../docs/comparison.md")]
    pub struct Comparison;
    #[doc = include_str!("../docs/getting-started.md")]
    pub struct GettingStarted;
    #[doc = include_str!("../docs/deployment-and-rbac.md")]
    pub struct DeploymentAndRbac;
}
