//! Does serving `/healthz` and `/metrics` under load slow event processing down?
//!
//! Run by hand: `cargo bench --bench health` (20,000 objects, 2,000 requests/s, 5 rounds of each
//! after a warm-up round;
//! `KACTOR_BENCH_OBJECTS=N`, `KACTOR_BENCH_RATE=R` and `KACTOR_BENCH_ROUNDS=K` to change); under
//! `cargo test --all-targets` it makes a quick run with 200 objects and one round instead.
//!
//! Each round gets a fresh emulator holding N widgets, created before the operator starts, and a
//! kactor operator (standalone, default settings, event posting off) with one create handler
//! returning a value, serving health and metrics on loopback. The clock runs from the operator's
//! start until its observer has seen N successful handler runs: that is the event processing
//! throughput. Rounds alternate between no load and a load generator asking `/healthz` and
//! `/metrics` (half each) at R requests/s in all, over 4 keep-alive connections, from a thread and
//! runtime of its own (a client on the same machine, as the kubelet and Prometheus are to a pod),
//! for as long as the round lasts.
//!
//! It prints, per round, the seconds and objects/s; then the medians with and without load and the
//! drop, the requests served and their latency (p50, p99, max) by path, and the CPU seconds of the
//! health server's thread (`kactor-health`) and of the load generator's (`load`) per 1,000 requests.
//!
//! Aim: throughput drops by less than 5 % under 2,000 requests/s.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactor::emulator::{samples, Emulator};
use kactor::observe::{HandlerRun, Observer, Verdict};
use kactor::prelude::*;
use kube::api::{Api, DynamicObject, PostParams};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// No round may take longer than this (a hang fails the benchmark instead of blocking CI).
const DEADLINE: Duration = Duration::from_secs(600);
/// The load generator's connections; half ask `/healthz`, half `/metrics`.
const CONNECTIONS: usize = 4;

/// Counts successful handler runs.
#[derive(Default)]
struct Done(AtomicUsize);

impl Observer for Done {
    fn handler_finished(&self, run: &HandlerRun<'_>) {
        if run.verdict == Verdict::Success {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn populate(emulator: &Emulator, count: usize) {
    let api: Api<DynamicObject> = samples::install_widgets(&emulator.client()).await.unwrap();
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..count {
        let api = api.clone();
        pending.push(async move {
            let widget = serde_json::from_value(samples::widget(&format!("w{i}"), 1)).unwrap();
            api.create(&PostParams::default(), &widget).await.unwrap();
        });
        if pending.len() >= 64 {
            futures::StreamExt::next(&mut pending).await;
        }
    }
    while futures::StreamExt::next(&mut pending).await.is_some() {}
}

/// The latencies the load generator saw, by path.
#[derive(Default)]
struct Latencies {
    healthz: Vec<Duration>,
    metrics: Vec<Duration>,
    failures: usize,
}

/// One keep-alive connection asking `path` every `period` until `stop`.
async fn ask(
    port: u16,
    path: &'static str,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> (Vec<Duration>, usize) {
    let mut seen = Vec::new();
    let mut failures = 0;
    let mut connection = None;
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        if connection.is_none() {
            match TcpStream::connect(("127.0.0.1", port)).await {
                Ok(stream) => connection = Some(BufReader::new(stream)),
                Err(_) => {
                    failures += 1;
                    continue;
                }
            }
        }
        let Some(stream) = connection.as_mut() else {
            continue;
        };
        let started = Instant::now();
        match request(stream, path).await {
            Ok(true) => seen.push(started.elapsed()),
            Ok(false) | Err(_) => {
                failures += 1;
                connection = None;
            }
        }
    }
    (seen, failures)
}

/// One GET on a keep-alive connection; true for a 200 (the body is read and dropped).
async fn request(stream: &mut BufReader<TcpStream>, path: &str) -> std::io::Result<bool> {
    let head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.get_mut().write_all(head.as_bytes()).await?;
    let mut status = String::new();
    stream.read_line(&mut status).await?;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await?;
    Ok(status.split(' ').nth(1) == Some("200"))
}

/// Starts the load generator on a thread of its own; stopping it returns what it saw.
fn load(port: u16, rate: usize) -> (Arc<AtomicBool>, std::thread::JoinHandle<Latencies>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("load".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let period = Duration::from_secs_f64(CONNECTIONS as f64 / rate as f64);
                let tasks: Vec<_> = (0..CONNECTIONS)
                    .map(|i| {
                        let path = if i % 2 == 0 { "/healthz" } else { "/metrics" };
                        tokio::spawn(ask(port, path, period, flag.clone()))
                    })
                    .collect();
                let mut latencies = Latencies::default();
                for (i, task) in tasks.into_iter().enumerate() {
                    let (seen, failures) = task.await.unwrap();
                    latencies.failures += failures;
                    if i % 2 == 0 {
                        latencies.healthz.extend(seen);
                    } else {
                        latencies.metrics.extend(seen);
                    }
                }
                latencies
            })
        })
        .unwrap();
    (stop, thread)
}

/// CPU seconds used so far by this process's thread named `name`.
fn thread_cpu_seconds(name: &str) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .map(|stat| {
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let fields: Vec<&str> = after.split_whitespace().collect();
            let utime: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let stime: f64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            (utime + stime) / ticks
        })
        .sum()
}

/// What one round measured.
struct Round {
    /// One rendering of /metrics: its time and size.
    render: (Duration, usize),
    loaded: bool,
    elapsed: Duration,
    latencies: Option<Latencies>,
    health_cpu: f64,
    load_cpu: f64,
}

