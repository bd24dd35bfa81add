//! Sharding against the cluster over real HTTP, with the real `kube::Client`: members hold their
//! labelled Leases and pause when they cannot renew; the assigner labels every object for its owner,
//! drains objects to a member that joins (the owners simulated by a loop that hands drained objects
//! over, as a worker does), takes over a crashed member's Lease, moves its objects and deletes the
//! Lease, after which the member rejoins under a fresh one; and it acts only while it leads.
//!
//! Timings are short (lease 2 s, renew deadline 1200 ms, retry 200 ms, resync 1 s). Waits have
//! generous deadlines; assertions are about outcomes (who owns what, what the Leases say), never
//! about speed.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kactor_peering::sharding::{
    owner, Assigner, Member, MemberState, RingError, RingSettings, RingView, Target,
    ASSIGNER_PREFIX, MEMBER_LABEL, MEMBER_TOGGLE,
};
use kactor_reactor::pausing::PauseSwitch;
use kactor_reactor::sharding::{drain_label, shard_label, Tenure, DRAINING, RING_LABEL};
use kactor_testenv::TestCluster;
use kube::api::{
    Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use serde_json::json;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

const RING: &str = "demo";
/// The members' Leases.
const LEASES: &str = "kube-system";
/// The objects.
const OBJECTS: &str = "shards";
/// How long to wait for something that should happen within seconds.
const WAIT: Duration = Duration::from_secs(60);

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Lease 2 s, renew deadline 1200 ms, retry 200 ms, resync 1 s.
fn quick(identity: &str) -> RingSettings {
    let mut settings = RingSettings::new(RING, LEASES, identity)
        .with_timings(Duration::from_secs(2), ms(1200), ms(200))
        .unwrap();
    settings.resync_period = Duration::from_secs(1);
    settings
}

/// A client of its own, without kube's own retries, so that injected faults reach us.
fn client(cluster: &TestCluster) -> kube::Client {
    let mut config = cluster.config();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn leases(cluster: &TestCluster) -> Api<Lease> {
    Api::namespaced(client(cluster), LEASES)
}

fn configmaps(cluster: &TestCluster) -> Api<ConfigMap> {
    Api::namespaced(client(cluster), OBJECTS)
}

fn lease_name(member: &str) -> String {
    format!("{RING}-{member}")
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

fn names(members: &[&str]) -> Vec<String> {
    members.iter().map(|m| m.to_string()).collect()
}

/// Polls `check` every 100 ms until it is `Ok`; panics with its last complaint after [`WAIT`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let complaint = match check().await {
            Ok(()) => return,
            Err(complaint) => complaint,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {complaint}"
        );
        tokio::time::sleep(ms(100)).await;
    }
}

/// One member running in a task, with its own switch and client.
struct Running {
    identity: String,
    switch: PauseSwitch,
    tenure: Tenure,
    joined: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RingError>>,
}

impl Running {
    fn start(cluster: &TestCluster, identity: &str) -> Running {
        let switch = PauseSwitch::new();
        let tenure = Tenure::default();
        let member = Member::new(client(cluster), quick(identity), switch.clone())
            .with_tenure(tenure.clone());
        assert!(
            switch.reasons().contains_key(MEMBER_TOGGLE),
            "paused before it joins"
        );
        assert!(!tenure.holds(), "no tenure before it joins");
        // As the operator does when it starts: nothing is held from before.
        tenure.quiesced(tenure.ended());
        let joined = member.joined();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(member.run(async move {
            let _ = stopped.await;
        }));
        Running {
            identity: identity.to_string(),
            switch,
            tenure,
            joined,
            stop: Some(stop),
            task,
        }
    }

    /// Joined, and its operator works.
    fn works(&self) -> bool {
        *self.joined.borrow() && !self.switch.is_paused()
    }

    /// What the operator does once every worker has taken a pause: the tenure may hold again.
    fn quiesce(&self) {
        self.tenure.quiesced(self.tenure.ended());
    }

