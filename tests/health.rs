//! Health and metrics, end to end: a real operator against the cluster, asked over real HTTP as the
//! kubelet and Prometheus ask it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kactor::emulator::samples;
use kactor::emulator::{Failure, Matcher};
use kactor::prelude::*;
use kube::api::{Patch, PatchParams, PostParams};

use support::{cluster_with_widgets, free_port, get, operator, spawn, until_answer};

/// An operator of `cluster` serving health and metrics on `port`, with quick health thresholds.
fn serving(cluster: &kactor_testenv::TestCluster, port: u16) -> Operator {
    operator(cluster)
        .liveness(&format!("http://127.0.0.1:{port}/healthz"))
        .settings(quick_health)
}

/// Short health thresholds, so that the tests see failures within seconds.
fn quick_health(settings: &mut Settings) {
    settings.health.heartbeat_interval = Duration::from_millis(100);
    settings.health.heartbeat_timeout = Duration::from_secs(1);
    settings.health.metrics_cache = Duration::ZERO;
}

/// A careless handler blocks its thread: by default an object thread, whose heartbeat stops (the
/// `actors` check names it); with no object threads, a thread of the operator's runtime (the
/// `executor` check). Either way `/healthz` fails, says what to do, and passes again once the
/// handler returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_its_thread_fails_liveness() {
    for (object_threads, failed, names) in [
        (None, "[-]actors failed", "object thread"),
        (Some(0), "[-]executor failed", "runtime worker thread"),
    ] {
        let (cluster, widgets) = cluster_with_widgets().await;
        let port = free_port();
        let operator = serving(&cluster, port)
            .settings(|settings| {
                if let Some(threads) = object_threads {
                    settings.execution.object_threads = threads;
                }
            })
            .on_create(
                ("example.com", "v1", "widgets"),
                "blocking",
                |_: Ctx| async {
                    // What a careless handler does: blocking I/O on the thread that runs it.
                    std::thread::sleep(Duration::from_secs(4));
                    Ok(())
                },
            );
        let running = spawn(operator);
        until_answer(port, "/healthz", "a healthy operator", |code, _| {
            code == 200
        })
        .await;
        let widget = serde_json::from_value(samples::widget("w1", 1)).unwrap();
        widgets
            .create(&PostParams::default(), &widget)
            .await
            .unwrap();
        let body = until_answer(
            port,
            "/healthz",
            "the blocked thread detected",
            |code, _| code == 500,
        )
        .await;
        assert!(body.contains(failed), "{object_threads:?}: {body}");
        assert!(body.contains(names), "{object_threads:?}: {body}");
        assert!(body.contains("spawn_blocking"), "says what to do: {body}");
        until_answer(port, "/healthz", "healthy once it returned", |code, _| {
            code == 200
        })
        .await;
        running.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn metrics_parse_as_prometheus_text_and_move_as_objects_are_handled() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let port = free_port();
    let operator = served_with_a_create_handler(operator(&cluster), port);
    let mine =
        kactor::prometheus::IntCounter::new("myop_custom_total", "The application's own").unwrap();
    operator
        .metrics()
        .registry()
        .register(Box::new(mine.clone()))
        .unwrap();
    mine.inc_by(7);
    let running = spawn(operator);
    create_widgets(&widgets, &["w1", "w2", "w3"]).await;
    let runs = r#"kactor_handler_runs_total{handler="create_fn",resource="widgets.v1.example.com",result="success"} 3"#;
    // The runs are counted when the handlers return, their patches once the API answered them.
    let text = until_answer(
        port,
        "/metrics",
        "three runs and their patches",
        |code, body| code == 200 && body.contains(runs) && requests(body, "patch") >= 6.0,
    )
    .await;

    let samples = parse_exposition(&text);
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        samples
            .iter()
            .find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(v)))
            .map(|s| s.value)
    };
    assert!(
        value(
            "kactor_events_received_total",
            &[("resource", "widgets.v1.example.com")]
        )
        .unwrap()
            >= 3.0
    );
    assert_eq!(
        value(
            "kactor_handler_duration_seconds_count",
            &[
                ("handler", "create_fn"),
                ("resource", "widgets.v1.example.com")
            ]
        ),
        Some(3.0)
    );
    assert_eq!(value("kactor_operator_paused", &[]), Some(0.0));
    assert_eq!(value("kactor_active_handlers", &[]), Some(0.0));
    assert!(
        value(
            "kactor_api_requests_total",
            &[("verb", "list"), ("code", "200")]
        )
        .unwrap()
            >= 1.0
    );
    assert!(
        value(
            "kactor_api_requests_total",
            &[("verb", "patch"), ("code", "200")]
        )
        .unwrap()
            >= 3.0
    );
    assert!(
        value(
            "kactor_api_requests_total",
            &[("verb", "watch"), ("code", "200")]
        )
        .unwrap()
            >= 1.0
    );
    assert!(
        value(
            "kactor_api_request_duration_seconds_count",
            &[("verb", "patch")]
        )
        .unwrap()
            >= 3.0
    );
    assert!(
        value("process_open_fds", &[]).unwrap() > 0.0,
        "the process collector"
    );
    assert_eq!(
        value("myop_custom_total", &[]),
        Some(7.0),
        "the application's own metric"
    );
    assert!(
        samples.iter().all(|s| !s
            .labels
            .iter()
            .any(|(_, v)| v.starts_with("w") && v.len() == 2)),
        "no object name is a label"
    );

    // More objects, more counts.
    let widget = serde_json::from_value(samples::widget("w4", 1)).unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    until_answer(port, "/metrics", "a fourth run", |_, body| {
        body.contains(&runs.replace("} 3", "} 4"))
    })
    .await;
    running.stop().await;
}

