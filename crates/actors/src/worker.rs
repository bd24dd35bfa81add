//! The ObjectWorker: one actor per object, the only place where that object is handled.
//!
//! **Expected flow**: the supervisor sends each of the object's events as [`Deliver`]. An idle worker
//! starts a processing cycle at once ([`Processor::process`], a task: on the worker's own object thread,
//! beside it, or on the operator's runtime when there are no object threads, never on the actors'
//! thread); a busy one keeps only the newest event (coalescing), so the next cycle
//! sees the newest body, never a backlog of stale states. What the worker does is one [`Phase`]
//! at a time, and every transition is the pure [`phase::step`] (tested by tables there); this
//! actor keeps the data and carries out the effects. When a cycle ends, the worker:
//! * starts the next cycle if an event came meanwhile;
//! * or, when changing handlers wait for our own last patch to come back through the watch, waits for
//!   it until `persistence.consistency_timeout`, then runs the cycle again on what it has;
//! * or idles; when the cycle handled its cause to the end and said a cycle on its own last
//!   write's event would find nothing to do ([`Cycle::quiet_echo`]), that event runs no cycle if
//!   its essence is its diff-base (anything else it brings, a webhook's or another writer's
//!   change in the same version, runs one);
//! * or, when handlers are delayed (a retry), sleeps that long and then touches the object, whose
//!   event starts the next cycle; any event that comes first ends the sleep at once;
//! * or, when the cycle failed unexpectedly (an API failure that outlived its retries), throttles the
//!   object per `queueing.error_delays` (1, 1, 2, 3, 5, ... s; reset by a success), keeping the newest
//!   event meanwhile, then tries again;
//! * or idles.
//!
//! **Guarantees**
//! * One cycle at a time per object; events are handled in arrival order (minus the coalesced ones).
//! * A handler's error or panic is that handler's failure; other handlers and objects go on.
//! * Every log line of a cycle carries the object (the `object` span).
//! * The object's memory (resume and retry bookkeeping) is the worker's while it runs: lent by the
//!   supervisor's record at start, moved into each cycle and back, and given back to the
//!   supervisor ([`Returned`]) when the worker stops, so it survives idling. Dropped work that the
//!   supervisor must know of (a pause) is told to it ([`Interrupted`]); nothing is shared.
//!
//! **Daemons and timers** ([`ObjectDaemons`]) belong to the worker: each cycle decides which should
//! run (before the changing handlers), every event replaces the live body they read, and when the
//! last one holding the object stops (during a deletion, a filter change, or on its own) the cycle
//! runs again at once, so the finalizer is released without waiting for another event. A pause
//! ([`Pause`]) stops them; the next event after the resume starts them again. What ended on its own
//! is remembered in the object's memory and never started again in this process.
//!
//! **Reconcile triggers**: besides the object's own events, a worker is sent triggers for its
//! reconcile handlers ([`Deliver::synthetic`]: a related object changed, routed by its supervisor)
//! and wakes itself when a requeue or a retry comes due ([`Cycle::wake`]). A trigger runs a cycle
//! on the newest body the worker has, as an event would (never two at once); triggers that come
//! while a cycle runs are gathered into the next one, and never replace a pending event (they join
//! it). A trigger (or a skipped event carrying triggers) that reaches a worker whose only body is a
//! version our own later write superseded waits for the next delivery that runs a cycle (that
//! write's event follows). A due wake keeps the worker from idling out; a pause drops the timer
//! (the due time stays in the object's memory, and the listing after the resume brings the object
//! back), and a cycle that ends during the pause arms none: it tells the supervisor
//! ([`Interrupted`], with its event), which dispatches the object again if the resume came first.
//! A trigger the supervisor routes after the resume ends the worker's pause as an event does (it
//! sends none while paused, and keeps them for the object's next event instead).
//!
//! **Idling**: after `queueing.idle_timeout` with nothing to do, nothing scheduled and no daemon or
//! timer running, the worker tells the supervisor, which stops it only if no event was sent since
//! (the supervisor is the only sender, so none is in flight). A listed object whose first cycle
//! found nothing to do (no request, nothing scheduled, as after a restart) does not wait: its
//! worker reports idle at once, unless the resource has daemons, timers or reconcile handlers
//! (whose children's events follow their first run). While it waits, a worker keeps the last
//! event's body only when daemons, timers or reconcile handlers may still need it; a worker of
//! changing and event handlers alone waits without it (the next cycle needs a next event).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use kactor_reactor::daemons::StopReason;
use kactor_reactor::handlers::Memo;
use kactor_reactor::processing::{
    Cycle, DaemonsView, Event, Next, ObjectMemory, ProcessingError, Processor, SpawnDecision,
    Written,
};
use kactor_reactor::triggers::{Trigger, Triggers};
use kactor_reactor::watching::EventType;
use kube::api::DynamicObject;
use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::daemons::{DaemonEnv, ObjectDaemons, Report, Reporter};
use crate::phase::{self, Effect, Facts, Input, Phase};
use crate::tracker::Tracker;

