//! Server-side printing: the `meta.k8s.io/v1` `Table` that `kubectl get` asks for.
//!
//! Columns are `Name`, the CRD's `additionalPrinterColumns` (simple `.a.b[0]` JSONPaths), and `Age`
//! when the CRD declares no columns of its own, as the API server prints custom resources.

use serde_json::{json, Value};

use crate::registry::ResourceType;

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// Whether an `Accept` header asks for `PartialObjectMetadata` (or its list): the objects' metadata
/// alone, as kube-rs's `list_metadata` and `watch_metadata` and controller-runtime's metadata-only
/// informers ask.
pub fn wants_metadata(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=PartialObjectMetadata"))
}

/// An object as `meta.k8s.io/v1` `PartialObjectMetadata`: its metadata alone.
pub fn partial_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object["metadata"],
    })
}

/// What a row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Include {
    /// Nothing.
    None,
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

impl Include {
    /// From the `includeObject` query parameter.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => Include::None,
            Some("Object") => Include::Object,
            _ => Include::Metadata,
        }
    }
}

fn columns(rtype: &ResourceType, version: &str) -> Vec<(String, String, String, String, i64)> {
    let custom = rtype
        .version(version)
        .map(|v| v.columns.clone())
        .unwrap_or_default();
    let mut columns = vec![(
        "Name".to_string(),
        "string".to_string(),
        "name".to_string(),
        ".metadata.name".to_string(),
        0,
    )];
    if custom.is_empty() {
        columns.push((
            "Age".into(),
            "date".into(),
            String::new(),
            ".metadata.creationTimestamp".into(),
            0,
        ));
    }
    for c in custom {
        columns.push((c.name, c.type_, c.format, c.json_path, c.priority));
    }
    columns
}

/// A Table of these objects.
pub fn table(
    rtype: &ResourceType,
    version: &str,
    objects: &[&Value],
    rv: &str,
    continue_token: Option<&str>,
    include: Include,
) -> Value {
    let columns = columns(rtype, version);
    let definitions: Vec<Value> = columns
        .iter()
        .map(|(name, type_, format, _, priority)| {
            json!({"name": name, "type": if type_ == "date" { "string" } else { type_ }, "format": format, "description": name, "priority": priority})
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let cells: Vec<Value> = columns
                .iter()
                .map(|(_, type_, _, path, _)| {
                    let value = jsonpath(object, path).cloned().unwrap_or(Value::Null);
                    if type_ == "date" {
                        value
                            .as_str()
                            .map(age)
                            .map(Value::String)
                            .unwrap_or(Value::Null)
                    } else {
                        value
                    }
                })
                .collect();
            let mut row = json!({"cells": cells});
            match include {
                Include::None => {}
                Include::Object => row["object"] = (*object).clone(),
                Include::Metadata => row["object"] = partial_metadata(object),
            }
            row
        })
        .collect();
    let mut metadata = json!({"resourceVersion": rv});
    if let Some(token) = continue_token {
        metadata["continue"] = json!(token);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": definitions, "rows": rows})
}

/// Evaluates a simple JSONPath: `.a.b`, `.a[0].b`, `.metadata.labels.app`.
fn jsonpath<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = object;
    for part in path
        .trim_start_matches('.')
        .split('.')
        .filter(|p| !p.is_empty())
    {
        let (name, index) = match part.split_once('[') {
            Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            current = current.get(name)?;
        }
        if let Some(i) = index {
            current = current.get(i)?;
        }
    }
    Some(current)
}

/// The age of a timestamp as kubectl prints it: `45s`, `3m10s`, `5h`, `2d3h`, `400d`.
pub fn age(timestamp: &str) -> String {
    let Ok(then) = timestamp.parse::<jiff::Timestamp>() else {
        return "<unknown>".to_string();
    };
    let seconds = (jiff::Timestamp::now().as_second() - then.as_second()).max(0);
    let (m, h, d) = (seconds / 60, seconds / 3600, seconds / 86400);
    match seconds {
        s if s < 120 => format!("{s}s"),
        _ if m < 10 => format!("{m}m{}s", seconds % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if d < 8 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_follows_fields_and_indexes() {
        let object = json!({"spec": {"size": 3, "items": [{"name": "a"}]}});
        assert_eq!(jsonpath(&object, ".spec.size"), Some(&json!(3)));
        assert_eq!(jsonpath(&object, ".spec.items[0].name"), Some(&json!("a")));
        assert_eq!(jsonpath(&object, ".spec.none"), None);
    }

    #[test]
    fn table_rows_have_a_cell_per_column() {
        let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"}, "versions": [{"name": "v1", "served": true, "storage": true,
            "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]}]}});
        let rtype = crate::registry::from_crd(&crd).unwrap();
        let object = json!({"metadata": {"name": "w1", "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"size": 2}});
        let table = table(&rtype, "v1", &[&object], "5", None, Include::Metadata);
        assert_eq!(table["rows"][0]["cells"], json!(["w1", 2]));
        assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn ages_print_as_kubectl_prints_them() {
        let long_ago = (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(50))
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        assert_eq!(age(&long_ago), "2d2h");
    }
}
