//! The HTTP/1.1 server: routing of the Kubernetes REST paths, request and response encoding, watches.
//!
//! Every request is one call into the [`State`] under its lock; the lock is never held across an await.
//! A watch is a task of its own that copies new events out of the history and writes them as chunked
//! JSON lines, so a slow watcher never slows a writer (it falls behind, and past the kept history it
//! gets a 410, as on a real cluster).

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::faults::{Failure, Faults, Matcher};
use crate::patch::PatchKind;
use crate::rbac;
use crate::registry::{GroupResource, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::{ApiError, ApiResult};
use crate::store::{
    self, encode_event, DeleteOptions, EventType, ListOptions, ObjKey, Propagation, Since, State,
    Subresource, Write,
};
use crate::table::{self, Include};
use crate::{openapi, openapi_proto, Settings};

/// The Kubernetes version the emulator reports.
pub const KUBERNETES_VERSION: &str = "v1.34.0";

/// What the server's tasks share.
pub(crate) struct Shared {
    pub state: Arc<Mutex<State>>,
    pub faults: Faults,
    pub settings: Settings,
    pub shutdown: watch::Receiver<bool>,
}

impl Shared {
    pub fn state(&self) -> MutexGuard<'_, State> {
        // Every State method leaves it consistent before it can panic (checks come before writes),
        // so a poisoned lock still guards a usable store.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A response body: a whole buffer, or the chunks of a watch.
pub(crate) enum Body {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(rx) => rx
                .poll_recv(cx)
                .map(|chunk| chunk.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Stream(_) => SizeHint::default(),
        }
    }
}

/// Accepts connections until shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(%error, "emulator: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                match &tls {
                    None => {
                        tokio::spawn(serve_connection(stream, shared.clone()));
                    }
                    Some(acceptor) => {
                        let (acceptor, shared) = (acceptor.clone(), shared.clone());
                        tokio::spawn(async move {
                            match acceptor.accept(stream).await {
                                Ok(stream) => serve_connection(stream, shared).await,
                                Err(error) => {
                                    tracing::debug!(%error, "emulator: TLS handshake failed")
                                }
                            }
                        });
                    }
                }
            }
            _ = stopped(&mut shutdown) => break,
        }
    }
}

/// Serves one connection (a TCP stream, or an in-memory one) until it closes or shutdown.
pub(crate) async fn serve_connection<IO>(io: IO, shared: Arc<Shared>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut shutdown = shared.shutdown.clone();
    let service = hyper::service::service_fn(move |request| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(&shared, request).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    tokio::select! {
        _ = connection => {}
        _ = stopped(&mut shutdown) => {}
    }
}

/// The emulator as a tower service: each request goes over a fresh in-memory connection to the
/// server (HTTP/1, as over TCP), with no socket and no I/O driver involved. So a client made of it
/// works under tokio's paused time, where a real socket's wait would let the clock jump.
#[derive(Clone)]
pub(crate) struct InProcess(pub(crate) Arc<Shared>);

/// How much an in-memory connection buffers each way before the writer waits.
const IN_PROCESS_BUFFER: usize = 256 * 1024;

impl tower_service::Service<hyper::Request<kube::client::Body>> for InProcess {
    type Response = hyper::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, hyper::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: hyper::Request<kube::client::Body>) -> Self::Future {
        let shared = self.0.clone();
        // The administrator's token, as the port's client sends it (ASCII, so always a header value).
        let admin = HeaderValue::from_str(&format!("Bearer {}", crate::ADMIN_TOKEN))
            .unwrap_or(HeaderValue::from_static(""));
        request
            .headers_mut()
            .entry(hyper::header::AUTHORIZATION)
            .or_insert(admin);
        Box::pin(async move {
            let (client, server) = tokio::io::duplex(IN_PROCESS_BUFFER);
            tokio::spawn(serve_connection(server, shared));
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client)).await?;
            tokio::spawn(connection);
            sender.send_request(request).await
        })
    }
}

/// Resolves once shutdown is signalled.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

async fn handle(shared: &Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = route(shared, request)
        .await
        .unwrap_or_else(|error| error_response(&error));
    tracing::debug!(%method, %path, status = response.status().as_u16(), "emulator request");
    response
}

