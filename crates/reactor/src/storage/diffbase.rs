//! The essence of an object (the part whose changes matter to handlers) and the diff-base: the
//! essence last handled, stored in the annotation `kopf.zalando.org/last-handled-configuration`
//! in the wire format of Kopf's default `AnnotationsDiffBaseStorage`.
//!
//! The cause of a change (create, update, resume, no-op) and the diff an update handler gets
//! are computed from the stored diff-base and the essence of the object as it is now.

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use serde_json::{Map, Value};

use crate::storage::progress::{annotation_path, store_marker, write_json, write_json_str};
use crate::structs::diffs::{cherrypick, ensure, remove, resolve};
use crate::structs::keys::{marked_prefixes, KeyForming};
use crate::structs::sharding::{DRAIN_LABEL_PREFIX, SHARD_LABEL_PREFIX};

/// Kubernetes' limit on the total size of an object's annotations (keys and values, in bytes).
pub const ANNOTATIONS_SIZE_LIMIT: usize = 256 * 1024;

/// The annotation that `kubectl apply` keeps; never part of the essence, as in Kopf.
/// The annotation (under the operator's prefix) that keeps, while a cause spans several cycles, the
/// essence the cause started from (what its first handlers saw), with each field handler's field as
/// that handler last saw it. When the cause is done, that essence becomes the diff-base, so a change that arrived meanwhile is a change after it (an update). A
/// kactor record: Kopf does not write it, leaves it alone, and keeps it out of the essence as every
/// annotation under its prefix.
pub const CAUSE_BASE_KEY: &str = "cause-base-configuration";

const KUBECTL_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The diff-base would not fit into the object's annotations.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the diff-base would make the object's annotations {size} bytes, over Kubernetes' limit of \
     {ANNOTATIONS_SIZE_LIMIT}; make the object smaller, or exclude the large fields from the \
     essence"
)]
pub struct DiffBaseTooLarge {
    /// The total size of all annotations (keys and values) with the diff-base stored.
    pub size: usize,
}

/// Where the diff-base is stored, as Kopf's default `AnnotationsDiffBaseStorage`: compact JSON
/// plus a newline under `<prefix>/last-handled-configuration` (and its V1 key if it differs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiffBaseStorage {
    /// The annotation keys (prefix, V1 keys).
    pub keys: KeyForming,
    /// The annotation's name (default `last-handled-configuration`, as in Kopf).
    pub key: String,
}

impl Default for DiffBaseStorage {
    /// As in Kopf: `kopf.zalando.org/last-handled-configuration`, V1 keys on.
    fn default() -> Self {
        Self {
            keys: KeyForming::default(),
            key: "last-handled-configuration".to_string(),
        }
    }
}