async fn round(objects: usize, rate: Option<usize>) -> Round {
    let emulator = Emulator::start().await.unwrap();
    populate(&emulator, objects).await;
    let port = free_port();
    let done = Arc::new(Done::default());
    let operator = Operator::new()
        .client(emulator.client())
        .standalone()
        .liveness(&format!("http://127.0.0.1:{port}/healthz"))
        .settings(|s| s.posting.enabled = false)
        .observer(done.clone())
        .on_create("widgets.example.com", "create_fn", |_ctx: Ctx| async move {
            Ok::<_, HandlerError>(json!({"message": "hello"}))
        });
    let metrics = operator.metrics();
    let generator = rate.map(|rate| load(port, rate));
    let (stop, stopped) = oneshot::channel::<()>();
    let started = Instant::now();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    // The health thread starts with the operator; its CPU is read from then on.
    let cpu_before = thread_cpu_seconds("kactor-health");
    let load_before = thread_cpu_seconds("load");
    while done.0.load(Ordering::Relaxed) < objects {
        assert!(
            started.elapsed() < DEADLINE,
            "the round did not finish in time"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let health_cpu = thread_cpu_seconds("kactor-health") - cpu_before;
    let load_cpu = thread_cpu_seconds("load") - load_before;
    let latencies = generator.map(|(flag, thread)| {
        flag.store(true, Ordering::Relaxed);
        thread.join().unwrap()
    });
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    // What one rendering of /metrics costs, with this round's series in it (the reason for
    // `health.metrics_cache`).
    let renders = 50;
    let clock = Instant::now();
    let bytes: usize = (0..renders).map(|_| metrics.render().len()).sum();
    let render = (clock.elapsed() / renders, bytes / renders as usize);
    Round {
        render,
        loaded: rate.is_some(),
        elapsed,
        latencies,
        health_cpu,
        load_cpu,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn print_latencies(path: &str, mut seen: Vec<Duration>, seconds: f64) {
    seen.sort();
    println!(
        "  {path:<9} {:>7} requests {:>7.0}/s   p50 {:>6.2} ms   p99 {:>6.2} ms   max {:>7.2} ms",
        seen.len(),
        seen.len() as f64 / seconds,
        percentile(&seen, 0.5).as_secs_f64() * 1e3,
        percentile(&seen, 0.99).as_secs_f64() * 1e3,
        seen.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(default)
    };
    let objects = env("KACTOR_BENCH_OBJECTS", if measuring { 20_000 } else { 200 });
    let rate = env("KACTOR_BENCH_RATE", 2_000);
    let rounds = env("KACTOR_BENCH_ROUNDS", if measuring { 5 } else { 1 });
    println!(
        "kactor health benchmark: {objects} objects, one create handler, {rate} requests/s on /healthz and /metrics, {rounds} rounds each, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if measuring {
        // Warms the allocator, the page cache and the CPU's clocks up; not counted.
        round(objects, None).await;
    }
    let mut all = Vec::new();
    for _ in 0..rounds {
        for rate in [None, Some(rate)] {
            let round = round(objects, rate).await;
            println!(
                "  {:<10} {:>7.2} s {:>9.0} objects/s",
                if round.loaded { "loaded" } else { "no load" },
                round.elapsed.as_secs_f64(),
                objects as f64 / round.elapsed.as_secs_f64()
            );
            all.push(round);
        }
    }
    let throughput = |loaded: bool| {
        median(
            all.iter()
                .filter(|r| r.loaded == loaded)
                .map(|r| objects as f64 / r.elapsed.as_secs_f64())
                .collect(),
        )
    };
    let (quiet, busy) = (throughput(false), throughput(true));
    let drop = (quiet - busy) / quiet * 100.0;
    println!();
    println!("median throughput: {quiet:.0} objects/s without load, {busy:.0} objects/s under load: {drop:+.1} % drop");
    let seconds: f64 = all
        .iter()
        .filter(|r| r.loaded)
        .map(|r| r.elapsed.as_secs_f64())
        .sum();
    let mut healthz = Vec::new();
    let mut metrics = Vec::new();
    let mut failures = 0;
    let mut health_cpu = 0.0;
    let mut load_cpu = 0.0;
    for round in all.iter_mut().filter(|r| r.loaded) {
        load_cpu += round.load_cpu;
        let latencies = round
            .latencies
            .take()
            .expect("a loaded round has latencies");
        healthz.extend(latencies.healthz);
        metrics.extend(latencies.metrics);
        failures += latencies.failures;
        health_cpu += round.health_cpu;
    }
    let served = healthz.len() + metrics.len();
    println!(
        "under load ({:.0} requests/s served, {failures} failed):",
        served as f64 / seconds
    );
    print_latencies("/healthz", healthz, seconds);
    print_latencies("/metrics", metrics, seconds);
    println!(
        "  the health thread used {health_cpu:.2} CPU s: {:.1} ms per 1,000 requests; the load generator {load_cpu:.2} CPU s: {:.1} ms per 1,000",
        health_cpu * 1e6 / served.max(1) as f64,
        load_cpu * 1e6 / served.max(1) as f64
    );
    let (render, size) = all.last().map(|r| r.render).unwrap_or_default();
    println!(
        "one rendering of /metrics ({size} bytes) costs {:.0} µs; it is reused for health.metrics_cache (1 s), so a scrape storm costs one per second",
        render.as_secs_f64() * 1e6
    );
    println!(
        "aim: less than 5 % drop: {}",
        if drop < 5.0 { "met" } else { "NOT met" }
    );
}
