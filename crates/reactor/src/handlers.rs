//! Handlers: what users register, what they are given ([`Ctx`], [`ActivityCtx`]), what they return.
//!
//! * `on_event` handlers ([`EventHandler`]) run for every watch event, including the initial listing;
//!   their errors are logged, never retried, and no progress is kept (`reference/kopf.md` §1.1).
//! * Changing handlers ([`ChangingHandler`]: create, update, delete, resume, field) run for a cause
//!   (see [`crate::causes`]), are retried per their [`Options`] until they succeed or fail for good,
//!   and keep their progress on the object (see [`crate::progression`]).
//! * `on_startup` / `on_cleanup` activities ([`Activity`], §1.22).
//!
//! A resource handler returns `Ok(value)`: anything serialisable; `()` (null) stores nothing, any
//! other value lands in `status.<handler id>` (an object is merged into it).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::Value;
use tokio::sync::watch;

use crate::causes::{ChangingCause, Reason};
use crate::daemons::{Live, SpawningHandler, Stopped};
use crate::diffs::Diff;
use crate::filters::{Filters, MetaFilter, ValueFilter};
use crate::patches::Patch;
use crate::posting::{EventPoster, ObjectRef};
use crate::resources::{Resource, Selector};
use crate::watching::EventType;

/// What a handler returns when it fails. Any `std::error::Error` converts into it with `?`.
pub enum HandlerError {
    /// Retry after a delay (Kopf's `TemporaryError`; the default delay is 60 s).
    Temporary {
        /// What went wrong.
        message: String,
        /// When to retry.
        delay: Duration,
    },
    /// Do not retry (Kopf's `PermanentError`).
    Permanent(String),
    /// Any other error.
    Failed(Box<dyn std::error::Error + Send + Sync>),
    /// The handler panicked.
    Panicked(String),
}

impl HandlerError {
    /// A temporary error: the handler is retried after `delay` (Kopf's `TemporaryError`;
    /// `Duration::ZERO` retries in the next cycle).
    pub fn temporary(message: impl Into<String>, delay: Duration) -> Self {
        HandlerError::Temporary {
            message: message.into(),
            delay,
        }
    }

    /// A permanent error: the handler is not retried.
    pub fn permanent(message: impl Into<String>) -> Self {
        HandlerError::Permanent(message.into())
    }

    /// Any other failure, from a message.
    pub fn msg(message: impl Into<String>) -> Self {
        HandlerError::Failed(message.into().into())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        HandlerError::Failed(Box::new(error))
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Temporary { message, delay } => {
                write!(f, "{message} (temporary; retry in {delay:?})")
            }
            HandlerError::Permanent(message) => write!(f, "{message} (permanent)"),
            HandlerError::Failed(error) => write!(f, "{error}"),
            HandlerError::Panicked(message) => write!(f, "the handler panicked: {message}"),
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What activities (and handlers that store no result) return.
pub type HandlerResult = Result<(), HandlerError>;

/// How a handler's arbitrary errors (not [`HandlerError::Temporary`] or [`HandlerError::Permanent`])
/// are treated (Kopf's `ErrorsMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorsMode {
    /// Retried after the handler's `backoff` (the default for changing handlers).
    #[default]
    Temporary,
    /// A final failure.
    Permanent,
    /// Logged, and the handler counts as done, with no result (the fixed mode of `on_event`).
    Ignored,
}

/// Per-object (or, for activities, per-operator) user state that lives as long as the object: Kopf's
/// `memo`, typed. Cheap to clone; clones share the state. Each type has one slot.
///
/// ```
/// # use kactor_reactor::handlers::Memo;
/// #[derive(Default)]
/// struct Seen { events: u32 }
/// let memo = Memo::default();
/// memo.with(|seen: &mut Seen| seen.events += 1);
/// assert_eq!(memo.with(|seen: &mut Seen| seen.events), 1);
/// ```
#[derive(Clone, Default)]
pub struct Memo(Arc<Mutex<Option<Slots>>>);

/// A memo's values, one per type; allocated on first use, so an unused memo costs one pointer.
type Slots = HashMap<TypeId, Box<dyn Any + Send>>;

impl Memo {
    /// Runs `f` on this type's slot, made with `T::default()` the first time.
    pub fn with<T: Default + Send + 'static, R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let slots = guard.get_or_insert_with(HashMap::new);
        let slot = slots
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()));
        match slot.downcast_mut::<T>() {
            Some(value) => f(value),
            // The slot for TypeId::of::<T>() only ever holds a T.
            None => unreachable!("a memo slot holds a value of another type"),
        }
    }

    /// Puts a value in its type's slot; returns the previous one.
    pub fn insert<T: Send + 'static>(&self, value: T) -> Option<T> {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let previous = guard
            .get_or_insert_with(HashMap::new)
            .insert(TypeId::of::<T>(), Box::new(value));
        previous.and_then(|p| p.downcast::<T>().ok()).map(|p| *p)
    }

    /// A copy of the value in this type's slot.
    pub fn get<T: Clone + Send + 'static>(&self) -> Option<T> {
        let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()?
            .get(&TypeId::of::<T>())?
            .downcast_ref::<T>()
            .cloned()
    }
}

