//! One object's worker alone, driven by hand as its supervisor drives it, against the cluster: the
//! deliveries a supervisor can send in an order the watch rarely gives.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use kactor_actors::system::ActorSystem;
use kactor_actors::tracker::Tracker;
use kactor_actors::worker::{Deliver, Idle, Interrupted, ObjectWorker, Returned, WorkerShared};
use kactor_emulator::samples;
use kactor_reactor::handlers::{Ctx, Memo, ResourceHandlers};
use kactor_reactor::names::EventType;
use kactor_reactor::posting::EventPoster;
use kactor_reactor::processing::{ObjectMemory, Processor};
use kactor_reactor::reconcile::{reconcile_fn, Action, Reconcile, ReconcileHandler};
use kactor_reactor::resources::{Resource, Selector};
use kactor_reactor::settings::Settings;
use kactor_reactor::triggers::{Related, Trigger, Triggers};
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Semaphore;

/// What the worker told its supervisor.
#[derive(Default)]
struct Told {
    idle: Vec<u64>,
    returned: usize,
    interrupted: usize,
}

/// Stands in for the supervisor: records what the worker tells it.
struct Supervisor(Arc<Mutex<Told>>);

impl Actor for Supervisor {
    type Context = Context<Self>;
}

impl Handler<Idle> for Supervisor {
    type Result = ();
    fn handle(&mut self, idle: Idle, _: &mut Context<Self>) {
        self.0.lock().unwrap().idle.push(idle.seq);
    }
}

impl Handler<Returned> for Supervisor {
    type Result = ();
    fn handle(&mut self, _: Returned, _: &mut Context<Self>) {
        self.0.lock().unwrap().returned += 1;
    }
}

impl Handler<Interrupted> for Supervisor {
    type Result = ();
    fn handle(&mut self, _: Interrupted, _: &mut Context<Self>) {
        self.0.lock().unwrap().interrupted += 1;
    }
}

/// A worker of widget `w1` with one reconcile handler that records the triggers of each run, and
/// two versions of the object: the one our own later write superseded, and the later one.
struct Harness {
    _cluster: TestCluster,
    actors: ActorSystem,
    worker: Addr<ObjectWorker>,
    told: Arc<Mutex<Told>>,
    runs: Arc<Mutex<Vec<Triggers>>>,
    superseded: Arc<DynamicObject>,
    later: Arc<DynamicObject>,
}

impl Harness {
    async fn start() -> Harness {
        let cluster = TestCluster::start().await.unwrap();
        let client = cluster.client();
        let widgets: Api<DynamicObject> = samples::install_widgets(&client).await.unwrap();
        let body = serde_json::from_value(samples::widget("w1", 1)).unwrap();
        let superseded = widgets.create(&PostParams::default(), &body).await.unwrap();
        let later = widgets
            .patch(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": 2}})),
            )
            .await
            .unwrap();
        let resources = kactor_reactor::discovery::scan(&client).await.unwrap();
        let resource = Selector::parse("widgets.example.com")
            .resolve(&resources)
            .unwrap()
            .clone();
        let runs: Arc<Mutex<Vec<Triggers>>> = Arc::default();
        let seen = runs.clone();
        let handlers = ResourceHandlers {
            reconcile: vec![ReconcileHandler {
                selector: Selector::from(&resource),
                options: Reconcile::id("reconcile").owns("deployments.v1.apps"),
                func: reconcile_fn(move |ctx: Ctx| {
                    seen.lock().unwrap().push(ctx.triggers().clone());
                    async { Ok(Action::await_change()) }
                }),
            }],
            ..ResourceHandlers::default()
        };
        let mut settings = Settings::default();
        settings.queueing.idle_timeout = Duration::from_millis(50);
        let settings = Arc::new(settings);
        let processor = Processor::new(
            Arc::new(resource),
            Arc::new(handlers),
            settings.clone(),
            Arc::new(client),
            EventPoster::disabled(),
            Arc::new(Semaphore::new(8)),
        );
        let actors = ActorSystem::start(Default::default(), 1).unwrap();
        let told: Arc<Mutex<Told>> = Arc::default();
        let record = told.clone();
        let supervisor = actors
            .start_actor(move || Supervisor(record))
            .await
            .unwrap();
        let shared = Arc::new(WorkerShared {
            processor: Arc::new(processor),
            runtime: tokio::runtime::Handle::current(),
            in_place: true,
            tracker: Arc::new(Tracker::default()),
            idle_timeout: settings.queueing.idle_timeout,
            consistency_timeout: settings.persistence.consistency_timeout,
            error_delays: settings.queueing.error_delays.clone().into(),
            supervisor: supervisor.clone().recipient(),
            returns: supervisor.clone().recipient(),
            interruptions: supervisor.recipient(),
            daemons: None,
        });
        // The memory a stopped worker gave back: our own later write superseded the first version.
        let memory = ObjectMemory {
            superseded: vec![superseded.metadata.resource_version.clone().unwrap()],
            ..ObjectMemory::default()
        };
        let key: Arc<str> = Arc::from(superseded.metadata.uid.as_deref().unwrap());
        // On an object thread, as the supervisor starts it: its cycles run there.
        let threads = actors.object_threads();
        let worker =
            ObjectWorker::start_in_arbiter(&threads.iter().next().unwrap().arbiter, move |_| {
                ObjectWorker::new(key, 1, Memo::default(), memory, shared)
            });
        Harness {
            _cluster: cluster,
            actors,
            worker,
            told,
            runs,
            superseded: Arc::new(superseded),
            later: Arc::new(later),
        }
    }

