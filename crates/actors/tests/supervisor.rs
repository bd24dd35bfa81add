//! The supervisor and its workers against the cluster.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use kactor_actors::supervisor::{
    Count, Pause, Poke, ResourceSupervisor, Resume, Shutdown, SupervisorConfig,
};
use kactor_actors::system::ActorSystem;
use kactor_actors::tracker::Tracker;
use kactor_emulator::samples;
use kactor_reactor::handlers::{
    handler_fn, Ctx, EventHandler, HandlerError, HandlerFn, ResourceHandlers,
};
use kactor_reactor::posting::EventPoster;
use kactor_reactor::reconcile::{reconcile_fn, Action, Reconcile, ReconcileHandler};
use kactor_reactor::resources::{Resource, Selector};
use kactor_reactor::settings::Settings;
use kactor_reactor::triggers::Related;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Semaphore;

/// A cluster with widgets, and a supervisor of them in `default` with one `on_event` handler.
struct Supervised {
    _cluster: TestCluster,
    widgets: Api<DynamicObject>,
    resource: Arc<Resource>,
    actors: ActorSystem,
    supervisor: Addr<ResourceSupervisor>,
    /// The threads the watch stream ran on.
    watched_on: Arc<WatchThreads>,
}

/// Names the threads a watch stream received its objects on (the observer's `events_received`
/// is told from the stream's task).
#[derive(Default)]
struct WatchThreads(Mutex<std::collections::BTreeSet<String>>);

impl kactor_reactor::observe::Observer for WatchThreads {
    fn events_received(&self, _resource: &str, _count: usize) {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed").to_string();
        self.0.lock().unwrap().insert(name);
    }
}

impl Supervised {
    async fn start(widgets: &[&str], func: HandlerFn, idle_timeout: Duration) -> Supervised {
        Supervised::start_with(widgets, func, |settings| {
            settings.queueing.idle_timeout = idle_timeout;
        })
        .await
    }

    async fn start_with(
        widgets: &[&str],
        func: HandlerFn,
        configure: impl FnOnce(&mut Settings),
    ) -> Supervised {
        let handlers = |selector| ResourceHandlers {
            event: vec![EventHandler {
                id: "count".into(),
                selector,
                filters: Default::default(),
                param: None,
                func,
            }],
            ..ResourceHandlers::default()
        };
        Supervised::start_handling(widgets, handlers, configure).await
    }

    /// The widgets, supervised with one reconcile handler, `func`, and workers that do not idle
    /// out within a test.
    async fn reconciling(widgets: &[&str], func: HandlerFn) -> Supervised {
        Supervised::reconciling_with(widgets, |_| Reconcile::id("reconcile"), func).await
    }

    /// As [`Supervised::reconciling`], with the handler's options that `options` makes for the
    /// widgets' selector.
    async fn reconciling_with(
        widgets: &[&str],
        options: impl FnOnce(&Selector) -> Reconcile,
        func: HandlerFn,
    ) -> Supervised {
        let handlers = |selector: Selector| ResourceHandlers {
            reconcile: vec![ReconcileHandler {
                options: options(&selector),
                selector,
                func,
            }],
            ..ResourceHandlers::default()
        };
        Supervised::start_handling(widgets, handlers, |settings| {
            settings.queueing.idle_timeout = Duration::from_secs(600);
        })
        .await
    }

    /// Tells the supervisor that a child of `owner` (the widget w1), a widget itself, was deleted:
    /// what a related kind's stream routes to the owner's reconcile handlers.
    fn child_of_w1_deleted(&self, owner: &DynamicObject) {
        self.supervisor.do_send(Poke {
            uid: owner.metadata.uid.clone(),
            namespace: Some("default".into()),
            name: "w1".into(),
            related: Related {
                resource: self.resource.clone(),
                namespace: Some("default".into()),
                name: "w1-child".into(),
                event: kactor_reactor::names::EventType::Deleted,
                owned: true,
                version: None,
            },
        });
    }

