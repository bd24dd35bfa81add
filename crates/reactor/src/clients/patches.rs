//! Patches: what a processing cycle changes on its object, accumulated, then sent together
//! (`reference/kopf.md` §1.4).
//!
//! **Expected flow**: handlers and the framework add to one [`Patch`] during a cycle: merge-patch
//! changes (results, progress, the diff-base, the user's `ctx.patch()` changes) and transformations
//! (functions over the body, such as adding the finalizer). At the end of the cycle [`apply`] sends
//! its merge patches, results before bookkeeping: a merge patch of `/status` with the handlers'
//! results and the user's status (when the resource has the status subresource), then a merge patch
//! of the body (progress, the diff-base, labels and annotations), then, if any, the framework's own
//! state kept in `status.kopf` (a diff-base too large for an annotation). Then the transformations go
//! as JSON patches of the body and of `/status`, computed on the freshest body and guarded by a
//! `resourceVersion` test.
//!
//! **Guarantees**
//! * A handler's result is never lost: it is stored before the progress record that says the handler
//!   succeeded. A failure or a crash between the two requests leaves the result without the record,
//!   and the handler runs again (at least once), where Kopf's order (body first) would keep the
//!   record and lose the result. Kopf reads both either way.
//! * A conflicting transformation (the object changed meanwhile) is kept and retried in the next cycle,
//!   on the next body; it never overwrites a concurrent change.
//! * A 404 means the object is gone: nothing is left to apply, and that is not an error.
//! * Fields the server dropped from a merge patch (a status without
//!   `x-kubernetes-preserve-unknown-fields` prunes unknown results) are reported as a warning.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DynamicObject, ObjectMeta, Patch as KubePatch, PatchParams};
use serde_json::{json, Map, Value};

use crate::clients::slim::{self, Slim};
use crate::structs::resources::Resource;
use crate::structs::sharding::{self, Shard, Standing};

/// The status field that holds the framework's own state (Kopf's status storage), sent last.
pub(crate) const KOPF_STATUS: &str = "kopf";

/// A transformation of the body, turned into JSON-patch operations when applied.
pub type PatchFn = Arc<dyn Fn(&mut Value) + Send + Sync>;

/// The changes of one cycle. Cheap to clone; clones share the changes.
#[derive(Clone, Default)]
pub struct Patch(Arc<Mutex<Changes>>);

/// What a [`Patch`] holds.
#[derive(Clone, Default)]
pub struct Changes {
    /// The merge patch (`null` removes a key).
    pub merge: Map<String, Value>,
    /// The transformations, in order.
    pub fns: Vec<PatchFn>,
}

impl Changes {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.merge.is_empty() && self.fns.is_empty()
    }
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changes")
            .field("merge", &self.merge)
            .field("fns", &self.fns.len())
            .finish()
    }
}

impl fmt::Debug for Patch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lock().fmt(f)
    }
}

