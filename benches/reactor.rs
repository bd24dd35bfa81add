//! The reactor's speed and memory against its floors, in one run, against the embedded emulator.
//!
//! Run by hand: `cargo bench --bench reactor [-- OBJECTS IDLE_OBJECTS]` (defaults 10000 and 100000);
//! under `cargo test --all-targets` it makes a quick run with 200 and 1000 instead.
//!
//! It prints, each beside its floor:
//! * the time from operator start until every object's `on_event` handler ran (the initial listing),
//!   against a bare `kube::runtime::watcher` listing the same objects (medians of five rounds each);
//! * the time until every object created while running was handled, against a bare watcher seeing
//!   the same creations in the same run;
//! * the dispatch latency (event received to handler start), p50 and p99, at 1,000 events/s;
//! * the operator's live heap per idle object with IDLE_OBJECTS objects (workers idled out), against
//!   the empty process (the heap before the operator started).
//!
//! Aims (issue #3): within 1.2x of the floor's time, p99 dispatch under 5 ms, under 2 KiB per idle object.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kactor::emulator::{samples, Emulator};
use kactor::prelude::*;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;

mod support;

#[global_allocator]
static ALLOCATOR: support::Counting = support::Counting;

async fn new_emulator() -> (Emulator, Api<DynamicObject>) {
    support::widgets::emulator_with_widgets(400_000).await
}

