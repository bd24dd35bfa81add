//! Object actors: a user's own type, one instance per object, alive as long as the object is
//! served here, handling the object's lifecycle (create, update, delete, resume) and any message sent
//! to it, one at a time, with `&mut self` and no lock.
//!
//! **Expected flow**: the operator registers an [`ObjectActor`] type with a [`ActorOptions`] (its name,
//! which methods run as handlers, with which options) and a factory. Its supervisors tell the
//! type-erased [`ObjectHost`] of every object they see ([`ObjectHost::seen`]): the first time, a task
//! is spawned that makes the actor with the factory and then takes envelopes from the object's
//! bounded mailbox, in arrival order. A lifecycle method is a changing handler like any other (its
//! progress, retries, result and finalizer are Kopf's); its handler function puts a call in the
//! mailbox and waits for the answer. Messages ([`Actors::tell`], [`Actors::ask`],
//! [`ActorRef::schedule`]) go into the same mailbox. The supervisor says when the actor stops
//! ([`ObjectHost::gone`]): the object was deleted, the operator pauses, or it exits; the stop is
//! queued behind what came before it, then [`ObjectActor::stopped`] runs and the task ends.
//!
//! **Guarantees**
//! * One task per object owns the actor: lifecycle methods, messages and `stopped` never overlap.
//! * Envelopes are handled in the order they entered the mailbox. A full mailbox makes
//!   [`Actors::tell`], [`Actors::ask`] and lifecycle calls wait (backpressure) and
//!   [`Actors::try_tell`] fail with [`ActorError::Full`].
//! * A panic in a method is that call's error (a lifecycle method's [`HandlerError::Panicked`],
//!   an ask's [`ActorError::Panicked`]); the actor goes on with its state as the method left it.
//! * The actor survives its object's worker idling: it is not the worker's, it is the object's.
//! * A message to an object with no actor here is [`ActorError::NotFound`], never a silent drop.
//!
//! **Caveats**
//! * An actor asking itself ([`ActorRef::ask`] inside its own method) waits for its own mailbox: it
//!   times out. Use [`ActorRef::tell`] or [`ActorRef::schedule`] to send to oneself.
//! * A factory that panics, or an object that cannot be read as [`ObjectActor::Resource`], leaves
//!   the object without an actor (logged; lifecycle calls fail and are retried) until its next event.

use foldhash::{HashMap, HashMapExt};
use std::any::Any;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use kactor_reactor::causes::Reason;
use kactor_reactor::execution::panic_message;
use kactor_reactor::handlers::{handler_fn, Ctx, HandlerError, HandlerFn, On};
use kactor_reactor::observe::{MessageOutcome, Observer};
use kactor_reactor::stopping::StopReason;
use kube::api::DynamicObject;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::tracker::Tracker;

