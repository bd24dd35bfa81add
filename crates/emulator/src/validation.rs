//! Validation of object metadata, as the API server's `ValidateObjectMeta` does it.

use serde_json::Value;

use crate::status::Cause;

/// A DNS-1123 subdomain: at most 253 characters of lowercase alphanumerics, `-` and `.`,
/// each dot-separated part starting and ending with an alphanumeric.
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| is_label_chars(part, usize::MAX))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub(crate) fn valid_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && valid_value(name)
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub(crate) fn valid_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let bytes = value.as_bytes();
    value.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A DNS-1123 label: at most 63 lowercase alphanumerics and `-`, starting and ending alphanumeric.
pub fn is_dns_label(name: &str) -> bool {
    is_label_chars(name, 63)
}

fn is_label_chars(part: &str, max: usize) -> bool {
    let bytes = part.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= max
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// How a kind's names are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1123 subdomain (most kinds).
    Subdomain,
    /// DNS-1123 label (namespaces, services).
    Label,
    /// Any name that is a valid path segment (RBAC roles and bindings allow `system:...`).
    PathSegment,
}

/// Checks the name, labels, annotations, finalizers and owner references of an object.
#[allow(
    clippy::too_many_lines,
    reason = "the API server's metadata checks, in its order, one after the other"
)]
pub fn validate_metadata(object: &Value, rule: NameRule) -> Vec<Cause> {
    let mut causes = Vec::new();
    let meta = &object["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let name_ok = match rule {
        NameRule::Subdomain => is_dns_subdomain(name),
        NameRule::Label => is_dns_label(name),
        NameRule::PathSegment => {
            !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
        }
    };
    if !name_ok {
        let message = match rule {
            NameRule::Subdomain => "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            NameRule::Label => "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            NameRule::PathSegment => "may not be '.' or '..' and may not contain '/' or '%'",
        };
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("{name:?}: {message}"),
        ));
    }
    if let Some(labels) = meta.get("labels").filter(|v| !v.is_null()) {
        match labels.as_object() {
            Some(labels) => {
                for (key, value) in labels {
                    if !valid_key(key) {
                        causes.push(Cause::new("FieldValueInvalid", "metadata.labels", format!("{key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
                    }
                    match value.as_str() {
                        Some(v) if valid_value(v) => {}
                        _ => causes.push(Cause::new("FieldValueInvalid", "metadata.labels", format!("{value}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))),
                    }
                }
            }
            None => causes.push(Cause::new(
                "FieldValueTypeInvalid",
                "metadata.labels",
                "must be a map of strings",
            )),
        }
    }
    if let Some(annotations) = meta.get("annotations").filter(|v| !v.is_null()) {
        match annotations.as_object() {
            Some(annotations) => {
                for (key, value) in annotations {
                    if !valid_key(key) {
                        causes.push(Cause::new("FieldValueInvalid", "metadata.annotations", format!("{key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
                    }
                    if !value.is_string() {
                        causes.push(Cause::new(
                            "FieldValueTypeInvalid",
                            format!("metadata.annotations.{key}"),
                            "must be a string",
                        ));
                    }
                }
                let size: usize = annotations
                    .iter()
                    .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                    .sum();
                if size > 256 * 1024 {
                    causes.push(Cause::new(
                        "FieldValueTooLong",
                        "metadata.annotations",
                        format!("Too long: must have at most 262144 bytes, got {size}"),
                    ));
                }
            }
            None => causes.push(Cause::new(
                "FieldValueTypeInvalid",
                "metadata.annotations",
                "must be a map of strings",
            )),
        }
    }
    if let Some(finalizers) = meta.get("finalizers").filter(|v| !v.is_null()) {
        match finalizers.as_array() {
            Some(list) => {
                for finalizer in list {
                    if !finalizer.as_str().is_some_and(valid_finalizer) {
                        causes.push(Cause::new("FieldValueInvalid", "metadata.finalizers", format!("{finalizer}: a finalizer must be a qualified name (e.g. 'example.com/my-finalizer')")));
                    }
                }
            }
            None => causes.push(Cause::new(
                "FieldValueTypeInvalid",
                "metadata.finalizers",
                "must be a list of strings",
            )),
        }
    }
    if let Some(owners) = meta.get("ownerReferences").filter(|v| !v.is_null()) {
        match owners.as_array() {
            Some(list) => {
                for (i, owner) in list.iter().enumerate() {
                    for field in ["apiVersion", "kind", "name", "uid"] {
                        if owner[field].as_str().is_none_or(str::is_empty) {
                            causes.push(Cause::new(
                                "FieldValueRequired",
                                format!("metadata.ownerReferences[{i}].{field}"),
                                format!("{field} must not be empty"),
                            ));
                        }
                    }
                }
                let controllers = list
                    .iter()
                    .filter(|o| o["controller"] == Value::Bool(true))
                    .count();
                if controllers > 1 {
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        "metadata.ownerReferences",
                        "Only one reference can have Controller set to true",
                    ));
                }
            }
            None => causes.push(Cause::new(
                "FieldValueTypeInvalid",
                "metadata.ownerReferences",
                "must be a list of owner references",
            )),
        }
    }
    causes
}

/// Finalizers are qualified names (`example.com/name`), or one of the well-known bare ones.
fn valid_finalizer(finalizer: &str) -> bool {
    const BARE: [&str; 3] = ["orphan", "foregroundDeletion", "kubernetes"];
    if BARE.contains(&finalizer) {
        return true;
    }
    let (prefix, name) = match finalizer.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, finalizer),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && valid_value(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subdomain_names_accept_dots_and_reject_uppercase() {
        assert!(is_dns_subdomain("widgets.example.com"));
        assert!(is_dns_subdomain("a-1"));
        assert!(!is_dns_subdomain("Widget"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain(""));
    }

    #[test]
    fn labels_reject_dots() {
        assert!(is_dns_label("kube-system"));
        assert!(!is_dns_label("a.b"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }

    #[test]
    fn kopf_finalizer_and_annotations_are_valid() {
        let object = json!({"metadata": {
            "name": "w1",
            "finalizers": ["kopf.zalando.org/KopfFinalizerMarker"],
            "annotations": {"kopf.zalando.org/last-handled-configuration": "{}"},
            "labels": {"app": "web"}
        }});
        assert!(validate_metadata(&object, NameRule::Subdomain).is_empty());
    }

    #[test]
    fn bad_labels_and_non_string_annotations_are_causes() {
        let object = json!({"metadata": {"name": "w1", "labels": {"a": "has space"}, "annotations": {"b": 1}}});
        let causes = validate_metadata(&object, NameRule::Subdomain);
        assert_eq!(causes.len(), 2);
    }
}