/// How many resourceVersions of events arrived during a cycle are kept to recognise our own patch's.
const ARRIVED_KEPT: usize = 16;
/// At most this many superseded versions are kept (the newest): a cycle adds up to three, and the list
/// empties when the last version written comes back.
const SUPERSEDED_KEPT: usize = 16;

/// An event for the worker's object.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Deliver {
    /// What happened.
    pub event_type: EventType,
    /// The object as the event carried it.
    pub body: Arc<DynamicObject>,
    /// The supervisor's count of events sent to this object (for safe idling).
    pub seq: u64,
    /// When the event was received from the API.
    pub received: Instant,
    /// Not a watch event of the object but a trigger of its reconcile handlers ([`Deliver::trigger`]):
    /// the body is only for a worker that has none yet.
    pub synthetic: bool,
    /// The reconcile triggers it carries (gathered when events coalesce).
    pub triggers: Triggers,
    /// A listed object's place in the listing's admission window, given back when the cycle that
    /// processes this delivery ends.
    pub admission: Option<Admission>,
}

/// A listed object's place in its supervisor's admission window
/// ([`Queueing::admission_window`](kactor_reactor::settings::Queueing::admission_window)): it
/// travels with the delivery and is given back when the cycle that processes it ends, or when the
/// delivery is dropped. The listing routes its next page only when there is room.
#[derive(Clone, Debug)]
pub struct Admission(pub Arc<tokio::sync::OwnedSemaphorePermit>);

impl Deliver {
    /// A watch event of the object.
    pub fn event(
        event_type: EventType,
        body: Arc<DynamicObject>,
        seq: u64,
        received: Instant,
    ) -> Self {
        Deliver {
            event_type,
            body,
            seq,
            received,
            synthetic: false,
            triggers: Triggers::default(),
            admission: None,
        }
    }

    /// A trigger of the object's reconcile handlers, with the newest body its sender knows.
    pub fn trigger(trigger: Trigger, body: Arc<DynamicObject>, seq: u64) -> Self {
        let mut triggers = Triggers::default();
        triggers.add(trigger);
        Deliver {
            event_type: EventType::Modified,
            body,
            seq,
            received: Instant::now(),
            synthetic: true,
            triggers,
            admission: None,
        }
    }

    /// This delivery, after `older`, as one: a watch event wins over a trigger (its body is the
    /// newest), and the triggers of both are kept.
    pub fn coalesce(self, older: Deliver) -> Deliver {
        let (mut kept, other) = if self.synthetic && !older.synthetic {
            (older, self)
        } else {
            (self, older)
        };
        let seq = kept.seq.max(other.seq);
        let (first, then) = if kept.seq >= other.seq {
            (other.triggers, std::mem::take(&mut kept.triggers))
        } else {
            (std::mem::take(&mut kept.triggers), other.triggers)
        };
        let mut triggers = first;
        triggers.absorb(then);
        kept.triggers = triggers;
        kept.seq = seq;
        // Still one object waiting for its cycle: it keeps its place in the window.
        kept.admission = kept.admission.take().or(other.admission);
        kept
    }
}

/// A cycle has ended, and gives the object's memory back.
#[derive(Message)]
#[rtype(result = "()")]
struct CycleDone {
    result: Result<Cycle, ProcessingError>,
    memory: ObjectMemory,
}

/// A touch after a delay has ended.
#[derive(Message)]
#[rtype(result = "()")]
struct Touched(Result<Option<String>, ProcessingError>);

/// Stop after the cycle under way, if any; scheduled retries and touches are dropped, daemons and
/// timers are asked to stop (`OPERATOR_EXITING`) and go through their stopping stages on their own
/// (sent by the supervisor when the worker idles, and at exit).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// The operator pauses: daemons and timers stop (`OPERATOR_PAUSING`), scheduled retries and touches
/// are dropped, and nothing starts until the next event (which comes only after the resume). The
/// object is marked for the listing after the resume to dispatch it again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Pause;

/// The object left this replica's shard (sharding): stop as on [`Stop`], but its daemons and timers
/// stop for `OPERATOR_DRAINING` (another replica starts them again).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Depart;

/// A cycle decided which daemons and timers should run.
#[derive(Message)]
#[rtype(result = "()")]
struct Decided(SpawnDecision);

/// A daemon or timer ended or was abandoned.
#[derive(Message)]
#[rtype(result = "()")]
struct DaemonReport(Report);

/// The worker has had nothing to do since the event numbered `seq`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Idle {
    /// The object's key.
    pub key: Arc<str>,
    /// The last event the worker took.
    pub seq: u64,
}

