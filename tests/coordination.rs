//! Several operators against one cluster: peering and leader election decide which one works.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor::emulator::samples;
use kactor::peering::lease::LeaseSettings;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, PostParams};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(20);

/// The names of the objects an operator handled.
#[derive(Clone, Default)]
struct Handled(Arc<Mutex<Vec<String>>>);

impl Handled {
    fn names(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn has(&self, name: &str) -> bool {
        self.names().iter().any(|n| n == name)
    }

    async fn until(&self, name: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !self.has(name) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} was not handled; handled: {:?}",
                self.names()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<kactor::Result<()>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("stops in time")
            .expect("task")
            .expect("a clean stop");
    }
}

fn operator(cluster: &TestCluster, identity: &str, handled: &Handled) -> Operator {
    let handled = handled.clone();
    Operator::new()
        .client(cluster.client())
        .identity(identity)
        .on_event("widgets.example.com", "record", move |ctx: Ctx| {
            let handled = handled.clone();
            async move {
                handled.0.lock().unwrap().push(ctx.name().to_string());
                Ok(())
            }
        })
}

fn spawn(operator: Operator) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

async fn create(api: &Api<DynamicObject>, name: &str) {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(samples::widget(name, 1)).unwrap(),
    )
    .await
    .unwrap();
}

async fn with_peering() -> (TestCluster, Api<DynamicObject>) {
    let cluster = TestCluster::start().await.unwrap();
    let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
    let crds: Api<DynamicObject> = Api::all_with(cluster.client(), &samples::crd_api_resource());
    for crd in kactor::peering::peering::crds() {
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap();
    }
    let peerings: Api<DynamicObject> = Api::all_with(
        cluster.client(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("kopf.dev", "v1", "ClusterKopfPeering"),
            "clusterkopfpeerings",
        ),
    );
    samples::until_served(&peerings).await.unwrap();
    let object = kactor::peering::peering::peering_object("default", None);
    peerings
        .create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap();
    (cluster, widgets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_priority_operator_pauses_while_a_higher_one_runs_and_takes_over_when_it_leaves() {
    let (cluster, widgets) = with_peering().await;
    create(&widgets, "first").await;
    let (high, low) = (Handled::default(), Handled::default());
    let high_running = spawn(
        operator(&cluster, "high", &high)
            .peering("default")
            .priority(100),
    );
    high.until("first").await;
    let low_running = spawn(
        operator(&cluster, "low", &low)
            .peering("default")
            .priority(0),
    );
    create(&widgets, "second").await;
    high.until("second").await;
    // The low operator started paused (mandatory peering) and sees the live higher priority.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        low.names().is_empty(),
        "the lower priority works while the higher one runs: {:?}",
        low.names()
    );

    high_running.stop().await;
    low.until("second").await;
    create(&widgets, "third").await;
    low.until("third").await;
    low_running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_operator_ignores_its_peers() {
    let (cluster, widgets) = with_peering().await;
    create(&widgets, "object").await;
    let (high, alone) = (Handled::default(), Handled::default());
    let high_running = spawn(
        operator(&cluster, "high", &high)
            .peering("default")
            .priority(100),
    );
    high.until("object").await;
    let alone_running = spawn(operator(&cluster, "alone", &alone).standalone());
    alone.until("object").await;
    alone_running.stop().await;
    high_running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_works_and_a_standby_takes_over_when_it_exits() {
    let cluster = TestCluster::start().await.unwrap();
    let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
    create(&widgets, "first").await;
    let lease = |identity: &str| {
        LeaseSettings::new("widget-operator", "default", identity)
            // Long enough that a slow machine's late renewal does not hand the lease over: the
            // takeover below is by a graceful release, not by expiry.
            .with_timings(
                Duration::from_secs(5),
                Duration::from_secs(3),
                Duration::from_millis(200),
            )
            .unwrap()
    };
    let (a, b) = (Handled::default(), Handled::default());
    let a_running = spawn(
        operator(&cluster, "a", &a)
            .standalone()
            .leader_election(lease("a")),
    );
    a.until("first").await;
    let b_running = spawn(
        operator(&cluster, "b", &b)
            .standalone()
            .leader_election(lease("b")),
    );
    create(&widgets, "second").await;
    a.until("second").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        b.names().is_empty(),
        "the standby works while another holds the lease: {:?}",
        b.names()
    );

    // A graceful exit releases the lease: the standby takes over and catches up.
    a_running.stop().await;
    b.until("second").await;
    create(&widgets, "third").await;
    b.until("third").await;
    b_running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_operator_pauses_when_a_higher_priority_arrives() {
    let (cluster, widgets) = with_peering().await;
    create(&widgets, "first").await;
    let (deployed, developer) = (Handled::default(), Handled::default());
    let deployed_operator = operator(&cluster, "deployed", &deployed)
        .peering("default")
        .priority(0);
    let deployed_switch = deployed_operator.pause_switch();
    let deployed_running = spawn(deployed_operator);
    deployed.until("first").await;
    // A developer's operator with --dev (priority 666) arrives: the deployed one pauses.
    let developer_running = spawn(
        operator(&cluster, "developer", &developer)
            .peering("default")
            .priority(666),
    );
    developer.until("first").await;
    // Waited for: the deployed operator has seen the developer's record and paused.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !deployed_switch.is_paused() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the outranked operator never paused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    create(&widgets, "second").await;
    developer.until("second").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !deployed.has("second"),
        "the outranked operator still works: {:?}",
        deployed.names()
    );
    developer_running.stop().await;
    deployed.until("second").await;
    deployed_running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_mandatory_peering_keeps_the_operator_paused() {
    let (cluster, widgets) = with_peering().await;
    create(&widgets, "object").await;
    let handled = Handled::default();
    let running = spawn(operator(&cluster, "waiting", &handled).peering("nonexistent"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(handled.names().is_empty(), "{:?}", handled.names());
    let peerings: Api<DynamicObject> = Api::all_with(
        cluster.client(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("kopf.dev", "v1", "ClusterKopfPeering"),
            "clusterkopfpeerings",
        ),
    );
    peerings
        .create(
            &PostParams::default(),
            &serde_json::from_value(kactor::peering::peering::peering_object(
                "nonexistent",
                None,
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    handled.until("object").await;
    running.stop().await;
}