/// A parsed request, as the handlers see it.
struct Call {
    method: Method,
    query: HashMap<String, String>,
    accept: String,
    content_type: String,
    body: Bytes,
}

impl Call {
    fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("true" | "1"))
    }

    fn dry_run(&self) -> bool {
        self.param("dryRun") == Some("All")
    }

    /// How a create, update or patch is to be carried out.
    fn write(&self) -> ApiResult<Write> {
        let strict = match self.param("fieldValidation") {
            None | Some("" | "Ignore" | "Warn") => false,
            Some("Strict") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation must be Ignore, Warn or Strict, not {other:?}"
                )))
            }
        };
        Ok(Write {
            dry_run: self.dry_run(),
            strict,
        })
    }

    fn json(&self) -> ApiResult<Value> {
        if self.body.is_empty() {
            return Err(ApiError::bad_request("the request body is empty"));
        }
        let media = self
            .content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        if media == crate::protobuf::MEDIA_TYPE {
            return crate::protobuf::decode(&self.body).map_err(|e| match e {
                crate::protobuf::Error::Invalid(_) => ApiError::bad_request(e.to_string()),
                crate::protobuf::Error::Unsupported(_) => {
                    ApiError::new(415, "UnsupportedMediaType", e.to_string())
                }
            });
        }
        // What a real API server decodes: JSON (and the patch formats, all JSON but apply's YAML)
        // and YAML; anything else is a 415 before the body is read.
        let known = media.is_empty()
            || media == "*/*"
            || media == "application/json"
            || media == "application/yaml"
            || (media.starts_with("application/") && media.ends_with("+json"))
            || media == "application/apply-patch+yaml";
        if !known {
            return Err(ApiError::unsupported_media_type(&self.content_type));
        }
        if media.ends_with("yaml") && serde_json::from_slice::<Value>(&self.body).is_err() {
            return serde_saphyr::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("invalid YAML body: {e}")));
        }
        serde_json::from_slice(&self.body).map_err(|e| {
            ApiError::bad_request(format!("couldn't decode the body: json parse error: {e}"))
        })
    }
}

async fn route(shared: &Arc<Shared>, request: Request<Incoming>) -> ApiResult<Response<Body>> {
    let (parts, incoming) = request.into_parts();
    let limit = shared.settings.max_body_bytes;
    let body = http_body_util::Limited::new(incoming, limit)
        .collect()
        .await
        .map_err(|_| {
            ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("the request body is larger than {limit} bytes"),
            )
        })?
        .to_bytes();
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let call = Call {
        method: parts.method.clone(),
        query: form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect(),
        accept: header(hyper::header::ACCEPT),
        content_type: header(CONTENT_TYPE),
        body,
    };
    let segments: Vec<String> = parts
        .uri
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    if shared.settings.rbac {
        let attributes = rbac::Attributes::of(&call.method, &segments, &call.query);
        let authorization = parts
            .headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        rbac::check(&shared.state(), authorization, &attributes)?;
    }
    let get = call.method == Method::GET;
    match segments.as_slice() {
        [] if get => ok(
            &json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v2", "/openapi/v3", "/readyz", "/version"]}),
        ),
        ["version"] if get => ok(&version()),
        ["healthz" | "livez" | "readyz", ..] if get => Ok(text(StatusCode::OK, "ok")),
        ["api"] if get => ok(
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.settings.address()}]}),
        ),
        ["apis"] if get => ok(&group_list(&shared.state())),
        ["api", "v1"] if get => ok(&resource_list(&shared.state(), "", "v1")?),
        ["apis", group] if get => group_list(&shared.state())["groups"]
            .as_array()
            .and_then(|groups| groups.iter().find(|g| g["name"] == *group))
            .map(|g| {
                let mut g = g.clone();
                g["kind"] = json!("APIGroup");
                g["apiVersion"] = json!("v1");
                g
            })
            .map_or_else(|| Err(ApiError::no_route(parts.uri.path())), |g| ok(&g)),
        ["apis", group, version] if get => ok(&resource_list(&shared.state(), group, version)?),
        ["openapi", "v2"] if get => Ok(openapi_v2(shared, &call.accept)),
        ["openapi", "v3"] if get => ok(&openapi::v3_root(&shared.state().types())),
        ["openapi", "v3", rest @ ..] if get => {
            openapi::v3_group_version(&shared.state().types(), rest)
                .map_or_else(|| Err(ApiError::no_route(parts.uri.path())), |doc| ok(&doc))
        }
        ["_emulator", rest @ ..] => admin(shared, &call, rest),
        ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]
            if call.method == Method::POST =>
        {
            self_review(shared, &parts.headers, &call)
        }
        ["api", "v1", rest @ ..] => resource(shared, call, "", "v1", rest).await,
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            resource(shared, call, group, version, rest).await
        }
        _ => Err(ApiError::no_route(parts.uri.path())),
    }
}

