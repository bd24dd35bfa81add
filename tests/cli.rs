//! The `kactor` command line, run as a process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams};

/// Kills the child when the test ends, even on a failed assertion.
mod support;

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn kactor_emulator_serves_a_sample_widget_and_writes_a_kubeconfig_any_client_can_use() {
    let dir = std::env::temp_dir().join(format!("kactor-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_kactor"))
            .args(["emulator", "--port", "0", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kactor runs"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut banner = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        banner.push(line.clone());
        if line.starts_with("Serving until Ctrl-C") || Instant::now() > deadline {
            break;
        }
    }
    assert!(
        banner.iter().any(|l| l.contains("kubectl get widgets")),
        "instructions printed: {banner:?}"
    );
    let config =
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("the kubeconfig is written");
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let resource = kactor::emulator::samples::widget_api_resource();
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let names: Vec<_> = widgets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|w| w.metadata.name)
        .collect();
    assert_eq!(names, ["demo"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `kactor events ...` with this KUBECONFIG (and no other source of credentials).
fn kactor_events(kubeconfig: &std::path::Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kactor"));
    command
        .arg("events")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap_or(kubeconfig))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kactor-cli-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits for a child with a deadline; kills it (and fails) if it hangs.
fn finish(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kactor_events_prints_each_event_and_exits_cleanly_on_sigterm() {
    use kactor::emulator::samples;
    use kactor_testenv::TestCluster;
    use kube::api::PostParams;
    let cluster = TestCluster::start().await.unwrap();
    let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
    widgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(samples::widget("listed", 1)).unwrap(),
        )
        .await
        .unwrap();
    let dir = scratch("events");
    cluster.write_kubeconfig(dir.join("kubeconfig")).unwrap();
    let port = support::free_port();
    let liveness = format!("--liveness=http://127.0.0.1:{port}/healthz");

    let mut child = Child(
        kactor_events(
            &dir.join("kubeconfig"),
            &["wd", "-A", "--log-format", "plain", &liveness],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let next = |what: &str| {
        lines_rx
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("no line for {what}"))
    };
    assert!(next("the listed widget").starts_with("LISTED   default/listed resourceVersion="));
    widgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(samples::widget("added", 1)).unwrap(),
        )
        .await
        .unwrap();
    assert!(next("the added widget").starts_with("ADDED    default/added"));

    // --liveness serves health and metrics; the client built from the kubeconfig counts requests.
    support::until_answer(port, "/readyz", "ready", |code, _| code == 200).await;
    let (code, body) = support::get(port, "/healthz").await.unwrap();
    assert_eq!((code, body.as_str()), (200, "{}"));
    let runs = r#"kactor_handler_runs_total{handler="print",resource="widgets.v1.example.com",result="success"} 2"#;
    let metrics = support::until_answer(port, "/metrics", "two events handled", |_, body| {
        body.contains(runs)
    })
    .await;
    for series in [
        r#"kactor_events_received_total{resource="widgets.v1.example.com"} 2"#,
        r#"kactor_api_requests_total{code="200",verb="list"}"#,
        r#"kactor_api_requests_total{code="200",verb="watch"}"#,
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = finish(&mut child.0, Duration::from_secs(10));
    assert!(
        status.success(),
        "a graceful stop exits with success: {status:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kactor_events_for_a_resource_nobody_serves_is_a_one_line_error() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cluster = runtime
        .block_on(kactor_testenv::TestCluster::start())
        .unwrap();
    let dir = scratch("missing");
    cluster.write_kubeconfig(dir.join("kubeconfig")).unwrap();
    let output = kactor_events(&dir.join("kubeconfig"), &["gizmos", "-A"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    let error: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("kactor: error:"))
        .collect();
    assert_eq!(error.len(), 1, "{stderr}");
    assert!(error[0].contains("\"gizmos\""), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kactor_events_with_an_unreachable_api_or_no_credentials_is_a_one_line_error() {
    let dir = scratch("unreachable");
    let unreachable = kactor::emulator::kubeconfig("http://127.0.0.1:1");
    std::fs::write(
        dir.join("kubeconfig"),
        serde_json::to_string(&unreachable).unwrap(),
    )
    .unwrap();
    let output = kactor_events(&dir.join("kubeconfig"), &["pods", "-A"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("kactor: error: cannot reach the Kubernetes API")),
        "{stderr}"
    );

    let output = kactor_events(&dir.join("nothing-here"), &["pods", "-A"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("kactor: error: no usable Kubernetes credentials")),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kactor_freeze_writes_a_kopf_record_and_resume_removes_it() {
    use kube::api::PostParams;
    let cluster = kactor_testenv::TestCluster::start().await.unwrap();
    let crds: Api<DynamicObject> = Api::all_with(
        cluster.client(),
        &kactor::emulator::samples::crd_api_resource(),
    );
    for crd in kactor::peering::peering::crds() {
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap();
    }
    let resource = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("kopf.dev", "v1", "ClusterKopfPeering"),
        "clusterkopfpeerings",
    );
    let peerings: Api<DynamicObject> = Api::all_with(cluster.client(), &resource);
    kactor::emulator::samples::until_served(&peerings)
        .await
        .unwrap();
    peerings
        .create(
            &PostParams::default(),
            &serde_json::from_value(kactor::peering::peering::peering_object("default", None))
                .unwrap(),
        )
        .await
        .unwrap();
    let dir = scratch("freeze");
    cluster.write_kubeconfig(dir.join("kubeconfig")).unwrap();
    let kactor = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kactor"))
            .args(args)
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let output = kactor(&["freeze", "-t", "60", "-p", "200", "-i", "maintainer"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let record = peerings.get("default").await.unwrap().data["status"]["maintainer"].clone();
    assert_eq!(
        (record["priority"].as_i64(), record["lifetime"].as_i64()),
        (Some(200), Some(60)),
        "{record}"
    );
    assert!(
        record["lastseen"]
            .as_str()
            .is_some_and(|t| t.ends_with("+00:00")),
        "{record}"
    );
    let output = kactor(&["resume", "-i", "maintainer"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status = peerings.get("default").await.unwrap().data["status"].clone();
    assert!(
        status.get("maintainer").is_none_or(|r| r.is_null()),
        "{status}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
