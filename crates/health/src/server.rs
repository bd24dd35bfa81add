//! The HTTP server of `/healthz`, `/readyz` and `/metrics`, on a thread of its own.
//!
//! **Expected flow**: [`HealthServer::start`] binds at once (so a port in use is an error for the
//! caller, not a log line later), then a thread named `kactor-health` runs a current-thread tokio
//! runtime with the accept loop and the sampler ([`HealthState::sample`] every
//! `heartbeat_interval`). [`HealthServer::stop`], or dropping the server, ends the thread.
//!
//! **Guarantees**: probes are answered even when the operator's runtime is saturated or blocked
//! (that is when they matter), and a burst of scrapes takes one thread, never the operator's: a
//! rendering of `/metrics` is reused for `metrics_cache`.
//!
//! Routes (GET and HEAD; other methods: 405; unknown paths: 404), in controller-runtime's forms:
//!
//! | Path | Success | Failure |
//! |------|---------|---------|
//! | the liveness path, `/healthz` | 200, Kopf's probe JSON | 500, `[+]`/`[-]` lines, `healthz check failed` |
//! | `/healthz/<check>` | 200 `ok` | 500 `[-]<check> failed: <why>` |
//! | `/readyz` | 200 `ok` | 500, as `/healthz` |
//! | `/readyz/<check>` | 200 `ok` | 500 `[-]<check> failed: <why>` |
//! | `/metrics` | 200, Prometheus text format 0.0.4 | |
//!
//! `?verbose` lists every check on success too; `?exclude=<check>` (repeatable) skips checks.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::checks::{HealthState, Outcome, Report, Select};
use crate::metrics::Metrics;

