//! The examples, end to end: the memcached operator against the cluster over real HTTP, its
//! program as a newcomer first runs it (`cargo run --example memcached`), the tour's script, and
//! the ephemeral volume claims of Kopf's walkthrough.
//!
//! Nothing is asserted on wall-clock time: what must happen is waited for, up to a generous cap.

mod support;

// The operator of `examples/memcached/`, compiled here as it is there; `main.rs` is the program
// around it, tested below through the built binary.
#[allow(dead_code)]
#[path = "../examples/memcached/operator.rs"]
mod memcached;

// The tour's operator and script, run here in-process.
#[allow(dead_code)]
#[path = "../examples/tour.rs"]
mod tour;

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kactor::emulator::samples;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};
use memcached::{Memcached, MemcachedSpec};
use serde_json::Value;
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// A cluster with the `Memcached` CRD, made from the Rust type as the example installs it, and
/// the APIs the tests use.
struct Cluster {
    cluster: TestCluster,
    memcacheds: Api<Memcached>,
    /// The same objects, untyped: handler results in `status` are not fields of `MemcachedStatus`.
    raw: Api<DynamicObject>,
    deployments: Api<Deployment>,
}

async fn cluster() -> Cluster {
    let cluster = TestCluster::builder()
        .emulator(|e| e.bookmark_interval(Duration::from_millis(200)))
        .start()
        .await
        .unwrap();
    let client = cluster.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Memcached::crd())
        .await
        .unwrap();
    let memcacheds = Api::namespaced(client.clone(), "default");
    samples::until_served(&memcacheds).await.unwrap();
    Cluster {
        memcacheds,
        raw: Api::namespaced_with(
            client.clone(),
            "default",
            &ApiResource::erase::<Memcached>(&()),
        ),
        deployments: Api::namespaced(client, "default"),
        cluster,
    }
}

/// Waits until a handler's result is in `status.<id>`, and returns it.
async fn result_of(cluster: &Cluster, name: &str, id: &str) -> Value {
    let object = support::until(&cluster.raw, name, &format!("status.{id}"), |o| {
        o.is_some_and(|o| !status(o)[id].is_null())
    })
    .await
    .unwrap();
    status(&object)[id].clone()
}

/// The example's operator on the cluster; `drift_check` is its timer's schedule.
fn memcached_operator(cluster: &TestCluster, drift_check: Timer) -> Operator {
    memcached::operator(drift_check)
        .expect("the operator's metric registers")
        .client(cluster.client())
        .standalone()
        .settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(10);
            s.queueing.exit_timeout = Duration::from_millis(500);
        })
}

/// The example's own schedule: no drift check runs during a test that does not wait for one.
fn slow_drift_check() -> Timer {
    memcached::drift_check()
}

/// A drift check every 200 ms, for the tests of the drift check.
fn fast_drift_check() -> Timer {
    Timer::every(Duration::from_millis(200))
}

async fn create(memcacheds: &Api<Memcached>, name: &str, size: i32) -> Memcached {
    memcacheds
        .create(
            &PostParams::default(),
            &Memcached::new(name, MemcachedSpec { size }),
        )
        .await
        .unwrap()
}

/// Waits until the object passes `check` (None: it does not exist), or fails showing it.
async fn until<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&K>) -> bool,
) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + Debug,
{
    until_within(WAIT, api, name, what, check).await
}

/// How long the garbage collector may take: a real one notices the kind of a CRD created just
/// before only at its next discovery resync (every 30 s), and collects the dependents of an owner of
/// that kind then; the emulator's collects at once.
const COLLECTED: Duration = Duration::from_secs(60);

