//! The objects, their history, and every rule of how a write changes them.
//!
//! One [`State`] behind one lock holds every collection, so a single resourceVersion counter orders all
//! writes, as etcd's revision does. Each collection keeps its objects in key order (namespace, name), and
//! a bounded history of its events for watches and consistent paginated lists; a watcher is woken through
//! a `tokio::sync::watch` channel and copies the events it has not seen yet out of the history.
//!
//! **Guarantees**
//! * Every write that changes an object gets a new resourceVersion and exactly one event; a write that
//!   changes nothing (a no-op update or patch) is not stored and has no event, as in the API server.
//! * `metadata.generation` starts at 1 and grows only when something other than metadata (and status,
//!   for kinds with a status subresource) changes.
//! * Deleting an object with finalizers only sets `deletionTimestamp`; the write that removes its last
//!   finalizer deletes it. Dependents whose owners are all gone are deleted (background propagation),
//!   or orphaned, or deleted first (foreground), as the DeleteOptions ask.
//! * Deleting a namespace deletes everything in it; the namespace goes when it is empty.
//! * Creating a CustomResourceDefinition serves its kind at once; deleting it drops its objects.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use crate::patch::{self, PatchKind};
use crate::registry::{self, GroupResource, ResourceType};
use crate::schema;
use crate::status::{ApiError, ApiResult, Cause};
use crate::validation::validate_metadata;

/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub type ObjKey = (String, String);

/// A watch event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object appeared.
    Added,
    /// The object changed.
    Modified,
    /// The object is gone; the event carries its last state.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change in a collection's history.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion of the write.
    pub rv: u64,
    /// What happened.
    pub type_: EventType,
    /// Which object.
    pub key: ObjKey,
    /// The object after the write (for deletions: its last state).
    pub object: Arc<Value>,
    /// The object before the write (None for additions).
    pub old: Option<Arc<Value>>,
    /// The watch line `{"type":...,"object":...}\n`, encoded once for all watchers.
    encoded: OnceLock<Bytes>,
}

impl Event {
    /// The encoded watch line with this event's own type and the object as stored.
    pub fn encoded(&self) -> Bytes {
        self.encoded
            .get_or_init(|| encode_event(self.type_.as_str(), &self.object))
            .clone()
    }
}

/// Encodes one watch line.
pub fn encode_event(type_: &str, object: &Value) -> Bytes {
    let mut line = Vec::with_capacity(256);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(type_.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    // Serialising a Value into a Vec cannot fail: keys are strings and there are no I/O errors.
    serde_json::to_writer(&mut line, object).unwrap_or_default();
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// One kind's objects and history.
pub struct Collection {
    /// The kind (replaced when its CRD changes).
    pub rtype: Arc<ResourceType>,
    /// Whether it is served (false once its CRD is deleted).
    pub served: bool,
    /// The objects in key order.
    pub objects: BTreeMap<ObjKey, Arc<Value>>,
    /// The kept history, oldest first.
    log: VecDeque<Arc<Event>>,
    /// Events with a resourceVersion up to this one may have been dropped from the history.
    compacted: u64,
    /// Wakes watchers; carries the newest resourceVersion.
    notify: watch::Sender<u64>,
    /// The collection as of past resourceVersions that paginated lists are reading (see
    /// [`PastView`]), the most recently used last.
    past: Vec<PastView>,
}

/// What a past resourceVersion's objects were, for the pages of a list consistent as of it: for
/// each object changed since, its state then (None: it did not exist). Built once from the history
/// and brought up to date page by page, so that a long listing (an operator that pages through its
/// listing as fast as it handles it, while writing to every object) costs each page its own
/// objects, not every event since the listing began.
struct PastView {
    /// The resourceVersion the list is consistent as of.
    rv: u64,
    /// The events up to this resourceVersion are folded in.
    upto: u64,
    /// The objects changed since `rv`, as they were then.
    overrides: BTreeMap<ObjKey, Option<Arc<Value>>>,
}

/// At most this many past views are kept per collection (lists paging at once as of different
/// versions); the least recently used goes first.
const PAST_VIEWS_KEPT: usize = 4;

impl Collection {
    fn new(rtype: Arc<ResourceType>) -> Self {
        Collection {
            rtype,
            served: true,
            objects: BTreeMap::new(),
            log: VecDeque::new(),
            compacted: 0,
            notify: watch::channel(0).0,
            past: Vec::new(),
        }
    }

    /// The view of the collection as of `rv` (`now` being the newest version), brought up to
    /// date with the history: its place in `past`, where it is now the most recently used.
    fn past_view(&mut self, rv: u64, now: u64) -> usize {
        let compacted = self.compacted;
        self.past.retain(|view| view.rv >= compacted);
        let at = match self.past.iter().position(|view| view.rv == rv) {
            Some(at) => {
                let view = self.past.remove(at);
                self.past.push(view);
                self.past.len() - 1
            }
            None => {
                if self.past.len() >= PAST_VIEWS_KEPT {
                    self.past.remove(0);
                }
                self.past.push(PastView {
                    rv,
                    upto: rv,
                    overrides: BTreeMap::new(),
                });
                self.past.len() - 1
            }
        };
        if rv < now {
            // The events since the view was last brought up to date; the first event of an object
            // after `rv` says what it was then.
            let view = &mut self.past[at];
            let first_after = self.log.partition_point(|e| e.rv <= view.upto);
            for event in self.log.range(first_after..) {
                view.overrides
                    .entry(event.key.clone())
                    .or_insert_with(|| event.old.clone());
                view.upto = event.rv;
            }
        }
        at
    }
}

/// Which part of an object a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// The object itself (status changes are ignored when the kind has a status subresource).
    Main,
    /// `/status`: only status changes.
    Status,
}

/// How a create, update or patch is carried out (`dryRun`, `fieldValidation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Write {
    /// `dryRun=All`: check everything, store nothing.
    pub dry_run: bool,
    /// `fieldValidation=Strict`: fields a custom resource's schema does not declare are an error
    /// instead of being dropped.
    pub strict: bool,
}

/// How dependents are treated when their owner is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Delete the owner now, the dependents after (the default).
    Background,
    /// Delete the dependents first, then the owner.
    Foreground,
    /// Keep the dependents, without the owner reference.
    Orphan,
}

/// What a DELETE may ask for.
#[derive(Debug, Clone)]
pub struct DeleteOptions {
    /// Dependents' fate.
    pub propagation: Propagation,
    /// Delete only if the uid is this one.
    pub uid: Option<String>,
    /// Delete only if the resourceVersion is this one.
    pub resource_version: Option<String>,
    /// Check everything but change nothing.
    pub dry_run: bool,
}

impl Default for DeleteOptions {
    fn default() -> Self {
        DeleteOptions {
            propagation: Propagation::Background,
            uid: None,
            resource_version: None,
            dry_run: false,
        }
    }
}

/// A list request's options.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// Only this namespace (None: all, or cluster-scoped).
    pub namespace: Option<String>,
    /// `labelSelector`.
    pub labels: crate::selectors::LabelSelector,
    /// `fieldSelector`.
    pub fields: crate::selectors::FieldSelector,
    /// `limit` (0: no limit).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `resourceVersion` with `resourceVersionMatch=Exact`: list as of that version.
    pub exact_rv: Option<u64>,
}

impl ListOptions {
    /// Whether an object is selected by the namespace and both selectors.
    pub fn selects(&self, key: &ObjKey, object: &Value) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == key.0)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }
}

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    /// The selected objects, in key order.
    pub items: Vec<Arc<Value>>,
    /// The list's resourceVersion.
    pub rv: u64,
    /// The token for the next page.
    pub continue_token: Option<String>,
    /// How many objects follow (only without selectors, as in the API server).
    pub remaining: Option<usize>,
}

/// The events a watcher has not seen yet.
pub enum Since {
    /// These events, and the resourceVersion the watcher is now up to date with.
    Events(Vec<Arc<Event>>, u64),
    /// The watcher's position is older than the kept history.
    Expired(u64),
    /// The kind is no longer served.
    Gone,
}

