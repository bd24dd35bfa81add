//! What the operator does, told to whoever measures it: the [`Observer`] hooks (metrics) and the
//! [`WatchBoard`] of live watch streams (health).
//!
//! The hooks are called on hot paths (every watch batch, every handler run, every API request), from
//! the actors' thread and the runtime's threads alike: an implementation must be cheap and must never
//! block. Labels are bounded: a resource (kubectl's form, `widgets.v1.example.com`), a handler id, a
//! verb, a status code; never an object's name or uid.
//!
//! `kactor-health` implements [`Observer`] with Prometheus metrics; an embedding application may
//! implement it for another metrics system.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub use crate::structs::names::MessageOutcome;
pub use crate::structs::names::Verdict;
use crate::structs::names::{RestartReason, SpawningKind};

/// One finished attempt of a handler (changing, event, daemon or timer).
#[derive(Debug, Clone, Copy)]
pub struct HandlerRun<'a> {
    /// The resource, in kubectl's form.
    pub resource: &'a str,
    /// The handler's id.
    pub handler: &'a str,
    /// How the attempt ended.
    pub verdict: Verdict,
    /// The attempts that came before this one (0: the first; more: a retry).
    pub attempt: u32,
    /// How long the attempt ran (for a daemon: its lifetime).
    pub duration: Duration,
    /// Whether it was counted as active ([`Observer::handler_started`] came first); false for
    /// daemons, which have their own gauge.
    pub active: bool,
}