    fn reason(&self) -> String {
        self.switch
            .reasons()
            .get(MEMBER_TOGGLE)
            .cloned()
            .unwrap_or_default()
    }

    async fn wait_joined(&self) {
        let what = format!("{} joins", self.identity);
        eventually(&what, || async {
            if self.works() {
                Ok(())
            } else {
                Err(self.reason())
            }
        })
        .await;
    }

    /// A graceful stop: `run` releases the Lease and returns.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("run returns after stop")
            .expect("run does not panic")
            .expect("the settings are valid");
    }

    /// A crash: the `run` future is dropped where it stands, without a release.
    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The assigner running in a task, leading while `leader` says so.
struct Assigning {
    view: watch::Receiver<RingView>,
    leader: watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RingError>>,
}

impl Assigning {
    fn start(cluster: &TestCluster, identity: &str, leads: bool) -> Assigning {
        let targets = vec![Target::new(
            ApiResource::erase::<ConfigMap>(&()),
            Some(OBJECTS.to_string()),
        )];
        let assigner = Assigner::new(client(cluster), quick(identity), targets);
        let view = assigner.view();
        let (leader, is_leader) = watch::channel(leads);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(assigner.run(is_leader, async move {
            let _ = stopped.await;
        }));
        Assigning {
            view,
            leader,
            stop: Some(stop),
            task,
        }
    }

    fn view(&self) -> RingView {
        self.view.borrow().clone()
    }

    /// The view once `check` holds of it. The assigner counts a page's writes when the last of
    /// them is answered, so the cluster can show every move a moment before the view counts them.
    async fn view_when(&self, what: &str, check: impl Fn(&RingView) -> bool) -> RingView {
        eventually(what, || {
            let view = self.view();
            let verdict = match check(&view) {
                true => Ok(()),
                false => Err(format!("{view:?}")),
            };
            async move { verdict }
        })
        .await;
        self.view()
    }

    /// Drops the sender of `is_leader`, as when the elector is gone: that counts as not leading.
    fn orphan(&mut self) {
        self.leader = watch::channel(false).0;
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("run returns after stop")
            .expect("run does not panic")
            .expect("the settings are valid");
    }
}

/// An object as the tests look at it.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    uid: String,
    owner: Option<String>,
    draining: bool,
}

async fn objects(cluster: &TestCluster) -> Vec<Seen> {
    let list = configmaps(cluster)
        .list(&ListParams::default())
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter(|cm| cm.metadata.name.as_deref().unwrap_or("").starts_with("cm-"))
        .map(|cm| {
            let labels = cm.metadata.labels.unwrap_or_default();
            Seen {
                name: cm.metadata.name.unwrap_or_default(),
                uid: cm.metadata.uid.unwrap_or_default(),
                owner: labels.get(&shard_label(RING)).cloned(),
                draining: labels.contains_key(&drain_label(RING)),
            }
        })
        .collect()
}

/// Every object labelled for `owner(uid, members)`, with no drain label.
async fn settled(cluster: &TestCluster, count: usize, members: &[String]) -> Result<(), String> {
    let objects = objects(cluster).await;
    if objects.len() != count {
        return Err(format!("{} objects, not {count}", objects.len()));
    }
    let wrong: Vec<&Seen> = objects
        .iter()
        .filter(|o| o.draining || o.owner.as_deref() != owner(&o.uid, members))
        .collect();
    match wrong.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{} of {count} objects are not (only) labelled for their owner among {members:?}, e.g. {first:?}",
            wrong.len()
        )),
    }
}

/// The objects each owner has.
async fn by_owner(cluster: &TestCluster) -> BTreeMap<String, BTreeSet<String>> {
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for object in objects(cluster).await {
        owners
            .entry(object.owner.unwrap_or_default())
            .or_default()
            .insert(object.name);
    }
    owners
}