/// Follow-up work of a write: what the API server's controllers would do next.
enum Followup {
    /// An object with this uid is gone: collect its dependents whose owners are all gone.
    CollectDependents(String),
    /// An object in this namespace is gone: finish the namespace if it is terminating and empty.
    CheckNamespace(String),
    /// A dependent of this owner is gone: release the owner's foreground deletion if none are left.
    CheckForeground(String),
    /// Delete everything in a terminating namespace.
    EmptyNamespace(String),
    /// A CRD was written or removed: serve its kind, or stop serving it.
    SyncCrd(Arc<Value>, bool),
    /// Delete an object whose owners are all gone.
    Collect(GroupResource, ObjKey),
}

/// Everything stored, behind one lock.
pub struct State {
    rv: u64,
    collections: HashMap<GroupResource, Collection>,
    uids: HashMap<String, (GroupResource, ObjKey)>,
    dependents: HashMap<String, BTreeSet<(GroupResource, ObjKey)>>,
    followups: VecDeque<Followup>,
    history_limit: usize,
}

const CRDS: (&str, &str) = ("apiextensions.k8s.io", "customresourcedefinitions");
const PROTECTED_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

impl State {
    /// A store with the built-in kinds and the standard namespaces.
    pub fn new(history_limit: usize) -> Self {
        let mut state = State {
            rv: 0,
            collections: HashMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            followups: VecDeque::new(),
            history_limit: history_limit.max(1),
        };
        for rtype in registry::builtin_types() {
            state
                .collections
                .insert(rtype.group_resource(), Collection::new(rtype));
        }
        let namespaces = GroupResource::new("", "namespaces");
        for name in PROTECTED_NAMESPACES {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            // The standard namespaces are valid by construction.
            let _ = state.create(&namespaces, None, body, Write::default());
        }
        state
    }

    /// The newest resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Every served kind.
    pub fn types(&self) -> Vec<Arc<ResourceType>> {
        let mut types: Vec<_> = self
            .collections
            .values()
            .filter(|c| c.served)
            .map(|c| c.rtype.clone())
            .collect();
        types.sort_by(|a, b| (&a.group, &a.plural).cmp(&(&b.group, &b.plural)));
        types
    }

