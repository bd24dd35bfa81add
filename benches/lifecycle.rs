//! One create handler over many objects, against two floors making the same writes, in one run,
//! against the embedded emulator.
//!
//! Run by hand: `cargo bench --bench lifecycle` (10000 objects; `KACTOR_BENCH_OBJECTS=N` to change);
//! under `cargo test --all-targets` it makes a quick run with 200 instead.
//!
//! Every contender gets a fresh emulator holding the same objects, created before it starts, so each
//! one handles an initial listing. Each object needs two writes: a merge patch of the object with the
//! diff-base annotation (`kopf.zalando.org/last-handled-configuration`, the essence and a newline) and
//! a merge patch of `/status` with the handler's result (`status.create_fn`), the two requests kactor
//! sends for a create handler returning `{"message": "hello"}`. The contenders:
//! * a bare `kube::Client` loop: one list, then the two patches per object, N at once (several N are
//!   tried; the fastest is the floor);
//! * a `kube::runtime::Controller` whose reconcile makes whichever of the two patches the object still
//!   misses, at kube's default concurrency (unbounded) and again at 256 (kactor's handler limit);
//! * kactor with `on_create` (standalone, default settings: no Event per outcome, as in Kopf 1.44),
//!   again with `posting.loggers` on, posting an Event per outcome (a third request per object,
//!   which the floors do not make), and again with no object threads
//!   (`execution.object_threads = 0`: the workers on the actors' thread, each cycle a task on the
//!   runtime, as kactor ran before it had object threads).
//!
//! The clock runs from the contender's start until a separate `kube::runtime::watcher`, started and
//! listed beforehand, has seen every object carry both its result and its diff-base. It prints the
//! seconds, objects/s and the ratio to the floor; the HTTP requests the emulator served per object by
//! kind (from its `emulator request` debug log); and the heap grown per object by the end (emulator
//! growth included, the same for all: the difference between contenders is theirs), the heap
//! allocations made per object (the emulator's included likewise; counted by the benchmark's
//! allocator, per thread, so that counting costs no contended atomic), the CPU seconds the process
//! used (the emulator's included) and the most files it had open at once (two per loopback
//! connection).
//!
//! Each contender runs three rounds (`KACTOR_BENCH_REPEAT`; one in the quick run, and one for a
//! contender whose first took over 30 s), the contenders alternating within a round; a row is the contender's median round, with the range of its rounds
//! below it (on a shared 2-core machine one round can be 30 % off the next).
//!
//! Aim: kactor within 1.3x of the bare loop.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kactor::emulator::{samples, Emulator};
use kactor::prelude::*;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::Value;
use tokio::sync::oneshot;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

mod support;

use support::widgets::{
    detect, emulator_with_widgets, populate, write_all, write_missing, HANDLER,
};
use support::Running;

#[global_allocator]
static ALLOCATOR: support::Counting = support::Counting;

/// The bare loop's concurrencies tried; the fastest is the floor. 256 is kactor's
/// `max_concurrent_handlers`.
const BARE_CONCURRENCIES: [usize; 3] = [16, 64, 256];
/// A contender whose first round took longer than this runs one round only.
const SLOW: Duration = Duration::from_secs(30);
/// No contender may take longer than this (a hang fails the benchmark instead of blocking CI).
const DEADLINE: Duration = Duration::from_secs(600);

// ---- Process figures: CPU time and open files ---------------------------------------------------

/// CPU seconds this process has used (user and system; the emulator's included).
fn cpu_seconds() -> f64 {
    support::cpu_seconds_of("self")
}

/// Samples the number of open files every 100 ms (each loopback connection holds two: the client's
/// and the emulator's); returns the peak when stopped. Each sample lists `/proc/self/fd`, which
/// costs the kernel a lookup per open file, in this process's CPU time: sampled every 10 ms, that
/// was 2 % of the CPU samples of a 10,000-object run with kactor (perf), more for the contenders
/// holding more connections. The clients' connections stay open for the whole run, so a tenth of
/// the samples finds the same peak.
fn sample_open_files(stop: oneshot::Receiver<()>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut peak = support::open_files();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return peak,
                _ = tokio::time::sleep(Duration::from_millis(100)) => peak = peak.max(support::open_files()),
            }
        }
    })
}

// ---- The objects and the writes -----------------------------------------------------------------

async fn new_emulator(objects: usize) -> (Emulator, Api<DynamicObject>) {
    let (emulator, widgets) = emulator_with_widgets(objects * 8 + 10_000).await;
    populate(&widgets, objects).await;
    (emulator, widgets)
}

// ---- Completion: a watcher counting finished objects ---------------------------------------------

