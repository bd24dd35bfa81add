//! Kubernetes Events about objects, as Kopf posts them (`reference/kopf.md` §1.17, §2.9): queued in
//! memory by a cheap [`EventPoster`] handle and posted by a background task, so that handlers never wait
//! for them and never fail because of them.
//!
//! The body is Kopf's, field for field, so `kubectl describe` shows the same lines for a Kopf operator
//! and for a kactor one: `generateName: kopf-event-`, `action: "Action?"`, `source.component`,
//! `reportingComponent`/`reportingInstance`, the involved object, and Python's ISO timestamps.
//!
//! Start with [`EventPoster::start`].

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kube::api::{DynamicObject, PostParams};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::clients::api;
use crate::structs::resources::Resource;

/// The longest message posted; longer ones keep their start and end around `...` (as in Kopf).
const MAX_MESSAGE_LENGTH: usize = 1024;
const CUT_MESSAGE_INFIX: &str = "...";

/// Who an event is about: the `involvedObject` of the event.
///
/// Empty fields are left out of the posted reference, as Kopf does for objects that lack them (a
/// cluster-scoped object has no namespace; an object not yet created has no uid).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// `group/version`, or `version` for the core group.
    pub api_version: String,
    /// The kind (`Widget`).
    pub kind: String,
    /// The object's name.
    pub name: Option<String>,
    /// The object's uid.
    pub uid: Option<String>,
    /// The object's namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
}

impl ObjectRef {
    /// The reference to `object`, served as `resource`.
    ///
    /// The object's own `apiVersion` and `kind` are used when it has them (as in Kopf, which takes
    /// them from the body), else the resource's: objects from lists often come without them.
    pub fn of(object: &DynamicObject, resource: &Resource) -> Self {
        let types = object.types.as_ref();
        let meta = &object.metadata;
        ObjectRef {
            api_version: types
                .map(|types| types.api_version.clone())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| resource.api_version()),
            kind: types
                .map(|types| types.kind.clone())
                .filter(|k| !k.is_empty())
                .unwrap_or_else(|| resource.kind.clone()),
            name: meta.name.clone().filter(|s| !s.is_empty()),
            uid: meta.uid.clone().filter(|s| !s.is_empty()),
            namespace: meta.namespace.clone().filter(|s| !s.is_empty()),
        }
    }

    /// Whether this is a core `v1` `Event`: events about events would breed without end.
    fn is_event(&self) -> bool {
        self.api_version == "v1" && self.kind == "Event"
    }

    /// The key that keeps one object's events in order: the uid (unique in time and space), else
    /// the identity fields (as in Kopf).
    fn key(&self) -> ObjectKey {
        match self.uid.as_deref() {
            Some(uid) if !uid.is_empty() => ObjectKey::Uid(uid.to_owned()),
            _ => ObjectKey::Identity {
                api_version: self.api_version.clone(),
                kind: self.kind.clone(),
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            },
        }
    }

    /// The `involvedObject` of an event posted into `namespace`: empty keys left out, the namespace
    /// always the event's own (for cluster-scoped objects too, as in Kopf).
    fn involved_object(&self, namespace: &str) -> Value {
        let mut reference = Map::new();
        let fields = [
            ("apiVersion", Some(self.api_version.as_str())),
            ("kind", Some(self.kind.as_str())),
            ("name", self.name.as_deref()),
            ("uid", self.uid.as_deref()),
        ];
        for (key, value) in fields {
            if let Some(value) = value.filter(|v| !v.is_empty()) {
                reference.insert(key.to_owned(), Value::from(value));
            }
        }
        reference.insert("namespace".to_owned(), Value::from(namespace));
        Value::Object(reference)
    }
}

