//! What handlers are given ([`Ctx`], [`ActivityCtx`]) and what they return ([`HandlerError`]):
//! the handler's side of the contract, apart from how handlers are registered
//! ([`crate::intents::handlers`]), so that filters, execution and daemons can speak of a context without
//! depending on the registry.
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

use crate::clients::cache::{Cache, CacheError, Caches};
use crate::clients::patches::Patch;
use crate::clients::posting::{EventPoster, Level, ObjectRef};
use crate::intents::indexes::{Index, Indexes, NoIndex};
use crate::structs::causes::{ChangingCause, Reason};
use crate::structs::diffs::Diff;
use crate::structs::names::EventType;
use crate::structs::resources::Resource;
use crate::structs::resources::Selector;
use crate::structs::stopping::{Live, Stopped};
use crate::structs::triggers::Triggers;

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
    /// The handler's sub-handlers are not all finished ([`Ctx::execute`]): it is invoked again
    /// after `delay`, when the earliest is due (Kopf's `HandlerChildrenRetry`). Not a failure: it
    /// is neither logged as an error nor posted.
    ChildrenRetry {
        /// Until the earliest unfinished sub-handler is due.
        delay: Duration,
    },
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
            HandlerError::ChildrenRetry { delay } => {
                write!(f, "sub-handlers are unfinished (retry in {delay:?})")
            }
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

    /// Whether nothing was ever put in it and nobody else holds it.
    pub fn is_unused(&self) -> bool {
        Arc::strong_count(&self.0) == 1
            && self.0.lock().unwrap_or_else(|p| p.into_inner()).is_none()
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
    caches: Option<Caches>,
    triggers: Option<Arc<Triggers>>,
    indexes: Option<Indexes>,
    /// Set by the object's worker when a newer event shows the object no longer this replica's, or
    /// being handed over (sharding): handlers not started yet are not started.
    departing: Option<Arc<crate::structs::sharding::Leaving>>,
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

impl Attempt {
    /// An attempt of a handler that keeps no progress (event and reconcile handlers): `retry`
    /// attempts came before it, and no field is reduced.
    pub fn plain(id: &str, param: Option<Arc<Value>>, retry: u32) -> Self {
        Attempt {
            id: id.into(),
            param,
            retry,
            started: None,
            runtime: Duration::ZERO,
            old: None,
            new: None,
            diff: None,
            reduced: false,
        }
    }
}

/// Where a context's Kubernetes Events go. The reference to the object is formed on the first
/// Event, not for every cycle (most post none).
struct EventSink {
    poster: EventPoster,
    body: Arc<DynamicObject>,
    resource: Arc<Resource>,
    object: std::sync::OnceLock<ObjectRef>,
}

impl EventSink {
    fn object(&self) -> &ObjectRef {
        self.object
            .get_or_init(|| ObjectRef::of(&self.body, &self.resource))
    }
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
            caches: None,
            triggers: None,
            indexes: None,
            departing: None,
        }
    }

    /// The same context, told by `flag` when the object leaves this replica (sharding).
    pub fn with_departing(mut self, flag: Option<Arc<crate::structs::sharding::Leaving>>) -> Self {
        self.departing = flag;
        self
    }

    /// Whether a newer event than this context's shows the object leaving this replica (sharding):
    /// the cycle starts no more handlers.
    pub(crate) fn is_departing(&self) -> bool {
        self.departing.as_ref().is_some_and(|flag| flag.is_set())
    }

    /// What says whether the object leaves this replica, when sharded.
    pub(crate) fn departing(&self) -> Option<&crate::structs::sharding::Leaving> {
        self.departing.as_deref()
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
        self.events = Some(Arc::new(EventSink {
            poster,
            body: self.body.clone(),
            resource: self.resource.clone(),
            object: std::sync::OnceLock::new(),
        }));
        self
    }

    /// The same context, reading the operator's shared caches.
    pub fn with_caches(mut self, caches: Caches) -> Self {
        self.caches = Some(caches);
        self
    }

    /// The same context, reading the operator's indexes.
    pub fn with_indexes(mut self, indexes: Indexes) -> Self {
        self.indexes = Some(indexes);
        self
    }

    /// The index an index handler of this id keeps (Kopf's index kwargs), as it is now: resource
    /// handlers run only once every index is populated.
    pub fn index(&self, id: &str) -> Result<Index, NoIndex> {
        self.indexes
            .as_ref()
            .and_then(|indexes| indexes.get(id))
            .ok_or_else(|| NoIndex(id.to_string()))
    }

    /// The same context, for a reconcile run with these triggers.
    pub fn with_triggers(mut self, triggers: Arc<Triggers>) -> Self {
        self.triggers = Some(triggers);
        self
    }

    /// The shared cache of a resource that a reconcile handler owns, watches or reads (or
    /// reconciles): read without a request to the API server, and never older than the event that
    /// triggered this run (`kactor_reactor::cache`).
    pub fn cache(&self, resource: impl Into<Selector>) -> Result<Cache, CacheError> {
        let selector = resource.into();
        match &self.caches {
            Some(caches) => caches.get(&selector),
            None => Err(CacheError::NotCached(selector.name)),
        }
    }

    /// For reconcile handlers: what triggered this run besides the object's own change (related
    /// objects that changed, a requeue); empty for other handlers.
    pub fn triggers(&self) -> &Triggers {
        static NONE: std::sync::OnceLock<Triggers> = std::sync::OnceLock::new();
        self.triggers
            .as_deref()
            .unwrap_or_else(|| NONE.get_or_init(Triggers::default))
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

    /// This handler's object as the owner of others ([`crate::hierarchies`]).
    pub fn owner(&self) -> Result<crate::hierarchies::Owner, crate::hierarchies::HierarchyError> {
        crate::hierarchies::Owner::of(&self.body)
    }

    /// Kopf's `kopf.adopt(child)`: the child (typed or JSON) owned by this handler's object (so that
    /// the garbage collector deletes it with it), named after it (`generateName: <name>-`), in its
    /// namespace, with its labels; what the child has of its own is kept. `adopt_with` takes Kopf's
    /// `forced`, `strict` and `nested`.
    ///
    /// ```
    /// # use kactor_reactor::handlers::{Ctx, HandlerError};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    ///
    /// fn child(ctx: &Ctx) -> Result<ConfigMap, HandlerError> {
    ///     let mut configmap = ConfigMap::default();
    ///     ctx.adopt(&mut configmap)?;               // then create it with ctx.client()
    ///     Ok(configmap)
    /// }
    /// ```
    pub fn adopt<T>(&self, child: &mut T) -> Result<(), crate::hierarchies::HierarchyError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + 'static,
    {
        self.adopt_with(child, &crate::hierarchies::Adoption::default())
    }

    /// [`adopt`](Self::adopt) with Kopf's options: `Adoption::default().forced().strict()
    /// .nested("spec.template")`.
    pub fn adopt_with<T>(
        &self,
        child: &mut T,
        adoption: &crate::hierarchies::Adoption,
    ) -> Result<(), crate::hierarchies::HierarchyError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + 'static,
    {
        crate::hierarchies::adopt(child, &self.owner()?, adoption)
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
        Logger {
            id: self.id(),
            events: self.events.as_deref(),
        }
    }

    /// Posts a `Normal` Kubernetes Event about the object (never fails the handler).
    pub fn info(&self, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster.info(sink.object(), reason, message);
        }
    }

    /// Posts a `Warning` Kubernetes Event about the object (never fails the handler).
    pub fn warn(&self, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster.warn(sink.object(), reason, message);
        }
    }

    /// Posts an `Error` Kubernetes Event about the object (never fails the handler).
    pub fn exception(&self, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster.exception(sink.object(), reason, message);
        }
    }

    /// Posts a Kubernetes Event of any type about the object (never fails the handler).
    pub fn event(&self, event_type: &str, reason: &str, message: &str) {
        if let Some(sink) = &self.events {
            sink.poster
                .event(sink.object(), event_type, reason, message);
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
    events: Option<&'a EventSink>,
}

impl Logger<'_> {
    /// Logs at debug level.
    pub fn debug(&self, message: impl fmt::Display) {
        let message = message.to_string();
        tracing::debug!(handler = self.id, "{message}");
        self.post(Level::Debug, &message);
    }

    /// Logs at info level.
    pub fn info(&self, message: impl fmt::Display) {
        let message = message.to_string();
        tracing::info!(handler = self.id, "{message}");
        self.post(Level::Info, &message);
    }

    /// Logs at warn level.
    pub fn warn(&self, message: impl fmt::Display) {
        let message = message.to_string();
        tracing::warn!(handler = self.id, "{message}");
        self.post(Level::Warning, &message);
    }

    /// Logs at error level.
    pub fn error(&self, message: impl fmt::Display) {
        let message = message.to_string();
        tracing::error!(handler = self.id, "{message}");
        self.post(Level::Error, &message);
    }

    /// Posts the line as an Event about the object when `posting.loggers` is on (Kopf's
    /// `K8sPoster`); the poster checks the settings.
    fn post(&self, level: Level, message: &str) {
        if let Some(sink) = self.events.filter(|sink| sink.poster.posts_logs(level)) {
            sink.poster.log(sink.object(), level, message);
        }
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

#[cfg(test)]
mod tests {
    use super::Memo;

    #[test]
    fn a_memo_is_unused_until_a_value_is_put_in_it_and_while_nobody_else_holds_it() {
        let memo = Memo::default();
        assert!(memo.is_unused());
        let held = memo.clone();
        assert!(!memo.is_unused(), "a handler may still put a value in it");
        drop(held);
        assert!(memo.is_unused());
        memo.insert(7_u32);
        assert!(!memo.is_unused());
    }
}