/// `kubectl auth can-i`: what the requesting user may do.
fn self_review(
    shared: &Arc<Shared>,
    headers: &hyper::HeaderMap,
    call: &Call,
) -> ApiResult<Response<Body>> {
    let authorization = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let review = rbac::self_review(
        &shared.state(),
        shared.settings.rbac,
        authorization,
        call.json()?,
    )?;
    object_response(StatusCode::CREATED, &review)
}

fn version() -> Value {
    let (major, minor) = KUBERNETES_VERSION
        .trim_start_matches('v')
        .split_once('.')
        .unwrap_or(("1", "34"));
    let minor = minor.split('.').next().unwrap_or(minor);
    json!({
        "major": major, "minor": minor, "gitVersion": KUBERNETES_VERSION, "gitCommit": "kactor-emulator",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "rust",
        "compiler": "rustc", "platform": "linux/amd64", "emulator": env!("CARGO_PKG_VERSION"),
    })
}

fn group_list(state: &State) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for rtype in state.types().iter().filter(|t| !t.group.is_empty()) {
        let versions: Vec<String> = rtype.versions.iter().map(|v| v.name.clone()).collect();
        match groups.iter_mut().find(|(g, _)| *g == rtype.group) {
            Some((_, known)) => {
                for v in versions {
                    if !known.contains(&v) {
                        known.push(v);
                    }
                }
            }
            None => groups.push((rtype.group.clone(), versions)),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(group, mut versions)| {
            versions.sort_by_key(|v| std::cmp::Reverse(crate::registry::version_priority(v)));
            let entries: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
                .collect();
            json!({"name": group, "versions": entries, "preferredVersion": entries[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(state: &State, group: &str, version: &str) -> ApiResult<Value> {
    let resources: Vec<Value> = state
        .types()
        .iter()
        .filter(|t| t.group == group)
        .filter_map(|t| t.version(version).map(|v| t.discovery(v)))
        .flatten()
        .collect();
    if resources.is_empty() && !(group.is_empty() && version == "v1") {
        return Err(ApiError::no_route(&format!("/apis/{group}/{version}")));
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// Where a resource request points.
struct Target {
    rtype: Arc<ResourceType>,
    version: String,
    /// `group/version` as objects carry it in this version.
    api_version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    fn gr(&self) -> GroupResource {
        self.rtype.group_resource()
    }

    fn key(&self) -> ObjKey {
        (
            self.namespace.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }

    /// The object as read in this version (no conversion: only `apiVersion` differs, as with `None`).
    fn present(&self, object: &Arc<Value>) -> Arc<Value> {
        if object["apiVersion"] == self.api_version.as_str() {
            object.clone()
        } else {
            let mut copy = (**object).clone();
            copy["apiVersion"] = json!(self.api_version);
            Arc::new(copy)
        }
    }
}

fn resolve_target(state: &State, group: &str, version: &str, rest: &[&str]) -> ApiResult<Target> {
    let not_found = || {
        ApiError::no_route(&format!(
            "/{}/{}",
            if group.is_empty() {
                "api".to_string()
            } else {
                format!("apis/{group}")
            },
            version
        ))
    };
    let namespaced_form = rest.len() >= 3
        && rest[0] == "namespaces"
        && state
            .resolve(group, version, rest[2])
            .is_some_and(|t| t.namespaced);
    let (namespace, tail) = if namespaced_form {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    if tail.is_empty() || tail.len() > 3 {
        return Err(not_found());
    }
    let rtype = state
        .resolve(group, version, tail[0])
        .ok_or_else(not_found)?;
    if namespace.is_some() != rtype.namespaced && (namespace.is_some() || tail.len() > 1) {
        return Err(not_found());
    }
    Ok(Target {
        api_version: rtype.api_version(version),
        rtype,
        version: version.to_string(),
        namespace,
        name: tail.get(1).map(|s| s.to_string()),
        sub: tail.get(2).map(|s| s.to_string()),
    })
}

#[allow(
    clippy::too_many_lines,
    reason = "the routing table of a resource's verbs, one arm each"
)]
async fn resource(
    shared: &Arc<Shared>,
    call: Call,
    group: &str,
    version: &str,
    rest: &[&str],
) -> ApiResult<Response<Body>> {
    let target = resolve_target(&shared.state(), group, version, rest)?;
    if let (Some("token"), Some(name), Some(namespace)) =
        (target.sub.as_deref(), &target.name, &target.namespace)
    {
        if group.is_empty() && target.rtype.plural == "serviceaccounts" {
            return if call.method == Method::POST {
                let request = call.json()?;
                let answer = crate::auth::token_request(&shared.state(), namespace, name, request)?;
                object_response(StatusCode::CREATED, &answer)
            } else {
                Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource ({})",
                    call.method
                )))
            };
        }
    }
    let collection = target.name.is_none();
    // The authorizer's verb, among those this endpoint serves: no creating into a named object,
    // no updating or patching a collection, and no HEAD.
    let verb = match rbac::verb(&call.method, collection, call.flag("watch")) {
        Some("create") if !collection => None,
        Some("update" | "patch") if collection => None,
        _ if call.method == Method::HEAD => None,
        verb => verb,
    };
    let Some(verb) = verb else {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            call.method
        )));
    };
    let request = crate::faults::Request {
        verb,
        group,
        plural: &target.rtype.plural,
        name: target.name.as_deref(),
        field_manager: call.param("fieldManager"),
    };
    let delay = shared.faults.latency(request);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(error) = shared.faults.take_failure(request) {
        return Err(error);
    }
    let sub = match target.sub.as_deref() {
        None => Subresource::Main,
        Some("status")
            if target
                .rtype
                .version(&target.version)
                .is_some_and(|v| v.status) =>
        {
            Subresource::Status
        }
        Some("scale") => return scale(shared, &call, &target, verb),
        Some("finalize")
            if group.is_empty() && target.rtype.plural == "namespaces" && verb == "update" =>
        {
            Subresource::Main
        }
        Some(other) => return Err(ApiError::no_route(&format!("{}/{other}", target.gr()))),
    };
    let gr = target.gr();
    match verb {
        "list" if table::wants_table(&call.accept) => {
            let page = shared.state().list(&gr, &list_options(&call, &target)?)?;
            let objects: Vec<Arc<Value>> = page.items.iter().map(|o| target.present(o)).collect();
            let refs: Vec<&Value> = objects.iter().map(|o| &**o).collect();
            let include = Include::parse(call.param("includeObject"));
            ok(&table::table(
                &target.rtype,
                &target.version,
                &refs,
                &page.rv.to_string(),
                page.continue_token.as_deref(),
                include,
            ))
        }
        "list" => {
            let page = shared.state().list(&gr, &list_options(&call, &target)?)?;
            let metadata = table::wants_metadata(&call.accept);
            Ok(json_bytes(
                StatusCode::OK,
                encode_list(&target, &page, metadata),
            ))
        }
        "watch" => start_watch(shared, &call, target),
        "get" => {
            let object = shared.state().get(&gr, &target.key())?;
            if table::wants_table(&call.accept) {
                let include = Include::parse(call.param("includeObject"));
                let presented = target.present(&object);
                return ok(&table::table(
                    &target.rtype,
                    &target.version,
                    &[&presented],
                    store::resource_version(&object),
                    None,
                    include,
                ));
            }
            if table::wants_metadata(&call.accept) {
                return ok(&table::partial_metadata(&object));
            }
            object_response(StatusCode::OK, &target.present(&object))
        }
        "create" => {
            let body = call.json()?;
            if body
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|rv| !rv.is_empty())
            {
                // A real server's answer, code and all (an internal error, without a reason).
                return Err(ApiError::new(
                    500,
                    "",
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            let created =
                shared
                    .state()
                    .create(&gr, target.namespace.as_deref(), body, call.write()?)?;
            object_response(StatusCode::CREATED, &target.present(&created))
        }
        "update" => {
            let body = call.json()?;
            let updated = shared
                .state()
                .update(&gr, &target.key(), body, sub, call.write()?)?;
            object_response(StatusCode::OK, &target.present(&updated))
        }
        "patch" => {
            let kind = PatchKind::from_content_type(&call.content_type)?;
            if kind == PatchKind::Strategic && target.rtype.custom {
                // Custom resources have no patch strategy to merge lists by.
                return Err(ApiError::unsupported_media_type(&call.content_type));
            }
            if kind == PatchKind::Apply && call.param("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is \
                     required for apply patch",
                ));
            }
            let patch = call.json()?;
            let mut state = shared.state();
            let existed = state.get(&gr, &target.key()).is_ok();
            let patched = state.patch(&gr, &target.key(), kind, &patch, sub, call.write()?)?;
            drop(state);
            let created = kind == PatchKind::Apply && !existed;
            object_response(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &target.present(&patched),
            )
        }
        "delete" => {
            let options = delete_options(&call)?;
            let deleted = shared.state().delete(&gr, &target.key(), &options)?;
            object_response(StatusCode::OK, &target.present(&deleted))
        }
        "deletecollection" => {
            let options = delete_options(&call)?;
            let list = list_options(&call, &target)?;
            let deleted = shared.state().delete_collection(&gr, &list, &options)?;
            let page = store::ListPage {
                items: deleted,
                rv: shared.state().rv(),
                continue_token: None,
                remaining: None,
            };
            Ok(json_bytes(
                StatusCode::OK,
                encode_list(&target, &page, false),
            ))
        }
        _ => Err(ApiError::method_not_allowed(verb.to_string())),
    }
}

fn scale(
    shared: &Arc<Shared>,
    call: &Call,
    target: &Target,
    verb: &str,
) -> ApiResult<Response<Body>> {
    let gr = target.gr();
    let key = target.key();
    match verb {
        "get" => ok(&shared.state().scale(&gr, &key, &target.version)?),
        "update" => ok(&shared.state().write_scale(
            &gr,
            &key,
            &target.version,
            call.json()?,
            call.write()?,
        )?),
        "patch" => {
            let kind = PatchKind::from_content_type(&call.content_type)?;
            let current = shared.state().scale(&gr, &key, &target.version)?;
            let patched = crate::patch::apply(kind, &current, &call.json()?, |m| {
                ApiError::new(422, "Invalid", m)
            })?;
            ok(&shared
                .state()
                .write_scale(&gr, &key, &target.version, patched, call.write()?)?)
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{verb} is not supported on /scale"
        ))),
    }
}