impl fmt::Display for ObjectRef {
    /// `namespace/name`, or `name` for cluster-scoped objects (as in Kopf's log prefixes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name.as_deref().unwrap_or("");
        match self.namespace.as_deref() {
            Some(namespace) => write!(f, "{namespace}/{name}"),
            None => f.write_str(name),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ObjectKey {
    Uid(String),
    Identity {
        api_version: String,
        kind: String,
        namespace: Option<String>,
        name: Option<String>,
    },
}

pub use crate::structs::settings::{Level, PostingSettings};

/// Which of the poster's methods queued an event; each looks at the settings its own way (Kopf's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Event,
    Info,
    Warn,
    Exception,
    /// A log line of the object's (Kopf's `K8sPoster` logging handler), at its severity.
    Log(Level),
}

impl Call {
    fn admitted(self, settings: &PostingSettings) -> bool {
        match self {
            Call::Event => settings.enabled,
            Call::Info => settings.enabled && settings.level <= Level::Info,
            // Kopf's `warn` checks only the level; kept so that settings mean the same in both.
            Call::Warn => settings.level <= Level::Warning,
            Call::Exception => settings.enabled && settings.level <= Level::Error,
            Call::Log(level) => settings.enabled && settings.loggers && settings.level <= level,
        }
    }
}

/// A cheap, cloneable handle that queues Kubernetes Events about objects; posting never blocks and
/// never fails the caller.
///
/// **Expected flow**: [`EventPoster::start`] spawns the posting task; handlers call
/// [`info`](EventPoster::info), [`warn`](EventPoster::warn), [`exception`](EventPoster::exception)
/// or [`event`](EventPoster::event) on clones of the handle; the task posts each event to
/// `/api/v1/namespaces/<ns>/events`, retrying per [`PostingSettings::default_backoffs`]. When every
/// clone is dropped, the task posts what is queued and ends.
///
/// ```no_run
/// # async fn example(client: kube::Client, widget: kube::api::DynamicObject,
/// #                  resource: kactor_reactor::resources::Resource) {
/// use kactor_reactor::posting::{EventPoster, ObjectRef, PostingSettings};
///
/// let (poster, task) = EventPoster::start(client, PostingSettings::default());
/// poster.info(&ObjectRef::of(&widget, &resource), "Created", "The widget is ready.");
/// drop(poster);
/// task.await.ok(); // the queued event is posted by now
/// # }
/// ```
///
/// **Guarantees**:
/// * The methods return at once, from any thread, with or without a runtime, and never panic.
/// * One object's events are posted in the order they were queued; a retrying post of one object
///   does not hold back another object's events.
/// * A failed post is logged at warn (Kopf's `Failed to post an event. Ignoring and continuing.`) and
///   forgotten; the caller never sees it.
/// * Events about core `v1` `Event` objects are dropped silently, so serving events cannot breed
///   events without end.
///
/// **Assumptions**: the namespace of a cluster-scoped object's events is the client's default
/// namespace (the kubeconfig context's or the service account's), else `default`, as in Kopf.
///
/// **Caveats**:
/// * Events are kept in memory only: those still queued when the process dies are lost.
/// * Beyond [`PostingSettings::queue_capacity`] events waiting or in flight, new ones are dropped.
/// * As in Kopf, [`EventPoster::warn`] posts even when [`PostingSettings::enabled`] is false;
///   use [`EventPoster::disabled`] to post nothing at all.
#[derive(Debug, Clone)]
pub struct EventPoster {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    queue: mpsc::UnboundedSender<Queued>,
    backlog: Arc<Backlog>,
    settings: Arc<PostingSettings>,
}

/// An event waiting to be posted.
#[derive(Debug)]
struct Queued {
    object: ObjectRef,
    type_: String,
    reason: String,
    message: String,
}

impl EventPoster {
    /// Starts the task that posts queued events, on the current tokio runtime, and returns the
    /// handle and the task. The task ends when every clone of the handle is dropped, after posting
    /// what is queued (retries included).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn start(client: kube::Client, settings: PostingSettings) -> (EventPoster, JoinHandle<()>) {
        let settings = Arc::new(settings);
        let backlog = Arc::new(Backlog::new(settings.queue_capacity));
        let (queue, received) = mpsc::unbounded_channel();
        let poster = Poster::new(client, settings.clone(), backlog.clone());
        let task = tokio::spawn(poster.run(received));
        let inner = Inner {
            queue,
            backlog,
            settings,
        };
        let handle = EventPoster {
            inner: Some(Arc::new(inner)),
        };
        (handle, task)
    }

