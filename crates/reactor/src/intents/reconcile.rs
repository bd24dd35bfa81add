//! Reconcile handlers: Operator SDK's and kube-rs's model, level-based, beside Kopf's changing handlers.
//!
//! A reconcile handler is given the object as it is now and makes the world match it; it returns
//! an [`Action`]: [`Action::requeue`] after a delay, or [`Action::await_change`]. It runs in the
//! object's worker, in the same cycle as the object's other handlers (after the changing handlers),
//! so it never overlaps them, their daemons' decisions, or another run of itself for that object.
//!
//! **When it runs** (each run sees everything that happened before it; bursts coalesce into one):
//! * the object changed, as its [`Predicate`] says (default: any new version, as controller-runtime
//!   without predicates; the first sight of an object in a process always counts, and so does the
//!   start of its deletion);
//! * an object it [owns](Reconcile::owns) changed (its `ownerReferences` name this object, as
//!   controller, by default) or an object a [watch](Reconcile::watches) maps to it changed: the
//!   event goes to this object's worker as a message ([`crate::structs::triggers`]);
//! * the requeue it asked for came due, or the retry after its error did.
//!
//! **Errors** are retried per object with an exponential backoff (`queueing.reconcile_backoff`:
//! 5 ms doubling to 1000 s, as controller-runtime), reset by a success;
//! [`HandlerError::Temporary`](crate::intents::context::HandlerError::Temporary) retries after its
//! own delay; [`HandlerError::Permanent`](crate::intents::context::HandlerError::Permanent) waits
//! for the next trigger. A panic is an error.
//!
//! **Deletion**: it sees the deletion timestamp (`ctx.meta().deletion_timestamp`). With
//! [`Reconcile::finalizer`] the object keeps the operator's finalizer until a run during the
//! deletion succeeds; without it, no finalizer is added, and an object that is gone is not
//! reconciled (its children go with it by garbage collection).
//!
//! Nothing is written to the object on its behalf: no progress annotations, no diff-base.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use kube::api::DynamicObject;
use serde_json::{json, Value};

use crate::intents::context::{Ctx, HandlerError, HandlerFn};
use crate::structs::resources::{Resource, Selector};

/// What a reconcile handler asks for next (kube-rs's `Action`; controller-runtime's `Result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Run again after `after`, whatever happens meanwhile (`Result{RequeueAfter: after}`). A
    /// trigger that comes sooner runs it sooner, and the requeue is then asked anew.
    pub fn requeue(after: Duration) -> Self {
        Action {
            requeue_after: Some(after),
        }
    }

    /// Run again only when something triggers it (`Result{}`).
    pub fn await_change() -> Self {
        Action {
            requeue_after: None,
        }
    }

    /// The requeue asked for, if any.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }

    /// As a handler's result value, for execution (the same path as every handler: panics, timeouts,
    /// metrics and logs).
    fn to_value(self) -> Value {
        match self.requeue_after {
            Some(after) => {
                json!({ "requeue_after_ns": u64::try_from(after.as_nanos()).unwrap_or(u64::MAX) })
            }
            None => Value::Null,
        }
    }

    /// Back from a result value.
    pub fn from_value(value: Option<&Value>) -> Self {
        let after = value
            .and_then(|v| v.get("requeue_after_ns"))
            .and_then(Value::as_u64)
            .map(Duration::from_nanos);
        Action {
            requeue_after: after,
        }
    }
}

/// A test on an object's old and new bodies: does the change trigger a reconcile? Composable with
/// [`Predicate::or`], [`Predicate::and`] and [`Predicate::not`] (controller-runtime's
/// `predicate.Or`, `And`, `Not`).
#[derive(Clone)]
pub struct Predicate {
    name: Arc<str>,
    test: PredicateFn,
}

type PredicateFn = Arc<dyn Fn(&DynamicObject, &DynamicObject) -> bool + Send + Sync>;

impl Predicate {
    /// A predicate of your own: `test(old, new)` says whether the change from the last reconciled
    /// body `old` to `new` triggers a run.
    pub fn new(
        name: impl Into<Arc<str>>,
        test: impl Fn(&DynamicObject, &DynamicObject) -> bool + Send + Sync + 'static,
    ) -> Self {
        Predicate {
            name: name.into(),
            test: Arc::new(test),
        }
    }

    /// Any new version (the default): status updates too.
    pub fn resource_version_changed() -> Self {
        Predicate::new("ResourceVersionChanged", |old, new| {
            old.metadata.resource_version != new.metadata.resource_version
        })
    }

    /// `metadata.generation` changed: the spec did, not only the status or the metadata
    /// (controller-runtime's `GenerationChangedPredicate`). For objects without a generation (some
    /// built-in kinds), any new version.
    pub fn generation_changed() -> Self {
        Predicate::new("GenerationChanged", |old, new| {
            match (old.metadata.generation, new.metadata.generation) {
                (Some(old), Some(new)) => old != new,
                _ => old.metadata.resource_version != new.metadata.resource_version,
            }
        })
    }

