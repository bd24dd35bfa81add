//! The OpenAPI documents clients read: `/openapi/v2` and `/openapi/v3` (root and per group-version).
//!
//! They describe every served kind's operations with the `x-kubernetes-group-version-kind` and
//! `x-kubernetes-action` extensions and the query parameters of each, which is what `kubectl` reads to
//! learn that the server validates fields itself (`fieldValidation`); schemas are the CRDs' own
//! `openAPIV3Schema`, and for built-in kinds, in v3, their real schemas made from the vendored
//! `.proto` files (`openapi_builtin`, what `kubectl explain` reads), or an open object in v2 and for
//! a built-in kind without a `.proto`.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::registry::ResourceType;

fn gvk(rtype: &ResourceType, version: &str) -> Value {
    json!({"group": rtype.group, "version": version, "kind": rtype.kind})
}

fn definition_name(rtype: &ResourceType, version: &str) -> String {
    let group = if rtype.group.is_empty() {
        "core".to_string()
    } else {
        rtype.group.split('.').rev().collect::<Vec<_>>().join(".")
    };
    format!("{group}.{version}.{}", rtype.kind)
}

fn schema_of(rtype: &ResourceType, version: &str) -> Value {
    let mut schema = rtype
        .version(version)
        .and_then(|v| v.schema.clone())
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    schema["x-kubernetes-group-version-kind"] = json!([gvk(rtype, version)]);
    schema
}

fn base_path(rtype: &ResourceType, version: &str) -> String {
    let prefix = if rtype.group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{}/{version}", rtype.group)
    };
    if rtype.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}", rtype.plural)
    } else {
        format!("{prefix}/{}", rtype.plural)
    }
}

/// The operations of one kind in one version, in the shape of either OpenAPI version.
fn paths(rtype: &ResourceType, version: &str, v3: bool, reference: &str) -> Vec<(String, Value)> {
    let query = |name: &str, kind: &str| -> Value {
        if v3 {
            json!({"name": name, "in": "query", "schema": {"type": kind}, "uniqueItems": true})
        } else {
            json!({"name": name, "in": "query", "type": kind, "uniqueItems": true})
        }
    };
    let path_param = |name: &str| -> Value {
        if v3 {
            json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}})
        } else {
            json!({"name": name, "in": "path", "required": true, "type": "string"})
        }
    };
    let response = |status: &str| -> Value {
        if v3 {
            json!({status: {"description": "OK", "content": {"application/json": {"schema": {"$ref": reference}}}}})
        } else {
            json!({status: {"description": "OK", "schema": {"$ref": reference}}})
        }
    };
    let writes = [
        query("dryRun", "string"),
        query("fieldManager", "string"),
        query("fieldValidation", "string"),
    ];
    let operation = |action: &str, extra: &[Value], status: &str| -> Value {
        let mut op = json!({
            "operationId": format!("{action}{}", rtype.kind),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk(rtype, version),
            "responses": response(status),
        });
        if !extra.is_empty() {
            op["parameters"] = Value::Array(extra.to_vec());
        }
        op
    };
    let body = if v3 {
        json!({"content": {"application/json": {"schema": {"$ref": reference}}}, "required": true})
    } else {
        Value::Null
    };
    let with_body = |mut op: Value| -> Value {
        if v3 {
            op["requestBody"] = body.clone();
        } else if let Some(params) = op["parameters"].as_array_mut() {
            params.push(json!({"name": "body", "in": "body", "required": true, "schema": {"$ref": reference}}));
        }
        op
    };
    let list_params = [
        query("labelSelector", "string"),
        query("fieldSelector", "string"),
        query("limit", "integer"),
        query("continue", "string"),
        query("resourceVersion", "string"),
        query("watch", "boolean"),
    ];
    let mut scope = Vec::new();
    if rtype.namespaced {
        scope.push(path_param("namespace"));
    }
    let collection = json!({
        "get": operation("list", &list_params, "200"),
        "post": with_body(operation("post", &writes, "201")),
        "delete": operation("deletecollection", &list_params, "200"),
        "parameters": scope,
    });
    let mut item_scope = scope.clone();
    item_scope.push(path_param("name"));
    let patch_params = [
        writes[0].clone(),
        writes[1].clone(),
        writes[2].clone(),
        query("force", "boolean"),
    ];
    let item = json!({
        "get": operation("get", &[], "200"),
        "put": with_body(operation("put", &writes, "200")),
        "patch": with_body(operation("patch", &patch_params, "200")),
        "delete": operation("delete", &[query("propagationPolicy", "string"), query("dryRun", "string")], "200"),
        "parameters": item_scope.clone(),
    });
    let base = base_path(rtype, version);
    let mut out = vec![
        (base.clone(), collection),
        (format!("{base}/{{name}}"), item.clone()),
    ];
    if rtype.version(version).is_some_and(|v| v.status) {
        let status = json!({
            "get": operation("get", &[], "200"),
            "put": with_body(operation("put", &writes, "200")),
            "patch": with_body(operation("patch", &patch_params, "200")),
            "parameters": item_scope,
        });
        out.push((format!("{base}/{{name}}/status"), status));
    }
    out
}