    /// The widgets, supervised with the handlers `handlers` makes for their selector.
    async fn start_handling(
        widgets: &[&str],
        handlers: impl FnOnce(Selector) -> ResourceHandlers,
        configure: impl FnOnce(&mut Settings),
    ) -> Supervised {
        let cluster = TestCluster::start().await.unwrap();
        let api = samples::install_widgets(&cluster.client()).await.unwrap();
        for name in widgets {
            let body = serde_json::from_value(samples::widget(name, 1)).unwrap();
            api.create(&PostParams::default(), &body).await.unwrap();
        }
        let resources = kactor_reactor::discovery::scan(&cluster.client())
            .await
            .unwrap();
        let resource = Selector::parse("widgets.example.com")
            .resolve(&resources)
            .unwrap()
            .clone();
        let resource = Arc::new(resource);
        let handlers = handlers(Selector::from(&*resource));
        let mut settings = Settings::default();
        configure(&mut settings);
        let actors = ActorSystem::start(
            settings.execution.actors_scheduling,
            settings.execution.object_threads,
        )
        .unwrap();
        let watched_on = Arc::new(WatchThreads::default());
        let config = SupervisorConfig {
            resource: resource.clone(),
            namespace: Some("default".into()),
            client: cluster.client(),
            handlers: Arc::new(handlers),
            poster: EventPoster::disabled(),
            settings: Arc::new(settings),
            runtime: tokio::runtime::Handle::current(),
            object_threads: actors.object_threads(),
            limiter: Arc::new(Semaphore::new(8)),
            tracker: Arc::new(Tracker::default()),
            daemon_tracker: Arc::new(Tracker::default()),
            observer: watched_on.clone(),
            watches: kactor_reactor::observe::WatchBoard::new(),
            start_paused: false,
            actors: Vec::new(),
            // As the operator gives them: a resource with reconcile handlers keeps its store.
            caches: Some(kactor_reactor::cache::Caches::default()),
            indexes: None,
        };
        let supervisor = actors
            .start_actor(move || ResourceSupervisor::new(config))
            .await
            .unwrap();
        Supervised {
            _cluster: cluster,
            widgets: api,
            resource,
            actors,
            supervisor,
            watched_on,
        }
    }

