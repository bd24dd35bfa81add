//! Structural schemas of custom resources: defaulting, pruning and validation of every write.
//!
//! As the API server does with a CRD's `openAPIV3Schema`: fields the schema does not declare are
//! dropped (unless `x-kubernetes-preserve-unknown-fields` or `additionalProperties` keeps them),
//! `default`s fill missing fields, and types, `required`, `enum`, `nullable`, `minimum`/`maximum`,
//! `minLength`/`maxLength` and `minItems`/`maxItems` are checked, each failure a cause of one 422.
//! This is what surprises operator authors on real clusters (a handler's result written to a status
//! the schema does not declare silently disappears), so the emulator does it too.
//! Not covered: `pattern`, `format`, CEL rules (`x-kubernetes-validations`), list-type uniqueness.

use serde_json::{Map, Value};

use crate::registry::ResourceType;
use crate::status::{ApiError, ApiResult, Cause};

/// What a walk over an object found wrong with it.
#[derive(Default)]
struct Found {
    /// Invalid values: a 422.
    causes: Vec<Cause>,
    /// Fields the schema does not declare (pruned; an error under `fieldValidation=Strict`).
    unknown: Vec<String>,
}

/// Defaults, prunes and validates a custom resource in place. With `strict`, a field the schema does
/// not declare is a 400, as with `fieldValidation=Strict` (kubectl's default); otherwise it is dropped.
pub fn prune_and_validate(
    rtype: &ResourceType,
    schema: &Value,
    object: &mut Value,
    strict: bool,
) -> ApiResult<()> {
    let mut found = Found::default();
    if let Some(map) = object.as_object_mut() {
        walk_object(schema, map, "", true, &mut found);
    }
    if strict && !found.unknown.is_empty() {
        let fields: Vec<String> = found
            .unknown
            .iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect();
        return Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
            fields.join(", "),
            kind = rtype.kind,
            version = rtype.storage_version,
        )));
    }
    if found.causes.is_empty() {
        Ok(())
    } else {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Err(ApiError::invalid(
            &rtype.group,
            &rtype.kind,
            name,
            found.causes,
        ))
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn walk_object(
    schema: &Value,
    map: &mut Map<String, Value>,
    path: &str,
    root: bool,
    found: &mut Found,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(properties) = properties {
        for (key, property) in properties {
            if !map.contains_key(key) {
                if let Some(default) = property.get("default") {
                    map.insert(key.clone(), default.clone());
                }
            }
        }
    }
    let embedded = root || schema["x-kubernetes-embedded-resource"] == Value::Bool(true);
    let additional = schema.get("additionalProperties");
    let mut pruned = Vec::new();
    for (key, value) in map.iter_mut() {
        if embedded && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let field = join(path, key);
        match properties.and_then(|p| p.get(key)) {
            Some(property) => walk(property, value, &field, found),
            None => match additional {
                Some(Value::Bool(true)) => {}
                Some(additional @ Value::Object(_)) => walk(additional, value, &field, found),
                _ if preserves_unknown(schema) => {}
                _ => {
                    found.unknown.push(field);
                    pruned.push(key.clone());
                }
            },
        }
    }
    for key in pruned {
        map.remove(&key);
    }
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(required) {
            found.causes.push(Cause::new(
                "FieldValueRequired",
                join(path, required),
                "Required value",
            ));
        }
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one arm per OpenAPI schema keyword, as the API server walks them"
)]
fn walk(schema: &Value, value: &mut Value, path: &str, found: &mut Found) {
    if value.is_null() {
        if schema["nullable"] != Value::Bool(true) && schema.get("type").is_some() {
            // The API server drops nulls of non-nullable fields instead of failing (pruning of nulls).
            found.causes.push(Cause::new(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"null\": {path} in body must be of type {}",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"] == Value::Bool(true);
    let type_ = schema["type"].as_str().unwrap_or_default();
    let type_ok = match type_ {
        _ if int_or_string => value.is_string() || value.is_i64() || value.is_u64(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    };
    if !type_ok {
        found.causes.push(Cause::new(
            "FieldValueTypeInvalid",
            path,
            format!(
                "Invalid value: {}: {path} in body must be of type {type_}",
                short(value)
            ),
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            let supported: Vec<String> = options.iter().map(short).collect();
            found.causes.push(Cause::new(
                "FieldValueNotSupported",
                path,
                format!(
                    "Unsupported value: {}: supported values: {}",
                    short(value),
                    supported.join(", ")
                ),
            ));
        }
    }
    if let Some(number) = value.as_f64() {
        if schema["minimum"].as_f64().is_some_and(|min| number < min) {
            found.causes.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {number}: {path} in body should be greater than or equal to {}",
                    schema["minimum"]
                ),
            ));
        }
        if schema["maximum"].as_f64().is_some_and(|max| number > max) {
            found.causes.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {number}: {path} in body should be less than or equal to {}",
                    schema["maximum"]
                ),
            ));
        }
    }
    if let Some(text) = value.as_str() {
        if let Some(pattern) = schema["pattern"].as_str() {
            match compiled(pattern) {
                Some(regex) if !regex.is_match(text) => found.causes.push(Cause::new(
                    "FieldValueInvalid",
                    path,
                    format!(
                        "Invalid value: {}: {path} in body should match '{pattern}'",
                        short(value)
                    ),
                )),
                // A pattern the CRD's own validation would have refused: nothing to hold values to.
                Some(_) | None => {}
            }
        }
        let length = text.chars().count() as u64;
        if schema["minLength"].as_u64().is_some_and(|min| length < min) {
            found.causes.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!(
                    "{path} in body should be at least {} chars long",
                    schema["minLength"]
                ),
            ));
        }
        if schema["maxLength"].as_u64().is_some_and(|max| length > max) {
            found.causes.push(Cause::new(
                "FieldValueTooLong",
                path,
                format!(
                    "{path} in body may not be longer than {}",
                    schema["maxLength"]
                ),
            ));
        }
    }
    match value {
        Value::Object(map) if !int_or_string => walk_object(schema, map, path, false, found),
        Value::Array(items) => {
            let count = items.len() as u64;
            if schema["minItems"].as_u64().is_some_and(|min| count < min) {
                found.causes.push(Cause::new(
                    "FieldValueInvalid",
                    path,
                    format!(
                        "{path} in body should have at least {} items",
                        schema["minItems"]
                    ),
                ));
            }
            if schema["maxItems"].as_u64().is_some_and(|max| count > max) {
                found.causes.push(Cause::new(
                    "FieldValueTooMany",
                    path,
                    format!(
                        "{path} in body should have at most {} items",
                        schema["maxItems"]
                    ),
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), found);
                }
            }
        }
        _ => {}
    }
}

