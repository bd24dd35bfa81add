//! Processing: one cycle of one object, from an event to one combined patch (`reference/kopf.md` §4,
//! "Processing one event"; Kopf's `process_resource_event`).
//!
//! **Expected flow** of [`Processor::process`], as Kopf's `processing.py`, one named step each:
//! 0. `run_index_handlers`: the object's entries in the indexes are updated ([`crate::intents::indexes`]),
//!    then, until every index is populated, the cycle waits (resource handlers see whole indexes);
//! 1. `run_event_handlers`: `on_event` handlers run (errors are logged and ignored, no progress is
//!    kept);
//! 2. `process_spawning`: which daemons and timers should run now (none during a deletion), told
//!    to the worker before the changing handlers run;
//! 3. `detect_causes`: the essence of the body and the stored diff-base give the diff and the
//!    changing cause;
//! 4. `decide_finalizer`: the finalizer is added when a handler needs it and removed when none does
//!    (a cycle that does either runs no changing handlers: the patch's own event starts the next);
//! 5. `process_changing`: the changing handlers run if the object is consistent (our last patch came
//!    back), per the lifecycle, with their progress read from and written to the object's
//!    annotations. A cause that spans several cycles (a retry, a delay) keeps the essence it started
//!    from, in the worker's memory and on the object ([`crate::storage::diffbase::CAUSE_BASE_KEY`], written
//!    with the progress), for the cycles and restarts to come, with each field handler's field set
//!    to the value that handler last saw. Once every handler of the cause is done, progress is
//!    purged and that becomes the diff-base: not the newest essence, so that whatever changed since
//!    a handler looked is an update after the cause;
//! 6. `run_reconcile`: reconcile handlers ([`crate::intents::reconcile`]) run when their
//!    predicate passes on the object's change since their last run, a related object changed, or
//!    their requeue or retry came due (kept in the object's memory: a pause or a new worker keeps
//!    it); the cycle returns when to wake for the next one ([`Cycle::wake`]);
//! 7. `release_finalizer`: during a deletion, the finalizer goes once no handler is pending and no
//!    daemon or timer still stops, and no reconcile handler with `finalizer()` still has to clean up;
//! 8. `apply_patch`: everything goes out as one combined patch ([`crate::clients::patches::apply`]): the
//!    results first, then the progress and the diff-base.
//!
//! The returned [`Cycle`] says what was [`Written`] (the version to wait for) and the one [`Next`]
//! thing the worker does: idle, await our own patch, retry after a delay, or await daemons.
//!
//! **Guarantees** (at least once: a handler may run again after a crash, nothing is lost)
//! * A handler's result is never lost: it is stored before the record of the handler's success, so
//!   a crash between the two re-runs the handler (Kopf's order loses the result instead).
//! * A handler that succeeded is not run again for the same cause, across cycles and restarts, once
//!   its success is stored.
//! * No change goes unhandled: a change that arrives while a cause is in progress is not absorbed
//!   into it (as in Kopf, where the newest essence becomes the diff-base), but handled after it, as
//!   an update (field handlers see the value the field settled on).
//! * Objects no changing handler could ever match (filters) are left alone: nothing is written
//!   (Kopf's stealth mode).
//! * An API failure that outlives its retries is returned as an error; the worker throttles the object
//!   and tries again, other objects go on.
//!
//! **Caveats**
//! * A cause's base too large for the annotations is kept in memory only: a restart mid-cause then
//!   absorbs a change made meanwhile, as Kopf does.
//! * A diff-base larger than Kubernetes' annotation limit cannot be kept in annotations; it goes to
//!   `status.kopf.last-handled-configuration` (Kopf's status storage format) and into the object's
//!   memory, with a Warning event, so the object is still handled once per change.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::actions::execution::{execute_once, Invocation};
use crate::clients::cache::Caches;
use crate::clients::observe::{NoObserver, Observer};
use crate::clients::patches::{self, ApplyError, Fence, Fenced, ObjectApi, Patch, PatchFn};
use crate::clients::posting::EventPoster;
use crate::intents::handlers::{
    Attempt, ChangingHandler, Ctx, ErrorsMode, HandlerError, HandlerFn, IndexHandler, Memo,
    ResourceHandlers,
};
use crate::intents::indexes::Indexes;
use crate::intents::reconcile::{Action, ReconcileHandler};
use crate::intents::subhandlers::{self, SubRunner, Subhandling, Subrefs};
use crate::storage::diffbase::DiffBaseStorage;
use crate::storage::progress::ProgressStorage;
use crate::storage::progression::{Outcome, State};
use crate::structs::causes::{self, ChangingCause, Reason};
use crate::structs::diffs::{self, resolve, Diff};
use crate::structs::finalizers;
use crate::structs::keys::KeyForming;
use crate::structs::names::EventType;
use crate::structs::names::Verdict;
use crate::structs::resources::{object_key, Resource};
use crate::structs::settings::Settings;
use crate::structs::sharding::{Shard, Standing};
use crate::structs::triggers::{Related, Triggers};

/// The longest a cycle sleeps for a delayed handler before touching the object anyway (Kopf's
/// `WAITING_KEEPALIVE_INTERVAL`: 10 minutes).
pub const WAITING_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(600);

/// Where a status-stored diff-base lives (Kopf's `StatusDiffBaseStorage` default field).
const STATUS_DIFF_BASE: [&str; 2] = [patches::KOPF_STATUS, "last-handled-configuration"];

/// At most this many namespaces' APIs are kept by a processor (`Apis`).
const APIS_KEPT: usize = 256;

/// The APIs the cycles' patches go through, made on first use ([`patches::object_api`]) and kept:
/// one for a cluster-scoped resource, else one per namespace. Making an API per request cost a
/// dozen allocations (its URL, the namespace, the client's handle) and the resource's five strings.
/// Past [`APIS_KEPT`] namespaces the map starts again, so that namespaces come and go without
/// their APIs piling up.
#[derive(Default)]
struct Apis {
    cluster: Option<Arc<ObjectApi>>,
    namespaced: HashMap<String, Arc<ObjectApi>>,
}

/// What one resource's cycles share.
pub struct Processor {
    /// The resource.
    pub resource: Arc<Resource>,
    /// Its handlers.
    pub handlers: Arc<ResourceHandlers>,
    /// The operator's settings.
    pub settings: Arc<Settings>,
    /// The API client.
    pub client: Arc<kube::Client>,
    /// Where Kubernetes Events go.
    pub poster: EventPoster,
    /// The global limit of concurrently running handlers.
    pub limiter: Arc<Semaphore>,
    /// This processor's limit of its cycles' writes in flight
    /// ([`Networking::max_concurrent_writes`](crate::structs::settings::Networking::max_concurrent_writes)).
    writes: Option<Semaphore>,
    /// Where handler runs are counted (metrics).
    pub observer: Arc<dyn Observer>,
    /// The resource as metrics label it (kubectl's form).
    pub label: Arc<str>,
    progress: ProgressStorage,
    diffbase: DiffBaseStorage,
    extra_fields: Vec<Vec<String>>,
    clock: Clock,
    caches: Option<Caches>,
    indexes: Option<Indexes>,
    /// Runs changing handlers and sub-handlers (made on first use, after the builder methods).
    steps: OnceLock<Arc<Steps>>,
    /// The APIs of the objects' namespaces, with this processor's client.
    apis: Mutex<Apis>,
}

/// What runs the due changing handlers of one cause, top-level or sub-handlers (one step of their
/// lifecycle), with what it needs of the processor.
struct Steps {
    settings: Arc<Settings>,
    label: Arc<str>,
    observer: Arc<dyn Observer>,
    progress: ProgressStorage,
    clock: Clock,
}

/// Where processing reads the wall-clock time it stores on objects (when handlers started, until
/// when they are delayed, the touch) and compares with what is stored.
#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    /// The system's clock: what an operator uses.
    #[default]
    System,
    /// Tokio's clock, from an origin: `wall` was the time at `at`. Under tokio's paused time the
    /// stored timestamps move with virtual time only, so a test can assert delays exactly (what
    /// freezegun does for Kopf's tests).
    Tokio {
        /// The wall-clock time at `at`.
        wall: Timestamp,
        /// The origin on tokio's clock.
        at: Instant,
    },
}

impl Clock {
    /// Tokio's clock, reading `wall` now.
    pub fn tokio(wall: Timestamp) -> Clock {
        Clock::Tokio {
            wall,
            at: Instant::now(),
        }
    }

    /// The time now.
    pub fn now(&self) -> Timestamp {
        match self {
            Clock::System => Timestamp::now(),
            Clock::Tokio { wall, at } => wall.checked_add(at.elapsed()).unwrap_or(*wall),
        }
    }
}