/// The shared cache's gauges, as Prometheus scrapes them: its objects and their size as JSON,
/// measured when scraped, follow the objects created, changed and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_caches_objects_and_bytes_follow_the_objects_when_scraped() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let port = free_port();
    let running = spawn(serving(&cluster, port).on_reconcile(
        ("example.com", "v1", "widgets"),
        Reconcile::id("reconcile"),
        |_: Ctx| async { Ok(Action::await_change()) },
    ));
    let gauges = |body: &str| -> Option<(f64, f64)> {
        let samples = parse_exposition(body);
        let value = |name: &str| {
            samples
                .iter()
                .find(|s| s.name == name && s.label("resource") == Some("widgets.v1.example.com"))
                .map(|s| s.value)
        };
        Some((value("kactor_cache_objects")?, value("kactor_cache_bytes")?))
    };
    until_answer(port, "/metrics", "an empty cache, at 0", |code, body| {
        code == 200 && gauges(body) == Some((0.0, 0.0))
    })
    .await;

    create_widgets(&widgets, &["w1", "w2", "w3"]).await;
    let three = until_answer(port, "/metrics", "three widgets cached", |_, body| {
        gauges(body).is_some_and(|(objects, _)| objects == 3.0)
    })
    .await;
    let (_, bytes) = gauges(&three).unwrap();
    // Each as the server sends it: at least its name, kind and spec, at most a few kilobytes.
    assert!((300.0..30_000.0).contains(&bytes), "{bytes} bytes");

    // A larger spec: more bytes, the same objects.
    let patch = json!({"spec": {"notes": "x".repeat(4000)}});
    widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let grown = until_answer(port, "/metrics", "the change measured", |_, body| {
        gauges(body).is_some_and(|(objects, now)| objects == 3.0 && now >= bytes + 4000.0)
    })
    .await;
    let (_, grown) = gauges(&grown).unwrap();

    widgets.delete("w1", &Default::default()).await.unwrap();
    until_answer(port, "/metrics", "the deletion measured", |_, body| {
        gauges(body).is_some_and(|(objects, now)| objects == 2.0 && now <= grown - 4000.0)
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_scrape_shows_every_resources_counters_and_gauges_at_zero() {
    // What a dashboard reads before anything happened: rate() and absent() need the series to exist.
    let (cluster, _widgets) = cluster_with_widgets().await;
    let port = free_port();
    let running = spawn(
        serving(&cluster, port)
            .on_create(
                ("example.com", "v1", "widgets"),
                "create_fn",
                |_: Ctx| async { Ok(()) },
            )
            .timer(
                ("example.com", "v1", "widgets"),
                "tick",
                Timer::every(Duration::from_secs(60)),
                |_: Ctx| async { Ok(()) },
            ),
    );
    let text = until_answer(port, "/metrics", "the resource served", |code, body| {
        code == 200 && body.contains("kactor_object_workers{")
    })
    .await;
    let samples = parse_exposition(&text);
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels.iter().all(|(k, v)| s.label(k) == Some(v))
            })
            .map(|s| s.value)
    };
    const W: &str = "widgets.v1.example.com";
    for name in [
        "kactor_events_received_total",
        "kactor_object_workers",
        "kactor_coalesced_events_total",
        "kactor_daemons_running",
        "kactor_timers_running",
    ] {
        assert_eq!(
            value(name, &[("resource", W)]),
            Some(0.0),
            "{name}:\n{text}"
        );
    }
    for reason in ["reconnect", "relist_410", "inactivity", "error"] {
        let labels = [("resource", W), ("reason", reason)];
        assert_eq!(
            value("kactor_watch_restarts_total", &labels),
            Some(0.0),
            "{reason}:\n{text}"
        );
    }
    for handler in ["create_fn", "tick"] {
        for result in ["success", "temporary", "permanent", "ignored", "timeout"] {
            let labels = [("handler", handler), ("resource", W), ("result", result)];
            assert_eq!(
                value("kactor_handler_runs_total", &labels),
                Some(0.0),
                "{handler} {result}:\n{text}"
            );
        }
        let labels = [("handler", handler), ("resource", W)];
        assert_eq!(
            value("kactor_handler_retries_total", &labels),
            Some(0.0),
            "{handler}:\n{text}"
        );
    }
    assert_eq!(value("kactor_active_handlers", &[]), Some(0.0));
    assert_eq!(value("kactor_operator_paused", &[]), Some(0.0));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_connected_by_configuration_counts_every_request() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let port = free_port();
    // Built from the configuration (as `--emulator` builds it), not handed a client: the metering
    // sits inside the clients kactor builds, the operator's and each object thread's (which make
    // the handlers' patches).
    let running = spawn(served_with_a_create_handler(
        Operator::new().kube_config(cluster.config()).standalone(),
        port,
    ));
    create_widgets(&widgets, &["w1", "w2"]).await;
    let text = until_answer(port, "/metrics", "both widgets' patches", |code, body| {
        code == 200 && requests(body, "patch") >= 4.0
    })
    .await;
    assert!(requests(&text, "list") >= 1.0, "{text}");
    assert!(requests(&text, "watch") >= 1.0, "{text}");
    let handled = widgets.get("w2").await.unwrap();
    assert_eq!(handled.data["status"]["create_fn"], json!({"done": true}));
    running.stop().await;
}