    /// Changes each of these widgets (its size to 3): an event each, while watched.
    async fn resize(&self, names: &[&str]) {
        let patch = json!({"spec": {"size": 3}});
        for name in names {
            self.widgets
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }

    async fn stop(self) {
        self.supervisor.send(Shutdown).await.unwrap();
        self.actors.stop();
    }
}

/// Waits (up to 10 s) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An event handler that counts its runs, and the count.
fn counting() -> (Arc<AtomicUsize>, HandlerFn) {
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let func = handler_fn(move |_: Ctx| {
        counter.fetch_add(1, Ordering::Relaxed);
        async { Ok(()) }
    });
    (handled, func)
}

/// Waits (up to 10 s) until no worker runs, then checks that the `objects` records stayed.
async fn until_no_workers(supervisor: &Addr<ResourceSupervisor>, objects: usize, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let census = supervisor.send(Count).await.unwrap();
        if census.workers == 0 {
            assert_eq!(census.objects, objects, "the records stay");
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {census:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_workers_stop_but_every_objects_record_stays() {
    let (handled, func) = counting();
    let names = ["w0", "w1", "w2", "w3", "w4"];
    let supervised = Supervised::start(&names, func, Duration::from_millis(100)).await;
    until("five listed objects handled", || {
        handled.load(Ordering::Relaxed) >= 5
    })
    .await;
    // Changed while watched: these workers wait out the idle timeout (listed objects that need
    // nothing do not wait at all).
    supervised.resize(&names).await;
    until("five changes handled", || {
        handled.load(Ordering::Relaxed) >= 10
    })
    .await;
    let busy = supervised.supervisor.send(Count).await.unwrap();
    assert_eq!(busy.objects, 5);
    until_no_workers(&supervised.supervisor, 5, "workers idle out").await;
    supervised.stop().await;
}

/// Each object's worker runs on one object thread, its handlers too, every cycle on the same one;
/// the objects are spread over the threads in turn. With no object threads, the handlers run on
/// the operator's runtime. The watch stream (its reading and decoding) runs on one object thread,
/// or on the operator's runtime when there are none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_objects_cycles_and_the_watch_stream_run_on_object_threads() {
    type Seen = Arc<Mutex<Vec<(String, std::thread::ThreadId, Option<String>)>>>;
    let names = ["w0", "w1", "w2", "w3"];
    for object_threads in [2, 0] {
        let seen: Seen = Arc::default();
        let record = seen.clone();
        let func = handler_fn(move |ctx: Ctx| {
            let thread = std::thread::current();
            let name = ctx.name().to_string();
            record
                .lock()
                .unwrap()
                .push((name, thread.id(), thread.name().map(str::to_string)));
            async { Ok(()) }
        });
        let supervised = Supervised::start_with(&names, func, |settings| {
            settings.execution.object_threads = object_threads;
            settings.queueing.idle_timeout = Duration::from_secs(600);
        })
        .await;
        until("four listed objects handled", || {
            seen.lock().unwrap().len() >= 4
        })
        .await;
        supervised.resize(&names).await;
        until("four changes handled", || seen.lock().unwrap().len() >= 8).await;
        let seen = seen.lock().unwrap().clone();
        // actix names its arbiters' threads `actix-rt|system:N|arbiter:M`.
        let on_object_threads = seen
            .iter()
            .filter(|(_, _, name)| name.as_deref().is_some_and(|n| n.contains("arbiter")))
            .count();
        let mut threads = std::collections::BTreeMap::new();
        for (name, thread, _) in &seen {
            threads
                .entry(name.clone())
                .or_insert_with(std::collections::HashSet::new)
                .insert(*thread);
        }
        let watched_on = supervised.watched_on.clone();
        supervised.stop().await;
        if object_threads == 0 {
            assert_eq!(on_object_threads, 0, "{seen:?}");
            let watched_on = watched_on.0.lock().unwrap().clone();
            assert!(
                watched_on.iter().all(|name| !name.contains("arbiter")),
                "on the operator's runtime: {watched_on:?}"
            );
            continue;
        }
        assert_eq!(on_object_threads, seen.len(), "{seen:?}");
        for (name, on) in &threads {
            assert_eq!(on.len(), 1, "{name}'s cycles ran on one thread: {seen:?}");
        }
        let used: std::collections::HashSet<_> = threads.values().flatten().collect();
        assert_eq!(used.len(), 2, "two objects on each thread: {seen:?}");
        let watched_on = watched_on.0.lock().unwrap().clone();
        assert_eq!(watched_on.len(), 1, "one thread: {watched_on:?}");
        assert!(
            watched_on.iter().all(|name| name.contains("arbiter")),
            "on an object thread: {watched_on:?}"
        );
    }
}

/// A worker waiting to idle out holds no body when nothing can read it any more (no daemons,
/// timers or reconcile handlers): every object handled within the idle timeout has such a worker,
/// and the bodies were most of their memory. The next event brings the next body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_worker_lets_go_of_the_body_and_handles_the_next_event() {
    let seen: Arc<Mutex<Vec<std::sync::Weak<DynamicObject>>>> = Arc::default();
    let bodies = seen.clone();
    let func = handler_fn(move |ctx: Ctx| {
        bodies.lock().unwrap().push(Arc::downgrade(&ctx.body));
        async { Ok(()) }
    });
    let names = ["w0", "w1", "w2"];
    // The workers wait far longer than the test.
    let supervised = Supervised::start(&names, func, Duration::from_secs(600)).await;
    until("three listed objects handled", || {
        seen.lock().unwrap().len() >= 3
    })
    .await;
    // Changed while watched: their workers wait out the idle timeout (listed objects that need
    // nothing do not: the next test).
    let change = |size: u32| json!({"spec": {"size": size}});
    for name in names {
        supervised
            .widgets
            .patch(name, &PatchParams::default(), &Patch::Merge(&change(5)))
            .await
            .unwrap();
    }
    until("three changes handled", || seen.lock().unwrap().len() >= 6).await;
    until("the waiting workers let go of the bodies", || {
        seen.lock().unwrap().iter().all(|b| b.upgrade().is_none())
    })
    .await;
    let census = supervised.supervisor.send(Count).await.unwrap();
    assert_eq!(census.workers, 3, "the workers still wait: {census:?}");

    // The next change of one object is handled on its own new body.
    supervised
        .widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(&change(7)))
        .await
        .unwrap();
    until("the change handled", || seen.lock().unwrap().len() >= 7).await;
    until("its body let go of too", || {
        seen.lock().unwrap()[6].upgrade().is_none()
    })
    .await;
    supervised.stop().await;
}

/// After a restart most listed objects need nothing: their workers stop at once instead of
/// waiting out the idle timeout (until then, a restart over 100,000 objects had 100,000 workers).
/// The records stay, and the next event of an object starts a worker again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_objects_that_need_nothing_do_not_keep_a_worker_waiting() {
    let (handled, func) = counting();
    let names = ["w0", "w1", "w2", "w3", "w4"];
    // An event handler writes nothing: every listed object's cycle ends with nothing sent.
    let supervised = Supervised::start(&names, func, Duration::from_secs(600)).await;
    until("five listed objects handled", || {
        handled.load(Ordering::Relaxed) >= 5
    })
    .await;
    until_no_workers(
        &supervised.supervisor,
        5,
        "the workers stop long before the idle timeout",
    )
    .await;