/// What survives between the cycles of one object, in memory (Kopf's `ResourceMemory`).
///
/// Every known object has one, so an idle object's memory holds nothing on the heap (see
/// [`ObjectMemory::shed`]): a small allocation kept per object, made during a burst among the
/// workers' and bodies', would keep a page of the burst resident per object after the burst.
pub struct ObjectMemory {
    /// First seen in the initial listing (resume handlers apply).
    pub noticed_by_listing: bool,
    /// A cause was fully handled in this process (resume handlers no longer apply).
    pub fully_handled_once: bool,
    /// Transformations that met a conflict, retried next cycle.
    pub remaining: Vec<PatchFn>,
    /// The diff-base, when it was too large for annotations and the status did not keep it.
    pub oversized_diff_base: Option<Value>,
    /// Daemons and timers (by id) that ended on their own: not started again in this process
    /// (Kopf's `forever_stopped`). Kept here by the worker when it stops.
    pub forever_stopped: Arc<HashSet<String>>,
    /// A hash of the last essence seen, for objects with no diff-base stored (no changing
    /// handlers): what tells an essential change from our own status patches for idle timers.
    pub seen_essence: Option<u64>,
    /// The essence the cause in progress started from, while it spans several cycles (also kept on
    /// the object, [`crate::storage::diffbase::CAUSE_BASE_KEY`], for a restart): the diff-base it leaves.
    pub cause_base: Option<(Reason, Value)>,
    /// The versions our own earlier requests made that a later one superseded, while their events
    /// have not come back (see [`Cycle::superseded`]). Kept here by the worker when it stops: on a
    /// stream lagging behind by more than the idle timeout, they arrive for the next worker.
    pub superseded: Vec<String>,
    /// Each reconcile handler's state, by its index among the resource's reconcile handlers.
    pub reconcile: Vec<ReconcileState>,
    /// Index handlers (by id) that failed for this object: left out for good (None) or until then.
    /// Boxed: most objects never have one, and every object has a memory.
    pub index_excluded: Option<Box<std::collections::HashMap<String, Option<Instant>>>>,
    /// The handover under way (sharding): the assigner asked for the object back. Boxed: almost
    /// always None.
    pub handover: Option<Box<Handover>>,
}

/// The set of no stopped daemons, shared by every memory that has none (copied on write).
fn none_stopped() -> Arc<HashSet<String>> {
    static NONE: OnceLock<Arc<HashSet<String>>> = OnceLock::new();
    NONE.get_or_init(Arc::default).clone()
}

impl Default for ObjectMemory {
    fn default() -> Self {
        ObjectMemory {
            noticed_by_listing: false,
            fully_handled_once: false,
            remaining: Vec::new(),
            oversized_diff_base: None,
            forever_stopped: none_stopped(),
            seen_essence: None,
            cause_base: None,
            superseded: Vec::new(),
            reconcile: Vec::new(),
            index_excluded: None,
            handover: None,
        }
    }
}

impl ObjectMemory {
    /// Lets go of the heap it holds for nothing, once its worker stopped: the capacity of empty
    /// lists, a set of stopped daemons that is empty.
    pub fn shed(&mut self) {
        if self.forever_stopped.is_empty() {
            self.forever_stopped = none_stopped();
        }
        if self.remaining.is_empty() {
            self.remaining = Vec::new();
        }
        if self.superseded.is_empty() {
            self.superseded = Vec::new();
        } else {
            self.superseded.shrink_to_fit();
        }
        if self.reconcile.is_empty() {
            self.reconcile = Vec::new();
        }
    }
}

/// A handover under way (sharding): the object's drain label reached this replica.
#[derive(Debug)]
pub struct Handover {
    /// When the drain label first reached this replica (by a cycle, or by the fence).
    pub since: Instant,
    /// What a cycle could not write because the fence found the drain label: it goes with the
    /// handover, or with the next cycle if the handover is called off.
    pub unsent: Option<serde_json::Map<String, Value>>,
}

impl Handover {
    fn now() -> Box<Handover> {
        Box::new(Handover {
            since: Instant::now(),
            unsent: None,
        })
    }
}

/// What a reconcile handler's runs leave for the next, per object.
#[derive(Default, Clone)]
pub struct ReconcileState {
    /// The body of its last run: what its predicate compares the next change with.
    pub last: Option<Arc<DynamicObject>>,
    /// Consecutive errors (the backoff's step).
    pub failures: u32,
    /// When it runs again with no other trigger: the requeue it asked for, or its retry.
    pub due: Option<Instant>,
    /// A run during the deletion succeeded: it lets the finalizer go.
    pub cleaned: bool,
    /// What triggered a run that failed: given again to its retry.
    pub retry: Option<Triggers>,
}

/// One cycle's input.
pub struct Event {
    /// What happened.
    pub event_type: EventType,
    /// The object.
    pub body: Arc<DynamicObject>,
    /// The object's memo.
    pub memo: Memo,
    /// When the event was received.
    pub received: Instant,
    /// Our last patch came back (or there was none, or the wait timed out).
    pub consistent: bool,
    /// The object's daemons and timers, when the resource has any.
    pub daemons: Option<DaemonsView>,
    /// Not a watch event: the cycle runs for its triggers (a related object, a requeue) on the
    /// newest body the worker has, and `on_event` handlers do not run.
    pub synthetic: bool,
    /// What triggered reconcile handlers since the last cycle, besides the object's own change.
    pub triggers: Triggers,
    /// Set by the worker when a newer event shows the object leaving this replica (sharding): the
    /// cycle starts no more handlers (it checks before each), and its writes meet the fence.
    pub departing: Option<Arc<crate::structs::sharding::Leaving>>,
}

/// What a cycle needs to know of the object's daemons and timers, and where it says which should run.
pub struct DaemonsView {
    /// Handlers (by id) that exited on their own or failed for good: never started again in this
    /// process (Kopf's `forever_stopped`).
    pub excluded: Arc<HashSet<String>>,
    /// Some daemon or timer of the object still runs (and so holds the object's finalizer).
    pub blocking: bool,
    /// Told once per cycle, before the changing handlers run, which should run now.
    pub decide: Box<dyn FnOnce(SpawnDecision) + Send>,
}

/// Which daemons and timers should run, as a cycle decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpawnDecision {
    /// Indices (into the resource's spawning handlers) of those whose filters match; none while the
    /// object is being deleted.
    pub wanted: Vec<usize>,
    /// The object is being deleted, or is gone: they all stop.
    pub deletion: bool,
    /// The object is handed over to another replica (sharding): they all stop
    /// (`OPERATOR_DRAINING`), and none starts.
    pub draining: bool,
    /// The object changed essentially (a non-empty diff against the last handled essence or, when
    /// none is kept, against the essence of the previous event): the idle period of timers starts
    /// again.
    pub essential_change: bool,
}

/// The last handled essence (the diff-base), the current one, and the diff between them.
type Essence = (Option<Value>, Value, Diff);

/// Where the object is in its life, as this cycle's event shows it.
struct Lifecycle {
    /// The deletion was requested (a deletion timestamp).
    deletion_ongoing: bool,
    /// Our finalizer holds the object.
    deletion_blocked: bool,
    /// The object is gone (a `DELETED` event): nothing can be written any more.
    deleted: bool,
}

impl Lifecycle {
    fn of(event: &Event, finalizer: &str) -> Self {
        Lifecycle {
            deletion_ongoing: finalizers::is_deletion_ongoing(&event.body),
            deletion_blocked: finalizers::is_deletion_blocked(&event.body, finalizer),
            deleted: event.event_type == EventType::Deleted,
        }
    }
}

/// What the cycle found of the object's daemons and timers.
#[derive(Debug, Default)]
struct Spawning {
    /// Some daemon or timer should run now.
    wanted: bool,
    /// Some daemon or timer still runs (and holds the finalizer).
    blocking: bool,
}

/// How the changing handlers' part of a cycle went.
#[derive(Debug)]
enum Changing {
    /// No cause to handle, or it waits for the finalizer's patch.
    NotRun,
    /// The body is not consistent yet: the handlers wait for our last patch to come back.
    AwaitOwnPatch,
    /// The handlers ran; those still pending come back after these delays (none: the cause is done).
    Ran { delays: Vec<Duration> },
}

/// Where a cause stands after a cycle.
struct CauseProgress {
    /// Every handler of the cause is done (or there was none): the diff-base is stored.
    done: bool,
    /// The delays of the handlers still pending.
    delays: Vec<Duration>,
    /// The essence the cause started from: the cause's own `new` (shared, not copied) unless it
    /// spans cycles or a field handler's view changed it.
    base: Option<Arc<Value>>,
}

/// What the worker does next, from what the cycle wrote and how its handlers went.
fn next_step(written: &Written, changing: &Changing, awaiting_daemons: bool) -> Next {
    match changing {
        Changing::AwaitOwnPatch => return Next::AwaitOwnPatch,
        Changing::Ran { delays } => {
            if let Some(delay) = delays.iter().min() {
                if *written == Written::Nothing {
                    return Next::RetryAfter((*delay).min(WAITING_KEEPALIVE_INTERVAL));
                }
                tracing::debug!(
                    "Sleeping was skipped because of the patch, {} seconds left.",
                    delay.as_secs_f64()
                );
            } else {
                tracing::debug!("Handling cycle is finished, waiting for new changes.");
            }
        }
        Changing::NotRun => {}
    }
    if awaiting_daemons {
        Next::AwaitDaemons
    } else {
        Next::Idle
    }
}

/// What a cycle came to: what it wrote, and what the worker does next. The worker matches on
/// [`Next`]; no two of its variants can hold at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// What the cycle's patch did to the object.
    pub written: Written,
    /// What comes next for the object.
    pub next: Next,
    /// The versions the cycle's earlier requests made (each request makes one; a cycle sends up to
    /// three): their events carry states older than [`Written::Version`], and the worker skips
    /// them instead of running handlers on them once the consistency timeout has passed.
    pub superseded: Vec<String>,
    /// When a reconcile handler runs again with no other trigger (a requeue, a retry): the worker
    /// wakes the object then, and does not idle out meanwhile.
    pub wake: Option<Duration>,
    /// A cycle on the event of [`Written::Version`] (the echo of our own last write) finds
    /// nothing to do if that event's essence is its diff-base: the cycle handled its cause to the
    /// end, and the resource has nothing else that reads every event. The worker skips that event
    /// when it is so ([`Processor::echo_changes_nothing`]); anything else it brings (a mutating
    /// webhook's change, another writer's, the handler's own change to the spec) runs a cycle as
    /// before.
    pub quiet_echo: bool,
}