/// [`until`], waiting at most `wait`.
async fn until_within<K>(
    wait: Duration,
    api: &Api<K>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&K>) -> bool,
) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + Debug,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let object = api.get_opt(name).await.unwrap();
        if check(object.as_ref()) {
            return object;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; the object: {}",
            serde_json::to_string_pretty(&object).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn replicas(deployment: &Deployment) -> Option<i32> {
    deployment.spec.as_ref()?.replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memcached_gets_a_deployment_of_its_size_labelled_and_owned_by_it() {
    let cluster = cluster().await;
    let running = spawn(memcached_operator(&cluster.cluster, slow_drift_check()));
    let created = create(&cluster.memcacheds, "cache", 3).await;

    let deployment = until(&cluster.deployments, "cache", "the Deployment", |d| {
        d.is_some()
    })
    .await
    .unwrap();
    assert_eq!(replicas(&deployment), Some(3));
    let labels = [("app", "memcached"), ("memcached_cr", "cache")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
    assert_eq!(deployment.metadata.labels.as_ref(), Some(&labels));
    let spec = deployment.spec.as_ref().unwrap();
    assert_eq!(spec.selector.match_labels.as_ref(), Some(&labels));
    let template = &spec.template;
    assert_eq!(
        template.metadata.as_ref().unwrap().labels.as_ref(),
        Some(&labels)
    );
    let container = &template.spec.as_ref().unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("memcached:1.6-alpine"));
    assert_eq!(
        container.command.as_deref(),
        Some(&["memcached", "-m=64", "-o", "modern", "-v"].map(String::from)[..])
    );
    let owners = deployment.owner_references();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = &owners[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("cache.example.com/v1alpha1", "Memcached", "cache")
    );
    assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));

    // The create handler's result, and the finalizer that the delete handler needs.
    assert_eq!(
        result_of(&cluster, "cache", "create_deployment").await,
        json!({"deployment": "cache", "replicas": 3})
    );
    let memcached = cluster.memcacheds.get("cache").await.unwrap();
    assert!(memcached.finalizers().iter().any(|f| f == FINALIZER));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_size_scales_the_deployment_and_shows_in_the_probe_and_metric() {
    let cluster = cluster().await;
    let port = free_port();
    let running = spawn(
        memcached_operator(&cluster.cluster, slow_drift_check())
            .liveness(&format!("http://127.0.0.1:{port}/healthz")),
    );
    create(&cluster.memcacheds, "cache", 3).await;
    until(&cluster.deployments, "cache", "3 replicas", |d| {
        d.and_then(replicas) == Some(3)
    })
    .await;

    cluster
        .memcacheds
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    let deployment = until(&cluster.deployments, "cache", "5 replicas", |d| {
        d.and_then(replicas) == Some(5)
    })
    .await
    .unwrap();
    // Only the replicas changed.
    let container = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("memcached:1.6-alpine"));
    assert_eq!(
        result_of(&cluster, "cache", "scale/spec.size").await,
        json!({"replicas": 5})
    );

    // The probe's result is part of /healthz; the counter is on /metrics with kactor's.
    let body = until_answer(port, "/healthz", "the probe's counts", |code, _| {
        code == 200
    })
    .await;
    let health: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        health["deployment_changes"],
        json!({"applied": 1, "scaled": 1, "repaired": 0, "deleted": 0}),
        "{body}"
    );
    let metrics = until_answer(port, "/metrics", "the metrics", |code, _| code == 200).await;
    assert!(
        metrics.contains("memcached_deployment_changes_total{change=\"scaled\"} 1"),
        "{metrics}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_check_recreates_a_deleted_deployment_and_restores_its_replicas() {
    let cluster = cluster().await;
    let deployments = &cluster.deployments;
    let running = spawn(memcached_operator(&cluster.cluster, fast_drift_check()));
    create(&cluster.memcacheds, "cache", 2).await;
    let first = until(deployments, "cache", "the Deployment", |d| d.is_some())
        .await
        .unwrap();

    deployments
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    let second = until(deployments, "cache", "a new Deployment", |d| {
        d.is_some_and(|d| d.uid() != first.uid())
    })
    .await
    .unwrap();
    assert_eq!(replicas(&second), Some(2));
    assert!(second.owner_references().iter().any(|o| o.name == "cache"));

    deployments
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 7}})),
        )
        .await
        .unwrap();
    until(deployments, "cache", "the replicas scaled back", |d| {
        d.and_then(replicas) == Some(2)
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_check_lists_the_pods_of_its_memcached_in_status_nodes() {
    let cluster = cluster().await;
    // The cluster runs no controllers: the test plays the ReplicaSet's part.
    let pods: Api<Pod> = Api::namespaced(cluster.cluster.client(), "default");
    for (name, owner) in [
        ("cache-b", "cache"),
        ("cache-a", "cache"),
        ("other-a", "other"),
    ] {
        make_pod(&pods, name, owner).await;
    }
    let running = spawn(memcached_operator(&cluster.cluster, fast_drift_check()));
    create(&cluster.memcacheds, "cache", 2).await;
    let nodes = |m: Option<&Memcached>| {
        m.and_then(|m| m.status.as_ref())
            .map(|s| s.nodes.clone())
            .unwrap_or_default()
    };
    until(&cluster.memcacheds, "cache", "status.nodes", |m| {
        nodes(m) == ["cache-a", "cache-b"]
    })
    .await;

    pods.delete("cache-b", &DeleteParams::default())
        .await
        .unwrap();
    until(
        &cluster.memcacheds,
        "cache",
        "status.nodes without the deleted pod",
        |m| nodes(m) == ["cache-a"],
    )
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_memcached_deletes_its_deployment_then_lets_it_go() {
    let cluster = cluster().await;
    let (memcacheds, deployments) = (&cluster.memcacheds, &cluster.deployments);
    let running = spawn(memcached_operator(&cluster.cluster, slow_drift_check()));
    create(memcacheds, "cache", 1).await;
    until(deployments, "cache", "the Deployment", |d| d.is_some()).await;
    until(memcacheds, "cache", "the finalizer", |m| {
        m.is_some_and(|m| m.finalizers().iter().any(|f| f == FINALIZER))
    })
    .await;
    // Without its owner reference, the garbage collector would leave the Deployment alone: only
    // the delete handler can delete it.
    deployments
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
        )
        .await
        .unwrap();

    memcacheds
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    until(deployments, "cache", "the Deployment to go", |d| {
        d.is_none()
    })
    .await;
    until(memcacheds, "cache", "the Memcached to go", |m| m.is_none()).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_recreates_a_deployment_deleted_while_it_was_down() {
    let cluster = cluster().await;
    let running = spawn(memcached_operator(&cluster.cluster, slow_drift_check()));
    create(&cluster.memcacheds, "cache", 4).await;
    result_of(&cluster, "cache", "create_deployment").await;
    running.stop().await;

    cluster
        .deployments
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    let running = spawn(memcached_operator(&cluster.cluster, slow_drift_check()));
    let deployment = until(&cluster.deployments, "cache", "the Deployment again", |d| {
        d.is_some()
    })
    .await
    .unwrap();
    assert_eq!(replicas(&deployment), Some(4));
    assert_eq!(
        result_of(&cluster, "cache", "resume_deployment").await,
        json!({"deployment": "cache", "replicas": 4})
    );
    running.stop().await;
}

/// The example's actor version on the cluster; `check_every` is how often each actor checks drift.
/// The example's reconcile version (`reconcile.rs`) on the cluster.
fn memcached_reconcile_operator(cluster: &TestCluster) -> Operator {
    memcached::reconcile::operator()
        .expect("the operator's metric registers")
        .client(cluster.client())
        .standalone()
        .settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(10);
            s.queueing.exit_timeout = Duration::from_millis(500);
        })
}

/// The longest an event-driven repair may take here. Not a benchmark: the handlers' version
/// repairs on its drift timer (every 30 s after 10 s without changes), so anything under this
/// cap is the child's event reaching its owner's worker, whatever the machine's speed.
const EVENT_DRIVEN: Duration = Duration::from_secs(5);

/// Waits (up to [`EVENT_DRIVEN`]) until the Deployment `cache` passes `check`, and prints how long
/// that took: shown, not asserted (it is polled every 25 ms), as the figure for the record.
async fn repaired(
    deployments: &Api<Deployment>,
    what: &str,
    check: impl Fn(Option<&Deployment>) -> bool,
) {
    let since = std::time::Instant::now();
    until_within(EVENT_DRIVEN, deployments, "cache", what, check).await;
    eprintln!("{what}: within {:?}", since.elapsed());
}

/// Makes a pod of `owner` by hand: the test clusters run no ReplicaSet controller.
async fn make_pod(pods: &Api<Pod>, name: &str, owner: &str) {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "memcached", "memcached_cr": owner}},
        "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6-alpine"}]},
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_version_puts_back_a_deployment_deleted_or_scaled_by_hand_at_once() {
    let cluster = cluster().await;
    let running = spawn(memcached_reconcile_operator(&cluster.cluster));
    let created = create(&cluster.memcacheds, "cache", 3).await;
    let deployment = until(&cluster.deployments, "cache", "the Deployment", |d| {
        d.and_then(replicas) == Some(3)
    })
    .await
    .unwrap();
    let owner = &deployment.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Memcached", Some(true))
    );
    assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
    // Nothing of Kopf's bookkeeping on a reconciled object: only kactor's finalizer.
    let object = cluster.raw.get("cache").await.unwrap();
    let annotations = object.metadata.annotations.clone().unwrap_or_default();
    assert!(
        !annotations.keys().any(|k| k.starts_with(PREFIX)),
        "{annotations:?}"
    );
    assert!(has_finalizer(&object));

    cluster
        .deployments
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    let uid = deployment.metadata.uid.clone();
    repaired(&cluster.deployments, "a deleted Deployment back", |d| {
        d.is_some_and(|d| d.metadata.uid != uid && replicas(d) == Some(3))
    })
    .await;

    let patch = json!({"spec": {"replicas": 1}});
    cluster
        .deployments
        .patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    repaired(&cluster.deployments, "3 replicas again", |d| {
        d.and_then(replicas) == Some(3)
    })
    .await;

    // A spec change scales it; the condition reports it, for this generation.
    let patch = json!({"spec": {"size": 4}});
    cluster
        .memcacheds
        .patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    until(&cluster.deployments, "cache", "4 replicas", |d| {
        d.and_then(replicas) == Some(4)
    })
    .await;
    let available = |o: Option<&DynamicObject>| {
        let Some(o) = o else { return false };
        status(o)["conditions"]
            .as_array()
            .is_some_and(|conditions| {
                conditions.iter().any(|c| {
                    c["type"] == "Available"
                        && c["status"] == "True"
                        && c["observedGeneration"] == json!(o.metadata.generation)
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("4 replicas"))
                })
            })
    };
    support::until(
        &cluster.raw,
        "cache",
        "Available for generation 2",
        available,
    )
    .await;

    // Deleted: the cleanup runs, then kactor lets the finalizer go.
    cluster
        .memcacheds
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    until(&cluster.memcacheds, "cache", "the Memcached to go", |m| {
        m.is_none()
    })
    .await;
    until(&cluster.deployments, "cache", "the Deployment to go", |d| {
        d.is_none()
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_version_keeps_status_nodes_with_the_pods() {
    let cluster = cluster().await;
    let pods: Api<Pod> = Api::namespaced(cluster.cluster.client(), "default");
    make_pod(&pods, "cache-b", "cache").await;
    make_pod(&pods, "other-a", "other").await;
    let running = spawn(memcached_reconcile_operator(&cluster.cluster));
    create(&cluster.memcacheds, "cache", 2).await;
    let nodes = |m: Option<&Memcached>| {
        m.and_then(|m| m.status.as_ref())
            .map(|s| s.nodes.clone())
            .unwrap_or_default()
    };
    until(&cluster.memcacheds, "cache", "status.nodes", |m| {
        nodes(m) == ["cache-b"]
    })
    .await;
    // A pod comes, one goes: the pods are watched, and mapped to their Memcached by label.
    make_pod(&pods, "cache-a", "cache").await;
    until_within(
        EVENT_DRIVEN,
        &cluster.memcacheds,
        "cache",
        "the new pod",
        |m| nodes(m) == ["cache-a", "cache-b"],
    )
    .await;
    pods.delete("cache-b", &DeleteParams::default())
        .await
        .unwrap();
    until_within(
        EVENT_DRIVEN,
        &cluster.memcacheds,
        "cache",
        "without the deleted pod",
        |m| nodes(m) == ["cache-a"],
    )
    .await;
    running.stop().await;
}

fn memcached_actor_operator(cluster: &TestCluster, check_every: Duration) -> Operator {
    memcached::actor::operator(check_every)
        .expect("the operator's metric registers")
        .client(cluster.client())
        .standalone()
        .settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(10);
            s.queueing.exit_timeout = Duration::from_millis(500);
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_version_applies_scales_reports_repairs_and_deletes() {
    use memcached::actor::{MemcachedActor, Report, Request};
    let cluster = cluster().await;
    let (memcacheds, deployments) = (&cluster.memcacheds, &cluster.deployments);
    let operator = memcached_actor_operator(&cluster.cluster, Duration::from_millis(200));
    let actors = operator.actors::<MemcachedActor>();
    let running = spawn(operator);

    create(memcacheds, "cache", 2).await;
    until(deployments, "cache", "the Deployment", |d| {
        d.and_then(replicas) == Some(2)
    })
    .await;
    assert_eq!(
        result_of(&cluster, "cache", "memcached/create").await,
        json!({"deployment": "cache", "replicas": 2})
    );
    memcacheds
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap();
    until(deployments, "cache", "4 replicas", |d| {
        d.and_then(replicas) == Some(4)
    })
    .await;
    let report = actors
        .ask(("default", "cache"), Request::Report)
        .await
        .unwrap();
    assert_eq!(report.replicas, Some(4), "{report:?}");

    // Drift: the Deployment scaled by hand, then deleted; the actor's own checks put it back.
    deployments
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    until(deployments, "cache", "the replicas put back", |d| {
        d.and_then(replicas) == Some(4)
    })
    .await;
    deployments
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    until(deployments, "cache", "the Deployment made again", |d| {
        d.is_some_and(|d| d.metadata.deletion_timestamp.is_none())
    })
    .await;
    let Report {
        repairs, checks, ..
    } = actors
        .ask(("default", "cache"), Request::Report)
        .await
        .unwrap();
    assert!(
        repairs >= 2 && checks >= repairs,
        "{repairs} repairs in {checks} checks"
    );
    until(memcacheds, "cache", "status.nodes", |m| {
        m.and_then(|m| m.status.as_ref()).is_some()
    })
    .await;

    memcacheds
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    until(deployments, "cache", "the Deployment to go", |d| {
        d.is_none()
    })
    .await;
    until(memcacheds, "cache", "the Memcached to go", |m| m.is_none()).await;
    running.stop().await;
}

/// Every operator's `--emulator` (`run_from_args`): the hello example, as built, on the embedded
/// API server: it says where the server and its kubeconfig are, installs its CRD, handles an object
/// created through that kubeconfig, and exits cleanly on SIGTERM, removing the kubeconfig.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_operator_runs_on_the_embedded_api_server_with_emulator() {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hello-emulator-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let (mut child, greetings, kubeconfig) =
        start_hello(&["--emulator"], &home.join("hello.log")).await;
    // The CRD was installed by --emulator, and the object is handled.
    assert_eq!(
        greet(&greetings, "kactor").await["message"],
        "hello, kactor"
    );

    let status = terminate(&mut child, DEMO_WAIT).await;
    assert!(status.success(), "{status}");
    assert!(!kubeconfig.exists(), "the kubeconfig is removed at exit");
    let _ = std::fs::remove_dir_all(&home);
}

/// The hello example started with `args` (`--emulator` among them), its log going to `log`; the
/// running program, and its greetings through the kubeconfig it printed.
async fn start_hello(
    args: &[&str],
    log: &Path,
) -> (tokio::process::Child, Api<DynamicObject>, PathBuf) {
    let mut child = tokio::process::Command::new(build_example("hello"))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("the example starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let kubeconfig = tokio::time::timeout(DEMO_WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(path) = line.trim().strip_prefix("kubectl     export KUBECONFIG=") {
                return PathBuf::from(path);
            }
        }
        panic!("the program ended without printing its kubeconfig");
    })
    .await
    .expect("the kubeconfig is printed in time");
    // The rest of stdout is read, so that a full pipe never blocks the program.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let greetings = Api::namespaced_with(
        kube::Client::try_from(config).unwrap(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("example.com", "v1", "Greeting"),
            "greetings",
        ),
    );
    (child, greetings, kubeconfig)
}

