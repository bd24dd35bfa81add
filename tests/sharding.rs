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

/// Counts the sharding hooks: fence rejections and handovers.
#[derive(Default)]
struct Counted {
    rejected: std::sync::atomic::AtomicUsize,
    handed_over: std::sync::atomic::AtomicUsize,
}

impl kactor::observe::Observer for Counted {
    fn fence_rejected(&self, resource: &str) {
        assert!(resource.starts_with("widgets."), "{resource}");
        self.rejected
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn handed_over(&self, resource: &str, _took: Duration) {
        assert!(resource.starts_with("widgets."), "{resource}");
        self.handed_over
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Counted {
    fn counts(&self) -> (usize, usize) {
        (
            self.rejected.load(std::sync::atomic::Ordering::SeqCst),
            self.handed_over.load(std::sync::atomic::Ordering::SeqCst),
        )
    }
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
    let counted = Arc::new(Counted::default());
    let running = spawn(operator.observer(counted.clone()));
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
    // Its write is rejected: the next owner runs the handler again (at least once). Waited for,
    // then a little longer for a write that should not come.
    let deadline = tokio::time::Instant::now() + WAIT;
    while counted.counts().0 == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no rejection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = widgets.get("w").await.unwrap();
    assert!(status(&after).get("slow").is_none(), "{after:?}");
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "nothing was written after the move"
    );
    assert_eq!(
        counted.counts(),
        (1, 0),
        "one rejection counted, no handover"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_fence_kept_out_during_a_drain_goes_with_the_handover() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let (operator, mut gate) = gated(&cluster);
    let counted = Arc::new(Counted::default());
    let running = spawn(operator.observer(counted.clone()));
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
    // A cycle on an event from before the drain label may try (and be rejected) once more.
    let (rejected, handed_over) = counted.counts();
    assert!(
        rejected >= 1 && handed_over == 1,
        "rejections {rejected}, handovers {handed_over}"
    );
    running.stop().await;
}

/// One handler call (one process, one monotonic clock).
type Call = support::Call<std::time::Instant>;

#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    /// Pairs of calls for one object by two replicas that overlap in time.
    fn overlaps(&self) -> Vec<(Call, Call)> {
        support::overlaps(self.0.lock().unwrap().clone())
    }

    /// How many calls each replica made.
    fn replicas(&self) -> std::collections::BTreeMap<String, usize> {
        let mut replicas = std::collections::BTreeMap::new();
        for call in self.0.lock().unwrap().iter() {
            *replicas.entry(call.replica.clone()).or_default() += 1;
        }
        replicas
    }
}

/// A ring member with quick timings (lease 2 s, renew deadline 1.2 s, retry 200 ms, resync 1 s)
/// whose create and field handlers record their calls, and take 20 ms each.
fn member(cluster: &kactor_testenv::TestCluster, replica: &str, calls: &Calls) -> Operator {
    let ring = kactor::sharding::RingSettings::new(RING, "default", replica)
        .with_timings(
            Duration::from_secs(2),
            Duration::from_millis(1200),
            Duration::from_millis(200),
        )
        .unwrap();
    let ring = kactor::sharding::RingSettings {
        resync_period: Duration::from_secs(1),
        ..ring
    };
    let record = |calls: &Calls, replica: &str| {
        let (calls, replica) = (calls.clone(), replica.to_string());
        move |ctx: Ctx| {
            let (calls, replica) = (calls.clone(), replica.clone());
            async move {
                let start = std::time::Instant::now();
                tokio::time::sleep(Duration::from_millis(20)).await;
                let size = ctx.spec()["size"].clone();
                calls.0.lock().unwrap().push(Call {
                    uid: ctx.uid().unwrap_or_default().to_string(),
                    replica,
                    start,
                    end: std::time::Instant::now(),
                });
                Ok(Some(size))
            }
        }
    };
    operator(cluster)
        .identity(replica)
        .shards(ring)
        .on_create(WIDGETS, "create", record(calls, replica))
        .on_field(WIDGETS, "spec.size", "size", record(calls, replica))
}

fn owner(object: &DynamicObject) -> Option<&str> {
    object
        .metadata
        .labels
        .as_ref()?
        .get(OWNER)
        .map(String::as_str)
}

/// The member of `members` that rendezvous hashing picks for `object` (by its uid, the default).
fn picked<'m>(object: &DynamicObject, members: &'m [&str]) -> Option<&'m str> {
    let names: Vec<String> = members.iter().map(|m| m.to_string()).collect();
    let pick = kactor::sharding::owner(object.metadata.uid.as_deref()?, &names)?;
    members.iter().copied().find(|m| *m == pick)
}

