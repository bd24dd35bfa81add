//! The watch stream of one resource in one namespace (or cluster-wide): list, then watch, forever.
//!
//! [`Watcher::next_batch`] drives an explicit state machine (`State`) and returns the next batch of
//! [`WatchItem`]s: the objects of one listing page, or the watch events ready at that moment.
//!
//! **Expected flow**: list page by page (`limit`/`continue`, consistent as of the first page), then
//! [`WatchItem::ListDone`]; watch from the listing's resourceVersion with bookmarks; when the stream
//! ends (server timeout, disconnect), watch again from the last resourceVersion seen (an event's or a
//! bookmark's); when the server says 410 Gone, list again from scratch; when nothing (not even a
//! bookmark) came for `inactivity_timeout`, drop the stream and watch again.
//!
//! **Guarantees**
//! * Events are delivered in the server's order, each once per stream; a resumed watch starts strictly
//!   after the last delivered resourceVersion, so nothing is replayed and nothing is lost.
//! * After a relist, every object that exists is delivered as [`WatchItem::Listed`] before
//!   [`WatchItem::ListDone`]; deciding what did not change since it was last seen (and what vanished
//!   during the gap) is the consumer's job, which knows what it saw.
//! * An object that cannot be decoded (nested deeper than serde_json's 128 levels, which a real API
//!   server takes from anyone who may create the object) is left out of its listing page, named in
//!   an error, and each event of it is left out too, counted (`Observer::objects_undecodable`): the
//!   resource's other objects are served. Retrying the page or reconnecting would bring it back
//!   every time, and serve nothing else.
//! * API errors are retried with `networking.error_backoffs` (honouring a 429's `retryAfterSeconds`);
//!   when the backoffs run out, the failure is recorded in [`WatchStatus`] (so health can report it)
//!   and retries go on at the longest backoff until the API answers again.
//!
//! **Caveats**: a resource that stops being served (404, its CRD deleted) ends the watcher with
//! [`WatchError::NotServed`]; a request the server rejects as invalid (400, 422) with
//! [`WatchError::Rejected`]. Both are for the consumer to act on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::api::{
    Api, DynamicObject, ListParams, ObjectList, PartialObjectMeta, WatchEvent, WatchParams,
};

pub use crate::clients::observe::WatchStatus;
use crate::clients::observe::{NoObserver, Observer};
use crate::clients::slim::{self, Slim};
pub use crate::structs::names::{EventType, RestartReason};
use crate::structs::settings::{Networking, Watching};

/// One thing a watcher delivers.
#[derive(Debug, Clone)]
pub enum WatchItem {
    /// An object as listed (initially, or after a relist).
    Listed(DynamicObject),
    /// The listing is complete: every existing object was just delivered as `Listed`.
    ListDone,
    /// A watch event.
    Event(EventType, DynamicObject),
}

/// Why a watcher stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The resource is not served (any more): 404 on list or watch.
    #[error("{resource} is not served by the cluster (404): {message}")]
    NotServed {
        /// The resource, as `plural.version.group`.
        resource: String,
        /// The API server's message.
        message: String,
    },
    /// The server rejected the request as invalid (a bad selector: 400, 422).
    #[error("the API server rejected the watch of {resource} ({code}): {message}")]
    Rejected {
        /// The resource.
        resource: String,
        /// The HTTP status.
        code: u16,
        /// The API server's message.
        message: String,
    },
}

/// The states of the stream.
enum State {
    /// Nothing is known: the next step lists from the start.
    Empty,
    /// Listing page by page; `rv` is the listing's resourceVersion (from its first page).
    Listing {
        /// The token of the next page.
        continue_token: Option<String>,
        /// The first page's resourceVersion.
        rv: Option<String>,
    },
    /// Everything up to `rv` is delivered and no stream is open: the next step opens one from `rv`.
    Listed {
        /// The last resourceVersion delivered (an event's, a bookmark's or the listing's).
        rv: String,
    },
    /// A watch stream is open.
    Watching {
        /// The last resourceVersion delivered.
        rv: String,
        /// The stream (its objects decoded without their managedFields: see `slim`).
        stream: BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>,
    },
}

/// The most events a batch takes from a stream without waiting.
const MAX_BATCH: usize = 512;

/// What one step of the watch stream's state machine came to.
enum Step {
    /// Items to hand out.
    Batch(Vec<WatchItem>),
    /// Nothing yet: step again.
    Again,
}

