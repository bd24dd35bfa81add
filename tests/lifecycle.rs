//! Changing handlers end to end: real operators against the cluster over real HTTP, checking what
//! lands on the objects in Kopf's formats.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor::emulator::samples;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::Value;
use support::*;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_handler_stores_its_result_and_the_diff_base_and_purges_its_progress() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let seen = calls.clone();
    let running =
        spawn(
            operator(&cluster).on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
                let seen = seen.clone();
                async move {
                    seen.record(&ctx);
                    assert_eq!(ctx.reason(), Some(Reason::Create));
                    Ok(json!({"message": format!("size {}", ctx.spec()["size"])}))
                }
            }),
        );
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
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let diffs = Arc::new(Mutex::new(Vec::new()));
    let (c1, c2, c3, c4) = (calls.clone(), calls.clone(), calls.clone(), calls.clone());
    let seen_diffs = diffs.clone();
    let running = spawn(
        operator(&cluster)
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

fn progress(object: &DynamicObject, id: &str) -> Option<Value> {
    annotation(object, &format!("{PREFIX}/{id}")).map(|text| serde_json::from_str(text).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_error_is_retried_after_its_delay_with_progress_on_the_object() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let seen = calls.clone();
    let running =
        spawn(
            operator(&cluster).on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
                let seen = seen.clone();
                async move {
                    seen.record(&ctx);
                    if ctx.retry() < 2 {
                        return Err(HandlerError::temporary(
                            "not ready yet",
                            Duration::from_millis(300),
                        ));
                    }
                    Ok(json!(ctx.retry()))
                }
            }),
        );
    create(&widgets, "w1", 1).await;
    let object = until(&widgets, "w1", "the first failure recorded", |o| {
        o.and_then(|o| progress(o, "create_fn"))
            .is_some_and(|p| p["retries"] == json!(1))
    })
    .await
    .unwrap();
    let record = progress(&object, "create_fn").unwrap();
    assert_eq!(record["purpose"], json!("create"));
    assert_eq!(record["success"], json!(false));
    assert_eq!(record["failure"], json!(false));
    assert_eq!(record["message"], json!("not ready yet"));
    assert!(record["delayed"].as_str().unwrap().ends_with("+00:00"));
    assert!(diff_base(&object).is_none(), "not done yet");

    let object = until(&widgets, "w1", "the success", |o| {
        o.is_some_and(|o| diff_base(o).is_some())
    })
    .await
    .unwrap();
    assert_eq!(status(&object)["create_fn"], json!(2));
    assert_eq!(progress(&object, "create_fn"), None, "purged when done");
    let retries: Vec<u32> = calls.all().iter().map(|(_, _, r)| *r).collect();
    assert_eq!(retries, vec![0, 1, 2]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_and_panics_fail_for_good_and_other_objects_go_on() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let seen = calls.clone();
    let running = spawn(
        operator(&cluster)
            .settings(|s| s.posting.loggers = true)
            .on_create(
                "widgets.example.com",
                On::id("create_fn").errors(ErrorsMode::Permanent),
                move |ctx: Ctx| {
                    let seen = seen.clone();
                    async move {
                        seen.record(&ctx);
                        match ctx.name() {
                            "refused" => Err(HandlerError::permanent("size is not allowed")),
                            "panics" => panic!("a bug in the handler"),
                            _ => {
                                ctx.logger().warn("a line through the object's logger");
                                Ok(json!("fine"))
                            }
                        }
                    }
                },
            ),
    );
    for name in ["refused", "panics", "fine"] {
        create(&widgets, name, 1).await;
    }
    for name in ["refused", "panics", "fine"] {
        // A failed cause is finished: the diff-base is stored, so nothing runs again until a change.
        until(&widgets, name, "the cause to finish", |o| {
            o.is_some_and(|o| diff_base(o).is_some())
        })
        .await;
    }
    let fine = widgets.get("fine").await.unwrap();
    assert_eq!(status(&fine)["create_fn"], json!("fine"));
    let refused = widgets.get("refused").await.unwrap();
    assert!(
        status(&refused).get("create_fn").is_none(),
        "no result for a failure"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in ["refused", "panics", "fine"] {
        assert_eq!(
            calls.count("create_fn", name),
            1,
            "{name}: {:?}",
            calls.all()
        );
    }
    // The outcomes are posted as Kubernetes Events about the objects (`posting.loggers` is on).
    let events: Api<DynamicObject> = Api::namespaced_with(
        cluster.client(),
        "default",
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Event>(&()),
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let messages: Vec<(String, String)> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|e| {
                (
                    e.data["involvedObject"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    e.data["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        let has =
            |name: &str, text: &str| messages.iter().any(|(n, m)| n == name && m.contains(text));
        if has("fine", "Handler 'create_fn' succeeded.")
            && has("fine", "a line through the object's logger")
            && has("refused", "failed permanently: size is not allowed")
            && has("panics", "a bug in the handler")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "events: {messages:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
}

/// By default (Kopf 1.44's `posting.loggers = false`) the outcomes are logged but not posted as
/// Events; what a handler posts itself is. Each object's events are posted in order, so once the
/// second handler's own event is there, the first handler's outcome would have been too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_outcomes_are_not_posted_and_a_handlers_own_events_are() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let running = spawn(
        operator(&cluster)
            .on_create("widgets.example.com", "first", |ctx: Ctx| async move {
                ctx.info("Creating", "first");
                ctx.logger().info("a log line, not posted");
                Ok(json!(1))
            })
            .on_create("widgets.example.com", "second", |ctx: Ctx| async move {
                ctx.info("Creating", "second");
                Ok(json!(2))
            }),
    );
    create(&widgets, "w1", 1).await;
    let uid = widgets.get("w1").await.unwrap().metadata.uid;
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cluster.client(), "default");
    let deadline = tokio::time::Instant::now() + WAIT;
    let posted = loop {
        let mut posted: Vec<(String, String)> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.uid == uid)
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect();
        posted.sort();
        if posted.iter().any(|(_, m)| m == "second") {
            break posted;
        }
        assert!(tokio::time::Instant::now() < deadline, "events: {posted:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        posted,
        [
            ("Creating".to_string(), "first".to_string()),
            ("Creating".to_string(), "second".to_string())
        ]
    );
    running.stop().await;
}

/// Two create handlers, the second failing once; an operator stopped in between and started again
/// runs each succeeded handler exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_finishes_the_job_without_rerunning_succeeded_handlers() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let build = |calls: &Calls, fail_second: bool| {
        let (first, second) = (calls.clone(), calls.clone());
        operator(&cluster)
            .on_create("widgets.example.com", "first", move |ctx: Ctx| {
                let calls = first.clone();
                async move {
                    calls.record(&ctx);
                    Ok(json!("one"))
                }
            })
            .on_create("widgets.example.com", "second", move |ctx: Ctx| {
                let calls = second.clone();
                async move {
                    calls.record(&ctx);
                    if fail_second {
                        return Err(HandlerError::temporary("later", Duration::from_secs(1)));
                    }
                    Ok(json!("two"))
                }
            })
    };
    create(&widgets, "w1", 1).await;
    let running = spawn(build(&calls, true));
    until(
        &widgets,
        "w1",
        "the first handler done and the second delayed",
        |o| {
            o.is_some_and(|o| {
                progress(o, "first").is_some_and(|p| p["success"] == json!(true))
                    && progress(o, "second").is_some_and(|p| p["retries"] == json!(1))
            })
        },
    )
    .await;
    running.stop().await;
    // On a busy machine the stop may come after one more (failed) retry: count what was stored.
    let stored = widgets.get("w1").await.unwrap();
    let failures = progress(&stored, "second").unwrap()["retries"]
        .as_u64()
        .unwrap() as usize;

    let running = spawn(build(&calls, false));
    let object = until(&widgets, "w1", "both done", |o| {
        o.is_some_and(|o| diff_base(o).is_some())
    })
    .await
    .unwrap();
    assert_eq!(calls.count("first", "w1"), 1, "{:?}", calls.all());
    assert_eq!(
        calls.count("second", "w1"),
        failures + 1,
        "{:?}",
        calls.all()
    );
    assert_eq!(status(&object)["first"], json!("one"));
    assert_eq!(status(&object)["second"], json!("two"));
    assert_eq!(progress(&object, "first"), None);
    assert_eq!(progress(&object, "second"), None);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_interrupted_by_a_restart_is_finished_by_the_next_operator() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let build = |calls: &Calls, fail: bool| {
        let calls = calls.clone();
        operator(&cluster).on_delete("widgets.example.com", "delete_fn", move |ctx: Ctx| {
            let calls = calls.clone();
            async move {
                calls.record(&ctx);
                if fail {
                    return Err(HandlerError::temporary("busy", Duration::from_secs(60)));
                }
                Ok(())
            }
        })
    };
    let running = spawn(build(&calls, true));
    create(&widgets, "w1", 1).await;
    until(&widgets, "w1", "the finalizer", |o| {
        o.is_some_and(has_finalizer)
    })
    .await;
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    until(&widgets, "w1", "the delete handler delayed", |o| {
        o.and_then(|o| progress(o, "delete_fn"))
            .is_some_and(|p| p["purpose"] == json!("delete") && p["retries"] == json!(1))
    })
    .await;
    running.stop().await;
    assert!(
        widgets.get_opt("w1").await.unwrap().is_some(),
        "held by the finalizer"
    );

    // The delay (60 s) is still running: the next operator waits for it... unless it is over. Make
    // the record due now, as if the time had passed while no operator ran.
    let key = format!("{PREFIX}/delete_fn");
    let object = widgets.get("w1").await.unwrap();
    let mut record = progress(&object, "delete_fn").unwrap();
    record["delayed"] = json!("2020-01-01T00:00:00.000000+00:00");
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: record.to_string()}}})),
        )
        .await
        .unwrap();
    let running = spawn(build(&calls, false));
    until(&widgets, "w1", "the object to go", |o| o.is_none()).await;
    assert_eq!(calls.count("delete_fn", "w1"), 2, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_handlers_run_once_per_process_for_listed_objects_and_create_does_not_rerun() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let build = |calls: &Calls| {
        let (create_calls, resume_calls) = (calls.clone(), calls.clone());
        operator(&cluster)
            .on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
                let calls = create_calls.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            })
            .on_resume("widgets.example.com", "resume_fn", move |ctx: Ctx| {
                let calls = resume_calls.clone();
                async move {
                    calls.record(&ctx);
                    assert_eq!(ctx.reason(), Some(Reason::Resume));
                    Ok(())
                }
            })
    };
    let running = spawn(build(&calls));
    create(&widgets, "w1", 1).await;
    until(&widgets, "w1", "the creation", |o| {
        o.is_some_and(|o| diff_base(o).is_some())
    })
    .await;
    running.stop().await;
    assert_eq!(
        calls.count("resume_fn", "w1"),
        0,
        "creation never mixes with resuming"
    );

    let running = spawn(build(&calls));
    let deadline = tokio::time::Instant::now() + WAIT;
    while calls.count("resume_fn", "w1") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", calls.all());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // A later change is an update, not another resume.
    set_size(&widgets, "w1", 2).await;
    until(&widgets, "w1", "the update handled", |o| {
        o.and_then(diff_base)
            .is_some_and(|b| b.contains("\"size\":2"))
    })
    .await;
    assert_eq!(calls.count("resume_fn", "w1"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("create_fn", "w1"), 1, "{:?}", calls.all());
    running.stop().await;
}

