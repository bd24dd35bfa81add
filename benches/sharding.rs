//! Sharding with real processes: several replicas of one operator share the widgets of one cluster
//! as a ring (`Operator::shards`), each replica a process of its own, against an emulator in this one.
//! What a user scaling out sees: how much faster N replicas finish than one, what each replica costs
//! in CPU and memory, and what the assigner (the holder of the ring's leader Lease, which labels every
//! object for its owner) costs as objects grow.
//!
//! Run by hand: `cargo bench --bench sharding` (about ten minutes); under `cargo test --all-targets`
//! (or `cargo test --bench sharding`) it makes a quick run instead (about 20 s): 60 objects, 1 and 2
//! replicas, the assigner over 60 objects with a 1 s quiet window. Against the emulator (in this
//! process), or with `KACTOR_BENCH_CLUSTER=apiserver` a real kube-apiserver with etcd
//! (kactor-testenv's; a fresh one per measurement). Sizes: `KACTOR_BENCH_SIZES` (objects of the fast
//! scenarios, default 10,000), `KACTOR_BENCH_SLEEP_SIZES` (the sleeping ones, default 2,000),
//! `KACTOR_BENCH_REPLICAS` (default `1,2,4`), `KACTOR_BENCH_ASSIGNER_SIZES` (default
//! `10000,100000`); `KACTOR_BENCH_ONLY=fast`, `sleep` or `assigner` runs one part;
//! `KACTOR_BENCH_KEEP=1` keeps the processes' logs.
//!
//! Each replica is this benchmark's binary started again in a role (`KACTOR_BENCH_ROLE`): an operator
//! (`Operator::new().client(..).standalone().identity(name).shards(ring)`, cluster-wide) with one
//! create handler on the widgets that returns a result (`status.create_fn`), logging at its default
//! level (INFO, to a log file), and an observer that tells this process, on its stdout, when it
//! joined the ring and took the leader Lease, and its counts (handler runs, watch events, the
//! assigner's resyncs and moves, handovers, fence rejections). The ring's timings are short, as in
//! `tests/sharding_faults.rs`: a 3 s lease, 2 s renew deadline, 300 ms retry period (the defaults,
//! 15 s / 10 s / 2 s, would only make the start slower: a member waits for its Lease, and the assigner
//! for the leader Lease); the resync period is the default 30 s in the throughput scenarios.
//!
//! **Throughput**, for 1, 2 and 4 replicas, with two handlers:
//! * *fast*: the handler returns at once, 256 handlers at once per replica (the default). On this
//!   machine's cores the replicas, the emulator and this watcher share the CPU: this shows the CPU cost
//!   of sharding more than its scaling.
//! * *sleep*: the handler sleeps 100 ms, with `max_concurrent_handlers` 8 in every replica, so that
//!   one replica does at most 80 objects/s and each replica's concurrency, not the CPU, is the
//!   bottleneck: N replicas should do N times as many if sharding scales.
//!
//! and two starts:
//! * *together*: the objects are created first, then the replicas are started all at once, and the
//!   clock starts with them (as a ring's first deployment, or a restart of all its pods, over existing
//!   objects). The assignment is included: the assigner labels the objects first, and a replica sees
//!   only its labelled objects. The assigner assigns to the members whose Leases it has seen, and
//!   moves objects (drains them) to the others as their Leases appear.
//! * *formed*: the replicas are started first, until the ring has formed (every replica joined, the
//!   assigner leads, and 1 s more for it to have seen every member's Lease); then the objects are
//!   created, 16 at once, and the clock starts with the first: the ring's capacity.
//!
//! Printed per scenario: the seconds until a watcher here has seen every object carry its result and
//! its diff-base, objects per second, the speedup over 1 replica (of the same handler and start) and
//! the per-replica efficiency (speedup / N); each replica's CPU seconds until then
//! (`/proc/<pid>/stat`) and their sum, the CPU seconds of this process (the emulator and the watcher);
//! each replica's peak RSS (`VmHWM`) and steady RSS (from 8 s after the last object is done, until the
//! RSS has not fallen for as long, at most a minute; compared to the RSS of a replica with no objects);
//! the handler runs each replica made (who did the work) and the objects each owns once all are quiet
//! (from their labels); and how the ring formed: when the last replica joined and the assigner took the
//! leader Lease (after the replicas' start), when every object was labelled (after the clock's start),
//! how many objects the assigner moved between live replicas (drained) and were handed over, how many
//! writes the fence rejected, and the handler runs beyond one per object. The replica marked `*` is
//! the assigner.
//!
//! **The assigner's cost**, over 10,000 and 100,000 objects, one process each of:
//! * *assigner alone*: the ring's member and assigner (`kactor::sharding::Member` and `Assigner`, as
//!   the leading replica runs them, with leadership given), no operator: the assigner by itself;
//! * *sharded replica*: an operator that shards, with a create handler that never matches (a label
//!   filter), so that no handler runs and nothing but the labels is written: one replica, the
//!   assigner, that watches and caches all the objects as its own;
//! * *unsharded replica*: the same operator without `.shards(..)`: what sharding adds is the difference.
//!
//! Printed: the seconds and CPU seconds until every object was labelled (the unsharded replica: until
//! it has seen every object), the CPU seconds until the process went quiet, its peak RSS; then over a
//! quiet window of 20 s with the resync period at 5 s (so that a few resyncs, each a metadata-only list
//! of every object, fall into it): the resyncs, the CPU seconds, CPU seconds per resync per 10,000
//! objects (the window's CPU, lease renewals included, over its resyncs), and the lowest and highest
//! RSS (sampled every 250 ms).
//!
//! Aims (the sharding issue): per-replica efficiency of at least 80 % of linear at 4 replicas (where
//! each replica's concurrency is the bottleneck), memory per replica about 1/N of one replica's, the
//! assigner's CPU and memory flat as objects grow from 10,000 to 100,000 (per 10,000 objects). The
//! reference is the external sharder's evaluation (timebertt/masters-thesis-controller-sharding):
//! capacity grows from 1 to 5 instances by about x3.2, and each of 3 shards uses about a third of the
//! singleton's memory. The figures are printed, never asserted.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kactor::emulator::samples;
use kactor::observe::{HandlerRun, Observer};
use kactor::pausing::PauseSwitch;
use kactor::prelude::*;
use kactor::sharding::{Assigner, Member, RingSettings, Target};
use kactor_testenv::{Backend, TestCluster};
use kube::api::{Api, DynamicObject, ListParams};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

