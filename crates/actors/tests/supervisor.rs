//! The supervisor and its workers against the cluster.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kactor_actors::supervisor::{Count, ResourceSupervisor, Shutdown, SupervisorConfig};
use kactor_actors::system::ActorSystem;
use kactor_actors::tracker::Tracker;
use kactor_emulator::samples;
use kactor_reactor::handlers::{handler_fn, Ctx, EventHandler, ResourceHandlers};
use kactor_reactor::posting::EventPoster;
use kactor_reactor::resources::Selector;
use kactor_reactor::settings::Settings;
use kactor_testenv::TestCluster;
use kube::api::PostParams;
use tokio::sync::Semaphore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_workers_stop_but_every_objects_record_stays() {
    let cluster = TestCluster::start().await.unwrap();
    let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
    for i in 0..5 {
        widgets
            .create(
                &PostParams::default(),
                &serde_json::from_value(samples::widget(&format!("w{i}"), 1)).unwrap(),
            )
            .await
            .unwrap();
    }
    let resources = kactor_reactor::discovery::scan(&cluster.client())
        .await
        .unwrap();
    let resource = Selector::parse("widgets.example.com")
        .resolve(&resources)
        .unwrap()
        .clone();
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let handler = EventHandler {
        id: "count".into(),
        selector: Selector::from(&resource),
        filters: Default::default(),
        param: None,
        func: handler_fn(move |_: Ctx| {
            counter.fetch_add(1, Ordering::Relaxed);
            async { Ok(()) }
        }),
    };
    let mut settings = Settings::default();
    settings.queueing.idle_timeout = Duration::from_millis(100);
    let config = SupervisorConfig {
        resource: Arc::new(resource),
        namespace: Some("default".into()),
        client: cluster.client(),
        handlers: Arc::new(ResourceHandlers {
            event: vec![handler],
            changing: vec![],
            spawning: vec![],
        }),
        poster: EventPoster::disabled(),
        settings: Arc::new(settings),
        runtime: tokio::runtime::Handle::current(),
        limiter: Arc::new(Semaphore::new(8)),
        tracker: Arc::new(Tracker::default()),
        daemon_tracker: Arc::new(Tracker::default()),
        observer: Arc::new(kactor_reactor::observe::NoObserver),
        watches: kactor_reactor::observe::WatchBoard::new(),
        start_paused: false,
    };
    let actors = ActorSystem::start().unwrap();
    let supervisor = actors
        .start_actor(move || ResourceSupervisor::new(config))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while handled.load(Ordering::Relaxed) < 5 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let busy = supervisor.send(Count).await.unwrap();
    assert_eq!(busy.objects, 5);
    loop {
        let census = supervisor.send(Count).await.unwrap();
        if census.workers == 0 {
            assert_eq!(census.objects, 5, "records outlive their idle workers");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers idle out: {census:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    supervisor.send(Shutdown).await.unwrap();
    actors.stop();
}