async fn create_namespace(cluster: &TestCluster) {
    let namespaces: Api<Namespace> = Api::all(client(cluster));
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(OBJECTS.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
}

/// ConfigMaps `cm-<from>` .. `cm-<to - 1>`, unlabelled.
async fn create_configmaps(cluster: &TestCluster, from: usize, to: usize) {
    let api = configmaps(cluster);
    futures::stream::iter(from..to)
        .map(|index| {
            let api = api.clone();
            async move {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("cm-{index:04}")),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([("index".into(), index.to_string())])),
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
}

/// An object an owner handed over.
#[derive(Debug, Clone)]
struct Drained {
    name: String,
    uid: String,
    from: String,
}

/// The owners, simulated: every 100 ms, each object with a drain label is handed over as a worker
/// does it (both labels removed, conditional on the resourceVersion seen), and recorded.
struct Drainer {
    handed_over: Arc<Mutex<Vec<Drained>>>,
    task: JoinHandle<()>,
}

impl Drainer {
    fn start(cluster: &TestCluster) -> Drainer {
        let api = configmaps(cluster);
        let handed_over = Arc::new(Mutex::new(Vec::new()));
        let record = handed_over.clone();
        let selector = format!("{}={DRAINING}", drain_label(RING));
        let task = tokio::spawn(async move {
            loop {
                let draining = api
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map(|list| list.items)
                    .unwrap_or_default();
                for cm in draining {
                    let metadata = cm.metadata;
                    let name = metadata.name.unwrap_or_default();
                    let from = metadata
                        .labels
                        .unwrap_or_default()
                        .get(&shard_label(RING))
                        .cloned()
                        .unwrap_or_default();
                    let patch = json!({"metadata": {
                        "resourceVersion": metadata.resource_version,
                        "labels": {shard_label(RING): null, drain_label(RING): null},
                    }});
                    let params = PatchParams::default();
                    if api
                        .patch(&name, &params, &Patch::Merge(&patch))
                        .await
                        .is_ok()
                    {
                        record.lock().unwrap().push(Drained {
                            name,
                            uid: metadata.uid.unwrap_or_default(),
                            from,
                        });
                    }
                }
                tokio::time::sleep(ms(100)).await;
            }
        });
        Drainer { handed_over, task }
    }

    /// What was handed over since the last call.
    fn take(&self) -> Vec<Drained> {
        std::mem::take(&mut *self.handed_over.lock().unwrap())
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every (uid, holder) a watch of the ring's Leases saw, in order, by Lease name.
#[derive(Clone, Default)]
struct LeaseHistory(Arc<Mutex<Vec<LeaseEvent>>>);

/// A Lease's name, uid and holder, as one watch event showed them.
type LeaseEvent = (String, String, Option<String>);

impl LeaseHistory {
    fn record(cluster: &TestCluster) -> (LeaseHistory, JoinHandle<()>) {
        let history = LeaseHistory::default();
        let api = leases(cluster);
        let seen = history.clone();
        let task = tokio::spawn(async move {
            let params = WatchParams::default().labels(&format!("{RING_LABEL}={RING}"));
            let mut rv = "0".to_string();
            loop {
                let Ok(stream) = api.watch(&params, &rv).await else {
                    tokio::time::sleep(ms(100)).await;
                    continue;
                };
                let mut stream = stream.boxed();
                while let Some(Ok(event)) = stream.next().await {
                    let lease = match event {
                        WatchEvent::Added(lease) | WatchEvent::Modified(lease) => lease,
                        WatchEvent::Bookmark(bookmark) => {
                            rv = bookmark.metadata.resource_version;
                            continue;
                        }
                        _ => continue,
                    };
                    rv = lease.metadata.resource_version.clone().unwrap_or(rv);
                    seen.0.lock().unwrap().push((
                        lease.metadata.name.clone().unwrap_or_default(),
                        lease.metadata.uid.clone().unwrap_or_default(),
                        holder(&lease),
                    ));
                }
            }
        });
        (history, task)
    }

    /// The holders the Lease with `uid` had, in order.
    fn holders(&self, uid: &str) -> Vec<Option<String>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, u, _)| u == uid)
            .map(|(_, _, holder)| holder.clone())
            .collect()
    }
}

#[tokio::test]
async fn a_member_holds_its_labelled_lease_while_it_works_and_releases_it_when_stopped() {
    let cluster = TestCluster::start().await.unwrap();
    let a = Running::start(&cluster, "a");
    a.wait_joined().await;

    let raw = Api::<DynamicObject>::namespaced_with(
        client(&cluster),
        LEASES,
        &ApiResource::erase::<Lease>(&()),
    );
    let created = raw.get(&lease_name("a")).await.unwrap();
    let labels = created.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(RING_LABEL).map(String::as_str), Some(RING));
    assert_eq!(labels.get(MEMBER_LABEL).map(String::as_str), Some("a"));
    let spec = &created.data["spec"];
    assert_eq!(spec["holderIdentity"], "a");
    assert_eq!(spec["leaseDurationSeconds"], 2);
    for field in ["acquireTime", "renewTime"] {
        let time = spec[field].as_str().unwrap_or_default();
        let (_, fraction) = time.split_once('.').unwrap_or_default();
        assert!(
            fraction.len() == 7 && fraction.ends_with('Z'),
            "{field} is a MicroTime: {time:?}"
        );
    }

    let first_renewal = spec["renewTime"].clone();
    eventually("a renews its lease", || async {
        let now = raw.get(&lease_name("a")).await.map_err(|e| e.to_string())?;
        if now.data["spec"]["renewTime"] == first_renewal {
            return Err("not renewed yet".into());
        }
        assert_eq!(now.data["spec"]["holderIdentity"], "a");
        Ok(())
    })
    .await;
    assert!(a.works(), "{}", a.reason());

    let switch = a.switch.clone();
    let joined = a.joined.clone();
    let tenure = a.tenure.clone();
    a.stop().await;
    assert!(switch.is_paused() && !*joined.borrow() && !tenure.holds());
    assert!(
        switch.reasons()[MEMBER_TOGGLE].contains("stopped"),
        "{:?}",
        switch.reasons()
    );
    let released = raw.get(&lease_name("a")).await.unwrap();
    let spec = &released.data["spec"];
    assert_eq!(
        spec["holderIdentity"].as_str().unwrap_or_default(),
        "",
        "{spec}"
    );
    assert_eq!(spec["leaseDurationSeconds"], 1);
}

