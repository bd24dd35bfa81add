//! Diffs between two essences of an object, as Kopf computes them (`kopf._cogs.structs.diffs`),
//! and the field-path helpers they need (Kopf's `dicts.parse_field`, `resolve`, `cherrypick`).
//!
//! A [`Diff`] is a list of [`DiffItem`]s, each an operation on one field with its old and new
//! value. It is what update and field handlers receive as `diff`, and it serialises exactly as
//! Kopf's: `[["change", ["spec", "x"], 1, 2], ...]`.

use serde::ser::{Serialize, SerializeTuple, Serializer};
use serde_json::{Map, Value};

/// The operation of a [`DiffItem`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiffOp {
    /// The field was absent (or null) and now has a value: `old` is `None`.
    Add,
    /// The field has a different value: both `old` and `new` are set.
    Change,
    /// The field had a value and is now absent (or null): `new` is `None`.
    Remove,
}

impl DiffOp {
    /// The name as Kopf writes it: `add`, `change`, `remove`.
    pub fn as_str(self) -> &'static str {
        match self {
            DiffOp::Add => "add",
            DiffOp::Change => "change",
            DiffOp::Remove => "remove",
        }
    }
}

/// One change of one field. Serialises as Kopf's tuple `[op, field, old, new]`, e.g.
/// `["add", ["spec", "x"], null, 1]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DiffItem {
    /// What happened to the field.
    pub op: DiffOp,
    /// The path of the field from the diffed root; empty for the root itself.
    pub field: Vec<String>,
    /// The value before, `None` for an addition.
    pub old: Option<Value>,
    /// The value after, `None` for a removal.
    pub new: Option<Value>,
}

impl Serialize for DiffItem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tuple = serializer.serialize_tuple(4)?;
        tuple.serialize_element(&self.op)?;
        tuple.serialize_element(&self.field)?;
        tuple.serialize_element(&self.old)?;
        tuple.serialize_element(&self.new)?;
        tuple.end()
    }
}

/// A list of changes between two values, as Kopf's `Diff`. Serialises as a list of items.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct Diff(pub Vec<DiffItem>);

impl Diff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The number of changed fields.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The changes in order.
    pub fn iter(&self) -> std::slice::Iter<'_, DiffItem> {
        self.0.iter()
    }

    /// The part of the diff under `field`, with paths relative to it, as Kopf's `reduce`:
    ///
    /// * with an empty `field`, the diff as it is;
    /// * items at or under `field` are kept, their paths re-rooted at `field`;
    /// * items above `field` (e.g. all of `spec` added when `field` is `spec.a`) are replaced by
    ///   the diff of the old and new values resolved at the rest of the path, rooted at `field`;
    /// * items elsewhere are dropped.
    ///
    /// This is the `diff` a field handler (`field="spec.a"`) receives.
    pub fn reduce(&self, field: &[String]) -> Diff {
        if field.is_empty() {
            return self.clone();
        }
        let mut items = Vec::new();
        for item in &self.0 {
            if item.field.starts_with(field) {
                items.push(DiffItem {
                    field: item.field[field.len()..].to_vec(),
                    ..item.clone()
                });
            } else if field.starts_with(&item.field) {
                let tail = &field[item.field.len()..];
                let old = item.old.as_ref().and_then(|v| resolve(v, tail));
                let new = item.new.as_ref().and_then(|v| resolve(v, tail));
                diff_into(old, new, &mut Vec::new(), &mut items);
            }
        }
        Diff(items)
    }
}

