//! The ResourceSupervisor: one actor per served (resource, namespace). It owns the watch stream and the
//! records of that stream's objects, and routes each event to the object's [`ObjectWorker`].
//!
//! **Expected flow**: on start it runs a [`Watcher`] as a task on one of the object threads, with that
//! thread's client (on the operator's runtime when there are none): JSON decoding happens there, not
//! on the actors' thread, and the bodies are made on a thread that runs workers, not on a third
//! one; each batch comes back as a message, acknowledged only
//! once routed, so a slow supervisor slows the stream down instead of piling batches up. Events are
//! routed by `metadata.uid` (or a key made of kind, apiVersion, name, namespace and creation time when
//! there is no uid, as Kopf does); a worker is started on an object's first event.
//!
//! **Reconcile handlers**: a resource with reconcile handlers keeps each object's newest body in
//! its record and in the resource's shared cache ([`Store`]), applied before the event is routed
//! (a handler never reads a cache older than its trigger). Triggers from related objects come as
//! [`Poke`]s, by owner uid or by name, and go to the object's worker like an event (a worker is
//! started for them with the record's body if none runs); while paused, they are kept with the
//! object's record and go with its first event after the resume (the listing dispatches it even
//! if it did not change).
//!
//! **Guarantees**
//! * After a relist (410 Gone), an object whose resourceVersion did not change since it was last seen
//!   is not dispatched again; an object that vanished during the gap is dispatched as `Deleted` (with
//!   the identity it was last seen with, the last body is not kept).
//! * An object's record (memo, last resourceVersion) lives until the object is deleted, whether or not
//!   its worker is running.
//! * An object's memory (resume and retry bookkeeping) has one owner at a time: the record while no
//!   worker runs, the worker while one does, which gives it back when it stops ([`Returned`]).
//!   An event that comes while it is on its way back is held (the newest only) and dispatched to
//!   the next worker with it; so no worker ever starts with a memory that another still has.
//! * Failures the watcher recovers from are retried there (and recorded in its `WatchStatus`); one it
//!   cannot recover from (the resource is no longer served, or the request is rejected) ends the
//!   supervisor, logged; the operator drops it or starts it again when discovery says so.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::sync::Arc;
use tokio::time::Instant;

use actix::prelude::*;
use compact_str::CompactString;
use kactor_reactor::cache::{Caches, Store};
use kactor_reactor::handlers::{Memo, ResourceHandlers};
use kactor_reactor::indexes::Indexes;
use kactor_reactor::observe::{BoardEntry, Observer, WatchBoard};
use kactor_reactor::posting::EventPoster;
use kactor_reactor::processing::{ObjectMemory, Processor};
use kactor_reactor::resources::Resource;
use kactor_reactor::settings::Settings;
use kactor_reactor::sharding::Standing;
use kactor_reactor::stopping::StopReason;
use kactor_reactor::triggers::{Related, Trigger, Triggers};
use kactor_reactor::watching::{EventType, WatchError, WatchItem, WatchStatus, Watcher};
use kube::api::{DynamicObject, ObjectMeta};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;

use crate::daemons::{ApiSink, DaemonEnv};
use crate::keys::RecordKey;
use crate::objects::{ActorEnv, ObjectHost, ObjectKey};
use crate::system::ObjectThreads;
use crate::tracker::Tracker;
pub use kactor_reactor::resources::object_key as key_of;

use crate::worker::{
    self, Admission, Deliver, Idle, Interrupted, ObjectWorker, Returned, Stop, WorkerShared,
};

/// How many batches may wait to be routed while the watch stream fetches the next one.
const IN_FLIGHT: usize = 4;

/// What a supervisor needs.
#[derive(Clone)]
pub struct SupervisorConfig {
    /// The resource to watch.
    pub resource: Arc<Resource>,
    /// The namespace, or None for cluster-wide (and for cluster-scoped resources).
    pub namespace: Option<String>,
    /// The client.
    pub client: kube::Client,
    /// The resource's handlers.
    pub handlers: Arc<ResourceHandlers>,
    /// Where Kubernetes Events about objects go.
    pub poster: EventPoster,
    /// The operator's settings.
    pub settings: Arc<Settings>,
    /// The runtime that runs the daemons and timers (and the watch stream and the cycles, when
    /// there are no object threads).
    pub runtime: Handle,
    /// Where the workers start and their cycles run, and the watch stream; none: the workers on
    /// the supervisor's thread, their cycles and the stream on `runtime`.
    pub object_threads: ObjectThreads,
    /// The global limit of concurrently running handlers.
    pub limiter: Arc<Semaphore>,
    /// The handler tasks in flight.
    pub tracker: Arc<Tracker>,
    /// The daemon and timer tasks in flight.
    pub daemon_tracker: Arc<Tracker>,
    /// Hooks for metrics.
    pub observer: Arc<dyn Observer>,
    /// Where the watch stream's health is shown (for `/healthz` and `/readyz`).
    pub watches: WatchBoard,
    /// Start without watching (the operator is paused); a [`Resume`] starts the stream.
    pub start_paused: bool,
    /// The users' object actors of this resource: each seen object has one of each, stopped when
    /// the object is deleted, the supervisor pauses or stops.
    pub actors: Vec<Arc<dyn ObjectHost>>,
    /// The operator's shared caches: handlers read them (`ctx.cache`), and a resource with
    /// reconcile handlers keeps its own store there up to date from this supervisor's stream.
    pub caches: Option<Caches>,
    /// The operator's indexes: handlers read them (`ctx.index`), this resource's index handlers
    /// keep them, and the first listing of an indexed resource is told to their readiness.
    pub indexes: Option<Indexes>,
}

