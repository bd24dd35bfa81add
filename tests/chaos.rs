//! Crash consistency, tried as an operator's users would break it: an operator process killed with
//! SIGKILL at random moments while objects are created, patched and deleted; then run to quiet and
//! checked. Three operators, three tests:
//!
//! * **Changes** (`an_operator_killed_at_random_loses_no_result_and_misses_no_change`): two create
//!   handlers (`a`, and `b`, which sleeps up to 300 ms and fails temporarily now and then), a field
//!   handler on `spec.size` and a delete handler. Checked: every object has every result
//!   (`status.a`, `status.b`); every object's field handler last saw its final `spec.size`; every
//!   deleted object is gone (no finalizer left); each handler's successful runs per object: more
//!   than one only where a kill cut off the first success before its record was stored (counted
//!   and printed, never failing the test).
//! * **Daemons and timers** (`daemons_and_timers_of_an_operator_killed_at_random_come_back_and_land_their_results`):
//!   a timer every second that returns `spec.size` and patches it into `status.ticked`, and a daemon
//!   that lives as long as its object. Checked: every object's timer result and patch show its
//!   final `spec.size` (they landed after the kills); every object has its daemon in the last
//!   process, and no process ever ran two daemons for one object; every deleted object is gone.
//! * **Deletions** (`a_deletion_cut_off_by_a_kill_releases_its_finalizer_after_the_restart`): every
//!   object handled first, then all deleted in bursts, with kills among them; at each kill, the
//!   objects whose delete handler had succeeded but whose finalizer was still there are counted
//!   (cut between the delete handler and the finalizer's release). Checked: every object is gone,
//!   its delete handler ran, and re-ran no more often than kills cut it off.
//!
//! The operator is this test binary itself, run again as the ignored test `chaos_operator_process`.
//! Seeded (`KACTOR_CHAOS_SEED`), sized by `KACTOR_CHAOS_OBJECTS` (default 200, 50 and 100) and
//! `KACTOR_CHAOS_KILLS` (default 6, 4 and 5), bounded in time (`KACTOR_CHAOS_QUIET`, default 240 s
//! to quiet). The tests take turns (one cluster and one operator at a time). Runs on either test
//! cluster; the figures go to stderr, past the harness's capture.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kactor::emulator::samples;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use tokio::process::{Child, Command};

const OPERATOR_ENV: &str = "KACTOR_CHAOS_OPERATOR";
const WIDGETS: &str = "widgets.example.com";
/// The field handler's id, as its result is stored (`status.<id>`).
const SIZE: &str = "size/spec.size";
/// The longest the operator may take to bring every object to quiet after the last kill (seconds;
/// `KACTOR_CHAOS_QUIET`).
const QUIET: u64 = 240;

/// One chaos test at a time: each runs a cluster (a real one, on that backend) and an operator
/// process, which is all a 2-core machine should carry at once.
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: a seeded sequence for the plan of actions (no dependency for a few numbers).
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A stable hash of a text, for the handlers' per-object choices (sleep, failure).
fn hash(text: &str) -> u64 {
    let mut random = Random(text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }));
    random.next()
}

/// Appends a run to the runs file: one short line with O_APPEND, so lines from the processes that
/// follow one another never mix.
fn record(runs: &Path, object: &str, handler: &str, value: &serde_json::Value) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(runs)
        .expect("the runs file opens");
    file.write_all(format!("{object} {handler} {value}\n").as_bytes())
        .expect("the run is recorded");
}

/// The runs recorded so far: (object, handler, value) per line.
fn runs_of(runs: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(runs).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut words = line.splitn(3, ' ');
            let (object, handler) = (words.next()?, words.next()?);
            let value = words.next().unwrap_or_default();
            Some((object.into(), handler.into(), value.into()))
        })
        .collect()
}

/// How often each (object, handler) ran successfully.
fn counts(runs: &[(String, String, String)]) -> HashMap<(String, String), u64> {
    let mut counts = HashMap::new();
    for (object, handler, _) in runs {
        *counts.entry((object.clone(), handler.clone())).or_default() += 1;
    }
    counts
}