/// The watcher of one resource in one namespace (or cluster-wide).
pub struct Watcher {
    api: Api<Slim>,
    /// `api`'s client, for the listing's requests (whose pages are decoded here: `slim::decode_list`).
    client: kube::Client,
    label: String,
    params: ListParams,
    watching: Watching,
    networking: Networking,
    state: State,
    status: Arc<WatchStatus>,
    /// Consecutive failures, indexing `networking.error_backoffs`.
    failures: usize,
    /// Where counts go (metrics).
    tell: Tell,
    /// Lists and watches `PartialObjectMetadata`: the objects come with their metadata alone.
    metadata_only: bool,
}

/// Where a watcher's counts go: its status and the observer, under the resource's label.
struct Tell {
    observer: Arc<dyn Observer>,
    resource: Arc<str>,
}

impl Tell {
    fn restarted(&self, status: &WatchStatus, reason: RestartReason) {
        status.restarted(reason);
        self.observer.watch_restarted(&self.resource, reason);
    }

    fn undecodable(&self, count: usize) {
        if count > 0 {
            self.observer.objects_undecodable(&self.resource, count);
        }
    }

    fn received(&self, status: &WatchStatus, count: usize) {
        status.received.fetch_add(count as u64, Ordering::Relaxed);
        if count > 0 {
            self.observer.events_received(&self.resource, count);
        }
    }
}

impl Watcher {
    /// A watcher over `api` (namespaced or all-namespace: [`crate::slim::api`]); `label` names it in
    /// logs and errors. Objects come without their `managedFields` ([`crate::slim`]).
    pub fn new(
        api: Api<Slim>,
        label: impl Into<String>,
        watching: Watching,
        networking: Networking,
    ) -> Self {
        Watcher {
            client: api.clone().into_client(),
            api,
            label: label.into(),
            params: ListParams::default(),
            watching,
            networking,
            state: State::Empty,
            status: Arc::new(WatchStatus::new()),
            failures: 0,
            tell: Tell {
                observer: Arc::new(NoObserver),
                resource: Arc::from(""),
            },
            metadata_only: false,
        }
    }

    /// Reports to `observer`, under the resource label `resource` (kubectl's form).
    pub fn observed(mut self, observer: Arc<dyn Observer>, resource: impl Into<Arc<str>>) -> Self {
        self.tell = Tell {
            observer,
            resource: resource.into(),
        };
        self
    }

    /// Keeps its health in `status` (shared by the streams one owner runs one after another, so that
    /// "listed once" and the silence clock outlive a pause).
    pub fn with_status(mut self, status: Arc<WatchStatus>) -> Self {
        status.touch();
        self.status = status;
        self
    }

    /// Only objects with these labels (a server-side label selector).
    pub fn labels(mut self, selector: &str) -> Self {
        self.params = self.params.labels(selector);
        self
    }

    /// Lists and watches the objects' metadata alone (`PartialObjectMetadata`, as kube-rs's
    /// `metadata_watcher` and controller-runtime's metadata-only informers do): each object comes
    /// as a `DynamicObject` with its `metadata`, no `apiVersion`/`kind` (as objects from lists often
    /// come) and empty data. The API server sends less and the consumer keeps less.
    pub fn metadata_only(mut self) -> Self {
        self.metadata_only = true;
        self
    }

    /// The watcher's health, to share.
    pub fn status(&self) -> Arc<WatchStatus> {
        self.status.clone()
    }

    /// The next batch of items; waits until there is one. Retries every recoverable failure itself.
    ///
    /// Cancel-safe: dropping the future (in a `select!`) loses nothing. The state only changes once a
    /// request has been answered; a dropped request is simply made again by the next call.
    pub async fn next_batch(&mut self) -> Result<Vec<WatchItem>, WatchError> {
        loop {
            let step = match &self.state {
                State::Empty => {
                    self.state = State::Listing {
                        continue_token: None,
                        rv: None,
                    };
                    Step::Again
                }
                State::Listing { continue_token, rv } => {
                    let (continue_token, rv) = (continue_token.clone(), rv.clone());
                    self.list_page(continue_token, rv).await?
                }
                State::Listed { rv } => {
                    let rv = rv.clone();
                    self.open_watch(rv).await?;
                    Step::Again
                }
                State::Watching { .. } => self.read_watch().await,
            };
            if let Step::Batch(items) = step {
                return Ok(items);
            }
        }
    }