/// A supervisor's label: the resource, and the namespace it watches (in logs, on the watch board,
/// and in the indexes' readiness).
pub fn label_of(resource: &Resource, namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => format!("{resource} in {namespace}"),
        None => resource.to_string(),
    }
}

/// One batch from the watch stream, with its place among those waiting to be routed (given back
/// when the batch is dropped, routed or not).
#[derive(Message)]
#[rtype(result = "()")]
struct Batch(
    Vec<WatchItem>,
    Instant,
    u64,
    tokio::sync::OwnedSemaphorePermit,
    /// The places of its listed objects in the admission window (none: admitted without one).
    Option<tokio::sync::OwnedSemaphorePermit>,
);

/// Flow control of a listing ([`Queueing::admission_window`](kactor_reactor::settings::Queueing::admission_window)):
/// a batch with listed objects is routed once each of them has a place in the window (at most
/// `patience` later), and each place is given back when that object's first cycle ends. Watch
/// events are never held back: they are what the operator is there for, and come one by one.
struct AdmissionWindow {
    places: Option<Arc<Semaphore>>,
    size: usize,
    patience: std::time::Duration,
    /// Resource handlers wait until the indexes are populated, which needs the whole listing:
    /// holding places until then could never end.
    indexes: Option<Indexes>,
    label: String,
}

impl AdmissionWindow {
    fn new(
        queueing: &kactor_reactor::settings::Queueing,
        indexes: Option<Indexes>,
        label: String,
    ) -> Self {
        let size = queueing.admission_window.min(Semaphore::MAX_PERMITS);
        AdmissionWindow {
            places: (size > 0).then(|| Arc::new(Semaphore::new(size))),
            size,
            patience: queueing.admission_patience,
            indexes,
            label,
        }
    }

    /// Waits for places for the batch's listed objects (at most the patience), and takes them.
    async fn admit(&mut self, batch: &[WatchItem]) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let places = self.places.as_ref()?;
        if self
            .indexes
            .as_ref()
            .is_some_and(|indexes| !indexes.is_ready())
        {
            return None;
        }
        let listed = batch
            .iter()
            .filter(|item| matches!(item, WatchItem::Listed(_)))
            .count();
        if listed == 0 {
            return None;
        }
        let wanted = u32::try_from(listed.min(self.size)).unwrap_or(u32::MAX);
        let waiting = places.clone().acquire_many_owned(wanted);
        match tokio::time::timeout(self.patience, waiting).await {
            Ok(Ok(taken)) => Some(taken),
            Ok(Err(_)) => None,
            Err(_) => {
                tracing::debug!(
                    supervisor = %self.label,
                    "The listing goes on: {} listed objects are still in their first cycle after {:?}.",
                    self.size - places.available_permits(),
                    self.patience,
                );
                None
            }
        }
    }
}

/// The watch stream ended for good.
#[derive(Message)]
#[rtype(result = "()")]
struct WatchEnded(WatchError, u64);

/// Stop watching and stop every worker (in-flight handlers go on; shutdown drains them).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

/// Stop the watch stream and keep every object's record: the operator is paused (peering, leader
/// election). Handlers already running finish; daemons and timers stop (`OPERATOR_PAUSING`);
/// scheduled retries are dropped and done again after the resume. The answer comes once every
/// worker has taken the pause: from then on, none starts a cycle until the first event after the
/// resume.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Pause;

/// Watch again after a pause: a fresh listing, with unchanged objects skipped and vanished ones
/// dispatched as deleted, as after a 410.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resume;

/// A related object changed: trigger the reconcile handlers of the object named (by uid, else by
/// namespace and name).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Poke {
    /// The object's uid (an owner reference's).
    pub uid: Option<String>,
    /// Its namespace.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// What changed.
    pub related: Related,
}

/// How many objects the supervisor knows, and how many have a running worker.
#[derive(Message)]
#[rtype(result = "Census")]
pub struct Count;

/// The answer to [`Count`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub struct Census {
    /// Objects known (not deleted).
    pub objects: usize,
    /// Of which with a running worker.
    pub workers: usize,
}

/// Where an object's memory is: with its record, or lent to a worker (by the worker's number),
/// which gives it back when it stops ([`Returned`]).
enum Memory {
    Here(ObjectMemory),
    Lent(u64),
}