    // A change after the listing: handled by a new worker, which waits as usual.
    let patch = json!({"spec": {"size": 7}});
    supervised
        .widgets
        .patch("w3", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    until("the change handled", || {
        handled.load(Ordering::Relaxed) >= 6
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let census = supervised.supervisor.send(Count).await.unwrap();
    assert_eq!(
        census.workers, 1,
        "a watched event's worker waits: {census:?}"
    );
    supervised.stop().await;
}

/// Reconcile handlers keep their listed objects' workers waiting even when the first run wrote
/// nothing to the object: the events of the children it made or changed follow, and go to the
/// waiting worker (starting a worker per parent again cost the owned benchmark a third more
/// CPU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciled_listed_objects_keep_their_workers_waiting() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let func = reconcile_fn(move |_: Ctx| {
        counter.fetch_add(1, Ordering::Relaxed);
        async { Ok(Action::await_change()) }
    });
    let supervised = Supervised::reconciling(&["w0", "w1", "w2"], func).await;
    until("three listed objects reconciled", || {
        runs.load(Ordering::Relaxed) >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let census = supervised.supervisor.send(Count).await.unwrap();
    assert_eq!(census.workers, 3, "the workers wait: {census:?}");
    supervised.stop().await;
}

/// The memory race, pinned: a paused worker drops an event that came while its cycle ran, and the
/// listing after the resume comes while that cycle still runs (the worker has the object's
/// memory). The object's version did not change since the event was routed, so only the worker's
/// report that it dropped work ([`Interrupted`](kactor_actors::worker::Interrupted)) gets the
/// object dispatched again: the handler sees the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_while_a_cycle_runs_dispatches_what_the_paused_worker_dropped() {
    let gate = Arc::new(Semaphore::new(0));
    let seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let (held, log) = (gate.clone(), seen.clone());
    let func = handler_fn(move |ctx: Ctx| {
        let (gate, log) = (held.clone(), log.clone());
        async move {
            let size = ctx.spec()["size"].as_i64().unwrap_or_default();
            log.lock().unwrap().push(size);
            if size == 1 {
                // The first cycle runs until the test lets it go.
                let _ = gate.acquire().await;
            }
            Ok(())
        }
    });
    let supervised = Supervised::start(&["w1"], func, Duration::from_secs(60)).await;
    until("the first cycle runs", || seen.lock().unwrap().len() == 1).await;

    // An event comes while the cycle runs (routed: the supervisor knows its version), then the
    // pause drops it in the worker.
    let patch = json!({"spec": {"size": 2}});
    supervised
        .widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    supervised.supervisor.send(Pause).await.unwrap();
    // The relist after the resume, while the first cycle still runs.
    supervised.supervisor.send(Resume).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*seen.lock().unwrap(), [1], "the first cycle still runs");

    gate.add_permits(1);
    until("the dropped change is handled", || {
        seen.lock().unwrap().last() == Some(&2)
    })
    .await;
    supervised.stop().await;
}