/// Creates a Greeting and waits for the greeting its handler leaves in its status.
async fn greet(greetings: &Api<DynamicObject>, name: &str) -> Value {
    let greeting = json!({
        "apiVersion": "example.com/v1", "kind": "Greeting",
        "metadata": {"name": name}, "spec": {"name": name}
    });
    greetings
        .create(
            &PostParams::default(),
            &serde_json::from_value(greeting).unwrap(),
        )
        .await
        .unwrap();
    let greeted = support::until(greetings, name, "the greeting", |g| {
        g.is_some_and(|g| !status(g)["greet"].is_null())
    })
    .await
    .unwrap();
    status(&greeted)["greet"].clone()
}

/// `--emulator-state FILE`: what was created is there again after a restart, as it was (nothing
/// handled again), after a clean exit and after a SIGKILL once it was saved; a file that is not a
/// saved state stops the program with a clear error, and is left as it was.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_state_file_the_emulator_keeps_what_was_created_across_restarts() {
    let home =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hello-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let state = home.join("state.json");
    let state_arg = format!("--emulator-state={}", state.display());
    let args = ["--emulator", state_arg.as_str()];
    let log = home.join("first.log");
    let (mut child, greetings, _) = start_hello(&args, &log).await;
    let first = greet(&greetings, "first").await;
    assert!(terminate(&mut child, DEMO_WAIT).await.success());
    assert!(state.is_file(), "saved at exit");

    // Again: the greeting is there as it was, and its handler does not run again.
    let log = home.join("second.log");
    let (mut child, greetings, _) = start_hello(&args, &log).await;
    let again = greetings.get("first").await.unwrap();
    assert_eq!(status(&again)["greet"], first);
    let second = greet(&greetings, "second").await;
    // Saved every second while something changes: a SIGKILL after that loses nothing. Waited
    // for in the file (its greeting there), not for a time a slow machine may not keep.
    let saved = serde_json::to_string(&second).unwrap();
    let deadline = tokio::time::Instant::now() + DEMO_WAIT;
    while !std::fs::read_to_string(&state).is_ok_and(|text| text.contains(&saved)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second greeting was never saved"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let handled = std::fs::read_to_string(&log).unwrap();
    assert!(handled.contains("[default/second]"), "{handled}");
    assert!(
        !handled.contains("[default/first]"),
        "first is not handled again:\n{handled}"
    );

    let log = home.join("third.log");
    let (mut child, greetings, _) = start_hello(&args, &log).await;
    for (name, greeting) in [("first", &first), ("second", &second)] {
        assert_eq!(
            &status(&greetings.get(name).await.unwrap())["greet"],
            greeting
        );
    }
    assert!(terminate(&mut child, DEMO_WAIT).await.success());

    // Not a saved state: a clear error, and the file is left as it was.
    std::fs::write(&state, "{\"not\": \"a state\"}").unwrap();
    let output = tokio::process::Command::new(build_example("hello"))
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("not an emulator state"), "{said}");
    assert_eq!(
        std::fs::read_to_string(&state).unwrap(),
        "{\"not\": \"a state\"}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

/// Sends SIGTERM to the program, as Kubernetes does to stop a pod, and waits for it to exit.
async fn terminate(child: &mut tokio::process::Child, wait: Duration) -> std::process::ExitStatus {
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    tokio::time::timeout(wait, child.wait())
        .await
        .expect("the program exits in time after SIGTERM")
        .unwrap()
}

/// The longest the program's demo may take: far more than it needs, even on a loaded machine.
const DEMO_WAIT: Duration = Duration::from_secs(120);

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_plays_its_demo_on_the_emulator_and_exits_cleanly_on_sigterm() {
    let program = memcached_binary();
    // A newcomer's machine: no cluster configured anywhere.
    let home = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memcached-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let mut child = tokio::process::Command::new(&program)
        .env("HOME", &home)
        .env("TMPDIR", &home)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .env_remove("KACTOR_EMULATOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    // The operator's log, read all along so that the program never blocks on a full pipe.
    let mut stderr = child.stderr.take().unwrap();
    let logs = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });

    let mut lines: Vec<String> = Vec::new();
    let read = tokio::time::timeout(DEMO_WAIT, async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            let done = line.starts_with("Demo finished.") || line.starts_with("The demo stopped");
            lines.push(line);
            if done {
                break;
            }
        }
    })
    .await;
    let output = lines.join("\n");
    assert!(
        read.is_ok(),
        "the demo did not finish in {DEMO_WAIT:?}; its output:\n{output}"
    );
    assert!(output.contains("no cluster configured"), "{output}");
    assert!(output.contains("Demo finished."), "{output}");
    for step in [
        "1. Creating the Memcached default/example-memcached with spec.size=3.",
        "made the Deployment default/example-memcached: 3 replicas",
        "2. Scaling: spec.size 3 -> 5.",
        "scaled the Deployment default/example-memcached to 5 replicas",
        "3. Deleting the Memcached.",
        "the Deployment is gone",
        "the Memcached is gone",
    ] {
        assert!(output.contains(step), "no {step:?} in:\n{output}");
    }
    let kubeconfig = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("kubectl     export KUBECONFIG="))
        .unwrap_or_else(|| panic!("no kubeconfig in:\n{output}"));
    assert!(Path::new(kubeconfig).starts_with(&home), "{kubeconfig}");
    assert!(Path::new(kubeconfig).is_file(), "{kubeconfig}");

    // The printed liveness URL answers.
    let liveness = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("liveness    "))
        .unwrap_or_else(|| panic!("no liveness URL in:\n{output}"));
    let port: u16 = liveness
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/healthz")
        .parse()
        .unwrap_or_else(|e| panic!("{liveness}: {e}"));
    let body = until_answer(port, "/healthz", "the liveness probe", |code, _| {
        code == 200
    })
    .await;
    assert!(body.contains("deployment_changes"), "{body}");

    let status = terminate(&mut child, WAIT).await;
    let mut rest = Vec::new();
    while let Some(line) = stdout.next_line().await.unwrap() {
        rest.push(line);
    }
    let logs = logs.await.unwrap();
    assert!(status.success(), "{status}; its log:\n{logs}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some("Stopped."),
        "{rest:?}"
    );
    assert!(
        !Path::new(kubeconfig).exists(),
        "the kubeconfig is removed at exit"
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn the_example_prints_the_crd_made_from_its_rust_type() {
    let output = std::process::Command::new(memcached_binary())
        .arg("crds")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let yaml = String::from_utf8(output.stdout).unwrap();
    let printed: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(printed, Memcached::crd(), "{yaml}");
}

/// The command that printed `deploy/memcached/manifests.yaml` (its header says so too).
const DEPLOY_MEMCACHED: [&str; 7] = [
    "manifests",
    "--image=memcached-operator:latest",
    "--all-namespaces",
    "--log-format=json",
    "--peering=memcached",
    "-o",
    "-",
];

fn memcached_manifests(args: &[&str]) -> String {
    let output = std::process::Command::new(memcached_binary())
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(output.status.success(), "{args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Binds every verb on everything to `system:anonymous` (`grant`), or removes that binding.
async fn grant_anonymous_admin(client: &kube::Client, grant: bool) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    const NAME: &str = "test-anonymous-admin";
    if !grant {
        bindings
            .delete(NAME, &DeleteParams::default())
            .await
            .unwrap();
        roles.delete(NAME, &DeleteParams::default()).await.unwrap();
        return;
    }
    let role = serde_json::from_value(json!({
        "metadata": {"name": NAME},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    }))
    .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let binding = serde_json::from_value(json!({
        "metadata": {"name": NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}],
    }))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// `deploy/memcached/manifests.yaml` is what the example prints: regenerate it when this fails, with
/// `memcached manifests --image=memcached-operator:latest -A --log-format=json --peering=memcached
/// -o deploy/memcached/manifests.yaml`. Its `Kustomization` lists it.
#[test]
fn the_deploy_manifests_are_what_the_example_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/memcached");
    let printed = memcached_manifests(&DEPLOY_MEMCACHED[..5]);
    let kept = std::fs::read_to_string(root.join("manifests.yaml")).unwrap();
    assert_eq!(
        printed,
        kept,
        "deploy/memcached/manifests.yaml is out of date: regenerate it with `memcached {}`",
        DEPLOY_MEMCACHED[..5].join(" ")
    );
    assert!(
        kept.contains(&DEPLOY_MEMCACHED[..5].join(" ")[10..]),
        "the header names the command"
    );
    let kustomization = std::fs::read_to_string(root.join("Kustomization")).unwrap();
    assert!(
        kustomization.contains("- manifests.yaml"),
        "{kustomization}"
    );
    let files: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json"))
        .collect();
    assert_eq!(
        files,
        ["manifests.yaml"],
        "`kubectl apply -f deploy/memcached/` reads these"
    );
}

/// `kubectl apply --server-side -f FILE` as the administrator, which must succeed; what it said.
async fn kubectl_apply_server_side(
    cluster: &TestCluster,
    kubeconfig: &Path,
    file: &Path,
) -> String {
    // kubectl sends no credentials to a server over plain http (client-go reads a kubeconfig's user
    // only for TLS), and the emulator serves http: there, the anonymous user applies, as admin for a
    // moment. Operators run with their service accounts' tokens on both servers.
    let anonymous_admin = cluster.emulator().is_some();
    if anonymous_admin {
        grant_anonymous_admin(&cluster.client(), true).await;
    }
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let applied = std::process::Command::new(&kubectl)
        .args(["apply", "--server-side", "-f"])
        .arg(file)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("{kubectl}: {e}"));
    let said = String::from_utf8_lossy(&applied.stdout).into_owned();
    assert!(
        applied.status.success(),
        "kubectl apply: {said}{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    if anonymous_admin {
        grant_anonymous_admin(&cluster.client(), false).await;
    }
    said
}

