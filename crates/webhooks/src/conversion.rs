//! CRD conversion: the `ConversionReview` the API server sends to `<path>/convert` when it reads or
//! writes a custom resource in another version than the stored one, answered with the user's
//! conversion functions (controller-runtime has this; Kopf does not).
//!
//! **Expected flow**: each object of the request is converted from its version to the desired one
//! along the registered conversions (`v1 → v2`, or `v1 → v2 → v3` when no direct one is
//! registered: the shortest chain). After each step the object's `apiVersion` is the step's, and
//! its `metadata` the original's, except the labels and annotations the function set (the API
//! server refuses any other change of metadata).
//!
//! **Guarantees**: one object that cannot be converted fails the whole review with a message naming
//! it (the API server then fails the client's request, and stores nothing half-converted).

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use kactor_reactor::admission::ConversionHandler;
use kactor_reactor::execution::panic_message;
use kactor_reactor::resources::Resource;
use serde_json::{json, Value};

use crate::review::{request_of, BadReview};

/// A conversion with its resource resolved.
#[derive(Clone)]
pub struct Converter {
    /// The conversion.
    pub handler: ConversionHandler,
    /// The resource (any served version of it: group, kind and plural are what count).
    pub resource: Arc<Resource>,
}

impl Converter {
    /// The CRD's name: `<plural>.<group>`.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.resource.plural, self.resource.group)
    }
}

/// Answers one `ConversionReview`.
pub fn respond(converters: &[Converter], review: &Value) -> Result<Value, BadReview> {
    let (request, uid, api_version) = request_of(review, "apiextensions.k8s.io/v1")?;
    let desired = request
        .get("desiredAPIVersion")
        .and_then(Value::as_str)
        .ok_or(BadReview::Shape("no request.desiredAPIVersion"))?;
    let objects = request
        .get("objects")
        .and_then(Value::as_array)
        .ok_or(BadReview::Shape("no request.objects"))?;
    let converted: Result<Vec<Value>, String> = objects
        .iter()
        .map(|object| convert(converters, object, desired))
        .collect();
    let response = match converted {
        Ok(objects) => json!({
            "uid": uid,
            "convertedObjects": objects,
            "result": {"status": "Success"},
        }),
        Err(message) => {
            tracing::error!("A conversion failed: {message}");
            json!({
                "uid": uid,
                "convertedObjects": [],
                "result": {"status": "Failure", "message": message},
            })
        }
    };
    Ok(json!({
        "apiVersion": api_version,
        "kind": "ConversionReview",
        "response": response,
    }))
}

fn split(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// One object, to `desired` along the shortest chain of conversions.
fn convert(converters: &[Converter], object: &Value, desired: &str) -> Result<Value, String> {
    let name = object["metadata"]["name"].as_str().unwrap_or("?");
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, from) = split(api_version);
    let (desired_group, to) = split(desired);
    if group != desired_group {
        return Err(format!(
            "{kind} {name}: cannot convert {api_version} to another group, {desired}"
        ));
    }
    if from == to {
        return Ok(object.clone());
    }
    let edges: Vec<&Converter> = converters
        .iter()
        .filter(|c| c.resource.group == group && c.resource.kind == kind)
        .collect();
    let Some(path) = shortest_path(&edges, from, to) else {
        return Err(format!(
            "{kind} {name}: no conversion from {from} to {to} is registered"
        ));
    };
    let mut current = object.clone();
    for step in path {
        let input = current.clone();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| (step.handler.func)(input)))
            .map_err(|panic| panic_message(&panic))
            .and_then(|r| r.map_err(|e| e.to_string()));
        let mut output = result.map_err(|message| {
            format!(
                "{kind} {name}: the conversion from {} to {} failed: {message}",
                step.handler.from, step.handler.to
            )
        })?;
        if !output.is_object() {
            return Err(format!(
                "{kind} {name}: the conversion to {} gave no object",
                step.handler.to
            ));
        }
        output["apiVersion"] = json!(format!("{group}/{}", step.handler.to));
        output["kind"] = json!(kind);
        output["metadata"] = kept_metadata(&current["metadata"], &output["metadata"]);
        current = output;
    }
    Ok(current)
}

/// The original metadata, with the labels and annotations the conversion gave (if it gave any).
fn kept_metadata(original: &Value, converted: &Value) -> Value {
    let mut metadata = original.clone();
    for key in ["labels", "annotations"] {
        if let Some(value) = converted.get(key) {
            metadata[key] = value.clone();
        }
    }
    metadata
}