impl fmt::Debug for Memo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slots = self
            .0
            .lock()
            .map(|g| g.as_ref().map_or(0, HashMap::len))
            .unwrap_or(0);
        f.debug_struct("Memo").field("slots", &slots).finish()
    }
}

/// What a resource handler is given: Kopf's kwargs (`reference/kopf.md` §1.3) for one event of one
/// object, and for changing handlers the cause and the attempt.
#[derive(Clone)]
pub struct Ctx {
    /// The event's type (`Listed` for the initial listing, Kopf's `None`).
    pub event_type: EventType,
    /// The object as the event carried it.
    pub body: Arc<DynamicObject>,
    /// The object's memo.
    pub memo: Memo,
    /// The resource being served.
    pub resource: Arc<Resource>,
    /// When kactor received the event from the API (the start of its dispatch latency).
    pub received: std::time::Instant,
    /// Shared by every event of the resource; cloned into a `kube::Client` only on request.
    client: Arc<kube::Client>,
    patch: Patch,
    cause: Option<Arc<ChangingCause>>,
    attempt: Option<Arc<Attempt>>,
    events: Option<Arc<EventSink>>,
    daemon: Option<Arc<DaemonSide>>,
}

/// What daemons and timers see beyond other handlers: the stop signal and the live body.
struct DaemonSide {
    stopped: Stopped,
    live: watch::Receiver<Live>,
}

/// One invocation of one handler: Kopf's per-handler kwargs.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The handler's id.
    pub id: Arc<str>,
    /// The handler's `param`.
    pub param: Option<Arc<Value>>,
    /// How many attempts came before this one (0 for the first).
    pub retry: u32,
    /// When the first attempt started.
    pub started: Option<Timestamp>,
    /// How long since the first attempt started.
    pub runtime: Duration,
    /// For field handlers: the old value of the field.
    pub old: Option<Arc<Value>>,
    /// For field handlers: the new value of the field.
    pub new: Option<Arc<Value>>,
    /// For field handlers: the diff reduced to the field.
    pub diff: Option<Arc<Diff>>,
    /// Whether the attempt carries field-reduced values.
    pub reduced: bool,
}

/// Where a context's Kubernetes Events go.
struct EventSink {
    poster: EventPoster,
    object: ObjectRef,
}

impl Ctx {
    /// The context of one event.
    pub fn new(
        event_type: EventType,
        body: Arc<DynamicObject>,
        memo: Memo,
        resource: Arc<Resource>,
        client: Arc<kube::Client>,
        received: std::time::Instant,
    ) -> Self {
        Ctx {
            event_type,
            body,
            memo,
            resource,
            received,
            client,
            patch: Patch::default(),
            cause: None,
            attempt: None,
            events: None,
            daemon: None,
        }
    }

    /// The same context, for a daemon or timer: with its stop signal and the live body.
    pub fn with_daemon(mut self, stopped: Stopped, live: watch::Receiver<Live>) -> Self {
        self.daemon = Some(Arc::new(DaemonSide { stopped, live }));
        self
    }