#[tokio::test]
async fn invalid_settings_are_refused_and_the_member_stays_paused() {
    let cluster = TestCluster::start().await.unwrap();
    let mut settings = quick("a");
    settings.renew_deadline = settings.lease_duration;
    let switch = PauseSwitch::new();
    let error = Member::new(client(&cluster), settings, switch.clone())
        .run(std::future::pending())
        .await
        .unwrap_err();
    assert!(matches!(error, RingError::RenewDeadline { .. }), "{error}");
    assert!(switch.is_paused());
    let mut settings = quick("a");
    settings.identity = "Pod_A".into();
    let error = Member::new(client(&cluster), settings, switch.clone())
        .run(std::future::pending())
        .await
        .unwrap_err();
    assert!(matches!(error, RingError::LeaseName { .. }), "{error}");
    assert!(leases(&cluster)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .all(|l| l
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(RING_LABEL))
            .is_none()));
}

#[tokio::test]
async fn the_assigner_labels_every_object_and_drains_a_quarter_to_a_fourth_member() {
    const COUNT: usize = 300;
    let cluster = TestCluster::start().await.unwrap();
    create_namespace(&cluster).await;
    create_configmaps(&cluster, 0, COUNT).await;
    let three = vec![
        Running::start(&cluster, "a"),
        Running::start(&cluster, "b"),
        Running::start(&cluster, "c"),
    ];
    for member in &three {
        member.wait_joined().await;
    }
    let assigner = Assigning::start(&cluster, "a", true);
    let drainer = Drainer::start(&cluster);

    let abc = names(&["a", "b", "c"]);
    eventually("every object is labelled for one of three", || {
        settled(&cluster, COUNT, &abc)
    })
    .await;
    let owners = by_owner(&cluster).await;
    for member in &abc {
        assert!(
            owners.get(member).is_some_and(|o| !o.is_empty()),
            "{member} owns some: {owners:?}"
        );
    }
    assert!(
        drainer.take().is_empty(),
        "nothing drains while the members stay"
    );
    let view = assigner
        .view_when("the view counts every assignment", |view| {
            view.assigned >= COUNT as u64
        })
        .await;
    assert!(view.leading);
    assert_eq!(view.live(), abc);

    let d = Running::start(&cluster, "d");
    d.wait_joined().await;
    let abcd = names(&["a", "b", "c", "d"]);
    eventually("every object is labelled for one of four", || {
        settled(&cluster, COUNT, &abcd)
    })
    .await;

    let handed_over = drainer.take();
    let objects = objects(&cluster).await;
    let destined: BTreeSet<String> = objects
        .iter()
        .filter(|o| owner(&o.uid, &abcd) == Some("d"))
        .map(|o| o.name.clone())
        .collect();
    for drained in &handed_over {
        assert!(abc.contains(&drained.from), "{drained:?}");
        assert_eq!(owner(&drained.uid, &abc), Some(drained.from.as_str()));
        assert_eq!(owner(&drained.uid, &abcd), Some("d"), "{drained:?}");
    }
    let drained: BTreeSet<String> = handed_over.iter().map(|d| d.name.clone()).collect();
    assert_eq!(
        drained, destined,
        "exactly the objects that d now wins were drained, each once"
    );
    assert_eq!(drained.len(), handed_over.len(), "each object drained once");
    assert!(
        (COUNT * 15 / 100..=COUNT * 35 / 100).contains(&drained.len()),
        "about a quarter drained: {} of {COUNT}",
        drained.len()
    );
    let view = assigner
        .view_when("the view counts every drain", |view| {
            view.drained >= drained.len() as u64
        })
        .await;
    assert_eq!(view.live(), abcd);
    assert_eq!(view.takeovers, 0, "{view:?}");

    assigner.stop().await;
    for member in three.into_iter().chain([d]) {
        member.stop().await;
    }
}

