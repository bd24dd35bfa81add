//! The ObjectWorker: one actor per object, the only place where that object is handled.
//!
//! **Expected flow**: the supervisor sends each of the object's events as [`Deliver`]. An idle worker
//! starts a processing cycle at once; a busy one keeps only the newest event (coalescing), so the next
//! cycle sees the newest body, never a backlog of stale states. A cycle runs the object's handlers one
//! after another as a task on the operator's runtime (never on the actor's thread), each under the
//! global limit of concurrently running handlers, and tells the worker when it is done.
//!
//! **Guarantees**
//! * One cycle at a time per object; events are handled in arrival order (minus the coalesced ones).
//! * A handler's error or panic is logged as that handler's failure; other handlers and objects go on.
//! * Every log line of a cycle carries the object (the `object` span).
//!
//! **Idling**: after `queueing.idle_timeout` with nothing to do, the worker tells the supervisor, which
//! stops it only if no event was sent since (the supervisor is the only sender, so none is in flight).
//! The object's memo lives in the supervisor's record of the object and survives the worker.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::FutureExt;
use kactor_reactor::handlers::{Ctx, EventHandler, HandlerError, Memo};
use kactor_reactor::resources::Resource;
use kactor_reactor::watching::EventType;
use kube::api::DynamicObject;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::tracker::Tracker;

/// An event for the worker's object.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deliver {
    /// What happened.
    pub event_type: EventType,
    /// The object as the event carried it.
    pub body: Arc<DynamicObject>,
    /// The supervisor's count of events sent to this object (for safe idling).
    pub seq: u64,
    /// When the event was received from the API.
    pub received: std::time::Instant,
}

/// A cycle has ended.
#[derive(Message)]
#[rtype(result = "()")]
struct CycleDone;

/// Stop now (sent by the supervisor when the worker idles).
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
    /// The resource served.
    pub resource: Arc<Resource>,
    /// The `on_event` handlers of that resource.
    pub handlers: Arc<[EventHandler]>,
    /// A client for the handlers.
    pub client: Arc<kube::Client>,
    /// The runtime handlers run on.
    pub runtime: Handle,
    /// The global limit of concurrently running handlers.
    pub limiter: Arc<Semaphore>,
    /// The handler tasks in flight.
    pub tracker: Arc<Tracker>,
    /// `queueing.idle_timeout`.
    pub idle_timeout: Duration,
    /// Where idling is reported.
    pub supervisor: Recipient<Idle>,
}

/// The actor of one object.
pub struct ObjectWorker {
    key: Arc<str>,
    memo: Memo,
    shared: Arc<WorkerShared>,
    busy: bool,
    pending: Option<Deliver>,
    last_seq: u64,
    idle: Option<SpawnHandle>,
}

impl ObjectWorker {
    /// A worker for the object known by `key`, with its memo.
    pub fn new(key: Arc<str>, memo: Memo, shared: Arc<WorkerShared>) -> Self {
        ObjectWorker {
            key,
            memo,
            shared,
            busy: false,
            pending: None,
            last_seq: 0,
            idle: None,
        }
    }

    fn start_cycle(&mut self, event: Deliver, ctx: &mut Context<Self>) {
        self.busy = true;
        self.last_seq = event.seq;
        if let Some(idle) = self.idle.take() {
            ctx.cancel_future(idle);
        }
        let meta = &event.body.metadata;
        let api_version = event.body.types.as_ref().map_or_else(
            || self.shared.resource.api_version(),
            |t| t.api_version.clone(),
        );
        let span = kactor_reactor::logging::object_span(
            &api_version,
            &self.shared.resource.kind,
            meta.name.as_deref().unwrap_or_default(),
            meta.namespace.as_deref(),
            meta.uid.as_deref().unwrap_or_default(),
        );
        let handler_ctx = Ctx::new(
            event.event_type,
            event.body,
            self.memo.clone(),
            self.shared.resource.clone(),
            self.shared.client.clone(),
            event.received,
        );
        let handlers = self.shared.handlers.clone();
        let limiter = self.shared.limiter.clone();
        let address = ctx.address();
        let cycle = async move {
            run_cycle(&handlers, handler_ctx, &limiter).await;
            address.do_send(CycleDone);
        };
        self.shared
            .tracker
            .spawn(&self.shared.runtime, cycle.instrument(span));
    }
}

impl Actor for ObjectWorker {
    type Context = Context<Self>;
}

impl Handler<Deliver> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, event: Deliver, ctx: &mut Context<Self>) {
        if self.busy {
            // Coalesce: the next cycle sees the newest body. A deletion is always the newest event.
            self.pending = Some(event);
        } else {
            self.start_cycle(event, ctx);
        }
    }
}

impl Handler<CycleDone> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, _: CycleDone, ctx: &mut Context<Self>) {
        self.busy = false;
        if let Some(next) = self.pending.take() {
            self.start_cycle(next, ctx);
            return;
        }
        let (key, seq, supervisor) = (
            self.key.clone(),
            self.last_seq,
            self.shared.supervisor.clone(),
        );
        self.idle = Some(ctx.run_later(self.shared.idle_timeout, move |_, _| {
            supervisor.do_send(Idle { key, seq })
        }));
    }
}

impl Handler<Stop> for ObjectWorker {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        if !self.busy && self.pending.is_none() {
            ctx.stop();
        }
    }
}

/// Runs the `on_event` handlers of one event, in order; failures are logged and never retried.
async fn run_cycle(handlers: &[EventHandler], ctx: Ctx, limiter: &Semaphore) {
    for handler in handlers {
        // The semaphore is never closed, so acquiring only waits.
        let Ok(_permit) = limiter.acquire().await else {
            return;
        };
        let result = AssertUnwindSafe((handler.func)(ctx.clone()))
            .catch_unwind()
            .await;
        let result =
            result.unwrap_or_else(|panic| Err(HandlerError::Panicked(panic_message(&panic))));
        match result {
            Ok(()) => tracing::debug!(handler = %handler.id, "Handler '{}' succeeded.", handler.id),
            Err(error) => {
                tracing::error!(handler = %handler.id, %error, "Handler '{}' failed with an exception. Will ignore. {error}", handler.id)
            }
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}
