//! Object actors end to end: a user's own actor per widget, with real operators against the cluster
//! over real HTTP. One behaviour each: state across events and messages, asks, a missing object,
//! one thing at a time per object, idling, restarts, deletion, pause and exit, panics, a full
//! mailbox, self-scheduled messages.

mod support;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor::actors::{ActorCtx, ActorError, ActorOptions, ActorRef, Actors, ObjectActor};
use kactor::emulator::samples;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::Value;
use support::*;
use tokio::sync::Semaphore;

/// A widget as the actor reads it: a typed resource of the test's own.
#[derive(Debug, Deserialize)]
struct Widget {
    metadata: ObjectMeta,
    spec: WidgetSpec,
}

#[derive(Debug, Deserialize)]
struct WidgetSpec {
    size: i64,
}

/// What happened, in order, across every actor of a test: `"<object>#<instance> <what>"`.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    fn push(&self, line: String) {
        self.0.lock().unwrap().push(line);
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, line: &str) -> usize {
        self.all().iter().filter(|l| *l == line).count()
    }

    async fn until(&self, what: &str, check: impl Fn(&[String]) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !check(&self.all()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; the journal: {:#?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What the test makes the actors do, shared by all of them.
#[derive(Default)]
struct Script {
    /// Temporary failures of `on_create` still to come.
    create_failures: AtomicU32,
    /// Panics of `on_create` still to come.
    create_panics: AtomicU32,
    /// Temporary failures of `on_delete` still to come.
    delete_failures: AtomicU32,
    /// How long `on_update` takes, in milliseconds.
    update_millis: AtomicU32,
    /// Factory calls so far (each actor's instance number).
    made: AtomicUsize,
    /// Methods running now, across the actors, and the most ever at once for one object.
    inside: Mutex<std::collections::HashMap<String, usize>>,
    most_at_once: AtomicUsize,
}

impl Script {
    fn enter(&self, name: &str) {
        let mut inside = self.inside.lock().unwrap();
        let now = inside.entry(name.to_string()).or_default();
        *now += 1;
        self.most_at_once.fetch_max(*now, Ordering::SeqCst);
    }

    fn leave(&self, name: &str) {
        *self.inside.lock().unwrap().get_mut(name).unwrap() -= 1;
    }
}

/// The actor: counts what it handled, and answers with what it knows.
struct Cache {
    name: String,
    instance: usize,
    size_at_birth: i64,
    handled: Vec<String>,
    script: Arc<Script>,
    journal: Journal,
}

enum Msg {
    /// Reply with what it handled so far.
    Handled,
    /// Reply with its instance number and the size its factory saw.
    Birth,
    /// Take this long.
    Sleep(Duration),
    /// Panic.
    Panic,
    /// Wait until the semaphore gives a permit.
    Block(Arc<Semaphore>),
    /// Note a tick in the journal (scheduled ones).
    Tick(u32),
}

#[derive(Debug, PartialEq)]
enum Reply {
    Handled(Vec<String>),
    Birth(usize, i64),
    Done,
}

impl Cache {
    fn note(&mut self, what: &str) {
        self.handled.push(what.to_string());
        self.journal
            .push(format!("{}#{} {what}", self.name, self.instance));
    }

    async fn method(&mut self, what: &str, millis: u32) {
        self.script.enter(&self.name);
        self.note(what);
        if millis > 0 {
            tokio::time::sleep(Duration::from_millis(millis.into())).await;
        }
        self.script.leave(&self.name);
    }
}

fn take(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl ObjectActor for Cache {
    type Resource = Widget;
    type Message = Msg;
    type Reply = Reply;

    async fn started(&mut self, _me: &ActorRef<Self>) {
        self.note("started");
    }

    async fn on_create(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        self.method(&format!("create retry={}", ctx.retry()), 0)
            .await;
        if take(&self.script.create_panics) {
            panic!("the create method panicked on purpose");
        }
        if take(&self.script.create_failures) {
            return Err(HandlerError::temporary(
                "not yet",
                Duration::from_millis(300),
            ));
        }
        let size = ctx.object()?.spec.size;
        Ok(json!({"size": size, "instance": self.instance}))
    }

    async fn on_update(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        let millis = self.script.update_millis.load(Ordering::SeqCst);
        self.method(&format!("update to {}", ctx.spec()["size"]), millis)
            .await;
        Ok(json!({"updates": self.handled.iter().filter(|h| h.starts_with("update")).count()}))
    }

    async fn on_resume(&mut self, _ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        self.method("resume", 0).await;
        Ok(Value::Null)
    }

    async fn on_delete(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        self.method(&format!("delete retry={}", ctx.retry()), 0)
            .await;
        if take(&self.script.delete_failures) {
            return Err(HandlerError::temporary(
                "still cleaning",
                Duration::from_millis(300),
            ));
        }
        Ok(Value::Null)
    }

    async fn on_message(&mut self, message: Msg, me: &ActorRef<Self>) -> Reply {
        assert_eq!(me.key().name, self.name, "a message reaches its own object");
        match message {
            Msg::Handled => Reply::Handled(self.handled.clone()),
            Msg::Birth => Reply::Birth(self.instance, self.size_at_birth),
            Msg::Sleep(time) => {
                self.method("sleep", time.as_millis() as u32).await;
                Reply::Done
            }
            Msg::Panic => panic!("the message handler panicked on purpose"),
            Msg::Block(gate) => {
                self.note("blocked");
                let _permit = gate.acquire().await.unwrap();
                self.note("unblocked");
                Reply::Done
            }
            Msg::Tick(n) => {
                self.note(&format!("tick {n}"));
                Reply::Done
            }
        }
    }

    async fn stopped(&mut self, reason: StopReason, _me: &ActorRef<Self>) {
        self.note(&format!("stopped {}", reason.as_str()));
    }
}

/// The test's world: a cluster with widgets, the script, the journal.
struct World {
    cluster: TestCluster,
    widgets: Api<DynamicObject>,
    script: Arc<Script>,
    journal: Journal,
}

impl World {
    async fn new() -> World {
        let (cluster, widgets) = cluster_with_widgets().await;
        World {
            cluster,
            widgets,
            script: Arc::default(),
            journal: Journal::default(),
        }
    }

    /// An operator with the cache actors served with `options`.
    fn operator(&self, options: ActorOptions) -> Operator {
        let script = self.script.clone();
        let journal = self.journal.clone();
        operator(&self.cluster).actor("widgets.example.com", options, move |widget: &Widget| {
            Cache {
                name: widget.metadata.name.clone().unwrap_or_default(),
                instance: script.made.fetch_add(1, Ordering::SeqCst) + 1,
                size_at_birth: widget.spec.size,
                handled: Vec::new(),
                script: script.clone(),
                journal: journal.clone(),
            }
        })
    }

    async fn create(&self, name: &str, size: i64) {
        self.widgets
            .create(
                &PostParams::default(),
                &serde_json::from_value(samples::widget(name, size)).unwrap(),
            )
            .await
            .unwrap();
    }

    async fn resize(&self, name: &str, size: i64) {
        self.widgets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": size}})),
            )
            .await
            .unwrap();
    }

    async fn until_status(&self, name: &str, id: &str, check: impl Fn(&Value) -> bool) {
        until(&self.widgets, name, &format!("status[{id}]"), |o| {
            o.is_some_and(|o| check(&status(o)[id]))
        })
        .await;
    }
}

/// Asks until the actor of `name` exists (the operator may still be listing).
async fn ask(actors: &Actors<Cache>, name: &str, message: fn() -> Msg) -> Reply {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match actors.ask(("default", name), message()).await {
            Ok(reply) => return reply,
            Err(ActorError::NotFound { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("asking {name}: {error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actors_state_is_kept_across_events_and_messages_and_results_land_in_status() {
    let world = World::new().await;
    // A closure handler registered after the actor: it runs after the actor's method.
    let operator =
        world
            .operator(ActorOptions::new("cache"))
            .on_create("widgets.example.com", "after", {
                let journal = world.journal.clone();
                move |ctx: Ctx| {
                    let journal = journal.clone();
                    async move {
                        journal.push(format!("{} closure after", ctx.name()));
                        Ok(())
                    }
                }
            });
    let caches = operator.actors::<Cache>();
    let metrics = operator.metrics();
    let running = spawn(operator);

    world.create("w1", 3).await;
    world
        .until_status("w1", "cache/create", |s| s["size"] == 3)
        .await;
    world.resize("w1", 4).await;
    world
        .until_status("w1", "cache/update", |s| s["updates"] == 1)
        .await;
    world.resize("w1", 5).await;
    world
        .until_status("w1", "cache/update", |s| s["updates"] == 2)
        .await;

    assert_eq!(
        ask(&caches, "w1", || Msg::Handled).await,
        Reply::Handled(vec![
            "started".into(),
            "create retry=0".into(),
            "update to 4".into(),
            "update to 5".into(),
        ]),
        "one actor saw every event, in order, and kept its state"
    );
    assert_eq!(ask(&caches, "w1", || Msg::Birth).await, Reply::Birth(1, 3));
    assert_eq!(caches.len(), 1);
    assert_eq!(
        caches.keys(),
        vec![kactor::actors::ObjectKey::namespaced("default", "w1")]
    );
    let object = world.widgets.get("w1").await.unwrap();
    assert_eq!(status(&object)["cache/create"]["instance"], 1);
    assert!(
        annotation(&object, &format!("{PREFIX}/cache.create")).is_none(),
        "the progress of a method that succeeded is purged, as a closure handler's"
    );
    assert_eq!(
        world.journal.all()[..3],
        ["w1#1 started", "w1#1 create retry=0", "w1 closure after"],
        "handlers of a resource run in the order they were registered"
    );

    let text = metrics.render();
    assert!(text.contains("kactor_actors{actor=\"cache\"} 1"), "{text}");
    assert!(
        text.contains("kactor_actor_messages_total{actor=\"cache\",result=\"handled\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("kactor_handler_runs_total{handler=\"cache/create\""),
        "lifecycle methods are handlers in the metrics: {text}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_to_an_object_with_no_actor_is_a_clear_error() {
    let world = World::new().await;
    let operator = world.operator("cache".into());
    let caches = operator.actors::<Cache>();
    let metrics = operator.metrics();
    let running = spawn(operator);
    world.create("here", 1).await;
    ask(&caches, "here", || Msg::Handled).await;
    let not_found = |metrics: &kactor::health::Metrics| -> f64 {
        let series = "kactor_actor_messages_total{actor=\"cache\",result=\"not_found\"} ";
        let text = metrics.render();
        let line = text.lines().find(|l| l.starts_with(series)).unwrap();
        line[series.len()..].parse().unwrap()
    };
    // The asks above may have come before the listing.
    let before = not_found(&metrics);

    let error = caches
        .ask(("default", "nowhere"), Msg::Handled)
        .await
        .unwrap_err();
    assert!(matches!(error, ActorError::NotFound { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "no cache actor runs for default/nowhere: the object does not exist, is not served by \
         this operator (its resource, its namespace, a pause), or is gone"
    );
    let error = caches
        .tell(("elsewhere", "here"), Msg::Handled)
        .await
        .unwrap_err();
    assert!(matches!(error, ActorError::NotFound { .. }), "{error}");
    assert_eq!(not_found(&metrics) - before, 2.0);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_messages_of_one_object_never_run_at_once() {
    let world = World::new().await;
    world.script.update_millis.store(30, Ordering::SeqCst);
    let operator = world.operator("cache".into());
    let caches = operator.actors::<Cache>();
    let running = spawn(operator);
    world.create("busy", 1).await;
    world
        .until_status("busy", "cache/create", |s| s["size"] == 1)
        .await;

    // Updates (30 ms each) and messages (10 ms each) of one object, all at once, from many tasks.
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let caches = caches.clone();
        senders.spawn(async move {
            for _ in 0..10 {
                caches
                    .ask(("default", "busy"), Msg::Sleep(Duration::from_millis(10)))
                    .await
                    .unwrap();
            }
        });
    }
    for size in 2..=6 {
        world.resize("busy", size).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    while let Some(sent) = senders.join_next().await {
        sent.unwrap();
    }
    world
        .until_status("busy", "cache/update", |s| s["updates"].as_u64() >= Some(1))
        .await;
    world
        .journal
        .until("the last update", |j| {
            j.iter().any(|l| l.ends_with("update to 6"))
        })
        .await;
    let journal = world.journal.all();
    assert_eq!(journal.iter().filter(|l| l.ends_with(" sleep")).count(), 40);
    assert!(journal.iter().filter(|l| l.contains(" update to ")).count() >= 2);
    assert_eq!(
        world.script.most_at_once.load(Ordering::SeqCst),
        1,
        "a method of one object ran while another was running: {journal:#?}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_outlives_its_idle_worker() {
    let world = World::new().await;
    let operator = world
        .operator("cache".into())
        .settings(|s| s.queueing.idle_timeout = Duration::from_millis(100));
    let caches = operator.actors::<Cache>();
    let running = spawn(operator);
    world.create("sleepy", 1).await;
    world
        .until_status("sleepy", "cache/create", |s| s["size"] == 1)
        .await;
    // Well past the idle timeout: the worker stopped, the actor did not.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        ask(&caches, "sleepy", || Msg::Birth).await,
        Reply::Birth(1, 1)
    );
    world.resize("sleepy", 2).await;
    world
        .until_status("sleepy", "cache/update", |s| s["updates"] == 1)
        .await;
    assert_eq!(
        ask(&caches, "sleepy", || Msg::Birth).await,
        Reply::Birth(1, 1),
        "the same actor handled the update after the worker came back"
    );
    assert_eq!(world.script.made.load(Ordering::SeqCst), 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_makes_new_actors_that_resume_kopf_progress_without_rerunning_what_succeeded() {
    let world = World::new().await;
    let options = || ActorOptions::new("cache").resume();
    let running = spawn(world.operator(options()));
    world.create("done", 1).await;
    world
        .until_status("done", "cache/create", |s| s["size"] == 1)
        .await;
    // `pending` fails its first attempt; the operator stops while its retry is due.
    world.script.create_failures.store(1, Ordering::SeqCst);
    world.create("pending", 2).await;
    until(
        &world.widgets,
        "pending",
        "the failed attempt's progress",
        |o| {
            o.and_then(|o| annotation(o, &format!("{PREFIX}/cache.create")))
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
                .is_some_and(|progress| progress["retries"] == 1)
        },
    )
    .await;
    running.stop().await;
    world
        .journal
        .until("the actors stopped at exit", |j| {
            j.contains(&"done#1 stopped OPERATOR_EXITING".to_string())
                && j.contains(&"pending#2 stopped OPERATOR_EXITING".to_string())
        })
        .await;

    let operator = world.operator(options());
    let caches = operator.actors::<Cache>();
    let running = spawn(operator);
    world
        .until_status("pending", "cache/create", |s| s["size"] == 2)
        .await;
    world
        .journal
        .until("the resume of done", |j| {
            j.iter().any(|l| l.ends_with("resume"))
        })
        .await;
    let journal = world.journal.all();
    assert_eq!(
        journal
            .iter()
            .filter(|l| l.starts_with("done#") && l.contains("create"))
            .count(),
        1,
        "a method that succeeded is not run again after the restart: {journal:#?}"
    );
    assert!(
        journal
            .iter()
            .any(|l| l.starts_with("pending#") && l.ends_with("create retry=1")),
        "the failed method is retried as Kopf's progress says: {journal:#?}"
    );
    let Reply::Birth(instance, _) = ask(&caches, "done", || Msg::Birth).await else {
        unreachable!()
    };
    assert!(
        instance > 2,
        "a new actor after the restart (instance {instance})"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_waits_for_on_delete_then_the_actor_stops_as_deleted() {
    let world = World::new().await;
    let operator = world.operator(ActorOptions::new("cache").delete());
    let caches = operator.actors::<Cache>();
    let running = spawn(operator);
    world.create("going", 1).await;
    until(&world.widgets, "going", "the finalizer", |o| {
        o.is_some_and(has_finalizer)
    })
    .await;
    world.script.delete_failures.store(1, Ordering::SeqCst);
    world
        .widgets
        .delete("going", &DeleteParams::default())
        .await
        .unwrap();
    world
        .journal
        .until("the failed delete", |j| {
            j.iter().any(|l| l.ends_with("delete retry=0"))
        })
        .await;
    assert!(
        world.widgets.get_opt("going").await.unwrap().is_some(),
        "the finalizer holds the object while on_delete has not succeeded"
    );
    until(&world.widgets, "going", "the object to go", |o| o.is_none()).await;
    world
        .journal
        .until("the actor to stop", |j| {
            j.iter().any(|l| l.ends_with("stopped RESOURCE_DELETED"))
        })
        .await;
    let journal = world.journal.all();
    let lines: Vec<&str> = journal
        .iter()
        .map(|l| &l[l.find(' ').unwrap() + 1..])
        .collect();
    assert_eq!(
        lines,
        [
            "started",
            "create retry=0",
            "delete retry=0",
            "delete retry=1",
            "stopped RESOURCE_DELETED"
        ]
    );
    let error = caches
        .ask(("default", "going"), Msg::Birth)
        .await
        .unwrap_err();
    assert!(matches!(error, ActorError::NotFound { .. }), "{error}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_stops_the_actors_the_resume_makes_new_ones_and_the_exit_stops_them() {
    let world = World::new().await;
    world.create("p1", 1).await;
    let operator = world.operator("cache".into());
    let caches = operator.actors::<Cache>();
    let switch = operator.pause_switch();
    let running = spawn(operator);
    assert_eq!(ask(&caches, "p1", || Msg::Birth).await, Reply::Birth(1, 1));
    world
        .until_status("p1", "cache/create", |s| s["size"] == 1)
        .await;

    switch.set("test", Some("paused by the test".into()));
    world
        .journal
        .until("the actor to stop for the pause", |j| {
            j.contains(&"p1#1 stopped OPERATOR_PAUSING".to_string())
        })
        .await;
    let error = caches.ask(("default", "p1"), Msg::Birth).await.unwrap_err();
    assert!(matches!(error, ActorError::NotFound { .. }), "{error}");

    world.resize("p1", 7).await;
    switch.set("test", None);
    assert_eq!(
        ask(&caches, "p1", || Msg::Birth).await,
        Reply::Birth(2, 7),
        "a new actor, made from the object as it is after the resume"
    );
    world
        .until_status("p1", "cache/update", |s| s["updates"] == 1)
        .await;
    running.stop().await;
    world
        .journal
        .until("the actor to stop at exit", |j| {
            j.contains(&"p1#2 stopped OPERATOR_EXITING".to_string())
        })
        .await;
    assert_eq!(
        world.journal.count("p1#2 create retry=0"),
        0,
        "create is not run again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_the_methods_error_and_the_actor_goes_on_with_its_state() {
    let world = World::new().await;
    world.script.create_panics.store(1, Ordering::SeqCst);
    let operator = world
        .operator("cache".into())
        .settings(|s| s.execution.default_backoff = Duration::from_millis(100));
    let caches = operator.actors::<Cache>();
    let running = spawn(operator);
    world.create("fragile", 1).await;
    world
        .until_status("fragile", "cache/create", |s| s["size"] == 1)
        .await;
    assert_eq!(
        world.journal.all(),
        [
            "fragile#1 started",
            "fragile#1 create retry=0",
            "fragile#1 create retry=1"
        ],
        "the panic was the attempt's error, retried by the same actor"
    );

    let error = caches
        .ask(("default", "fragile"), Msg::Panic)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the cache actor of default/fragile panicked on the message: the message handler \
         panicked on purpose"
    );
    caches
        .tell(("default", "fragile"), Msg::Panic)
        .await
        .unwrap();
    assert_eq!(
        ask(&caches, "fragile", || Msg::Handled).await,
        Reply::Handled(vec![
            "started".into(),
            "create retry=0".into(),
            "create retry=1".into()
        ]),
        "the state after a panic is what the method left"
    );
    assert_eq!(world.script.made.load(Ordering::SeqCst), 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_mailbox_makes_tell_wait_and_try_tell_fail() {
    let world = World::new().await;
    let operator = world.operator(ActorOptions::new("cache").mailbox(2));
    let caches = operator.actors::<Cache>();
    let running = spawn(operator);
    world.create("crowded", 1).await;
    world
        .until_status("crowded", "cache/create", |s| s["size"] == 1)
        .await;

    let gate = Arc::new(Semaphore::new(0));
    caches
        .tell(("default", "crowded"), Msg::Block(gate.clone()))
        .await
        .unwrap();
    world
        .journal
        .until("the actor to be blocked", |j| {
            j.iter().any(|l| l.ends_with("blocked"))
        })
        .await;
    caches
        .try_tell(("default", "crowded"), Msg::Tick(0))
        .unwrap();
    caches
        .try_tell(("default", "crowded"), Msg::Tick(1))
        .unwrap();
    let error = caches
        .try_tell(("default", "crowded"), Msg::Tick(2))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the mailbox of the cache actor of default/crowded is full (2 waiting)"
    );
    let waiting = tokio::spawn({
        let caches = caches.clone();
        async move { caches.tell(("default", "crowded"), Msg::Tick(3)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "tell waits for room");
    gate.add_permits(1);
    waiting.await.unwrap().unwrap();
    world
        .journal
        .until("every tick", |j| j.iter().any(|l| l.ends_with("tick 3")))
        .await;
    let ticks: Vec<String> = world
        .journal
        .all()
        .into_iter()
        .filter(|l| l.contains("tick") || l.contains("blocked"))
        .collect();
    assert_eq!(
        ticks,
        [
            "crowded#1 blocked",
            "crowded#1 unblocked",
            "crowded#1 tick 0",
            "crowded#1 tick 1",
            "crowded#1 tick 3"
        ]
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_messages_arrive_later_and_die_with_their_actor() {
    let world = World::new().await;
    let operator = world.operator("cache".into());
    let caches = operator.actors::<Cache>();
    let switch = operator.pause_switch();
    let running = spawn(operator);
    world.create("timed", 1).await;
    let me = {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(me) = caches.get(("default", "timed")) {
                break me;
            }
            assert!(tokio::time::Instant::now() < deadline, "no actor");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    me.schedule(Duration::from_millis(200), Msg::Tick(1));
    me.schedule(Duration::from_secs(2), Msg::Tick(2));
    world
        .journal
        .until("the first tick", |j| {
            j.iter().any(|l| l.ends_with("tick 1"))
        })
        .await;
    switch.set("test", Some("paused by the test".into()));
    world
        .journal
        .until("the pause", |j| {
            j.iter().any(|l| l.ends_with("stopped OPERATOR_PAUSING"))
        })
        .await;
    switch.set("test", None);
    ask(&caches, "timed", || Msg::Birth).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !world.journal.all().iter().any(|l| l.ends_with("tick 2")),
        "a message scheduled by a stopped actor never reaches the next one: {:#?}",
        world.journal.all()
    );
    let error = me.tell(Msg::Tick(3)).await.unwrap_err();
    assert!(matches!(error, ActorError::Stopped { .. }), "{error}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_without_lifecycle_methods_is_made_for_every_object_and_writes_nothing() {
    use kactor::actors::Method;
    let world = World::new().await;
    world.create("quiet", 4).await;
    let operator = world.operator(
        ActorOptions::new("cache")
            .without(Method::Create)
            .without(Method::Update),
    );
    let caches = operator.actors::<Cache>();
    let running = spawn(operator);
    assert_eq!(
        ask(&caches, "quiet", || Msg::Birth).await,
        Reply::Birth(1, 4)
    );
    world.resize("quiet", 5).await;
    world.create("later", 1).await;
    assert_eq!(
        ask(&caches, "later", || Msg::Birth).await,
        Reply::Birth(2, 1)
    );
    let object = world.widgets.get("quiet").await.unwrap();
    assert!(
        object.metadata.annotations.unwrap_or_default().is_empty()
            && object.metadata.finalizers.unwrap_or_default().is_empty()
            && status(&world.widgets.get("quiet").await.unwrap()).is_null(),
        "an actor with no lifecycle method leaves objects as they are"
    );
    assert_eq!(
        ask(&caches, "quiet", || Msg::Handled).await,
        Reply::Handled(vec!["started".into()])
    );
    running.stop().await;
}