    /// For daemons and timers, the stop signal: await it, poll it, or sleep on it
    /// (`ctx.stopped().wait_timeout(..)`), and see why (`ctx.stopped().reasons()`). For other
    /// handlers it never fires.
    ///
    /// ```
    /// # use kactor_reactor::handlers::{Ctx, HandlerError};
    /// # use std::time::Duration;
    /// async fn monitor(ctx: Ctx) -> Result<(), HandlerError> {
    ///     while !ctx.stopped().wait_timeout(Duration::from_secs(30)).await {
    ///         let now = ctx.fresh(); // the newest body, not the one the daemon started with
    ///         println!("size is {}", now.spec()["size"]);
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn stopped(&self) -> Stopped {
        self.daemon
            .as_ref()
            .map_or_else(Stopped::never, |d| d.stopped.clone())
    }

    /// The same context with the newest body of the object: for daemons and timers, the body of the
    /// last event received (Kopf's live `body`); for other handlers, this very context.
    pub fn fresh(&self) -> Ctx {
        let mut fresh = self.clone();
        if let Some(daemon) = &self.daemon {
            let live = daemon.live.borrow();
            fresh.body = live.body.clone();
            fresh.event_type = live.event_type;
        }
        fresh
    }

    /// The same context, accumulating into `patch` (one per processing cycle).
    pub fn with_patch(mut self, patch: Patch) -> Self {
        self.patch = patch;
        self
    }

    /// The same context, for a changing cause.
    pub fn with_cause(mut self, cause: Arc<ChangingCause>) -> Self {
        self.cause = Some(cause);
        self
    }

    /// The same context, for one attempt of one handler.
    pub fn with_attempt(mut self, attempt: Attempt) -> Self {
        self.attempt = Some(Arc::new(attempt));
        self
    }

    /// The same context, posting Kubernetes Events through `poster`.
    pub fn with_events(mut self, poster: EventPoster) -> Self {
        let object = ObjectRef::of(&self.body, &self.resource);
        self.events = Some(Arc::new(EventSink { poster, object }));
        self
    }

    /// A client, to call the API.
    pub fn client(&self) -> kube::Client {
        (*self.client).clone()
    }

