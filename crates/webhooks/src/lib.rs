//! kactor's admission webhooks: the operator's own HTTPS server for its `on_validate` and
//! `on_mutate` handlers (Kopf's `WebhookServer`), its certificate, and the webhook configurations
//! that point the API server at it (Kopf's `settings.admission.managed`).
//!
//! **Expected flow**: [`Webhooks::start`] binds at once (a port in use is the caller's error),
//! makes or reads the certificate, and serves `POST <path>/<handler id>` with TLS (HTTP/1.1) on the
//! operator's runtime; each request is one handler's ([`review::respond`]); CRD conversions are
//! served at `<path>/convert` ([`conversion`]). With a managed name, [`Webhooks::configure`]
//! creates or updates the `ValidatingWebhookConfiguration` and `MutatingWebhookConfiguration`
//! ([`managed`]) and points the converted CRDs' `spec.conversion` at the server; the certificate's
//! rotation on disk updates their `caBundle`. A CRD's conversion stays when the operator exits: the
//! objects stored in one version must stay readable in the others. [`Webhooks::stop`] takes the non-persistent webhooks out of them and stops
//! serving.
//!
//! **Guarantees**
//! * A request never waits for the operator's watching or handlers: admission handlers run in the
//!   request's own task.
//! * A bad request (not JSON, not an `AdmissionReview`) is answered 400 with the reason; an unknown
//!   path 404; anything but POST 405.
//! * The certificate files are read again when they change (see [`certs`]); a broken file keeps
//!   the previous certificate.

pub mod certs;
pub mod conversion;
pub mod managed;
pub mod review;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kactor_reactor::admission::AdmissionKind;
use kactor_reactor::settings::WebhookServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::certs::Certs;
pub use crate::conversion::Converter;
pub use crate::review::Served;

/// The path (under the server's prefix) of the CRD conversion webhook.
pub const CONVERT_PATH: &str = "/convert";

/// The largest request read (an `AdmissionReview` carries the object twice for an update).
const MAX_REQUEST: usize = 32 * 1024 * 1024;

/// Why the webhook server cannot start or configure.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The address cannot be listened on.
    #[error("the webhook server cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate cannot be made or read.
    #[error(transparent)]
    Cert(#[from] certs::CertError),
    /// TLS cannot be set up.
    #[error("the webhook server's TLS cannot be set up: {0}")]
    Tls(String),
    /// The webhook configurations cannot be written.
    #[error("the webhook configuration {name} cannot be written: {source}")]
    Configure {
        /// The configuration's name.
        name: String,
        /// Why.
        source: kube::Error,
    },
}

/// What the request tasks share.
struct Shared {
    served: Vec<Served>,
    converters: Vec<Converter>,
    path: String,
    client: Arc<kube::Client>,
}

/// The running webhook server (see the [crate docs](crate)).
pub struct Webhooks {
    addr: SocketAddr,
    base_url: String,
    certs: Certs,
    shared: Arc<Shared>,
    managed: Arc<Mutex<Option<String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Webhooks {
    /// Listens per `settings` and serves the admission handlers `served` and the CRD conversions
    /// `converters` on the current runtime.
    pub async fn start(
        settings: &WebhookServer,
        served: Vec<Served>,
        converters: Vec<Converter>,
        client: kube::Client,
    ) -> Result<Webhooks, WebhookError> {
        let addr = SocketAddr::new(settings.addr, settings.port);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| WebhookError::Listen { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| WebhookError::Listen { addr, source })?;
        let loaded = match (&settings.certfile, &settings.pkeyfile) {
            (Some(cert), Some(key)) => certs::from_files(cert, key, settings.cafile.as_deref())?,
            _ => {
                let mut names = vec![
                    settings.host.clone(),
                    "localhost".to_string(),
                    "127.0.0.1".to_string(),
                ];
                names.extend(settings.extra_sans.iter().cloned());
                names.dedup();
                certs::self_signed(&names)?
            }
        };
        let certs = Certs::new(loaded);
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(certs.clone()));
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let path = settings.path.trim_end_matches('/').to_string();
        let shared = Arc::new(Shared {
            served,
            converters,
            path: path.clone(),
            client: Arc::new(client),
        });
        let mut tasks = vec![tokio::spawn(serve(listener, acceptor, shared.clone()))];
        let managed: Arc<Mutex<Option<String>>> = Arc::default();
        let base_url = format!("https://{}:{}{path}", settings.host, addr.port());
        if let (Some(cert), Some(key)) = (&settings.certfile, &settings.pkeyfile) {
            let (shared, managed, base_url) = (shared.clone(), managed.clone(), base_url.clone());
            let follow = certs.clone().follow(
                cert.clone(),
                key.clone(),
                settings.cafile.clone(),
                settings.file_check_interval,
                move |ca_pem| {
                    // The webhooks must trust the new CA: their caBundle follows.
                    let name = managed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    if let Some(name) = name {
                        let (shared, base_url) = (shared.clone(), base_url.clone());
                        tokio::spawn(async move {
                            if let Err(error) = configure(&shared, &name, &base_url, &ca_pem).await {
                                tracing::error!(%error, "The webhooks' new CA bundle cannot be written.");
                            }
                        });
                    }
                },
            );
            tasks.push(tokio::spawn(follow));
        }
        tracing::info!(%addr, url = %base_url, "Serving admission webhooks.");
        Ok(Webhooks {
            addr,
            base_url,
            certs,
            shared,
            managed,
            tasks,
        })
    }

