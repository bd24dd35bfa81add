//! The daemons and timers of one object ([`ObjectDaemons`]), owned by the object's worker
//! (`reference/kopf.md` §1.8, §1.9; Kopf's `daemons.py`).
//!
//! **Expected flow**: every cycle of the object decides which daemons and timers should run (their
//! filters match, the object is not being deleted; [`SpawnDecision`]); the worker hands the decision
//! to [`ObjectDaemons::apply`], which starts the missing ones as tasks on the operator's runtime and
//! stops those no longer wanted. Every event replaces the live body they read
//! ([`ObjectDaemons::observe`]). A task that ends reports it ([`Report::Exited`]) to the owner, which
//! calls [`ObjectDaemons::exited`].
//!
//! **Stopping** goes through explicit stages ([`Stage`]), per the handler's [`Cancellation`]:
//! signalled (the stop flag is set with the reason: `RESOURCE_DELETED`, `FILTERS_MISMATCH`,
//! `OPERATOR_PAUSING`, `OPERATOR_EXITING`); after `cancellation_backoff`, cancelled (the task is
//! aborted at its next `.await`); after `cancellation_timeout`, abandoned ([`Report::Abandoned`]: it
//! no longer holds the finalizer). With no timeout, it is waited for however long it takes.
//!
//! **Guarantees**
//! * Never two instances of one handler for one object: a daemon wanted again while it is still
//!   stopping is started again only once it has exited.
//! * A daemon or timer that ends on its own (it returned, failed for good, or a one-shot timer ran)
//!   is not started again in this process (Kopf's `forever_stopped`).
//! * Results land in `status.<id>` and patches are sent after each run; a patch that fails is kept
//!   for the next run.
//! * After a crash, nothing of a daemon or timer is lost but the call in flight: the next process
//!   starts every object's daemons again from its listing (Kopf keeps no record of daemons on the
//!   object either), and timers resume their schedule, so a timer's result or patch cut off by the
//!   crash is made again by its next call (`tests/chaos.rs`). A daemon that had ended on its own
//!   starts again too: that is kept in memory only, as in Kopf.
//! * Daemons do not count against `execution.max_concurrent_handlers` (they run for the object's
//!   life); each timer call does.
//!
//! **Caveats**: a cancelled task stops at its next `.await`; one blocked in synchronous code cannot be
//! cancelled, and is abandoned after `cancellation_timeout`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use jiff::Timestamp;
use kactor_reactor::cache::Caches;
use kactor_reactor::daemons::{
    Cancellation, Live, SpawningKind, StopReason, Stopped, Stopper, Timer,
};
use kactor_reactor::execution::{execute_once, Invocation};
use kactor_reactor::handlers::{Attempt, Ctx, Memo, ResourceHandlers, Spawning, SpawningHandler};
use kactor_reactor::indexes::Indexes;
use kactor_reactor::observe::Observer;
use kactor_reactor::patches::{self, Applied, ApplyError, Changes, Fence, Patch};
use kactor_reactor::posting::EventPoster;
use kactor_reactor::processing::{deliver_result, SpawnDecision, LAPSED_RECHECK};
use kactor_reactor::progression::Outcome;
use kactor_reactor::resources::Resource;
use kactor_reactor::sharding::{Shard, Tenure};
use kactor_reactor::watching::EventType;
use kube::api::DynamicObject;
use serde_json::Value;
use tokio::runtime::Handle;
use tokio::sync::{watch, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::tracker::Tracker;

/// Where daemons and timers send their patches.
pub trait PatchSink: Send + Sync {
    /// Sends `changes` to the object, of which `body` is the newest known version.
    fn apply(
        &self,
        body: Arc<DynamicObject>,
        changes: Changes,
    ) -> BoxFuture<'_, Result<Applied, ApplyError>>;
}

/// The API, as a [`PatchSink`]: [`patches::apply`] with the operator's retries.
pub struct ApiSink {
    /// The client.
    pub client: kube::Client,
    /// The resource.
    pub resource: Arc<Resource>,
    /// `networking.error_backoffs`.
    pub backoffs: Vec<Duration>,
    /// The write fence of a sharded operator (`settings.shard`).
    pub shard: Option<Shard>,
}

impl PatchSink for ApiSink {
    fn apply(
        &self,
        body: Arc<DynamicObject>,
        changes: Changes,
    ) -> BoxFuture<'_, Result<Applied, ApplyError>> {
        async move {
            patches::apply(
                &self.client,
                &self.resource,
                &body,
                changes,
                &self.backoffs,
                self.shard.as_ref().map(|shard| Fence {
                    shard,
                    draining: false,
                }),
            )
            .await
        }
        .boxed()
    }
}

