//! Daemons and timers of one object, with paused (deterministic) time: every option, every stopping
//! stage and reason, filter changes, and the object's deletion waiting for its daemons.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use kactor_actors::daemons::{DaemonEnv, ObjectDaemons, PatchSink, Report, Stage};
use kactor_actors::tracker::Tracker;
use kactor_reactor::daemons::{Daemon, SpawningKind, StopReason, Timer};
use kactor_reactor::handlers::{
    handler_fn, Ctx, HandlerError, Memo, Options, ResourceHandlers, Spawning, SpawningHandler,
};
use kactor_reactor::observe::Observer;
use kactor_reactor::patches::{Applied, ApplyError, Changes};
use kactor_reactor::posting::EventPoster;
use kactor_reactor::processing::SpawnDecision;
use kactor_reactor::resources::{Resource, Selector};
use kactor_reactor::sharding::Tenure;
use kactor_reactor::watching::EventType;
use kube::api::DynamicObject;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

fn resource() -> Resource {
    Resource {
        group: "example.com".into(),
        version: "v1".into(),
        plural: "widgets".into(),
        kind: "Widget".into(),
        singular: "widget".into(),
        short_names: vec![],
        categories: vec![],
        namespaced: true,
        preferred: true,
        verbs: vec![],
        subresources: vec!["status".into()],
    }
}

fn body(spec: Value) -> Arc<DynamicObject> {
    let mut object = DynamicObject::new("w1", &resource().api_resource()).within("default");
    object.metadata.uid = Some("uid-1".into());
    object.metadata.resource_version = Some("1".into());
    object.data = json!({ "spec": spec });
    Arc::new(object)
}

/// What the sink received, and how many of the next patches fail.
#[derive(Default)]
struct Sink {
    applied: Mutex<Vec<Value>>,
    failures: AtomicUsize,
}

impl PatchSink for Sink {
    fn apply(
        &self,
        _: Arc<DynamicObject>,
        changes: Changes,
    ) -> BoxFuture<'_, Result<Applied, ApplyError>> {
        async move {
            if self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let status = kube::core::Status::failure("injected", "Injected").with_code(503);
                return Err(ApplyError::Api {
                    what: "the object",
                    source: kube::Error::Api(status.boxed()),
                });
            }
            self.applied
                .lock()
                .unwrap()
                .push(Value::Object(changes.merge));
            Ok(Applied::default())
        }
        .boxed()
    }
}

/// What the observer saw.
#[derive(Default)]
struct Observed {
    started: AtomicUsize,
    exited: AtomicUsize,
    lateness: Mutex<Vec<Duration>>,
}

impl Observer for Observed {
    fn daemon_started(&self, _: &str, _: SpawningKind) {
        self.started.fetch_add(1, Ordering::SeqCst);
    }
    fn daemon_exited(&self, _: &str, _: SpawningKind) {
        self.exited.fetch_add(1, Ordering::SeqCst);
    }
    fn timer_lateness(&self, _: &str, _: &str, lateness: Duration) {
        self.lateness.lock().unwrap().push(lateness);
    }
}

/// A log of what handlers did, with the (paused) time since the test began.
#[derive(Clone)]
struct Log {
    t0: Instant,
    lines: Arc<Mutex<Vec<(Duration, String)>>>,
}

impl Log {
    fn new() -> Self {
        Log {
            t0: Instant::now(),
            lines: Arc::default(),
        }
    }
    fn add(&self, line: impl Into<String>) {
        let at = self.t0.elapsed();
        self.lines.lock().unwrap().push((at, line.into()));
    }
    /// The times (in whole milliseconds since the start) of the lines equal to `line`.
    fn times(&self, line: &str) -> Vec<u128> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| l == line)
            .map(|(at, _)| at.as_millis())
            .collect()
    }
    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }
}

fn spawning<F, Fut>(id: &str, spawning: Spawning, options: Options, f: F) -> SpawningHandler
where
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, HandlerError>> + Send + 'static,
{
    SpawningHandler {
        id: id.into(),
        selector: Selector::from(&resource()),
        spawning,
        options,
        filters: Default::default(),
        func: handler_fn(f),
    }
}

/// One object's daemons, with the owner's loop played by the test.
struct Harness {
    daemons: ObjectDaemons,
    reports: mpsc::UnboundedReceiver<Report>,
    sink: Arc<Sink>,
    observed: Arc<Observed>,
    tracker: Arc<Tracker>,
    may_start: bool,
    /// The replica's tenure in its ring (unbounded unless a test bounds it).
    tenure: Tenure,
}

