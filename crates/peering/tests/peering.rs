//! Peering, end to end: operators' peering (`kactor_peering::peering::run`) against the cluster over
//! real HTTP with the real `kube::Client`, one behaviour per test, and one interop test with a real
//! Kopf operator in the same peering.
//!
//! Each test starts its own cluster. Lifetimes are short where expiry matters; every wait has a
//! deadline and asserts an outcome, never a speed.
//!
//! The Kopf test finds Python through `KACTOR_PYTHON` (default `python3`, which must import `kopf`);
//! without it the test is skipped with a line saying so, unless `KACTOR_REQUIRE_THIRD_PARTY=1`
//! (set by `scripts/test`), when it fails.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kactor_emulator::samples;
use kactor_peering::peering::{
    self, crds, freeze, peering_object, resume, PeeringMode, PeeringSettings, CRD_MISSING,
};
use kactor_reactor::pausing::PauseSwitch;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The longest a test waits for peering to react to a change.
const REACT: Duration = Duration::from_secs(30);

// ---- helpers --------------------------------------------------------------------------------------

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

fn peerings(client: &kube::Client, group: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    let (kind, plural) = match namespace {
        Some(_) => ("KopfPeering", "kopfpeerings"),
        None => ("ClusterKopfPeering", "clusterkopfpeerings"),
    };
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural);
    match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

async fn install_crds(client: &kube::Client, group: &str) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &samples::crd_api_resource());
    for mut crd in crds() {
        if group != "kopf.dev" {
            let plural = crd["spec"]["names"]["plural"].as_str().unwrap().to_string();
            crd["spec"]["group"] = json!(group);
            crd["metadata"]["name"] = json!(format!("{plural}.{group}"));
        }
        let name = crd["metadata"]["name"].as_str().unwrap().to_string();
        api.create(&PostParams::default(), &object(crd))
            .await
            .expect("the peering CRD is created");
        samples::until_established(client, &name)
            .await
            .expect("the peering CRD is established");
    }
}

async fn create_peering(client: &kube::Client, group: &str, namespace: Option<&str>) {
    let mut body = peering_object("default", namespace);
    body["apiVersion"] = json!(format!("{group}/v1"));
    let api = peerings(client, group, namespace);
    samples::until_served(&api)
        .await
        .expect("the peering CRD is served");
    api.create(&PostParams::default(), &object(body))
        .await
        .expect("the peering object is created");
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("a namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("the namespace is created");
}

/// A cluster with Kopf's peering CRDs and the cluster-wide peering object `default`.
async fn cluster_with_peering() -> TestCluster {
    let cluster = TestCluster::start().await.expect("the cluster starts");
    install_crds(&cluster.client(), "kopf.dev").await;
    create_peering(&cluster.client(), "kopf.dev", None).await;
    cluster
}

/// Cluster-wide peering with this priority, lifetime and mode.
fn settings(priority: i64, lifetime: u64, mode: PeeringMode) -> PeeringSettings {
    PeeringSettings {
        priority,
        lifetime: Duration::from_secs(lifetime),
        mode,
        clusterwide: true,
        ..PeeringSettings::default()
    }
}

/// One operator's peering, running in the background.
struct Operator {
    identity: String,
    switch: PauseSwitch,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Operator {
    fn start(client: &kube::Client, settings: PeeringSettings, identity: &str) -> Operator {
        let switch = PauseSwitch::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(peering::run(
            client.clone(),
            settings,
            identity.to_string(),
            switch.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Operator {
            identity: identity.to_string(),
            switch,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn reasons(&self) -> BTreeMap<String, String> {
        self.switch.reasons()
    }

    async fn wait_paused(&self, containing: &str) -> BTreeMap<String, String> {
        let what = format!("{} paused with {containing:?}", self.identity);
        eventually(&what, REACT, || async {
            let reasons = self.reasons();
            reasons
                .values()
                .any(|reason| reason.contains(containing))
                .then_some(reasons)
        })
        .await
    }

    async fn wait_unpaused(&self) {
        let what = format!("{} unpaused", self.identity);
        eventually(&what, REACT, || async {
            (!self.switch.is_paused()).then_some(())
        })
        .await
    }

    /// Stops it and waits until `run` has returned (its record removed).
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(REACT, task)
                .await
                .unwrap_or_else(|_| panic!("{}'s peering did not stop in time", self.identity))
                .expect("the peering task does not panic");
        }
    }
}

/// Polls `check` every 100 ms until it gives `Some`, at most `limit`; then panics naming `what`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `status` of a peering object (an empty object if it has none).
async fn status(api: &Api<DynamicObject>) -> Value {
    let object = api
        .get("default")
        .await
        .expect("the peering object is read");
    object.data.get("status").cloned().unwrap_or(json!({}))
}

async fn wait_record(api: &Api<DynamicObject>, identity: &str) -> Value {
    eventually(&format!("the record of {identity}"), REACT, || async {
        let status = status(api).await;
        status.get(identity).filter(|r| r.is_object()).cloned()
    })
    .await
}

async fn wait_no_record(api: &Api<DynamicObject>, identity: &str) {
    eventually(&format!("no record of {identity}"), REACT, || async {
        status(api).await.get(identity).is_none().then_some(())
    })
    .await
}

/// Writes a record as another operator (or a person) would: an arbitrary JSON value.
async fn write_record(api: &Api<DynamicObject>, identity: &str, record: Value) {
    api.patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {identity: record}})),
    )
    .await
    .expect("the record is written");
}