/// Hooks for metrics. Every method has an empty default.
pub trait Observer: Send + Sync + 'static {
    /// The operator serves `resource` (kubectl's form) with the handlers of these ids (of every
    /// kind): told when its supervisor starts (once per namespace served), before anything else
    /// about it, so that metrics can show every series at 0 from the first scrape.
    fn resource_served(&self, _resource: &str, _handlers: &[&str]) {}

    /// A watch stream of `resource` delivered `count` objects or events (a listing page, a batch).
    fn events_received(&self, _resource: &str, _count: usize) {}

    /// A watch stream of `resource` was reopened.
    fn watch_restarted(&self, _resource: &str, _reason: RestartReason) {}

    /// A handler attempt began (it is counted as active until the matching
    /// [`handler_finished`](Self::handler_finished) or [`handler_dropped`](Self::handler_dropped)).
    fn handler_started(&self) {}

    /// A handler attempt ended (`run.active`: it was counted by `handler_started`).
    fn handler_finished(&self, _run: &HandlerRun<'_>) {}

    /// A handler attempt was cancelled before it ended (shutdown, a stopped daemon).
    fn handler_dropped(&self) {}

    /// An object worker of `resource` started (+1) or stopped (-1).
    fn workers_changed(&self, _resource: &str, _delta: i64) {}

    /// A busy worker of `resource` replaced `count` queued events with a newer one.
    fn events_coalesced(&self, _resource: &str, _count: u64) {}

    /// `count` objects of a listing of `resource`, or watch events, could not be decoded (an
    /// object nested deeper than the decoder goes, say) and were left out; the rest was served.
    fn objects_undecodable(&self, _resource: &str, _count: usize) {}

    /// A daemon or timer of `resource` started.
    fn daemon_started(&self, _resource: &str, _kind: SpawningKind) {}

    /// A daemon or timer of `resource` ended (or was abandoned).
    fn daemon_exited(&self, _resource: &str, _kind: SpawningKind) {}

    /// A timer's call started `lateness` after it was due.
    fn timer_lateness(&self, _resource: &str, _handler: &str, _lateness: Duration) {}

    /// The operator paused (true) or resumed (false).
    fn paused(&self, _paused: bool) {}

    /// This operator started (true) or stopped (false) leading the election `name`.
    fn leadership(&self, _name: &str, _leading: bool) {}

    /// An API request answered (`code`: the HTTP status; None: no answer, a transport error) after
    /// `duration` (until the response's headers: a watch counts until its stream opened).
    fn api_request(&self, _verb: &'static str, _code: Option<u16>, _duration: Duration) {}

    /// The operator runs object actors named `actor` (their lifecycle's name): told once per
    /// supervisor start, so that their series show at 0 from the first scrape.
    fn actors_served(&self, _actor: &str) {}

    /// An object actor named `actor` started (+1) or stopped (-1).
    fn actors_changed(&self, _actor: &str, _delta: i64) {}

    /// Messages were queued in (+) or taken out of (-) the mailboxes of the actors named `actor`.
    fn mailboxes_changed(&self, _actor: &str, _delta: i64) {}

    /// A message to an actor named `actor` came to `outcome`; `duration` is how long its handling
    /// ran (zero when it was never handled).
    fn actor_message(&self, _actor: &str, _outcome: MessageOutcome, _duration: Duration) {}

    /// The operator keeps a shared cache of `resource`: `size` tells how many objects it holds and
    /// their size as JSON whenever asked (a scrape), rather than on each of its events (measuring
    /// every object as JSON as it came cost the thread that applies the events a twelfth of its
    /// work).
    fn cache_served(&self, _resource: &str, _size: Arc<dyn CacheSize>) {}

    /// Sharding: whether this replica is a member of the ring `ring` now (its Lease held).
    fn shard_member(&self, _ring: &str, _joined: bool) {}

    /// Sharding, on the assigner's replica: the objects each member owns, as its last resync counted
    /// them (a member not among `owners` owns none now).
    fn shard_objects(&self, _ring: &str, _owners: &[(&str, usize)]) {}

    /// Sharding, on the assigner's replica: `count` more moves of `kind` (`assigned`, `drained`,
    /// `relabelled`, `takeover`).
    fn shard_moves(&self, _ring: &str, _kind: &'static str, _count: u64) {}

    /// Sharding: the write fence rejected a write to an object of `resource` (it had moved, or was
    /// being handed over).
    fn fence_rejected(&self, _resource: &str) {}

    /// Sharding: an object of `resource` was handed over, `took` after its drain label first reached
    /// this replica.
    fn handed_over(&self, _resource: &str, _took: Duration) {}
}

/// A shared cache's size, measured when asked ([`Observer::cache_served`]).
pub trait CacheSize: Send + Sync {
    /// The objects the cache holds and their size as JSON (each object measured once per version,
    /// on the first ask after it came); None once the cache is gone.
    fn size(&self) -> Option<(usize, usize)>;
}

/// The observer that observes nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// Several observers as one: each hook goes to each, in order.
#[derive(Clone, Default)]
pub struct Tee(pub Vec<Arc<dyn Observer>>);

impl Observer for Tee {
    fn resource_served(&self, resource: &str, handlers: &[&str]) {
        self.0
            .iter()
            .for_each(|o| o.resource_served(resource, handlers));
    }
    fn events_received(&self, resource: &str, count: usize) {
        self.0
            .iter()
            .for_each(|o| o.events_received(resource, count));
    }
    fn watch_restarted(&self, resource: &str, reason: RestartReason) {
        self.0
            .iter()
            .for_each(|o| o.watch_restarted(resource, reason));
    }
    fn handler_started(&self) {
        self.0.iter().for_each(|o| o.handler_started());
    }
    fn handler_finished(&self, run: &HandlerRun<'_>) {
        self.0.iter().for_each(|o| o.handler_finished(run));
    }
    fn handler_dropped(&self) {
        self.0.iter().for_each(|o| o.handler_dropped());
    }
    fn workers_changed(&self, resource: &str, delta: i64) {
        self.0
            .iter()
            .for_each(|o| o.workers_changed(resource, delta));
    }
    fn events_coalesced(&self, resource: &str, count: u64) {
        self.0
            .iter()
            .for_each(|o| o.events_coalesced(resource, count));
    }
    fn objects_undecodable(&self, resource: &str, count: usize) {
        self.0
            .iter()
            .for_each(|o| o.objects_undecodable(resource, count));
    }
    fn daemon_started(&self, resource: &str, kind: SpawningKind) {
        self.0.iter().for_each(|o| o.daemon_started(resource, kind));
    }
    fn daemon_exited(&self, resource: &str, kind: SpawningKind) {
        self.0.iter().for_each(|o| o.daemon_exited(resource, kind));
    }
    fn timer_lateness(&self, resource: &str, handler: &str, lateness: Duration) {
        self.0
            .iter()
            .for_each(|o| o.timer_lateness(resource, handler, lateness));
    }
    fn paused(&self, paused: bool) {
        self.0.iter().for_each(|o| o.paused(paused));
    }
    fn leadership(&self, name: &str, leading: bool) {
        self.0.iter().for_each(|o| o.leadership(name, leading));
    }
    fn actors_served(&self, actor: &str) {
        self.0.iter().for_each(|o| o.actors_served(actor));
    }
    fn actors_changed(&self, actor: &str, delta: i64) {
        self.0.iter().for_each(|o| o.actors_changed(actor, delta));
    }
    fn mailboxes_changed(&self, actor: &str, delta: i64) {
        self.0
            .iter()
            .for_each(|o| o.mailboxes_changed(actor, delta));
    }
    fn actor_message(&self, actor: &str, outcome: MessageOutcome, duration: Duration) {
        self.0
            .iter()
            .for_each(|o| o.actor_message(actor, outcome, duration));
    }
    fn api_request(&self, verb: &'static str, code: Option<u16>, duration: Duration) {
        self.0
            .iter()
            .for_each(|o| o.api_request(verb, code, duration));
    }
    fn cache_served(&self, resource: &str, size: Arc<dyn CacheSize>) {
        self.0
            .iter()
            .for_each(|o| o.cache_served(resource, size.clone()));
    }
    fn shard_member(&self, ring: &str, joined: bool) {
        self.0.iter().for_each(|o| o.shard_member(ring, joined));
    }
    fn shard_objects(&self, ring: &str, owners: &[(&str, usize)]) {
        self.0.iter().for_each(|o| o.shard_objects(ring, owners));
    }
    fn shard_moves(&self, ring: &str, kind: &'static str, count: u64) {
        self.0.iter().for_each(|o| o.shard_moves(ring, kind, count));
    }
    fn fence_rejected(&self, resource: &str) {
        self.0.iter().for_each(|o| o.fence_rejected(resource));
    }
    fn handed_over(&self, resource: &str, took: Duration) {
        self.0.iter().for_each(|o| o.handed_over(resource, took));
    }
}

/// A watcher's health, shared with whoever reports it (health probes, metrics). Cheap to read.
#[derive(Debug)]
pub struct WatchStatus {
    /// When the status was made: the origin of `last_activity_ms` (on tokio's clock, as every
    /// deadline of the operator).
    origin: Instant,
    /// Milliseconds since `origin` of the last response, event or bookmark.
    last_activity_ms: AtomicU64,
    /// Whether the initial listing has completed once.
    pub(crate) listed: AtomicBool,
    /// Restarts by reason, in the order of [`RestartReason::ALL`].
    restarts: [AtomicU64; 4],
    /// Events and listed objects received.
    pub(crate) received: AtomicU64,
    /// The failure the watcher could not recover from within its backoffs, while it lasts.
    failing: Mutex<Option<String>>,
    /// Whether the stream is stopped on purpose (the operator is paused): silence is no failure.
    paused: AtomicBool,
}

impl Default for WatchStatus {
    fn default() -> Self {
        WatchStatus::new()
    }
}

impl WatchStatus {
    /// A status whose silence clock starts now.
    pub fn new() -> Self {
        WatchStatus {
            origin: Instant::now(),
            last_activity_ms: AtomicU64::new(0),
            listed: AtomicBool::default(),
            restarts: Default::default(),
            received: AtomicU64::default(),
            failing: Mutex::default(),
            paused: AtomicBool::default(),
        }
    }

    fn since_origin_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    pub(crate) fn touch(&self) {
        self.last_activity_ms
            .store(self.since_origin_ms(), Ordering::Relaxed);
    }

    pub(crate) fn restarted(&self, reason: RestartReason) {
        if let Some(i) = RestartReason::ALL.iter().position(|r| *r == reason) {
            self.restarts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_failing(&self, failure: Option<String>) {
        *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = failure;
    }

    /// Marks the stream as stopped on purpose (the operator paused) or running again. Resuming
    /// restarts the silence clock: the time spent paused is not silence.
    pub fn set_paused(&self, paused: bool) {
        if !paused {
            self.touch();
        }
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Whether the stream is stopped on purpose.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// How long ago the stream last showed life (a response, an event, a bookmark).
    pub fn idle_for(&self) -> Duration {
        let last = self.last_activity_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.since_origin_ms().saturating_sub(last))
    }

    /// Whether the initial listing has completed at least once.
    pub fn is_listed(&self) -> bool {
        self.listed.load(Ordering::Relaxed)
    }

    /// How often the stream was reopened for this reason.
    pub fn restarts(&self, reason: RestartReason) -> u64 {
        RestartReason::ALL
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.restarts[i].load(Ordering::Relaxed))
    }

    /// Events and listed objects received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The failure that outlasted the backoffs, if the watcher is failing now.
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Counts a handler attempt as active while it lives: the count goes down even when the attempt is
/// cancelled (dropped) before it ends.
pub struct ActiveHandler<'a> {
    observer: &'a dyn Observer,
    finished: bool,
}

impl<'a> ActiveHandler<'a> {
    /// Counts an attempt as started.
    pub fn start(observer: &'a dyn Observer) -> Self {
        observer.handler_started();
        ActiveHandler {
            observer,
            finished: false,
        }
    }

    /// The attempt ended as `run` says.
    pub fn finish(mut self, run: &HandlerRun<'_>) {
        self.finished = true;
        self.observer.handler_finished(run);
    }
}

impl Drop for ActiveHandler<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.observer.handler_dropped();
        }
    }
}

