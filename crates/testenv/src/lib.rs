//! Test clusters for kactor operators: one handle, two servers.
//!
//! [`TestCluster`] gives a test a Kubernetes API server over real HTTP and a `kube::Client` for it:
//! by default the embedded emulator ([`kactor_emulator`]: milliseconds to start, fault injection), or,
//! with `KACTOR_TEST_CLUSTER=apiserver`, a real kube-apiserver with etcd and the controllers that
//! objects rely on without nodes (garbage collection, namespace deletion, service accounts), built
//! from Go modules on first use ([`apiserver`]). The same test runs on both; where the two servers
//! disagree, the real one is right.
//!
//! This crate is for tests and benchmarks, not for operators: start with [`TestCluster::start`].
//!
//! ```no_run
//! # async fn example() -> Result<(), kactor_testenv::Error> {
//! use kactor_testenv::TestCluster;
//! let cluster = TestCluster::start().await?;          // KACTOR_TEST_CLUSTER picks the server
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::default_namespaced(cluster.client());
//! assert!(pods.list(&Default::default()).await?.items.is_empty());
//! if let Some(emulator) = cluster.emulator() {
//!     emulator.faults().end_watches();                // fault injection: the emulator only
//! }
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```

pub mod apiserver;

use std::fmt;
use std::path::{Path, PathBuf};

pub use apiserver::ApiServer;
pub use kactor_emulator as emulator;
pub use kactor_emulator::{Emulator, EmulatorBuilder};

/// The environment variable that chooses the server: `emulator` (the default) or `apiserver`.
pub const CLUSTER_ENV: &str = "KACTOR_TEST_CLUSTER";

/// Why a test cluster could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `KACTOR_TEST_CLUSTER` names no server.
    #[error(
        "{CLUSTER_ENV}={0:?} names no test cluster: use `emulator` (the default) or `apiserver`"
    )]
    UnknownBackend(String),
    /// The emulator could not start.
    #[error(transparent)]
    Emulator(#[from] kactor_emulator::Error),
    /// The real server's binary could not be found or built.
    #[error("cannot build the real API server: {0}")]
    Build(String),
    /// The real server did not start.
    #[error("kube-apiserver {message}; the end of its log ({}):\n{}", .log.display(), apiserver::tail(.log, 25))]
    ApiServer {
        /// What went wrong.
        message: String,
        /// The components' log.
        log: PathBuf,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A request to the cluster failed, or a client could not be built.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl Error {
    fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// Which server a [`TestCluster`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// kactor's in-memory API emulator.
    Emulator,
    /// A real kube-apiserver with etcd ([`apiserver`]).
    ApiServer,
}

impl Backend {
    /// The server `KACTOR_TEST_CLUSTER` asks for: `emulator` when unset or empty, or `apiserver`.
    pub fn from_env() -> Result<Backend, Error> {
        Backend::parse(&std::env::var(CLUSTER_ENV).unwrap_or_default())
    }

    /// A value of `KACTOR_TEST_CLUSTER`.
    pub fn parse(value: &str) -> Result<Backend, Error> {
        match value.trim() {
            "" | "emulator" => Ok(Backend::Emulator),
            "apiserver" | "kube-apiserver" => Ok(Backend::ApiServer),
            other => Err(Error::UnknownBackend(other.to_string())),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Emulator => "emulator",
            Backend::ApiServer => "apiserver",
        })
    }
}

/// Options of a [`TestCluster`].
#[derive(Debug)]
pub struct TestClusterBuilder {
    backend: Option<Backend>,
    rbac: bool,
    emulator: EmulatorBuilder,
}

impl TestClusterBuilder {
    /// Runs this server whatever `KACTOR_TEST_CLUSTER` says.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Authorizes requests with RBAC, so that a client of a service account
    /// ([`TestCluster::client_as_service_account`]) may do only what Roles and bindings grant it.
    /// The administrator's client may do everything either way.
    pub fn rbac(mut self, enabled: bool) -> Self {
        self.rbac = enabled;
        self.emulator = self.emulator.rbac(enabled);
        self
    }

    /// Settings that only the emulator has (bookmark interval, history limit, ...): a real server
    /// keeps its own.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), kactor_testenv::Error> {
    /// let cluster = kactor_testenv::TestCluster::builder()
    ///     .emulator(|e| e.bookmark_interval(std::time::Duration::from_millis(200)))
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn emulator(mut self, configure: impl FnOnce(EmulatorBuilder) -> EmulatorBuilder) -> Self {
        self.emulator = configure(self.emulator);
        self
    }

    /// Starts the server.
    pub async fn start(self) -> Result<TestCluster, Error> {
        let backend = match self.backend {
            Some(backend) => backend,
            None => Backend::from_env()?,
        };
        let server = match backend {
            Backend::Emulator => Server::Emulator(self.emulator.start().await?),
            Backend::ApiServer => Server::ApiServer(Box::new(ApiServer::start(self.rbac).await?)),
        };
        Ok(TestCluster { server })
    }
}

/// A Kubernetes API server for a test: the emulator or a real kube-apiserver, stopped when dropped.
#[derive(Debug)]
pub struct TestCluster {
    server: Server,
}

#[derive(Debug)]
enum Server {
    Emulator(Emulator),
    ApiServer(Box<ApiServer>),
}

impl TestCluster {
    /// Starts the server that `KACTOR_TEST_CLUSTER` names (the emulator by default).
    pub async fn start() -> Result<TestCluster, Error> {
        Self::builder().start().await
    }

    /// Options: the server, RBAC, the emulator's settings.
    pub fn builder() -> TestClusterBuilder {
        TestClusterBuilder {
            backend: None,
            rbac: false,
            emulator: Emulator::builder(),
        }
    }

    /// Which server this is.
    pub fn backend(&self) -> Backend {
        match self.server {
            Server::Emulator(_) => Backend::Emulator,
            Server::ApiServer(_) => Backend::ApiServer,
        }
    }

    /// The emulator, for what only it has (fault injection, object counts); `None` on a real server.
    pub fn emulator(&self) -> Option<&Emulator> {
        match &self.server {
            Server::Emulator(emulator) => Some(emulator),
            Server::ApiServer(_) => None,
        }
    }

    /// The emulator's fault injection.
    ///
    /// # Panics
    /// On a real API server, which has none: a test that injects faults runs on the emulator only
    /// (kactor's own put them in a module `emulator_only`, which `scripts/test` skips on the real
    /// server), or checks [`emulator`](Self::emulator) first.
    pub fn faults(&self) -> &kactor_emulator::Faults {
        match &self.server {
            Server::Emulator(emulator) => emulator.faults(),
            Server::ApiServer(_) => panic!(
                "fault injection needs the emulator, and this test runs on a real API server \
                 ({CLUSTER_ENV}=apiserver): put the test in a module `emulator_only`, or use \
                 TestCluster::builder().backend(Backend::Emulator)"
            ),
        }
    }

    /// The base URL (`http://` for the emulator, `https://` for the real server).
    pub fn url(&self) -> &str {
        match &self.server {
            Server::Emulator(emulator) => emulator.url(),
            Server::ApiServer(server) => server.url(),
        }
    }

    /// A client, as the administrator (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        match &self.server {
            Server::Emulator(emulator) => emulator.client(),
            Server::ApiServer(server) => server.client(),
        }
    }

    /// The administrator's client configuration, to build clients with other settings.
    pub fn config(&self) -> kube::Config {
        match &self.server {
            Server::Emulator(emulator) => emulator.config(),
            Server::ApiServer(server) => server.config(),
        }
    }

    /// The administrator's kubeconfig.
    pub fn kubeconfig(&self) -> kube::config::Kubeconfig {
        match &self.server {
            Server::Emulator(emulator) => emulator.kubeconfig(),
            Server::ApiServer(server) => server.kubeconfig().clone(),
        }
    }

    /// Writes the administrator's kubeconfig for other programs (kubectl, Kopf, an operator's binary).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        match &self.server {
            Server::Emulator(emulator) => Ok(emulator.write_kubeconfig(path)?),
            Server::ApiServer(server) => server.write_kubeconfig(path),
        }
    }

    /// A client configuration that authenticates as the service account `namespace/name`, with
    /// `namespace` as its default namespace, as a pod running as that account has. On the real
    /// server the ServiceAccount must exist (its token comes from the TokenRequest API); on the
    /// emulator it must exist in RBAC mode.
    pub async fn config_as_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<kube::Config, Error> {
        match &self.server {
            Server::Emulator(emulator) => Ok(emulator.config_as_service_account(namespace, name)),
            Server::ApiServer(server) => {
                use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
                use k8s_openapi::api::core::v1::ServiceAccount;
                let accounts: kube::Api<ServiceAccount> =
                    kube::Api::namespaced(server.client(), namespace);
                let request = TokenRequest {
                    spec: TokenRequestSpec {
                        audiences: vec![],
                        expiration_seconds: Some(24 * 3600),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let answer = accounts
                    .create_token_request(name, &Default::default(), &request)
                    .await?;
                let token = answer.status.map(|s| s.token).unwrap_or_default();
                let mut config = server.config();
                config.default_namespace = namespace.to_string();
                config.auth_info = kube::config::AuthInfo {
                    token: Some(token.into()),
                    ..Default::default()
                };
                Ok(config)
            }
        }
    }

    /// A client of [`config_as_service_account`](Self::config_as_service_account).
    pub async fn client_as_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<kube::Client, Error> {
        let config = self.config_as_service_account(namespace, name).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Stops the server and waits until it is gone.
    pub async fn shutdown(self) {
        match self.server {
            Server::Emulator(emulator) => emulator.shutdown(),
            Server::ApiServer(server) => server.shutdown().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emulator_is_the_default_and_the_real_server_is_asked_for_by_name() {
        assert_eq!(Backend::parse("").unwrap(), Backend::Emulator);
        assert_eq!(Backend::parse(" emulator ").unwrap(), Backend::Emulator);
        assert_eq!(Backend::parse("apiserver").unwrap(), Backend::ApiServer);
        assert_eq!(
            Backend::parse("kube-apiserver").unwrap(),
            Backend::ApiServer
        );
        let unknown = Backend::parse("kind").unwrap_err().to_string();
        assert!(
            unknown.contains("\"kind\" names no test cluster"),
            "{unknown}"
        );
    }

    #[test]
    fn the_cached_binary_is_named_by_version_and_sources() {
        let path = apiserver::cached_binary_path().unwrap();
        let dir = path
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy();
        assert!(dir.starts_with(apiserver::KUBERNETES_VERSION), "{dir}");
        assert_eq!(
            dir.len(),
            apiserver::KUBERNETES_VERSION.len() + 1 + 12,
            "{dir}"
        );
        assert_eq!(path, apiserver::cached_binary_path().unwrap());
    }
}