/// A user's actor of one object: its state is `self`, made by the factory given at registration
/// when the object is first seen, dropped when the object is gone, the operator pauses or exits.
///
/// Every method has a default but [`on_message`](Self::on_message). Which lifecycle methods run
/// is the [`ActorOptions`]'s choice (by default create and update; resume and delete on request), so
/// that an actor without a delete method puts no finalizer on its objects.
///
/// ```
/// use kactor_actors::objects::{ActorCtx, ActorRef, ObjectActor};
/// use kactor_reactor::handlers::HandlerError;
/// use kube::api::DynamicObject;
/// use serde_json::{json, Value};
///
/// struct Counter { updates: u64 }
///
/// enum Ask { Updates }
///
/// impl ObjectActor for Counter {
///     type Resource = DynamicObject;
///     type Message = Ask;
///     type Reply = u64;
///
///     async fn on_update(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
///         self.updates += 1;
///         tracing::info!("{} changed {} times", ctx.name(), self.updates);
///         Ok(json!({"updates": self.updates})) // lands in status.<the update method's id>
///     }
///
///     async fn on_message(&mut self, message: Ask, _me: &ActorRef<Self>) -> u64 {
///         match message {
///             Ask::Updates => self.updates,
///         }
///     }
/// }
/// ```
pub trait ObjectActor: Sized + Send + 'static {
    /// How the object is read for the factory and [`ActorCtx::object`]: a typed resource
    /// (`#[derive(CustomResource)]`, a `k8s-openapi` type) or `DynamicObject`.
    type Resource: DeserializeOwned + Send + Sync + 'static;
    /// What others may send the actor.
    type Message: Send + 'static;
    /// What [`on_message`](Self::on_message) answers (to [`Actors::ask`]; dropped for a tell).
    type Reply: Send + 'static;

    /// Called once, right after the factory made the actor, before anything else it handles.
    fn started(&mut self, me: &ActorRef<Self>) -> impl Future<Output = ()> + Send {
        let _ = me;
        async {}
    }

    /// The creation handler (Kopf's `on.create`): the object was never handled before. What it
    /// returns lands in `status.<id>` (`Value::Null`: nothing; `json!({..})`, or
    /// `serde_json::to_value(..)` of a type of one's own).
    fn on_create(
        &mut self,
        ctx: &ActorCtx<Self>,
    ) -> impl Future<Output = Result<Value, HandlerError>> + Send {
        let _ = ctx;
        async { Ok(Value::Null) }
    }

    /// The update handler (Kopf's `on.update`): the essence changed since it was last handled;
    /// `ctx.diff()`, `ctx.old()` and `ctx.new_value()` say how.
    fn on_update(
        &mut self,
        ctx: &ActorCtx<Self>,
    ) -> impl Future<Output = Result<Value, HandlerError>> + Send {
        let _ = ctx;
        async { Ok(Value::Null) }
    }

    /// The deletion handler (Kopf's `on.delete`), when the options have it: the object keeps the
    /// finalizer until it succeeds (unless the options made it optional).
    fn on_delete(
        &mut self,
        ctx: &ActorCtx<Self>,
    ) -> impl Future<Output = Result<Value, HandlerError>> + Send {
        let _ = ctx;
        async { Ok(Value::Null) }
    }

    /// The resume handler (Kopf's `on.resume`), when the options have it: once per process for an
    /// object handled before, found by the initial listing.
    fn on_resume(
        &mut self,
        ctx: &ActorCtx<Self>,
    ) -> impl Future<Output = Result<Value, HandlerError>> + Send {
        let _ = ctx;
        async { Ok(Value::Null) }
    }

    /// A message sent with [`Actors::tell`], [`Actors::ask`] or [`ActorRef::schedule`].
    fn on_message(
        &mut self,
        message: Self::Message,
        me: &ActorRef<Self>,
    ) -> impl Future<Output = Self::Reply> + Send;

    /// The last call: the object was deleted ([`StopReason::ResourceDeleted`]), the operator
    /// pauses ([`StopReason::OperatorPausing`]; a new actor is made after the resume) or exits
    /// ([`StopReason::OperatorExiting`]). What was queued before the stop was handled.
    fn stopped(
        &mut self,
        reason: StopReason,
        me: &ActorRef<Self>,
    ) -> impl Future<Output = ()> + Send {
        let _ = (reason, me);
        async {}
    }
}

/// A lifecycle method of an [`ObjectActor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// [`ObjectActor::on_create`].
    Create,
    /// [`ObjectActor::on_update`].
    Update,
    /// [`ObjectActor::on_delete`].
    Delete,
    /// [`ObjectActor::on_resume`].
    Resume,
}