impl Default for Cycle {
    fn default() -> Self {
        Cycle {
            written: Written::Nothing,
            next: Next::Idle,
            superseded: Vec::new(),
            wake: None,
            quiet_echo: false,
        }
    }
}

/// How the reconcile handlers' part of a cycle went.
#[derive(Debug, Default)]
struct Reconciled {
    /// When the next one is due.
    wake: Option<Duration>,
    /// A handler with `finalizer()` has not cleaned up after the deletion yet.
    holds_finalizer: bool,
}

/// What a cycle's patch did to the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Nothing was sent.
    Nothing,
    /// The patch was sent, but the object was gone.
    Gone,
    /// Our patch made this version: changing handlers wait until the watch brings it (a version
    /// ending in `~which~never~arrives` when the finalizer was released, as Kopf marks it: the
    /// object is about to vanish and the wait lasts until the consistency timeout).
    Version(String),
    /// The patch was sent, and the answer carried no version to wait for.
    Unversioned,
}

/// What the worker does after a cycle (in the spirit of kube-runtime's `Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing is scheduled: the next event starts the next cycle.
    Idle,
    /// Changing handlers did not run: they wait until our last patch comes back through the watch,
    /// or until the consistency deadline; then the cycle runs again on what it has.
    AwaitOwnPatch,
    /// Handlers are delayed (a retry): sleep this long (at most [`WAITING_KEEPALIVE_INTERVAL`]),
    /// then touch the object, whose event starts the next cycle. Only when nothing was written (a
    /// written patch's own event comes back sooner).
    RetryAfter(Duration),
    /// The object is being deleted and its finalizer stays only for daemons or timers still
    /// stopping: the cycle runs again once the last of them has stopped.
    AwaitDaemons,
}

/// What a sharded replica does with an object's event, before anything else.
enum Gate {
    /// Its handlers run: the object is this replica's.
    Handle,
    /// Nothing runs; the cycle comes to this.
    Skip(Cycle),
    /// The assigner asks for it back: the handover.
    HandOver,
}

/// Where a sharded replica stands with `body`. Its ring membership is read first (see
/// [`Tenure`](crate::structs::sharding::Tenure)): frozen past the renew deadline, this replica's
/// objects may have moved, so it starts nothing until its Lease is renewed. The pause that follows
/// keeps the event for the listing after the resume; the wake covers a renewal that lands just
/// after the deadline, with no pause at all.
fn gate(shard: &Shard, body: &DynamicObject) -> Gate {
    if !shard.tenure().holds() {
        tracing::info!("This replica's ring membership has lapsed (its Lease was not renewed by the renew deadline): nothing starts until it is renewed.");
        return Gate::Skip(Cycle {
            wake: Some(LAPSED_RECHECK),
            ..Cycle::default()
        });
    }
    match shard.standing(body) {
        Standing::Mine => Gate::Handle,
        Standing::NotMine => {
            // A late event, or a trigger on a body that has moved on: its departure follows in
            // the stream.
            tracing::debug!("The object is not this replica's (its shard label names another): nothing is done.");
            Gate::Skip(Cycle::default())
        }
        Standing::Draining => Gate::HandOver,
    }
}

/// How soon a cycle that found this replica's ring membership lapsed looks again, if no pause
/// comes first (a renewal that landed just after the deadline pauses nothing).
pub const LAPSED_RECHECK: Duration = Duration::from_secs(1);

/// Why a cycle failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessingError {
    /// Sending the patch failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
}

impl Processor {
    /// A processor for a resource.
    pub fn new(
        resource: Arc<Resource>,
        handlers: Arc<ResourceHandlers>,
        settings: Arc<Settings>,
        client: Arc<kube::Client>,
        poster: EventPoster,
        limiter: Arc<Semaphore>,
    ) -> Self {
        let persistence = &settings.persistence;
        let keys = KeyForming {
            prefix: persistence.prefix.clone(),
            v1: persistence.v1_keys,
        };
        let progress = ProgressStorage {
            keys: keys.clone(),
            ..ProgressStorage::default()
        };
        let diffbase = DiffBaseStorage {
            keys,
            ..DiffBaseStorage::default()
        };
        let extra_fields = handlers.extra_fields();
        let writes = settings.networking.max_concurrent_writes;
        let writes = (writes > 0).then(|| Semaphore::new(writes));
        Processor {
            observer: Arc::new(NoObserver),
            label: Arc::from(resource.to_string()),
            resource,
            handlers,
            settings,
            client,
            poster,
            limiter,
            writes,
            progress,
            diffbase,
            extra_fields,
            clock: Clock::System,
            caches: None,
            indexes: None,
            steps: OnceLock::new(),
            apis: Mutex::default(),
        }
    }

    /// Handlers read the indexes `indexes` (`ctx.index`), and this resource's index handlers keep
    /// them.
    pub fn with_indexes(mut self, indexes: Indexes) -> Self {
        self.indexes = Some(indexes);
        self
    }

    /// Handlers read the shared caches `caches` (`ctx.cache`).
    pub fn with_caches(mut self, caches: Caches) -> Self {
        self.caches = Some(caches);
        self
    }