/// What the daemons and timers of one resource share.
pub struct DaemonEnv {
    /// The resource.
    pub resource: Arc<Resource>,
    /// Its handlers; daemons and timers are known by their index in `spawning`.
    pub handlers: Arc<ResourceHandlers>,
    /// The client given to handlers.
    pub client: Arc<kube::Client>,
    /// Where Kubernetes Events go.
    pub poster: EventPoster,
    /// The global limit of concurrently running handlers (taken by each timer call).
    pub limiter: Arc<Semaphore>,
    /// `execution.default_backoff`.
    pub default_backoff: Duration,
    /// Where patches go.
    pub sink: Arc<dyn PatchSink>,
    /// Hooks for metrics.
    pub observer: Arc<dyn Observer>,
    /// The resource as metrics label it (kubectl's form).
    pub label: Arc<str>,
    /// The runtime the tasks run on.
    pub runtime: Handle,
    /// The daemon and timer tasks in flight.
    pub tracker: Arc<Tracker>,
    /// The shared caches handlers read (`ctx.cache`).
    pub caches: Option<Caches>,
    /// The indexes handlers read (`ctx.index`).
    pub indexes: Option<Indexes>,
    /// Sharded: this replica's tenure in its ring. While it has lapsed (a process frozen past its
    /// renew deadline, before the pause stops them), timers skip their calls and daemons do not
    /// restart.
    pub tenure: Option<Tenure>,
}

impl DaemonEnv {
    /// Whether this replica's ring membership has lapsed (sharded only).
    fn lapsed(&self) -> bool {
        self.tenure.as_ref().is_some_and(|tenure| !tenure.holds())
    }
}

/// What a daemon's or timer's task tells its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The task of handler `index` (its instance `generation`) has ended.
    Exited {
        /// The handler's index in the resource's spawning handlers.
        index: usize,
        /// Which instance.
        generation: u64,
    },
    /// The task did not end within its cancellation timeout: it no longer holds the finalizer.
    Abandoned {
        /// The handler's index in the resource's spawning handlers.
        index: usize,
        /// Which instance.
        generation: u64,
    },
}

/// How reports reach the owner (for the worker: a message to itself).
pub type Reporter = Arc<dyn Fn(Report) + Send + Sync>;

/// Where a daemon or timer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Running; not asked to stop.
    Running,
    /// Asked to stop (the flag is set with the reason); it has `cancellation_backoff` to exit on its
    /// own, or, with no cancellation settings, as long as it takes.
    Signalled,
    /// Its task was cancelled; it has `cancellation_timeout` to end.
    Cancelled,
    /// It did not end in time: left running, no longer holding the finalizer.
    Abandoned,
}

struct Running {
    generation: u64,
    stopper: Stopper,
    abort: AbortHandle,
    abandoned: bool,
    /// Start it again once it has exited (it was wanted again while stopping).
    respawn: bool,
}

impl Running {
    fn stage(&self) -> Stage {
        let reasons = self.stopper.reasons();
        if self.abandoned {
            Stage::Abandoned
        } else if reasons.contains(StopReason::DaemonCancelled) {
            Stage::Cancelled
        } else if reasons.is_empty() {
            Stage::Running
        } else {
            Stage::Signalled
        }
    }
}

/// The daemons and timers of one object (see the module's documentation). Owned by one owner (the
/// object's worker), which feeds it events, decisions and reports, in order.
pub struct ObjectDaemons {
    env: Arc<DaemonEnv>,
    memo: Memo,
    span: tracing::Span,
    live: watch::Sender<Live>,
    running: BTreeMap<usize, Running>,
    excluded: Arc<HashSet<String>>,
    report: Reporter,
    generation: u64,
}

impl ObjectDaemons {
    /// The daemons of the object whose first known version is `body`; those in `excluded` ended on
    /// their own earlier in this process and are not started again; reports go to `report`.
    pub fn new(
        env: Arc<DaemonEnv>,
        memo: Memo,
        span: tracing::Span,
        body: Arc<DynamicObject>,
        event_type: EventType,
        excluded: Arc<HashSet<String>>,
        report: Reporter,
    ) -> Self {
        let live = Live {
            body,
            event_type,
            changed: Instant::now(),
        };
        ObjectDaemons {
            env,
            memo,
            span,
            live: watch::channel(live).0,
            running: BTreeMap::new(),
            excluded,
            report,
            generation: 0,
        }
    }

