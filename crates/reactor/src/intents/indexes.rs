//! In-memory indexes (Kopf's `@kopf.index`, `reference/kopf.md` §1.15): what index handlers return for
//! each object, gathered by key across the objects of a resource, read by any handler
//! (`ctx.index("by_owner")`).
//!
//! **Expected flow**: in each cycle of an object, before anything else, the resource's index
//! handlers run on the object's body; each result replaces what the object gave that index before:
//! * an object (a JSON map) is merged per key: each entry's value goes under its key;
//! * any other value goes under the key `None` (Kopf's non-dict result);
//! * null (`()`, `None`) indexes nothing and keeps what the object gave before.
//!
//! What an object gave is removed when it is deleted, when it no longer passes the handler's
//! filters, and, per the handler's errors mode, when the handler fails: `Ignored` (the default)
//! keeps the stale values, `Permanent` and `Temporary` remove them (Kopf's modes).
//!
//! **Readiness**: resource handlers run only once the indexes are populated: every stream of an
//! indexed resource that the operator started with has finished its first listing, and each
//! object of that listing has been indexed once ([`Indexes::ready`]). Index handlers themselves
//! never wait; activities (`on_startup`) have no such guarantee, as in Kopf.
//!
//! **Guarantees**: a reader sees a whole update of one object or none of it (one lock); values are
//! shared (`Arc`), never copied on read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::Value;
use tokio::sync::watch;

/// An index's key: the key of a map result, or None for any other result.
pub type IndexKey = Option<String>;

/// One index: key -> (object -> value).
#[derive(Default)]
struct IndexData {
    entries: HashMap<IndexKey, BTreeMap<Arc<str>, Arc<Value>>>,
    /// Object -> the keys it gave (to remove them).
    given: HashMap<Arc<str>, Vec<IndexKey>>,
}

impl IndexData {
    fn remove(&mut self, object: &str) {
        let Some(keys) = self.given.remove(object) else {
            return;
        };
        for key in keys {
            if let Some(values) = self.entries.get_mut(&key) {
                values.remove(object);
                if values.is_empty() {
                    self.entries.remove(&key);
                }
            }
        }
    }

    fn replace(&mut self, object: &Arc<str>, result: &Value) {
        let pairs: Vec<(IndexKey, Value)> = match result {
            Value::Null => return,
            Value::Object(map) => map
                .iter()
                .map(|(key, value)| (Some(key.clone()), value.clone()))
                .collect(),
            other => vec![(None, other.clone())],
        };
        self.remove(object);
        let mut keys = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            self.entries
                .entry(key.clone())
                .or_default()
                .insert(object.clone(), Arc::new(value));
            keys.push(key);
        }
        self.given.insert(object.clone(), keys);
    }
}

/// Every index of the operator, by the id of its handler.
#[derive(Clone, Default)]
pub struct Indexes {
    inner: Arc<IndexesInner>,
}

#[derive(Default)]
struct IndexesInner {
    indexes: RwLock<HashMap<String, IndexData>>,
    readiness: Mutex<Readiness>,
    ready: ReadySignal,
}

/// The streams and objects the first population waits for.
#[derive(Default)]
struct Readiness {
    /// Streams (by label) not listed yet.
    unlisted: HashSet<String>,
    /// Objects of the first listings not indexed yet.
    unindexed: HashSet<Arc<str>>,
    /// Objects indexed before their listing completed.
    indexed: HashSet<Arc<str>>,
    /// Readiness has been reached (it stays).
    reached: bool,
}

struct ReadySignal(watch::Sender<bool>);

impl Default for ReadySignal {
    fn default() -> Self {
        ReadySignal(watch::channel(true).0)
    }
}

impl Indexes {
    /// Makes the index `id` (empty) if it is not there yet.
    pub fn declare(&self, id: &str) {
        self.write().entry(id.to_string()).or_default();
    }

    /// The first population waits for the stream `label` to list, and for each object it lists to
    /// be indexed. Called before the stream starts.
    pub fn expect_stream(&self, label: &str) {
        let mut readiness = self.readiness();
        if readiness.reached {
            return;
        }
        readiness.unlisted.insert(label.to_string());
        self.inner.ready.0.send_replace(false);
    }

    /// The stream `label` finished its first listing, with these objects.
    pub fn stream_listed(&self, label: &str, objects: impl IntoIterator<Item = Arc<str>>) {
        let mut readiness = self.readiness();
        if readiness.reached || !readiness.unlisted.remove(label) {
            return;
        }
        for object in objects {
            if !readiness.indexed.remove(&object) {
                readiness.unindexed.insert(object);
            }
        }
        self.settle(&mut readiness);
    }

    /// The object was indexed (its cycle ran the index handlers), whatever came of it.
    pub fn indexed(&self, object: &Arc<str>) {
        let mut readiness = self.readiness();
        if readiness.reached {
            return;
        }
        if !readiness.unindexed.remove(object) {
            readiness.indexed.insert(object.clone());
        }
        self.settle(&mut readiness);
    }