    /// The kind served at `group/version/plural`.
    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        let collection = self.collections.get(&GroupResource::new(group, plural))?;
        (collection.served && collection.rtype.version(version).is_some())
            .then(|| collection.rtype.clone())
    }

    /// A subscription to a collection's changes.
    pub fn subscribe(&self, gr: &GroupResource) -> Option<watch::Receiver<u64>> {
        self.collections.get(gr).map(|c| c.notify.subscribe())
    }

    /// Every object of a kind, in key order (none if the kind is not stored).
    pub fn objects(&self, gr: &GroupResource) -> impl Iterator<Item = &Arc<Value>> {
        self.collections
            .get(gr)
            .into_iter()
            .flat_map(|c| c.objects.values())
    }

    /// How many objects there are in all.
    pub fn object_count(&self) -> usize {
        self.collections.values().map(|c| c.objects.len()).sum()
    }

    /// Every stored object, for [`restore`](Self::restore): CRDs first, then namespaces, then the
    /// rest, each group in the order of their resourceVersions.
    pub fn dump(&self) -> Vec<Value> {
        let rank = |gr: &GroupResource| match (gr.group.as_str(), gr.plural.as_str()) {
            CRDS => 0,
            ("", "namespaces") => 1,
            _ => 2,
        };
        let mut objects: Vec<(u8, u64, &Arc<Value>)> = self
            .collections
            .iter()
            .flat_map(|(gr, collection)| {
                collection.objects.values().map(move |object| {
                    let rv = resource_version(object).parse().unwrap_or(0);
                    (rank(gr), rv, object)
                })
            })
            .collect();
        objects.sort_by_key(|(rank, rv, _)| (*rank, *rv));
        objects
            .into_iter()
            .map(|(_, _, object)| (**object).clone())
            .collect()
    }

    /// Stores objects as [`dump`](Self::dump) gave them, as they were: uids, timestamps,
    /// finalizers and deletion marks kept (each gets a new resourceVersion, after `rv`). CRDs make
    /// their kinds served first. No garbage is collected while restoring: owners stored later still
    /// count. Objects of a kind that is not served are an error, with nothing half done: the whole
    /// dump is checked before anything is stored.
    pub fn restore(&mut self, rv: u64, objects: Vec<Value>) -> Result<usize, String> {
        let mut placed = Vec::with_capacity(objects.len());
        let mut crd_kinds: Vec<(String, String)> = Vec::new();
        for object in objects {
            let api_version = object["apiVersion"].as_str().unwrap_or_default();
            let kind = object["kind"].as_str().unwrap_or_default();
            let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
            let name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .filter(|name| !name.is_empty())
                .ok_or_else(|| format!("an object of kind {kind:?} without metadata.name"))?
                .to_string();
            let namespace = object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let known = self
                .collections
                .iter()
                .find(|(_, c)| c.rtype.group == group && c.rtype.kind == kind)
                .map(|(gr, _)| gr.clone());
            let gr = match known {
                Some(gr) => gr,
                // A custom resource whose CRD comes earlier in the dump.
                None if crd_kinds.iter().any(|(g, k)| g == group && k == kind) => {
                    GroupResource::new(group, "")
                }
                None => return Err(format!("{api_version} {kind} {namespace}/{name}: no such kind is served, and no CRD before it defines it")),
            };
            if (gr.group.as_str(), gr.plural.as_str()) == CRDS {
                let spec = &object["spec"];
                crd_kinds.push((
                    spec["group"].as_str().unwrap_or_default().to_string(),
                    spec["names"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
            placed.push((gr, (namespace, name), object));
        }
        self.rv = self.rv.max(rv);
        let count = placed.len();
        for (gr, key, object) in placed {
            let gr = if gr.plural.is_empty() {
                let kind = object["kind"].as_str().unwrap_or_default();
                match self
                    .collections
                    .iter()
                    .find(|(g, c)| g.group == gr.group && c.rtype.kind == kind)
                {
                    Some((gr, _)) => gr.clone(),
                    None => {
                        return Err(format!(
                            "the CRD of {} {kind} did not make it served",
                            gr.group
                        ))
                    }
                }
            } else {
                gr
            };
            self.store(&gr, key, object);
            // Only what serves the CRDs now; collecting garbage would count owners not yet restored.
            self.followups
                .retain(|followup| matches!(followup, Followup::SyncCrd(..)));
            self.run_followups();
        }
        Ok(count)
    }

    /// Drops every collection's history: older resourceVersions and continue tokens become 410 Gone.
    pub fn compact(&mut self) {
        let rv = self.rv;
        for collection in self.collections.values_mut() {
            collection.log.clear();
            collection.compacted = rv;
        }
    }

    fn collection(&self, gr: &GroupResource) -> ApiResult<&Collection> {
        self.collections
            .get(gr)
            .filter(|c| c.served)
            .ok_or_else(|| ApiError::no_route(&gr.to_string()))
    }

    /// One object.
    pub fn get(&self, gr: &GroupResource, key: &ObjKey) -> ApiResult<Arc<Value>> {
        let collection = self.collection(gr)?;
        collection
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&gr.group, &gr.plural, &key.1))
    }

    /// One page of a list; consistent across pages as of the first page's resourceVersion.
    pub fn list(&mut self, gr: &GroupResource, options: &ListOptions) -> ApiResult<ListPage> {
        let now = self.rv;
        let collection = self
            .collections
            .get_mut(gr)
            .filter(|c| c.served)
            .ok_or_else(|| ApiError::no_route(&gr.to_string()))?;
        // With a token, how many objects the list holds in all and how many earlier pages returned,
        // when it says (the first page of an unselective list counted them).
        let (at, start, counts) = match &options.continue_token {
            Some(token) => {
                let (rv, start, counts) = decode_continue(token)?;
                (Some(rv), Some(start), counts)
            }
            None => (options.exact_rv, None, None),
        };
        let rv = at.unwrap_or(now);
        let unselective = options.labels.is_empty() && options.fields.is_empty();
        if rv < now && rv < collection.compacted {
            return Err(if options.continue_token.is_some() {
                ApiError::expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results.")
            } else {
                ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    collection.compacted
                ))
            });
        }
        // The objects as of `rv`: the current ones, with every later change undone from the history.
        let view_at = collection.past_view(rv, now);
        let collection = &*collection;
        let view = &collection.past[view_at];
        let lower = match &start {
            Some(key) => std::ops::Bound::Excluded(key.clone()),
            None => match &options.namespace {
                Some(ns) => std::ops::Bound::Included((ns.clone(), String::new())),
                None => std::ops::Bound::Unbounded,
            },
        };
        let current = collection
            .objects
            .range((lower.clone(), std::ops::Bound::Unbounded));
        let past = view
            .overrides
            .range::<ObjKey, _>((lower, std::ops::Bound::Unbounded));
        let merged = MergeAsOf::new(current, past);
        let mut items = Vec::new();
        let mut last_key: Option<ObjKey> = None;
        let mut more = false;
        let mut remaining = 0usize;
        // Known counts: the objects after this page are not counted one by one.
        let known = counts.filter(|_| unselective);
        for (key, object) in merged {
            if options.namespace.as_ref().is_some_and(|ns| *ns != key.0) {
                if options.namespace.as_ref().is_some_and(|ns| *ns < key.0) {
                    break;
                }
                continue;
            }
            if !options.selects(key, object) {
                continue;
            }
            if options.limit > 0 && items.len() >= options.limit {
                more = true;
                if !unselective || known.is_some() {
                    break;
                }
                remaining += 1;
                continue;
            }
            last_key = Some(key.clone());
            items.push(object.clone());
        }
        let counts = match known {
            Some((total, returned)) => {
                remaining = total.saturating_sub(returned + items.len());
                Some((total, returned + items.len()))
            }
            // The first page counted the rest.
            None if unselective && start.is_none() => Some((items.len() + remaining, items.len())),
            None => None,
        };
        let continue_token = match (more, last_key) {
            (true, Some(key)) => Some(encode_continue(rv, &key, counts)),
            _ => None,
        };
        let remaining = (more && unselective).then_some(remaining);
        if continue_token.is_none() {
            // The last page: the view goes (a list as of the same version may build it again).
            let collection = self.collections.get_mut(gr).expect("looked up above");
            collection.past.retain(|view| view.rv != rv);
        }
        Ok(ListPage {
            items,
            rv,
            continue_token,
            remaining,
        })
    }

    /// The current objects selected by `options`, for a watch's initial events, and the resourceVersion.
    pub fn snapshot(
        &self,
        gr: &GroupResource,
        options: &ListOptions,
    ) -> ApiResult<(Vec<Arc<Value>>, u64)> {
        let collection = self.collection(gr)?;
        let items = collection
            .objects
            .iter()
            .filter(|(key, object)| options.selects(key, object))
            .map(|(_, object)| object.clone())
            .collect();
        Ok((items, self.rv))
    }

    /// The events after `cursor`.
    pub fn since(&self, gr: &GroupResource, cursor: u64) -> Since {
        let Some(collection) = self.collections.get(gr) else {
            return Since::Gone;
        };
        if cursor < collection.compacted {
            return Since::Expired(collection.compacted);
        }
        let first = collection.log.partition_point(|e| e.rv <= cursor);
        let events: Vec<_> = collection.log.range(first..).cloned().collect();
        if events.is_empty() && !collection.served {
            return Since::Gone;
        }
        Since::Events(events, self.rv.max(cursor))
    }

    /// Creates an object (POST), or checks that it could be created (dry run).
    pub fn create(
        &mut self,
        gr: &GroupResource,
        namespace: Option<&str>,
        body: Value,
        write: Write,
    ) -> ApiResult<Arc<Value>> {
        let rtype = self.collection(gr)?.rtype.clone();
        let mut object = into_object(body)?;
        check_type_meta(&rtype, &object)?;
        let meta = metadata_mut(&mut object)?;
        let namespace = self.check_namespace(&rtype, namespace, meta)?;
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            match meta
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|g| !g.is_empty())
            {
                Some(prefix) => name = format!("{prefix}{}", random_suffix()),
                None => {
                    let cause = Cause::new(
                        "FieldValueRequired",
                        "metadata.name",
                        "name or generateName is required",
                    );
                    return Err(ApiError::invalid(
                        &rtype.group,
                        &rtype.kind,
                        "",
                        vec![cause],
                    ));
                }
            }
            meta.insert("name".into(), json!(name));
        }
        let key = (namespace.clone(), name.clone());
        if self.collection(gr)?.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&rtype.group, &rtype.plural, &name));
        }
        if rtype.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        } else {
            meta.remove("namespace");
        }
        for field in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(field);
        }
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(now()));
        if rtype.generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        object.insert(
            "apiVersion".into(),
            json!(rtype.api_version(&rtype.storage_version)),
        );
        object.insert("kind".into(), json!(rtype.kind));
        if rtype.has_status() {
            object.remove("status");
        }
        let mut object = Value::Object(object);
        self.admit(&rtype, &mut object, None, write.strict)?;
        if write.dry_run {
            return Ok(Arc::new(object));
        }
        let stored = self.store(gr, key, object);
        self.run_followups();
        Ok(stored)
    }

    /// Replaces an object (PUT), or its status.
    pub fn update(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        body: Value,
        sub: Subresource,
        write: Write,
    ) -> ApiResult<Arc<Value>> {
        let rtype = self.collection(gr)?.rtype.clone();
        let body = into_object(body)?;
        check_type_meta(&rtype, &body)?;
        let meta = body.get("metadata").and_then(Value::as_object);
        let body_name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if body_name != key.1 {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                key.1
            )));
        }
        if let Some(ns) = meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
        {
            if rtype.namespaced && !ns.is_empty() && ns != key.0 {
                return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
            }
        }
        let current = self.get(gr, key)?;
        let rv = meta
            .and_then(|m| m.get("resourceVersion"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if rv.is_empty() {
            if !rtype.unconditional_update {
                let cause = Cause::new(
                    "FieldValueInvalid",
                    "metadata.resourceVersion",
                    "0x0: must be specified for an update",
                );
                return Err(ApiError::invalid(
                    &rtype.group,
                    &rtype.kind,
                    &key.1,
                    vec![cause],
                ));
            }
        } else if rv != resource_version(&current) {
            return Err(ApiError::stale(&rtype.group, &rtype.plural, &key.1));
        }
        let object = prepare_update(&rtype, &current, Value::Object(body), sub);
        self.finish_write(gr, &rtype, key, &current, object, write)
    }

    /// Patches an object, or its status. An apply patch creates a missing object.
    pub fn patch(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        kind: PatchKind,
        patch: &Value,
        sub: Subresource,
        write: Write,
    ) -> ApiResult<Arc<Value>> {
        let rtype = self.collection(gr)?.rtype.clone();
        let current = match self.get(gr, key) {
            Ok(current) => current,
            Err(error)
                if kind == PatchKind::Apply && sub == Subresource::Main && error.code == 404 =>
            {
                let mut body = patch.clone();
                if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("name".into(), json!(key.1));
                }
                let namespace = (!key.0.is_empty()).then_some(key.0.as_str());
                return self.create(gr, namespace, body, write);
            }
            Err(error) => return Err(error),
        };
        let patched = patch::apply(kind, &current, patch, |message| {
            ApiError::new(422, "Invalid", message)
        })?;
        if !patched.is_object() {
            return Err(ApiError::bad_request("the patch must leave an object"));
        }
        if let Some(map) = patched.as_object() {
            check_type_meta(&rtype, map)?;
        }
        let rv = patched
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !rv.is_empty() && rv != resource_version(&current) {
            return Err(ApiError::stale(&rtype.group, &rtype.plural, &key.1));
        }
        let patched_name = patched
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if patched_name != key.1 {
            let cause = Cause::new(
                "FieldValueInvalid",
                "metadata.name",
                format!("{patched_name:?}: field is immutable"),
            );
            return Err(ApiError::invalid(
                &rtype.group,
                &rtype.kind,
                &key.1,
                vec![cause],
            ));
        }
        let object = prepare_update(&rtype, &current, patched, sub);
        self.finish_write(gr, &rtype, key, &current, object, write)
    }

    /// Deletes an object: marks it for deletion while it has finalizers, removes it otherwise.
    pub fn delete(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        options: &DeleteOptions,
    ) -> ApiResult<Arc<Value>> {
        let rtype = self.collection(gr)?.rtype.clone();
        let current = self.get(gr, key)?;
        if options.uid.as_ref().is_some_and(|uid| {
            Some(uid.as_str()) != current.pointer("/metadata/uid").and_then(Value::as_str)
        }) {
            return Err(ApiError::conflict(
                &rtype.group,
                &rtype.plural,
                &key.1,
                "Precondition failed: UID in precondition does not match the UID of the object",
            ));
        }
        if options
            .resource_version
            .as_ref()
            .is_some_and(|rv| rv != resource_version(&current))
        {
            return Err(ApiError::conflict(&rtype.group, &rtype.plural, &key.1, "Precondition failed: ResourceVersion in precondition does not match the ResourceVersion of the object"));
        }
        if gr.group.is_empty()
            && gr.plural == "namespaces"
            && PROTECTED_NAMESPACES[..2].contains(&key.1.as_str())
        {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{}\" is forbidden: this namespace may not be deleted",
                key.1
            )));
        }
        if options.dry_run {
            return Ok(current);
        }
        let result = self.delete_object(gr, key, options.propagation);
        self.run_followups();
        result
    }

    /// Deletes every selected object of a collection (DELETE on the collection).
    pub fn delete_collection(
        &mut self,
        gr: &GroupResource,
        list: &ListOptions,
        options: &DeleteOptions,
    ) -> ApiResult<Vec<Arc<Value>>> {
        let keys: Vec<ObjKey> = self
            .collection(gr)?
            .objects
            .iter()
            .filter(|(key, object)| list.selects(key, object))
            .map(|(key, _)| key.clone())
            .collect();
        let mut deleted = Vec::new();
        for key in keys {
            if options.dry_run {
                deleted.push(self.get(gr, &key)?);
            } else {
                deleted.push(self.delete_object(gr, &key, options.propagation)?);
            }
        }
        self.run_followups();
        Ok(deleted)
    }

    /// Reads `/scale` of an object.
    pub fn scale(&self, gr: &GroupResource, key: &ObjKey, version: &str) -> ApiResult<Value> {
        let rtype = self.collection(gr)?.rtype.clone();
        let (spec_path, status_path) = rtype
            .version(version)
            .and_then(|v| v.scale.clone())
            .ok_or_else(|| ApiError::no_route(&format!("{gr}/scale")))?;
        let object = self.get(gr, key)?;
        let meta = &object["metadata"];
        let selector = object
            .pointer("/spec/selector/matchLabels")
            .and_then(Value::as_object)
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            });
        let mut scale = json!({
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": object.pointer(&spec_path).cloned().unwrap_or(json!(0))},
            "status": {"replicas": object.pointer(&status_path).cloned().unwrap_or(json!(0))},
        });
        if let Some(selector) = selector {
            scale["status"]["selector"] = json!(selector);
        }
        Ok(scale)
    }

    /// Writes `/scale` of an object: only `spec.replicas` is taken.
    pub fn write_scale(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        version: &str,
        scale: Value,
        write: Write,
    ) -> ApiResult<Value> {
        let rtype = self.collection(gr)?.rtype.clone();
        let (spec_path, _) = rtype
            .version(version)
            .and_then(|v| v.scale.clone())
            .ok_or_else(|| ApiError::no_route(&format!("{gr}/scale")))?;
        let current = self.get(gr, key)?;
        let rv = scale
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !rv.is_empty() && rv != resource_version(&current) {
            return Err(ApiError::stale(&rtype.group, &rtype.plural, &key.1));
        }
        let Some(replicas) = scale.pointer("/spec/replicas").and_then(Value::as_i64) else {
            let cause = Cause::new("FieldValueRequired", "spec.replicas", "must be an integer");
            return Err(ApiError::invalid(
                "autoscaling",
                "Scale",
                &key.1,
                vec![cause],
            ));
        };
        let mut object = (*current).clone();
        set_pointer(&mut object, &spec_path, json!(replicas));
        self.finish_write(gr, &rtype, key, &current, object, write)?;
        self.scale(gr, key, version)
    }

    /// Checks the URL's namespace against the object's and the kind's scope; returns the key's namespace.
    fn check_namespace(
        &self,
        rtype: &ResourceType,
        namespace: Option<&str>,
        meta: &Map<String, Value>,
    ) -> ApiResult<String> {
        if !rtype.namespaced {
            return Ok(String::new());
        }
        let Some(namespace) = namespace else {
            return Err(ApiError::method_not_allowed(format!("the server does not allow this method on the requested resource: {} must be created in a namespace", rtype.plural)));
        };
        if let Some(body_ns) = meta.get("namespace").and_then(Value::as_str) {
            if !body_ns.is_empty() && body_ns != namespace {
                return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
            }
        }
        let ns_object = self
            .get(
                &GroupResource::new("", "namespaces"),
                &(String::new(), namespace.to_string()),
            )
            .map_err(|_| ApiError::not_found("", "namespaces", namespace))?;
        if ns_object
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null())
        {
            return Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                rtype.plural,
                meta.get("name").and_then(Value::as_str).unwrap_or_default()
            )));
        }
        Ok(namespace.to_string())
    }

    /// The per-kind rules every write passes: metadata validation, then what the kind's strategy does.
    fn admit(
        &self,
        rtype: &ResourceType,
        object: &mut Value,
        current: Option<&Value>,
        strict: bool,
    ) -> ApiResult<()> {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut causes = validate_metadata(object, rtype.name_rule);
        if let Some(current) = current {
            let deleting = current
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|t| !t.is_null());
            if deleting {
                let old: BTreeSet<&str> = finalizers(current).collect();
                let added: Vec<&str> = finalizers(object).filter(|f| !old.contains(f)).collect();
                if !added.is_empty() {
                    causes.push(Cause::new("FieldValueForbidden", "metadata.finalizers", format!("no new finalizers can be added if the object is being deleted, found new finalizers {added:?}")));
                }
            }
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(&rtype.group, &rtype.kind, &name, causes));
        }
        if !rtype.custom {
            crate::kinds::validate(&rtype.group, &rtype.plural, &rtype.kind, object)?;
        }
        match (rtype.group.as_str(), rtype.plural.as_str()) {
            ("", "namespaces") => {
                let spec = object
                    .as_object_mut()
                    .map(|o| o.entry("spec").or_insert_with(|| json!({})));
                if let Some(spec) = spec.and_then(Value::as_object_mut) {
                    spec.entry("finalizers")
                        .or_insert_with(|| json!(["kubernetes"]));
                }
                if current.is_none() {
                    object["status"] = json!({"phase": "Active"});
                }
            }
            ("", "secrets") => normalize_secret(object)?,
            CRDS => {
                registry::from_crd(object)?;
                let stored = current
                    .and_then(|c| c.pointer("/status/storedVersions"))
                    .cloned();
                object["status"] = crd_status(object, stored);
            }
            _ if rtype.custom => {
                let version = rtype.version(&rtype.storage_version);
                if let Some(schema) = version.and_then(|v| v.schema.as_ref()) {
                    schema::prune_and_validate(rtype, schema, object, strict)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The common end of PUT, PATCH and finalizer removal: validate, bump generation, store or remove.
    fn finish_write(
        &mut self,
        gr: &GroupResource,
        rtype: &ResourceType,
        key: &ObjKey,
        current: &Arc<Value>,
        mut object: Value,
        write: Write,
    ) -> ApiResult<Arc<Value>> {
        self.admit(rtype, &mut object, Some(current), write.strict)?;
        set_pointer(
            &mut object,
            "/metadata/resourceVersion",
            json!(resource_version(current)),
        );
        if rtype.generation {
            let generation = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let changed = spec_of(rtype, &object) != spec_of(rtype, current);
            set_pointer(
                &mut object,
                "/metadata/generation",
                json!(generation + i64::from(changed)),
            );
        }
        if object == **current {
            return Ok(current.clone());
        }
        if write.dry_run {
            return Ok(Arc::new(object));
        }
        let stored = if is_deletable(&object) {
            self.remove(gr, key, object)
        } else {
            self.store(gr, key.clone(), object)
        };
        self.run_followups();
        Ok(stored)
    }

    /// Deletes one object with the given propagation; used by DELETE and by the garbage collector.
    fn delete_object(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        propagation: Propagation,
    ) -> ApiResult<Arc<Value>> {
        let current = self.get(gr, key)?;
        let uid = current
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let dependents: Vec<_> = self
            .dependents
            .get(&uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        if propagation == Propagation::Orphan {
            for (dep_gr, dep_key) in &dependents {
                let Ok(dependent) = self.get(dep_gr, dep_key) else {
                    continue;
                };
                let mut orphan = (*dependent).clone();
                if let Some(owners) = orphan
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    owners.retain(|o| o["uid"].as_str() != Some(uid.as_str()));
                }
                self.store(dep_gr, dep_key.clone(), orphan);
            }
        }
        let mut object = (*current).clone();
        let namespace = gr.group.is_empty() && gr.plural == "namespaces";
        if propagation == Propagation::Foreground
            && !dependents.is_empty()
            && !finalizers(&object).any(|f| f == "foregroundDeletion")
        {
            push_finalizer(&mut object, "foregroundDeletion");
        }
        if object
            .pointer("/metadata/deletionTimestamp")
            .is_none_or(Value::is_null)
        {
            set_pointer(&mut object, "/metadata/deletionTimestamp", json!(now()));
            set_pointer(
                &mut object,
                "/metadata/deletionGracePeriodSeconds",
                json!(0),
            );
        }
        if namespace {
            set_pointer(&mut object, "/status/phase", json!("Terminating"));
            self.followups
                .push_back(Followup::EmptyNamespace(key.1.clone()));
        }
        if propagation == Propagation::Foreground {
            for (dep_gr, dep_key) in dependents {
                self.followups.push_back(Followup::Collect(dep_gr, dep_key));
            }
        }
        if is_deletable(&object) {
            Ok(self.remove(gr, key, object))
        } else if object == *current {
            Ok(current)
        } else {
            Ok(self.store(gr, key.clone(), object))
        }
    }

    /// Stores a new state of an object: a new resourceVersion, an event, the indexes.
    fn store(&mut self, gr: &GroupResource, key: ObjKey, mut object: Value) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        set_pointer(
            &mut object,
            "/metadata/resourceVersion",
            json!(rv.to_string()),
        );
        let object = Arc::new(object);
        let Some(collection) = self.collections.get_mut(gr) else {
            return object;
        };
        let old = collection.objects.insert(key.clone(), object.clone());
        let type_ = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        if let Some(old) = &old {
            unindex_owners(&mut self.dependents, gr, &key, old);
        }
        index_owners(&mut self.dependents, gr, &key, &object);
        if let Some(uid) = object.pointer("/metadata/uid").and_then(Value::as_str) {
            self.uids
                .entry(uid.to_string())
                .or_insert_with(|| (gr.clone(), key.clone()));
            if type_ == EventType::Added && owners_all_gone(&self.uids, &object) {
                self.followups
                    .push_back(Followup::Collect(gr.clone(), key.clone()));
            }
        }
        if (gr.group.as_str(), gr.plural.as_str()) == CRDS {
            self.followups
                .push_back(Followup::SyncCrd(object.clone(), true));
        }
        Self::record(
            collection,
            self.history_limit,
            Event {
                rv,
                type_,
                key,
                object: object.clone(),
                old,
                encoded: OnceLock::new(),
            },
        );
        object
    }

    /// Removes an object for good; the DELETED event carries its last state.
    fn remove(&mut self, gr: &GroupResource, key: &ObjKey, mut object: Value) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        set_pointer(
            &mut object,
            "/metadata/resourceVersion",
            json!(rv.to_string()),
        );
        let object = Arc::new(object);
        let Some(collection) = self.collections.get_mut(gr) else {
            return object;
        };
        let old = collection.objects.remove(key);
        if let Some(old) = &old {
            unindex_owners(&mut self.dependents, gr, key, old);
        }
        if let Some(uid) = object.pointer("/metadata/uid").and_then(Value::as_str) {
            self.uids.remove(uid);
            self.followups
                .push_back(Followup::CollectDependents(uid.to_string()));
        }
        for owner in owner_uids(&object) {
            self.followups
                .push_back(Followup::CheckForeground(owner.to_string()));
        }
        if !key.0.is_empty() {
            self.followups
                .push_back(Followup::CheckNamespace(key.0.clone()));
        }
        if (gr.group.as_str(), gr.plural.as_str()) == CRDS {
            self.followups
                .push_back(Followup::SyncCrd(object.clone(), false));
        }
        let event = Event {
            rv,
            type_: EventType::Deleted,
            key: key.clone(),
            object: object.clone(),
            old,
            encoded: OnceLock::new(),
        };
        Self::record(collection, self.history_limit, event);
        object
    }

    fn record(collection: &mut Collection, limit: usize, event: Event) {
        let rv = event.rv;
        collection.log.push_back(Arc::new(event));
        while collection.log.len() > limit {
            if let Some(dropped) = collection.log.pop_front() {
                collection.compacted = dropped.rv;
            }
        }
        collection.notify.send_replace(rv);
    }

    /// Does what the controllers would do after a write, until nothing is left to do.
    fn run_followups(&mut self) {
        while let Some(followup) = self.followups.pop_front() {
            match followup {
                Followup::CollectDependents(uid) => {
                    let dependents: Vec<_> = self
                        .dependents
                        .get(&uid)
                        .map(|d| d.iter().cloned().collect())
                        .unwrap_or_default();
                    for (gr, key) in dependents {
                        self.followups.push_back(Followup::Collect(gr, key));
                    }
                }
                Followup::Collect(gr, key) => {
                    let Ok(object) = self.get(&gr, &key) else {
                        continue;
                    };
                    let foreground_owner =
                        owner_uids(&object).any(|uid| self.is_foreground_deleting(uid));
                    if owners_all_gone(&self.uids, &object) || foreground_owner {
                        let _ = self.delete_object(&gr, &key, Propagation::Background);
                    }
                }
                Followup::CheckForeground(owner_uid) => {
                    if self
                        .dependents
                        .get(&owner_uid)
                        .is_some_and(|d| !d.is_empty())
                    {
                        continue;
                    }
                    let Some((gr, key)) = self.uids.get(&owner_uid).cloned() else {
                        continue;
                    };
                    let Ok(owner) = self.get(&gr, &key) else {
                        continue;
                    };
                    if finalizers(&owner).any(|f| f == "foregroundDeletion") {
                        let mut released = (*owner).clone();
                        remove_finalizer(&mut released, "foregroundDeletion");
                        if is_deletable(&released) {
                            self.remove(&gr, &key, released);
                        } else {
                            self.store(&gr, key, released);
                        }
                    }
                }
                Followup::EmptyNamespace(namespace) => {
                    let mut victims = Vec::new();
                    for (gr, collection) in &self.collections {
                        if collection.rtype.namespaced {
                            let from = (namespace.clone(), String::new());
                            victims.extend(
                                collection
                                    .objects
                                    .range(from..)
                                    .take_while(|(k, _)| k.0 == namespace)
                                    .map(|(k, _)| (gr.clone(), k.clone())),
                            );
                        }
                    }
                    for (gr, key) in victims {
                        let _ = self.delete_object(&gr, &key, Propagation::Background);
                    }
                    self.followups
                        .push_back(Followup::CheckNamespace(namespace));
                }
                Followup::CheckNamespace(namespace) => self.finish_namespace(&namespace),
                Followup::SyncCrd(crd, present) => self.sync_crd(&crd, present),
            }
        }
    }

    fn is_foreground_deleting(&self, uid: &str) -> bool {
        let Some((gr, key)) = self.uids.get(uid) else {
            return false;
        };
        self.get(gr, key)
            .is_ok_and(|o| finalizers(&o).any(|f| f == "foregroundDeletion"))
    }

    /// Removes a terminating namespace once nothing is left in it.
    fn finish_namespace(&mut self, namespace: &str) {
        let namespaces = GroupResource::new("", "namespaces");
        let key = (String::new(), namespace.to_string());
        let Ok(ns) = self.get(&namespaces, &key) else {
            return;
        };
        if ns
            .pointer("/metadata/deletionTimestamp")
            .is_none_or(Value::is_null)
        {
            return;
        }
        let occupied = self.collections.values().any(|c| {
            c.rtype.namespaced
                && c.objects
                    .range((namespace.to_string(), String::new())..)
                    .next()
                    .is_some_and(|(k, _)| k.0 == namespace)
        });
        if occupied {
            return;
        }
        let mut finished = (*ns).clone();
        set_pointer(&mut finished, "/spec/finalizers", json!([]));
        if is_deletable(&finished) {
            self.remove(&namespaces, &key, finished);
        } else if finished != *ns {
            self.store(&namespaces, key, finished);
        }
    }

    /// Serves the kind a CRD defines (when it is stored), or stops serving it (when it is removed).
    fn sync_crd(&mut self, crd: &Value, present: bool) {
        let Ok(rtype) = registry::from_crd(crd) else {
            return;
        };
        let gr = rtype.group_resource();
        if present {
            let rtype = Arc::new(rtype);
            match self.collections.get_mut(&gr) {
                Some(collection) if collection.rtype.custom => {
                    collection.rtype = rtype;
                    collection.served = true;
                }
                Some(_) => {}
                None => {
                    self.collections.insert(gr, Collection::new(rtype));
                }
            }
            return;
        }
        let Some(collection) = self.collections.get(&gr).filter(|c| c.rtype.custom) else {
            return;
        };
        let keys: Vec<(ObjKey, Arc<Value>)> = collection
            .objects
            .iter()
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (key, object) in keys {
            self.remove(&gr, &key, (*object).clone());
        }
        if let Some(collection) = self.collections.get_mut(&gr) {
            collection.served = false;
            collection.notify.send_modify(|_| {});
        }
    }
}