mod support;

use support::widgets::{detect_when, is_done, populate, HANDLER};

/// The role this binary is started in: `replica` or `assigner`.
const ROLE: &str = "KACTOR_BENCH_ROLE";
/// A replica's name in the ring.
const NAME: &str = "KACTOR_BENCH_REPLICA";
/// What the handler does: `fast`, `sleep` or `none`.
const WORK: &str = "KACTOR_BENCH_WORK";
/// `1`: the replica shards.
const SHARDED: &str = "KACTOR_BENCH_SHARDED";
/// The ring's resync period, in milliseconds.
const RESYNC: &str = "KACTOR_BENCH_RESYNC_MS";

const RING: &str = "widgets";
/// The label the assigner writes: `shard.kactor.dev/<ring>`.
const SHARD_LABEL: &str = "shard.kactor.dev/widgets";
const WIDGETS: &str = "widgets.example.com";
/// A label no widget has: the filter of the handler that never runs.
const NEVER: &str = "bench.kactor.dev/never";
/// How long the sleeping handler sleeps, and how many run at once per replica.
const SLEEP: Duration = Duration::from_millis(100);
const SLEEPING_CONCURRENCY: usize = 8;
/// No measurement may take longer than this.
const DEADLINE: Duration = Duration::from_secs(900);

// ---- The replicas' processes ---------------------------------------------------------------------

fn main() {
    match std::env::var(ROLE) {
        Ok(role) => replica_process(&role),
        Err(_) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(bench()),
    }
}

/// What a replica tells the benchmark, counted here and printed by [`report_counts`].
static RUNS: AtomicU64 = AtomicU64::new(0);
static EVENTS: AtomicU64 = AtomicU64::new(0);
static RESYNCS: AtomicU64 = AtomicU64::new(0);
static ASSIGNED: AtomicU64 = AtomicU64::new(0);
static DRAINED: AtomicU64 = AtomicU64::new(0);
static RELABELLED: AtomicU64 = AtomicU64::new(0);
static HANDED: AtomicU64 = AtomicU64::new(0);
static FENCED: AtomicU64 = AtomicU64::new(0);

/// The replica's observer: joining and leading are printed at once, the rest is counted.
struct Report;

impl Observer for Report {
    fn events_received(&self, resource: &str, count: usize) {
        if resource.starts_with("widgets") {
            EVENTS.fetch_add(count as u64, Ordering::Relaxed);
        }
    }

    fn handler_finished(&self, _run: &HandlerRun<'_>) {
        RUNS.fetch_add(1, Ordering::Relaxed);
    }

    fn leadership(&self, _name: &str, leading: bool) {
        println!("leading {}", u8::from(leading));
    }

    fn shard_member(&self, _ring: &str, joined: bool) {
        println!("joined {}", u8::from(joined));
    }

    fn shard_objects(&self, _ring: &str, _owners: &[(&str, usize)]) {
        RESYNCS.fetch_add(1, Ordering::Relaxed);
    }

    fn shard_moves(&self, _ring: &str, kind: &'static str, count: u64) {
        let counter = match kind {
            "assigned" => &ASSIGNED,
            "drained" => &DRAINED,
            "relabelled" => &RELABELLED,
            _ => return,
        };
        counter.fetch_add(count, Ordering::Relaxed);
    }

    fn fence_rejected(&self, _resource: &str) {
        FENCED.fetch_add(1, Ordering::Relaxed);
    }