/// What the supervisor keeps of an object, running worker or not.
///
/// Idle, a record holds nothing on the heap in the usual case (short names, no memo used, nothing
/// pending): it lives in the records' table alone. Records are made while a burst of workers runs,
/// and a small allocation of each, left among the freed workers' and bodies', would keep a page
/// of the burst resident per object long after it (about 4 KB per object at 100,000 objects).
struct Record {
    /// The last resourceVersion seen.
    rv: CompactString,
    /// The identity, to report a vanished object.
    name: CompactString,
    namespace: Option<CompactString>,
    /// Whether the key is the object's uid (else the object had none).
    keyed_by_uid: bool,
    /// Events sent to the object so far.
    sent: u64,
    /// The user's state for this object: made for the first worker, let go when a worker stops
    /// and nothing was put in it.
    memo: Option<Memo>,
    /// The framework's state for this object (resume and retry bookkeeping): owned by the record
    /// while no worker runs, by the worker while one does.
    memory: Memory,
    /// The last worker stopped with work scheduled (a pause): the next listing dispatches the
    /// object even if it did not change. Told by the worker ([`Interrupted`]), cleared when an
    /// event is dispatched.
    interrupted: bool,
    /// The newest event that came while the memory was on its way back from a stopping worker:
    /// dispatched to the next worker once it is back.
    held: Option<Box<Deliver>>,
    /// The running worker, if any.
    worker: Option<Addr<ObjectWorker>>,
    /// The newest body, for resources with reconcile handlers: a trigger may need a worker.
    body: Option<Arc<DynamicObject>>,
    /// Triggers that came while paused: they go with the object's next event (the listing after
    /// the resume dispatches it).
    paused_triggers: Option<Box<Triggers>>,
    /// The object left this replica's shard while its worker still had its memory: the record
    /// goes when the memory is back, unless the object came back meanwhile (sharding).
    departed: bool,
    /// Its last event asked for it back (sharding): its DELETED is the end of the handover.
    draining: bool,
    /// Paused since its last event, and not brought by the listing after the resume yet: what the
    /// record and the worker hold may be from before the pause (its object may even have moved to
    /// another replica meanwhile), so a trigger waits for the listing as it does while paused.
    relisting: bool,
}

impl Record {
    /// The object's uid, known from the key it is kept under.
    fn uid(&self, key: &RecordKey) -> Option<String> {
        self.keyed_by_uid.then(|| key.to_key().to_string())
    }
}

/// The actor of one watched (resource, namespace).
pub struct ResourceSupervisor {
    config: SupervisorConfig,
    label: String,
    records: HashMap<RecordKey, Record>,
    /// Keys seen in the listing under way, to find what vanished when it completes.
    listing: HashSet<RecordKey>,
    watch: Option<tokio::task::JoinHandle<()>>,
    /// Counts the streams started: what an earlier (aborted) stream still had in flight is dropped.
    generation: u64,
    shared: Option<Arc<WorkerShared>>,
    /// Each object thread, with what its workers share: as `shared`, with the processor that
    /// uses that thread's own client (when it has one). Empty: the workers start here.
    threads: Vec<(actix::ArbiterHandle, Arc<WorkerShared>)>,
    /// The stream's health, across the streams of pauses and resumes.
    status: Arc<WatchStatus>,
    /// The stream's place on the board, while the supervisor runs.
    entry: Option<BoardEntry>,
    /// The resource as metrics label it.
    resource_label: Arc<str>,
    /// The number of the last worker started (a worker gives the memory back under it).
    workers_started: u64,
    /// The resource's shared cache, for resources with reconcile handlers.
    store: Option<Store>,
    /// Its own address, once started (for the answers of its own tasks); weak, so that it keeps
    /// nothing alive.
    me: Option<actix::WeakAddr<ResourceSupervisor>>,
}

/// Whether a DELETED event of a sharded operator is the object's departure from its shard.
enum Departure {
    Departed,
    Deleted,
    /// The event cannot tell: the API server sends an object that leaves a selector as it was
    /// before (still labelled for us), as it sends a deletion. The object is read to tell.
    Unsure,
}

/// What reading the object of an unsure DELETED told: alive (it left the shard) or not.
#[derive(Message)]
#[rtype(result = "()")]
struct Confirmed {
    key: Arc<str>,
    body: Arc<DynamicObject>,
    /// The record's event count when it was asked: a newer event makes the answer moot.
    sent: u64,
    alive: bool,
    received: Instant,
}

impl ResourceSupervisor {
    /// A supervisor; start it with `Actor::start` on the actors' thread.
    pub fn new(config: SupervisorConfig) -> Self {
        let label = label_of(&config.resource, config.namespace.as_deref());
        // On the board from the start: readiness waits for this stream's listing as soon as the
        // supervisor exists, not only once it started.
        let status = Arc::new(WatchStatus::new());
        status.set_paused(config.start_paused);
        let entry = Some(config.watches.register(label.as_str(), status.clone()));
        let resource_label: Arc<str> = Arc::from(config.resource.to_string());
        let store = config
            .caches
            .as_ref()
            .filter(|_| !config.handlers.reconcile.is_empty())
            .map(|caches| caches.store(&config.resource, &config.observer));
        config
            .observer
            .resource_served(&resource_label, &config.handlers.ids());
        ResourceSupervisor {
            resource_label,
            config,
            label,
            records: HashMap::new(),
            listing: HashSet::new(),
            watch: None,
            generation: 0,
            shared: None,
            threads: Vec::new(),
            status,
            entry,
            workers_started: 0,
            store,
            me: None,
        }
    }

