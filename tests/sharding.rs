//! Sharding, the replica's side, against the cluster over real HTTP: an operator whose settings place
//! it in a ring (`settings.shard`) handles only the objects labelled for it, hands an object over when
//! the drain label asks for it (daemons stopped, what it had not written carried into the handover,
//! both labels removed), and its writes to an object that moved meanwhile are rejected by the fence.
//! The test plays the assigner's part by writing the labels itself.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor::prelude::*;
use kactor::sharding::Shard;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::Value;
use support::*;

const WIDGETS: &str = "widgets.example.com";
const RING: &str = "widgets";
const OWNER: &str = "shard.kactor.dev/widgets";
const DRAIN: &str = "drain.kactor.dev/widgets";

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    async fn until(&self, what: &str, check: impl Fn(&[String]) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !check(&self.all()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; the log: {:?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn sharded(cluster: &kactor_testenv::TestCluster) -> Operator {
    operator(cluster).settings(|s| s.shard = Some(Shard::new(RING, "me").unwrap()))
}

async fn create(widgets: &Api<DynamicObject>, name: &str, owner: Option<&str>) {
    let mut widget = kactor::emulator::samples::widget(name, 1);
    if let Some(owner) = owner {
        widget["metadata"]["labels"] = serde_json::json!({ OWNER: owner });
    }
    let widget: DynamicObject = serde_json::from_value(widget).unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
}

async fn label(widgets: &Api<DynamicObject>, name: &str, labels: Value) {
    let patch = serde_json::json!({"metadata": {"labels": labels}});
    widgets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn labels(object: &DynamicObject) -> Vec<(String, String)> {
    object
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_handles_only_its_objects_and_hands_one_over_when_asked() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let log = Log::default();
    let (created, daemons) = (log.clone(), log.clone());
    let running = spawn(
        sharded(&cluster)
            .on_create(WIDGETS, "create", move |ctx: Ctx| {
                let log = created.clone();
                async move {
                    log.push(format!("created {}", ctx.name()));
                    Ok(Some(serde_json::json!("done")))
                }
            })
            .daemon(WIDGETS, "d", Daemon::new(), move |ctx: Ctx| {
                let log = daemons.clone();
                async move {
                    log.push(format!("daemon {}", ctx.name()));
                    let reasons = ctx.stopped().wait().await;
                    log.push(format!("daemon {} stopped {reasons}", ctx.name()));
                    Ok(())
                }
            }),
    );
    create(&widgets, "mine", Some("me")).await;
    create(&widgets, "theirs", Some("them")).await;
    create(&widgets, "nobodys", None).await;
    let handled = until(&widgets, "mine", "its create handler's result", |o| {
        o.is_some_and(|o| status(o)["create"] == "done" && diff_base(o).is_some())
    })
    .await
    .unwrap();
    log.until("its daemon", |l| l.iter().any(|e| e == "daemon mine"))
        .await;

    // The drain label: its daemon stops for the handover, and both labels go; what it handled stays.
    label(&widgets, "mine", serde_json::json!({ DRAIN: "true" })).await;
    let handed = until(&widgets, "mine", "the handover", |o| {
        o.is_some_and(|o| labels(o).is_empty())
    })
    .await
    .unwrap();
    log.until("the daemon's stop", |l| {
        l.iter()
            .any(|e| e == "daemon mine stopped OPERATOR_DRAINING")
    })
    .await;
    assert_eq!(
        diff_base(&handed),
        diff_base(&handled),
        "the diff-base stays for the next owner"
    );
    assert_eq!(status(&handed)["create"], "done");

    // Labelled for another replica now: a change to it is not ours.
    label(&widgets, "mine", serde_json::json!({ OWNER: "them" })).await;
    create(&widgets, "mine-too", Some("me")).await;
    log.until("the next object of ours", |l| {
        l.iter().any(|e| e == "created mine-too")
    })
    .await;
    // The objects of others and of nobody are untouched: no handler, no annotation, no finalizer.
    for name in ["theirs", "nobodys"] {
        let object = widgets.get(name).await.unwrap();
        assert!(
            status(&object).get("create").is_none(),
            "{name}: {object:?}"
        );
        assert!(
            diff_base(&object).is_none() && !has_finalizer(&object),
            "{name}: {object:?}"
        );
    }
    let entries = log.all();
    assert_eq!(
        entries.iter().filter(|e| e.starts_with("created")).count(),
        2,
        "{entries:?}"
    );
    assert!(
        !entries
            .iter()
            .any(|e| e.contains("theirs") || e.contains("nobodys")),
        "{entries:?}"
    );
    running.stop().await;
}

/// A slow update handler of `w` signals its start and waits for the test's go before it returns.
struct Gate {
    started: tokio::sync::mpsc::UnboundedReceiver<()>,
    go: Arc<tokio::sync::Notify>,
}

fn gated(cluster: &kactor_testenv::TestCluster) -> (Operator, Gate) {
    let (started, started_rx) = tokio::sync::mpsc::unbounded_channel();
    let go = Arc::new(tokio::sync::Notify::new());
    let wait = go.clone();
    let operator = sharded(cluster).on_update(WIDGETS, "slow", move |_: Ctx| {
        let (started, wait) = (started.clone(), wait.clone());
        async move {
            let _ = started.send(());
            wait.notified().await;
            Ok(Some(serde_json::json!("late")))
        }
    });
    (
        operator,
        Gate {
            started: started_rx,
            go,
        },
    )
}

async fn resize(widgets: &Api<DynamicObject>, name: &str, size: i64) {
    let patch = serde_json::json!({"spec": {"size": size}});
    widgets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_rejects_the_writes_of_a_replica_whose_object_moved_while_its_handler_ran() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let (operator, mut gate) = gated(&cluster);
    let running = spawn(operator);
    create(&widgets, "w", Some("me")).await;
    until(&widgets, "w", "its diff-base", |o| {
        o.is_some_and(|o| diff_base(o).is_some())
    })
    .await;
    resize(&widgets, "w", 2).await;
    tokio::time::timeout(WAIT, gate.started.recv())
        .await
        .unwrap();
    // The object moves to another replica while the handler runs (a relabel of a dead owner).
    label(&widgets, "w", serde_json::json!({ OWNER: "them" })).await;
    let before = widgets.get("w").await.unwrap();
    gate.go.notify_one();
    // Its write is rejected: the next owner runs the handler again (at least once).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = widgets.get("w").await.unwrap();
    assert!(status(&after).get("slow").is_none(), "{after:?}");
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "nothing was written after the move"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_fence_kept_out_during_a_drain_goes_with_the_handover() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let (operator, mut gate) = gated(&cluster);
    let running = spawn(operator);
    create(&widgets, "w", Some("me")).await;
    until(&widgets, "w", "its diff-base", |o| {
        o.is_some_and(|o| diff_base(o).is_some())
    })
    .await;
    resize(&widgets, "w", 2).await;
    tokio::time::timeout(WAIT, gate.started.recv())
        .await
        .unwrap();
    // The assigner asks for it back while the handler runs: the handler finishes, and its result
    // and its progress go out with the handover, not before it.
    label(&widgets, "w", serde_json::json!({ DRAIN: "true" })).await;
    gate.go.notify_one();
    let handed = until(&widgets, "w", "the handover", |o| {
        o.is_some_and(|o| labels(o).is_empty())
    })
    .await
    .unwrap();
    assert_eq!(status(&handed)["slow"], "late", "{handed:?}");
    let base: Value = serde_json::from_str(diff_base(&handed).unwrap()).unwrap();
    assert_eq!(
        base["spec"]["size"], 2,
        "the update is recorded as handled: {handed:?}"
    );
    running.stop().await;
}
