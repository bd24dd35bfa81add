//! One admission request: the `AdmissionReview` the API server sent, the handler run on it, and the
//! `AdmissionReview` answered (`reference/kopf.md` §2.10).
//!
//! The answer: `{apiVersion, kind: AdmissionReview, response: {uid, allowed, warnings?, patch?,
//! patchType?: JSONPatch, status?: {message, code}}}`, in the request's own `apiVersion` (`v1`, or
//! `v1beta1` from old servers).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::FutureExt;
use kactor_reactor::admission::{
    AdmissionCtx, AdmissionError, AdmissionHandler, AdmissionKind, Operation,
};
use kactor_reactor::execution::panic_message;
use kactor_reactor::handlers::{Ctx, HandlerError, Memo};
use kactor_reactor::resources::Resource;
use kactor_reactor::watching::EventType;
use kube::api::DynamicObject;
use serde_json::{json, Value};

/// How long a handler may take when its webhook names no timeout (the API server's own limit).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// An admission handler with the resource it serves, resolved.
#[derive(Clone)]
pub struct Served {
    /// The handler.
    pub handler: AdmissionHandler,
    /// Its resource.
    pub resource: Arc<Resource>,
}

/// Why a request cannot even be read.
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    /// Not an `AdmissionReview` with a request.
    #[error("not an AdmissionReview with a request: {0}")]
    Shape(&'static str),
}

/// A review's request, its uid and the review's `apiVersion` (`default` when it has none): what
/// every answer starts from.
pub fn request_of<'a>(
    review: &'a Value,
    default: &'static str,
) -> Result<(&'a Value, &'a str, &'a str), BadReview> {
    let request = review
        .get("request")
        .filter(|r| r.is_object())
        .ok_or(BadReview::Shape("no request"))?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .ok_or(BadReview::Shape("no request.uid"))?;
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or(default);
    Ok((request, uid, api_version))
}

/// Answers one `AdmissionReview`: the handler's verdict, warnings and (for a mutating handler) its
/// changes as a JSON patch.
pub async fn respond(
    served: &Served,
    review: &Value,
    client: &Arc<kube::Client>,
) -> Result<Value, BadReview> {
    let (request, uid, api_version) = request_of(review, "admission.k8s.io/v1")?;
    let operation = request
        .get("operation")
        .and_then(Value::as_str)
        .and_then(Operation::parse)
        .ok_or(BadReview::Shape("no known request.operation"))?;
    let object = |key: &str| -> Option<Arc<DynamicObject>> {
        let value = request.get(key).filter(|v| v.is_object())?;
        serde_json::from_value(value.clone()).ok().map(Arc::new)
    };
    let old = object("oldObject");
    // The object itself; for a deletion, the one being deleted (Kopf's `body`).
    let Some(body) = object("object").or_else(|| old.clone()) else {
        return Err(BadReview::Shape(
            "neither request.object nor request.oldObject",
        ));
    };
    let mut response = json!({"uid": uid, "allowed": true});
    let handler = &served.handler;
    let ctx = Ctx::new(
        EventType::Listed,
        body.clone(),
        Memo::default(),
        served.resource.clone(),
        client.clone(),
        std::time::Instant::now(),
    );
    if handler.serves(operation) && handler.admission.filters.matches(&ctx, false) {
        let ctx = Arc::new(AdmissionCtx::new(
            ctx,
            operation,
            old,
            request.get("userInfo").cloned().unwrap_or(Value::Null),
            request
                .get("dryRun")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            request
                .get("subResource")
                .and_then(Value::as_str)
                .map(String::from),
        ));
        let outcome = run(served, ctx.clone()).await;
        let warnings = ctx.warnings();
        if !warnings.is_empty() {
            response["warnings"] = json!(warnings);
        }
        match outcome {
            Ok(()) => {
                if handler.kind == AdmissionKind::Mutating {
                    if let Some(patch) = json_patch_of(&body, ctx.ctx()) {
                        response["patch"] = json!(patch);
                        response["patchType"] = json!("JSONPatch");
                    }
                }
            }
            Err(error) => {
                let (message, code) = error.status();
                tracing::info!(handler = %handler.admission.id, %operation, object = ctx.name(), code, "Denied: {message}");
                response["allowed"] = json!(false);
                response["status"] = json!({"message": message, "code": code});
            }
        }
    }
    Ok(json!({
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// Runs the handler: a panic or running out of time is its failure (the request is denied).
async fn run(served: &Served, ctx: Arc<AdmissionCtx>) -> Result<(), AdmissionError> {
    let admission = &served.handler.admission;
    let limit = admission.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let call = AssertUnwindSafe((served.handler.func)(ctx)).catch_unwind();
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(HandlerError::Panicked(panic_message(&panic)).into()),
        Err(_) => Err(AdmissionError::Failed(HandlerError::msg(format!(
            "the admission handler '{}' timed out after {} seconds",
            admission.id,
            limit.as_secs_f64()
        )))),
    }
}

/// What the handler's patch does to the object, as a base64 JSON patch; None if nothing.
fn json_patch_of(body: &DynamicObject, ctx: &Ctx) -> Option<String> {
    let patch = ctx.patch().to_value();
    let original = serde_json::to_value(body).ok()?;
    let mut patched = original.clone();
    if patch.as_object().is_some_and(|p| !p.is_empty()) {
        json_patch::merge(&mut patched, &patch);
    }
    for transform in ctx.patch().take().fns {
        transform(&mut patched);
    }
    let operations = json_patch::diff(&original, &patched);
    if operations.0.is_empty() {
        return None;
    }
    let text = serde_json::to_vec(&operations).ok()?;
    Some(base64::engine::general_purpose::STANDARD.encode(text))
}