impl Patch {
    /// An empty patch.
    pub fn new() -> Self {
        Patch::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Changes> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Merges a merge patch into this one: objects are merged key by key, anything else replaces
    /// (lists replace whole, `null` removes the key on the server).
    ///
    /// ```
    /// # use kactor_reactor::patches::Patch;
    /// # use serde_json::json;
    /// let patch = Patch::new();
    /// patch.merge(json!({"status": {"phase": "Ready"}, "metadata": {"labels": {"old": null}}}));
    /// patch.merge(json!({"status": {"nodes": ["a"]}}));
    /// assert_eq!(patch.to_value(), json!({
    ///     "status": {"phase": "Ready", "nodes": ["a"]}, "metadata": {"labels": {"old": null}}
    /// }));
    /// ```
    pub fn merge(&self, value: Value) {
        if let Value::Object(map) = value {
            merge_into(&mut self.lock().merge, map);
        }
    }

    /// Sets one field, creating the objects on the way (`&["spec", "size"]`).
    pub fn set(&self, path: &[&str], value: Value) {
        let mut changes = self.lock();
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        let mut map = &mut changes.merge;
        for key in parents {
            let entry = map
                .entry(key.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            map = match entry {
                Value::Object(inner) => inner,
                // Made an object just above.
                _ => return,
            };
        }
        map.insert(last.to_string(), value);
    }

    /// Removes one field on the server (sets it to `null` in the merge patch).
    pub fn remove(&self, path: &[&str]) {
        self.set(path, Value::Null);
    }

    /// Sets `status.<key>`.
    pub fn status(&self, key: &str, value: Value) {
        self.set(&["status", key], value);
    }

    /// Sets a label, or removes it with None.
    pub fn label(&self, key: &str, value: Option<&str>) {
        self.set(
            &["metadata", "labels", key],
            value.map_or(Value::Null, Value::from),
        );
    }

    /// Sets an annotation, or removes it with None.
    pub fn annotation(&self, key: &str, value: Option<&str>) {
        self.set(
            &["metadata", "annotations", key],
            value.map_or(Value::Null, Value::from),
        );
    }

    /// Adds a transformation of the whole body (as JSON), sent as a JSON patch computed on the
    /// freshest body, guarded by its `resourceVersion`.
    pub fn transform(&self, f: impl Fn(&mut Value) + Send + Sync + 'static) {
        self.lock().fns.push(Arc::new(f));
    }

    /// Adds transformations kept from an earlier cycle.
    pub fn extend_fns(&self, fns: impl IntoIterator<Item = PatchFn>) {
        self.lock().fns.extend(fns);
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The merge patch so far.
    pub fn to_value(&self) -> Value {
        Value::Object(self.lock().merge.clone())
    }

    /// Whether the merge patch sets this path (to anything, null included).
    pub fn contains(&self, path: &[&str]) -> bool {
        let changes = self.lock();
        let mut map = &changes.merge;
        for (index, key) in path.iter().enumerate() {
            match map.get(*key) {
                Some(Value::Object(inner)) if index + 1 < path.len() => map = inner,
                Some(_) => return index + 1 == path.len(),
                None => return false,
            }
        }
        true
    }

    /// Edits the merge patch so far as one JSON object (what the storages' `store` and `purge`
    /// take).
    pub fn edit<R>(&self, f: impl FnOnce(&mut Value) -> R) -> R {
        let mut changes = self.lock();
        let mut value = Value::Object(std::mem::take(&mut changes.merge));
        let result = f(&mut value);
        if let Value::Object(map) = value {
            changes.merge = map;
        }
        result
    }

    /// Takes the changes out, leaving the patch empty.
    pub fn take(&self) -> Changes {
        std::mem::take(&mut *self.lock())
    }
}

fn merge_into(target: &mut Map<String, Value>, source: Map<String, Value>) {
    for (key, value) in source {
        match (target.get_mut(&key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => {
                merge_into(existing, incoming)
            }
            (_, value) => {
                target.insert(key, value);
            }
        }
    }
}

/// What applying a cycle's changes did.
#[derive(Default)]
pub struct Applied {
    /// The object's resourceVersion after our last successful request (the version the worker waits
    /// to see again before running changing handlers); None when nothing was sent.
    pub resource_version: Option<String>,
    /// The versions our earlier requests made, oldest first, when several were sent: their watch
    /// events bring states older than what we wrote, and the worker skips them.
    pub superseded: Vec<String>,
    /// The object as the answer to our last request gave it: its type fields, its metadata and,
    /// of the rest, the top-level fields that request patched (the whole object when
    /// transformations were sent, or after a merge that transformations followed).
    pub body: Option<DynamicObject>,
    /// Transformations that met a conflict, to retry next cycle.
    pub remaining: Vec<PatchFn>,
    /// The object was gone (404).
    pub gone: bool,
    /// Deletion is requested and no finalizer is left: the object is about to vanish, so its next
    /// version will never arrive.
    pub released: bool,
    /// The write fence rejected a request (sharded operators only): the object moved, or is being
    /// handed over. Nothing after the rejected request was sent.
    pub fenced: Option<Fenced>,
}

/// Why the write fence stopped a cycle's requests ([`Fence`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Fenced {
    /// The assigner asks for the object back: the merge patch that was not written (all of it:
    /// what went before is sent again, which changes nothing) goes with the handover.
    Draining(Map<String, Value>),
    /// The object belongs to another replica now (or to none): its changes are not ours to write.
    Moved,
}

/// The write fence of a sharded operator's requests to its object ([`sharding`]): every request
/// carries JSON-patch tests that the object is still this replica's.
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    /// This replica's place in the ring.
    pub shard: &'a Shard,
    /// The handover's own writes: they test that the drain label is there, not that it is absent.
    pub draining: bool,
}

impl Fence<'_> {
    fn tests(&self) -> Vec<json_patch::PatchOperation> {
        if self.draining {
            self.shard.drain_fence()
        } else {
            self.shard.fence()
        }
    }

    /// The standing the writes need.
    fn expected(&self) -> Standing {
        if self.draining {
            Standing::Draining
        } else {
            Standing::Mine
        }
    }
}

/// How many times a fenced write is made again from a freshly read object when it met a
/// concurrent change (not the fence) before the cycle gives up as on any API failure.
const FENCED_ATTEMPTS: usize = 4;

impl Applied {
    /// Our request's answer is the object's newest state; the version before it is superseded.
    fn advance(&mut self, object: DynamicObject) {
        let version = object.metadata.resource_version.clone();
        if let Some(earlier) = std::mem::replace(&mut self.resource_version, version) {
            self.superseded.push(earlier);
        }
        self.body = Some(object);
    }
}

/// Why applying failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The API refused or failed the request, after retries.
    #[error("patching {what} failed: {source}")]
    Api {
        /// Which request.
        what: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

/// Sends a cycle's changes to the object `body` (see the module's documentation).
///
/// With a `fence` (a sharded operator), every request is a JSON patch that starts with the fence's
/// tests; the merge patches are turned into JSON patches against the object as last seen
/// ([`sharding::merge_to_ops`]). A rejected request (422, 409) makes it read the object: if it is
/// still ours, the request is made again from what was read; if not, it stops there and says why
/// ([`Applied::fenced`]).
pub async fn apply(
    client: &kube::Client,
    resource: &Resource,
    body: &DynamicObject,
    changes: Changes,
    backoffs: &[Duration],
    fence: Option<Fence<'_>>,
) -> Result<Applied, ApplyError> {
    let api = object_api(client, resource, body);
    apply_through(&api, resource, body, changes, backoffs, fence).await
}

/// The API the requests to the object `body` of `resource` go through: its namespace's (none for
/// a cluster-scoped resource), with answers decoded without their managedFields (see `slim`).
/// Making one is a dozen allocations (the URL, the namespace, the client's handle); an operator
/// keeps one per namespace ([`Processor`](crate::processing::Processor)).
pub fn object_api(client: &kube::Client, resource: &Resource, body: &DynamicObject) -> ObjectApi {
    let api = slim::api(
        client.clone(),
        body.metadata
            .namespace
            .as_deref()
            .filter(|_| resource.namespaced),
        &resource.api_resource(),
    );
    ObjectApi {
        request: kube::core::Request::new(api.resource_url()),
        client: client.clone(),
        api,
    }
}

/// The requests to the objects of one resource in one namespace ([`object_api`]): its
/// `Api<Slim>`, and what the merge patches go through so that their answers are read only for
/// what they changed (`slim::decode_keeping`).
pub struct ObjectApi {
    api: Api<Slim>,
    client: kube::Client,
    request: kube::core::Request,
}

impl ObjectApi {
    /// The resource's API in the namespace.
    pub fn api(&self) -> &Api<Slim> {
        &self.api
    }

    /// A merge patch of the object `name` (of its `/status` with `to_status`), the answer decoded
    /// with its type fields and metadata and, of the rest, the top-level fields `patch` has (all
    /// of them with `whole`).
    async fn merge(
        &self,
        name: &str,
        to_status: bool,
        patch: &Value,
        whole: bool,
    ) -> Result<DynamicObject, kube::Error> {
        let params = PatchParams::default();
        let merge = KubePatch::Merge(patch);
        let fields = match patch {
            Value::Object(fields) if !whole => fields,
            _ if to_status => {
                return self
                    .api
                    .patch_status(name, &params, &merge)
                    .await
                    .map(Slim::into_inner)
            }
            _ => {
                return self
                    .api
                    .patch(name, &params, &merge)
                    .await
                    .map(Slim::into_inner)
            }
        };
        // What `Api::patch` and `Api::patch_status` send, and the verb they name the request by.
        let (request, verb) = if to_status {
            let request = self
                .request
                .patch_subresource("status", name, &params, &merge);
            (request, "patch_subresource")
        } else {
            (self.request.patch(name, &params, &merge), "patch")
        };
        let mut request = request.map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert(verb);
        let text = self.client.request_text(request).await?;
        slim::decode_keeping(&text, fields).map_err(kube::Error::SerdeError)
    }
}

/// [`apply`] through an API made beforehand ([`object_api`] of the same object).
pub async fn apply_through(
    api: &ObjectApi,
    resource: &Resource,
    body: &DynamicObject,
    changes: Changes,
    backoffs: &[Duration],
    fence: Option<Fence<'_>>,
) -> Result<Applied, ApplyError> {
    let mut applied = Applied::default();
    if changes.is_empty() {
        return Ok(applied);
    }
    let name = body.metadata.name.clone().unwrap_or_default();
    let has_status = resource.subresources.iter().any(|s| s == "status");

    if let Some(fence) = fence {
        // Boxed, like the transformations below: what only sharded operators run stays out of
        // the size of every cycle's future (a task's size is allocated and copied per cycle).
        return Box::pin(apply_fenced(
            &api.api, &name, body, changes, has_status, backoffs, fence,
        ))
        .await;
    }
    // The answers are read for the fields each request changed, unless transformations follow:
    // the last answer is then the body they start from.
    let whole = !changes.fns.is_empty();
    for (what, to_status, patch) in merge_requests(changes.merge, has_status) {
        let response = crate::clients::api::retrying(backoffs, what, || {
            api.merge(&name, to_status, &patch, whole)
        })
        .await;
        match response {
            Ok(object) => {
                warn_inconsistencies(&patch, &object);
                applied.advance(object);
            }
            Err(error) if is_not_found(&error) => {
                applied.gone = true;
                return Ok(applied);
            }
            Err(source) => return Err(ApplyError::Api { what, source }),
        }
    }

    transform_into(
        &mut applied,
        &api.api,
        &name,
        body,
        changes.fns,
        has_status,
        backoffs,
        &[],
    )
    .await?;
    applied.released = is_released(applied.body.as_ref());
    Ok(applied)
}

/// [`apply`] behind the write fence: each merge request as a JSON patch starting with the fence's
/// tests, then the transformations with them too. See [`apply`].
async fn apply_fenced(
    api: &Api<Slim>,
    name: &str,
    body: &DynamicObject,
    changes: Changes,
    has_status: bool,
    backoffs: &[Duration],
    fence: Fence<'_>,
) -> Result<Applied, ApplyError> {
    let mut applied = Applied::default();
    let tests = fence.tests();
    let everything = changes.merge.clone();
    let mut current = to_json(body, "the object")?;
    for (what, to_status, patch) in merge_requests(changes.merge, has_status) {
        let Value::Object(merge) = &patch else {
            continue;
        };
        let request = FencedRequest {
            api,
            name,
            what,
            to_status,
            tests: &tests,
            backoffs,
        };
        match request.send(merge, current, fence).await? {
            FencedAnswer::Written(object) => {
                warn_inconsistencies(&patch, &object);
                current = to_json(&object, what)?;
                applied.advance(*object);
            }
            FencedAnswer::Gone => {
                applied.gone = true;
                return Ok(applied);
            }
            FencedAnswer::Rejected(standing) => {
                tracing::info!(
                    ?standing,
                    "The write fence kept our changes from the object: it is no longer ours to write ({what})."
                );
                applied.fenced = Some(if standing == Standing::Draining {
                    Fenced::Draining(everything)
                } else {
                    Fenced::Moved
                });
                return Ok(applied);
            }
        }
    }
    transform_into(
        &mut applied,
        api,
        name,
        body,
        changes.fns,
        has_status,
        backoffs,
        &tests,
    )
    .await?;
    applied.released = is_released(applied.body.as_ref());
    Ok(applied)
}

/// The transformations, on the object as our last request left it (else `body`), after `fence`'s
/// tests if any: what they wrote goes into `applied`. A conflict (the object changed, or the fence)
/// keeps them for the next cycle, on the next body; a 404 marks the object gone.
#[allow(clippy::too_many_arguments)]
async fn transform_into(
    applied: &mut Applied,
    api: &Api<Slim>,
    name: &str,
    body: &DynamicObject,
    fns: Vec<PatchFn>,
    has_status: bool,
    backoffs: &[Duration],
    fence: &[json_patch::PatchOperation],
) -> Result<(), ApplyError> {
    if fns.is_empty() || applied.gone {
        return Ok(());
    }
    let fresh = applied.body.as_ref().unwrap_or(body);
    // Boxed: few cycles transform the object (a finalizer added or removed), and the requests'
    // futures would otherwise be part of every cycle's.
    match Box::pin(transform(
        api, name, fresh, &fns, has_status, backoffs, fence,
    ))
    .await
    {
        Ok(Some(object)) => applied.advance(object),
        Ok(None) => {}
        Err(error) if is_not_found(&error) => applied.gone = true,
        Err(error) if is_conflict(&error) => {
            tracing::debug!(%error, "the object changed meanwhile (or, sharded, is no longer ours); the transformations are retried on the next body");
            applied.remaining = fns;
        }
        Err(source) => {
            return Err(ApplyError::Api {
                what: "the object (JSON patch)",
                source,
            })
        }
    }
    Ok(())
}

/// Whether the object, as our last request left it, is about to vanish: its deletion is requested
/// and no finalizer is left.
fn is_released(object: Option<&DynamicObject>) -> bool {
    object.is_some_and(|object| {
        let finalizers = object
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty());
        object.metadata.deletion_timestamp.is_some() && !finalizers
    })
}

fn to_json(object: &DynamicObject, what: &'static str) -> Result<Value, ApplyError> {
    serde_json::to_value(object).map_err(|e| ApplyError::Api {
        what,
        source: kube::Error::SerdeError(e),
    })
}

/// One merge request of a cycle, to be sent behind the fence.
struct FencedRequest<'a> {
    api: &'a Api<Slim>,
    name: &'a str,
    what: &'static str,
    to_status: bool,
    tests: &'a [json_patch::PatchOperation],
    backoffs: &'a [Duration],
}