/// The operator a chaos test kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Changes,
    Spawning,
    Deletions,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Changes => "changes",
            Scenario::Spawning => "spawning",
            Scenario::Deletions => "deletions",
        }
    }

    fn parse(name: &str) -> Scenario {
        [Scenario::Changes, Scenario::Spawning, Scenario::Deletions]
            .into_iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("no scenario {name}"))
    }

    /// The operator's handlers, each recording its successful runs in `runs`.
    fn handlers(self, operator: Operator, runs: &Path) -> Operator {
        let runs = runs.to_path_buf();
        let recorder = |handler: &'static str| {
            let runs = runs.clone();
            move |ctx: &Ctx, value: &serde_json::Value| record(&runs, ctx.name(), handler, value)
        };
        match self {
            Scenario::Changes => {
                let (a, b, size, cleanup) = (
                    recorder("a"),
                    recorder("b"),
                    recorder(SIZE),
                    recorder("cleanup"),
                );
                operator
                    .on_create(WIDGETS, "a", move |ctx: Ctx| {
                        let a = a.clone();
                        async move {
                            let result = json!({"size": ctx.spec()["size"]});
                            a(&ctx, &result);
                            Ok(result)
                        }
                    })
                    .on_create(WIDGETS, "b", move |ctx: Ctx| {
                        let b = b.clone();
                        async move {
                            let choice = hash(&format!("{}/{}", ctx.name(), ctx.retry()));
                            tokio::time::sleep(Duration::from_millis(choice % 300)).await;
                            if ctx.retry() == 0 && choice.is_multiple_of(4) {
                                return Err(HandlerError::temporary(
                                    "not yet",
                                    Duration::from_millis(200),
                                ));
                            }
                            let result = json!({"size": ctx.spec()["size"]});
                            b(&ctx, &result);
                            Ok(result)
                        }
                    })
                    .on_field(WIDGETS, "spec.size", "size", move |ctx: Ctx| {
                        let size = size.clone();
                        async move {
                            let result = json!({"size": ctx.new_value()});
                            size(&ctx, &result);
                            Ok(result)
                        }
                    })
                    .on_delete(WIDGETS, "cleanup", move |ctx: Ctx| {
                        let cleanup = cleanup.clone();
                        async move {
                            cleanup(&ctx, &json!(null));
                            Ok(())
                        }
                    })
            }
            Scenario::Spawning => {
                let started = recorder("daemon");
                operator
                    .timer(
                        WIDGETS,
                        "tick",
                        Timer::every(Duration::from_secs(1)),
                        |ctx: Ctx| async move {
                            let size = ctx.spec()["size"].clone();
                            ctx.patch().status("ticked", size.clone());
                            Ok(json!({"size": size}))
                        },
                    )
                    .daemon(WIDGETS, "daemon", Daemon::new(), move |ctx: Ctx| {
                        let started = started.clone();
                        async move {
                            started(&ctx, &json!(std::process::id()));
                            ctx.stopped().wait().await;
                            Ok(())
                        }
                    })
            }
            Scenario::Deletions => {
                let (a, cleanup) = (recorder("a"), recorder("cleanup"));
                operator
                    .on_create(WIDGETS, "a", move |ctx: Ctx| {
                        let a = a.clone();
                        async move {
                            a(&ctx, &json!(true));
                            Ok(json!(true))
                        }
                    })
                    .on_delete(WIDGETS, "cleanup", move |ctx: Ctx| {
                        let cleanup = cleanup.clone();
                        async move {
                            let pause = hash(ctx.name()) % 200;
                            tokio::time::sleep(Duration::from_millis(pause)).await;
                            // Which process ran it: a kill cuts off only what its own process did.
                            cleanup(&ctx, &json!(std::process::id()));
                            Ok(())
                        }
                    })
            }
        }
    }
}

/// The operator under test, in its own process (see the module's documentation).
#[test]
#[ignore = "the operator process of the chaos tests, which run it"]
fn chaos_operator_process() {
    let spec = std::env::var(OPERATOR_ENV).expect("run by a chaos test");
    let mut lines = spec.lines();
    let (Some(scenario), Some(kubeconfig), Some(runs)) = (lines.next(), lines.next(), lines.next())
    else {
        panic!("a scenario, a kubeconfig and a runs file: {spec:?}");
    };
    let scenario = Scenario::parse(scenario);
    let (kubeconfig, runs) = (PathBuf::from(kubeconfig), PathBuf::from(runs));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let operator = Operator::new().client(client).standalone().settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(100);
            s.networking.error_backoffs = vec![Duration::from_millis(100); 3];
            s.queueing.error_delays = vec![Duration::from_millis(500)];
        });
        scenario
            .handlers(operator, &runs)
            .run_until(std::future::pending())
            .await
            .unwrap();
    });
}