/// Progress written by Kopf (its format, its keys) is picked up where Kopf left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_left_by_kopf_is_continued_and_garbage_is_treated_as_absent() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let mut kopf_halfway = samples::widget("kopf", 1);
    kopf_halfway["metadata"]["annotations"] = json!({
        "kopf.zalando.org/create_a": "{\"started\":\"2026-03-01T10:00:00.123456+00:00\",\"stopped\":\"2026-03-01T10:00:00.523456+00:00\",\"purpose\":\"create\",\"retries\":1,\"success\":true,\"failure\":false}",
    });
    let mut garbage = samples::widget("garbage", 1);
    garbage["metadata"]["annotations"] = json!({
        "kopf.zalando.org/create_a": "{not json",
        "kopf.zalando.org/create_b": "{\"retries\":\"many\"}",
        "kopf.zalando.org/last-handled-configuration": "[1, 2",
    });
    for body in [kopf_halfway, garbage] {
        widgets
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
    }
    let calls = Calls::default();
    let (a, b) = (calls.clone(), calls.clone());
    let running = spawn(
        operator(&cluster)
            .on_create("widgets.example.com", "create_a", move |ctx: Ctx| {
                let calls = a.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            })
            .on_create("widgets.example.com", "create_b", move |ctx: Ctx| {
                let calls = b.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            }),
    );
    for name in ["kopf", "garbage"] {
        let object = until(&widgets, name, "the creation", |o| {
            o.and_then(diff_base)
                .is_some_and(|b| b.starts_with("{\"spec\""))
        })
        .await
        .unwrap();
        assert_eq!(progress(&object, "create_a"), None, "{name}: purged");
        assert_eq!(annotation(&object, &format!("{PREFIX}/create_b")), None);
    }
    assert_eq!(calls.count("create_a", "kopf"), 0, "Kopf's success stands");
    assert_eq!(calls.count("create_b", "kopf"), 1);
    assert_eq!(calls.count("create_a", "garbage"), 1);
    assert_eq!(calls.count("create_b", "garbage"), 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_base_too_large_for_annotations_is_kept_in_the_status_and_handled_once() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let seen = calls.clone();
    let running =
        spawn(
            operator(&cluster).on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
                let seen = seen.clone();
                async move {
                    seen.record(&ctx);
                    Ok(())
                }
            }),
        );
    let mut big = samples::widget("big", 1);
    big["spec"]["blob"] = json!("x".repeat(300 * 1024));
    widgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(big).unwrap(),
        )
        .await
        .unwrap();
    let object = until(&widgets, "big", "the status diff-base", |o| {
        o.is_some_and(|o| status(o)["kopf"]["last-handled-configuration"].is_string())
    })
    .await
    .unwrap();
    assert!(diff_base(&object).is_none());
    // Later events (a label) change nothing in the essence's handling: no second creation.
    widgets
        .patch(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"touched": true}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(calls.count("create_fn", "big"), 1, "{:?}", calls.all());
    running.stop().await;
}

