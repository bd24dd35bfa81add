//! The watch stream against the cluster over real HTTP, with the emulator's fault injection.

use std::time::Duration;

use kactor_emulator::{samples, Failure, Matcher};
use kactor_reactor::settings::{Networking, Watching};
use kactor_reactor::slim::Slim;
use kactor_reactor::watching::{RestartReason, WatchError, WatchItem, Watcher};
use kactor_testenv::TestCluster;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn quick() -> (Watching, Networking) {
    let watching = Watching {
        inactivity_timeout: Duration::from_secs(30),
        reconnect_backoff: Duration::from_millis(10),
        list_page_size: 2,
        ..Default::default()
    };
    let networking = Networking {
        error_backoffs: vec![Duration::from_millis(10); 3],
        ..Default::default()
    };
    (watching, networking)
}

/// A cluster with the widget CRD, a client without kube's own retries, and the widgets API.
async fn setup() -> (TestCluster, Api<DynamicObject>) {
    let cluster = TestCluster::start().await.unwrap();
    let mut config = cluster.config();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    (cluster, samples::install_widgets(&client).await.unwrap())
}

/// The same widgets' API, decoding as the watcher does (`kactor_reactor::slim`).
fn slim(api: &Api<DynamicObject>) -> Api<Slim> {
    kactor_reactor::slim::api(
        api.clone().into_client(),
        api.namespace(),
        &samples::widget_api_resource(),
    )
}

async fn create(api: &Api<DynamicObject>, name: &str) {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(samples::widget(name, 1)).unwrap(),
    )
    .await
    .unwrap();
}

fn describe(item: &WatchItem) -> String {
    let name = |o: &DynamicObject| o.metadata.name.clone().unwrap_or_default();
    match item {
        WatchItem::Listed(o) => format!("listed {}", name(o)),
        WatchItem::ListDone => "list-done".to_string(),
        WatchItem::Event(t, o) => format!("{} {}", t.as_str().unwrap_or("?"), name(o)),
    }
}

/// Collects items until `count` were seen.
async fn take_items(watcher: &mut Watcher, count: usize) -> Vec<WatchItem> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let batch = tokio::time::timeout(WAIT, watcher.next_batch())
            .await
            .expect("items in time")
            .expect("no watch error");
        seen.extend(batch);
    }
    seen
}

/// Collects items until `count` were seen, described.
async fn take(watcher: &mut Watcher, count: usize) -> Vec<String> {
    take_items(watcher, count)
        .await
        .iter()
        .map(describe)
        .collect()
}

#[tokio::test]
async fn it_lists_existing_objects_page_by_page_then_watches_new_ones() {
    let (_emulator, api) = setup().await;
    for name in ["a", "b", "c"] {
        create(&api, name).await;
    }
    let (watching, networking) = quick();
    let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
    let first = watcher.next_batch().await.unwrap();
    assert_eq!(
        first.iter().map(describe).collect::<Vec<_>>(),
        ["listed a", "listed b"],
        "a page of list_page_size"
    );
    assert_eq!(take(&mut watcher, 2).await, ["listed c", "list-done"]);
    assert!(watcher.status().is_listed());
    create(&api, "d").await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 2}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        take(&mut watcher, 3).await,
        ["ADDED d", "MODIFIED a", "DELETED b"]
    );
}

#[tokio::test]
async fn a_resource_that_stops_being_served_ends_the_watcher() {
    let (cluster, api) = setup().await;
    let (watching, networking) = quick();
    let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
    assert_eq!(take(&mut watcher, 1).await, ["list-done"]);
    let crds: Api<DynamicObject> = Api::all_with(cluster.client(), &samples::crd_api_resource());
    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let end = loop {
        match tokio::time::timeout(WAIT, watcher.next_batch())
            .await
            .unwrap()
        {
            Ok(_) => continue,
            Err(error) => break error,
        }
    };
    assert!(matches!(end, WatchError::NotServed { .. }), "{end}");
}

#[tokio::test]
async fn label_selectors_are_applied_by_the_server() {
    let (_emulator, api) = setup().await;
    create(&api, "a").await;
    let mut other = samples::widget("b", 1);
    other["metadata"]["labels"] = json!({"app": "other"});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(other).unwrap(),
    )
    .await
    .unwrap();
    let (watching, networking) = quick();
    let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking).labels("app=demo");
    assert_eq!(take(&mut watcher, 2).await, ["listed a", "list-done"]);
}