    fn handed_over(&self, _resource: &str, _took: Duration) {
        HANDED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Prints the counts (`counts <runs> <events> <resyncs> <assigned> <drained> <relabelled> <handed>
/// <fenced>`) every 100 ms when they changed.
async fn report_counts() {
    let mut last = String::new();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let counts: Vec<String> = [
            &RUNS,
            &EVENTS,
            &RESYNCS,
            &ASSIGNED,
            &DRAINED,
            &RELABELLED,
            &HANDED,
            &FENCED,
        ]
        .iter()
        .map(|counter| counter.load(Ordering::Relaxed).to_string())
        .collect();
        let line = format!("counts {}", counts.join(" "));
        if line != last {
            println!("{line}");
            last = line;
        }
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a replica"))
}

/// The ring, with short timings (see the module's documentation).
fn ring(identity: &str) -> RingSettings {
    let ring = RingSettings::new(RING, "default", identity)
        .with_timings(
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::from_millis(300),
        )
        .expect("valid ring timings");
    let resync = env(RESYNC).parse().expect("milliseconds");
    RingSettings {
        resync_period: Duration::from_millis(resync),
        ..ring
    }
}

/// This binary started as a replica (or the assigner alone): runs until killed.
fn replica_process(role: &str) {
    let _ = kactor::logging::init(&kactor::logging::LogSettings::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        tokio::spawn(report_counts());
        match role {
            "replica" => replica().await,
            "assigner" => assigner_alone().await,
            other => panic!("unknown role {other}"),
        }
    });
}

async fn replica() {
    let name = env(NAME);
    let client = kube::Client::try_default().await.expect("a client");
    let mut operator = Operator::new()
        .client(client)
        .standalone()
        .identity(&name)
        .cluster_wide()
        .observer(Arc::new(Report));
    if env(SHARDED) == "1" {
        operator = operator.shards(ring(&name));
    }
    let operator = match env(WORK).as_str() {
        "fast" => operator.on_create(WIDGETS, HANDLER, |_ctx: Ctx| async move {
            Ok::<_, HandlerError>(json!({"message": "hello"}))
        }),
        "sleep" => operator
            .settings(|s| s.execution.max_concurrent_handlers = SLEEPING_CONCURRENCY)
            .on_create(WIDGETS, HANDLER, |_ctx: Ctx| async move {
                tokio::time::sleep(SLEEP).await;
                Ok::<_, HandlerError>(json!({"message": "hello"}))
            }),
        "none" => operator.on_create(
            WIDGETS,
            On::id(HANDLER).label(NEVER, MetaFilter::Present),
            |_ctx: Ctx| async move { Ok::<_, HandlerError>(json!({"message": "never"})) },
        ),
        other => panic!("unknown work {other}"),
    };
    operator.run().await.expect("the operator");
}

/// The ring's member and assigner as the leading replica runs them, with leadership given.
async fn assigner_alone() {
    let name = env(NAME);
    let client = kube::Client::try_default().await.expect("a client");
    let settings = ring(&name);
    let member = Member::new(client.clone(), settings.clone(), PauseSwitch::new());
    let mut joined = member.joined();
    tokio::spawn(member.run(std::future::pending()));
    // As in a replica, where the leader Lease takes longer than the member's own: the assigner's
    // first look at the Leases finds this member.
    let _ = joined.wait_for(|joined| *joined).await;
    println!("joined 1");
    let target = Target::new(samples::widget_api_resource(), None);
    let assigner = Assigner::new(client, settings, vec![target]);
    let mut view = assigner.view();
    tokio::spawn(async move {
        while view.changed().await.is_ok() {
            let view = view.borrow_and_update();
            RESYNCS.store(view.resyncs, Ordering::Relaxed);
            ASSIGNED.store(view.assigned, Ordering::Relaxed);
            DRAINED.store(view.drained, Ordering::Relaxed);
            RELABELLED.store(view.relabelled, Ordering::Relaxed);
        }
    });
    // Kept, so that leadership is never taken back.
    let (_leading, is_leader) = tokio::sync::watch::channel(true);
    println!("leading 1");
    assigner
        .run(is_leader, std::future::pending())
        .await
        .expect("valid ring settings");
}

// ---- Running and watching the replicas -----------------------------------------------------------

/// The counts a replica last printed.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    runs: u64,
    events: u64,
    resyncs: u64,
    assigned: u64,
    drained: u64,
    relabelled: u64,
    handed: u64,
    fenced: u64,
}

impl Counts {
    fn parse(line: &str) -> Option<Counts> {
        let numbers: Vec<u64> = line
            .strip_prefix("counts ")?
            .split(' ')
            .filter_map(|n| n.parse().ok())
            .collect();
        let [runs, events, resyncs, assigned, drained, relabelled, handed, fenced] =
            numbers.try_into().ok()?;
        Some(Counts {
            runs,
            events,
            resyncs,
            assigned,
            drained,
            relabelled,
            handed,
            fenced,
        })
    }
}

/// What a replica told, with when (since the replicas were started).
#[derive(Debug, Default)]
struct Seen {
    joined: Option<Duration>,
    leading: Option<Duration>,
    /// When its assigner first labelled objects.
    assigning: Option<Duration>,
    counts: Counts,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    Fast,
    Sleep,
    None,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Fast => "fast",
            Work::Sleep => "sleep",
            Work::None => "none",
        }
    }
}

/// What a process is started as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// An operator with a handler doing `work`, sharded or not.
    Replica { work: Work, sharded: bool },
    /// The ring's member and assigner alone.
    Assigner,
}

/// A replica's process, with what it told.
struct Replica {
    name: String,
    child: Child,
    /// Where its stdout (but for the report lines) and stderr go.
    log: PathBuf,
    pid: u32,
    seen: Arc<Mutex<Seen>>,
}