    /// The event type as Kopf gives it: None for a listing, else `ADDED`/`MODIFIED`/`DELETED`.
    pub fn kopf_type(&self) -> Option<&'static str> {
        self.event_type.as_str()
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.body.metadata.name.as_deref().unwrap_or_default()
    }

    /// `metadata.namespace` (None for cluster-scoped objects).
    pub fn namespace(&self) -> Option<&str> {
        self.body.metadata.namespace.as_deref()
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> Option<&str> {
        self.body.metadata.uid.as_deref()
    }

    /// The object's metadata.
    pub fn meta(&self) -> &kube::api::ObjectMeta {
        &self.body.metadata
    }

    /// `metadata.labels` (empty when absent).
    pub fn labels(&self) -> &std::collections::BTreeMap<String, String> {
        self.body.metadata.labels.as_ref().unwrap_or(empty_map())
    }

    /// `metadata.annotations` (empty when absent).
    pub fn annotations(&self) -> &std::collections::BTreeMap<String, String> {
        self.body
            .metadata
            .annotations
            .as_ref()
            .unwrap_or(empty_map())
    }

    /// `spec` (null when absent).
    pub fn spec(&self) -> &Value {
        self.body.data.get("spec").unwrap_or(&Value::Null)
    }

    /// `status` (null when absent).
    pub fn status(&self) -> &Value {
        self.body.data.get("status").unwrap_or(&Value::Null)
    }

    /// `spec` as a typed value (`ctx.spec_as::<MySpec>()?`); a missing spec reads as null.
    pub fn spec_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(self.spec())
    }

    /// `status` as a typed value; a missing status reads as null.
    pub fn status_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(self.status())
    }

    /// The whole object as a typed resource (a `kube::CustomResource` struct, a `k8s-openapi` type).
    pub fn object<K: serde::de::DeserializeOwned>(&self) -> Result<K, serde_json::Error> {
        serde_json::to_value(&*self.body).and_then(serde_json::from_value)
    }

    /// The cycle's patch: what it adds is sent with the cycle's one combined patch.
    ///
    /// ```
    /// # use kactor_reactor::handlers::Ctx;
    /// # use serde_json::json;
    /// fn handler(ctx: &Ctx) {
    ///     ctx.patch().status("phase", json!("Ready"));
    ///     ctx.patch().label("example.com/handled", Some("yes"));
    /// }
    /// ```
    pub fn patch(&self) -> &Patch {
        &self.patch
    }

    /// The changing cause, for changing handlers (and their filters).
    pub fn cause(&self) -> Option<&ChangingCause> {
        self.cause.as_deref()
    }

    /// Why a changing handler runs (`create`, `update`, `delete`, `resume`).
    pub fn reason(&self) -> Option<Reason> {
        self.cause.as_ref().map(|c| c.reason)
    }

    /// The old essence (the diff-base), or for field handlers the field's old value.
    pub fn old(&self) -> Option<&Value> {
        match &self.attempt {
            Some(attempt) if attempt.reduced => attempt.old.as_deref(),
            _ => self.cause.as_ref().and_then(|c| c.old.as_deref()),
        }
    }

    /// The new essence, or for field handlers the field's new value.
    pub fn new_value(&self) -> Option<&Value> {
        match &self.attempt {
            Some(attempt) if attempt.reduced => attempt.new.as_deref(),
            _ => self.cause.as_ref().and_then(|c| c.new.as_deref()),
        }
    }

    /// From old to new (for field handlers, reduced to the field).
    pub fn diff(&self) -> &Diff {
        if let Some(diff) = self.attempt.as_ref().and_then(|a| a.diff.as_deref()) {
            return diff;
        }
        match &self.cause {
            Some(cause) => &cause.diff,
            None => empty_diff(),
        }
    }

    /// The handler's id.
    pub fn id(&self) -> &str {
        self.attempt.as_ref().map_or("", |a| &a.id)
    }

    /// The handler's `param`.
    pub fn param(&self) -> Option<&Value> {
        self.attempt.as_ref().and_then(|a| a.param.as_deref())
    }

    /// How many attempts came before this one (0 for the first).
    pub fn retry(&self) -> u32 {
        self.attempt.as_ref().map_or(0, |a| a.retry)
    }

    /// When the handler's first attempt started.
    pub fn started(&self) -> Option<Timestamp> {
        self.attempt.as_ref().and_then(|a| a.started)
    }

    /// How long since the handler's first attempt started.
    pub fn runtime(&self) -> Duration {
        self.attempt.as_ref().map_or(Duration::ZERO, |a| a.runtime)
    }

    /// A logger for this object: its lines carry the object and the handler.
    pub fn logger(&self) -> Logger<'_> {
        Logger { id: self.id() }
    }

    /// Posts a `Normal` Kubernetes Event about the object (never fails the handler).
    pub fn info(&self, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster.info(&sink.object, reason, message);
        }
    }

    /// Posts a `Warning` Kubernetes Event about the object (never fails the handler).
    pub fn warn(&self, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster.warn(&sink.object, reason, message);
        }
    }

    /// Posts an `Error` Kubernetes Event about the object (never fails the handler).
    pub fn exception(&self, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster.exception(&sink.object, reason, message);
        }
    }

    /// Posts a Kubernetes Event of any type about the object (never fails the handler).
    pub fn event(&self, event_type: &str, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster.event(&sink.object, event_type, reason, message);
        }
    }
}

fn empty_map() -> &'static std::collections::BTreeMap<String, String> {
    static EMPTY: std::sync::OnceLock<std::collections::BTreeMap<String, String>> =
        std::sync::OnceLock::new();
    EMPTY.get_or_init(Default::default)
}

fn empty_diff() -> &'static Diff {
    static EMPTY: std::sync::OnceLock<Diff> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Diff(Vec::new()))
}

/// A handler's logger: lines go through `tracing` inside the object's span, with the handler's id.
pub struct Logger<'a> {
    id: &'a str,
}

impl Logger<'_> {
    /// Logs at debug level.
    pub fn debug(&self, message: impl fmt::Display) {
        tracing::debug!(handler = self.id, "{message}");
    }

    /// Logs at info level.
    pub fn info(&self, message: impl fmt::Display) {
        tracing::info!(handler = self.id, "{message}");
    }

    /// Logs at warn level.
    pub fn warn(&self, message: impl fmt::Display) {
        tracing::warn!(handler = self.id, "{message}");
    }

    /// Logs at error level.
    pub fn error(&self, message: impl fmt::Display) {
        tracing::error!(handler = self.id, "{message}");
    }
}