/// The shortest sampling interval: a zero setting would make the sampler spin.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// How long a connection may take to send a request's headers (a slow client holds no more).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
const METRICS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The running health server (see the [module docs](self)).
///
/// ```no_run
/// # use std::sync::Arc;
/// # fn demo(state: Arc<kactor_health::HealthState>, metrics: Arc<kactor_health::Metrics>) {
/// let server = kactor_health::HealthServer::start(
///     "0.0.0.0:8080".parse().unwrap(),
///     "/healthz",
///     state,
///     metrics,
/// )
/// .expect("the port is free");
/// println!("serving health on {}", server.local_addr());
/// server.stop();
/// # }
/// ```
#[derive(Debug)]
pub struct HealthServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HealthServer {
    /// Listens on `addr` (port 0: any free port) and serves on a thread of its own. The liveness
    /// checks answer at `liveness_path` (Kopf's `--liveness` path) and at `/healthz`.
    pub fn start(
        addr: SocketAddr,
        liveness_path: &str,
        state: Arc<HealthState>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<HealthServer> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("kactor-health")
            .build()?;
        let listener = {
            let _context = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let routes = Arc::new(Routes {
            liveness_path: normalise(liveness_path),
            state,
            metrics,
            rendering: Mutex::new(None),
        });
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("kactor-health".to_string())
            .spawn(move || runtime.block_on(serve(listener, routes, stopped)))?;
        tracing::debug!(%addr, "Serving health checks and metrics.");
        Ok(HealthServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens (with the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving: the listener and every connection are closed, and the thread has ended
    /// when this returns.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the health server's thread panicked");
            }
        }
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `/x/` → `/x`, `x` → `/x`, `` → `/`.
fn normalise(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.starts_with('/') {
        trimmed.to_string()
    } else {
        format!("/{trimmed}")
    }
}

/// Accepts connections and samples the operator's runtime until stopped.
async fn serve(listener: TcpListener, routes: Arc<Routes>, mut stopped: oneshot::Receiver<()>) {
    let interval = routes.state.settings().heartbeat_interval.max(MIN_INTERVAL);
    let mut sampler = tokio::time::interval(interval);
    sampler.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = sampler.tick() => routes.state.sample(),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(stream, routes.clone()));
                }
                Err(error) => {
                    // Out of file descriptors, most likely: let some close.
                    tracing::warn!(%error, "the health server cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

async fn connection(stream: tokio::net::TcpStream, routes: Arc<Routes>) {
    let service = hyper::service::service_fn(move |request| {
        let routes = routes.clone();
        async move { Ok::<_, Infallible>(routes.handle(request).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(error) = served {
        tracing::debug!(%error, "a health connection ended with an error");
    }
}

/// What the request handlers share.
struct Routes {
    liveness_path: String,
    state: Arc<HealthState>,
    metrics: Arc<Metrics>,
    /// The last rendering of the metrics, and when it was made.
    rendering: Mutex<Option<(Instant, Bytes)>>,
}

/// Where a path leads.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    /// The liveness checks: all, or one.
    Liveness(Option<&'a str>),
    /// The readiness checks: all, or one.
    Readiness(Option<&'a str>),
    Metrics,
    NotFound,
}

impl Routes {
    fn route<'a>(&self, path: &'a str) -> Route<'a> {
        let one = |name: &'a str| match name {
            "" => None,
            name => Some(name),
        };
        if path == "/metrics" {
            Route::Metrics
        } else if path == "/readyz" {
            Route::Readiness(None)
        } else if let Some(name) = path.strip_prefix("/readyz/") {
            Route::Readiness(one(name))
        } else if path == "/healthz" || path == self.liveness_path {
            Route::Liveness(None)
        } else if let Some(name) = path.strip_prefix("/healthz/") {
            Route::Liveness(one(name))
        } else if let Some(name) = path
            .strip_prefix(self.liveness_path.as_str())
            .filter(|_| self.liveness_path != "/")
            .and_then(|rest| rest.strip_prefix('/'))
        {
            Route::Liveness(one(name))
        } else {
            Route::NotFound
        }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let route = self.route(request.uri().path());
        let readable = matches!(*request.method(), Method::GET | Method::HEAD);
        if route != Route::NotFound && !readable {
            let mut response = respond(
                StatusCode::METHOD_NOT_ALLOWED,
                TEXT,
                "405 method not allowed\n",
            );
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        let query = Query::parse(request.uri().query());
        match route {
            Route::Liveness(Some(name)) => {
                single(name, self.state.liveness_of(&Select::Only(name)).await)
            }
            Route::Readiness(Some(name)) => {
                single(name, self.state.readiness_of(&Select::Only(name)))
            }
            Route::Liveness(None) => {
                let report = self.state.liveness_of(&query.select()).await;
                if report.passed() && !query.verbose {
                    let empty = serde_json::Value::Object(Default::default());
                    let probes = report.probes().unwrap_or(&empty);
                    respond(StatusCode::OK, JSON, probes.to_string())
                } else {
                    aggregated(&report)
                }
            }
            Route::Readiness(None) => {
                let report = self.state.readiness_of(&query.select());
                if report.passed() && !query.verbose {
                    respond(StatusCode::OK, TEXT, "ok")
                } else {
                    aggregated(&report)
                }
            }
            Route::Metrics => respond(StatusCode::OK, METRICS, self.rendering()),
            Route::NotFound => respond(StatusCode::NOT_FOUND, TEXT, "404 page not found\n"),
        }
    }

    /// The metrics' text, rendered at most once per `metrics_cache`.
    fn rendering(&self) -> Bytes {
        let max_age = self.state.settings().metrics_cache;
        if max_age.is_zero() {
            return Bytes::from(self.metrics.render());
        }
        // Only this server's one thread takes the lock: it never waits.
        let mut rendering = self.rendering.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, text)) = rendering.as_ref() {
            if at.elapsed() < max_age {
                return text.clone();
            }
        }
        let text = Bytes::from(self.metrics.render());
        *rendering = Some((Instant::now(), text.clone()));
        text
    }
}

/// `?verbose` and `?exclude=<check>`.
#[derive(Debug, Default)]
struct Query {
    verbose: bool,
    exclude: Vec<String>,
}

impl Query {
    fn parse(query: Option<&str>) -> Query {
        let mut parsed = Query::default();
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*key {
                "verbose" => parsed.verbose = true,
                "exclude" => parsed.exclude.push(value.into_owned()),
                _ => {}
            }
        }
        parsed
    }

    fn select(&self) -> Select<'_> {
        match self.exclude.is_empty() {
            true => Select::All,
            false => Select::Except(&self.exclude),
        }
    }
}

/// Every check, one per line (controller-runtime's text): 200 or 500.
fn aggregated(report: &Report) -> Response<Full<Bytes>> {
    let status = match report.passed() {
        true => StatusCode::OK,
        false => StatusCode::INTERNAL_SERVER_ERROR,
    };
    log_failures(report);
    respond(status, TEXT, report.to_string())
}

/// One check: `ok`, its failure, or 404 for a check that does not exist.
fn single(name: &str, report: Report) -> Response<Full<Bytes>> {
    log_failures(&report);
    match report.outcome(name) {
        None => respond(StatusCode::NOT_FOUND, TEXT, "404 page not found\n"),
        Some(Outcome::Failed(message)) => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            TEXT,
            format!("[-]{name} failed: {message}\n"),
        ),
        Some(Outcome::Ok | Outcome::Excluded) => respond(StatusCode::OK, TEXT, "ok"),
    }
}

/// The failures a probe answered, as controller-runtime logs them: so that whoever sees the
/// operator restarted finds why in its last lines.
fn log_failures(report: &Report) {
    for (check, reason) in report.failures() {
        tracing::warn!(check, %reason, "{} check '{check}' failed: {reason}", report.name());
    }
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use kactor_reactor::handlers::{ActivityCtx, Memo, Probe};
    use kactor_reactor::observe::{Observer, WatchBoard};
    use kactor_reactor::settings::Settings;
    use kactor_reactor::watching::WatchStatus;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server with tiny thresholds, on a free port.
    fn server(board: &WatchBoard) -> (HealthServer, Arc<HealthState>, Arc<Metrics>) {
        let mut settings = Settings::default();
        settings.health.silent_watch_timeout = Duration::from_millis(50);
        settings.watching.inactivity_timeout = Duration::from_millis(50);
        settings.health.heartbeat_interval = Duration::from_millis(50);
        let state = HealthState::new(&settings, board.clone(), tokio::runtime::Handle::current());
        let metrics = Arc::new(Metrics::new().unwrap());
        let server = HealthServer::start(
            "127.0.0.1:0".parse().unwrap(),
            "/live",
            state.clone(),
            metrics.clone(),
        )
        .unwrap();
        (server, state, metrics)
    }

    /// A response: status, headers (lowercase names), body.
    #[derive(Debug)]
    struct Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    async fn request(addr: SocketAddr, method: &str, target: &str) -> Answer {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!("{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .map(|line| {
                let (name, value) = line.split_once(':').unwrap();
                (name.to_ascii_lowercase(), value.trim().to_string())
            })
            .collect();
        Answer {
            status,
            headers,
            body: body.to_string(),
        }
    }

    async fn get(addr: SocketAddr, target: &str) -> Answer {
        request(addr, "GET", target).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_healthy_operator_answers_with_kopfs_probe_json_at_both_liveness_paths() {
        let (server, state, _) = server(&WatchBoard::new());
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let ctx = ActivityCtx {
            memo: Memo::default(),
            client: kube::Client::try_from(config).unwrap(),
        };
        let probe = Probe {
            id: "db".to_string(),
            func: Arc::new(|_| async { Ok(json!({"up": true})) }.boxed()),
        };
        state.set_probes(vec![probe], ctx);
        for path in ["/healthz", "/live", "/live/"] {
            let answer = get(server.local_addr(), path).await;
            assert_eq!(answer.status, 200, "{path}: {answer:?}");
            assert_eq!(answer.header("content-type"), Some("application/json"));
            let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
            assert_eq!(body, json!({"db": {"up": true}}));
        }
        let verbose = get(server.local_addr(), "/healthz?verbose").await;
        assert_eq!(verbose.status, 200);
        assert_eq!(verbose.header("content-type"), Some(TEXT));
        assert_eq!(
            verbose.body,
            "[+]watches ok\n[+]actors ok\n[+]executor ok\n[+]probes ok\nhealthz check passed\n"
        );
        let one = get(server.local_addr(), "/healthz/watches").await;
        assert_eq!((one.status, one.body.as_str()), (200, "ok"));
        let one = get(server.local_addr(), "/live/probes").await;
        assert_eq!((one.status, one.body.as_str()), (200, "ok"));
        server.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deaf_operator_fails_liveness_naming_the_silent_stream() {
        let board = WatchBoard::new();
        let (server, _state, _) = server(&board);
        let _entry = board.register(
            "widgets.v1.example.com in default",
            Arc::new(WatchStatus::new()),
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
        let addr = server.local_addr();

        let answer = get(addr, "/healthz").await;
        assert_eq!(answer.status, 500);
        assert_eq!(answer.header("content-type"), Some(TEXT));
        let lines: Vec<&str> = answer.body.lines().collect();
        assert_eq!(lines.len(), 5, "{}", answer.body);
        assert!(lines[0].starts_with(
            "[-]watches failed: widgets.v1.example.com in default: no event, bookmark or answer for "
        ));
        assert_eq!(
            lines[1..],
            [
                "[+]actors ok",
                "[+]executor ok",
                "[+]probes ok",
                "healthz check failed"
            ]
        );

        let one = get(addr, "/healthz/watches").await;
        assert_eq!(one.status, 500);
        assert!(one
            .body
            .starts_with("[-]watches failed: widgets.v1.example.com in default:"));
        let one = get(addr, "/healthz/actors").await;
        assert_eq!((one.status, one.body.as_str()), (200, "ok"));

        let excluded = get(addr, "/healthz?exclude=watches").await;
        assert_eq!(excluded.status, 200, "{}", excluded.body);
        assert_eq!(excluded.body, "{}");
        let excluded = get(addr, "/healthz?verbose&exclude=watches&exclude=probes").await;
        assert_eq!(
            excluded.body,
            "[+]watches excluded: ok\n[+]actors ok\n[+]executor ok\n[+]probes excluded: ok\n\
             healthz check passed\n"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readiness_turns_ok_after_startup_and_listing() {
        let board = WatchBoard::new();
        let (server, state, _) = server(&board);
        let addr = server.local_addr();
        let status = Arc::new(WatchStatus::new());
        let _entry = board.register("widgets.v1.example.com", status.clone());

        let answer = get(addr, "/readyz").await;
        assert_eq!(answer.status, 500);
        assert_eq!(
            answer.body,
            "[-]startup failed: the startup activities have not finished yet, or watching has not begun\n\
             [-]listing failed: not listed yet: widgets.v1.example.com\nreadyz check failed\n"
        );
        state.startup_done();
        let one = get(addr, "/readyz/startup").await;
        assert_eq!((one.status, one.body.as_str()), (200, "ok"));
        let one = get(addr, "/readyz/listing").await;
        assert_eq!(one.status, 500);
        assert_eq!(
            one.body,
            "[-]listing failed: not listed yet: widgets.v1.example.com\n"
        );
        let excluded = get(addr, "/readyz?exclude=listing").await;
        assert_eq!((excluded.status, excluded.body.as_str()), (200, "ok"));
        status.set_paused(true);
        let answer = get(addr, "/readyz").await;
        assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));
        let verbose = get(addr, "/readyz?verbose").await;
        assert_eq!(
            verbose.body,
            "[+]startup ok\n[+]listing ok\nreadyz check passed\n"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_are_served_in_the_text_format() {
        let (server, _, metrics) = server(&WatchBoard::new());
        metrics.events_received("widgets.v1.example.com", 3);
        metrics.api_request("list", None, Duration::from_millis(5));
        let answer = get(server.local_addr(), "/metrics").await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("content-type"), Some(METRICS));
        let mut samples = 0;
        for line in answer.body.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').expect("name{labels} value");
            value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("a value: {line}"));
            let name = series.split('{').next().unwrap();
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "a metric name: {line}"
            );
            if let Some(labels) = series.strip_prefix(name) {
                assert!(
                    labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                    "{line}"
                );
            }
            samples += 1;
        }
        assert!(samples > 10);
        assert!(answer
            .body
            .contains("kactor_events_received_total{resource=\"widgets.v1.example.com\"} 3\n"));
        assert!(answer
            .body
            .contains("kactor_api_requests_total{code=\"<error>\",verb=\"list\"} 1\n"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_renderings_are_reused_within_the_cache_period() {
        let board = WatchBoard::new();
        let mut settings = Settings::default();
        settings.health.metrics_cache = Duration::from_secs(3600);
        let state = HealthState::new(&settings, board, tokio::runtime::Handle::current());
        let metrics = Arc::new(Metrics::new().unwrap());
        let server = HealthServer::start(
            "127.0.0.1:0".parse().unwrap(),
            "/healthz",
            state,
            metrics.clone(),
        )
        .unwrap();
        metrics.paused(true);
        let first = get(server.local_addr(), "/metrics").await;
        assert!(first.body.contains("kactor_operator_paused 1\n"));
        metrics.paused(false);
        let second = get(server.local_addr(), "/metrics").await;
        assert!(
            second.body.contains("kactor_operator_paused 1\n"),
            "the cached rendering"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unknown_paths_and_checks_are_404_and_other_methods_405() {
        let (server, _, _) = server(&WatchBoard::new());
        let addr = server.local_addr();
        for path in [
            "/",
            "/nope",
            "/healthz/nope",
            "/readyz/watches",
            "/healthzz",
            "/metrics/x",
        ] {
            assert_eq!(get(addr, path).await.status, 404, "{path}");
        }
        let post = request(addr, "POST", "/healthz").await;
        assert_eq!(post.status, 405);
        assert_eq!(post.header("allow"), Some("GET, HEAD"));
        assert_eq!(request(addr, "DELETE", "/metrics").await.status, 405);
        let head = request(addr, "HEAD", "/readyz").await;
        assert_eq!(head.status, 500);
        assert_eq!(head.body, "", "no body for HEAD");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keep_alive_connections_serve_many_requests() {
        let (server, _, _) = server(&WatchBoard::new());
        let mut stream = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .unwrap();
        let mut buffer = vec![0; 4096];
        for _ in 0..20 {
            stream
                .write_all(b"GET /readyz/listing HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut raw = Vec::new();
            while !raw.ends_with(b"\r\n\r\nok") {
                let read = stream.read(&mut buffer).await.unwrap();
                assert!(read > 0, "the connection stays open");
                raw.extend_from_slice(&buffer[..read]);
            }
            assert!(raw.starts_with(b"HTTP/1.1 200 OK\r\n"));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_port_in_use_is_an_error_at_start_and_stopping_frees_it() {
        let (server, state, metrics) = server(&WatchBoard::new());
        let addr = server.local_addr();
        let error = HealthServer::start(addr, "/healthz", state.clone(), metrics.clone())
            .expect_err("the port is taken");
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
        server.stop();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "closed"
        );
        let again = HealthServer::start(addr, "/healthz", state, metrics).unwrap();
        assert_eq!(get(again.local_addr(), "/healthz").await.status, 200);
    }

    #[tokio::test]
    async fn the_server_samples_the_operators_runtime_and_reports_a_blocked_worker() {
        let operator = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut settings = Settings::default();
        settings.health.heartbeat_interval = Duration::from_millis(100);
        settings.health.heartbeat_timeout = Duration::from_millis(500);
        let state = HealthState::new(&settings, WatchBoard::new(), operator.handle().clone());
        let metrics = Arc::new(Metrics::new().unwrap());
        let server =
            HealthServer::start("127.0.0.1:0".parse().unwrap(), "/healthz", state, metrics)
                .unwrap();
        let addr = server.local_addr();
        assert_eq!(get(addr, "/healthz/executor").await.status, 200);
        operator.spawn(async { std::thread::sleep(Duration::from_secs(3)) });
        let failed = answer_until(addr, "/healthz/executor", |a| a.status == 500).await;
        assert!(
            failed
                .body
                .starts_with("[-]executor failed: runtime worker thread "),
            "{}",
            failed.body
        );
        assert!(failed
            .body
            .contains(" of 2 has been stuck in one poll for "));
        answer_until(addr, "/healthz/executor", |a| a.status == 200).await;
        drop(server);
        operator.shutdown_background();
    }

    /// Asks until the answer is as wanted, or panics after 20 s.
    async fn answer_until(
        addr: SocketAddr,
        target: &str,
        wanted: impl Fn(&Answer) -> bool,
    ) -> Answer {
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = get(addr, target).await;
            if wanted(&answer) {
                return answer;
            }
            assert!(
                Instant::now() < give_up,
                "{target} still answers {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[test]
    fn paths_lead_to_their_routes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let routes = |liveness: &str| Routes {
            liveness_path: normalise(liveness),
            state: HealthState::new(
                &Settings::default(),
                WatchBoard::new(),
                runtime.handle().clone(),
            ),
            metrics: Arc::new(Metrics::with_registry(prometheus::Registry::new()).unwrap()),
            rendering: Mutex::new(None),
        };
        let custom = routes("probe/live/");
        assert_eq!(custom.liveness_path, "/probe/live");
        assert_eq!(custom.route("/probe/live"), Route::Liveness(None));
        assert_eq!(custom.route("/probe/live/db"), Route::Liveness(Some("db")));
        assert_eq!(custom.route("/probe/lived"), Route::NotFound);
        assert_eq!(custom.route("/healthz"), Route::Liveness(None));
        assert_eq!(custom.route("/healthz/"), Route::Liveness(None));
        assert_eq!(
            custom.route("/readyz/startup"),
            Route::Readiness(Some("startup"))
        );
        assert_eq!(custom.route("/metrics"), Route::Metrics);
        let root = routes("/");
        assert_eq!(root.route("/"), Route::Liveness(None));
        assert_eq!(root.route("/x"), Route::NotFound);
    }
}