/// A worker stopped, and gives the object's memory back to the supervisor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Returned {
    /// The object's key.
    pub key: Arc<str>,
    /// The worker's number (the supervisor's count of workers started).
    pub number: u64,
    /// The object's memory.
    pub memory: ObjectMemory,
}

/// A worker dropped work it had scheduled (a pause): the supervisor's next listing dispatches the
/// object even if it did not change.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Interrupted {
    /// The object's key.
    pub key: Arc<str>,
    /// The worker's number.
    pub number: u64,
    /// Paused, the event the dropped work was for (the pending one, else the last cycle's): a cycle
    /// that ends during the pause may drop its retry after the listing after the resume has
    /// passed the object, and the supervisor then dispatches this event again at once. None when
    /// the worker stops.
    pub dropped: Option<Deliver>,
}

/// What every worker of one supervisor shares.
#[derive(Clone)]
pub struct WorkerShared {
    /// Runs the cycles.
    pub processor: Arc<Processor>,
    /// The runtime cycles run on, unless they run in place.
    pub runtime: Handle,
    /// The workers run on object threads: each cycle runs on its worker's thread (in that
    /// thread's runtime), not on `runtime`.
    pub in_place: bool,
    /// The cycle tasks in flight.
    pub tracker: Arc<Tracker>,
    /// `queueing.idle_timeout`.
    pub idle_timeout: Duration,
    /// `persistence.consistency_timeout`.
    pub consistency_timeout: Duration,
    /// `queueing.error_delays`.
    pub error_delays: Arc<[Duration]>,
    /// Where idling is reported.
    pub supervisor: Recipient<Idle>,
    /// Where the memory goes back when a worker stops.
    pub returns: Recipient<Returned>,
    /// Where dropped work is reported.
    pub interruptions: Recipient<Interrupted>,
    /// What daemons and timers need, when the resource has any.
    pub daemons: Option<Arc<DaemonEnv>>,
}

/// The actor of one object: the data; what it is doing is its [`Phase`], decided by
/// [`phase::step`].
pub struct ObjectWorker {
    key: Arc<str>,
    /// The supervisor's number for this worker.
    number: u64,
    memo: Memo,
    /// The object's memory, owned; None only while a cycle has it.
    memory: Option<ObjectMemory>,
    shared: Arc<WorkerShared>,
    phase: Phase,
    /// The event being delivered, until the phase decides whether it is held.
    arriving: Option<Deliver>,
    /// The newest event not yet processed.
    pending: Option<Deliver>,
    /// The resourceVersions of the events that arrived during the running cycle or touch (the
    /// newest few): the version our own patch wrote may come back before the cycle ends.
    arrived: std::collections::VecDeque<Box<str>>,
    /// The event of the last cycle, to run again after a consistency wait or throttling.
    last: Option<Deliver>,
    last_seq: u64,
    /// The idle timer, the retry sleep, the consistency wait or the throttling pause.
    timer: Option<SpawnHandle>,
    throttle_step: usize,
    /// The error that throttles the object, for the log.
    error: Option<ProcessingError>,
    /// The version our last patch produced, not yet seen in the watch, and until when to wait for it.
    expected: Option<(String, Instant)>,
    /// A cycle on the event of `expected` finds nothing to do if its essence is its diff-base
    /// ([`Cycle::quiet_echo`]): such an event is skipped. Cleared when a cycle starts.
    quiet_echo: bool,
    /// The versions our own requests produced that a later one of ours superseded, not seen yet:
    /// their events bring states older than ours, whose handlers may look undone (the result is
    /// written before the diff-base), so they are skipped. The version we expect follows in the
    /// stream (or a listing brings the object as it is).
    superseded: Vec<String>,
    /// The object's daemons and timers (made on the first event, when the resource has any).
    daemons: Option<ObjectDaemons>,
    /// The last daemon holding the finalizer stopped during a cycle: run the cycle again after it.
    recheck: bool,
    /// The wake for a reconcile handler's requeue or retry.
    wake: Option<SpawnHandle>,
    /// Sharding: set when an event shows the object no longer this replica's (or being handed
    /// over), read by the running cycle before each handler it starts. None when not sharded.
    departing: Option<Arc<kactor_reactor::sharding::Leaving>>,
    /// The running cycle is a listed object's first (its delivery had a place in the listing's
    /// admission window).
    listed: bool,
    /// That cycle found nothing to do: the worker stops without waiting out the idle timeout.
    settled: bool,
    /// Reconcile triggers that came with a version our own later write superseded, to a worker
    /// with no other body: they join the next delivery that runs a cycle (that write's event
    /// follows), and hold the worker from idling out until it comes.
    held: Option<Box<Triggers>>,
    /// The cycle that just ended asked to be woken: a fact for the phase's step on its end.
    woken: bool,
}