/// What a startup or cleanup activity is given.
#[derive(Clone)]
pub struct ActivityCtx {
    /// The operator-wide memo (the same for every activity).
    pub memo: Memo,
    /// A client, to call the API.
    pub client: kube::Client,
}

/// A resource handler function: its result is stored in `status.<id>` unless it is null.
pub type HandlerFn =
    Arc<dyn Fn(Ctx) -> BoxFuture<'static, Result<Value, HandlerError>> + Send + Sync>;

/// Wraps an async function returning any serialisable value as a [`HandlerFn`].
pub fn handler_fn<F, Fut, R>(f: F) -> HandlerFn
where
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<R, HandlerError>> + Send + 'static,
    R: serde::Serialize + 'static,
{
    Arc::new(move |ctx| {
        f(ctx)
            .map(|result| {
                result.and_then(|value| {
                    serde_json::to_value(value).map_err(|e| {
                        HandlerError::msg(format!("the handler's result cannot be stored: {e}"))
                    })
                })
            })
            .boxed()
    })
}

/// A startup or cleanup activity function.
pub type ActivityFn = Arc<dyn Fn(ActivityCtx) -> BoxFuture<'static, HandlerResult> + Send + Sync>;

/// A probe function: what it returns is its entry in the liveness JSON.
pub type ProbeFn =
    Arc<dyn Fn(ActivityCtx) -> BoxFuture<'static, Result<Value, HandlerError>> + Send + Sync>;

/// A registered `on_event` handler.
#[derive(Clone)]
pub struct EventHandler {
    /// The handler's id (in logs, and the key of its result in `status`).
    pub id: String,
    /// Which resource it serves.
    pub selector: Selector,
    /// Which objects it is for.
    pub filters: Filters,
    /// The handler's `param`.
    pub param: Option<Arc<Value>>,
    /// The function.
    pub func: HandlerFn,
}

/// The options of a changing handler (Kopf's decorator arguments, `reference/kopf.md` §1.2).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// How arbitrary errors are treated (default: temporary).
    pub errors: Option<ErrorsMode>,
    /// Give up once this long has passed since the first attempt (default: never). An attempt still
    /// running when the time is up is cancelled.
    pub timeout: Option<Duration>,
    /// Give up after this many attempts in all (default: never).
    pub retries: Option<u32>,
    /// The delay before retrying after an arbitrary error (default: `execution.default_backoff`).
    pub backoff: Option<Duration>,
    /// Given to the handler as `ctx.param()`.
    pub param: Option<Arc<Value>>,
}

/// A registered changing handler: create, update, delete, resume or field.
#[derive(Clone)]
pub struct ChangingHandler {
    /// The id: the key of its progress annotation and of its result in `status`.
    pub id: String,
    /// Which resource it serves.
    pub selector: Selector,
    /// The reason it runs for; None: any (field and resume handlers).
    pub reason: Option<Reason>,
    /// A resume handler: runs once per process for objects found in the initial listing.
    pub initial: bool,
    /// For resume handlers: also while deletion is ongoing.
    pub deleted: bool,
    /// The object must keep our finalizer while this handler may run (non-optional delete handlers).
    pub requires_finalizer: bool,
    /// With a field: runs only when the field changed.
    pub field_needs_change: bool,
    /// Errors, retries, timeout, backoff, param.
    pub options: Options,
    /// Which objects and changes it is for.
    pub filters: Filters,
    /// The function.
    pub func: HandlerFn,
}

impl ChangingHandler {
    /// A changing handler as registered for `reason`: `Some(Noop)` marks a field handler (any
    /// reason; the field must change), `None` a resume handler; the others are the cause it runs
    /// for. A delete handler that is not optional requires the finalizer.
    pub fn register(selector: Selector, on: On, reason: Option<Reason>, func: HandlerFn) -> Self {
        let field_handler = reason == Some(Reason::Noop);
        let resume = reason.is_none();
        let delete = reason == Some(Reason::Delete);
        let needs_change =
            field_handler || (reason == Some(Reason::Update) && on.filters.field.is_some());
        ChangingHandler {
            id: on.id,
            selector,
            reason: if field_handler || resume {
                None
            } else {
                reason
            },
            initial: resume,
            deleted: resume && on.deleted,
            requires_finalizer: delete && !on.optional,
            field_needs_change: needs_change,
            options: on.options,
            filters: on.filters,
            func,
        }
    }