impl Replica {
    fn start(plan: &Plan, kubeconfig: &Path, name: &str, role: Role, started: Instant) -> Replica {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let number = STARTED.fetch_add(1, Ordering::Relaxed);
        let log = plan.dir.join(format!("{number}-{name}.log"));
        let stderr = std::fs::File::create(&log).expect("the log file");
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        match role {
            Role::Replica { work, sharded } => command
                .env(ROLE, "replica")
                .env(WORK, work.name())
                .env(SHARDED, if sharded { "1" } else { "0" }),
            Role::Assigner => command.env(ROLE, "assigner"),
        };
        command
            .env(NAME, name)
            .env(RESYNC, plan.resync.as_millis().to_string())
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        let mut child = command.spawn().expect("the replica starts");
        let pid = child.id().expect("a running child");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stdout = child.stdout.take().expect("piped stdout");
        let told = seen.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let at = started.elapsed();
                let mut seen = told.lock().expect("not poisoned");
                match line.as_str() {
                    "joined 1" => _ = seen.joined.get_or_insert(at),
                    "leading 1" => _ = seen.leading.get_or_insert(at),
                    _ => {
                        if let Some(counts) = Counts::parse(&line) {
                            if counts.assigned > 0 {
                                seen.assigning.get_or_insert(at);
                            }
                            seen.counts = counts;
                        }
                    }
                }
            }
        });
        Replica {
            name: name.to_string(),
            child,
            log,
            pid,
            seen,
        }
    }

    fn seen<T>(&self, what: impl FnOnce(&Seen) -> T) -> T {
        what(&self.seen.lock().expect("not poisoned"))
    }

    fn cpu_seconds(&self) -> f64 {
        support::cpu_seconds_of(&self.pid.to_string())
    }

    /// A `/proc/<pid>/status` figure in bytes (`VmRSS`, `VmHWM`); 0 once the process is gone.
    fn memory(&self, field: &str) -> u64 {
        support::memory_of(self.pid, field)
    }

    /// Fails with the end of its log if the process has exited.
    fn check_alive(&mut self, what: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "{what}: {} exited ({status}) before it was done:\n{}",
                self.name,
                tail.join("\n")
            );
        }
    }

    /// Waits until the process has used under 2 % of a core for half a second (at most `limit`).
    async fn quiet(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut before = self.cpu_seconds();
        while Instant::now() < deadline {
            self.check_alive("waiting for quiet");
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.cpu_seconds();
            if now - before < 0.01 {
                return;
            }
            before = now;
        }
    }

    /// The RSS once it has stopped falling for `stable`, at most a minute.
    async fn settled_rss(&self, stable: Duration) -> u64 {
        support::settled_rss_of(self.pid, stable).await
    }

    async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Waits for `done`; fails if a replica exits first, or after [`DEADLINE`].
async fn until(
    replicas: &mut [Replica],
    done: impl Future<Output = Instant>,
    what: &str,
) -> Instant {
    let deadline = tokio::time::sleep(DEADLINE);
    tokio::pin!(deadline, done);
    loop {
        tokio::select! {
            finished = &mut done => return finished,
            () = &mut deadline => panic!("{what}: not done after {DEADLINE:?}"),
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                for replica in replicas.iter_mut() {
                    replica.check_alive(what);
                }
            }
        }
    }
}

// ---- The cluster ---------------------------------------------------------------------------------

/// The server the replicas run against: `KACTOR_BENCH_CLUSTER=apiserver` for a real kube-apiserver
/// with etcd (kactor-testenv's), else the emulator.
fn backend() -> Backend {
    Backend::parse(&std::env::var("KACTOR_BENCH_CLUSTER").unwrap_or_default())
        .expect("KACTOR_BENCH_CLUSTER: emulator or apiserver")
}

struct Setup {
    /// Kept until the measurement is done (dropping it stops the server).
    _cluster: TestCluster,
    widgets: Api<DynamicObject>,
    kubeconfig: PathBuf,
}

/// A fresh server for `objects` widgets, with the widgets' CRD and `created` of them.
async fn setup(plan: &Plan, objects: usize, created: usize) -> Setup {
    let cluster = TestCluster::builder()
        .backend(backend())
        .emulator(|emulator| emulator.history_limit(objects * 8 + 10_000))
        .start()
        .await
        .expect("the cluster starts");
    let widgets = samples::install_widgets(&cluster.client())
        .await
        .expect("the widgets' CRD");
    let kubeconfig = plan.dir.join("kubeconfig");
    cluster
        .write_kubeconfig(&kubeconfig)
        .expect("the kubeconfig");
    populate(&widgets, created).await;
    Setup {
        _cluster: cluster,
        widgets,
        kubeconfig,
    }
}

fn owner(object: &DynamicObject) -> Option<&str> {
    object
        .metadata
        .labels
        .as_ref()?
        .get(SHARD_LABEL)
        .map(String::as_str)
        .filter(|owner| !owner.is_empty())
}

/// The objects each owner's label names.
async fn owners(widgets: &Api<DynamicObject>) -> BTreeMap<String, usize> {
    let listed = widgets
        .list_metadata(&ListParams::default())
        .await
        .expect("the widgets");
    let mut owners = BTreeMap::new();
    for object in &listed.items {
        let owner = object
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SHARD_LABEL))
            .map_or("-", String::as_str);
        *owners.entry(owner.to_string()).or_default() += 1;
    }
    owners
}

/// The instant the `objects`-th object was first seen labelled, once it has been.
type Labelled = Arc<Mutex<Option<Instant>>>;

/// A watcher that resolves when every object carries its result (or, `labelled_only`, its shard
/// label), and records when every object was labelled.
async fn watch_objects(
    widgets: &Api<DynamicObject>,
    objects: usize,
    labelled_only: bool,
) -> (tokio::task::JoinHandle<Instant>, Labelled) {
    let labelled_at: Labelled = Arc::default();
    let at = labelled_at.clone();
    let mut labelled = HashSet::with_capacity(objects);
    let detector = detect_when(widgets.clone(), objects, move |object| {
        if owner(object).is_some()
            && labelled.insert(object.metadata.name.clone().unwrap_or_default())
            && labelled.len() == objects
        {
            at.lock()
                .expect("not poisoned")
                .get_or_insert(Instant::now());
        }
        if labelled_only {
            owner(object).is_some()
        } else {
            is_done(object)
        }
    });
    detector.listed.await.expect("the completion watcher lists");
    (detector.done, labelled_at)
}