/// The next cycle waits for the version our own patch wrote (`consistency_timeout`), but not when
/// that version's event already arrived while the patch was in flight: with an hour-long timeout,
/// handlers that need several cycles still finish at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_own_patch_seen_during_the_cycle_counts_as_consistent() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let (first, second, third) = (calls.clone(), calls.clone(), calls.clone());
    let running = spawn(
        operator(&cluster)
            .settings(|s| s.persistence.consistency_timeout = Duration::from_secs(3600))
            .on_create("widgets.example.com", "first", move |ctx: Ctx| {
                let calls = first.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            })
            .on_create("widgets.example.com", "second", move |ctx: Ctx| {
                let calls = second.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            })
            .on_create("widgets.example.com", "third", move |ctx: Ctx| {
                let calls = third.clone();
                async move {
                    calls.record(&ctx);
                    Ok(())
                }
            })
            // A deletion handler: the first cycle adds the finalizer, alone.
            .on_delete("widgets.example.com", "cleanup", |_: Ctx| async { Ok(()) }),
    );
    for name in ["w1", "w2", "w3", "w4"] {
        create(&widgets, name, 1).await;
    }
    for name in ["w1", "w2", "w3", "w4"] {
        // One handler per cycle: three cycles, each after the patch of the one before.
        until(&widgets, name, "all three handlers", |o| {
            o.is_some_and(|o| diff_base(o).is_some())
        })
        .await;
        for id in ["first", "second", "third"] {
            assert_eq!(calls.count(id, name), 1, "{:?}", calls.all());
        }
    }
    running.stop().await;
}