/// Listed and watched as `PartialObjectMetadata`: names, labels, versions and owners come, the
/// bodies do not (on the emulator as on the real server, which answers these `Accept` headers).
#[tokio::test]
async fn a_metadata_only_watcher_gets_each_object_without_its_body() {
    let (_cluster, api) = setup().await;
    for name in ["a", "b", "c"] {
        create(&api, name).await;
    }
    let (watching, networking) = quick();
    let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking).metadata_only();
    let objects = take_items(&mut watcher, 4).await;
    assert_eq!(
        objects.iter().map(describe).collect::<Vec<_>>(),
        ["listed a", "listed b", "listed c", "list-done"],
        "listed page by page as ever"
    );
    for item in &objects[..3] {
        let WatchItem::Listed(object) = item else {
            unreachable!()
        };
        assert_eq!(object.data, json!({}), "no body: {object:?}");
        assert!(object.types.is_none(), "not PartialObjectMetadata's types");
        assert!(object.metadata.uid.is_some() && object.metadata.resource_version.is_some());
        assert!(object.metadata.labels.is_some(), "labels kept");
    }
    // One object's metadata, as the server types it.
    let one = api.get_metadata("a").await.unwrap();
    let types = one.types.expect("typed");
    assert_eq!(
        (types.api_version.as_str(), types.kind.as_str()),
        ("meta.k8s.io/v1", "PartialObjectMetadata")
    );
    assert_eq!(one.metadata.name.as_deref(), Some("a"));

    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "x"}}, "spec": {"size": 5}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    let events = take_items(&mut watcher, 2).await;
    assert_eq!(
        events.iter().map(describe).collect::<Vec<_>>(),
        ["MODIFIED a", "DELETED b"]
    );
    let WatchItem::Event(_, modified) = &events[0] else {
        unreachable!()
    };
    assert_eq!(modified.data, json!({}), "an event without the body");
    assert_eq!(
        modified
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("tier")),
        Some(&"x".to_string()),
        "the event carries the new metadata"
    );
}

#[tokio::test]
async fn next_batch_is_cancel_safe_in_a_select_loop() {
    let (_emulator, api) = setup().await;
    let (watching, networking) = quick();
    let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
    assert_eq!(take(&mut watcher, 1).await, ["list-done"]);
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            for i in 0..20 {
                create(&api, &format!("w{i:02}")).await;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    // Cancel the pending call again and again, as a select! loop with a busier branch does.
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < 20 {
        assert!(tokio::time::Instant::now() < deadline, "{seen:?}");
        if let Ok(batch) =
            tokio::time::timeout(Duration::from_millis(1), watcher.next_batch()).await
        {
            seen.extend(batch.unwrap().iter().map(describe));
        }
    }
    writer.await.unwrap();
    let expected: Vec<String> = (0..20).map(|i| format!("ADDED w{i:02}")).collect();
    assert_eq!(
        seen, expected,
        "every event once, in order, and no relisting"
    );
    assert_eq!(watcher.status().restarts(RestartReason::Relist410), 0);
}

/// Tests that inject faults, which only the emulator can: `scripts/test` skips them on the real
/// API server (`--skip emulator_only`).
mod emulator_only {
    use super::*;

    #[tokio::test]
    async fn a_dropped_stream_resumes_without_losing_or_replaying_events() {
        let (cluster, api) = setup().await;
        create(&api, "a").await;
        let (watching, networking) = quick();
        let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
        assert_eq!(take(&mut watcher, 2).await, ["listed a", "list-done"]);
        create(&api, "b").await;
        assert_eq!(take(&mut watcher, 1).await, ["ADDED b"]);
        cluster.faults().end_watches();
        create(&api, "c").await;
        assert_eq!(
            take(&mut watcher, 1).await,
            ["ADDED c"],
            "c once, and b not again"
        );
        assert!(watcher.status().restarts(RestartReason::Reconnect) >= 1);
    }

    #[tokio::test]
    async fn a_410_gone_relists_everything() {
        let (cluster, api) = setup().await;
        create(&api, "a").await;
        let (watching, networking) = quick();
        let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
        assert_eq!(take(&mut watcher, 2).await, ["listed a", "list-done"]);
        create(&api, "b").await;
        assert_eq!(take(&mut watcher, 1).await, ["ADDED b"]);
        // c is written while the stream is silent, then the history is compacted past it: the watcher's
        // resume point (b) is older than the kept history, so the resumed watch gets 410.
        cluster.faults().silence_watches(Matcher::any());
        create(&api, "c").await;
        cluster.faults().compact();
        cluster.faults().end_watches();
        cluster.faults().reset();
        let seen = take(&mut watcher, 4).await;
        assert_eq!(seen, ["listed a", "listed b", "listed c", "list-done"]);
        assert_eq!(watcher.status().restarts(RestartReason::Relist410), 1);
    }

    #[tokio::test]
    async fn a_silent_stream_is_reopened_after_the_inactivity_timeout() {
        let (cluster, api) = setup().await;
        let (mut watching, networking) = quick();
        watching.inactivity_timeout = Duration::from_millis(300);
        let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
        assert_eq!(take(&mut watcher, 1).await, ["list-done"]);
        cluster
            .faults()
            .silence_watches(Matcher::any().resource("widgets"));
        create(&api, "a").await;
        let faults = cluster.faults().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            faults.reset();
        });
        assert_eq!(take(&mut watcher, 1).await, ["ADDED a"]);
        assert!(
            watcher.status().restarts(RestartReason::Inactivity) >= 1,
            "the silent stream was given up at least once"
        );
    }

    #[tokio::test]
    async fn api_errors_are_retried_and_a_lasting_failure_is_reported_then_cleared() {
        let (cluster, api) = setup().await;
        create(&api, "a").await;
        let (watching, networking) = quick();
        cluster
            .faults()
            .fail(Failure::new(500).verb("list").resource("widgets").times(5));
        let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
        let status = watcher.status();
        assert_eq!(take(&mut watcher, 2).await, ["listed a", "list-done"]);
        assert_eq!(status.restarts(RestartReason::Error), 5);
        assert!(
            status.failing().is_none(),
            "the failure is cleared once the API answers"
        );

        cluster
            .faults()
            .fail(Failure::new(503).verb("watch").times(100));
        cluster.faults().end_watches();
        let watching = tokio::spawn(async move {
            let seen = take(&mut watcher, 1).await;
            (watcher, seen)
        });
        let deadline = tokio::time::Instant::now() + WAIT;
        while status.failing().is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lasting failure is reported"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(status.failing().unwrap().contains("503"));
        cluster.faults().reset();
        create(&api, "b").await;
        let (_, seen) = tokio::time::timeout(WAIT, watching).await.unwrap().unwrap();
        assert_eq!(seen, ["ADDED b"]);
        assert!(status.failing().is_none());
    }

    #[tokio::test]
    async fn a_429_is_retried_no_sooner_than_retry_after() {
        let (cluster, api) = setup().await;
        let (watching, networking) = quick();
        cluster
            .faults()
            .fail(Failure::new(429).verb("list").retry_after(1));
        let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking);
        let started = std::time::Instant::now();
        assert_eq!(take(&mut watcher, 1).await, ["list-done"]);
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "Retry-After is honoured"
        );
    }
}

