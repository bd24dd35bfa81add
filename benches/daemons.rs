//! Daemons and timers at scale, against the embedded emulator: 10,000 objects with a 1-second timer
//! each, then 10,000 objects with an idle daemon each.
//!
//! Run by hand: `cargo bench --bench daemons` (10000 objects, a 10 s window; `KACTOR_BENCH_OBJECTS=N`
//! and `KACTOR_BENCH_WINDOW=SECONDS` to change; `KACTOR_BENCH_LOGS=1` formats kactor's INFO logs into a
//! sink, to see what logging costs); under `cargo test --all-targets` it makes a quick run
//! with 200 objects and a 2 s window instead.
//!
//! **Timers**: every object has `Timer::every(1 s)` with a handler that does nothing. From the
//! operator's start until every timer has started (`Observer::daemon_started`) it prints the wall and
//! CPU seconds; after a warm-up (every timer has run at least twice) it measures a window of steady
//! state (≈ N calls per second): the timers' lateness (`Observer::timer_lateness`, the delay
//! between when a call was due and when it started: p50, p99, p99.9, max), the calls made, and the
//! CPU used as a fraction of one core.
//!
//! **Daemons**: every object has a daemon that awaits `ctx.stopped().wait()`. It prints the heap grown
//! per daemon once all have started and the API is quiet, against the same objects with no operator,
//! and how that splits between the operator (what is freed when it stops) and the emulator (what
//! stays: the objects' finalizers and their history). A baseline on the same objects, every object's
//! worker kept alive by a no-op `on_event` handler, shows what the daemon adds to a live worker.
//!
//! CPU is read from `/proc` per thread, so the figures split by who used it: the emulator runs on a
//! runtime of its own (threads `emulator`), the operator on another (threads `operator`: handlers,
//! daemon and timer tasks, the client, the watch streams) plus its actors' thread (`kactor-actors`);
//! the benchmark's own driver (the main thread) is what remains. The requests the emulator serves
//! are counted from its debug log, to show that it is idle during the steady state.
//!
//! Aims: timers' p99 lateness under 20 ms, and under a quarter of one core, at 10,000 timers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactor::daemons::SpawningKind;
use kactor::emulator::{samples, Emulator};
use kactor::observe::Observer as Observe;
use kactor::prelude::*;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

mod support;

use support::widgets::populate;

#[global_allocator]
static ALLOCATOR: support::Counting = support::Counting;

const RESOURCE: &str = "widgets.example.com";
/// The timers' interval.
const INTERVAL: Duration = Duration::from_secs(1);
/// No phase may take longer than this (a hang fails the benchmark instead of blocking CI).
const DEADLINE: Duration = Duration::from_secs(120);
/// The thread names by which CPU is split.
const EMULATOR_THREADS: &str = "emulator";
const OPERATOR_THREADS: &str = "operator";
const ACTORS_THREAD: &str = "kactor-actors";

// ---- Requests served, counted from the emulator's debug log -------------------------------------

/// Counts the emulator's requests; every other callsite stays disabled (the operator logs nothing,
/// as with no subscriber), unless `logs`: then kactor's INFO logs are formatted (plain text) and
/// thrown away, to see what logging costs (a timer logs `Handler 'tick' succeeded.` per call).
fn count_requests(logs: bool) {
    let formatted = logs.then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("kactor", tracing::Level::INFO)
                    .with_target("kactor_emulator", tracing::Level::WARN),
            )
    });
    let _ = tracing_subscriber::registry()
        .with(support::request_counter())
        .with(formatted)
        .try_init();
}

fn describe_requests(requests: support::Requests, objects: usize) -> String {
    let total: u64 = requests.iter().sum();
    let kinds: Vec<String> = support::KINDS
        .iter()
        .zip(requests)
        .filter(|(_, count)| *count > 0)
        .map(|(kind, count)| format!("{kind} {count}"))
        .collect();
    if total == 0 {
        return "0".to_string();
    }
    format!(
        "{total} ({:.2} per object: {})",
        total as f64 / objects as f64,
        kinds.join(", ")
    )
}