/// The watch streams that run now, for health checks: each supervisor (and the operator's own
/// watchers of namespaces and CRDs) registers its stream's [`WatchStatus`] for as long as it runs.
/// Cheap to clone; all clones share one board.
#[derive(Clone, Default)]
pub struct WatchBoard {
    inner: Arc<Mutex<BoardInner>>,
}

#[derive(Default)]
struct BoardInner {
    entries: BTreeMap<u64, (Arc<str>, Arc<WatchStatus>)>,
}

static NEXT_ENTRY: AtomicU64 = AtomicU64::new(1);

impl WatchBoard {
    /// A new, empty board.
    pub fn new() -> Self {
        WatchBoard::default()
    }

    /// Puts a stream on the board, labelled (`widgets.v1.example.com in default`); it stays until
    /// the returned entry is dropped.
    pub fn register(&self, label: impl Into<Arc<str>>, status: Arc<WatchStatus>) -> BoardEntry {
        let id = NEXT_ENTRY.fetch_add(1, Ordering::Relaxed);
        self.lock().entries.insert(id, (label.into(), status));
        BoardEntry {
            board: self.clone(),
            id,
        }
    }

    /// The streams on the board now, in registration order.
    pub fn streams(&self) -> Vec<(Arc<str>, Arc<WatchStatus>)> {
        self.lock().entries.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BoardInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for WatchBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchBoard")
            .field("streams", &self.lock().entries.len())
            .finish()
    }
}