    fn route(
        &mut self,
        event_type: EventType,
        object: DynamicObject,
        received: Instant,
        admission: Option<Admission>,
    ) {
        let key = key_of(&self.config.resource, &object);
        let body = Arc::new(object);
        if let Some(store) = &self.store {
            // Before anything is routed: a handler never reads a cache older than its trigger.
            store.apply(event_type, &body);
        }
        if event_type != EventType::Deleted && self.shared.is_some() {
            // Before the unchanged check: after a resume, an unchanged object gets its actors again.
            for host in &self.config.actors {
                host.seen(&body);
            }
        }
        if event_type == EventType::Deleted {
            match self.departure(&key, &body) {
                Departure::Departed => return self.depart(&key),
                Departure::Unsure => return self.confirm_departure(key, body, received),
                Departure::Deleted => {}
            }
        }
        self.route_body(event_type, key, body, received, admission);
    }

    /// [`ResourceSupervisor::route`], once the cache has the event and a deletion is known to be one.
    fn route_body(
        &mut self,
        event_type: EventType,
        key: Arc<str>,
        body: Arc<DynamicObject>,
        received: Instant,
        admission: Option<Admission>,
    ) {
        let object = &*body;
        let rv = object
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default();
        let record_key = RecordKey::of(&key);
        if let Some(record) = self.records.get_mut(&record_key) {
            record.relisting = false;
        }
        if event_type == EventType::Listed {
            self.listing.insert(record_key.clone());
            let unchanged = self
                .records
                .get(&record_key)
                .is_some_and(|r| r.rv == rv && !r.interrupted);
            if unchanged {
                return;
            }
        }
        if self.shared.is_none() {
            return;
        }
        let record = self
            .records
            .entry(record_key.clone())
            .or_insert_with(|| Record {
                rv: CompactString::default(),
                name: object.metadata.name.as_deref().unwrap_or_default().into(),
                namespace: object
                    .metadata
                    .namespace
                    .as_deref()
                    .map(CompactString::from),
                keyed_by_uid: object
                    .metadata
                    .uid
                    .as_deref()
                    .is_some_and(|u| !u.is_empty()),
                sent: 0,
                memo: None,
                memory: Memory::Here(ObjectMemory::default()),
                interrupted: false,
                held: None,
                worker: None,
                body: None,
                paused_triggers: None,
                departed: false,
                draining: false,
                relisting: false,
            });
        record.departed = false;
        if record.rv != rv {
            record.rv = CompactString::from(rv);
        }
        record.sent += 1;
        record.interrupted = false;
        if let Some(shard) = &self.config.settings.shard {
            // What a DELETED of it will mean: the end of our handover, or a deletion.
            record.draining = shard.standing(object) == Standing::Draining;
        }
        if self.store.is_some() {
            record.body = Some(body.clone());
        }
        let mut deliver = Deliver::event(event_type, body, record.sent, received);
        deliver.admission = admission;
        if let Some(triggers) = record.paused_triggers.take() {
            deliver.triggers = *triggers;
        }
        self.dispatch(key, record_key, deliver);
    }

    /// Sends the event to the object's worker, starting one with the object's memory if none runs;
    /// holds it while the memory is on its way back from a stopping worker. A deletion removes the
    /// record once dispatched (the worker finishes its last cycle on its own).
    fn dispatch(&mut self, key: Arc<str>, record_key: RecordKey, deliver: Deliver) {
        let (Some(shared), Some(record)) = (self.shared.clone(), self.records.get_mut(&record_key))
        else {
            return;
        };
        let deleted = deliver.event_type == EventType::Deleted;
        if let Some(worker) = &record.worker {
            worker.do_send(deliver);
        } else if let Memory::Lent(_) = record.memory {
            let deliver = match record.held.take() {
                Some(held) => {
                    self.config
                        .observer
                        .events_coalesced(&self.resource_label, 1);
                    deliver.coalesce(*held)
                }
                None => deliver,
            };
            record.held = Some(Box::new(deliver));
            // The record stays until the memory is back and the deletion dispatched.
            return;
        } else {
            self.workers_started += 1;
            let number = self.workers_started;
            let Memory::Here(memory) = std::mem::replace(&mut record.memory, Memory::Lent(number))
            else {
                return;
            };
            let memo = record.memo.get_or_insert_with(Memo::default).clone();
            // In turn, so that each object thread gets as many workers.
            let placed = match self.threads.len() {
                0 => None,
                len => self.threads.get((number % len as u64) as usize),
            };
            let worker = match placed {
                Some((thread, shared)) => {
                    let made = ObjectWorker::new(key.clone(), number, memo, memory, shared.clone());
                    ObjectWorker::start_in_arbiter(thread, move |_| made)
                }
                None => ObjectWorker::new(key.clone(), number, memo, memory, shared).start(),
            };
            worker.do_send(deliver);
            record.worker = Some(worker);
        }
        if deleted {
            if let Some(record) = self.records.remove(&record_key) {
                self.actors_gone(&record_key, &record, StopReason::ResourceDeleted);
            }
        }
    }