/// The same at scale: every worker has an event pending behind its running cycle when the pause
/// comes, and the resume follows at once. The workers take the pause one by one on the actors'
/// thread while the listing after the resume is fetched; no page of it may be routed before every
/// worker has told what it dropped, else the objects whose pause came after the page looked
/// unchanged and their changes were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_right_after_a_pause_dispatches_what_every_paused_worker_dropped() {
    const WIDGETS: usize = 1000;
    let gate = Arc::new(Semaphore::new(0));
    let seen: Arc<Mutex<std::collections::HashMap<String, i64>>> = Arc::default();
    let (held, log) = (gate.clone(), seen.clone());
    let func = handler_fn(move |ctx: Ctx| {
        let (gate, log) = (held.clone(), log.clone());
        async move {
            let size = ctx.spec()["size"].as_i64().unwrap_or_default();
            log.lock().unwrap().insert(ctx.name().to_string(), size);
            if size == 1 {
                // Every first cycle runs (or waits for its turn) until the test lets it go.
                let _ = gate.acquire().await.map(|permit| permit.forget());
            }
            Ok(())
        }
    });
    let names: Vec<String> = (0..WIDGETS).map(|i| format!("w{i:04}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let supervised = Supervised::start(&names, func, Duration::from_secs(60)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while supervised.supervisor.send(Count).await.unwrap().workers < WIDGETS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a worker per widget"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A change of every widget while its first cycle runs, routed to its worker (held there).
    let patch = json!({"spec": {"size": 2}});
    for name in &names {
        supervised
            .widgets
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    supervised.supervisor.do_send(Pause);
    supervised.supervisor.do_send(Resume);
    tokio::time::sleep(Duration::from_millis(500)).await;

    gate.add_permits(WIDGETS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let missed: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, size)| **size != 2)
            .map(|(name, _)| name.clone())
            .collect();
        let handled = seen.lock().unwrap().len();
        if missed.is_empty() && handled == WIDGETS {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "every dropped change is handled; {} of {WIDGETS} not: {:?}",
            missed.len() + WIDGETS - handled,
            &missed[..missed.len().min(10)]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    supervised.stop().await;
}

/// A reconcile handler that runs through a pause and a resume and fails: the listing after the
/// resume passed the object (unchanged, and nothing dropped yet), and the retry the failure
/// scheduled comes due while the worker still waits for its first event after the pause. The
/// worker tells the supervisor of it instead of arming it, and the supervisor dispatches the object
/// again: the handler is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_failing_through_a_pause_and_a_resume_is_retried() {
    let gate = Arc::new(Semaphore::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let (held, counter) = (gate.clone(), runs.clone());
    let func = reconcile_fn(move |_: Ctx| {
        let (gate, counter) = (held.clone(), counter.clone());
        async move {
            if counter.fetch_add(1, Ordering::Relaxed) == 0 {
                let _ = gate.acquire().await;
                return Err(HandlerError::msg("failed while the operator paused"));
            }
            Ok(Action::await_change())
        }
    });
    let supervised = Supervised::reconciling(&["w1"], func).await;
    until("the first run", || runs.load(Ordering::Relaxed) == 1).await;
    supervised.supervisor.send(Pause).await.unwrap();
    supervised.supervisor.send(Resume).await.unwrap();
    // The listing after the resume finds the object as it was routed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs.load(Ordering::Relaxed), 1, "the first run still runs");

    gate.add_permits(1);
    until("the failed run is retried", || {
        runs.load(Ordering::Relaxed) >= 2
    })
    .await;
    supervised.stop().await;
}

/// A worker that dropped nothing in a pause waits, paused, for its first event after the resume:
/// the listing passed its object (unchanged). A child's change routed to it after the resume (the
/// supervisor sends only while resumed) is that event: its reconcile handler runs at once, not
/// when the object itself changes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_change_after_a_pause_and_a_resume_reconciles_its_owner() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let func = reconcile_fn(move |_: Ctx| {
        counter.fetch_add(1, Ordering::Relaxed);
        async { Ok(Action::await_change()) }
    });
    // It owns widgets too, so that a widget can stand for its child.
    let owning_widgets = |widgets: &Selector| Reconcile::id("reconcile").owns(widgets.clone());
    let supervised = Supervised::reconciling_with(&["w1"], owning_widgets, func).await;
    until("the first run", || runs.load(Ordering::Relaxed) == 1).await;
    supervised.supervisor.send(Pause).await.unwrap();
    supervised.supervisor.send(Resume).await.unwrap();
    // The listing after the resume finds the object as it was routed: no run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs.load(Ordering::Relaxed), 1, "nothing changed");

    let owner = supervised.widgets.get("w1").await.unwrap();
    supervised.child_of_w1_deleted(&owner);
    until("the child's change reconciles its owner", || {
        runs.load(Ordering::Relaxed) >= 2
    })
    .await;
    supervised.stop().await;
}

/// Tests that inject faults, which only the emulator can.
mod emulator_only {
    use super::*;
    use kactor_emulator::Failure;