impl DiffBaseStorage {
    /// The essence of an object, as Kopf computes it for diffing and storing (the diff-base
    /// storage's `build`, then the default progress storage's `clear`):
    ///
    /// * `apiVersion`, `kind`, `status` and all of `metadata` except `labels` and `annotations`
    ///   are dropped;
    /// * of the annotations, these are dropped: `kubectl.kubernetes.io/last-applied-configuration`;
    ///   all under prefixes of Kopf-based operators (a prefix with a `<prefix>/kopf-managed` key,
    ///   `kopf.zalando.org`, or `*.kopf.zalando.org`); the diff-base keys; and all under our own
    ///   prefix (as the progress storage does);
    /// * `extra_fields` (the fields of field handlers, e.g. `status.x`) are copied back from the
    ///   object;
    /// * `status.kopf.progress` (the legacy progress) is dropped, and so are `metadata.labels`,
    ///   `metadata.annotations`, `metadata` and `status` when left empty.
    ///
    /// **Assumption:** the progress storage uses the same prefix and the default status field, as
    /// Kopf's defaults do.
    pub fn essence(&self, body: &DynamicObject, extra_fields: &[Vec<String>]) -> Value {
        // Built from the typed object's parts rather than from the whole object as JSON: the
        // metadata Kopf drops (managedFields above all) is never encoded, and the annotations
        // dropped below (the diff-base itself among them) are never copied.
        let mut essence: Map<String, Value> = match &body.data {
            Value::Object(data) => data
                .iter()
                .filter(|(key, _)| {
                    !matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status")
                })
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
            _ => Map::new(),
        };
        let mut metadata = Map::new();
        if let Some(labels) = &body.metadata.labels {
            metadata.insert("labels".to_string(), string_map(essential_labels(labels)));
        }
        if let Some(annotations) = &body.metadata.annotations {
            let mut ignored = marked_prefixes(annotations.keys().map(String::as_str));
            ignored.push(&self.keys.prefix);
            let kept = annotations
                .iter()
                .filter(|(key, _)| essential_annotation(key, &ignored));
            metadata.insert("annotations".to_string(), string_map(kept));
        }
        if !metadata.is_empty() {
            essence.insert("metadata".to_string(), Value::Object(metadata));
        }
        let mut essence = Value::Object(essence);

        if !extra_fields.is_empty() {
            if let Ok(body @ Value::Object(_)) = serde_json::to_value(body) {
                cherrypick(&body, &mut essence, extra_fields);
            }
        }
        remove_empty_stanzas(&mut essence);

        // What the diff-base storage's `build` adds: its own keys.
        let own_keys = self.keys.keys(&self.key);
        if let Some(annotations) = annotations_mut(&mut essence) {
            annotations.retain(|key, _| !own_keys.contains(key));
        }
        remove_empty_stanzas(&mut essence);

        // What the progress storage's `clear` adds: the whole own prefix, the legacy progress.
        let prefix = self.keys.prefix.as_str();
        if let Some(annotations) = annotations_mut(&mut essence) {
            annotations.retain(|key, _| !is_under(key, prefix));
        }
        remove_empty_stanzas(&mut essence);
        remove(&mut essence, &["status", "kopf", "progress"]);
        remove_empty_stanzas(&mut essence);

        essence
    }

