//! Real operators against the cluster over real HTTP: the reactor end to end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor::emulator::{samples, Matcher};
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(15);

/// What the handlers saw: (event type, name), in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, String)>>>);

impl Seen {
    fn record(&self, ctx: &Ctx) {
        let kind = ctx.kopf_type().unwrap_or("None").to_string();
        self.0.lock().unwrap().push((kind, ctx.name().to_string()));
    }

    fn all(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, kind: &str, name: &str) -> usize {
        self.all()
            .iter()
            .filter(|(k, n)| k == kind && n == name)
            .count()
    }

    /// Waits until `check` holds, or fails with what was seen.
    async fn until(&self, what: &str, check: impl Fn(&[(String, String)]) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if check(&self.all()) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; seen: {:?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<kactor::Result<()>>,
}

impl Running {
    async fn stop(mut self) -> kactor::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("the operator stops in time")
            .expect("the operator task")
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

async fn cluster_with_widgets() -> (TestCluster, Api<DynamicObject>) {
    let cluster = TestCluster::builder()
        .emulator(|e| e.bookmark_interval(Duration::from_millis(200)))
        .start()
        .await
        .unwrap();
    let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
    (cluster, widgets)
}

async fn create(api: &Api<DynamicObject>, name: &str) {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(samples::widget(name, 1)).unwrap(),
    )
    .await
    .unwrap();
}

fn recording(cluster: &TestCluster, seen: &Seen) -> Operator {
    let seen = seen.clone();
    Operator::new()
        .client(cluster.client())
        .settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(10);
            s.networking.error_backoffs = vec![Duration::from_millis(20); 3];
            s.queueing.exit_timeout = Duration::from_millis(500);
        })
        .on_event("widgets.example.com", "record", move |ctx: Ctx| {
            let seen = seen.clone();
            async move {
                seen.record(&ctx);
                Ok(())
            }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_that_exist_before_start_and_objects_created_after_are_all_seen() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create(&widgets, "before").await;
    let seen = Seen::default();
    let running = spawn(recording(&cluster, &seen));
    seen.until("the listed object", |s| {
        s.contains(&("None".into(), "before".into()))
    })
    .await;
    create(&widgets, "after").await;
    widgets
        .patch(
            "after",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    widgets
        .delete("after", &DeleteParams::default())
        .await
        .unwrap();
    seen.until("the new object's whole life", |s| {
        s.iter().any(|(k, n)| k == "DELETED" && n == "after")
    })
    .await;
    let after: Vec<_> = seen
        .all()
        .into_iter()
        .filter(|(_, n)| n == "after")
        .map(|(k, _)| k)
        .collect();
    assert_eq!(after.first().map(String::as_str), Some("ADDED"));
    assert_eq!(after.last().map(String::as_str), Some("DELETED"));
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_and_a_crd_that_appear_later_are_served() {
    let cluster = TestCluster::start().await.unwrap();
    let seen = Seen::default();
    let operator = recording(&cluster, &seen).namespaces(["team-*"]).on_event(
        ("example.com", "v1", "widgets"),
        "record-exact",
        {
            let seen = seen.clone();
            move |ctx: Ctx| {
                let seen = seen.clone();
                async move {
                    seen.record(&ctx);
                    Ok(())
                }
            }
        },
    );
    // "widgets.example.com" is not an exact selector and the CRD does not exist yet: an error.
    let error = operator.run_until(async {}).await.unwrap_err();
    assert!(error.to_string().contains("widgets"), "{error}");

    let exact_only = Operator::new()
        .client(cluster.client())
        .namespaces(["team-*"])
        .on_event(("example.com", "v1", "widgets"), "record", {
            let seen = seen.clone();
            move |ctx: Ctx| {
                let seen = seen.clone();
                async move {
                    seen.record(&ctx);
                    Ok(())
                }
            }
        });
    let running = spawn(exact_only);
    tokio::time::sleep(Duration::from_millis(300)).await;
    samples::install_widgets(&cluster.client()).await.unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(cluster.client());
    for name in ["team-a", "other"] {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
        let api: Api<DynamicObject> =
            Api::namespaced_with(cluster.client(), name, &samples::widget_api_resource());
        let mut body = samples::widget(&format!("in-{name}"), 1);
        body["metadata"]["namespace"] = serde_json::json!(name);
        // The operator may not have started the namespace's supervisor yet; the object is listed then.
        api.create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    }
    seen.until("the object in the new matching namespace", |s| {
        s.iter().any(|(_, n)| n == "in-team-a")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !seen.all().iter().any(|(_, n)| n == "in-other"),
        "a namespace not matching the patterns is not served"
    );
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_and_a_slow_handler_hurt_nobody_else() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let seen = Seen::default();
    let operator = recording(&cluster, &seen).on_event(
        "widgets.example.com",
        "troublemaker",
        |ctx: Ctx| async move {
            match ctx.name() {
                "panicky" => panic!("this handler panics"),
                "slow" => tokio::time::sleep(Duration::from_secs(30)).await,
                _ => {}
            }
            Ok(())
        },
    );
    let running = spawn(operator);
    seen.until("the listing", |_| true).await;
    create(&widgets, "slow").await;
    create(&widgets, "panicky").await;
    create(&widgets, "fine").await;
    seen.until("the other objects' events", |s| {
        s.iter().any(|(_, n)| n == "fine") && s.iter().any(|(_, n)| n == "panicky")
    })
    .await;
    widgets
        .patch(
            "panicky",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    seen.until("the panicky object's next event", |s| {
        s.iter().filter(|(_, n)| n == "panicky").count() == 2
    })
    .await;
    // The slow handler is still running; shutdown cancels it after exit_timeout instead of hanging.
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arriving_during_a_cycle_are_coalesced_to_the_newest_body() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create(&widgets, "busy").await;
    let sizes: Arc<Mutex<Vec<i64>>> = Arc::default();
    let operator =
        Operator::new()
            .client(cluster.client())
            .on_event("widgets.example.com", "slow", {
                let sizes = sizes.clone();
                move |ctx: Ctx| {
                    let sizes = sizes.clone();
                    async move {
                        sizes
                            .lock()
                            .unwrap()
                            .push(ctx.spec()["size"].as_i64().unwrap_or_default());
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Ok(())
                    }
                }
            });
    let running = spawn(operator);
    let deadline = tokio::time::Instant::now() + WAIT;
    while sizes.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for size in 2..=6 {
        widgets
            .patch(
                "busy",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"size": size}})),
            )
            .await
            .unwrap();
    }
    while sizes.lock().unwrap().last() != Some(&6) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the newest body is handled: {:?}",
            sizes.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handled = sizes.lock().unwrap().clone();
    assert!(
        handled.len() < 6,
        "intermediate states were coalesced: {handled:?}"
    );
    assert!(
        handled.windows(2).all(|w| w[0] < w[1]),
        "in order: {handled:?}"
    );
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_and_cleanup_activities_run_around_the_watching() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create(&widgets, "w").await;
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let note = |log: &Arc<Mutex<Vec<String>>>, what: &'static str| {
        let log = log.clone();
        move |_: ActivityCtx| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(what.to_string());
                Ok(())
            }
        }
    };
    let operator = Operator::new()
        .client(cluster.client())
        .on_startup("first", note(&log, "startup"))
        .on_cleanup("last", note(&log, "cleanup"))
        .on_event("widgets.example.com", "event", {
            let log = log.clone();
            move |_: Ctx| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push("event".into());
                    Ok(())
                }
            }
        });
    let running = spawn(operator);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !log.lock().unwrap().contains(&"event".to_string()) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await.unwrap();
    assert_eq!(*log.lock().unwrap(), ["startup", "event", "cleanup"]);

    let failing = Operator::new()
        .client(cluster.client())
        .on_startup("broken", |_: ActivityCtx| async {
            Err(HandlerError::msg("no database"))
        });
    let error = failing.run_until(async {}).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "startup handler 'broken' failed: no database; the operator does not start"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_is_a_clear_one_line_error() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
    let operator = Operator::new()
        .client(client)
        .on_event("widgets", "x", |_: Ctx| async { Ok(()) });
    let error = tokio::time::timeout(WAIT, operator.run_until(async {}))
        .await
        .expect("no hang")
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("cannot reach the Kubernetes API"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_object_keeps_its_memo_across_events() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let counts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    #[derive(Default)]
    struct Events(u32);
    let operator = Operator::new()
        .client(cluster.client())
        .settings(|s| s.queueing.idle_timeout = Duration::from_millis(50))
        .on_event("widgets.example.com", "count", {
            let counts = counts.clone();
            move |ctx: Ctx| {
                let counts = counts.clone();
                async move {
                    let n = ctx.memo.with(|events: &mut Events| {
                        events.0 += 1;
                        events.0
                    });
                    counts.lock().unwrap().insert(ctx.name().to_string(), n);
                    Ok(())
                }
            }
        });
    let running = spawn(operator);
    // Each change waits until the handler has seen the one before: an operator slow to start
    // (a loaded machine) would otherwise list the object only after the first change, one event
    // for two, which the memo would count rightly as one.
    let seen = |n: u32| {
        let counts = counts.clone();
        async move {
            let deadline = tokio::time::Instant::now() + WAIT;
            while counts.lock().unwrap().get("m") != Some(&n) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "expected {n}: {:?}",
                    counts.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    create(&widgets, "m").await;
    seen(1).await;
    for size in 2..=3 {
        // Longer than the idle timeout: the worker stops in between, the memo stays.
        tokio::time::sleep(Duration::from_millis(200)).await;
        widgets
            .patch(
                "m",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"size": size}})),
            )
            .await
            .unwrap();
        seen(size).await;
    }
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_longer_than_the_ultimate_exiting_timeout_gives_up() {
    let cluster = TestCluster::start().await.unwrap();
    let operator = Operator::new()
        .client(cluster.client())
        .settings(|s| s.process.ultimate_exiting_timeout = Duration::from_millis(200))
        .on_cleanup("stuck", |_: ActivityCtx| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        });
    let error = tokio::time::timeout(WAIT, operator.run_until(async {}))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(matches!(error, kactor::Error::ExitTimeout(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_stops_handling_keeps_memory_and_resuming_catches_up() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create(&widgets, "steady").await;
    create(&widgets, "changing").await;
    let seen = Seen::default();
    #[derive(Default)]
    struct Events(u32);
    let counts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let operator = recording(&cluster, &seen).on_event("widgets.example.com", "count", {
        let counts = counts.clone();
        move |ctx: Ctx| {
            let counts = counts.clone();
            async move {
                let n = ctx.memo.with(|events: &mut Events| {
                    events.0 += 1;
                    events.0
                });
                counts.lock().unwrap().insert(ctx.name().to_string(), n);
                Ok(())
            }
        }
    });
    let switch = operator.pause_switch();
    let running = spawn(operator);
    seen.until("the listing", |s| s.len() == 2).await;

    switch.set("test", Some("paused by the test".into()));
    // The pause reaches the supervisors in well under a millisecond; this is a generous margin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    create(&widgets, "while-paused").await;
    widgets
        .patch(
            "changing",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"size": 9}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        seen.all().len(),
        2,
        "nothing is handled while paused: {:?}",
        seen.all()
    );

    switch.set("test", None);
    seen.until("the changes made while paused", |s| {
        s.iter().any(|(_, n)| n == "while-paused")
            && s.iter().filter(|(_, n)| n == "changing").count() == 2
    })
    .await;
    assert_eq!(
        seen.count("None", "steady"),
        1,
        "an unchanged object is not handled again after a resume"
    );
    assert_eq!(
        counts.lock().unwrap().get("changing"),
        Some(&2),
        "the memo survived the pause"
    );
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_that_starts_paused_waits_for_the_resume() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create(&widgets, "waiting").await;
    let seen = Seen::default();
    let operator = recording(&cluster, &seen);
    let switch = operator.pause_switch();
    switch.set("test", Some("paused before the start".into()));
    let running = spawn(operator);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(seen.all().is_empty(), "{:?}", seen.all());
    switch.set("test", None);
    seen.until("the object after the resume", |s| {
        s.iter().any(|(_, n)| n == "waiting")
    })
    .await;
    running.stop().await.unwrap();
}

/// Tests that inject faults, which only the emulator can: `scripts/test` skips them on the real
/// API server (`--skip emulator_only`).
mod emulator_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_stream_a_410_and_a_silent_stream_lose_nothing_and_replay_nothing() {
        let (cluster, widgets) = cluster_with_widgets().await;
        create(&widgets, "steady").await;
        let seen = Seen::default();
        let operator = recording(&cluster, &seen)
            .settings(|s| s.watching.inactivity_timeout = Duration::from_millis(800));
        let running = spawn(operator);
        seen.until("the listing", |s| s.len() == 1).await;

        cluster.faults().end_watches();
        create(&widgets, "after-drop").await;
        seen.until("the event after the drop", |s| {
            s.iter().any(|(_, n)| n == "after-drop")
        })
        .await;

        // While the stream is silent, one object changes and one goes; then the history is compacted, so
        // the resumed watch gets 410 and the operator relists.
        cluster
            .faults()
            .silence_watches(Matcher::any().resource("widgets"));
        create(&widgets, "during-410").await;
        widgets
            .delete("after-drop", &DeleteParams::default())
            .await
            .unwrap();
        cluster.faults().compact();
        cluster.faults().end_watches();
        cluster.faults().reset();
        seen.until("the relisted changes", |s| {
            s.iter().any(|(_, n)| n == "during-410")
                && s.iter().any(|(k, n)| k == "DELETED" && n == "after-drop")
        })
        .await;

        // A stream that stays open but silent is given up after the inactivity timeout.
        cluster
            .faults()
            .silence_watches(Matcher::any().resource("widgets"));
        let faults = cluster.faults().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            faults.reset();
        });
        create(&widgets, "after-silence").await;
        seen.until("the event after the silence", |s| {
            s.iter().any(|(_, n)| n == "after-silence")
        })
        .await;

        assert_eq!(
            seen.count("None", "steady"),
            1,
            "an unchanged object is not dispatched again after a relist: {:?}",
            seen.all()
        );
        assert_eq!(
            seen.all().iter().filter(|(_, n)| n == "during-410").count(),
            1,
            "{:?}",
            seen.all()
        );
        running.stop().await.unwrap();
    }
}
