//! What the benchmarks share: a heap-counting allocator, the count of requests the emulator served,
//! the number of open files, waiting for the process to be idle, and a contender running in it.

// Each benchmark is its own crate and uses only part of this.
#![allow(dead_code)]

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use tracing_subscriber::Layer;

pub mod widgets;

/// Counts live heap bytes, per thread: every thread adds to a counter of its own (on its own
/// cache line), and [`live_bytes`] sums them. One shared counter would be one more contended
/// atomic per allocation and per free, which no user's process pays: it cost about 7 % of a
/// contender's CPU (`perf`, `--bench lifecycle`), and the most to whichever allocates most.
pub struct Counting;

/// Threads beyond this many share the last counter.
const COUNTERS: usize = 256;

/// A thread's live bytes, what it allocated minus what it freed (negative where it freed what
/// another thread allocated), and how many allocations it made.
#[repr(align(128))]
struct Counter {
    bytes: AtomicI64,
    allocations: AtomicU64,
}

static COUNTER: [Counter; COUNTERS] = [const {
    Counter {
        bytes: AtomicI64::new(0),
        allocations: AtomicU64::new(0),
    }
}; COUNTERS];
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's counter, claimed on its first allocation (no allocation here: a const
    /// initialiser and no destructor).
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Adds `delta` to the calling thread's live bytes, and `allocations` to its allocations.
fn count(delta: i64, allocations: u64) {
    let slot = MINE
        .try_with(|mine| {
            if mine.get() == usize::MAX {
                mine.set(THREADS.fetch_add(1, Ordering::Relaxed).min(COUNTERS - 1));
            }
            mine.get()
        })
        // A thread's allocations during its own teardown go to the shared last counter.
        .unwrap_or(COUNTERS - 1);
    let counter = &COUNTER[slot];
    if slot < COUNTERS - 1 {
        // Written by this thread alone: no read-modify-write needed.
        let bytes = counter.bytes.load(Ordering::Relaxed);
        counter.bytes.store(bytes + delta, Ordering::Relaxed);
        let made = counter.allocations.load(Ordering::Relaxed);
        counter
            .allocations
            .store(made + allocations, Ordering::Relaxed);
    } else {
        counter.bytes.fetch_add(delta, Ordering::Relaxed);
        counter
            .allocations
            .fetch_add(allocations, Ordering::Relaxed);
    }
}

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as i64, 1);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(-(layout.size() as i64), 0);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64, 0);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

/// Whether this is a measuring run (`cargo bench` passes `--bench`; `cargo test --all-targets`
/// does not).
pub fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// How many objects a benchmark runs with: `KACTOR_BENCH_OBJECTS`, else `measured` under
/// `cargo bench` (which passes `--bench`), else `quick`: under `cargo test --all-targets` a small
/// run proves the benchmark still works without spending the test suite's time.
pub fn objects(measured: usize, quick: usize) -> usize {
    let measuring = measuring();
    std::env::var("KACTOR_BENCH_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if measuring { measured } else { quick })
}

/// How many rounds a benchmark makes of each contender (`KACTOR_BENCH_REPEAT`): 3 when measuring,
/// 1 in a quick run. Rounds alternate the contenders, so that a slow spell of the machine falls on
/// all of them; each contender's median round is printed, with the range.
pub fn repeats() -> usize {
    std::env::var("KACTOR_BENCH_REPEAT")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(if measuring() { 3 } else { 1 })
}

/// The median of `rounds` by `key` (the lower middle of an even count), and the smallest and
/// largest `key`.
pub fn median_by<T>(rounds: &[T], key: impl Fn(&T) -> f64) -> (&T, f64, f64) {
    assert!(!rounds.is_empty(), "a median of no rounds");
    let mut order: Vec<&T> = rounds.iter().collect();
    order.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let (low, high) = (key(order[0]), key(order[order.len() - 1]));
    (order[(order.len() - 1) / 2], low, high)
}

/// A contender's rounds summed up: its median round by `seconds`, and the range of its rounds'
/// seconds and CPU seconds.
pub struct Summary<'a, T> {
    pub median: &'a T,
    pub rounds: usize,
    pub seconds: (f64, f64),
    pub cpu: (f64, f64),
}

/// The [`Summary`] of `rounds`, whose seconds and CPU seconds `seconds` and `cpu` read.
pub fn summarize<T>(
    rounds: &[T],
    seconds: impl Fn(&T) -> f64,
    cpu: impl Fn(&T) -> f64,
) -> Summary<'_, T> {
    let (median, low, high) = median_by(rounds, seconds);
    let (_, cpu_low, cpu_high) = median_by(rounds, cpu);
    Summary {
        median,
        rounds: rounds.len(),
        seconds: (low, high),
        cpu: (cpu_low, cpu_high),
    }
}

/// Live heap bytes now.
pub fn live_bytes() -> u64 {
    let live: i64 = COUNTER
        .iter()
        .map(|c| c.bytes.load(Ordering::Relaxed))
        .sum();
    live.max(0) as u64
}