// ---- CPU time, per thread -------------------------------------------------------------------------

/// The CPU seconds used so far: by the whole process (exited threads included) and by each living
/// thread, with its name.
#[derive(Clone, Default)]
struct CpuSnapshot {
    process: f64,
    threads: HashMap<u32, (String, f64)>,
}

fn cpu_now() -> CpuSnapshot {
    let process = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| support::parse_stat(&stat))
        .map_or(0.0, |(_, seconds)| seconds);
    let mut threads = HashMap::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Some(parsed) = std::fs::read_to_string(task.path().join("stat"))
                .ok()
                .and_then(|stat| support::parse_stat(&stat))
            {
                threads.insert(tid, parsed);
            }
        }
    }
    CpuSnapshot { process, threads }
}

/// CPU seconds used between two snapshots, split by who used them.
#[derive(Clone, Copy, Default)]
struct CpuUsed {
    process: f64,
    /// The operator's runtime: handlers, daemon and timer tasks, the client, the watch streams.
    runtime: f64,
    /// The operator's actors' thread: supervisors and object workers.
    actors: f64,
    emulator: f64,
}

impl CpuUsed {
    fn between(before: &CpuSnapshot, after: &CpuSnapshot) -> Self {
        let mut used = CpuUsed {
            process: after.process - before.process,
            ..CpuUsed::default()
        };
        for (tid, (name, seconds)) in &after.threads {
            let earlier = before.threads.get(tid).map_or(0.0, |(_, s)| *s);
            let delta = seconds - earlier;
            if name.starts_with(OPERATOR_THREADS) {
                used.runtime += delta;
            } else if name.starts_with(ACTORS_THREAD) {
                used.actors += delta;
            } else if name.starts_with(EMULATOR_THREADS) {
                used.emulator += delta;
            }
        }
        used
    }

    fn operator(&self) -> f64 {
        self.runtime + self.actors
    }

    /// The rest: the benchmark's driver, and threads that ended in between.
    fn other(&self) -> f64 {
        (self.process - self.operator() - self.emulator).max(0.0)
    }

    fn describe(&self) -> String {
        format!(
            "{:.2} s (operator {:.2} = runtime {:.2} + actors {:.2}; emulator {:.2}; benchmark and other {:.2})",
            self.process,
            self.operator(),
            self.runtime,
            self.actors,
            self.emulator,
            self.other()
        )
    }
}

// ---- Lateness histogram ---------------------------------------------------------------------------

/// The width of a lateness bucket.
const BUCKET_NS: u64 = 10_000;
/// 10 µs buckets up to 200 ms; the last one holds everything later.
const BUCKETS: usize = 20_000;

/// Timers' lateness: a histogram of 10 µs buckets, and the largest value since the last reset. Kept
/// in a static, so that neither the heap figures nor the timers' work include it.
struct Lateness {
    counts: [AtomicU64; BUCKETS],
    max_ns: AtomicU64,
}

static LATENESS: Lateness = Lateness {
    counts: [const { AtomicU64::new(0) }; BUCKETS],
    max_ns: AtomicU64::new(0),
};

impl Lateness {
    fn record(&self, lateness: Duration) {
        let ns = u64::try_from(lateness.as_nanos()).unwrap_or(u64::MAX);
        let bucket = usize::try_from(ns / BUCKET_NS).map_or(BUCKETS - 1, |b| b.min(BUCKETS - 1));
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Forgets the largest value; returns it.
    fn take_max(&self) -> Duration {
        Duration::from_nanos(self.max_ns.swap(0, Ordering::Relaxed))
    }
}

/// The lateness recorded between two snapshots.
struct Distribution {
    counts: Vec<u64>,
    total: u64,
    max: Duration,
}

impl Distribution {
    fn between(before: &[u64], after: &[u64], max: Duration) -> Self {
        let counts: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        let total = counts.iter().sum();
        Distribution { counts, total, max }
    }