/// Iterates the objects as of a past resourceVersion: current objects overridden by the undone history.
struct MergeAsOf<'a, C, P>
where
    C: Iterator<Item = (&'a ObjKey, &'a Arc<Value>)>,
    P: Iterator<Item = (&'a ObjKey, &'a Option<Arc<Value>>)>,
{
    current: std::iter::Peekable<C>,
    past: std::iter::Peekable<P>,
}

impl<'a, C, P> MergeAsOf<'a, C, P>
where
    C: Iterator<Item = (&'a ObjKey, &'a Arc<Value>)>,
    P: Iterator<Item = (&'a ObjKey, &'a Option<Arc<Value>>)>,
{
    fn new(current: C, past: P) -> Self {
        MergeAsOf {
            current: current.peekable(),
            past: past.peekable(),
        }
    }
}

impl<'a, C, P> Iterator for MergeAsOf<'a, C, P>
where
    C: Iterator<Item = (&'a ObjKey, &'a Arc<Value>)>,
    P: Iterator<Item = (&'a ObjKey, &'a Option<Arc<Value>>)>,
{
    type Item = (&'a ObjKey, &'a Arc<Value>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.current.peek(), self.past.peek()) {
                (None, None) => return None,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((c, _)), Some((p, _))) => (*c).cmp(*p),
            };
            match order {
                std::cmp::Ordering::Less => return self.current.next(),
                std::cmp::Ordering::Greater => {
                    if let Some((key, Some(object))) = self.past.next() {
                        return Some((key, object));
                    }
                }
                std::cmp::Ordering::Equal => {
                    self.current.next();
                    if let Some((key, Some(object))) = self.past.next() {
                        return Some((key, object));
                    }
                }
            }
        }
    }
}

