//! Parents that own one child each, reconciled level-based: kactor's `on_reconcile` with
//! `Reconcile::owns` beside kube-rs's `Controller` with its owned kind, in one run, against the
//! embedded emulator (issue 21's proof).
//!
//! Run by hand: `cargo bench --bench owned` (10000 parents, 3 rounds; `KACTOR_BENCH_OBJECTS=N` and
//! `KACTOR_BENCH_REPEAT=K` to change); under `cargo test --all-targets` it makes a quick run with
//! 200 and one round instead.
//!
//! Every contender gets a fresh emulator holding the same widgets (the parents), created before it
//! starts. Each widget `wNNNNNN` (`spec.size` = NNNNNN) owns one ConfigMap named after it (owner
//! reference with `controller: true`, the widget's labels, `data.size` = the widget's `spec.size`).
//! Each contender's reconcile reads the child from its cache and makes the same writes: a child
//! missing from the cache is created, a child whose `data.size` differs is merge-patched; nothing
//! else (no write to the widget). The contenders:
//! * kube-rs's `Controller` on the widgets, owning the ConfigMaps, reading them from a reflector
//!   store, at kube's default concurrency (unbounded) and again at 256 (kactor's handler limit).
//!   `Controller::owns` watches the children's metadata only and keeps no store, so a reconcile
//!   reading a separate reflector can run before that reflector has the change that triggered it,
//!   and miss a touched child for good (tried at 10,000 children: 1 and 5 of them were never put
//!   back); the children are therefore one reflector's stream given to `Controller::owns_stream`
//!   (kube's `unstable-runtime` feature): one watch, the store updated before the trigger, as
//!   kactor's cache guarantees;
//! * kactor: `on_reconcile(widgets, Reconcile::id(..).owns("configmaps"), ..)` reading
//!   `ctx.cache("configmaps")`, writing through the cache's API (`Cache::api`, whose answers are
//!   decoded as the cache keeps objects) and remembering its own writes there (`Cache::remember`),
//!   standalone, default settings, its client built from the emulator's configuration
//!   (`Operator::kube_config`, as `--emulator` does): one request buffer per request, as the
//!   `Controller`'s client (the emulator's own) has.
//!
//! Two clocks, each stopped by a separate `kube::runtime::watcher` of the ConfigMaps, started and
//! listed beforehand:
//! * A, converge after start: from the contender's start until every child exists with the right
//!   size;
//! * B, after touching every child: with the contender converged (and, in a measuring run, left
//!   alone for [`QUIET`] first, so that kactor's workers idled out), the benchmark's own client
//!   merge-patches every child's `data.size` to a wrong value, [`TOUCH_CONCURRENCY`] at once; the
//!   clock runs from the first touch until every child was seen wrong and then right again (each
//!   fix is a reconcile triggered by the child's event). The touching is inside the clock, the
//!   same for every contender.
//!
//! For each phase it prints seconds, objects/s, the ratio to kube's `Controller` (default
//! concurrency), the CPU seconds the process used (the emulator's included), reconcile runs per
//! object until the clock stopped and after it (until the next phase), and the requests the
//! emulator served per object by kind (the touches not counted; the watcher's own list and watch
//! included). Memory, all in the one process that also runs the emulator:
//! * heap grown from the start until A converged, per object (the emulator's growth included: the
//!   same children and events for every contender, so the difference between contenders is theirs),
//!   and the process's RSS then and after [`QUIET`] (glibc's free pages are returned between
//!   contenders, so each starts from the same floor; kactor returns its own after its workers idle
//!   out, kube-rs does not);
//! * held: what stopping the contender freed after B and [`QUIET`] (its caches of parents and
//!   children, its per-object state, its connections), per object;
//! * per cached child: the children the contender's cache held, copied into a fresh store of its
//!   own kind (kactor's cache store of `DynamicObject`s; kube-rs's reflector store of typed
//!   `ConfigMap`s), the heap that store grew by, per child (bodies and index, each in its own
//!   representation), and the bodies' part of it; for kactor also
//!   `kactor_cache_bytes{resource="configmaps.v1"}` / `kactor_cache_objects` (the bodies' size as
//!   JSON, what the metric reports), and the heap per child of a store of the same children as a
//!   metadata-only cache keeps them (`Operator::cache_metadata_only`; this benchmark's handler
//!   reads the children's data, so it cannot use one).
//!
//! Every contender runs once in each round, each round starting with the next contender (this
//! machine's speed drifts within a minute); the tables give each contender's median round, with
//! every round's seconds beside it, and memory from the first round.
//!
//! Aim: kactor at least as fast as `Controller` in both phases, by the medians.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kactor::cache::{Cache, Slim};
use kactor::emulator::{samples, Emulator};
use kactor::health::Metrics;
use kactor::prelude::*;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource as _, ResourceExt};
use serde_json::Value;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