    /// Reads the time from `clock` (see [`Clock::Tokio`], for tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Counts handler runs with `observer`.
    pub fn observed(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Runs one cycle (see the module's documentation): Kopf's `process_resource_event`, as named
    /// steps.
    pub async fn process(
        &self,
        mut event: Event,
        memory: &mut ObjectMemory,
    ) -> Result<Cycle, ProcessingError> {
        let now = self.clock.now();
        if event.event_type == EventType::Listed {
            memory.noticed_by_listing = true;
        }
        let sharded = self.settings.shard.as_ref();
        if let Some(shard) = sharded.filter(|_| event.event_type != EventType::Deleted) {
            match gate(shard, &event.body) {
                Gate::Handle => {}
                Gate::Skip(cycle) => return Ok(cycle),
                // Boxed: a handover is rare, and its requests' futures would otherwise be part of
                // every cycle's (a task's size is allocated and copied per cycle).
                Gate::HandOver => return Box::pin(self.drain(shard, &mut event, memory)).await,
            }
        }
        let patch = Patch::new();
        if let Some(unsent) = memory.handover.take().and_then(|h| h.unsent) {
            // The fence stopped it for a handover that did not happen: it goes now.
            patch.merge(Value::Object(unsent));
        }
        // Transformations that met a conflict go first; changing handlers wait until they are out.
        patch.extend_fns(std::mem::take(&mut memory.remaining));
        let leftovers = !patch.is_empty();
        let base = Ctx::new(
            event.event_type,
            event.body.clone(),
            event.memo.clone(),
            self.resource.clone(),
            self.client.clone(),
            event.received.into_std(),
        )
        .with_patch(patch.clone())
        .with_events(self.poster.clone())
        .with_departing(event.departing.clone());
        let base = match &self.caches {
            Some(caches) => base.with_caches(caches.clone()),
            None => base,
        };
        let base = match &self.indexes {
            Some(indexes) => base.with_indexes(indexes.clone()),
            None => base,
        };
        let object = Lifecycle::of(&event, &self.settings.persistence.finalizer);
        if let Some(indexes) = &self.indexes {
            if !event.synthetic && !self.handlers.index.is_empty() {
                self.run_index_handlers(indexes, &base, &object, memory)
                    .await;
            }
            if !indexes.is_ready() {
                tracing::debug!("Waiting for the indexes to be populated.");
                indexes.ready().await;
            }
        }

        if !event.synthetic {
            self.run_event_handlers(&base).await;
        }
        let essence = self
            .needs_essence(&event)
            .then(|| self.essence(&event.body, memory));
        let spawning = self.process_spawning(
            event.daemons.take(),
            &base,
            essence.as_ref(),
            &object,
            memory,
        );
        let mut cause = self.detect_causes(&base, essence, memory);
        // The finalizer added by this cycle's patch: not on the object yet.
        let mut finalizer_coming = false;
        if self.decide_finalizer(&patch, &object, &spawning, cause.as_ref()) {
            // The finalizer's own patch comes back as an event: the cause is handled then.
            cause = None;
            finalizer_coming = !object.deletion_blocked;
        }
        let changing = match &cause {
            Some(ctx) => {
                self.process_changing(ctx, event.consistent, leftovers, memory, now, &spawning)
                    .await
            }
            None => Changing::NotRun,
        };
        let triggers = Arc::new(std::mem::take(&mut event.triggers));
        let reconciled = self
            .run_reconcile(&base, &triggers, &object, finalizer_coming, memory)
            .await;
        let awaiting_daemons =
            self.release_finalizer(&patch, &object, &spawning, &changing, &reconciled);
        if object.deleted {
            return Ok(Cycle::default());
        }
        let (written, superseded, answer) = self.apply_patch(&event.body, &patch, memory).await?;
        let quiet_echo = match (&written, &changing, answer) {
            (Written::Version(_), Changing::Ran { delays }, Some(answer)) => {
                delays.is_empty() && self.quiet_echo(&answer, memory)
            }
            _ => false,
        };
        Ok(Cycle {
            next: next_step(&written, &changing, awaiting_daemons),
            written,
            superseded,
            wake: reconciled.wake,
            quiet_echo,
        })
    }

    /// After a cycle that handled its cause to the end and wrote a version: whether a cycle on
    /// that version's own event finds nothing to do once its essence is its diff-base (checked by
    /// the worker when the event comes, [`Processor::echo_changes_nothing`]). Read from `answer`,
    /// the object as our last request left it (its metadata at least): the event of that version
    /// brings the same object, so its finalizers and deletion are these.
    ///
    /// A cycle on that event would then: run no event, index or reconcile handler, decide no
    /// daemon or timer (the resource has none), find a no-op cause (not a resume: the object was
    /// fully handled once), neither add nor remove the finalizer (no handler needs it, the object
    /// does not have it), have no transformations left over and no handover, and write nothing.
    fn quiet_echo(&self, answer: &DynamicObject, memory: &ObjectMemory) -> bool {
        let handlers = &self.handlers;
        let plain = handlers.event.is_empty()
            && handlers.index.is_empty()
            && handlers.reconcile.is_empty()
            && handlers.spawning.is_empty()
            && !handlers.changing.iter().any(|h| h.requires_finalizer)
            && self.extra_fields.is_empty()
            && self.settings.shard.is_none();
        let settled = memory.fully_handled_once
            && memory.remaining.is_empty()
            && memory.handover.is_none()
            && memory.oversized_diff_base.is_none();
        let finalizer = &self.settings.persistence.finalizer;
        let alive = !finalizers::is_deletion_ongoing(answer)
            && !finalizers::is_deletion_blocked(answer, finalizer);
        plain && settled && alive
    }

    /// Whether the event of our own last write ([`Cycle::quiet_echo`]) brings an essence equal
    /// to its diff-base (a no-op cause), compared in place.
    pub fn echo_changes_nothing(&self, body: &DynamicObject) -> bool {
        // Quietly: an unreadable diff-base runs the cycle, which warns of it.
        self.diffbase
            .fetch_quietly(body)
            .is_some_and(|base| self.diffbase.matches(body, &base))
    }

    /// The handover of an object the assigner asks back (sharding): no handler runs. Its daemons
    /// and timers stop first (`OPERATOR_DRAINING`) and the cycle runs again when the last has
    /// stopped; then what the fence kept from the last cycle is written, and both labels are
    /// removed ([`patches::release`]), each behind the handover's fence. The progress and the
    /// diff-base are on the object already (every cycle writes them), so the next owner resumes it
    /// as after a restart. A rejected request ends the cycle: the next event says what now.
    async fn drain(
        &self,
        shard: &Shard,
        event: &mut Event,
        memory: &mut ObjectMemory,
    ) -> Result<Cycle, ProcessingError> {
        let since = memory.handover.get_or_insert_with(Handover::now).since;
        if let Some(view) = event.daemons.take() {
            let blocking = view.blocking;
            (view.decide)(SpawnDecision {
                draining: true,
                ..SpawnDecision::default()
            });
            if blocking {
                tracing::info!(
                    "Handing the object over: its daemons and timers are stopping first."
                );
                return Ok(Cycle {
                    next: Next::AwaitDaemons,
                    ..Cycle::default()
                });
            }
        }
        let unsent = memory.handover.as_mut().and_then(|h| h.unsent.take());
        let backoffs = &self.settings.networking.error_backoffs;
        let _write = self.write_slot().await;
        let _permit = self.limiter.acquire().await;
        if let Some(unsent) = unsent {
            let changes = patches::Changes {
                merge: unsent,
                fns: Vec::new(),
            };
            let fence = Fence {
                shard,
                draining: true,
            };
            let applied = patches::apply_through(
                &self.api(&event.body),
                &self.resource,
                &event.body,
                changes,
                backoffs,
                Some(fence),
            )
            .await?;
            if applied.gone {
                return Ok(Cycle {
                    written: Written::Gone,
                    ..Cycle::default()
                });
            }
            if let Some(fenced) = applied.fenced {
                tracing::info!(
                    "The handover was called off, or the object moved on: nothing is handed over."
                );
                self.observer.fence_rejected(&self.label);
                if let (Fenced::Draining(unsent), Some(handover)) = (fenced, &mut memory.handover) {
                    handover.unsent = Some(unsent);
                }
                return Ok(Cycle::default());
            }
        }
        match patches::release(&self.client, &self.resource, &event.body, shard, backoffs).await? {
            Some(_) => {
                tracing::info!(
                    "Handed over: the object's shard labels are removed; the assigner gives it to its next owner."
                );
                memory.handover = None;
                self.observer.handed_over(&self.label, since.elapsed());
            }
            None => {
                tracing::info!(
                    "The handover was called off, or the object moved on: nothing is handed over."
                );
                self.observer.fence_rejected(&self.label);
            }
        }
        // Its next event is its departure from this replica's watch (or, called off, a change).
        Ok(Cycle::default())
    }

    /// Whether the cycle needs the object's essence: for changing handlers (their causes) and for
    /// daemons and timers (an essential change restarts the idle clock of timers).
    fn needs_essence(&self, event: &Event) -> bool {
        !self.handlers.changing.is_empty() || event.daemons.is_some()
    }

    /// Kopf's `process_spawning_cause`, its decision part: which daemons and timers should run
    /// now. They are decided before the changing handlers run (they live throughout the object's
    /// life), none while the object is being deleted (they stop as soon as the deletion starts).
    fn process_spawning(
        &self,
        view: Option<DaemonsView>,
        base: &Ctx,
        essence: Option<&Essence>,
        object: &Lifecycle,
        memory: &mut ObjectMemory,
    ) -> Spawning {
        let (Some(view), Some((old, new, diff))) = (view, essence) else {
            return Spawning::default();
        };
        let deletion = object.deletion_ongoing || object.deleted;
        let wanted: Vec<usize> = if deletion {
            Vec::new()
        } else {
            self.handlers
                .spawning
                .iter()
                .enumerate()
                .filter(|(_, h)| !view.excluded.contains(&h.id) && h.filters.matches(base, false))
                .map(|(index, _)| index)
                .collect()
        };
        let essential_change = if old.is_some() {
            !diff.is_empty()
        } else {
            // No diff-base (Kopf resets the idle clock on every event then): compare with the
            // essence of the previous event instead, so a timer's own status patch is quiet.
            let hash = hash_of(new);
            memory.seen_essence.replace(hash) != Some(hash)
        };
        let spawning = Spawning {
            wanted: !wanted.is_empty(),
            blocking: view.blocking,
        };
        (view.decide)(SpawnDecision {
            wanted,
            deletion,
            draining: false,
            essential_change,
        });
        spawning
    }

    /// Kopf's cause detection: the changing cause of this event, in its context, if some changing
    /// handler could match it (a cheap pre-match on the filters that need no cause).
    fn detect_causes(
        &self,
        base: &Ctx,
        essence: Option<Essence>,
        memory: &ObjectMemory,
    ) -> Option<Ctx> {
        if self.handlers.changing.is_empty() {
            return None;
        }
        let (old, new, diff) = essence?;
        let cause = causes::detect(
            base.event_type,
            &base.body,
            &self.settings.persistence.finalizer,
            old,
            Some(new),
            diff,
            memory.noticed_by_listing && !memory.fully_handled_once,
        );
        let ctx = base.clone().with_cause(Arc::new(cause));
        self.handlers
            .changing
            .iter()
            .any(|h| h.filters.prematch(&ctx))
            .then_some(ctx)
    }

    /// Adds the finalizer when something needs it (a delete handler that may run, a daemon or timer
    /// that should run or still runs) and removes it when nothing does. Returns whether it did
    /// either: the changing handlers then wait for the patch's own event.
    fn decide_finalizer(
        &self,
        patch: &Patch,
        object: &Lifecycle,
        spawning: &Spawning,
        cause: Option<&Ctx>,
    ) -> bool {
        let must_block = spawning.wanted
            || spawning.blocking
            || self.handlers.reconcile.iter().any(|h| h.options.finalizer)
            || cause.is_some_and(|ctx| {
                self.handlers
                    .changing
                    .iter()
                    .any(|h| h.requires_finalizer && h.filters.prematch(ctx))
            });
        let finalizer = self.settings.persistence.finalizer.clone();
        if must_block && !object.deletion_blocked && !object.deletion_ongoing {
            tracing::debug!("Adding the finalizer, thus preventing the actual deletion.");
            patch.transform(move |b| finalizers::block_deletion(b, &finalizer));
            return true;
        }
        if !must_block && object.deletion_blocked {
            tracing::debug!("Removing the finalizer, as there are no handlers requiring it.");
            patch.transform(move |b| finalizers::allow_deletion(b, &finalizer));
            return true;
        }
        false
    }

    /// Kopf's `process_changing_cause`, guarded: the handlers run only on a consistent body (our
    /// last patch came back, or the wait for it timed out) and once leftover transformations are
    /// out, so that they never act on a state older than what we wrote.
    async fn process_changing(
        &self,
        ctx: &Ctx,
        consistent: bool,
        leftovers: bool,
        memory: &mut ObjectMemory,
        now: Timestamp,
        spawning: &Spawning,
    ) -> Changing {
        let gone = ctx.reason() == Some(Reason::Gone);
        if !(consistent || gone) || leftovers {
            return Changing::AwaitOwnPatch;
        }
        let delays = self.run_changing(ctx, memory, now, spawning.blocking).await;
        Changing::Ran { delays }
    }

    /// During a deletion, releases the finalizer once nothing holds it: no changing handler is
    /// pending and no daemon or timer still stops. Returns whether the release waits for daemons.
    fn release_finalizer(
        &self,
        patch: &Patch,
        object: &Lifecycle,
        spawning: &Spawning,
        changing: &Changing,
        reconciled: &Reconciled,
    ) -> bool {
        if object.deleted || !object.deletion_ongoing || !object.deletion_blocked {
            return false;
        }
        if reconciled.holds_finalizer {
            tracing::debug!("A reconcile handler has not cleaned up yet; the finalizer stays.");
            return false;
        }
        if spawning.blocking {
            tracing::debug!("Daemons and timers are still stopping; the finalizer stays.");
            return true;
        }
        let pending = match changing {
            Changing::AwaitOwnPatch => true,
            Changing::Ran { delays } => !delays.is_empty(),
            Changing::NotRun => false,
        };
        if !pending {
            tracing::debug!("Removing the finalizer, thus allowing the actual deletion.");
            let finalizer = self.settings.persistence.finalizer.clone();
            patch.transform(move |b| finalizers::allow_deletion(b, &finalizer));
        }
        false
    }

    /// Runs the reconcile handlers that are triggered (see the module's documentation), each at
    /// most once per cycle, in registration order. While the finalizer is `coming` (this cycle's
    /// patch adds it), the handlers that hold it wait for its own event, with what triggered them:
    /// what a handler with cleanup makes exists only once the object cannot go without its cleanup
    /// (the quickstart's controller adds its finalizer before it creates anything, too).
    async fn run_reconcile(
        &self,
        base: &Ctx,
        triggers: &Arc<Triggers>,
        object: &Lifecycle,
        finalizer_coming: bool,
        memory: &mut ObjectMemory,
    ) -> Reconciled {
        let handlers = &self.handlers.reconcile;
        let mut reconciled = Reconciled::default();
        if handlers.is_empty() || object.deleted {
            // Gone: nothing to reconcile, and nothing to wake for.
            return reconciled;
        }
        memory
            .reconcile
            .resize_with(handlers.len(), ReconcileState::default);
        for (handler, state) in handlers.iter().zip(memory.reconcile.iter_mut()) {
            let now = Instant::now();
            let due = state.due.is_some_and(|due| due <= now);
            let cleaning = object.deletion_ongoing && handler.options.finalizer;
            if cleaning && state.cleaned {
                continue;
            }
            let mine = triggers_for(handler, triggers, state.retry.take(), |related| {
                // The event of an owned object brought a version of our own writing that the
                // handler remembered, and nothing newer came: the echo of its own write, not news
                // (here when the watch was quicker than the handler's remembering; else the
                // stream did not route it at all). A change by someone else in between is a newer
                // version, and runs the handler.
                let (Some(caches), Some(version)) = (&self.caches, &related.version) else {
                    return false;
                };
                related.owned
                    && related.event != EventType::Deleted
                    && caches.ours(
                        &related.resource,
                        related.namespace.as_deref(),
                        &related.name,
                        version,
                    )
            });
            let related = !mine.related.is_empty() || mine.overflowed;
            let changed = !handler.options.related_only
                && changed(handler, state.last.as_deref(), &base.body);
            if !(due || related || changed) {
                if let Some(due) = state.due {
                    let left = due.saturating_duration_since(now);
                    reconciled.wake = Some(reconciled.wake.map_or(left, |w| w.min(left)));
                }
                // Not run: what triggered it before waits for its retry still.
                state.retry = (!mine.is_empty() && state.failures > 0).then_some(mine);
                reconciled.holds_finalizer |= cleaning;
                continue;
            }
            if finalizer_coming && handler.options.finalizer {
                // Its triggers and its due time wait with it for the finalizer's event.
                state.retry = (!mine.is_empty()).then_some(mine);
                continue;
            }
            let mine = Arc::new(mine);
            self.reconcile_once(handler, base, &mine, state).await;
            if state.failures > 0 {
                // Its retry is told what this run was: the changes are not lost to an error.
                state.retry = Some(Arc::unwrap_or_clone(mine));
            }
            if let Some(due) = state.due {
                let left = due.saturating_duration_since(Instant::now());
                reconciled.wake = Some(reconciled.wake.map_or(left, |w| w.min(left)));
            }
            reconciled.holds_finalizer |= cleaning && !state.cleaned;
        }
        reconciled
    }

    /// One run of one reconcile handler, its outcome kept in `state`.
    async fn reconcile_once(
        &self,
        handler: &ReconcileHandler,
        base: &Ctx,
        triggers: &Arc<Triggers>,
        state: &mut ReconcileState,
    ) {
        let options = &handler.options;
        let func = match options.timeout {
            Some(timeout) => with_timeout(handler.func.clone(), timeout),
            None => handler.func.clone(),
        };
        let backoff = self.settings.queueing.reconcile_delay(state.failures + 1);
        let ctx = base.clone().with_triggers(triggers.clone());
        let attempt = Attempt::plain(&options.id, options.param.clone(), state.failures);
        let Some((outcome, verdict)) = self
            .run_plain(&func, ErrorsMode::Temporary, backoff, ctx, attempt)
            .await
        else {
            return;
        };
        let now = Instant::now();
        state.last = Some(base.body.clone());
        match (verdict, outcome.delay) {
            (Verdict::Success, _) => {
                state.failures = 0;
                let action = Action::from_value(outcome.result.as_ref());
                state.due = action.requeue_after().map(|after| now + after);
                state.cleaned = finalizers::is_deletion_ongoing(&base.body);
            }
            // Retried: after the backoff (arbitrary errors) or its own delay (temporary ones).
            (_, Some(delay)) if !outcome.final_ => {
                state.failures = state.failures.saturating_add(1);
                state.due = Some(now + delay);
            }
            // Failed for good: until the next trigger.
            _ => {
                state.failures = 0;
                state.due = None;
            }
        }
    }

    /// Kopf's `apply_reaction_outcomes`: everything the cycle gathered goes out as one combined
    /// patch per target ([`patches::apply`]: the results first, then the progress and the
    /// diff-base), minus the touch annotation of an earlier sleep. Returns what it wrote, and the
    /// versions its earlier requests made.
    async fn apply_patch(
        &self,
        body: &DynamicObject,
        patch: &Patch,
        memory: &mut ObjectMemory,
    ) -> Result<(Written, Vec<String>, Option<DynamicObject>), ProcessingError> {
        if patch.is_empty() {
            return Ok((Written::Nothing, Vec::new(), None));
        }
        let mut changes = patch.take();
        let mut merge = Value::Object(std::mem::take(&mut changes.merge));
        self.progress.clear_touch(body, &mut merge);
        if let Value::Object(map) = merge {
            changes.merge = map;
        }
        let applied = self.send(body, changes).await?;
        memory.remaining = applied.remaining;
        match applied.fenced {
            Some(Fenced::Draining(unsent)) => {
                self.observer.fence_rejected(&self.label);
                memory.handover.get_or_insert_with(Handover::now).unsent = Some(unsent);
            }
            Some(Fenced::Moved) => self.observer.fence_rejected(&self.label),
            None => {}
        }
        let written = match (applied.gone, applied.released, applied.resource_version) {
            (true, _, _) => Written::Gone,
            // Every request met a conflict (the body was older than the object): nothing was
            // written, so the version the worker waits for is still the one to wait for. Taken as
            // a write, it would count that version as superseded and skip its event: the last one,
            // after which the object would wait for an event that never comes.
            (false, _, None) if applied.body.is_none() => Written::Nothing,
            (false, _, None) => Written::Unversioned,
            // The object is about to vanish: its next version never arrives, so changing handlers
            // wait out the consistency timeout (or the deletion) instead of running on the stale
            // events of our own intermediate requests (Kopf's trick, same words).
            (false, true, Some(rv)) => Written::Version(format!("{rv}~which~never~arrives")),
            (false, false, Some(rv)) => Written::Version(rv),
        };
        Ok((written, applied.superseded, applied.body))
    }

    /// Touches the object (the touch annotation set to now) so that its next event starts a cycle
    /// after a fully slept delay. Returns the new version.
    pub async fn touch(&self, body: &DynamicObject) -> Result<Option<String>, ProcessingError> {
        let mut merge = json!({});
        self.progress.touch(&mut merge, self.clock.now());
        let changes = patches::Changes {
            merge: merge.as_object().cloned().unwrap_or_default(),
            fns: Vec::new(),
        };
        let applied = self.send(body, changes).await?;
        Ok(applied.resource_version)
    }

    /// A place for one of this processor's writes, while there is a limit
    /// ([`Networking::max_concurrent_writes`](crate::structs::settings::Networking::max_concurrent_writes));
    /// taken before a place of the handlers' limit, which a write holds only while it is sent.
    async fn write_slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match &self.writes {
            Some(writes) => writes.acquire().await.ok(),
            None => None,
        }
    }

    /// Sends changes to the object ([`patches::apply`], with the operator's retries). Patches share
    /// the handlers' limit, and have one of their own per processor (`max_concurrent_writes`): a
    /// listing of thousands of objects must not open thousands of connections to the API server at
    /// once, nor hundreds.
    async fn send(
        &self,
        body: &DynamicObject,
        changes: patches::Changes,
    ) -> Result<patches::Applied, ProcessingError> {
        let _write = self.write_slot().await;
        let _permit = self.limiter.acquire().await;
        let fence = self.settings.shard.as_ref().map(|shard| Fence {
            shard,
            draining: false,
        });
        let applied = patches::apply_through(
            &self.api(body),
            &self.resource,
            body,
            changes,
            &self.settings.networking.error_backoffs,
            fence,
        )
        .await?;
        Ok(applied)
    }

    /// The API the object's patches go through: its namespace's, made once (see `Apis`).
    fn api(&self, body: &DynamicObject) -> Arc<ObjectApi> {
        let make = || Arc::new(patches::object_api(&self.client, &self.resource, body));
        let namespace = body
            .metadata
            .namespace
            .as_deref()
            .filter(|_| self.resource.namespaced);
        let mut apis = self.apis.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(namespace) = namespace else {
            return apis.cluster.get_or_insert_with(make).clone();
        };
        if let Some(api) = apis.namespaced.get(namespace) {
            return api.clone();
        }
        if apis.namespaced.len() >= APIS_KEPT {
            apis.namespaced.clear();
        }
        let api = make();
        apis.namespaced.insert(namespace.to_owned(), api.clone());
        api
    }

    /// The last handled essence (the diff-base), the current one, and the diff between them.
    fn essence(&self, body: &DynamicObject, memory: &ObjectMemory) -> Essence {
        let old = self
            .diffbase
            .fetch(body)
            .or_else(|| status_diff_base(body))
            .or_else(|| memory.oversized_diff_base.clone());
        let new = self.diffbase.essence(body, &self.extra_fields);
        let diff = diffs::diff(old.as_ref(), Some(&new));
        (old, new, diff)
    }

    /// Kopf's indexing: each index handler's result for the object replaces what it gave before;
    /// a gone object, or one its filters no longer pass, gives nothing; an error per the handler's
    /// errors mode. Told to the indexes' readiness either way.
    async fn run_index_handlers(
        &self,
        indexes: &Indexes,
        base: &Ctx,
        object: &Lifecycle,
        memory: &mut ObjectMemory,
    ) {
        let key = object_key(&self.resource, &base.body);
        for handler in &self.handlers.index {
            if object.deleted || !handler.filters.matches(base, false) {
                indexes.remove(&handler.id, &key);
                continue;
            }
            let now = Instant::now();
            if let Some(excluded) = &mut memory.index_excluded {
                match excluded.get(&handler.id) {
                    Some(None) => continue,
                    Some(Some(until)) if *until > now => continue,
                    _ => {}
                }
                excluded.remove(&handler.id);
            }
            if let Some(result) = self.index_once(handler, base, memory).await {
                indexes.replace(&handler.id, &key, &result);
            } else if memory
                .index_excluded
                .as_ref()
                .is_some_and(|excluded| excluded.contains_key(&handler.id))
            {
                indexes.remove(&handler.id, &key);
            }
        }
        indexes.indexed(&key);
    }

    /// One run of an index handler: its result, or None (a null result, or an error: the
    /// exclusion per its errors mode is left in the memory).
    async fn index_once(
        &self,
        handler: &IndexHandler,
        base: &Ctx,
        memory: &mut ObjectMemory,
    ) -> Option<Value> {
        let backoff = handler
            .backoff
            .unwrap_or(self.settings.execution.default_backoff);
        let attempt = Attempt::plain(&handler.id, handler.param.clone(), 0);
        let (outcome, _) = self
            .run_plain(
                &handler.func,
                handler.errors,
                backoff,
                base.clone(),
                attempt,
            )
            .await?;
        let until = match (outcome.error, outcome.delay) {
            (None, _) => return outcome.result,
            (Some(_), Some(delay)) => Some(Instant::now() + delay),
            (Some(_), None) => None,
        };
        memory
            .index_excluded
            .get_or_insert_with(Default::default)
            .insert(handler.id.clone(), until);
        None
    }

    /// One attempt of a handler that keeps no progress (event, index and reconcile handlers),
    /// under the handlers' limit: its outcome, or None when the limit is closed (at exit).
    async fn run_plain(
        &self,
        func: &HandlerFn,
        errors: ErrorsMode,
        backoff: Duration,
        ctx: Ctx,
        attempt: Attempt,
    ) -> Option<(Outcome, Verdict)> {
        let id = attempt.id.clone();
        let retry = attempt.retry;
        let invocation = Invocation {
            id: &id,
            func,
            errors,
            backoff,
            timeout: None,
            retries: None,
            post_events: false,
            resource: &self.label,
            observer: &*self.observer,
            active: true,
        };
        let _permit = self.limiter.acquire().await.ok()?;
        Some(
            execute_once(
                &invocation,
                ctx.with_attempt(attempt),
                retry,
                Duration::ZERO,
            )
            .await,
        )
    }

    async fn run_event_handlers(&self, base: &Ctx) {
        for handler in &self.handlers.event {
            if !handler.filters.matches(base, false) {
                continue;
            }
            let attempt = Attempt::plain(&handler.id, handler.param.clone(), 0);
            let ran = self
                .run_plain(
                    &handler.func,
                    ErrorsMode::Ignored,
                    Duration::ZERO,
                    base.clone(),
                    attempt,
                )
                .await;
            let Some((outcome, _)) = ran else {
                return;
            };
            deliver_result(base.patch(), &handler.id, &outcome);
        }
    }

    /// Kopf's `process_changing_cause`: runs the cause's handlers that are due, and once the cause
    /// is done, stores the diff-base. Returns the delays of the handlers still pending.
    ///
    /// `daemons_running`: the object's daemons or timers are still stopping. A finished deletion
    /// then keeps its progress (the handlers' successes) until the cycle that releases the
    /// finalizer, so that the cycles in between do not run the deletion handlers again.
    async fn run_changing(
        &self,
        ctx: &Ctx,
        memory: &mut ObjectMemory,
        now: Timestamp,
        daemons_running: bool,
    ) -> Vec<Duration> {
        let Some(cause) = ctx.cause() else {
            return Vec::new();
        };
        let progress = if cause.reason.has_handlers() {
            self.handle_cause(ctx, cause, memory, now, daemons_running)
                .await
        } else {
            CauseProgress {
                done: true,
                delays: Vec::new(),
                base: None,
            }
        };
        if progress.done {
            // What the cause's handlers saw: the essence it started from, with each field
            // handler's field as that handler last saw it. A change that arrived while it was in
            // progress is then a change after it, handled by the next cycle.
            if let Some(new) = progress.base.as_deref().or(cause.new.as_deref()) {
                if cause.old.as_deref() != Some(new) {
                    self.store_diff_base(ctx, new, memory);
                }
            }
            memory.fully_handled_once = true;
        }
        match cause.reason {
            Reason::Gone => tracing::debug!("Deleted, really deleted, and we are notified."),
            Reason::Free => {
                tracing::debug!("Deletion, but we are done with it, and we do not care.")
            }
            Reason::Noop => tracing::debug!(
                "Something has changed, but we are not interested (the essence is the same)."
            ),
            _ => {}
        }
        progress.delays
    }

    /// One cycle of a cause with handlers: its progress read from the object, the due handlers
    /// run, and the progress, results and cause-base written to the patch.
    async fn handle_cause(
        &self,
        ctx: &Ctx,
        cause: &ChangingCause,
        memory: &mut ObjectMemory,
        now: Timestamp,
        daemons_running: bool,
    ) -> CauseProgress {
        let (reason, body) = (cause.reason, ctx.body.clone());
        let owned: Vec<&str> = self
            .handlers
            .changing
            .iter()
            .map(|h| h.id.as_str())
            .collect();
        let handlers: Vec<&ChangingHandler> = self
            .handlers
            .changing
            .iter()
            .filter(|h| h.matches(ctx))
            .collect();
        let ids: Vec<&str> = handlers.iter().map(|h| h.id.as_str()).collect();
        let state = State::from_storage(&body, &self.progress, owned.iter().copied(), now);
        let base = self.cause_base(&state, cause, &body, memory);
        let (mut state, mut merge) = self.supersede(state, reason, &ids, &owned, now, &body);
        tracing::debug!("{} is in progress.", capitalize(reason.title()));
        let mut progress = CauseProgress {
            done: handlers.is_empty(),
            delays: Vec::new(),
            base,
        };
        if handlers.is_empty() {
            self.diffbase.clear_cause_base(&body, &mut merge);
            ctx.patch().merge(merge);
            return progress;
        }
        let steps = self.steps();
        let runner: Arc<dyn SubRunner> = steps.clone();
        let outcomes = steps
            .run_due(
                &runner,
                ctx,
                &handlers,
                &state,
                now,
                Some(&self.limiter),
                &[],
            )
            .await;
        let finished_at = self.clock.now();
        state = state.with_outcomes(outcomes.iter().map(|(id, o)| (id.as_str(), o)), finished_at);
        // A finished cause's records are purged below, in this very patch: not encoded at all.
        let purged = state.done() && !(reason == Reason::Delete && daemons_running);
        if purged {
            state.store_purged(&self.progress, &mut merge);
        } else {
            state.store(&self.progress, &mut merge);
        }
        for (id, outcome) in &outcomes {
            deliver_result(ctx.patch(), id, outcome);
        }
        if let Some(base) = progress.base.as_mut() {
            seen_by_field_handlers(base, cause, &handlers, &outcomes);
        }
        if state.done() {
            // Logged by the cycle that finished the cause, once: a deletion's records stay on
            // the object while its daemons stop, and the cycle after that finds it done already.
            if !outcomes.is_empty() {
                let counts = state.counts();
                tracing::info!(
                    "{} is processed: {} succeeded; {} failed.",
                    capitalize(reason.title()),
                    counts.success,
                    counts.failure
                );
            }
            if purged {
                // In the cycle's patch: it holds the records sub-handlers wrote in this very
                // cycle, which are dropped from it (Kopf's purge of what is not on the body yet).
                ctx.patch().merge(std::mem::take(&mut merge));
                ctx.patch().edit(|patch| {
                    state.purge(&body, &self.progress, owned.iter().copied(), patch);
                    self.diffbase.clear_cause_base(&body, patch);
                });
            }
            progress.done = true;
        } else {
            progress.delays = state.delays(finished_at);
            if let Some(base) = &progress.base {
                // Kept for the cycles to come, and on the object with the progress, for a
                // restart; too large for the annotations, the memory keeps it alone.
                memory.cause_base = Some((reason, Value::clone(base)));
                if self.diffbase.fetch_cause_base(&body).as_ref() != Some(&**base) {
                    let _ = self.diffbase.store_cause_base(&body, base, &mut merge);
                }
            }
        }
        ctx.patch().merge(merge);
        progress
    }

    /// The essence this cause started from: kept from its first cycle (in memory, or on the object
    /// for a restart) while its progress is on the object; else this cycle's.
    fn cause_base(
        &self,
        state: &State,
        cause: &ChangingCause,
        body: &DynamicObject,
        memory: &mut ObjectMemory,
    ) -> Option<Arc<Value>> {
        let reason = cause.reason;
        let continued = state
            .iter()
            .any(|(_, s)| s.purpose.as_deref() == Some(reason.as_str()));
        let remembered = memory.cause_base.take().filter(|(r, _)| *r == reason);
        continued
            .then(|| {
                remembered
                    .map(|(_, essence)| essence)
                    .or_else(|| self.diffbase.fetch_cause_base(body))
            })
            .flatten()
            .map(Arc::new)
            .or_else(|| cause.new.clone())
    }

    /// The progress of this cause's handlers; the progress of another cause (a creation still
    /// retrying when an update came) is superseded by this one, and purged (in the returned merge
    /// patch, to which the cycle adds).
    fn supersede(
        &self,
        state: State,
        reason: Reason,
        ids: &[&str],
        owned: &[&str],
        now: Timestamp,
        body: &DynamicObject,
    ) -> (State, Value) {
        let mut merge = json!({});
        let mut state = state
            .with_purpose(reason.as_str(), [])
            .with_handlers(ids.iter().copied(), now);
        let extras = state.extras();
        for (purpose, counts) in &extras {
            tracing::info!(
                "{} is superseded by {}: {} succeeded; {} failed; {} left to the moment.",
                capitalize(&Reason::title_of(purpose)),
                reason.title(),
                counts.success,
                counts.failure,
                counts.running
            );
            state = state.with_purpose(reason.as_str(), ids.iter().copied());
        }
        if !extras.is_empty() {
            state.purge(body, &self.progress, owned.iter().copied(), &mut merge);
        }
        (state, merge)
    }

    /// What runs the due changing handlers and their sub-handlers.
    fn steps(&self) -> &Arc<Steps> {
        self.steps.get_or_init(|| {
            Arc::new(Steps {
                settings: self.settings.clone(),
                label: self.label.clone(),
                observer: self.observer.clone(),
                progress: self.progress.clone(),
                clock: self.clock,
            })
        })
    }

    fn store_diff_base(&self, ctx: &Ctx, essence: &Value, memory: &mut ObjectMemory) {
        let mut merge = json!({});
        match self.diffbase.store(&ctx.body, essence, &mut merge) {
            Ok(()) => {
                memory.oversized_diff_base = None;
                if status_diff_base(&ctx.body).is_some() {
                    ctx.patch().set(
                        &["status", STATUS_DIFF_BASE[0], STATUS_DIFF_BASE[1]],
                        Value::Null,
                    );
                }
                ctx.patch().merge(merge);
            }
            Err(error) => {
                let message = format!(
                    "The last handled configuration cannot be kept in annotations ({error}); it is kept in status.kopf.last-handled-configuration instead."
                );
                tracing::error!("{message}");
                ctx.warn("DiffBaseTooLarge", &message);
                for key in self.diffbase.keys.each(&self.diffbase.key) {
                    if ctx.annotations().contains_key(&key) {
                        ctx.patch().annotation(&key, None);
                    }
                }
                let text = serde_json::to_string(essence).unwrap_or_default();
                ctx.patch().set(
                    &["status", STATUS_DIFF_BASE[0], STATUS_DIFF_BASE[1]],
                    Value::String(text),
                );
                memory.oversized_diff_base = Some(essence.clone());
            }
        }
    }
}

impl Steps {
    /// The handlers that are due (awakened), in the order the lifecycle picks, each once: their
    /// outcomes by id. Top-level handlers take a slot of `limiter` each; sub-handlers run in
    /// their parent's (`None`). Each attempt may register sub-handlers: their ids, at any depth,
    /// go to its outcome's `subrefs`, and to each of `ancestors`.
    #[allow(clippy::too_many_arguments)]
    async fn run_due(
        &self,
        runner: &Arc<dyn SubRunner>,
        ctx: &Ctx,
        handlers: &[&ChangingHandler],
        state: &State,
        now: Timestamp,
        limiter: Option<&Semaphore>,
        ancestors: &[Subrefs],
    ) -> Vec<(String, Outcome)> {
        let Some(cause) = ctx.cause() else {
            return Vec::new();
        };
        let awakened: Vec<&ChangingHandler> = handlers
            .iter()
            .copied()
            .filter(|h| state.get(&h.id).is_some_and(|s| s.awakened(now)))
            .collect();
        let retries: Vec<u32> = awakened
            .iter()
            .map(|h| state.get(&h.id).map_or(0, |s| s.retries))
            .collect();
        let mut outcomes = Vec::new();
        for index in self.settings.execution.lifecycle.plan(&retries) {
            let handler = awakened[index];
            let Some(handler_state) = state.get(&handler.id) else {
                continue;
            };
            let (attempts, runtime) = (handler_state.retries, handler_state.runtime(now));
            let attempt = attempt_for(handler, cause, attempts, runtime, handler_state.started);
            let invocation = Invocation {
                id: &handler.id,
                func: &handler.func,
                errors: handler.options.errors.unwrap_or_default(),
                backoff: handler
                    .options
                    .backoff
                    .unwrap_or(self.settings.execution.default_backoff),
                timeout: handler.options.timeout,
                retries: handler.options.retries,
                post_events: true,
                resource: &self.label,
                observer: &*self.observer,
                active: true,
            };
            let _permit = match (limiter, ctx.departing()) {
                (Some(limiter), Some(leaving)) => tokio::select! {
                    biased;
                    () = leaving.wait() => None,
                    permit = limiter.acquire() => match permit {
                        Ok(permit) => Some(permit),
                        Err(_) => break,
                    },
                },
                (Some(limiter), None) => match limiter.acquire().await {
                    Ok(permit) => Some(permit),
                    Err(_) => break,
                },
                (None, _) => None,
            };
            if ctx.is_departing() {
                // Sharding: checked again before each handler, after the wait for a slot. The
                // handlers not started are the next owner's.
                tracing::debug!(handler = %handler.id, "The object is leaving this replica: the handler is not started here.");
                break;
            }
            if self
                .settings
                .shard
                .as_ref()
                .is_some_and(|shard| !shard.tenure().holds())
            {
                // Sharding: the membership lapsed while the cycle ran or waited for a slot (a
                // frozen process thawing). The handlers not started stay due: the next cycle, on
                // this replica once its Lease is renewed or on the next owner, runs them.
                tracing::info!(handler = %handler.id, "This replica's ring membership has lapsed: the handler is not started.");
                break;
            }
            let own = Subrefs::default();
            let mut lineage = ancestors.to_vec();
            lineage.push(own.clone());
            let sub = Arc::new(Subhandling::new(&handler.id, lineage, runner.clone()));
            let ctx = ctx.clone().with_attempt(attempt);
            let (mut outcome, _) =
                subhandlers::scoped(sub, execute_once(&invocation, ctx, attempts, runtime)).await;
            outcome.subrefs = own
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect();
            outcomes.push((handler.id.clone(), outcome));
        }
        outcomes
    }
}

impl SubRunner for Steps {
    /// Kopf's `kopf.execute()`: the sub-handlers' records read from the object, the due ones run
    /// once, their records and results added to the cycle's patch, their ids to every ancestor's
    /// `subrefs`; unfinished ones make the parent retry when the earliest is due.
    fn run<'a>(
        &'a self,
        runner: Arc<dyn SubRunner>,
        ctx: &'a Ctx,
        handlers: Vec<ChangingHandler>,
        ancestors: Vec<Subrefs>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        async move {
            let Some(cause) = ctx.cause() else {
                return Err(HandlerError::msg(
                    "sub-handlers run only inside changing handlers (create, update, delete, resume, field)",
                ));
            };
            let now = self.clock.now();
            let owned = handlers.iter().map(|h| h.id.as_str());
            let matching: Vec<&ChangingHandler> = handlers.iter().filter(|h| h.matches(ctx)).collect();
            let state = State::from_storage(&ctx.body, &self.progress, owned, now)
                .with_purpose(cause.reason.as_str(), [])
                .with_handlers(matching.iter().map(|h| h.id.as_str()), now);
            let outcomes = self
                .run_due(&runner, ctx, &matching, &state, now, None, &ancestors)
                .await;
            let finished = self.clock.now();
            let state =
                state.with_outcomes(outcomes.iter().map(|(id, o)| (id.as_str(), o)), finished);
            let mut merge = json!({});
            state.store(&self.progress, &mut merge);
            ctx.patch().merge(merge);
            for (id, outcome) in &outcomes {
                deliver_result(ctx.patch(), id, outcome);
            }
            for (id, _) in state.iter() {
                for subrefs in &ancestors {
                    subrefs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id.to_string());
                }
            }
            if state.done() {
                Ok(())
            } else {
                let delay = state.delays(finished).into_iter().min().unwrap_or_default();
                Err(HandlerError::ChildrenRetry { delay })
            }
        }
        .boxed()
    }
}

