//! Causes: what happened to an object, as changing handlers see it (`reference/kopf.md` §1.5).
//!
//! A cause is detected from the event, the body, and the diff between the essence stored as the
//! diff-base (`old`) and the current one (`new`), in Kopf's order: a `DELETED` event is [`Reason::Gone`];
//! a deletion without our finalizer is [`Reason::Free`]; a deletion is [`Reason::Delete`]; no diff-base
//! is [`Reason::Create`]; no diff in an object first seen in the initial listing is [`Reason::Resume`];
//! no diff is [`Reason::Noop`]; anything else is [`Reason::Update`].

use std::fmt;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::structs::diffs::Diff;
use crate::structs::finalizers;
use crate::structs::names::EventType;

/// Why changing handlers run (Kopf's `Reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The object has no diff-base yet: it is new to us.
    Create,
    /// The essence changed since the diff-base.
    Update,
    /// Deletion was requested and our finalizer holds the object.
    Delete,
    /// First seen in the initial listing, with nothing changed: the operator restarted.
    Resume,
    /// Something changed, but not the essence.
    Noop,
    /// Deletion was requested and our finalizer is gone: nothing to do.
    Free,
    /// The object is gone from the API.
    Gone,
}

impl Reason {
    /// The name stored as a handler's `purpose` (`create`, `update`, `delete`, `resume`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Create => "create",
            Reason::Update => "update",
            Reason::Delete => "delete",
            Reason::Resume => "resume",
            Reason::Noop => "noop",
            Reason::Free => "free",
            Reason::Gone => "gone",
        }
    }

    /// Kopf's title of the reason in log messages (`Creation is processed: ...`).
    pub fn title(self) -> &'static str {
        match self {
            Reason::Create => "creation",
            Reason::Update => "updating",
            Reason::Delete => "deletion",
            Reason::Resume => "resuming",
            other => other.as_str(),
        }
    }

    /// The title of a stored purpose (which may come from another version or operator).
    pub fn title_of(purpose: &str) -> String {
        match purpose {
            "create" => "creation".into(),
            "update" => "updating".into(),
            "delete" => "deletion".into(),
            "resume" => "resuming".into(),
            other => format!("{other:?}"),
        }
    }

    /// Whether handlers run for this reason (create, update, delete, resume).
    pub fn has_handlers(self) -> bool {
        matches!(
            self,
            Reason::Create | Reason::Update | Reason::Delete | Reason::Resume
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What changed, for changing handlers.
#[derive(Debug, Clone)]
pub struct ChangingCause {
    /// Why.
    pub reason: Reason,
    /// The object was first seen in the initial listing and not yet fully handled by this process:
    /// resume handlers are mixed into whatever cause there is.
    pub initial: bool,
    /// Whether deletion was requested.
    pub deleted: bool,
    /// The essence stored as the diff-base (None: never handled).
    pub old: Option<Arc<Value>>,
    /// The current essence.
    pub new: Option<Arc<Value>>,
    /// From `old` to `new`.
    pub diff: Arc<Diff>,
}

/// Detects the changing cause, in Kopf's order (see the module's documentation).
pub fn detect(
    event_type: EventType,
    body: &DynamicObject,
    finalizer: &str,
    old: Option<Value>,
    new: Option<Value>,
    diff: Diff,
    initial: bool,
) -> ChangingCause {
    let deleted = finalizers::is_deletion_ongoing(body);
    let no_diff = diff.is_empty();
    let mut initial = initial;
    let reason = if event_type == EventType::Deleted {
        Reason::Gone
    } else if deleted && !finalizers::is_deletion_blocked(body, finalizer) {
        Reason::Free
    } else if deleted {
        Reason::Delete
    } else if old.is_none() {
        // Creation never mixes with resuming, even for an object found in the initial listing.
        initial = false;
        Reason::Create
    } else if no_diff && initial {
        Reason::Resume
    } else if no_diff {
        Reason::Noop
    } else {
        Reason::Update
    };
    ChangingCause {
        reason,
        initial,
        deleted,
        old: old.map(Arc::new),
        new: new.map(Arc::new),
        diff: Arc::new(diff),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::diffs::diff;
    use serde_json::json;

    const FIN: &str = "kopf.zalando.org/KopfFinalizerMarker";

    fn body(meta: Value) -> DynamicObject {
        serde_json::from_value(json!({"metadata": meta})).unwrap()
    }

    fn cause(event: EventType, meta: Value, old: Option<Value>, initial: bool) -> ChangingCause {
        let new = json!({"spec": {"x": 1}});
        let d = diff(old.as_ref(), Some(&new));
        detect(event, &body(meta), FIN, old, Some(new), d, initial)
    }

    #[test]
    fn a_deleted_event_is_gone() {
        let c = cause(EventType::Deleted, json!({"name": "a"}), None, false);
        assert_eq!(c.reason, Reason::Gone);
    }

    #[test]
    fn deletion_without_our_finalizer_is_free_and_with_it_is_delete() {
        let ts = "2026-01-01T00:00:00Z";
        let free = cause(
            EventType::Modified,
            json!({"name": "a", "deletionTimestamp": ts, "finalizers": ["x"]}),
            None,
            false,
        );
        assert_eq!(free.reason, Reason::Free);
        let delete = cause(
            EventType::Modified,
            json!({"name": "a", "deletionTimestamp": ts, "finalizers": [FIN]}),
            None,
            false,
        );
        assert_eq!(delete.reason, Reason::Delete);
        assert!(delete.deleted);
    }

    #[test]
    fn no_diff_base_is_create_and_never_resume() {
        let c = cause(EventType::Listed, json!({"name": "a"}), None, true);
        assert_eq!(c.reason, Reason::Create);
        assert!(!c.initial);
    }

    #[test]
    fn no_diff_is_resume_when_initial_else_noop() {
        let same = Some(json!({"spec": {"x": 1}}));
        let resumed = cause(EventType::Listed, json!({"name": "a"}), same.clone(), true);
        assert_eq!(resumed.reason, Reason::Resume);
        let noop = cause(EventType::Modified, json!({"name": "a"}), same, false);
        assert_eq!(noop.reason, Reason::Noop);
    }

    #[test]
    fn a_diff_is_update_even_when_initial() {
        let c = cause(
            EventType::Listed,
            json!({"name": "a"}),
            Some(json!({"spec": {"x": 0}})),
            true,
        );
        assert_eq!(c.reason, Reason::Update);
        assert!(c.initial);
    }
}
