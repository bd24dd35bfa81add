//! Label and field selectors, parsed and matched as the API server does.
//!
//! Label selectors take both syntaxes: equality (`a=b`, `a==b`, `a!=b`) and set-based (`a in (x,y)`,
//! `a notin (x)`, `a`, `!a`), comma-separated and all required. Field selectors take `metadata.name`
//! and `metadata.namespace` for every resource, plus the extra fields some kinds index (events' involved
//! object, pods' node and phase, secrets' type); anything else is a 400, as in the API server.

use serde_json::Value;

use crate::status::{ApiError, ApiResult};
use crate::validation::{valid_key, valid_value};

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed `labelSelector`. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the query-parameter form.
    pub fn parse(text: &str) -> ApiResult<Self> {
        let mut requirements = Vec::new();
        for term in split_terms(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_term(term).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unable to parse requirement: invalid label selector: {term:?}"
                ))
            })?);
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether the selector is empty (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        if self.requirements.is_empty() {
            return true;
        }
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements
            .iter()
            .all(|requirement| match requirement {
                Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
                Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
                Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
                Requirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
                Requirement::Exists(k) => get(k).is_some(),
                Requirement::DoesNotExist(k) => get(k).is_none(),
            })
    }
}

/// Splits at commas that are not inside a `( ... )` value set.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

fn parse_term(term: &str) -> Option<Requirement> {
    if let Some(key) = term.strip_prefix('!') {
        return valid_key(key.trim()).then(|| Requirement::DoesNotExist(key.trim().to_string()));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return pair(key, value).map(|(k, v)| Requirement::NotEquals(k, v));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return pair(key, value).map(|(k, v)| Requirement::Equals(k, v));
    }
    for (operator, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = term.split_once(operator) {
            let key = key.trim();
            let set = set.trim().strip_prefix('(')?.strip_suffix(')')?;
            let values: Vec<String> = set.split(',').map(|v| v.trim().to_string()).collect();
            if !valid_key(key) || !values.iter().all(|v| valid_value(v)) {
                return None;
            }
            return Some(if negated {
                Requirement::NotIn(key.to_string(), values)
            } else {
                Requirement::In(key.to_string(), values)
            });
        }
    }
    valid_key(term).then(|| Requirement::Exists(term.to_string()))
}

fn pair(key: &str, value: &str) -> Option<(String, String)> {
    let (key, value) = (key.trim(), value.trim());
    (valid_key(key) && valid_value(value)).then(|| (key.to_string(), value.to_string()))
}

/// A parsed `fieldSelector`: `field=value`, `field==value` and `field!=value`, all required.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    requirements: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the query-parameter form, accepting only the fields `kind` (a plural) indexes.
    pub fn parse(text: &str, group: &str, plural: &str) -> ApiResult<Self> {
        let mut requirements = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !supported_field(group, plural, field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            requirements.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether the selector is empty (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object satisfies every requirement. A missing field reads as the empty string.
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(field, equal, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

fn supported_field(group: &str, plural: &str, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    let extra: &[&str] = match (group, plural) {
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "events") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "type",
        ],
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        _ => &[],
    };
    extra.contains(&field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "namespace": "ns1", "labels": labels}})
    }

    #[test]
    fn equality_selectors_match_label_values() {
        let selector = LabelSelector::parse("app=web,tier==front,env!=prod").unwrap();
        assert!(selector.matches(&labelled(json!({"app": "web", "tier": "front"}))));
        assert!(!selector.matches(&labelled(
            json!({"app": "web", "tier": "front", "env": "prod"})
        )));
        assert!(!selector.matches(&labelled(json!({"app": "db", "tier": "front"}))));
    }

    #[test]
    fn set_based_selectors_match_membership_and_existence() {
        let selector =
            LabelSelector::parse("env in (dev, qa),tier notin (back),app,!legacy").unwrap();
        assert!(selector.matches(&labelled(json!({"env": "qa", "app": "x"}))));
        assert!(!selector.matches(&labelled(json!({"env": "prod", "app": "x"}))));
        assert!(!selector.matches(&labelled(json!({"env": "qa", "app": "x", "tier": "back"}))));
        assert!(!selector.matches(&labelled(json!({"env": "qa", "app": "x", "legacy": "1"}))));
        assert!(!selector.matches(&labelled(json!({"env": "qa"}))));
    }

    #[test]
    fn notin_matches_objects_without_the_label() {
        let selector = LabelSelector::parse("tier notin (back)").unwrap();
        assert!(selector.matches(&json!({"metadata": {"name": "x"}})));
    }

    #[test]
    fn malformed_label_selectors_are_rejected() {
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
        assert!(LabelSelector::parse("=x").is_err());
    }

    #[test]
    fn field_selectors_match_name_and_namespace_and_reject_unknown_fields() {
        let selector = FieldSelector::parse(
            "metadata.name=x,metadata.namespace!=other",
            "",
            "configmaps",
        )
        .unwrap();
        assert!(selector.matches(&labelled(json!({}))));
        assert!(FieldSelector::parse("spec.size=3", "example.com", "widgets").is_err());
        let events = FieldSelector::parse("involvedObject.name=x", "", "events").unwrap();
        assert!(events.matches(&json!({"involvedObject": {"name": "x"}})));
    }
}
