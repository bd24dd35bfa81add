//! Objects decoded as the operator keeps them: a [`DynamicObject`] without
//! `metadata.managedFields`, decoded in one pass.
//!
//! A real API server sends every object, every answer to a write and every watch event with its
//! `managedFields`: the field managers of server-side apply, often as large as the rest of the
//! object. Nothing in kactor reads them (the essence, the diff-base and the caches leave them out),
//! and decoding them into `ObjectMeta` was a tenth of an operator's CPU against a real server. So
//! [`Slim`] skips them while decoding. It also decodes the object straight into its parts:
//! `DynamicObject`'s own `Deserialize` (two `#[serde(flatten)]` fields) buffers every object into
//! an intermediate tree first.
//!
//! Everything else is decoded exactly as `DynamicObject` decodes it (a test compares the two).
//! Handlers see bodies without `managedFields`; one that needs them reads the object itself.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, ObjectList, TypeMeta};
use kube::Resource;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A [`DynamicObject`] decoded without `metadata.managedFields`; see the module's documentation.
#[derive(Clone, Debug, PartialEq)]
pub struct Slim(pub DynamicObject);

impl Slim {
    /// The object.
    pub fn into_inner(self) -> DynamicObject {
        self.0
    }
}

impl From<Slim> for DynamicObject {
    fn from(slim: Slim) -> Self {
        slim.0
    }
}

/// The API of a resource whose objects are decoded as [`Slim`]: `Api::namespaced_with` or
/// `Api::all_with` of the same client and resource.
pub fn api(
    client: kube::Client,
    namespace: Option<&str>,
    resource: &ApiResource,
) -> kube::Api<Slim> {
    match namespace {
        Some(namespace) => kube::Api::namespaced_with(client, namespace, resource),
        None => kube::Api::all_with(client, resource),
    }
}

impl Resource for Slim {
    type DynamicType = ApiResource;
    type Scope = <DynamicObject as Resource>::Scope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::group(dt)
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::version(dt)
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::kind(dt)
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::api_version(dt)
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// Encoded as the [`DynamicObject`] it holds, so that an `Api<Slim>` can create and replace.
impl Serialize for Slim {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Slim {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_map(ObjectVisitor { keep: None })
            .map(Slim)
    }
}

/// Decodes an object as [`Slim`] does, but of its data (all but the type fields and `metadata`)
/// only the top-level fields that `fields` has as keys: the answer to a merge patch is read for
/// what the patch changed (and the metadata), and the rest of it, the spec above all, is skipped
/// unread instead of decoded into values that nothing reads.
pub(crate) fn decode_keeping(
    text: &str,
    fields: &Map<String, Value>,
) -> serde_json::Result<DynamicObject> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let object = deserializer.deserialize_map(ObjectVisitor { keep: Some(fields) })?;
    deserializer.end()?;
    Ok(object)
}

/// An object of a listing page that could not be decoded, as far as it can be named.
#[derive(Debug)]
pub struct Undecodable {
    /// Its name, if its metadata could be read.
    pub name: Option<String>,
    /// Its namespace, if it has one and its metadata could be read.
    pub namespace: Option<String>,
    /// Why it could not be decoded.
    pub error: serde_json::Error,
}

/// A listing page, its objects decoded as [`Slim`]. When the page does not decode whole, it is
/// taken apart object by object, and the objects that do not decode are left out and returned
/// beside it: one object nested deeper than the decoder goes (128 levels: a real API server takes
/// far deeper ones) must not keep every other object of the resource from being served. The page
/// itself broken (not JSON, not a list) is the error.
pub fn decode_list(
    text: &str,
) -> serde_json::Result<(ObjectList<DynamicObject>, Vec<Undecodable>)> {
    let whole = match serde_json::from_str::<ObjectList<Slim>>(text) {
        Ok(page) => {
            let items = page.items.into_iter().map(Slim::into_inner).collect();
            let page = ObjectList {
                types: page.types,
                metadata: page.metadata,
                items,
            };
            return Ok((page, Vec::new()));
        }
        Err(error) => error,
    };
    // Skipping a value (as `RawValue` does) goes as deep as it must; decoding one into a tree
    // does not.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Page<'a> {
        #[serde(default)]
        api_version: String,
        #[serde(default)]
        kind: String,
        #[serde(default)]
        metadata: ListMeta,
        #[serde(borrow, default)]
        items: Option<Vec<&'a RawValue>>,
    }
    #[derive(Deserialize, Default)]
    struct Named {
        #[serde(default)]
        metadata: Names,
    }
    #[derive(Deserialize, Default)]
    struct Names {
        name: Option<String>,
        namespace: Option<String>,
    }
    let Ok(page) = serde_json::from_str::<Page<'_>>(text) else {
        return Err(whole);
    };
    let raw = page.items.unwrap_or_default();
    let mut items = Vec::with_capacity(raw.len());
    let mut undecodable = Vec::new();
    for item in raw {
        match serde_json::from_str::<Slim>(item.get()) {
            Ok(object) => items.push(object.into_inner()),
            Err(error) => {
                let names = serde_json::from_str::<Named>(item.get())
                    .unwrap_or_default()
                    .metadata;
                undecodable.push(Undecodable {
                    name: names.name,
                    namespace: names.namespace,
                    error,
                });
            }
        }
    }
    let page = ObjectList {
        types: TypeMeta {
            api_version: page.api_version,
            kind: page.kind,
        },
        metadata: page.metadata,
        items,
    };
    Ok((page, undecodable))
}