mod support;

use support::widgets::{detect_when, emulator_with_widgets, populate, Detector};
use support::Running;

#[global_allocator]
static ALLOCATOR: support::Counting = support::Counting;

/// No phase may take longer than this (a hang fails the benchmark instead of blocking CI).
const DEADLINE: Duration = Duration::from_secs(600);
/// The benchmark's own touches of the children: this many at once.
const TOUCH_CONCURRENCY: usize = 64;
/// In a measuring run, a converged contender is left alone this long before phase B and before its
/// memory is read: kactor's workers idle out after 5 s (`queueing.idle_timeout`) and their memory
/// is returned 2 s after the wave.
const QUIET: Duration = Duration::from_secs(8);
/// What the touches set `data.size` to (no widget has it).
const WRONG: &str = "-1";
/// The reconcile handler's id in kactor.
const HANDLER: &str = "owned";

// ---- The children ---------------------------------------------------------------------------------

fn config_maps_resource() -> ApiResource {
    ApiResource::erase::<ConfigMap>(&())
}

/// The size a widget asks of its child: its `spec.size`, as the ConfigMap's string.
fn wanted_size(widget: &DynamicObject) -> String {
    widget.data["spec"]["size"].to_string()
}

/// Whether a child has its widget's size: `wNNNNNN` has `spec.size` NNNNNN.
fn is_right(child: &DynamicObject) -> bool {
    let name = child.metadata.name.as_deref().unwrap_or_default();
    let wanted = name.get(1..).and_then(|n| n.parse::<u64>().ok());
    let size = child.data["data"]["size"].as_str();
    wanted.is_some_and(|n| size == Some(n.to_string().as_str()))
}

/// Phase B's test: a child is finished once seen wrong (touched) and then right again.
fn back_to_right() -> impl FnMut(&DynamicObject) -> bool + Send + 'static {
    let mut touched = HashSet::new();
    move |child| {
        let name = child.metadata.name.clone().unwrap_or_default();
        if is_right(child) {
            touched.contains(&name)
        } else {
            touched.insert(name);
            false
        }
    }
}

/// Sets every child's `data.size` wrong, [`TOUCH_CONCURRENCY`] at once.
async fn touch_all(children: &Api<DynamicObject>, objects: usize) {
    let patch = Patch::Merge(json!({"data": {"size": WRONG}}));
    futures::stream::iter(0..objects)
        .map(|i| {
            let patch = &patch;
            async move {
                children
                    .patch(&format!("w{i:06}"), &PatchParams::default(), patch)
                    .await
                    .expect("touch a child");
            }
        })
        .buffer_unordered(TOUCH_CONCURRENCY)
        .for_each(|()| async {})
        .await;
}

/// Reconcile runs, failed runs, and creations answered 409 (the child was there, the cache did not
/// have it yet), since the phase started; the first failure's message.
static RUNS: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);
static CONFLICTS: AtomicU64 = AtomicU64::new(0);
static FIRST_ERROR: OnceLock<String> = OnceLock::new();

fn counters() -> [u64; 3] {
    [&RUNS, &ERRORS, &CONFLICTS].map(|c| c.swap(0, Ordering::Relaxed))
}