/// Writes a kubeconfig that authenticates as the service account `namespace/name`.
async fn write_account_kubeconfig(cluster: &TestCluster, namespace: &str, name: &str, path: &Path) {
    let mut kubeconfig = cluster.kubeconfig();
    let account = cluster
        .config_as_service_account(namespace, name)
        .await
        .unwrap();
    for named in &mut kubeconfig.auth_infos {
        named.auth_info = Some(account.auth_info.clone());
    }
    std::fs::write(path, serde_saphyr::to_string(&kubeconfig).unwrap()).unwrap();
}

/// Prints the memcached example's manifests into `home` and applies them in one kubectl call; every
/// object is accepted.
async fn apply_the_manifests_in_one_go(cluster: &TestCluster, home: &Path) {
    let admin_kubeconfig = home.join("admin.kubeconfig");
    cluster.write_kubeconfig(&admin_kubeconfig).unwrap();
    let manifests = home.join("manifests.yaml");
    std::fs::write(
        &manifests,
        memcached_manifests(&[
            "manifests",
            "--image=memcached-operator:test",
            "-A",
            "--peering=memcached",
            "--operator-namespace=memcached-system",
        ]),
    )
    .unwrap();
    let said = kubectl_apply_server_side(cluster, &admin_kubeconfig, &manifests).await;
    for object in [
        "namespace/memcached-system",
        "customresourcedefinition.apiextensions.k8s.io/memcacheds.cache.example.com",
        "customresourcedefinition.apiextensions.k8s.io/clusterkopfpeerings.kopf.dev",
        "serviceaccount/memcached",
        "clusterrole.rbac.authorization.k8s.io/memcached",
        "clusterrolebinding.rbac.authorization.k8s.io/memcached",
        "deployment.apps/memcached",
        "service/memcached-metrics",
    ] {
        assert!(
            said.contains(&format!("{object} serverside-applied")),
            "{object}:\n{said}"
        );
    }
}