/// The top level: `apiVersion` and `kind` into the type fields (when both are strings, as
/// `DynamicObject`'s flattened `TypeMeta` takes them), `metadata` through [`MetadataSeed`], the
/// rest into `data` (with `keep`, only the fields it has; the others are skipped).
struct ObjectVisitor<'k> {
    keep: Option<&'k Map<String, Value>>,
}

impl<'de> Visitor<'de> for ObjectVisitor<'_> {
    type Value = DynamicObject;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DynamicObject, A::Error> {
        let mut metadata = None;
        let mut data = Map::new();
        // The type fields in the order they came: `DynamicObject`'s flattened `TypeMeta` takes
        // them in that order, and stops at the first that is not a string.
        let mut type_fields = Vec::with_capacity(2);
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if key == "metadata" {
                if metadata.is_some() {
                    return Err(de::Error::duplicate_field("metadata"));
                }
                metadata = Some(map.next_value_seed(MetadataSeed)?);
                continue;
            }
            match &*key {
                "apiVersion" => type_fields.push("apiVersion"),
                "kind" => type_fields.push("kind"),
                _ if self.keep.is_some_and(|keep| !keep.contains_key(&*key)) => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                _ => {}
            }
            data.insert(key.into_owned(), map.next_value::<Value>()?);
        }
        let types = take_types(&mut data, &type_fields);
        Ok(DynamicObject {
            types,
            metadata: metadata.unwrap_or_default(),
            data: Value::Object(data),
        })
    }
}

/// Takes the type fields out of `data` as `DynamicObject`'s flattened `Option<TypeMeta>` does:
/// each in the order it came, until one is not a string (it is taken all the same, and the rest
/// stay); the type is there only if both were strings.
fn take_types(data: &mut Map<String, Value>, order: &[&str]) -> Option<TypeMeta> {
    let (mut api_version, mut kind) = (None, None);
    for &field in order {
        match data.remove(field) {
            Some(Value::String(value)) if field == "apiVersion" => api_version = Some(value),
            Some(Value::String(value)) => kind = Some(value),
            _ => return None,
        }
    }
    Some(TypeMeta {
        api_version: api_version?,
        kind: kind?,
    })
}

/// A map key, borrowed from the input where it can be (serde's own `Cow<str>` is always owned).
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }

            fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }

            fn visit_string<E: de::Error>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }

        deserializer.deserialize_str(KeyVisitor)
    }
}

/// `ObjectMeta`, decoded by its own `Deserialize` from the map with `managedFields` left out.
struct MetadataSeed;

impl<'de> DeserializeSeed<'de> for MetadataSeed {
    type Value = ObjectMeta;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ObjectMeta, D::Error> {
        deserializer.deserialize_map(MetadataVisitor)
    }
}

struct MetadataVisitor;

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = ObjectMeta;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object's metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ObjectMeta, A::Error> {
        ObjectMeta::deserialize(de::value::MapAccessDeserializer::new(WithoutManagedFields(
            map,
        )))
    }
}