/// A schema's `pattern`, compiled once (None: not a regular expression).
fn compiled(pattern: &str) -> Option<regex::Regex> {
    static CACHE: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, Option<regex::Regex>>>,
    > = std::sync::OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    cache
        .entry(pattern.to_string())
        .or_insert_with(|| regex::Regex::new(pattern).ok())
        .clone()
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 64 {
        format!(
            "{}...",
            &text[..text
                .char_indices()
                .take_while(|(i, _)| *i < 61)
                .last()
                .map_or(0, |(i, c)| i + c.len_utf8())]
        )
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rtype() -> ResourceType {
        let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"}, "versions": [{"name": "v1", "served": true, "storage": true}]}});
        crate::registry::from_crd(&crd).unwrap()
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 0},
                "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            }},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        }})
    }

    #[test]
    fn undeclared_fields_are_pruned_and_defaults_filled() {
        let mut object = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 1, "extra": true, "labels": {"a": "b"}}, "junk": 1, "status": {"anything": {"goes": 1}}});
        prune_and_validate(&rtype(), &schema(), &mut object, false).unwrap();
        assert_eq!(
            object["spec"],
            json!({"size": 1, "mode": "fast", "labels": {"a": "b"}})
        );
        assert!(object.get("junk").is_none());
        assert_eq!(object["status"]["anything"]["goes"], 1);
        assert_eq!(object["metadata"]["name"], "w");
    }

    #[test]
    fn strict_field_validation_rejects_undeclared_fields() {
        let mut object =
            json!({"metadata": {"name": "w"}, "spec": {"size": 1, "colour": "red"}, "extra": 1});
        let error = prune_and_validate(&rtype(), &schema(), &mut object, true).unwrap_err();
        assert_eq!(error.code, 400);
        assert!(
            error.message.contains(
                "strict decoding error: unknown field \"extra\", unknown field \"spec.colour\""
            ),
            "{}",
            error.message
        );
    }

    #[test]
    fn wrong_types_enums_minimums_and_missing_required_fields_are_invalid() {
        let mut object = json!({"metadata": {"name": "w"}, "spec": {"size": -1, "mode": "medium"}});
        let error = prune_and_validate(&rtype(), &schema(), &mut object, false).unwrap_err();
        assert_eq!(error.code, 422);
        assert!(error.message.contains("spec.size"), "{}", error.message);
        assert!(error.message.contains("spec.mode"), "{}", error.message);
        let mut object = json!({"metadata": {"name": "w"}, "spec": {"size": "three"}});
        assert!(prune_and_validate(&rtype(), &schema(), &mut object, false)
            .unwrap_err()
            .message
            .contains("must be of type integer"));
        let mut object = json!({"metadata": {"name": "w"}, "spec": {}});
        assert!(prune_and_validate(&rtype(), &schema(), &mut object, false)
            .unwrap_err()
            .message
            .contains("spec.size: Required value"));
    }
}
