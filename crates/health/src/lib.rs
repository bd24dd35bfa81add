//! kactor's health: liveness and readiness checks that tell the truth, and Prometheus metrics.
//!
//! Kopf's most reported failure is the "deaf" operator: its watch streams silently stopped while its
//! liveness probe, which only proves that a reporter task runs, looks fine. Here `/healthz` fails
//! when the operator cannot do its work, so that the kubelet restarts it. Kopf has no metrics; ours
//! mirror controller-runtime's.
//!
//! It is not for: running the operator or deciding what it watches (the root crate wires this
//! crate in), or pushing metrics anywhere (they are scraped).
//!
//! Start with [`HealthState`] (what the checks read), [`HealthServer`] (where they are served) and
//! [`Metrics`] (the [`Observer`](kactor_reactor::observe::Observer) behind `/metrics`).
//!
//! # Liveness checks (`/healthz`), in order
//!
//! | Check | Fails when | Threshold (`settings.health`) |
//! |-------|-----------|-----------|
//! | `watches` | a stream that is not paused showed no event, bookmark or answer | `silent_watch_timeout` (120 s), and at least `watching.inactivity_timeout` plus a margin for the reconnect (10 s, or the inactivity timeout when shorter) |
//! | `actors` | the actors' thread did not beat (the [`HealthActor`]) | `heartbeat_timeout` (10 s) |
//! | `executor` | the operator's runtime ran no heartbeat task, or one worker thread was stuck in one poll | `heartbeat_timeout` (10 s) |
//! | `probes` | a probe handler failed, panicked or timed out; its results are reused | `probe_timeout` (10 s), `probe_cache` (10 s, as in Kopf) |
//! | the user's | [`HealthState::add_liveness_check`] | |
//!
//! # Readiness checks (`/readyz`), in order
//!
//! `startup` (the startup activities succeeded: [`HealthState::startup_done`]), `listing` (every
//! stream that is not paused has listed its objects once), then the user's
//! ([`HealthState::add_readiness_check`]).
//!
//! # Routes
//!
//! GET and HEAD; other methods get 405, unknown paths 404.
//!
//! * The `--liveness` path and `/healthz`: 200 with Kopf's probe JSON (`{"<probe id>": <result>}`);
//!   500 with controller-runtime's text (`[+]watches ok`, `[-]actors failed: <why>`, ...,
//!   `healthz check failed`). `?verbose` gives that text on success too; `?exclude=<check>`
//!   (repeatable) skips checks; `/healthz/<check>` runs one check (`ok`, or its failure).
//! * `/readyz`, `/readyz/<check>`: the same for readiness; the success body is `ok`.
//! * `/metrics`: Prometheus's text format, rendered at most once per `metrics_cache` (1 s).
//!
//! # Metrics
//!
//! `kactor_events_received_total{resource}`, `kactor_watch_restarts_total{resource,reason}`,
//! `kactor_handler_runs_total{resource,handler,result}`,
//! `kactor_handler_duration_seconds{resource,handler}` (controller-runtime's buckets),
//! `kactor_handler_retries_total{resource,handler}`, `kactor_active_handlers`,
//! `kactor_object_workers{resource}`, `kactor_coalesced_events_total{resource}`,
//! `kactor_daemons_running{resource}`, `kactor_timers_running{resource}`,
//! `kactor_timer_lateness_seconds{resource}`, `kactor_operator_paused`,
//! `leader_election_master_status{name}` (controller-runtime's), `kactor_api_requests_total{verb,code}`,
//! `kactor_api_request_duration_seconds{verb}`, and the process's own `process_*` (on Linux).

pub mod actor;
pub mod checks;
mod executor;
mod format;
pub mod metrics;
mod probes;
pub mod server;

pub use actor::{HealthActor, Ping};
pub use checks::{Check, CheckError, HealthState, Outcome, Report};
pub use metrics::Metrics;
pub use server::HealthServer;