fn list_options(call: &Call, target: &Target) -> ApiResult<ListOptions> {
    let limit = match call.param("limit") {
        Some(text) => text
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {text:?}")))?
            .max(0) as usize,
        None => 0,
    };
    let exact_rv = match (
        call.param("resourceVersionMatch"),
        call.param("resourceVersion"),
    ) {
        (Some("Exact"), Some(rv)) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion: {rv:?}")))?,
        ),
        _ => None,
    };
    Ok(ListOptions {
        namespace: target.namespace.clone(),
        labels: LabelSelector::parse(call.param("labelSelector").unwrap_or_default())?,
        fields: FieldSelector::parse(
            call.param("fieldSelector").unwrap_or_default(),
            &target.rtype.group,
            &target.rtype.plural,
        )?,
        limit,
        continue_token: call
            .param("continue")
            .filter(|c| !c.is_empty())
            .map(String::from),
        exact_rv,
    })
}

fn delete_options(call: &Call) -> ApiResult<DeleteOptions> {
    let body: Value = if call.body.is_empty() {
        json!({})
    } else {
        call.json()?
    };
    let policy = call
        .param("propagationPolicy")
        .map(String::from)
        .or_else(|| body["propagationPolicy"].as_str().map(String::from));
    let propagation = match policy.as_deref() {
        None | Some("Background") => {
            if body["orphanDependents"] == Value::Bool(true) {
                Propagation::Orphan
            } else {
                Propagation::Background
            }
        }
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid propagationPolicy {other:?}: must be Orphan, Background or Foreground"
            )))
        }
    };
    let dry_run = call.dry_run()
        || body["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    Ok(DeleteOptions {
        propagation,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
        dry_run,
    })
}

