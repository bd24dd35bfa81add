//! Handlers: what users register, what they are given ([`Ctx`], [`ActivityCtx`]), what they return.
//!
//! * `on_event` handlers ([`EventHandler`]) run for every watch event, including the initial listing;
//!   their errors are logged, never retried, and no progress is kept (`reference/kopf.md` §1.1).
//! * Changing handlers ([`ChangingHandler`]: create, update, delete, resume, field) run for a cause
//!   (see [`crate::structs::causes`]), are retried per their [`Options`] until they succeed or fail for good,
//!   and keep their progress on the object (see [`crate::storage::progression`]).
//! * `on_startup` / `on_cleanup` activities ([`Activity`], §1.22).
//!
//! A resource handler returns `Ok(value)`: anything serialisable; `()` (null) stores nothing, any
//! other value lands in `status.<handler id>` (an object is merged into it).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub use crate::intents::context::{
    handler_fn, ActivityCtx, ActivityFn, Attempt, Ctx, ErrorsMode, HandlerError, HandlerFn,
    HandlerResult, Logger, Memo, ProbeFn,
};
use crate::intents::daemons::{Cancellation, Daemon, InitialDelay, Timer};
use crate::intents::filters::{Filters, MetaFilter, ValueFilter};
use crate::intents::reconcile::ReconcileHandler;
use crate::structs::causes::Reason;
use crate::structs::names::SpawningKind;
use crate::structs::resources::Selector;

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

/// A registered index handler (Kopf's `@kopf.index`): its result for each object is kept in the
/// index of its id ([`crate::intents::indexes`]).
#[derive(Clone)]
pub struct IndexHandler {
    /// The id: the index's name (`ctx.index(id)`).
    pub id: String,
    /// Which resource it indexes.
    pub selector: Selector,
    /// Which objects it indexes: the others' values are removed.
    pub filters: Filters,
    /// Errors: `Ignored` (the default, as Kopf's) keeps the stale values; `Permanent` removes them
    /// and leaves the object out until the operator restarts; `Temporary` removes them and tries
    /// again at the first event after the delay.
    pub errors: ErrorsMode,
    /// The delay before trying again after an error, in the `Temporary` mode (default:
    /// `execution.default_backoff`).
    pub backoff: Option<Duration>,
    /// The handler's `param`.
    pub param: Option<Arc<Value>>,
    /// The function.
    pub func: HandlerFn,
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