/// Tests that inject faults, which only the emulator can: `scripts/test` skips them on the real
/// API server (`--skip emulator_only`).
mod emulator_only {
    use super::*;

    /// The watch stream lags behind our own patches by more than `consistency_timeout` and the idle
    /// timeout, as it does when an operator works through a listing of 100,000 objects: the event of
    /// our first request (the result written, the diff-base not yet) arrives after the wait is over,
    /// for a new worker. It is a state we superseded ourselves, and the handler does not run again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lagging_stream_does_not_rerun_handlers_on_our_own_intermediate_version() {
        let (cluster, widgets) = cluster_with_widgets().await;
        create(&widgets, "w1", 1).await;
        // The listing is a request, not a watch: the object is handled, and its events held back.
        cluster
            .faults()
            .silence_watches(kactor::emulator::Matcher::any().resource("widgets"));
        let calls = Calls::default();
        let seen = calls.clone();
        let running = spawn(
            operator(&cluster)
                .settings(|s| {
                    s.persistence.consistency_timeout = Duration::from_millis(200);
                    // The worker idles out before the events come: the next one must know them.
                    s.queueing.idle_timeout = Duration::from_millis(100);
                })
                .on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
                    let seen = seen.clone();
                    async move {
                        seen.record(&ctx);
                        Ok(json!("done"))
                    }
                }),
        );
        until(&widgets, "w1", "the result and the diff-base", |o| {
            o.is_some_and(|o| diff_base(o).is_some() && status(o)["create_fn"] == json!("done"))
        })
        .await;
        // Well past the consistency timeout, the held-back events arrive: the status patch's
        // version first (no diff-base yet), then the object patch's.
        tokio::time::sleep(Duration::from_millis(600)).await;
        cluster.faults().reset();
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(calls.count("create_fn", "w1"), 1, "{:?}", calls.all());
        running.stop().await;
    }

    /// The API fails every patch for a while: the object is throttled and handled once the API is
    /// back; other objects are not held up meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn api_failures_throttle_the_object_and_it_is_handled_when_the_api_recovers() {
        let cluster = TestCluster::builder()
            .emulator(|e| e.bookmark_interval(Duration::from_millis(200)))
            .start()
            .await
            .unwrap();
        let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
        let calls = Calls::default();
        let seen = calls.clone();
        // kube's own retries are off, so the failures reach kactor's retries and then its throttling.
        let mut config = cluster.config();
        config.default_retry = false;
        let client = kube::Client::try_from(config).unwrap();
        let operator = operator(&cluster)
            .client(client)
            .settings(|s| s.queueing.error_delays = vec![Duration::from_millis(200)])
            .on_create("widgets.example.com", "create_fn", move |ctx: Ctx| {
                let seen = seen.clone();
                async move {
                    seen.record(&ctx);
                    Ok(json!("done"))
                }
            });
        // Every patch fails 10 times in a row: more than the 3 retries of a cycle, so the object is
        // throttled at least twice before a cycle gets through.
        cluster.faults().fail(
            kactor::emulator::Failure::new(503)
                .verb("patch")
                .resource("widgets")
                .times(10),
        );
        create(&widgets, "w1", 1).await;
        let running = spawn(operator);
        let object = until(&widgets, "w1", "the result after the outage", |o| {
            o.is_some_and(|o| diff_base(o).is_some())
        })
        .await
        .unwrap();
        assert_eq!(status(&object)["create_fn"], json!("done"));
        // Each failed cycle ran the handler (its result was never stored): at least once, as in Kopf.
        assert!(calls.count("create_fn", "w1") >= 2, "{:?}", calls.all());
        // Another object created now is handled at once.
        create(&widgets, "w2", 1).await;
        until(&widgets, "w2", "the second object", |o| {
            o.is_some_and(|o| diff_base(o).is_some())
        })
        .await;
        running.stop().await;
    }
}