    /// Listing: one page, with the listing's resourceVersion kept from its first page; the last
    /// page ends the listing (`ListDone`). A 410 lists again from the start.
    async fn list_page(
        &mut self,
        continue_token: Option<String>,
        rv: Option<String>,
    ) -> Result<Step, WatchError> {
        let mut params = self.params.clone();
        if self.watching.list_page_size > 0 {
            params = params.limit(self.watching.list_page_size);
        }
        if let Some(token) = continue_token.as_deref() {
            params = params.continue_token(token);
        }
        let page = if self.metadata_only {
            self.api
                .list_metadata(&params)
                .await
                .map(|page| ObjectList {
                    types: page.types,
                    metadata: page.metadata,
                    items: page.items.into_iter().map(from_metadata).collect(),
                })
        } else {
            self.list_objects(&params).await
        };
        match page {
            Ok(page) => {
                self.succeeded();
                let rv = rv
                    .or(page.metadata.resource_version.clone())
                    .unwrap_or_default();
                let mut items: Vec<WatchItem> =
                    page.items.into_iter().map(WatchItem::Listed).collect();
                self.tell.received(&self.status, items.len());
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => {
                        self.state = State::Listing {
                            continue_token: Some(token),
                            rv: Some(rv),
                        }
                    }
                    None => {
                        items.push(WatchItem::ListDone);
                        self.status.listed.store(true, Ordering::Relaxed);
                        self.state = State::Listed { rv };
                    }
                }
                return Ok(Step::Batch(items));
            }
            Err(error) if status_of(&error).is_some_and(|(code, _)| code == 410) => {
                tracing::info!(watcher = %self.label, "the listing expired (410 Gone); listing again");
                self.tell.restarted(&self.status, RestartReason::Relist410);
                self.state = State::Empty;
            }
            Err(error) => self.failed(error).await?,
        }
        Ok(Step::Again)
    }

    /// One page of the listing, as `Api::list` asks for it, decoded here ([`slim::decode_list`]):
    /// an object that does not decode is left out with an error that names it, and the rest of the
    /// page is served; kube's own decoding would fail the page, again at every retry, and log it
    /// whole. (`&mut self`: a future holding `&self` would need the watcher, its stream
    /// included, to be `Sync`.)
    async fn list_objects(
        &mut self,
        params: &ListParams,
    ) -> kube::Result<ObjectList<DynamicObject>> {
        let mut request = kube::core::Request::new(self.api.resource_url())
            .list(params)
            .map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("list");
        let text = self.client.request_text(request).await?;
        let (page, undecodable) = slim::decode_list(&text).map_err(kube::Error::SerdeError)?;
        for object in &undecodable {
            tracing::error!(
                watcher = %self.label,
                name = object.name.as_deref().unwrap_or("?"),
                namespace = object.namespace.as_deref().unwrap_or(""),
                error = %object.error,
                "an object of the listing cannot be decoded; it is left out, and the other objects are served"
            );
        }
        self.tell.undecodable(undecodable.len());
        Ok(page)
    }

    /// Listed: opens the watch from `rv`. A 410 lists again.
    async fn open_watch(&mut self, rv: String) -> Result<(), WatchError> {
        let mut params = WatchParams::default();
        if let Some(selector) = &self.params.label_selector {
            params = params.labels(selector);
        }
        if let Some(timeout) = self.watching.server_timeout {
            params = params.timeout(timeout.as_secs().clamp(1, u64::from(u32::MAX)) as u32);
        }
        let stream = if self.metadata_only {
            self.api
                .watch_metadata(&params, &rv)
                .await
                .map(|stream| stream.map(|event| event.map(event_from_metadata)).boxed())
        } else {
            self.api
                .watch(&params, &rv)
                .await
                .map(|stream| stream.map(|event| event.map(event_from_slim)).boxed())
        };
        match stream {
            Ok(stream) => {
                self.succeeded();
                self.state = State::Watching { rv, stream };
            }
            Err(error) if status_of(&error).is_some_and(|(code, _)| code == 410) => {
                self.tell.restarted(&self.status, RestartReason::Relist410);
                self.state = State::Empty;
            }
            Err(error) => self.failed(error).await?,
        }
        Ok(())
    }

    /// Watching: the next events, with whatever else is ready at once (up to `MAX_BATCH`); bookmarks
    /// move the resourceVersion. Silence beyond the inactivity timeout, an ended stream or an error
    /// reconnects; a 410 lists again.
    async fn read_watch(&mut self) -> Step {
        let State::Watching { rv, stream } = &mut self.state else {
            return Step::Again;
        };
        // Measured from the last sign of life, not from this call, so that a caller that
        // keeps cancelling and calling again does not postpone the timeout forever.
        let remaining = self
            .watching
            .inactivity_timeout
            .saturating_sub(self.status.idle_for());
        let first = tokio::time::timeout(remaining, stream.next()).await;
        let first = match first {
            Err(_) => {
                tracing::warn!(watcher = %self.label, timeout = ?self.watching.inactivity_timeout, "no event or bookmark within the inactivity timeout; reconnecting");
                self.tell.restarted(&self.status, RestartReason::Inactivity);
                self.state = State::Listed { rv: rv.clone() };
                return Step::Again;
            }
            Ok(None) => {
                self.tell.restarted(&self.status, RestartReason::Reconnect);
                self.state = State::Listed { rv: rv.clone() };
                tokio::time::sleep(self.watching.reconnect_backoff).await;
                return Step::Again;
            }
            Ok(Some(first)) => first,
        };
        // From here on nothing awaits until the state is settled: the batch cannot be lost.
        let mut items = Vec::new();
        let mut next = Some(first);
        let mut relist = false;
        let mut broken = false;
        while let Some(event) = next.take() {
            self.status.touch();
            match event {
                Ok(WatchEvent::Added(object)) => {
                    push_event(&mut items, rv, EventType::Added, object)
                }
                Ok(WatchEvent::Modified(object)) => {
                    push_event(&mut items, rv, EventType::Modified, object)
                }
                Ok(WatchEvent::Deleted(object)) => {
                    push_event(&mut items, rv, EventType::Deleted, object)
                }
                Ok(WatchEvent::Bookmark(bookmark)) => *rv = bookmark.metadata.resource_version,
                Ok(WatchEvent::Error(status)) if status.code == 410 => {
                    tracing::info!(watcher = %self.label, message = %status.message, "the watch expired (410 Gone); listing again");
                    relist = true;
                }
                Ok(WatchEvent::Error(status)) => {
                    tracing::warn!(watcher = %self.label, code = status.code, message = %status.message, "the watch stream reported an error; reconnecting");
                    broken = true;
                }
                Err(error) => match undecodable_event(&error) {
                    // One event the decoder cannot take (the stream goes on line by line): a
                    // reconnection would only bring it again, and stall every other object.
                    Some(why) => {
                        tracing::error!(watcher = %self.label, error = %why, "an event of the watch stream cannot be decoded; it is left out, and the other objects are served");
                        self.tell.undecodable(1);
                    }
                    None => {
                        tracing::warn!(watcher = %self.label, %error, "the watch stream failed; reconnecting");
                        broken = true;
                    }
                },
            }
            if !relist && !broken && items.len() < MAX_BATCH {
                // Whatever else is ready joins this batch; an ended stream shows on the next call.
                next = stream.next().now_or_never().flatten();
            }
        }
        self.tell.received(&self.status, items.len());
        if relist {
            self.tell.restarted(&self.status, RestartReason::Relist410);
            self.state = State::Empty;
        } else if broken {
            self.tell.restarted(&self.status, RestartReason::Error);
            self.state = State::Listed { rv: rv.clone() };
        }
        if !items.is_empty() {
            return Step::Batch(items);
        }
        if broken {
            tokio::time::sleep(self.watching.reconnect_backoff).await;
        }
        Step::Again
    }

    fn succeeded(&mut self) {
        self.status.touch();
        if self.failures > 0 {
            self.failures = 0;
            if self.status.failing().is_some() {
                tracing::info!(watcher = %self.label, "the API answers again; the watch goes on");
            }
            self.status.set_failing(None);
        }
    }

    /// Decides what a failed request means: a backoff and a retry, or the end of the watcher.
    async fn failed(&mut self, error: kube::Error) -> Result<(), WatchError> {
        let resource = self.label.clone();
        match status_of(&error) {
            Some((404, message)) => return Err(WatchError::NotServed { resource, message }),
            Some((code @ (400 | 422), message)) => {
                return Err(WatchError::Rejected {
                    resource,
                    code,
                    message,
                })
            }
            _ => {}
        }
        self.tell.restarted(&self.status, RestartReason::Error);
        let backoffs = &self.networking.error_backoffs;
        let mut delay = backoffs
            .get(self.failures)
            .or(backoffs.last())
            .copied()
            .unwrap_or(Duration::from_secs(1));
        if let Some(wait) = crate::clients::api::retry_after(&error) {
            delay = delay.max(wait);
        }
        self.failures += 1;
        if self.failures > backoffs.len() {
            let failure = format!("{resource}: {error}");
            if self.status.failing().as_deref() != Some(failure.as_str()) {
                tracing::error!(watcher = %resource, %error, "the watch keeps failing after {} retries; still retrying every {:?}", backoffs.len(), delay);
            }
            self.status.set_failing(Some(failure));
        } else {
            tracing::warn!(watcher = %resource, %error, ?delay, "an API request of the watch failed; retrying");
        }
        tokio::time::sleep(delay).await;
        Ok(())
    }
}