/// What became of a [`FencedRequest`].
enum FencedAnswer {
    Written(Box<DynamicObject>),
    Gone,
    /// The fence: the object stands so for us now.
    Rejected(Standing),
}

impl FencedRequest<'_> {
    /// Sends the merge as JSON-patch operations on `current`, after the fence's tests. A rejection
    /// reads the object: the fence's, if it is no longer ours as the fence needs; otherwise a
    /// concurrent change, and the request is made again from what was read.
    async fn send(
        &self,
        merge: &Map<String, Value>,
        mut current: Value,
        fence: Fence<'_>,
    ) -> Result<FencedAnswer, ApplyError> {
        let (api, name, what) = (self.api, self.name, self.what);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut ops = self.tests.to_vec();
            ops.extend(sharding::merge_to_ops(&current, merge));
            let request = KubePatch::Json::<()>(json_patch::Patch(ops));
            let response = crate::clients::api::retrying(self.backoffs, what, || async {
                let params = PatchParams::default();
                if self.to_status {
                    api.patch_status(name, &params, &request).await
                } else {
                    api.patch(name, &params, &request).await
                }
            })
            .await;
            let error = match response {
                Ok(object) => return Ok(FencedAnswer::Written(Box::new(object.into_inner()))),
                Err(error) if is_not_found(&error) => return Ok(FencedAnswer::Gone),
                Err(error) if is_conflict(&error) && attempts < FENCED_ATTEMPTS => error,
                Err(source) => return Err(ApplyError::Api { what, source }),
            };
            let fresh =
                match crate::clients::api::retrying(self.backoffs, what, || api.get(name)).await {
                    Ok(fresh) => fresh.into_inner(),
                    Err(error) if is_not_found(&error) => return Ok(FencedAnswer::Gone),
                    Err(source) => return Err(ApplyError::Api { what, source }),
                };
            let standing = fence.shard.standing(&fresh);
            if standing != fence.expected() {
                return Ok(FencedAnswer::Rejected(standing));
            }
            tracing::debug!(%error, "the object changed meanwhile; the fenced patch is made again from it");
            current = to_json(&fresh, what)?;
        }
    }
}