// ---- The contenders ------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Contender {
    Bare(usize),
    /// With a concurrency limit, or kube's default (unbounded).
    Controller(Option<u16>),
    Kactor {
        /// Whether the handlers' outcomes are posted as Events (`posting.loggers`; off by default).
        loggers: bool,
        /// Whether the workers and their cycles run on object threads (the default).
        object_threads: bool,
    },
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Contender::Bare(concurrency) => write!(f, "bare loop, {concurrency} at once"),
            Contender::Controller(None) => write!(f, "kube Controller"),
            Contender::Controller(Some(limit)) => write!(f, "kube Controller, {limit} at once"),
            Contender::Kactor {
                loggers: false,
                object_threads: true,
            } => write!(f, "kactor"),
            Contender::Kactor {
                loggers: true,
                object_threads: true,
            } => write!(f, "kactor, outcome events on"),
            Contender::Kactor {
                loggers,
                object_threads: false,
            } => match loggers {
                false => write!(f, "kactor, no object threads"),
                true => write!(f, "kactor, outcome events on, no object threads"),
            },
        }
    }
}

fn bare_loop(api: Api<DynamicObject>, concurrency: usize) -> Running {
    Running::Task(tokio::spawn(async move {
        write_all(&api, concurrency, || {}).await;
    }))
}

/// Reconcile errors, and the first one's message (a retried reconcile writes what is missing).
static RECONCILE_ERRORS: AtomicU64 = AtomicU64::new(0);
static FIRST_ERROR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Writes what the object misses, level-triggered as a Controller's reconcile is: the object's
/// patch event triggers another reconcile, which writes nothing if it already sees the status.
async fn reconcile(
    object: Arc<DynamicObject>,
    api: Arc<Api<DynamicObject>>,
) -> kube::Result<Action> {
    write_missing(&api, &object).await?;
    Ok(Action::await_change())
}

fn controller(api: Api<DynamicObject>, concurrency: Option<u16>) -> Running {
    let mut config = kube::runtime::controller::Config::default();
    if let Some(limit) = concurrency {
        config = config.concurrency(limit);
    }
    Running::Task(tokio::spawn(async move {
        Controller::new_with(
            api.clone(),
            watcher::Config::default(),
            samples::widget_api_resource(),
        )
        .with_config(config)
        .run(
            reconcile,
            |_, error, _| {
                RECONCILE_ERRORS.fetch_add(1, Ordering::Relaxed);
                let _ = FIRST_ERROR.set(error.to_string());
                Action::requeue(Duration::from_millis(100))
            },
            Arc::new(api),
        )
        .for_each(|_| async {})
        .await;
    }))
}

fn kactor(emulator: &Emulator, loggers: bool, object_threads: bool) -> Running {
    let operator = Operator::new()
        .kube_config(emulator.config())
        .standalone()
        .settings(|s| {
            s.posting.loggers = loggers;
            if !object_threads {
                s.execution.object_threads = 0;
            }
        })
        .on_create("widgets.example.com", HANDLER, |_ctx: Ctx| async move {
            Ok::<_, HandlerError>(json!({"message": "hello"}))
        });
    Running::operator(operator)
}

// ---- One measurement -----------------------------------------------------------------------------

struct Figures {
    contender: Contender,
    elapsed: Duration,
    /// Requests served from the start until every object was done, by kind.
    requests: [u64; 6],
    /// Requests served after that, until the contender had stopped.
    requests_after: u64,
    heap_grown: u64,
    /// Heap allocations made (the emulator's included) from the start until done.
    allocations: u64,
    /// CPU seconds used by the process (emulator included) from the start until done.
    cpu: f64,
    /// The most files open at once, sampled.
    peak_files: usize,
    /// Failed reconciles (Controllers only).
    errors: u64,
    /// What the first object carries at the end: its annotations and status, to check that every
    /// contender wrote the same.
    written: (Value, Value),
}