    /// A newer version of the object: what its daemons and timers read from now on.
    pub fn observe(&self, body: Arc<DynamicObject>, event_type: EventType) {
        self.live.send_modify(|live| {
            live.body = body;
            live.event_type = event_type;
        });
    }

    /// Handlers (by id) that ended on their own: never started again in this process.
    pub fn excluded(&self) -> Arc<HashSet<String>> {
        self.excluded.clone()
    }

    /// How many are running and hold the object's finalizer (abandoned ones do not).
    pub fn holding(&self) -> usize {
        self.running.values().filter(|r| !r.abandoned).count()
    }

    /// The stage of handler `index`, if it runs.
    pub fn stage(&self, index: usize) -> Option<Stage> {
        self.running.get(&index).map(Running::stage)
    }

    /// Applies a cycle's decision: the idle clock, then stopping and starting. `may_start` is false
    /// while the operator is paused or exiting.
    pub fn apply(&mut self, decision: &SpawnDecision, may_start: bool) {
        if decision.essential_change {
            self.live.send_modify(|live| live.changed = Instant::now());
        }
        if decision.deletion {
            self.stop_all(StopReason::ResourceDeleted);
            return;
        }
        if decision.draining {
            self.stop_all(StopReason::OperatorDraining);
            return;
        }
        let unwanted: Vec<usize> = self
            .running
            .keys()
            .copied()
            .filter(|index| !decision.wanted.contains(index))
            .collect();
        for index in unwanted {
            self.stop(index, StopReason::FiltersMismatch);
        }
        for &index in &decision.wanted {
            let Some(handler) = self.env.handlers.spawning.get(index) else {
                continue;
            };
            if self.excluded.contains(&handler.id) {
                continue;
            }
            match self.running.get_mut(&index) {
                Some(running) if running.stage() != Stage::Running => running.respawn = may_start,
                Some(_) => {}
                None if may_start => self.start(index),
                None => {}
            }
        }
    }

    /// Stops them all, for `reason`.
    pub fn stop_all(&mut self, reason: StopReason) {
        let indices: Vec<usize> = self.running.keys().copied().collect();
        for index in indices {
            self.stop(index, reason);
        }
    }

    /// A task has ended (a [`Report::Exited`]); `may_start` as for [`Self::apply`]. Returns whether
    /// it was known.
    pub fn exited(&mut self, index: usize, generation: u64, may_start: bool) -> bool {
        if self.running.get(&index).map(|r| r.generation) != Some(generation) {
            return false;
        }
        let Some(running) = self.running.remove(&index) else {
            return false;
        };
        let handler = &self.env.handlers.spawning[index];
        let requested = running.stopper.reasons().without(StopReason::Done);
        if requested.is_empty() {
            // Exited on its own: returned, failed for good, or a one-shot timer ran.
            Arc::make_mut(&mut self.excluded).insert(handler.id.clone());
        } else if running.respawn && may_start {
            self.start(index);
        }
        true
    }

    /// A task was abandoned (a [`Report::Abandoned`]). Returns whether it was known.
    pub fn abandoned(&mut self, index: usize, generation: u64) -> bool {
        match self.running.get_mut(&index) {
            Some(running) if running.generation == generation => {
                running.abandoned = true;
                running.respawn = false;
                true
            }
            _ => false,
        }
    }

    fn start(&mut self, index: usize) {
        let env = self.env.clone();
        let handler = &env.handlers.spawning[index];
        self.generation += 1;
        let generation = self.generation;
        let stopper = Stopper::new();
        let job = Job {
            env: env.clone(),
            index,
            memo: self.memo.clone(),
            live: self.live.subscribe(),
            stopped: stopper.stopped(),
        };
        let guard = ExitGuard {
            stopper: stopper.share(),
            report: self.report.clone(),
            env: env.clone(),
            index,
            generation,
        };
        env.observer.daemon_started(&env.label, handler.kind());
        let span = tracing::info_span!(parent: &self.span, "daemon", handler = %handler.id);
        let task = async move {
            let _guard = guard;
            job.run().await;
        };
        let abort = env.tracker.spawn(&env.runtime, task.instrument(span));
        self.running.insert(
            index,
            Running {
                generation,
                stopper,
                abort,
                abandoned: false,
                respawn: false,
            },
        );
    }