/// The operator serving health and metrics on `port`, with quick health thresholds and a create
/// handler returning `{"done": true}`.
fn served_with_a_create_handler(operator: Operator, port: u16) -> Operator {
    operator
        .liveness(&format!("http://127.0.0.1:{port}/healthz"))
        .settings(quick_health)
        .on_create(
            ("example.com", "v1", "widgets"),
            "create_fn",
            |_: Ctx| async { Ok(json!({"done": true})) },
        )
}

/// The API requests of this verb counted in a rendering of the metrics, over every code.
fn requests(metrics: &str, verb: &str) -> f64 {
    parse_exposition(metrics)
        .iter()
        .filter(|s| s.name == "kactor_api_requests_total" && s.label("verb") == Some(verb))
        .map(|s| s.value)
        .sum()
}

/// One sample of the text exposition format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses Prometheus' text format strictly: `# HELP`/`# TYPE` lines, then `name{k="v",...} value`
/// lines whose family was declared; panics on anything else.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut typed = std::collections::HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (keyword, name, what) = (parts.next(), parts.next(), parts.next());
            match keyword {
                Some("HELP") => assert!(name.is_some() && what.is_some(), "{line}"),
                Some("TYPE") => {
                    let kind = what.unwrap_or_default();
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                        "{line}"
                    );
                    typed.insert(name.unwrap().to_string(), kind.to_string());
                }
                _ => panic!("an unknown comment: {line}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("not a number: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed: {line}"));
                let mut labels = Vec::new();
                for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                    let (key, value) = pair.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
                    labels.push((key.to_string(), value.trim_end_matches('"').to_string()));
                }
                (name, labels)
            }
            None => (series, Vec::new()),
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "a bad name: {line}"
        );
        let family = ["_bucket", "_count", "_sum", "_total"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|f| typed.contains_key(*f)))
            .unwrap_or(name);
        assert!(
            typed.contains_key(family) || typed.contains_key(name),
            "a sample without a TYPE: {line}"
        );
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    assert!(!samples.is_empty());
    samples
}