fn failed(error: &dyn fmt::Display) {
    ERRORS.fetch_add(1, Ordering::Relaxed);
    let _ = FIRST_ERROR.set(error.to_string());
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

// ---- kube-rs's Controller -------------------------------------------------------------------------

/// The Controller's context: a client, the widgets' resource, and the children's reflector store.
struct Owner {
    client: kube::Client,
    widgets: ApiResource,
    children: reflector::Store<ConfigMap>,
}

async fn reconcile(
    widget: Arc<DynamicObject>,
    owner: Arc<Owner>,
) -> kube::Result<controller::Action> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    let (name, namespace) = (widget.name_any(), widget.namespace().unwrap_or_default());
    let size = wanted_size(&widget);
    let api: Api<ConfigMap> = Api::namespaced(owner.client.clone(), &namespace);
    match owner
        .children
        .get(&ObjectRef::new(&name).within(&namespace))
    {
        None => {
            let mut reference = widget
                .controller_owner_ref(&owner.widgets)
                .expect("a listed widget has a name and uid");
            // As kactor's (and Kopf's) adopt.
            reference.block_owner_deletion = Some(true);
            let child = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(namespace),
                    labels: widget.metadata.labels.clone(),
                    owner_references: Some(vec![reference]),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([("size".to_string(), size)])),
                ..ConfigMap::default()
            };
            match api.create(&PostParams::default(), &child).await {
                Err(error) if is_conflict(&error) => {
                    CONFLICTS.fetch_add(1, Ordering::Relaxed);
                }
                made => drop(made?),
            }
        }
        Some(child) if child.data.as_ref().and_then(|d| d.get("size")) != Some(&size) => {
            let patch = Patch::Merge(json!({"data": {"size": size}}));
            api.patch(&name, &PatchParams::default(), &patch).await?;
        }
        Some(_) => {}
    }
    Ok(controller::Action::await_change())
}

fn controller(client: kube::Client, concurrency: Option<u16>) -> (Running, Children) {
    let mut config = controller::Config::default();
    if let Some(limit) = concurrency {
        config = config.concurrency(limit);
    }
    let widgets = Api::<DynamicObject>::all_with(client.clone(), &samples::widget_api_resource());
    let (children, writer) = reflector::store::<ConfigMap>();
    let child_events = reflector::reflector(
        writer,
        watcher(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .touched_objects();
    let owner = Arc::new(Owner {
        client,
        widgets: samples::widget_api_resource(),
        children: children.clone(),
    });
    let task = tokio::spawn(async move {
        Controller::new_with(
            widgets,
            watcher::Config::default(),
            samples::widget_api_resource(),
        )
        .owns_stream(child_events)
        .with_config(config)
        .run(
            reconcile,
            |_, error, _| {
                failed(error);
                controller::Action::requeue(Duration::from_millis(100))
            },
            owner,
        )
        .for_each(|_| async {})
        .await;
    });
    (Running::Task(task), Children::Kube(children))
}

// ---- kactor -------------------------------------------------------------------------------------

async fn reconcile_kactor(ctx: Ctx, caught: &OnceLock<Cache>) -> Result<Action, HandlerError> {
    let children = ctx.cache("configmaps")?;
    let _ = caught.set(children.clone());
    let size = wanted_size(&ctx.body);
    let (name, namespace) = (ctx.name(), ctx.namespace());
    // The cache's API: its answers decoded as the cache keeps objects (`Slim`).
    let api = children.api(ctx.client(), namespace);
    match children.get(namespace, name) {
        None => {
            let mut child = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name},
                "data": {"size": size},
            });
            ctx.adopt(&mut child)?;
            let child: DynamicObject = serde_json::from_value(child)?;
            match api.create(&PostParams::default(), &Slim(child)).await {
                Ok(made) => {
                    children.remember(made.into_inner());
                }
                Err(error) if is_conflict(&error) => {
                    CONFLICTS.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => return Err(error.into()),
            }
        }
        Some(child) if child.data["data"]["size"].as_str() != Some(size.as_str()) => {
            let patch = Patch::Merge(json!({"data": {"size": size}}));
            let patched = api.patch(name, &PatchParams::default(), &patch).await?;
            children.remember(patched.into_inner());
        }
        Some(_) => {}
    }
    Ok(Action::await_change())
}