async fn populate(api: &Api<DynamicObject>, prefix: &str, count: usize) {
    let api = api.clone();
    let prefix = prefix.to_string();
    let tasks: Vec<_> = (0..16)
        .map(|worker| {
            let api = api.clone();
            let prefix = prefix.clone();
            tokio::spawn(async move {
                let mut i = worker;
                while i < count {
                    let body = samples::widget(&format!("{prefix}{i:06}"), i as i64);
                    api.create(
                        &PostParams::default(),
                        &serde_json::from_value(body).unwrap(),
                    )
                    .await
                    .expect("create");
                    i += 16;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// An operator counting handled objects, with dispatch latencies recorded in microseconds.
struct Counted {
    handled: Arc<AtomicUsize>,
    latencies: Arc<Mutex<Vec<u64>>>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<kactor::Result<()>>,
}

fn start_operator(emulator: &Emulator, idle: Duration) -> Counted {
    let handled = Arc::new(AtomicUsize::new(0));
    let latencies: Arc<Mutex<Vec<u64>>> = Arc::default();
    let operator = Operator::new()
        .client(emulator.client())
        .settings(|s| s.queueing.idle_timeout = idle)
        .on_event("widgets.example.com", "count", {
            let handled = handled.clone();
            let latencies = latencies.clone();
            move |ctx: Ctx| {
                let latency = ctx.received.elapsed().as_micros() as u64;
                latencies.lock().unwrap().push(latency);
                handled.fetch_add(1, Ordering::Relaxed);
                async { Ok(()) }
            }
        });
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    Counted {
        handled,
        latencies,
        stop,
        task,
    }
}

async fn wait_for(counter: &AtomicUsize, target: usize) {
    while counter.load(Ordering::Relaxed) < target {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A bare kube-runtime watcher counting objects (applied events), until `target`.
fn bare_watcher(api: Api<DynamicObject>, seen: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream =
            kube::runtime::watcher(api, kube::runtime::watcher::Config::default()).boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            if matches!(
                event,
                kube::runtime::watcher::Event::InitApply(_)
                    | kube::runtime::watcher::Event::Apply(_)
            ) {
                seen.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

fn ratio(value: Duration, floor: Duration) -> String {
    format!(
        "{:>8.1} ms   floor {:>8.1} ms   ratio {:.2}x",
        value.as_secs_f64() * 1e3,
        floor.as_secs_f64() * 1e3,
        value.as_secs_f64() / floor.as_secs_f64()
    )
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

#[tokio::main(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "the benchmark's whole run and report, read top to bottom"
)]
async fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let objects = args
        .first()
        .copied()
        .unwrap_or(if measuring { 10_000 } else { 200 });
    let idle_objects = args
        .get(1)
        .copied()
        .unwrap_or(if measuring { 100_000 } else { 1_000 });
    println!(
        "kactor reactor benchmark: {objects} objects, {idle_objects} idle objects, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    // 1. The initial listing, the bare watcher and the operator over the same objects, five rounds in
    //    alternating order; the medians are compared (single runs of ~100 ms on 2 shared cores are noisy).
    let (emulator, widgets) = new_emulator().await;
    populate(&widgets, "w", objects).await;
    let (mut bare_times, mut operator_times) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let bare_first = round % 2 == 0;
        for bare_turn in [bare_first, !bare_first] {
            if bare_turn {
                let seen = Arc::new(AtomicUsize::new(0));
                let started = Instant::now();
                let bare = bare_watcher(widgets.clone(), seen.clone());
                wait_for(&seen, objects).await;
                bare_times.push(started.elapsed());
                bare.abort();
            } else {
                let started = Instant::now();
                let operator = start_operator(&emulator, Duration::from_secs(5));
                wait_for(&operator.handled, objects).await;
                operator_times.push(started.elapsed());
                if std::env::var("KACTOR_BENCH_ONLY").as_deref() == Ok("listing") {
                    let mut latencies = operator.latencies.lock().unwrap().clone();
                    latencies.sort_unstable();
                    println!(
                        "  listing dispatch latency p50 {:.3} ms p99 {:.3} ms max {:.3} ms",
                        percentile(&latencies, 0.5),
                        percentile(&latencies, 0.99),
                        percentile(&latencies, 1.0)
                    );
                }
                let _ = operator.stop.send(());
                operator.task.await.unwrap().unwrap();
            }
        }
    }
    bare_times.sort();
    operator_times.sort();
    let (bare_listing, operator_listing) = (bare_times[2], operator_times[2]);
    if std::env::var("KACTOR_BENCH_ONLY").as_deref() == Ok("listing") {
        // For profiling the listing alone: `KACTOR_BENCH_ONLY=listing perf record ...`.
        println!(
            "initial listing of {objects:>6} objects   {}",
            ratio(operator_listing, bare_listing)
        );
        return;
    }
    let operator = start_operator(&emulator, Duration::from_secs(5));
    wait_for(&operator.handled, objects).await;

    // 2. Objects created while running, seen by both in the same run.
    let bare_seen = Arc::new(AtomicUsize::new(0));
    let bare = bare_watcher(widgets.clone(), bare_seen.clone());
    wait_for(&bare_seen, objects).await;
    let (bare_base, operator_base) = (
        bare_seen.load(Ordering::Relaxed),
        operator.handled.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let creating = {
        let widgets = widgets.clone();
        tokio::spawn(async move {
            populate(&widgets, "n", objects).await;
            Instant::now()
        })
    };
    let (bare_done, operator_done) = tokio::join!(
        async {
            wait_for(&bare_seen, bare_base + objects).await;
            Instant::now()
        },
        async {
            wait_for(&operator.handled, operator_base + objects).await;
            Instant::now()
        }
    );
    let last_write = creating.await.unwrap();
    bare.abort();
    let (bare_running, operator_running) = (bare_done - started, operator_done - started);
    // The writers bound both: what tells them apart is how far behind the last write each one is.
    let (bare_lag, operator_lag) = (
        bare_done.saturating_duration_since(last_write),
        operator_done.saturating_duration_since(last_write),
    );

    // 3. Dispatch latency at 1,000 events/s: patches paced at one per millisecond.
    operator.latencies.lock().unwrap().clear();
    let paced = (objects / 2).clamp(100, 5_000);
    let base = operator.handled.load(Ordering::Relaxed);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let params = PatchParams::default();
    for i in 0..paced {
        tick.tick().await;
        let api = widgets.clone();
        let params = params.clone();
        tokio::spawn(async move {
            api.patch(
                &format!("w{:06}", i % objects),
                &params,
                &Patch::Merge(serde_json::json!({"spec": {"size": i as i64 + 1_000_000}})),
            )
            .await
            .expect("patch");
        });
    }
    wait_for(&operator.handled, base + paced).await;
    let mut latencies = operator.latencies.lock().unwrap().clone();
    latencies.sort_unstable();
    let _ = operator.stop.send(());
    operator.task.await.unwrap().unwrap();
    drop(emulator);

    // 4. Memory per idle object: the heap the operator adds over the process without it.
    let (emulator, widgets) = new_emulator().await;
    populate(&widgets, "i", idle_objects).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let heap_before = support::live_bytes();
    let idle = start_operator(&emulator, Duration::from_millis(500));
    wait_for(&idle.handled, idle_objects).await;
    idle.latencies.lock().unwrap().clear();
    idle.latencies.lock().unwrap().shrink_to_fit();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let heap_after = support::live_bytes();
    let per_object = heap_after.saturating_sub(heap_before) as f64 / idle_objects as f64;
    let _ = idle.stop.send(());
    idle.task.await.unwrap().unwrap();

    println!();
    println!(
        "initial listing of {objects:>6} objects   {}",
        ratio(operator_listing, bare_listing)
    );
    println!(
        "{objects:>6} objects created running  {}",
        ratio(operator_running, bare_running)
    );
    println!(
        "  behind the last write           {:>8.1} ms   floor {:>8.1} ms   (polled every 1 ms)",
        operator_lag.as_secs_f64() * 1e3,
        bare_lag.as_secs_f64() * 1e3
    );
    println!(
        "dispatch latency at 1000 events/s  p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms   ({} events)",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0),
        latencies.len()
    );
    println!("heap per idle object ({idle_objects} objects)  {per_object:>8.0} bytes   floor: the process before the operator (0 by definition)");
    println!();
    println!("aims: within 1.2x of the floor, p99 < 5 ms, < 2048 bytes per idle object");
}