impl ObjectWorker {
    /// The worker numbered `number` for the object known by `key`, with its memo and memory (given
    /// back to the supervisor when it stops).
    pub fn new(
        key: Arc<str>,
        number: u64,
        memo: Memo,
        mut memory: ObjectMemory,
        shared: Arc<WorkerShared>,
    ) -> Self {
        let superseded = std::mem::take(&mut memory.superseded);
        let departing = shared.processor.settings.shard.is_some().then(Arc::default);
        ObjectWorker {
            key,
            number,
            memo,
            memory: Some(memory),
            shared,
            phase: Phase::Idle,
            arriving: None,
            pending: None,
            quiet_echo: false,
            arrived: std::collections::VecDeque::new(),
            last: None,
            last_seq: 0,
            timer: None,
            throttle_step: 0,
            error: None,
            expected: None,
            superseded,
            daemons: None,
            recheck: false,
            wake: None,
            departing,
            listed: false,
            settled: false,
            held: None,
            woken: false,
        }
    }

    /// Steps the phase on `input` and carries out the effects, in order.
    fn apply(&mut self, input: Input, ctx: &mut Context<Self>) {
        let facts = Facts {
            // The arriving event is not pending yet: only `Hold` makes it so.
            pending: self.pending.is_some(),
            // A due wake holds the worker as a daemon does: it must not idle out before it; so do
            // triggers held for the next delivery that runs a cycle.
            holding: self.holding() > 0 || self.wake.is_some() || self.held.is_some(),
            recheck: self.recheck,
            last_deleted: self
                .last
                .as_ref()
                .is_some_and(|l| l.event_type == EventType::Deleted),
            wake: std::mem::take(&mut self.woken),
        };
        let (phase, effects) = phase::step(self.phase, input, facts);
        self.phase = phase;
        for effect in effects {
            self.carry_out(effect, ctx);
        }
        self.arriving = None;
        if !matches!(self.phase, Phase::Busy(_)) {
            // Held for a timer (a throttled object) or a pause: this worker's place in the
            // listing's window is not what bounds it, so the listing need not wait for it.
            if let Some(pending) = &mut self.pending {
                pending.admission = None;
            }
        }
    }

    fn carry_out(&mut self, effect: Effect, ctx: &mut Context<Self>) {
        match effect {
            Effect::CancelTimer => self.cancel_timer(ctx),
            Effect::Hold => {
                if let Some(event) = self.arriving.take() {
                    self.last_seq = self.last_seq.max(event.seq);
                    let event = match self.pending.take() {
                        Some(pending) => {
                            let processor = &self.shared.processor;
                            processor.observer.events_coalesced(&processor.label, 1);
                            event.coalesce(pending)
                        }
                        None => event,
                    };
                    self.pending = Some(event);
                }
            }
            Effect::DropPending => self.pending = None,
            Effect::Cycle => match self.pending.take().or_else(|| self.last.clone()) {
                Some(event) => self.start_cycle(event, ctx),
                None => tracing::error!(object = %self.key, "a cycle without an event"),
            },
            Effect::Touch => self.start_touch(ctx),
            Effect::AwaitConsistency => {
                let wait = self
                    .expected
                    .as_ref()
                    .map_or(Duration::ZERO, |(_, deadline)| {
                        deadline.saturating_duration_since(Instant::now())
                    });
                self.arm(wait, ctx);
            }
            Effect::Sleep(delay) => {
                tracing::debug!(object = %self.key, "Sleeping for {} seconds for the delayed handlers.", delay.as_secs_f64());
                self.arm(delay, ctx);
            }
            Effect::Throttle => {
                let delays = &self.shared.error_delays;
                let delay = delays
                    .get(self.throttle_step)
                    .or(delays.last())
                    .copied()
                    .unwrap_or(Duration::from_secs(1));
                self.throttle_step += 1;
                if let Some(error) = self.error.take() {
                    tracing::error!(object = %self.key, %error, "Throttling for {} seconds due to an unexpected error: {error}", delay.as_secs_f64());
                }
                self.arm(delay, ctx);
            }
            Effect::Unthrottle => self.throttle_step = 0,
            Effect::ArmIdle => {
                self.let_go_of_the_body();
                let idle = if std::mem::take(&mut self.settled) {
                    Duration::ZERO
                } else {
                    self.shared.idle_timeout
                };
                self.arm(idle, ctx);
            }
            Effect::ReportIdle => self.shared.supervisor.do_send(Idle {
                key: self.key.clone(),
                seq: self.last_seq,
            }),
            Effect::Interrupted => self.tell_interrupted(),
            Effect::Recheck => self.recheck = true,
            Effect::Rechecked => self.recheck = false,
            Effect::StopActor => ctx.stop(),
        }
    }

    /// Tells the supervisor that work was dropped ([`Interrupted`]); paused, with the event it was
    /// for (the pending one, else the last cycle's).
    fn tell_interrupted(&self) {
        let dropped = matches!(self.phase, Phase::Paused(_))
            .then(|| self.pending.clone().or_else(|| self.last.clone()))
            .flatten()
            .map(|mut event| {
                // Its place in a listing's window is not what it waits for now.
                event.admission = None;
                event
            });
        self.shared.interruptions.do_send(Interrupted {
            key: self.key.clone(),
            number: self.number,
            dropped,
        });
    }