    /// Where it listens (with the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The webhooks' base URL: `https://<host>:<port><path>`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The CA bundle (PEM) that verifies the certificate served now.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.certs.ca_pem()
    }

    /// Creates or updates the webhook configurations named `managed` for the handlers, and keeps
    /// their CA bundle up to date from now on.
    pub async fn configure(&self, managed: &str) -> Result<(), WebhookError> {
        *self
            .managed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(managed.to_string());
        configure(&self.shared, managed, &self.base_url, &self.certs.ca_pem()).await
    }

    /// Stops serving; the managed configurations keep only the persistent webhooks (or are
    /// deleted when none is).
    pub async fn stop(mut self) {
        let managed = self
            .managed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(name) = managed {
            let ca_pem = self.certs.ca_pem();
            for kind in [AdmissionKind::Validating, AdmissionKind::Mutating] {
                if !self.shared.served.iter().any(|s| s.handler.kind == kind) {
                    continue;
                }
                let persistent = managed::webhooks(
                    kind,
                    &self.shared.served,
                    &name,
                    &self.base_url,
                    &ca_pem,
                    true,
                );
                if let Err(error) =
                    managed::withdraw(&self.shared.client, kind, &name, persistent).await
                {
                    tracing::error!(%error, configuration = %name, "The webhook configuration cannot be withdrawn.");
                }
            }
        }
        let tasks = std::mem::take(&mut self.tasks);
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl Drop for Webhooks {
    /// Dropped without [`Webhooks::stop`] (an operator that failed after starting it): the server
    /// stops listening at once; the configurations are left as they are.
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn configure(
    shared: &Shared,
    managed: &str,
    base_url: &str,
    ca_pem: &[u8],
) -> Result<(), WebhookError> {
    for kind in [AdmissionKind::Validating, AdmissionKind::Mutating] {
        let webhooks = managed::webhooks(kind, &shared.served, managed, base_url, ca_pem, false);
        managed::apply(&shared.client, kind, managed, webhooks)
            .await
            .map_err(|source| WebhookError::Configure {
                name: managed.to_string(),
                source,
            })?;
    }
    let url = format!("{}{CONVERT_PATH}", base_url.trim_end_matches('/'));
    let mut crds: Vec<String> = shared.converters.iter().map(Converter::crd_name).collect();
    crds.sort();
    crds.dedup();
    for crd in crds {
        managed::convert_through(&shared.client, &crd, &url, ca_pem)
            .await
            .map_err(|source| WebhookError::Configure { name: crd, source })?;
    }
    Ok(())
}

async fn serve(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, shared: Arc<Shared>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "The webhook server cannot accept a connection.");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (acceptor, shared) = (acceptor.clone(), shared.clone());
        tokio::spawn(async move {
            let stream = match acceptor.accept(stream).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%peer, %error, "A TLS handshake with the webhook server failed.");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(&shared, request).await) }
            });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %error, "A webhook connection ended with an error.");
            }
        });
    }
}

async fn route(shared: &Shared, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_string();
    if !shared.converters.is_empty() && path == format!("{}{CONVERT_PATH}", shared.path) {
        let review = match read_json(request).await {
            Ok(review) => review,
            Err(response) => return response,
        };
        return match conversion::respond(&shared.converters, &review) {
            Ok(answer) => json_response(&answer),
            Err(error) => text(StatusCode::BAD_REQUEST, error.to_string()),
        };
    }
    let Some(id) = path
        .strip_prefix(shared.path.as_str())
        .and_then(|rest| rest.strip_prefix('/'))
        .map(|quoted| {
            percent_encoding::percent_decode_str(quoted)
                .decode_utf8_lossy()
                .into_owned()
        })
    else {
        return text(StatusCode::NOT_FOUND, format!("no webhook at {path}"));
    };
    let Some(served) = shared.served.iter().find(|s| s.handler.admission.id == id) else {
        return text(StatusCode::NOT_FOUND, format!("no webhook at {path}"));
    };
    let review = match read_json(request).await {
        Ok(review) => review,
        Err(response) => return response,
    };
    match review::respond(served, &review, &shared.client).await {
        Ok(answer) => json_response(&answer),
        Err(error) => text(StatusCode::BAD_REQUEST, error.to_string()),
    }
}

/// The request's JSON body, or the response that says why there is none (405, 400).
async fn read_json(request: Request<Incoming>) -> Result<serde_json::Value, Response<Full<Bytes>>> {
    if request.method() != Method::POST {
        return Err(text(StatusCode::METHOD_NOT_ALLOWED, "POST a review".into()));
    }
    let body = Limited::new(request.into_body(), MAX_REQUEST)
        .collect()
        .await
        .map_err(|e| {
            text(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request: {e}"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| text(StatusCode::BAD_REQUEST, format!("not JSON: {e}")))
}

fn json_response(answer: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn text(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message)));
    *response.status_mut() = status;
    response
}