    /// The labels changed (`LabelChangedPredicate`).
    pub fn labels_changed() -> Self {
        Predicate::new("LabelsChanged", |old, new| {
            old.metadata.labels != new.metadata.labels
        })
    }

    /// The annotations changed (`AnnotationChangedPredicate`).
    pub fn annotations_changed() -> Self {
        Predicate::new("AnnotationsChanged", |old, new| {
            old.metadata.annotations != new.metadata.annotations
        })
    }

    /// Either this or `other`.
    pub fn or(self, other: Predicate) -> Self {
        let name = format!("Or({}, {})", self.name, other.name);
        Predicate::new(name, move |old, new| {
            (self.test)(old, new) || (other.test)(old, new)
        })
    }

    /// Both this and `other`.
    pub fn and(self, other: Predicate) -> Self {
        let name = format!("And({}, {})", self.name, other.name);
        Predicate::new(name, move |old, new| {
            (self.test)(old, new) && (other.test)(old, new)
        })
    }

    /// Not this.
    #[allow(
        clippy::should_implement_trait,
        reason = "controller-runtime's name, on a builder"
    )]
    pub fn not(self) -> Self {
        let name = format!("Not({})", self.name);
        Predicate::new(name, move |old, new| !(self.test)(old, new))
    }

    /// Whether the change from `old` to `new` triggers.
    pub fn test(&self, old: &DynamicObject, new: &DynamicObject) -> bool {
        (self.test)(old, new)
    }
}

impl fmt::Debug for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Which owners an owned object's events go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OwnerRefs {
    /// Only the owner reference marked `controller: true` (controller-runtime's
    /// `OnlyControllerOwner`, the default).
    #[default]
    Controller,
    /// Every owner reference of the reconciled kind.
    All,
}

/// A kind the reconciled objects own: its events go to their owners' workers.
#[derive(Debug, Clone)]
pub struct Owns {
    /// The owned resource.
    pub selector: Selector,
    /// Which owner references count.
    pub owners: OwnerRefs,
}

/// Maps a watched object to the objects to reconcile: (namespace, name) pairs
/// (controller-runtime's `EnqueueRequestsFromMapFunc`, kube-rs's `watches`).
pub type MapFn = Arc<dyn Fn(&DynamicObject) -> Vec<(Option<String>, String)> + Send + Sync>;

/// A kind whose events are mapped to the objects to reconcile.
#[derive(Clone)]
pub struct Watches {
    /// The watched resource.
    pub selector: Selector,
    /// The mapping.
    pub map: MapFn,
}

impl fmt::Debug for Watches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watches")
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

/// A reconcile handler's registration: its id and options.
///
/// ```
/// # use kactor_reactor::reconcile::{Predicate, Reconcile};
/// # use std::time::Duration;
/// let options = Reconcile::id("memcached")
///     .owns("deployments.v1.apps")
///     .cache("pods")
///     .predicate(Predicate::generation_changed().or(Predicate::labels_changed()))
///     .finalizer()
///     .timeout(Duration::from_secs(60));
/// ```
#[derive(Debug, Clone)]
pub struct Reconcile {
    /// The handler's id (in logs and metrics).
    pub id: String,
    /// Which changes of the object trigger it (None: any new version).
    pub predicate: Option<Predicate>,
    /// The kinds it owns.
    pub owns: Vec<Owns>,
    /// The kinds it watches, mapped.
    pub watches: Vec<Watches>,
    /// Other kinds it reads from the cache (`ctx.cache`), with no trigger.
    pub cached: Vec<Selector>,
    /// It runs only for related objects' changes (and its retries), never for the object's own
    /// (`Operator::on_owned`, Kopf-style).
    pub related_only: bool,
    /// The object keeps the operator's finalizer until a run during its deletion succeeds.
    pub finalizer: bool,
    /// A run still going after this long is cancelled and counts as an error.
    pub timeout: Option<Duration>,
    /// Given to the handler as `ctx.param()`.
    pub param: Option<Arc<Value>>,
}

impl Reconcile {
    /// A reconcile handler with this id.
    pub fn id(id: impl Into<String>) -> Self {
        Reconcile {
            id: id.into(),
            predicate: None,
            owns: Vec::new(),
            watches: Vec::new(),
            cached: Vec::new(),
            related_only: false,
            finalizer: false,
            timeout: None,
            param: None,
        }
    }

    /// Only changes that pass `predicate` trigger it (children, watches and requeues always do).
    pub fn predicate(mut self, predicate: Predicate) -> Self {
        self.predicate = Some(predicate);
        self
    }

    /// The objects of `resource` whose controller owner reference names a reconciled object
    /// trigger it, and are cached (`ctx.cache(resource)`).
    pub fn owns(self, resource: impl Into<Selector>) -> Self {
        self.owns_with(resource, OwnerRefs::Controller)
    }

    /// As [`Reconcile::owns`], choosing which owner references count.
    pub fn owns_with(mut self, resource: impl Into<Selector>, owners: OwnerRefs) -> Self {
        self.owns.push(Owns {
            selector: resource.into(),
            owners,
        });
        self
    }