impl Method {
    /// `create`, `update`, `delete`, `resume`: the last part of the method's default handler id.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Create => "create",
            Method::Update => "update",
            Method::Delete => "delete",
            Method::Resume => "resume",
        }
    }

    /// The reason the method's handler is registered for (None: a resume handler).
    pub fn reason(self) -> Option<Reason> {
        match self {
            Method::Create => Some(Reason::Create),
            Method::Update => Some(Reason::Update),
            Method::Delete => Some(Reason::Delete),
            Method::Resume => None,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an [`ObjectActor`] type is served: its name (in handler ids, logs and metrics), which
/// lifecycle methods run as handlers and with which options, its mailbox's capacity and the default
/// timeout of an ask.
///
/// By default `create` and `update` run, with the handler ids `<name>/create` and `<name>/update`
/// (their progress in `kopf.zalando.org/<name>.create`, their results in `status["<name>/create"]`).
/// An id of one's own takes over objects handled by a Kopf handler or a closure of that id.
///
/// ```
/// use kactor_actors::objects::{ActorOptions, Method};
/// use kactor_reactor::handlers::On;
/// use std::time::Duration;
///
/// let options = ActorOptions::new("cache")
///     .delete()                                              // cache/delete, with a finalizer
///     .on(Method::Create, On::id("create_fn").timeout(Duration::from_secs(60)))
///     .mailbox(64);
/// assert_eq!(options.id(Method::Create), Some("create_fn"));
/// assert_eq!(options.id(Method::Delete), Some("cache/delete"));
/// assert_eq!(options.id(Method::Resume), None);
/// ```
#[derive(Debug, Clone)]
pub struct ActorOptions {
    name: Arc<str>,
    methods: Vec<(Method, On)>,
    mailbox: usize,
    ask_timeout: Duration,
}

/// The default capacity of an actor's mailbox.
pub const DEFAULT_MAILBOX: usize = 256;

/// The default time an ask waits for room in the mailbox and for the reply.
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(30);

impl ActorOptions {
    /// The actors named `name`, with `create` and `update`.
    pub fn new(name: &str) -> Self {
        let options = ActorOptions {
            name: Arc::from(name),
            methods: Vec::new(),
            mailbox: DEFAULT_MAILBOX,
            ask_timeout: DEFAULT_ASK_TIMEOUT,
        };
        let create = options.default_on(Method::Create);
        let update = options.default_on(Method::Update);
        options
            .on(Method::Create, create)
            .on(Method::Update, update)
    }

    fn default_on(&self, method: Method) -> On {
        On::id(format!("{}/{method}", self.name))
    }

    /// Also runs [`ObjectActor::on_resume`] (id `<name>/resume`).
    pub fn resume(self) -> Self {
        let on = self.default_on(Method::Resume);
        self.on(Method::Resume, on)
    }

    /// Also runs [`ObjectActor::on_delete`] (id `<name>/delete`), holding Kopf's finalizer on every
    /// object so that it runs before the object goes (`.on(Method::Delete, On::id(..).optional())`
    /// for a best-effort one without the finalizer).
    pub fn delete(self) -> Self {
        let on = self.default_on(Method::Delete);
        self.on(Method::Delete, on)
    }

    /// Runs `method` with these options (its id, filters, timeout, retries, ...), in place of what
    /// was set for it.
    pub fn on(mut self, method: Method, on: impl Into<On>) -> Self {
        let on = on.into();
        match self.methods.iter_mut().find(|(m, _)| *m == method) {
            Some(slot) => slot.1 = on,
            None => self.methods.push((method, on)),
        }
        self
    }

    /// Does not run `method`.
    pub fn without(mut self, method: Method) -> Self {
        self.methods.retain(|(m, _)| *m != method);
        self
    }

    /// The capacity of each actor's mailbox (default 256, at least 1).
    pub fn mailbox(mut self, capacity: usize) -> Self {
        self.mailbox = capacity.max(1);
        self
    }

    /// How long [`Actors::ask`] waits, for room and for the reply together (default 30 s).
    pub fn ask_timeout(mut self, timeout: Duration) -> Self {
        self.ask_timeout = timeout;
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The handler id of `method`, if it runs.
    pub fn id(&self, method: Method) -> Option<&str> {
        self.methods
            .iter()
            .find(|(m, _)| *m == method)
            .map(|(_, on)| on.id.as_str())
    }

    /// The methods that run, with their options, in the order they were set.
    pub fn methods(&self) -> impl Iterator<Item = (Method, &On)> {
        self.methods.iter().map(|(m, on)| (*m, on))
    }
}

impl From<&str> for ActorOptions {
    fn from(name: &str) -> Self {
        ActorOptions::new(name)
    }
}

/// Which object: its namespace (None for a cluster-scoped one) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The namespace; None for a cluster-scoped object.
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A namespaced object.
    pub fn namespaced(namespace: &str, name: &str) -> Self {
        ObjectKey {
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        }
    }

    /// A cluster-scoped object.
    pub fn cluster(name: &str) -> Self {
        ObjectKey {
            namespace: None,
            name: name.to_string(),
        }
    }

    /// The key of `object`; None without a name.
    pub fn of(object: &DynamicObject) -> Option<Self> {
        Some(ObjectKey {
            namespace: object.metadata.namespace.clone(),
            name: object.metadata.name.clone()?,
        })
    }
}

impl From<(&str, &str)> for ObjectKey {
    /// `(namespace, name)`.
    fn from((namespace, name): (&str, &str)) -> Self {
        ObjectKey::namespaced(namespace, name)
    }
}

impl fmt::Display for ObjectKey {
    /// `namespace/name`, or `name` for a cluster-scoped object.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{namespace}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Why a message to an actor did not get through, or got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActorError {
    /// No actor of that object runs here.
    #[error(
        "no {actor} actor runs for {object}: the object does not exist, is not served by this \
         operator (its resource, its namespace, a pause), or is gone"
    )]
    NotFound {
        /// The actor's name.
        actor: Arc<str>,
        /// The object.
        object: ObjectKey,
    },
    /// The mailbox was full ([`Actors::try_tell`]).
    #[error("the mailbox of the {actor} actor of {object} is full ({capacity} waiting)")]
    Full {
        /// The actor's name.
        actor: Arc<str>,
        /// The object.
        object: ObjectKey,
        /// The mailbox's capacity.
        capacity: usize,
    },
    /// The actor stopped before it handled the message (the object went, the operator paused).
    #[error("the {actor} actor of {object} stopped before it handled the message")]
    Stopped {
        /// The actor's name.
        actor: Arc<str>,
        /// The object.
        object: ObjectKey,
    },
    /// No reply within the timeout; the message may still be handled later.
    #[error("the {actor} actor of {object} did not reply within {timeout:?}")]
    Timeout {
        /// The actor's name.
        actor: Arc<str>,
        /// The object.
        object: ObjectKey,
        /// The timeout.
        timeout: Duration,
    },
    /// The actor's `on_message` panicked on this message.
    #[error("the {actor} actor of {object} panicked on the message: {message}")]
    Panicked {
        /// The actor's name.
        actor: Arc<str>,
        /// The object.
        object: ObjectKey,
        /// The panic's message.
        message: String,
    },
}

