//! Throughput and memory of the embedded API emulator, over real HTTP with the real `kube::Client`.
//!
//! Run by hand: `cargo bench --bench emulator` (optionally `-- OBJECTS CONCURRENCY`, default 20000 16);
//! under `cargo test --all-targets` it makes a quick run of 200 objects instead.
//! It prints, with a watcher attached throughout:
//! * creates/s, merge-patches/s and merge-patches/s of `/status` (what an operator's results cost)
//!   sustained by CONCURRENCY clients,
//! * watch events/s delivered live (during the writes) and replayed from history to a late watcher,
//! * bytes of resident memory per stored object (and the objects' average JSON size, for scale).
//!
//! Targets (issue #2, on the 2-core machine): at least 5,000 writes/s and 50,000 events/s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kactor::emulator::{samples, Emulator};
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;

mod support;

#[global_allocator]
static ALLOCATOR: support::Counting = support::Counting;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Counts watch events until `expected` arrived; returns the instant of the last one.
fn spawn_watcher(
    api: Api<DynamicObject>,
    from: String,
    expected: u64,
    counter: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        let mut stream = api
            .watch(&WatchParams::default().timeout(600), &from)
            .await
            .expect("watch")
            .boxed();
        let mut last = Instant::now();
        while counter.load(Ordering::Relaxed) < expected {
            match stream.next().await {
                Some(Ok(
                    WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_),
                )) => {
                    counter.fetch_add(1, Ordering::Relaxed);
                    last = Instant::now();
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => panic!("watch failed: {error}"),
                None => panic!(
                    "watch ended early at {} events",
                    counter.load(Ordering::Relaxed)
                ),
            }
        }
        last
    })
}

/// Runs `total` operations over `concurrency` tasks; returns the elapsed time.
async fn run_concurrently<F, Fut>(total: usize, concurrency: usize, op: F) -> Duration
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|worker| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut i = worker;
                while i < total {
                    op(i).await;
                    i += concurrency;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("worker");
    }
    started.elapsed()
}

/// A merge patch of every object (`w000000`, ...), of its `/status` if `status`; the elapsed time.
async fn patch_all(
    api: &Api<DynamicObject>,
    objects: usize,
    concurrency: usize,
    status: bool,
    patch_of: fn(usize) -> serde_json::Value,
) -> Duration {
    let api = api.clone();
    run_concurrently(objects, concurrency, move |i| {
        let api = api.clone();
        async move {
            let (name, params, patch) = (
                format!("w{i:06}"),
                PatchParams::default(),
                Patch::Merge(patch_of(i)),
            );
            let written = if status {
                api.patch_status(&name, &params, &patch).await
            } else {
                api.patch(&name, &params, &patch).await
            };
            written.expect("merge patch");
        }
    })
    .await
}

fn rate(count: usize, elapsed: Duration) -> String {
    format!(
        "{:>9.0}/s  ({count} in {:.2} s)",
        count as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    )
}