    /// A poster that posts nothing: for tests, and for operators that post no events.
    pub fn disabled() -> EventPoster {
        EventPoster { inner: None }
    }

    /// Queues an event of any type (Kopf's `kopf.event`): posted if [`PostingSettings::enabled`].
    pub fn event(&self, object: &ObjectRef, type_: &str, reason: &str, message: &str) {
        self.enqueue(Call::Event, object, type_, reason, message);
    }

    /// Queues a `Normal` event (Kopf's `kopf.info`): posted if enabled and the level is at most
    /// [`Level::Info`].
    pub fn info(&self, object: &ObjectRef, reason: &str, message: &str) {
        self.enqueue(Call::Info, object, "Normal", reason, message);
    }

    /// Queues a `Warning` event (Kopf's `kopf.warn`): posted if the level is at most
    /// [`Level::Warning`], enabled or not, as in Kopf.
    pub fn warn(&self, object: &ObjectRef, reason: &str, message: &str) {
        self.enqueue(Call::Warn, object, "Warning", reason, message);
    }

    /// Queues an `Error` event (Kopf's `kopf.exception`; Kubernetes shows the type as it is): posted
    /// if enabled and the level is at most [`Level::Error`]. An empty reason becomes `Error`; to
    /// describe an error value the way Kopf describes an exception, use
    /// [`EventPoster::exception_from`].
    pub fn exception(&self, object: &ObjectRef, reason: &str, message: &str) {
        let reason = if reason.is_empty() { "Error" } else { reason };
        self.enqueue(Call::Exception, object, "Error", reason, message);
    }

    /// Queues an `Error` event about `error`, as Kopf's `kopf.exception(obj, exc=…)`: an empty
    /// reason becomes the error's type name (`ValidationError`), and the message is
    /// `"<message> <error>"`, or `"<error>"` when the message is empty.
    pub fn exception_from<E>(&self, object: &ObjectRef, reason: &str, message: &str, error: &E)
    where
        E: std::error::Error + ?Sized,
    {
        let reason = if reason.is_empty() {
            short_type_name::<E>()
        } else {
            reason
        };
        let message = if message.is_empty() {
            error.to_string()
        } else {
            format!("{message} {error}")
        };
        self.enqueue(Call::Exception, object, "Error", reason, &message);
    }

    /// Whether a log line at `level` would be posted as an Event (`posting.loggers` and its
    /// level), so that a caller need not form the object's reference for nothing.
    pub fn posts_logs(&self, level: Level) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|inner| Call::Log(level).admitted(&inner.settings))
    }

    /// Queues a log line of the object's as an event (Kopf's `K8sPoster`): reason `Logging`, the
    /// type by severity (`Debug`, `Normal`, `Warning`, `Error`, `Fatal`); posted if enabled,
    /// [`PostingSettings::loggers`] is on and the level is at least [`PostingSettings::level`].
    pub fn log(&self, object: &ObjectRef, level: Level, message: &str) {
        let type_ = match level {
            Level::Debug => "Debug",
            Level::Info => "Normal",
            Level::Warning => "Warning",
            Level::Error => "Error",
            Level::Critical => "Fatal",
        };
        self.enqueue(Call::Log(level), object, type_, "Logging", message);
    }

    fn enqueue(&self, call: Call, object: &ObjectRef, type_: &str, reason: &str, message: &str) {
        let Some(inner) = &self.inner else {
            return;
        };
        if !call.admitted(&inner.settings) || object.is_event() {
            return;
        }
        if !inner.backlog.reserve() {
            return;
        }
        let queued = Queued {
            object: object.clone(),
            type_: type_.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        if inner.queue.send(queued).is_err() {
            // The posting task is gone (aborted, or its runtime shut down): nothing can post it.
            inner.backlog.release();
            tracing::debug!(object = %object, reason, "The event poster has stopped; the event is dropped.");
        }
    }
}