    /// Idle, the worker keeps the last event only where something may still read it: daemons and
    /// timers (a cycle runs again on it when the last one stops) and reconcile handlers (a trigger
    /// or a requeue runs on it). Else its body is let go at once rather than when the worker idles
    /// out: it is most of a waiting worker's memory, and every object handled in the last
    /// `idle_timeout` has a waiting worker (after a restart over 100,000 objects, all of them).
    fn let_go_of_the_body(&mut self) {
        if !self.reads_the_last_event() && self.pending.is_none() {
            self.last = None;
        }
    }

    /// Whether something may use the last event while the worker is idle: daemons and timers,
    /// reconcile handlers (whose children's events follow their first run, too).
    fn reads_the_last_event(&self) -> bool {
        self.shared.daemons.is_some() || !self.shared.processor.handlers.reconcile.is_empty()
    }

    /// Arms the timer: when it fires, the phase decides what it meant.
    fn arm(&mut self, after: Duration, ctx: &mut Context<Self>) {
        self.cancel_timer(ctx);
        self.timer = Some(ctx.run_later(after, |worker, ctx| {
            worker.timer = None;
            worker.apply(Input::TimerFired, ctx);
        }));
    }

    fn cancel_timer(&mut self, ctx: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
    }

    /// Arms (or, with None, drops) the wake for a reconcile handler's requeue or retry.
    fn set_wake(&mut self, after: Option<Duration>, ctx: &mut Context<Self>) {
        if let Some(wake) = self.wake.take() {
            ctx.cancel_future(wake);
        }
        self.wake = after.map(|after| {
            ctx.run_later(after, |worker, ctx| {
                worker.wake = None;
                if matches!(worker.phase, Phase::Paused(_)) {
                    // Not armed while paused (a pause cancels it, a cycle ending paused tells it
                    // instead): a wake of its own does not end a pause; only a delivery does.
                    return;
                }
                if let Some(body) = worker.newest_body() {
                    let seq = worker.last_seq;
                    worker.triggered(Deliver::trigger(Trigger::Requeue, body, seq), ctx);
                }
            })
        });
    }

    /// The newest body the worker has: of the pending event, else of the last processed.
    fn newest_body(&self) -> Option<Arc<DynamicObject>> {
        self.pending
            .as_ref()
            .or(self.last.as_ref())
            .map(|d| d.body.clone())
    }

    /// A trigger of the reconcile handlers: a cycle on the newest body the worker has (the one
    /// given, for a worker that has none yet), or joined to the pending event.
    ///
    /// Paused, it unpauses the worker as an event does: the supervisor sends a trigger (a child's
    /// change, a re-dispatch) only while resumed, and its mailbox is ordered, so a pause after the
    /// trigger comes after it here too. A worker that dropped nothing in the pause waits for its
    /// first event after the resume, which for an unchanged object may be a child's change.
    fn triggered(&mut self, mut deliver: Deliver, ctx: &mut Context<Self>) {
        let gone = self
            .last
            .as_ref()
            .is_some_and(|l| l.event_type == EventType::Deleted);
        if gone || matches!(self.phase, Phase::Stopping(_)) {
            // Gone, or stopping (what was in flight is told to the supervisor).
            return;
        }
        match self.pending.as_ref().or(self.last.as_ref()) {
            Some(newest) => {
                deliver.body = newest.body.clone();
                deliver.event_type = newest.event_type;
            }
            // A new worker: the sender's body, unless it is a version our own later write
            // superseded: that write's event follows, and the triggers wait for it.
            None if self.is_superseded(&deliver) => {
                self.hold(std::mem::take(&mut deliver.triggers));
                return;
            }
            None => {}
        }
        self.join_held(&mut deliver);
        self.arriving = Some(deliver);
        self.apply(Input::Event, ctx);
    }

    /// The held triggers join this delivery, which runs a cycle (before its own: they came first).
    fn join_held(&mut self, deliver: &mut Deliver) {
        if let Some(held) = self.held.take() {
            let mut triggers = *held;
            triggers.absorb(std::mem::take(&mut deliver.triggers));
            deliver.triggers = triggers;
        }
    }

    /// Keeps triggers for the next delivery that runs a cycle.
    fn hold(&mut self, triggers: Triggers) {
        if triggers.is_empty() {
            return;
        }
        match &mut self.held {
            Some(held) => held.absorb(triggers),
            None => self.held = Some(Box::new(triggers)),
        }
    }

    /// Whether the operator lets daemons and timers start now.
    fn may_start(&self) -> bool {
        !matches!(self.phase, Phase::Paused(_) | Phase::Stopping(_))
    }

