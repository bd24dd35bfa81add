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
//! * The object's memory (memo, resume and retry bookkeeping) lives in the supervisor's record of the
//!   object and survives the worker.
//!
//! **Idling**: after `queueing.idle_timeout` with nothing to do and nothing scheduled, the worker tells
//! the supervisor, which stops it only if no event was sent since (the supervisor is the only sender,
//! so none is in flight).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use kactor_reactor::handlers::Memo;
use kactor_reactor::processing::{Cycle, Event, ObjectMemory, ProcessingError, Processor};
use kactor_reactor::watching::EventType;
use kube::api::DynamicObject;
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::tracker::Tracker;

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

/// A cycle has ended.
#[derive(Message)]
#[rtype(result = "()")]
struct CycleDone {
    result: Result<Cycle, ProcessingError>,
}

/// A touch after a delay has ended.
#[derive(Message)]
#[rtype(result = "()")]
struct Touched(Result<Option<String>, ProcessingError>);

/// Stop after the cycle under way, if any; scheduled retries and touches are dropped (sent by the
/// supervisor when the worker idles, when the operator pauses, and at exit).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// The worker has had nothing to do since the event numbered `seq`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Idle {
    /// The object's key.
    pub key: Arc<str>,
    /// The last event the worker took.
    pub seq: u64,
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
}

/// The actor of one object.
pub struct ObjectWorker {
    key: Arc<str>,
    memo: Memo,
    memory: Arc<Mutex<ObjectMemory>>,
    shared: Arc<WorkerShared>,
    busy: bool,
    stopping: bool,
    /// The newest event not yet processed.
    pending: Option<Deliver>,
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
}

impl ObjectWorker {
    /// A worker for the object known by `key`, with its memo and memory.
    pub fn new(
        key: Arc<str>,
        memo: Memo,
        memory: Arc<Mutex<ObjectMemory>>,
        shared: Arc<WorkerShared>,
    ) -> Self {
        ObjectWorker {
            key,
            memo,
            memory,
            shared,
            busy: false,
            stopping: false,
            pending: None,
            last: None,
            last_seq: 0,
            timer: None,
            scheduled: false,
            throttled: false,
            throttle_step: 0,
            expected: None,
        }
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

    fn start_cycle(&mut self, event: Deliver, ctx: &mut Context<Self>) {
        self.busy = true;
        self.last_seq = self.last_seq.max(event.seq);
        self.cancel_timer(ctx);
        let consistent = match &self.expected {
            None => true,
            Some((_, deadline)) => Instant::now() >= *deadline,
        };
        let input = Event {
            event_type: event.event_type,
            body: event.body.clone(),
            memo: self.memo.clone(),
            received: event.received,
            consistent,
        };
        let span = self.span(&event.body);
        self.last = Some(event);
        let processor = self.shared.processor.clone();
        let memory = self.memory.clone();
        let address = ctx.address();
        let cycle = async move {
            // Only this object's one cycle at a time uses the memory; the lock is never contended
            // and is not held across the cycle's awaits.
            let mut taken = std::mem::take(&mut *lock(&memory));
            let result = processor.process(input, &mut taken).await;
            let mut slot = lock(&memory);
            // A stop during the cycle may have marked the object as interrupted meanwhile.
            taken.interrupted |= slot.interrupted;
            *slot = taken;
            drop(slot);
            address.do_send(CycleDone { result });
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
        if let Some(next) = self.pending.take() {
            self.start_cycle(next, ctx);
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

fn lock(memory: &Mutex<ObjectMemory>) -> std::sync::MutexGuard<'_, ObjectMemory> {
    memory.lock().unwrap_or_else(|p| p.into_inner())
}

impl Actor for ObjectWorker {
    type Context = Context<Self>;
}

impl Handler<Deliver> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, event: Deliver, ctx: &mut Context<Self>) {
        if let Some((expected, _)) = &self.expected {
            if event.body.metadata.resource_version.as_deref() == Some(expected.as_str()) {
                self.expected = None;
            }
        }
        if self.stopping {
            return;
        }
        if self.busy || self.throttled {
            // Coalesce: the next cycle sees the newest body. A deletion is always the newest event.
            self.last_seq = self.last_seq.max(event.seq);
            self.pending = Some(event);
        } else {
            // Ends an idle wait, a retry sleep or a consistency wait at once.
            self.start_cycle(event, ctx);
        }
    }
}

impl Handler<CycleDone> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, CycleDone { result }: CycleDone, ctx: &mut Context<Self>) {
        self.busy = false;
        let cycle = match result {
            Ok(cycle) => cycle,
            Err(error) => {
                if self.stopping {
                    return ctx.stop();
                }
                return self.throttle(&error, ctx);
            }
        };
        self.throttle_step = 0;
        if cycle.patched {
            self.expected = cycle
                .resource_version
                .map(|rv| (rv, Instant::now() + self.shared.consistency_timeout));
        }
        if self.stopping || self.pending.is_some() {
            return self.settle(ctx);
        }
        if cycle.awaiting_consistency {
            let wait = self
                .expected
                .as_ref()
                .map_or(Duration::ZERO, |(_, deadline)| {
                    deadline.saturating_duration_since(Instant::now())
                });
            return self.rerun_after(wait, ctx);
        }
        match cycle.delay {
            Some(delay) => self.touch_after(delay, ctx),
            None => self.settle(ctx),
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
                self.expected =
                    version.map(|rv| (rv, Instant::now() + self.shared.consistency_timeout));
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
            lock(&self.memory).interrupted = true;
        }
        self.stopping = true;
        self.pending = None;
        self.cancel_timer(ctx);
        if !self.busy {
            ctx.stop();
        }
    }
}