    fn stop(&mut self, index: usize, reason: StopReason) {
        let Some(running) = self.running.get_mut(&index) else {
            return;
        };
        running.respawn = false;
        if running.stage() != Stage::Running {
            running.stopper.stop(reason);
            return;
        }
        running.stopper.stop(reason);
        let handler = &self.env.handlers.spawning[index];
        let cancellation = handler.cancellation();
        if cancellation == Cancellation::default() {
            let reasons = running.stopper.reasons();
            tracing::debug!(parent: &self.span, "{handler} is signalled to exit ({reasons}).");
            return;
        }
        let stages = Stages {
            title: handler.to_string(),
            cancellation,
            stopper: running.stopper.share(),
            abort: running.abort.clone(),
            report: self.report.clone(),
            index,
            generation: running.generation,
        };
        // The stages are timed on the operator's runtime; they end early once the task has exited.
        self.env
            .runtime
            .spawn(stages.run().instrument(self.span.clone()));
    }
}

impl Drop for ObjectDaemons {
    /// Whatever still runs when its owner goes is asked to stop (the operator is exiting).
    fn drop(&mut self) {
        self.stop_all(StopReason::OperatorExiting);
    }
}

/// The stopping stages of one task after the stop flag was set.
struct Stages {
    title: String,
    cancellation: Cancellation,
    stopper: Stopper,
    abort: AbortHandle,
    report: Reporter,
    index: usize,
    generation: u64,
}

impl Stages {
    async fn run(self) {
        if let Some(backoff) = self.cancellation.backoff {
            self.stopper.stop(StopReason::DaemonSignalled);
            tracing::debug!("{} is signalled to exit gracefully.", self.title);
            if self.stopper.exited_within(backoff).await {
                return;
            }
        }
        if let Some(timeout) = self.cancellation.timeout {
            self.stopper.stop(StopReason::DaemonCancelled);
            tracing::debug!("{} is signalled to exit by force.", self.title);
            self.abort.abort();
            if self.stopper.exited_within(timeout).await {
                return;
            }
            self.stopper.stop(StopReason::DaemonAbandoned);
            tracing::warn!("{} did not exit in time. Leaving it orphaned.", self.title);
            (self.report)(Report::Abandoned {
                index: self.index,
                generation: self.generation,
            });
        }
    }
}

/// Reports the end of a task, also when it is cancelled (dropped).
struct ExitGuard {
    stopper: Stopper,
    report: Reporter,
    env: Arc<DaemonEnv>,
    index: usize,
    generation: u64,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.stopper.stop(StopReason::Done);
        let kind = self.env.handlers.spawning[self.index].kind();
        self.env.observer.daemon_exited(&self.env.label, kind);
        (self.report)(Report::Exited {
            index: self.index,
            generation: self.generation,
        });
    }
}

/// The failures in a row of one handler, for its retries, timeout and `ctx.retry()`.
#[derive(Default)]
struct Streak {
    attempts: u32,
    started: Option<(Timestamp, Instant)>,
}

/// One task: one daemon or timer of one object.
struct Job {
    env: Arc<DaemonEnv>,
    index: usize,
    memo: Memo,
    live: watch::Receiver<Live>,
    stopped: Stopped,
}

impl Job {
    fn handler(&self) -> &SpawningHandler {
        &self.env.handlers.spawning[self.index]
    }

    fn ctx(&self, patch: &Patch) -> Ctx {
        let live = self.live.borrow().clone();
        let ctx = Ctx::new(
            live.event_type,
            live.body,
            self.memo.clone(),
            self.env.resource.clone(),
            self.env.client.clone(),
            Instant::now().into_std(),
        )
        .with_patch(patch.clone())
        .with_events(self.env.poster.clone())
        .with_daemon(self.stopped.clone(), self.live.clone());
        let ctx = match &self.env.caches {
            Some(caches) => ctx.with_caches(caches.clone()),
            None => ctx,
        };
        match &self.env.indexes {
            Some(indexes) => ctx.with_indexes(indexes.clone()),
            None => ctx,
        }
    }

    async fn run(self) {
        let handler = self.handler();
        if let Some(delay) = handler.initial_delay() {
            let delay = delay.of(&self.ctx(&Patch::new()));
            if self.stopped.wait_timeout(delay).await {
                tracing::debug!(
                    "{handler} has exited on request and will not be retried or restarted."
                );
                return;
            }
        }
        match &handler.spawning {
            Spawning::Daemon(_) => self.daemon().await,
            Spawning::Timer(timer) => self.timer(timer).await,
        }
        if self.stopped.is_stopped() {
            tracing::debug!(
                "{handler} has exited on request and will not be retried or restarted."
            );
        } else {
            tracing::debug!(
                "{handler} has exited on its own and will not be retried or restarted."
            );
        }
    }