/// Heap allocations made so far (reallocations not counted).
pub fn allocations() -> u64 {
    COUNTER
        .iter()
        .map(|c| c.allocations.load(Ordering::Relaxed))
        .sum()
}

/// Kinds of request: object patches, status patches, event posts, other posts, gets (get, list,
/// watch, discovery), anything else.
pub const KINDS: [&str; 6] = ["patch", "status", "event", "post", "get", "other"];
static REQUESTS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Requests served so far, by kind (see [`KINDS`]).
pub type Requests = [u64; 6];

/// A tracing layer counting the emulator's `emulator request` events by kind; add it to the
/// benchmark's subscriber.
pub fn request_counter<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let only_requests = tracing_subscriber::filter::Targets::new()
        .with_target("kactor_emulator::server", tracing::Level::DEBUG);
    RequestCounter.with_filter(only_requests)
}

struct RequestCounter;

#[derive(Default)]
struct Request {
    method: String,
    path: String,
}

impl tracing::field::Visit for Request {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        match field.name() {
            "method" => self.method = format!("{value:?}"),
            "path" => self.path = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for RequestCounter {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut request = Request::default();
        event.record(&mut request);
        let kind = match request.method.as_str() {
            "PATCH" if request.path.ends_with("/status") => 1,
            "PATCH" => 0,
            "POST" if request.path.contains("/events") => 2,
            "POST" => 3,
            "GET" => 4,
            _ => 5,
        };
        REQUESTS[kind].fetch_add(1, Ordering::Relaxed);
    }
}

/// Requests served so far.
pub fn requests_now() -> Requests {
    std::array::from_fn(|kind| REQUESTS[kind].load(Ordering::Relaxed))
}

/// Requests served since `before` (an earlier [`requests_now`]).
pub fn requests_since(before: Requests) -> Requests {
    let now = requests_now();
    std::array::from_fn(|kind| now[kind] - before[kind])
}

/// Files this process has open (each loopback connection holds two: the client's and the
/// emulator's).
pub fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count())
}

/// This process's resident set size, in bytes (`VmRSS` of `/proc/self/status`; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The CPU seconds (user and system) a process has used: `"self"` or a pid, from `/proc/<it>/stat`;
/// 0 once it is gone.
pub fn cpu_seconds_of(process: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{process}/stat"))
        .ok()
        .and_then(|stat| parse_stat(&stat))
        .map_or(0.0, |(_, seconds)| seconds)
}

/// A `/proc/<pid>/status` figure of a process in bytes (`VmRSS`, `VmHWM`); 0 once it is gone.
pub fn memory_of(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|kb| {
            kb.trim_start_matches(':')
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kb| kb * 1024)
}

/// A process's RSS once it has stopped falling for `stable` (the allocator gives memory back a
/// while after the workers idled out), at most a minute.
pub async fn settled_rss_of(pid: u32, stable: Duration) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rss = memory_of(pid, "VmRSS");
    let mut since = Instant::now();
    while Instant::now() < deadline && since.elapsed() < stable {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = memory_of(pid, "VmRSS");
        if now + (1 << 20) < rss {
            since = Instant::now();
        }
        rss = rss.min(now);
    }
    rss
}

/// The command (a thread's name) and utime + stime in seconds of a `/proc/.../stat` line.
pub fn parse_stat(stat: &str) -> Option<(String, f64)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    // The fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    // USER_HZ: 100 clock ticks per second on Linux.
    Some((name, ticks as f64 / 100.0))
}

/// Waits until the process is idle (under a tenth of a core for 100 ms, at most 10 s): the previous
/// contender's emulator frees its objects and history after its last connection closes, and that
/// must not be counted against the next contender.
pub async fn settle() {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut before = cpu_seconds_of("self");
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = cpu_seconds_of("self");
        if now - before < 0.01 {
            return;
        }
        before = now;
    }
}

/// A contender running in the benchmark's process, and how to stop it.
pub enum Running {
    /// A task (a bare loop, a `Controller`): aborted.
    Task(tokio::task::JoinHandle<()>),
    /// A kactor operator (`run_until`): told to stop, and awaited.
    Operator(
        oneshot::Sender<()>,
        tokio::task::JoinHandle<kactor::Result<()>>,
    ),
}

impl Running {
    /// Runs `operator` until [`Running::stop`].
    pub fn operator(operator: kactor::Operator) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(operator.run_until(async {
            let _ = stopped.await;
        }));
        Running::Operator(stop, task)
    }

    /// Stops it; an operator gets 60 s.
    pub async fn stop(self) {
        match self {
            Running::Task(task) => {
                task.abort();
                let _ = task.await;
            }
            Running::Operator(stop, task) => {
                let _ = stop.send(());
                match tokio::time::timeout(Duration::from_secs(60), task).await {
                    Ok(ended) => ended.expect("the operator task").expect("the operator"),
                    Err(_) => println!("  (the operator did not stop within 60 s)"),
                }
            }
        }
    }
}
