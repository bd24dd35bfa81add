//! Helpers for the tests that run third-party tools (kubectl, Python clients, Kopf) against the emulator:
//! finding the tools, a scratch directory per test, subprocesses with time limits, and polling.
//!
//! Every wait here is bounded, so that a broken cluster fails a test instead of hanging it.

use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The environment variable that turns a missing tool from a skip into a failure (set by `scripts/test`).
pub const REQUIRE: &str = "KACTOR_REQUIRE_THIRD_PARTY";

/// Proxy settings a developer's shell may have, which must not route loopback traffic elsewhere.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// A file of this crate's `tests/` directory.
pub fn test_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(relative)
}

/// What a missing tool means for a test: `None` to skip it (with a line on stderr saying so), or a
/// panic when [`REQUIRE`] is `1`.
fn unavailable(test: &str, what: &str, detail: &str) -> Option<String> {
    if std::env::var(REQUIRE).as_deref() == Ok("1") {
        panic!(
            "{test}: {what} is not installed ({detail}), and {REQUIRE}=1 requires it: \
             run scripts/test, which installs it"
        );
    }
    // Straight to the process's stderr, past the test harness's capture, so a skip is always seen.
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {test}: {what} not installed ({detail}); run scripts/test"
    );
    None
}

/// The program an environment variable names, or a default: a name looked up on `PATH`, or a path.
/// A relative path is taken from the test's working directory (the crate's), and made absolute, as
/// the tools run in a scratch directory.
fn program(variable: &str, default: &str) -> String {
    let program = std::env::var(variable)
        .ok()
        .filter(|p| !p.trim().is_empty())
        .unwrap_or_else(|| default.to_string());
    if program.contains('/') {
        if let Ok(absolute) = std::path::absolute(&program) {
            return absolute.to_string_lossy().into_owned();
        }
    }
    program
}

/// Whether `program args` runs and exits 0 within a minute; `Err` tells why not.
async fn probe(program: &str, args: &[&str]) -> Result<(), String> {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command
        .spawn()
        .map_err(|e| format!("`{program}` cannot be run: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await {
        Ok(Ok(output)) if output.status.success() => Ok(()),
        Ok(Ok(output)) => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
            Err(format!(
                "`{program} {}` failed: {}",
                args.join(" "),
                last.trim()
            ))
        }
        Ok(Err(e)) => Err(format!("`{program}` failed to run: {e}")),
        Err(_) => Err(format!("`{program} {}` took over 60 s", args.join(" "))),
    }
}

/// The kubectl to use (env `KUBECTL`, default `kubectl`), or `None` when the test is to be skipped.
pub async fn kubectl(test: &str) -> Option<String> {
    let kubectl = program("KUBECTL", "kubectl");
    match probe(&kubectl, &["version", "--client"]).await {
        Ok(()) => Some(kubectl),
        Err(detail) => unavailable(test, "kubectl", &detail),
    }
}

/// The Python to use (env `KACTOR_PYTHON`, default `python3`) if it can import all of `modules`,
/// or `None` when the test is to be skipped.
pub async fn python(test: &str, modules: &[&str]) -> Option<String> {
    let python = program("KACTOR_PYTHON", "python3");
    let import = format!("import {}", modules.join(", "));
    match probe(&python, &["-c", &import]).await {
        Ok(()) => Some(python),
        Err(detail) => unavailable(
            test,
            &format!("Python with {}", modules.join(" and ")),
            &detail,
        ),
    }
}

/// A scratch directory of one test, under the system's temporary directory, removed when dropped.
/// It holds the cluster's kubeconfig and is the tools' `HOME`, so nothing is cached across tests.
pub struct Workdir {
    path: PathBuf,
    kubeconfig: PathBuf,
}

