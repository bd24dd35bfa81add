//! The OpenAPI v3 schemas of the built-in kinds, made from the upstream `.proto` files that
//! `protobuf` decodes bodies with: the same fields, their types, the API's documentation from the
//! files' comments, and the markers among those comments that clients read (`+patchMergeKey`,
//! `+patchStrategy`, `+listType`, `+listMapKey`, `+mapType`, `+structType`, `+required`) as the
//! `x-kubernetes-*` extensions kube-openapi gives them. This is what `kubectl explain` reads.
//!
//! The definitions are named as on a real server (`io.k8s.api.core.v1.ConfigMap`). What the `.proto`
//! files cannot say is left out: most `required` lists (a real server derives them from Go's
//! `omitempty`, which the files do not carry; only `+required` is read), enums and defaults.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{json, Map, Value};

use crate::protobuf;

/// The definitions a built-in kind's schema needs, the kind's own first; None for a kind without
/// a vendored `.proto` (its schema stays an open object).
pub fn schemas(group: &str, version: &str, kind: &str) -> Option<(String, Map<String, Value>)> {
    // Made once per kind: they never change, and every `/openapi/v3` request hashes the documents.
    type Cache = Mutex<HashMap<String, Option<(String, Map<String, Value>)>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = format!("{group}/{version}/{kind}");
    let cache = CACHE.get_or_init(Cache::default);
    if let Some(known) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return known.clone();
    }
    let made = make(group, version, kind);
    cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, made.clone());
    made
}

fn make(group: &str, version: &str, kind: &str) -> Option<(String, Map<String, Value>)> {
    let api_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let message = protobuf::descriptor_of(&api_version, kind).ok()?;
    let mut definitions = Map::new();
    let root = define(&message, &mut definitions);
    if let Some(schema) = definitions.get_mut(&root) {
        schema["x-kubernetes-group-version-kind"] =
            json!([{"group": group, "version": version, "kind": kind}]);
        // A kind's type fields are not in its message (they are the envelope's).
        schema["properties"]["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"});
        schema["properties"]["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"});
    }
    Some((root, definitions))
}