// ---- Throughput ----------------------------------------------------------------------------------

/// How the replicas meet the objects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The objects first, then the replicas all at once; the clock starts with the replicas.
    Together,
    /// The replicas first, until the ring has formed (every replica joined, the assigner leads, and
    /// 1 s more for it to see every member's Lease); then the objects are created, 16 at once, and
    /// the clock starts with the first.
    Formed,
}

impl Start {
    fn name(self) -> &'static str {
        match self {
            Start::Together => "together",
            Start::Formed => "formed",
        }
    }
}

struct Throughput {
    work: Work,
    start: Start,
    objects: usize,
    elapsed: Duration,
    /// Per replica, in the order started: CPU seconds until done, peak and steady RSS, handler runs,
    /// the objects its label names once every replica is quiet.
    cpu: Vec<f64>,
    peak: Vec<u64>,
    steady: Vec<u64>,
    runs: Vec<u64>,
    owned: Vec<usize>,
    /// Objects that no replica's label names once every replica is quiet.
    unowned: usize,
    /// The replica that led (assigned), if one did.
    assigner: Option<usize>,
    server_cpu: f64,
    drained: u64,
    handed: u64,
    relabelled: u64,
    fenced: u64,
    /// Since the replicas' start: the last replica joined the ring, the assigner led; since the
    /// clock's start: every object was labelled.
    joined: Option<Duration>,
    leading: Option<Duration>,
    labelled: Option<Duration>,
}

impl Throughput {
    fn replicas(&self) -> usize {
        self.cpu.len()
    }

    fn rate(&self) -> f64 {
        self.objects as f64 / self.elapsed.as_secs_f64()
    }

    fn reruns(&self) -> i64 {
        self.runs.iter().sum::<u64>() as i64 - self.objects as i64
    }
}

/// Starts the replicas; with [`Start::Formed`], waits until their ring has formed and creates the
/// objects. Returns them and the instant the clock starts.
async fn start_replicas(
    plan: &Plan,
    setup: &Setup,
    work: Work,
    (replicas, objects): (usize, usize),
    start: Start,
) -> (Vec<Replica>, Instant) {
    let role = Role::Replica {
        work,
        sharded: true,
    };
    let started = Instant::now();
    let mut running: Vec<Replica> = (0..replicas)
        .map(|i| {
            let name = format!("replica-{i}");
            Replica::start(plan, &setup.kubeconfig, &name, role, started)
        })
        .collect();
    if start == Start::Together {
        return (running, started);
    }
    let deadline = started + Duration::from_secs(60);
    loop {
        for replica in &mut running {
            replica.check_alive("the ring forming");
        }
        let joined = running.iter().all(|r| r.seen(|s| s.joined.is_some()));
        let led = running.iter().any(|r| r.seen(|s| s.leading.is_some()));
        if joined && led {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ring did not form within a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let clock = Instant::now();
    populate(&setup.widgets, objects).await;
    (running, clock)
}

async fn measure_throughput(
    plan: &Plan,
    work: Work,
    (replicas, objects): (usize, usize),
    start: Start,
) -> Throughput {
    let created = if start == Start::Together { objects } else { 0 };
    let setup = setup(plan, objects, created).await;
    let (done, labelled_at) = watch_objects(&setup.widgets, objects, false).await;
    let server_before = support::cpu_seconds_of("self");
    let (mut running, clock) = start_replicas(plan, &setup, work, (replicas, objects), start).await;
    let what = format!(
        "{} handlers, {replicas} replicas, {objects} objects, {}",
        work.name(),
        start.name()
    );
    let done = until(
        &mut running,
        async { done.await.expect("the completion watcher") },
        &what,
    )
    .await;
    let elapsed = done - clock;
    let server_cpu = support::cpu_seconds_of("self") - server_before;
    let cpu: Vec<f64> = running.iter().map(Replica::cpu_seconds).collect();
    tokio::time::sleep(plan.idle).await;
    futures::future::join_all(running.iter_mut().map(|r| r.quiet(Duration::from_secs(30)))).await;
    let peak = running.iter().map(|r| r.memory("VmHWM")).collect();
    let steady = futures::future::join_all(running.iter().map(|r| r.settled_rss(plan.idle))).await;
    let mut owners = owners(&setup.widgets).await;
    let owned = running
        .iter()
        .map(|r| owners.remove(&r.name).unwrap_or(0))
        .collect();
    let seen: Vec<(Option<Duration>, Option<Duration>, Counts)> = running
        .iter()
        .map(|r| r.seen(|s| (s.joined, s.leading, s.counts)))
        .collect();
    let sum = |count: fn(&Counts) -> u64| seen.iter().map(|(_, _, c)| count(c)).sum();
    let figures = Throughput {
        work,
        start,
        objects,
        elapsed,
        cpu,
        peak,
        steady,
        runs: seen.iter().map(|(_, _, counts)| counts.runs).collect(),
        owned,
        unowned: owners.values().sum(),
        assigner: seen.iter().position(|(_, leading, _)| leading.is_some()),
        server_cpu,
        drained: sum(|c| c.drained),
        handed: sum(|c| c.handed),
        relabelled: sum(|c| c.relabelled),
        fenced: sum(|c| c.fenced),
        joined: seen.iter().map(|(joined, _, _)| *joined).max().flatten(),
        leading: seen.iter().filter_map(|(_, leading, _)| *leading).min(),
        labelled: labelled_at
            .lock()
            .expect("not poisoned")
            .map(|at| at - clock),
    };
    for replica in running {
        replica.kill().await;
    }
    print_progress(&figures);
    figures
}

fn print_progress(f: &Throughput) {
    let seconds =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.2}", d.as_secs_f64()));
    println!(
        "  {} handlers, {} replicas, {} objects, {}: {:.2} s, {:.2} CPU s in all; the last replica \
         joined {} s and the assigner led {} s after their start, every object was labelled after {} s; \
         {} drained, {} handed over, {} relabelled, {} writes fenced, {} re-runs",
        f.work.name(),
        f.replicas(),
        f.objects,
        f.start.name(),
        f.elapsed.as_secs_f64(),
        f.cpu.iter().sum::<f64>(),
        seconds(f.joined),
        seconds(f.leading),
        seconds(f.labelled),
        f.drained,
        f.handed,
        f.relabelled,
        f.fenced,
        f.reruns(),
    );
}

/// The RSS of a sharded replica over no objects, `plan.settle` after its start.
async fn empty_rss(plan: &Plan) -> u64 {
    let setup = setup(plan, 0, 0).await;
    let role = Role::Replica {
        work: Work::Fast,
        sharded: true,
    };
    let mut replica = Replica::start(plan, &setup.kubeconfig, "empty", role, Instant::now());
    tokio::time::sleep(plan.settle).await;
    replica.check_alive("the empty replica");
    let rss = replica.memory("VmRSS");
    replica.kill().await;
    rss
}

// ---- The assigner's cost -------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cost {
    Alone,
    Sharded,
    Unsharded,
}

