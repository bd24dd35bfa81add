//! A sample custom resource, for the demo and for tests: `widgets.example.com`.

use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::{json, Value};

/// The `widgets.example.com` CRD: namespaced, `v1` served and stored, with a status subresource,
/// a schema (`spec.size` an integer, status open), printer columns and the short name `wd`.
pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                 "properties": {"size": {"type": "integer", "minimum": 0}}},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    })
}

/// A `Widget` named `name` of the given size, in the `default` namespace.
pub fn widget(name: &str, size: i64) -> Value {
    json!({
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "demo"}},
        "spec": {"size": size},
    })
}

/// The `widgets.example.com/v1` resource, for `kube::Api::namespaced_with`.
pub fn widget_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    )
}

/// The `customresourcedefinitions.apiextensions.k8s.io/v1` resource, for `kube::Api::all_with`.
pub fn crd_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    )
}

/// Installs the widget CRD through `client` and returns the widgets of the `default` namespace.
pub async fn install_widgets(
    client: &kube::Client,
) -> kube::Result<kube::Api<kube::api::DynamicObject>> {
    let crds: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(client.clone(), &crd_api_resource());
    let crd = serde_json::from_value(widget_crd()).map_err(kube::Error::SerdeError)?;
    crds.create(&kube::api::PostParams::default(), &crd).await?;
    Ok(kube::Api::namespaced_with(
        client.clone(),
        "default",
        &widget_api_resource(),
    ))
}