/// Encodes a list page without copying its objects into a new `Value`: whole objects, or with
/// `metadata_only` a `PartialObjectMetadataList`.
fn encode_list(target: &Target, page: &store::ListPage, metadata_only: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + page.items.len() * 512);
    let mut metadata = json!({"resourceVersion": page.rv.to_string()});
    if let Some(token) = &page.continue_token {
        metadata["continue"] = json!(token);
    }
    if let Some(remaining) = page.remaining {
        metadata["remainingItemCount"] = json!(remaining);
    }
    let head = if metadata_only {
        json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
    } else {
        json!({"kind": target.rtype.list_kind, "apiVersion": target.api_version, "metadata": metadata})
    };
    let head = head.to_string();
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing a Value into a Vec cannot fail.
        if metadata_only {
            let _ = serde_json::to_writer(&mut out, &table::partial_metadata(item));
        } else {
            let _ = serde_json::to_writer(&mut out, &*target.present(item));
        }
    }
    out.extend_from_slice(b"]}");
    out
}

/// How a watch's objects are shown (the `Accept` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// As stored, in the version asked for.
    Object,
    /// As a `Table` (kubectl's `get --watch`).
    Table(Include),
    /// As `PartialObjectMetadata`: the metadata alone.
    Metadata,
}

