//! The shared cache: one store per resource, fed by the operator's own watch streams, read by every
//! handler without a request to the API server (controller-runtime's informer cache, kube-rs's
//! reflector `Store`).
//!
//! **Expected flow**: the stream that watches a resource (a supervisor for a resource with
//! reconcile handlers, a cache watch for the kinds they own or watch, see `Reconcile::owns`)
//! applies each event to the resource's [`Store`] *before* it routes the event anywhere; handlers
//! read it through [`Cache`] (`ctx.cache("deployments.v1.apps")`): [`Cache::get`], [`Cache::list`],
//! [`Cache::matching`] (labels), [`Cache::owned_by`] (ownerReferences, indexed).
//!
//! **Guarantees**
//! * **Never older than the trigger.** A handler run because of an event reads a store that has
//!   that event applied already: the stream applies, then routes. So a reconcile triggered by a
//!   child's change sees that change, and the parent's own store holds at least the body the handler
//!   was given.
//! * **Read your own writes.** A handler that just created or changed an object may put the API
//!   server's answer in the store ([`Cache::remember`]): it is kept unless the store already holds
//!   a newer version (resourceVersions compared as numbers when both are numbers, as
//!   java-operator-sdk's `TemporaryResourceCache` does; otherwise the watch wins), so the next run
//!   does not create the object again because the watch has not brought it yet.
//! * A relist (410 Gone, a resume) replaces what its scope held: objects that vanished meanwhile are
//!   removed when the listing completes.
//! * Bounded by what is watched: only kinds that some handler owns, watches or reconciles are
//!   cached; the number of objects and their size (as JSON) are metrics
//!   (`kactor_cache_objects`, `kactor_cache_bytes`), measured when scraped: each object once per
//!   version, outside the store's lock, so that applying an event costs no serialization.
//!
//! Reads take a read lock for a moment and clone `Arc`s: never a copy of a body.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use foldhash::{HashMap, HashSet, HashSetExt};

use kube::api::DynamicObject;

use crate::clients::observe::{CacheSize, Observer};
use crate::clients::slim::Slim;
use crate::structs::names::EventType;
use crate::structs::resources::{Resource, Selector};

/// Changes an object before a related kind's cache keeps it: to drop what handlers never read
/// (kube-rs's `modify`, controller-runtime's `TransformFunc`). `metadata.managedFields` is always
/// dropped first (often half of an object's size; handlers never need it).
pub type Transform = Arc<dyn Fn(&mut DynamicObject) + Send + Sync>;

/// An object's place in a store: its namespace (None for cluster-scoped objects) and name.
pub type CacheKey = (Option<String>, String);

/// One resource's objects, as the operator's watch streams last saw them.
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    resource: Arc<Resource>,
    state: RwLock<State>,
    /// The kind is watched as metadata alone: what a handler remembers is kept so too.
    metadata_only: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct State {
    objects: HashMap<CacheKey, Entry>,
    /// Owner uid -> the keys of the objects that name it in their ownerReferences.
    owners: HashMap<Arc<str>, HashSet<CacheKey>>,
    /// Keys seen by each listing under way, by the listing's namespace (None: all).
    listing: HashMap<Option<String>, HashSet<CacheKey>>,
    /// The size as JSON of the objects measured so far ([`Entry::bytes`]).
    bytes: AtomicUsize,
    /// The objects the watch said were deleted lately, with the version of their deletion: a
    /// handler's answer to an earlier write of one ([`Cache::remember`]) is not taken back in.
    deleted: Tombstones,
}

/// At most this many deletions are remembered (the newest), per store: a handler remembers the
/// answer to its write right after the write, so only the deletions of the last moments matter.
const TOMBSTONES_KEPT: usize = 1024;

/// The keys of lately deleted objects and the versions of their deletions, oldest first.
#[derive(Default)]
struct Tombstones {
    versions: HashMap<CacheKey, String>,
    order: std::collections::VecDeque<CacheKey>,
}

impl Tombstones {
    fn bury(&mut self, key: CacheKey, version: Option<&str>) {
        let Some(version) = version else {
            return;
        };
        if self
            .versions
            .insert(key.clone(), version.to_owned())
            .is_none()
        {
            self.order.push_back(key);
        }
        while self.order.len() > TOMBSTONES_KEPT {
            if let Some(oldest) = self.order.pop_front() {
                self.versions.remove(&oldest);
            }
        }
    }

