//! kactor and Kopf on the same objects, one after the other: what one leaves half done, the other
//! finishes, in Kopf's own formats. Kopf is a real process (`tests/python/kopf_subhandlers.py`, from
//! the venv `scripts/test` makes, or `KACTOR_PYTHON`); without it the test is skipped, unless
//! `KACTOR_REQUIRE_THIRD_PARTY=1` (as `scripts/test` sets) makes that a failure.

#[allow(dead_code)]
#[path = "../crates/emulator/tests/common/mod.rs"]
mod common;
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Background, Workdir};
use kactor::emulator::samples;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};
use support::{diff_base, operator, spawn, status, PREFIX};

/// Kopf takes a few seconds to start; a real server's watch may lag.
const KOPF_WAIT: Duration = Duration::from_secs(90);

/// The progress records of `create_fn` and its sub-handlers on the object, by annotation key,
/// parsed.
fn records(object: &DynamicObject) -> BTreeMap<String, Value> {
    let annotations = object.metadata.annotations.clone().unwrap_or_default();
    annotations
        .into_iter()
        .filter(|(key, _)| key.starts_with(&format!("{PREFIX}/create_fn")))
        .map(|(key, text)| {
            let record = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{key} is not JSON ({e}): {text}"));
            (key, record)
        })
        .collect()
}

/// The records with their times replaced by a mark: what two operators must agree on.
fn shapes(records: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    records
        .iter()
        .map(|(key, record)| {
            let mut record = record.clone();
            for time in ["started", "stopped", "delayed"] {
                if let Some(value) = record.get_mut(time) {
                    assert!(
                        value.as_str().is_some_and(|t| t.ends_with("+00:00")),
                        "{key}.{time} is not Kopf's time: {value}"
                    );
                    *value = json!("<time>");
                }
            }
            (key.clone(), record)
        })
        .collect()
}

fn retries_of(object: Option<&DynamicObject>, id: &str) -> u64 {
    let key = format!("{PREFIX}/{}", id.replace('/', "."));
    object
        .map(records)
        .and_then(|r| r.get(&key).and_then(|r| r["retries"].as_u64()))
        .unwrap_or(0)
}

/// Handled for good: the diff-base is there and no record is left.
fn finished(object: Option<&DynamicObject>) -> bool {
    object.is_some_and(|o| diff_base(o).is_some() && records(o).is_empty())
}