impl View {
    fn of(call: &Call) -> Self {
        if table::wants_table(&call.accept) {
            View::Table(Include::parse(call.param("includeObject")))
        } else if table::wants_metadata(&call.accept) {
            View::Metadata
        } else {
            View::Object
        }
    }
}

/// The watch a request asks for.
struct WatchSpec {
    target: Target,
    options: ListOptions,
    initial: Option<Vec<Arc<Value>>>,
    initial_end: bool,
    cursor: u64,
    bookmarks: bool,
    view: View,
    timeout: Option<Duration>,
    notify: watch::Receiver<u64>,
}

fn start_watch(shared: &Arc<Shared>, call: &Call, target: Target) -> ApiResult<Response<Body>> {
    let mut options = list_options(call, &target)?;
    options.limit = 0;
    options.continue_token = None;
    let bookmarks = call.flag("allowWatchBookmarks");
    let send_initial = call.param("sendInitialEvents").map(|v| v == "true");
    let rv = call.param("resourceVersion").unwrap_or_default();
    let timeout = match call.param("timeoutSeconds") {
        Some(text) => Some(Duration::from_secs(text.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds: {text:?}"))
        })?)),
        None => None,
    };
    if send_initial == Some(true) && !bookmarks {
        return Err(ApiError::invalid(
            &target.rtype.group,
            &target.rtype.kind,
            "",
            vec![crate::status::Cause::new(
                "FieldValueForbidden",
                "allowWatchBookmarks",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            )],
        ));
    }
    let gr = target.gr();
    let state = shared.state();
    let notify = state
        .subscribe(&gr)
        .ok_or_else(|| ApiError::no_route(&gr.to_string()))?;
    let (initial, cursor) = if send_initial == Some(true)
        || (send_initial.is_none() && (rv.is_empty() || rv == "0"))
    {
        let (items, rv) = state.snapshot(&gr, &options)?;
        (Some(items), rv)
    } else if rv.is_empty() || rv == "0" {
        (None, state.rv())
    } else {
        (
            None,
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion: {rv:?}")))?,
        )
    };
    drop(state);
    let spec = WatchSpec {
        view: View::of(call),
        target,
        options,
        initial,
        initial_end: send_initial == Some(true),
        cursor,
        bookmarks,
        timeout,
        notify,
    };
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(run_watch(shared.clone(), spec, tx));
    let mut response = Response::new(Body::Stream(rx));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
        .headers_mut()
        .insert("Transfer-Encoding", HeaderValue::from_static("chunked"));
    Ok(response)
}