    /// Whether the indexes are populated (nothing to wait for).
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.0.borrow()
    }

    /// Waits until the indexes are populated.
    pub async fn ready(&self) {
        let mut ready = self.inner.ready.0.subscribe();
        // The sender lives as long as `self`: the wait ends only when ready.
        let _ = ready.wait_for(|ready| *ready).await;
    }

    fn settle(&self, readiness: &mut Readiness) {
        if readiness.unlisted.is_empty() && readiness.unindexed.is_empty() {
            readiness.reached = true;
            readiness.indexed = HashSet::new();
            self.inner.ready.0.send_replace(true);
        }
    }

    /// The object's result for the index `id` replaces what it gave before (null keeps it).
    pub fn replace(&self, id: &str, object: &Arc<str>, result: &Value) {
        self.write()
            .entry(id.to_string())
            .or_default()
            .replace(object, result);
    }

    /// Removes what the object gave the index `id`.
    pub fn remove(&self, id: &str, object: &str) {
        if let Some(index) = self.write().get_mut(id) {
            index.remove(object);
        }
    }

    /// The index `id` as handlers read it; None if no index handler has that id.
    pub fn get(&self, id: &str) -> Option<Index> {
        self.read().contains_key(id).then(|| Index {
            indexes: self.clone(),
            id: Arc::from(id),
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, IndexData>> {
        self.inner
            .indexes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, IndexData>> {
        self.inner
            .indexes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn readiness(&self) -> std::sync::MutexGuard<'_, Readiness> {
        self.inner
            .readiness
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One index, as handlers read it (Kopf's `kopf.Index`): a mapping of keys to the values the
/// objects gave under them (Kopf's `kopf.Store`), in no particular order.
///
/// ```
/// # use kactor_reactor::handlers::{Ctx, HandlerError};
/// async fn pods_on_node(ctx: Ctx) -> Result<usize, HandlerError> {
///     let by_node = ctx.index("by_node")?;
///     Ok(by_node.get(Some("node-1")).len())
/// }
/// ```
#[derive(Clone)]
pub struct Index {
    indexes: Indexes,
    id: Arc<str>,
}

impl Index {
    /// The values under `key` (None: the key of non-map results).
    pub fn get(&self, key: Option<&str>) -> Vec<Arc<Value>> {
        let indexes = self.indexes.read();
        indexes
            .get(&*self.id)
            .and_then(|index| index.entries.get(&key.map(String::from)))
            .map(|values| values.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The values under `key`, each as a `T`; values that are not a `T` are left out.
    pub fn get_as<T: serde::de::DeserializeOwned>(&self, key: Option<&str>) -> Vec<T> {
        self.get(key)
            .iter()
            .filter_map(|value| T::deserialize(&**value).ok())
            .collect()
    }

    /// Whether some object gave a value under `key`.
    pub fn contains(&self, key: Option<&str>) -> bool {
        let indexes = self.indexes.read();
        indexes
            .get(&*self.id)
            .is_some_and(|index| index.entries.contains_key(&key.map(String::from)))
    }

    /// Every key with at least one value.
    pub fn keys(&self) -> Vec<IndexKey> {
        let indexes = self.indexes.read();
        indexes
            .get(&*self.id)
            .map(|index| index.entries.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// How many keys have values.
    pub fn len(&self) -> usize {
        let indexes = self.indexes.read();
        indexes
            .get(&*self.id)
            .map_or(0, |index| index.entries.len())
    }

    /// Whether no key has values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why an index cannot be read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("there is no index `{0}`: register an index handler with this id (Operator::index)")]
pub struct NoIndex(pub String);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    fn sorted(values: Vec<Arc<Value>>) -> Vec<Value> {
        let mut values: Vec<Value> = values.iter().map(|v| (**v).clone()).collect();
        values.sort_by_key(ToString::to_string);
        values
    }

    #[test]
    fn results_are_merged_per_key_as_kopf_merges_them() {
        let indexes = Indexes::default();
        indexes.declare("by_node");
        let index = indexes.get("by_node").unwrap();
        indexes.replace("by_node", &key("p1"), &json!({"node-1": "p1", "zone-a": 1}));
        indexes.replace("by_node", &key("p2"), &json!({"node-1": "p2"}));
        indexes.replace("by_node", &key("p3"), &json!("not a map"));
        assert_eq!(
            sorted(index.get(Some("node-1"))),
            [json!("p1"), json!("p2")]
        );
        assert_eq!(sorted(index.get(None)), [json!("not a map")]);
        assert_eq!(index.get_as::<i64>(Some("zone-a")), [1]);
        assert_eq!(index.len(), 3);
        // A new result replaces the object's old one; null keeps it.
        indexes.replace("by_node", &key("p1"), &json!({"node-2": "p1"}));
        indexes.replace("by_node", &key("p2"), &Value::Null);
        assert_eq!(sorted(index.get(Some("node-1"))), [json!("p2")]);
        assert!(!index.contains(Some("zone-a")), "empty keys are removed");
        assert!(index.contains(Some("node-2")));
        indexes.remove("by_node", "p2");
        indexes.remove("by_node", "p3");
        let mut keys = index.keys();
        keys.sort();
        assert_eq!(keys, [Some("node-2".to_string())]);
        assert!(indexes.get("other").is_none());
    }

    #[tokio::test]
    async fn readiness_waits_for_every_stream_and_every_listed_object() {
        let indexes = Indexes::default();
        assert!(indexes.is_ready(), "nothing indexed: nothing to wait for");
        indexes.expect_stream("pods");
        indexes.expect_stream("nodes");
        assert!(!indexes.is_ready());
        // Indexed before its stream's listing completed: counted all the same.
        indexes.indexed(&key("p1"));
        indexes.stream_listed("pods", [key("p1"), key("p2")]);
        assert!(!indexes.is_ready());
        indexes.stream_listed("nodes", [key("n1")]);
        indexes.indexed(&key("p2"));
        assert!(!indexes.is_ready());
        let waiting = tokio::spawn({
            let indexes = indexes.clone();
            async move { indexes.ready().await }
        });
        indexes.indexed(&key("n1"));
        assert!(indexes.is_ready());
        waiting.await.unwrap();
        // Once reached, it stays: later streams do not hold handlers back.
        indexes.expect_stream("later");
        assert!(indexes.is_ready());
    }
}