/// Counts the events waiting or in flight, to keep them under the queue's capacity.
#[derive(Debug)]
struct Backlog {
    pending: AtomicUsize,
    /// Events dropped in the current burst of overflow; 0 when there is none.
    dropped: AtomicUsize,
    capacity: usize,
}

impl Backlog {
    fn new(capacity: usize) -> Self {
        Backlog {
            pending: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            capacity,
        }
    }

    /// Takes a place for one more event; false (and a warning at the start of a burst) when full.
    fn reserve(&self) -> bool {
        let reserved = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |pending| {
                (pending < self.capacity).then_some(pending + 1)
            })
            .is_ok();
        let capacity = self.capacity;
        if reserved {
            let dropped = self.dropped.swap(0, Ordering::AcqRel);
            if dropped > 0 {
                tracing::warn!(dropped, capacity, "The K8s-event queue has room again; {dropped} events were dropped while it was full.");
            }
        } else if self.dropped.fetch_add(1, Ordering::AcqRel) == 0 {
            tracing::warn!(capacity, "The K8s-event queue is full ({capacity} events); new events are dropped until it drains.");
        }
        reserved
    }

    /// Frees the place of an event that was posted, failed, or could not be queued.
    fn release(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The posting task's state: which objects have a post in flight, and what waits behind each.
///
/// An object is either idle (not in `waiting`), or has exactly one post in flight and its later
/// events queued behind it (in `waiting`). So each object's events go out in order, and different
/// objects' events go out concurrently.
struct Poster {
    client: kube::Client,
    settings: Arc<PostingSettings>,
    backlog: Arc<Backlog>,
    limit: Option<Arc<Semaphore>>,
    waiting: HashMap<ObjectKey, VecDeque<Queued>>,
    in_flight: JoinSet<()>,
    keys: HashMap<tokio::task::Id, ObjectKey>,
}

impl Poster {
    fn new(client: kube::Client, settings: Arc<PostingSettings>, backlog: Arc<Backlog>) -> Self {
        let limit = settings
            .worker_limit
            .map(|limit| Arc::new(Semaphore::new(limit.max(1))));
        Poster {
            client,
            settings,
            backlog,
            limit,
            waiting: HashMap::new(),
            in_flight: JoinSet::new(),
            keys: HashMap::new(),
        }
    }

    /// Routes events until every handle is dropped, then finishes what is queued.
    async fn run(mut self, mut received: mpsc::UnboundedReceiver<Queued>) {
        let mut open = true;
        loop {
            tokio::select! {
                event = received.recv(), if open => match event {
                    Some(event) => self.route(event),
                    None => open = false,
                },
                Some(finished) = self.in_flight.join_next_with_id() => {
                    let id = match finished {
                        Ok((id, ())) => id,
                        Err(error) => {
                            tracing::error!(%error, "Posting an event has failed unexpectedly.");
                            error.id()
                        }
                    };
                    self.finished(id);
                },
                else => break,
            }
        }
    }

    fn route(&mut self, event: Queued) {
        let key = event.object.key();
        match self.waiting.get_mut(&key) {
            Some(behind) => behind.push_back(event),
            None => {
                self.waiting.insert(key.clone(), VecDeque::new());
                self.spawn(key, event);
            }
        }
    }

    fn finished(&mut self, id: tokio::task::Id) {
        self.backlog.release();
        let Some(key) = self.keys.remove(&id) else {
            return;
        };
        match self.waiting.get_mut(&key).and_then(VecDeque::pop_front) {
            Some(next) => self.spawn(key, next),
            None => {
                self.waiting.remove(&key);
            }
        }
    }

    fn spawn(&mut self, key: ObjectKey, event: Queued) {
        let client = self.client.clone();
        let settings = self.settings.clone();
        let limit = self.limit.clone();
        let handle = self.in_flight.spawn(async move {
            // The semaphore is never closed, so a permit always comes.
            let _permit = match limit {
                Some(limit) => limit.acquire_owned().await.ok(),
                None => None,
            };
            post_event(&client, &settings, &event).await;
        });
        self.keys.insert(handle.id(), key);
    }
}

/// Posts one event, with retries; failures are logged and ignored (as in Kopf).
async fn post_event(client: &kube::Client, settings: &PostingSettings, event: &Queued) {
    let namespace = match event.object.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => namespace,
        _ => match client.default_namespace() {
            "" => "default",
            namespace => namespace,
        },
    };
    let message = shorten(&event.message);
    let now = isoformat(jiff::Timestamp::now());
    let body = event_body(settings, event, namespace, &message, &now);
    let path = format!("/api/v1/namespaces/{namespace}/events");
    let what = format!("POST {path}");
    let bytes = body.to_string().into_bytes();
    let posted = api::retrying(&settings.default_backoffs, &what, || {
        let request =
            kube::core::Request::new(path.as_str()).create(&PostParams::default(), bytes.clone());
        async move {
            let request = request.map_err(kube::Error::BuildRequest)?;
            client.request::<Value>(request).await
        }
    })
    .await;
    let Err(error) = posted else {
        return;
    };
    let (type_, reason) = (event.type_.as_str(), event.reason.as_str());
    match &error {
        kube::Error::Api(status) => tracing::warn!(
            object = %event.object,
            code = status.code,
            "Failed to post an event. Ignoring and continuing. Code: {}. Message: {}. Details: {:?}. \
             Event: type={type_:?}, reason={reason:?}, message={message:?}.",
            status.code,
            status.message,
            status.details,
        ),
        _ => tracing::warn!(
            object = %event.object,
            %error,
            "Failed to post an event. Ignoring and continuing. Error: {error}. \
             Event: type={type_:?}, reason={reason:?}, message={message:?}."
        ),
    }
}