/// A map with its `managedFields` entry skipped, unread.
struct WithoutManagedFields<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for WithoutManagedFields<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(Key(key)) = self.0.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            if key == "managedFields" {
                self.0.next_value::<IgnoredAny>()?;
                continue;
            }
            return match key {
                Cow::Borrowed(key) => seed
                    .deserialize(de::value::BorrowedStrDeserializer::new(key))
                    .map(Some),
                Cow::Owned(key) => seed
                    .deserialize(de::value::StringDeserializer::new(key))
                    .map(Some),
            };
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn managed() -> Value {
        json!([{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:size": {}}}}])
    }

    /// Sent as the `DynamicObject` it holds (an `Api<Slim>` creates what an `Api<DynamicObject>`
    /// would), and read back the same.
    #[test]
    fn objects_encode_as_dynamic_objects_do() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "labels": {"app": "demo"}},
            "data": {"size": "3"},
        }))
        .unwrap();
        let text = serde_json::to_string(&Slim(object.clone())).unwrap();
        assert_eq!(text, serde_json::to_string(&object).unwrap());
        let back: Slim = serde_json::from_str(&text).unwrap();
        assert_eq!(back.into_inner(), object);
    }

    /// The same as `DynamicObject` decodes it, but for `managedFields`.
    #[test]
    fn objects_decode_as_dynamic_objects_do_without_managed_fields() {
        let samples = [
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"name": "w", "namespace": "n", "uid": "u", "resourceVersion": "7",
                                "generation": 2, "labels": {"app": "demo"},
                                "annotations": {"a\"b": "c\\nd"}, "finalizers": ["f"],
                                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                                                     "name": "c", "uid": "x", "controller": true}],
                                "creationTimestamp": "2026-01-01T00:00:00Z",
                                "managedFields": managed()},
                   "spec": {"size": 3, "nested": {"list": [1, "two", null, 1.5]}},
                   "status": {"create_fn": {"message": "hello"}}}),
            // From a list: no type fields.
            json!({"metadata": {"name": "w", "managedFields": managed()}, "spec": {}}),
            // One type field alone stays in the data, as with DynamicObject.
            json!({"kind": "Widget", "metadata": {"name": "w"}}),
            json!({"apiVersion": "v1", "metadata": {"name": "w"}, "data": {"k": "v"}}),
            // No metadata.
            json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {}}),
            // Type fields that are not strings, in either order.
            json!({"apiVersion": 1, "kind": "Widget", "metadata": {"name": "w"}}),
            json!({"kind": "Widget", "apiVersion": 1, "metadata": {"name": "w"}}),
            json!({"kind": ["Widget"], "apiVersion": "v1", "metadata": {"name": "w"}}),
        ];
        for sample in samples {
            let text = serde_json::to_vec(&sample).unwrap();
            let mut expected: DynamicObject = serde_json::from_slice(&text).unwrap();
            expected.metadata.managed_fields = None;
            let slim: Slim = serde_json::from_slice(&text).unwrap();
            assert_eq!(slim.0, expected, "{sample}");
        }
    }

    /// Decoded as `Slim` decodes it, with the data's fields that are not kept left out (the type
    /// fields and the metadata always in); what is skipped is still checked to be JSON.
    #[test]
    fn an_answer_is_decoded_keeping_only_the_fields_asked_for() {
        let sample = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "resourceVersion": "7", "annotations": {"a": "b"},
                         "managedFields": managed()},
            "spec": {"size": 3, "nested": {"list": [1, "two", null, 1.5]}},
            "status": {"create_fn": {"message": "hello"}}, "extra": [1, 2]});
        let text = serde_json::to_string(&sample).unwrap();
        let whole = serde_json::from_str::<Slim>(&text).unwrap().into_inner();
        for kept in [
            json!({"status": {"create_fn": null}}),
            json!({"metadata": {"annotations": {"a": "c"}}}),
            json!({"spec": {}, "extra": null, "absent": 1}),
            json!({"apiVersion": "v2"}),
            json!({}),
        ] {
            let fields = kept.as_object().unwrap();
            let partial = decode_keeping(&text, fields).unwrap();
            let mut expected = whole.clone();
            expected
                .data
                .as_object_mut()
                .unwrap()
                .retain(|key, _| fields.contains_key(key));
            assert_eq!(partial, expected, "{kept}");
        }
        let fields = json!({"status": {}});
        let fields = fields.as_object().unwrap();
        for broken in [
            r#"{"metadata": {"name": "w"}, "spec": {"size": }"#,
            r#"{"metadata": {"name": 5}}"#,
            r#"{"metadata": {"name": "w"}} trailing"#,
        ] {
            assert!(decode_keeping(broken, fields).is_err(), "{broken}");
        }
    }

    fn deep(depth: usize) -> Value {
        let mut nested = json!({});
        for _ in 0..depth {
            nested = json!({ "a": nested });
        }
        nested
    }

    /// A page that decodes whole is decoded as kube decodes it; one with objects that do not (too
    /// deep, metadata of the wrong shape) is decoded object by object, without them, and they are
    /// named beside it. A page that is not a list is the error.
    #[test]
    fn a_listing_page_leaves_out_the_objects_that_do_not_decode() {
        let good = |name: &str| {
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"name": name, "namespace": "n", "resourceVersion": "3",
                                "managedFields": managed()},
                   "spec": {"size": 1}})
        };
        let list = |items: Vec<Value>| {
            json!({"apiVersion": "example.com/v1", "kind": "WidgetList",
                   "metadata": {"resourceVersion": "10", "continue": "t"}, "items": items})
            .to_string()
        };
        let text = list(vec![good("a"), good("b")]);
        let (page, undecodable) = decode_list(&text).unwrap();
        let expected: kube::api::ObjectList<Slim> = serde_json::from_str(&text).unwrap();
        assert!(undecodable.is_empty());
        assert_eq!(page.metadata, expected.metadata);
        assert_eq!(page.types, expected.types);
        assert_eq!(
            page.items,
            expected
                .items
                .into_iter()
                .map(Slim::into_inner)
                .collect::<Vec<_>>()
        );

        let mut too_deep = good("deep");
        too_deep["spec"]["nested"] = deep(300);
        let mut misshapen = good("labels");
        misshapen["metadata"]["labels"] = json!({"app": 1});
        let text = list(vec![good("a"), too_deep, good("b"), misshapen, json!(5)]);
        let (page, undecodable) = decode_list(&text).unwrap();
        let names = |objects: &[DynamicObject]| {
            objects
                .iter()
                .map(|o| o.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&page.items), ["a", "b"]);
        assert!(page
            .items
            .iter()
            .all(|o| o.metadata.managed_fields.is_none()));
        assert_eq!(page.metadata.resource_version.as_deref(), Some("10"));
        assert_eq!(page.metadata.continue_.as_deref(), Some("t"));
        assert_eq!(page.types.kind, "WidgetList");
        let named: Vec<_> = undecodable
            .iter()
            .map(|u| (u.name.as_deref(), u.namespace.as_deref()))
            .collect();
        assert_eq!(
            named,
            [
                (Some("deep"), Some("n")),
                (Some("labels"), Some("n")),
                (None, None)
            ]
        );
        assert!(
            undecodable[0].error.to_string().contains("recursion limit"),
            "{}",
            undecodable[0].error
        );

        for broken in ["not json", r#"{"items": 5}"#, r#"{"items": [{"a": }]}"#] {
            assert!(decode_list(broken).is_err(), "{broken}");
        }
        let (page, undecodable) = decode_list(r#"{"items": null}"#).unwrap();
        assert!(page.items.is_empty() && undecodable.is_empty());
    }

    #[test]
    fn metadata_of_the_wrong_shape_is_an_error_as_with_dynamic_objects() {
        for sample in [
            json!({"metadata": {"name": 5}}),
            json!({"metadata": []}),
            json!({"metadata": {"labels": {"a": 1}}}),
            json!({"metadata": null}),
        ] {
            let text = serde_json::to_vec(&sample).unwrap();
            assert!(
                serde_json::from_slice::<DynamicObject>(&text).is_err(),
                "{sample}"
            );
            assert!(serde_json::from_slice::<Slim>(&text).is_err(), "{sample}");
        }
    }

    #[test]
    fn watch_events_and_lists_decode() {
        let event = json!({"type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "c", "resourceVersion": "9", "managedFields": managed()}}});
        let event: kube::api::WatchEvent<Slim> = serde_json::from_value(event).unwrap();
        let kube::api::WatchEvent::Modified(Slim(object)) = event else {
            panic!("{event:?}")
        };
        assert_eq!(object.metadata.resource_version.as_deref(), Some("9"));
        assert!(object.metadata.managed_fields.is_none());
        let list = json!({"apiVersion": "v1", "kind": "ConfigMapList",
                          "metadata": {"resourceVersion": "10", "continue": "t"},
                          "items": [{"metadata": {"name": "c", "managedFields": managed()}}]});
        let list: kube::api::ObjectList<Slim> = serde_json::from_value(list).unwrap();
        assert_eq!(list.items.len(), 1);
        assert!(list.items[0].0.metadata.managed_fields.is_none());
        assert_eq!(list.metadata.continue_.as_deref(), Some("t"));
    }
}