/// The operator's process, started and SIGKILLed by the test.
struct OperatorProcess {
    child: Child,
    pid: u32,
}

/// A chaos test's cluster, widgets, files and operator process.
struct Chaos {
    scenario: Scenario,
    cluster: TestCluster,
    widgets: Api<DynamicObject>,
    dir: PathBuf,
    kubeconfig: PathBuf,
    runs: PathBuf,
    log: PathBuf,
    operator: Option<OperatorProcess>,
    kills: u64,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Chaos {
    /// A cluster with widgets and the scenario's operator running.
    async fn start(scenario: Scenario) -> Chaos {
        let turn = TURNS.lock().await;
        let cluster = TestCluster::start().await.unwrap();
        let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
        let dir = std::env::temp_dir().join(format!(
            "kactor-chaos-{}-{}",
            scenario.name(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (kubeconfig, runs, log) = (dir.join("kubeconfig"), dir.join("runs"), dir.join("log"));
        cluster.write_kubeconfig(&kubeconfig).unwrap();
        let mut chaos = Chaos {
            scenario,
            cluster,
            widgets,
            dir,
            kubeconfig,
            runs,
            log,
            operator: None,
            kills: 0,
            _turn: turn,
        };
        chaos.start_operator();
        chaos
    }

    fn start_operator(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "chaos_operator_process",
                "--ignored",
                "--nocapture",
            ])
            .env(
                OPERATOR_ENV,
                format!(
                    "{}\n{}\n{}",
                    self.scenario.name(),
                    self.kubeconfig.display(),
                    self.runs.display()
                ),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("the operator process starts");
        let pid = child.id().expect("a running process has a pid");
        self.operator = Some(OperatorProcess { child, pid });
    }

    /// SIGKILL, and wait until it is gone.
    async fn kill(&mut self) {
        if let Some(mut operator) = self.operator.take() {
            operator.child.kill().await.unwrap();
            self.kills += 1;
        }
    }

    /// The running operator's pid.
    fn pid(&self) -> u32 {
        self.operator.as_ref().map_or(0, |o| o.pid)
    }

    /// Creates these widgets at once (size 1).
    async fn create(&self, names: &[String]) {
        let post = PostParams::default();
        futures::future::join_all(names.iter().map(|name| {
            let body = serde_json::from_value(samples::widget(name, 1)).unwrap();
            let (widgets, post) = (&self.widgets, &post);
            async move { widgets.create(post, &body).await.unwrap() }
        }))
        .await;
    }

    /// Deletes a widget; false if it was gone already.
    async fn delete(&self, name: &str) -> bool {
        match self.widgets.delete(name, &DeleteParams::default()).await {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if status.code == 404 => false,
            Err(e) => panic!("deleting {name}: {e}"),
        }
    }

    /// Sets a widget's `spec.size`; false if it was gone already.
    async fn resize(&self, name: &str, size: u64) -> bool {
        let patch = json!({"spec": {"size": size}});
        match self
            .widgets
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if status.code == 404 => false,
            Err(e) => panic!("patching {name}: {e}"),
        }
    }

    async fn objects(&self) -> Vec<DynamicObject> {
        self.widgets.list(&Default::default()).await.unwrap().items
    }

    /// Waits until `check` finds no problem or the quiet deadline passes; the last findings.
    async fn until_quiet<F>(&self, quiet: Duration, mut check: F) -> Findings
    where
        F: AsyncFnMut(&Chaos) -> Findings,
    {
        let deadline = tokio::time::Instant::now() + quiet;
        let mut last = check(self).await;
        while !last.quiet() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            last = check(self).await;
        }
        last
    }

    /// Kills the operator, prints the figures, and fails if the findings are not quiet.
    async fn finish(mut self, figures: String, last: Findings, quiet: Duration) {
        self.kill().await;
        // Straight to the process's stderr, past the test harness's capture: the figures are the
        // point.
        let _ = writeln!(
            std::io::stderr(),
            "chaos ({}) on the {}: {figures}; {}",
            self.scenario.name(),
            self.cluster.backend(),
            last.summary(),
        );
        assert!(
            last.quiet(),
            "not quiet after {} s: {last:#?}\nthe operator's log: {}",
            quiet.as_secs(),
            self.log.display()
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the cluster holds that it should not, by kind of problem (each: one line per object).
#[derive(Debug, Default)]
struct Findings(BTreeMap<&'static str, Vec<String>>);

impl Findings {
    /// A problem of this kind (the kind is shown at 0 even with none).
    fn kind(&mut self, kind: &'static str) -> &mut Vec<String> {
        self.0.entry(kind).or_default()
    }

    fn quiet(&self) -> bool {
        self.0.values().all(Vec::is_empty)
    }

    /// `kind N, kind N, ...`
    fn summary(&self) -> String {
        self.0
            .iter()
            .map(|(kind, problems)| format!("{kind} {}", problems.len()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Every deleted object must be gone: its name under "deleted but present".
fn deleted_but_present(
    findings: &mut Findings,
    object: &DynamicObject,
    deleted: &HashSet<String>,
) -> bool {
    let name = object.metadata.name.clone().unwrap_or_default();
    let present = deleted.contains(&name);
    findings.kind("deleted but present");
    if present {
        findings.kind("deleted but present").push(name);
    }
    present
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_at_random_loses_no_result_and_misses_no_change() {
    let objects = setting("KACTOR_CHAOS_OBJECTS", 200) as usize;
    let kills = setting("KACTOR_CHAOS_KILLS", 6);
    let seed = setting("KACTOR_CHAOS_SEED", 1);
    let quiet = Duration::from_secs(setting("KACTOR_CHAOS_QUIET", QUIET));
    let mut random = Random(seed);
    let mut chaos = Chaos::start(Scenario::Changes).await;
    let names: Vec<String> = (0..objects).map(|i| format!("w{i:05}")).collect();

    // Creations in bursts (a tenth of the objects at a time, so that many are in flight when a kill
    // lands), patches and deletions throughout, and kills at random steps, a random moment after
    // the step's writes.
    let mut deleted = HashSet::new();
    let (mut patches, mut deletions) = (0u64, 0u64);
    let burst = (objects / 10).max(10);
    let creation_steps = objects.div_ceil(burst) as u64;
    let steps = creation_steps + 2 * kills + 10;
    let mut created = 0;
    for step in 0..steps {
        if created < objects {
            let batch = &names[created..(created + burst).min(objects)];
            created += batch.len();
            chaos.create(batch).await;
        }
        for _ in 0..20 {
            let name = &names[random.below(created as u64) as usize];
            if deleted.contains(name) {
                continue;
            }
            if random.below(10) == 0 {
                if chaos.delete(name).await {
                    deleted.insert(name.clone());
                    deletions += 1;
                }
            } else if chaos.resize(name, 1 + random.below(9)).await {
                patches += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(random.below(400))).await;
        if chaos.kills < kills && random.below(steps - step) < kills - chaos.kills {
            chaos.kill().await;
            chaos.start_operator();
        }
    }

    // To quiet: every object handled as the test left it.
    let last = chaos
        .until_quiet(quiet, async |chaos: &Chaos| {
            let mut findings = Findings::default();
            findings.kind("results missing");
            findings.kind("changes unhandled");
            for object in chaos.objects().await {
                if deleted_but_present(&mut findings, &object, &deleted) {
                    continue;
                }
                let name = object.metadata.name.clone().unwrap_or_default();
                let status = &object.data["status"];
                for handler in ["a", "b"] {
                    if status.get(handler).is_none() {
                        findings
                            .kind("results missing")
                            .push(format!("{name}: status.{handler}"));
                    }
                }
                let size = &object.data["spec"]["size"];
                if status[SIZE]["size"] != *size {
                    findings.kind("changes unhandled").push(format!(
                        "{name}: spec.size {size}, the field handler last saw {}",
                        status[SIZE]["size"]
                    ));
                }
            }
            findings
        })
        .await;

    // Successful runs per object and handler.
    let counts = counts(&runs_of(&chaos.runs));
    let mut reruns: BTreeMap<&str, u64> = BTreeMap::new();
    for ((_, handler), count) in &counts {
        if handler == "a" || handler == "b" {
            *reruns.entry(handler.as_str()).or_default() += count - 1;
        }
    }
    let cleanups = counts.keys().filter(|(_, h)| h == "cleanup").count();
    let figures = format!(
        "seed {seed}, {objects} objects, {} kills, {patches} patches, {deletions} deletions; \
         create handlers' re-runs after kills {reruns:?}; delete handlers run for {cleanups} of \
         {deletions} deleted objects",
        chaos.kills
    );
    chaos.finish(figures, last, quiet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_and_timers_of_an_operator_killed_at_random_come_back_and_land_their_results() {
    let objects = setting("KACTOR_CHAOS_OBJECTS", 50) as usize;
    let kills = setting("KACTOR_CHAOS_KILLS", 4);
    let seed = setting("KACTOR_CHAOS_SEED", 1);
    let quiet = Duration::from_secs(setting("KACTOR_CHAOS_QUIET", QUIET));
    let mut random = Random(seed);
    let mut chaos = Chaos::start(Scenario::Spawning).await;
    let names: Vec<String> = (0..objects).map(|i| format!("s{i:05}")).collect();
    chaos.create(&names).await;

    // Patches and deletions while timers tick and daemons run, and kills among them.
    let mut deleted = HashSet::new();
    let (mut patches, mut deletions) = (0u64, 0u64);
    let steps = 2 * kills + 6;
    for step in 0..steps {
        for _ in 0..10 {
            let name = &names[random.below(objects as u64) as usize];
            if deleted.contains(name) {
                continue;
            }
            if random.below(15) == 0 {
                if chaos.delete(name).await {
                    deleted.insert(name.clone());
                    deletions += 1;
                }
            } else if chaos.resize(name, 1 + random.below(9)).await {
                patches += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(300 + random.below(1200))).await;
        if chaos.kills < kills && random.below(steps - step) < kills - chaos.kills {
            chaos.kill().await;
            chaos.start_operator();
        }
    }

    // To quiet: the timers' results and patches show every final size, every object has its
    // daemon in the last process.
    let last = chaos
        .until_quiet(quiet, async |chaos: &Chaos| {
            let pid = chaos.pid().to_string();
            let daemons: HashSet<String> = runs_of(&chaos.runs)
                .into_iter()
                .filter(|(_, handler, value)| handler == "daemon" && *value == pid)
                .map(|(object, _, _)| object)
                .collect();
            let mut findings = Findings::default();
            findings.kind("timer results stale");
            findings.kind("timer patches stale");
            findings.kind("daemons missing");
            for object in chaos.objects().await {
                if deleted_but_present(&mut findings, &object, &deleted) {
                    continue;
                }
                let name = object.metadata.name.clone().unwrap_or_default();
                let (size, status) = (&object.data["spec"]["size"], &object.data["status"]);
                if status["tick"]["size"] != *size {
                    findings.kind("timer results stale").push(format!(
                        "{name}: spec.size {size}, status.tick {}",
                        status["tick"]
                    ));
                }
                if status["ticked"] != *size {
                    findings.kind("timer patches stale").push(format!(
                        "{name}: spec.size {size}, status.ticked {}",
                        status["ticked"]
                    ));
                }
                if !daemons.contains(&name) {
                    findings.kind("daemons missing").push(name);
                }
            }
            findings
        })
        .await;

    // Never two daemons of one object in one process.
    let runs = runs_of(&chaos.runs);
    let mut starts: HashMap<(&str, &str), u64> = HashMap::new();
    for (object, handler, pid) in &runs {
        if handler == "daemon" {
            *starts.entry((object.as_str(), pid.as_str())).or_default() += 1;
        }
    }
    let doubles: Vec<_> = starts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubles.is_empty(),
        "two daemons of one object in one process: {doubles:?}"
    );
    let figures = format!(
        "seed {seed}, {objects} objects, {} kills, {patches} patches, {deletions} deletions; \
         daemons started {} (in {} processes)",
        chaos.kills,
        starts.len(),
        chaos.kills + 1,
    );
    chaos.finish(figures, last, quiet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_cut_off_by_a_kill_releases_its_finalizer_after_the_restart() {
    let objects = setting("KACTOR_CHAOS_OBJECTS", 100) as usize;
    let kills = setting("KACTOR_CHAOS_KILLS", 5);
    let seed = setting("KACTOR_CHAOS_SEED", 1);
    let quiet = Duration::from_secs(setting("KACTOR_CHAOS_QUIET", QUIET));
    let mut random = Random(seed);
    let mut chaos = Chaos::start(Scenario::Deletions).await;
    let names: Vec<String> = (0..objects).map(|i| format!("d{i:05}")).collect();

    // Every object handled first: each holds the finalizer when it is deleted.
    chaos.create(&names).await;
    let handled = chaos
        .until_quiet(quiet, async |chaos: &Chaos| {
            let mut findings = Findings::default();
            findings.kind("not handled yet");
            for object in chaos.objects().await {
                let held = object
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| f.iter().any(|f| f == support::FINALIZER));
                if !held || object.data["status"]["a"] != json!(true) {
                    let name = object.metadata.name.clone().unwrap_or_default();
                    findings.kind("not handled yet").push(name);
                }
            }
            findings
        })
        .await;
    assert!(handled.quiet(), "before the deletions: {handled:#?}");

    // Deletions in bursts; after some of them, a kill the moment one to three delete handlers of
    // the burst succeeded (the handlers sleep up to 200 ms, so others are still running). At each
    // kill, with the operator dead, the objects whose delete handler succeeded in the killed
    // process but which still hold the finalizer: the deletions cut between the handler and the
    // finalizer's release.
    let mut cut = 0u64;
    let burst = (objects / 10).max(5);
    let steps = objects.div_ceil(burst) as u64;
    for (step, batch) in names.chunks(burst).enumerate() {
        let pid = chaos.pid().to_string();
        let cleaned_here = |chaos: &Chaos| -> HashSet<String> {
            runs_of(&chaos.runs)
                .into_iter()
                .filter(|(_, handler, value)| handler == "cleanup" && *value == pid)
                .map(|(object, _, _)| object)
                .collect()
        };
        let before = cleaned_here(&chaos).len();
        futures::future::join_all(batch.iter().map(|name| chaos.delete(name))).await;
        if chaos.kills < kills && random.below(steps - step as u64) < kills - chaos.kills {
            let wanted = before + 1 + random.below(3) as usize;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while cleaned_here(&chaos).len() < wanted && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            chaos.kill().await;
            let cleaned = cleaned_here(&chaos);
            cut += chaos
                .objects()
                .await
                .iter()
                .filter(|o| o.metadata.deletion_timestamp.is_some())
                .filter(|o| cleaned.contains(o.metadata.name.as_deref().unwrap_or_default()))
                .count() as u64;
            chaos.start_operator();
        } else {
            tokio::time::sleep(Duration::from_millis(random.below(300))).await;
        }
    }

    // To quiet: every object gone.
    let deleted: HashSet<String> = names.iter().cloned().collect();
    let last = chaos
        .until_quiet(quiet, async |chaos: &Chaos| {
            let mut findings = Findings::default();
            for object in chaos.objects().await {
                deleted_but_present(&mut findings, &object, &deleted);
            }
            findings.kind("deleted but present");
            findings
        })
        .await;
    let counts = counts(&runs_of(&chaos.runs));
    let never: Vec<&String> = names
        .iter()
        .filter(|name| !counts.contains_key(&(name.to_string(), "cleanup".to_string())))
        .collect();
    let reruns: u64 = counts
        .iter()
        .filter(|((_, handler), _)| handler == "cleanup")
        .map(|(_, n)| n - 1)
        .sum();
    let figures = format!(
        "seed {seed}, {objects} objects, {} kills; deletions cut between the delete handler and \
         the finalizer's release {cut}; delete handlers re-run {reruns}; never run {}",
        chaos.kills,
        never.len()
    );
    assert!(never.is_empty(), "delete handlers never ran for {never:?}");
    assert!(
        reruns <= cut,
        "{reruns} re-runs of delete handlers, but only {cut} deletions were cut off by a kill"
    );
    chaos.finish(figures, last, quiet).await;
}
