//! The errors an operator can stop with. Each says, on one line, what happened and what to do.

use kactor_reactor::discovery::{DiscoveryError, ResolveError};
use kactor_reactor::namespaces::PatternError;

/// Why an operator could not start, or stopped.
#[derive(thiserror::Error)]
pub enum Error {
    /// No credentials were found, or they are unusable.
    #[error("no usable Kubernetes credentials: {0}; set KUBECONFIG, use ~/.kube/config, or run in a pod with a service account (or try the operator without a cluster: --emulator)")]
    Credentials(String),
    /// `--emulator`: the embedded API server could not start, or take the operator's CRDs.
    #[error("the embedded API server (--emulator): {0}")]
    Emulator(String),
    /// Discovery failed (the API is unreachable, or refuses).
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// A handler's resource does not exist, is ambiguous, or cannot be watched.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// A `--namespace` pattern is invalid.
    #[error("invalid namespace pattern: {0}")]
    Namespaces(#[from] PatternError),
    /// Admission handlers are registered but no webhook server is set.
    #[error("admission handlers ({0}) need a webhook server: set settings.admission.server (e.g. `s.admission.server = Some(Default::default())`)")]
    NoWebhookServer(String),
    /// The webhook server could not start, or its configurations could not be written.
    #[error(transparent)]
    Webhooks(#[from] kactor_webhooks::WebhookError),
    /// A startup activity failed.
    #[error("startup handler '{id}' failed: {message}; the operator does not start")]
    Startup {
        /// The activity's id.
        id: String,
        /// Its error.
        message: String,
    },
    /// The actors' thread could not run.
    #[error(transparent)]
    Actors(#[from] kactor_actors::system::SystemError),
    /// A second stop signal arrived during the graceful shutdown.
    #[error("interrupted by a second signal during shutdown; exited without waiting for handlers and cleanup")]
    Interrupted,
    /// The graceful shutdown took longer than `process.ultimate_exiting_timeout`.
    #[error("the shutdown took longer than {0:?} (process.ultimate_exiting_timeout); exited without waiting further")]
    ExitTimeout(std::time::Duration),
    /// The leader election settings are invalid.
    #[error(transparent)]
    LeaderElection(#[from] kactor_peering::lease::LeaseError),
    /// The sharding settings are invalid.
    #[error(transparent)]
    Sharding(#[from] kactor_peering::sharding::RingError),
    /// Sharding cannot run with these other settings.
    #[error("sharding: {0}")]
    ShardingConflict(String),
    /// The `--liveness` URL is not one kactor can serve.
    #[error("invalid liveness endpoint {url:?}: {reason}; expected http://HOST:PORT/PATH, e.g. http://0.0.0.0:8080/healthz")]
    Liveness {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The health server could not listen.
    #[error("cannot serve health and metrics on {addr}: {source}; choose another --liveness port")]
    HealthServer {
        /// The address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// A health check's name is taken or cannot be a path segment.
    #[error(transparent)]
    HealthCheck(#[from] kactor_health::CheckError),
    /// A metric could not be registered (a name clash on the application's registry).
    #[error("cannot register kactor's metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// Logging could not be set up.
    #[error(transparent)]
    Logging(#[from] crate::logging::LoggingError),
    /// The RBAC could not be derived, or (`rbac verify`) is not all granted.
    #[error(transparent)]
    Rbac(#[from] RbacError),
    /// A declared CRD could not be installed ([`crate::Operator::install_crds`]).
    #[error("cannot install the CRD {name}: {reason}")]
    InstallCrd {
        /// The CRD's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// `manifests` was given options it cannot deploy (a name that is not a Kubernetes name, several
    /// replicas with nothing to make them take turns, ...).
    #[error("cannot make the manifests: {0}")]
    Deploy(String),
    /// `olm bundle` was given options it cannot bundle (those `manifests` cannot deploy, a version
    /// that is not a semantic version, a channel that is not listed, ...).
    #[error("cannot make the OLM bundle: {0}")]
    Bundle(String),
    /// A command's input could not be read.
    #[error("cannot read {what}: {reason}")]
    Input {
        /// What was read (`rbac.yaml`, `stdin`).
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A command's output could not be written.
    #[error("cannot write {what}: {reason}")]
    Output {
        /// What was written (`rbac.yaml`, `stdout`).
        what: String,
        /// Why it failed.
        reason: String,
    },
}

/// One line, as `Display`: `main` returning this error prints a clear message, not a struct dump.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// kactor's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an operator's RBAC cannot be derived, or is not granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RbacError {
    /// A handler's resource is named by kind or short name, and discovery could not resolve it.
    #[error(
        "cannot resolve the resource \"{selector}\" for RBAC: {reason}; name it by group and plural \
         (e.g. (\"example.com\", \"v1\", \"widgets\") or \"widgets.example.com\") to resolve it offline"
    )]
    Unresolved {
        /// The resource, as the handler names it.
        selector: String,
        /// Why discovery did not resolve it.
        reason: String,
    },
    /// The manifests are not YAML, or not Kubernetes objects.
    #[error("cannot read the RBAC manifests: {0}; give the YAML of Roles, ClusterRoles and their bindings")]
    Manifests(String),
    /// `rbac verify` found permissions missing.
    #[error(
        "{missing} of {needed} permissions are missing for {user}; grant them (`rbac generate` prints \
         them all)"
    )]
    Missing {
        /// How many (verb, resource, place) permissions are missing.
        missing: usize,
        /// How many are needed.
        needed: usize,
        /// The service account's user name.
        user: String,
    },
}
