//! What a real API server checks of some built-in kinds beyond their metadata, for the kinds
//! operators write most: ConfigMaps and Secrets (data keys and encodings), Pods and Deployments
//! (containers, a selector matching the template), Events (the involved object's namespace) and
//! Leases (their durations). A body that does not decode as the kind is a 400 BadRequest, a value the
//! kind's validation refuses a 422 Invalid, as on a real server; kinds not listed here are stored
//! as they come.

use base64::Engine;
use serde_json::Value;

use crate::status::{ApiError, ApiResult, Cause};

/// Checks `object` of the built-in resource `group`/`plural`: Ok, or the real server's error.
pub fn validate(group: &str, plural: &str, kind: &str, object: &Value) -> ApiResult<()> {
    let causes = match (group, plural) {
        ("", "configmaps") => {
            let mut causes = data_keys(object, "data")?;
            if let Some(values) = object.get("data").and_then(Value::as_object) {
                if let Some((key, _)) = values.iter().find(|(_, v)| !v.is_string()) {
                    return Err(undecodable(kind, &format!("data.{key} must be a string")));
                }
            }
            causes.extend(data_keys(object, "binaryData")?);
            base64_values(object, "binaryData", kind)?;
            causes
        }
        ("", "secrets") => {
            let causes = data_keys(object, "data")?;
            base64_values(object, "data", kind)?;
            causes
        }
        ("", "pods") => containers(&object["spec"], "spec"),
        ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets") => {
            workload(&object["spec"])
        }
        ("", "events") => event(object),
        ("coordination.k8s.io", "leases") => lease(&object["spec"]),
        _ => Vec::new(),
    };
    if causes.is_empty() {
        return Ok(());
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Err(ApiError::invalid(group, kind, name, causes))
}

/// A 400 for a body that does not decode as the kind.
fn undecodable(kind: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version \"v1\" cannot be handled as a {kind}: {why}"
    ))
}

/// The keys of a data map: `[-._a-zA-Z0-9]+`, at most 253 characters, not `.` or `..`.
fn data_keys(object: &Value, field: &str) -> ApiResult<Vec<Cause>> {
    let Some(map) = object.get(field).filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let Some(map) = map.as_object() else {
        return Err(ApiError::bad_request(format!("{field} must be a map")));
    };
    Ok(map
        .keys()
        .filter(|key| {
            key.is_empty()
                || key.len() > 253
                || *key == "."
                || *key == ".."
                || !key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
        .map(|key| {
            Cause::new(
                "FieldValueInvalid",
                format!("{field}[{key}]"),
                format!(
                    "Invalid value: {key:?}: a valid config key must consist of alphanumeric \
                     characters, '-', '_' or '.'"
                ),
            )
        })
        .collect())
}

/// The values of a map of base64 (a Secret's `data`, a ConfigMap's `binaryData`).
fn base64_values(object: &Value, field: &str, kind: &str) -> ApiResult<()> {
    for (key, value) in object
        .get(field)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let decoded = value
            .as_str()
            .map(|text| base64::engine::general_purpose::STANDARD.decode(text));
        if !matches!(decoded, Some(Ok(_))) {
            return Err(undecodable(
                kind,
                &format!("{field}.{key}: illegal base64 data"),
            ));
        }
    }
    Ok(())
}

/// A pod spec's containers: at least one, each with a name and an image.
fn containers(spec: &Value, path: &str) -> Vec<Cause> {
    let list = spec["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if list.is_empty() {
        return vec![Cause::new(
            "FieldValueRequired",
            format!("{path}.containers"),
            "Required value",
        )];
    }
    let mut causes = Vec::new();
    for (i, container) in list.iter().enumerate() {
        for field in ["name", "image"] {
            if container[field].as_str().is_none_or(str::is_empty) {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    format!("{path}.containers[{i}].{field}"),
                    "Required value",
                ));
            }
        }
    }
    causes
}