    /// Whether `essence` is the essence of `body` ([`essence`](Self::essence) without extra
    /// fields), compared in place: nothing is copied. For the event of the operator's own last
    /// write, whose essence is nearly always the diff-base it just stored: the check that the
    /// write (and whatever a mutating webhook or another writer added to it) changed nothing
    /// that handlers see.
    pub fn matches(&self, body: &DynamicObject, essence: &Value) -> bool {
        let Value::Object(essence) = essence else {
            return false;
        };
        let mut fields = 0;
        if let Value::Object(data) = &body.data {
            for (key, value) in data {
                if matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
                    continue;
                }
                if essence.get(key) != Some(value) {
                    return false;
                }
                fields += 1;
            }
        }
        let metadata = match essence.get("metadata") {
            None => None,
            Some(Value::Object(metadata)) => Some(metadata),
            Some(_) => return false,
        };
        let stanza = |name: &str| match metadata.map(|m| m.get(name)) {
            None | Some(None) => Some(None),
            Some(Some(Value::Object(map))) => Some(Some(map)),
            Some(Some(_)) => None,
        };
        let (Some(labels), Some(annotations)) = (stanza("labels"), stanza("annotations")) else {
            return false;
        };
        let empty = BTreeMap::new();
        let body_labels = body.metadata.labels.as_ref().unwrap_or(&empty);
        if !same_strings(essential_labels(body_labels), labels) {
            return false;
        }
        let body_annotations = body.metadata.annotations.as_ref().unwrap_or(&empty);
        let mut ignored = marked_prefixes(body_annotations.keys().map(String::as_str));
        ignored.push(&self.keys.prefix);
        let own = self.keys.keys(&self.key);
        let kept = body_annotations.iter().filter(|(key, _)| {
            essential_annotation(key, &ignored) && !own.iter().any(|own| own == *key)
        });
        if !same_strings(kept, annotations) {
            return false;
        }
        // Nothing else: the essence has metadata only for labels or annotations it keeps.
        let stanzas = usize::from(labels.is_some()) + usize::from(annotations.is_some());
        let metadata_fine = match metadata {
            None => true,
            Some(metadata) => stanzas > 0 && metadata.len() == stanzas,
        };
        metadata_fine && essence.len() == fields + usize::from(metadata.is_some())
    }

    /// The diff-base stored on the object (V2 key first, then V1), or `None` if there is none.
    ///
    /// A `null` is absent, as in Kopf. Invalid JSON, or JSON that is not an object, is logged as a
    /// warning and treated as absent (then the object is handled as if new, i.e. created); Kopf
    /// would fail the processing of the object instead, for good.
    pub fn fetch(&self, body: &DynamicObject) -> Option<Value> {
        self.fetch_named(body, &self.key, true)
    }

    /// The diff-base as [`fetch`](Self::fetch) reads it, without the warning for an unreadable
    /// one: for a check whose "no" runs the cycle that warns.
    pub fn fetch_quietly(&self, body: &DynamicObject) -> Option<Value> {
        self.fetch_named(body, &self.key, false)
    }

    /// The essence a cause that spans several cycles started from ([`CAUSE_BASE_KEY`]), when a
    /// cycle before this one stored it; read as the diff-base is.
    pub fn fetch_cause_base(&self, body: &DynamicObject) -> Option<Value> {
        self.fetch_named(body, CAUSE_BASE_KEY, true)
    }

    fn fetch_named(&self, body: &DynamicObject, name: &str, warn: bool) -> Option<Value> {
        let annotations = body.metadata.annotations.as_ref()?;
        for key in self.keys.each(name) {
            let Some(text) = annotations.get(&key) else {
                continue;
            };
            let problem = match serde_json::from_str::<Value>(text) {
                Ok(value @ Value::Object(_)) => return Some(value),
                Ok(Value::Null) => continue,
                Ok(_) => "it is not a JSON object".to_string(),
                Err(error) => format!("it is not valid JSON: {error}"),
            };
            if warn {
                tracing::warn!(
                    key = %key,
                    "Ignoring the unreadable essence in the annotation {key} ({problem}); it is treated as absent."
                );
            }
        }
        None
    }

    /// Adds the essence a cause started from to a merge patch ([`CAUSE_BASE_KEY`]); nothing when
    /// the annotations would exceed Kubernetes' limit (the worker's memory keeps it then).
    pub fn store_cause_base(
        &self,
        body: &DynamicObject,
        essence: &Value,
        patch: &mut Value,
    ) -> Result<(), DiffBaseTooLarge> {
        self.store_named(body, CAUSE_BASE_KEY, essence, patch)
    }

    /// Removes the cause's base from the object (a merge patch), if it has one.
    pub fn clear_cause_base(&self, body: &DynamicObject, patch: &mut Value) {
        let annotations = body.metadata.annotations.as_ref();
        for key in self.keys.each(CAUSE_BASE_KEY) {
            if annotations.is_some_and(|a| a.contains_key(&key)) {
                ensure(patch, &annotation_path(&key), Value::Null);
            }
        }
    }

    /// Adds the essence to a JSON merge patch under the diff-base key(s), plus the
    /// `<prefix>/kopf-managed` marker for a non-Kopf prefix (unless the body or the patch has it).
    ///
    /// The value is Kopf's `json.dumps(essence, separators=(',', ':')) + '\n'`: compact, ASCII
    /// only, Python's floats. Fails, adding nothing, when the annotations (the body's, with the
    /// patch's and these applied) would exceed Kubernetes' 256 KiB limit.
    ///
    /// **Key order.** Kopf writes keys in the order of its essence dict, which follows the
    /// object's JSON as the API server sent it (sorted, for custom resources) with `metadata`
    /// moved after the other fields, and then the extra fields in the order of a Python set
    /// (random per process). kactor writes: the top-level fields sorted, then `metadata`
    /// (`labels`, `annotations`, then the rest sorted) if it has labels or annotations, then the
    /// remaining of `apiVersion`, `kind`, `metadata`, `status`; everything below sorted. That is
    /// byte-identical to Kopf for custom resources with at most one extra field outside `spec`.
    /// Otherwise only the order differs, and that does not matter: Kopf and kactor compare parsed
    /// JSON, never the text.
    pub fn store(
        &self,
        body: &DynamicObject,
        essence: &Value,
        patch: &mut Value,
    ) -> Result<(), DiffBaseTooLarge> {
        self.store_named(body, &self.key, essence, patch)
    }

    fn store_named(
        &self,
        body: &DynamicObject,
        name: &str,
        essence: &Value,
        patch: &mut Value,
    ) -> Result<(), DiffBaseTooLarge> {
        let mut encoded = String::new();
        write_essence(essence, &mut encoded);
        encoded.push('\n');

        let keys = self.keys.keys(name);
        let size = annotations_size_after(body, patch, &keys, &encoded, &self.keys);
        if size > ANNOTATIONS_SIZE_LIMIT {
            return Err(DiffBaseTooLarge { size });
        }
        for key in &keys {
            ensure(patch, &annotation_path(key), Value::String(encoded.clone()));
        }
        store_marker(&self.keys, Some(body), patch);
        Ok(())
    }
}

