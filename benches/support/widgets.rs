//! The benchmarks' objects and the writes a create handler's outcome makes, by hand: what the floors
//! (bare loops, kube's `Controller`) send to match kactor.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use kactor::emulator::{samples, Emulator};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use serde_json::json;
use tokio::sync::oneshot;

/// Kopf's diff-base annotation.
pub const DIFF_BASE: &str = "kopf.zalando.org/last-handled-configuration";
/// The create handler's id: its result is `status.create_fn`.
pub const HANDLER: &str = "create_fn";

/// An emulator keeping `history` events (so that watchers of a big burst never get 410 Gone), with
/// the widgets' CRD installed; the widgets' API in `default`.
pub async fn emulator_with_widgets(history: usize) -> (Emulator, Api<DynamicObject>) {
    let emulator = Emulator::builder()
        .history_limit(history)
        .start()
        .await
        .expect("emulator");
    let widgets = samples::install_widgets(&emulator.client())
        .await
        .expect("CRD");
    (emulator, widgets)
}

/// Creates `count` widgets `w000000`, `w000001`, ... with 16 requests at once.
pub async fn populate(api: &Api<DynamicObject>, count: usize) {
    let tasks: Vec<_> = (0..16)
        .map(|worker| {
            let api = api.clone();
            tokio::spawn(async move {
                let mut i = worker;
                while i < count {
                    let body = samples::widget(&format!("w{i:06}"), i as i64);
                    let object = serde_json::from_value(body).expect("a widget");
                    api.create(&PostParams::default(), &object)
                        .await
                        .expect("create");
                    i += 16;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("populate");
    }
}

pub fn has_diff_base(object: &DynamicObject) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DIFF_BASE))
}

/// Both writes are on the object.
pub fn is_done(object: &DynamicObject) -> bool {
    has_diff_base(object) && !object.data["status"][HANDLER].is_null()
}

/// The first of the two writes kactor makes for a handled creation: the diff-base (the essence, in
/// Kopf's key order, and a newline) on the object.
pub async fn write_diff_base(api: &Api<DynamicObject>, object: &DynamicObject) -> kube::Result<()> {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let labels = serde_json::to_string(&object.metadata.labels).unwrap_or_default();
    let spec = serde_json::to_string(&object.data["spec"]).unwrap_or_default();
    let essence = format!("{{\"spec\":{spec},\"metadata\":{{\"labels\":{labels}}}}}\n");
    let patch = json!({"metadata": {"annotations": {DIFF_BASE: essence}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// The second: the handler's result on `/status`.
pub async fn write_status(api: &Api<DynamicObject>, object: &DynamicObject) -> kube::Result<()> {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let patch = json!({"status": {HANDLER: {"message": "hello"}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// The bare loop: one list, then both writes for each object, `concurrency` at once; `each` after
/// each object.
pub async fn write_all(api: &Api<DynamicObject>, concurrency: usize, each: fn()) {
    let listed = api.list(&ListParams::default()).await.expect("list");
    futures::stream::iter(listed.items)
        .map(|object| async move {
            write_diff_base(api, &object).await.expect("patch");
            write_status(api, &object).await.expect("patch status");
            each();
        })
        .buffer_unordered(concurrency)
        .for_each(|()| async {})
        .await;
}

/// What a `Controller`'s level-triggered reconcile writes: whichever of the two writes the object
/// still misses (its patch events bring further reconciles, which then write nothing). Returns
/// whether it wrote the diff-base, the object's first writing reconcile.
pub async fn write_missing(api: &Api<DynamicObject>, object: &DynamicObject) -> kube::Result<bool> {
    let first = !has_diff_base(object);
    if first {
        write_diff_base(api, object).await?;
    }
    if object.data["status"][HANDLER].is_null() {
        write_status(api, object).await?;
    }
    Ok(first)
}

/// A watcher started before a contender: `listed` resolves once it has listed the objects, `done`
/// with the instant it saw the `expected`-th finished object.
pub struct Detector {
    pub listed: oneshot::Receiver<()>,
    pub done: tokio::task::JoinHandle<Instant>,
    pub finished: Arc<AtomicUsize>,
}

/// A [`Detector`] of widgets carrying both writes ([`is_done`]).
pub fn detect(api: Api<DynamicObject>, expected: usize) -> Detector {
    detect_when(api, expected, is_done)
}

/// A [`Detector`] of the objects of `api`: an object is finished once `finishes` says so of one of
/// its versions (it is told every version, in order, the listed ones first).
pub fn detect_when(
    api: Api<DynamicObject>,
    expected: usize,
    mut finishes: impl FnMut(&DynamicObject) -> bool + Send + 'static,
) -> Detector {
    let (ready, listed) = oneshot::channel();
    let finished = Arc::new(AtomicUsize::new(0));
    let counter = finished.clone();
    let done = tokio::spawn(async move {
        let mut ready = Some(ready);
        let mut names = HashSet::with_capacity(expected);
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        loop {
            match events.try_next().await {
                Ok(Some(watcher::Event::InitDone)) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(Some(watcher::Event::InitApply(object) | watcher::Event::Apply(object))) => {
                    if finishes(&object) {
                        names.insert(object.metadata.name.unwrap_or_default());
                        counter.store(names.len(), Ordering::Relaxed);
                        if names.len() >= expected {
                            return Instant::now();
                        }
                    }
                }
                Ok(Some(_)) | Err(_) => {}
                Ok(None) => panic!("the completion watcher ended"),
            }
        }
    });
    Detector {
        listed,
        done,
        finished,
    }
}
