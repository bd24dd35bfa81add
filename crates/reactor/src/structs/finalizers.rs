//! The finalizer that keeps an object while its delete handlers (and, later, daemons) need it
//! (`reference/kopf.md` §1.7, §2.6).
//!
//! **Expected flow**: a cycle that finds the finalizer needed and missing adds it and runs no changing
//! handlers (the patch's own event starts the next cycle); once deletion is requested, the delete
//! handlers run, and the cycle in which nothing is left to do removes it, letting the API server
//! delete the object.
//!
//! **Guarantees**: the finalizer is added and removed by JSON patches that test the object's
//! `resourceVersion` first, so a concurrent change of the list (another controller's finalizer) is
//! never overwritten: the patch fails with a conflict and is retried on the fresher body. Removal drops
//! every copy of ours and leaves the others in place.

use kube::api::DynamicObject;
use serde_json::{json, Value};

/// Whether deletion was requested (`metadata.deletionTimestamp` is set).
pub fn is_deletion_ongoing(body: &DynamicObject) -> bool {
    body.metadata.deletion_timestamp.is_some()
}

/// Whether our finalizer is on the object.
pub fn is_deletion_blocked(body: &DynamicObject, finalizer: &str) -> bool {
    body.metadata
        .finalizers
        .as_ref()
        .is_some_and(|all| all.iter().any(|f| f == finalizer))
}

/// Adds the finalizer to a body (a patch transformation); a no-op when it is there.
pub fn block_deletion(body: &mut Value, finalizer: &str) {
    let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let finalizers = metadata
        .entry("finalizers")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !finalizers.is_array() {
        *finalizers = Value::Array(Vec::new());
    }
    if let Some(list) = finalizers.as_array_mut() {
        if !list.iter().any(|f| f == finalizer) {
            list.push(json!(finalizer));
        }
    }
}

/// Removes every copy of the finalizer from a body (a patch transformation); an emptied list is
/// dropped.
pub fn allow_deletion(body: &mut Value, finalizer: &str) {
    let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(list) = metadata.get_mut("finalizers").and_then(Value::as_array_mut) {
        list.retain(|f| f != finalizer);
        if list.is_empty() {
            metadata.remove("finalizers");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "kopf.zalando.org/KopfFinalizerMarker";

    #[test]
    fn blocking_appends_once_and_keeps_other_finalizers() {
        let mut body = json!({"metadata": {"finalizers": ["other"]}});
        block_deletion(&mut body, OURS);
        block_deletion(&mut body, OURS);
        assert_eq!(body, json!({"metadata": {"finalizers": ["other", OURS]}}));
    }

    #[test]
    fn allowing_removes_every_copy_and_drops_an_empty_list() {
        let mut body = json!({"metadata": {"finalizers": [OURS, "other", OURS]}});
        allow_deletion(&mut body, OURS);
        assert_eq!(body, json!({"metadata": {"finalizers": ["other"]}}));
        let mut body = json!({"metadata": {"finalizers": [OURS]}});
        allow_deletion(&mut body, OURS);
        assert_eq!(body, json!({"metadata": {}}));
    }

    #[test]
    fn the_state_is_read_from_metadata() {
        let body: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": "x", "finalizers": [OURS], "deletionTimestamp": "2026-01-01T00:00:00Z"}
        }))
        .unwrap();
        assert!(is_deletion_ongoing(&body));
        assert!(is_deletion_blocked(&body, OURS));
        assert!(!is_deletion_blocked(&body, "other"));
    }
}