fn into_object(body: Value) -> ApiResult<Map<String, Value>> {
    match body {
        Value::Object(map) => Ok(map),
        other => Err(ApiError::bad_request(format!(
            "the body of the request must be a JSON object, not {}",
            json_type(&other)
        ))),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn metadata_mut(object: &mut Map<String, Value>) -> ApiResult<&mut Map<String, Value>> {
    let meta = object.entry("metadata").or_insert_with(|| json!({}));
    if meta.is_null() {
        *meta = json!({});
    }
    meta.as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

/// The body's apiVersion and kind, when given, must name this kind in a served version.
fn check_type_meta(rtype: &ResourceType, object: &Map<String, Value>) -> ApiResult<()> {
    if let Some(kind) = object
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
    {
        if kind != rtype.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                rtype.kind
            )));
        }
    }
    if let Some(api_version) = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
    {
        let served = rtype
            .versions
            .iter()
            .any(|v| rtype.api_version(&v.name) == api_version);
        if !served {
            let expected = rtype.api_version(&rtype.storage_version);
            return Err(ApiError::bad_request(format!("the API version in the data ({api_version}) does not match the expected API version ({expected})")));
        }
    }
    if let Some(meta) = object.get("metadata") {
        if !meta.is_object() && !meta.is_null() {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
    }
    Ok(())
}