    /// Any event of an object of `resource` triggers the objects `map` names; `resource` is
    /// cached.
    pub fn watches(
        mut self,
        resource: impl Into<Selector>,
        map: impl Fn(&DynamicObject) -> Vec<(Option<String>, String)> + Send + Sync + 'static,
    ) -> Self {
        self.watches.push(Watches {
            selector: resource.into(),
            map: Arc::new(map),
        });
        self
    }

    /// `resource` is cached for `ctx.cache`, with no trigger.
    pub fn cache(mut self, resource: impl Into<Selector>) -> Self {
        self.cached.push(resource.into());
        self
    }

    /// The object keeps the operator's finalizer until a run during its deletion succeeds (the
    /// handler cleans up what garbage collection does not).
    pub fn finalizer(mut self) -> Self {
        self.finalizer = true;
        self
    }

    /// A run still going after this long is cancelled, and counts as an error.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// A value given to the handler as `ctx.param()`.
    pub fn param(mut self, param: Value) -> Self {
        self.param = Some(Arc::new(param));
        self
    }

    /// It runs only when a related object changes (and for its retries), never for the object's
    /// own changes or a requeue.
    pub fn related_only(mut self) -> Self {
        self.related_only = true;
        self
    }

    /// Whether changes of `resource` trigger it (it owns or watches it).
    pub fn relates_to(&self, resource: &Resource) -> bool {
        self.owns.iter().any(|o| o.selector.matches(resource))
            || self.watches.iter().any(|w| w.selector.matches(resource))
    }

    /// Every kind it caches: owned, watched, and read.
    pub fn cached_kinds(&self) -> Vec<Selector> {
        let mut kinds: Vec<Selector> = Vec::new();
        let all = self
            .owns
            .iter()
            .map(|o| &o.selector)
            .chain(self.watches.iter().map(|w| &w.selector))
            .chain(self.cached.iter());
        for selector in all {
            if !kinds.contains(selector) {
                kinds.push(selector.clone());
            }
        }
        kinds
    }
}

impl From<&str> for Reconcile {
    fn from(id: &str) -> Self {
        Reconcile::id(id)
    }
}

impl From<String> for Reconcile {
    fn from(id: String) -> Self {
        Reconcile::id(id)
    }
}

/// A registered reconcile handler.
#[derive(Clone)]
pub struct ReconcileHandler {
    /// Which resource it reconciles.
    pub selector: Selector,
    /// Its id and options.
    pub options: Reconcile,
    /// The function, its [`Action`] as a result value.
    pub func: HandlerFn,
}

impl ReconcileHandler {
    /// The handler's id.
    pub fn id(&self) -> &str {
        &self.options.id
    }
}

/// Wraps an async function returning an [`Action`] as a handler function.
pub fn reconcile_fn<F, Fut>(f: F) -> HandlerFn
where
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action, HandlerError>> + Send + 'static,
{
    Arc::new(move |ctx| f(ctx).map(|r| r.map(Action::to_value)).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(rv: &str, generation: i64, label: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "metadata": {"name": "m", "resourceVersion": rv, "generation": generation,
                         "labels": {"app": label}},
        }))
        .unwrap()
    }

    #[test]
    fn actions_survive_the_handler_path() {
        for action in [
            Action::requeue(Duration::from_millis(1500)),
            Action::await_change(),
        ] {
            let value = action.to_value();
            let value = (!value.is_null()).then_some(value);
            assert_eq!(Action::from_value(value.as_ref()), action);
        }
    }

    #[test]
    fn predicates_compare_the_last_reconciled_body_with_the_new_one() {
        let base = object("1", 1, "web");
        let status_only = object("2", 1, "web");
        let spec = object("3", 2, "web");
        let relabelled = object("4", 1, "db");
        let rv = Predicate::resource_version_changed();
        let generation = Predicate::generation_changed();
        let labels = Predicate::labels_changed();
        assert!(rv.test(&base, &status_only));
        assert!(!generation.test(&base, &status_only));
        assert!(generation.test(&base, &spec));
        assert!(!labels.test(&base, &spec));
        assert!(labels.test(&base, &relabelled));
        let either = generation.clone().or(labels.clone());
        assert!(either.test(&base, &spec) && either.test(&base, &relabelled));
        assert!(!either.test(&base, &status_only));
        assert!(!generation.clone().and(labels).test(&base, &spec));
        assert!(generation.clone().not().test(&base, &status_only));
        assert_eq!(
            format!("{:?}", either),
            "Or(GenerationChanged, LabelsChanged)"
        );
    }

    #[test]
    fn kinds_are_cached_once() {
        let options = Reconcile::id("r")
            .owns("deployments.v1.apps")
            .watches("configmaps", |_| Vec::new())
            .cache("pods")
            .cache("deployments.v1.apps");
        let kinds: Vec<String> = options.cached_kinds().into_iter().map(|s| s.name).collect();
        assert_eq!(kinds, ["deployments", "configmaps", "pods"]);
    }
}