/// Kopf's `kopf.adopt`, in a handler: the ConfigMap it makes is owned by the widget, named after it,
/// in its namespace, with its labels; deleting the widget deletes it (the garbage collector follows
/// the owner reference: at once on the emulator, at its next discovery resync on a real server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_adopted_in_a_handler_is_owned_named_labelled_and_goes_with_its_parent() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (cluster, widgets) = cluster_with_widgets().await;
    let running = spawn(operator(&cluster).on_create(
        "widgets.example.com",
        "child",
        |ctx: Ctx| async move {
            let mut configmap: ConfigMap = serde_json::from_value(json!({
                "data": {"size": ctx.spec()["size"].to_string()},
            }))?;
            ctx.adopt(&mut configmap)?;
            let namespace = ctx.namespace().unwrap_or("default");
            let made = Api::<ConfigMap>::namespaced(ctx.client(), namespace)
                .create(&PostParams::default(), &configmap)
                .await?;
            Ok(json!({"configmap": made.metadata.name}))
        },
    ));
    let widget = widgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(samples::widget("parent", 3)).unwrap(),
        )
        .await
        .unwrap();
    let handled = until(&widgets, "parent", "the child's name in the status", |o| {
        o.is_some_and(|o| status(o)["child"]["configmap"].is_string())
    })
    .await
    .unwrap();
    let name = status(&handled)["child"]["configmap"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        name.starts_with("parent-"),
        "generateName after the owner: {name}"
    );
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let child = configmaps.get(&name).await.unwrap();
    assert_eq!(child.data.unwrap()["size"], "3");
    assert_eq!(
        child.metadata.labels.unwrap()["app"],
        "demo",
        "the owner's labels"
    );
    let reference = &child.metadata.owner_references.unwrap()[0];
    assert_eq!(reference.uid, widget.metadata.uid.unwrap());
    assert_eq!(
        (
            reference.kind.as_str(),
            reference.controller,
            reference.block_owner_deletion
        ),
        ("Widget", Some(true), Some(true))
    );

    widgets
        .delete("parent", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while configmaps.get_opt(&name).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child outlived its parent by a minute"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await;
}