/// Hands the object over (sharded operators): the handover fence, then both labels removed, in one
/// request ([`Shard::release`]). Ok(None): the object is gone, or no longer ours to hand over (the
/// assigner changed its mind, or another replica has it).
pub async fn release(
    client: &kube::Client,
    resource: &Resource,
    body: &DynamicObject,
    shard: &Shard,
    backoffs: &[Duration],
) -> Result<Option<DynamicObject>, ApplyError> {
    let api = object_api(client, resource, body).api;
    let name = body.metadata.name.clone().unwrap_or_default();
    let request = KubePatch::Json::<()>(json_patch::Patch(shard.release()));
    let what = "the object (handover)";
    let params = PatchParams::default();
    let response =
        crate::clients::api::retrying(backoffs, what, || api.patch(&name, &params, &request)).await;
    match response {
        Ok(object) => Ok(Some(object.into_inner())),
        Err(error) if is_not_found(&error) || is_conflict(&error) => Ok(None),
        Err(source) => Err(ApplyError::Api { what, source }),
    }
}

/// The merge patches a cycle's merge splits into, in the order they go out, each with what it is
/// (for errors) and whether it goes to `/status`: the results (`/status`) first, then the body
/// (progress, diff-base), then the framework's own state kept in the status (`status.kopf`, a
/// diff-base too large for an annotation). A crash between two of them re-runs a handler rather
/// than losing its result. Without a status subresource, all is one patch of the body.
fn merge_requests(
    mut merge: serde_json::Map<String, Value>,
    has_status: bool,
) -> Vec<(&'static str, bool, Value)> {
    let mut status = if has_status {
        merge.remove("status")
    } else {
        None
    };
    let bookkeeping = match &mut status {
        Some(Value::Object(fields)) => fields.remove(KOPF_STATUS),
        _ => None,
    };
    let mut requests = Vec::new();
    // Moved into their requests (`json!` would copy them through serde).
    let wrapped =
        |key: &str, value: Value| Value::Object(Map::from_iter([(key.to_string(), value)]));
    if let Some(status) = status.filter(|s| s.as_object().is_none_or(|s| !s.is_empty())) {
        requests.push(("the status", true, wrapped("status", status)));
    }
    if !merge.is_empty() {
        requests.push(("the object", false, Value::Object(merge)));
    }
    if let Some(bookkeeping) = bookkeeping {
        requests.push((
            "the status's bookkeeping",
            true,
            wrapped("status", wrapped(KOPF_STATUS, bookkeeping)),
        ));
    }
    requests
}