    /// The object came back (made again): its tombstone goes.
    fn raise(&mut self, key: &CacheKey) {
        if !self.versions.is_empty() && self.versions.remove(key).is_some() {
            self.order.retain(|k| k != key);
        }
    }

    /// Whether `version` of the object is from before its deletion.
    fn outlived(&self, key: &CacheKey, version: Option<&str>) -> bool {
        !self.versions.is_empty()
            && self
                .versions
                .get(key)
                .is_some_and(|deleted| !is_newer(version, Some(deleted)))
    }
}

struct Entry {
    object: Arc<DynamicObject>,
    /// Its size as JSON, measured when the cache's size is first asked after it came; 0 until
    /// then.
    bytes: AtomicUsize,
    owners: Vec<Arc<str>>,
    /// This version is a write of ours, as the server answered it ([`Cache::remember`]); a
    /// newer version from the watch clears it.
    ours: bool,
}

impl Store {
    /// An empty store of `resource`; `observer` may ask its size ([`Observer::cache_served`]).
    pub fn new(resource: Arc<Resource>, observer: Arc<dyn Observer>) -> Self {
        let label = resource.to_string();
        let inner = Arc::new(StoreInner {
            resource,
            state: RwLock::new(State::default()),
            metadata_only: std::sync::atomic::AtomicBool::new(false),
        });
        observer.cache_served(&label, Arc::new(Measure(Arc::downgrade(&inner))));
        Store { inner }
    }

