//! The peering resources: Kopf's CRDs ([`crds`]), their objects ([`peering_object`]), and which of
//! them the cluster serves ([`served_resources`]).

use kube::api::Api;
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

/// The API groups of the peering resources, newest first: `kopf.dev` (Kopf ≥ 1.29) and the legacy
/// `zalando.org`. Clusters serve one or the other (they cannot coexist); if both are served, both
/// are used, as in Kopf.
const GROUPS: [&str; 2] = ["kopf.dev", "zalando.org"];
const VERSION: &str = "v1";

/// One served peering resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeeringResource {
    /// `kopf.dev` or `zalando.org`.
    pub group: String,
    /// `clusterkopfpeerings` or `kopfpeerings`.
    pub plural: String,
    /// `ClusterKopfPeering` or `KopfPeering`.
    pub kind: String,
    /// Whether its objects live in namespaces (as served, whatever the plural suggests).
    pub namespaced: bool,
    /// Whether it has the status subresource (Kopf's CRDs do not; records then go to `/status`).
    pub has_status: bool,
}

impl PeeringResource {
    /// The plural for namespaced or cluster-wide peering.
    pub(crate) fn plural_for(namespaced: bool) -> &'static str {
        if namespaced {
            "kopfpeerings"
        } else {
            "clusterkopfpeerings"
        }
    }

    /// The kind for namespaced or cluster-wide peering.
    pub(crate) fn kind_for(namespaced: bool) -> &'static str {
        if namespaced {
            "KopfPeering"
        } else {
            "ClusterKopfPeering"
        }
    }

    /// An API for its objects: in `namespace` if it is namespaced, else cluster-wide.
    pub(crate) fn api<K>(&self, client: &kube::Client, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
    {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&self.group, VERSION, &self.kind),
            &self.plural,
        );
        match namespace {
            Some(namespace) if self.namespaced => {
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        }
    }
}

impl std::fmt::Display for PeeringResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.plural, self.group)
    }
}

/// The peering resources the cluster serves, for namespaced (`kopfpeerings`) or cluster-wide
/// (`clusterkopfpeerings`) peering, in either group; empty if none is. A group that is not served at
/// all (404) is simply absent; any other failure is an error.
pub(crate) async fn served_resources(
    client: &kube::Client,
    namespaced: bool,
) -> Result<Vec<PeeringResource>, kube::Error> {
    let plural = PeeringResource::plural_for(namespaced);
    let mut served = Vec::new();
    for group in GROUPS {
        let list = match client
            .list_api_group_resources(&format!("{group}/{VERSION}"))
            .await
        {
            Ok(list) => list,
            Err(error) if super::records::is_not_found(&error) => continue,
            Err(error) => return Err(error),
        };
        let Some(entry) = list.resources.iter().find(|r| r.name == plural) else {
            continue;
        };
        let status = format!("{plural}/status");
        served.push(PeeringResource {
            group: group.to_string(),
            plural: plural.to_string(),
            kind: entry.kind.clone(),
            namespaced: entry.namespaced,
            has_status: list.resources.iter().any(|r| r.name == status),
        });
    }
    Ok(served)
}

/// The peering CRDs, as Kopf's `peering.yaml`: `clusterkopfpeerings.kopf.dev` (cluster-scoped, for
/// cluster-wide operators) and `kopfpeerings.kopf.dev` (namespaced, one object per served
/// namespace), `v1` served and stored, with an open `status` (`x-kubernetes-preserve-unknown-fields`)
/// where the records live. Like Kopf's, they have no status subresource. Install them once per
/// cluster; kactor never installs them itself.
pub fn crds() -> Vec<Value> {
    [
        ("ClusterKopfPeering", "Cluster"),
        ("KopfPeering", "Namespaced"),
    ]
    .into_iter()
    .map(|(kind, scope)| {
        let singular = kind.to_lowercase();
        let plural = format!("{singular}s");
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{}", GROUPS[0])},
            "spec": {
                "scope": scope,
                "group": GROUPS[0],
                "names": {"kind": kind, "plural": plural, "singular": singular},
                "versions": [{
                    "name": VERSION,
                    "served": true,
                    "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        },
                    }},
                }],
            },
        })
    })
    .collect()
}

/// A peering object named `name`: a `ClusterKopfPeering` (no namespace) or a `KopfPeering` in
/// `namespace`, of `kopf.dev/v1`. Operators peer through it once it exists.
pub fn peering_object(name: &str, namespace: Option<&str>) -> Value {
    let kind = PeeringResource::kind_for(namespace.is_some());
    let mut metadata = json!({"name": name});
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({
        "apiVersion": format!("{}/{VERSION}", GROUPS[0]),
        "kind": kind,
        "metadata": metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_are_kopfs() {
        let crds = crds();
        assert_eq!(crds.len(), 2);
        let names: Vec<&str> = crds
            .iter()
            .map(|c| c["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
        );
        assert_eq!(crds[0]["spec"]["scope"], "Cluster");
        assert_eq!(crds[1]["spec"]["scope"], "Namespaced");
        assert_eq!(crds[0]["spec"]["names"]["singular"], "clusterkopfpeering");
        assert_eq!(crds[1]["spec"]["names"]["kind"], "KopfPeering");
        for crd in &crds {
            let version = &crd["spec"]["versions"][0];
            assert_eq!(version["name"], "v1");
            assert_eq!(version["served"], true);
            assert_eq!(version["storage"], true);
            assert!(version.get("subresources").is_none());
            assert_eq!(
                version["schema"]["openAPIV3Schema"]["properties"]["status"]
                    ["x-kubernetes-preserve-unknown-fields"],
                true
            );
        }
    }

    #[test]
    fn peering_objects_are_cluster_or_namespaced() {
        assert_eq!(
            peering_object("default", None),
            json!({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "default"}})
        );
        assert_eq!(
            peering_object("x", Some("ns1"))["metadata"],
            json!({"name": "x", "namespace": "ns1"})
        );
        assert_eq!(peering_object("x", Some("ns1"))["kind"], "KopfPeering");
    }
}