/// `manifests` in one `kubectl apply --server-side` on an empty cluster (RBAC on): every object is
/// accepted; then the program runs with the Deployment's own arguments and environment, as its
/// service account: it creates its peering object, handles a Memcached, and no request is denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_apply_in_one_go_and_the_operator_works_with_exactly_them() {
    let cluster = TestCluster::builder().rbac(true).start().await.unwrap();
    let home = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memcached-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    apply_the_manifests_in_one_go(&cluster, &home).await;

    // The program, run as the Deployment runs it.
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), "memcached-system");
    let deployment = deployments.get("memcached").await.unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("memcached"));
    let container = &pod.containers[0];
    assert_eq!(container.image.as_deref(), Some("memcached-operator:test"));
    let port = free_port();
    // Health on a free local port rather than the pod's 0.0.0.0:8080.
    let args: Vec<String> = container
        .args
        .clone()
        .unwrap()
        .into_iter()
        .map(|arg| {
            arg.replace(
                "--liveness=http://0.0.0.0:8080",
                &format!("--liveness=http://127.0.0.1:{port}"),
            )
        })
        .collect();
    assert!(args.contains(&"--create-peering".to_string()), "{args:?}");
    let account_kubeconfig = home.join("account.kubeconfig");
    write_account_kubeconfig(
        &cluster,
        "memcached-system",
        "memcached",
        &account_kubeconfig,
    )
    .await;
    let log = home.join("operator.log");
    let mut child = run_as_the_pod(&args, &[], &account_kubeconfig, &log);

    let peerings = Api::<DynamicObject>::all_with(
        cluster.client(),
        &ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "kopf.dev",
            "v1",
            "ClusterKopfPeering",
        )),
    );
    until(
        &peerings,
        "memcached",
        "the operator's record in the peering it created",
        |p| p.is_some_and(|p| p.data["status"].get("memcached-7d4b9-x2x1z").is_some()),
    )
    .await;
    let memcacheds: Api<Memcached> = Api::namespaced(cluster.client(), "default");
    memcacheds
        .create(
            &PostParams::default(),
            &Memcached::new("cache", MemcachedSpec { size: 2 }),
        )
        .await
        .unwrap();
    let made: Api<Deployment> = Api::namespaced(cluster.client(), "default");
    until(&made, "cache", "the Memcached's Deployment", |d| {
        d.is_some()
    })
    .await;
    until_answer(port, "/readyz", "readiness", |code, _| code == 200).await;
    let output = stop_undenied(&mut child, &log).await;
    assert!(
        output.contains("Created the missing peering object 'memcached' cluster-wide"),
        "{output}"
    );

    // The reconcile version, with the same manifests: its caches of Deployments and pods (listed
    // and watched) are within them too.
    let reconcile = [("MEMCACHED_RECONCILE", "true")];
    let mut child = run_as_the_pod(&args, &reconcile, &account_kubeconfig, &log);
    memcacheds
        .create(
            &PostParams::default(),
            &Memcached::new("cache2", MemcachedSpec { size: 1 }),
        )
        .await
        .unwrap();
    until(
        &made,
        "cache2",
        "the reconciled Memcached's Deployment",
        |d| d.is_some(),
    )
    .await;
    until_answer(port, "/readyz", "readiness", |code, _| code == 200).await;
    stop_undenied(&mut child, &log).await;
    let _ = std::fs::remove_dir_all(&home);
}

