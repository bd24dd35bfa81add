//! The ObjectWorker: one actor per object, the only place where that object is handled.
//!
//! **Expected flow**: the supervisor sends each of the object's events as [`Deliver`]. An idle worker
//! starts a processing cycle at once ([`Processor::process`], run as a task on the operator's runtime,
//! never on the actor's thread); a busy one keeps only the newest event (coalescing), so the next cycle
//! sees the newest body, never a backlog of stale states. When a cycle ends, the worker:
//! * starts the next cycle if an event came meanwhile;
//! * or, when changing handlers wait for our own last patch to come back through the watch, waits for
//!   it until `persistence.consistency_timeout`, then runs the cycle again on what it has;
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
//! **Idling**: after `queueing.idle_timeout` with nothing to do, nothing scheduled and no daemon or
//! timer running, the worker tells the supervisor, which stops it only if no event was sent since
//! (the supervisor is the only sender, so none is in flight).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use kactor_reactor::daemons::StopReason;
use kactor_reactor::handlers::Memo;
use kactor_reactor::processing::{
    Cycle, DaemonsView, Event, Next, ObjectMemory, ProcessingError, Processor, SpawnDecision,
    Written,
};
use kactor_reactor::watching::EventType;
use kube::api::DynamicObject;
use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::daemons::{DaemonEnv, ObjectDaemons, Report, Reporter};
use crate::tracker::Tracker;

/// How many resourceVersions of events arrived during a cycle are kept to recognise our own patch's.
const ARRIVED_KEPT: usize = 16;

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
}

/// What every worker of one supervisor shares.
#[derive(Clone)]
pub struct WorkerShared {
    /// Runs the cycles.
    pub processor: Arc<Processor>,
    /// The runtime cycles run on.
    pub runtime: Handle,
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

/// The actor of one object.
pub struct ObjectWorker {
    key: Arc<str>,
    /// The supervisor's number for this worker.
    number: u64,
    memo: Memo,
    /// The object's memory, owned; None only while a cycle has it.
    memory: Option<ObjectMemory>,
    shared: Arc<WorkerShared>,
    busy: bool,
    stopping: bool,
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
    /// The timer is work to do (not the idle timer).
    scheduled: bool,
    throttled: bool,
    throttle_step: usize,
    /// The version our last patch produced, not yet seen in the watch, and until when to wait for it.
    expected: Option<(String, Instant)>,
    /// The object's daemons and timers (made on the first event, when the resource has any).
    daemons: Option<ObjectDaemons>,
    /// The operator is paused: nothing starts until the next event.
    paused: bool,
    /// The last daemon holding the finalizer stopped during a cycle: run the cycle again after it.
    recheck: bool,
}

impl ObjectWorker {
    /// The worker numbered `number` for the object known by `key`, with its memo and memory (given
    /// back to the supervisor when it stops).
    pub fn new(
        key: Arc<str>,
        number: u64,
        memo: Memo,
        memory: ObjectMemory,
        shared: Arc<WorkerShared>,
    ) -> Self {
        ObjectWorker {
            key,
            number,
            memo,
            memory: Some(memory),
            shared,
            busy: false,
            arrived: std::collections::VecDeque::new(),
            stopping: false,
            pending: None,
            last: None,
            last_seq: 0,
            timer: None,
            scheduled: false,
            throttled: false,
            throttle_step: 0,
            expected: None,
            daemons: None,
            paused: false,
            recheck: false,
        }
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

    fn mark_interrupted(&self) {
        self.shared.interruptions.do_send(Interrupted {
            key: self.key.clone(),
            number: self.number,
        });
    }

    fn cancel_timer(&mut self, ctx: &mut Context<Self>) {
        self.scheduled = false;
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
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
        self.busy = true;
        self.arrived.clear();
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
        let input = Event {
            event_type: event.event_type,
            body: event.body.clone(),
            memo: self.memo.clone(),
            received: event.received,
            consistent,
            daemons,
        };
        let span = self.span(&event.body);
        self.last = Some(event);
        let processor = self.shared.processor.clone();
        // One cycle at a time: the memory goes with it and comes back in `CycleDone`.
        let mut memory = self.memory.take().unwrap_or_else(|| {
            tracing::error!(object = %self.key, "a cycle started while another had the memory");
            ObjectMemory::default()
        });
        let address = ctx.address();
        let cycle = async move {
            let result = processor.process(input, &mut memory).await;
            address.do_send(CycleDone { result, memory });
        };
        self.shared
            .tracker
            .spawn(&self.shared.runtime, cycle.instrument(span));
    }

    /// Nothing to do now: run what is pending, or wait for what is scheduled, or idle.
    fn settle(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            ctx.stop();
            return;
        }
        if self.paused {
            if self.pending.take().is_some() {
                self.mark_interrupted();
            }
        } else if let Some(next) = self.pending.take() {
            self.start_cycle(next, ctx);
            return;
        }
        if self.holding() > 0 {
            // Daemons and timers run: the worker stays (their reports come here).
            return;
        }
        let (key, seq, supervisor) = (
            self.key.clone(),
            self.last_seq,
            self.shared.supervisor.clone(),
        );
        self.timer = Some(ctx.run_later(self.shared.idle_timeout, move |_, _| {
            supervisor.do_send(Idle { key, seq })
        }));
    }