/// Sets, in the cause's base, each field whose handler just succeeded to the value it saw (this
/// cycle's essence): the base then holds, field by field, what the field handlers last saw, and the
/// rest as the cause started. A field handler that saw an intermediate value (the field changed
/// mid-cause and changed back after) gets the change to the value the field settled on as an update
/// after the cause, instead of the diff-base claiming it saw the start.
fn seen_by_field_handlers(
    base: &mut Arc<Value>,
    cause: &ChangingCause,
    handlers: &[&ChangingHandler],
    outcomes: &[(String, Outcome)],
) {
    let Some(new) = cause.new.as_deref() else {
        return;
    };
    for (id, outcome) in outcomes {
        if outcome.error.is_some() || !outcome.final_ {
            continue;
        }
        let field = handlers
            .iter()
            .find(|h| h.id == *id)
            .and_then(|h| h.filters.field.as_ref());
        let Some((field, (last, parents))) = field.and_then(|f| Some((f, f.split_last()?))) else {
            continue;
        };
        // Copied only here, when a field handler's view differs from the cause's `new`.
        let base = Arc::make_mut(base);
        match resolve(new, field) {
            Some(_) => diffs::cherrypick(new, base, std::slice::from_ref(field)),
            None => {
                let parent = parents
                    .iter()
                    .try_fold(&mut *base, |value, key| value.get_mut(key));
                if let Some(Value::Object(fields)) = parent {
                    fields.remove(last);
                }
            }
        }
    }
}