#[tokio::test]
async fn a_crashed_members_objects_move_to_the_live_ones_and_it_rejoins_under_a_fresh_lease() {
    const COUNT: usize = 150;
    let cluster = TestCluster::start().await.unwrap();
    create_namespace(&cluster).await;
    create_configmaps(&cluster, 0, COUNT).await;
    let a = Running::start(&cluster, "a");
    let b = Running::start(&cluster, "b");
    let c = Running::start(&cluster, "c");
    for member in [&a, &b, &c] {
        member.wait_joined().await;
    }
    let (history, recorder) = LeaseHistory::record(&cluster);
    let assigner = Assigning::start(&cluster, "a", true);
    let drainer = Drainer::start(&cluster);
    let abc = names(&["a", "b", "c"]);
    eventually("every object is labelled for one of three", || {
        settled(&cluster, COUNT, &abc)
    })
    .await;
    let of_c = by_owner(&cluster).await.remove("c").unwrap_or_default();
    assert!(!of_c.is_empty());
    let old = leases(&cluster).get(&lease_name("c")).await.unwrap();
    let old_uid = old.metadata.uid.clone().unwrap();

    let c_switch = c.switch.clone();
    c.crash().await;
    assert!(
        c_switch.is_paused(),
        "a dropped member leaves its operator paused"
    );
    assert_eq!(
        holder(&leases(&cluster).get(&lease_name("c")).await.unwrap()).as_deref(),
        Some("c"),
        "a crash releases nothing"
    );

    let ab = names(&["a", "b"]);
    eventually(
        "c's objects move to a and b and its lease is deleted",
        || async {
            settled(&cluster, COUNT, &ab).await?;
            match leases(&cluster).get_opt(&lease_name("c")).await {
                Ok(None) => Ok(()),
                Ok(Some(lease)) => Err(format!("c's lease is still there: {:?}", holder(&lease))),
                Err(error) => Err(error.to_string()),
            }
        },
    )
    .await;
    assert!(
        drainer.take().is_empty(),
        "a dead member's objects are relabelled, not drained, and the others keep theirs"
    );
    let holders = history.holders(&old_uid);
    let taken_at = holders
        .iter()
        .position(|h| h.as_deref() == Some("assigner/a"))
        .unwrap_or_else(|| panic!("the assigner took c's lease over: {holders:?}"));
    assert!(holders[..taken_at]
        .iter()
        .all(|h| h.as_deref() == Some("c")));
    let view = assigner
        .view_when("the view counts c's objects relabelled", |view| {
            view.relabelled >= of_c.len() as u64
        })
        .await;
    assert!(view.takeovers >= 1 && view.deleted_leases >= 1, "{view:?}");

    let c = Running::start(&cluster, "c");
    c.wait_joined().await;
    let fresh = leases(&cluster).get(&lease_name("c")).await.unwrap();
    assert_ne!(fresh.metadata.uid.as_deref(), Some(old_uid.as_str()));
    assert_eq!(holder(&fresh).as_deref(), Some("c"));
    eventually("c gets its objects back by drains", || {
        settled(&cluster, COUNT, &abc)
    })
    .await;
    let handed_over = drainer.take();
    for drained in &handed_over {
        assert!(ab.contains(&drained.from), "{drained:?}");
        assert_eq!(owner(&drained.uid, &abc), Some("c"), "{drained:?}");
    }
    let drained: BTreeSet<String> = handed_over.iter().map(|d| d.name.clone()).collect();
    assert_eq!(drained, of_c, "c gets back exactly what it had, by drains");
    let holders = history.holders(&old_uid);
    assert!(
        holders[taken_at..]
            .iter()
            .all(|h| h.as_deref().is_some_and(|h| h.starts_with(ASSIGNER_PREFIX))),
        "the taken-over lease was never written by c again: {holders:?}"
    );

    recorder.abort();
    assigner.stop().await;
    for member in [a, b, c] {
        member.stop().await;
    }
}