    /// Kopf's `_daemon`: run until it returns or fails for good; retry after errors.
    async fn daemon(&self) {
        let patch = Patch::new();
        let mut streak = Streak::default();
        while !self.stopped.is_stopped() {
            if self.env.lapsed() {
                // Sharding: not (re)started while the membership has lapsed; the pause that
                // follows stops it, or the renewal lets it go on.
                if self.stopped.wait_timeout(LAPSED_RECHECK).await {
                    break;
                }
                continue;
            }
            let outcome = self.attempt(&patch, &mut streak).await;
            self.flush(&patch).await;
            if outcome.final_ {
                break;
            }
            let delay = outcome.delay.unwrap_or(self.env.default_backoff);
            if self.stopped.wait_timeout(delay).await {
                break;
            }
        }
    }

    /// Kopf's `_timer`: call on schedule until stopped or failed for good.
    async fn timer(&self, timer: &Timer) {
        let patch = Patch::new();
        let mut streak = Streak::default();
        let mut changes = self.live.clone();
        let mut due = Instant::now();
        loop {
            if let Some(idle) = timer.idle {
                // The idle clock is a moving target: every essential change starts it again.
                loop {
                    let deadline = self.live.borrow().changed + idle;
                    if Instant::now() >= deadline {
                        break;
                    }
                    due = deadline;
                    if self.stopped.wait_until(deadline).await {
                        return;
                    }
                }
            }
            let permit = tokio::select! {
                permit = self.env.limiter.acquire() => permit,
                _ = self.stopped.wait() => return,
            };
            let Ok(permit) = permit else {
                return;
            };
            if self.env.lapsed() {
                // Sharding: no call while the membership has lapsed (its object may have moved);
                // the pause that follows stops the timer, or the renewal lets it go on.
                drop(permit);
                due = Instant::now() + LAPSED_RECHECK;
                if self.stopped.wait_until(due).await {
                    return;
                }
                continue;
            }
            let started = Instant::now();
            let lateness = started.saturating_duration_since(due);
            self.env
                .observer
                .timer_lateness(&self.env.label, &self.handler().id, lateness);
            let outcome = self.attempt(&patch, &mut streak).await;
            drop(permit);
            self.flush(&patch).await;

            if !outcome.final_ {
                // A temporary failure: its delay (or the backoff) overrides the schedule.
                let delay = outcome.delay.unwrap_or(self.env.default_backoff);
                due = Instant::now() + delay;
                if self.stopped.wait_until(due).await {
                    return;
                }
                continue;
            }
            if outcome.error.is_some() {
                // Failed for good: stopped for the rest of the process (the error is logged).
                return;
            }
            streak = Streak::default();
            let now = Instant::now();
            match (timer.interval, timer.idle) {
                (Some(interval), _) if timer.sharp => {
                    // Keep the grid: |-----|-----|-----| whatever the call took.
                    let passed = now.saturating_duration_since(started);
                    due = now + (interval - remainder(passed, interval));
                }
                (Some(interval), _) => due = now + interval,
                (None, Some(_)) => {
                    // Idle only: once per quiet period, so wait for the next change first.
                    loop {
                        if changes.borrow_and_update().changed > started {
                            break;
                        }
                        tokio::select! {
                            changed = changes.changed() => if changed.is_err() { return },
                            _ = self.stopped.wait() => return,
                        }
                    }
                    continue;
                }
                (None, None) => return,
            }
            if self.stopped.wait_until(due).await {
                return;
            }
        }
    }

    /// One attempt, its result stored in the patch.
    async fn attempt(&self, patch: &Patch, streak: &mut Streak) -> Outcome {
        let handler = self.handler();
        let (started, since) = *streak
            .started
            .get_or_insert_with(|| (Timestamp::now(), Instant::now()));
        let runtime = since.elapsed();
        let invocation = Invocation {
            id: &handler.id,
            func: &handler.func,
            errors: handler.options.errors.unwrap_or_default(),
            backoff: handler.options.backoff.unwrap_or(self.env.default_backoff),
            timeout: handler.options.timeout,
            retries: handler.options.retries,
            post_events: false,
            resource: &self.env.label,
            observer: &*self.env.observer,
            // A timer's call is a handler run like any other; a daemon lives on (its own gauge).
            active: handler.kind() == SpawningKind::Timer,
        };
        let ctx = self.ctx(patch).with_attempt(Attempt {
            id: handler.id.as_str().into(),
            param: handler.options.param.clone(),
            retry: streak.attempts,
            started: Some(started),
            runtime,
            old: None,
            new: None,
            diff: None,
            reduced: false,
        });
        let (outcome, _) = execute_once(&invocation, ctx, streak.attempts, runtime).await;
        streak.attempts += 1;
        deliver_result(patch, &handler.id, &outcome);
        outcome
    }