/// The labels that are part of the essence. A sharded operator's own labels say which replica
/// has the object, not what it is: a move between replicas is no change of the object.
fn essential_labels(labels: &BTreeMap<String, String>) -> impl Iterator<Item = (&String, &String)> {
    labels.iter().filter(|(key, _)| {
        !key.starts_with(SHARD_LABEL_PREFIX) && !key.starts_with(DRAIN_LABEL_PREFIX)
    })
}

/// Whether an annotation is part of the essence: not kubectl's last applied configuration, nor
/// under one of the `ignored` prefixes (Kopf-based operators' and our own).
fn essential_annotation(key: &str, ignored: &[&str]) -> bool {
    key != KUBECTL_LAST_APPLIED && !ignored.iter().any(|prefix| is_under(key, prefix))
}

/// Whether `entries` are exactly the string values of `stanza`; no stanza is no entries (the
/// essence leaves empty labels and annotations out).
fn same_strings<'a>(
    entries: impl Iterator<Item = (&'a String, &'a String)>,
    stanza: Option<&Map<String, Value>>,
) -> bool {
    let mut count = 0;
    for (key, value) in entries {
        let Some(Value::String(expected)) = stanza.and_then(|s| s.get(key)) else {
            return false;
        };
        if expected != value {
            return false;
        }
        count += 1;
    }
    count == stanza.map_or(0, Map::len)
}

/// Whether an annotation key is `<prefix>/...`, checked without forming `<prefix>/`.
fn is_under(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|name| name.starts_with('/'))
}

/// Labels or annotations as a JSON object.
fn string_map<'a>(entries: impl Iterator<Item = (&'a String, &'a String)>) -> Value {
    Value::Object(
        entries
            .map(|(key, value)| (key.clone(), Value::String(value.clone())))
            .collect(),
    )
}

fn annotations_mut(essence: &mut Value) -> Option<&mut Map<String, Value>> {
    essence
        .get_mut("metadata")?
        .get_mut("annotations")?
        .as_object_mut()
}

/// Python's truthiness: what Kopf's `if not value` takes as empty.
fn is_falsy(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(object) => object.is_empty(),
    }
}

/// Kopf's `remove_empty_stanzas`: empty labels, annotations, metadata and status go.
fn remove_empty_stanzas(essence: &mut Value) {
    let Some(object) = essence.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
        for key in ["annotations", "labels"] {
            if metadata.get(key).is_some_and(is_falsy) {
                metadata.remove(key);
            }
        }
    }
    for key in ["metadata", "status"] {
        if object.get(key).is_some_and(is_falsy) {
            object.remove(key);
        }
    }
}