#[tokio::main(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "the benchmark's whole run and report, read top to bottom"
)]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` does not, and then a small run proves
    // the benchmark still works without spending the test suite's time.
    let measuring = std::env::args().any(|a| a == "--bench");
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let objects: usize = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(if measuring { 20_000 } else { 200 });
    let concurrency: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    println!(
        "kactor-emulator benchmark: {objects} objects, {concurrency} concurrent clients, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let emulator = Emulator::builder()
        .history_limit(objects * 4)
        .start()
        .await
        .expect("emulator");
    let client = emulator.client();
    let api = samples::install_widgets(&client).await.expect("CRD");
    let start_rv = emulator.resource_version().to_string();
    let memory_before = resident_bytes();
    let heap_before = support::live_bytes();

    // Creates, with a live watcher.
    let live = Arc::new(AtomicU64::new(0));
    let watcher = spawn_watcher(
        api.clone(),
        start_rv.clone(),
        objects as u64 * 3,
        live.clone(),
    );
    let create_api = api.clone();
    let creates = run_concurrently(objects, concurrency, move |i| {
        let api = create_api.clone();
        async move {
            let body = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"name": format!("w{i:06}"), "labels": {"app": "bench", "shard": format!("s{}", i % 16)},
                             "annotations": {"kopf.zalando.org/last-handled-configuration": "{\"spec\":{\"size\":1}}"}},
                "spec": {"size": i, "image": "memcached:1.6", "ports": [11211]}});
            api.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.expect("create");
        }
    })
    .await;
    let memory_after = resident_bytes();
    // Let the watcher drain what it holds before counting the heap.
    while live.load(Ordering::Relaxed) < objects as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let heap_after = support::live_bytes();

    // Merge patches, with the same watcher: of the main endpoint, then of `/status`, as an operator
    // writes a handler's result.
    let patches = patch_all(
        &api,
        objects,
        concurrency,
        false,
        |i| json!({"status": {"observed": i}, "metadata": {"labels": {"patched": "yes"}}}),
    )
    .await;
    let status_patches = patch_all(
        &api,
        objects,
        concurrency,
        true,
        |i| json!({"status": {"create_fn": {"message": "hello", "run": i}}}),
    )
    .await;
    let writes_started = Instant::now() - creates - patches - status_patches;
    let last_live = watcher.await.expect("watcher");
    let live_elapsed = last_live.duration_since(writes_started);

    // Replay: a late watcher gets every event from the kept history, as fast as it can take them.
    let replayed = Arc::new(AtomicU64::new(0));
    let replay_started = Instant::now();
    let replay = spawn_watcher(
        api.clone(),
        start_rv.clone(),
        objects as u64 * 3,
        replayed.clone(),
    )
    .await
    .expect("replay");
    let replay_elapsed = replay.duration_since(replay_started);

    // Four replaying watchers at once: events/s delivered in all.
    let many_started = Instant::now();
    let counters: Vec<_> = (0..4).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let handles: Vec<_> = counters
        .iter()
        .map(|c| spawn_watcher(api.clone(), start_rv.clone(), objects as u64 * 3, c.clone()))
        .collect();
    for handle in handles {
        handle.await.expect("watcher");
    }
    let many_elapsed = many_started.elapsed();

    let list_started = Instant::now();
    let listed = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .len();
    let list_elapsed = list_started.elapsed();
    let sample = serde_json::to_vec(&api.get("w000001").await.expect("get"))
        .map(|v| v.len())
        .unwrap_or(0);

    println!();
    println!(
        "creates (1 watcher attached)     {}",
        rate(objects, creates)
    );
    println!(
        "merge patches (1 watcher)        {}",
        rate(objects, patches)
    );
    println!(
        "/status patches (1 watcher)      {}",
        rate(objects, status_patches)
    );
    println!(
        "writes overall                   {}",
        rate(objects * 3, creates + patches + status_patches)
    );
    println!(
        "watch events, live               {}",
        rate(objects * 3, live_elapsed)
    );
    println!(
        "watch events, replay (1 watcher) {}",
        rate(objects * 3, replay_elapsed)
    );
    println!(
        "watch events, replay (4 at once) {}",
        rate(objects * 12, many_elapsed)
    );
    println!(
        "list of all objects              {}",
        rate(listed, list_elapsed)
    );
    println!(
        "heap per stored object           {:>9.0} bytes live (object, its history event and indexes)",
        heap_after.saturating_sub(heap_before) as f64 / objects as f64
    );
    println!(
        "memory per stored object         {:>9.0} bytes resident  (object JSON ~{sample} bytes; {} objects, {:.1} MiB grown)",
        (memory_after.saturating_sub(memory_before)) as f64 / objects as f64,
        emulator.object_count(),
        (memory_after.saturating_sub(memory_before)) as f64 / 1048576.0
    );
    println!();
    println!("targets: >= 5000 writes/s, >= 50000 events/s");
}