    /// Sends what the patch holds; what cannot be sent now stays in it for the next run.
    async fn flush(&self, patch: &Patch) {
        if patch.is_empty() {
            return;
        }
        let changes = patch.take();
        let body = self.live.borrow().body.clone();
        // Patches share the handlers' limit (see `execution.max_concurrent_handlers`).
        let _permit = self.env.limiter.acquire().await;
        match self.env.sink.apply(body, changes.clone()).await {
            Ok(applied) => {
                if applied.fenced.is_some() {
                    // The object moved, or is being handed over: these changes are not ours to
                    // write any more (the daemon is stopping, or stopped).
                    self.env.observer.fence_rejected(&self.env.label);
                }
                patch.extend_fns(applied.remaining);
            }
            Err(error) => {
                tracing::error!("Patching failed; the changes are kept for the next run: {error}");
                patch.merge(Value::Object(changes.merge));
                patch.extend_fns(changes.fns);
            }
        }
    }
}

/// `passed % interval`, for durations.
fn remainder(passed: Duration, interval: Duration) -> Duration {
    let interval_ns = interval.as_nanos().max(1);
    Duration::from_nanos((passed.as_nanos() % interval_ns) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test(start_paused = true)]
    async fn a_task_that_outlives_its_cancellation_timeout_is_abandoned() {
        // A task blocked in synchronous code ignores its cancellation: played here by a stop flag
        // that never reports `Done` and an abort handle of a task that is not the daemon.
        let stopper = Stopper::new();
        let decoy = tokio::spawn(std::future::pending::<()>());
        let reports = Arc::new(Mutex::new(Vec::new()));
        let seen = reports.clone();
        let stages = Stages {
            title: "Daemon 'd'".into(),
            cancellation: Cancellation {
                backoff: Some(Duration::from_secs(2)),
                timeout: Some(Duration::from_secs(3)),
            },
            stopper: stopper.share(),
            abort: decoy.abort_handle(),
            report: Arc::new(move |report| seen.lock().unwrap().push(report)),
            index: 0,
            generation: 7,
        };
        stopper.stop(StopReason::ResourceDeleted);
        let t0 = Instant::now();
        stages.run().await;
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(5),
            "backoff, then timeout"
        );
        assert_eq!(
            stopper.reasons().to_string(),
            "RESOURCE_DELETED|DAEMON_SIGNALLED|DAEMON_CANCELLED|DAEMON_ABANDONED"
        );
        assert!(
            decoy.await.unwrap_err().is_cancelled(),
            "the cancellation was sent"
        );
        assert_eq!(
            *reports.lock().unwrap(),
            vec![Report::Abandoned {
                index: 0,
                generation: 7
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stages_end_as_soon_as_the_task_exits() {
        let stopper = Stopper::new();
        let decoy = tokio::spawn(std::future::pending::<()>());
        let stages = Stages {
            title: "Daemon 'd'".into(),
            cancellation: Cancellation {
                backoff: Some(Duration::from_secs(10)),
                timeout: Some(Duration::from_secs(10)),
            },
            stopper: stopper.share(),
            abort: decoy.abort_handle(),
            report: Arc::new(|_| panic!("no report: it exited")),
            index: 0,
            generation: 1,
        };
        stopper.stop(StopReason::OperatorPausing);
        let done = stopper.share();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            done.stop(StopReason::Done);
        });
        let t0 = Instant::now();
        stages.run().await;
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        assert!(!stopper.reasons().contains(StopReason::DaemonCancelled));
        decoy.abort();
    }

    #[test]
    fn remainders_of_durations() {
        let s = Duration::from_secs;
        assert_eq!(
            remainder(Duration::from_millis(2500), s(1)),
            Duration::from_millis(500)
        );
        assert_eq!(remainder(s(3), s(1)), Duration::ZERO);
        assert_eq!(remainder(s(3), Duration::ZERO), Duration::ZERO);
    }
}