/// A widget whose spec is nested `depth` levels deep.
fn deep_widget(name: &str, depth: usize) -> DynamicObject {
    let mut nested = json!({});
    for _ in 0..depth {
        nested = json!({ "a": nested });
    }
    let mut widget = samples::widget(name, 1);
    widget["spec"]["nested"] = nested;
    serde_json::from_value(widget).unwrap()
}

/// Counts what the watcher reports as undecodable.
#[derive(Default)]
struct Undecodable(std::sync::atomic::AtomicUsize);

impl kactor_reactor::observe::Observer for Undecodable {
    fn objects_undecodable(&self, _resource: &str, count: usize) {
        self.0
            .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Tests that need what only a real API server does.
mod apiserver_only {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;

    /// A real API server takes an object nested far deeper than serde_json decodes (128 levels),
    /// from anyone who may create one. It is left out of its listing page and its events, each
    /// time with an error and a count, and every other object is listed and watched as before:
    /// before, the page failed at every retry, and no object of the resource was ever served.
    #[tokio::test]
    async fn an_object_too_deep_to_decode_is_left_out_and_the_others_are_served() {
        let (_cluster, api) = setup().await;
        create(&api, "a").await;
        // kube cannot decode the answer either; the server took it all the same.
        match api
            .create(&PostParams::default(), &deep_widget("deep", 200))
            .await
        {
            Ok(_) | Err(kube::Error::SerdeError(_)) => {}
            Err(error) => panic!("the server takes it: {error}"),
        }
        create(&api, "c").await;
        let (watching, networking) = quick();
        let undecodable = Arc::new(Undecodable::default());
        let mut watcher = Watcher::new(slim(&api), "widgets", watching, networking)
            .observed(undecodable.clone(), "widgets");
        // Pages of two: the deep object shares one with `a`.
        assert_eq!(
            take(&mut watcher, 3).await,
            ["listed a", "listed c", "list-done"]
        );
        assert_eq!(undecodable.0.load(Ordering::Relaxed), 1);
        assert_eq!(watcher.status().restarts(RestartReason::Error), 0);

        // Its events are left out as well; the stream goes on with the others'.
        for name in ["deep", "a"] {
            let patched = api
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"size": 2}})),
                )
                .await;
            if let Err(error) = patched {
                assert!(matches!(error, kube::Error::SerdeError(_)), "{error}");
            }
        }
        assert_eq!(take(&mut watcher, 1).await, ["MODIFIED a"]);
        assert_eq!(undecodable.0.load(Ordering::Relaxed), 2);
        assert_eq!(watcher.status().restarts(RestartReason::Error), 0);
    }
}