/// One lifecycle call, waiting in a mailbox.
struct Call {
    method: Method,
    ctx: Ctx,
    reply: oneshot::Sender<Result<Value, HandlerError>>,
}

/// What a mailbox holds.
enum Envelope<A: ObjectActor> {
    Call(Box<Call>),
    Tell(A::Message),
    Ask(A::Message, oneshot::Sender<Result<A::Reply, String>>),
    Stop(StopReason),
}

/// Where actors run: given by the supervisor that serves their objects.
#[derive(Clone)]
pub struct ActorEnv {
    /// The runtime their tasks run on (the operator's, never the actors' thread).
    pub runtime: Handle,
    /// Their tasks, drained at exit.
    pub tracker: Arc<Tracker>,
    /// Told of actors, mailboxes and messages.
    pub observer: Arc<dyn Observer>,
}

/// An actor's entry in its type's table.
struct Entry<A: ObjectActor> {
    uid: Option<Box<str>>,
    mailbox: mpsc::Sender<Envelope<A>>,
}

type Factory<A> = dyn Fn(&<A as ObjectActor>::Resource) -> A + Send + Sync;

struct Shared<A: ObjectActor> {
    options: ActorOptions,
    factory: Box<Factory<A>>,
    table: Mutex<HashMap<Arc<ObjectKey>, Entry<A>>>,
    env: OnceLock<ActorEnv>,
}

/// The actors of one [`ObjectActor`] type: where messages are sent from (handlers of other
/// resources, daemons, the application's own code). Cheap to clone.
pub struct Actors<A: ObjectActor>(Arc<Shared<A>>);

impl<A: ObjectActor> Clone for Actors<A> {
    fn clone(&self) -> Self {
        Actors(self.0.clone())
    }
}

impl<A: ObjectActor> fmt::Debug for Actors<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Actors")
            .field("name", &self.0.options.name)
            .field("running", &self.len())
            .finish()
    }
}

/// A handle to one actor: send it messages, or schedule them. Cheap to clone; it does not keep the
/// actor alive (a stopped actor's handle answers [`ActorError::Stopped`]).
pub struct ActorRef<A: ObjectActor> {
    key: Arc<ObjectKey>,
    mailbox: mpsc::Sender<Envelope<A>>,
    shared: Arc<Shared<A>>,
}

impl<A: ObjectActor> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        ActorRef {
            key: self.key.clone(),
            mailbox: self.mailbox.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<A: ObjectActor> fmt::Debug for ActorRef<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActorRef({} of {})", self.shared.options.name, self.key)
    }
}

/// What a lifecycle method is given: the handler's [`Ctx`] (the object, its diff, the cycle's
/// patch, the logger, ...), through `Deref`, and the actor's own handle.
pub struct ActorCtx<A: ObjectActor> {
    ctx: Ctx,
    me: ActorRef<A>,
}

impl<A: ObjectActor> Deref for ActorCtx<A> {
    type Target = Ctx;

    fn deref(&self) -> &Ctx {
        &self.ctx
    }
}

impl<A: ObjectActor> ActorCtx<A> {
    /// The actor's own handle (to schedule messages to itself, or give to a task it spawns).
    pub fn me(&self) -> &ActorRef<A> {
        &self.me
    }