impl<'a> IntoIterator for &'a Diff {
    type Item = &'a DiffItem;
    type IntoIter = std::slice::Iter<'a, DiffItem>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for Diff {
    type Item = DiffItem;
    type IntoIter = std::vec::IntoIter<DiffItem>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// The diff from `a` to `b`, with Kopf's `diff_iter` semantics:
///
/// * `None` and JSON `null` are the same (Python's `None`): a field that becomes null is removed,
///   a null field that gets a value is added, and a field added or removed with a null value is
///   no change at all.
/// * Equal values give no items. Equality is Python's: `1 == 1.0` and `true == 1`, `false == 0`.
/// * Two objects are compared key by key, recursively: first the added keys, then the removed
///   keys, then the keys in both. Lists are compared as a whole (any difference changes the list).
/// * Anything else that differs is a change of the field.
///
/// **Ordering:** Kopf iterates over sets of keys in hash order, which Python randomises per
/// process; kactor takes the keys in sorted order within each of the three groups, so the
/// result is deterministic and holds the same items as Kopf's.
pub fn diff(a: Option<&Value>, b: Option<&Value>) -> Diff {
    let mut items = Vec::new();
    diff_into(a, b, &mut Vec::new(), &mut items);
    Diff(items)
}

fn diff_into(
    a: Option<&Value>,
    b: Option<&Value>,
    path: &mut Vec<String>,
    items: &mut Vec<DiffItem>,
) {
    let a = a.filter(|v| !v.is_null());
    let b = b.filter(|v| !v.is_null());
    match (a, b) {
        (None, None) => {}
        (Some(a), Some(b)) if python_eq(a, b) => {}
        (None, Some(b)) => items.push(item(DiffOp::Add, path, None, Some(b))),
        (Some(a), None) => items.push(item(DiffOp::Remove, path, Some(a), None)),
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            for (key, new) in b.iter().filter(|(key, _)| !a.contains_key(*key)) {
                descend(None, Some(new), key, path, items);
            }
            for (key, old) in a.iter().filter(|(key, _)| !b.contains_key(*key)) {
                descend(Some(old), None, key, path, items);
            }
            for (key, old) in a.iter() {
                if let Some(new) = b.get(key) {
                    descend(Some(old), Some(new), key, path, items);
                }
            }
        }
        (Some(a), Some(b)) => items.push(item(DiffOp::Change, path, Some(a), Some(b))),
    }
}

fn descend(
    a: Option<&Value>,
    b: Option<&Value>,
    key: &str,
    path: &mut Vec<String>,
    items: &mut Vec<DiffItem>,
) {
    path.push(key.to_string());
    diff_into(a, b, path, items);
    path.pop();
}

fn item(op: DiffOp, path: &[String], old: Option<&Value>, new: Option<&Value>) -> DiffItem {
    DiffItem {
        op,
        field: path.to_vec(),
        old: old.cloned(),
        new: new.cloned(),
    }
}

/// Python's `==` on JSON-decoded values: numbers by value, booleans as 0 and 1.
fn python_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::String(a), Value::String(b)) => a == b,
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| python_eq(a, b))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, a)| b.get(key).is_some_and(|b| python_eq(a, b)))
        }
        _ => match (PyNumber::of(a), PyNumber::of(b)) {
            (Some(a), Some(b)) => a.equals(b),
            _ => false,
        },
    }
}

#[derive(Clone, Copy)]
enum PyNumber {
    Int(i128),
    Float(f64),
}

impl PyNumber {
    fn of(value: &Value) -> Option<Self> {
        match value {
            Value::Bool(b) => Some(PyNumber::Int(i128::from(*b))),
            Value::Number(n) => Some(if let Some(i) = n.as_i64() {
                PyNumber::Int(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                PyNumber::Int(i128::from(u))
            } else {
                PyNumber::Float(n.as_f64().unwrap_or(f64::NAN))
            }),
            _ => None,
        }
    }

    fn equals(self, other: Self) -> bool {
        match (self, other) {
            (PyNumber::Int(a), PyNumber::Int(b)) => a == b,
            (PyNumber::Int(i), PyNumber::Float(f)) | (PyNumber::Float(f), PyNumber::Int(i)) => {
                f.fract() == 0.0 && f == i as f64
            }
            (PyNumber::Float(a), PyNumber::Float(b)) => a == b,
        }
    }
}

/// A dotted field path split into its parts, as Kopf's `parse_field`: `"spec.a.b"` gives
/// `["spec", "a", "b"]`. As in Kopf, there is no escaping: a key with a dot in it cannot be
/// named this way (pass the parts instead).
pub fn parse_field(path: &str) -> Vec<String> {
    path.split('.').map(str::to_string).collect()
}

/// The value at `field` inside `value`, as Kopf's `resolve` with a default: `None` when a key is
/// absent or when a value on the way is not an object. An empty `field` is the value itself.
pub fn resolve<'a, S: AsRef<str>>(value: &'a Value, field: &[S]) -> Option<&'a Value> {
    field
        .iter()
        .try_fold(value, |current, key| current.as_object()?.get(key.as_ref()))
}