/// What a PUT or PATCH may change: the main endpoint keeps the status (when it is a subresource) and the
/// server-owned metadata; `/status` changes only the status.
fn prepare_update(
    rtype: &ResourceType,
    current: &Value,
    mut object: Value,
    sub: Subresource,
) -> Value {
    if sub == Subresource::Status {
        return with_status_of(current, object);
    }
    if rtype.has_status() {
        match current.get("status") {
            Some(status) => object["status"] = status.clone(),
            None => {
                if let Some(map) = object.as_object_mut() {
                    map.remove("status");
                }
            }
        }
    }
    object["apiVersion"] = current["apiVersion"].clone();
    object["kind"] = current["kind"].clone();
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match current["metadata"].get(field) {
            Some(value) => object["metadata"][field] = value.clone(),
            None => {
                if let Some(meta) = object["metadata"].as_object_mut() {
                    meta.remove(field);
                }
            }
        }
    }
    object
}

/// `current` with the status of `written` (none where `written` has none, or a null one): all a write
/// to `/status` may change. `written` is the request's body or the patched copy, already a whole copy
/// of the object; it is kept, and only the top-level fields that differ from `current` are set back,
/// so a write of the status alone copies the object once, not twice.
fn with_status_of(current: &Value, written: Value) -> Value {
    let (Value::Object(stored), Value::Object(mut object)) = (current, written) else {
        // Both are objects wherever this is called (the store keeps objects; the writes check theirs).
        return current.clone();
    };
    object.retain(|key, value| {
        if key == "status" {
            !value.is_null()
        } else {
            stored.contains_key(key)
        }
    });
    for (key, value) in stored.iter().filter(|(key, _)| *key != "status") {
        match object.get_mut(key) {
            Some(mine) if mine == value => {}
            Some(mine) => *mine = value.clone(),
            None => {
                object.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(object)
}

/// The part of an object whose changes bump `metadata.generation`.
fn spec_of<'a>(rtype: &ResourceType, object: &'a Value) -> Vec<(&'a String, &'a Value)> {
    let skip_status = rtype.has_status();
    object
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| {
            !(matches!(k.as_str(), "metadata" | "apiVersion" | "kind")
                || (skip_status && k.as_str() == "status"))
        })
        .collect()
}

/// Whether an object marked for deletion has nothing left holding it.
fn is_deletable(object: &Value) -> bool {
    let marked = object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    let namespace_held = object["kind"] == "Namespace"
        && object
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
    marked && finalizers(object).next().is_none() && !namespace_held
}

fn finalizers(object: &Value) -> impl Iterator<Item = &str> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn push_finalizer(object: &mut Value, finalizer: &str) {
    let meta = &mut object["metadata"];
    match meta.get_mut("finalizers").and_then(Value::as_array_mut) {
        Some(list) => list.push(json!(finalizer)),
        None => meta["finalizers"] = json!([finalizer]),
    }
}

fn remove_finalizer(object: &mut Value, finalizer: &str) {
    if let Some(list) = object
        .pointer_mut("/metadata/finalizers")
        .and_then(Value::as_array_mut)
    {
        list.retain(|f| f.as_str() != Some(finalizer));
    }
}

fn owner_uids(object: &Value) -> impl Iterator<Item = &str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|o| o["uid"].as_str())
}