impl Harness {
    fn new(handlers: Vec<SpawningHandler>) -> Self {
        let sink = Arc::new(Sink::default());
        let observed = Arc::new(Observed::default());
        let tracker = Arc::new(Tracker::default());
        let tenure = Tenure::default();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let env = Arc::new(DaemonEnv {
            resource: Arc::new(resource()),
            handlers: Arc::new(ResourceHandlers {
                spawning: handlers,
                ..ResourceHandlers::default()
            }),
            client: Arc::new(client),
            poster: EventPoster::disabled(),
            limiter: Arc::new(Semaphore::new(8)),
            default_backoff: Duration::from_secs(60),
            sink: sink.clone(),
            observer: observed.clone(),
            label: Arc::from("widgets.v1.example.com"),
            runtime: tokio::runtime::Handle::current(),
            tracker: tracker.clone(),
            caches: None,
            indexes: None,
            tenure: Some(tenure.clone()),
        });
        let (sender, reports) = mpsc::unbounded_channel();
        let daemons = ObjectDaemons::new(
            env,
            Memo::default(),
            tracing::Span::none(),
            body(json!({"size": 1})),
            EventType::Listed,
            Arc::default(),
            Arc::new(move |report| {
                let _ = sender.send(report);
            }),
        );
        Harness {
            daemons,
            reports,
            sink,
            observed,
            tracker,
            may_start: true,
            tenure,
        }
    }

    fn decide(&mut self, wanted: &[usize]) {
        let decision = SpawnDecision {
            wanted: wanted.to_vec(),
            deletion: false,
            essential_change: false,
            ..SpawnDecision::default()
        };
        self.daemons.apply(&decision, self.may_start);
    }

    fn change(&mut self, wanted: &[usize]) {
        let decision = SpawnDecision {
            wanted: wanted.to_vec(),
            deletion: false,
            essential_change: true,
            ..SpawnDecision::default()
        };
        self.daemons.apply(&decision, self.may_start);
    }

    fn drain(&mut self) {
        let decision = SpawnDecision {
            draining: true,
            ..SpawnDecision::default()
        };
        self.daemons.apply(&decision, self.may_start);
    }

    fn delete(&mut self) {
        let decision = SpawnDecision {
            wanted: vec![],
            deletion: true,
            essential_change: false,
            ..SpawnDecision::default()
        };
        self.daemons.apply(&decision, self.may_start);
    }