/// Applies the transformations to a JSON copy of `body` and sends the difference as JSON patches
/// (body, then status), each starting with a test of the resourceVersion. None: nothing changed.
async fn transform(
    api: &Api<Slim>,
    name: &str,
    body: &DynamicObject,
    fns: &[PatchFn],
    has_status: bool,
    backoffs: &[Duration],
    fence: &[json_patch::PatchOperation],
) -> Result<Option<DynamicObject>, kube::Error> {
    let before = serde_json::to_value(body).map_err(kube::Error::SerdeError)?;
    let mut after = before.clone();
    for f in fns {
        f(&mut after);
    }
    let ops = json_patch::diff(&before, &after).0;
    let (status_ops, body_ops): (Vec<_>, Vec<_>) = ops
        .into_iter()
        .partition(|op| has_status && op_path(op).starts_with("/status"));
    let mut resource_version = body.metadata.resource_version.clone().unwrap_or_default();
    let mut last = None;
    for (to_status, ops) in [(false, body_ops), (true, status_ops)] {
        if ops.is_empty() {
            continue;
        }
        let mut all = vec![json_patch::PatchOperation::Test(
            json_patch::TestOperation {
                path: json_patch::jsonptr::PointerBuf::parse("/metadata/resourceVersion")
                    .unwrap_or_default(),
                value: Value::String(resource_version.clone()),
            },
        )];
        all.extend(fence.iter().cloned());
        all.extend(ops);
        let patch = KubePatch::Json::<()>(json_patch::Patch(all));
        let object = crate::clients::api::retrying(backoffs, "the object (JSON patch)", || async {
            let params = PatchParams::default();
            if to_status {
                api.patch_status(name, &params, &patch).await
            } else {
                api.patch(name, &params, &patch).await
            }
        })
        .await?
        .into_inner();
        resource_version = object.metadata.resource_version.clone().unwrap_or_default();
        last = Some(object);
    }
    Ok(last)
}