fn owners_all_gone(uids: &HashMap<String, (GroupResource, ObjKey)>, object: &Value) -> bool {
    let mut owners = owner_uids(object).peekable();
    owners.peek().is_some() && owners.all(|uid| !uids.contains_key(uid))
}

fn index_owners(
    index: &mut HashMap<String, BTreeSet<(GroupResource, ObjKey)>>,
    gr: &GroupResource,
    key: &ObjKey,
    object: &Value,
) {
    for uid in owner_uids(object) {
        index
            .entry(uid.to_string())
            .or_default()
            .insert((gr.clone(), key.clone()));
    }
}

fn unindex_owners(
    index: &mut HashMap<String, BTreeSet<(GroupResource, ObjKey)>>,
    gr: &GroupResource,
    key: &ObjKey,
    object: &Value,
) {
    for uid in owner_uids(object) {
        if let Some(set) = index.get_mut(uid) {
            set.remove(&(gr.clone(), key.clone()));
            if set.is_empty() {
                index.remove(uid);
            }
        }
    }
}

/// Secrets keep `stringData` as base64 `data`, as the API server does, and default their type.
fn normalize_secret(object: &mut Value) -> ApiResult<()> {
    use base64::Engine;
    let Some(map) = object.as_object_mut() else {
        return Ok(());
    };
    if let Some(string_data) = map.remove("stringData") {
        let Value::Object(entries) = string_data else {
            return Err(ApiError::bad_request("stringData must be a map of strings"));
        };
        let data = map.entry("data").or_insert_with(|| json!({}));
        if data.is_null() {
            *data = json!({});
        }
        for (key, value) in entries {
            let text = value.as_str().ok_or_else(|| {
                ApiError::bad_request(format!("stringData.{key} must be a string"))
            })?;
            data[key.as_str()] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
    map.entry("type").or_insert_with(|| json!("Opaque"));
    Ok(())
}

/// The status the CRD controllers would set at once: names accepted, established, stored versions.
fn crd_status(crd: &Value, stored: Option<Value>) -> Value {
    let spec = &crd["spec"];
    let storage = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        .unwrap_or_default();
    let mut stored_versions: Vec<String> = stored
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default();
    if !stored_versions.iter().any(|v| v == storage) {
        stored_versions.push(storage.to_string());
    }
    let mut names = spec["names"].clone();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    if names
        .get("singular")
        .is_none_or(|s| s.as_str().is_none_or(str::is_empty))
    {
        names["singular"] = json!(kind.to_lowercase());
    }
    if names
        .get("listKind")
        .is_none_or(|s| s.as_str().is_none_or(str::is_empty))
    {
        names["listKind"] = json!(format!("{kind}List"));
    }
    let previous = crd.pointer("/status/conditions").cloned();
    let since = previous
        .as_ref()
        .and_then(|c| c.as_array())
        .and_then(|c| c.first())
        .and_then(|c| c["lastTransitionTime"].as_str())
        .map(String::from)
        .unwrap_or_else(now);
    json!({
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": since},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": since},
        ],
        "acceptedNames": names,
        "storedVersions": stored_versions,
    })
}