fn kactor(emulator: &Emulator) -> (Running, Children) {
    let caught: Arc<OnceLock<Cache>> = Arc::default();
    let cache = caught.clone();
    let operator = Operator::new()
        .kube_config(emulator.config())
        .standalone()
        .on_reconcile(
            "widgets.example.com",
            Reconcile::id(HANDLER).owns("configmaps"),
            move |ctx: Ctx| {
                let caught = caught.clone();
                async move {
                    RUNS.fetch_add(1, Ordering::Relaxed);
                    let outcome = reconcile_kactor(ctx, &caught).await;
                    if let Err(error) = &outcome {
                        failed(error);
                    }
                    outcome
                }
            },
        );
    let metrics = operator.metrics();
    (
        Running::operator(operator),
        Children::Kactor(cache, metrics),
    )
}

// ---- The contender's cache of children ------------------------------------------------------------

/// Where a contender keeps the children it read.
enum Children {
    Kube(reflector::Store<ConfigMap>),
    /// The cache the handler read (caught on its first run), and the operator's metrics.
    Kactor(Arc<OnceLock<Cache>>, Arc<Metrics>),
}

/// A copy of the children a contender's cache held, in its own representation.
enum Copied {
    Typed(Vec<ConfigMap>),
    Dynamic(Arc<kactor::resources::Resource>, Vec<DynamicObject>),
}

impl Children {
    /// A deep copy of what the cache holds; kactor's `kactor_cache_bytes` and `kactor_cache_objects`
    /// of the ConfigMaps.
    fn copy(&self) -> (Copied, Option<(f64, f64)>) {
        match self {
            Children::Kube(store) => {
                let copied = store.state().iter().map(|c| (**c).clone()).collect();
                (Copied::Typed(copied), None)
            }
            Children::Kactor(cache, metrics) => {
                let cache = cache.get().expect("the handler ran");
                let copied = cache.list(None).iter().map(|c| (**c).clone()).collect();
                let rendered = metrics.render();
                let metric = |name: &str| {
                    rendered
                        .lines()
                        .find(|l| l.starts_with(name) && l.contains("resource=\"configmaps"))
                        .and_then(|l| l.rsplit(' ').next())
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0)
                };
                let json = (
                    metric("kactor_cache_bytes{"),
                    metric("kactor_cache_objects{"),
                );
                (
                    Copied::Dynamic(Arc::new(cache.resource().clone()), copied),
                    Some(json),
                )
            }
        }
    }
}

impl Copied {
    fn len(&self) -> usize {
        match self {
            Copied::Typed(children) => children.len(),
            Copied::Dynamic(_, children) => children.len(),
        }
    }

    /// The heap a fresh store of the contender's kind grows by when it is given these children, and
    /// the part of it that is the bodies alone (each in an `Arc`, as both stores keep them), per
    /// child (measured in a quiet process).
    fn store_bytes_per_child(&self) -> (f64, f64) {
        let per_child = |bytes: u64| bytes as f64 / self.len().max(1) as f64;
        let grown = |fill: &dyn Fn() -> Box<dyn std::any::Any>| {
            let before = support::live_bytes();
            let kept = fill();
            let grown = support::live_bytes().saturating_sub(before);
            drop(kept);
            per_child(grown)
        };
        match self {
            Copied::Typed(children) => (
                grown(&|| {
                    let (store, mut writer) = reflector::store::<ConfigMap>();
                    for child in children {
                        writer.apply_watcher_event(&watcher::Event::Apply(child.clone()));
                    }
                    Box::new((store, writer))
                }),
                grown(&|| Box::new(children.iter().cloned().map(Arc::new).collect::<Vec<_>>())),
            ),
            Copied::Dynamic(resource, children) => (
                grown(&|| {
                    let store = kactor_reactor::cache::Store::new(
                        resource.clone(),
                        Arc::new(kactor::observe::NoObserver),
                    );
                    for child in children {
                        store.apply(EventType::Added, &Arc::new(child.clone()));
                    }
                    Box::new(store)
                }),
                grown(&|| Box::new(children.iter().cloned().map(Arc::new).collect::<Vec<_>>())),
            ),
        }
    }