impl Cost {
    fn name(self) -> &'static str {
        match self {
            Cost::Alone => "assigner alone",
            Cost::Sharded => "sharded replica, no handler runs",
            Cost::Unsharded => "unsharded replica, no handler runs",
        }
    }
}

struct Costs {
    cost: Cost,
    objects: usize,
    /// Until every object was labelled (unsharded: seen), and the CPU seconds then.
    until: Duration,
    cpu_until: f64,
    /// The CPU seconds once the process went quiet, its peak RSS.
    cpu_settled: f64,
    peak: u64,
    /// Over the quiet window: resyncs, CPU seconds, the lowest and highest RSS (sampled every
    /// 250 ms).
    resyncs: u64,
    window_cpu: f64,
    rss_low: u64,
    rss_high: u64,
    assigned: u64,
}

async fn measure_cost(plan: &Plan, cost: Cost, objects: usize) -> Costs {
    let setup = setup(plan, objects, objects).await;
    let (labelled, _) = watch_objects(&setup.widgets, objects, true).await;
    let started = Instant::now();
    let role = match cost {
        Cost::Alone => Role::Assigner,
        Cost::Sharded | Cost::Unsharded => Role::Replica {
            work: Work::None,
            sharded: cost == Cost::Sharded,
        },
    };
    let mut running = [Replica::start(
        plan,
        &setup.kubeconfig,
        "replica-0",
        role,
        started,
    )];
    let what = format!("{}, {objects} objects", cost.name());
    let done = if cost == Cost::Unsharded {
        labelled.abort();
        let seen = running[0].seen.clone();
        let listed = async move {
            while seen.lock().expect("not poisoned").counts.events < objects as u64 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Instant::now()
        };
        until(&mut running, listed, &what).await
    } else {
        let labelled = async { labelled.await.expect("the label watcher") };
        until(&mut running, labelled, &what).await
    };
    let [mut replica] = running;
    let cpu_until = replica.cpu_seconds();
    replica.quiet(Duration::from_secs(60)).await;
    let cpu_settled = replica.cpu_seconds();
    let resyncs_before = replica.seen(|s| s.counts.resyncs);
    let (mut rss_low, mut rss_high) = (u64::MAX, 0);
    let window = Instant::now();
    while window.elapsed() < plan.window {
        tokio::time::sleep(Duration::from_millis(250)).await;
        replica.check_alive(&what);
        let rss = replica.memory("VmRSS");
        (rss_low, rss_high) = (rss_low.min(rss), rss_high.max(rss));
    }
    let figures = Costs {
        cost,
        objects,
        until: done - started,
        cpu_until,
        cpu_settled,
        peak: replica.memory("VmHWM"),
        resyncs: replica.seen(|s| s.counts.resyncs) - resyncs_before,
        window_cpu: replica.cpu_seconds() - cpu_settled,
        rss_low,
        rss_high,
        assigned: replica.seen(|s| s.counts.assigned),
    };
    replica.kill().await;
    println!(
        "  {what}: {:.2} s, {:.2} CPU s until {} ({} assigned); {} resyncs, {:.2} CPU s in the quiet window",
        figures.until.as_secs_f64(),
        figures.cpu_until,
        if cost == Cost::Unsharded {
            "seen"
        } else {
            "labelled"
        },
        figures.assigned,
        figures.resyncs,
        figures.window_cpu,
    );
    figures
}

// ---- Printing ------------------------------------------------------------------------------------

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1048576.0)
}