    /// What a DELETED event means to a sharded operator: the object left this replica's shard
    /// (handed over, relabelled), or was deleted. Its labels name another replica, or none (an
    /// object that vanished while the stream was down is known only by its identity: it may live
    /// on, elsewhere): it left. A deletion timestamp: deleted. Its handover was under way: it left.
    /// Otherwise the event cannot tell (see [`Departure::Unsure`]). Unsharded: a deletion.
    fn departure(&self, key: &Arc<str>, body: &DynamicObject) -> Departure {
        let Some(shard) = &self.config.settings.shard else {
            return Departure::Deleted;
        };
        if shard.standing(body) == Standing::NotMine {
            return Departure::Departed;
        }
        if body.metadata.deletion_timestamp.is_some() {
            return Departure::Deleted;
        }
        match self.records.get(&RecordKey::of(key)) {
            Some(record) if record.draining => Departure::Departed,
            Some(_) => Departure::Unsure,
            // Never seen: nothing here to stop, or to tell of its deletion.
            None => Departure::Departed,
        }
    }

    /// Reads the object of an unsure DELETED: alive with the same uid, it left this shard; gone, it
    /// was deleted. The answer comes back as [`Confirmed`]; a failed read counts as a departure (no
    /// deletion is told that may not be one; a listing tells the rest).
    fn confirm_departure(&mut self, key: Arc<str>, body: Arc<DynamicObject>, received: Instant) {
        let (Some(me), Some(record)) = (self.me.clone(), self.records.get(&RecordKey::of(&key)))
        else {
            return;
        };
        let sent = record.sent;
        let config = &self.config;
        let api = kactor_reactor::slim::api(
            config.client.clone(),
            body.metadata
                .namespace
                .as_deref()
                .filter(|_| config.resource.namespaced),
            &config.resource.api_resource(),
        );
        let backoffs = config.settings.networking.error_backoffs.clone();
        config.runtime.spawn(async move {
            let name = body.metadata.name.clone().unwrap_or_default();
            let read = kactor_reactor::api::retrying(&backoffs, "the object (departed?)", || {
                api.get_opt(&name)
            })
            .await;
            let alive = match read {
                Ok(Some(object)) => object.into_inner().metadata.uid == body.metadata.uid,
                Ok(None) => false,
                Err(_) => true,
            };
            if let Some(me) = me.upgrade() {
                me.do_send(Confirmed {
                    key,
                    body,
                    sent,
                    alive,
                    received,
                });
            }
        });
    }

    /// The object is no longer this replica's: its worker stops after its cycle under way (whose
    /// writes the fence rejects), its daemons and timers stop (`OPERATOR_DRAINING`), its actors
    /// go, and so does its record, once the worker has given its memory back. Nothing of a
    /// deletion happens: no handlers, no `DELETED` for event handlers.
    fn depart(&mut self, key: &Arc<str>) {
        tracing::debug!(supervisor = %self.label, object = %key, "the object left this replica's shard");
        if let Some(indexes) = &self.config.indexes {
            for handler in &self.config.handlers.index {
                indexes.remove(&handler.id, key);
            }
        }
        let record_key = RecordKey::of(key);
        let Some(record) = self.records.get_mut(&record_key) else {
            return;
        };
        if let Some(worker) = record.worker.take() {
            worker.do_send(worker::Depart);
        }
        record.held = None;
        record.body = None;
        record.paused_triggers = None;
        if let Memory::Lent(_) = record.memory {
            record.departed = true;
        } else if let Some(record) = self.records.remove(&record_key) {
            self.actors_gone(&record_key, &record, StopReason::OperatorDraining);
        }
    }

    /// Stops the object's actors, for `reason`.
    fn actors_gone(&self, key: &RecordKey, record: &Record, reason: StopReason) {
        if self.config.actors.is_empty() {
            return;
        }
        let object = ObjectKey {
            namespace: record.namespace.as_deref().map(String::from),
            name: record.name.to_string(),
        };
        let uid = record.uid(key);
        for host in &self.config.actors {
            host.gone(&object, uid.as_deref(), reason);
        }
    }

    /// Where the watch stream runs, and its client: on one of the object threads (chosen by the
    /// supervisor's label), with that thread's client, so that its socket, its decoding and the
    /// bodies it makes stay on one thread, where the workers of some of its objects run too; with
    /// no object threads, on the operator's runtime.
    fn watch_thread(&self) -> (Handle, kube::Client) {
        let threads = &self.config.object_threads;
        if threads.is_empty() {
            return (self.config.runtime.clone(), self.config.client.clone());
        }
        let hash = std::hash::BuildHasher::hash_one(
            &foldhash::fast::FixedState::with_seed(0),
            &self.label,
        );
        let thread = threads
            .iter()
            .nth((hash % threads.len() as u64) as usize)
            .expect("an object thread");
        let client = thread
            .client
            .clone()
            .unwrap_or_else(|| self.config.client.clone());
        (thread.runtime.clone(), client)
    }

