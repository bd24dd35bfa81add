//! Changing handlers end to end: real operators against the emulator over real HTTP, checking what
//! lands on the objects in Kopf's formats.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor::emulator::{samples, Emulator};
use kactor::prelude::*;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::Value;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(20);
const PREFIX: &str = "kopf.zalando.org";
const FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";

/// Calls of handlers: (handler id, object name, retry).
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<(String, String, u32)>>>);

impl Calls {
    fn record(&self, ctx: &Ctx) {
        self.0
            .lock()
            .unwrap()
            .push((ctx.id().to_string(), ctx.name().to_string(), ctx.retry()));
    }

    fn count(&self, id: &str, name: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, n, _)| i == id && n == name)
            .count()
    }

    fn all(&self) -> Vec<(String, String, u32)> {
        self.0.lock().unwrap().clone()
    }
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<kactor::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("the operator stops in time")
            .expect("the operator task")
            .expect("the operator ends well");
    }
}

fn spawn(operator: Operator) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        task,
    }
}

async fn emulator_with_widgets() -> (Emulator, Api<DynamicObject>) {
    let emulator = Emulator::builder()
        .bookmark_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let widgets = samples::install_widgets(&emulator.client()).await.unwrap();
    (emulator, widgets)
}

async fn create(api: &Api<DynamicObject>, name: &str, size: i64) {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(samples::widget(name, size)).unwrap(),
    )
    .await
    .unwrap();
}

async fn set_size(api: &Api<DynamicObject>, name: &str, size: i64) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": size}})),
    )
    .await
    .unwrap();
}

/// A quiet operator for the emulator: short retries, no waiting at exit.
fn operator(emulator: &Emulator) -> Operator {
    Operator::new()
        .client(emulator.client())
        .standalone()
        .settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(10);
            s.networking.error_backoffs = vec![Duration::from_millis(20); 3];
            s.queueing.exit_timeout = Duration::from_millis(500);
        })
}

/// Waits until the object passes `check` (None: the object is gone), or fails showing it.
async fn until(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&DynamicObject>) -> bool,
) -> Option<DynamicObject> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let object = api.get_opt(name).await.unwrap();
        if check(object.as_ref()) {
            return object;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; the object: {}",
            serde_json::to_string_pretty(&object).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn annotation<'a>(object: &'a DynamicObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn status(object: &DynamicObject) -> &Value {
    object.data.get("status").unwrap_or(&Value::Null)
}

fn has_finalizer(object: &DynamicObject) -> bool {
    object
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_handler_stores_its_result_and_the_diff_base_and_purges_its_progress() {
    let (emulator, widgets) = emulator_with_widgets().await;
    let calls = Calls::default();
    let seen = calls.clone();
    let running = spawn(operator(&emulator).on_create(
        "widgets.example.com",
        "create_fn",
        move |ctx: Ctx| {
            let seen = seen.clone();
            async move {
                seen.record(&ctx);
                assert_eq!(ctx.reason(), Some(Reason::Create));
                Ok(json!({"message": format!("size {}", ctx.spec()["size"])}))
            }
        },
    ));
    create(&widgets, "w1", 3).await;
    let object = until(&widgets, "w1", "the diff-base", |o| {
        o.is_some_and(|o| annotation(o, &format!("{PREFIX}/last-handled-configuration")).is_some())
    })
    .await
    .unwrap();
    assert_eq!(status(&object)["create_fn"], json!({"message": "size 3"}));
    let base = annotation(&object, &format!("{PREFIX}/last-handled-configuration")).unwrap();
    // Kopf's format: compact JSON of the essence and a trailing newline.
    assert_eq!(
        base,
        "{\"spec\":{\"size\":3},\"metadata\":{\"labels\":{\"app\":\"demo\"}}}\n"
    );
    assert_eq!(annotation(&object, &format!("{PREFIX}/create_fn")), None);
    assert!(!has_finalizer(&object), "no delete handler, no finalizer");
    // Nothing runs twice, whatever events come after.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(calls.count("create_fn", "w1"), 1, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_field_and_delete_handlers_run_for_their_causes() {
    let (emulator, widgets) = emulator_with_widgets().await;
    let calls = Calls::default();
    let diffs = Arc::new(Mutex::new(Vec::new()));
    let (c1, c2, c3, c4) = (calls.clone(), calls.clone(), calls.clone(), calls.clone());
    let seen_diffs = diffs.clone();
    let running = spawn(
        operator(&emulator)
            .on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
                let calls = c1.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            })
            .on_update("widgets.example.com", "update_fn", move |ctx: Ctx| {
                let (calls, diffs) = (c2.clone(), seen_diffs.clone());
                async move {
                    calls.record(&ctx);
                    diffs
                        .lock()
                        .unwrap()
                        .push(serde_json::to_value(ctx.diff()).unwrap());
                    Ok(())
                }
            })
            .on_field(
                "widgets.example.com",
                "spec.size",
                "size_fn",
                move |ctx: Ctx| {
                    let calls = c3.clone();
                    async move {
                        calls.record(&ctx);
                        Ok(json!({"old": ctx.old(), "new": ctx.new_value()}))
                    }
                },
            )
            .on_delete("widgets.example.com", "delete_fn", move |ctx: Ctx| {
                let calls = c4.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            }),
    );
    create(&widgets, "w1", 1).await;
    until(&widgets, "w1", "the finalizer and the creation", |o| {
        o.is_some_and(|o| {
            has_finalizer(o)
                && annotation(o, &format!("{PREFIX}/last-handled-configuration")).is_some()
        })
    })
    .await;
    assert_eq!(calls.count("create_fn", "w1"), 1);
    // The field handler ran for the creation too: size appeared.
    assert_eq!(calls.count("size_fn/spec.size", "w1"), 1);

    set_size(&widgets, "w1", 5).await;
    let object = until(&widgets, "w1", "the update", |o| {
        o.is_some_and(|o| {
            annotation(o, &format!("{PREFIX}/last-handled-configuration"))
                .is_some_and(|base| base.starts_with("{\"spec\":{\"size\":5}"))
        })
    })
    .await
    .unwrap();
    assert_eq!(calls.count("update_fn", "w1"), 1);
    assert_eq!(calls.count("size_fn/spec.size", "w1"), 2);
    assert_eq!(
        status(&object)["size_fn/spec.size"],
        json!({"old": 1, "new": 5})
    );
    assert_eq!(
        diffs.lock().unwrap()[0],
        json!([["change", ["spec", "size"], 1, 5]])
    );

    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    until(&widgets, "w1", "the object to go", |o| o.is_none()).await;
    assert_eq!(calls.count("delete_fn", "w1"), 1);
    assert_eq!(calls.count("create_fn", "w1"), 1);
    running.stop().await;
}