/// Kopf's event body (§2.9).
fn event_body(
    settings: &PostingSettings,
    event: &Queued,
    namespace: &str,
    message: &str,
    now: &str,
) -> Value {
    json!({
        "metadata": {
            "namespace": namespace,
            "generateName": settings.event_name_prefix,
        },
        "action": "Action?",
        "type": event.type_,
        "reason": event.reason,
        "message": message,
        "reportingComponent": settings.reporting_component,
        "reportingInstance": settings.reporting_instance,
        "source": {"component": settings.reporting_component},
        "involvedObject": event.object.involved_object(namespace),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "eventTime": now,
    })
}

/// Cuts a message longer than 1024 characters to its first 511 and last 510 around `...`, exactly as
/// Kopf does (counting characters, not bytes).
fn shorten(message: &str) -> Cow<'_, str> {
    let length = message.chars().count();
    if length <= MAX_MESSAGE_LENGTH {
        return Cow::Borrowed(message);
    }
    let infix = CUT_MESSAGE_INFIX.chars().count();
    let prefix = MAX_MESSAGE_LENGTH / 2 - infix / 2;
    let suffix = MAX_MESSAGE_LENGTH / 2 - (infix - infix / 2);
    let byte_at = |chars: usize| {
        message
            .char_indices()
            .nth(chars)
            .map_or(message.len(), |(at, _)| at)
    };
    let (head, tail) = (byte_at(prefix), byte_at(length - suffix));
    Cow::Owned(format!(
        "{}{CUT_MESSAGE_INFIX}{}",
        &message[..head],
        &message[tail..]
    ))
}

/// Python's `datetime.now(UTC).isoformat()`: microseconds (left out when zero) and `+00:00`.
fn isoformat(now: jiff::Timestamp) -> String {
    let seconds = now.strftime("%Y-%m-%dT%H:%M:%S");
    match now.subsec_microsecond() {
        0 => format!("{seconds}+00:00"),
        micros => format!("{seconds}.{micros:06}+00:00"),
    }
}