    /// Starts the watch stream: a fresh listing, then watching.
    fn start_watching(&mut self, ctx: &mut Context<Self>) {
        let config = &self.config;
        let (runtime, client) = self.watch_thread();
        let api = kactor_reactor::slim::api(
            client,
            config
                .namespace
                .as_deref()
                .filter(|_| config.resource.namespaced),
            &config.resource.api_resource(),
        );
        let mut watcher = Watcher::new(
            api,
            self.label.clone(),
            config.settings.watching.clone(),
            config.settings.networking.clone(),
        )
        .observed(config.observer.clone(), self.resource_label.clone())
        .with_status(self.status.clone());
        if let Some(shard) = &config.settings.shard {
            // Only this replica's objects: an object that leaves the selector (handed over,
            // relabelled) comes as DELETED with its new labels, which `route` tells from a deletion.
            watcher = watcher.labels(&shard.selector());
        }
        self.status.set_paused(false);
        self.listing.clear();
        if let Some(store) = &self.store {
            store.listing_started(config.namespace.as_deref());
        }
        self.generation += 1;
        let generation = self.generation;
        let address = ctx.address();
        let mut admission = AdmissionWindow::new(
            &config.settings.queueing,
            config.indexes.clone(),
            self.label.clone(),
        );
        tracing::debug!(supervisor = %self.label, "watching");
        self.watch = Some(runtime.spawn(async move {
            // Up to IN_FLIGHT batches wait to be routed while the next page is fetched and decoded;
            // beyond that the stream waits for the supervisor (backpressure, not an unbounded
            // backlog). Each batch is queued at once and in order: `do_send` never parks a message,
            // where `send` parks it when the mailbox is full (triggers of related kinds fill it),
            // to be delivered only when its future is polled again, which a stream waiting for its
            // next event never does: a listing's last page could wait for good, or be overtaken.
            //
            // The next page is fetched while a batch waits for room in the admission window, so
            // the window's wait and the page's round trip overlap.
            let (pages, mut fetched) = tokio::sync::mpsc::channel(1);
            let fetch = async move {
                loop {
                    let batch = watcher.next_batch().await;
                    let ended = batch.is_err();
                    if pages.send((batch, Instant::now())).await.is_err() || ended {
                        break;
                    }
                }
                // The routing below ends the task, once it has routed what was fetched.
                std::future::pending::<()>().await;
            };
            let route = async move {
                let permits = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
                while let Some((batch, received)) = fetched.recv().await {
                    match batch {
                        Ok(batch) => {
                            let Ok(permit) = permits.clone().acquire_owned().await else {
                                return;
                            };
                            let admitted = admission.admit(&batch).await;
                            if !address.connected() {
                                return;
                            }
                            address.do_send(Batch(batch, received, generation, permit, admitted));
                        }
                        Err(error) => {
                            // Told after every batch before it was routed (their permits are back).
                            let _ = permits.acquire_many(IN_FLIGHT as u32).await;
                            address.do_send(WatchEnded(error, generation));
                            return;
                        }
                    }
                }
            };
            tokio::select! {
                () = fetch => {}
                () = route => {}
            }
        }));
    }

    /// A listing completed: whatever was known but not listed vanished while the stream was down.
    fn finish_listing(&mut self, received: Instant) {
        if let Some(store) = &self.store {
            store.listing_done(self.config.namespace.as_deref());
        }
        let listed = std::mem::take(&mut self.listing);
        if let Some(indexes) = &self.config.indexes {
            if !self.config.handlers.index.is_empty() {
                indexes.stream_listed(&self.label, listed.iter().map(RecordKey::to_key));
            }
        }
        let vanished: Vec<RecordKey> = self
            .records
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        for record_key in vanished {
            let Some(record) = self.records.get(&record_key) else {
                continue;
            };
            let key = record_key.to_key();
            let body = DynamicObject {
                types: Some(kube::api::TypeMeta {
                    api_version: self.config.resource.api_version(),
                    kind: self.config.resource.kind.clone(),
                }),
                metadata: ObjectMeta {
                    name: Some(record.name.to_string()),
                    namespace: record.namespace.as_deref().map(String::from),
                    uid: record.uid(&record_key),
                    resource_version: Some(record.rv.to_string()),
                    ..ObjectMeta::default()
                },
                data: serde_json::Value::Object(Default::default()),
            };
            tracing::debug!(supervisor = %self.label, object = %key, "the object vanished while the stream was down; dispatching its deletion");
            self.route(EventType::Deleted, body, received, None);
        }
    }
}