/// The triggers of this cycle that concern the handler (related kinds it owns or watches; a
/// requeue), after those of its failed run if it is retried; `echo` leaves out the changes that
/// are only the operator's own writes coming back.
fn triggers_for(
    handler: &ReconcileHandler,
    triggers: &Triggers,
    retry: Option<Triggers>,
    echo: impl Fn(&Related) -> bool,
) -> Triggers {
    let mut mine = retry.unwrap_or_default();
    mine.absorb(Triggers {
        related: triggers
            .related
            .iter()
            .filter(|r| handler.options.relates_to(&r.resource) && !echo(r))
            .cloned()
            .collect(),
        overflowed: triggers.overflowed,
        requeued: triggers.requeued,
    });
    mine
}

/// Whether the object changed for the handler since its last run: always on the first sight and
/// at the start of the deletion; otherwise as its predicate says (any new version by default).
fn changed(handler: &ReconcileHandler, last: Option<&DynamicObject>, body: &DynamicObject) -> bool {
    let Some(last) = last else {
        return true;
    };
    if last.metadata.deletion_timestamp.is_none() && body.metadata.deletion_timestamp.is_some() {
        return true;
    }
    match &handler.options.predicate {
        Some(predicate) => predicate.test(last, body),
        None => last.metadata.resource_version != body.metadata.resource_version,
    }
}