/// Tests that inject faults, which only the emulator can: `scripts/test` skips them on the real
/// API server (`--skip emulator_only`).
mod emulator_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deaf_watch_stream_fails_liveness_until_it_recovers() {
        let (cluster, _widgets) = cluster_with_widgets().await;
        let port = free_port();
        let running = spawn(
            operator(&cluster)
                .liveness(&format!("http://127.0.0.1:{port}/healthz"))
                .settings(|s| {
                    quick_health(s);
                    s.watching.inactivity_timeout = Duration::from_millis(500);
                    s.health.silent_watch_timeout = Duration::from_millis(1500);
                })
                .on_probe("answer", |_: ActivityCtx| async { Ok(42) })
                .on_create(
                    ("example.com", "v1", "widgets"),
                    "create_fn",
                    |_: Ctx| async { Ok(()) },
                ),
        );
        let body = until_answer(port, "/healthz", "a healthy operator", |code, _| {
            code == 200
        })
        .await;
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            json!({"answer": 42}),
            "Kopf's probe JSON"
        );

        // The stream stays open but says nothing, and every attempt to watch again fails.
        cluster.faults().fail(
            Failure::new(500)
                .verb("watch")
                .resource("widgets")
                .times(u32::MAX),
        );
        cluster
            .faults()
            .silence_watches(Matcher::any().resource("widgets"));
        let body = until_answer(port, "/healthz", "the deaf stream detected", |code, _| {
            code == 500
        })
        .await;
        assert!(body.contains("[-]watches failed"), "{body}");
        assert!(
            body.contains("widgets.v1.example.com"),
            "names the stream: {body}"
        );
        assert!(
            body.contains("[+]actors ok"),
            "the other checks pass: {body}"
        );
        let (code, only) = get(port, "/healthz/watches").await.unwrap();
        assert_eq!(code, 500, "{only}");
        let (code, _) = get(port, "/healthz?exclude=watches").await.unwrap();
        assert_eq!(code, 200, "the failed check excluded");

        cluster.faults().reset();
        until_answer(port, "/healthz", "recovery", |code, _| code == 200).await;
        running.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readiness_waits_for_the_startup_activities_and_the_initial_listing() {
        let (cluster, _widgets) = cluster_with_widgets().await;
        let port = free_port();
        let (release, released) = tokio::sync::watch::channel(false);
        let released = Arc::new(released);
        // The listing of widgets answers late.
        cluster.faults().add_latency(
            Matcher::any().verb("list").resource("widgets"),
            Duration::from_secs(2),
        );
        let running = spawn(
            operator(&cluster)
                .liveness(&format!("http://127.0.0.1:{port}/live"))
                .settings(quick_health)
                .on_startup("connect", move |_: ActivityCtx| {
                    let mut released = (*released).clone();
                    async move {
                        let _ = released.wait_for(|r| *r).await;
                        Ok(())
                    }
                })
                .on_event(("example.com", "v1", "widgets"), "log", |_: Ctx| async {
                    Ok(())
                }),
        );
        let body = until_answer(port, "/readyz", "not ready during startup", |code, _| {
            code == 500
        })
        .await;
        assert!(body.contains("[-]startup failed"), "{body}");
        let (code, _) = get(port, "/live").await.unwrap();
        assert_eq!(code, 200, "alive meanwhile, at Kopf's liveness path too");

        release.send(true).unwrap();
        let body = until_answer(
            port,
            "/readyz?verbose",
            "startup done, listing not",
            |_, body| body.contains("[+]startup ok"),
        )
        .await;
        assert!(body.contains("[-]listing failed"), "{body}");
        assert!(body.contains("widgets.v1.example.com"), "{body}");
        let (code, _) = get(port, "/readyz/listing").await.unwrap();
        assert_eq!(code, 500);

        let body = until_answer(port, "/readyz", "ready", |code, _| code == 200).await;
        assert_eq!(body.trim(), "ok");
        let body = until_answer(port, "/readyz?verbose", "every check passes", |code, _| {
            code == 200
        })
        .await;
        assert!(
            body.contains("[+]listing ok") && body.contains("readyz check passed"),
            "{body}"
        );
        running.stop().await;
    }
}

/// Creates the widgets named, each of size 1.
async fn create_widgets(widgets: &kube::Api<kube::api::DynamicObject>, names: &[&str]) {
    for name in names {
        let widget = serde_json::from_value(samples::widget(name, 1)).unwrap();
        widgets
            .create(&PostParams::default(), &widget)
            .await
            .unwrap();
    }
}