fn op_path(op: &json_patch::PatchOperation) -> String {
    use json_patch::PatchOperation as Op;
    match op {
        Op::Add(o) => o.path.to_string(),
        Op::Remove(o) => o.path.to_string(),
        Op::Replace(o) => o.path.to_string(),
        Op::Move(o) => o.path.to_string(),
        Op::Copy(o) => o.path.to_string(),
        Op::Test(o) => o.path.to_string(),
    }
}

/// Whether the API said the object is not there.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// Whether the API refused a request because the object changed (a failed test, a conflict).
pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409 || status.code == 422)
}

/// Warns about fields of a merge patch that the response does not carry as sent (pruned by a
/// structural schema, typically a status without `x-kubernetes-preserve-unknown-fields`), as Kopf
/// does; empty labels, annotations and finalizers are dropped by the API server and not reported.
fn warn_inconsistencies(patch: &Value, response: &DynamicObject) {
    let missing = inconsistencies(patch, response);
    if !missing.is_empty() {
        tracing::warn!(
            fields = %missing.join(", "),
            "Merge-patching finished with inconsistencies: the API did not keep {}; is the schema missing them (x-kubernetes-preserve-unknown-fields)?",
            missing.join(", ")
        );
    }
}

/// The dotted paths of the patch's fields that the response does not carry as sent.
fn inconsistencies(patch: &Value, response: &DynamicObject) -> Vec<String> {
    let Value::Object(fields) = patch else {
        return Vec::new();
    };
    // Each patched field is compared with the response's field, taken from the typed object: the
    // response is never encoded whole (its managedFields and the diff-base are most of it).
    let mut missing = Vec::new();
    let mut path: Vec<&str> = Vec::new();
    for (key, expected) in fields {
        path.push(key);
        match key.as_str() {
            "metadata" => {
                if !compare_metadata(expected, &response.metadata, &mut path, &mut missing) {
                    let actual = patched_metadata(&response.metadata, expected);
                    compare(expected, actual.as_ref(), &mut path, &mut missing);
                }
            }
            "apiVersion" | "kind" => {
                let actual = serde_json::to_value(&response.types).ok();
                let actual = actual.as_ref().and_then(|types| types.get(key));
                compare(expected, actual, &mut path, &mut missing);
            }
            _ => compare(expected, response.data.get(key), &mut path, &mut missing),
        }
        path.pop();
    }
    missing
}