/// The function, cancelled after `timeout` with an error (retried with the backoff).
fn with_timeout(
    func: crate::intents::handlers::HandlerFn,
    timeout: Duration,
) -> crate::intents::handlers::HandlerFn {
    Arc::new(move |ctx| {
        let call = func(ctx);
        async move {
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| {
                    Err(crate::intents::handlers::HandlerError::msg(format!(
                        "timed out after {} seconds (cancelled while running)",
                        timeout.as_secs_f64()
                    )))
                })
        }
        .boxed()
    })
}

/// A hash of a JSON value (of its serialisation; keys are ordered).
fn hash_of(value: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    hasher.finish()
}

/// A diff-base kept in the status (Kopf's `StatusDiffBaseStorage` format: a JSON string).
fn status_diff_base(body: &DynamicObject) -> Option<Value> {
    let text = body
        .data
        .get("status")?
        .get(STATUS_DIFF_BASE[0])?
        .get(STATUS_DIFF_BASE[1])?
        .as_str()?;
    match serde_json::from_str::<Value>(text) {
        Ok(value) if value.is_object() => Some(value),
        _ => {
            tracing::warn!("status.kopf.last-handled-configuration is not a JSON object; it is treated as absent");
            None
        }
    }
}

/// A handler's attempt: its kwargs, and for field handlers the values reduced to the field.
fn attempt_for(
    handler: &ChangingHandler,
    cause: &ChangingCause,
    retry: u32,
    runtime: Duration,
    started: Timestamp,
) -> Attempt {
    let mut attempt = Attempt {
        id: handler.id.as_str().into(),
        param: handler.options.param.clone(),
        retry,
        started: Some(started),
        runtime,
        old: None,
        new: None,
        diff: None,
        reduced: false,
    };
    if let Some(field) = &handler.filters.field {
        attempt.reduced = true;
        attempt.old = cause
            .old
            .as_deref()
            .and_then(|v| resolve(v, field))
            .cloned()
            .map(Arc::new);
        attempt.new = cause
            .new
            .as_deref()
            .and_then(|v| resolve(v, field))
            .cloned()
            .map(Arc::new);
        attempt.diff = Some(Arc::new(cause.diff.reduce(field)));
    }
    attempt
}

