//! The health server against a real watch stream on the cluster, over real HTTP: readiness waits
//! for the listing, and a stream whose API keeps failing makes `/healthz` fail with the stream's
//! last error (the "deaf" operator), until the API answers again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactor_emulator::{samples, Failure};
use kactor_health::{HealthServer, HealthState, Metrics};
use kactor_reactor::observe::WatchBoard;
use kactor_reactor::settings::{Networking, Settings, Watching};
use kactor_reactor::watching::Watcher;
use kactor_testenv::TestCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Status and body of a GET.
async fn get(addr: SocketAddr, target: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// Asks until the status is `wanted`, or panics after 20 s.
async fn until(addr: SocketAddr, target: &str, wanted: u16) -> String {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(addr, target).await;
        if status == wanted {
            return body;
        }
        assert!(
            Instant::now() < give_up,
            "{target} still answers {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tests that inject faults, which only the emulator can: `scripts/test` skips them on the real
/// API server (`--skip emulator_only`).
mod emulator_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_whose_api_keeps_failing_fails_liveness_until_the_api_answers() {
        let cluster = TestCluster::start().await.unwrap();
        let mut config = cluster.config();
        config.default_retry = false;
        let client = kube::Client::try_from(config).unwrap();
        samples::install_widgets(&client).await.unwrap();
        let api = kactor_reactor::slim::api(
            client.clone(),
            Some("default"),
            &samples::widget_api_resource(),
        );

        let mut settings = Settings::default();
        settings.health.silent_watch_timeout = Duration::from_millis(300);
        settings.watching.inactivity_timeout = Duration::from_millis(100);
        let board = WatchBoard::new();
        let state = HealthState::new(&settings, board.clone(), tokio::runtime::Handle::current());
        let metrics = Arc::new(Metrics::new().unwrap());
        let server = HealthServer::start(
            "127.0.0.1:0".parse().unwrap(),
            "/healthz",
            state.clone(),
            metrics,
        )
        .unwrap();
        let addr = server.local_addr();

        let watching = Watching {
            reconnect_backoff: Duration::from_millis(10),
            ..Default::default()
        };
        let networking = Networking {
            error_backoffs: vec![Duration::from_millis(10); 3],
            ..Default::default()
        };
        let mut watcher = Watcher::new(api, "widgets", watching, networking);
        let _entry = board.register("widgets.v1.example.com in default", watcher.status());
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 500);
        assert!(body.contains("[-]startup failed"), "{body}");
        let watch = tokio::spawn(async move { while watcher.next_batch().await.is_ok() {} });
        state.startup_done();
        assert_eq!(until(addr, "/readyz", 200).await, "ok");
        assert_eq!(get(addr, "/healthz").await, (200, "{}".to_string()));

        cluster
            .faults()
            .fail(Failure::new(503).verb("watch").times(1_000_000));
        cluster.faults().end_watches();
        let failure = until(addr, "/healthz/watches", 500).await;
        assert!(
            failure.starts_with(
                "[-]watches failed: widgets.v1.example.com in default: no event, bookmark or answer for "
            ),
            "{failure}"
        );
        assert!(
            failure.contains(" s (limit 0.3 s); last error: "),
            "{failure}"
        );
        assert!(failure.contains("503"), "{failure}");
        let (status, body) = get(addr, "/healthz").await;
        assert_eq!(status, 500);
        assert!(body.ends_with("healthz check failed\n"), "{body}");

        cluster.faults().reset();
        assert_eq!(until(addr, "/healthz", 200).await, "{}");
        watch.abort();
        server.stop();
    }
}
