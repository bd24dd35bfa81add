//! An in-memory Kubernetes API server, for tests, benchmarks and demos of kactor operators.
//!
//! It is a real HTTP/1.1 server speaking the Kubernetes REST API on a loopback port, with the semantics
//! operators rely on: resourceVersions, generation, the status subresource, finalizers and
//! `deletionTimestamp`, owner-reference garbage collection, watches with bookmarks and 410 Gone,
//! metadata-only lists and watches (`PartialObjectMetadata`, as `Accept` asks), server-side `Table`s,
//! label and field selectors, merge and JSON patches, conflicts, discovery, OpenAPI, and CRDs that
//! serve their kinds at once. `kubectl`, the Python client and Kopf work against it unchanged.
//!
//! It is not a cluster: no controllers run (a Deployment makes no pods), there is no admission beyond
//! validation, and strategic merge patch behaves as a merge patch. Every request is allowed, unless
//! the emulator runs in RBAC mode ([`EmulatorBuilder::rbac`]): then requests are authorized by the
//! Roles, ClusterRoles and bindings stored in it, as a cluster does, so that tests catch the
//! permissions an operator lacks ([`Emulator::client_as_service_account`]).
//!
//! Start with [`Emulator::start`]; [`Faults`] injects failures; `store.rs` holds the write rules,
//! `rbac.rs` the authorizer.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use kactor_emulator::Emulator;
//! let emulator = Emulator::start().await?;
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::default_namespaced(emulator.client());
//! assert!(pods.list(&Default::default()).await?.items.is_empty());
//! # Ok(()) }
//! ```

mod auth;
mod faults;
mod kinds;
mod openapi;
mod openapi_builtin;
mod openapi_proto;
mod patch;
mod protobuf;
mod rbac;
mod registry;
pub mod samples;
mod schema;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod tls;
mod validation;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use auth::{service_account_token, ADMIN_TOKEN};
pub use faults::{Failure, Faults, Matcher};
pub use server::KUBERNETES_VERSION;
pub use status::{ApiError, Cause};

/// Why the emulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The TLS certificate or configuration could not be made ([`EmulatorBuilder::tls`]).
    #[error("cannot set up TLS for the emulator: {0}")]
    Tls(String),
    /// The port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The client for the emulator could not be built.
    #[error("cannot build a Kubernetes client for the emulator: {0}")]
    Client(#[from] kube::Error),
    /// A saved state is not one ([`Emulator::restore`], [`Emulator::load_state`]).
    #[error("cannot restore the emulator's state: {0}")]
    State(String),
    /// A state file could not be read or written.
    #[error("cannot read or write the emulator's state file {path}: {source}")]
    StateFile {
        /// Where.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The kubeconfig could not be written.
    #[error("cannot write the kubeconfig to {path}: {source}")]
    Kubeconfig {
        /// Where.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The emulator's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to listen; port 0 picks a free one. Default `127.0.0.1:0`.
    pub addr: SocketAddr,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK. Default 10 s (the API server
    /// sends one about every minute; operators only need one within their inactivity timeout).
    pub bookmark_interval: Duration,
    /// How many events each kind keeps for watches and paginated lists; older positions get 410 Gone.
    /// Default 10 000.
    pub history_limit: usize,
    /// The largest request body accepted; default 3 MiB, as the API server's limit.
    pub max_body_bytes: usize,
    /// Authorize every request by the RBAC objects stored in the emulator (see
    /// [`EmulatorBuilder::rbac`]). Default false: every request is allowed.
    pub rbac: bool,
    /// Serve HTTPS with a self-signed certificate (see [`EmulatorBuilder::tls`]). Default false.
    pub tls: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            bookmark_interval: Duration::from_secs(10),
            history_limit: 10_000,
            max_body_bytes: 3 * 1024 * 1024,
            rbac: false,
            tls: false,
        }
    }
}

impl Settings {
    pub(crate) fn address(&self) -> String {
        self.addr.to_string()
    }
}

/// Builds an emulator with other than the default settings.
#[derive(Debug, Clone, Default)]
pub struct EmulatorBuilder {
    settings: Settings,
}

impl EmulatorBuilder {
    /// Listen on this port of 127.0.0.1 (0: any free one).
    pub fn port(mut self, port: u16) -> Self {
        self.settings.addr.set_port(port);
        self
    }

    /// Listen on this address.
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.settings.addr = addr;
        self
    }

    /// Send watch bookmarks this often.
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.settings.bookmark_interval = interval;
        self
    }

    /// Keep this many events per kind.
    pub fn history_limit(mut self, events: usize) -> Self {
        self.settings.history_limit = events;
        self
    }

    /// Authorizes requests as a cluster's RBAC authorizer does (default: off, every request is
    /// allowed).
    ///
    /// In RBAC mode, the administrator's requests ([`Emulator::client`], the written kubeconfig: the
    /// token [`ADMIN_TOKEN`], a member of `system:masters`) are allowed everything; a service
    /// account's ([`Emulator::client_as_service_account`]) are allowed what the Roles, ClusterRoles,
    /// RoleBindings and ClusterRoleBindings stored in the emulator grant it, and denied with the API
    /// server's 403 `Forbidden` otherwise; requests without a token are anonymous, and unknown tokens
    /// get a 401. Discovery (`/api`, `/apis`), `/openapi`, `/version` and the health paths are open to
    /// everyone.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use kactor_emulator::Emulator;
    /// let emulator = Emulator::builder().rbac(true).start().await?;
    /// // Create the ServiceAccount and its RBAC as the administrator (emulator.client()), then:
    /// let operator = emulator.client_as_service_account("ops", "my-operator")?;
    /// # Ok(()) }
    /// ```
    pub fn rbac(mut self, enabled: bool) -> Self {
        self.settings.rbac = enabled;
        self
    }

    /// Serves HTTPS instead of HTTP (default: off), with a self-signed certificate for 127.0.0.1
    /// and `localhost` made at start. [`Emulator::client`], [`Emulator::config`] and the kubeconfig
    /// trust it. kubectl sends a kubeconfig's bearer token only over TLS: with the RBAC mode, this
    /// is what lets kubectl act as the administrator or, with `--token`, as a service account.
    pub fn tls(mut self, enabled: bool) -> Self {
        self.settings.tls = enabled;
        self
    }

    /// Starts serving.
    pub async fn start(self) -> Result<Emulator, Error> {
        Emulator::with_settings(self.settings).await
    }
}

