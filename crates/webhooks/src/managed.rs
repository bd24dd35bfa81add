//! The webhook configurations the operator keeps (Kopf's `settings.admission.managed`): one
//! `ValidatingWebhookConfiguration` and one `MutatingWebhookConfiguration` named after the setting,
//! a webhook per handler, pointed at the operator's server with its CA bundle; patched when the CA
//! changes, and at exit left with only the persistent webhooks (or deleted).
//!
//! Each webhook, as Kopf makes it (`reference/kopf.md` §1.14): the name `<id>.<managed>` (`/` in
//! the id becomes `.`, `_` becomes `-`), `sideEffects: None` (`NoneOnDryRun` with side effects),
//! `failurePolicy: Fail` (`Ignore`), `matchPolicy: Equivalent`, one rule for the handler's resource
//! (its operations, or `*`; `scope: *`), an `objectSelector` from its label filters,
//! `clientConfig` with the server's URL and the handler's id as the path, `timeoutSeconds` (30 by
//! default) and `admissionReviewVersions: [v1, v1beta1]`.

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kactor_reactor::admission::AdmissionKind;
use kactor_reactor::filters::MetaFilter;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::review::{Served, DEFAULT_TIMEOUT};

/// The name of a handler's webhook in a configuration named `managed`.
pub fn webhook_name(id: &str, managed: &str) -> String {
    format!("{}.{managed}", id.replace('/', ".").replace('_', "-"))
}

/// What is quoted in a webhook's path: as Python's `urllib.parse.quote` (Kopf's), all but letters,
/// digits and `-._~`.
const QUOTED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The URL path of a handler's webhook under the server's `path` prefix (the id, URL-quoted).
pub fn webhook_path(prefix: &str, id: &str) -> String {
    let quoted = percent_encoding::utf8_percent_encode(id, QUOTED);
    format!("{}/{quoted}", prefix.trim_end_matches('/'))
}

/// The webhooks of one kind for these handlers: `base_url` is the server's (`https://host:port`
/// and the path prefix), `ca_pem` its CA bundle.
pub fn webhooks(
    kind: AdmissionKind,
    served: &[Served],
    managed: &str,
    base_url: &str,
    ca_pem: &[u8],
    only_persistent: bool,
) -> Vec<Value> {
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    served
        .iter()
        .filter(|s| s.handler.kind == kind)
        .filter(|s| !only_persistent || s.handler.admission.persistent)
        .map(|s| {
            let admission = &s.handler.admission;
            let resource = &s.resource;
            let plural = match &admission.subresource {
                Some(sub) => format!("{}/{sub}", resource.plural),
                None => resource.plural.clone(),
            };
            let operations: Vec<&str> = if admission.operations.is_empty() {
                vec!["*"]
            } else {
                admission.operations.iter().map(|o| o.as_str()).collect()
            };
            let timeout = admission.timeout.unwrap_or(DEFAULT_TIMEOUT).as_secs().clamp(1, 30);
            let mut webhook = json!({
                "name": webhook_name(&admission.id, managed),
                "sideEffects": if admission.side_effects { "NoneOnDryRun" } else { "None" },
                "failurePolicy": if admission.ignore_failures { "Ignore" } else { "Fail" },
                "matchPolicy": "Equivalent",
                "rules": [{
                    "apiGroups": [resource.group],
                    "apiVersions": [resource.version],
                    "resources": [plural],
                    "operations": operations,
                    "scope": "*",
                }],
                "clientConfig": {
                    "url": format!("{}{}", base_url.trim_end_matches('/'), webhook_path("", &admission.id)),
                    "caBundle": ca_bundle,
                },
                "timeoutSeconds": timeout,
                "admissionReviewVersions": ["v1", "v1beta1"],
            });
            if let Some(selector) = object_selector(&admission.filters.labels) {
                webhook["objectSelector"] = selector;
            }
            webhook
        })
        .collect()
}

/// The label filters the API server can check itself: values, presence and absence (callbacks
/// are checked by the handler's own filters only).
fn object_selector(labels: &[(String, MetaFilter)]) -> Option<Value> {
    let mut match_labels = serde_json::Map::new();
    let mut expressions = Vec::new();
    for (key, filter) in labels {
        match filter {
            MetaFilter::Is(value) => {
                match_labels.insert(key.clone(), json!(value));
            }
            MetaFilter::Present => expressions.push(json!({"key": key, "operator": "Exists"})),
            MetaFilter::Absent => {
                expressions.push(json!({"key": key, "operator": "DoesNotExist"}));
            }
            MetaFilter::Check(_) => {}
        }
    }
    if match_labels.is_empty() && expressions.is_empty() {
        return None;
    }
    let mut selector = json!({});
    if !match_labels.is_empty() {
        selector["matchLabels"] = Value::Object(match_labels);
    }
    if !expressions.is_empty() {
        selector["matchExpressions"] = json!(expressions);
    }
    Some(selector)
}