    /// The object as [`ObjectActor::Resource`]; an error (retried like any handler error) when the
    /// object does not read as one.
    pub fn object(&self) -> Result<A::Resource, HandlerError> {
        self.ctx.object::<A::Resource>().map_err(|e| {
            HandlerError::msg(format!(
                "{} cannot be read as {}: {e}",
                self.me.key,
                std::any::type_name::<A::Resource>()
            ))
        })
    }
}

impl<A: ObjectActor> Actors<A> {
    /// The actors made by `factory`, served as `options` say. The operator's builder calls this;
    /// the handle is the one `Operator::actors` gives back.
    pub fn new(
        options: ActorOptions,
        factory: impl Fn(&A::Resource) -> A + Send + Sync + 'static,
    ) -> Self {
        Actors(Arc::new(Shared {
            options,
            factory: Box::new(factory),
            table: Mutex::new(HashMap::new()),
            env: OnceLock::new(),
        }))
    }

    /// The actors' name.
    pub fn name(&self) -> &str {
        &self.0.options.name
    }

    /// The options they are served with.
    pub fn options(&self) -> &ActorOptions {
        &self.0.options
    }

    /// How many actors run now.
    pub fn len(&self) -> usize {
        self.0.table().len()
    }

    /// Whether no actor runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects that have an actor now.
    pub fn keys(&self) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self.0.table().keys().map(|k| (**k).clone()).collect();
        keys.sort();
        keys
    }

    /// The handle of `object`'s actor.
    pub fn get(&self, object: impl Into<ObjectKey>) -> Result<ActorRef<A>, ActorError> {
        let key = object.into();
        let found = self
            .0
            .table()
            .get_key_value(&key)
            .filter(|(_, entry)| !entry.mailbox.is_closed())
            .map(|(key, entry)| (key.clone(), entry.mailbox.clone()));
        match found {
            Some((key, mailbox)) => Ok(ActorRef {
                key,
                mailbox,
                shared: self.0.clone(),
            }),
            None => {
                self.0.observe(MessageOutcome::NotFound, Duration::ZERO);
                Err(ActorError::NotFound {
                    actor: self.0.options.name.clone(),
                    object: key,
                })
            }
        }
    }

    /// Sends `message` to `object`'s actor, waiting for room in its mailbox.
    pub async fn tell(
        &self,
        object: impl Into<ObjectKey>,
        message: A::Message,
    ) -> Result<(), ActorError> {
        self.get(object)?.tell(message).await
    }

    /// Sends `message` to `object`'s actor if its mailbox has room; [`ActorError::Full`] if not.
    pub fn try_tell(
        &self,
        object: impl Into<ObjectKey>,
        message: A::Message,
    ) -> Result<(), ActorError> {
        self.get(object)?.try_tell(message)
    }

    /// Sends `message` to `object`'s actor and waits for the reply, for the options' ask timeout.
    pub async fn ask(
        &self,
        object: impl Into<ObjectKey>,
        message: A::Message,
    ) -> Result<A::Reply, ActorError> {
        self.get(object)?.ask(message).await
    }

    /// [`ask`](Self::ask) with a timeout of its own.
    pub async fn ask_timeout(
        &self,
        object: impl Into<ObjectKey>,
        message: A::Message,
        timeout: Duration,
    ) -> Result<A::Reply, ActorError> {
        self.get(object)?.ask_timeout(message, timeout).await
    }

    /// The changing handlers of the lifecycle methods, for the registry: each puts a call in the
    /// object's mailbox and waits for the method's result.
    pub fn handlers(&self) -> Vec<(Option<Reason>, On, HandlerFn)> {
        self.0
            .options
            .methods()
            .map(|(method, on)| {
                let shared = self.0.clone();
                let func = handler_fn(move |ctx: Ctx| {
                    let shared = shared.clone();
                    async move { shared.call(method, ctx).await }
                });
                (method.reason(), on.clone(), func)
            })
            .collect()
    }
}