    /// A sub-handler, registered by a changing handler while it runs ([`Ctx::subhandler`]): any
    /// cause of its parent, filtered by its own filters (a field filter checks the value, as for
    /// a resume handler, not that the field changed).
    pub fn sub(selector: Selector, on: On, func: HandlerFn) -> Self {
        ChangingHandler {
            id: on.id,
            selector,
            reason: None,
            initial: false,
            deleted: false,
            requires_finalizer: false,
            field_needs_change: false,
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
        self.filters.field = Some(crate::structs::diffs::parse_field(field));
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
    /// Reconcile handlers, in registration order.
    pub reconcile: Vec<ReconcileHandler>,
    /// Index handlers, in registration order.
    pub index: Vec<IndexHandler>,
}

impl ResourceHandlers {
    /// The ids of every handler, of every kind, in registration order per kind.
    pub fn ids(&self) -> Vec<&str> {
        self.event
            .iter()
            .map(|h| h.id.as_str())
            .chain(self.changing.iter().map(|h| h.id.as_str()))
            .chain(self.spawning.iter().map(|h| h.id.as_str()))
            .chain(self.reconcile.iter().map(ReconcileHandler::id))
            .chain(self.index.iter().map(|h| h.id.as_str()))
            .collect()
    }

    /// Adds every handler of `other` (a resource served with the handlers of several selectors).
    pub fn extend(&mut self, other: &ResourceHandlers) {
        self.event.extend(other.event.iter().cloned());
        self.changing.extend(other.changing.iter().cloned());
        self.spawning.extend(other.spawning.iter().cloned());
        self.reconcile.extend(other.reconcile.iter().cloned());
        self.index.extend(other.index.iter().cloned());
    }

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
        self.event.is_empty()
            && self.changing.is_empty()
            && self.spawning.is_empty()
            && self.reconcile.is_empty()
            && self.index.is_empty()
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
    /// Reconcile handlers, in registration order.
    pub reconcile_handlers: Vec<ReconcileHandler>,
    /// Index handlers, in registration order.
    pub index_handlers: Vec<IndexHandler>,
    /// Admission handlers (validating and mutating webhooks), in registration order. They are
    /// served by the webhook server, not by watching.
    pub admission_handlers: Vec<crate::intents::admission::AdmissionHandler>,
    /// Conversions between versions of custom resources (a CRD conversion webhook), served by the
    /// webhook server.
    pub conversion_handlers: Vec<crate::intents::admission::ConversionHandler>,
    /// How related kinds' caches change objects before keeping them, by kind.
    pub cache_transforms: Vec<(Selector, crate::clients::cache::Transform)>,
    /// Related kinds whose caches keep the objects' metadata alone (listed and watched as
    /// `PartialObjectMetadata`).
    pub metadata_only: Vec<Selector>,
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
            .chain(self.spawning_handlers.iter().map(|h| &h.selector))
            .chain(self.reconcile_handlers.iter().map(|h| &h.selector))
            .chain(self.index_handlers.iter().map(|h| &h.selector));
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
            reconcile: self
                .reconcile_handlers
                .iter()
                .filter(|h| h.selector == *selector)
                .cloned()
                .collect(),
            index: self
                .index_handlers
                .iter()
                .filter(|h| h.selector == *selector)
                .cloned()
                .collect(),
        }
    }

    /// The kinds reconcile handlers cache (owned, watched, read), in registration order.
    pub fn cached_kinds(&self) -> Vec<Selector> {
        let mut kinds: Vec<Selector> = Vec::new();
        for handler in &self.reconcile_handlers {
            for selector in handler.options.cached_kinds() {
                if !kinds.contains(&selector) {
                    kinds.push(selector);
                }
            }
        }
        kinds
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

/// What a spawning handler runs as.
#[derive(Debug, Clone)]
pub enum Spawning {
    /// A daemon.
    Daemon(Daemon),
    /// A timer.
    Timer(Timer),
}

/// A registered daemon or timer.
#[derive(Clone)]
pub struct SpawningHandler {
    /// The id: the key of its result in `status`.
    pub id: String,
    /// Which resource it serves.
    pub selector: Selector,
    /// Daemon or timer, with their options.
    pub spawning: Spawning,
    /// Errors, retries, timeout, backoff, param.
    pub options: Options,
    /// Which objects it runs for (re-checked on every event).
    pub filters: Filters,
    /// The function.
    pub func: HandlerFn,
}

impl SpawningHandler {
    /// Daemon or timer.
    pub fn kind(&self) -> SpawningKind {
        match self.spawning {
            Spawning::Daemon(_) => SpawningKind::Daemon,
            Spawning::Timer(_) => SpawningKind::Timer,
        }
    }

    /// How it is stopped.
    pub fn cancellation(&self) -> Cancellation {
        match &self.spawning {
            Spawning::Daemon(daemon) => daemon.cancellation,
            Spawning::Timer(timer) => timer.cancellation,
        }
    }

    /// Its initial delay.
    pub fn initial_delay(&self) -> Option<&InitialDelay> {
        match &self.spawning {
            Spawning::Daemon(daemon) => daemon.initial_delay.as_ref(),
            Spawning::Timer(timer) => timer.initial_delay.as_ref(),
        }
    }
}

impl fmt::Display for SpawningHandler {
    /// Kopf's wording: `Daemon 'monitor'`, `Timer 'ping'`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            SpawningKind::Daemon => write!(f, "Daemon '{}'", self.id),
            SpawningKind::Timer => write!(f, "Timer '{}'", self.id),
        }
    }
}