    /// The daemons and timers read the newest body; they are set up on the object's first event.
    fn observe(&mut self, event: &Deliver, ctx: &mut Context<Self>) {
        let Some(env) = &self.shared.daemons else {
            return;
        };
        match &self.daemons {
            Some(daemons) => daemons.observe(event.body.clone(), event.event_type),
            None => {
                // A weak address: the reports must not keep a worker alive that nothing else wants.
                let address = ctx.address().downgrade();
                let report: Reporter = Arc::new(move |report| {
                    if let Some(address) = address.upgrade() {
                        address.do_send(DaemonReport(report));
                    }
                });
                // No cycle runs yet: the memory is here.
                let excluded = self
                    .memory
                    .as_ref()
                    .map(|m| m.forever_stopped.clone())
                    .unwrap_or_default();
                self.daemons = Some(ObjectDaemons::new(
                    env.clone(),
                    self.memo.clone(),
                    self.span(&event.body),
                    event.body.clone(),
                    event.event_type,
                    excluded,
                    report,
                ));
            }
        }
    }

    /// How many daemons and timers hold the object (and keep the worker from idling).
    fn holding(&self) -> usize {
        self.daemons.as_ref().map_or(0, ObjectDaemons::holding)
    }

    fn span(&self, body: &DynamicObject) -> tracing::Span {
        let resource = &self.shared.processor.resource;
        let meta = &body.metadata;
        let api_version = body
            .types
            .as_ref()
            .map_or_else(|| resource.api_version(), |t| t.api_version.clone());
        kactor_reactor::logging::object_span(
            &api_version,
            &resource.kind,
            meta.name.as_deref().unwrap_or_default(),
            meta.namespace.as_deref(),
            meta.uid.as_deref().unwrap_or_default(),
        )
    }

    /// Our own patch wrote `version`: the next cycle waits (up to `consistency_timeout`) until an
    /// event brings it, unless one already did while the patch was in flight.
    fn expect(&mut self, version: Option<String>) {
        self.expected = version
            .filter(|rv| !self.arrived.iter().any(|seen| **seen == **rv))
            .map(|rv| (rv, Instant::now() + self.shared.consistency_timeout));
    }

    fn start_cycle(&mut self, event: Deliver, ctx: &mut Context<Self>) {
        self.arrived.clear();
        self.quiet_echo = false;
        self.last_seq = self.last_seq.max(event.seq);
        self.cancel_timer(ctx);
        let consistent = match &self.expected {
            None => true,
            Some((_, deadline)) => Instant::now() >= *deadline,
        };
        let daemons = self.daemons.as_ref().map(|daemons| {
            let address = ctx.address();
            DaemonsView {
                excluded: daemons.excluded(),
                blocking: daemons.holding() > 0,
                decide: Box::new(move |decision| address.do_send(Decided(decision))),
            }
        });
        let mut event = event;
        let input = Event {
            event_type: event.event_type,
            body: event.body.clone(),
            memo: self.memo.clone(),
            received: event.received,
            consistent,
            daemons,
            synthetic: event.synthetic,
            // Taken by this cycle: a rerun of the same event has none of them.
            triggers: std::mem::take(&mut event.triggers),
            departing: self.departing.clone(),
        };
        // Given back when this cycle ends; a rerun of the same event is not a listed object's first.
        let admission = event.admission.take();
        self.listed = admission.is_some();
        self.settled = false;
        let span = self.span(&event.body);
        self.last = Some(event);
        let processor = self.shared.processor.clone();
        // One cycle at a time: the memory goes with it and comes back in `CycleDone`.
        let mut memory = self.memory.take().unwrap_or_else(|| {
            tracing::error!(object = %self.key, "a cycle started while another had the memory");
            ObjectMemory::default()
        });
        let address = ctx.address();
        // Boxed where it is made: the cycle's future is a few KB, and a task holding it inline
        // copies it at every move (into its span, the tracker's wrapper, the task) and is
        // allocated 128-byte aligned, which glibc serves slowly; boxed, those move a pointer.
        let cycle = Box::pin(async move {
            let result = processor.process(input, &mut memory).await;
            drop(admission);
            address.do_send(CycleDone { result, memory });
        });
        self.shared
            .tracker
            .spawn(&self.runtime(), cycle.instrument(span));
    }

    /// Where this worker's cycles and touches run: its own thread's runtime on an object thread
    /// (so that the cycle's data stays on the thread that made it and will free it), else the
    /// operator's.
    fn runtime(&self) -> Handle {
        match self.shared.in_place {
            true => Handle::current(),
            false => self.shared.runtime.clone(),
        }
    }

    /// Touches the object after a retry sleep, so that its event starts the next cycle.
    fn start_touch(&mut self, ctx: &mut Context<Self>) {
        let Some(last) = self.last.clone() else {
            return;
        };
        self.arrived.clear();
        let processor = self.shared.processor.clone();
        let address = ctx.address();
        let span = self.span(&last.body);
        let touch = async move {
            let result = processor.touch(&last.body).await;
            address.do_send(Touched(result));
        };
        self.shared
            .tracker
            .spawn(&self.runtime(), touch.instrument(span));
    }