/// [`compare`] of a patch's `metadata` with the response's, for the usual patch of labels,
/// annotations and finalizers, without copying the response's values (a diff-base annotation is
/// the largest of them): the same paths come out, in the same order. False, with nothing
/// compared, for any other shape ([`patched_metadata`] is taken then).
fn compare_metadata<'a>(
    expected: &'a Value,
    metadata: &ObjectMeta,
    path: &mut Vec<&'a str>,
    out: &mut Vec<String>,
) -> bool {
    let Value::Object(wanted) = expected else {
        return false;
    };
    let usual = !wanted.is_empty()
        && wanted.iter().all(|(key, value)| match key.as_str() {
            "labels" | "annotations" => matches!(value, Value::Object(_) | Value::Null),
            // Not compared: `compare` passes over a list there.
            "finalizers" => matches!(value, Value::Array(_) | Value::Null),
            _ => false,
        });
    if !usual {
        return false;
    }
    for (key, value) in wanted {
        let (Value::Object(keys), Some(actual)) = (
            value,
            match key.as_str() {
                "labels" => Some(metadata.labels.as_ref()),
                "annotations" => Some(metadata.annotations.as_ref()),
                _ => None,
            },
        ) else {
            continue;
        };
        path.push(key);
        for (name, wanted) in keys {
            path.push(name);
            let found = actual.and_then(|map| map.get(name));
            match wanted {
                Value::String(text) => {
                    if found != Some(text) {
                        out.push(path.join("."));
                    }
                }
                other => {
                    let found = found.map(|text| Value::String(text.clone()));
                    compare(other, found.as_ref(), path, out);
                }
            }
            path.pop();
        }
        path.pop();
    }
    true
}

/// The response's metadata as JSON, as far as a patch's `metadata` needs it: of the labels and
/// annotations, only the keys patched; anything beyond labels, annotations and finalizers takes
/// the whole metadata.
fn patched_metadata(metadata: &ObjectMeta, expected: &Value) -> Option<Value> {
    let Value::Object(wanted) = expected else {
        return serde_json::to_value(metadata).ok();
    };
    let mut actual = Map::new();
    for (key, wanted) in wanted {
        let map = match key.as_str() {
            "labels" => metadata.labels.as_ref(),
            "annotations" => metadata.annotations.as_ref(),
            "finalizers" => {
                if let Some(finalizers) = &metadata.finalizers {
                    actual.insert(key.clone(), json!(finalizers));
                }
                continue;
            }
            _ => return serde_json::to_value(metadata).ok(),
        };
        let Some(map) = map else { continue };
        let picked: Map<String, Value> = match wanted {
            Value::Object(keys) => keys
                .keys()
                .filter_map(|k| map.get(k).map(|v| (k.clone(), Value::String(v.clone()))))
                .collect(),
            _ => map
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        };
        actual.insert(key.clone(), Value::Object(picked));
    }
    Some(Value::Object(actual))
}