/// The shortest chain of conversions from `from` to `to` (breadth first).
fn shortest_path<'a>(edges: &[&'a Converter], from: &str, to: &str) -> Option<Vec<&'a Converter>> {
    let mut came: HashMap<&str, &'a Converter> = HashMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(version) = queue.pop_front() {
        if version == to {
            let mut path = Vec::new();
            let mut at = to;
            while at != from {
                let step = came[at];
                path.push(step);
                at = step.handler.from.as_str();
            }
            path.reverse();
            return Some(path);
        }
        for edge in edges.iter().filter(|e| e.handler.from == version) {
            let next = edge.handler.to.as_str();
            if next != from && !came.contains_key(next) {
                came.insert(next, edge);
                queue.push_back(next);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use kactor_reactor::admission::convert_fn;
    use kactor_reactor::handlers::HandlerError;
    use kactor_reactor::resources::Selector;

    fn converter(from: &str, to: &str, func: kactor_reactor::admission::ConvertFn) -> Converter {
        Converter {
            handler: ConversionHandler {
                selector: Selector::parse("widgets.example.com"),
                from: from.into(),
                to: to.into(),
                func,
            },
            resource: Arc::new(Resource::namespaced(
                "example.com",
                "v1",
                "Widget",
                "widgets",
            )),
        }
    }

    fn review(objects: Value, desired: &str) -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u1", "desiredAPIVersion": desired, "objects": objects},
        })
    }

    fn converters() -> Vec<Converter> {
        vec![
            // v1 {spec.size} -> v2 {spec.dimensions.size}, and back.
            converter(
                "v1",
                "v2",
                convert_fn(|mut o: Value| {
                    let size = o["spec"]["size"].take();
                    o["spec"] = json!({"dimensions": {"size": size}});
                    o["metadata"]["labels"]["converted"] = json!("yes");
                    o["metadata"]["name"] = json!("renamed, which is not kept");
                    Ok::<_, HandlerError>(o)
                }),
            ),
            converter(
                "v2",
                "v1",
                convert_fn(|mut o: Value| {
                    let size = o["spec"]["dimensions"]["size"].take();
                    o["spec"] = json!({"size": size});
                    Ok::<_, HandlerError>(o)
                }),
            ),
            converter(
                "v2",
                "v3",
                convert_fn(|mut o: Value| {
                    o["spec"]["v3"] = json!(true);
                    Ok::<_, HandlerError>(o)
                }),
            ),
        ]
    }

    fn widget(version: &str, spec: Value) -> Value {
        json!({
            "apiVersion": format!("example.com/{version}"), "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "default", "uid": "x", "labels": {"app": "demo"}},
            "spec": spec,
        })
    }

    #[test]
    fn objects_are_converted_along_the_shortest_chain_keeping_their_metadata() {
        let answer = respond(
            &converters(),
            &review(
                json!([widget("v1", json!({"size": 3})), widget("v3", json!({}))]),
                "example.com/v3",
            ),
        )
        .unwrap();
        let response = &answer["response"];
        assert_eq!(response["result"], json!({"status": "Success"}));
        let converted = &response["convertedObjects"][0];
        assert_eq!(converted["apiVersion"], "example.com/v3");
        assert_eq!(
            converted["spec"],
            json!({"dimensions": {"size": 3}, "v3": true})
        );
        assert_eq!(
            converted["metadata"]["name"], "w1",
            "only labels and annotations may change"
        );
        assert_eq!(
            converted["metadata"]["labels"],
            json!({"app": "demo", "converted": "yes"})
        );
        assert_eq!(
            response["convertedObjects"][1],
            widget("v3", json!({})),
            "already there"
        );
    }

    #[test]
    fn an_object_without_a_conversion_fails_the_review_naming_it() {
        let answer = respond(
            &converters(),
            &review(json!([widget("v3", json!({}))]), "example.com/v1"),
        )
        .unwrap();
        let response = &answer["response"];
        assert_eq!(response["result"]["status"], "Failure");
        assert_eq!(response["convertedObjects"], json!([]));
        let message = response["result"]["message"].as_str().unwrap();
        assert!(
            message.contains("Widget w1") && message.contains("from v3 to v1"),
            "{message}"
        );
    }
}