    /// Runs the cycle again on the last event now (the daemons that held the object have stopped).
    fn rerun(&mut self, ctx: &mut Context<Self>) {
        match self.last.clone() {
            Some(last) if last.event_type != EventType::Deleted => self.start_cycle(last, ctx),
            _ => self.settle(ctx),
        }
    }

    /// Runs the last event again after `after` unless an event comes first.
    fn rerun_after(&mut self, after: Duration, ctx: &mut Context<Self>) {
        self.scheduled = true;
        self.timer = Some(ctx.run_later(after, |worker, ctx| {
            worker.timer = None;
            worker.scheduled = false;
            worker.throttled = false;
            match worker.pending.take().or_else(|| worker.last.clone()) {
                Some(event) => worker.start_cycle(event, ctx),
                None => worker.settle(ctx),
            }
        }));
    }

    /// Sleeps `delay`, then touches the object so that its event starts the next cycle.
    fn touch_after(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        tracing::debug!(object = %self.key, "Sleeping for {} seconds for the delayed handlers.", delay.as_secs_f64());
        self.scheduled = true;
        self.timer = Some(ctx.run_later(delay, |worker, ctx| {
            worker.timer = None;
            worker.scheduled = false;
            let Some(last) = worker.last.clone() else {
                return worker.settle(ctx);
            };
            worker.busy = true;
            worker.arrived.clear();
            let processor = worker.shared.processor.clone();
            let address = ctx.address();
            let span = worker.span(&last.body);
            let touch = async move {
                let result = processor.touch(&last.body).await;
                address.do_send(Touched(result));
            };
            worker
                .shared
                .tracker
                .spawn(&worker.shared.runtime, touch.instrument(span));
        }));
    }

