//! What the end-to-end tests of handlers share: a cluster with widgets, a quiet operator, running
//! and stopping it, and waiting for what lands on objects.

// Each test file is its own crate and uses only part of this.
#![allow(dead_code)]

use std::time::Duration;

use kactor::emulator::samples;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio::sync::oneshot;

/// The longest anything is waited for.
pub const WAIT: Duration = Duration::from_secs(20);
/// Kopf's annotation prefix.
pub const PREFIX: &str = "kopf.zalando.org";
/// Kopf's finalizer.
pub const FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";

/// An operator running in a task.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<kactor::Result<()>>,
}

impl Running {
    /// Panics with the operator's error if it ended on its own (it runs until stopped).
    pub async fn assert_running(&mut self) {
        if self.task.is_finished() {
            let ended = (&mut self.task).await.expect("the operator task");
            panic!("the operator ended on its own: {ended:?}");
        }
    }

    /// Stops it, and checks that it ends well and in time.
    pub async fn stop(mut self) {
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

/// Runs the operator until [`Running::stop`].
pub fn spawn(operator: Operator) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        task,
    }
}

/// Writes a test makes all along, in rounds, until [`Rounds::stop`].
pub struct Rounds {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Rounds {
    /// Runs `round(0)`, `round(1)`, ... in a task, with `pause` after each, until stopped.
    pub fn start<F, Fut>(pause: Duration, mut round: F) -> Self
    where
        F: FnMut(u64) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            for n in 0u64.. {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                round(n).await;
                tokio::time::sleep(pause).await;
            }
        });
        Rounds { stop, task }
    }

    /// Stops between two rounds and returns once the round under way has finished. Not aborted:
    /// the requests of an aborted round that were already sent would still land after the test
    /// had looked, as changes the test did not count.
    pub async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.expect("the rounds ran");
    }
}

/// A cluster with the widgets CRD installed.
pub async fn cluster_with_widgets() -> (TestCluster, Api<DynamicObject>) {
    let cluster = TestCluster::builder()
        .emulator(|e| e.bookmark_interval(Duration::from_millis(200)))
        .start()
        .await
        .unwrap();
    let widgets = samples::install_widgets(&cluster.client()).await.unwrap();
    (cluster, widgets)
}

/// A quiet operator for the cluster: short retries, no waiting at exit.
pub fn operator(cluster: &TestCluster) -> Operator {
    Operator::new()
        .client(cluster.client())
        .standalone()
        .settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(10);
            s.networking.error_backoffs = vec![Duration::from_millis(20); 3];
            s.queueing.exit_timeout = Duration::from_millis(500);
        })
}

/// Waits until the object passes `check` (None: the object is gone), or fails showing it.
pub async fn until(
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

/// An annotation's value.
pub fn annotation<'a>(object: &'a DynamicObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The stored diff-base, as text.
pub fn diff_base(object: &DynamicObject) -> Option<&str> {
    annotation(object, &format!("{PREFIX}/last-handled-configuration"))
}

/// The status (null when absent).
pub fn status(object: &DynamicObject) -> &Value {
    object.data.get("status").unwrap_or(&Value::Null)
}

/// Whether our finalizer is on the object.
pub fn has_finalizer(object: &DynamicObject) -> bool {
    object
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// A free loopback port for the health server.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on the health server: the status and the body (None while it does not listen yet).
pub async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// Asks `path` until the answer passes `check`; fails with the last answer after [`WAIT`].
pub async fn until_answer(
    port: u16,
    path: &str,
    what: &str,
    check: impl Fn(u16, &str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = None;
    loop {
        if let Some((code, body)) = get(port, path).await {
            if check(code, &body) {
                return body;
            }
            last = Some((code, body));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what} on {path}; the last answer: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` every 25 ms until it holds, for at most [`WAIT`].
pub async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A handler call of a sharded operator: which object, which replica, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Call<T> {
    pub uid: String,
    pub replica: String,
    pub start: T,
    pub end: T,
}

/// The pairs of calls for one object, by two replicas, that overlap in time: what sharding must
/// never let happen.
pub fn overlaps<T: Ord + Copy>(mut calls: Vec<Call<T>>) -> Vec<(Call<T>, Call<T>)> {
    calls.sort_by(|a, b| (&a.uid, a.start).cmp(&(&b.uid, b.start)));
    let mut overlaps = Vec::new();
    for (i, a) in calls.iter().enumerate() {
        for b in calls[i + 1..].iter().take_while(|b| b.uid == a.uid) {
            if b.replica != a.replica && b.start < a.end {
                overlaps.push((a.clone(), b.clone()));
            }
        }
    }
    overlaps
}