    /// The upper edge of the bucket holding quantile `q` (the largest value for the last bucket).
    fn quantile(&self, q: f64) -> Duration {
        let rank = ((q * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                if bucket == BUCKETS - 1 {
                    return self.max;
                }
                return Duration::from_nanos((bucket as u64 + 1) * BUCKET_NS).min(self.max);
            }
        }
        self.max
    }

    fn mean(&self) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        // Bucket midpoints.
        let sum: f64 = self
            .counts
            .iter()
            .enumerate()
            .map(|(bucket, count)| (bucket as f64 + 0.5) * BUCKET_NS as f64 * *count as f64)
            .sum();
        Duration::from_nanos((sum / self.total as f64) as u64)
    }

    /// How many were later than `limit`.
    fn later_than(&self, limit: Duration) -> u64 {
        let first = usize::try_from(limit.as_nanos() / u128::from(BUCKET_NS)).unwrap_or(BUCKETS);
        self.counts.iter().skip(first).sum()
    }
}

fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

// ---- The observer ---------------------------------------------------------------------------------

/// Counts starts and exits of daemons and timers, and records the timers' lateness.
#[derive(Default)]
struct Observer {
    started: AtomicUsize,
    exited: AtomicUsize,
}

impl Observe for Observer {
    fn daemon_started(&self, _resource: &str, _kind: SpawningKind) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    fn daemon_exited(&self, _resource: &str, _kind: SpawningKind) {
        self.exited.fetch_add(1, Ordering::Relaxed);
    }

    fn timer_lateness(&self, _resource: &str, _handler: &str, lateness: Duration) {
        LATENESS.record(lateness);
    }
}

// ---- Waiting --------------------------------------------------------------------------------------