impl Actor for ResourceSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.me = Some(ctx.address().downgrade());
        let config = &self.config;
        let client = Arc::new(config.client.clone());
        let daemons = (!config.handlers.spawning.is_empty()).then(|| {
            Arc::new(DaemonEnv {
                resource: config.resource.clone(),
                handlers: config.handlers.clone(),
                client: client.clone(),
                poster: config.poster.clone(),
                limiter: config.limiter.clone(),
                default_backoff: config.settings.execution.default_backoff,
                sink: Arc::new(ApiSink {
                    client: config.client.clone(),
                    resource: config.resource.clone(),
                    backoffs: config.settings.networking.error_backoffs.clone(),
                    shard: config.settings.shard.clone(),
                }),
                observer: config.observer.clone(),
                label: self.resource_label.clone(),
                runtime: config.runtime.clone(),
                tracker: config.daemon_tracker.clone(),
                caches: config.caches.clone(),
                indexes: config.indexes.clone(),
                tenure: config
                    .settings
                    .shard
                    .as_ref()
                    .map(|shard| shard.tenure().clone()),
            })
        });
        let processor = |client: Arc<kube::Client>| {
            let processor = Processor::new(
                config.resource.clone(),
                config.handlers.clone(),
                config.settings.clone(),
                client,
                config.poster.clone(),
                config.limiter.clone(),
            )
            .observed(config.observer.clone());
            let processor = match &config.caches {
                Some(caches) => processor.with_caches(caches.clone()),
                None => processor,
            };
            Arc::new(match &config.indexes {
                Some(indexes) => processor.with_indexes(indexes.clone()),
                None => processor,
            })
        };
        let common = processor(client);
        for host in &config.actors {
            host.bind(ActorEnv {
                runtime: config.runtime.clone(),
                tracker: config.daemon_tracker.clone(),
                observer: config.observer.clone(),
            });
            config.observer.actors_served(host.name());
        }
        let shared = Arc::new(WorkerShared {
            processor: common.clone(),
            runtime: config.runtime.clone(),
            in_place: !config.object_threads.is_empty(),
            tracker: config.tracker.clone(),
            idle_timeout: config.settings.queueing.idle_timeout,
            consistency_timeout: config.settings.persistence.consistency_timeout,
            error_delays: config.settings.queueing.error_delays.clone().into(),
            supervisor: ctx.address().recipient(),
            returns: ctx.address().recipient(),
            interruptions: ctx.address().recipient(),
            daemons,
        });
        self.threads = config
            .object_threads
            .iter()
            .map(|thread| {
                let shared = match &thread.client {
                    Some(client) => Arc::new(WorkerShared {
                        processor: processor(Arc::new(client.clone())),
                        ..(*shared).clone()
                    }),
                    None => shared.clone(),
                };
                (thread.arbiter.clone(), shared)
            })
            .collect();
        self.shared = Some(shared);
        if config.start_paused {
            tracing::debug!(supervisor = %self.label, "starting paused");
        } else {
            self.start_watching(ctx);
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
        self.entry = None;
        for record in self.records.values_mut() {
            if let Some(worker) = record.worker.take() {
                worker.do_send(Stop);
            }
        }
        for (key, record) in &self.records {
            self.actors_gone(key, record, StopReason::OperatorExiting);
        }
        tracing::debug!(supervisor = %self.label, "stopped watching");
    }
}

impl Handler<Batch> for ResourceSupervisor {
    type Result = ();

    fn handle(
        &mut self,
        Batch(items, received, generation, _routing, mut admitted): Batch,
        _: &mut Context<Self>,
    ) {
        if generation != self.generation || self.watch.is_none() {
            // From a stream stopped by a pause: the listing after the resume sees it all anew.
            return;
        }
        for item in items {
            match item {
                WatchItem::Listed(object) => {
                    // Its place goes with its delivery; an object left as it is gives it back now.
                    let place = admitted
                        .as_mut()
                        .and_then(|places| places.split(1))
                        .map(|place| Admission(Arc::new(place)));
                    self.route(EventType::Listed, object, received, place)
                }
                WatchItem::ListDone => self.finish_listing(received),
                WatchItem::Event(event_type, object) => {
                    self.route(event_type, object, received, None)
                }
            }
        }
    }
}

impl Handler<WatchEnded> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, WatchEnded(error, generation): WatchEnded, ctx: &mut Context<Self>) {
        if generation != self.generation || self.watch.is_none() {
            return;
        }
        match &error {
            WatchError::NotServed { .. } => {
                tracing::warn!(supervisor = %self.label, %error, "the resource is no longer served; not watching it any more")
            }
            WatchError::Rejected { .. } => {
                tracing::error!(supervisor = %self.label, %error, "the watch cannot go on")
            }
        }
        ctx.stop();
    }
}

impl Handler<Confirmed> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, confirmed: Confirmed, _: &mut Context<Self>) {
        let current = self
            .records
            .get(&RecordKey::of(&confirmed.key))
            .is_some_and(|record| record.sent == confirmed.sent);
        if !current {
            // A newer event came meanwhile (it came back), or the record went: moot.
            return;
        }
        if confirmed.alive {
            self.depart(&confirmed.key);
        } else {
            let Confirmed {
                key,
                body,
                received,
                ..
            } = confirmed;
            self.route_body(EventType::Deleted, key, body, received, None);
        }
    }
}

impl Handler<Idle> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, idle: Idle, _: &mut Context<Self>) {
        if let Some(record) = self.records.get_mut(&RecordKey::of(&idle.key)) {
            if record.sent == idle.seq {
                if let Some(worker) = record.worker.take() {
                    worker.do_send(Stop);
                }
            }
        }
    }
}

impl Handler<Returned> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, returned: Returned, _: &mut Context<Self>) {
        let record_key = RecordKey::of(&returned.key);
        let Some(record) = self.records.get_mut(&record_key) else {
            // The object was deleted meanwhile: its memory goes with it.
            return;
        };
        if !matches!(record.memory, Memory::Lent(number) if number == returned.number) {
            // From a worker of an object of the same key that was deleted and made again.
            return;
        }
        let mut memory = returned.memory;
        memory.shed();
        if record.departed {
            // It left this replica's shard while the worker ran.
            if let Some(record) = self.records.remove(&record_key) {
                self.actors_gone(&record_key, &record, StopReason::OperatorDraining);
            }
            crate::memory::worker_released(&self.config.runtime);
            return;
        }
        record.memory = Memory::Here(memory);
        if record.memo.as_ref().is_some_and(Memo::is_unused) {
            record.memo = None;
        }
        crate::memory::worker_released(&self.config.runtime);
        if let Some(held) = record.held.take() {
            self.dispatch(returned.key, record_key, *held);
        }
    }
}

