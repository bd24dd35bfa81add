//! The handling suite: one object's cycles ([`Processor::process`]) called directly, against the
//! in-process emulator under tokio's paused time, one behaviour per test (Kopf's `tests/handling/`
//! is the model). The processor reads the time from tokio's clock ([`Clock::Tokio`]), so delays are
//! asserted exactly, in virtual time; nothing sleeps for real.
//!
//! Each test plays the worker's part by hand: it fetches the object as the watch would bring it,
//! runs a cycle, and checks what the cycle wrote to the object and the one [`Next`] step it asked
//! for.

mod emulator_only {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use jiff::Timestamp;
    use kactor_emulator::{samples, Emulator, Failure};
    use kactor_reactor::causes::Reason;
    use kactor_reactor::handlers::{
        handler_fn, ChangingHandler, Ctx, EventHandler, HandlerError, Memo, On, ResourceHandlers,
    };
    use kactor_reactor::posting::EventPoster;
    use kactor_reactor::processing::{
        Clock, Cycle, DaemonsView, Event, Next, ObjectMemory, ProcessingError, Processor,
        SpawnDecision, Written,
    };
    use kactor_reactor::reconcile::{reconcile_fn, Action, Predicate, Reconcile, ReconcileHandler};
    use kactor_reactor::resources::{Resource, Selector};
    use kactor_reactor::settings::Settings;
    use kactor_reactor::sharding::Shard;
    use kactor_reactor::triggers::{Related, Trigger, Triggers};
    use kactor_reactor::watching::EventType;
    use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
    use serde_json::{json, Value};
    use tokio::sync::Semaphore;
    use tokio::time::Instant;

    const WIDGETS: &str = "widgets.v1.example.com";
    const FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";
    const DIFF_BASE: &str = "kopf.zalando.org/last-handled-configuration";
    const CAUSE_BASE: &str = "kopf.zalando.org/cause-base-configuration";

    /// What the handlers saw, in order: `id reason retry old->new`.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl Seen {
        fn push(&self, ctx: &Ctx) {
            let values = |v: Option<&Value>| v.map_or("-".to_string(), Value::to_string);
            self.0.lock().unwrap().push(format!(
                "{} {} {} {}->{}",
                ctx.id(),
                ctx.reason().map_or("-", Reason::as_str),
                ctx.retry(),
                values(ctx.old()),
                values(ctx.new_value()),
            ));
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    /// A changing handler that records what it saw and returns `{"size": spec.size}`, or fails
    /// temporarily with `delay` while `failures` last.
    fn handler(
        seen: &Seen,
        on: On,
        reason: Option<Reason>,
        failures: u32,
        delay: Duration,
    ) -> ChangingHandler {
        let seen = seen.clone();
        let func = handler_fn(move |ctx: Ctx| {
            seen.push(&ctx);
            async move {
                if ctx.retry() < failures {
                    return Err(HandlerError::temporary("not yet", delay));
                }
                Ok(json!({"size": ctx.spec()["size"]}))
            }
        });
        ChangingHandler::register(Selector::parse(WIDGETS), on, reason, func)
    }

    /// A handler of this id for this reason that succeeds at once.
    fn plain(seen: &Seen, id: &str, reason: Reason) -> ChangingHandler {
        handler(seen, On::id(id), Some(reason), 0, Duration::ZERO)
    }

    fn create(seen: &Seen) -> ChangingHandler {
        plain(seen, "create_fn", Reason::Create)
    }

    fn update(seen: &Seen) -> ChangingHandler {
        plain(seen, "update_fn", Reason::Update)
    }

    fn delete(seen: &Seen) -> ChangingHandler {
        plain(seen, "delete_fn", Reason::Delete)
    }

    fn field(seen: &Seen) -> ChangingHandler {
        let on = On::id("size").field("spec.size");
        let mut handler = handler(seen, on, Some(Reason::Noop), 0, Duration::ZERO);
        handler.id = "size/spec.size".into();
        handler
    }

    /// The emulator, the widgets, and a processor of these handlers on tokio's clock.
    struct Handling {
        emulator: Emulator,
        widgets: Api<DynamicObject>,
        processor: Processor,
        memory: ObjectMemory,
        /// What the processor was made of, for another (`processor_for`).
        parts: (Arc<Resource>, Arc<ResourceHandlers>, Arc<kube::Client>),
    }

    impl Handling {
        async fn new(changing: Vec<ChangingHandler>) -> Handling {
            Handling::with_settings(changing, Settings::default()).await
        }

        async fn with_settings(changing: Vec<ChangingHandler>, settings: Settings) -> Handling {
            let handlers = ResourceHandlers {
                changing,
                ..ResourceHandlers::default()
            };
            Handling::with_handlers(handlers, settings).await
        }

        async fn with_handlers(handlers: ResourceHandlers, settings: Settings) -> Handling {
            let emulator = Emulator::start().await.unwrap();
            let client = emulator.in_process_client();
            let widgets = samples::install_widgets(&client).await.unwrap();
            let resources = kactor_reactor::discovery::scan(&client).await.unwrap();
            let resource = Selector::parse(WIDGETS)
                .resolve(&resources)
                .unwrap()
                .clone();
            let parts = (Arc::new(resource), Arc::new(handlers), Arc::new(client));
            let processor = processor_of(&parts, settings);
            Handling {
                emulator,
                widgets,
                processor,
                memory: ObjectMemory::default(),
                parts,
            }
        }

        /// Every handler slot of the processor (4), held until dropped.
        async fn take_every_slot(&self) -> tokio::sync::OwnedSemaphorePermit {
            self.processor
                .limiter
                .clone()
                .acquire_many_owned(4)
                .await
                .unwrap()
        }

        /// A processor of the same handlers with other settings (another replica, say).
        fn processor_for(&self, settings: Settings) -> Processor {
            processor_of(&self.parts, settings)
        }

        async fn create_widget(&self, size: i64) -> DynamicObject {
            let body = serde_json::from_value(samples::widget("w1", size)).unwrap();
            self.widgets
                .create(&PostParams::default(), &body)
                .await
                .unwrap()
        }

        async fn get(&self) -> Option<DynamicObject> {
            self.widgets.get_opt("w1").await.unwrap()
        }

        /// The widget, created with our finalizer and then deleted: as its deletion's first
        /// event brings it.
        async fn deleting(&self) -> DynamicObject {
            let mut body =
                serde_json::from_value::<DynamicObject>(samples::widget("w1", 1)).unwrap();
            body.metadata.finalizers = Some(vec![FINALIZER.into()]);
            self.widgets
                .create(&PostParams::default(), &body)
                .await
                .unwrap();
            self.widgets
                .delete("w1", &DeleteParams::default())
                .await
                .unwrap();
            self.get().await.unwrap()
        }

        async fn resize(&self, size: i64) {
            let patch = json!({"spec": {"size": size}});
            self.widgets
                .patch("w1", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }

        /// Cycles on the object as the watch brings it, until one writes nothing: the cause's
        /// handlers run one per cycle (Kopf's default lifecycle, `asap`).
        async fn settle(&mut self) -> Cycle {
            for _ in 0..10 {
                let cycle = self.cycle(EventType::Modified).await;
                if cycle.written == Written::Nothing {
                    return cycle;
                }
            }
            panic!("no quiet after 10 cycles");
        }

        /// A widget of size 1, created and handled to quiet.
        async fn handled(&mut self) {
            self.create_widget(1).await;
            self.cycle(EventType::Added).await;
            self.settle().await;
        }

        /// A cycle on the object as it is now, as the watch would bring it.
        async fn cycle(&mut self, event_type: EventType) -> Cycle {
            let body = self.get().await.expect("the object exists");
            self.cycle_on(event_type, body, true, None).await
        }

        async fn cycle_on(
            &mut self,
            event_type: EventType,
            body: DynamicObject,
            consistent: bool,
            daemons: Option<DaemonsView>,
        ) -> Cycle {
            self.try_cycle_on(event_type, body, consistent, daemons)
                .await
                .expect("the cycle's patch is applied")
        }

        async fn try_cycle_on(
            &mut self,
            event_type: EventType,
            body: DynamicObject,
            consistent: bool,
            daemons: Option<DaemonsView>,
        ) -> Result<Cycle, ProcessingError> {
            let event = Event {
                consistent,
                daemons,
                ..arriving(event_type, body)
            };
            self.processor.process(event, &mut self.memory).await
        }
    }

    /// A processor on tokio's clock.
    fn processor_of(
        (resource, handlers, client): &(Arc<Resource>, Arc<ResourceHandlers>, Arc<kube::Client>),
        settings: Settings,
    ) -> Processor {
        Processor::new(
            resource.clone(),
            handlers.clone(),
            Arc::new(settings),
            client.clone(),
            EventPoster::disabled(),
            Arc::new(Semaphore::new(4)),
        )
        // A whole second: the stored timestamps (microseconds) are exact.
        .with_clock(Clock::tokio(Timestamp::from_second(1_800_000_000).unwrap()))
    }

    /// The event a watch brings with `body`: consistent, with no daemons, triggers or departure.
    fn arriving(event_type: EventType, body: DynamicObject) -> Event {
        Event {
            event_type,
            body: Arc::new(body),
            memo: Memo::default(),
            received: Instant::now(),
            consistent: true,
            daemons: None,
            synthetic: false,
            triggers: Triggers::default(),
            departing: None,
        }
    }

    /// A view of the object's daemons (still running if `blocking`) that records each decision.
    fn recording(decided: &Arc<Mutex<Vec<SpawnDecision>>>, blocking: bool) -> DaemonsView {
        let decided = decided.clone();
        DaemonsView {
            excluded: Arc::default(),
            blocking,
            decide: Box::new(move |decision| decided.lock().unwrap().push(decision)),
        }
    }

    /// The essence of a widget of this size, as stored and as handlers see it.
    fn essence(size: i64) -> Value {
        json!({"metadata": {"labels": {"app": "demo"}}, "spec": {"size": size}})
    }

    /// A stored essence (diff-base, cause-base), parsed.
    fn stored(object: &DynamicObject, key: &str) -> Option<Value> {
        annotation(object, key).map(|text| serde_json::from_str(text).unwrap())
    }

    fn annotation<'a>(object: &'a DynamicObject, key: &str) -> Option<&'a str> {
        object
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    fn progress_keys(object: &DynamicObject) -> Vec<String> {
        let annotations = object.metadata.annotations.clone().unwrap_or_default();
        annotations
            .into_keys()
            .filter(|k| k.starts_with("kopf.zalando.org/") && k != DIFF_BASE)
            .collect()
    }

    fn finalized(object: &DynamicObject) -> bool {
        object
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
    }

    fn version(object: &DynamicObject) -> Written {
        Written::Version(object.metadata.resource_version.clone().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_creation_runs_the_create_handler_once_and_stores_its_result_and_the_diff_base() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen)]).await;
        handling.create_widget(1).await;