impl<A: ObjectActor> ActorRef<A> {
    /// The object.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    fn stopped(&self) -> ActorError {
        ActorError::Stopped {
            actor: self.shared.options.name.clone(),
            object: (*self.key).clone(),
        }
    }

    /// Sends a message, waiting for room in the mailbox.
    pub async fn tell(&self, message: A::Message) -> Result<(), ActorError> {
        self.shared.queued(1);
        self.mailbox
            .send(Envelope::Tell(message))
            .await
            .map_err(|_| {
                self.shared.queued(-1);
                self.stopped()
            })
    }

    /// Sends a message if the mailbox has room.
    pub fn try_tell(&self, message: A::Message) -> Result<(), ActorError> {
        self.shared.queued(1);
        self.mailbox
            .try_send(Envelope::Tell(message))
            .map_err(|error| {
                self.shared.queued(-1);
                match error {
                    mpsc::error::TrySendError::Full(_) => {
                        self.shared.observe(MessageOutcome::Full, Duration::ZERO);
                        ActorError::Full {
                            actor: self.shared.options.name.clone(),
                            object: (*self.key).clone(),
                            capacity: self.shared.options.mailbox,
                        }
                    }
                    mpsc::error::TrySendError::Closed(_) => self.stopped(),
                }
            })
    }

    /// Sends a message and waits for the reply, for the options' ask timeout.
    pub async fn ask(&self, message: A::Message) -> Result<A::Reply, ActorError> {
        self.ask_timeout(message, self.shared.options.ask_timeout)
            .await
    }

    /// Sends a message and waits for the reply, for `timeout` (room in the mailbox included).
    pub async fn ask_timeout(
        &self,
        message: A::Message,
        timeout: Duration,
    ) -> Result<A::Reply, ActorError> {
        let exchange = async {
            let (reply, answer) = oneshot::channel();
            self.shared.queued(1);
            if self
                .mailbox
                .send(Envelope::Ask(message, reply))
                .await
                .is_err()
            {
                self.shared.queued(-1);
                return Err(self.stopped());
            }
            match answer.await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(message)) => Err(ActorError::Panicked {
                    actor: self.shared.options.name.clone(),
                    object: (*self.key).clone(),
                    message,
                }),
                Err(_) => Err(self.stopped()),
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                self.shared.observe(MessageOutcome::Timeout, Duration::ZERO);
                Err(ActorError::Timeout {
                    actor: self.shared.options.name.clone(),
                    object: (*self.key).clone(),
                    timeout,
                })
            })
    }

    /// Sends `message` to this actor after `after`, unless it stopped by then (a scheduled message
    /// never reaches the actor made after a pause). The returned handle cancels it. Needs a tokio
    /// runtime (as inside any actor method).
    pub fn schedule(&self, after: Duration, message: A::Message) -> tokio::task::AbortHandle {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(after) => {
                    let _ = me.tell(message).await;
                }
                () = me.mailbox.closed() => {}
            }
        })
        .abort_handle()
    }
}

impl<A: ObjectActor> Shared<A> {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<ObjectKey>, Entry<A>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn env(&self) -> Option<ActorEnv> {
        self.env.get().cloned()
    }

    fn queued(&self, delta: i64) {
        if let Some(env) = self.env.get() {
            env.observer.mailboxes_changed(&self.options.name, delta);
        }
    }

    fn observe(&self, outcome: MessageOutcome, duration: Duration) {
        if let Some(env) = self.env.get() {
            env.observer
                .actor_message(&self.options.name, outcome, duration);
        }
    }

    /// The mailbox of `body`'s actor: the running one, or a new one made from `body` when it is of
    /// an earlier object of the same name, its factory failed, or (`anew`) there is none.
    fn ensure(self: &Arc<Self>, body: &Arc<DynamicObject>, anew: bool) -> Option<ActorRef<A>> {
        let key = ObjectKey::of(body)?;
        let env = self.env()?;
        let uid = body.metadata.uid.as_deref();
        let mut table = self.table();
        match table.get_key_value(&key) {
            Some((key, entry)) if entry.uid.as_deref() == uid && !entry.mailbox.is_closed() => {
                return Some(ActorRef {
                    key: key.clone(),
                    mailbox: entry.mailbox.clone(),
                    shared: self.clone(),
                });
            }
            None if !anew => return None,
            _ => {}
        }
        let key = Arc::new(key);
        let (mailbox, inbox) = mpsc::channel(self.options.mailbox);
        let me = ActorRef {
            key: key.clone(),
            mailbox: mailbox.clone(),
            shared: self.clone(),
        };
        if let Some(earlier) = table.insert(
            key,
            Entry {
                uid: uid.map(Box::from),
                mailbox,
            },
        ) {
            self.stop(&env, earlier.mailbox, StopReason::ResourceDeleted);
        }
        drop(table);
        env.tracker.spawn(
            &env.runtime,
            run(me.clone(), body.clone(), inbox, env.observer.clone()),
        );
        Some(me)
    }