fn compare<'a>(
    expected: &'a Value,
    actual: Option<&Value>,
    path: &mut Vec<&'a str>,
    out: &mut Vec<String>,
) {
    match expected {
        Value::Object(map) if !map.is_empty() => {
            for (key, value) in map {
                path.push(key);
                compare(value, actual.and_then(|a| a.get(key)), path, out);
                path.pop();
            }
        }
        Value::Null => {}
        Value::Object(_) | Value::Array(_)
            if matches!(
                path.as_slice(),
                ["metadata", "labels" | "annotations" | "finalizers"]
            ) => {}
        value => {
            if actual != Some(value) {
                out.push(path.join("."));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_go_first_then_the_body_then_the_status_bookkeeping() {
        let merge = serde_json::json!({
            "metadata": {"annotations": {"kopf.zalando.org/create_fn": "{}"}},
            "status": {"create_fn": {"done": true}, "kopf": {"last-handled-configuration": "{}"}},
        });
        let Value::Object(merge) = merge else {
            unreachable!()
        };
        let order: Vec<(&str, bool)> = merge_requests(merge.clone(), true)
            .into_iter()
            .map(|(what, to_status, _)| (what, to_status))
            .collect();
        assert_eq!(
            order,
            [
                ("the status", true),
                ("the object", false),
                ("the status's bookkeeping", true)
            ]
        );
        let whole = merge_requests(merge, false);
        assert_eq!(
            whole.len(),
            1,
            "no status subresource: one patch of the body"
        );
        assert_eq!(whole[0].2["status"]["create_fn"]["done"], true);
    }
    use serde_json::json;

    #[test]
    fn set_creates_the_objects_on_the_way_and_replaces_scalars() {
        let patch = Patch::new();
        patch.set(&["status", "x"], json!(1));
        patch.set(&["status", "x", "y"], json!(2));
        patch.label("app.kubernetes.io/name", Some("web"));
        patch.annotation("gone", None);
        assert_eq!(
            patch.to_value(),
            json!({"status": {"x": {"y": 2}}, "metadata": {
                "labels": {"app.kubernetes.io/name": "web"}, "annotations": {"gone": null}}})
        );
        assert!(patch.contains(&["metadata", "annotations", "gone"]));
        assert!(!patch.contains(&["metadata", "annotations", "other"]));
    }

    #[test]
    fn take_empties_the_patch_for_every_clone() {
        let patch = Patch::new();
        let clone = patch.clone();
        clone.transform(|body| body["spec"] = json!({}));
        clone.status("done", json!(true));
        let changes = patch.take();
        assert_eq!(changes.fns.len(), 1);
        assert!(clone.is_empty());
    }

    #[test]
    fn inconsistencies_ignore_emptied_metadata_lists() {
        let response: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": "a"}, "status": {"kept": 1}
        }))
        .unwrap();
        assert_eq!(
            inconsistencies(
                &json!({"status": {"kept": 1, "pruned": 2},
                        "metadata": {"finalizers": [], "labels": {}}}),
                &response
            ),
            vec!["status.pruned".to_string()]
        );
    }

    #[test]
    fn inconsistencies_compare_each_patched_field_with_the_typed_response() {
        let response: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "a", "generation": 3, "finalizers": ["f"],
                         "labels": {"l": "1"},
                         "annotations": {"kept": "v", "other": "big"}},
            "spec": {"size": 2, "list": [1]}, "status": {"done": true}
        }))
        .unwrap();
        let patch = json!({
            "apiVersion": "example.com/v1",
            "metadata": {"annotations": {"kept": "v", "lost": "w", "gone": null},
                         "labels": {"l": "2"}, "finalizers": ["f"], "generation": 3},
            "spec": {"size": 2, "list": [1, 2], "nested": {"x": 1}},
            "status": {"done": true, "cleared": null},
        });
        assert_eq!(
            inconsistencies(&patch, &response),
            [
                "metadata.annotations.lost",
                "metadata.labels.l",
                "spec.list",
                "spec.nested.x"
            ]
        );
        let patch = json!({"metadata": {"uid": "u"}, "kind": "Gadget"});
        assert_eq!(inconsistencies(&patch, &response), ["kind", "metadata.uid"]);
    }

    #[test]
    fn the_usual_metadata_is_compared_as_the_copied_metadata_would_be() {
        let responses = [
            json!({"metadata": {"name": "a", "labels": {"l": "1"},
                                "annotations": {"kept": "v", "n": "{}"}, "finalizers": ["f"]}}),
            json!({"metadata": {"name": "a"}}),
        ];
        let patches = [
            json!({"annotations": {"kept": "v", "lost": "w", "gone": null}, "labels": {"l": "2"}}),
            json!({"annotations": {"n": {"x": 1}, "m": {}, "k": 3, "kept": null}}),
            json!({"labels": {}, "annotations": null, "finalizers": ["f", "g"]}),
            json!({"finalizers": null, "labels": {"l": "1"}}),
        ];
        for response in &responses {
            let object: DynamicObject = serde_json::from_value(response.clone()).unwrap();
            for expected in &patches {
                let mut path = vec!["metadata"];
                let mut fast = Vec::new();
                assert!(compare_metadata(
                    expected,
                    &object.metadata,
                    &mut path,
                    &mut fast
                ));
                let mut slow = Vec::new();
                let actual = patched_metadata(&object.metadata, expected);
                compare(expected, actual.as_ref(), &mut path, &mut slow);
                assert_eq!(fast, slow, "{expected} on {response}");
            }
        }
        let object: DynamicObject = serde_json::from_value(responses[0].clone()).unwrap();
        for unusual in [
            json!({}),
            json!({"uid": "u"}),
            json!({"labels": "x"}),
            json!(3),
        ] {
            let mut path = vec!["metadata"];
            assert!(!compare_metadata(
                &unusual,
                &object.metadata,
                &mut path,
                &mut Vec::new()
            ));
        }
    }
}
