//! What an index costs per indexed object (issue 18), at 100,000 objects, in one run against the
//! embedded emulator.
//!
//! Run by hand: `cargo bench --bench indexes` (100000 objects; `KACTOR_BENCH_OBJECTS=N` to change); under
//! `cargo test --all-targets` it makes a quick run with 1,000.
//!
//! Two operators over the same objects, one after the other, each until every object's `on_event`
//! handler ran and the workers idled out (so what stays is the per-object records):
//! * **plain**: the `on_event` handler only;
//! * **indexed**: the same, and an index handler giving each widget's `{name, namespace}` under one of
//!   100 keys (`spec.size % 100`), as `@kopf.index` handlers typically do (pods by node).
//!
//! Resource handlers run only once the indexes are populated, so the indexed operator's handlers
//! all ran means its index is whole; the benchmark checks that it is, through `ctx.index`.
//!
//! Printed: the live heap (a counting allocator) each operator adds over the process before it,
//! per object, and the difference, the index's cost per object, beside the floor: the same values in
//! a hand-built `HashMap<String, Vec<Value>>` (what a program would keep without a framework). The
//! process's RSS after each is printed too (it includes the emulator, so read it as a trend).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactor::prelude::*;

mod support;

#[global_allocator]
static ALLOCATOR: support::Counting = support::Counting;

/// The keys the widgets are spread over.
const KEYS: i64 = 100;

/// What the index handler gives for a widget: `{key: {name, namespace}}`.
fn entry(size: i64, name: &str, namespace: Option<&str>) -> (String, serde_json::Value) {
    let key = (size % KEYS).to_string();
    (key, json!({"name": name, "namespace": namespace}))
}

/// One operator's run: the heap it added per object, its time until every handler ran, the RSS.
struct Measured {
    heap_per_object: f64,
    seconds: f64,
    rss: u64,
}

async fn measure(client: kube::Client, objects: usize, indexed: bool) -> Measured {
    // Nothing of the previous operator left running.
    support::settle().await;
    let before = support::live_bytes();
    let handled = Arc::new(AtomicUsize::new(0));
    let largest_key = Arc::new(AtomicUsize::new(0));
    let mut operator = Operator::new()
        .client(client)
        .settings(|s| s.queueing.idle_timeout = Duration::from_millis(500))
        .on_event("widgets.example.com", "count", {
            let (handled, largest_key) = (handled.clone(), largest_key.clone());
            move |ctx: Ctx| {
                // Every handler runs after the index is whole: a few of them check it (reading a
                // key copies its values out, which is not what is measured here).
                if ctx.name().ends_with("000") {
                    if let Ok(index) = ctx.index("by_size") {
                        // The key "0" holds every hundredth widget.
                        largest_key.fetch_max(index.get(Some("0")).len(), Ordering::Relaxed);
                    }
                }
                handled.fetch_add(1, Ordering::Relaxed);
                async { Ok(()) }
            }
        });
    if indexed {
        operator = operator.index("widgets.example.com", "by_size", |ctx: Ctx| async move {
            let size = ctx.spec()["size"].as_i64().unwrap_or_default();
            let (key, value) = entry(size, ctx.name(), ctx.namespace());
            Ok(json!({ key: value }))
        });
    }
    let started = Instant::now();
    let running = support::Running::operator(operator);
    while handled.load(Ordering::Relaxed) < objects {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    // The workers idle out (500 ms) and give their bodies back; what stays is the records (and
    // the index).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let heap = support::live_bytes().saturating_sub(before);
    let rss = support::rss_bytes();
    if indexed {
        let expected = objects.div_ceil(KEYS as usize);
        assert_eq!(
            largest_key.load(Ordering::Relaxed),
            expected,
            "the index is whole before any handler runs"
        );
    }
    running.stop().await;
    Measured {
        heap_per_object: heap as f64 / objects as f64,
        seconds,
        rss,
    }
}

/// The floor: the same values in a hand-built map, and the heap it takes per object.
fn floor(objects: usize) -> f64 {
    let before = support::live_bytes();
    let mut map: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for i in 0..objects {
        let (key, value) = entry(i as i64, &format!("w{i:06}"), Some("default"));
        map.entry(key).or_default().push(value);
    }
    let heap = support::live_bytes().saturating_sub(before);
    assert_eq!(map.len(), KEYS.min(objects as i64) as usize);
    drop(map);
    heap as f64 / objects as f64
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let objects = support::objects(100_000, 1_000);
    println!(
        "kactor index benchmark: {objects} objects, one index of {KEYS} keys, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let (emulator, widgets) = support::widgets::emulator_with_widgets(objects * 2 + 1000).await;
    support::widgets::populate(&widgets, objects).await;
    let plain = measure(emulator.client(), objects, false).await;
    let indexed = measure(emulator.client(), objects, true).await;
    let floor = floor(objects);
    let index = indexed.heap_per_object - plain.heap_per_object;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);

    println!();
    println!("operator             seconds   heap B/object   process RSS MiB");
    println!(
        "on_event only        {:>7.2}   {:>13.0}   {:>15.1}",
        plain.seconds,
        plain.heap_per_object,
        mib(plain.rss)
    );
    println!(
        "on_event and index   {:>7.2}   {:>13.0}   {:>15.1}",
        indexed.seconds,
        indexed.heap_per_object,
        mib(indexed.rss)
    );
    println!();
    println!(
        "the index per object: {index:.0} bytes; floor (the same values in a HashMap<String, Vec<Value>>): {floor:.0} bytes; ratio {:.2}x",
        index / floor
    );
}