/// The example's program with the Deployment's arguments and environment (plus `env`), as its
/// service account, its log in `log`.
fn run_as_the_pod(
    args: &[String],
    env: &[(&str, &str)],
    kubeconfig: &Path,
    log: &Path,
) -> tokio::process::Child {
    tokio::process::Command::new(memcached_binary())
        .args(args)
        .envs(env.iter().copied())
        .env("KUBECONFIG", kubeconfig)
        .env("POD_ID", "memcached-7d4b9-x2x1z")
        .env("POD_NAMESPACE", "memcached-system")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Stops the program, which must exit well with no request denied; its log.
async fn stop_undenied(child: &mut tokio::process::Child, log: &Path) -> String {
    let status = terminate(child, WAIT).await;
    let output = std::fs::read_to_string(log).unwrap();
    assert!(status.success(), "{status}:\n{output}");
    // A 403 as a number of its own: a port such as 40363 in the log is not one, nor the
    // milliseconds of a line's timestamp (`[2026-11-27 20:52:40,403]`).
    let status_403 = output.lines().any(|line| {
        let text = match line.strip_prefix('[') {
            Some(rest) => rest.split_once(']').map_or(line, |(_, text)| text),
            None => line,
        };
        text.match_indices("403").any(|(at, _)| {
            let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit());
            !digit(text[..at].chars().next_back()) && !digit(text[at + 3..].chars().next())
        })
    });
    assert!(!status_403, "a request was denied:\n{output}");
    for denied in ["Forbidden", "forbidden"] {
        assert!(!output.contains(denied), "a request was denied:\n{output}");
    }
    output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tour_fires_every_kind_of_handler_with_its_filters_and_errors() {
    let narrator = tour::Narrator::default();
    // Each step waits (up to 60 s) for what it shows before the next.
    tour::play(&narrator).await.unwrap();
    let said = narrator.lines().join("\n");
    let count = |text: &str| narrator.count(text);
    for kind in [
        "[startup]",
        "[cleanup]",
        "[event]",
        "[create]",
        "[update]",
        "[field]",
        "[resume]",
        "[delete]",
        "[daemon]",
        "[timer]",
        "[probe]",
        "[index]",
    ] {
        assert!(count(kind) > 0, "no {kind} in:\n{said}");
    }
    // The index follows demo's size, and the timer reads it.
    assert!(
        count("[index] by_size: demo is small (size 1)") >= 1,
        "{said}"
    );
    assert!(count("1 big widget(s) in the index by_size") >= 1, "{said}");
    // Errors: a temporary one is retried, a permanent one is not (not even after the restart).
    assert_eq!(count("flaky: demo, attempt 1 fails"), 1, "{said}");
    assert_eq!(count("flaky: demo, attempt 2 succeeds"), 1, "{said}");
    assert_eq!(count("[create] strict: strict"), 1, "{said}");
    // Filters: the annotation, the label, and the new value of a field.
    assert_eq!(count("[create] strict: demo"), 0, "{said}");
    for unwatched in ["audit: Added strict", "started for strict", "tick: strict"] {
        assert_eq!(count(unwatched), 0, "{unwatched:?} in:\n{said}");
    }
    assert_eq!(count("[update] grow:"), 1, "{said}");
    // Changing handlers run once per cause; the daemon stops for the exit, then the deletion.
    assert_eq!(count("[create] create_fn: demo"), 1, "{said}");
    assert_eq!(
        count("monitor: stopping for demo, because OPERATOR_EXITING"),
        1,
        "{said}"
    );
    assert!(count("/healthz answers 200") == 1, "{said}");
}

/// The example's binary. `cargo test` builds the examples with the tests (CI's `--all-targets`
/// too); `cargo test --test examples` does not, so it is built here when missing or older than
/// its sources.
fn memcached_binary() -> PathBuf {
    example_binary("memcached")
}

/// The binary of the example `name` (`examples/<name>/main.rs` or `examples/<name>.rs`), built
/// when missing or older than its sources.
fn example_binary(name: &str) -> PathBuf {
    // Once per example and test process: the tests that run it may start at the same time. The
    // lock is held while building, so that two tests never run cargo at once.
    static PROGRAMS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut programs = PROGRAMS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, program)) = programs.iter().find(|(built, _)| built == name) {
        return program.clone();
    }
    let program = build_example(name);
    programs.push((name.to_string(), program.clone()));
    program
}