/// Why an item of the watch stream is a line that did not decode, if it is one. kube's stream
/// yields each line on its own: one that is not an event is a `SerdeError`, unless it decodes as
/// a `Status`, which any JSON object does (all its fields are optional): an event too deep to
/// decode comes as an empty `Status`. An error the server sends comes as an `ERROR` event.
fn undecodable_event(error: &kube::Error) -> Option<String> {
    match error {
        kube::Error::SerdeError(error) => Some(error.to_string()),
        kube::Error::Api(status)
            if status.code == 0
                && status.status.is_none()
                && status.message.is_empty()
                && status.reason.is_empty() =>
        {
            Some("a line that is neither an event nor an error".to_string())
        }
        _ => None,
    }
}

/// A metadata-only object as the consumers take every object: no type fields (the server's are
/// `meta.k8s.io/v1` `PartialObjectMetadata`, not the object's), empty data.
fn from_metadata(partial: PartialObjectMeta<Slim>) -> DynamicObject {
    let mut metadata = partial.metadata;
    metadata.managed_fields = None;
    DynamicObject {
        types: None,
        metadata,
        data: serde_json::Value::Object(serde_json::Map::new()),
    }
}

fn event_from_slim(event: WatchEvent<Slim>) -> WatchEvent<DynamicObject> {
    match event {
        WatchEvent::Added(object) => WatchEvent::Added(object.into_inner()),
        WatchEvent::Modified(object) => WatchEvent::Modified(object.into_inner()),
        WatchEvent::Deleted(object) => WatchEvent::Deleted(object.into_inner()),
        WatchEvent::Bookmark(bookmark) => WatchEvent::Bookmark(bookmark),
        WatchEvent::Error(status) => WatchEvent::Error(status),
    }
}