    /// Lets time pass by `d`, handing reports to the daemons as the worker does.
    async fn run_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        loop {
            tokio::select! {
                report = self.reports.recv() => self.hand(report.unwrap()),
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        while let Ok(report) = self.reports.try_recv() {
            self.hand(report);
        }
    }

    fn hand(&mut self, report: Report) {
        match report {
            Report::Exited { index, generation } => {
                self.daemons.exited(index, generation, self.may_start);
            }
            Report::Abandoned { index, generation } => {
                self.daemons.abandoned(index, generation);
            }
        }
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A daemon that logs its start and stop reasons, and exits when asked to.
fn polite(log: &Log) -> impl Fn(Ctx) -> BoxFuture<'static, Result<Value, HandlerError>> {
    let log = log.clone();
    move |ctx: Ctx| {
        let log = log.clone();
        async move {
            log.add("started");
            let reasons = ctx.stopped().wait().await;
            log.add(format!("stopped {reasons}"));
            Ok(Value::Null)
        }
        .boxed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_daemon_starts_after_its_initial_delay() {
    let log = Log::new();
    let daemon = Spawning::Daemon(Daemon::new().initial_delay(secs(5)));
    let mut h = Harness::new(vec![spawning(
        "d",
        daemon,
        Options::default(),
        polite(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(10)).await;
    assert_eq!(log.times("started"), vec![5000]);
    assert_eq!(h.daemons.stage(0), Some(Stage::Running));
    assert_eq!(h.observed.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_initial_delay_can_be_computed_from_the_object() {
    let log = Log::new();
    let daemon = Spawning::Daemon(
        Daemon::new()
            .initial_delay_with(|ctx: &Ctx| secs(ctx.spec()["size"].as_u64().unwrap_or(0) * 3)),
    );
    let mut h = Harness::new(vec![spawning(
        "d",
        daemon,
        Options::default(),
        polite(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(10)).await;
    assert_eq!(log.times("started"), vec![3000], "size 1 → 3 s");
}

#[tokio::test(start_paused = true)]
async fn a_stop_during_the_initial_delay_never_calls_the_handler() {
    let log = Log::new();
    let daemon = Spawning::Daemon(Daemon::new().initial_delay(secs(5)));
    let mut h = Harness::new(vec![spawning(
        "d",
        daemon,
        Options::default(),
        polite(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(2)).await;
    h.delete();
    h.run_for(secs(10)).await;
    assert!(log.lines().is_empty(), "{:?}", log.lines());
    assert_eq!(h.daemons.holding(), 0);
    assert!(
        !h.daemons.excluded().contains("d"),
        "stopped on request, not on its own"
    );
}

#[tokio::test(start_paused = true)]
async fn a_daemon_is_retried_after_a_temporary_error_with_its_delay_then_not_restarted() {
    let log = Log::new();
    let l = log.clone();
    let handler = move |ctx: Ctx| {
        let log = l.clone();
        async move {
            log.add(format!("attempt {}", ctx.retry()));
            if ctx.retry() < 2 {
                return Err(HandlerError::temporary("not yet", secs(3)));
            }
            Ok(json!({"done": true}))
        }
    };
    let mut h = Harness::new(vec![spawning(
        "d",
        Spawning::Daemon(Daemon::new()),
        Options::default(),
        handler,
    )]);
    h.decide(&[0]);
    h.run_for(secs(20)).await;
    assert_eq!(log.times("attempt 0"), vec![0]);
    assert_eq!(log.times("attempt 1"), vec![3000]);
    assert_eq!(log.times("attempt 2"), vec![6000]);
    assert_eq!(h.daemons.holding(), 0, "it returned");
    assert!(h.daemons.excluded().contains("d"), "exited on its own");
    assert_eq!(
        h.sink.applied.lock().unwrap().last(),
        Some(&json!({"status": {"d": {"done": true}}}))
    );
    h.decide(&[0]);
    h.run_for(secs(10)).await;
    assert_eq!(log.lines().len(), 3, "never restarted: {:?}", log.lines());
}

#[tokio::test(start_paused = true)]
async fn arbitrary_errors_are_retried_after_the_backoff() {
    let log = Log::new();
    let l = log.clone();
    let handler = move |ctx: Ctx| {
        let log = l.clone();
        async move {
            log.add("attempt");
            if ctx.retry() == 0 {
                return Err(HandlerError::msg("boom"));
            }
            Ok(Value::Null)
        }
    };
    let options = Options {
        backoff: Some(secs(7)),
        ..Options::default()
    };
    let mut h = Harness::new(vec![spawning(
        "d",
        Spawning::Daemon(Daemon::new()),
        options,
        handler,
    )]);
    h.decide(&[0]);
    h.run_for(secs(20)).await;
    assert_eq!(log.times("attempt"), vec![0, 7000]);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_stops_a_daemon_for_good() {
    let log = Log::new();
    let l = log.clone();
    let handler = move |_: Ctx| {
        let log = l.clone();
        async move {
            log.add("attempt");
            Err::<Value, _>(HandlerError::permanent("never"))
        }
    };
    let mut h = Harness::new(vec![spawning(
        "d",
        Spawning::Daemon(Daemon::new()),
        Options::default(),
        handler,
    )]);
    h.decide(&[0]);
    h.run_for(secs(120)).await;
    h.change(&[0]);
    h.run_for(secs(120)).await;
    assert_eq!(log.times("attempt"), vec![0]);
    assert!(h.daemons.excluded().contains("d"));
}

/// A timer whose calls take `took` and which logs their starts.
fn slow(
    log: &Log,
    took: Duration,
) -> impl Fn(Ctx) -> BoxFuture<'static, Result<Value, HandlerError>> {
    let log = log.clone();
    move |_: Ctx| {
        let log = log.clone();
        async move {
            log.add("call");
            tokio::time::sleep(took).await;
            Ok(Value::Null)
        }
        .boxed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_timer_sleeps_its_interval_between_the_end_of_a_call_and_the_next() {
    let log = Log::new();
    let timer = Spawning::Timer(Timer::every(secs(1)));
    let mut h = Harness::new(vec![spawning(
        "t",
        timer,
        Options::default(),
        slow(&log, ms(300)),
    )]);
    h.decide(&[0]);
    h.run_for(ms(4000)).await;
    assert_eq!(log.times("call"), vec![0, 1300, 2600, 3900]);
}

/// Sharding: while the replica's membership has lapsed (frozen past its renew deadline, before
/// the pause arrives), a timer makes no call and looks again after `LAPSED_RECHECK`; renewed, it
/// goes on. A daemon that failed is not restarted meanwhile.
#[tokio::test(start_paused = true)]
async fn timers_and_daemon_restarts_wait_while_the_membership_has_lapsed() {
    let log = Log::new();
    let daemon_log = Log::new();
    let failing = {
        let log = daemon_log.clone();
        move |_: Ctx| {
            let log = log.clone();
            async move {
                log.add("daemon");
                Err(HandlerError::temporary("again", secs(1)))
            }
            .boxed()
        }
    };
    let mut h = Harness::new(vec![
        spawning(
            "t",
            Spawning::Timer(Timer::every(secs(1))),
            Options::default(),
            slow(&log, ms(0)),
        ),
        spawning(
            "d",
            Spawning::Daemon(Daemon::new()),
            Options::default(),
            failing,
        ),
    ]);
    let tenure = h.tenure.clone();
    tenure.hold_until(Instant::now() + ms(2500));
    h.decide(&[0, 1]);
    h.run_for(ms(3500)).await;
    tenure.hold_until(Instant::now() + secs(10));
    h.run_for(ms(1000)).await;
    assert_eq!(
        log.times("call"),
        vec![0, 1000, 2000, 4000],
        "none at 3000 (lapsed); looked again 1 s later, renewed"
    );
    assert_eq!(
        daemon_log.times("daemon"),
        vec![0, 1000, 2000, 4000],
        "its retry at 3000 waited for the renewal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sharp_timer_keeps_the_grid() {
    let log = Log::new();
    let timer = Spawning::Timer(Timer::every(secs(1)).sharp());
    let mut h = Harness::new(vec![spawning(
        "t",
        timer,
        Options::default(),
        slow(&log, ms(300)),
    )]);
    h.decide(&[0]);
    h.run_for(ms(3500)).await;
    assert_eq!(log.times("call"), vec![0, 1000, 2000, 3000]);
}

#[tokio::test(start_paused = true)]
async fn a_sharp_timer_skips_the_grid_points_a_long_call_overlaps() {
    let log = Log::new();
    let timer = Spawning::Timer(Timer::every(secs(1)).sharp());
    let mut h = Harness::new(vec![spawning(
        "t",
        timer,
        Options::default(),
        slow(&log, ms(1500)),
    )]);
    h.decide(&[0]);
    h.run_for(ms(6500)).await;
    assert_eq!(
        log.times("call"),
        vec![0, 2000, 4000, 6000],
        "never overlapping itself"
    );
}

#[tokio::test(start_paused = true)]
async fn a_timer_with_idle_waits_for_a_quiet_period() {
    let log = Log::new();
    let timer = Spawning::Timer(Timer::every(secs(10)).idle(secs(5)));
    let mut h = Harness::new(vec![spawning(
        "t",
        timer,
        Options::default(),
        slow(&log, ms(0)),
    )]);
    h.decide(&[0]);
    h.run_for(secs(2)).await;
    h.change(&[0]); // an essential change at 2 s: quiet from 2 s
    h.run_for(secs(2)).await;
    h.decide(&[0]); // not essential (e.g. our own status patch): no reset
    h.run_for(secs(4)).await;
    assert_eq!(log.times("call"), vec![7000]);
    h.run_for(secs(11)).await;
    assert_eq!(log.times("call"), vec![7000, 17000], "then every interval");
}

#[tokio::test(start_paused = true)]
async fn an_idle_only_timer_runs_once_per_quiet_period() {
    let log = Log::new();
    let timer = Spawning::Timer(Timer::new().idle(secs(5)));
    let mut h = Harness::new(vec![spawning(
        "t",
        timer,
        Options::default(),
        slow(&log, ms(0)),
    )]);
    h.decide(&[0]);
    h.run_for(secs(20)).await;
    assert_eq!(
        log.times("call"),
        vec![5000],
        "once, however long it stays quiet"
    );
    h.change(&[0]);
    h.run_for(secs(20)).await;
    assert_eq!(log.times("call"), vec![5000, 25000]);
}

#[tokio::test(start_paused = true)]
async fn a_timer_with_neither_interval_nor_idle_runs_once() {
    let log = Log::new();
    let timer = Spawning::Timer(Timer::new().initial_delay(secs(2)));
    let mut h = Harness::new(vec![spawning(
        "t",
        timer,
        Options::default(),
        slow(&log, ms(0)),
    )]);
    h.decide(&[0]);
    h.run_for(secs(30)).await;
    assert_eq!(log.times("call"), vec![2000]);
    assert!(h.daemons.excluded().contains("t"));
}

#[tokio::test(start_paused = true)]
async fn timer_errors_override_the_schedule_and_a_success_resets_the_retries() {
    // Kopf's example: 3 failures with backoff=5 and interval=10 take 25 s.
    let log = Log::new();
    let l = log.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = move |ctx: Ctx| {
        let (log, calls) = (l.clone(), calls.clone());
        async move {
            log.add(format!("call retry={}", ctx.retry()));
            if calls.fetch_add(1, Ordering::SeqCst) < 3 {
                return Err(HandlerError::msg("flaky"));
            }
            Ok(Value::Null)
        }
    };
    let options = Options {
        backoff: Some(secs(5)),
        ..Options::default()
    };
    let timer = Spawning::Timer(Timer::every(secs(10)));
    let mut h = Harness::new(vec![spawning("t", timer, options, handler)]);
    h.decide(&[0]);
    h.run_for(ms(25500)).await;
    let lines: Vec<(u128, String)> = log
        .lines
        .lock()
        .unwrap()
        .iter()
        .map(|(at, l)| (at.as_millis(), l.clone()))
        .collect();
    assert_eq!(
        lines,
        vec![
            (0, "call retry=0".to_string()),
            (5000, "call retry=1".to_string()),
            (10000, "call retry=2".to_string()),
            (15000, "call retry=3".to_string()),
            (25000, "call retry=0".to_string()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_stops_a_timer_for_good() {
    let log = Log::new();
    let l = log.clone();
    let handler = move |_: Ctx| {
        let log = l.clone();
        async move {
            log.add("call");
            Err::<Value, _>(HandlerError::permanent("broken"))
        }
    };
    let timer = Spawning::Timer(Timer::every(secs(1)));
    let mut h = Harness::new(vec![spawning("t", timer, Options::default(), handler)]);
    h.decide(&[0]);
    h.run_for(secs(10)).await;
    assert_eq!(log.times("call"), vec![0]);
    assert!(h.daemons.excluded().contains("t"));
    assert_eq!(h.daemons.holding(), 0);
}

#[tokio::test(start_paused = true)]
async fn results_and_patches_are_sent_after_each_run_and_lateness_is_observed() {
    let count = Arc::new(AtomicUsize::new(0));
    let handler = move |ctx: Ctx| {
        let count = count.clone();
        async move {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            ctx.patch().label("ticks", Some(&n.to_string()));
            Ok(json!({"n": n}))
        }
    };
    let timer = Spawning::Timer(Timer::every(secs(1)));
    let mut h = Harness::new(vec![spawning("t", timer, Options::default(), handler)]);
    h.decide(&[0]);
    h.run_for(ms(2500)).await;
    let applied = h.sink.applied.lock().unwrap().clone();
    assert_eq!(
        applied,
        vec![
            json!({"metadata": {"labels": {"ticks": "1"}}, "status": {"t": {"n": 1}}}),
            json!({"metadata": {"labels": {"ticks": "2"}}, "status": {"t": {"n": 2}}}),
            json!({"metadata": {"labels": {"ticks": "3"}}, "status": {"t": {"n": 3}}}),
        ]
    );
    let lateness = h.observed.lateness.lock().unwrap().clone();
    assert_eq!(lateness, vec![Duration::ZERO; 3], "paused time: never late");
}

#[tokio::test(start_paused = true)]
async fn a_failed_patch_is_kept_and_sent_with_the_next_run() {
    let count = Arc::new(AtomicUsize::new(0));
    let handler = move |ctx: Ctx| {
        let count = count.clone();
        async move {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            ctx.patch().label(&format!("run-{n}"), Some("yes"));
            Ok(Value::Null)
        }
    };
    let timer = Spawning::Timer(Timer::every(secs(1)));
    let mut h = Harness::new(vec![spawning("t", timer, Options::default(), handler)]);
    h.sink.failures.store(1, Ordering::SeqCst);
    h.decide(&[0]);
    h.run_for(ms(1500)).await;
    let applied = h.sink.applied.lock().unwrap().clone();
    assert_eq!(
        applied,
        vec![json!({"metadata": {"labels": {"run-1": "yes", "run-2": "yes"}}})]
    );
}

#[tokio::test(start_paused = true)]
async fn daemons_read_the_live_body() {
    let log = Log::new();
    let l = log.clone();
    let handler = move |ctx: Ctx| {
        let log = l.clone();
        async move {
            while !ctx.stopped().wait_timeout(secs(1)).await {
                log.add(format!("size {}", ctx.fresh().spec()["size"]));
            }
            Ok(Value::Null)
        }
    };
    let mut h = Harness::new(vec![spawning(
        "d",
        Spawning::Daemon(Daemon::new()),
        Options::default(),
        handler,
    )]);
    h.decide(&[0]);
    h.run_for(ms(1500)).await;
    h.daemons
        .observe(body(json!({"size": 2})), EventType::Modified);
    h.run_for(secs(1)).await;
    assert_eq!(log.lines(), vec!["size 1", "size 2"]);
}

#[tokio::test(start_paused = true)]
async fn a_daemon_that_exits_on_its_signal_is_neither_signalled_again_nor_cancelled() {
    let log = Log::new();
    let daemon = Spawning::Daemon(Daemon::new());
    let mut h = Harness::new(vec![spawning(
        "d",
        daemon,
        Options::default(),
        polite(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    h.delete();
    assert_eq!(h.daemons.stage(0), Some(Stage::Signalled));
    h.run_for(secs(1)).await;
    assert_eq!(log.lines(), vec!["started", "stopped RESOURCE_DELETED"]);
    assert_eq!(h.daemons.holding(), 0);
    assert_eq!(h.observed.exited.load(Ordering::SeqCst), 1);
    assert!(!h.daemons.excluded().contains("d"));
}

#[tokio::test(start_paused = true)]
async fn a_handover_stops_daemons_for_operator_draining_and_starts_none() {
    let log = Log::new();
    let mut h = Harness::new(vec![
        spawning(
            "d",
            Spawning::Daemon(Daemon::new()),
            Options::default(),
            polite(&log),
        ),
        spawning(
            "e",
            Spawning::Daemon(Daemon::new()),
            Options::default(),
            polite(&log),
        ),
    ]);
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    // The handover: the running one stops, and the one that was not running does not start.
    h.drain();
    h.run_for(secs(1)).await;
    assert_eq!(log.lines(), vec!["started", "stopped OPERATOR_DRAINING"]);
    assert_eq!(h.daemons.holding(), 0);
    assert!(
        !h.daemons.excluded().contains("d"),
        "the next owner starts it again"
    );
}

/// Records its drop (the cancellation of the future that owns it) and the stop reasons then.
struct DropGuard(Log, kactor_reactor::daemons::Stopped);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.add(format!("dropped {}", self.1.reasons()));
    }
}

/// A daemon that ignores its stop signal.
fn stubborn(log: &Log) -> impl Fn(Ctx) -> BoxFuture<'static, Result<Value, HandlerError>> {
    let log = log.clone();
    move |ctx: Ctx| {
        let log = log.clone();
        async move {
            let _guard = DropGuard(log.clone(), ctx.stopped());
            log.add("started");
            tokio::time::sleep(secs(3600)).await;
            log.add("woke up");
            Ok(Value::Null)
        }
        .boxed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_daemon_ignoring_its_signal_is_cancelled_after_the_cancellation_backoff() {
    let log = Log::new();
    let daemon = Spawning::Daemon(
        Daemon::new()
            .cancellation_backoff(secs(5))
            .cancellation_timeout(secs(10)),
    );
    let mut h = Harness::new(vec![spawning(
        "d",
        daemon,
        Options::default(),
        stubborn(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    h.delete();
    h.run_for(secs(4)).await;
    assert_eq!(h.daemons.stage(0), Some(Stage::Signalled));
    assert_eq!(h.daemons.holding(), 1, "holds the finalizer meanwhile");
    h.run_for(secs(2)).await;
    assert_eq!(h.daemons.holding(), 0);
    assert_eq!(
        log.times("dropped RESOURCE_DELETED|DAEMON_SIGNALLED|DAEMON_CANCELLED"),
        vec![6000]
    );
    assert!(log.times("woke up").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_daemon_without_cancellation_settings_is_waited_for_however_long_it_takes() {
    let log = Log::new();
    let daemon = Spawning::Daemon(Daemon::new());
    let mut h = Harness::new(vec![spawning(
        "d",
        daemon,
        Options::default(),
        stubborn(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    h.delete();
    h.run_for(secs(3000)).await;
    assert_eq!(h.daemons.holding(), 1, "still holding the finalizer");
    assert_eq!(h.daemons.stage(0), Some(Stage::Signalled));
    h.run_for(secs(700)).await;
    assert_eq!(h.daemons.holding(), 0);
    assert_eq!(log.times("woke up"), vec![3_600_000]);
}

#[tokio::test(start_paused = true)]
async fn a_daemon_wanted_again_while_stopping_starts_again_only_after_it_exited() {
    let log = Log::new();
    let l = log.clone();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), most.clone());
    let handler = move |ctx: Ctx| {
        let (log, running, most) = (l.clone(), r.clone(), m.clone());
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            log.add("started");
            let reasons = ctx.stopped().wait().await;
            log.add(format!("stopped {reasons}"));
            // Takes its time to wind down.
            tokio::time::sleep(secs(3)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(Value::Null)
        }
    };
    let mut h = Harness::new(vec![spawning(
        "d",
        Spawning::Daemon(Daemon::new()),
        Options::default(),
        handler,
    )]);
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    h.decide(&[]); // the filters stop matching at 1 s
    h.run_for(secs(1)).await;
    h.decide(&[0]); // and match again at 2 s, while it still winds down
    h.run_for(secs(5)).await;
    assert_eq!(log.times("started"), vec![0, 4000]);
    assert_eq!(log.times("stopped FILTERS_MISMATCH"), vec![1000]);
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two at once");
    assert_eq!(h.daemons.stage(0), Some(Stage::Running));
}

#[tokio::test(start_paused = true)]
async fn nothing_starts_while_paused_and_pausing_stops_with_its_reason() {
    let log = Log::new();
    let mut h = Harness::new(vec![spawning(
        "d",
        Spawning::Daemon(Daemon::new()),
        Options::default(),
        polite(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    h.may_start = false;
    h.daemons.stop_all(StopReason::OperatorPausing);
    h.run_for(secs(1)).await;
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    assert_eq!(log.lines(), vec!["started", "stopped OPERATOR_PAUSING"]);
    h.may_start = true; // resumed: the next event's decision starts it again
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    assert_eq!(
        log.lines(),
        vec!["started", "stopped OPERATOR_PAUSING", "started"]
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_owner_stops_everything_as_the_operator_exits() {
    let log = Log::new();
    let mut h = Harness::new(vec![
        spawning(
            "d",
            Spawning::Daemon(Daemon::new()),
            Options::default(),
            polite(&log),
        ),
        spawning(
            "t",
            Spawning::Timer(Timer::every(secs(1))),
            Options::default(),
            slow(&log, ms(0)),
        ),
    ]);
    h.decide(&[0, 1]);
    h.run_for(ms(1500)).await;
    assert_eq!(h.daemons.holding(), 2);
    let Harness {
        daemons, tracker, ..
    } = h;
    drop(daemons);
    assert_eq!(tracker.drain(secs(10)).await, 0, "both ended on their own");
    let lines = log.lines();
    assert_eq!(
        lines,
        vec!["started", "call", "call", "stopped OPERATOR_EXITING"],
        "the timer's sleep ended at once too"
    );
}

#[tokio::test(start_paused = true)]
async fn a_daemon_with_only_a_cancellation_timeout_is_cancelled_at_once() {
    let log = Log::new();
    let daemon = Spawning::Daemon(Daemon::new().cancellation_timeout(secs(5)));
    let mut h = Harness::new(vec![spawning(
        "d",
        daemon,
        Options::default(),
        stubborn(&log),
    )]);
    h.decide(&[0]);
    h.run_for(secs(1)).await;
    h.decide(&[]);
    h.run_for(secs(1)).await;
    assert_eq!(h.daemons.holding(), 0, "no backoff: cancelled at once");
    assert_eq!(
        log.times("dropped FILTERS_MISMATCH|DAEMON_CANCELLED"),
        vec![1000]
    );
    assert!(!h.daemons.abandoned(0, 1), "gone: nothing to abandon");
}
