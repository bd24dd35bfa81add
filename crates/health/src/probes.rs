//! The probe handlers (Kopf's `@kopf.on.probe`): run together on the operator's runtime, each
//! within a timeout, their results reused for a while.
//!
//! **Expected flow**: a liveness request finds the cache older than `probe_cache` (or empty), so it
//! spawns every probe on the operator's runtime, waits for all of them (each at most
//! `probe_timeout`, timed on the caller's runtime, so a blocked operator runtime still answers),
//! and keeps the combined result: `{"<probe id>": <result>, ...}` or the failures.
//!
//! **Guarantees**: concurrent requests share one run (they wait on the cache's lock); a panic or a
//! timeout is a failure of that probe, never of the health server; failures are cached like
//! successes, so a failing probe is not hammered by every kubelet request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use kactor_reactor::execution::panic_message;
use kactor_reactor::handlers::{ActivityCtx, Probe};
use serde_json::{Map, Value};
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::format::seconds;

/// The probes to run, and the last result.
#[derive(Default)]
pub(crate) struct Probes {
    /// The probes and their context, with a generation that invalidates older cached results.
    set: Mutex<Option<Registered>>,
    cache: tokio::sync::Mutex<Option<Cached>>,
}

#[derive(Clone)]
struct Registered {
    generation: u64,
    probes: Arc<[Probe]>,
    ctx: ActivityCtx,
}

struct Cached {
    generation: u64,
    at: Instant,
    result: Result<Value, String>,
}

impl Probes {
    /// Replaces the probes; the next check runs them.
    pub(crate) fn set(&self, probes: Vec<Probe>, ctx: ActivityCtx) {
        let mut set = self.registered();
        let generation = set.as_ref().map_or(1, |r| r.generation + 1);
        *set = Some(Registered {
            generation,
            probes: probes.into(),
            ctx,
        });
    }

    fn registered(&self) -> std::sync::MutexGuard<'_, Option<Registered>> {
        self.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The probes' results as Kopf's liveness JSON, fresh within `max_age`, or why they failed.
    pub(crate) async fn check(
        &self,
        runtime: &Handle,
        timeout: Duration,
        max_age: Duration,
    ) -> Result<Value, String> {
        let generation = match self.registered().as_ref() {
            Some(registered) if !registered.probes.is_empty() => registered.generation,
            _ => return Ok(Value::Object(Map::new())),
        };
        let mut cache = self.cache.lock().await;
        if let Some(cached) = cache.as_ref() {
            if cached.generation == generation && cached.at.elapsed() < max_age {
                return cached.result.clone();
            }
        }
        // Read again: the probes may have been replaced while this waited for the cache.
        let Some(registered) = self.registered().clone() else {
            return Ok(Value::Object(Map::new()));
        };
        let result = run(&registered, runtime, timeout).await;
        *cache = Some(Cached {
            generation: registered.generation,
            at: Instant::now(),
            result: result.clone(),
        });
        result
    }
}

/// Runs every probe at once and combines their results.
async fn run(
    registered: &Registered,
    runtime: &Handle,
    timeout: Duration,
) -> Result<Value, String> {
    let runs = registered.probes.iter().map(|probe| {
        let (func, ctx) = (probe.func.clone(), registered.ctx.clone());
        // Even the probe's synchronous part runs on the operator's runtime, not on the caller's.
        let task = runtime.spawn(async move { func(ctx).await });
        let id = probe.id.as_str();
        async move {
            let abort = task.abort_handle();
            let outcome = match tokio::time::timeout(timeout, task).await {
                Ok(Ok(Ok(value))) => return Ok((id, value)),
                Ok(Ok(Err(error))) => format!("probe '{id}' failed: {error}"),
                Ok(Err(error)) if error.is_panic() => format!(
                    "probe '{id}' panicked: {}",
                    panic_message(&error.into_panic())
                ),
                Ok(Err(_)) => format!("probe '{id}' was cancelled: the operator is shutting down"),
                Err(_) => {
                    abort.abort();
                    format!("probe '{id}' timed out after {} s", seconds(timeout))
                }
            };
            tracing::warn!(probe = id, "{outcome}");
            Err(outcome)
        }
    });
    let mut results = Map::new();
    let mut failures = Vec::new();
    for outcome in join_all(runs).await {
        match outcome {
            Ok((id, value)) => {
                results.insert(id.to_string(), value);
            }
            Err(failure) => failures.push(failure),
        }
    }
    if failures.is_empty() {
        Ok(Value::Object(results))
    } else {
        Err(failures.join("; "))
    }
}