async fn measure(contender: Contender, objects: usize) -> Figures {
    support::settle().await;
    let (emulator, widgets) = new_emulator(objects).await;
    let detector = detect(widgets.clone(), objects);
    detector.listed.await.expect("the completion watcher lists");
    support::settle().await;
    let (requests_before, heap_before) = (support::requests_now(), support::live_bytes());
    let allocations_before = support::allocations();

    RECONCILE_ERRORS.store(0, Ordering::Relaxed);
    let (stop_sampling, sampling) = oneshot::channel();
    let sampler = sample_open_files(sampling);
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let running = match contender {
        Contender::Bare(concurrency) => bare_loop(widgets.clone(), concurrency),
        Contender::Controller(concurrency) => controller(widgets.clone(), concurrency),
        Contender::Kactor {
            loggers,
            object_threads,
        } => kactor(&emulator, loggers, object_threads),
    };
    let done = match tokio::time::timeout(DEADLINE, detector.done).await {
        Ok(done) => done.expect("the completion watcher"),
        Err(_) => panic!(
            "{contender}: only {} of {objects} objects done after {DEADLINE:?}",
            detector.finished.load(Ordering::Relaxed)
        ),
    };
    let elapsed = done - started;
    println!("  {contender}: {:.3} s", elapsed.as_secs_f64());
    let (requests_done, heap_done) = (support::requests_now(), support::live_bytes());
    let allocations = support::allocations() - allocations_before;
    let cpu = cpu_seconds() - cpu_before;
    let _ = stop_sampling.send(());
    let peak_files = sampler.await.expect("the sampler");
    running.stop().await;
    let requests_stopped = support::requests_now();
    let first = widgets.get("w000000").await.expect("get");
    let written = (
        json!(first.metadata.annotations),
        first.data["status"].clone(),
    );
    drop(emulator);

    Figures {
        contender,
        elapsed,
        requests: std::array::from_fn(|k| requests_done[k] - requests_before[k]),
        requests_after: requests_stopped
            .iter()
            .zip(&requests_done)
            .map(|(stopped, done)| stopped - done)
            .sum(),
        heap_grown: heap_done.saturating_sub(heap_before),
        allocations,
        cpu,
        peak_files,
        errors: RECONCILE_ERRORS.load(Ordering::Relaxed),
        written,
    }
}

type Summary<'a> = support::Summary<'a, Figures>;

fn summarize(rounds: &[Figures]) -> Summary<'_> {
    support::summarize(rounds, |f| f.elapsed.as_secs_f64(), |f| f.cpu)
}

fn print_row(summary: &Summary, floor: Duration, objects: usize) {
    let figures = summary.median;
    let per_object = |count: u64| count as f64 / objects as f64;
    let total: u64 = figures.requests.iter().sum();
    let kinds: Vec<String> = support::KINDS
        .iter()
        .zip(figures.requests)
        .filter(|(_, count)| *count > 0)
        .map(|(kind, count)| format!("{kind} {:.2}", per_object(count)))
        .collect();
    println!(
        "{:<28} {:>8.3} {:>10.0} {:>7.2}x {:>7.2} {:>6} {:>10.0} {:>11.0}   {:.2} ({}; +{} after done)",
        figures.contender.to_string(),
        figures.elapsed.as_secs_f64(),
        objects as f64 / figures.elapsed.as_secs_f64(),
        figures.elapsed.as_secs_f64() / floor.as_secs_f64(),
        figures.cpu,
        figures.peak_files,
        figures.heap_grown as f64 / objects as f64,
        per_object(figures.allocations),
        per_object(total),
        kinds.join(", "),
        figures.requests_after,
    );
    if summary.seconds.0 < summary.seconds.1 {
        println!(
            "{:<28} rounds: {:.3}-{:.3} s, {:.2}-{:.2} CPU s",
            "", summary.seconds.0, summary.seconds.1, summary.cpu.0, summary.cpu.1
        );
    }
    if figures.errors > 0 {
        println!("{:<28} {} failed reconciles, retried", "", figures.errors);
    }
}

/// Whether this process may open the files kube's unbounded `Controller` needs: a connection per
/// object at once, two files each (both ends are in this process), and a margin. The soft limit is
/// raised to the hard one first. Below it, its reconciles fail to connect and retry for minutes.
fn files_for_unbounded(objects: usize) -> Result<(), String> {
    let needed = 2 * objects as u64 + 2048;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the valid rlimit it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(format!(
            "RLIMIT_NOFILE unknown: {}",
            std::io::Error::last_os_error()
        ));
    }
    if limit.rlim_cur < needed && limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads the valid rlimit it is given; raising the soft limit up to the
        // hard one needs no privilege.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
        // SAFETY: as above.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    }
    if limit.rlim_cur < needed {
        return Err(format!(
            "it opens a connection per object at once, two files each in this process: about \
             {needed} open files, and RLIMIT_NOFILE allows {} (raise the hard limit, ulimit -Hn, \
             to run it)",
            limit.rlim_cur
        ));
    }
    Ok(())
}