/// Copies each of `fields` from `src` into `dst`, creating the parent objects, as Kopf's
/// `cherrypick`. Fields absent in `src` are skipped. Where Kopf would raise (an empty path, or a
/// value on the way that is not an object), the field is skipped too.
pub fn cherrypick(src: &Value, dst: &mut Value, fields: &[Vec<String>]) {
    for field in fields {
        if field.is_empty() {
            continue;
        }
        if let Some(value) = resolve(src, field) {
            ensure(dst, field, value.clone());
        }
    }
}

/// Sets `field` in `dst` to `value`, creating the parent objects, as Kopf's `dicts.ensure`.
/// A `null` root becomes an object first. Returns `false` and changes nothing when `field` is
/// empty or a value on the way is not an object (Kopf raises there).
///
/// The path is borrowed (`&[&str]` as well as `&[String]`): a key is copied only where the patch
/// does not have it yet.
pub(crate) fn ensure<S: AsRef<str>>(dst: &mut Value, field: &[S], value: Value) -> bool {
    let Some((last, parents)) = field.split_last() else {
        return false;
    };
    if dst.is_null() {
        *dst = Value::Object(Map::new());
    }
    let mut current = dst;
    for key in parents {
        let Some(object) = current.as_object_mut() else {
            return false;
        };
        let key = key.as_ref();
        if !object.contains_key(key) {
            object.insert(key.to_owned(), Value::Object(Map::new()));
        }
        current = object.get_mut(key).expect("present or just inserted");
    }
    match current.as_object_mut() {
        Some(object) => {
            let last = last.as_ref();
            match object.get_mut(last) {
                Some(slot) => *slot = value,
                None => {
                    object.insert(last.to_owned(), value);
                }
            }
            true
        }
        None => false,
    }
}

