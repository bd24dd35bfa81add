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
pub mod deploy;
#[cfg(feature = "emulator")]
pub mod emulated;
mod error;
mod liveness;
pub mod logging;
pub mod olm;
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
    pub use kactor_reactor::reconcile::{Action, Predicate, Reconcile};
    pub use kactor_reactor::resources::{Resource, Selector};
    pub use kactor_reactor::settings::Settings;
    pub use kactor_reactor::watching::EventType;
    pub use serde_json::json;
}

// The domain's public face: what handlers are given and return, their options, settings and
// metrics hooks. The engine's internals (the registry's records, processing, execution, the
// patching of objects, the watch stream) stay in the workspace's crates.

/// Object actors: a type of the user's own per object, with its state, its lifecycle methods and
/// its mailbox ([`Operator::actor`], [`Operator::actors`]; `docs/actors.md`).
pub mod actors {
    pub use kactor_actors::objects::{
        ActorCtx, ActorError, ActorOptions, ActorRef, Actors, Method, ObjectActor, ObjectKey,
        DEFAULT_ASK_TIMEOUT, DEFAULT_MAILBOX,
    };
    pub use kactor_reactor::observe::MessageOutcome;
}

/// Changing causes: why a changing handler runs ([`Ctx::cause`](handlers::Ctx::cause)).
pub mod causes {
    pub use kactor_reactor::causes::{ChangingCause, Reason};
}

/// Daemons and timers: their options, and how they are told to stop.
pub mod daemons {
    pub use kactor_reactor::daemons::{
        Cancellation, Daemon, InitialDelay, SpawningKind, StopReason, StopReasons, Stopped, Timer,
    };
}

/// What changed, as handlers are given it ([`Ctx::diff`](handlers::Ctx::diff)).
pub mod diffs {
    pub use kactor_reactor::diffs::{Diff, DiffItem, DiffOp};
}

/// Object hierarchies, as Kopf's `kopf.adopt`, `label`, `append_owner_reference`,
/// `remove_owner_reference`, `harmonize_naming` and `adjust_namespace`: the children a handler makes,
/// owned by their parent, named after it, in its namespace, with its labels
/// ([`Ctx::adopt`](handlers::Ctx::adopt)).
pub mod hierarchies {
    pub use kactor_reactor::hierarchies::{
        adjust_namespace, adopt, append_owner_reference, harmonize_naming, label,
        remove_owner_reference, Adoption, HierarchyError, Owner,
    };
}

/// Status conditions, as apimachinery's `meta.SetStatusCondition`, `RemoveStatusCondition`,
/// `FindStatusCondition` and `IsStatusConditionTrue` keep them (Operator SDK's way of reporting an
/// object's state): typed on k8s-openapi's `Condition`, or as the JSON a handler reads
/// ([`Conditions`](conditions::Conditions)), validated as the API server validates them.
pub mod conditions {
    pub use kactor_reactor::conditions::{
        find_condition, is_condition_false, is_condition_present_and_equal, is_condition_true,
        is_unset, new_condition, remove_condition, set_condition, unset_time, validate_condition,
        validate_conditions, Condition, ConditionError, ConditionStatus, Conditions, Time,
        MAX_MESSAGE_LENGTH, MAX_REASON_LENGTH,
    };
}

/// In-memory indexes (Kopf's `@kopf.index`): [`Operator::index`], read with
/// [`Ctx::index`](handlers::Ctx::index).
pub mod indexes {
    pub use kactor_reactor::indexes::{Index, IndexKey, NoIndex};
}

/// Admission webhooks ([`Operator::on_validate`], [`Operator::on_mutate`]): what their handlers
/// are given and return, their options, and the webhook server's settings (`docs/admission.md`).
pub mod admission {
    pub use kactor_reactor::admission::{
        Admission, AdmissionCtx, AdmissionError, AdmissionKind, Operation,
    };
    pub use kactor_reactor::settings::{AdmissionSettings, WebhookServer};
    pub use kactor_webhooks::CONVERT_PATH;
}