/// The resourceVersion of a stored object.
pub fn resource_version(object: &Value) -> &str {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn set_pointer(object: &mut Value, pointer: &str, value: Value) {
    let mut target = object;
    for part in pointer.trim_start_matches('/').split('/') {
        if !target.is_object() {
            *target = json!({});
        }
        target = target
            .as_object_mut()
            .map(|m| m.entry(part).or_insert(Value::Null))
            .expect("made an object above");
    }
    *target = value;
}

/// A continue token as a real API server writes it (its `rv` and `start`), with, for an
/// unselective list, how many objects it holds in all and how many the pages so far returned (the
/// emulator's own, for `remainingItemCount` without counting the rest on every page).
fn encode_continue(rv: u64, key: &ObjKey, counts: Option<ListCounts>) -> String {
    use base64::Engine;
    let mut token =
        json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}", key.0, key.1)});
    if let Some((total, returned)) = counts {
        token["total"] = json!(total);
        token["returned"] = json!(returned);
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// A list's total and what its pages returned so far, as a continue token carries them.
type ListCounts = (usize, usize);

/// A continue token's resourceVersion and start, and the list's counts if it carries them.
fn decode_continue(token: &str) -> ApiResult<(u64, ObjKey, Option<ListCounts>)> {
    use base64::Engine;
    let invalid =
        || ApiError::bad_request("continue key is not valid: the token cannot be decoded");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| invalid())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    let rv = value["rv"].as_u64().ok_or_else(invalid)?;
    let (ns, name) = value["start"]
        .as_str()
        .and_then(|s| s.split_once('/'))
        .ok_or_else(invalid)?;
    let count = |field: &str| usize::try_from(value[field].as_u64()?).ok();
    let counts = count("total").zip(count("returned"));
    Ok((rv, (ns.to_string(), name.to_string()), counts))
}

/// The time now, as the API server writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// 64 bits that differ on every call and from run to run (std's randomly keyed SipHash of a counter).
fn random_u64() -> u64 {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEYS.get_or_init(Default::default)
        .hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A version-4 UUID.
fn new_uid() -> String {
    let bits = (u128::from(random_u64()) << 64) | u128::from(random_u64());
    uuid::Builder::from_random_bytes(bits.to_be_bytes())
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// Five characters from the API server's alphabet for `generateName` (no vowels, no look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut bits = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char;
            bits /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widgets_crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        })
    }

    fn setup() -> (State, GroupResource) {
        setup_keeping(100)
    }

    /// The widgets' CRD installed in a store keeping `history` events.
    fn setup_keeping(history: usize) -> (State, GroupResource) {
        let mut state = State::new(history);
        state
            .create(
                &GroupResource::new(CRDS.0, CRDS.1),
                None,
                widgets_crd(),
                Write::default(),
            )
            .unwrap();
        (state, GroupResource::new("example.com", "widgets"))
    }

    fn widget(name: &str) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": 1}})
    }

    fn key(name: &str) -> ObjKey {
        ("default".into(), name.into())
    }

    #[test]
    fn uids_are_distinct_version_4_uuids() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        for uid in [&a, &b] {
            assert_eq!(uid.len(), 36, "{uid}");
            for (i, c) in uid.char_indices() {
                match i {
                    8 | 13 | 18 | 23 => assert_eq!(c, '-', "{uid}"),
                    14 => assert_eq!(c, '4', "the version, in {uid}"),
                    19 => assert!("89ab".contains(c), "the variant, in {uid}"),
                    _ => assert!(c.is_ascii_hexdigit() && !c.is_ascii_uppercase(), "{uid}"),
                }
            }
        }
        // Every other bit is random: over many uids, each hex digit shows more than one value.
        let many: Vec<String> = (0..64).map(|_| new_uid()).collect();
        for i in (0..36).filter(|i| ![8, 13, 14, 18, 23].contains(i)) {
            let values: std::collections::HashSet<u8> =
                many.iter().map(|u| u.as_bytes()[i]).collect();
            assert!(values.len() > 1, "digit {i} is always the same: {many:?}");
        }
    }

    #[test]
    fn paginated_list_is_consistent_as_of_the_first_page() {
        let (mut state, gr) = setup();
        for name in ["a", "b", "c", "d"] {
            state
                .create(&gr, Some("default"), widget(name), Write::default())
                .unwrap();
        }
        let options = ListOptions {
            limit: 2,
            ..Default::default()
        };
        let first = state.list(&gr, &options).unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.remaining, Some(2));
        state
            .delete(&gr, &key("c"), &DeleteOptions::default())
            .unwrap();
        state
            .create(&gr, Some("default"), widget("cc"), Write::default())
            .unwrap();
        let options = ListOptions {
            limit: 2,
            continue_token: first.continue_token.clone(),
            ..Default::default()
        };
        let second = state.list(&gr, &options).unwrap();
        let names: Vec<_> = second
            .items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["c", "d"]);
        assert_eq!(second.rv, first.rv);
        assert!(second.continue_token.is_none());
    }

    /// The pages of two lists taken while objects are patched, made and deleted between every
    /// page: each list is what the collection held when it began, whatever the order of their pages
    /// (the past views are brought up to date page by page), with the right count of the rest.
    #[test]
    fn long_paginated_lists_stay_consistent_while_every_object_is_written() {
        let (mut state, gr) = setup_keeping(10_000);
        let name = |i: usize| format!("w{i:03}");
        for i in 0..60 {
            state
                .create(&gr, Some("default"), widget(&name(i)), Write::default())
                .unwrap();
        }
        let snapshot = |state: &mut State| -> Vec<Value> {
            let all = state.list(&gr, &ListOptions::default()).unwrap();
            all.items.iter().map(|o| (**o).clone()).collect()
        };
        let mut expected = vec![snapshot(&mut state)];
        let mut tokens: Vec<Option<String>> = vec![None, None];
        let mut got: Vec<Vec<Value>> = vec![Vec::new(), Vec::new()];
        let mut done = [false, false];
        let mut step = 0;
        while !done.iter().all(|d| *d) {
            // The second list begins after the first list's third page.
            for list in 0..2 {
                if done[list] || (list == 1 && step < 3) {
                    continue;
                }
                if list == 1 && got[1].is_empty() && tokens[1].is_none() && expected.len() == 1 {
                    expected.push(snapshot(&mut state));
                }
                let page = state
                    .list(
                        &gr,
                        &ListOptions {
                            limit: 7,
                            continue_token: tokens[list].clone(),
                            ..Default::default()
                        },
                    )
                    .unwrap();
                got[list].extend(page.items.iter().map(|o| (**o).clone()));
                let expected_rest = expected[list].len() - got[list].len();
                match &page.continue_token {
                    Some(_) => assert_eq!(page.remaining, Some(expected_rest), "list {list}"),
                    None => assert_eq!(expected_rest, 0, "list {list}"),
                }
                tokens[list] = page.continue_token.clone();
                done[list] = page.continue_token.is_none();
            }
            // Between pages: every object patched, one deleted, one made.
            for i in 0..60 {
                let _ = state.patch(
                    &gr,
                    &key(&name(i)),
                    PatchKind::Merge,
                    &json!({"spec": {"size": step + 2}}),
                    Subresource::Main,
                    Write::default(),
                );
            }
            let _ = state.delete(&gr, &key(&name(step * 2)), &DeleteOptions::default());
            state
                .create(
                    &gr,
                    Some("default"),
                    widget(&name(100 + step)),
                    Write::default(),
                )
                .unwrap();
            step += 1;
        }
        assert_eq!(got[0], expected[0]);
        assert_eq!(got[1], expected[1]);
        assert_ne!(
            expected[0], expected[1],
            "the lists were taken at different versions"
        );
        assert!(
            state.collections[&gr].past.is_empty(),
            "finished lists let their views go"
        );
    }

    #[test]
    fn compaction_expires_old_continue_tokens() {
        let (mut state, gr) = setup();
        for name in ["a", "b", "c"] {
            state
                .create(&gr, Some("default"), widget(name), Write::default())
                .unwrap();
        }
        let first = state
            .list(
                &gr,
                &ListOptions {
                    limit: 1,
                    ..Default::default()
                },
            )
            .unwrap();
        state
            .create(&gr, Some("default"), widget("d"), Write::default())
            .unwrap();
        state.compact();
        let options = ListOptions {
            limit: 1,
            continue_token: first.continue_token,
            ..Default::default()
        };
        assert_eq!(state.list(&gr, &options).unwrap_err().code, 410);
    }

    #[test]
    fn a_no_op_patch_writes_nothing() {
        let (mut state, gr) = setup();
        let created = state
            .create(&gr, Some("default"), widget("a"), Write::default())
            .unwrap();
        let rv = state.rv();
        let patched = state
            .patch(
                &gr,
                &key("a"),
                PatchKind::Merge,
                &json!({"spec": {"size": 1}}),
                Subresource::Main,
                Write::default(),
            )
            .unwrap();
        assert_eq!(state.rv(), rv);
        assert_eq!(patched, created);
    }

    #[test]
    fn history_beyond_the_limit_expires_old_positions() {
        let mut state = State::new(2);
        let gr = GroupResource::new("", "configmaps");
        let start = state.rv();
        for i in 0..3 {
            state
                .create(
                    &gr,
                    Some("default"),
                    json!({"metadata": {"name": format!("c{i}")}}),
                    Write::default(),
                )
                .unwrap();
        }
        assert!(matches!(state.since(&gr, start), Since::Expired(_)));
        assert!(
            matches!(state.since(&gr, state.rv() - 1), Since::Events(ref e, _) if e.len() == 1)
        );
    }

    /// The plain definition of a `/status` write: the stored object, its status replaced by the
    /// written one, or removed where that has none or a null one.
    fn status_written_plainly(current: &Value, written: &Value) -> Value {
        let mut expected = current.clone();
        match written.get("status") {
            Some(status) if !status.is_null() => expected["status"] = status.clone(),
            _ => {
                expected.as_object_mut().unwrap().remove("status");
            }
        }
        expected
    }

    #[test]
    fn a_status_write_changes_only_the_status() {
        let current = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "default", "labels": {"a": "1"}, "resourceVersion": "7"},
            "spec": {"size": 1},
            "status": {"phase": "old"},
        });
        let writes = [
            // A merge patch of the status alone: everything else as stored.
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"name": "w", "namespace": "default", "labels": {"a": "1"}, "resourceVersion": "7"},
                   "spec": {"size": 1}, "status": {"phase": "new", "ready": true}}),
            // Other fields changed, added and removed beside the status: none of that is kept.
            json!({"apiVersion": "example.com/v2", "kind": "Widget",
                   "metadata": {"name": "w", "labels": {"b": "2"}},
                   "spec": {"size": 3}, "extra": [1, 2], "status": {"phase": "new"}}),
            // A null status, and no status at all: the status goes.
            json!({"metadata": {"name": "w"}, "status": null}),
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
            // A status of another type is the status written.
            json!({"status": "odd", "other": {"x": null}}),
        ];
        for written in &writes {
            assert_eq!(
                with_status_of(&current, written.clone()),
                status_written_plainly(&current, written),
                "writing {written}"
            );
        }
        let without_status = json!({"kind": "Widget", "metadata": {"name": "w"}, "spec": {}});
        for written in &writes {
            assert_eq!(
                with_status_of(&without_status, written.clone()),
                status_written_plainly(&without_status, written),
                "writing {written} to an object without a status"
            );
        }
    }

    #[test]
    fn a_status_patch_keeps_the_rest_of_the_object() {
        let (mut state, gr) = setup();
        let key: ObjKey = ("default".into(), "w".into());
        let created = state
            .create(
                &gr,
                Some("default"),
                json!({"apiVersion": "example.com/v1", "kind": "Widget",
                       "metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"size": 1}}),
                Write::default(),
            )
            .unwrap();
        let patched = state
            .patch(
                &gr,
                &key,
                PatchKind::Merge,
                &json!({"metadata": {"labels": {"a": "2"}}, "spec": {"size": 5},
                        "status": {"phase": "done"}}),
                Subresource::Status,
                Write::default(),
            )
            .unwrap();
        assert_eq!(patched["status"], json!({"phase": "done"}));
        assert_eq!(patched["spec"], created["spec"]);
        assert_eq!(patched["metadata"]["labels"], created["metadata"]["labels"]);
        assert_eq!(
            patched["metadata"]["generation"],
            created["metadata"]["generation"]
        );
        assert_ne!(
            patched["metadata"]["resourceVersion"],
            created["metadata"]["resourceVersion"]
        );
        let cleared = state
            .patch(
                &gr,
                &key,
                PatchKind::Merge,
                &json!({"status": null}),
                Subresource::Status,
                Write::default(),
            )
            .unwrap();
        assert!(cleared.get("status").is_none(), "{cleared}");
        assert_eq!(cleared["spec"], created["spec"]);
    }
}
