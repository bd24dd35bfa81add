//! Object actors without an operator: the table as supervisors drive it (`seen`, `gone`) and the
//! lifecycle handlers as the processing cycle calls them, under tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor_actors::objects::{
    ActorCtx, ActorEnv, ActorError, ActorOptions, ActorRef, Actors, Method, ObjectActor,
    ObjectHost, ObjectKey,
};
use kactor_actors::tracker::Tracker;
use kactor_emulator::{samples, Emulator};
use kactor_reactor::handlers::{Ctx, HandlerError, Memo};
use kactor_reactor::names::EventType;
use kactor_reactor::observe::NoObserver;
use kactor_reactor::resources::Resource;
use kactor_reactor::stopping::StopReason;
use kube::api::DynamicObject;
use serde::Deserialize;
use serde_json::{json, Value};

/// What the actors of a test did: `"<name>@<uid> <what>"`.
type Log = Arc<Mutex<Vec<String>>>;

#[derive(Deserialize)]
struct Widget {
    metadata: kube::api::ObjectMeta,
    spec: Spec,
}

#[derive(Deserialize)]
struct Spec {
    size: i64,
}

struct Probe {
    who: String,
    log: Log,
}

impl Probe {
    fn note(&self, what: impl std::fmt::Display) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} {what}", self.who));
    }
}

impl ObjectActor for Probe {
    type Resource = Widget;
    type Message = u32;
    type Reply = u32;

    async fn on_create(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        self.note("create");
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(json!({"size": ctx.object()?.spec.size}))
    }

    async fn on_message(&mut self, n: u32, _me: &ActorRef<Self>) -> u32 {
        self.note(format!("message {n}"));
        n * 2
    }

    async fn stopped(&mut self, reason: StopReason, _me: &ActorRef<Self>) {
        self.note(format!("stopped {}", reason.as_str()));
    }
}

struct Bench {
    _emulator: Emulator,
    client: Arc<kube::Client>,
    resource: Arc<Resource>,
    log: Log,
    made: Arc<AtomicUsize>,
    actors: Actors<Probe>,
}

impl Bench {
    async fn new(options: ActorOptions) -> Bench {
        let emulator = Emulator::start().await.unwrap();
        let client = emulator.in_process_client();
        samples::install_widgets(&client).await.unwrap();
        let resources = kactor_reactor::discovery::scan(&client).await.unwrap();
        let resource = kactor_reactor::resources::Selector::parse("widgets.example.com")
            .resolve(&resources)
            .unwrap()
            .clone();
        let log = Log::default();
        let made = Arc::new(AtomicUsize::new(0));
        let actors = Actors::new(options, {
            let log = log.clone();
            let made = made.clone();
            move |widget: &Widget| {
                made.fetch_add(1, Ordering::SeqCst);
                assert!(
                    widget.spec.size >= 0,
                    "the factory panicked on a negative size"
                );
                Probe {
                    who: format!(
                        "{}@{}",
                        widget.metadata.name.as_deref().unwrap_or_default(),
                        widget.metadata.uid.as_deref().unwrap_or_default()
                    ),
                    log: log.clone(),
                }
            }
        });
        actors.bind(ActorEnv {
            runtime: tokio::runtime::Handle::current(),
            tracker: Arc::new(Tracker::default()),
            observer: Arc::new(NoObserver),
        });
        Bench {
            _emulator: emulator,
            client: Arc::new(client),
            resource: Arc::new(resource),
            log,
            made,
            actors,
        }
    }

    fn body(name: &str, uid: &str, size: i64) -> Arc<DynamicObject> {
        let mut body: DynamicObject = serde_json::from_value(samples::widget(name, size)).unwrap();
        body.metadata.namespace = Some("default".into());
        body.metadata.uid = Some(uid.into());
        Arc::new(body)
    }

    fn ctx(&self, body: Arc<DynamicObject>) -> Ctx {
        Ctx::new(
            EventType::Added,
            body,
            Memo::default(),
            self.resource.clone(),
            self.client.clone(),
            std::time::Instant::now(),
        )
    }