/// Which objects and changes handlers are for.
pub mod filters {
    pub use kactor_reactor::filters::{MetaCheck, MetaFilter, ValueCheck, ValueFilter, WhenFn};
}

/// Handlers: what they are given ([`Ctx`](handlers::Ctx)), what they return, and their options.
pub mod handlers {
    pub use kactor_reactor::handlers::{
        ActivityCtx, Ctx, ErrorsMode, HandlerError, HandlerResult, Logger, Memo, On, Options,
    };
}

/// Reconcile handlers ([`Operator::on_reconcile`]): what they return, their options and
/// predicates, and what triggered a run (`docs/reconcile.md`).
pub mod reconcile {
    pub use kactor_reactor::reconcile::{Action, OwnerRefs, Predicate, Reconcile};
    pub use kactor_reactor::triggers::{Related, Triggers};
}

/// The shared cache that reconcile handlers read (`ctx.cache(..)`).
pub mod cache {
    pub use kactor_reactor::cache::{Cache, CacheError};
    pub use kactor_reactor::slim::Slim;
}

/// The order in which a cause's handlers run.
pub mod lifecycles {
    pub use kactor_reactor::lifecycles::Lifecycle;
}

/// Hooks for metrics: implement [`Observer`](observe::Observer) for another metrics system.
pub mod observe {
    pub use kactor_reactor::observe::{
        CacheSize, HandlerRun, MessageOutcome, NoObserver, Observer, Tee, Verdict,
    };
    pub use kactor_reactor::watching::RestartReason;
}

/// What handlers write to their object ([`Ctx::patch`](handlers::Ctx::patch)).
pub mod patches {
    pub use kactor_reactor::patches::{Patch, PatchFn};
}

/// Pausing the operator ([`Operator::pause_switch`]).
pub mod pausing {
    pub use kactor_reactor::pausing::PauseSwitch;
}

/// Kubernetes Events about objects.
pub mod posting {
    pub use kactor_reactor::posting::{Level, PostingSettings};
}

/// Sharding: replicas that share one operator's objects (`docs/sharding.md`). The labels, the fence
/// and a replica's place in the ring ([`Settings::shard`](settings::Settings::shard)).
pub mod sharding {
    pub use kactor_peering::sharding::{
        owner, Assigner, HashBy, Member, MemberState, RingError, RingSettings, RingView, Target,
        ASSIGNER_FIELD_MANAGER, MEMBER_FIELD_MANAGER, MEMBER_TOGGLE,
    };
    pub use kactor_reactor::sharding::{
        drain_label, shard_label, Shard, ShardError, Standing, DRAINING, DRAIN_LABEL_PREFIX,
        RING_LABEL, SHARD_LABEL_PREFIX,
    };
}

/// What the cluster serves, and how handlers name it.
pub mod resources {
    pub use kactor_reactor::resources::{Resource, Selector};
}

/// The operator's settings (Kopf's `settings`).
pub mod settings {
    pub use kactor_reactor::settings::{
        ActorsScheduling, Execution, Health, Networking, Persistence, Process, Queueing, Settings,
        Watching,
    };
}

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
    #[doc = include_str!("../docs/actors.md")]
    pub struct Actors;
    #[doc = include_str!("../docs/reconcile.md")]
    pub struct Reconcile;
    #[doc = include_str!("../docs/admission.md")]
    pub struct Admission;
    #[doc = include_str!("../docs/daemons-and-timers.md")]
    pub struct DaemonsAndTimers;
    #[doc = include_str!("../docs/peering-and-leader-election.md")]
    pub struct PeeringAndLeaderElection;
    #[doc = include_str!("../docs/sharding.md")]
    pub struct Sharding;
    #[doc = include_str!("../docs/comparison.md")]
    pub struct Comparison;
    #[doc = include_str!("../docs/getting-started.md")]
    pub struct GettingStarted;
    #[doc = include_str!("../docs/deployment-and-rbac.md")]
    pub struct DeploymentAndRbac;
}