/// The Swagger 2.0 document of everything served.
pub fn v2(types: &[Arc<ResourceType>]) -> Value {
    let mut all_paths = Map::new();
    let mut definitions = Map::new();
    for rtype in types {
        for version in &rtype.versions {
            let name = definition_name(rtype, &version.name);
            definitions.insert(name.clone(), schema_of(rtype, &version.name));
            for (path, item) in paths(
                rtype,
                &version.name,
                false,
                &format!("#/definitions/{name}"),
            ) {
                all_paths.insert(path, item);
            }
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": crate::server::KUBERNETES_VERSION},
        "paths": all_paths,
        "definitions": definitions,
    })
}

fn group_version_key(rtype: &ResourceType, version: &str) -> String {
    if rtype.group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{}/{version}", rtype.group)
    }
}

fn hash(text: &str) -> String {
    format!("{:016X}", crate::registry::fnv1a(text))
}

/// The OpenAPI v3 root: one entry per group-version, with a URL that changes with its content.
pub fn v3_root(types: &[Arc<ResourceType>]) -> Value {
    let mut keys: Vec<String> = types
        .iter()
        .flat_map(|t| t.versions.iter().map(|v| group_version_key(t, &v.name)))
        .collect();
    keys.sort();
    keys.dedup();
    let mut paths = Map::new();
    for key in keys {
        let rest: Vec<&str> = key.split('/').collect();
        // The hash of the document without the built-in kinds' schemas: those are fixed for a
        // build (made from the vendored `.proto` files, named by the kinds in the paths), and
        // expanding every group-version's on each root request is most of the work.
        let content = v3_document(types, &rest, false)
            .map(|d| d.to_string())
            .unwrap_or_default();
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", hash(&content))}),
        );
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of one group-version (`["api", "v1"]` or `["apis", group, version]`).
pub fn v3_group_version(types: &[Arc<ResourceType>], rest: &[&str]) -> Option<Value> {
    v3_document(types, rest, true)
}

/// The v3 document of one group-version, with the built-in kinds' real schemas or (for hashing)
/// without them.
fn v3_document(types: &[Arc<ResourceType>], rest: &[&str], built_ins: bool) -> Option<Value> {
    let (group, version) = match rest {
        ["api", version] => ("", *version),
        ["apis", group, version] => (*group, *version),
        _ => return None,
    };
    let mut all_paths = Map::new();
    let mut schemas = Map::new();
    for rtype in types
        .iter()
        .filter(|t| t.group == group && t.version(version).is_some())
    {
        let built_in = rtype
            .version(version)
            .is_some_and(|v| built_ins && v.schema.is_none())
            .then(|| crate::openapi_builtin::schemas(group, version, &rtype.kind))
            .flatten();
        let name = match built_in {
            // A built-in kind with a vendored `.proto`: its real schema and those it refers to.
            Some((root, mut definitions)) => {
                // The kind's own definition wins over the same message reached from another kind
                // (which lacks the kind's type fields and group-version-kind).
                if let Some(own) = definitions.remove(&root) {
                    schemas.insert(root.clone(), own);
                }
                for (key, schema) in definitions {
                    schemas.entry(key).or_insert(schema);
                }
                root
            }
            None => {
                let name = definition_name(rtype, version);
                schemas.insert(name.clone(), schema_of(rtype, version));
                name
            }
        };
        for (path, item) in paths(
            rtype,
            version,
            true,
            &format!("#/components/schemas/{name}"),
        ) {
            all_paths.insert(path, item);
        }
    }
    if all_paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": crate::server::KUBERNETES_VERSION},
        "paths": all_paths,
        "components": {"schemas": schemas},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v3_patch_operations_declare_field_validation_for_their_kind() {
        let types = crate::registry::builtin_types();
        let doc = v3_group_version(&types, &["api", "v1"]).unwrap();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "ConfigMap"
        );
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation"));
        let root = v3_root(&types);
        assert!(root["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap()
            .starts_with("/openapi/v3/apis/apps/v1?hash="));
    }
}