    /// Queues the stop behind what the mailbox holds (waiting for room on the runtime if full).
    fn stop(&self, env: &ActorEnv, mailbox: mpsc::Sender<Envelope<A>>, reason: StopReason) {
        self.queued(1);
        match mailbox.try_send(Envelope::Stop(reason)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(stop)) => {
                env.runtime.spawn(async move {
                    let _ = mailbox.send(stop).await;
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.queued(-1),
        }
    }

    /// A lifecycle method's handler: the call through the mailbox, and its result.
    async fn call(self: Arc<Self>, method: Method, ctx: Ctx) -> Result<Value, HandlerError> {
        let body = ctx.body.clone();
        // Only the supervisor makes an actor for an object it has none for: a call that finds none
        // comes from a cycle that outlived its actor (a pause, an exit), and is tried again later.
        let Some(me) = self.ensure(&body, false) else {
            return Err(HandlerError::temporary(
                format!(
                    "the {} actor of {} is not running (the operator is pausing or exiting)",
                    self.options.name,
                    ObjectKey::of(&body).map_or_else(String::new, |key| key.to_string())
                ),
                Duration::from_secs(1),
            ));
        };
        let (reply, answer) = oneshot::channel();
        self.queued(1);
        let call = Call { method, ctx, reply };
        if me
            .mailbox
            .send(Envelope::Call(Box::new(call)))
            .await
            .is_err()
        {
            self.queued(-1);
            return Err(HandlerError::msg(format!(
                "the {} actor of {} stopped before {method} ran",
                self.options.name, me.key
            )));
        }
        answer.await.unwrap_or_else(|_| {
            Err(HandlerError::msg(format!(
                "the {} actor of {} stopped before {method} ended (see the log: its factory may \
                 have failed)",
                self.options.name, me.key
            )))
        })
    }
}

/// The object's task: makes the actor, then handles its mailbox until a stop.
async fn run<A: ObjectActor>(
    me: ActorRef<A>,
    body: Arc<DynamicObject>,
    mut inbox: mpsc::Receiver<Envelope<A>>,
    observer: Arc<dyn Observer>,
) {
    let shared = me.shared.clone();
    let name = shared.options.name.clone();
    let made = make(&shared, &body);
    // Not kept for the actor's life: the state machine of this task would hold the whole object.
    drop(body);
    let mut actor = match made {
        Ok(actor) => actor,
        Err(why) => {
            tracing::error!(actor = %name, object = %me.key, "the actor cannot be made: {why}");
            let error = format!("the {name} actor of {} cannot be made: {why}", me.key);
            inbox.close();
            while let Some(envelope) = inbox.recv().await {
                shared.queued(-1);
                match envelope {
                    Envelope::Call(call) => {
                        let _ = call.reply.send(Err(HandlerError::msg(error.clone())));
                    }
                    Envelope::Ask(_, reply) => {
                        let _ = reply.send(Err(error.clone()));
                    }
                    Envelope::Tell(_) | Envelope::Stop(_) => {}
                }
            }
            return;
        }
    };
    observer.actors_changed(&name, 1);
    if let Err(panic) = AssertUnwindSafe(actor.started(&me)).catch_unwind().await {
        let message = panic_message(&panic);
        tracing::error!(actor = %name, object = %me.key, "the actor's started() panicked: {message}");
    }
    let reason = loop {
        let Some(envelope) = inbox.recv().await else {
            // Cannot happen while this task holds its own handle (`me`); stop as at an exit if it
            // ever does.
            break StopReason::OperatorExiting;
        };
        shared.queued(-1);
        match envelope {
            Envelope::Call(call) => {
                // Boxed: the task's state machine would otherwise keep room for the largest
                // lifecycle future and its context, for the actor's whole life.
                Box::pin(answer(&mut actor, *call, &me)).await;
            }
            Envelope::Tell(message) => {
                let _ = handle(&mut actor, message, &me, &*observer).await;
            }
            Envelope::Ask(message, reply) => {
                let _ = reply.send(handle(&mut actor, message, &me, &*observer).await);
            }
            Envelope::Stop(reason) => break reason,
        }
    };
    // Nothing more is taken: what comes after the stop is answered as stopped (its senders see
    // their reply channel dropped).
    inbox.close();
    if let Err(panic) = AssertUnwindSafe(actor.stopped(reason, &me))
        .catch_unwind()
        .await
    {
        let message = panic_message(&panic);
        tracing::error!(actor = %name, object = %me.key, "the actor's stopped() panicked: {message}");
    }
    while inbox.try_recv().is_ok() {
        shared.queued(-1);
    }
    observer.actors_changed(&name, -1);
    tracing::debug!(actor = %name, object = %me.key, reason = reason.as_str(), "the actor stopped");
}

/// Handles one message: its reply, or the message of its panic (logged), timed and counted.
async fn handle<A: ObjectActor>(
    actor: &mut A,
    message: A::Message,
    me: &ActorRef<A>,
    observer: &dyn Observer,
) -> Result<A::Reply, String> {
    let started = Instant::now();
    let handled = AssertUnwindSafe(actor.on_message(message, me))
        .catch_unwind()
        .await
        .map_err(|panic| panic_message(&panic));
    let name = &me.shared.options.name;
    let outcome = match &handled {
        Ok(_) => MessageOutcome::Handled,
        Err(panic) => {
            tracing::error!(actor = %name, object = %me.key, "the actor panicked on a message: {panic}");
            MessageOutcome::Panicked
        }
    };
    observer.actor_message(name, outcome, started.elapsed());
    handled
}

/// Runs one lifecycle call and sends its result back; a panic is the call's error.
async fn answer<A: ObjectActor>(actor: &mut A, call: Call, me: &ActorRef<A>) {
    let Call { method, ctx, reply } = call;
    let ctx = ActorCtx {
        ctx,
        me: me.clone(),
    };
    let result = AssertUnwindSafe(lifecycle(actor, method, &ctx))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(HandlerError::Panicked(panic_message(&panic))));
    let _ = reply.send(result);
}

/// The actor, from the factory: the object read as the actor's resource, and a panic caught.
fn make<A: ObjectActor>(shared: &Shared<A>, body: &DynamicObject) -> Result<A, String> {
    let made = if let Some(resource) = (body as &dyn Any).downcast_ref::<A::Resource>() {
        std::panic::catch_unwind(AssertUnwindSafe(|| (shared.factory)(resource)))
    } else {
        let value = serde_json::to_value(body).map_err(|e| e.to_string())?;
        let resource: A::Resource = serde_json::from_value(value).map_err(|e| {
            format!(
                "the object cannot be read as {}: {e}",
                std::any::type_name::<A::Resource>()
            )
        })?;
        std::panic::catch_unwind(AssertUnwindSafe(|| (shared.factory)(&resource)))
    };
    made.map_err(|panic| format!("the factory panicked: {}", panic_message(&panic)))
}

/// Runs one lifecycle method; its result as a handler's.
async fn lifecycle<A: ObjectActor>(
    actor: &mut A,
    method: Method,
    ctx: &ActorCtx<A>,
) -> Result<Value, HandlerError> {
    match method {
        Method::Create => actor.on_create(ctx).await,
        Method::Update => actor.on_update(ctx).await,
        Method::Delete => actor.on_delete(ctx).await,
        Method::Resume => actor.on_resume(ctx).await,
    }
}

/// An [`Actors`] table as its supervisors see it, whatever the actor type.
pub trait ObjectHost: Send + Sync + 'static {
    /// The actors' name.
    fn name(&self) -> &str;