    fn throttle(&mut self, error: &ProcessingError, ctx: &mut Context<Self>) {
        let delays = &self.shared.error_delays;
        let delay = delays
            .get(self.throttle_step)
            .or(delays.last())
            .copied()
            .unwrap_or(Duration::from_secs(1));
        self.throttle_step += 1;
        tracing::error!(object = %self.key, %error, "Throttling for {} seconds due to an unexpected error: {error}", delay.as_secs_f64());
        self.throttled = true;
        self.rerun_after(delay, ctx);
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

    fn handle(&mut self, event: Deliver, ctx: &mut Context<Self>) {
        self.observe(&event, ctx);
        // Events come again only after a resume (the supervisor drops what a paused stream sent).
        self.paused = false;
        if let Some((expected, _)) = &self.expected {
            if event.body.metadata.resource_version.as_deref() == Some(expected.as_str()) {
                self.expected = None;
            }
        }
        if self.busy {
            if let Some(rv) = event.body.metadata.resource_version.as_deref() {
                if self.arrived.len() == ARRIVED_KEPT {
                    self.arrived.pop_front();
                }
                self.arrived.push_back(rv.into());
            }
        }
        if self.stopping {
            return;
        }
        if self.busy || self.throttled {
            // Coalesce: the next cycle sees the newest body. A deletion is always the newest event.
            self.last_seq = self.last_seq.max(event.seq);
            if self.pending.replace(event).is_some() {
                let processor = &self.shared.processor;
                processor.observer.events_coalesced(&processor.label, 1);
            }
        } else {
            // Ends an idle wait, a retry sleep or a consistency wait at once.
            self.start_cycle(event, ctx);
        }
    }
}

impl Handler<CycleDone> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, CycleDone { result, memory }: CycleDone, ctx: &mut Context<Self>) {
        self.busy = false;
        self.memory = Some(memory);
        let cycle = match result {
            Ok(cycle) => cycle,
            Err(error) => {
                if self.stopping {
                    return ctx.stop();
                }
                if self.paused {
                    self.mark_interrupted();
                    return self.settle(ctx);
                }
                return self.throttle(&error, ctx);
            }
        };
        self.throttle_step = 0;
        match cycle.written {
            Written::Version(version) => self.expect(Some(version)),
            Written::Unversioned => self.expect(None),
            Written::Nothing | Written::Gone => {}
        }
        let scheduled = matches!(cycle.next, Next::AwaitOwnPatch | Next::RetryAfter(_));
        if self.paused && scheduled {
            self.mark_interrupted();
        }
        if self.stopping || self.paused || self.pending.is_some() {
            return self.settle(ctx);
        }
        if std::mem::take(&mut self.recheck) {
            return self.rerun(ctx);
        }
        match cycle.next {
            Next::AwaitOwnPatch => {
                let wait = self
                    .expected
                    .as_ref()
                    .map_or(Duration::ZERO, |(_, deadline)| {
                        deadline.saturating_duration_since(Instant::now())
                    });
                self.rerun_after(wait, ctx);
            }
            Next::RetryAfter(delay) => self.touch_after(delay, ctx),
            // The last daemon's report runs the cycle again (`recheck`, or a rerun).
            Next::AwaitDaemons | Next::Idle => self.settle(ctx),
        }
    }
}

impl Handler<Touched> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, Touched(result): Touched, ctx: &mut Context<Self>) {
        self.busy = false;
        match result {
            Ok(version) => {
                self.throttle_step = 0;
                self.expect(version);
                self.settle(ctx);
            }
            Err(error) => {
                if self.stopping {
                    return ctx.stop();
                }
                self.throttle(&error, ctx);
            }
        }
    }
}

impl Handler<Stop> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        if self.busy || self.scheduled || self.pending.is_some() {
            self.mark_interrupted();
        }
        self.stopping = true;
        self.pending = None;
        self.cancel_timer(ctx);
        if let Some(daemons) = &mut self.daemons {
            daemons.stop_all(StopReason::OperatorExiting);
        }
        if !self.busy {
            ctx.stop();
        }
    }
}

impl Handler<Pause> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, _: Pause, ctx: &mut Context<Self>) {
        if self.scheduled || self.pending.is_some() || self.holding() > 0 {
            // The listing after the resume dispatches the object even if unchanged, so that its
            // retries go on and its daemons and timers start again.
            self.mark_interrupted();
        }
        self.paused = true;
        self.pending = None;
        self.throttled = false;
        if let Some(daemons) = &mut self.daemons {
            daemons.stop_all(StopReason::OperatorPausing);
        }
        if !self.busy {
            self.cancel_timer(ctx);
            self.settle(ctx);
        }
    }
}

impl Handler<Decided> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, Decided(decision): Decided, _: &mut Context<Self>) {
        let may_start = !self.paused && !self.stopping;
        if let Some(daemons) = &mut self.daemons {
            daemons.apply(&decision, may_start);
        }
    }
}

impl Handler<DaemonReport> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, DaemonReport(report): DaemonReport, ctx: &mut Context<Self>) {
        let may_start = !self.paused && !self.stopping;
        let Some(daemons) = &mut self.daemons else {
            return;
        };
        let before = daemons.holding();
        let known = match report {
            Report::Exited { index, generation } => daemons.exited(index, generation, may_start),
            Report::Abandoned { index, generation } => daemons.abandoned(index, generation),
        };
        if !known || self.stopping {
            return;
        }
        if before > 0 && daemons.holding() == 0 {
            // Nothing holds the object any more: a cycle releases (or drops) the finalizer now,
            // instead of waiting for the next event.
            if self.paused {
                self.settle(ctx);
            } else if self.busy {
                self.recheck = true;
            } else if self.pending.is_none() && !self.throttled {
                self.rerun(ctx);
            }
        }
    }
}