fn build_example(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_kactor"));
    let profile_dir = bin.parent().unwrap();
    let program = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = std::fs::metadata(&program).and_then(|m| m.modified()).ok();
    let example_dir = format!("examples/{name}");
    let example_file = format!("examples/{name}.rs");
    let sources = [&*example_dir, &*example_file, "src", "crates", "Cargo.toml"]
        .iter()
        .filter_map(|p| newest(&root.join(p)))
        .max();
    if built.is_some_and(|built| sources.is_none_or(|sources| sources <= built)) {
        return program;
    }
    let mut cargo = std::process::Command::new(env!("CARGO"));
    cargo.current_dir(root).args(["build", "--example", name]);
    // Cargo sets these for the tests it runs. A build script that reads one (ring reads
    // CARGO_MANIFEST_DIR) would rebuild with it here, and again without it in the next build.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_tests = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&&*name);
        if set_for_tests {
            cargo.env_remove(&*name);
        }
    }
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cargo.arg("--release");
        }
        Some(profile) => {
            cargo.args(["--profile", profile]);
        }
    }
    let status = cargo.status().expect("cannot run cargo");
    assert!(status.success(), "cargo build --example {name}: {status}");
    program
}

/// The newest modification time of the Rust sources and manifests at or under `path` (only those:
/// files that tests write elsewhere in the tree must not make the binary look stale).
fn newest(path: &Path) -> Option<SystemTime> {
    let metadata = std::fs::metadata(path).ok()?;
    if metadata.is_dir() {
        return std::fs::read_dir(path)
            .ok()?
            .filter_map(|entry| newest(&entry.ok()?.path()))
            .max();
    }
    let source = path
        .extension()
        .is_some_and(|extension| extension == "rs" || extension == "toml");
    source.then(|| metadata.modified().ok()).flatten()
}

// Kopf's walkthrough operator, `examples/ephemeral_volume_claims/`, compiled here as it is there.
#[allow(dead_code)]
#[path = "../examples/ephemeral_volume_claims/operator.rs"]
mod ephemeral_volume_claims;

/// The walkthrough operator against the cluster: its PVCs follow their EVCs' size and labels, and
/// go with them.
mod evc {
    use super::ephemeral_volume_claims::{self, EphemeralVolumeClaim, EphemeralVolumeClaimSpec};
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use std::collections::BTreeMap;

    /// A cluster with the `EphemeralVolumeClaim` CRD, made from the Rust type, and the APIs the
    /// tests use.
    struct Cluster {
        cluster: TestCluster,
        evcs: Api<EphemeralVolumeClaim>,
        /// The same objects, untyped: handler results in `status` are not fields of the status type.
        raw: Api<DynamicObject>,
        pvcs: Api<PersistentVolumeClaim>,
    }

