//! A real kube-apiserver with etcd, built from Go modules on first use and cached per machine.
//!
//! The Go program (`apiserver/main.go` beside this crate, embedded here) runs an embedded etcd,
//! kube-apiserver and the garbage-collector, namespace, service-account and PVC/PV-protection controllers of
//! kube-controller-manager, all on 127.0.0.1. It is built once per machine and version into the
//! user's cache directory (`$XDG_CACHE_HOME/kactor` or `~/.cache/kactor`; `KACTOR_CACHE_DIR`
//! overrides it), so a fresh clone of a project does not pay for it again; `KACTOR_APISERVER_BIN`
//! names a binary built elsewhere.
//!
//! **Expected flow**: [`ApiServer::start`] finds or builds the binary, runs it with its standard
//! input on a pipe, waits for its `ready` line (about 3 s), and loads the kubeconfig it wrote.
//! [`ApiServer::shutdown`] (or dropping the handle) closes that pipe: the server stops, and removes its
//! state directory, within about a second.
//!
//! **Guarantees**: a test process that dies, even by SIGKILL, closes the pipe too, so no server
//! outlives its test process. Concurrent first uses build once (a file lock).
//!
//! **Caveats**: the first build takes 5 to 10 minutes on 2 cores and about 3.5 GB of memory; it needs
//! `go` (1.26 or newer) and the Go module proxy. Each server costs about 300 MB of memory.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use blake2::{Blake2s256, Digest};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::Error;

/// The Kubernetes release the server is built from.
pub const KUBERNETES_VERSION: &str = "v1.37.2";

const MAIN_GO: &str = include_str!("../apiserver/main.go");
const GO_MOD: &str = include_str!("../apiserver/go.mod");
const GO_SUM: &str = include_str!("../apiserver/go.sum");

/// How long the server may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running kube-apiserver (with etcd and the controllers), stopped when dropped.
pub struct ApiServer {
    url: String,
    kubeconfig_path: PathBuf,
    kubeconfig: kube::config::Kubeconfig,
    config: kube::Config,
    client: kube::Client,
    child: Child,
    /// Closing it stops the server.
    stdin: Option<ChildStdin>,
    log: PathBuf,
}

impl ApiServer {
    /// Starts a server; with `rbac`, requests are authorized by RBAC (the admin is in
    /// `system:masters`), otherwise every authenticated request is allowed.
    pub async fn start(rbac: bool) -> Result<ApiServer, Error> {
        let binary = binary().await?;
        // Two servers starting at once may pick the same free port; a retry picks another.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(&binary, rbac).await {
                Err(Error::ApiServer { log, .. }) if attempt < 3 && port_taken(&log) => continue,
                result => return result,
            }
        }
    }

    async fn start_once(binary: &Path, rbac: bool) -> Result<ApiServer, Error> {
        let log = log_path();
        let log_file = File::create(&log).map_err(|e| Error::io("creating the server's log", e))?;
        let mut command = Command::new(binary);
        command
            .arg("-exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(false);
        if rbac {
            command.arg("-rbac");
        }
        let mut child = command
            .spawn()
            .map_err(|e| Error::io(format!("running {}", binary.display()), e))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let failed = |message: String| Error::ApiServer {
            message,
            log: log.clone(),
        };

        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(READY_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("kactor-apiserver: ready at ") {
                    return Ok(Some(rest.to_string()));
                }
            }
            Ok::<_, io::Error>(None)
        })
        .await;
        let (url, kubeconfig_path) = match ready {
            Ok(Ok(Some(rest))) => match rest.split_once(" kubeconfig ") {
                Some((url, path)) => (url.to_string(), PathBuf::from(path)),
                None => return Err(failed(format!("unexpected ready line: {rest}"))),
            },
            Ok(Ok(None)) => {
                let status = child.wait().await.ok();
                return Err(failed(format!(
                    "exited before it was ready ({})",
                    status.map_or("unknown status".into(), |s| s.to_string())
                )));
            }
            Ok(Err(e)) => return Err(failed(format!("reading its output: {e}"))),
            Err(_) => {
                let _ = child.start_kill();
                return Err(failed(format!(
                    "not ready within {} s",
                    READY_TIMEOUT.as_secs()
                )));
            }
        };
        // Nothing more is printed on stdout; drain it so the pipe never fills.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig_path)
            .map_err(|e| failed(format!("reading its kubeconfig: {e}")))?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig.clone(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| failed(format!("loading its kubeconfig: {e}")))?;
        let client = kube::Client::try_from(config.clone())?;
        Ok(ApiServer {
            url,
            kubeconfig_path,
            kubeconfig,
            config,
            client,
            child,
            stdin,
            log,
        })
    }

    /// The base URL, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client for it, as its administrator (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The administrator's client configuration.
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// The administrator's kubeconfig.
    pub fn kubeconfig(&self) -> &kube::config::Kubeconfig {
        &self.kubeconfig
    }

    /// Where the server wrote the administrator's kubeconfig (removed when the server stops).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// Copies the administrator's kubeconfig to `path`, for other programs.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        std::fs::copy(&self.kubeconfig_path, path)
            .map(drop)
            .map_err(|e| Error::io(format!("writing the kubeconfig to {}", path.display()), e))
    }

    /// The components' log (etcd, kube-apiserver, kube-controller-manager), removed with the server.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Stops the server and waits until it has exited (10 s at most, then it is killed).
    pub async fn shutdown(mut self) {
        self.stdin.take();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url)
            .field("kubeconfig", &self.kubeconfig_path)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // Closing its standard input stops it; it removes its own state directory. The log goes now
        // (the server writes on into the unlinked file until it exits).
        self.stdin.take();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn log_path() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "kactor-apiserver-{}-{}.log",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn port_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("address already in use"))
}