    /// Where actors run: the first supervisor to start binds it; later binds (the other
    /// supervisors of the same operator) change nothing.
    fn bind(&self, env: ActorEnv);

    /// The object was seen (listed, added, modified): it has an actor from now on.
    fn seen(&self, body: &Arc<DynamicObject>);

    /// The object of `uid` is no longer served here, for `reason`: its actor stops (an actor of a
    /// newer object of the same name is left alone).
    fn gone(&self, key: &ObjectKey, uid: Option<&str>, reason: StopReason);
}

impl<A: ObjectActor> ObjectHost for Actors<A> {
    fn name(&self) -> &str {
        &self.0.options.name
    }

    fn bind(&self, env: ActorEnv) {
        let _ = self.0.env.set(env);
    }

    fn seen(&self, body: &Arc<DynamicObject>) {
        self.0.ensure(body, true);
    }

    fn gone(&self, key: &ObjectKey, uid: Option<&str>, reason: StopReason) {
        let Some(env) = self.0.env() else {
            return;
        };
        let mut table = self.0.table();
        if table
            .get(key)
            .is_some_and(|entry| entry.uid.as_deref() == uid)
        {
            if let Some(entry) = table.remove(key) {
                drop(table);
                self.0.stop(&env, entry.mailbox, reason);
            }
        }
    }
}