    /// The names of the related objects each run saw.
    fn runs(&self) -> Vec<Vec<String>> {
        let runs = self.runs.lock().unwrap();
        runs.iter()
            .map(|t| t.related.iter().map(|r| r.name.clone()).collect())
            .collect()
    }

    async fn until_runs(&self, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.runs.lock().unwrap().len() < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{count} runs, saw {:?}",
                self.runs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn stop(self) {
        self.actors.stop();
    }
}

/// A child of the widget (a Deployment) changed: the trigger its supervisor routes.
fn child_changed(name: &str) -> Trigger {
    let deployments = Resource::namespaced("apps", "v1", "Deployment", "deployments");
    Trigger::Related(Related {
        resource: Arc::new(deployments),
        namespace: Some("default".into()),
        name: name.into(),
        event: EventType::Modified,
        owned: true,
        version: Some("1".into()),
    })
}

/// A new worker's only body is a version our own later write superseded (the supervisor routed a
/// child's change with the body it had): the reconcile does not run on it, and the child's change
/// is not lost: it runs with the next event, the later version's. Meanwhile the worker does not
/// idle out (the triggers would go with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_on_a_superseded_version_waits_for_the_next_event() {
    let harness = Harness::start().await;
    let trigger = child_changed("child-1");
    harness
        .worker
        .do_send(Deliver::trigger(trigger, harness.superseded.clone(), 1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        harness.runs(),
        Vec::<Vec<String>>::new(),
        "not on the superseded version"
    );
    assert_eq!(
        harness.told.lock().unwrap().idle,
        Vec::<u64>::new(),
        "held, not idle"
    );
    harness.worker.do_send(Deliver::event(
        EventType::Modified,
        harness.later.clone(),
        2,
        tokio::time::Instant::now(),
    ));
    harness.until_runs(1).await;
    assert_eq!(harness.runs(), vec![vec!["child-1".to_string()]]);
    // Nothing holds it now: it idles out after the event it took.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !harness.told.lock().unwrap().idle.contains(&2) {
        assert!(tokio::time::Instant::now() < deadline, "the worker idles");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(harness.runs().len(), 1, "{:?}", harness.runs());
    harness.stop();
}

/// While the worker's memory was on its way back, the supervisor coalesced a child's change into
/// the superseded version's event: the event is skipped, its triggers are not. They run with the
/// next event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_coalesced_into_a_skipped_event_run_with_the_next() {
    let harness = Harness::start().await;
    let trigger = Deliver::trigger(child_changed("child-1"), harness.superseded.clone(), 1);
    let event = Deliver::event(
        EventType::Modified,
        harness.superseded.clone(),
        2,
        tokio::time::Instant::now(),
    );
    harness.worker.do_send(event.coalesce(trigger));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        harness.runs(),
        Vec::<Vec<String>>::new(),
        "the event is skipped"
    );
    let mut next = Deliver::trigger(child_changed("child-2"), harness.later.clone(), 3);
    next = Deliver::event(
        EventType::Modified,
        harness.later.clone(),
        4,
        tokio::time::Instant::now(),
    )
    .coalesce(next);
    harness.worker.do_send(next);
    harness.until_runs(1).await;
    assert_eq!(
        harness.runs(),
        vec![vec!["child-1".to_string(), "child-2".to_string()]],
        "both children, oldest first"
    );
    harness.stop();
}

/// Held triggers join the next delivery that runs a cycle, whatever it is: here another child's
/// change, routed with the later version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_triggers_join_the_next_trigger_that_runs() {
    let harness = Harness::start().await;
    let first = Deliver::trigger(child_changed("child-1"), harness.superseded.clone(), 1);
    harness.worker.do_send(first);
    let second = Deliver::trigger(child_changed("child-2"), harness.later.clone(), 2);
    harness.worker.do_send(second);
    harness.until_runs(1).await;
    assert_eq!(
        harness.runs(),
        vec![vec!["child-1".to_string(), "child-2".to_string()]]
    );
    harness.stop();
}