/// Waits until every widget passes `check`, or fails showing the first that does not.
async fn until_all(
    widgets: &Api<DynamicObject>,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let all = widgets.list(&Default::default()).await.unwrap().items;
        let failing = all.iter().find(|o| !check(o));
        let Some(failing) = failing else {
            return;
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; e.g. {}",
            serde_json::to_string_pretty(failing).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every change handled: the field handler's last result and the diff-base show the final size.
fn settled(object: &DynamicObject) -> bool {
    let size = &object.data["spec"]["size"];
    let base: Option<Value> = diff_base(object).and_then(|b| serde_json::from_str(b).ok());
    status(object)["create"].is_number()
        && base.is_some_and(|b| &b["spec"]["size"] == size)
        && object
            .metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(DRAIN))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_objects_and_hand_them_over_as_they_come_and_go_never_two_at_once() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let r1 = spawn(member(&cluster, "r1", &calls));
    let r2 = spawn(member(&cluster, "r2", &calls));
    let r3 = spawn(member(&cluster, "r3", &calls));
    for i in 0..60 {
        create(&widgets, &format!("w{i}"), None).await;
    }
    // Changes all along, while replicas come and go.
    let changing = {
        let widgets = widgets.clone();
        Rounds::start(Duration::from_millis(100), move |round| {
            let widgets = widgets.clone();
            async move {
                for i in (round % 7..60).step_by(7) {
                    resize(&widgets, &format!("w{i}"), (round % 5 + 1) as i64).await;
                }
            }
        })
    };
    until_all(&widgets, "every object handled by one of three", |o| {
        matches!(owner(o), Some("r1" | "r2" | "r3")) && status(o)["create"].is_number()
    })
    .await;
    let list = || async { widgets.list(&Default::default()).await.unwrap().items };
    let owned = |objects: &[DynamicObject], replica: &str| {
        objects.iter().filter(|o| owner(o) == Some(replica)).count()
    };
    // Each where rendezvous hashing over the three puts it, which is random from run to run (the
    // uids are): a fixed share per replica would fail now and then by chance.
    until_all(
        &widgets,
        "every object with its owner among the three",
        |o| owner(o) == picked(o, &["r1", "r2", "r3"]),
    )
    .await;
    let objects = list().await;
    let shares = ["r1", "r2", "r3"].map(|r| owned(&objects, r));
    eprintln!("shares of r1, r2, r3: {shares:?}");
    assert!(shares.iter().all(|n| *n > 0), "the three share the objects");

    // A graceful exit: its objects go to the others.
    r3.stop().await;
    until_all(&widgets, "r3's objects moved to r1 and r2", |o| {
        matches!(owner(o), Some("r1" | "r2"))
    })
    .await;
    // A new replica: objects are drained from the others to it.
    let r4 = spawn(member(&cluster, "r4", &calls));
    until_all(&widgets, "the objects r4 is picked for moved to it", |o| {
        picked(o, &["r1", "r2", "r4"]) != Some("r4") || owner(o) == Some("r4")
    })
    .await;
    // Its objects change too, before the changes stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Stopped between rounds, not aborted: an aborted round's requests already sent would land after
    // the look below.
    changing.stop().await;
    until_all(&widgets, "every change handled, by a live replica", |o| {
        matches!(owner(o), Some("r1" | "r2" | "r4")) && settled(o)
    })
    .await;
    let owners: std::collections::BTreeMap<String, usize> =
        list()
            .await
            .iter()
            .fold(Default::default(), |mut owners, o| {
                *owners.entry(owner(o).unwrap().to_string()).or_default() += 1;
                owners
            });
    eprintln!("owners at the end: {owners:?}");
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert_eq!(
        calls.overlaps(),
        Vec::new(),
        "never two replicas on one object at once"
    );
    let replicas = calls.replicas();
    eprintln!("handler calls per replica: {replicas:?}");
    assert_eq!(
        replicas.len(),
        4,
        "every replica handled objects: {replicas:?}"
    );
    for running in [r1, r2, r4] {
        running.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_leaves_the_shard_is_not_deleted_for_event_handlers_but_a_deleted_one_is() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let log = Log::default();
    let seen = log.clone();
    let running = spawn(sharded(&cluster).on_event(WIDGETS, "ev", move |ctx: Ctx| {
        let log = seen.clone();
        async move {
            log.push(format!("{} {:?}", ctx.name(), ctx.event_type));
            Ok(())
        }
    }));
    for name in ["relabelled", "handed", "deleted"] {
        create(&widgets, name, Some("me")).await;
    }
    log.until("the three seen", |l| {
        ["relabelled", "handed", "deleted"]
            .iter()
            .all(|n| l.iter().any(|e| e.starts_with(&format!("{n} "))))
    })
    .await;
    // By hand: the API server sends it as it was (labelled for us), as it sends a deletion.
    label(&widgets, "relabelled", serde_json::json!({ OWNER: "them" })).await;
    // Through a handover.
    label(&widgets, "handed", serde_json::json!({ DRAIN: "true" })).await;
    until(&widgets, "handed", "the handover", |o| {
        o.is_some_and(|o| labels(o).is_empty())
    })
    .await;
    widgets
        .delete("deleted", &Default::default())
        .await
        .unwrap();
    log.until("the deletion", |l| l.iter().any(|e| e == "deleted Deleted"))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let entries = log.all();
    assert!(
        !entries
            .iter()
            .any(|e| e == "relabelled Deleted" || e == "handed Deleted"),
        "{entries:?}"
    );
    running.stop().await;
}