    /// New requests of ours went out: the version we waited for (if it has not come back) and the
    /// earlier ones of these requests are superseded by their last, which the caller expects next.
    fn supersede(&mut self, earlier: Vec<String>) {
        if let Some((previous, _)) = self.expected.take() {
            self.superseded.push(previous);
        }
        self.superseded.extend(earlier);
        let excess = self.superseded.len().saturating_sub(SUPERSEDED_KEPT);
        self.superseded.drain(..excess);
    }

    /// Whether the event of our own last write needs no cycle: the worker idles (nothing
    /// pending, held or throttled), the event carries no triggers, and its body's essence is its
    /// diff-base ([`Cycle::quiet_echo`] says why a cycle would then do nothing).
    fn echo_changes_nothing(&self, event: &Deliver) -> bool {
        matches!(self.phase, Phase::Idle)
            && event.event_type == EventType::Modified
            && event.triggers.is_empty()
            && self.pending.is_none()
            && self.held.is_none()
            && self.error.is_none()
            && self.shared.processor.echo_changes_nothing(&event.body)
    }

    /// Whether the event brings a version that one of our own later requests superseded.
    fn is_superseded(&self, event: &Deliver) -> bool {
        event
            .body
            .metadata
            .resource_version
            .as_deref()
            .is_some_and(|rv| self.superseded.iter().any(|v| v == rv))
    }

    /// A task runs: what arrives meanwhile may be our own patch's version.
    fn busy(&self) -> bool {
        matches!(
            self.phase,
            Phase::Busy(_) | Phase::Paused(Some(_)) | Phase::Stopping(Some(_))
        )
    }
}

impl Actor for ObjectWorker {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        let processor = &self.shared.processor;
        processor.observer.workers_changed(&processor.label, 1);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let processor = &self.shared.processor;
        processor.observer.workers_changed(&processor.label, -1);
        // A worker stops only between cycles, so the memory is here; it goes back to the
        // supervisor, with what ended on its own (it stays ended for the next worker).
        if let Some(mut memory) = self.memory.take() {
            if let Some(daemons) = &self.daemons {
                memory.forever_stopped = daemons.excluded();
            }
            memory.superseded = std::mem::take(&mut self.superseded);
            self.shared.returns.do_send(Returned {
                key: self.key.clone(),
                number: self.number,
                memory,
            });
        }
    }
}

impl Handler<Deliver> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, mut event: Deliver, ctx: &mut Context<Self>) {
        if event.synthetic {
            self.last_seq = self.last_seq.max(event.seq);
            self.triggered(event, ctx);
            return;
        }
        if self.is_superseded(&event) {
            // Seen, so that the supervisor may still let the worker idle out.
            self.last_seq = self.last_seq.max(event.seq);
            tracing::debug!(object = %self.key, "An event of our own patch's intermediate version is skipped; the version it led to follows.");
            // Each version comes once: forgotten when seen (after the triggers, which still need
            // to know it superseded).
            let seen = self
                .superseded
                .iter()
                .position(|v| Some(v.as_str()) == event.body.metadata.resource_version.as_deref());
            if !event.triggers.is_empty() {
                // Triggers coalesced into it (while the memory was on its way back) are not lost:
                // a trigger like any other, they run on the body the worker has or wait.
                event.synthetic = true;
                self.triggered(event, ctx);
            }
            if let Some(seen) = seen {
                self.superseded.remove(seen);
            }
            return;
        }
        self.join_held(&mut event);
        self.observe(&event, ctx);
        if let (Some(departing), Some(shard)) =
            (&self.departing, &self.shared.processor.settings.shard)
        {
            // The cycle under way (if any) starts no more handlers once the object leaves us.
            let leaving = shard.standing(&event.body) != kactor_reactor::sharding::Standing::Mine;
            departing.set(leaving);
        }
        if let Some((expected, _)) = &self.expected {
            if event.body.metadata.resource_version.as_deref() == Some(expected.as_str()) {
                self.expected = None;
                // The stream is past our earlier versions: any not seen never come.
                self.superseded = Vec::new();
                // A cycle on it would find nothing to do: none runs (see `Cycle::quiet_echo`).
                if std::mem::take(&mut self.quiet_echo) && self.echo_changes_nothing(&event) {
                    self.last_seq = self.last_seq.max(event.seq);
                    tracing::debug!(object = %self.key, "The event of our own last patch changes nothing that handlers see; no cycle runs for it.");
                    return;
                }
            }
        }
        if self.busy() {
            if let Some(rv) = event.body.metadata.resource_version.as_deref() {
                if self.arrived.len() == ARRIVED_KEPT {
                    self.arrived.pop_front();
                }
                self.arrived.push_back(rv.into());
            }
        }
        self.arriving = Some(event);
        self.apply(Input::Event, ctx);
    }
}