    /// For kactor's store: the heap per child of a fresh store given the same children as a
    /// metadata-only cache keeps them (`Operator::cache_metadata_only`: metadata alone, no data).
    fn metadata_store_bytes_per_child(&self) -> Option<f64> {
        let Copied::Dynamic(resource, children) = self else {
            return None;
        };
        let stripped: Vec<DynamicObject> = children
            .iter()
            .map(|child| DynamicObject {
                types: None,
                metadata: child.metadata.clone(),
                data: json!({}),
            })
            .collect();
        let before = support::live_bytes();
        let store = kactor_reactor::cache::Store::new(
            resource.clone(),
            Arc::new(kactor::observe::NoObserver),
        );
        for child in &stripped {
            store.apply(EventType::Added, &Arc::new(child.clone()));
        }
        let grown = support::live_bytes().saturating_sub(before);
        drop(store);
        Some(grown as f64 / stripped.len().max(1) as f64)
    }
}

// ---- The contenders and one measurement ---------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    /// With a concurrency limit, or kube's default (unbounded).
    Controller(Option<u16>),
    Kactor,
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Contender::Controller(None) => write!(f, "kube Controller"),
            Contender::Controller(Some(limit)) => write!(f, "kube Controller, {limit} at once"),
            Contender::Kactor => write!(f, "kactor"),
        }
    }
}

/// One phase's figures.
struct Phase {
    elapsed: Duration,
    cpu: f64,
    /// Requests served during the phase, by kind, the benchmark's touches not counted.
    requests: support::Requests,
    /// Reconcile runs, failed runs, creations answered 409.
    counts: [u64; 3],
    /// Reconcile runs after the clock stopped, until the next phase (or the stop).
    late_runs: u64,
}

/// The figures at a phase's start.
struct Start {
    instant: Instant,
    cpu: f64,
    requests: support::Requests,
}

impl Start {
    /// Starts a phase (the counters of reconciles start again).
    fn now() -> Start {
        counters();
        Start {
            instant: Instant::now(),
            cpu: support::cpu_seconds_of("self"),
            requests: support::requests_now(),
        }
    }

    /// Waits for `detector`; the phase's figures, `touches` patches not counted. Past the
    /// [`DEADLINE`], says which children are not right (read from `children`), and fails.
    async fn until(
        self,
        detector: Detector,
        children: &Api<DynamicObject>,
        what: &str,
        objects: usize,
        touches: u64,
    ) -> Phase {
        let Ok(done) = tokio::time::timeout(DEADLINE, detector.done).await else {
            let listed = children.list(&Default::default()).await.expect("list");
            let right: HashSet<String> = listed
                .items
                .iter()
                .filter(|c| is_right(c))
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            let wrong: Vec<String> = (0..objects)
                .map(|i| format!("w{i:06}"))
                .filter(|name| !right.contains(name))
                .collect();
            let [runs, errors, conflicts] = counters();
            panic!(
                "{what}: only {} of {objects} children done after {DEADLINE:?}; {} missing or \
                 wrong (first {:?}, last {:?}) of {} listed; {runs} reconcile runs, {errors} \
                 failed (the first: {:?}), {conflicts} creations answered 409",
                detector.finished.load(Ordering::Relaxed),
                wrong.len(),
                wrong.first(),
                wrong.last(),
                listed.items.len(),
                FIRST_ERROR.get(),
            );
        };
        let done = done.expect("the completion watcher");
        let cpu = support::cpu_seconds_of("self") - self.cpu;
        let mut requests = support::requests_since(self.requests);
        requests[0] -= touches;
        Phase {
            elapsed: done - self.instant,
            cpu,
            requests,
            counts: counters(),
            late_runs: 0,
        }
    }
}

struct Figures {
    contender: Contender,
    a: Phase,
    b: Phase,
    /// Heap grown from the start until A converged (the emulator's growth included).
    heap_grown: u64,
    /// RSS before the start, when A converged, and after [`QUIET`].
    rss: [u64; 3],
    /// The heap stopping the contender freed, after B and [`QUIET`].
    held: u64,
    cached: usize,
    /// A fresh store of the contender's kind given its cached children: its heap per child, and
    /// the bodies' part of it.
    store_per_child: (f64, f64),
    /// kactor's store per child had the children been cached as metadata alone.
    metadata_per_child: Option<f64>,
    /// kactor's `kactor_cache_bytes` / `kactor_cache_objects` of the ConfigMaps.
    json_per_child: Option<f64>,
    /// What the first child carries at the end (its owner's uid left out), to check that every
    /// contender wrote the same.
    written: Value,
}