fn event_from_metadata(event: WatchEvent<PartialObjectMeta<Slim>>) -> WatchEvent<DynamicObject> {
    match event {
        WatchEvent::Added(object) => WatchEvent::Added(from_metadata(object)),
        WatchEvent::Modified(object) => WatchEvent::Modified(from_metadata(object)),
        WatchEvent::Deleted(object) => WatchEvent::Deleted(from_metadata(object)),
        WatchEvent::Bookmark(bookmark) => WatchEvent::Bookmark(bookmark),
        WatchEvent::Error(status) => WatchEvent::Error(status),
    }
}

fn push_event(
    items: &mut Vec<WatchItem>,
    rv: &mut String,
    type_: EventType,
    object: DynamicObject,
) {
    if let Some(version) = &object.metadata.resource_version {
        rv.clone_from(version);
    }
    items.push(WatchItem::Event(type_, object));
}

fn status_of(error: &kube::Error) -> Option<(u16, String)> {
    match error {
        kube::Error::Api(status) => Some((status.code, status.message.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What kube's stream makes of a line that is not an event: a decoding error, or the empty
    /// `Status` that any JSON object decodes as; not a `Status` with something in it.
    #[test]
    fn a_line_that_did_not_decode_is_told_from_an_error() {
        let too_deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let serde = serde_json::from_str::<serde_json::Value>(&too_deep).unwrap_err();
        assert!(undecodable_event(&kube::Error::SerdeError(serde))
            .is_some_and(|why| why.contains("recursion limit")));
        let line = r#"{"type": "MODIFIED", "object": {"metadata": {"name": 5}}}"#;
        let empty: kube::core::Status = serde_json::from_str(line).unwrap();
        assert!(undecodable_event(&kube::Error::Api(empty.boxed())).is_some());
        let status: kube::core::Status =
            serde_json::from_str(r#"{"code": 500, "message": "etcd is down"}"#).unwrap();
        assert!(undecodable_event(&kube::Error::Api(status.boxed())).is_none());
        let io = std::io::Error::other("reset");
        assert!(undecodable_event(&kube::Error::ReadEvents(io)).is_none());
    }
}