/// The size Kubernetes would count for the annotations once the patch and the diff-base (and
/// the marker) are applied to the body.
fn annotations_size_after(
    body: &DynamicObject,
    patch: &Value,
    keys: &[String],
    encoded: &str,
    forming: &KeyForming,
) -> usize {
    let mut annotations: BTreeMap<&str, &str> = body
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let patched = resolve(patch, &["metadata", "annotations"]).and_then(Value::as_object);
    for (key, value) in patched.into_iter().flatten() {
        match value.as_str() {
            Some(value) => annotations.insert(key, value),
            None => annotations.remove(key.as_str()),
        };
    }
    for key in keys {
        annotations.insert(key, encoded);
    }
    let marker = forming.marker();
    if let Some(marker) = &marker {
        annotations.entry(marker).or_insert("yes");
    }
    annotations.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Writes the essence in Kopf's key order as far as it is knowable; see [`DiffBaseStorage::store`].
fn write_essence(essence: &Value, out: &mut String) {
    let Value::Object(object) = essence else {
        write_json(essence, out);
        return;
    };
    const LATE: [&str; 4] = ["apiVersion", "kind", "metadata", "status"];
    let metadata_early = object
        .get("metadata")
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key("labels") || m.contains_key("annotations"));

    let mut order: Vec<&str> = object
        .keys()
        .map(String::as_str)
        .filter(|key| !LATE.contains(key))
        .collect();
    if metadata_early {
        order.push("metadata");
    }
    order.extend(
        LATE.iter()
            .filter(|key| object.contains_key(**key) && !(metadata_early && **key == "metadata")),
    );

    out.push('{');
    for (index, key) in order.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_json_str(key, out);
        out.push(':');
        match (key, object.get(key)) {
            ("metadata", Some(Value::Object(metadata))) => write_metadata(metadata, out),
            (_, Some(value)) => write_json(value, out),
            (_, None) => out.push_str("null"),
        }
    }
    out.push('}');
}