/// Returns glibc's free pages to the system (between contenders, so that each one's RSS starts from
/// the same floor).
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only walks glibc's own arenas; it takes their locks itself.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// A fresh emulator with `objects` widgets; the ConfigMaps' API, and a watcher of them listed.
async fn prepare(
    objects: usize,
    finishes: fn(&DynamicObject) -> bool,
) -> (Emulator, Api<DynamicObject>, Detector) {
    support::settle().await;
    trim();
    let (emulator, widgets) = emulator_with_widgets(objects * 8 + 10_000).await;
    populate(&widgets, objects).await;
    let children = Api::namespaced_with(emulator.client(), "default", &config_maps_resource());
    let mut detector = detect_when(children.clone(), objects, finishes);
    (&mut detector.listed).await.expect("the watcher lists");
    support::settle().await;
    (emulator, children, detector)
}

async fn quiet(measuring: bool) {
    if measuring {
        tokio::time::sleep(QUIET).await;
    }
}

async fn measure(contender: Contender, objects: usize, measuring: bool) -> Figures {
    let (emulator, children_api, detector) = prepare(objects, is_right).await;
    let (heap_before, rss_before) = (support::live_bytes(), support::rss_bytes());
    let start = Start::now();
    let (running, children) = match contender {
        Contender::Controller(concurrency) => controller(emulator.client(), concurrency),
        Contender::Kactor => kactor(&emulator),
    };
    let mut a = start
        .until(detector, &children_api, "converge after start", objects, 0)
        .await;
    println!(
        "  {contender}: converged after start in {:.3} s",
        a.elapsed.as_secs_f64()
    );
    let (heap_grown, rss_converged) = (
        support::live_bytes().saturating_sub(heap_before),
        support::rss_bytes(),
    );
    quiet(measuring).await;
    let rss_quiet = support::rss_bytes();
    a.late_runs = counters()[0];

    let mut detector = detect_when(children_api.clone(), objects, back_to_right());
    (&mut detector.listed).await.expect("the watcher lists");
    let start = Start::now();
    touch_all(&children_api, objects).await;
    let mut b = start
        .until(
            detector,
            &children_api,
            "after touching every child",
            objects,
            objects as u64,
        )
        .await;
    println!(
        "  {contender}: back after touching every child in {:.3} s",
        b.elapsed.as_secs_f64()
    );

    let (copied, json) = children.copy();
    drop(children);
    quiet(measuring).await;
    b.late_runs = counters()[0];
    let heap_running = support::live_bytes();
    running.stop().await;
    support::settle().await;
    let held = heap_running.saturating_sub(support::live_bytes());
    let first = children_api.get("w000000").await.expect("the first child");
    drop(emulator);
    let mut owners = json!(first.metadata.owner_references);
    owners[0]["uid"] = Value::Null;
    let written =
        json!({"labels": first.metadata.labels, "owners": owners, "data": first.data["data"]});
    support::settle().await;

    Figures {
        contender,
        a,
        b,
        heap_grown,
        rss: [rss_before, rss_converged, rss_quiet],
        held,
        cached: copied.len(),
        store_per_child: copied.store_bytes_per_child(),
        metadata_per_child: copied.metadata_store_bytes_per_child(),
        json_per_child: json.map(|(bytes, count)| bytes / count.max(1.0)),
        written,
    }
}

// ---- Printing -----------------------------------------------------------------------------------

fn describe_requests(requests: support::Requests, objects: usize) -> String {
    let per_object = |count: u64| count as f64 / objects as f64;
    let kinds: Vec<String> = support::KINDS
        .iter()
        .zip(requests)
        .filter(|(_, count)| *count > 0)
        .map(|(kind, count)| format!("{kind} {:.2}", per_object(count)))
        .collect();
    format!(
        "{:.2} ({})",
        per_object(requests.iter().sum()),
        kinds.join(", ")
    )
}