/// A running emulator. Dropping it stops the server and ends every connection.
pub struct Emulator {
    shared: Arc<server::Shared>,
    addr: SocketAddr,
    url: String,
    tls: Option<Arc<tls::Tls>>,
    client: kube::Client,
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Emulator {
    /// Starts an emulator with the default settings on a free loopback port.
    pub async fn start() -> Result<Emulator, Error> {
        Self::with_settings(Settings::default()).await
    }

    /// A builder for other settings.
    pub fn builder() -> EmulatorBuilder {
        EmulatorBuilder::default()
    }

    /// Starts an emulator with these settings.
    pub async fn with_settings(settings: Settings) -> Result<Emulator, Error> {
        let listener = TcpListener::bind(settings.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: settings.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: settings.addr,
            source,
        })?;
        let tls = match settings.tls {
            true => Some(Arc::new(tls::Tls::self_signed(addr)?)),
            false => None,
        };
        let url = format!("{}://{addr}", if tls.is_some() { "https" } else { "http" });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let state = Arc::new(Mutex::new(store::State::new(settings.history_limit)));
        let faults = Faults::new(state.clone());
        let settings = Settings { addr, ..settings };
        let shared = Arc::new(server::Shared {
            state,
            faults,
            settings,
            shutdown: shutdown_rx,
        });
        tokio::spawn(server::serve(
            listener,
            tls.as_ref().map(|t| t.acceptor.clone()),
            shared.clone(),
        ));
        let client = kube::Client::try_from(config_for(&url, tls.as_deref()))?;
        Ok(Emulator {
            shared,
            addr,
            url,
            tls,
            client,
            shutdown,
        })
    }

