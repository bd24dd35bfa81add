//! Sub-handlers: handlers that a changing handler registers while it runs, each with a progress
//! record of its own (Kopf's `@kopf.subhandler`, `kopf.register` and `kopf.execute`;
//! `reference/kopf.md` §1.1).
//!
//! **Expected flow**: a changing handler (create, update, delete, resume or field) calls
//! [`Ctx::subhandler`] for each piece of work, with an id of its own; the sub-handler's id becomes
//! `parent/child`. The parent then calls [`Ctx::execute`], or returns and they are executed right
//! after it (implicitly, as Kopf does). Executing them is one step of a lifecycle, the same as for
//! top-level handlers:
//! * their records are read from the object (`parent/child` keys, Kopf's format);
//! * the due ones run as the operator's lifecycle picks them (by default one per cycle), each with
//!   its own retries, backoff, timeout and errors mode;
//! * their records and results (`status.<parent/child>`) go into the cycle's patch;
//! * every sub-handler id, at any depth, is added to the `subrefs` of each ancestor's record;
//! * while any is not finished, the parent is not finished either: it is retried (invoked again,
//!   registering its sub-handlers again) when the earliest sub-handler is due, without an error
//!   logged or posted (Kopf's `HandlerChildrenRetry`, stored with the message `None`).
//!
//! When every sub-handler finished, succeeded or failed for good, the parent succeeds (unless it
//! fails itself), and when the cause is done the records of the parent and of all its sub-handlers
//! are purged. So an object that Kopf left with half-done sub-handlers is continued by kactor, and
//! the other way round.
//!
//! **Guarantees**
//! * Sub-handlers never take a slot of `execution.max_concurrent_handlers`: their parent holds one.
//! * A sub-handler can register sub-handlers of its own (`parent/child/grandchild`).
//! * A second registration of an id in the same attempt is refused (logged); the first one runs.
//! * Outside a changing handler (event handlers, daemons, timers, reconcile handlers) there is no
//!   lifecycle to track them: registering logs an error, and [`Ctx::execute`] fails. The same goes
//!   for a task the handler spawns: the attempt's sub-handlers are known to the handler's own task
//!   (a task-local, as Kopf keeps them in a context variable), not to the context it was given.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde::Serialize;

use crate::intents::context::{handler_fn, Ctx, HandlerError};
use crate::intents::handlers::{ChangingHandler, On};
use crate::structs::resources::Selector;

/// The message Kopf stores in a parent's record while its sub-handlers are unfinished (the text
/// of its internal `HandlerChildrenRetry`, which carries no message).
pub const CHILDREN_RETRY_MESSAGE: &str = "None";

/// The ids of the sub-handlers of one handler, at any depth (its record's `subrefs`).
pub type Subrefs = Arc<Mutex<BTreeSet<String>>>;

/// Runs sub-handlers: one step of their lifecycle (implemented by the processing, which knows the
/// progress storage, the lifecycle and the clock).
pub trait SubRunner: Send + Sync {
    /// Runs the due ones of `handlers` (registered under `ctx`'s handler) once, stores their
    /// progress and results in `ctx`'s patch, and adds their ids to each of `subrefs` (the
    /// ancestors'). Err([`HandlerError::ChildrenRetry`]): some are not finished yet.
    fn run<'a>(
        &'a self,
        runner: Arc<dyn SubRunner>,
        ctx: &'a Ctx,
        handlers: Vec<ChangingHandler>,
        subrefs: Vec<Subrefs>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// What one attempt of a changing handler knows of its sub-handlers.
pub struct Subhandling {
    /// The handler's id: the prefix of its sub-handlers' ids.
    prefix: Arc<str>,
    /// Registered in this attempt.
    registered: Mutex<Vec<ChangingHandler>>,
    /// Executed already (explicitly): not again after the handler returns.
    executed: AtomicBool,
    /// The subrefs of this handler's record and of every ancestor's (this one last).
    subrefs: Vec<Subrefs>,
    runner: Arc<dyn SubRunner>,
}

impl Subhandling {
    /// For one attempt of the handler `id`, whose record's sub-handler ids go into the last of
    /// `subrefs` (the ancestors' before it).
    pub fn new(id: &str, subrefs: Vec<Subrefs>, runner: Arc<dyn SubRunner>) -> Self {
        Subhandling {
            prefix: Arc::from(id),
            registered: Mutex::new(Vec::new()),
            executed: AtomicBool::new(false),
            subrefs,
            runner,
        }
    }