/// Creates the configuration of `kind` named `managed` with these webhooks, or sets its webhooks
/// (every other field of it is left as it is). Nothing is done for no webhooks.
pub async fn apply(
    client: &kube::Client,
    kind: AdmissionKind,
    managed: &str,
    webhooks: Vec<Value>,
) -> Result<(), kube::Error> {
    if webhooks.is_empty() {
        return Ok(());
    }
    let (api_kind, body) = (kind_name(kind), json!({"webhooks": webhooks}));
    let object = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": api_kind,
        "metadata": {"name": managed},
        "webhooks": body["webhooks"],
    });
    match kind {
        AdmissionKind::Validating => {
            upsert::<ValidatingWebhookConfiguration>(client, managed, object, body).await
        }
        AdmissionKind::Mutating => {
            upsert::<MutatingWebhookConfiguration>(client, managed, object, body).await
        }
    }
}

/// At exit: the configuration keeps only `persistent` webhooks, or is deleted if none is.
pub async fn withdraw(
    client: &kube::Client,
    kind: AdmissionKind,
    managed: &str,
    persistent: Vec<Value>,
) -> Result<(), kube::Error> {
    match kind {
        AdmissionKind::Validating => {
            shrink::<ValidatingWebhookConfiguration>(client, managed, persistent).await
        }
        AdmissionKind::Mutating => {
            shrink::<MutatingWebhookConfiguration>(client, managed, persistent).await
        }
    }
}

/// Points the CRD's conversion at the server (`strategy: Webhook`, with its URL and CA bundle).
pub async fn convert_through(
    client: &kube::Client,
    crd: &str,
    url: &str,
    ca_pem: &[u8],
) -> Result<(), kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch = json!({"spec": {"conversion": {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {
                "url": url,
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
            "conversionReviewVersions": ["v1"],
        },
    }}});
    api.patch(crd, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

fn kind_name(kind: AdmissionKind) -> &'static str {
    match kind {
        AdmissionKind::Validating => "ValidatingWebhookConfiguration",
        AdmissionKind::Mutating => "MutatingWebhookConfiguration",
    }
}

/// What the two webhook configuration kinds are to the API: cluster-scoped typed objects.
trait Configuration:
    kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
{
}

impl<K> Configuration for K where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize
{
}

async fn upsert<K>(
    client: &kube::Client,
    name: &str,
    object: Value,
    webhooks: Value,
) -> Result<(), kube::Error>
where
    K: Configuration,
{
    let api: Api<K> = Api::all(client.clone());
    if api.get_opt(name).await?.is_some() {
        api.patch(name, &PatchParams::default(), &Patch::Merge(&webhooks))
            .await?;
        return Ok(());
    }
    let object: K = serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        // Made meanwhile (another replica): set its webhooks.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            api.patch(name, &PatchParams::default(), &Patch::Merge(&webhooks))
                .await?;
            Ok(())
        }
        Err(error) => Err(error),
    }
}

async fn shrink<K>(
    client: &kube::Client,
    name: &str,
    persistent: Vec<Value>,
) -> Result<(), kube::Error>
where
    K: Configuration,
{
    let api: Api<K> = Api::all(client.clone());
    let result = if persistent.is_empty() {
        api.delete(name, &DeleteParams::default()).await.map(|_| ())
    } else {
        let body = json!({"webhooks": persistent});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
    };
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kactor_reactor::admission::{admission_fn, Admission, AdmissionHandler, Operation};
    use kactor_reactor::filters::MetaFilter;
    use kactor_reactor::resources::{Resource, Selector};
    use std::sync::Arc;

    fn served(kind: AdmissionKind, admission: Admission) -> Served {
        Served {
            handler: AdmissionHandler {
                kind,
                selector: Selector::parse("widgets.example.com"),
                admission,
                func: admission_fn(|_| async { Ok(()) }),
            },
            resource: Arc::new(Resource::namespaced(
                "example.com",
                "v1",
                "Widget",
                "widgets",
            )),
        }
    }

    #[test]
    fn a_webhook_is_made_as_kopf_makes_it() {
        let all = [
            served(
                AdmissionKind::Validating,
                Admission::id("check_size")
                    .operations([Operation::Create, Operation::Update])
                    .label("app", "demo")
                    .label("skip", MetaFilter::Absent),
            ),
            served(
                AdmissionKind::Mutating,
                Admission::id("defaults").side_effects(),
            ),
        ];
        let hooks = webhooks(
            AdmissionKind::Validating,
            &all,
            "auto.kactor.dev",
            "https://localhost:9443",
            b"PEM",
            false,
        );
        assert_eq!(
            hooks,
            [json!({
                "name": "check-size.auto.kactor.dev",
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "rules": [{
                    "apiGroups": ["example.com"],
                    "apiVersions": ["v1"],
                    "resources": ["widgets"],
                    "operations": ["CREATE", "UPDATE"],
                    "scope": "*",
                }],
                "objectSelector": {
                    "matchLabels": {"app": "demo"},
                    "matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}],
                },
                "clientConfig": {"url": "https://localhost:9443/check_size", "caBundle": "UEVN"},
                "timeoutSeconds": 30,
                "admissionReviewVersions": ["v1", "v1beta1"],
            })]
        );
        let mutating = webhooks(AdmissionKind::Mutating, &all, "m", "https://h", b"", false);
        assert_eq!(mutating[0]["sideEffects"], "NoneOnDryRun");
        assert_eq!(mutating[0]["rules"][0]["operations"], json!(["*"]));
        assert!(webhooks(AdmissionKind::Mutating, &all, "m", "https://h", b"", true).is_empty());
    }
}