    /// A child's change routed after a resume but before the listing after it brought its owner
    /// (here: the listing fails for a while) waits for that listing, as during the pause: the
    /// reconcile handler runs on the owner as it is now, never on the body from before the pause
    /// (which, for a sharded replica, may be an object that moved away meanwhile).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trigger_after_a_resume_waits_for_the_listing_to_bring_its_object() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let func = reconcile_fn(move |ctx: Ctx| {
            seen.lock().unwrap().push(ctx.spec()["size"].clone());
            async { Ok(Action::await_change()) }
        });
        let owning_widgets = |widgets: &Selector| Reconcile::id("reconcile").owns(widgets.clone());
        let supervised = Supervised::reconciling_with(&["w1"], owning_widgets, func).await;
        until("the first run", || sizes.lock().unwrap().len() == 1).await;

        supervised.supervisor.send(Pause).await.unwrap();
        let patch = json!({"spec": {"size": 2}});
        let owner = supervised
            .widgets
            .patch("w1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        supervised._cluster.faults().fail(
            Failure::new(500)
                .verb("list")
                .resource("widgets")
                .times(u32::MAX),
        );
        supervised.supervisor.send(Resume).await.unwrap();
        supervised.child_of_w1_deleted(&owner);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            *sizes.lock().unwrap(),
            [json!(1)],
            "no run on the body from before the pause"
        );

        supervised._cluster.faults().reset();
        until("the listing brings it, with the trigger", || {
            sizes.lock().unwrap().len() >= 2
        })
        .await;
        let sizes = sizes.lock().unwrap().clone();
        assert!(sizes[1..].iter().all(|size| *size == json!(2)), "{sizes:?}");
        supervised.stop().await;
    }
}

/// Waits (up to 10 s) until the supervisor knows `objects` objects.
async fn census_reaches(supervised: &Supervised, objects: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let census = supervised.supervisor.send(Count).await.unwrap();
        if census.objects >= objects {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{objects} objects routed: {census:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Twelve widgets listed two per page, a window of four places, and a handler that blocks until the
/// test lets it go: the first cycles of four objects hold the window, and the listing waits.
async fn listing_behind_blocked_handlers(
    patience: Duration,
) -> (Supervised, Arc<Semaphore>, Arc<AtomicUsize>) {
    let gate = Arc::new(Semaphore::new(0));
    let handled = Arc::new(AtomicUsize::new(0));
    let (held, counter) = (gate.clone(), handled.clone());
    let func = handler_fn(move |_: Ctx| {
        let (gate, counter) = (held.clone(), counter.clone());
        async move {
            gate.acquire().await.expect("the gate stays open").forget();
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    });
    let names: Vec<String> = (0..12).map(|i| format!("w{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let supervised = Supervised::start_with(&names, func, |settings| {
        settings.watching.list_page_size = 2;
        settings.queueing.admission_window = 4;
        settings.queueing.admission_patience = patience;
    })
    .await;
    (supervised, gate, handled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_routes_objects_only_as_fast_as_their_first_cycles_end() {
    let (supervised, gate, handled) =
        listing_behind_blocked_handlers(Duration::from_secs(60)).await;
    census_reaches(&supervised, 4).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let census = supervised.supervisor.send(Count).await.unwrap();
    assert_eq!(
        census.objects, 4,
        "only the window's objects are routed: {census:?}"
    );

    // Each cycle that ends makes room for the next listed object, until all are handled.
    gate.add_permits(12);
    until("every object handled", || {
        handled.load(Ordering::Relaxed) == 12
    })
    .await;
    let census = supervised.supervisor.send(Count).await.unwrap();
    assert_eq!(census.objects, 12, "{census:?}");
    supervised.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_goes_on_after_its_patience_when_first_cycles_do_not_end() {
    let (supervised, gate, handled) =
        listing_behind_blocked_handlers(Duration::from_millis(100)).await;
    // Stuck cycles slow the listing down, never stop it: every object gets its worker.
    census_reaches(&supervised, 12).await;
    assert_eq!(
        handled.load(Ordering::Relaxed),
        0,
        "no handler was let go yet"
    );
    gate.add_permits(12);
    until("every object handled", || {
        handled.load(Ordering::Relaxed) == 12
    })
    .await;
    supervised.stop().await;
}