impl Workdir {
    /// A new, empty directory for `test`, with the cluster's kubeconfig written into it.
    pub fn new(test: &str, cluster: &kactor_testenv::TestCluster) -> Workdir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "kactor-third-party-{}-{}-{}",
            test,
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        let kubeconfig = path.join("kubeconfig");
        cluster
            .write_kubeconfig(&kubeconfig)
            .expect("the kubeconfig is written");
        Workdir { path, kubeconfig }
    }

    /// A command for `program` pointed at the cluster: `KUBECONFIG` is its kubeconfig, `HOME` this
    /// directory, no proxies, unbuffered Python that writes no bytecode next to the test scripts.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.path)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(&self.path)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for variable in PROXY_VARIABLES {
            command.env_remove(variable);
        }
        command
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Runs a command to its end, at most `limit`; panics (naming it) if it takes longer.
pub async fn run(command: &mut Command, limit: Duration) -> Output {
    let description = describe(command);
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{description}`: {e}"));
    // On a time-out the child is dropped, and `kill_on_drop` ends it.
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("`{description}` failed to run: {e}")),
        Err(_) => panic!("`{description}` did not finish within {limit:?}"),
    }
}

/// Runs a command that must succeed within `limit`, and returns its stdout.
pub async fn run_ok(command: &mut Command, limit: Duration) -> String {
    let description = describe(command);
    let output = run(command, limit).await;
    assert!(
        output.status.success(),
        "`{description}` failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn describe(command: &Command) -> String {
    let command = command.as_std();
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A process running in the background while a test goes on, its output collected as it comes.
/// Dropping it kills the process; if the test is failing, its output is printed first.
pub struct Background {
    name: String,
    /// Set once the process has exited.
    status: Arc<Mutex<Option<ExitStatus>>>,
    /// Dropping or sending kills the process.
    kill: Option<oneshot::Sender<()>>,
    /// Owns the child: waits for it, or kills it when told.
    waiter: Option<JoinHandle<()>>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl Background {
    /// Starts `command`; `name` labels its output in failure messages.
    pub fn spawn(name: &str, command: &mut Command) -> Background {
        let description = describe(command);
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} (`{description}`): {e}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take(), stdout.clone()),
            collect(child.stderr.take(), stderr.clone()),
        ];
        let status = Arc::new(Mutex::new(None));
        let (kill, killed) = oneshot::channel::<()>();
        let waiter = tokio::spawn(wait_or_kill(child, killed, status.clone()));
        Background {
            name: name.to_string(),
            status,
            kill: Some(kill),
            waiter: Some(waiter),
            stdout,
            stderr,
            readers,
        }
    }

    /// Its standard output so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Everything it printed so far, for a failure message.
    pub fn report(&self) -> String {
        format!(
            "--- {name} stdout ---\n{}\n--- {name} stderr ---\n{}\n--- end of {name} ---",
            self.stdout(),
            self.stderr.lock().unwrap(),
            name = self.name
        )
    }

    /// Panics, with its output, if it has exited.
    pub fn assert_running(&self) {
        if let Some(status) = *self.status.lock().unwrap() {
            panic!(
                "{} exited unexpectedly ({status}):\n{}",
                self.name,
                self.report()
            );
        }
    }

    /// Waits for it to exit by itself, at most `limit` (then panics), with all its output collected.
    pub async fn wait(&mut self, limit: Duration) -> ExitStatus {
        if let Some(waiter) = self.waiter.as_mut() {
            if tokio::time::timeout(limit, waiter).await.is_err() {
                panic!(
                    "{} did not exit within {limit:?}:\n{}",
                    self.name,
                    self.report()
                );
            }
            self.waiter = None;
        }
        self.drain().await;
        self.status.lock().unwrap().expect("the process has exited")
    }

    /// Kills it (if still running) and waits for it to go, with all its output collected.
    pub async fn kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(waiter) = self.waiter.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), waiter).await;
        }
        self.drain().await;
    }

    async fn drain(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(10), reader).await;
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.report());
        }
        // Dropping the sender tells the waiter to kill the process.
        self.kill.take();
    }
}

async fn wait_or_kill(
    mut child: Child,
    killed: oneshot::Receiver<()>,
    status: Arc<Mutex<Option<ExitStatus>>>,
) {
    let exit = tokio::select! {
        exit = child.wait() => exit,
        // Sent or dropped: either way the process is to go.
        _ = killed => {
            let _ = child.start_kill();
            child.wait().await
        }
    };
    if let Ok(exit) = exit {
        *status.lock().unwrap() = Some(exit);
    }
}

fn collect(
    pipe: Option<impl tokio::io::AsyncRead + Unpin + Send + 'static>,
    into: Arc<Mutex<String>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let Some(mut pipe) = pipe else { return };
        let mut buffer = vec![0u8; 8192];
        let mut pending = Vec::new();
        loop {
            match pipe.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    pending.extend_from_slice(&buffer[..n]);
                    // Keep an incomplete UTF-8 sequence for the next read.
                    let valid = match std::str::from_utf8(&pending) {
                        Ok(text) => text.len(),
                        Err(e) if e.error_len().is_none() => e.valid_up_to(),
                        Err(_) => pending.len(),
                    };
                    let text = String::from_utf8_lossy(&pending[..valid]).into_owned();
                    into.lock().unwrap().push_str(&text);
                    pending.drain(..valid);
                }
            }
        }
        into.lock()
            .unwrap()
            .push_str(&String::from_utf8_lossy(&pending));
    })
}

/// Polls `check` every 100 ms until it gives `Some`, at most `limit`; then panics naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