/// Which phase of a contender's figures.
type PhaseOf = fn(&Figures) -> &Phase;

/// A contender's round whose `phase` took the median time.
fn median_round(rounds: &[Figures], phase: PhaseOf) -> &Figures {
    support::median_by(rounds, |f| phase(f).elapsed.as_secs_f64()).0
}

fn print_phase(title: &str, all: &[Vec<Figures>], phase: PhaseOf, objects: usize) {
    println!();
    println!("{title}");
    println!(
        "{:<28} {:>8} {:>10} {:>8} {:>7} {:>14}   requests per object; every round's seconds",
        "contender", "seconds", "objects/s", "ratio", "cpu s", "runs/obj +late"
    );
    let base = phase(median_round(&all[0], phase)).elapsed.as_secs_f64();
    for rounds in all {
        let figures = median_round(rounds, phase);
        let p = phase(figures);
        let seconds = p.elapsed.as_secs_f64();
        let each: Vec<String> = rounds
            .iter()
            .map(|f| format!("{:.3}", phase(f).elapsed.as_secs_f64()))
            .collect();
        println!(
            "{:<28} {:>8.3} {:>10.0} {:>7.2}x {:>7.2} {:>8.2} {:>+5.2}   {}; {}",
            figures.contender.to_string(),
            seconds,
            objects as f64 / seconds,
            seconds / base,
            p.cpu,
            p.counts[0] as f64 / objects as f64,
            p.late_runs as f64 / objects as f64,
            describe_requests(p.requests, objects),
            each.join(" "),
        );
        for f in rounds {
            let p = phase(f);
            if p.counts[1] + p.counts[2] > 0 {
                println!(
                    "{:<28} {} failed reconciles (retried), {} creations answered 409",
                    "", p.counts[1], p.counts[2]
                );
            }
        }
    }
}

/// What the memory columns are.
const LEGEND: &str = "\
heap B/obj: grown from the start until A converged, per parent (the emulator's children and its
  events included); RSS: the process's, before the start, when A converged, after the quiet wait
  (8 s in a measuring run);
held B/obj: freed by stopping the contender after B and the quiet wait, per parent (its caches of
  parents and children, per-object state, connections);
store B/ch: the heap of a fresh store of the contender's kind given the children its cache held,
  per child (kactor: DynamicObject bodies, by name and by owner; kube-rs: typed ConfigMaps by
  ObjectRef); bodies: the part of it that is the bodies alone, each in an Arc;
JSON B/ch: kactor's kactor_cache_bytes / kactor_cache_objects of configmaps.v1 (the bodies' size
  as JSON, not their heap)
";

fn print_memory(all: &[Vec<Figures>], objects: usize) {
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    // The first round's: every contender's first start in this process.
    let all: Vec<&Figures> = all.iter().map(|rounds| &rounds[0]).collect();
    println!();
    println!("memory, the first round (the emulator runs in the same process: its growth is in heap and RSS)");
    println!(
        "{:<28} {:>10} {:>8} {:>8} {:>8} {:>10} {:>7} {:>10} {:>9} {:>10}",
        "contender",
        "heap B/obj",
        "RSS MiB",
        "at A",
        "quiet",
        "held B/obj",
        "cached",
        "store B/ch",
        "bodies",
        "JSON B/ch"
    );
    for figures in &all {
        println!(
            "{:<28} {:>10.0} {:>8.1} {:>8.1} {:>8.1} {:>10.0} {:>7} {:>10.0} {:>9.0} {:>10}",
            figures.contender.to_string(),
            figures.heap_grown as f64 / objects as f64,
            mib(figures.rss[0]),
            mib(figures.rss[1]),
            mib(figures.rss[2]),
            figures.held as f64 / objects as f64,
            figures.cached,
            figures.store_per_child.0,
            figures.store_per_child.1,
            figures
                .json_per_child
                .map_or("-".to_string(), |bytes| format!("{bytes:.0}")),
        );
    }
    for figures in &all {
        if let Some(bytes) = figures.metadata_per_child {
            println!(
                "{}'s store of the same children as metadata only (Operator::cache_metadata_only): {bytes:.0} B per child",
                figures.contender
            );
        }
    }
    println!();
    print!("{LEGEND}");
}