/// The last `lines` lines of a log, for error messages.
pub(crate) fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The server's binary: `KACTOR_APISERVER_BIN`, or the cached build, built now if missing.
pub async fn binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("KACTOR_APISERVER_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Build(format!(
                "KACTOR_APISERVER_BIN={} is not a file",
                path.display()
            )))
        };
    }
    tokio::task::spawn_blocking(build)
        .await
        .map_err(|e| Error::Build(format!("the build task failed: {e}")))?
}

/// Where the binary of these sources lives: the cache directory, the version and a hash of the Go
/// sources (a change of them builds anew).
pub fn cached_binary_path() -> Result<PathBuf, Error> {
    let mut hasher = Blake2s256::new();
    for part in [MAIN_GO, GO_MOD, GO_SUM] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let hash: String = hasher.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(cache_dir()?
        .join("apiserver")
        .join(format!("{KUBERNETES_VERSION}-{hash}"))
        .join("kactor-apiserver"))
}

fn cache_dir() -> Result<PathBuf, Error> {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("KACTOR_CACHE_DIR") {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(dir.join("kactor"));
    }
    match var("HOME") {
        Some(home) => Ok(home.join(".cache").join("kactor")),
        None => Err(Error::Build(
            "no cache directory: set HOME, XDG_CACHE_HOME or KACTOR_CACHE_DIR".into(),
        )),
    }
}

/// Builds the binary unless it is cached; one build at a time per machine (a lock file).
fn build() -> Result<PathBuf, Error> {
    let binary = cached_binary_path()?;
    if binary.is_file() {
        return Ok(binary);
    }
    let dir = binary.parent().expect("the binary's path has a directory");
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let lock = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join("build.lock"))
        .map_err(|e| Error::io("opening the build lock", e))?;
    lock.lock()
        .map_err(|e| Error::io("taking the build lock", e))?;
    if binary.is_file() {
        return Ok(binary); // another process built it while this one waited
    }
    let go = std::env::var_os("GO").unwrap_or_else(|| "go".into());
    let src = dir.join("src");
    std::fs::create_dir_all(&src).map_err(|e| Error::io("creating the source directory", e))?;
    for (name, text) in [("main.go", MAIN_GO), ("go.mod", GO_MOD), ("go.sum", GO_SUM)] {
        std::fs::write(src.join(name), text)
            .map_err(|e| Error::io(format!("writing {name}"), e))?;
    }
    eprintln!(
        "kactor-testenv: building kube-apiserver {KUBERNETES_VERSION} with etcd into {} \
         (once per machine: 5-10 minutes on 2 cores, about 3.5 GB of memory)",
        dir.display()
    );
    let mut ldflags = String::from("-s -w");
    let minor = KUBERNETES_VERSION.split('.').nth(1).unwrap_or_default();
    for package in [
        "k8s.io/client-go/pkg/version",
        "k8s.io/component-base/version",
    ] {
        for (key, value) in [
            ("gitVersion", KUBERNETES_VERSION),
            ("gitMajor", "1"),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            ldflags.push_str(&format!(" -X {package}.{key}={value}"));
        }
    }
    let partial = dir.join("kactor-apiserver.partial");
    let started = std::time::Instant::now();
    let mut command = std::process::Command::new(&go);
    command
        .args(["build", "-trimpath", "-ldflags", &ldflags, "-o"])
        .arg(&partial)
        .arg(".")
        .current_dir(&src)
        .stdin(Stdio::null());
    let scratch = GoScratch::set(&mut command, dir);
    let status = command.status().map_err(|e| {
        Error::Build(format!(
            "cannot run `{}`: {e}; the real API server is built from Go modules: install Go 1.26 \
                 or newer, or set KACTOR_APISERVER_BIN to a built kactor-apiserver",
            go.to_string_lossy()
        ))
    })?;
    if !status.success() {
        return Err(Error::Build(format!(
            "`go build` failed ({status}) in {}",
            src.display()
        )));
    }
    std::fs::rename(&partial, &binary).map_err(|e| Error::io("installing the binary", e))?;
    eprintln!(
        "kactor-testenv: built {} in {} s",
        binary.display(),
        started.elapsed().as_secs()
    );
    scratch.remove();
    Ok(binary)
}

/// The Go build and module caches of the one build, private to it unless `GOCACHE` or `GOMODCACHE`
/// is set, and removed once the binary is built: they hold several GB that nothing reads again
/// (the binary is what is cached), and a CI machine's disk is not large. A failed build keeps them
/// for the next try.
struct GoScratch {
    dirs: Vec<PathBuf>,
}

impl GoScratch {
    fn set(command: &mut std::process::Command, dir: &Path) -> GoScratch {
        let mut dirs = Vec::new();
        for (var, name) in [("GOCACHE", "go-build"), ("GOMODCACHE", "go-mod")] {
            if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
                let path = dir.join(name);
                command.env(var, &path);
                dirs.push(path);
            }
        }
        if !dirs.is_empty() {
            // The module cache is read-only unless asked otherwise, which a plain removal cannot undo.
            let mut flags = std::env::var("GOFLAGS").unwrap_or_default();
            if !flags.split_whitespace().any(|f| f == "-modcacherw") {
                flags = format!("{flags} -modcacherw").trim().to_owned();
            }
            command.env("GOFLAGS", flags);
        }
        GoScratch { dirs }
    }

    fn remove(self) {
        for dir in self.dirs {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                eprintln!("kactor-testenv: could not remove {}: {e}", dir.display());
            }
        }
    }
}