impl Handler<Interrupted> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, interrupted: Interrupted, _: &mut Context<Self>) {
        let record_key = RecordKey::of(&interrupted.key);
        let Some(record) = self.records.get_mut(&record_key) else {
            return;
        };
        if !matches!(record.memory, Memory::Lent(number) if number == interrupted.number) {
            return;
        }
        // For the listing after the resume.
        record.interrupted = true;
        let Some(dropped) = interrupted.dropped else {
            return;
        };
        if self.watch.is_none() || record.relisting || dropped.seq != record.sent {
            // Paused still, or the listing after the resume has not brought it yet: that listing
            // dispatches it. Or a newer event was sent to the worker, which runs a cycle when it
            // comes.
            return;
        }
        // Resumed already, and nothing newer sent: the listing may have passed the object (a
        // cycle that ran through the pause dropped its retry only as it ended). Its newest event
        // again; a listing still to bring it adds one more, which the worker coalesces.
        record.sent += 1;
        let mut deliver = Deliver::event(
            dropped.event_type,
            dropped.body,
            record.sent,
            Instant::now(),
        );
        deliver.triggers = dropped.triggers;
        self.dispatch(interrupted.key, record_key, deliver);
    }
}

impl Handler<Shutdown> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Pause> for ResourceSupervisor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Pause, ctx: &mut Context<Self>) -> ResponseFuture<()> {
        if let Some(watch) = self.watch.take() {
            watch.abort();
            tracing::debug!(supervisor = %self.label, "paused");
        }
        self.status.set_paused(true);
        // Nothing is touched while paused: workers drop their scheduled retries and touches, and
        // stop their daemons and timers; such objects are dispatched again by the listing after
        // the resume (see `route`), and idle workers stop as usual meanwhile.
        for record in self.records.values_mut() {
            record.relisting = true;
        }
        let mut paused = Vec::new();
        for (key, record) in &self.records {
            if let Some(worker) = &record.worker {
                paused.push(worker.send(worker::Pause));
            }
            self.actors_gone(key, record, StopReason::OperatorPausing);
        }
        let (taken, all_taken) = tokio::sync::oneshot::channel::<()>();
        if paused.is_empty() {
            let _ = taken.send(());
        } else {
            // Nothing else is handled until every worker has taken the pause: what a worker drops
            // it tells (`Interrupted`) before it answers, so that the listing after a resume, whose
            // pages come after it, dispatches the object again. Without the wait, a resume's
            // listing could be routed first: the actors' thread polls an actor woken from another
            // thread (the supervisor, by the listing's page) before those woken from its own (the
            // workers, by the pause) now and then, and the object was taken for unchanged.
            ctx.wait(
                futures::future::join_all(paused)
                    .into_actor(self)
                    .map(move |_, _, _| {
                        let _ = taken.send(());
                    }),
            );
        }
        Box::pin(async move {
            let _ = all_taken.await;
        })
    }
}

impl Handler<Resume> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, _: Resume, ctx: &mut Context<Self>) {
        if self.watch.is_none() {
            self.start_watching(ctx);
        }
    }
}

impl Handler<Poke> for ResourceSupervisor {
    type Result = ();

    fn handle(&mut self, poke: Poke, _: &mut Context<Self>) {
        let uid = poke.uid.or_else(|| {
            let cache = self.store.as_ref()?.cache();
            let object = cache.get(poke.namespace.as_deref(), &poke.name)?;
            object.metadata.uid.clone()
        });
        let Some(uid) = uid else {
            return;
        };
        let key: Arc<str> = Arc::from(uid.as_str());
        let record_key = RecordKey::of(&key);
        let Some(record) = self.records.get_mut(&record_key) else {
            // Not seen yet: its first event runs its reconcile handlers anyway.
            return;
        };
        if self.watch.is_none() || record.relisting {
            // Paused, or resumed with the listing still to bring it: kept for the object's next
            // event, which that listing brings (as an interrupted object, even if it did not
            // change), so that the trigger runs on the object as it is now.
            record
                .paused_triggers
                .get_or_insert_with(Default::default)
                .add(Trigger::Related(poke.related));
            record.interrupted = true;
            return;
        }
        let Some(body) = record.body.clone() else {
            return;
        };
        record.sent += 1;
        let deliver = Deliver::trigger(Trigger::Related(poke.related), body, record.sent);
        self.dispatch(key, record_key, deliver);
    }
}

impl Handler<Count> for ResourceSupervisor {
    type Result = Census;

    fn handle(&mut self, _: Count, _: &mut Context<Self>) -> Census {
        Census {
            objects: self.records.len(),
            workers: self.records.values().filter(|r| r.worker.is_some()).count(),
        }
    }
}