/// Removes `field` from `dst` and then every parent on the way that is left an empty object, as
/// Kopf's `dicts.remove`. Absent fields, and values on the way that are not objects, are left
/// alone.
pub(crate) fn remove<S: AsRef<str>>(dst: &mut Value, field: &[S]) {
    let Some(object) = dst.as_object_mut() else {
        return;
    };
    match field {
        [] => {}
        [key] => {
            object.remove(key.as_ref());
        }
        [key, rest @ ..] => {
            let key = key.as_ref();
            let Some(child) = object.get_mut(key) else {
                return;
            };
            if !child.is_object() {
                return;
            }
            remove(child, rest);
            if child.as_object().is_some_and(Map::is_empty) {
                object.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(field: &str) -> Vec<String> {
        parse_field(field)
    }

    #[test]
    fn equal_values_give_an_empty_diff() {
        assert!(diff(Some(&json!({"a": [1, 2]})), Some(&json!({"a": [1, 2]}))).is_empty());
        assert!(diff(None, None).is_empty());
    }

    #[test]
    fn a_changed_leaf_is_one_change_item() {
        let d = diff(
            Some(&json!({"spec": {"x": 1}})),
            Some(&json!({"spec": {"x": 2}})),
        );
        assert_eq!(
            d.0,
            vec![DiffItem {
                op: DiffOp::Change,
                field: path("spec.x"),
                old: Some(json!(1)),
                new: Some(json!(2)),
            }]
        );
    }

    #[test]
    fn additions_come_before_removals_and_changes() {
        let d = diff(
            Some(&json!({"a": 1, "c": 1, "z": 1})),
            Some(&json!({"b": 1, "c": 2, "y": 1})),
        );
        let ops: Vec<_> = d.iter().map(|i| (i.op, i.field.join("."))).collect();
        assert_eq!(
            ops,
            vec![
                (DiffOp::Add, "b".to_string()),
                (DiffOp::Add, "y".to_string()),
                (DiffOp::Remove, "a".to_string()),
                (DiffOp::Remove, "z".to_string()),
                (DiffOp::Change, "c".to_string()),
            ]
        );
    }

    #[test]
    fn null_values_count_as_absent() {
        let d = diff(Some(&json!({"a": null})), Some(&json!({"a": 1})));
        assert_eq!(d.0[0].op, DiffOp::Add);
        assert!(diff(Some(&json!({})), Some(&json!({"a": null}))).is_empty());
        assert!(diff(Some(&Value::Null), None).is_empty());
    }

    #[test]
    fn numbers_compare_by_value_as_in_python() {
        assert!(diff(Some(&json!({"a": 1})), Some(&json!({"a": 1.0}))).is_empty());
        assert!(diff(Some(&json!({"a": true})), Some(&json!({"a": 1}))).is_empty());
        assert_eq!(diff(Some(&json!(1.5)), Some(&json!(1))).len(), 1);
    }

    #[test]
    fn lists_change_as_a_whole() {
        let d = diff(Some(&json!({"l": [1, 2]})), Some(&json!({"l": [1, 2, 3]})));
        assert_eq!(d.len(), 1);
        assert_eq!(d.0[0].field, path("l"));
    }

    #[test]
    fn diff_items_serialise_as_kopf_tuples() {
        let d = diff(None, Some(&json!({"x": 1})));
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!([["add", [], null, {"x": 1}]])
        );
    }

    #[test]
    fn reduce_reroots_items_under_the_field() {
        let d = diff(
            Some(&json!({"spec": {"a": {"b": 1}}})),
            Some(&json!({"spec": {"a": {"b": 2}}})),
        );
        let r = d.reduce(&path("spec.a"));
        assert_eq!(r.0[0].field, path("b"));
        assert!(d.reduce(&path("status")).is_empty());
    }

    #[test]
    fn reduce_rediffs_items_above_the_field() {
        let d = diff(None, Some(&json!({"spec": {"a": {"b": 1}}})));
        let r = d.reduce(&path("spec.a"));
        assert_eq!(
            r.0,
            vec![DiffItem {
                op: DiffOp::Add,
                field: vec![],
                old: None,
                new: Some(json!({"b": 1})),
            }]
        );
    }

    #[test]
    fn resolve_stops_at_non_objects() {
        let v = json!({"spec": {"a": "text"}});
        assert_eq!(resolve(&v, &path("spec.a")), Some(&json!("text")));
        assert_eq!(resolve(&v, &path("spec.a.b")), None);
        assert_eq!(resolve::<&str>(&v, &[]), Some(&v));
    }

    #[test]
    fn cherrypick_copies_present_fields_only() {
        let src = json!({"status": {"x": {"y": 1}}, "spec": 1});
        let mut dst = json!({"spec": 2});
        cherrypick(
            &src,
            &mut dst,
            &[path("status.x"), path("status.missing"), path("spec.z")],
        );
        assert_eq!(dst, json!({"spec": 2, "status": {"x": {"y": 1}}}));
    }

    #[test]
    fn remove_drops_parents_left_empty() {
        let mut v = json!({"status": {"kopf": {"progress": {"a": 1}}, "x": 1}});
        remove(&mut v, &path("status.kopf.progress"));
        assert_eq!(v, json!({"status": {"x": 1}}));
        let mut v = json!({"metadata": {"annotations": {"k": "v"}}});
        remove(&mut v, &path("metadata.annotations.k"));
        assert_eq!(v, json!({}));
    }

    #[test]
    fn ensure_creates_parents_and_refuses_to_cross_non_objects() {
        let mut v = Value::Null;
        assert!(ensure(&mut v, &path("a.b"), json!(1)));
        assert_eq!(v, json!({"a": {"b": 1}}));
        let mut v = json!({"a": "text"});
        assert!(!ensure(&mut v, &path("a.b"), json!(1)));
        assert_eq!(v, json!({"a": "text"}));
    }
}
