//! A [`kube::Client`] that tells an [`Observer`] about every request it sends: the Kubernetes verb,
//! the status code and the time until the response's headers (for `kactor_api_requests_total` and
//! `kactor_api_request_duration_seconds`).
//!
//! It wraps any client, the one an operator builds from a kubeconfig and one an application hands
//! in alike, so every request of the operator (watches, patches, events, peering, leases) is counted
//! whatever the client was built with.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use kube::client::Body;
use tokio::time::Instant;
use tower_layer::Layer;

use crate::clients::observe::Observer;

/// `client`, with every request told to `observer`.
///
/// A client built here from a kubeconfig is better made with [`MeteredLayer`] (one buffer hop per
/// request instead of two); this is for a client handed in ready-made.
pub fn metered(client: kube::Client, observer: Arc<dyn Observer>) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    let service = MeteredLayer(observer).layer(Sender(client));
    kube::Client::new(service, namespace)
}

/// The layer that tells an observer about every request, for `kube::client::ClientBuilder::with_layer`.
#[derive(Clone)]
pub struct MeteredLayer(pub Arc<dyn Observer>);

impl<S> tower_layer::Layer<S> for MeteredLayer {
    type Service = Metered<S>;

    fn layer(&self, inner: S) -> Metered<S> {
        Metered {
            inner,
            observer: self.0.clone(),
        }
    }
}

/// The service of [`MeteredLayer`].
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    observer: Arc<dyn Observer>,
}

impl<S, B> tower_service::Service<http::Request<Body>> for Metered<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let verb = verb(
            request.method(),
            request.uri().path(),
            request.uri().query().unwrap_or(""),
        );
        let observer = self.observer.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let started = Instant::now();
            let response = response.await;
            let code = response.as_ref().ok().map(|r| r.status().as_u16());
            observer.api_request(verb, code, started.elapsed());
            response
        })
    }
}

/// Sends through a ready-made client.
#[derive(Clone)]
struct Sender(kube::Client);

impl tower_service::Service<http::Request<Body>> for Sender {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { client.send(request).await })
    }
}

/// The Kubernetes verb of a request, as the API server's audit log names it: `get`, `list`, `watch`,
/// `create`, `update`, `patch`, `delete`, `deletecollection`; `other` for what is none of them.
///
/// Paths are `/api/v1/...` (the core group) or `/apis/<group>/<version>/...`, then optionally
/// `namespaces/<ns>/`, then `<plural>[/<name>[/<subresource>]]`. A collection (no name) is listed,
/// watched, created into or deleted as a whole; a named object is got, updated, patched or deleted.
/// Discovery (`/api`, `/apis`, `/apis/<group>/<version>`) counts as `get`.
pub fn verb(method: &http::Method, path: &str, query: &str) -> &'static str {
    // On every request: the segments go into an array, not a vector. The longest path the API
    // has is eight segments (`/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>/<sub>`).
    let mut buffer = [""; 8];
    let mut count = 0;
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        if let Some(slot) = buffer.get_mut(count) {
            *slot = segment;
        }
        count += 1;
    }
    let segments = &buffer[..count.min(buffer.len())];
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or(&[]);
    // `namespaces/<ns>/<plural>...` is scoped; `namespaces[/<name>[/<sub>]]` is the namespaces.
    // What counts is how many segments follow: the plural, then the name and subresource.
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    // A path deeper than any of the API's is taken as a named object's (a name and more).
    let rest = if count > buffer.len() {
        &["<plural>", "<name>"][..]
    } else {
        rest
    };
    let collection = rest.len() <= 1;
    let watching = query
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1" || pair == "watch");
    match (method.as_str(), collection) {
        ("GET", _) if watching => "watch",
        ("GET", true) if rest.is_empty() => "get",
        ("GET", true) => "list",
        ("GET", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn verbs_are_the_api_servers() {
        let cases = [
            (Method::GET, "/api/v1/pods", "", "list"),
            (
                Method::GET,
                "/api/v1/namespaces/default/pods",
                "limit=500",
                "list",
            ),
            (Method::GET, "/api/v1/namespaces/default/pods/p", "", "get"),
            (
                Method::GET,
                "/api/v1/namespaces/default/pods/p/status",
                "",
                "get",
            ),
            (Method::GET, "/api/v1/namespaces", "", "list"),
            (Method::GET, "/api/v1/namespaces/default", "", "get"),
            (
                Method::GET,
                "/apis/example.com/v1/widgets",
                "watch=true&resourceVersion=5&allowWatchBookmarks=true",
                "watch",
            ),
            (Method::GET, "/apis/example.com/v1", "", "get"),
            (Method::GET, "/apis", "", "get"),
            (Method::GET, "/api", "", "get"),
            (
                Method::POST,
                "/api/v1/namespaces/default/events",
                "",
                "create",
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                "",
                "update",
            ),
            (
                Method::PATCH,
                "/apis/example.com/v1/namespaces/ns/widgets/w/status",
                "",
                "patch",
            ),
            (
                Method::PATCH,
                "/apis/kopf.dev/v1/clusterkopfpeerings/default",
                "",
                "patch",
            ),
            (
                Method::DELETE,
                "/apis/example.com/v1/namespaces/ns/widgets/w",
                "",
                "delete",
            ),
            (
                Method::DELETE,
                "/apis/example.com/v1/namespaces/ns/widgets",
                "",
                "deletecollection",
            ),
            (Method::HEAD, "/api/v1/pods", "", "other"),
        ];
        for (method, path, query, expected) in cases {
            assert_eq!(
                verb(&method, path, query),
                expected,
                "{method} {path}?{query}"
            );
        }
    }

    #[derive(Default)]
    struct Seen(std::sync::Mutex<Vec<(&'static str, Option<u16>)>>);

    impl Observer for Seen {
        fn api_request(&self, verb: &'static str, code: Option<u16>, _: std::time::Duration) {
            self.0.lock().unwrap().push((verb, code));
        }
    }

    #[tokio::test]
    async fn requests_are_counted_with_their_verb_and_code() {
        use kube::api::{Api, DynamicObject, ListParams};
        let emulator = kactor_emulator::Emulator::start().await.unwrap();
        let seen = Arc::new(Seen::default());
        let client = metered(emulator.client(), seen.clone());
        let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), "default");
        configmaps.list(&ListParams::default()).await.unwrap();
        assert!(configmaps.get("missing").await.is_err());
        let widgets: Api<DynamicObject> = Api::all_with(
            client,
            &kube::discovery::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("nowhere.example.com", "v1", "Widget"),
                "widgets",
            ),
        );
        assert!(widgets.list(&ListParams::default()).await.is_err());
        assert_eq!(
            *seen.0.lock().unwrap(),
            [("list", Some(200)), ("get", Some(404)), ("list", Some(404))]
        );
    }
}