    /// The kind is watched as `PartialObjectMetadata`: the store holds the objects' metadata
    /// alone, and a body a handler remembers ([`Cache::remember`]) is kept as its metadata too, so
    /// that every read of the store looks the same.
    pub fn keep_metadata_only(&self) {
        self.inner
            .metadata_only
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The resource it holds.
    pub fn resource(&self) -> &Arc<Resource> {
        &self.inner.resource
    }

    /// Applies one event of a watch stream: an object listed, added or modified is kept, a deleted
    /// one removed. Returns whether the store changed: an object it already held at the same
    /// version did not change it (a relist, or the event of a write of ours that a handler
    /// remembered, [`Cache::remember`]).
    pub fn apply(&self, event_type: EventType, object: &Arc<DynamicObject>) -> bool {
        let Some(key) = key_of(object) else {
            return false;
        };
        let mut state = self.write();
        if event_type == EventType::Deleted {
            let version = object.metadata.resource_version.as_deref();
            state.deleted.bury(key.clone(), version);
            return state.remove(&key);
        }
        state.deleted.raise(&key);
        if event_type == EventType::Listed {
            for (scope, seen) in &mut state.listing {
                if scope.is_none() || *scope == key.0 {
                    seen.insert(key.clone());
                }
            }
        }
        // Held at this very version: a relist, or the echo of a write of ours remembered from the
        // server's answer (or a repeated event).
        let same = state.objects.get(&key).is_some_and(|e| {
            e.object.metadata.resource_version == object.metadata.resource_version
        });
        if !same {
            state.insert(key, object.clone());
        }
        !same
    }

    /// A listing of `namespace` (None: every namespace) starts: what it does not bring is removed
    /// when it completes ([`Store::listing_done`]).
    pub fn listing_started(&self, namespace: Option<&str>) {
        self.write()
            .listing
            .insert(namespace.map(String::from), HashSet::new());
    }

    /// The listing of `namespace` completed: objects of its scope that it did not bring vanished,
    /// and are removed (and returned).
    pub fn listing_done(&self, namespace: Option<&str>) -> Vec<Arc<DynamicObject>> {
        let mut state = self.write();
        let Some(seen) = state.listing.remove(&namespace.map(String::from)) else {
            return Vec::new();
        };
        let vanished: Vec<CacheKey> = state
            .objects
            .keys()
            .filter(|key| namespace.is_none_or(|ns| key.0.as_deref() == Some(ns)))
            .filter(|key| !seen.contains(*key))
            .cloned()
            .collect();
        let mut removed = Vec::new();
        for key in vanished {
            if let Some(entry) = state.objects.get(&key) {
                removed.push(entry.object.clone());
            }
            state.remove(&key);
        }
        removed
    }

    /// Forgets every object of `namespace` (None: all): the scope is not served any more.
    pub fn forget(&self, namespace: Option<&str>) {
        let mut state = self.write();
        let gone: Vec<CacheKey> = state
            .objects
            .keys()
            .filter(|key| namespace.is_none_or(|ns| key.0.as_deref() == Some(ns)))
            .cloned()
            .collect();
        for key in gone {
            state.remove(&key);
        }
    }

    /// The handle handlers read with.
    pub fn cache(&self) -> Cache {
        Cache {
            store: self.clone(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.inner
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.inner
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A store's size as [`Observer::cache_served`] asks it; it does not keep the store alive.
struct Measure(Weak<StoreInner>);

impl CacheSize for Measure {
    /// Objects not measured since they came are measured now, outside the lock (a burst of events
    /// since the last scrape may be thousands of objects, and the stream's next event must not
    /// wait for them), and counted unless a newer version replaced them meanwhile.
    fn size(&self) -> Option<(usize, usize)> {
        let inner = self.0.upgrade()?;
        let read = || {
            inner
                .state
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let unmeasured: Vec<Arc<DynamicObject>> = read()
            .objects
            .values()
            .filter(|e| e.bytes.load(Ordering::Relaxed) == 0)
            .map(|e| e.object.clone())
            .collect();
        // By address: the objects are kept alive here, so no other can take their place.
        let sizes: HashMap<*const DynamicObject, usize> = unmeasured
            .iter()
            .map(|object| (Arc::as_ptr(object), json_size(object)))
            .collect();
        let state = read();
        if !sizes.is_empty() {
            for entry in state.objects.values() {
                let Some(&size) = sizes.get(&Arc::as_ptr(&entry.object)) else {
                    continue;
                };
                // Another scrape may have measured it meanwhile.
                let measured =
                    entry
                        .bytes
                        .compare_exchange(0, size, Ordering::Relaxed, Ordering::Relaxed);
                if measured.is_ok() {
                    state.bytes.fetch_add(size, Ordering::Relaxed);
                }
            }
        }
        Some((state.objects.len(), state.bytes.load(Ordering::Relaxed)))
    }
}

impl State {
    fn insert(&mut self, key: CacheKey, object: Arc<DynamicObject>) {
        let uids = || {
            object
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|owner| owner.uid.as_str())
        };
        // A newer version of a held object with the same owners (most changes): replaced in place,
        // the owners' index as it is.
        if let Some(entry) = self.objects.get_mut(&key) {
            if entry.owners.iter().map(|uid| &**uid).eq(uids()) {
                uncount(&mut self.bytes, entry);
                *entry = Entry {
                    object,
                    bytes: AtomicUsize::new(0),
                    owners: std::mem::take(&mut entry.owners),
                    ours: false,
                };
                return;
            }
        }
        self.remove(&key);
        let owners: Vec<Arc<str>> = object
            .metadata
            .owner_references
            .iter()
            .flatten()
            .map(|owner| Arc::from(owner.uid.as_str()))
            .collect();
        for owner in &owners {
            self.owners
                .entry(owner.clone())
                .or_default()
                .insert(key.clone());
        }
        self.objects.insert(
            key,
            Entry {
                object,
                bytes: AtomicUsize::new(0),
                owners,
                ours: false,
            },
        );
    }

    /// Removes the object; whether it was held.
    fn remove(&mut self, key: &CacheKey) -> bool {
        let Some(mut entry) = self.objects.remove(key) else {
            return false;
        };
        uncount(&mut self.bytes, &mut entry);
        for owner in entry.owners {
            if let Some(owned) = self.owners.get_mut(&owner) {
                owned.remove(key);
                if owned.is_empty() {
                    self.owners.remove(&owner);
                }
            }
        }
        true
    }
}

/// Takes an entry going away (replaced or removed) out of the measured total.
fn uncount(total: &mut AtomicUsize, entry: &mut Entry) {
    let total = total.get_mut();
    *total = total.saturating_sub(*entry.bytes.get_mut());
}

/// A resource's cache, as a handler reads it (`ctx.cache(..)`).
///
/// ```
/// # use kactor_reactor::handlers::{Ctx, HandlerError};
/// async fn nodes(ctx: Ctx) -> Result<Vec<String>, HandlerError> {
///     let pods = ctx.cache("pods")?;
///     let ns = ctx.namespace().unwrap_or_default();
///     Ok(pods
///         .matching(Some(ns), &[("app", "memcached"), ("memcached_cr", ctx.name())])
///         .iter()
///         .filter_map(|pod| pod.metadata.name.clone())
///         .collect())
/// }
/// ```
#[derive(Clone)]
pub struct Cache {
    store: Store,
}

impl Cache {
    /// The resource it holds.
    pub fn resource(&self) -> &Resource {
        &self.store.inner.resource
    }

    /// The object named `name` in `namespace` (None for cluster-scoped objects).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<DynamicObject>> {
        let key = (namespace.map(String::from), name.to_string());
        self.store
            .read()
            .objects
            .get(&key)
            .map(|e| e.object.clone())
    }

    /// Every object in `namespace` (None: in every namespace), in no particular order.
    pub fn list(&self, namespace: Option<&str>) -> Vec<Arc<DynamicObject>> {
        self.filter(namespace, |_| true)
    }

    /// The objects in `namespace` (None: everywhere) whose labels include every pair given
    /// (controller-runtime's `client.MatchingLabels`).
    pub fn matching(
        &self,
        namespace: Option<&str>,
        labels: &[(&str, &str)],
    ) -> Vec<Arc<DynamicObject>> {
        self.filter(namespace, |object| {
            has_labels(object.metadata.labels.as_ref(), labels)
        })
    }

    /// The objects in `namespace` (None: everywhere) that pass `keep`.
    pub fn filter(
        &self,
        namespace: Option<&str>,
        keep: impl Fn(&DynamicObject) -> bool,
    ) -> Vec<Arc<DynamicObject>> {
        self.store
            .read()
            .objects
            .iter()
            .filter(|(key, _)| namespace.is_none_or(|ns| key.0.as_deref() == Some(ns)))
            .filter(|(_, entry)| keep(&entry.object))
            .map(|(_, entry)| entry.object.clone())
            .collect()
    }

    /// The objects whose ownerReferences name `owner` (by uid; any owner, controller or not).
    pub fn owned_by(&self, owner: &DynamicObject) -> Vec<Arc<DynamicObject>> {
        let Some(uid) = owner.metadata.uid.as_deref() else {
            return Vec::new();
        };
        let state = self.store.read();
        state
            .owners
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|key| state.objects.get(key).map(|e| e.object.clone()))
            .collect()
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.store.read().objects.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The API of the cached resource in `namespace` (None: cluster-scoped, or every namespace),
    /// for the writes whose answers the handler [remembers](Self::remember). Its objects are
    /// [`Slim`]: decoded as the cache keeps them, without `metadata.managedFields` (which a real
    /// API server sends with every answer) and in one pass, instead of through
    /// `DynamicObject`'s buffered `#[serde(flatten)]`.
    ///
    /// ```
    /// # use kactor_reactor::handlers::{Ctx, HandlerError};
    /// # use kactor_reactor::slim::Slim;
    /// use kube::api::{DynamicObject, PostParams};
    /// use serde_json::json;
    ///
    /// async fn make_child(ctx: &Ctx) -> Result<(), HandlerError> {
    ///     let children = ctx.cache("configmaps")?;
    ///     let mut child = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"size": "3"}});
    ///     ctx.adopt(&mut child)?;
    ///     let child: DynamicObject = serde_json::from_value(child)?;
    ///     let api = children.api(ctx.client(), ctx.namespace());
    ///     let made = api.create(&PostParams::default(), &Slim(child)).await?;
    ///     children.remember(made.into_inner());
    ///     Ok(())
    /// }
    /// ```
    pub fn api(&self, client: kube::Client, namespace: Option<&str>) -> kube::Api<Slim> {
        crate::clients::slim::api(client, namespace, &self.resource().api_resource())
    }

    /// Keeps an object as the API server answered a write of ours (a create, a patch), so that the
    /// next read sees it before the watch brings it. Ignored when the store already has a newer
    /// version of it, or when the watch said since that it was deleted (the write's events and its
    /// deletion's may all come before the handler remembers it); the watch's next event replaces
    /// it. Returns whether it was kept.
    pub fn remember(&self, mut object: DynamicObject) -> bool {
        let Some(key) = key_of(&object) else {
            return false;
        };
        // Kept as the watch keeps objects: never with managedFields (the answer to a handler's
        // own request has them), and as metadata alone for a metadata-only kind.
        object.metadata.managed_fields = None;
        if self
            .store
            .inner
            .metadata_only
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            object.types = None;
            object.data = serde_json::Value::Object(serde_json::Map::new());
        }
        let mut state = self.store.write();
        if state
            .deleted
            .outlived(&key, object.metadata.resource_version.as_deref())
        {
            // The watch already said it was deleted since: a ghost, not kept.
            return false;
        }
        if let Some(held) = state.objects.get_mut(&key) {
            let version = object.metadata.resource_version.as_deref();
            let held_version = held.object.metadata.resource_version.as_deref();
            if version.is_some() && version == held_version {
                // The watch brought this very write first: it is ours all the same.
                held.ours = true;
                return false;
            }
            if !is_newer(version, held_version) {
                return false;
            }
        }
        state.insert(key.clone(), Arc::new(object));
        if let Some(entry) = state.objects.get_mut(&key) {
            entry.ours = true;
        }
        true
    }

    /// Forgets an object we deleted, so that the next read does not find it before the watch says
    /// it is gone.
    pub fn forget(&self, namespace: Option<&str>, name: &str) {
        let key = (namespace.map(String::from), name.to_string());
        let mut state = self.store.write();
        state.remove(&key);
    }
}

/// The operator's caches, by resource: what `ctx.cache(..)` looks in.
#[derive(Clone, Default)]
pub struct Caches {
    stores: Arc<RwLock<Vec<Store>>>,
}

/// Why a cache cannot be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheError {
    /// No handler owns, watches or reconciles the resource, so it is not cached.
    #[error("`{0}` is not cached: name it in a reconcile handler's `owns`, `watches` or `cache` (or reconcile it)")]
    NotCached(String),
}

impl Caches {
    /// The store of `resource`, made (empty) if there is none yet.
    pub fn store(&self, resource: &Arc<Resource>, observer: &Arc<dyn Observer>) -> Store {
        let mut stores = self
            .stores
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(store) = stores.iter().find(|s| **s.resource() == **resource) {
            return store.clone();
        }
        let store = Store::new(resource.clone(), observer.clone());
        stores.push(store.clone());
        store
    }

    /// Whether `version` of this object is the newest the cache of `resource` holds, and a write
    /// of ours that a handler remembered ([`Cache::remember`]): its event is not news to the
    /// operator.
    pub fn ours(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        version: &str,
    ) -> bool {
        let stores = self
            .stores
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(store) = stores.iter().find(|s| **s.resource() == *resource) else {
            return false;
        };
        let key = (namespace.map(String::from), name.to_string());
        let ours = store.read().objects.get(&key).is_some_and(|e| {
            e.ours && e.object.metadata.resource_version.as_deref() == Some(version)
        });
        ours
    }

    /// The cache of the resource `selector` names.
    pub fn get(&self, selector: &Selector) -> Result<Cache, CacheError> {
        let stores = self
            .stores
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        stores
            .iter()
            .filter(|s| selector.matches(s.resource()))
            // The preferred version when the selector names none.
            .max_by_key(|s| s.resource().preferred)
            .map(Store::cache)
            .ok_or_else(|| CacheError::NotCached(selector_text(selector)))
    }
}

fn selector_text(selector: &Selector) -> String {
    match (&selector.version, &selector.group) {
        (Some(version), Some(group)) if !group.is_empty() => {
            format!("{}.{version}.{group}", selector.name)
        }
        (Some(version), _) => format!("{}.{version}", selector.name),
        (None, Some(group)) if !group.is_empty() => format!("{}.{group}", selector.name),
        _ => selector.name.clone(),
    }
}

fn key_of(object: &DynamicObject) -> Option<CacheKey> {
    let name = object.metadata.name.clone()?;
    Some((object.metadata.namespace.clone(), name))
}

fn has_labels(labels: Option<&BTreeMap<String, String>>, wanted: &[(&str, &str)]) -> bool {
    wanted.iter().all(|(key, value)| {
        labels
            .and_then(|labels| labels.get(*key))
            .is_some_and(|v| v == value)
    })
}

/// Whether version `a` is newer than `b`: as numbers when both are (etcd's revisions); otherwise a
/// different version counts as newer only when `b` is unknown.
fn is_newer(a: Option<&str>, b: Option<&str>) -> bool {
    match (a.map(str::parse::<u64>), b.map(str::parse::<u64>)) {
        (Some(Ok(a)), Some(Ok(b))) => a > b,
        (Some(_), None) => true,
        _ => false,
    }
}

/// The size of the object as JSON, counted without keeping the text.
fn json_size(object: &DynamicObject) -> usize {
    struct Counter(usize);
    impl io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, object);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::observe::NoObserver;
    use serde_json::json;

    fn pods() -> Arc<Resource> {
        Arc::new(Resource {
            group: String::new(),
            version: "v1".into(),
            plural: "pods".into(),
            kind: "Pod".into(),
            singular: "pod".into(),
            short_names: vec!["po".into()],
            categories: vec![],
            namespaced: true,
            preferred: true,
            verbs: vec![],
            subresources: vec![],
        })
    }

    fn pod(ns: &str, name: &str, rv: &str, owner: Option<&str>, app: &str) -> Arc<DynamicObject> {
        let mut value = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "uid": format!("uid-{name}"),
                         "labels": {"app": app}},
        });
        if let Some(owner) = owner {
            value["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": owner, "controller": true
            }]);
        }
        Arc::new(serde_json::from_value(value).unwrap())
    }

    /// The owner the pods name by `uid`.
    fn replica_set(uid: &str) -> DynamicObject {
        serde_json::from_value(json!({"metadata": {"name": "rs", "uid": uid}})).unwrap()
    }

    fn store() -> Store {
        Store::new(pods(), Arc::new(NoObserver))
    }

    #[test]
    fn events_keep_the_newest_and_deletions_remove() {
        let store = store();
        let cache = store.cache();
        store.apply(EventType::Added, &pod("a", "p1", "1", None, "web"));
        store.apply(EventType::Modified, &pod("a", "p1", "2", None, "web"));
        store.apply(EventType::Added, &pod("b", "p2", "3", None, "db"));
        assert_eq!(cache.len(), 2);
        let p1 = cache.get(Some("a"), "p1").unwrap();
        assert_eq!(p1.metadata.resource_version.as_deref(), Some("2"));
        assert!(cache.get(Some("b"), "p1").is_none());
        assert_eq!(cache.list(Some("b")).len(), 1);
        assert_eq!(cache.list(None).len(), 2);
        store.apply(EventType::Deleted, &pod("a", "p1", "4", None, "web"));
        assert!(cache.get(Some("a"), "p1").is_none());
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn labels_and_owners_select_objects() {
        let store = store();
        let cache = store.cache();
        store.apply(EventType::Added, &pod("a", "p1", "1", Some("o1"), "web"));
        store.apply(EventType::Added, &pod("a", "p2", "2", Some("o1"), "db"));
        store.apply(EventType::Added, &pod("a", "p3", "3", Some("o2"), "web"));
        let web = cache.matching(Some("a"), &[("app", "web")]);
        assert_eq!(web.len(), 2);
        assert!(cache
            .matching(Some("a"), &[("app", "web"), ("tier", "x")])
            .is_empty());
        let owner = replica_set("o1");
        let mut owned: Vec<_> = cache
            .owned_by(&owner)
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        owned.sort();
        assert_eq!(owned, ["p1", "p2"]);
        // An owner changed: the index follows.
        store.apply(EventType::Modified, &pod("a", "p2", "4", Some("o2"), "db"));
        assert_eq!(cache.owned_by(&owner).len(), 1);
        store.apply(EventType::Deleted, &pod("a", "p1", "5", Some("o1"), "web"));
        assert!(cache.owned_by(&owner).is_empty());
    }

    #[test]
    fn a_newer_version_with_the_same_owners_keeps_the_index_and_the_byte_count_true() {
        let store = store();
        let cache = store.cache();
        let owner = replica_set("o1");
        store.apply(EventType::Added, &pod("a", "p1", "1", Some("o1"), "web"));
        store.apply(EventType::Added, &pod("a", "p2", "2", Some("o1"), "web"));
        let longer = pod("a", "p1", "3", Some("o1"), "a-much-longer-label-value");
        store.apply(EventType::Modified, &longer);
        cache.remember((*pod("a", "p2", "4", Some("o1"), "db")).clone());
        let mut owned: Vec<_> = cache
            .owned_by(&owner)
            .iter()
            .map(|p| p.metadata.resource_version.clone().unwrap())
            .collect();
        owned.sort();
        assert_eq!(owned, ["3", "4"]);
        let sizes = json_size(&longer) + json_size(&pod("a", "p2", "4", Some("o1"), "db"));
        let measure = Measure(Arc::downgrade(&store.inner));
        assert_eq!(measure.size(), Some((2, sizes)));
        assert_eq!(store.read().owners.len(), 1);
    }

    #[test]
    fn a_relist_removes_what_vanished_in_its_scope_only() {
        let store = store();
        let cache = store.cache();
        store.apply(EventType::Added, &pod("a", "p1", "1", None, "web"));
        store.apply(EventType::Added, &pod("a", "p2", "2", None, "web"));
        store.apply(EventType::Added, &pod("b", "p3", "3", None, "web"));
        store.listing_started(Some("a"));
        assert!(!store.apply(EventType::Listed, &pod("a", "p2", "2", None, "web")));
        assert!(store.apply(EventType::Listed, &pod("a", "p3", "9", None, "web")));
        let vanished = store.listing_done(Some("a"));
        assert_eq!(vanished.len(), 1);
        assert_eq!(vanished[0].metadata.name.as_deref(), Some("p1"));
        assert!(cache.get(Some("a"), "p1").is_none());
        assert!(cache.get(Some("a"), "p2").is_some());
        assert!(
            cache.get(Some("b"), "p3").is_some(),
            "another namespace's listing"
        );
        store.listing_started(None);
        assert_eq!(store.listing_done(None).len(), 3);
        assert!(cache.is_empty());
    }

    #[test]
    fn our_own_writes_are_read_until_the_watch_is_newer() {
        let store = store();
        let cache = store.cache();
        // Created by a handler: the watch has not brought it yet.
        assert!(cache.remember((*pod("a", "p1", "5", None, "web")).clone()));
        assert!(cache.get(Some("a"), "p1").is_some());
        // The watch brings an older version (an event already in flight): ours stays newer...
        assert!(!cache.remember((*pod("a", "p1", "4", None, "web")).clone()));
        store.apply(EventType::Modified, &pod("a", "p1", "7", None, "web"));
        // ...and a write answered with an older version than the watch's is not kept.
        assert!(!cache.remember((*pod("a", "p1", "6", None, "web")).clone()));
        assert_eq!(
            cache
                .get(Some("a"), "p1")
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("7")
        );
        cache.forget(Some("a"), "p1");
        assert!(cache.is_empty());
    }

    #[test]
    fn caches_are_found_by_the_names_users_write() {
        let caches = Caches::default();
        let observer: Arc<dyn Observer> = Arc::new(NoObserver);
        let store = caches.store(&pods(), &observer);
        store.apply(EventType::Added, &pod("a", "p1", "1", None, "web"));
        for name in ["pods", "pods.v1", "po", "Pod"] {
            assert_eq!(
                caches.get(&Selector::parse(name)).unwrap().len(),
                1,
                "{name}"
            );
        }
        // The same store for the same resource.
        assert_eq!(caches.store(&pods(), &observer).cache().len(), 1);
        let error = caches
            .get(&Selector::parse("deployments.v1.apps"))
            .err()
            .unwrap();
        assert!(error
            .to_string()
            .contains("`deployments.v1.apps` is not cached"));
    }

    #[test]
    fn the_size_in_bytes_follows_the_objects_measured_when_asked() {
        #[derive(Default)]
        struct Sizes(std::sync::Mutex<Vec<(String, Arc<dyn CacheSize>)>>);
        impl Observer for Sizes {
            fn cache_served(&self, resource: &str, size: Arc<dyn CacheSize>) {
                self.0.lock().unwrap().push((resource.to_string(), size));
            }
        }
        let sizes = Arc::new(Sizes::default());
        let store = Store::new(pods(), sizes.clone());
        let (label, size) = sizes.0.lock().unwrap()[0].clone();
        assert_eq!(label, "pods.v1");
        assert_eq!(size.size(), Some((0, 0)));
        let json = |object: &DynamicObject| serde_json::to_vec(object).unwrap().len();

        let p1 = pod("a", "p1", "1", None, "web");
        store.apply(EventType::Added, &p1);
        assert_eq!(size.size(), Some((1, json(&p1))));
        // Asked again: measured once, the same.
        assert_eq!(size.size(), Some((1, json(&p1))));

        // A newer version (longer), and a second object, between two asks.
        let p1b = pod("a", "p1", "2", None, "a-longer-label-value");
        let p2 = pod("a", "p2", "3", Some("o1"), "web");
        store.apply(EventType::Modified, &p1b);
        store.apply(EventType::Added, &p2);
        assert_eq!(size.size(), Some((2, json(&p1b) + json(&p2))));
        // Replaced before it was measured, then removed: nothing of it stays counted.
        store.apply(EventType::Modified, &pod("a", "p2", "4", Some("o1"), "web"));
        store.apply(EventType::Deleted, &p2);
        assert_eq!(size.size(), Some((1, json(&p1b))));
        store.apply(EventType::Deleted, &p1b);
        assert_eq!(size.size(), Some((0, 0)));

        // A write of ours (made again after the deletion), remembered, counts as the watch's
        // would.
        let p1c = pod("a", "p1", "9", None, "web");
        assert!(store.cache().remember((*p1c).clone()));
        assert_eq!(size.size(), Some((1, json(&p1c))));

        drop(store);
        assert_eq!(size.size(), None, "the store is gone");
    }

    /// The watch brought a child's creation and its deletion before the handler that made it
    /// remembers the answer to its create: the deleted child is not taken back in (it would be
    /// read as existing until the next listing). Made again, newer, it is.
    #[test]
    fn a_write_answered_before_its_deletion_is_not_remembered_after_it() {
        let store = store();
        let cache = store.cache();
        store.apply(EventType::Added, &pod("a", "p1", "5", None, "web"));
        store.apply(EventType::Deleted, &pod("a", "p1", "6", None, "web"));
        assert!(!cache.remember((*pod("a", "p1", "5", None, "web")).clone()));
        assert!(cache.get(Some("a"), "p1").is_none());
        assert!(cache.remember((*pod("a", "p1", "8", None, "web")).clone()));
        assert!(cache.get(Some("a"), "p1").is_some());
        // Made again and seen by the watch: the tombstone goes with it, and the next deletion
        // makes one anew.
        store.apply(EventType::Deleted, &pod("a", "p2", "9", None, "web"));
        store.apply(EventType::Added, &pod("a", "p2", "10", None, "web"));
        assert!(!cache.remember((*pod("a", "p2", "10", None, "web")).clone()));
        assert!(cache.get(Some("a"), "p2").is_some());
        store.apply(EventType::Deleted, &pod("a", "p2", "11", None, "web"));
        assert!(!cache.remember((*pod("a", "p2", "10", None, "web")).clone()));
        assert!(cache.get(Some("a"), "p2").is_none());

        // Only the newest deletions are kept.
        for n in 0..TOMBSTONES_KEPT + 10 {
            store.apply(
                EventType::Deleted,
                &pod("b", &format!("q{n}"), &(100 + n).to_string(), None, "web"),
            );
        }
        let state = store.write();
        assert_eq!(state.deleted.versions.len(), TOMBSTONES_KEPT);
        assert_eq!(state.deleted.order.len(), TOMBSTONES_KEPT);
        assert!(!state
            .deleted
            .versions
            .contains_key(&(Some("b".into()), "q0".into())));
    }

    #[test]
    fn a_remembered_write_is_ours_until_a_newer_version_comes() {
        let caches = Caches::default();
        let store = caches.store(&pods(), &(Arc::new(NoObserver) as Arc<dyn Observer>));
        let cache = store.cache();
        let ours = |rv: &str| caches.ours(&pods(), Some("a"), "p1", rv);
        // Remembered first: the watch's event of the same version changes nothing (no trigger).
        assert!(cache.remember((*pod("a", "p1", "5", None, "web")).clone()));
        assert!(ours("5"));
        assert!(!store.apply(EventType::Added, &pod("a", "p1", "5", None, "web")));
        assert!(ours("5"));
        // Someone else's change: newer, not ours.
        assert!(store.apply(EventType::Modified, &pod("a", "p1", "6", None, "web")));
        assert!(!ours("6") && !ours("5"));
        // The watch first, then the handler remembers the same version: ours all the same.
        assert!(store.apply(EventType::Modified, &pod("a", "p1", "7", None, "web")));
        assert!(!ours("7"));
        assert!(!cache.remember((*pod("a", "p1", "7", None, "web")).clone()));
        assert!(ours("7"));
        assert!(!caches.ours(&pods(), Some("a"), "p2", "7"), "not held");
    }
}
