//! Handlers: what users register, what they are given ([`Ctx`], [`ActivityCtx`]), what they return.
//!
//! This issue's handlers are `on_event` (every watch event, including the initial listing; errors are
//! logged, never retried) and the `on_startup` / `on_cleanup` activities (`reference/kopf.md` §1.22).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::api::DynamicObject;
use serde_json::Value;

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
    /// A temporary error: the handler is retried after `delay`.
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

/// What handlers return.
pub type HandlerResult = Result<(), HandlerError>;

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

/// What an object's handler is given: Kopf's kwargs, for one event of one object.
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
        }
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

    /// `spec` (null when absent).
    pub fn spec(&self) -> &Value {
        self.body.data.get("spec").unwrap_or(&Value::Null)
    }

    /// `status` (null when absent).
    pub fn status(&self) -> &Value {
        self.body.data.get("status").unwrap_or(&Value::Null)
    }

    /// `spec` as a typed value.
    pub fn spec_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(self.spec().clone())
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

/// An `on_event` handler function.
pub type EventFn = Arc<dyn Fn(Ctx) -> BoxFuture<'static, HandlerResult> + Send + Sync>;

/// A startup or cleanup activity function.
pub type ActivityFn = Arc<dyn Fn(ActivityCtx) -> BoxFuture<'static, HandlerResult> + Send + Sync>;

/// A registered `on_event` handler.
#[derive(Clone)]
pub struct EventHandler {
    /// The handler's id (in logs and, later, in progress annotations).
    pub id: String,
    /// Which resource it serves.
    pub selector: Selector,
    /// The function.
    pub func: EventFn,
}

/// A registered startup or cleanup activity.
#[derive(Clone)]
pub struct Activity {
    /// The activity's id.
    pub id: String,
    /// The function.
    pub func: ActivityFn,
}

/// Every registered handler of an operator.
#[derive(Clone, Default)]
pub struct Registry {
    /// `on_event` handlers, in registration order.
    pub event_handlers: Vec<EventHandler>,
    /// `on_startup` activities, run in order before anything is watched.
    pub startup: Vec<Activity>,
    /// `on_cleanup` activities, run in order after everything stopped.
    pub cleanup: Vec<Activity>,
}

impl Registry {
    /// The distinct selectors that handlers were registered for, in registration order.
    pub fn selectors(&self) -> Vec<Selector> {
        let mut selectors: Vec<Selector> = Vec::new();
        for handler in &self.event_handlers {
            if !selectors.contains(&handler.selector) {
                selectors.push(handler.selector.clone());
            }
        }
        selectors
    }

    /// The handlers registered with this selector.
    pub fn handlers_for(&self, selector: &Selector) -> Vec<EventHandler> {
        self.event_handlers
            .iter()
            .filter(|h| h.selector == *selector)
            .cloned()
            .collect()
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