/// `k8s.io.api.core.v1.ConfigMap` is `io.k8s.api.core.v1.ConfigMap`, as kube-openapi names it.
fn definition_name(message: &MessageDescriptor) -> String {
    let full = message.full_name();
    match full.strip_prefix("k8s.io.") {
        Some(rest) => format!("io.k8s.{rest}"),
        None => full.to_owned(),
    }
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// Adds the message's definition, and those it refers to; its name.
fn define(message: &MessageDescriptor, definitions: &mut Map<String, Value>) -> String {
    let name = definition_name(message);
    if definitions.contains_key(&name) {
        return name;
    }
    // A placeholder first: the schemas refer to themselves (JSONSchemaProps does).
    definitions.insert(name.clone(), Value::Null);
    let (text, markers) = comment(message.parent_file().name(), message.path());
    let mut schema = special(message.full_name()).unwrap_or_else(|| object(message, definitions));
    if !text.is_empty() {
        schema["description"] = Value::String(text);
    }
    for marker in &markers {
        if let Some(kind) = marker.strip_prefix("structType=") {
            schema["x-kubernetes-map-type"] = Value::String(kind.to_owned());
        }
    }
    definitions.insert(name.clone(), schema);
    name
}

/// Kubernetes' special messages, which are strings, numbers or raw JSON in JSON.
fn special(full_name: &str) -> Option<Value> {
    let (package, name) = full_name.rsplit_once('.')?;
    Some(match (package, name) {
        ("k8s.io.apimachinery.pkg.apis.meta.v1", "Time" | "MicroTime") => {
            json!({"type": "string", "format": "date-time"})
        }
        ("k8s.io.apimachinery.pkg.apis.meta.v1", "Duration") => json!({"type": "string"}),
        ("k8s.io.apimachinery.pkg.util.intstr", "IntOrString") => {
            json!({"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]})
        }
        ("k8s.io.apimachinery.pkg.api.resource", "Quantity") => {
            json!({"oneOf": [{"type": "string"}, {"type": "number"}]})
        }
        ("k8s.io.apimachinery.pkg.runtime", "RawExtension")
        | ("k8s.io.apimachinery.pkg.apis.meta.v1", "FieldsV1") => json!({"type": "object"}),
        _ => return None,
    })
}

/// An ordinary message: an object with a property per field (the members of inline ones on it).
fn object(message: &MessageDescriptor, definitions: &mut Map<String, Value>) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for field in message.fields() {
        if protobuf::is_inline(message.name(), field.name()) {
            if let Kind::Message(inner) = field.kind() {
                let mut embedded = object(&inner, definitions);
                if let Value::Object(members) = embedded["properties"].take() {
                    properties.extend(members);
                }
                continue;
            }
        }
        let name = protobuf::json_name(field.name());
        let (text, markers) = comment(field.parent_file().name(), field.path());
        let mut schema = field_schema(&field, definitions);
        if !text.is_empty() {
            schema["description"] = Value::String(text);
        }
        let mut map_keys = Vec::new();
        for marker in &markers {
            let (key, value) = marker.split_once('=').unwrap_or((marker.as_str(), ""));
            match key {
                "patchMergeKey" => schema["x-kubernetes-patch-merge-key"] = json!(value),
                "patchStrategy" => schema["x-kubernetes-patch-strategy"] = json!(value),
                "listType" => schema["x-kubernetes-list-type"] = json!(value),
                "listMapKey" => map_keys.push(value.to_owned()),
                "mapType" => schema["x-kubernetes-map-type"] = json!(value),
                "required" | "k8s:required" => required.push(name.clone()),
                _ => {}
            }
        }
        if !map_keys.is_empty() {
            schema["x-kubernetes-list-map-keys"] = json!(map_keys);
        }
        properties.insert(name, schema);
    }
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// A field's schema: its type, an array of it, or a map of it.
fn field_schema(field: &FieldDescriptor, definitions: &mut Map<String, Value>) -> Value {
    if field.is_map() {
        if let Kind::Message(entry) = field.kind() {
            let value = entry.map_entry_value_field();
            return json!({"type": "object", "additionalProperties": single(&value.kind(), definitions)});
        }
    }
    let item = single(&field.kind(), definitions);
    if field.is_list() {
        return json!({"type": "array", "items": item});
    }
    match item.get("$ref") {
        // OpenAPI 3.0 ignores what stands beside a `$ref`: kube-openapi wraps it in an allOf.
        Some(_) => json!({"allOf": [item]}),
        None => item,
    }
}

fn single(kind: &Kind, definitions: &mut Map<String, Value>) -> Value {
    match kind {
        Kind::String => json!({"type": "string"}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 | Kind::Uint32 | Kind::Fixed32 => {
            json!({"type": "integer", "format": "int32"})
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64 => {
            json!({"type": "integer", "format": "int64"})
        }
        Kind::Double | Kind::Float => json!({"type": "number", "format": "double"}),
        Kind::Bytes => json!({"type": "string", "format": "byte"}),
        Kind::Enum(_) => json!({"type": "string"}),
        Kind::Message(message) => reference(&define(message, definitions)),
    }
}

/// The comment above a message or field: its text (paragraphs of joined lines) and its `+markers`.
fn comment(file: &str, path: &[i32]) -> (String, Vec<String>) {
    static COMMENTS: OnceLock<HashMap<(String, Vec<i32>), String>> = OnceLock::new();
    let comments = COMMENTS.get_or_init(|| {
        let mut all = HashMap::new();
        for file in protobuf::pool().files() {
            let proto = file.file_descriptor_proto();
            let Some(info) = &proto.source_code_info else {
                continue;
            };
            for location in &info.location {
                if let Some(text) = &location.leading_comments {
                    all.insert(
                        (file.name().to_owned(), location.path.clone()),
                        text.clone(),
                    );
                }
            }
        }
        all
    });
    let Some(raw) = comments.get(&(file.to_owned(), path.to_vec())) else {
        return (String::new(), Vec::new());
    };
    let (mut paragraphs, mut markers) = (vec![String::new()], Vec::new());
    for line in raw.lines().map(str::trim) {
        if let Some(marker) = line.strip_prefix('+') {
            markers.push(marker.to_owned());
        } else if line.is_empty() {
            if !paragraphs.last().is_some_and(String::is_empty) {
                paragraphs.push(String::new());
            }
        } else {
            let paragraph = paragraphs.last_mut().expect("one at least");
            if !paragraph.is_empty() {
                paragraph.push(' ');
            }
            paragraph.push_str(line);
        }
    }
    let text = paragraphs
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    (text, markers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn property<'a>(
        definitions: &'a Map<String, Value>,
        definition: &str,
        field: &str,
    ) -> &'a Value {
        &definitions[definition]["properties"][field]
    }

    #[test]
    fn a_config_map_is_described_with_its_fields_and_documentation() {
        let (root, definitions) = schemas("", "v1", "ConfigMap").unwrap();
        assert_eq!(root, "io.k8s.api.core.v1.ConfigMap");
        let config_map = &definitions[&root];
        assert_eq!(
            config_map["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "ConfigMap"}])
        );
        assert!(config_map["description"]
            .as_str()
            .unwrap()
            .starts_with("ConfigMap holds configuration data"));
        let data = property(&definitions, &root, "data");
        assert_eq!(data["type"], "object");
        assert_eq!(data["additionalProperties"], json!({"type": "string"}));
        assert_eq!(
            property(&definitions, &root, "binaryData")["additionalProperties"]["format"],
            "byte"
        );
        assert_eq!(property(&definitions, &root, "kind")["type"], "string");
        let metadata = property(&definitions, &root, "metadata");
        assert_eq!(
            metadata["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        let meta = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
        assert_eq!(
            property(&definitions, meta, "creationTimestamp")["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Time"
        );
        assert_eq!(
            definitions["io.k8s.apimachinery.pkg.apis.meta.v1.Time"]["format"],
            "date-time"
        );
        // Markers are extensions, not documentation.
        let descriptions = serde_json::to_string(&definitions).unwrap();
        assert!(
            !descriptions.contains("+optional"),
            "markers left in the descriptions"
        );
    }

    #[test]
    fn a_deployment_carries_the_patch_markers_and_inline_members() {
        let (root, definitions) = schemas("apps", "v1", "Deployment").unwrap();
        assert_eq!(root, "io.k8s.api.apps.v1.Deployment");
        let pod = "io.k8s.api.core.v1.PodSpec";
        let containers = property(&definitions, pod, "containers");
        assert_eq!(containers["type"], "array");
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        assert_eq!(containers["x-kubernetes-list-type"], "map");
        assert_eq!(containers["x-kubernetes-list-map-keys"], json!(["name"]));
        assert!(
            property(&definitions, "io.k8s.api.core.v1.Container", "image")["description"]
                .as_str()
                .unwrap()
                .contains("Container image name")
        );
        // A volume's sources are its own members, as in its JSON.
        let volume = &definitions["io.k8s.api.core.v1.Volume"]["properties"];
        assert!(
            volume.get("emptyDir").is_some() && volume.get("volumeSource").is_none(),
            "{volume}"
        );
        let surge = property(
            &definitions,
            "io.k8s.api.apps.v1.RollingUpdateDeployment",
            "maxSurge",
        );
        assert_eq!(
            surge["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.util.intstr.IntOrString"
        );
        // Every reference resolves in the same set.
        let text = serde_json::to_string(&definitions).unwrap();
        for reference in text.split("#/components/schemas/").skip(1) {
            let name = &reference[..reference.find('"').unwrap()];
            assert!(
                definitions.contains_key(name),
                "{name} is referred to but not defined"
            );
        }
    }

    #[test]
    fn kinds_without_a_proto_have_none() {
        assert!(schemas("example.com", "v1", "Widget").is_none());
        assert!(schemas("", "v1", "Gadget").is_none());
    }
}
