//! Crash consistency, tried as an operator's users would break it: an operator process with two
//! create handlers (`a`, and `b`, which sleeps up to 300 ms and fails temporarily now and then), a
//! field handler on `spec.size` and a delete handler, killed with SIGKILL at random moments while
//! objects are created, patched and deleted; then run to quiet and checked:
//!
//! * every object has every result (`status.a`, `status.b`);
//! * every object's field handler last saw its final `spec.size`;
//! * every deleted object is gone (no finalizer left);
//! * each handler's successful runs per object: more than one only where a kill cut off the first
//!   success before its record was stored (counted and printed, never failing the test).
//!
//! The operator is this test binary itself, run again as the ignored test `chaos_operator_process`.
//! Seeded (`KACTOR_CHAOS_SEED`), sized by `KACTOR_CHAOS_OBJECTS` (default 200) and
//! `KACTOR_CHAOS_KILLS` (default 6), bounded in time (`KACTOR_CHAOS_QUIET`, default 240 s to
//! quiet). Runs on either test cluster; its figures go to stderr, past the harness's capture.

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

/// Appends a successful run to the runs file: one short line with O_APPEND, so lines from the
/// processes that follow one another never mix.
fn record(runs: &Path, object: &str, handler: &str, value: &serde_json::Value) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(runs)
        .expect("the runs file opens");
    file.write_all(format!("{object} {handler} {value}\n").as_bytes())
        .expect("the run is recorded");
}

/// The operator under test, in its own process (see the module's documentation).
#[test]
#[ignore = "the operator process of the chaos test, which runs it"]
fn chaos_operator_process() {
    let spec = std::env::var(OPERATOR_ENV)
        .expect("run by an_operator_killed_at_random_loses_no_result_and_misses_no_change");
    let (kubeconfig, runs) = spec.split_once('\n').expect("kubeconfig and runs paths");
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
        let (a, b, size, cleanup) = (runs.clone(), runs.clone(), runs.clone(), runs);
        Operator::new()
            .client(client)
            .standalone()
            .settings(|s| {
                s.watching.reconnect_backoff = Duration::from_millis(100);
                s.networking.error_backoffs = vec![Duration::from_millis(100); 3];
                s.queueing.error_delays = vec![Duration::from_millis(500)];
            })
            .on_create(WIDGETS, "a", move |ctx: Ctx| {
                let runs = a.clone();
                async move {
                    let result = json!({"size": ctx.spec()["size"]});
                    record(&runs, ctx.name(), "a", &result);
                    Ok(result)
                }
            })
            .on_create(WIDGETS, "b", move |ctx: Ctx| {
                let runs = b.clone();
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
                    record(&runs, ctx.name(), "b", &result);
                    Ok(result)
                }
            })
            .on_field(WIDGETS, "spec.size", "size", move |ctx: Ctx| {
                let runs = size.clone();
                async move {
                    let result = json!({"size": ctx.new_value()});
                    record(&runs, ctx.name(), SIZE, &result);
                    Ok(result)
                }
            })
            .on_delete(WIDGETS, "cleanup", move |ctx: Ctx| {
                let runs = cleanup.clone();
                async move {
                    record(&runs, ctx.name(), "cleanup", &json!(null));
                    Ok(())
                }
            })
            .run_until(std::future::pending())
            .await
            .unwrap();
    });
}

/// The operator's process, started and SIGKILLed by the test.
struct OperatorProcess {
    child: Child,
}

impl OperatorProcess {
    fn start(kubeconfig: &Path, runs: &Path, log: &Path) -> OperatorProcess {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
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
                format!("{}\n{}", kubeconfig.display(), runs.display()),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("the operator process starts");
        OperatorProcess { child }
    }