/// A `lastseen` this many seconds ago, as Python's `isoformat()` writes it.
fn lastseen_ago(seconds: i64) -> String {
    let at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(seconds);
    let utc = at.to_zoned(jiff::tz::TimeZone::UTC).datetime();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        utc.year(),
        utc.month(),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second(),
        utc.subsec_nanosecond() / 1_000
    )
}

/// Whether `text` is `YYYY-mm-ddTHH:MM:SS.ffffff+00:00`, Python's `isoformat()` of a UTC time.
fn is_kopf_lastseen(text: &str) -> bool {
    let bytes = text.as_bytes();
    let pattern = b"dddd-dd-ddTdd:dd:dd.dddddd+00:00";
    bytes.len() == pattern.len()
        && bytes.iter().zip(pattern).all(|(b, p)| match p {
            b'd' => b.is_ascii_digit(),
            _ => b == p,
        })
}

// ---- behaviours -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_priority_pauses_for_a_higher_one_and_resumes_when_it_stops() {
    let cluster = cluster_with_peering().await;
    let client = cluster.client();
    let api = peerings(&client, "kopf.dev", None);

    let low = Operator::start(&client, settings(0, 60, PeeringMode::AutoDetect), "low");
    wait_record(&api, "low").await;
    // A long lifetime: only the removal of its record (not its expiry) can resume the low one in time.
    let high = Operator::start(&client, settings(100, 60, PeeringMode::AutoDetect), "high");

    let reasons = low
        .wait_paused("Pausing operations in favour of high (priority 100)")
        .await;
    assert!(
        reasons.keys().all(|key| key.starts_with("peering default")),
        "{reasons:?}"
    );
    assert!(!high.switch.is_paused(), "{:?}", high.reasons());

    high.stop().await;
    assert!(
        status(&api).await.get("high").is_none(),
        "the leaving operator removes its record"
    );
    low.wait_unpaused().await;

    low.stop().await;
    assert_eq!(status(&api).await, json!({}), "no record is left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_priorities_pause_both_operators() {
    let cluster = cluster_with_peering().await;
    let client = cluster.client();

    let one = Operator::start(&client, settings(5, 60, PeeringMode::AutoDetect), "one");
    let two = Operator::start(&client, settings(5, 60, PeeringMode::AutoDetect), "two");
    one.wait_paused("Possibly conflicting operators with the same priority: two (priority 5)")
        .await;
    two.wait_paused("Possibly conflicting operators with the same priority: one (priority 5)")
        .await;

    two.stop().await;
    one.wait_unpaused().await;
    one.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peer_is_cleaned_up_and_does_not_pause() {
    let cluster = cluster_with_peering().await;
    let client = cluster.client();
    let api = peerings(&client, "kopf.dev", None);
    write_record(
        &api,
        "ghost",
        json!({"priority": 100, "lifetime": 60, "lastseen": lastseen_ago(3600)}),
    )
    .await;

    // Mandatory: paused until the first look at the object, so unpaused means "looked and free".
    let operator = Operator::start(&client, settings(0, 3, PeeringMode::Mandatory), "alive");
    operator.wait_unpaused().await;
    wait_no_record(&api, "ghost").await;
    wait_record(&api, "alive").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_peer_that_expires_without_leaving_stops_blocking() {
    let cluster = cluster_with_peering().await;
    let client = cluster.client();
    let api = peerings(&client, "kopf.dev", None);
    let operator = Operator::start(&client, settings(0, 60, PeeringMode::Mandatory), "survivor");
    operator.wait_unpaused().await;

    // A peer that then dies without removing its record: it pauses the operator until it expires,
    // and nothing but the operator's own wake-up at that expiry lifts the pause.
    let record = json!({"priority": 100, "lifetime": 5, "lastseen": lastseen_ago(0)});
    write_record(&api, "crashed", record).await;
    operator
        .wait_paused("Pausing operations in favour of crashed (priority 100)")
        .await;
    operator.wait_unpaused().await;
    wait_no_record(&api, "crashed").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_ignores_peers_and_writes_no_record() {
    let cluster = cluster_with_peering().await;
    let client = cluster.client();
    let api = peerings(&client, "kopf.dev", None);
    write_record(
        &api,
        "boss",
        json!({"priority": 1000, "lifetime": 3600, "lastseen": lastseen_ago(0)}),
    )
    .await;

    let alone = Operator::start(&client, settings(0, 3, PeeringMode::Standalone), "alone");
    // A peering operator next to it shows that the boss's record pauses whoever peers.
    let control = Operator::start(&client, settings(0, 3, PeeringMode::AutoDetect), "control");
    control
        .wait_paused("Pausing operations in favour of boss (priority 1000)")
        .await;
    wait_record(&api, "control").await;

    assert!(!alone.switch.is_paused(), "{:?}", alone.reasons());
    assert!(status(&api).await.get("alone").is_none());
    alone.stop().await;
    control.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_peering_stays_paused_without_the_crd_and_resumes_once_crd_and_object_exist() {
    let cluster = TestCluster::start().await.expect("the cluster starts");
    let client = cluster.client();
    let operator = Operator::start(&client, settings(0, 3, PeeringMode::Mandatory), "strict");

    let reasons = operator.wait_paused("peering CRD is missing").await;
    assert!(reasons.contains_key(CRD_MISSING), "{reasons:?}");

    install_crds(&client, "kopf.dev").await;
    let reasons = operator.wait_paused("is missing cluster-wide").await;
    eventually("the CRD toggle lifted", REACT, || async {
        (!operator.reasons().contains_key(CRD_MISSING)).then_some(())
    })
    .await;
    assert!(operator.switch.is_paused(), "still paused: {reasons:?}");

    create_peering(&client, "kopf.dev", None).await;
    operator.wait_unpaused().await;
    let api = peerings(&client, "kopf.dev", None);
    wait_record(&api, "strict").await;
    operator.stop().await;
    wait_no_record(&api, "strict").await;
}

/// `--create-peering`: a mandatory operator whose peering object is missing creates it (cluster-wide
/// and in each served namespace, once the CRD is there) and peers through it; without the CRD it stays
/// paused as without the option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_peering_with_create_missing_creates_the_missing_objects_and_peers() {
    let cluster = TestCluster::start().await.expect("the cluster starts");
    let client = cluster.client();
    let mut cluster_wide = settings(0, 3, PeeringMode::Mandatory);
    cluster_wide.create_missing = true;
    let operator = Operator::start(&client, cluster_wide, "creator");
    let reasons = operator.wait_paused("peering CRD is missing").await;
    assert!(reasons.contains_key(CRD_MISSING), "{reasons:?}");

    install_crds(&client, "kopf.dev").await;
    operator.wait_unpaused().await;
    let api = peerings(&client, "kopf.dev", None);
    let created = api
        .get("default")
        .await
        .expect("the operator created the object");
    assert_eq!(
        created.types.as_ref().map(|t| t.kind.as_str()),
        Some("ClusterKopfPeering")
    );
    wait_record(&api, "creator").await;

    // Namespaced: one KopfPeering in each served namespace; one already there is left as it is.
    for namespace in ["ns1", "ns2"] {
        create_namespace(&client, namespace).await;
    }
    create_peering(&client, "kopf.dev", Some("ns1")).await;
    let ns1 = peerings(&client, "kopf.dev", Some("ns1"));
    let before = ns1.get("default").await.unwrap().metadata.uid;
    let namespaced = PeeringSettings {
        lifetime: Duration::from_secs(3),
        mode: PeeringMode::Mandatory,
        namespaces: vec!["ns1".into(), "ns2".into()],
        create_missing: true,
        ..PeeringSettings::default()
    };
    let local = Operator::start(&client, namespaced, "local");
    // Paused from the call on, before the spawned peering has run: waiting for "unpaused" cannot
    // pass before the objects are created and seen.
    assert!(
        local.reasons().contains_key(peering::STARTING),
        "{:?}",
        local.reasons()
    );
    local.wait_unpaused().await;
    let ns2 = peerings(&client, "kopf.dev", Some("ns2"));
    wait_record(&ns1, "local").await;
    wait_record(&ns2, "local").await;
    assert_eq!(ns1.get("default").await.unwrap().metadata.uid, before);
    local.stop().await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_detection_without_the_crd_runs_unpaused_and_peers_once_it_appears() {
    let cluster = TestCluster::start().await.expect("the cluster starts");
    let client = cluster.client();
    let operator = Operator::start(&client, settings(0, 3, PeeringMode::AutoDetect), "relaxed");

    // Not peering: never paused, whatever the time it takes to find there is no CRD.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(!operator.switch.is_paused(), "{:?}", operator.reasons());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The CRD, the object and a higher peer appear later: it peers and pauses.
    install_crds(&client, "kopf.dev").await;
    create_peering(&client, "kopf.dev", None).await;
    let api = peerings(&client, "kopf.dev", None);
    write_record(
        &api,
        "boss",
        json!({"priority": 9, "lifetime": 3600, "lastseen": lastseen_ago(0)}),
    )
    .await;
    operator
        .wait_paused("Pausing operations in favour of boss (priority 9)")
        .await;
    wait_record(&api, "relaxed").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeze_pauses_a_running_operator_and_resume_releases_it() {
    let cluster = cluster_with_peering().await;
    let client = cluster.client();
    let api = peerings(&client, "kopf.dev", None);
    let operator = Operator::start(&client, settings(0, 3, PeeringMode::Mandatory), "worker");
    operator.wait_unpaused().await;

    freeze(
        client.clone(),
        "default",
        None,
        "admin@laptop",
        100,
        Duration::from_secs(3600),
    )
    .await
    .expect("frozen");
    let record = wait_record(&api, "admin@laptop").await;
    assert_eq!(record["priority"], 100);
    assert_eq!(record["lifetime"], 3600);
    operator
        .wait_paused("Pausing operations in favour of admin@laptop (priority 100)")
        .await;

    resume(client.clone(), "default", None, "admin@laptop")
        .await
        .expect("resumed");
    wait_no_record(&api, "admin@laptop").await;
    operator.wait_unpaused().await;
    operator.stop().await;

    let missing = freeze(
        client.clone(),
        "absent",
        None,
        "admin",
        100,
        Duration::from_secs(60),
    )
    .await
    .expect_err("no such peering object");
    assert!(
        missing.to_string().contains("`absent` not found"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_peering_uses_a_kopfpeering_in_each_served_namespace() {
    let cluster = TestCluster::start().await.expect("the cluster starts");
    let client = cluster.client();
    install_crds(&client, "kopf.dev").await;
    create_peering(&client, "kopf.dev", None).await;
    for namespace in ["ns1", "ns2"] {
        create_namespace(&client, namespace).await;
        create_peering(&client, "kopf.dev", Some(namespace)).await;
    }
    let settings = PeeringSettings {
        priority: 0,
        lifetime: Duration::from_secs(3),
        mode: PeeringMode::Mandatory,
        clusterwide: false,
        namespaces: vec!["ns1".into(), "ns2".into()],
        ..PeeringSettings::default()
    };
    let operator = Operator::start(&client, settings, "local");
    operator.wait_unpaused().await;
    let ns1 = peerings(&client, "kopf.dev", Some("ns1"));
    let ns2 = peerings(&client, "kopf.dev", Some("ns2"));
    wait_record(&ns1, "local").await;
    wait_record(&ns2, "local").await;

    // A conflict in one namespace pauses the operator, with that namespace's toggle only.
    freeze(
        client.clone(),
        "default",
        Some("ns2"),
        "admin",
        50,
        Duration::from_secs(3600),
    )
    .await
    .expect("frozen in ns2");
    let reasons = operator
        .wait_paused("Pausing operations in favour of admin (priority 50)")
        .await;
    let keys: Vec<&String> = reasons.keys().collect();
    assert_eq!(
        keys,
        ["peering default@ns2 (kopfpeerings.kopf.dev)"],
        "{reasons:?}"
    );

    resume(client.clone(), "default", Some("ns2"), "admin")
        .await
        .expect("resumed in ns2");
    operator.wait_unpaused().await;
    operator.stop().await;
    wait_no_record(&ns1, "local").await;
    wait_no_record(&ns2, "local").await;
    let cluster = peerings(&client, "kopf.dev", None);
    assert_eq!(
        status(&cluster).await,
        json!({}),
        "namespaced peering leaves the cluster-wide object alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_zalando_peering_is_used_when_only_it_is_served() {
    let cluster = TestCluster::start().await.expect("the cluster starts");
    let client = cluster.client();
    install_crds(&client, "zalando.org").await;
    create_peering(&client, "zalando.org", None).await;
    let api = peerings(&client, "zalando.org", None);
    write_record(
        &api,
        "old-kopf",
        json!({"priority": 10, "lifetime": 3600, "lastseen": lastseen_ago(0)}),
    )
    .await;

    let operator = Operator::start(&client, settings(0, 3, PeeringMode::Mandatory), "new");
    operator
        .wait_paused("Pausing operations in favour of old-kopf (priority 10)")
        .await;
    wait_record(&api, "new").await;
    operator.stop().await;
    wait_no_record(&api, "new").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepalive_record_is_byte_compatible_with_kopfs() {
    let cluster = cluster_with_peering().await;
    let client = cluster.client();
    let api = peerings(&client, "kopf.dev", None);
    let operator = Operator::start(
        &client,
        settings(42, 7, PeeringMode::AutoDetect),
        "kactor-1",
    );
    wait_record(&api, "kactor-1").await;

    // The object as the API serves it: its JSON, as any other client (Kopf) reads it.
    let raw = status(&api).await;
    let text = raw.to_string();
    let record = raw["kactor-1"]
        .as_object()
        .unwrap_or_else(|| panic!("no record in {text}"));
    let mut fields: Vec<&str> = record.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["lastseen", "lifetime", "priority"], "{text}");
    assert!(
        record["priority"].is_i64() && record["priority"] == 42,
        "{text}"
    );
    assert!(
        record["lifetime"].is_i64() && record["lifetime"] == 7,
        "{text}"
    );
    let lastseen = record["lastseen"].as_str().expect("lastseen is a string");
    assert!(
        is_kopf_lastseen(lastseen),
        "lastseen {lastseen:?} is not isoformat() of UTC"
    );
    let seen: jiff::Timestamp = lastseen.parse().expect("lastseen parses");
    let age = jiff::Timestamp::now()
        .duration_since(seen)
        .as_secs_f64()
        .abs();
    assert!(age < 60.0, "lastseen {lastseen} is now, give or take");

    operator.stop().await;
    let raw = status(&api).await;
    assert!(
        raw.get("kactor-1").is_none(),
        "the record is removed, not nulled: {raw}"
    );
}

// ---- Kopf ------------------------------------------------------------------------------------------

mod kopf {
    //! Minimal helpers to run a Kopf operator as a subprocess, after `crates/emulator/tests/common`.

    use std::io::Write as _;
    use std::path::{Path, PathBuf};
    use std::process::Stdio;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::io::AsyncReadExt as _;
    use tokio::process::{Child, Command};

    /// Set to `1` (by `scripts/test`), a missing Python or Kopf fails the test instead of skipping it.
    pub const REQUIRE: &str = "KACTOR_REQUIRE_THIRD_PARTY";

    const PROXY_VARIABLES: [&str; 6] = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ];

    /// The Python to use (`KACTOR_PYTHON`, default `python3`) if it imports `kopf`; else `None` (the
    /// test is skipped, with a line on stderr), or a panic when `KACTOR_REQUIRE_THIRD_PARTY=1`.
    pub async fn python(test: &str) -> Option<String> {
        let mut python = std::env::var("KACTOR_PYTHON")
            .ok()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| "python3".to_string());
        if python.contains('/') {
            if let Ok(absolute) = std::path::absolute(&python) {
                python = absolute.to_string_lossy().into_owned();
            }
        }
        let probe = Command::new(&python)
            .args(["-c", "import kopf"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .status();
        let detail = match tokio::time::timeout(Duration::from_secs(60), probe).await {
            Ok(Ok(status)) if status.success() => return Some(python),
            Ok(Ok(status)) => format!("`{python} -c 'import kopf'` failed ({status})"),
            Ok(Err(error)) => format!("`{python}` cannot be run: {error}"),
            Err(_) => format!("`{python} -c 'import kopf'` took over 60 s"),
        };
        if std::env::var(REQUIRE).as_deref() == Ok("1") {
            panic!("{test}: Python with Kopf is not installed ({detail}), and {REQUIRE}=1 requires it: run scripts/test");
        }
        // Straight to the process's stderr, past the test harness's capture, so a skip is always seen.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {test}: Python with Kopf not installed ({detail}); run scripts/test"
        );
        None
    }

    /// A scratch directory with the cluster's kubeconfig; removed when dropped.
    pub struct Workdir {
        path: PathBuf,
        kubeconfig: PathBuf,
    }

    impl Workdir {
        pub fn new(test: &str, cluster: &kactor_testenv::TestCluster) -> Workdir {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let path = std::env::temp_dir().join(format!(
                "kactor-peering-{test}-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("the scratch directory is made");
            let kubeconfig = path.join("kubeconfig");
            cluster
                .write_kubeconfig(&kubeconfig)
                .expect("the kubeconfig is written");
            Workdir { path, kubeconfig }
        }

        /// `python -m kopf run ... <script>` pointed at the cluster, with `POD_ID` as its identity.
        pub fn kopf(&self, python: &str, script: &Path, identity: &str, args: &[&str]) -> Command {
            let mut command = Command::new(python);
            command
                .args(["-m", "kopf", "run"])
                .args(args)
                .arg(script)
                .env("KUBECONFIG", &self.kubeconfig)
                .env("HOME", &self.path)
                .env("POD_ID", identity)
                .env("NO_PROXY", "127.0.0.1,localhost")
                .env("no_proxy", "127.0.0.1,localhost")
                .env("PYTHONUNBUFFERED", "1")
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .current_dir(&self.path)
                .stdin(Stdio::null());
            for variable in PROXY_VARIABLES {
                command.env_remove(variable);
            }
            command
        }
    }

    impl Drop for Workdir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }

    /// A Kopf process in the background, its output collected; killed when dropped, and its output
    /// printed if the test is failing.
    pub struct Kopf {
        name: String,
        child: Child,
        output: Arc<Mutex<String>>,
        readers: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Kopf {
        pub fn spawn(name: &str, command: &mut Command) -> Kopf {
            let mut child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
            let output = Arc::new(Mutex::new(String::new()));
            let readers = vec![
                collect(child.stdout.take(), output.clone()),
                collect(child.stderr.take(), output.clone()),
            ];
            Kopf {
                name: name.to_string(),
                child,
                output,
                readers,
            }
        }

        /// Everything it printed so far.
        pub fn log(&self) -> String {
            self.output.lock().unwrap().clone()
        }

        /// Panics, with its output, if it has exited.
        pub fn assert_running(&mut self) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited unexpectedly ({status}):\n{}",
                    self.name,
                    self.report()
                );
            }
        }

        fn report(&self) -> String {
            format!(
                "--- {name} output ---\n{}\n--- end of {name} ---",
                self.log(),
                name = self.name
            )
        }

        /// Asks it to exit (SIGTERM, as Kubernetes does) and waits at most `limit` for it to go.
        pub async fn terminate(&mut self, limit: Duration) {
            if let Some(pid) = self.child.id() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
            match tokio::time::timeout(limit, self.child.wait()).await {
                Ok(Ok(_)) => {}
                _ => panic!(
                    "{} did not exit within {limit:?} of SIGTERM:\n{}",
                    self.name,
                    self.report()
                ),
            }
            for reader in self.readers.drain(..) {
                let _ = tokio::time::timeout(Duration::from_secs(10), reader).await;
            }
        }
    }

    impl Drop for Kopf {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("{}", self.report());
            }
            let _ = self.child.start_kill();
        }
    }

    fn collect(
        pipe: Option<impl tokio::io::AsyncRead + Unpin + Send + 'static>,
        into: Arc<Mutex<String>>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let Some(mut pipe) = pipe else { return };
            let mut buffer = vec![0u8; 8192];
            loop {
                match pipe.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => into
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..n])),
                }
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn kopf_and_kactor_pause_in_favour_of_each_other() {
    const TEST: &str = "kopf_and_kactor_pause_in_favour_of_each_other";
    let Some(python) = kopf::python(TEST).await else {
        return;
    };
    let cluster = cluster_with_peering().await;
    let client = cluster.client();
    let api = peerings(&client, "kopf.dev", None);
    let dir = kopf::Workdir::new(TEST, &cluster);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/kopf_peer.py");

    // Kopf at 100, kactor at 0: kactor pauses in Kopf's favour, and works again once Kopf exits.
    let low = Operator::start(
        &client,
        settings(0, 60, PeeringMode::Mandatory),
        "kactor-low",
    );
    low.wait_unpaused().await;
    let mut command = dir.kopf(
        &python,
        &script,
        "kopf-high",
        &[
            "--priority",
            "100",
            "-A",
            "--peering",
            "default",
            "--verbose",
        ],
    );
    let mut high = kopf::Kopf::spawn("kopf (priority 100)", &mut command);
    low.wait_paused("Pausing operations in favour of kopf-high (priority 100)")
        .await;
    high.assert_running();
    let record = wait_record(&api, "kopf-high").await;
    assert!(
        record["priority"].is_i64() && record["priority"] == 100,
        "{record}"
    );
    assert!(
        record["lifetime"].is_i64() && record["lifetime"] == 60,
        "{record}"
    );
    let lastseen = record["lastseen"]
        .as_str()
        .expect("Kopf's lastseen is a string");
    assert!(
        lastseen.parse::<jiff::Timestamp>().is_ok() && lastseen.ends_with("+00:00"),
        "Kopf's lastseen {lastseen:?}"
    );
    high.terminate(Duration::from_secs(60)).await;
    let log = high.log();
    // Kopf's record lives 60 s: only Kopf's own removal at exit can lift the pause this soon.
    wait_no_record(&api, "kopf-high").await;
    low.wait_unpaused().await;
    low.stop().await;
    assert!(
        !log.contains("Traceback"),
        "Kopf failed reading kactor's record:\n{log}"
    );

    // kactor at 100, Kopf at 0: Kopf pauses in kactor's favour, and resumes once kactor leaves.
    let high = Operator::start(
        &client,
        settings(100, 60, PeeringMode::Mandatory),
        "kactor-high",
    );
    high.wait_unpaused().await;
    wait_record(&api, "kactor-high").await;
    let mut command = dir.kopf(
        &python,
        &script,
        "kopf-low",
        // Auto-detected peering: with `--peering` (mandatory) Kopf starts paused and so never says
        // "Pausing operations in favour of ...", which is what shows it read kactor's record.
        &["--priority", "0", "-A", "--verbose"],
    );
    let mut low = kopf::Kopf::spawn("kopf (priority 0)", &mut command);
    eventually(
        "Kopf pausing in favour of kactor",
        Duration::from_secs(60),
        || {
            low.assert_running();
            let log = low.log();
            async move {
                (log.contains("Pausing operations in favour of") && log.contains("kactor-high"))
                    .then_some(())
            }
        },
    )
    .await;
    wait_record(&api, "kopf-low").await;
    let log = low.log();
    assert!(
        log.contains("kactor-high: priority=100, lifetime=60, lastseen="),
        "Kopf read kactor's record field by field:\n{log}"
    );
    assert!(!high.switch.is_paused(), "{:?}", high.reasons());
    high.stop().await;
    eventually("Kopf resuming after kactor left", REACT, || {
        low.assert_running();
        let log = low.log();
        async move {
            log.contains("Resuming operations after the pause")
                .then_some(())
        }
    })
    .await;
    low.terminate(Duration::from_secs(60)).await;
    let log = low.log();
    assert!(!log.contains("Traceback"), "Kopf failed:\n{log}");
    assert!(
        !log.contains("Possibly conflicting"),
        "Kopf saw a conflict:\n{log}"
    );
    wait_no_record(&api, "kopf-low").await;
}