    async fn cluster() -> Cluster {
        let cluster = TestCluster::builder()
            .emulator(|e| e.bookmark_interval(Duration::from_millis(200)))
            .start()
            .await
            .unwrap();
        let client = cluster.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &EphemeralVolumeClaim::crd())
            .await
            .unwrap();
        let evcs = Api::namespaced(client.clone(), "default");
        samples::until_served(&evcs).await.unwrap();
        Cluster {
            evcs,
            raw: Api::namespaced_with(
                client.clone(),
                "default",
                &ApiResource::erase::<EphemeralVolumeClaim>(&()),
            ),
            pvcs: Api::namespaced(client, "default"),
            cluster,
        }
    }

    fn evc_operator(cluster: &TestCluster) -> Operator {
        ephemeral_volume_claims::operator()
            .client(cluster.client())
            .standalone()
            .settings(|s| {
                s.watching.reconnect_backoff = Duration::from_millis(10);
                s.queueing.exit_timeout = Duration::from_millis(500);
            })
    }

    async fn create(
        evcs: &Api<EphemeralVolumeClaim>,
        name: &str,
        size: &str,
        labels: &[(&str, &str)],
    ) -> EphemeralVolumeClaim {
        let mut evc = EphemeralVolumeClaim::new(
            name,
            EphemeralVolumeClaimSpec {
                size: size.to_string(),
            },
        );
        evc.metadata.labels = Some(string_map(labels));
        evcs.create(&PostParams::default(), &evc).await.unwrap()
    }

    fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Waits until a handler's result is in `status.<id>`, and returns it.
    async fn result_of(cluster: &Cluster, name: &str, id: &str) -> Value {
        let object = until(&cluster.raw, name, &format!("status.{id}"), |o| {
            o.is_some_and(|o| !status(o)[id].is_null())
        })
        .await
        .unwrap();
        status(&object)[id].clone()
    }

    fn storage(pvc: Option<&PersistentVolumeClaim>) -> Option<&str> {
        let requests = pvc?.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
        requests.get("storage").map(|quantity| quantity.0.as_str())
    }

    fn labels(pvc: Option<&PersistentVolumeClaim>) -> BTreeMap<String, String> {
        pvc.and_then(|p| p.metadata.labels.clone())
            .unwrap_or_default()
    }

    async fn patch_evc(cluster: &Cluster, name: &str, patch: Value) {
        cluster
            .evcs
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_evc_gets_a_pvc_of_its_size_with_its_labels_and_owned_by_it() {
        let cluster = cluster().await;
        let running = spawn(evc_operator(&cluster.cluster));
        let created = create(&cluster.evcs, "claim", "3Gi", &[("app", "demo")]).await;

        let pvc = until(&cluster.pvcs, "claim", "the PVC", |p| p.is_some())
            .await
            .unwrap();
        assert_eq!(storage(Some(&pvc)), Some("3Gi"));
        let spec = pvc.spec.as_ref().unwrap();
        assert_eq!(
            spec.access_modes.as_deref(),
            Some(&["ReadWriteOnce".to_string()][..])
        );
        assert_eq!(labels(Some(&pvc)), string_map(&[("app", "demo")]));
        let owners = pvc.owner_references();
        assert_eq!(owners.len(), 1, "{owners:?}");
        let owner = &owners[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str()
            ),
            ("kopf.dev/v1", "EphemeralVolumeClaim", "claim")
        );
        assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
        assert_eq!(owner.controller, Some(true));
        assert_eq!(
            result_of(&cluster, "claim", "create_fn").await,
            json!({"pvc-name": "claim"})
        );
        // No handler needs a finalizer: deleting an EVC never waits for the operator.
        let evc = cluster.evcs.get("claim").await.unwrap();
        assert!(evc.finalizers().is_empty(), "{:?}", evc.finalizers());

        // Without spec.size, the CRD's default: 1Gi.
        let plain: EphemeralVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "kopf.dev/v1",
            "kind": "EphemeralVolumeClaim",
            "metadata": {"name": "plain"},
            "spec": {},
        }))
        .unwrap();
        cluster
            .evcs
            .create(&PostParams::default(), &plain)
            .await
            .unwrap();
        let pvc = until(&cluster.pvcs, "plain", "the PVC of the default size", |p| {
            p.is_some()
        })
        .await;
        assert_eq!(storage(pvc.as_ref()), Some("1Gi"));
        running.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resizing_an_evc_patches_its_pvc_storage() {
        let cluster = cluster().await;
        // A real API server lets a PVC grow only when it is bound and its class allows expansion:
        // the cluster gets a default expandable class (its admission gives it to the PVC), and the
        // test plays the volume binder's part. The emulator checks neither.
        let real = cluster.cluster.backend() == kactor_testenv::Backend::ApiServer;
        if real {
            let classes: Api<StorageClass> = Api::all(cluster.cluster.client());
            let class = serde_json::from_value(json!({
                "metadata": {"name": "expandable", "annotations": {
                    "storageclass.kubernetes.io/is-default-class": "true"}},
                "provisioner": "example.com/none",
                "allowVolumeExpansion": true,
            }))
            .unwrap();
            classes
                .create(&PostParams::default(), &class)
                .await
                .unwrap();
        }
        let running = spawn(evc_operator(&cluster.cluster));
        create(&cluster.evcs, "claim", "1Gi", &[]).await;
        result_of(&cluster, "claim", "create_fn").await;
        if real {
            cluster
                .pvcs
                .patch_status(
                    "claim",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": "Bound",
                        "capacity": {"storage": "1Gi"}}})),
                )
                .await
                .unwrap();
        }

        patch_evc(&cluster, "claim", json!({"spec": {"size": "2Gi"}})).await;
        let pvc = until(&cluster.pvcs, "claim", "the PVC of 2Gi", |p| {
            storage(p) == Some("2Gi")
        })
        .await
        .unwrap();
        // Only the storage changed.
        let spec = pvc.spec.unwrap();
        assert_eq!(
            spec.access_modes.as_deref(),
            Some(&["ReadWriteOnce".to_string()][..])
        );
        assert_eq!(
            result_of(&cluster, "claim", "update_fn/spec.size").await,
            json!("2Gi")
        );
        running.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relabelling_an_evc_sets_and_removes_its_labels_on_the_pvc() {
        let cluster = cluster().await;
        let running = spawn(evc_operator(&cluster.cluster));
        create(
            &cluster.evcs,
            "claim",
            "1Gi",
            &[("app", "demo"), ("tier", "a")],
        )
        .await;
        until(&cluster.pvcs, "claim", "the PVC", |p| p.is_some()).await;
        // A label put on the PVC by someone else: relabelling leaves it alone.
        cluster
            .pvcs
            .patch(
                "claim",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"backup": "daily"}}})),
            )
            .await
            .unwrap();

        patch_evc(
            &cluster,
            "claim",
            json!({"metadata": {"labels": {"app": null, "tier": "b", "owner": "me"}}}),
        )
        .await;
        let expected = string_map(&[("backup", "daily"), ("owner", "me"), ("tier", "b")]);
        until(&cluster.pvcs, "claim", "the PVC relabelled", |p| {
            labels(p) == expected
        })
        .await;

        // All the EVC's labels removed: the PVC keeps only the foreign one.
        patch_evc(&cluster, "claim", json!({"metadata": {"labels": null}})).await;
        let expected = string_map(&[("backup", "daily")]);
        until(
            &cluster.pvcs,
            "claim",
            "the PVC without the EVC's labels",
            |p| labels(p) == expected,
        )
        .await;
        running.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deleting_an_evc_deletes_it_at_once_and_its_pvc_with_it() {
        let cluster = cluster().await;
        let running = spawn(evc_operator(&cluster.cluster));
        create(&cluster.evcs, "claim", "1Gi", &[]).await;
        until(&cluster.pvcs, "claim", "the PVC", |p| p.is_some()).await;
        result_of(&cluster, "claim", "create_fn").await;

        cluster
            .evcs
            .delete("claim", &DeleteParams::default())
            .await
            .unwrap();
        until(&cluster.evcs, "claim", "the EVC to go", |e| e.is_none()).await;
        // The garbage collector's work: the operator deletes nothing.
        until_within(COLLECTED, &cluster.pvcs, "claim", "the PVC to go", |p| {
            p.is_none()
        })
        .await;
        running.stop().await;
    }

    #[test]
    fn the_example_prints_the_crd_made_from_its_rust_type() {
        let output = std::process::Command::new(example_binary("ephemeral_volume_claims"))
            .arg("crds")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let yaml = String::from_utf8(output.stdout).unwrap();
        let printed: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(printed, EphemeralVolumeClaim::crd(), "{yaml}");
    }
}

/// The memcached example's validating webhook (`--webhook-host`), asked by the real API server
/// (the emulator calls no webhooks).
mod apiserver_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_memcached_webhook_refuses_a_size_over_its_bound() {
        let cluster = cluster().await;
        assert!(
            cluster.cluster.emulator().is_none(),
            "the emulator calls no webhooks"
        );
        let operator = memcached::validating(
            memcached_operator(&cluster.cluster, slow_drift_check()),
            "127.0.0.1",
            0,
        );
        let mut running = spawn(operator);
        // Until the API server has seen the webhook configuration: dry runs.
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let too_big = Memcached::new("huge", MemcachedSpec { size: 17 });
        let deadline = tokio::time::Instant::now() + WAIT;
        let denial = loop {
            match cluster.memcacheds.create(&dry, &too_big).await {
                Err(kube::Error::Api(status)) => break status,
                Ok(_) => {}
                Err(other) => panic!("{other}"),
            }
            running.assert_running().await;
            assert!(
                tokio::time::Instant::now() < deadline,
                "the webhook never took effect"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(denial.code, 422);
        assert!(
            denial.message.contains("spec.size 17 is more than 16 pods"),
            "{denial:?}"
        );
        // Within bounds: made, and handled as usual.
        create(&cluster.memcacheds, "fine", 16).await;
        result_of(&cluster, "fine", "create_deployment").await;
        // Scaling past the bound is refused too.
        let patch = serde_json::json!({"spec": {"size": 40}});
        let refused = cluster
            .memcacheds
            .patch("fine", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("more than 16"), "{refused}");
        running.stop().await;
    }
}