    /// The base URL, `http://127.0.0.1:PORT` (`https://` with [`EmulatorBuilder::tls`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for it, as its administrator (cheap to clone; default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A client for it, as its administrator, that talks to it in memory instead of over its port
    /// (default namespace `default`): for tests under tokio's paused time
    /// (`#[tokio::test(start_paused = true)]`), where waiting on a real socket lets the clock jump
    /// ahead. Every request is still a whole HTTP/1 exchange, watches included.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let emulator = kactor_emulator::Emulator::start().await?;
    /// let client = emulator.in_process_client();
    /// let version = client.apiserver_version().await?;
    /// assert!(!version.git_version.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn in_process_client(&self) -> kube::Client {
        kube::Client::new(server::InProcess(self.shared.clone()), "default")
    }

    /// A client configuration for it, as its administrator, to build clients with other settings
    /// (kube's default client retries 429, 503 and 504 answers by itself; set `default_retry = false`
    /// to see them).
    pub fn config(&self) -> kube::Config {
        config_for(&self.url, self.tls.as_deref())
    }

    /// The PEM of the certificate it serves with [`EmulatorBuilder::tls`] (its own CA).
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// A client that sends the token of the service account `namespace/name`
    /// (`system:serviceaccount:<namespace>:<name>`), with `namespace` as its default namespace, as a
    /// pod running as that service account has. In RBAC mode ([`EmulatorBuilder::rbac`]) its requests
    /// are allowed what the RBAC objects stored in the emulator grant it, and the ServiceAccount
    /// object must exist (a 401 otherwise); without RBAC mode they are allowed everything.
    pub fn client_as_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<kube::Client, Error> {
        Ok(kube::Client::try_from(
            self.config_as_service_account(namespace, name),
        )?)
    }

    /// The configuration of [`client_as_service_account`](Self::client_as_service_account).
    pub fn config_as_service_account(&self, namespace: &str, name: &str) -> kube::Config {
        let mut config = config_for(&self.url, self.tls.as_deref());
        config.default_namespace = namespace.to_string();
        config.auth_info.token = Some(service_account_token(namespace, name).into());
        config
    }

    /// The fault controls.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.state().rv()
    }

    /// How many objects are stored, of every kind.
    pub fn object_count(&self) -> usize {
        self.shared.state().object_count()
    }

    /// Everything stored, as one JSON document for [`restore`](Self::restore):
    /// `{"kind": "EmulatorState", "resourceVersion": "N", "objects": [...]}`, CRDs first.
    pub fn state(&self) -> serde_json::Value {
        let state = self.shared.state();
        serde_json::json!({
            "apiVersion": "kactor.dev/v1",
            "kind": "EmulatorState",
            "resourceVersion": state.rv().to_string(),
            "objects": state.dump(),
        })
    }

    /// Stores what [`state`](Self::state) gave, as it was (uids, timestamps, finalizers, deletion
    /// marks), beside what is stored now; objects of the same name are replaced. Returns how many
    /// objects were restored. Watchers see them as ADDED or MODIFIED.
    pub fn restore(&self, state: &serde_json::Value) -> Result<usize, Error> {
        let invalid = |reason: String| Error::State(reason);
        if state["kind"] != "EmulatorState" {
            return Err(invalid(
                "not an emulator state (kind EmulatorState)".to_string(),
            ));
        }
        let rv = state["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .ok_or_else(|| invalid("no resourceVersion".to_string()))?;
        let objects = state["objects"]
            .as_array()
            .ok_or_else(|| invalid("no objects".to_string()))?
            .clone();
        self.shared.state().restore(rv, objects).map_err(invalid)
    }

    /// Writes [`state`](Self::state) to a file, atomically: a crash mid-write leaves the previous
    /// file whole.
    pub fn save_state(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        let failed = |source: std::io::Error| Error::StateFile {
            path: path.display().to_string(),
            source,
        };
        let text = serde_json::to_vec(&self.state()).unwrap_or_default();
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        std::fs::write(&partial, text).map_err(failed)?;
        std::fs::rename(&partial, path).map_err(failed)
    }

    /// Restores the state saved in a file by [`save_state`](Self::save_state). A missing file is
    /// no state (`Ok(None)`); a file that is not one is an error, and nothing is restored.
    pub fn load_state(&self, path: impl AsRef<Path>) -> Result<Option<usize>, Error> {
        let path = path.as_ref();
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(Error::StateFile {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        let state: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| Error::State(format!("{} is not JSON: {e}", path.display())))?;
        self.restore(&state).map(Some).map_err(|error| match error {
            Error::State(reason) => Error::State(format!("{}: {reason}", path.display())),
            other => other,
        })
    }

    /// A kubeconfig for it: cluster, user and context `kactor-emulator`, namespace `default`.
    pub fn kubeconfig(&self) -> kube::config::Kubeconfig {
        let mut config = kubeconfig(&self.url);
        if let (Some(tls), Some(cluster)) = (&self.tls, config.clusters.first_mut()) {
            if let Some(cluster) = cluster.cluster.as_mut() {
                use base64::Engine as _;
                cluster.certificate_authority_data =
                    Some(base64::engine::general_purpose::STANDARD.encode(&tls.ca_pem));
            }
        }
        config
    }

    /// The kubeconfig as text any client reads (JSON is YAML).
    pub fn kubeconfig_yaml(&self) -> String {
        serde_json::to_string_pretty(&self.kubeconfig()).unwrap_or_default()
    }

    /// Writes the kubeconfig to a file.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| Error::Kubeconfig {
            path: path.display().to_string(),
            source,
        })
    }

    /// Stops serving: the listener closes and every connection and watch ends.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Waits until [`Emulator::shutdown`] is called (for a standalone server).
    pub async fn stopped(&self) {
        let mut receiver = self.shutdown.subscribe();
        let _ = receiver.wait_for(|stopped| *stopped).await;
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The administrator's configuration for an emulator at `url`, trusting its certificate if it has one.
fn config_for(url: &str, tls: Option<&tls::Tls>) -> kube::Config {
    // A URL made of "http(s)://" and a socket address always parses.
    let uri: hyper::Uri = url.parse().expect("http://<socket address> is a valid URI");
    let mut config = kube::Config::new(uri);
    config.auth_info.token = Some(ADMIN_TOKEN.to_string().into());
    if let Some(tls) = tls {
        config.root_cert = Some(vec![tls.ca_der.to_vec()]);
    }
    config
}

/// A kubeconfig for an emulator at `url`.
pub fn kubeconfig(url: &str) -> kube::config::Kubeconfig {
    use kube::config::{
        AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
    };
    const NAME: &str = "kactor-emulator";
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: NAME.into(),
            cluster: Some(Cluster {
                server: Some(url.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: NAME.into(),
            auth_info: Some(AuthInfo {
                token: Some(ADMIN_TOKEN.to_string().into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: NAME.into(),
            context: Some(Context {
                cluster: NAME.into(),
                user: Some(NAME.into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(NAME.into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    }
}
