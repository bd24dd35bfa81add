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

/// Installs the widget CRD through `client` and returns the widgets of the `default` namespace, once
/// they are served (a real API server serves a new CRD's kind a moment after creating it).
pub async fn install_widgets(
    client: &kube::Client,
) -> kube::Result<kube::Api<kube::api::DynamicObject>> {
    let crds: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(client.clone(), &crd_api_resource());
    let crd = serde_json::from_value(widget_crd()).map_err(kube::Error::SerdeError)?;
    crds.create(&kube::api::PostParams::default(), &crd).await?;
    let widgets = kube::Api::namespaced_with(client.clone(), "default", &widget_api_resource());
    until_served(&widgets).await?;
    until_discovered(client, "example.com", "v1", "widgets").await?;
    Ok(widgets)
}

/// Waits until discovery lists `plural` in `group`/`version` (both `/apis` and the group-version's
/// resource list), for at most 30 s. A real API server serves a new CRD's objects a moment before
/// its discovery documents name it, so what resolves kinds through discovery (RBAC generation, an
/// operator's start) must wait for this, not for the list to answer. At the deadline it returns
/// all the same: the resolution that follows says what is missing.
pub async fn until_discovered(
    client: &kube::Client,
    group: &str,
    version: &str,
    plural: &str,
) -> kube::Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let grouped = client
            .list_api_groups()
            .await?
            .groups
            .iter()
            .any(|g| g.name == group && g.versions.iter().any(|v| v.version == version));
        let listed = grouped
            && match client
                .list_api_group_resources(&format!("{group}/{version}"))
                .await
            {
                Ok(list) => list.resources.iter().any(|r| r.name == plural),
                Err(kube::Error::Api(status)) if status.code == 404 => false,
                Err(error) => return Err(error),
            };
        if listed || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Waits until `api`'s resource is served (a list answers something else than 404 Not Found), for
/// at most 30 s: a real API server serves a CRD's kind a moment after the CRD is created.
pub async fn until_served<K>(api: &kube::Api<K>) -> kube::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match api.list(&kube::api::ListParams::default().limit(1)).await {
            Err(kube::Error::Api(status)) if status.code == 404 => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(kube::Error::Api(status));
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

/// Waits until the CRD `name` is established (its `Established` condition is `True`), for at most
/// 30 s: a real API server establishes a CRD a moment after it is created, the emulator at once.
/// At the deadline it returns all the same: the next request on the kind says what is wrong.
pub async fn until_established(client: &kube::Client, name: &str) -> kube::Result<()> {
    let crds: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(client.clone(), &crd_api_resource());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let crd = crds.get(name).await?;
        let established = crd.data["status"]["conditions"]
            .as_array()
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
        if established || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