/// Every contender's rounds (see [`support::repeats`]), in the contenders' order.
async fn run_all(objects: usize) -> Vec<Vec<Figures>> {
    // `KACTOR_BENCH_ONLY=kactor` (a contender's name as printed) runs the bare loop at 256 and that
    // contender only: for profiling it.
    let only = std::env::var("KACTOR_BENCH_ONLY").ok();
    let mut contenders: Vec<Contender> = BARE_CONCURRENCIES.map(Contender::Bare).to_vec();
    contenders.extend([
        Contender::Controller(None),
        Contender::Controller(Some(256)),
        Contender::Kactor {
            loggers: false,
            object_threads: true,
        },
        Contender::Kactor {
            loggers: true,
            object_threads: true,
        },
        Contender::Kactor {
            loggers: false,
            object_threads: false,
        },
    ]);
    contenders.retain(|contender| match (&only, contender) {
        (None, _) | (Some(_), Contender::Bare(256)) => true,
        (Some(only), contender) => contender.to_string() == *only,
    });
    let unbounded = |contender: &Contender| matches!(contender, Contender::Controller(None));
    if contenders.iter().any(unbounded) {
        if let Err(why) = files_for_unbounded(objects) {
            println!("kube Controller (unbounded): not run: {why}");
            contenders.retain(|contender| !unbounded(contender));
        }
    }
    let mut all: Vec<Vec<Figures>> = contenders.iter().map(|_| Vec::new()).collect();
    let rounds = support::repeats();
    for round in 0..rounds {
        if rounds > 1 {
            println!("round {} of {rounds}", round + 1);
        }
        for (contender, figures) in contenders.iter().zip(&mut all) {
            // A contender that took half a minute (kube's unbounded Controller, opening a
            // connection per reconcile) is not run again: its rounds would take most of the run.
            if figures.first().is_some_and(|f| f.elapsed > SLOW) {
                continue;
            }
            figures.push(measure(*contender, objects).await);
        }
    }
    all
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let objects = support::objects(10_000, 200);
    let _ = tracing_subscriber::registry()
        .with(support::request_counter())
        .try_init();
    println!(
        "kactor lifecycle benchmark: {objects} objects, one create handler returning a value, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let rounds = run_all(objects).await;
    let summaries: Vec<Summary> = rounds.iter().map(|r| summarize(r)).collect();
    let all: Vec<&Figures> = summaries.iter().map(|s| s.median).collect();
    let (floor_index, floor) = all
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.contender, Contender::Bare(_)))
        .map(|(i, f)| (i, f.elapsed))
        .min_by_key(|(_, elapsed)| *elapsed)
        .expect("a bare loop ran");

    println!();
    println!(
        "{:<28} {:>8} {:>10} {:>8} {:>7} {:>6} {:>10} {:>11}   requests per object",
        "contender", "seconds", "objects/s", "ratio", "cpu s", "files", "heap B/obj", "allocs/obj"
    );
    for summary in &summaries {
        print_row(summary, floor, objects);
    }
    println!();
    println!(
        "floor: the fastest bare loop ({}); kube's Controller default concurrency is unbounded; \
         each row is the contender's median of {} round(s) (KACTOR_BENCH_REPEAT)",
        all[floor_index].contender,
        support::repeats()
    );
    if let Some(error) = FIRST_ERROR.get() {
        println!("the first failed reconcile: {error}");
    }
    for figures in &all[1..] {
        if figures.written != all[0].written {
            println!(
                "NOTE: {} wrote {} beside {} by {}",
                figures.contender,
                json!(figures.written),
                json!(all[0].written),
                all[0].contender
            );
        }
    }
    let kactor = all.iter().find(|f| {
        matches!(
            f.contender,
            Contender::Kactor {
                loggers: false,
                object_threads: true
            }
        )
    });
    if let Some(kactor) = kactor {
        let met = |yes: bool| if yes { "met" } else { "NOT met" };
        let ratio = kactor.elapsed.as_secs_f64() / floor.as_secs_f64();
        println!(
            "aim: within 1.3x of the bare loop: {} ({ratio:.2}x)",
            met(ratio <= 1.3)
        );
        let floor_cpu = all[floor_index].cpu;
        let cpu_ratio = kactor.cpu / floor_cpu;
        println!(
            "aim: CPU within 1.5x of the floor's: {} ({:.2} s against {floor_cpu:.2} s, {cpu_ratio:.2}x)",
            met(cpu_ratio <= 1.5),
            kactor.cpu
        );
        let controllers: Vec<&&Figures> = all
            .iter()
            .filter(|f| matches!(f.contender, Contender::Controller(_)))
            .collect();
        if let Some(fastest) = controllers.iter().min_by_key(|f| f.elapsed) {
            println!(
                "aim: faster than kube's Controller at every concurrency run here: {} ({:.3} s against {}'s {:.3} s, {:.2}x)",
                met(kactor.elapsed < fastest.elapsed),
                kactor.elapsed.as_secs_f64(),
                fastest.contender,
                fastest.elapsed.as_secs_f64(),
                kactor.elapsed.as_secs_f64() / fastest.elapsed.as_secs_f64()
            );
        }
    }
}