    /// Whether this handler runs for this cause (Kopf's registry matching): the reason, the resume
    /// rules, then the filters.
    pub fn matches(&self, ctx: &Ctx) -> bool {
        let Some(cause) = ctx.cause() else {
            return false;
        };
        if self.reason.is_some_and(|r| r != cause.reason) {
            return false;
        }
        if self.initial && (!cause.initial || (cause.deleted && !self.deleted)) {
            return false;
        }
        self.filters.matches(ctx, self.field_needs_change)
    }
}

/// A handler registration in the making: the id, the options and the filters (Kopf's decorator
/// arguments). A string is an id with no options.
///
/// ```
/// # use kactor_reactor::handlers::{On, ErrorsMode};
/// # use std::time::Duration;
/// let on = On::id("scale")
///     .field("spec.replicas")
///     .label("app", "web")
///     .errors(ErrorsMode::Permanent)
///     .retries(3)
///     .timeout(Duration::from_secs(600));
/// ```
#[derive(Clone, Debug, Default)]
pub struct On {
    /// The handler's id.
    pub id: String,
    /// Errors, retries, timeout, backoff, param.
    pub options: Options,
    /// The filters.
    pub filters: Filters,
    /// For delete handlers: no finalizer is needed (the handler runs if the operator happens to see
    /// the deletion).
    pub optional: bool,
    /// For resume handlers: also while deletion is ongoing.
    pub deleted: bool,
}

impl On {
    /// A handler with this id.
    pub fn id(id: impl Into<String>) -> Self {
        On {
            id: id.into(),
            ..On::default()
        }
    }

    /// How arbitrary errors are treated.
    pub fn errors(mut self, mode: ErrorsMode) -> Self {
        self.options.errors = Some(mode);
        self
    }

    /// Give up once this long has passed since the first attempt.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }

    /// Give up after this many attempts in all.
    pub fn retries(mut self, retries: u32) -> Self {
        self.options.retries = Some(retries);
        self
    }

    /// The delay before retrying after an arbitrary error.
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.options.backoff = Some(backoff);
        self
    }

    /// A value given to the handler as `ctx.param()`.
    pub fn param(mut self, param: Value) -> Self {
        self.options.param = Some(Arc::new(param));
        self
    }

    /// Only objects whose label passes the filter (a value, [`MetaFilter::Present`],
    /// [`MetaFilter::Absent`], or [`MetaFilter::check`]).
    pub fn label(mut self, key: impl Into<String>, filter: impl Into<MetaFilter>) -> Self {
        self.filters.labels.push((key.into(), filter.into()));
        self
    }

    /// Only objects whose annotation passes the filter.
    pub fn annotation(mut self, key: impl Into<String>, filter: impl Into<MetaFilter>) -> Self {
        self.filters.annotations.push((key.into(), filter.into()));
        self
    }

    /// The field the handler is about (`"spec.replicas"`): it must be present (or pass `value`).
    pub fn field(mut self, field: &str) -> Self {
        self.filters.field = Some(crate::diffs::parse_field(field));
        self
    }

    /// The field's value must pass this filter.
    pub fn value(mut self, filter: impl Into<ValueFilter>) -> Self {
        self.filters.value = Some(filter.into());
        self
    }

    /// Update and field handlers: the field's old value must pass this filter.
    pub fn old(mut self, filter: impl Into<ValueFilter>) -> Self {
        self.filters.old = Some(filter.into());
        self
    }

    /// Update and field handlers: the field's new value must pass this filter.
    pub fn new(mut self, filter: impl Into<ValueFilter>) -> Self {
        self.filters.new = Some(filter.into());
        self
    }

    /// A last check over the whole context.
    pub fn when(mut self, when: impl Fn(&Ctx) -> bool + Send + Sync + 'static) -> Self {
        self.filters.when = Some(Arc::new(when));
        self
    }

    /// Delete handlers: no finalizer is needed.
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Resume handlers: also while deletion is ongoing.
    pub fn deleted(mut self) -> Self {
        self.deleted = true;
        self
    }
}

impl From<&str> for On {
    fn from(id: &str) -> Self {
        On::id(id)
    }
}

impl From<String> for On {
    fn from(id: String) -> Self {
        On::id(id)
    }
}