        let cycle = handling.cycle(EventType::Added).await;
        let object = handling.get().await.unwrap();
        assert_eq!(cycle.written, version(&object), "the version to wait for");
        assert_eq!(cycle.next, Next::Idle);
        assert_eq!(
            seen.take(),
            [format!("create_fn create 0 -->{}", essence(1))]
        );
        assert_eq!(object.data["status"]["create_fn"], json!({"size": 1}));
        assert_eq!(stored(&object, DIFF_BASE), Some(essence(1)));
        assert!(
            progress_keys(&object).is_empty(),
            "{:?}",
            progress_keys(&object)
        );

        // Our own patch comes back: nothing to do, nothing written.
        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(cycle, Cycle::default());
        assert!(seen.take().is_empty());
    }

    /// A client over the emulator's that holds every PATCH for 50 ms (virtual) and records how
    /// many were in flight at most.
    #[derive(Clone)]
    struct HoldingPatches {
        inner: kube::Client,
        now: Arc<std::sync::atomic::AtomicUsize>,
        most: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl tower_service::Service<http::Request<kube::client::Body>> for HoldingPatches {
        type Response = http::Response<kube::client::Body>;
        type Error = kube::Error;
        type Future = futures::future::BoxFuture<'static, Result<Self::Response, kube::Error>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), kube::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
            use std::sync::atomic::Ordering::SeqCst;
            let this = self.clone();
            Box::pin(async move {
                let patch = request.method() == http::Method::PATCH;
                if patch {
                    let now = this.now.fetch_add(1, SeqCst) + 1;
                    this.most.fetch_max(now, SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let response = this.inner.send(request).await;
                if patch {
                    this.now.fetch_sub(1, SeqCst);
                }
                response
            })
        }
    }

    /// The most writes in flight at once while six new widgets are handled together by one
    /// processor with these settings (and 4 handler slots), once each has its result.
    async fn most_writes_in_flight(settings: Settings) -> usize {
        let seen = Seen::default();
        let handling = Handling::new(vec![create(&seen)]).await;
        let holding = HoldingPatches {
            inner: (*handling.parts.2).clone(),
            now: Arc::default(),
            most: Arc::default(),
        };
        let client = kube::Client::new(holding.clone(), "default");
        let parts = (
            handling.parts.0.clone(),
            handling.parts.1.clone(),
            Arc::new(client),
        );
        let processor = processor_of(&parts, settings);
        let names: Vec<String> = (1..=6).map(|n| format!("w{n}")).collect();
        let mut bodies = Vec::new();
        for name in &names {
            let body = serde_json::from_value(samples::widget(name, 1)).unwrap();
            bodies.push(
                handling
                    .widgets
                    .create(&PostParams::default(), &body)
                    .await
                    .unwrap(),
            );
        }
        let cycles = bodies.into_iter().map(|body| {
            let processor = &processor;
            async move {
                let mut memory = ObjectMemory::default();
                let event = arriving(EventType::Added, body);
                processor.process(event, &mut memory).await.unwrap()
            }
        });
        for cycle in futures::future::join_all(cycles).await {
            assert!(
                matches!(cycle.written, Written::Version(_)),
                "each cycle wrote its result"
            );
        }
        for name in &names {
            let object = handling.widgets.get(name).await.unwrap();
            assert_eq!(
                object.data["status"]["create_fn"],
                json!({"size": 1}),
                "{name} carries its result"
            );
        }
        assert_eq!(seen.take().len(), 6, "one run per widget");
        holding.most.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `networking.max_concurrent_writes` bounds a processor's writes in flight below the
    /// handlers' limit; 0 leaves only the handlers' limit, which bounds them too.
    #[tokio::test(start_paused = true)]
    async fn a_processors_writes_in_flight_are_bounded_by_its_own_limit() {
        let mut settings = Settings::default();
        settings.networking.max_concurrent_writes = 2;
        assert_eq!(most_writes_in_flight(settings).await, 2);
        let mut settings = Settings::default();
        settings.networking.max_concurrent_writes = 0;
        assert_eq!(
            most_writes_in_flight(settings).await,
            4,
            "the handlers' 4 slots, which writes share"
        );
    }

    /// The echo of our own last write (its event, the object as that write left it, or changed
    /// in the same version by someone else): the worker skips it when the cycle that wrote it said
    /// it would be quiet and the echo's essence matches, so a quiet echo must be exactly one whose
    /// cycle does nothing.
    #[tokio::test(start_paused = true)]
    async fn the_echo_of_a_finished_cause_is_skipped_only_when_its_cycle_would_do_nothing() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen), update(&seen)]).await;
        handling.create_widget(1).await;
        let cycle = handling.cycle(EventType::Added).await;
        seen.take();
        assert!(cycle.quiet_echo, "a cause done in one cycle");

        // The echo as the write left it: its essence is its diff-base, and its cycle does nothing.
        let echo = handling.get().await.unwrap();
        assert_eq!(stored(&echo, DIFF_BASE), Some(essence(1)));
        assert!(handling.processor.echo_changes_nothing(&echo));
        let quiet = handling
            .cycle_on(EventType::Modified, echo, true, None)
            .await;
        assert_eq!(quiet, Cycle::default());
        assert!(seen.take().is_empty());

        // The same version changed by another writer (as a mutating webhook changes our own
        // write): no match, and its cycle runs the update handler.
        handling.resize(2).await;
        let changed = handling.get().await.unwrap();
        assert!(!handling.processor.echo_changes_nothing(&changed));
        let cycle = handling
            .cycle_on(EventType::Modified, changed, true, None)
            .await;
        assert_eq!(
            seen.take(),
            [format!("update_fn update 0 {}->{}", essence(1), essence(2))]
        );
        assert!(cycle.quiet_echo);
        let echo = handling.get().await.unwrap();
        assert_eq!(stored(&echo, DIFF_BASE), Some(essence(2)));
        assert!(handling.processor.echo_changes_nothing(&echo));
        // A label is part of the essence too; a garbled diff-base is no match.
        let mut labelled = echo.clone();
        labelled
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("tier".into(), "web".into());
        assert!(!handling.processor.echo_changes_nothing(&labelled));
        let mut garbled = echo;
        garbled
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(DIFF_BASE.into(), "{not json".into());
        assert!(!handling.processor.echo_changes_nothing(&garbled));
    }

    /// No quiet echo where a cycle on the echo has work whatever it brings: a cause not done yet
    /// (a retry), a finalizer to add or to keep (a delete handler), handlers that read every
    /// event.
    #[tokio::test(start_paused = true)]
    async fn no_echo_is_quiet_where_its_cycle_has_work_whatever_it_brings() {
        let seen = Seen::default();
        let retrying = handler(
            &seen,
            On::id("create_fn"),
            Some(Reason::Create),
            1,
            Duration::from_secs(1),
        );
        let mut handling = Handling::new(vec![retrying]).await;
        handling.create_widget(1).await;
        let cycle = handling.cycle(EventType::Added).await;
        assert_eq!(seen.take().len(), 1, "the handler ran and failed");
        assert!(cycle.written != Written::Nothing, "its progress is written");
        assert!(!cycle.quiet_echo, "a retry is due");

        let mut handling = Handling::new(vec![create(&seen), delete(&seen)]).await;
        handling.create_widget(1).await;
        let adding = handling.cycle(EventType::Added).await;
        assert!(!adding.quiet_echo, "the finalizer is added first");
        let created = handling.cycle(EventType::Modified).await;
        assert!(created.written != Written::Nothing);
        assert!(!created.quiet_echo, "the finalizer holds the object");

        let events = Seen::default();
        let recorded = events.clone();
        let handlers = ResourceHandlers {
            changing: vec![create(&seen)],
            event: vec![EventHandler {
                id: "events".into(),
                selector: Selector::parse(WIDGETS),
                filters: Default::default(),
                param: None,
                func: handler_fn(move |ctx: Ctx| {
                    recorded.push(&ctx);
                    async { Ok(Value::Null) }
                }),
            }],
            ..ResourceHandlers::default()
        };
        let mut handling = Handling::with_handlers(handlers, Settings::default()).await;
        handling.create_widget(1).await;
        let cycle = handling.cycle(EventType::Added).await;
        assert!(cycle.written != Written::Nothing);
        assert!(!cycle.quiet_echo, "an event handler sees every event");
        seen.take();
    }

    #[tokio::test(start_paused = true)]
    async fn a_cause_finished_in_one_cycle_leaves_no_record_but_the_marker_of_a_custom_prefix() {
        // Kopf stores the records, then purges them in the same patch; what is left of the
        // store is a non-Kopf prefix's marker. kactor encodes no record for such a cycle.
        let seen = Seen::default();
        let mut settings = Settings::default();
        settings.persistence.prefix = "my-op.example.com".into();
        let mut handling = Handling::with_settings(vec![create(&seen)], settings).await;
        handling.create_widget(1).await;
        handling.cycle(EventType::Added).await;

        let object = handling.get().await.unwrap();
        let annotations = object.metadata.annotations.clone().unwrap_or_default();
        let ours: Vec<&str> = annotations
            .keys()
            .map(String::as_str)
            .filter(|k| k.starts_with("my-op.example.com/") || k.starts_with("kopf.zalando.org/"))
            .collect();
        assert_eq!(
            ours,
            [
                "my-op.example.com/kopf-managed",
                "my-op.example.com/last-handled-configuration"
            ]
        );
        assert_eq!(annotations["my-op.example.com/kopf-managed"], "yes");
        assert_eq!(object.data["status"]["create_fn"], json!({"size": 1}));
        assert!(
            object.data["status"].get("kopf").is_none(),
            "{}",
            object.data["status"]
        );
        assert_eq!(seen.take().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delete_handler_puts_the_finalizer_on_first_and_no_handler_runs_in_that_cycle() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen), delete(&seen)]).await;
        handling.create_widget(1).await;

        let cycle = handling.cycle(EventType::Added).await;
        let object = handling.get().await.unwrap();
        assert!(finalized(&object));
        assert_eq!(cycle.written, version(&object));
        assert_eq!(
            cycle.next,
            Next::Idle,
            "the finalizer's own event comes back"
        );
        assert!(
            seen.take().is_empty(),
            "no handler before the finalizer is on"
        );

        handling.cycle(EventType::Modified).await;
        assert_eq!(
            seen.take(),
            [format!("create_fn create 0 -->{}", essence(1))]
        );
    }

    /// A cycle on a body older than the object (an event still on its way when our own newer patch
    /// went out): its finalizer change meets the resourceVersion test and is refused. Nothing was
    /// written, and the cycle says so: taken as a write of unknown version, it made the worker count
    /// the version it waited for as superseded and skip its event, the last one, so the object
    /// waited for good (found at 2-3 % of objects with a daemon that returns at once).
    #[tokio::test(start_paused = true)]
    async fn a_change_refused_for_a_stale_body_writes_nothing_and_is_made_on_the_next_body() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen), delete(&seen)]).await;
        let stale = handling.create_widget(1).await;
        // Someone else's change makes the body the cycle gets stale.
        let label = json!({"metadata": {"labels": {"other": "change"}}});
        handling
            .widgets
            .patch("w1", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();

        let cycle = handling.cycle_on(EventType::Added, stale, true, None).await;
        assert_eq!(cycle.written, Written::Nothing, "{cycle:?}");
        let object = handling.get().await.unwrap();
        assert!(!finalized(&object), "the refused change is not there");

        // The next body (the change's event) gets it.
        let cycle = handling.cycle(EventType::Modified).await;
        let object = handling.get().await.unwrap();
        assert!(finalized(&object));
        assert_eq!(cycle.written, version(&object));
    }

    #[tokio::test(start_paused = true)]
    async fn an_inconsistent_body_makes_the_handlers_await_our_own_patch() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen)]).await;
        let body = handling.create_widget(1).await;

        let cycle = handling.cycle_on(EventType::Added, body, false, None).await;
        assert_eq!(
            cycle,
            Cycle {
                written: Written::Nothing,
                next: Next::AwaitOwnPatch,
                ..Default::default()
            }
        );
        assert!(seen.take().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_temporary_failure_is_retried_after_its_delay_to_the_microsecond() {
        let seen = Seen::default();
        let failing = handler(
            &seen,
            On::id("create_fn"),
            Some(Reason::Create),
            1,
            Duration::from_secs(7),
        );
        let mut handling = Handling::new(vec![failing]).await;
        handling.create_widget(1).await;

        // The failure: its progress is written, and the patch's event comes back first.
        let cycle = handling.cycle(EventType::Added).await;
        assert_eq!(cycle.next, Next::Idle, "the sleep is skipped for the patch");
        assert_eq!(
            seen.take(),
            [format!("create_fn create 0 -->{}", essence(1))]
        );
        let object = handling.get().await.unwrap();
        assert_eq!(
            progress_keys(&object),
            [CAUSE_BASE, "kopf.zalando.org/create_fn"]
        );
        let progress: Value =
            serde_json::from_str(annotation(&object, "kopf.zalando.org/create_fn").unwrap())
                .unwrap();
        assert_eq!(
            progress["delayed"], "2027-01-15T08:00:07.000000+00:00",
            "{progress}"
        );
        assert!(object.data["status"].get("create_fn").is_none());

        // Two seconds later the handler is still asleep: five seconds to go, nothing written.
        tokio::time::advance(Duration::from_secs(2)).await;
        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(
            cycle,
            Cycle {
                written: Written::Nothing,
                next: Next::RetryAfter(Duration::from_secs(5)),
                ..Default::default()
            }
        );
        assert!(seen.take().is_empty());

        // Once the delay has passed (the worker's touch brings the event), the retry succeeds.
        tokio::time::advance(Duration::from_secs(5)).await;
        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(cycle.next, Next::Idle);
        assert_eq!(
            seen.take(),
            [format!("create_fn create 1 -->{}", essence(1))]
        );
        let object = handling.get().await.unwrap();
        assert_eq!(object.data["status"]["create_fn"], json!({"size": 1}));
        assert!(progress_keys(&object).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_delay_is_slept_in_keepalive_intervals_of_ten_minutes() {
        let seen = Seen::default();
        let failing = handler(
            &seen,
            On::id("create_fn"),
            Some(Reason::Create),
            1,
            Duration::from_secs(3600),
        );
        let mut handling = Handling::new(vec![failing]).await;
        handling.create_widget(1).await;
        handling.cycle(EventType::Added).await;
        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(cycle.next, Next::RetryAfter(Duration::from_secs(600)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_update_gives_update_and_field_handlers_the_old_and_new_values() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen), update(&seen), field(&seen)]).await;
        handling.handled().await;
        assert_eq!(
            seen.take(),
            [
                format!("create_fn create 0 -->{}", essence(1)),
                "size/spec.size create 0 -->1".to_string(),
            ],
            "one handler per cycle"
        );

        handling.resize(2).await;
        let cycle = handling.settle().await;
        assert_eq!(cycle.next, Next::Idle);
        assert_eq!(
            seen.take(),
            [
                format!("update_fn update 0 {}->{}", essence(1), essence(2)),
                "size/spec.size update 0 1->2".to_string(),
            ]
        );
        let object = handling.get().await.unwrap();
        assert_eq!(object.data["status"]["size/spec.size"], json!({"size": 2}));
    }

    /// A creation whose create handler failed once (it retries after a second), beside a field
    /// handler on `spec.size`: after its first cycle.
    async fn creation_retrying(seen: &Seen) -> Handling {
        let slow = handler(
            seen,
            On::id("create_fn"),
            Some(Reason::Create),
            1,
            Duration::from_secs(1),
        );
        let mut handling = Handling::new(vec![slow, field(seen)]).await;
        handling.create_widget(1).await;
        handling.cycle(EventType::Added).await;
        handling
    }

    /// Crash consistency: a change made while the creation is still retrying is not absorbed into
    /// it. The creation ends with the diff-base it started from, so the change is an update after
    /// it, and the field handler sees the value the field settled on.
    #[tokio::test(start_paused = true)]
    async fn a_change_made_while_a_cause_is_retrying_is_handled_after_it() {
        let seen = Seen::default();
        let mut handling = creation_retrying(&seen).await;
        let object = handling.get().await.unwrap();
        assert_eq!(
            stored(&object, CAUSE_BASE),
            Some(essence(1)),
            "the creation's base is kept on the object, for a restart"
        );

        // The creation goes on: the field handler sees 1; then the change; then the retry of the
        // create handler, which sees 2 and ends the creation.
        handling.cycle(EventType::Modified).await;
        handling.resize(2).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        handling.cycle(EventType::Modified).await;
        let object = handling.get().await.unwrap();
        assert_eq!(
            stored(&object, DIFF_BASE),
            Some(essence(1)),
            "the creation leaves the essence it started from"
        );
        assert_eq!(annotation(&object, CAUSE_BASE), None);

        handling.settle().await;
        let seen = seen.take();
        assert_eq!(
            seen,
            [
                format!("create_fn create 0 -->{}", essence(1)),
                "size/spec.size create 0 -->1".to_string(),
                format!("create_fn create 1 -->{}", essence(2)),
                "size/spec.size update 0 1->2".to_string(),
            ],
            "the change is an update after the creation"
        );
        let object = handling.get().await.unwrap();
        assert_eq!(object.data["status"]["size/spec.size"], json!({"size": 2}));
    }

    /// The same across a restart: the new process has no memory of the cause, only what the
    /// object holds.
    #[tokio::test(start_paused = true)]
    async fn a_change_made_while_a_cause_is_retrying_is_handled_after_it_across_a_restart() {
        let seen = Seen::default();
        let mut handling = creation_retrying(&seen).await;
        handling.cycle(EventType::Modified).await;
        handling.resize(2).await;

        handling.memory = ObjectMemory::default();
        tokio::time::advance(Duration::from_secs(1)).await;
        handling.cycle(EventType::Listed).await;
        handling.settle().await;
        let seen = seen.take();
        assert_eq!(
            seen.last().unwrap(),
            "size/spec.size update 0 1->2",
            "{seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_runs_the_delete_handler_then_releases_the_finalizer_for_good() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen), delete(&seen)]).await;
        handling.handled().await;
        seen.take();

        handling
            .widgets
            .delete("w1", &DeleteParams::default())
            .await
            .unwrap();
        let deleting = handling.get().await.unwrap();
        assert!(deleting.metadata.deletion_timestamp.is_some());
        let cycle = handling
            .cycle_on(EventType::Modified, deleting, true, None)
            .await;
        assert_eq!(
            seen.take(),
            [format!("delete_fn delete 0 {}->{}", essence(1), essence(1))]
        );
        assert!(handling.get().await.is_none(), "the finalizer was released");
        match &cycle.written {
            Written::Version(rv) => assert!(rv.ends_with("~which~never~arrives"), "{rv}"),
            other => panic!("expected a version that never arrives, got {other:?}"),
        }
        assert_eq!(cycle.next, Next::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_keeps_the_finalizer_while_daemons_stop_and_releases_it_after() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![]).await;
        let deleting = handling.deleting().await;
        let decided = Arc::new(Mutex::new(Vec::new()));
        let view = |blocking: bool| recording(&decided, blocking);

        let cycle = handling
            .cycle_on(
                EventType::Modified,
                deleting.clone(),
                true,
                Some(view(true)),
            )
            .await;
        assert_eq!(
            cycle,
            Cycle {
                written: Written::Nothing,
                next: Next::AwaitDaemons,
                ..Default::default()
            }
        );
        assert!(finalized(&handling.get().await.unwrap()));
        let decision = decided.lock().unwrap().pop().unwrap();
        assert!(
            decision.deletion && decision.wanted.is_empty(),
            "{decision:?}"
        );

        // The last daemon stopped: the worker runs the cycle again, which lets the object go.
        let cycle = handling
            .cycle_on(EventType::Modified, deleting, true, Some(view(false)))
            .await;
        assert_eq!(cycle.next, Next::Idle);
        assert!(handling.get().await.is_none());
        assert!(seen.take().is_empty());
    }

    /// The log lines this thread writes from now on, as the formatter writes them (no colours).
    ///
    /// One subscriber for the whole test binary, sorting lines by the thread that wrote them
    /// (each test's cycles run on its own thread): a subscriber set for one thread alone missed
    /// lines now and then while other tests logged on theirs.
    fn captured_log() -> impl Fn() -> String {
        type Threads = Mutex<std::collections::HashMap<std::thread::ThreadId, Vec<u8>>>;
        static LINES: std::sync::OnceLock<Arc<Threads>> = std::sync::OnceLock::new();
        struct Lines(Arc<Threads>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let thread = std::thread::current().id();
                let mut lines = self.0.lock().unwrap();
                lines.entry(thread).or_default().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = LINES.get_or_init(|| {
            let lines = Arc::new(Threads::default());
            let writer = lines.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || Lines(writer.clone()))
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
            lines
        });
        let thread = std::thread::current().id();
        lines.lock().unwrap().remove(&thread);
        move || {
            let lines = lines.lock().unwrap();
            String::from_utf8_lossy(lines.get(&thread).map_or(&[][..], Vec::as_slice)).into_owned()
        }
    }

    /// A deletion's handlers ran while the object's daemons were still stopping: their records
    /// stay on the object until the daemons are gone, and the cycle that then releases the
    /// finalizer runs no handler again and does not report the deletion a second time.
    #[tokio::test(start_paused = true)]
    async fn a_deletion_waiting_for_its_daemons_is_reported_processed_once() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![delete(&seen)]).await;
        let deleting = handling.deleting().await;
        let decided = Arc::new(Mutex::new(Vec::new()));
        let log = captured_log();
        let processed = |log: &dyn Fn() -> String| {
            log()
                .lines()
                .filter(|line| line.contains("is processed"))
                .map(|line| {
                    line.split_once("Deletion")
                        .map_or(line, |(_, m)| m)
                        .to_owned()
                })
                .collect::<Vec<_>>()
        };

        let cycle = handling
            .cycle_on(
                EventType::Modified,
                deleting,
                true,
                Some(recording(&decided, true)),
            )
            .await;
        assert_eq!(seen.take().len(), 1, "the deletion handler ran");
        assert_eq!(cycle.next, Next::AwaitDaemons);
        let kept = handling.get().await.unwrap();
        assert!(finalized(&kept), "the finalizer waits for the daemons");
        assert_eq!(processed(&log), [" is processed: 1 succeeded; 0 failed."]);

        // The daemons are gone: the same object again, its records as the first cycle left them.
        let cycle = handling
            .cycle_on(
                EventType::Modified,
                kept,
                true,
                Some(recording(&decided, false)),
            )
            .await;
        assert_eq!(cycle.next, Next::Idle);
        assert!(handling.get().await.is_none(), "the finalizer was released");
        assert!(seen.take().is_empty(), "no handler ran again");
        assert_eq!(
            processed(&log),
            [" is processed: 1 succeeded; 0 failed."],
            "reported once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_object_is_written_nothing() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen), delete(&seen)]).await;
        let body = handling.create_widget(1).await;
        handling
            .widgets
            .delete("w1", &DeleteParams::default())
            .await
            .unwrap();
        let cycle = handling
            .cycle_on(EventType::Deleted, body, true, None)
            .await;
        assert_eq!(cycle, Cycle::default());
        assert!(seen.take().is_empty());
    }

    /// Sharding: a handover asked for (the drain label) while an update handler ran. That cycle's
    /// write is rejected by the fence and kept; the next cycle stops the daemons first (and waits
    /// for them), then writes what was kept and removes both labels, behind the handover's fence.
    /// A move is no change: the next owner's first cycle runs no handler.
    #[tokio::test(start_paused = true)]
    async fn a_handover_stops_the_daemons_first_and_carries_what_the_fence_kept_out() {
        const OWNER: &str = "shard.kactor.dev/ring";
        const DRAIN: &str = "drain.kactor.dev/ring";
        let seen = Seen::default();
        let sharded = |member: &str| Settings {
            shard: Some(Shard::new("ring", member).unwrap()),
            ..Settings::default()
        };
        let mut handling =
            Handling::with_settings(vec![create(&seen), update(&seen)], sharded("me")).await;
        let mut body = serde_json::from_value::<DynamicObject>(samples::widget("w1", 1)).unwrap();
        body.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(OWNER.into(), "me".into());
        handling
            .widgets
            .create(&PostParams::default(), &body)
            .await
            .unwrap();
        handling.cycle(EventType::Added).await;
        handling.settle().await;
        assert_eq!(seen.take().len(), 1, "created");
        let label = |handling: &Handling, labels: Value| {
            let widgets = handling.widgets.clone();
            async move {
                let patch = json!({"metadata": {"labels": labels}});
                widgets
                    .patch("w1", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        };

        // The update's cycle runs on the body from before the drain label.
        handling.resize(2).await;
        let before_drain = handling.get().await.unwrap();
        label(&handling, json!({ DRAIN: "true" })).await;
        let cycle = handling
            .cycle_on(EventType::Modified, before_drain, true, None)
            .await;
        assert_eq!(cycle.written, Written::Nothing, "the fence kept it out");
        assert_eq!(seen.take().len(), 1, "the update handler ran");
        let object = handling.get().await.unwrap();
        assert!(
            object.data["status"].get("update_fn").is_none(),
            "{object:?}"
        );
        assert!(handling.memory.handover.is_some(), "kept for the handover");

        // The handover: the daemons stop first, and the cycle waits for them.
        let decided = Arc::new(Mutex::new(Vec::new()));
        let view = |blocking: bool| recording(&decided, blocking);
        let draining = handling.get().await.unwrap();
        let cycle = handling
            .cycle_on(
                EventType::Modified,
                draining.clone(),
                true,
                Some(view(true)),
            )
            .await;
        assert_eq!(cycle.next, Next::AwaitDaemons);
        let decision = decided.lock().unwrap().pop().unwrap();
        assert!(
            decision.draining && decision.wanted.is_empty(),
            "{decision:?}"
        );
        assert_eq!(
            handling.get().await.unwrap().metadata.resource_version,
            draining.metadata.resource_version
        );

        // They stopped: what was kept, then both labels gone; no handler ran.
        let cycle = handling
            .cycle_on(EventType::Modified, draining, true, Some(view(false)))
            .await;
        assert_eq!(cycle, Cycle::default());
        assert!(seen.take().is_empty());
        assert!(handling.memory.handover.is_none());
        let handed = handling.get().await.unwrap();
        assert!(
            handed
                .metadata
                .labels
                .as_ref()
                .is_none_or(|l| !l.contains_key(OWNER) && !l.contains_key(DRAIN)),
            "{handed:?}"
        );
        assert_eq!(handed.data["status"]["update_fn"], json!({"size": 2}));
        assert_eq!(stored(&handed, DIFF_BASE), Some(essence(2)));

        // The next owner (labelled for it by the assigner) resumes it: nothing to do.
        label(&handling, json!({ OWNER: "next" })).await;
        handling.processor = handling.processor_for(sharded("next"));
        handling.memory = ObjectMemory::default();
        let cycle = handling.cycle(EventType::Listed).await;
        assert_eq!(cycle.written, Written::Nothing);
        assert!(seen.take().is_empty(), "a move is no change");
    }

    /// Sharding: when a newer event shows the object leaving (the worker sets the flag), the cycle
    /// starts no more handlers: they are the next owner's.
    #[tokio::test(start_paused = true)]
    async fn a_cycle_starts_no_handler_once_its_object_is_leaving() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen)]).await;
        let body = handling.create_widget(1).await;
        let departing = Arc::new(kactor_reactor::sharding::Leaving::default());
        departing.set(true);
        let event = Event {
            departing: Some(departing.clone()),
            ..arriving(EventType::Added, body)
        };
        handling
            .processor
            .process(event, &mut handling.memory)
            .await
            .unwrap();
        assert!(seen.take().is_empty(), "no handler started");
        let object = handling.get().await.unwrap();
        assert!(
            object.data["status"].get("create_fn").is_none(),
            "{object:?}"
        );

        // Not leaving: the handler runs.
        departing.set(false);
        handling.cycle(EventType::Modified).await;
        assert_eq!(seen.take().len(), 1);
    }

    /// Sharding: a cycle waiting for a handler slot (every slot taken) when its object leaves starts
    /// no handler, even once slots come free; it only writes what it has (behind the fence).
    #[tokio::test(start_paused = true)]
    async fn a_cycle_waiting_for_a_slot_stops_waiting_when_its_object_leaves() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen)]).await;
        let body = handling.create_widget(1).await;
        let slots = handling.take_every_slot().await;
        let leaving = Arc::new(kactor_reactor::sharding::Leaving::default());
        let event = Event {
            departing: Some(leaving.clone()),
            ..arriving(EventType::Added, body)
        };
        let started = Instant::now();
        let (cycle, ()) = tokio::join!(
            handling.processor.process(event, &mut handling.memory),
            async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                leaving.set(true);
                // The slots free up later: what the cycle writes waits for one, as every write.
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop(slots);
            }
        );
        cycle.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(4));
        assert!(
            seen.take().is_empty(),
            "no handler started, though slots came free"
        );
    }

    /// Sharding, a replica's tenure (its membership's renew deadline): the settings of the
    /// replica "me", its tenure held for 10 s from now, and the widget labelled for it.
    async fn sharded_for_ten_seconds(
        changing: Vec<ChangingHandler>,
    ) -> (Handling, kactor_reactor::sharding::Tenure) {
        let shard = Shard::new("ring", "me").unwrap();
        let tenure = shard.tenure().clone();
        tenure.hold_until(Instant::now() + Duration::from_secs(10));
        let settings = Settings {
            shard: Some(shard),
            ..Settings::default()
        };
        let handling = Handling::with_settings(changing, settings).await;
        let mut body = serde_json::from_value::<DynamicObject>(samples::widget("w1", 1)).unwrap();
        body.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("shard.kactor.dev/ring".into(), "me".into());
        handling
            .widgets
            .create(&PostParams::default(), &body)
            .await
            .unwrap();
        (handling, tenure)
    }

    /// Sharding: a replica frozen past its renew deadline runs its queued events when it thaws,
    /// before the member's pause reaches its workers; its objects may have moved meanwhile. Its
    /// tenure has lapsed by the clock, so the cycle starts nothing and writes nothing, and asks to
    /// look again later (the pause, when it comes, cancels that). Renewed, the same event runs.
    #[tokio::test(start_paused = true)]
    async fn a_replica_whose_membership_lapsed_starts_no_cycle_until_it_is_renewed() {
        let seen = Seen::default();
        let (mut handling, tenure) = sharded_for_ten_seconds(vec![create(&seen)]).await;
        let created = handling.get().await.unwrap();

        tokio::time::sleep(Duration::from_secs(10)).await; // frozen, then thawed
        let cycle = handling.cycle(EventType::Added).await;
        assert_eq!(
            cycle,
            Cycle {
                wake: Some(kactor_reactor::processing::LAPSED_RECHECK),
                ..Cycle::default()
            }
        );
        assert!(seen.take().is_empty(), "no handler started");
        assert_eq!(
            handling.get().await.unwrap().metadata.resource_version,
            created.metadata.resource_version,
            "nothing written, not even the finalizer"
        );

        tenure.hold_until(Instant::now() + Duration::from_secs(10));
        handling.cycle(EventType::Added).await;
        handling.settle().await;
        assert_eq!(seen.take().len(), 1, "renewed: the handler runs");
        let object = handling.get().await.unwrap();
        assert_eq!(object.data["status"]["create_fn"], json!({"size": 1}));
    }

    /// Sharding: a cycle that waited for a handler slot past its replica's renew deadline (frozen
    /// meanwhile, or starved) starts no handler once it gets one. The handler stays due: the
    /// cycle writes its progress (behind the fence) and nothing else, and once the Lease is
    /// renewed the next cycle runs it (or, had the object moved, the next owner would).
    #[tokio::test(start_paused = true)]
    async fn a_cycle_whose_membership_lapses_while_it_waits_for_a_slot_starts_no_handler() {
        let seen = Seen::default();
        let (mut handling, tenure) = sharded_for_ten_seconds(vec![create(&seen)]).await;
        let slots = handling.take_every_slot().await;
        let body = handling.get().await.unwrap();
        let (cycle, ()) = tokio::join!(
            handling.cycle_on(EventType::Added, body, true, None),
            async {
                tokio::time::sleep(Duration::from_secs(11)).await;
                drop(slots);
            }
        );
        assert!(
            seen.take().is_empty(),
            "no handler started after the deadline"
        );
        let object = handling.get().await.unwrap();
        assert!(
            object.data["status"].get("create_fn").is_none(),
            "{object:?}"
        );
        // The handler's progress (started, not done) is what the cycle wrote: that version's
        // event starts the next cycle, which runs the handler.
        assert_eq!(cycle.written, version(&object));
        assert_eq!(cycle.next, Next::Idle);
        let record: Value =
            serde_json::from_str(annotation(&object, "kopf.zalando.org/create_fn").unwrap())
                .unwrap();
        assert_eq!(
            (&record["success"], &record["retries"]),
            (&json!(false), &json!(0)),
            "{record}"
        );

        tenure.hold_until(Instant::now() + Duration::from_secs(10));
        handling.cycle(EventType::Modified).await;
        handling.settle().await;
        assert_eq!(seen.take().len(), 1, "renewed: the handler runs");
    }

    /// An API failure that outlives the retries fails the cycle after exactly the backoffs
    /// (`networking.error_backoffs`); the worker throttles the object then. Nothing is lost: the
    /// next cycle runs the handler again and its result lands.
    #[tokio::test(start_paused = true)]
    async fn an_api_failure_that_outlives_its_retries_fails_the_cycle_after_the_backoffs() {
        let seen = Seen::default();
        let mut settings = Settings::default();
        settings.networking.error_backoffs = vec![Duration::from_secs(1), Duration::from_secs(2)];
        let mut handling = Handling::with_settings(vec![create(&seen)], settings).await;
        let body = handling.create_widget(1).await;
        handling
            .emulator
            .faults()
            .fail(Failure::new(500).verb("patch").times(3));

        let started = Instant::now();
        let error = handling
            .try_cycle_on(EventType::Added, body, true, None)
            .await
            .expect_err("three answers of 500 outlive two retries");
        assert_eq!(started.elapsed(), Duration::from_secs(3), "1 s, then 2 s");
        assert!(error.to_string().contains("500"), "{error}");
        assert_eq!(seen.take().len(), 1);

        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(cycle.next, Next::Idle);
        assert_eq!(
            seen.take().len(),
            1,
            "run again: its first success was not stored"
        );
        let object = handling.get().await.unwrap();
        assert_eq!(object.data["status"]["create_fn"], json!({"size": 1}));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_resumes_a_handled_object_once_per_process() {
        let seen = Seen::default();
        let resume = handler(&seen, On::id("resume_fn"), None, 0, Duration::ZERO);
        let mut handling = Handling::new(vec![create(&seen), resume]).await;
        handling.handled().await;
        seen.take();

        // A new process lists the object: unchanged since it was handled.
        handling.memory = ObjectMemory::default();
        handling.cycle(EventType::Listed).await;
        let resumed = seen.take();
        assert_eq!(resumed.len(), 1, "{resumed:?}");
        assert!(resumed[0].starts_with("resume_fn resume 0"), "{resumed:?}");
        handling.settle().await;

        // Listed again in the same process (a relist): no second resume.
        handling.cycle(EventType::Listed).await;
        assert!(seen.take().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_outside_the_essence_runs_nothing_and_writes_nothing() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![create(&seen), update(&seen)]).await;
        handling.handled().await;
        seen.take();

        let patch = json!({"status": {"elsewhere": true}});
        handling
            .widgets
            .patch_status("w1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(cycle, Cycle::default());
        assert!(seen.take().is_empty());
    }

    /// The field changes mid-cause and back again: the field handler saw the intermediate value, so
    /// the change back to where the cause started is an update after it (the diff-base keeps, per
    /// field handler, what it last saw). Found by the chaos test: 9 seen, 1 final, never handled.
    #[tokio::test(start_paused = true)]
    async fn a_field_changed_mid_cause_and_back_is_handled_after_it() {
        let seen = Seen::default();
        let mut handling = creation_retrying(&seen).await;
        handling.resize(9).await;
        // The field handler's turn: it sees 9.
        handling.cycle(EventType::Modified).await;
        let object = handling.get().await.unwrap();
        assert_eq!(
            stored(&object, CAUSE_BASE),
            Some(essence(9)),
            "what the field handler saw is kept with the cause"
        );
        handling.resize(1).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        // The create handler's retry ends the creation; then the update.
        handling.settle().await;
        let seen = seen.take();
        assert_eq!(
            seen,
            [
                format!("create_fn create 0 -->{}", essence(1)),
                "size/spec.size create 0 -->9".to_string(),
                format!("create_fn create 1 -->{}", essence(1)),
                "size/spec.size update 0 9->1".to_string(),
            ],
        );
        let object = handling.get().await.unwrap();
        assert_eq!(object.data["status"]["size/spec.size"], json!({"size": 1}));
        assert_eq!(stored(&object, DIFF_BASE), Some(essence(1)));
    }

    /// What a reconcile handler does on each run, in order (the last one again when they run out),
    /// and what it saw: `retry related requeued deleting`.
    #[derive(Clone, Default)]
    struct Script {
        steps: Arc<Mutex<std::collections::VecDeque<Step>>>,
        seen: Seen,
    }

    #[derive(Clone, Copy)]
    enum Step {
        Ok(Option<Duration>),
        Fail,
    }

    impl Script {
        fn new(steps: &[Step]) -> Script {
            let script = Script::default();
            script.steps.lock().unwrap().extend(steps.iter().copied());
            script
        }

        fn handler(&self, options: Reconcile) -> ReconcileHandler {
            let script = self.clone();
            let func = reconcile_fn(move |ctx: Ctx| {
                let step = {
                    let mut steps = script.steps.lock().unwrap();
                    if steps.len() > 1 {
                        steps.pop_front()
                    } else {
                        steps.front().copied()
                    }
                };
                let triggers = ctx.triggers();
                script.seen.0.lock().unwrap().push(format!(
                    "{} {} {} {}",
                    ctx.retry(),
                    triggers.related.len(),
                    triggers.requeued,
                    ctx.meta().deletion_timestamp.is_some(),
                ));
                async move {
                    match step {
                        Some(Step::Ok(Some(after))) => Ok(Action::requeue(after)),
                        Some(Step::Ok(None)) | None => Ok(Action::await_change()),
                        Some(Step::Fail) => Err(HandlerError::msg("the cache is not warm")),
                    }
                }
            });
            ReconcileHandler {
                selector: Selector::parse(WIDGETS),
                options,
                func,
            }
        }

        fn runs(&self) -> Vec<String> {
            self.seen.take()
        }
    }

    async fn reconciling(handler: ReconcileHandler) -> Handling {
        let handlers = ResourceHandlers {
            reconcile: vec![handler],
            ..ResourceHandlers::default()
        };
        Handling::with_handlers(handlers, Settings::default()).await
    }

    impl Handling {
        /// A cycle for a requeue or a related change: on the object as it is now, with no watch
        /// event.
        async fn triggered(&mut self, triggers: Triggers) -> Cycle {
            let body = self.get().await.expect("the object exists");
            let event = Event {
                synthetic: true,
                triggers,
                ..arriving(EventType::Modified, body)
            };
            self.processor
                .process(event, &mut self.memory)
                .await
                .unwrap()
        }

        /// Triggers telling of an event of the owned ConfigMap `w1`, at `version`.
        async fn config_map_changed(&self, event: EventType, version: Option<&str>) -> Triggers {
            let resources = kactor_reactor::discovery::scan(&self.emulator.in_process_client())
                .await
                .unwrap();
            let config_maps = Selector::parse("configmaps")
                .resolve(&resources)
                .unwrap()
                .clone();
            let mut triggers = Triggers::default();
            triggers.add(Trigger::Related(Related {
                resource: Arc::new(config_maps),
                namespace: Some("default".into()),
                name: "w1".into(),
                event,
                owned: true,
                version: version.map(String::from),
            }));
            triggers
        }

        async fn requeued(&mut self) -> Cycle {
            self.triggered(Triggers {
                requeued: true,
                ..Triggers::default()
            })
            .await
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_error_backs_off_exponentially_and_a_success_resets_it() {
        use Step::{Fail, Ok as Done};
        let script = Script::new(&[Fail, Fail, Fail, Done(None), Fail, Done(None)]);
        let mut h = reconciling(script.handler(Reconcile::id("r"))).await;
        h.create_widget(1).await;
        // 5 ms, 10 ms, 20 ms (controller-runtime's 5 ms doubling), each asked as the wake.
        assert_eq!(h.cycle(EventType::Added).await.wake, Some(MS(5)));
        for delay in [10, 20] {
            tokio::time::advance(MS(delay / 2)).await;
            assert_eq!(h.requeued().await.wake, Some(MS(delay)));
        }
        // Early: nothing runs, and the wake is what is left.
        tokio::time::advance(MS(15)).await;
        assert_eq!(h.requeued().await.wake, Some(MS(5)));
        tokio::time::advance(MS(5)).await;
        assert_eq!(h.requeued().await.wake, None, "succeeded: await a change");
        assert_eq!(
            script.runs(),
            [
                "0 0 false false",
                "1 0 true false",
                "2 0 true false",
                "3 0 true false"
            ]
        );
        // The next error starts from 5 ms again.
        h.resize(2).await;
        assert_eq!(h.cycle(EventType::Modified).await.wake, Some(MS(5)));
        tokio::time::advance(MS(5)).await;
        assert_eq!(h.requeued().await.wake, None);
        assert_eq!(script.runs(), ["0 0 false false", "1 0 true false"]);
        // Nothing was written for it: no progress, no diff-base, no finalizer.
        let object = h.get().await.unwrap();
        assert!(object
            .metadata
            .annotations
            .as_ref()
            .is_none_or(std::collections::BTreeMap::is_empty));
        assert!(!finalized(&object));
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_comes_due_and_a_change_runs_the_handler_sooner() {
        let script = Script::new(&[Step::Ok(Some(Duration::from_secs(30)))]);
        let mut h = reconciling(script.handler(Reconcile::id("r"))).await;
        h.create_widget(1).await;
        assert_eq!(
            h.cycle(EventType::Added).await.wake,
            Some(Duration::from_secs(30))
        );
        // The same body again (a bookmark's relist, a pause's): nothing runs.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            h.cycle(EventType::Modified).await.wake,
            Some(Duration::from_secs(20))
        );
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(h.requeued().await.wake, Some(Duration::from_secs(30)));
        // A change 5 s later runs it at once, and asks the requeue anew.
        tokio::time::advance(Duration::from_secs(5)).await;
        h.resize(3).await;
        assert_eq!(
            h.cycle(EventType::Modified).await.wake,
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            script.runs(),
            ["0 0 false false", "0 0 true false", "0 0 false false"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_generation_predicate_ignores_status_updates_but_not_related_changes() {
        let script = Script::new(&[Step::Ok(None)]);
        let options = Reconcile::id("r")
            .predicate(Predicate::generation_changed())
            .owns("deployments.v1.apps");
        let mut h = reconciling(script.handler(options)).await;
        h.create_widget(1).await;
        h.cycle(EventType::Added).await;
        let status = json!({"status": {"nodes": ["a"]}});
        h.widgets
            .patch_status("w1", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        h.cycle(EventType::Modified).await;
        assert_eq!(
            script.runs(),
            ["0 0 false false"],
            "a status update is ignored"
        );
        h.resize(5).await;
        h.cycle(EventType::Modified).await;
        let mut triggers = Triggers::default();
        let deployments = Resource::namespaced("apps", "v1", "Deployment", "deployments");
        let related = |resource: Resource| {
            Trigger::Related(Related {
                resource: Arc::new(resource),
                namespace: Some("default".into()),
                name: "w1".into(),
                event: EventType::Deleted,
                owned: true,
                version: None,
            })
        };
        // Of a kind the handler does not own: not its trigger.
        triggers.add(related(Resource {
            plural: "statefulsets".into(),
            kind: "StatefulSet".into(),
            ..deployments.clone()
        }));
        h.triggered(triggers).await;
        assert_eq!(script.runs(), ["0 0 false false"], "the spec change only");
        let mut triggers = Triggers::default();
        triggers.add(related(deployments));
        h.triggered(triggers).await;
        assert_eq!(script.runs(), ["0 1 false false"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_finalizer_holds_the_object_until_a_run_during_deletion_succeeds() {
        use Step::{Fail, Ok as Done};
        let script = Script::new(&[Done(None), Fail, Done(None)]);
        let mut h = reconciling(script.handler(Reconcile::id("r").finalizer())).await;
        h.create_widget(1).await;
        h.cycle(EventType::Added).await;
        assert!(finalized(&h.get().await.unwrap()), "the finalizer is added");
        assert_eq!(
            script.runs(),
            Vec::<String>::new(),
            "nothing runs before the finalizer is on the object"
        );
        h.settle().await;
        assert_eq!(
            script.runs(),
            ["0 0 false false"],
            "on the finalizer's event"
        );
        h.widgets
            .delete("w1", &DeleteParams::default())
            .await
            .unwrap();
        // The run during the deletion fails: the finalizer stays, a retry is due in 5 ms.
        let cycle = h.cycle(EventType::Modified).await;
        assert_eq!(cycle.wake, Some(MS(5)));
        assert!(finalized(&h.get().await.unwrap()));
        tokio::time::advance(MS(5)).await;
        h.requeued().await;
        assert!(
            h.get().await.is_none(),
            "cleaned up: the finalizer went, and the object"
        );
        // The deletion's run, and its retry.
        assert_eq!(script.runs(), ["0 0 false true", "1 0 true true"]);
    }

    /// A handler with cleanup waits for the finalizer's own event, and is given then what triggered
    /// it in the cycle that added the finalizer: what it makes exists only once the object cannot
    /// go without its cleanup (a crash in between would leave children with no finalizer).
    #[tokio::test(start_paused = true)]
    async fn a_handler_with_cleanup_first_runs_on_the_finalizers_event_with_what_triggered_it() {
        let script = Script::new(&[Step::Ok(None)]);
        let options = Reconcile::id("r").finalizer().owns("configmaps");
        let mut h = reconciling(script.handler(options)).await;
        h.create_widget(1).await;
        let triggers = h.config_map_changed(EventType::Deleted, None).await;
        let cycle = h.triggered(triggers).await;
        assert_ne!(cycle.written, Written::Nothing, "the finalizer's patch");
        assert!(finalized(&h.get().await.unwrap()));
        assert_eq!(script.runs(), Vec::<String>::new());
        h.settle().await;
        assert_eq!(
            script.runs(),
            ["0 1 false false"],
            "one run, told of the child's deletion"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_is_given_the_changes_that_triggered_the_failed_run() {
        use Step::{Fail, Ok as Done};
        let script = Script::new(&[Done(None), Fail, Done(None)]);
        let mut h = reconciling(script.handler(Reconcile::id("r").owns("configmaps"))).await;
        h.create_widget(1).await;
        h.cycle(EventType::Added).await;
        let triggers = h.config_map_changed(EventType::Modified, Some("1")).await;
        assert_eq!(h.triggered(triggers).await.wake, Some(MS(5)));
        tokio::time::advance(MS(5)).await;
        assert_eq!(h.requeued().await.wake, None);
        // The retry saw the ConfigMap's change again, and the requeue that brought it.
        assert_eq!(
            script.runs(),
            ["0 0 false false", "0 1 false false", "1 1 true false"]
        );
    }
    /// A create handler with two sub-handlers, `a` and `b`; `b` fails temporarily (7 s) at
    /// its first attempt. Each records what it saw.
    fn with_subhandlers(seen: &Seen) -> ChangingHandler {
        let seen = seen.clone();
        let func = handler_fn(move |ctx: Ctx| {
            seen.push(&ctx);
            for id in ["a", "b"] {
                let seen = seen.clone();
                ctx.subhandler(id, move |ctx: Ctx| {
                    seen.push(&ctx);
                    async move {
                        if ctx.id() == "create_fn/b" && ctx.retry() == 0 {
                            return Err(HandlerError::temporary("not yet", Duration::from_secs(7)));
                        }
                        Ok(json!({"item": ctx.id()}))
                    }
                });
            }
            async move { Ok(json!({"items": 2})) }
        });
        ChangingHandler::register(
            Selector::parse(WIDGETS),
            On::id("create_fn"),
            Some(Reason::Create),
            func,
        )
    }

    fn record(object: &DynamicObject, id: &str) -> Value {
        let key = format!("kopf.zalando.org/{}", id.replace('/', "."));
        let text = annotation(object, &key).unwrap_or_else(|| panic!("no record {key}"));
        serde_json::from_str(text).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn sub_handlers_run_one_per_cycle_and_their_parent_finishes_after_the_last() {
        let seen = Seen::default();
        let mut handling = Handling::new(vec![with_subhandlers(&seen)]).await;
        handling.create_widget(1).await;
        let created = format!("create -->{}", essence(1));

        // The first cycle: the parent registers both; the lifecycle runs `a`.
        handling.cycle(EventType::Added).await;
        assert_eq!(
            seen.take(),
            [
                format!("create_fn create 0 -->{}", essence(1)),
                format!("create_fn/a {created}").replacen("create -", "create 0 -", 1),
            ]
        );
        let object = handling.get().await.unwrap();
        // Kopf's records: the parent unfinished, due at once, with the children's ids.
        assert_eq!(
            record(&object, "create_fn"),
            json!({
                "started": "2027-01-15T08:00:00.000000+00:00",
                "delayed": "2027-01-15T08:00:00.000000+00:00",
                "purpose": "create",
                "retries": 1,
                "success": false,
                "failure": false,
                "message": "None",
                "subrefs": ["create_fn/a", "create_fn/b"],
            })
        );
        let a = record(&object, "create_fn/a");
        assert_eq!(
            (a["success"].clone(), a["retries"].clone()),
            (json!(true), json!(1))
        );
        let b = record(&object, "create_fn/b");
        assert_eq!(
            (b["success"].clone(), b["retries"].clone()),
            (json!(false), json!(0))
        );
        assert_eq!(
            object.data["status"]["create_fn/a"],
            json!({"item": "create_fn/a"})
        );
        assert!(object.data["status"].get("create_fn").is_none());
        assert_eq!(stored(&object, DIFF_BASE), None, "the cause is not done");

        // The second: `a` is done and not run again; `b` fails for 7 s, and so waits its parent.
        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(
            seen.take(),
            [
                format!("create_fn create 1 -->{}", essence(1)),
                format!("create_fn/b create 0 -->{}", essence(1)),
            ]
        );
        assert_eq!(cycle.next, Next::Idle, "its own patch's event comes first");
        let object = handling.get().await.unwrap();
        assert_eq!(
            record(&object, "create_fn")["delayed"],
            "2027-01-15T08:00:07.000000+00:00"
        );
        let cycle = handling.cycle(EventType::Modified).await;
        assert_eq!(cycle.next, Next::RetryAfter(Duration::from_secs(7)));
        assert!(seen.take().is_empty(), "nothing is due yet");

        // After the delay: `b` succeeds, so does the parent; every record is purged.
        tokio::time::advance(Duration::from_secs(7)).await;
        handling.cycle(EventType::Modified).await;
        assert_eq!(
            seen.take(),
            [
                format!("create_fn create 2 -->{}", essence(1)),
                format!("create_fn/b create 1 -->{}", essence(1)),
            ]
        );
        let object = handling.get().await.unwrap();
        assert!(
            progress_keys(&object).is_empty(),
            "{:?}",
            progress_keys(&object)
        );
        assert_eq!(object.data["status"]["create_fn"], json!({"items": 2}));
        assert_eq!(
            object.data["status"]["create_fn/b"],
            json!({"item": "create_fn/b"})
        );
        assert_eq!(stored(&object, DIFF_BASE), Some(essence(1)));
        assert_eq!(handling.settle().await, Cycle::default());
        assert!(seen.take().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn sub_handlers_nest_and_every_ancestor_lists_their_ids() {
        let seen = Seen::default();
        let inner = seen.clone();
        let func = handler_fn(move |ctx: Ctx| {
            inner.push(&ctx);
            let seen = inner.clone();
            ctx.subhandler("child", move |ctx: Ctx| {
                seen.push(&ctx);
                let seen = seen.clone();
                async move {
                    let leaf = seen.clone();
                    ctx.subhandler("leaf", move |ctx: Ctx| {
                        leaf.push(&ctx);
                        async move {
                            if ctx.retry() == 0 {
                                return Err(HandlerError::temporary("once", Duration::ZERO));
                            }
                            Ok(())
                        }
                    });
                    // Explicitly: the parent's code after it runs only once they are done.
                    ctx.execute().await?;
                    seen.0.lock().unwrap().push("child after its leaf".into());
                    Ok(())
                }
            });
            async move { Ok(()) }
        });
        let parent = ChangingHandler::register(
            Selector::parse(WIDGETS),
            On::id("create_fn"),
            Some(Reason::Create),
            func,
        );
        let mut handling = Handling::new(vec![parent]).await;
        handling.create_widget(1).await;
        handling.cycle(EventType::Added).await;
        let object = handling.get().await.unwrap();
        assert_eq!(
            record(&object, "create_fn")["subrefs"],
            json!(["create_fn/child", "create_fn/child/leaf"])
        );
        assert_eq!(
            record(&object, "create_fn/child")["subrefs"],
            json!(["create_fn/child/leaf"])
        );
        assert_eq!(record(&object, "create_fn/child/leaf")["retries"], json!(1));
        handling.settle().await;
        let ids: Vec<String> = seen
            .take()
            .into_iter()
            .map(|line| line.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(
            ids,
            [
                "create_fn create",
                "create_fn/child create",
                "create_fn/child/leaf create",
                "create_fn create",
                "create_fn/child create",
                "create_fn/child/leaf create",
                "child after",
            ]
        );
        let object = handling.get().await.unwrap();
        assert!(
            progress_keys(&object).is_empty(),
            "{:?}",
            progress_keys(&object)
        );
        assert_eq!(stored(&object, DIFF_BASE), Some(essence(1)));
    }
    #[tokio::test(start_paused = true)]
    async fn a_sub_handler_whose_filters_do_not_match_neither_runs_nor_holds_its_parent() {
        let seen = Seen::default();
        let inner = seen.clone();
        let func = handler_fn(move |ctx: Ctx| {
            inner.push(&ctx);
            let (matching, other) = (inner.clone(), inner.clone());
            ctx.subhandler(On::id("matching").label("app", "demo"), move |ctx: Ctx| {
                matching.push(&ctx);
                async move { Ok(()) }
            });
            ctx.subhandler(On::id("other").when(|_| false), move |ctx: Ctx| {
                other.push(&ctx);
                async move { Ok(()) }
            });
            // The same id again is refused: the first registration runs, once.
            ctx.subhandler("matching", |_| async {
                if true {
                    panic!("a second registration must not run");
                }
                Ok(())
            });
            async move { Ok(()) }
        });
        let parent = ChangingHandler::register(
            Selector::parse(WIDGETS),
            On::id("create_fn"),
            Some(Reason::Create),
            func,
        );
        let mut handling = Handling::new(vec![parent]).await;
        handling.create_widget(1).await;
        handling.cycle(EventType::Added).await;
        let ids: Vec<String> = seen
            .take()
            .into_iter()
            .map(|line| line.split(' ').next().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["create_fn", "create_fn/matching"]);
        let object = handling.get().await.unwrap();
        assert!(
            progress_keys(&object).is_empty(),
            "{:?}",
            progress_keys(&object)
        );
        assert_eq!(stored(&object, DIFF_BASE), Some(essence(1)));
    }
}