async fn within(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    others: &[&Background],
    check: impl Fn(Option<&DynamicObject>) -> bool,
) -> DynamicObject {
    let deadline = tokio::time::Instant::now() + KOPF_WAIT;
    loop {
        for other in others {
            other.assert_running();
        }
        let object = api.get_opt(name).await.unwrap();
        if check(object.as_ref()) {
            return object.expect("the object exists");
        }
        if tokio::time::Instant::now() >= deadline {
            let logs: Vec<String> = others.iter().map(|o| o.report()).collect();
            panic!(
                "timed out waiting for {what}; the object: {}\n{}",
                serde_json::to_string_pretty(&object).unwrap(),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn kopf(python: &str, dir: &Workdir, role: &str) -> Background {
    let script = common::test_file("python/kopf_subhandlers.py");
    let mut command = dir.command(python);
    command
        .env("KOPF_ROLE", role)
        .args(["-m", "kopf", "run", "--standalone", "-A", "--verbose"])
        .arg(script);
    Background::spawn(&format!("kopf ({role})"), &mut command)
}

async fn create(api: &Api<DynamicObject>, name: &str) {
    let body = serde_json::from_value(samples::widget(name, 1)).unwrap();
    api.create(&PostParams::default(), &body).await.unwrap();
}

/// Who ran which of kactor's handlers on which object: `id name`.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<String>>>);

impl Runs {
    fn record(&self, ctx: &Ctx) {
        let line = format!("{} {}", ctx.id(), ctx.name());
        self.0.lock().unwrap().push(line);
    }

    fn count(&self, line: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|l| *l == line).count()
    }
}

/// kactor's twin of the Kopf operator: `create_fn` with the sub-handlers `a` and `b`; `b` fails
/// temporarily (3 s) on `from-kactor`, to leave that object half done for Kopf.
fn kactor(cluster: &TestCluster, runs: &Runs) -> Operator {
    let runs = runs.clone();
    operator(cluster).on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
        let runs = runs.clone();
        async move {
            runs.record(&ctx);
            for id in ["a", "b"] {
                let runs = runs.clone();
                ctx.subhandler(id, move |ctx: Ctx| {
                    runs.record(&ctx);
                    async move {
                        if ctx.id() == "create_fn/b" && ctx.name() == "from-kactor" {
                            let delay = Duration::from_secs(3);
                            return Err(HandlerError::temporary("left to kactor", delay));
                        }
                        Ok(json!({"by": "kactor"}))
                    }
                });
            }
            Ok(json!({"by": "kactor"}))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_done_sub_handlers_are_handed_over_between_kopf_and_kactor_in_kopfs_format() {
    const TEST: &str = "half_done_sub_handlers_are_handed_over_between_kopf_and_kactor";
    let Some(python) = common::python(TEST, &["kopf"]).await else {
        return;
    };
    let (cluster, widgets) = support::cluster_with_widgets().await;
    let dir = Workdir::new(TEST, &cluster);

    // Kopf runs `a`, then fails `b`: killed with its records on the object.
    let mut first = kopf(&python, &dir, "first");
    create(&widgets, "from-kopf").await;
    let left_by_kopf = within(&widgets, "from-kopf", "Kopf's b to fail", &[&first], |o| {
        retries_of(o, "create_fn/b") >= 1
    })
    .await;
    first.kill().await;
    let by_kopf = records(&left_by_kopf);
    let parent = &by_kopf[&format!("{PREFIX}/create_fn")];
    assert_eq!(parent["subrefs"], json!(["create_fn/a", "create_fn/b"]));
    assert_eq!(parent["message"], "None", "Kopf's HandlerChildrenRetry");

    // kactor finishes it without running `a` again, and leaves `from-kactor` half done.
    let runs = Runs::default();
    let running = spawn(kactor(&cluster, &runs));
    let done = within(&widgets, "from-kopf", "kactor to finish", &[], finished).await;
    // Created only now, to see its first failure of `b` before the second (3 s later).
    create(&widgets, "from-kactor").await;
    let left_by_kactor = within(&widgets, "from-kactor", "kactor's b to fail", &[], |o| {
        retries_of(o, "create_fn/b") >= 1
    })
    .await;
    running.stop().await;
    assert_eq!(
        runs.count("create_fn/a from-kopf"),
        0,
        "Kopf's success stands"
    );
    assert_eq!(runs.count("create_fn/b from-kopf"), 1);
    assert_eq!(
        (
            &status(&done)["create_fn/a"],
            &status(&done)["create_fn/b"],
            &status(&done)["create_fn"]
        ),
        (
            &json!({"by": "kopf"}),
            &json!({"by": "kactor"}),
            &json!({"by": "kactor"})
        )
    );

    // At the same point, kactor wrote what Kopf wrote: the same keys, the same records.
    assert_eq!(shapes(&records(&left_by_kactor)), shapes(&by_kopf));

    // Kopf finishes what kactor left, without running `a` again.
    let second = kopf(&python, &dir, "second");
    let done = within(
        &widgets,
        "from-kactor",
        "Kopf to finish",
        &[&second],
        // Kopf patches the body (diff-base, records purged), then the status (the results).
        |o| finished(o) && o.is_some_and(|o| !status(o)["create_fn/b"].is_null()),
    )
    .await;
    assert_eq!(
        (&status(&done)["create_fn/a"], &status(&done)["create_fn/b"]),
        (&json!({"by": "kactor"}), &json!({"by": "kopf"}))
    );
    let log = second.report();
    for problem in ["a ran again", "Traceback"] {
        assert!(!log.contains(problem), "Kopf logged {problem:?}:\n{log}");
    }
}