/// A registered startup or cleanup activity.
#[derive(Clone)]
pub struct Activity {
    /// The activity's id.
    pub id: String,
    /// The function.
    pub func: ActivityFn,
}

/// A registered probe (Kopf's `@kopf.on.probe`): its result is its entry, `{"<id>": <result>}`, in
/// the JSON that `/healthz` answers with; its failure fails `/healthz`.
#[derive(Clone)]
pub struct Probe {
    /// The probe's id.
    pub id: String,
    /// The function.
    pub func: ProbeFn,
}

/// The handlers of one resource, as its supervisor and workers use them.
#[derive(Clone, Default)]
pub struct ResourceHandlers {
    /// `on_event` handlers, in registration order.
    pub event: Vec<EventHandler>,
    /// Changing handlers, in registration order.
    pub changing: Vec<ChangingHandler>,
    /// Daemons and timers, in registration order.
    pub spawning: Vec<SpawningHandler>,
}

impl ResourceHandlers {
    /// The fields named by handlers, kept in the essence even outside `spec` (Kopf's extra fields).
    pub fn extra_fields(&self) -> Vec<Vec<String>> {
        let mut fields: Vec<Vec<String>> = Vec::new();
        let named = self
            .changing
            .iter()
            .filter_map(|h| h.filters.field.as_ref())
            .chain(self.event.iter().filter_map(|h| h.filters.field.as_ref()))
            .chain(
                self.spawning
                    .iter()
                    .filter_map(|h| h.filters.field.as_ref()),
            );
        for field in named {
            if !fields.contains(field) {
                fields.push(field.clone());
            }
        }
        fields
    }

    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.event.is_empty() && self.changing.is_empty() && self.spawning.is_empty()
    }
}

/// Every registered handler of an operator.
#[derive(Clone, Default)]
pub struct Registry {
    /// `on_event` handlers, in registration order.
    pub event_handlers: Vec<EventHandler>,
    /// Changing handlers, in registration order.
    pub changing_handlers: Vec<ChangingHandler>,
    /// Daemons and timers, in registration order.
    pub spawning_handlers: Vec<SpawningHandler>,
    /// `on_startup` activities, run in order before anything is watched.
    pub startup: Vec<Activity>,
    /// `on_cleanup` activities, run in order after everything stopped.
    pub cleanup: Vec<Activity>,
    /// `on_probe` handlers, run (concurrently) when `/healthz` is asked and their results are stale.
    pub probes: Vec<Probe>,
}

impl Registry {
    /// The distinct selectors that handlers were registered for, in registration order.
    pub fn selectors(&self) -> Vec<Selector> {
        let mut selectors: Vec<Selector> = Vec::new();
        let all = self
            .event_handlers
            .iter()
            .map(|h| &h.selector)
            .chain(self.changing_handlers.iter().map(|h| &h.selector))
            .chain(self.spawning_handlers.iter().map(|h| &h.selector));
        for selector in all {
            if !selectors.contains(selector) {
                selectors.push(selector.clone());
            }
        }
        selectors
    }

    /// The handlers registered with this selector.
    pub fn handlers_for(&self, selector: &Selector) -> ResourceHandlers {
        ResourceHandlers {
            event: self
                .event_handlers
                .iter()
                .filter(|h| h.selector == *selector)
                .cloned()
                .collect(),
            changing: self
                .changing_handlers
                .iter()
                .filter(|h| h.selector == *selector)
                .cloned()
                .collect(),
            spawning: self
                .spawning_handlers
                .iter()
                .filter(|h| h.selector == *selector)
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_keeps_one_slot_per_type_shared_by_clones() {
        let memo = Memo::default();
        let clone = memo.clone();
        memo.with(|n: &mut u32| *n += 2);
        assert_eq!(clone.get::<u32>(), Some(2));
        assert_eq!(clone.insert(String::from("x")), None);
        assert_eq!(memo.get::<String>().as_deref(), Some("x"));
        assert_eq!(memo.get::<u64>(), None);
    }

    #[test]
    fn errors_convert_with_the_question_mark() {
        fn fails() -> HandlerResult {
            let _: u32 = "x".parse()?;
            Ok(())
        }
        assert!(matches!(fails(), Err(HandlerError::Failed(_))));
        assert_eq!(HandlerError::permanent("no").to_string(), "no (permanent)");
    }
}