#[tokio::test]
async fn a_taken_over_member_waits_until_its_lease_is_deleted_before_it_rejoins() {
    const COUNT: usize = 40;
    let cluster = TestCluster::start().await.unwrap();
    create_namespace(&cluster).await;
    create_configmaps(&cluster, 0, COUNT).await;
    let a = Running::start(&cluster, "a");
    a.wait_joined().await;
    let assigner = Assigning::start(&cluster, "boss", true);
    let drainer = Drainer::start(&cluster);
    let only_a = names(&["a"]);
    eventually("every object is a's", || settled(&cluster, COUNT, &only_a)).await;

    a.crash().await;
    let api = leases(&cluster);
    eventually("the assigner takes a's lease over", || async {
        let lease = api.get(&lease_name("a")).await.map_err(|e| e.to_string())?;
        match holder(&lease) {
            Some(holder) if holder == "assigner/boss" => Ok(()),
            other => Err(format!("held by {other:?}")),
        }
    })
    .await;
    let taken = api.get(&lease_name("a")).await.unwrap();
    assigner
        .view_when("the view shows a's lease taken over", |view| {
            view.members.get("a") == Some(&MemberState::TakenOver)
        })
        .await;

    // No live member: a's objects cannot move, so its lease stays taken over, and a, started again,
    // must wait, however long (here more than a lease duration and many retry periods).
    let a = Running::start(&cluster, "a");
    for _ in 0..30 {
        tokio::time::sleep(ms(100)).await;
        assert!(!*a.joined.borrow() && a.switch.is_paused());
        let now = api.get(&lease_name("a")).await.unwrap();
        assert_eq!(now.metadata.uid, taken.metadata.uid);
        assert_eq!(holder(&now).as_deref(), Some("assigner/boss"));
    }
    assert!(a.reason().contains("taken over"), "{}", a.reason());
    settled(&cluster, COUNT, &only_a).await.unwrap();

    // b joins: a's objects move to b, a's lease is deleted, a rejoins and gets its share by drains.
    let b = Running::start(&cluster, "b");
    a.wait_joined().await;
    let fresh = api.get(&lease_name("a")).await.unwrap();
    assert_ne!(fresh.metadata.uid, taken.metadata.uid);
    let ab = names(&["a", "b"]);
    eventually("a and b share the objects", || {
        settled(&cluster, COUNT, &ab)
    })
    .await;
    let handed_over = drainer.take();
    assert!(!handed_over.is_empty());
    for drained in &handed_over {
        assert_eq!(drained.from, "b", "{drained:?}");
        assert_eq!(owner(&drained.uid, &ab), Some("a"), "{drained:?}");
    }

    assigner.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_resync_pages_through_every_object_of_an_owner_gone_without_a_lease() {
    // More than two pages of the resync's list (500 each), labelled for an owner that never had a
    // Lease: only a resync moves them (the unlabelled watch does not see them), page by page.
    const COUNT: usize = 1_100;
    let cluster = TestCluster::start().await.unwrap();
    create_namespace(&cluster).await;
    create_configmaps(&cluster, 0, COUNT).await;
    let patch = json!({"metadata": {"labels": {shard_label(RING): "ghost"}}});
    futures::stream::iter(objects(&cluster).await)
        .map(|object| {
            let (api, patch) = (configmaps(&cluster), &patch);
            async move {
                api.patch(&object.name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    let member = Running::start(&cluster, "a");
    member.wait_joined().await;
    let assigner = Assigning::start(&cluster, "a", true);
    let a = names(&["a"]);
    eventually("every object moved from the ghost to a", || {
        settled(&cluster, COUNT, &a)
    })
    .await;
    // Each object relabelled once: a move that met a 409 is not counted, and is not redone.
    let view = assigner
        .view_when("the view counts every object relabelled", |view| {
            view.relabelled >= COUNT as u64
        })
        .await;
    assert_eq!(view.relabelled, COUNT as u64, "{view:?}");
    assigner.stop().await;
    member.stop().await;
}

#[tokio::test]
async fn the_assigner_acts_only_while_it_leads() {
    const FIRST: usize = 40;
    const ALL: usize = 60;
    let cluster = TestCluster::start().await.unwrap();
    create_namespace(&cluster).await;
    create_configmaps(&cluster, 0, FIRST).await;
    let a = Running::start(&cluster, "a");
    let b = Running::start(&cluster, "b");
    a.wait_joined().await;
    b.wait_joined().await;
    let ab = names(&["a", "b"]);

    let first = Assigning::start(&cluster, "a", false);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        objects(&cluster).await.iter().all(|o| o.owner.is_none()),
        "nothing is assigned before it leads"
    );
    assert_eq!(first.view(), RingView::default());

    first.leader.send_replace(true);
    eventually("the leader labels every object", || {
        settled(&cluster, FIRST, &ab)
    })
    .await;
    assert!(first.view().leading);

    first.leader.send_replace(false);
    let mut view = first.view.clone();
    tokio::time::timeout(WAIT, view.wait_for(|v| !v.leading))
        .await
        .unwrap()
        .unwrap();
    create_configmaps(&cluster, FIRST, ALL).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let unlabelled = objects(&cluster)
        .await
        .into_iter()
        .filter(|o| o.owner.is_none())
        .count();
    assert_eq!(
        unlabelled,
        ALL - FIRST,
        "nothing is assigned after it stops leading"
    );

    // Failover: another replica's assigner leads now.
    let second = Assigning::start(&cluster, "b", true);
    eventually("the new leader labels the new objects", || {
        settled(&cluster, ALL, &ab)
    })
    .await;
    assert!(second.view().assigned >= (ALL - FIRST) as u64);
    assert!(!first.view().leading);

    // The elector of the second is gone: it stops, and stays stopped.
    let mut second = second;
    second.orphan();
    let mut view = second.view.clone();
    tokio::time::timeout(WAIT, view.wait_for(|v| !v.leading))
        .await
        .unwrap()
        .unwrap();
    create_configmaps(&cluster, ALL, ALL + 5).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unlabelled = objects(&cluster)
        .await
        .into_iter()
        .filter(|o| o.owner.is_none())
        .count();
    assert_eq!(unlabelled, 5, "nothing is assigned without an elector");
    assert!(!second.view().leading);

    first.stop().await;
    second.stop().await;
    a.stop().await;
    b.stop().await;
}

/// A process frozen past its renew deadline (here: its thread blocked, so that no timer and no task
/// of it runs) finds its tenure lapsed the moment it runs again, before the member has paused the
/// operator: the cycles that run first, on overdue timers and queued events, start nothing. The
/// member then pauses and joins again, but the tenure holds again only once the operator has
/// paused its workers since; a crash ends it at once.
#[tokio::test(flavor = "current_thread")]
async fn a_frozen_members_tenure_has_lapsed_when_it_thaws_before_its_pause_comes() {
    let cluster = TestCluster::start().await.unwrap();
    let a = Running::start(&cluster, "a");
    a.wait_joined().await;
    assert!(a.tenure.holds());

    // Frozen for longer than the renew deadline (1.2 s): nothing of this runtime runs meanwhile.
    std::thread::sleep(ms(1500));
    assert!(!a.tenure.holds(), "lapsed by the clock alone, on thawing");
    assert!(
        !a.switch.is_paused(),
        "the pause has not come yet: it needs the member's task to run"
    );

    // The member runs again: it pauses (its renew deadline passed), then joins again.
    let mut reasons = a.switch.subscribe();
    tokio::time::timeout(WAIT, reasons.wait_for(|r| r.contains_key(MEMBER_TOGGLE)))
        .await
        .expect("the member pauses once it runs")
        .unwrap();
    a.wait_joined().await;
    assert!(
        !a.tenure.holds() && a.tenure.needs_pause(),
        "joined again, but the workers still hold what came before"
    );
    a.quiesce();
    assert!(a.tenure.holds(), "held again once the operator has paused");

    let tenure = a.tenure.clone();
    a.crash().await;
    assert!(!tenure.holds(), "a crashed membership ends its tenure");
}

/// Tests that inject faults, which only the emulator can: the apiserver pass skips them
/// (`--skip emulator_only`).
mod emulator_only {
    use super::*;
    use kactor_emulator::Failure;

    #[tokio::test]
    async fn a_member_whose_renewals_fail_pauses_itself_before_its_lease_could_expire() {
        let cluster = TestCluster::start().await.unwrap();
        let a = Running::start(&cluster, "a");
        a.wait_joined().await;

        cluster.faults().fail(
            Failure::new(500)
                .verb("update")
                .resource("leases")
                .times(u32::MAX),
        );
        let mut reasons = a.switch.subscribe();
        tokio::time::timeout(WAIT, reasons.wait_for(|r| r.contains_key(MEMBER_TOGGLE)))
            .await
            .expect("a pauses in time")
            .unwrap();
        let paused_at = jiff::Timestamp::now();
        assert!(!*a.joined.borrow());
        assert!(!a.tenure.holds(), "the tenure ended with the membership");
        assert!(a.reason().contains("lost lease"), "{}", a.reason());

        let lease = leases(&cluster).get(&lease_name("a")).await.unwrap();
        assert_eq!(holder(&lease).as_deref(), Some("a"));
        let renewed = lease.spec.and_then(|s| s.renew_time).unwrap().0;
        assert!(
            paused_at < renewed + Duration::from_secs(2),
            "a paused ({paused_at}) before its lease could expire for the assigner ({renewed} + 2 s)"
        );

        // The API recovers: nobody took the lease over, so a takes it back and works again.
        cluster.faults().reset();
        a.wait_joined().await;
        assert_eq!(
            holder(&leases(&cluster).get(&lease_name("a")).await.unwrap()).as_deref(),
            Some("a")
        );
        a.stop().await;
    }
}