    /// SIGKILL, and wait until it is gone.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// What the cluster holds of one object, checked against what the test did to it.
#[derive(Debug, Default)]
struct Verdict {
    results_missing: Vec<String>,
    changes_unhandled: Vec<String>,
    deleted_but_present: Vec<String>,
}

impl Verdict {
    fn quiet(&self) -> bool {
        self.results_missing.is_empty()
            && self.changes_unhandled.is_empty()
            && self.deleted_but_present.is_empty()
    }
}

async fn verdict(widgets: &Api<DynamicObject>, deleted: &HashSet<String>) -> Verdict {
    let mut verdict = Verdict::default();
    for object in widgets.list(&Default::default()).await.unwrap().items {
        let name = object.metadata.name.clone().unwrap_or_default();
        if deleted.contains(&name) {
            verdict.deleted_but_present.push(name);
            continue;
        }
        let status = &object.data["status"];
        for handler in ["a", "b"] {
            if status.get(handler).is_none() {
                verdict
                    .results_missing
                    .push(format!("{name}: status.{handler}"));
            }
        }
        let size = &object.data["spec"]["size"];
        if status[SIZE]["size"] != *size {
            verdict.changes_unhandled.push(format!(
                "{name}: spec.size {size}, the field handler last saw {}",
                status[SIZE]["size"]
            ));
        }
    }
    verdict
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_at_random_loses_no_result_and_misses_no_change() {
    let objects = setting("KACTOR_CHAOS_OBJECTS", 200) as usize;
    let kills = setting("KACTOR_CHAOS_KILLS", 6);
    let seed = setting("KACTOR_CHAOS_SEED", 1);
    let quiet = Duration::from_secs(setting("KACTOR_CHAOS_QUIET", QUIET));
    let mut random = Random(seed);

    let cluster = TestCluster::start().await.unwrap();
    let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("kactor-chaos-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (kubeconfig, runs, log) = (dir.join("kubeconfig"), dir.join("runs"), dir.join("log"));
    cluster.write_kubeconfig(&kubeconfig).unwrap();

    let names: Vec<String> = (0..objects).map(|i| format!("w{i:05}")).collect();
    let mut operator = OperatorProcess::start(&kubeconfig, &runs, &log);

    // Creations in bursts (a tenth of the objects at a time, so that many are in flight when a kill
    // lands), patches and deletions throughout, and kills at random steps, a random moment after
    // the step's writes.
    let mut deleted = HashSet::new();
    let (mut patches, mut deletions, mut killed) = (0u64, 0u64, 0u64);
    let post = PostParams::default();
    let burst = (objects / 10).max(10);
    let creation_steps = objects.div_ceil(burst) as u64;
    let steps = creation_steps + 2 * kills + 10;
    let mut created = 0;
    for step in 0..steps {
        if created < objects {
            let batch = &names[created..(created + burst).min(objects)];
            created += batch.len();
            futures::future::join_all(batch.iter().map(|name| {
                let body = serde_json::from_value(samples::widget(name, 1)).unwrap();
                let (widgets, post) = (&widgets, &post);
                async move { widgets.create(post, &body).await.unwrap() }
            }))
            .await;
        }
        for _ in 0..20 {
            let name = &names[random.below(created as u64) as usize];
            if deleted.contains(name) {
                continue;
            }
            if random.below(10) == 0 {
                match widgets.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {
                        deleted.insert(name.clone());
                        deletions += 1;
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(e) => panic!("deleting {name}: {e}"),
                }
            } else {
                let size = 1 + random.below(9);
                let patch = json!({"spec": {"size": size}});
                match widgets
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => patches += 1,
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(e) => panic!("patching {name}: {e}"),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(random.below(400))).await;
        if killed < kills && random.below(steps - step) < kills - killed {
            operator.kill().await;
            killed += 1;
            operator = OperatorProcess::start(&kubeconfig, &runs, &log);
        }
    }

    // To quiet: every object handled as the test left it.
    let deadline = tokio::time::Instant::now() + quiet;
    let mut last = verdict(&widgets, &deleted).await;
    while !last.quiet() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        last = verdict(&widgets, &deleted).await;
    }
    operator.kill().await;

    // Successful runs per object and handler.
    let text = std::fs::read_to_string(&runs).unwrap_or_default();
    let mut counts: HashMap<(String, String), u64> = HashMap::new();
    for line in text.lines() {
        let mut words = line.splitn(3, ' ');
        if let (Some(object), Some(handler)) = (words.next(), words.next()) {
            *counts
                .entry((object.to_string(), handler.to_string()))
                .or_default() += 1;
        }
    }
    let mut reruns: BTreeMap<&str, u64> = BTreeMap::new();
    for ((_, handler), count) in &counts {
        if handler == "a" || handler == "b" {
            *reruns.entry(handler.as_str()).or_default() += count - 1;
        }
    }
    let cleanups = counts.keys().filter(|(_, h)| h == "cleanup").count();
    // Straight to the process's stderr, past the test harness's capture: the figures are the point.
    let _ = writeln!(
        std::io::stderr(),
        "chaos on the {}: seed {seed}, {objects} objects, {killed} kills, {patches} patches, \
         {deletions} deletions; results missing {}, changes unhandled {}, deleted but present {}; \
         create handlers' re-runs after kills {reruns:?}; delete handlers run for {cleanups} of \
         {deletions} deleted objects",
        cluster.backend(),
        last.results_missing.len(),
        last.changes_unhandled.len(),
        last.deleted_but_present.len(),
    );
    assert!(
        last.quiet(),
        "not quiet after {} s: {last:#?}\nthe operator's log: {}",
        quiet.as_secs(),
        log.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