    /// Sees the object, as its supervisor does before dispatching an event, and calls the
    /// lifecycle method's handler, as the processing cycle then does.
    fn seen_and_call(
        &self,
        method: Method,
        body: Arc<DynamicObject>,
    ) -> futures::future::BoxFuture<'static, Result<Value, HandlerError>> {
        self.actors.seen(&body);
        self.call(method, body)
    }

    /// Calls the lifecycle method's handler as a processing cycle would.
    fn call(
        &self,
        method: Method,
        body: Arc<DynamicObject>,
    ) -> futures::future::BoxFuture<'static, Result<Value, HandlerError>> {
        let id = self.actors.options().id(method).unwrap().to_string();
        let (_, _, func) = self
            .actors
            .handlers()
            .into_iter()
            .find(|(_, on, _)| on.id == id)
            .unwrap();
        func(self.ctx(body))
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Lets the actors' tasks run what they have.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_newer_object_of_the_same_name_replaces_the_actor_and_the_old_ones_deletion_spares_it() {
    let bench = Bench::new(ActorOptions::new("probe")).await;
    let key = ObjectKey::namespaced("default", "w");
    bench.actors.seen(&Bench::body("w", "old", 1));
    bench.actors.seen(&Bench::body("w", "old", 2));
    assert_eq!(bench.actors.ask(key.clone(), 1).await, Ok(2));
    assert_eq!(
        bench.made.load(Ordering::SeqCst),
        1,
        "seen again: the same actor"
    );

    // Recreated under the same name while the old one's deletion is still to come (a relist).
    bench.actors.seen(&Bench::body("w", "new", 1));
    bench
        .actors
        .gone(&key, Some("old"), StopReason::ResourceDeleted);
    assert_eq!(bench.actors.ask(key.clone(), 3).await, Ok(6));
    Bench::settle().await;
    assert_eq!(
        bench.log(),
        [
            "w@old message 1",
            "w@old stopped RESOURCE_DELETED",
            "w@new message 3"
        ]
    );
    bench
        .actors
        .gone(&key, Some("new"), StopReason::OperatorExiting);
    Bench::settle().await;
    assert_eq!(
        bench.log().last().unwrap(),
        "w@new stopped OPERATOR_EXITING"
    );
    assert!(bench.actors.is_empty());
    assert!(matches!(
        bench.actors.ask(key, 4).await,
        Err(ActorError::NotFound { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_lifecycle_call_and_messages_are_handled_in_arrival_order() {
    let bench = Bench::new(ActorOptions::new("probe")).await;
    let body = Bench::body("w", "u1", 5);
    bench.actors.seen(&body);
    let key = ObjectKey::namespaced("default", "w");
    bench.actors.tell(key.clone(), 1).await.unwrap();
    // The call is queued when its handler runs: on a task of its own, as in a cycle.
    let create = tokio::spawn(bench.call(Method::Create, body.clone()));
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    let asked = bench.actors.ask(key.clone(), 2);
    let (created, asked) = tokio::join!(create, asked);
    assert_eq!(created.unwrap().unwrap(), json!({"size": 5}));
    assert_eq!(asked, Ok(4));
    assert_eq!(
        bench.log(),
        ["w@u1 message 1", "w@u1 create", "w@u1 message 2"],
        "the ask that came during create waited for it"
    );
}

#[tokio::test(start_paused = true)]
async fn an_object_the_factory_cannot_take_gets_no_actor_and_a_clear_error_until_it_changes() {
    let bench = Bench::new(ActorOptions::new("probe")).await;
    let key = ObjectKey::namespaced("default", "w");

    // Not seen (yet, or any more: a pause, an exit): a temporary error, retried later.
    let error = bench
        .call(Method::Create, Bench::body("w", "u1", 1))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the probe actor of default/w is not running (the operator is pausing or exiting) \
         (temporary; retry in 1s)"
    );
    assert_eq!(bench.made.load(Ordering::SeqCst), 0);

    // The factory panics.
    let error = bench
        .seen_and_call(Method::Create, Bench::body("w", "u1", -1))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the probe actor of default/w cannot be made: the factory panicked: the factory panicked \
         on a negative size"
    );
    Bench::settle().await;
    assert!(matches!(
        bench.actors.ask(key.clone(), 1).await,
        Err(ActorError::NotFound { .. })
    ));

    // The object does not read as the actor's resource.
    let mut garbage = (*Bench::body("w", "u1", 1)).clone();
    garbage.data["spec"] = json!({"size": "large"});
    let error = bench
        .seen_and_call(Method::Create, Arc::new(garbage))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("the probe actor of default/w cannot be made: the object cannot be read as objects::Widget: invalid type: string \"large\""),
        "{error}"
    );

    // Fixed: the next call makes the actor.
    let made = bench.made.load(Ordering::SeqCst);
    assert_eq!(
        bench
            .seen_and_call(Method::Create, Bench::body("w", "u1", 3))
            .await
            .unwrap(),
        json!({"size": 3})
    );
    assert_eq!(bench.made.load(Ordering::SeqCst), made + 1);
    assert_eq!(bench.actors.ask(key, 1).await, Ok(2));
}

#[tokio::test(start_paused = true)]
async fn an_ask_that_gets_no_reply_in_time_is_a_timeout_and_the_message_is_still_handled() {
    let bench = Bench::new(ActorOptions::new("probe").ask_timeout(Duration::from_millis(10))).await;
    let body = Bench::body("w", "u1", 5);
    bench.actors.seen(&body);
    let key = ObjectKey::namespaced("default", "w");
    let create = tokio::spawn(bench.call(Method::Create, body));
    tokio::task::yield_now().await;
    let error = bench.actors.ask(key.clone(), 7).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "the probe actor of default/w did not reply within 10ms"
    );
    create.await.unwrap().unwrap();
    Bench::settle().await;
    assert_eq!(bench.log(), ["w@u1 create", "w@u1 message 7"]);
}
