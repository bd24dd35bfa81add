//! Object actors at scale, against the embedded emulator: `ask` round trips to 10,000 actors, and
//! the memory an idle actor costs at 100,000 objects.
//!
//! Run by hand: `cargo bench --bench actors` (`KACTOR_BENCH_OBJECTS=N` actors for the asks, 10000;
//! `KACTOR_BENCH_IDLE_OBJECTS=N` objects for the memory, 100000; `KACTOR_BENCH_WINDOW=SECONDS` per
//! concurrency, 3); under `cargo test --all-targets` it makes a quick run with 200 and 1,000 objects
//! and a 0.3 s window instead.
//!
//! **Asks**: an operator serving N widgets with an actor type that has no lifecycle method (so that
//! nothing but messages runs) answers `ask`s sent to random objects by many tasks at once, at several
//! numbers of asks in flight, each for the window. It prints the round trips per second and their
//! latency (p50, p99), beside the floor: the same round trips through a bare tokio channel and
//! oneshot to one task per object, without kactor's table, handles and metrics.
//!
//! **Memory**: three processes (this program run again), each with the emulator holding the same M
//! widgets and an operator watching them with a no-op `on_event` handler, its workers idled away;
//! one also has an actor per object, one a bare tokio task per object awaiting a bounded channel
//! (the floor: what an actor is made of). Each prints its resident set (RSS, what the user pays for) and
//! its live heap (a counting allocator) once quiet, the smaller of two runs; the difference per
//! object is what an idle actor costs.
//!
//! Aims: over 100,000 asks per second; an idle actor's cost small beside the object it serves.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactor::actors::{ActorOptions, ActorRef, Actors, Method, ObjectActor, ObjectKey};
use kactor::emulator::{samples, Emulator};
use kactor::prelude::*;
use kube::api::{Api, DynamicObject, PostParams};
use tokio::sync::{mpsc, oneshot};

mod support;

#[global_allocator]
static ALLOCATOR: support::Counting = support::Counting;

const RESOURCE: &str = "widgets.example.com";
/// Asks in flight at once, per measurement.
const CONCURRENCIES: [usize; 3] = [1, 16, 256];
/// No phase may take longer than this (a hang fails the benchmark instead of blocking CI).
const DEADLINE: Duration = Duration::from_secs(600);
/// The environment variable that makes this program one of the memory contenders.
const ROLE: &str = "KACTOR_BENCH_ROLE";

/// The benchmark's actor: a counter per object.
struct Counter {
    count: u64,
}

impl ObjectActor for Counter {
    type Resource = DynamicObject;
    type Message = ();
    type Reply = u64;