impl Handler<CycleDone> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, CycleDone { result, memory }: CycleDone, ctx: &mut Context<Self>) {
        self.memory = Some(memory);
        let next = match result {
            Ok(cycle) => {
                let wrote_nothing = cycle.written == Written::Nothing;
                match cycle.written {
                    Written::Version(version) => {
                        self.supersede(cycle.superseded);
                        self.expect(Some(version));
                        // Only for the event still to come (not one that came during the patch).
                        self.quiet_echo = cycle.quiet_echo && self.expected.is_some();
                    }
                    Written::Unversioned => {
                        self.supersede(cycle.superseded);
                        self.expect(None);
                    }
                    // Nothing written: what an earlier cycle wrote is still on its way.
                    Written::Nothing => {}
                    Written::Gone => self.superseded = Vec::new(),
                }
                if self
                    .pending
                    .as_ref()
                    .is_some_and(|p| !p.synthetic && self.is_superseded(p))
                {
                    // Its triggers are not lost: they run on the body the worker has.
                    if let Some(mut dropped) = self.pending.take() {
                        if let Some(body) = self.newest_body() {
                            if !dropped.triggers.is_empty() {
                                dropped.synthetic = true;
                                dropped.body = body;
                                self.pending = Some(dropped);
                            }
                        }
                    }
                }
                let gone = self
                    .last
                    .as_ref()
                    .is_some_and(|l| l.event_type == EventType::Deleted);
                // A listed object that needed nothing (after a restart, most of them): nothing
                // of ours is on its way back, nothing is due, so its worker need not wait for
                // more events. The next one starts a worker again. Not for reconcile handlers:
                // the events of the children they just made or changed follow.
                self.settled = self.listed
                    && !self.reads_the_last_event()
                    && wrote_nothing
                    && cycle.next == Next::Idle
                    && cycle.wake.is_none()
                    && self.expected.is_none();
                let wake = cycle.wake.filter(|_| !gone);
                // Paused, it is not armed: the phase counts it as dropped work, and tells it (its
                // due time stays in the object's memory for the cycle the resume brings).
                let paused = matches!(self.phase, Phase::Paused(_));
                self.set_wake(wake.filter(|_| !paused), ctx);
                self.woken = wake.is_some();
                Some(cycle.next)
            }
            Err(error) => {
                // What was written is unknown: the next event is taken as it comes.
                self.settled = false;
                self.superseded = Vec::new();
                self.error = Some(error);
                None
            }
        };
        self.apply(Input::CycleDone(next), ctx);
    }
}

impl Handler<Touched> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, Touched(result): Touched, ctx: &mut Context<Self>) {
        let ok = match result {
            Ok(version) => {
                self.supersede(Vec::new());
                self.expect(version);
                true
            }
            Err(error) => {
                self.error = Some(error);
                false
            }
        };
        self.apply(Input::TouchDone(ok), ctx);
    }
}

impl Handler<Stop> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        // The phase first (it tells dropped work while the daemons still count as holding).
        self.apply(Input::Stop, ctx);
        self.set_wake(None, ctx);
        if let Some(daemons) = &mut self.daemons {
            daemons.stop_all(StopReason::OperatorExiting);
        }
    }
}

impl Handler<Pause> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, _: Pause, ctx: &mut Context<Self>) {
        // The phase first: running daemons count as dropped work, which the listing after the
        // resume starts again.
        self.apply(Input::Pause, ctx);
        self.set_wake(None, ctx);
        if let Some(daemons) = &mut self.daemons {
            daemons.stop_all(StopReason::OperatorPausing);
        }
    }
}

impl Handler<Depart> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, _: Depart, ctx: &mut Context<Self>) {
        self.apply(Input::Stop, ctx);
        self.set_wake(None, ctx);
        if let Some(daemons) = &mut self.daemons {
            daemons.stop_all(StopReason::OperatorDraining);
        }
    }
}

impl Handler<Decided> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, Decided(decision): Decided, _: &mut Context<Self>) {
        let may_start = self.may_start();
        if let Some(daemons) = &mut self.daemons {
            daemons.apply(&decision, may_start);
        }
    }
}

impl Handler<DaemonReport> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, DaemonReport(report): DaemonReport, ctx: &mut Context<Self>) {
        let may_start = self.may_start();
        let Some(daemons) = &mut self.daemons else {
            return;
        };
        let before = daemons.holding();
        let known = match report {
            Report::Exited { index, generation } => daemons.exited(index, generation, may_start),
            Report::Abandoned { index, generation } => daemons.abandoned(index, generation),
        };
        if known && before > 0 && daemons.holding() == 0 {
            self.apply(Input::Released, ctx);
        }
    }
}