/// `labels` and `annotations` first (Kopf picks them first), then the rest in sorted order.
fn write_metadata(metadata: &Map<String, Value>, out: &mut String) {
    const EARLY: [&str; 2] = ["labels", "annotations"];
    let order = EARLY
        .iter()
        .copied()
        .filter(|key| metadata.contains_key(*key))
        .chain(
            metadata
                .keys()
                .map(String::as_str)
                .filter(|key| !EARLY.contains(key)),
        );
    out.push('{');
    for (index, key) in order.enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_json_str(key, out);
        out.push(':');
        match metadata.get(key) {
            Some(value) => write_json(value, out),
            None => out.push_str("null"),
        }
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|part| part.to_string()).collect()
    }

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_essence_matches_exactly_the_bodies_whose_essence_it_is() {
        let bodies = [
            json!({"metadata": {"name": "n"}}),
            json!({"metadata": {"name": "n"}, "spec": {"x": 1}}),
            json!({"metadata": {"name": "n"}, "spec": {"x": 2}}),
            json!({"metadata": {"name": "n"}, "spec": {"x": 1}, "data": null}),
            json!({"metadata": {"name": "n"}, "spec": {"x": 1}, "status": {"s": 1}}),
            json!({"metadata": {"name": "n", "labels": {}}, "spec": {"x": 1}}),
            json!({"metadata": {"name": "n", "labels": {"a": "b"}}, "spec": {"x": 1}}),
            json!({"metadata": {"name": "n", "labels": {"a": "c"}}, "spec": {"x": 1}}),
            json!({"metadata": {"name": "n", "labels": {"a": "b", "shard.kactor.dev/op": "r1"}},
                   "spec": {"x": 1}}),
            json!({"metadata": {"name": "n", "annotations": {"example.com/x": "y"}},
                   "spec": {"x": 1}}),
            json!({"metadata": {"name": "n", "annotations": {"example.com/x": "z"}},
                   "spec": {"x": 1}}),
            json!({"metadata": {"name": "n", "annotations": {
                       "kopf.zalando.org/last-handled-configuration": "{\"spec\":{\"x\":1}}\n",
                       "last-handled-configuration": "{}",
                       "kubectl.kubernetes.io/last-applied-configuration": "{}",
                       "other.io/kopf-managed": "yes", "other.io/h": "1"}},
                   "spec": {"x": 1}}),
            json!({"metadata": {"name": "n", "labels": {"a": "b"},
                                "annotations": {"example.com/x": "y"}},
                   "spec": {"x": 1}}),
        ];
        let bodies: Vec<DynamicObject> = bodies.into_iter().map(object).collect();
        let unprefixed = DiffBaseStorage {
            keys: KeyForming {
                prefix: String::new(),
                v1: true,
            },
            ..DiffBaseStorage::default()
        };
        for storage in [DiffBaseStorage::default(), unprefixed] {
            for (i, one) in bodies.iter().enumerate() {
                let essence = storage.essence(one, &[]);
                for (j, other) in bodies.iter().enumerate() {
                    let same = storage.essence(other, &[]) == essence;
                    assert_eq!(
                        storage.matches(other, &essence),
                        same,
                        "body {j} against the essence of body {i} ({essence}), prefix {:?}",
                        storage.keys.prefix
                    );
                }
            }
        }
        // What is not an essence of ours matches nothing.
        let storage = DiffBaseStorage::default();
        for essence in [
            json!(null),
            json!({"spec": {"x": 1}, "status": {"s": 1}}),
            json!({"spec": {"x": 1}, "metadata": {}}),
            json!({"spec": {"x": 1}, "metadata": {"labels": "a"}}),
            json!({"spec": {"x": 1}, "metadata": {"name": "n"}}),
        ] {
            assert!(!storage.matches(&bodies[1], &essence), "{essence}");
        }
    }

    #[test]
    fn essence_keeps_spec_labels_and_foreign_annotations() {
        let body = object(json!({
            "apiVersion": "v1", "kind": "Thing",
            "metadata": {"name": "n", "uid": "u", "labels": {"a": "b"},
                         "annotations": {"example.com/x": "y", "kopf.zalando.org/fn": "{}"}},
            "spec": {"x": 1}, "status": {"y": 2},
        }));
        let essence = DiffBaseStorage::default().essence(&body, &[]);
        assert_eq!(
            essence,
            json!({"spec": {"x": 1},
                   "metadata": {"labels": {"a": "b"}, "annotations": {"example.com/x": "y"}}})
        );
    }

    #[test]
    fn essence_leaves_out_a_sharded_operators_labels_so_that_a_move_is_no_change() {
        let labelled = |labels: Value| {
            object(json!({"metadata": {"name": "n", "labels": labels}, "spec": {"x": 1}}))
        };
        let storage = DiffBaseStorage::default();
        let here = storage.essence(
            &labelled(json!({"a": "b", "shard.kactor.dev/op": "r1"})),
            &[],
        );
        let draining = storage.essence(
            &labelled(
                json!({"a": "b", "shard.kactor.dev/op": "r1", "drain.kactor.dev/op": "true"}),
            ),
            &[],
        );
        let moved = storage.essence(
            &labelled(json!({"a": "b", "shard.kactor.dev/op": "r2"})),
            &[],
        );
        assert_eq!(
            here,
            json!({"spec": {"x": 1}, "metadata": {"labels": {"a": "b"}}})
        );
        assert_eq!((&draining, &moved), (&here, &here));
        let only = storage.essence(&labelled(json!({"shard.kactor.dev/op": "r1"})), &[]);
        assert_eq!(only, json!({"spec": {"x": 1}}));
    }

    #[test]
    fn essence_drops_annotations_of_marked_prefixes() {
        let body = object(json!({
            "apiVersion": "v1", "kind": "Thing",
            "metadata": {"name": "n", "annotations": {
                "their.example.com/kopf-managed": "yes", "their.example.com/fn": "{}",
                "x.kopf.zalando.org/fn": "{}", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        }));
        assert_eq!(DiffBaseStorage::default().essence(&body, &[]), json!({}));
    }

    #[test]
    fn essence_restores_extra_fields_without_the_legacy_progress() {
        let body = object(json!({
            "apiVersion": "v1", "kind": "Thing", "metadata": {"name": "n"},
            "status": {"x": 1, "kopf": {"progress": {"fn": {}}}},
        }));
        let storage = DiffBaseStorage::default();
        assert_eq!(
            storage.essence(&body, &[field(&["status", "x"])]),
            json!({"status": {"x": 1}})
        );
        assert_eq!(
            storage.essence(&body, &[field(&["status", "kopf"])]),
            json!({})
        );
    }

    #[test]
    fn essence_leaves_out_server_metadata_and_its_own_records() {
        let body = object(json!({
            "apiVersion": "v1", "kind": "Thing",
            "metadata": {"name": "n", "uid": "u", "resourceVersion": "7", "generation": 2,
                         "finalizers": ["f"], "ownerReferences": [],
                         "managedFields": [{"manager": "m", "operation": "Update",
                                            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
                         "labels": {},
                         "annotations": {
                             "my-op.example.com/last-handled-configuration": "{\"spec\":{}}\n",
                             "my-op.example.com/fn": "{}", "my-op.example.comx/y": "z"}},
            "spec": {"x": [1, 2]}, "other": "top",
        }));
        let storage = DiffBaseStorage {
            keys: KeyForming::new("my-op.example.com").unwrap(),
            ..Default::default()
        };
        assert_eq!(
            storage.essence(&body, &[]),
            json!({"spec": {"x": [1, 2]}, "other": "top",
                   "metadata": {"annotations": {"my-op.example.comx/y": "z"}}})
        );
        // An extra field is copied back from the whole object, metadata included.
        assert_eq!(
            storage.essence(&body, &[field(&["metadata", "generation"])]),
            json!({"spec": {"x": [1, 2]}, "other": "top",
                   "metadata": {"generation": 2, "annotations": {"my-op.example.comx/y": "z"}}})
        );
    }

    #[test]
    fn store_puts_metadata_after_the_other_fields() {
        let body = object(json!({"apiVersion": "v1", "kind": "Thing", "metadata": {"name": "n"}}));
        let essence = json!({"spec": {"b": 1, "a": 2}, "metadata": {"labels": {"x": "y"}}});
        let mut patch = json!({});
        DiffBaseStorage::default()
            .store(&body, &essence, &mut patch)
            .unwrap();
        assert_eq!(
            patch["metadata"]["annotations"]["kopf.zalando.org/last-handled-configuration"],
            "{\"spec\":{\"a\":2,\"b\":1},\"metadata\":{\"labels\":{\"x\":\"y\"}}}\n"
        );
    }

    #[test]
    fn store_refuses_a_diff_base_over_the_annotations_limit() {
        let body = object(json!({"apiVersion": "v1", "kind": "Thing", "metadata": {"name": "n"}}));
        let essence = json!({"spec": {"blob": "x".repeat(ANNOTATIONS_SIZE_LIMIT)}});
        let mut patch = json!({});
        let error = DiffBaseStorage::default()
            .store(&body, &essence, &mut patch)
            .unwrap_err();
        assert!(error.size > ANNOTATIONS_SIZE_LIMIT);
        assert_eq!(patch, json!({}));
    }

    #[test]
    fn fetch_ignores_non_objects() {
        let body = object(json!({"apiVersion": "v1", "kind": "Thing", "metadata": {
            "name": "n", "annotations": {"kopf.zalando.org/last-handled-configuration": "[1]"}}}));
        assert_eq!(DiffBaseStorage::default().fetch(&body), None);
        assert_eq!(DiffBaseStorage::default().fetch_quietly(&body), None);
    }

    #[test]
    fn fetching_quietly_reads_as_fetching_does() {
        let storage = DiffBaseStorage::default();
        for annotations in [
            json!({}),
            json!({"kopf.zalando.org/last-handled-configuration": "{\"spec\":{\"x\":1}}\n"}),
            json!({"kopf.zalando.org/last-handled-configuration": "null"}),
            json!({"kopf.zalando.org/last-handled-configuration": "{not json"}),
        ] {
            let body = object(json!({"metadata": {"name": "n", "annotations": annotations}}));
            assert_eq!(
                storage.fetch_quietly(&body),
                storage.fetch(&body),
                "{annotations}"
            );
        }
    }
}