fn print_verdict(all: &[Vec<Figures>]) {
    if let Some(error) = FIRST_ERROR.get() {
        println!("the first failed reconcile: {error}");
    }
    let first = &all[0][0];
    for figures in all.iter().flatten() {
        if figures.written != first.written {
            println!(
                "NOTE: {} wrote {} beside {} by {}",
                figures.contender, figures.written, first.written, first.contender
            );
        }
    }
    let kactor = all.iter().find(|r| r[0].contender == Contender::Kactor);
    let controllers = || all.iter().filter(|r| r[0].contender != Contender::Kactor);
    let phases: [(&str, PhaseOf); 2] = [("A", |f| &f.a), ("B", |f| &f.b)];
    if let Some(kactor) = kactor {
        for (name, phase) in phases {
            let median = |rounds: &[Figures]| phase(median_round(rounds, phase)).elapsed;
            let best = |rounds: &[Figures]| rounds.iter().map(|f| phase(f).elapsed).min();
            let (Some(median_floor), Some(best_floor)) = (
                controllers().map(|r| median(r)).min(),
                controllers().filter_map(|r| best(r)).min(),
            ) else {
                continue;
            };
            let ratio = median(kactor).as_secs_f64() / median_floor.as_secs_f64();
            let best_ratio =
                best(kactor).unwrap_or_default().as_secs_f64() / best_floor.as_secs_f64();
            println!(
                "aim, phase {name}: kactor at least as fast as the fastest Controller: {} ({ratio:.2}x by the medians of {} rounds; {best_ratio:.2}x by the best rounds)",
                if ratio <= 1.0 { "met" } else { "NOT met" },
                kactor.len(),
            );
            // The Controller as `Controller::new` runs it, with no limit on reconciles at once.
            if let Some(default) = all
                .iter()
                .find(|r| r[0].contender == Contender::Controller(None))
            {
                let ratio = median(kactor).as_secs_f64() / median(default).as_secs_f64();
                println!(
                    "         beside kube's default Controller (no concurrency limit): {} ({ratio:.2}x by the medians)",
                    if ratio <= 1.0 { "as fast or faster" } else { "slower" },
                );
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let (measuring, objects) = (support::measuring(), support::objects(10_000, 200));
    let _ = tracing_subscriber::registry()
        .with(support::request_counter())
        .try_init();
    println!(
        "kactor owned-children benchmark: {objects} widgets each owning one ConfigMap, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    // `KACTOR_BENCH_ONLY=kactor` (a contender's name as printed) runs that contender only: for
    // profiling it.
    let only = std::env::var("KACTOR_BENCH_ONLY").ok();
    let contenders: Vec<Contender> = [
        Contender::Controller(None),
        Contender::Controller(Some(256)),
        Contender::Kactor,
    ]
    .into_iter()
    .filter(|c| only.as_ref().is_none_or(|only| *only == c.to_string()))
    .collect();
    // This machine's speed drifts by a third within a minute (other tenants): every contender
    // runs in each round, each round starting with the next one, and the tables give each
    // contender's median round.
    let rounds = support::repeats();
    let mut all: Vec<Vec<Figures>> = contenders.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        println!("round {} of {rounds}", round + 1);
        for k in 0..contenders.len() {
            let index = (round + k) % contenders.len();
            all[index].push(measure(contenders[index], objects, measuring).await);
        }
    }
    print_phase(
        "phase A: converge after start (every child created)",
        &all,
        |f| &f.a,
        objects,
    );
    print_phase(
        "phase B: after touching every child (each set wrong, then put back)",
        &all,
        |f| &f.b,
        objects,
    );
    print_memory(&all, objects);
    println!();
    println!("ratio: to the first contender; runs/obj: reconcile runs per object until the clock stopped,");
    println!("  +late: after it, until the next phase; requests: until the clock stopped, the touches not");
    println!("  counted, the watcher's included");
    print_verdict(&all);
}