/// Streams a watch until its timeout, a fault, shutdown, or the client leaving.
async fn run_watch(shared: Arc<Shared>, mut spec: WatchSpec, tx: mpsc::Sender<Bytes>) {
    let gr = spec.target.gr();
    let mut end = shared.faults.end_watches.subscribe();
    let mut silence = shared.faults.silence_changed.subscribe();
    let mut shutdown = shared.shutdown.clone();
    let deadline = spec.timeout.map(|t| Instant::now() + t);
    let period = shared.settings.bookmark_interval;
    let mut bookmark_tick = tokio::time::interval_at(Instant::now() + period, period);
    let mut bookmark_due = false;
    loop {
        let silenced = shared.faults.is_silenced(&gr.group, &gr.plural);
        if !silenced {
            if let Some(initial) = spec.initial.take() {
                for object in &initial {
                    if tx.send(encode(&spec, "ADDED", object)).await.is_err() {
                        return;
                    }
                }
                if spec.initial_end && tx.send(bookmark(&spec, true)).await.is_err() {
                    return;
                }
            }
            let since = shared.state().since(&gr, spec.cursor);
            match since {
                Since::Events(events, cursor) => {
                    for event in &events {
                        let Some(line) = deliver(&spec, event) else {
                            continue;
                        };
                        if tx.send(line).await.is_err() {
                            return;
                        }
                    }
                    spec.cursor = cursor;
                    if !events.is_empty() {
                        // Look again before waiting: the wake-up for what came after these may be spent.
                        continue;
                    }
                }
                Since::Expired(oldest) => {
                    let error = ApiError::expired(format!(
                        "too old resource version: {} ({oldest})",
                        spec.cursor
                    ));
                    let _ = tx.send(encode_event("ERROR", &error.to_status())).await;
                    return;
                }
                Since::Gone => return,
            }
            if bookmark_due {
                bookmark_due = false;
                if tx.send(bookmark(&spec, false)).await.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            changed = spec.notify.changed() => if changed.is_err() { return },
            _ = bookmark_tick.tick(), if spec.bookmarks => bookmark_due = true,
            _ = end.changed() => return,
            _ = silence.changed() => {}
            _ = sleep_until(deadline) => return,
            _ = stopped(&mut shutdown) => return,
            _ = tx.closed() => return,
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The line for an event as this watcher sees it, with selector transitions as the API server makes them:
/// an object that stops matching is DELETED for this watcher (in its state before the change, at the
/// change's version), one that starts matching is ADDED.
fn deliver(spec: &WatchSpec, event: &store::Event) -> Option<Bytes> {
    let now = spec.options.selects(&event.key, &event.object);
    let before = event
        .old
        .as_ref()
        .is_some_and(|old| spec.options.selects(&event.key, old));
    let type_ = match (event.type_, before, now) {
        (EventType::Added, _, true) => EventType::Added,
        (EventType::Modified, true, true) => EventType::Modified,
        (EventType::Modified, false, true) => EventType::Added,
        (EventType::Modified, true, false) => EventType::Deleted,
        (EventType::Deleted, b, n) if b || n => EventType::Deleted,
        _ => return None,
    };
    if (event.type_, type_) == (EventType::Modified, EventType::Deleted) {
        // As the API server's watch cache: the object as this watcher last saw it (it no longer
        // matches as it is now), with the version of the change that made it leave.
        if let Some(old) = &event.old {
            let mut left = Value::clone(old);
            left["metadata"]["resourceVersion"] = Value::from(event.rv.to_string());
            return Some(encode(spec, type_.as_str(), &Arc::new(left)));
        }
    }
    let as_stored =
        spec.view == View::Object && event.object["apiVersion"] == spec.target.api_version.as_str();
    if type_ == event.type_ && as_stored {
        Some(event.encoded())
    } else {
        Some(encode(spec, type_.as_str(), &event.object))
    }
}

fn encode(spec: &WatchSpec, type_: &str, object: &Arc<Value>) -> Bytes {
    let object = spec.target.present(object);
    match spec.view {
        View::Table(include) => {
            let rv = store::resource_version(&object).to_string();
            encode_event(
                type_,
                &table::table(
                    &spec.target.rtype,
                    &spec.target.version,
                    &[&object],
                    &rv,
                    None,
                    include,
                ),
            )
        }
        View::Metadata => encode_event(type_, &table::partial_metadata(&object)),
        View::Object => encode_event(type_, &object),
    }
}

fn bookmark(spec: &WatchSpec, initial_end: bool) -> Bytes {
    let mut metadata =
        json!({"resourceVersion": spec.cursor.to_string(), "creationTimestamp": null});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object = json!({"kind": spec.target.rtype.kind, "apiVersion": spec.target.api_version, "metadata": metadata});
    let object = match spec.view {
        View::Metadata => table::partial_metadata(&object),
        _ => object,
    };
    encode_event("BOOKMARK", &object)
}

fn admin(shared: &Arc<Shared>, call: &Call, rest: &[&str]) -> ApiResult<Response<Body>> {
    let faults = &shared.faults;
    let body = || -> ApiResult<Value> {
        if call.body.is_empty() {
            Ok(json!({}))
        } else {
            call.json()
        }
    };
    let matcher = |value: &Value| -> ApiResult<Matcher> {
        serde_json::from_value(value.clone()).map_err(|e| ApiError::bad_request(e.to_string()))
    };
    match (&call.method, rest) {
        (&Method::GET, ["stats"]) => {
            let state = shared.state();
            ok(&json!({"objects": state.object_count(), "resourceVersion": state.rv().to_string()}))
        }
        (&Method::POST, ["faults", "end-watches"]) => {
            faults.end_watches();
            ok(&json!({"done": "end-watches"}))
        }
        (&Method::POST, ["faults", "compact"]) => {
            faults.compact();
            ok(&json!({"done": "compact"}))
        }
        (&Method::POST, ["faults", "fail"]) => {
            let failure: Failure = serde_json::from_value(body()?)
                .map_err(|e| ApiError::bad_request(format!("invalid failure: {e}")))?;
            faults.fail(failure);
            ok(&json!({"done": "fail"}))
        }
        (&Method::POST, ["faults", "latency"]) => {
            let body = body()?;
            let millis = body["millis"]
                .as_u64()
                .ok_or_else(|| ApiError::bad_request("latency needs \"millis\""))?;
            faults.add_latency(matcher(&body)?, Duration::from_millis(millis));
            ok(&json!({"done": "latency"}))
        }
        (&Method::POST, ["faults", "silence"]) => {
            faults.silence_watches(matcher(&body()?)?);
            ok(&json!({"done": "silence"}))
        }
        (&Method::POST, ["faults", "reset"]) => {
            faults.reset();
            ok(&json!({"done": "reset"}))
        }
        _ => Err(ApiError::no_route("/_emulator")),
    }
}

fn ok(value: &Value) -> ApiResult<Response<Body>> {
    Ok(json_bytes(
        StatusCode::OK,
        serde_json::to_vec(value).unwrap_or_default(),
    ))
}

fn object_response(status: StatusCode, object: &Value) -> ApiResult<Response<Body>> {
    Ok(json_bytes(
        status,
        serde_json::to_vec(object).unwrap_or_default(),
    ))
}

/// `/openapi/v2`: JSON, or protobuf when asked for it (as kubectl does).
fn openapi_v2(shared: &Arc<Shared>, accept: &str) -> Response<Body> {
    let document = openapi::v2(&shared.state().types());
    if !wants_protobuf_openapi(accept) {
        return json_bytes(
            StatusCode::OK,
            serde_json::to_vec(&document).unwrap_or_default(),
        );
    }
    let mut response = Response::new(Body::Full(Some(Bytes::from(openapi_proto::document(
        &document,
    )))));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(openapi_proto::CONTENT_TYPE),
    );
    response
}

/// Whether `/openapi/v2` is asked for in protobuf: its media type is accepted, ahead of JSON if
/// both are (kubectl asks for protobuf alone).
fn wants_protobuf_openapi(accept: &str) -> bool {
    let position = |wanted: &str| {
        accept
            .split(',')
            .position(|item| item.split(';').next().unwrap_or_default().trim() == wanted)
    };
    match (
        position(openapi_proto::ACCEPT),
        position("application/json"),
    ) {
        (Some(protobuf), Some(json)) => protobuf < json,
        (protobuf, _) => protobuf.is_some(),
    }
}

fn json_bytes(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Body::Full(Some(Bytes::from(body))));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::Full(Some(Bytes::from_static(body.as_bytes()))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn error_response(error: &ApiError) -> Response<Body> {
    let mut response = json_bytes(
        StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        serde_json::to_vec(&error.to_status()).unwrap_or_default(),
    );
    if let Some(seconds) = error.retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}