/// Polls `done` every 10 ms until it holds; panics with `what` after [`DEADLINE`].
async fn wait_until(what: impl Fn() -> String, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > DEADLINE {
            panic!("waited {DEADLINE:?} for {}", what());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the emulator has served no request for `quiet` (the operator has written what it
/// writes at startup).
async fn until_api_quiet(quiet: Duration) {
    let started = Instant::now();
    let mut last = support::requests_now();
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        if started.elapsed() > DEADLINE {
            panic!("the API was still busy after {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = support::requests_now();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

/// Gives what was freed or closed time to settle (connections ending, tasks dropped), then reads
/// the heap.
async fn settled_heap() -> u64 {
    tokio::time::sleep(Duration::from_millis(500)).await;
    support::live_bytes()
}

// ---- The emulator, the objects, the operator ----------------------------------------------------

/// Starts an emulator on the emulator's runtime, installs the widgets and creates `objects` of
/// them (16 creates at once, through a client on the operator's runtime, dropped afterwards).
async fn new_emulator(emulator_runtime: &Runtime, objects: usize) -> Emulator {
    let emulator = emulator_runtime
        .spawn(
            Emulator::builder()
                .history_limit(objects * 4 + 10_000)
                .start(),
        )
        .await
        .expect("the emulator's runtime")
        .expect("emulator");
    let client = kube::Client::try_from(emulator.config()).expect("a client");
    let widgets = samples::install_widgets(&client).await.expect("CRD");
    let started = Instant::now();
    populate(&widgets, objects).await;
    println!(
        "  created {objects} objects in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    emulator
}

/// A running operator, and how to stop it.
struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<kactor::Result<()>>,
    started: Instant,
    cpu: CpuSnapshot,
}

/// Starts `operator` on the current (the operator's) runtime, with its own client.
fn start(emulator: &Emulator, operator: Operator) -> Running {
    let client = kube::Client::try_from(emulator.config()).expect("a client");
    let operator = operator.client(client).standalone();
    let (stop, stopped) = oneshot::channel::<()>();
    let cpu = cpu_now();
    let started = Instant::now();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    Running {
        stop,
        task,
        started,
        cpu,
    }
}

impl Running {
    /// Stops the operator; returns how long it took.
    async fn stop(self) -> Duration {
        let started = Instant::now();
        let _ = self.stop.send(());
        match tokio::time::timeout(DEADLINE, self.task).await {
            Ok(ended) => ended.expect("the operator task").expect("the operator"),
            Err(_) => panic!("the operator did not stop within {DEADLINE:?}"),
        }
        started.elapsed()
    }
}

/// Waits until `count` daemons or timers have started; prints the wall and CPU used since the
/// operator's start.
async fn until_started(running: &Running, observer: &Observer, count: usize, what: &str) {
    let requests = support::requests_now();
    wait_until(
        || {
            format!(
                "{count} {what} to start ({} did)",
                observer.started.load(Ordering::Relaxed)
            )
        },
        || observer.started.load(Ordering::Relaxed) >= count,
    )
    .await;
    let elapsed = running.started.elapsed();
    let cpu = CpuUsed::between(&running.cpu, &cpu_now());
    println!(
        "  {count} {what} started in {:.2} s; CPU {}",
        elapsed.as_secs_f64(),
        cpu.describe()
    );
    println!(
        "  requests served from the start until then (discovery and the listing included; finalizer patches still in flight not): {}",
        describe_requests(support::requests_since(requests), count)
    );
}

// ---- Timers ---------------------------------------------------------------------------------------

/// The index of a widget named `w000123`.
fn index_of(name: &str) -> Option<usize> {
    name.strip_prefix('w')?.parse().ok()
}

#[allow(
    clippy::too_many_lines,
    reason = "one benchmark scenario with its report, read top to bottom"
)]
async fn timers(emulator_runtime: &Runtime, objects: usize, window: Duration) {
    println!("timers: {objects} objects, Timer::every({INTERVAL:?}), a handler that does nothing");
    let emulator = new_emulator(emulator_runtime, objects).await;
    let heap_before = settled_heap().await;

    // Calls per object, to know when every timer has run twice, and how evenly they run.
    let calls: Arc<Vec<AtomicU32>> = Arc::new((0..objects).map(|_| AtomicU32::new(0)).collect());
    let observer = Arc::new(Observer::default());
    let operator = Operator::new().observer(observer.clone()).timer(
        RESOURCE,
        "tick",
        Timer::every(INTERVAL),
        {
            let calls = calls.clone();
            move |ctx: Ctx| {
                if let Some(count) = index_of(ctx.name()).and_then(|i| calls.get(i)) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                async { Ok::<_, HandlerError>(()) }
            }
        },
    );
    let running = start(&emulator, operator);
    until_started(&running, &observer, objects, "timers").await;

    let least = || calls.iter().map(|c| c.load(Ordering::Relaxed)).min();
    wait_until(
        || format!("every timer to run twice (the least has {:?})", least()),
        || least().unwrap_or(0) >= 2,
    )
    .await;
    let warm_up = running.started.elapsed();
    until_api_quiet(Duration::from_millis(500)).await;
    println!(
        "  warm-up: every timer had run at least twice {:.2} s after the start",
        warm_up.as_secs_f64()
    );

    // The window.
    let per_object_before: Vec<u32> = calls.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let requests = support::requests_now();
    let lateness_before = LATENESS.snapshot();
    LATENESS.take_max();
    let cpu_before = cpu_now();
    let started = Instant::now();
    let mut per_second = Vec::new();
    let mut last = lateness_before.iter().sum::<u64>();
    let mut next = started;
    while started.elapsed() < window {
        next += Duration::from_secs(1);
        tokio::time::sleep_until(next.into()).await;
        let now: u64 = LATENESS.snapshot().iter().sum();
        per_second.push(now - last);
        last = now;
    }
    let wall = started.elapsed();
    let cpu = CpuUsed::between(&cpu_before, &cpu_now());
    let lateness =
        Distribution::between(&lateness_before, &LATENESS.snapshot(), LATENESS.take_max());
    let requests = support::requests_since(requests);
    let per_object: Vec<u32> = calls
        .iter()
        .zip(&per_object_before)
        .map(|(c, before)| c.load(Ordering::Relaxed) - before)
        .collect();
    let (heap_running, files_running) = (support::live_bytes(), support::open_files());

    let stopped_in = running.stop().await;
    drop(emulator);

    let seconds = wall.as_secs_f64();
    let share = |cpu: f64| cpu / seconds;
    println!(
        "  steady state, a window of {seconds:.2} s: {} calls, {:.0} per second (each second: {})",
        lateness.total,
        lateness.total as f64 / seconds,
        per_second
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  calls per object in the window: min {}, max {}",
        per_object.iter().min().copied().unwrap_or(0),
        per_object.iter().max().copied().unwrap_or(0)
    );
    println!(
        "  lateness: p50 {}, p99 {}, p99.9 {}, max {}, mean {}; {} calls later than 20 ms",
        ms(lateness.quantile(0.50)),
        ms(lateness.quantile(0.99)),
        ms(lateness.quantile(0.999)),
        ms(lateness.max),
        ms(lateness.mean()),
        lateness.later_than(Duration::from_millis(20)),
    );
    println!(
        "  CPU in the window: {}; as a share of one core: process {:.3}, operator {:.3} (runtime {:.3}, actors {:.3}), emulator {:.3}",
        cpu.describe(),
        share(cpu.process),
        share(cpu.operator()),
        share(cpu.runtime),
        share(cpu.actors),
        share(cpu.emulator),
    );
    println!(
        "  CPU per timer call: {:.1} µs (operator's threads only)",
        cpu.operator() / lateness.total.max(1) as f64 * 1e6
    );
    println!(
        "  requests served by the emulator in the window: {} (the handlers make no API calls and return nothing to store: the emulator should be idle)",
        describe_requests(requests, objects)
    );
    println!(
        "  heap grown with the timers running: {:.0} B per object (the operator's, and the emulator's growth from its writes); {files_running} files open",
        heap_running.saturating_sub(heap_before) as f64 / objects as f64
    );
    println!(
        "  the operator stopped in {:.2} s",
        stopped_in.as_secs_f64()
    );

    let p99 = lateness.quantile(0.99);
    let operator_share = share(cpu.operator());
    let process_share = share(cpu.process);
    println!(
        "  aim: p99 lateness under 20 ms: {} ({}); under a quarter of one core: {} (operator {:.3}, process {:.3})",
        met(p99 < Duration::from_millis(20)),
        ms(p99),
        met(operator_share < 0.25 && process_share < 0.25),
        operator_share,
        process_share,
    );
}

fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "NOT met"
    }
}

// ---- Daemons --------------------------------------------------------------------------------------

async fn daemons(emulator_runtime: &Runtime, objects: usize) {
    println!("daemons: {objects} objects, a daemon that awaits ctx.stopped().wait()");
    let heap_empty = settled_heap().await;
    let emulator = new_emulator(emulator_runtime, objects).await;
    let observer = Arc::new(Observer::default());
    let handled = Arc::new(AtomicUsize::new(0));
    let per = |bytes: i128| bytes as f64 / objects as f64;
    let diff = |a: u64, b: u64| i128::from(a) - i128::from(b);

    // A baseline first, on the same objects (it writes nothing to them): every object's worker kept
    // alive (no idling) by an `on_event` handler that does nothing, and no daemon.
    let heap_objects = settled_heap().await;
    let operator = Operator::new()
        .settings(|s| s.queueing.idle_timeout = Duration::from_secs(3600))
        .on_event(RESOURCE, "noop", {
            let handled = handled.clone();
            move |_ctx: Ctx| {
                handled.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, HandlerError>(()) }
            }
        });
    let running = start(&emulator, operator);
    wait_until(
        || format!("{objects} events handled ({handled:?})"),
        || handled.load(Ordering::Relaxed) >= objects,
    )
    .await;
    until_api_quiet(Duration::from_secs(1)).await;
    let (heap_workers, files_workers) = (settled_heap().await, support::open_files());
    running.stop().await;
    let heap_workers_stopped = settled_heap().await;

    // The daemons.
    let heap_objects_again = heap_workers_stopped;
    let operator = Operator::new().observer(observer.clone()).daemon(
        RESOURCE,
        "idle",
        Daemon::new(),
        |ctx: Ctx| async move {
            ctx.stopped().wait().await;
            Ok::<_, HandlerError>(())
        },
    );
    let running = start(&emulator, operator);
    until_started(&running, &observer, objects, "daemons").await;
    until_api_quiet(Duration::from_secs(1)).await;
    let (heap_daemons, files_daemons) = (settled_heap().await, support::open_files());

    let stopped_in = running.stop().await;
    wait_until(
        || {
            format!(
                "{objects} daemons to exit ({} did)",
                observer.exited.load(Ordering::Relaxed)
            )
        },
        || observer.exited.load(Ordering::Relaxed) >= objects,
    )
    .await;
    let heap_stopped = settled_heap().await;
    drop(emulator);

    let operators_daemons = per(diff(heap_daemons, heap_stopped));
    let operators_workers = per(diff(heap_workers, heap_workers_stopped));
    println!(
        "  the emulator holds {:.0} B per object before any operator starts",
        per(diff(heap_objects, heap_empty))
    );
    println!(
        "  heap per idle daemon: {:.0} B (all {objects} running, API quiet, minus the same objects with no operator)",
        per(diff(heap_daemons, heap_objects_again))
    );
    println!(
        "    of which the operator's: {operators_daemons:.0} B (freed when it stopped: the worker actor, its cached body and memory, the daemon's task, the watch, the client and both ends of its connections)",
    );
    println!(
        "    and the emulator's growth: {:.0} B (kept after the stop: the objects' finalizers and the history of those writes)",
        per(diff(heap_stopped, heap_objects_again))
    );
    println!(
        "    {files_daemons} files open then ({files_workers} in the baseline below): two per loopback connection, so about {} connections opened for the finalizers' burst of patches and kept idle in the client's pool (their buffers, both ends, are in the figures)",
        files_daemons.saturating_sub(files_workers) / 2
    );
    println!(
        "  baseline, every object's worker kept alive by a no-op on_event handler, no daemon: {operators_workers:.0} B per object (the operator's, freed when it stopped; the emulator grew by {:.0} B)",
        per(diff(heap_workers_stopped, heap_objects))
    );
    println!(
        "  so the daemon itself (its task, stop signal, live body channel, the finalizer in the body) costs about {:.0} B beyond a live worker (the idle connections included)",
        operators_daemons - operators_workers
    );
    println!(
        "  the operator stopped in {:.2} s ({objects} daemons signalled OPERATOR_EXITING)",
        stopped_in.as_secs_f64()
    );
}

// ---- Main -----------------------------------------------------------------------------------------

fn runtime(name: &str, workers: Option<usize>) -> Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.thread_name(name).enable_all();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder.build().expect("a runtime")
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` does not, and then a small run proves
    // the benchmark still works without spending the test suite's time.
    let measuring = std::env::args().any(|a| a == "--bench");
    let objects: usize = env_or("KACTOR_BENCH_OBJECTS", if measuring { 10_000 } else { 200 });
    let window = Duration::from_secs(env_or(
        "KACTOR_BENCH_WINDOW",
        if measuring { 10 } else { 2 },
    ));
    let logs = std::env::var("KACTOR_BENCH_LOGS").is_ok_and(|v| v == "1");
    count_requests(logs);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "kactor daemons benchmark: {objects} objects, {cores} cores; the emulator on a runtime of its own (1 thread), the operator on another ({cores} threads) and its actors' thread; kactor's logs {}",
        if logs {
            "formatted at INFO into a sink (KACTOR_BENCH_LOGS=1)"
        } else {
            "off (no subscriber for them; KACTOR_BENCH_LOGS=1 to format them)"
        }
    );

    // The emulator's runtime serves HTTP only; the operator's runs the operator and, on its main
    // thread (outside the workers), this driver.
    let emulator_runtime = runtime(EMULATOR_THREADS, Some(1));
    let operator_runtime = runtime(OPERATOR_THREADS, None);
    operator_runtime.block_on(async {
        timers(&emulator_runtime, objects, window).await;
        println!();
        daemons(&emulator_runtime, objects).await;
    });
}