/// The last path segment of a type's name: `ValidationError` for `my_crate::ValidationError`,
/// `Error` for `dyn std::error::Error + Send`.
fn short_type_name<E: ?Sized>() -> &'static str {
    let name = std::any::type_name::<E>();
    let name = name.strip_prefix("dyn ").unwrap_or(name);
    let path = name.split(['<', ' ']).next().unwrap_or(name);
    path.rsplit("::").next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use kube::api::{ObjectMeta, TypeMeta};

    use super::*;

    fn widgets() -> Resource {
        Resource::namespaced("example.com", "v1", "Widget", "widgets")
    }

    fn widget_ref() -> ObjectRef {
        ObjectRef {
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            name: Some("w1".into()),
            uid: Some("uid-1".into()),
            namespace: Some("ns1".into()),
        }
    }

    fn queued(object: ObjectRef) -> Queued {
        Queued {
            object,
            type_: "Normal".into(),
            reason: "Created".into(),
            message: "It is done.".into(),
        }
    }

    #[test]
    fn builds_kopfs_event_body() {
        let body = event_body(
            &PostingSettings::default(),
            &queued(widget_ref()),
            "ns1",
            "It is done.",
            "2024-05-01T12:00:00.123456+00:00",
        );
        let expected = json!({
            "metadata": {"namespace": "ns1", "generateName": "kopf-event-"},
            "action": "Action?",
            "type": "Normal",
            "reason": "Created",
            "message": "It is done.",
            "reportingComponent": "kopf",
            "reportingInstance": "dev",
            "source": {"component": "kopf"},
            "involvedObject": {
                "apiVersion": "example.com/v1", "kind": "Widget", "name": "w1", "uid": "uid-1",
                "namespace": "ns1",
            },
            "firstTimestamp": "2024-05-01T12:00:00.123456+00:00",
            "lastTimestamp": "2024-05-01T12:00:00.123456+00:00",
            "eventTime": "2024-05-01T12:00:00.123456+00:00",
        });
        assert_eq!(body, expected);
    }

    #[test]
    fn leaves_empty_keys_out_of_the_involved_object_and_sets_the_events_namespace() {
        let object = ObjectRef {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: Some("node-1".into()),
            uid: None,
            namespace: None,
        };
        assert_eq!(
            object.involved_object("default"),
            json!({"apiVersion": "v1", "kind": "Node", "name": "node-1", "namespace": "default"})
        );
    }

    #[test]
    fn shortens_long_messages_to_1024_characters_as_kopf_does() {
        let message = format!("{}{}", "a".repeat(600), "b".repeat(600));
        let short = shorten(&message);
        assert_eq!(short.chars().count(), 1024);
        assert_eq!(short, format!("{}...{}", "a".repeat(511), "b".repeat(510)));
    }

    #[test]
    fn shortens_by_characters_not_bytes() {
        let message = "é".repeat(2000);
        let short = shorten(&message);
        assert_eq!(short, format!("{}...{}", "é".repeat(511), "é".repeat(510)));
    }

    #[test]
    fn leaves_messages_of_1024_characters_as_they_are() {
        let message = "x".repeat(1024);
        assert!(matches!(shorten(&message), Cow::Borrowed(m) if m == message));
    }

    #[test]
    fn formats_timestamps_as_pythons_isoformat() {
        let with_micros: jiff::Timestamp = "2024-05-01T12:00:00.1234567Z".parse().unwrap();
        assert_eq!(isoformat(with_micros), "2024-05-01T12:00:00.123456+00:00");
        let whole: jiff::Timestamp = "2024-05-01T12:00:00.0000009Z".parse().unwrap();
        assert_eq!(isoformat(whole), "2024-05-01T12:00:00+00:00");
    }

    #[test]
    fn refers_to_an_object_by_its_own_types_else_by_the_resources() {
        let mut object = DynamicObject {
            types: Some(TypeMeta {
                api_version: "example.com/v2".into(),
                kind: "Gadget".into(),
            }),
            metadata: ObjectMeta {
                name: Some("w1".into()),
                namespace: Some("ns1".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            data: Value::Null,
        };
        let own = ObjectRef::of(&object, &widgets());
        assert_eq!(
            (own.api_version.as_str(), own.kind.as_str()),
            ("example.com/v2", "Gadget")
        );
        object.types = None;
        assert_eq!(ObjectRef::of(&object, &widgets()), widget_ref());
    }

    #[test]
    fn keys_events_by_uid_else_by_identity() {
        assert_eq!(widget_ref().key(), ObjectKey::Uid("uid-1".into()));
        let nameless = ObjectRef {
            uid: None,
            ..widget_ref()
        };
        assert!(matches!(nameless.key(), ObjectKey::Identity { name: Some(n), .. } if n == "w1"));
    }

    #[test]
    fn admits_events_per_kopfs_checks_of_enabled_and_level() {
        let at = |enabled, level| PostingSettings {
            enabled,
            level,
            ..Default::default()
        };
        let defaults = PostingSettings::default();
        for call in [Call::Event, Call::Info, Call::Warn, Call::Exception] {
            assert!(call.admitted(&defaults), "{call:?} by default");
        }
        let disabled = at(false, Level::Info);
        assert!(!Call::Event.admitted(&disabled));
        assert!(!Call::Info.admitted(&disabled));
        assert!(!Call::Exception.admitted(&disabled));
        assert!(
            Call::Warn.admitted(&disabled),
            "Kopf's warn ignores `enabled`"
        );
        let errors_only = at(true, Level::Error);
        assert!(!Call::Info.admitted(&errors_only));
        assert!(!Call::Warn.admitted(&errors_only));
        assert!(Call::Exception.admitted(&errors_only));
        assert!(Call::Event.admitted(&at(true, Level::Critical)));
        assert!(!Call::Exception.admitted(&at(true, Level::Critical)));
    }

    #[test]
    fn admits_log_lines_only_with_loggers_on_from_the_level_up() {
        let defaults = PostingSettings::default();
        for level in [Level::Debug, Level::Info, Level::Error, Level::Critical] {
            assert!(
                !Call::Log(level).admitted(&defaults),
                "Kopf 1.44 posts no log lines by default ({level:?})"
            );
        }
        let loggers = PostingSettings {
            loggers: true,
            ..Default::default()
        };
        assert!(!Call::Log(Level::Debug).admitted(&loggers));
        assert!(Call::Log(Level::Info).admitted(&loggers));
        assert!(Call::Log(Level::Critical).admitted(&loggers));
        let warnings = PostingSettings {
            level: Level::Warning,
            ..loggers.clone()
        };
        assert!(!Call::Log(Level::Info).admitted(&warnings));
        assert!(Call::Log(Level::Warning).admitted(&warnings));
        let disabled = PostingSettings {
            enabled: false,
            ..loggers
        };
        assert!(!Call::Log(Level::Error).admitted(&disabled));
    }

    #[test]
    fn never_skips_events_about_events_only_for_other_kinds() {
        let event = ObjectRef {
            api_version: "v1".into(),
            kind: "Event".into(),
            ..widget_ref()
        };
        assert!(event.is_event());
        let new_events = ObjectRef {
            api_version: "events.k8s.io/v1".into(),
            ..event.clone()
        };
        assert!(!new_events.is_event());
        assert!(!widget_ref().is_event());
    }

    #[test]
    fn drops_events_beyond_the_capacity_until_there_is_room() {
        let backlog = Backlog::new(2);
        assert!(backlog.reserve());
        assert!(backlog.reserve());
        assert!(!backlog.reserve());
        assert!(!backlog.reserve());
        assert_eq!(backlog.dropped.load(Ordering::Acquire), 2);
        backlog.release();
        assert!(backlog.reserve());
        assert_eq!(
            backlog.dropped.load(Ordering::Acquire),
            0,
            "the burst is over"
        );
    }

    #[test]
    fn disabled_poster_accepts_events_and_posts_nothing() {
        let poster = EventPoster::disabled();
        poster.info(&widget_ref(), "Created", "nothing happens");
        poster.exception(&widget_ref(), "", "nothing happens");
    }

    #[test]
    fn names_errors_by_their_types_last_segment() {
        #[derive(Debug)]
        struct ValidationError;
        impl fmt::Display for ValidationError {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("invalid")
            }
        }
        impl std::error::Error for ValidationError {}
        assert_eq!(short_type_name::<ValidationError>(), "ValidationError");
        assert_eq!(short_type_name::<std::io::Error>(), "Error");
        assert_eq!(
            short_type_name::<dyn std::error::Error + Send + Sync>(),
            "Error"
        );
    }
}
