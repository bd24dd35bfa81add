//! The PATCH formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and the two Kubernetes ones.
//!
//! Strategic merge patch behaves as a JSON merge patch here: lists are replaced, not merged by key, and
//! the `$patch`/`$setElementOrder`/`$retainKeys`/`$deleteFromPrimitiveList` directives are dropped; custom
//! resources refuse it (415), as on a real server. Server-side apply (`application/apply-patch+yaml`)
//! needs a `fieldManager` and is a merge patch that creates the object when it is missing; fields are
//! not tracked by manager, so it never reports a conflict between managers (a real server answers
//! 409 Conflict).

use serde_json::Value;

use crate::status::{ApiError, ApiResult};

/// The patch formats the API server accepts, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json` (applied as a merge patch).
    Strategic,
    /// `application/apply-patch+yaml` (applied as a merge patch; creates).
    Apply,
}

impl PatchKind {
    /// The patch kind for a `Content-Type`, or a 415.
    pub fn from_content_type(content_type: &str) -> ApiResult<Self> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        match media {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchKind::Apply),
            _ => Err(ApiError::unsupported_media_type(content_type)),
        }
    }
}

/// Applies a patch to a copy of `target`; errors are the API server's (400 malformed, 422 failed test).
pub fn apply(
    kind: PatchKind,
    target: &Value,
    patch: &Value,
    describe: impl Fn(String) -> ApiError,
) -> ApiResult<Value> {
    let mut result = target.clone();
    match kind {
        PatchKind::Json => {
            let _: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("the server rejected our request due to an error in our request: invalid JSON patch: {e}")))?;
            // One operation at a time, as the API server's JSON patch library goes: a `replace` of
            // a key its object does not have adds it (a real server answers 200, not 422).
            for operation in patch.as_array().into_iter().flatten() {
                let mut operation = operation.clone();
                let path = operation["path"].as_str().unwrap_or_default().to_string();
                if operation["op"] == "test"
                    && operation["value"].is_null()
                    && result.pointer(&path).is_none()
                {
                    // The API server's library passes a test of `null` where the key is absent
                    // (its parent must be there): how a writer tests that a label is not set.
                    let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
                    if result.pointer(parent).is_some_and(Value::is_object) {
                        continue;
                    }
                }
                if operation["op"] == "replace" && result.pointer(&path).is_none() {
                    let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
                    if result.pointer(parent).is_some_and(Value::is_object) {
                        operation["op"] = Value::from("add");
                    }
                }
                let one: json_patch::Patch = serde_json::from_value(Value::Array(vec![operation]))
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut result, &one).map_err(|e| match e.kind {
                    json_patch::PatchErrorKind::TestFailed => describe(format!(
                        "the server rejected our request due to an error in our request: {e}"
                    )),
                    _ => ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    ),
                })?;
            }
        }
        PatchKind::Merge | PatchKind::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("the patch must be a JSON object"));
            }
            json_patch::merge(&mut result, patch);
        }
        PatchKind::Strategic => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("the patch must be a JSON object"));
            }
            json_patch::merge(&mut result, &strip_directives(patch));
        }
    }
    Ok(result)
}

/// Removes strategic-merge-patch directives, keeping the merge-patch meaning of the rest.
fn strip_directives(patch: &Value) -> Value {
    match patch {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|item| !item.as_object().is_some_and(|m| m.contains_key("$patch")))
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn invalid(message: String) -> ApiError {
        ApiError::new(422, "Invalid", message)
    }

    #[test]
    fn merge_patch_sets_and_removes_keys() {
        let target = json!({"spec": {"a": 1, "b": 2}, "metadata": {"name": "x"}});
        let out = apply(
            PatchKind::Merge,
            &target,
            &json!({"spec": {"a": null, "c": 3}}),
            invalid,
        )
        .unwrap();
        assert_eq!(out["spec"], json!({"b": 2, "c": 3}));
    }

    #[test]
    fn json_patch_failed_test_is_invalid() {
        let target = json!({"metadata": {"resourceVersion": "5"}});
        let patch = json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}]);
        let error = apply(PatchKind::Json, &target, &patch, invalid).unwrap_err();
        assert_eq!(error.code, 422);
    }

    #[test]
    fn a_null_test_passes_where_the_key_is_absent_as_in_the_api_server() {
        let target = json!({"metadata": {"labels": {"shard": "a"}}});
        let passes = |patch: Value| apply(PatchKind::Json, &target, &patch, invalid).map(|_| ());
        assert!(
            passes(json!([{"op": "test", "path": "/metadata/labels/drain", "value": null}]))
                .is_ok()
        );
        let present =
            passes(json!([{"op": "test", "path": "/metadata/labels/shard", "value": null}]));
        assert_eq!(present.unwrap_err().code, 422);
        let no_parent =
            passes(json!([{"op": "test", "path": "/metadata/annotations/x", "value": null}]));
        assert_eq!(no_parent.unwrap_err().code, 422, "the parent must be there");
    }

    #[test]
    fn malformed_json_patch_is_bad_request() {
        let error = apply(PatchKind::Json, &json!({}), &json!({"op": "add"}), invalid).unwrap_err();
        assert_eq!(error.code, 400);
    }

    #[test]
    fn strategic_patch_drops_directives() {
        let target = json!({"spec": {"containers": [{"name": "a"}]}});
        let patch = json!({"spec": {"$setElementOrder/containers": [{"name": "b"}], "containers": [{"name": "b"}]}});
        let out = apply(PatchKind::Strategic, &target, &patch, invalid).unwrap();
        assert_eq!(out, json!({"spec": {"containers": [{"name": "b"}]}}));
    }
}