/// `a/b/c`, the assigner's marked `*`.
fn per_replica(values: impl Iterator<Item = String>, assigner: Option<usize>) -> String {
    values
        .enumerate()
        .map(|(i, v)| {
            if Some(i) == assigner {
                format!("{v}*")
            } else {
                v
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The 1-replica figures of the same work and size.
fn single<'a>(all: &'a [Throughput], f: &Throughput) -> Option<&'a Throughput> {
    all.iter().find(|s| {
        s.work == f.work && s.start == f.start && s.objects == f.objects && s.replicas() == 1
    })
}

fn print_throughput(all: &[Throughput], empty: u64) {
    println!();
    println!(
        "{:<5} {:<8} {:>1} {:>6} {:>7} {:>6} {:>7} {:>4} {:>6} {:>6} {:<22} {:<22} {:<22} {:<22} {:<22} {:>7}",
        "work", "start", "N", "objs", "seconds", "obj/s", "speedup", "eff", "server", "cpu s",
        "cpu s per replica", "peak MiB per replica", "steady MiB per rep.", "runs per replica",
        "objects per replica", "drained"
    );
    for f in all {
        let (speedup, efficiency) = single(all, f).map_or((f64::NAN, f64::NAN), |one| {
            let speedup = f.rate() / one.rate();
            (speedup, speedup / f.replicas() as f64)
        });
        let mut owned = per_replica(f.owned.iter().map(usize::to_string), f.assigner);
        if f.unowned > 0 {
            owned += &format!(" +{}", f.unowned);
        }
        println!(
            "{:<5} {:<8} {:>1} {:>6} {:>7.2} {:>6.0} {:>6.2}x {:>3.0}% {:>6.2} {:>6.2} {:<22} {:<22} {:<22} {:<22} {:<22} {:>7}",
            f.work.name(),
            f.start.name(),
            f.replicas(),
            f.objects,
            f.elapsed.as_secs_f64(),
            f.rate(),
            speedup,
            efficiency * 100.0,
            f.server_cpu,
            f.cpu.iter().sum::<f64>(),
            per_replica(f.cpu.iter().map(|c| format!("{c:.2}")), f.assigner),
            per_replica(f.peak.iter().map(|&b| mib(b)), f.assigner),
            per_replica(f.steady.iter().map(|&b| mib(b)), f.assigner),
            per_replica(f.runs.iter().map(u64::to_string), f.assigner),
            owned,
            f.drained,
        );
    }
    println!(
        "(N: replicas; eff: speedup / N; server: CPU s of this process, the {} and the watcher (and, \
         when formed, the creation of the objects); * the assigner; runs: the handler runs each replica \
         made; objects per replica: their labels once all were quiet, +N: unlabelled; a replica over no \
         objects: {} MiB)",
        backend_name(),
        mib(empty)
    );
}

fn print_costs(all: &[Costs]) {
    println!();
    println!(
        "{:>7} {:<35} {:>8} {:>7} {:>9} {:>9} {:>8} | {:>7} {:>6} {:>16} {:>13}",
        "objects",
        "process",
        "seconds",
        "cpu s",
        "cpu s/10k",
        "settled",
        "peak MiB",
        "resyncs",
        "cpu s",
        "cpu s/resync/10k",
        "RSS MiB"
    );
    for c in all {
        let tens = c.objects as f64 / 10_000.0;
        let per_resync = if c.resyncs == 0 {
            "-".to_string()
        } else {
            format!("{:.3}", c.window_cpu / c.resyncs as f64 / tens)
        };
        println!(
            "{:>7} {:<35} {:>8.2} {:>7.2} {:>9.3} {:>9.2} {:>8} | {:>7} {:>6.2} {:>16} {:>13}",
            c.objects,
            c.cost.name(),
            c.until.as_secs_f64(),
            c.cpu_until,
            c.cpu_until / tens,
            c.cpu_settled,
            mib(c.peak),
            c.resyncs,
            c.window_cpu,
            per_resync,
            format!("{}-{}", mib(c.rss_low), mib(c.rss_high)),
        );
    }
    println!(
        "(seconds, cpu s: until every object was labelled, for the unsharded replica until it had seen \
         every object; settled: CPU s once the process went quiet; right of |: the quiet window, with the lowest and \
         highest RSS in it)"
    );
}

fn print_aims(plan: &Plan, all: &[Throughput], costs: &[Costs], empty: u64) {
    println!();
    for f in all.iter().filter(|f| f.replicas() > 1) {
        let Some(one) = single(all, f) else { continue };
        let speedup = f.rate() / one.rate();
        let efficiency = speedup / f.replicas() as f64;
        let above = |rss: u64| rss.saturating_sub(empty) as f64;
        let steady = f.steady.iter().map(|&r| above(r)).sum::<f64>() / f.replicas() as f64;
        let memory = steady / above(one.steady[0]).max(1.0);
        let mut line = format!(
            "{} handlers, {} replicas, {}: x{speedup:.2} the objects/s of one, {:.0} % of linear per \
             replica; steady RSS beyond an empty replica's {:.0} % of one replica's (1/N = {:.0} %)",
            f.work.name(),
            f.replicas(),
            f.start.name(),
            efficiency * 100.0,
            memory * 100.0,
            100.0 / f.replicas() as f64
        );
        if f.replicas() == 4 {
            let met = if efficiency >= 0.8 { "met" } else { "NOT met" };
            line += &format!("; aim >= 80 % at 4 replicas: {met}");
        }
        println!("{line}");
    }
    let alone: Vec<&Costs> = costs.iter().filter(|c| c.cost == Cost::Alone).collect();
    if let (Some(small), Some(large)) = (alone.first(), alone.last()) {
        if large.objects > small.objects {
            let per = |c: &Costs| c.cpu_until / (c.objects as f64 / 10_000.0);
            let resync =
                |c: &Costs| c.window_cpu / c.resyncs.max(1) as f64 / (c.objects as f64 / 10_000.0);
            println!(
                "the assigner alone, {} -> {} objects: labelling CPU s per 10,000 objects x{:.2}, CPU s per \
                 resync per 10,000 objects x{:.2}, peak RSS x{:.2}, lowest RSS in the quiet window x{:.2} \
                 (flat per object: x1)",
                small.objects,
                large.objects,
                per(large) / per(small),
                resync(large) / resync(small),
                large.peak as f64 / small.peak as f64,
                large.rss_low as f64 / small.rss_low as f64,
            );
        }
    }
    for objects in plan.assigner_sizes.iter() {
        let find = |cost| {
            costs
                .iter()
                .find(|c| c.cost == cost && c.objects == *objects)
        };
        if let (Some(sharded), Some(unsharded)) = (find(Cost::Sharded), find(Cost::Unsharded)) {
            println!(
                "{objects} objects: sharding adds {:+.2} CPU s until settled, {:+.2} CPU s over the quiet \
                 window ({} resyncs), {:+.1} MiB of peak RSS, {:+.1} MiB of the lowest RSS in the window",
                sharded.cpu_settled - unsharded.cpu_settled,
                sharded.window_cpu - unsharded.window_cpu,
                sharded.resyncs,
                (sharded.peak as f64 - unsharded.peak as f64) / 1048576.0,
                (sharded.rss_low as f64 - unsharded.rss_low as f64) / 1048576.0,
            );
        }
    }
    println!(
        "reference (timebertt/masters-thesis-controller-sharding): capacity x3.2 from 1 to 5 instances; \
         each of 3 shards about a third of the singleton's memory"
    );
}

fn backend_name() -> &'static str {
    match backend() {
        Backend::Emulator => "emulator",
        Backend::ApiServer => "kube-apiserver",
    }
}

// ---- The run -------------------------------------------------------------------------------------

struct Plan {
    dir: PathBuf,
    replicas: Vec<usize>,
    fast_sizes: Vec<usize>,
    sleep_sizes: Vec<usize>,
    assigner_sizes: Vec<usize>,
    /// The resync period of the ring (the assigner's cost); the throughput scenarios' replicas get
    /// it too.
    resync: Duration,
    /// The quiet window of the assigner's cost.
    window: Duration,
    /// How long the empty replica runs before its RSS is read, and how long the workers are let idle
    /// out before the steady RSS is.
    settle: Duration,
    idle: Duration,
}

fn list(name: &str, measured: &[usize], quick: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|list| {
            list.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| {
            if support::measuring() {
                measured.to_vec()
            } else {
                quick.to_vec()
            }
        })
}

fn plan() -> Plan {
    let measuring = support::measuring();
    let dir = std::env::temp_dir().join(format!("kactor-bench-sharding-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let seconds =
        |measured: u64, quick: u64| Duration::from_secs(if measuring { measured } else { quick });
    Plan {
        dir,
        replicas: list("KACTOR_BENCH_REPLICAS", &[1, 2, 4], &[1, 2]),
        fast_sizes: list("KACTOR_BENCH_SIZES", &[10_000], &[60]),
        sleep_sizes: list("KACTOR_BENCH_SLEEP_SIZES", &[2_000], &[60]),
        assigner_sizes: list("KACTOR_BENCH_ASSIGNER_SIZES", &[10_000, 100_000], &[60]),
        resync: seconds(30, 30),
        window: seconds(20, 1),
        settle: seconds(3, 1),
        // The quick run reads the steady RSS at once.
        idle: seconds(8, 0),
    }
}

async fn bench() {
    let mut plan = plan();
    let only = std::env::var("KACTOR_BENCH_ONLY").ok();
    let runs = |part: &str| only.as_deref().is_none_or(|only| only == part);
    println!(
        "kactor sharding benchmark: {:?} replicas, fast handlers over {:?} objects, sleeping ones \
         ({} ms, {SLEEPING_CONCURRENCY} at once per replica) over {:?}, the assigner over {:?}; {} \
         cores, against the {} (KACTOR_BENCH_CLUSTER)",
        plan.replicas,
        plan.fast_sizes,
        SLEEP.as_millis(),
        plan.sleep_sizes,
        plan.assigner_sizes,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        backend_name(),
    );
    let empty = empty_rss(&plan).await;
    let mut all = Vec::new();
    for (work, sizes) in [
        (Work::Fast, &plan.fast_sizes),
        (Work::Sleep, &plan.sleep_sizes),
    ] {
        if !runs(work.name()) {
            continue;
        }
        for start in [Start::Together, Start::Formed] {
            for &objects in sizes {
                for &replicas in &plan.replicas {
                    let size = (replicas, objects);
                    all.push(measure_throughput(&plan, work, size, start).await);
                }
            }
        }
    }
    let mut costs = Vec::new();
    if runs("assigner") {
        // A few resyncs in the quiet window.
        plan.resync = plan.window / 4;
        for &objects in &plan.assigner_sizes {
            for cost in [Cost::Alone, Cost::Sharded, Cost::Unsharded] {
                costs.push(measure_cost(&plan, cost, objects).await);
            }
        }
    }
    if !all.is_empty() {
        print_throughput(&all, empty);
    }
    if !costs.is_empty() {
        print_costs(&costs);
    }
    print_aims(&plan, &all, &costs, empty);
    if std::env::var_os("KACTOR_BENCH_KEEP").is_some() {
        println!("the replicas' logs: {}", plan.dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&plan.dir);
    }
}