    /// Whether the sub-handlers were executed already in this attempt.
    pub fn executed(&self) -> bool {
        self.executed.load(Ordering::SeqCst)
    }
}

tokio::task_local! {
    /// The sub-handlers of the changing handler whose attempt runs in this task.
    static SUBHANDLING: Arc<Subhandling>;
}

/// Runs `attempt` (one attempt of a changing handler) with `sub` as its sub-handlers.
///
/// A plain function, not an `async fn`: an `async fn` would keep the attempt's future twice in its
/// own (as its argument and inside the scope it awaits), and every cycle's future carries it.
pub fn scoped<F: std::future::Future>(
    sub: Arc<Subhandling>,
    attempt: F,
) -> impl std::future::Future<Output = F::Output> {
    SUBHANDLING.scope(sub, attempt)
}

/// The sub-handlers of the changing handler whose attempt runs in this task, if any.
pub fn current() -> Option<Arc<Subhandling>> {
    SUBHANDLING.try_with(Arc::clone).ok()
}

impl Ctx {
    /// Registers a sub-handler of this changing handler: `on`'s id becomes `<this id>/<id>`, with
    /// its options (errors, retries, timeout, backoff, param) and filters. It runs when the
    /// handler calls [`Ctx::execute`], or right after the handler returns.
    ///
    /// ```
    /// # use kactor_reactor::handlers::{Ctx, HandlerError, On};
    /// async fn create(ctx: Ctx) -> Result<(), HandlerError> {
    ///     let items: Vec<String> = serde_json::from_value(ctx.spec()["items"].clone())?;
    ///     for item in items {
    ///         // Each item is a handler of its own: `create/<item>`, retried on its own.
    ///         ctx.subhandler(On::id(item.as_str()), move |ctx| {
    ///             let item = item.clone();
    ///             async move {
    ///                 ctx.logger().info(format!("handling {item}"));
    ///                 Ok(serde_json::json!({"item": item}))
    ///             }
    ///         });
    ///     }
    ///     Ok(()) // the sub-handlers run now, as if `ctx.execute().await?` were here
    /// }
    /// ```
    pub fn subhandler<F, Fut, R>(&self, on: impl Into<On>, f: F)
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<R, HandlerError>> + Send + 'static,
        R: Serialize + 'static,
    {
        let mut on = on.into();
        let Some(sub) = current() else {
            tracing::error!(
                "Sub-handler '{}' is ignored: sub-handlers run only inside changing handlers (create, update, delete, resume, field).",
                on.id
            );
            return;
        };
        on.id = format!("{}/{}", sub.prefix, on.id);
        let mut registered = sub.registered.lock().unwrap_or_else(|e| e.into_inner());
        if registered.iter().any(|h| h.id == on.id) {
            tracing::error!(
                "Sub-handler '{}' is registered twice in one attempt; the first one is kept.",
                on.id
            );
            return;
        }
        let resource = &self.resource;
        let selector = Selector::new(&resource.group, &resource.version, &resource.plural);
        registered.push(ChangingHandler::sub(selector, on, handler_fn(f)));
    }

    /// Executes the sub-handlers registered so far (Kopf's `await kopf.execute()`): the due ones
    /// run once. `Err` while some are unfinished: return it (`?`), and the handler is invoked again
    /// when the earliest is due. Without this call, they are executed after the handler returns.
    pub async fn execute(&self) -> Result<(), HandlerError> {
        let Some(sub) = current() else {
            return Err(HandlerError::msg(
                "sub-handlers run only inside changing handlers (create, update, delete, resume, field)",
            ));
        };
        if sub.executed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let handlers =
            std::mem::take(&mut *sub.registered.lock().unwrap_or_else(|e| e.into_inner()));
        sub.runner
            .run(sub.runner.clone(), self, handlers, sub.subrefs.clone())
            .await
    }
}