/// Stores a result in `status.<id>`: an object is merged into what is there, anything else replaces.
pub fn deliver_result(patch: &Patch, id: &str, outcome: &Outcome) {
    if outcome.error.is_some() {
        return;
    }
    if let Some(result) = &outcome.result {
        patch.merge(json!({ "status": { id: result } }));
    }
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod memory_tests {
    use super::ObjectMemory;
    use std::sync::Arc;

    #[test]
    fn an_idle_memory_sheds_empty_capacity_and_keeps_what_it_knows() {
        let mut memory = ObjectMemory::default();
        memory.superseded.reserve(16);
        Arc::make_mut(&mut memory.forever_stopped).insert("d1".into());
        memory.shed();
        assert_eq!(memory.superseded.capacity(), 0);
        assert!(
            memory.forever_stopped.contains("d1"),
            "what ended stays ended"
        );

        // An emptied set is the shared empty one again; writing to it copies it.
        let mut other = ObjectMemory::default();
        Arc::make_mut(&mut memory.forever_stopped).clear();
        memory.shed();
        assert!(Arc::ptr_eq(&memory.forever_stopped, &other.forever_stopped));
        Arc::make_mut(&mut other.forever_stopped).insert("d2".into());
        assert!(memory.forever_stopped.is_empty());

        let mut kept = ObjectMemory::default();
        kept.superseded.push("12".into());
        kept.shed();
        assert_eq!(kept.superseded, ["12"], "versions still awaited are kept");
    }
}

#[cfg(test)]
mod api_tests {
    use super::*;

    fn processor(resource: Resource) -> Processor {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Processor::new(
            Arc::new(resource),
            Arc::new(ResourceHandlers::default()),
            Arc::new(Settings::default()),
            Arc::new(kube::Client::try_from(config).unwrap()),
            EventPoster::disabled(),
            Arc::new(Semaphore::new(1)),
        )
    }

    fn object(namespace: Option<&str>) -> DynamicObject {
        let mut object = DynamicObject::new(
            "w",
            &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        object.metadata.namespace = namespace.map(str::to_string);
        object
    }

    #[tokio::test]
    async fn each_namespace_has_its_api_made_once_and_the_kept_ones_are_bounded() {
        let widgets = processor(Resource::namespaced(
            "example.com",
            "v1",
            "Widget",
            "widgets",
        ));
        let first = widgets.api(&object(Some("ns1")));
        assert_eq!(
            first.api().resource_url(),
            "/apis/example.com/v1/namespaces/ns1/widgets"
        );
        assert!(Arc::ptr_eq(&first, &widgets.api(&object(Some("ns1")))));
        let other = widgets.api(&object(Some("ns2")));
        assert_eq!(
            other.api().resource_url(),
            "/apis/example.com/v1/namespaces/ns2/widgets"
        );
        assert!(!Arc::ptr_eq(&first, &other));

        // Many namespaces: the map starts again rather than growing.
        for n in 0..APIS_KEPT + 10 {
            let namespace = format!("many-{n}");
            let api = widgets.api(&object(Some(&namespace)));
            assert_eq!(
                api.api().resource_url(),
                format!("/apis/example.com/v1/namespaces/{namespace}/widgets")
            );
        }
        let kept = widgets.apis.lock().unwrap().namespaced.len();
        assert!(kept <= APIS_KEPT, "{kept} namespaces' APIs kept");

        // A cluster-scoped resource: one API, whatever the object says of a namespace.
        let mut nodes = Resource::namespaced("", "v1", "Node", "nodes");
        nodes.namespaced = false;
        let nodes = processor(nodes);
        let api = nodes.api(&object(None));
        assert_eq!(api.api().resource_url(), "/api/v1/nodes");
        assert!(Arc::ptr_eq(&api, &nodes.api(&object(Some("ns1")))));
    }
}