    async fn on_message(&mut self, (): (), _me: &ActorRef<Self>) -> u64 {
        self.count += 1;
        self.count
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An actor with no lifecycle method: made per object, handling messages only.
fn options() -> ActorOptions {
    ActorOptions::new("counter")
        .without(Method::Create)
        .without(Method::Update)
}

/// An emulator holding `objects` widgets in `default`.
async fn emulator_with(objects: usize) -> Emulator {
    let emulator = Emulator::start().await.expect("the emulator starts");
    let client = emulator.in_process_client();
    let widgets: Api<DynamicObject> = samples::install_widgets(&client).await.unwrap();
    let names: Vec<String> = (0..objects).map(|i| format!("w{i:06}")).collect();
    futures::future::join_all(names.chunks(objects.div_ceil(16).max(1)).map(|chunk| {
        let widgets = widgets.clone();
        async move {
            for name in chunk {
                let body = serde_json::from_value(samples::widget(name, 1)).unwrap();
                widgets.create(&PostParams::default(), &body).await.unwrap();
            }
        }
    }))
    .await;
    emulator
}

/// A quiet operator on the emulator: standalone, workers idle after a second.
fn operator(emulator: &Emulator) -> Operator {
    Operator::new()
        .client(emulator.in_process_client())
        .standalone()
        .settings(|s| {
            s.queueing.idle_timeout = Duration::from_secs(1);
            s.queueing.exit_timeout = Duration::from_secs(5);
        })
}

/// Runs `operator` until the returned sender is dropped or fired.
fn run(
    operator: Operator,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<kactor::Result<()>>,
) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    (stop, task)
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Round trips per second and latencies, at one concurrency.
struct Rate {
    in_flight: usize,
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// Sends asks with `ask` from `in_flight` tasks for `window`, each to a pseudo-random object.
async fn measure<F, Fut>(in_flight: usize, objects: usize, window: Duration, ask: F) -> Rate
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|task| {
            let ask = ask.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                // A multiplicative hash walks every object in a different order per task.
                let mut i = task * 7919;
                while started.elapsed() < window {
                    let sent = Instant::now();
                    ask((i.wrapping_mul(2_654_435_761)) % objects).await;
                    latencies.push(sent.elapsed());
                    i += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Rate {
        in_flight,
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.5),
        p99: at(0.99),
    }
}

/// The floor: one task per object taking `((), oneshot)` from a bounded channel, as an actor's
/// mailbox, without kactor's table, handles and metrics.
fn bare_actors(objects: usize) -> Arc<Vec<mpsc::Sender<oneshot::Sender<u64>>>> {
    let senders = (0..objects)
        .map(|_| {
            let (sender, mut inbox) = mpsc::channel::<oneshot::Sender<u64>>(256);
            tokio::spawn(async move {
                let mut count = 0;
                while let Some(reply) = inbox.recv().await {
                    count += 1;
                    let _ = reply.send(count);
                }
            });
            sender
        })
        .collect();
    Arc::new(senders)
}

async fn asks(objects: usize, window: Duration) {
    println!("asks: {objects} actors, a window of {window:?} per concurrency");
    let emulator = emulator_with(objects).await;
    let operator = operator(&emulator).actor(RESOURCE, options(), |_: &DynamicObject| Counter {
        count: 0,
    });
    let actors: Actors<Counter> = operator.actors::<Counter>();
    let started = Instant::now();
    let (stop, task) = run(operator);
    until("every actor", || actors.len() == objects).await;
    println!(
        "  {objects} actors made in {:.2} s (listing included)",
        started.elapsed().as_secs_f64()
    );
    let keys: Arc<Vec<ObjectKey>> = Arc::new(
        (0..objects)
            .map(|i| ObjectKey::namespaced("default", &format!("w{i:06}")))
            .collect(),
    );
    let handles: Arc<Vec<ActorRef<Counter>>> = Arc::new(
        keys.iter()
            .map(|key| actors.get(key.clone()).unwrap())
            .collect(),
    );
    let bare = bare_actors(objects);

    println!();
    println!(
        "  {:<34} {:>9} {:>12} {:>10} {:>10}",
        "contender", "in flight", "asks/s", "p50 µs", "p99 µs"
    );
    for in_flight in CONCURRENCIES {
        let by_key = {
            let (actors, keys) = (actors.clone(), keys.clone());
            measure(in_flight, objects, window, move |i| {
                let (actors, key) = (actors.clone(), keys[i].clone());
                async move {
                    actors.ask(key, ()).await.unwrap();
                }
            })
            .await
        };
        let by_handle = {
            let handles = handles.clone();
            measure(in_flight, objects, window, move |i| {
                let handle = handles[i].clone();
                async move {
                    handle.ask(()).await.unwrap();
                }
            })
            .await
        };
        let floor = {
            let bare = bare.clone();
            measure(in_flight, objects, window, move |i| {
                let sender = bare[i].clone();
                async move {
                    let (reply, answer) = oneshot::channel();
                    sender.send(reply).await.unwrap();
                    answer.await.unwrap();
                }
            })
            .await
        };
        for (name, rate) in [
            ("kactor: actors.ask(object, msg)", &by_key),
            ("kactor: actor_ref.ask(msg)", &by_handle),
            ("floor: tokio mpsc + oneshot", &floor),
        ] {
            println!(
                "  {:<34} {:>9} {:>12.0} {:>10.1} {:>10.1}",
                name,
                rate.in_flight,
                rate.per_second,
                rate.p50.as_secs_f64() * 1e6,
                rate.p99.as_secs_f64() * 1e6
            );
        }
    }
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// What a memory contender runs beside the watched objects.
#[derive(Clone, Copy, PartialEq)]
enum Beside {
    Nothing,
    Actors,
    /// A bare tokio task per object awaiting a bounded channel (what an actor is made of).
    Tasks,
}

/// One memory contender, in a process of its own: prints `RESULT <rss> <heap>` once quiet.
async fn memory_contender(objects: usize, beside: Beside) {
    let emulator = emulator_with(objects).await;
    let seen = Arc::new(AtomicUsize::new(0));
    let mut operator = operator(&emulator).on_event(RESOURCE, "count", {
        let seen = seen.clone();
        move |_: Ctx| {
            seen.fetch_add(1, Ordering::Relaxed);
            async { Ok(()) }
        }
    });
    let mut actors = None;
    let mut tasks = Vec::new();
    if beside == Beside::Tasks {
        for _ in 0..objects {
            let (sender, mut inbox) = mpsc::channel::<((), Option<oneshot::Sender<u64>>)>(256);
            tokio::spawn(async move { while inbox.recv().await.is_some() {} });
            tasks.push(sender);
        }
    }
    if beside == Beside::Actors {
        operator = operator.actor(RESOURCE, options(), |_: &DynamicObject| Counter {
            count: 0,
        });
        actors = Some(operator.actors::<Counter>());
    }
    let (stop, task) = run(operator);
    until("every object listed", || {
        seen.load(Ordering::Relaxed) >= objects
    })
    .await;
    if let Some(actors) = &actors {
        until("every actor", || actors.len() == objects).await;
        // Every actor has run (its `started`) and waits on its mailbox.
        for i in (0..objects).step_by((objects / 100).max(1)) {
            actors
                .ask(("default", format!("w{i:06}").as_str()), ())
                .await
                .unwrap();
        }
    }
    // The workers idle away (after a second without events), and the allocator settles.
    tokio::time::sleep(Duration::from_secs(4)).await;
    println!("RESULT {} {}", support::rss_bytes(), support::live_bytes());
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// Runs this program again as a memory contender, twice (a process's RSS varies from run to run by
/// how its allocator's arenas fall): the smaller RSS and heap.
fn contender(role: &str, objects: usize) -> (u64, u64) {
    let (a, b) = (contender_once(role, objects), contender_once(role, objects));
    (a.0.min(b.0), a.1.min(b.1))
}

/// Runs this program again as a memory contender; its RSS and heap.
fn contender_once(role: &str, objects: usize) -> (u64, u64) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .env(ROLE, role)
        .env("KACTOR_BENCH_IDLE_OBJECTS", objects.to_string())
        .output()
        .expect("the contender runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "the {role} contender printed no result:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let mut figures = line.split_whitespace().map(|f| f.parse::<u64>().unwrap());
    (figures.next().unwrap(), figures.next().unwrap())
}

fn memory(objects: usize) {
    println!();
    println!("memory: {objects} idle objects, each contender in a process of its own");
    let (base_rss, base_heap) = contender("baseline", objects);
    let (rss, heap) = contender("actors", objects);
    let (tasks_rss, tasks_heap) = contender("tasks", objects);
    let per = |with: u64, without: u64| (with as f64 - without as f64) / objects as f64;
    println!("  {:<44} {:>10} {:>10}", "contender", "RSS MiB", "heap MiB");
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "  {:<44} {:>10.1} {:>10.1}",
        "objects watched, no actors (on_event no-op)",
        mib(base_rss),
        mib(base_heap)
    );
    println!(
        "  {:<44} {:>10.1} {:>10.1}",
        "the same, with an idle actor per object",
        mib(rss),
        mib(heap)
    );
    println!(
        "  {:<44} {:>10.1} {:>10.1}",
        "the same, with a bare tokio task and channel",
        mib(tasks_rss),
        mib(tasks_heap)
    );
    println!(
        "  an idle actor costs {:.0} B of RSS and {:.0} B of heap per object (the emulator's objects \
         are in all three); a bare tokio task awaiting a bounded channel, {:.0} B and {:.0} B",
        per(rss, base_rss),
        per(heap, base_heap),
        per(tasks_rss, base_rss),
        per(tasks_heap, base_heap)
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Ok(role) = std::env::var(ROLE) {
        let objects = env_or("KACTOR_BENCH_IDLE_OBJECTS", 1_000);
        let beside = match role.as_str() {
            "actors" => Beside::Actors,
            "tasks" => Beside::Tasks,
            _ => Beside::Nothing,
        };
        runtime.block_on(memory_contender(objects, beside));
        return;
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` does not, and then a small run proves
    // the benchmark still works without spending the test suite's time.
    let measuring = std::env::args().any(|a| a == "--bench");
    let objects = env_or("KACTOR_BENCH_OBJECTS", if measuring { 10_000 } else { 200 });
    let idle = env_or(
        "KACTOR_BENCH_IDLE_OBJECTS",
        if measuring { 100_000 } else { 1_000 },
    );
    let window = Duration::from_secs_f64(env_or(
        "KACTOR_BENCH_WINDOW",
        if measuring { 3.0 } else { 0.3 },
    ));
    println!(
        "kactor actors benchmark, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    runtime.block_on(asks(objects, window));
    drop(runtime);
    memory(idle);
}