/// A stream's place on a [`WatchBoard`]; dropping it takes the stream off.
#[derive(Debug)]
pub struct BoardEntry {
    board: WatchBoard,
    id: u64,
}

impl Drop for BoardEntry {
    fn drop(&mut self) {
        self.board.lock().entries.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    #[test]
    fn entries_leave_the_board_when_dropped() {
        let board = WatchBoard::new();
        let first = board.register("widgets.v1.example.com", Arc::default());
        let second = board.register("pods.v1 in default", Arc::default());
        let labels: Vec<String> = board.streams().iter().map(|s| s.0.to_string()).collect();
        assert_eq!(labels, ["widgets.v1.example.com", "pods.v1 in default"]);
        drop(first);
        assert_eq!(&*board.streams()[0].0, "pods.v1 in default");
        drop(second);
        assert!(board.streams().is_empty());
    }

    #[derive(Default)]
    struct Active(AtomicI64, AtomicI64);

    impl Observer for Active {
        fn handler_started(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn handler_finished(&self, run: &HandlerRun<'_>) {
            assert_eq!(run.handler, "h");
            self.0.fetch_sub(1, Ordering::Relaxed);
            self.1.fetch_add(1, Ordering::Relaxed);
        }
        fn handler_dropped(&self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn an_active_handler_is_counted_down_once_finished_or_dropped() {
        let observer = Active::default();
        let finished = ActiveHandler::start(&observer);
        let dropped = ActiveHandler::start(&observer);
        assert_eq!(observer.0.load(Ordering::Relaxed), 2);
        finished.finish(&HandlerRun {
            resource: "widgets.v1.example.com",
            handler: "h",
            verdict: Verdict::Success,
            attempt: 0,
            duration: Duration::ZERO,
            active: true,
        });
        drop(dropped);
        assert_eq!(observer.0.load(Ordering::Relaxed), 0);
        assert_eq!(observer.1.load(Ordering::Relaxed), 1, "one finished run");
    }
}