/// A workload's spec: a selector, a template whose labels it selects, and the template's pods.
fn workload(spec: &Value) -> Vec<Cause> {
    let selector = &spec["selector"];
    let matching = selector["matchLabels"].as_object();
    let expressions = selector["matchExpressions"]
        .as_array()
        .is_some_and(|e| !e.is_empty());
    if matching.is_none_or(serde_json::Map::is_empty) && !expressions {
        return vec![Cause::new(
            "FieldValueRequired",
            "spec.selector",
            "Required value",
        )];
    }
    let labels = spec
        .pointer("/template/metadata/labels")
        .and_then(Value::as_object);
    let mut causes = Vec::new();
    let selected = matching
        .into_iter()
        .flatten()
        .all(|(key, value)| labels.is_some_and(|labels| labels.get(key) == Some(value)));
    if !selected {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.template.metadata.labels",
            "Invalid value: `selector` does not match template `labels`",
        ));
    }
    causes.extend(containers(&spec["template"]["spec"], "spec.template.spec"));
    causes
}

/// A core/v1 Event: its involved object is in its namespace (or, cluster-scoped, the event is in
/// `default` or in none), as the API server's legacy event validation has it.
fn event(object: &Value) -> Vec<Cause> {
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let involved = object["involvedObject"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let fits = if involved.is_empty() {
        namespace.is_empty() || namespace == "default"
    } else {
        involved == namespace
    };
    if fits {
        return Vec::new();
    }
    vec![Cause::new(
        "FieldValueInvalid",
        "involvedObject.namespace",
        format!("Invalid value: {involved:?}: does not match event.namespace"),
    )]
}

/// A Lease's durations and transitions: positive, and not negative.
fn lease(spec: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(duration) = spec["leaseDurationSeconds"].as_i64().filter(|d| *d <= 0) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.leaseDurationSeconds",
            format!("Invalid value: {duration}: must be greater than 0"),
        ));
    }
    if let Some(transitions) = spec["leaseTransitions"].as_i64().filter(|t| *t < 0) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.leaseTransitions",
            format!("Invalid value: {transitions}: must be greater than or equal to 0"),
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_data_must_be_strings_under_valid_keys_and_binary_data_base64() {
        let ok = json!({"metadata": {"name": "c"}, "data": {"a.b_c-1": "x"}, "binaryData": {"b": "aGk="}});
        assert!(validate("", "configmaps", "ConfigMap", &ok).is_ok());
        let number = json!({"metadata": {"name": "c"}, "data": {"a": 1}});
        assert_eq!(
            validate("", "configmaps", "ConfigMap", &number)
                .unwrap_err()
                .code,
            400
        );
        let key = json!({"metadata": {"name": "c"}, "data": {"bad key": "1"}});
        assert_eq!(
            validate("", "configmaps", "ConfigMap", &key)
                .unwrap_err()
                .code,
            422
        );
        let binary = json!({"metadata": {"name": "c"}, "binaryData": {"b": "%%%"}});
        assert_eq!(
            validate("", "configmaps", "ConfigMap", &binary)
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn workloads_need_containers_and_a_selector_of_their_template() {
        let template = json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let good =
            json!({"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": template}});
        assert!(validate("apps", "deployments", "Deployment", &good).is_ok());
        let other =
            json!({"spec": {"selector": {"matchLabels": {"app": "b"}}, "template": template}});
        assert_eq!(
            validate("apps", "deployments", "Deployment", &other)
                .unwrap_err()
                .code,
            422
        );
        let none = json!({"spec": {"template": template}});
        assert_eq!(
            validate("apps", "deployments", "Deployment", &none)
                .unwrap_err()
                .code,
            422
        );
        let empty = json!({"spec": {"containers": []}});
        assert_eq!(validate("", "pods", "Pod", &empty).unwrap_err().code, 422);
    }

    #[test]
    fn events_are_in_their_objects_namespace_and_leases_last() {
        let here = json!({"metadata": {"namespace": "a"}, "involvedObject": {"namespace": "a"}});
        assert!(validate("", "events", "Event", &here).is_ok());
        let cluster =
            json!({"metadata": {"namespace": "default"}, "involvedObject": {"kind": "Node"}});
        assert!(validate("", "events", "Event", &cluster).is_ok());
        let elsewhere =
            json!({"metadata": {"namespace": "a"}, "involvedObject": {"namespace": "b"}});
        assert_eq!(
            validate("", "events", "Event", &elsewhere)
                .unwrap_err()
                .code,
            422
        );
        let lease = json!({"spec": {"leaseDurationSeconds": 0}});
        assert_eq!(
            validate("coordination.k8s.io", "leases", "Lease", &lease)
                .unwrap_err()
                .code,
            422
        );
    }
}
