//! The kinds the emulator serves: the built-in ones, and those that CustomResourceDefinitions add.
//!
//! A [`ResourceType`] says everything the storage and the HTTP layer need to know about a kind: its
//! names, scope, served versions, subresources, and the API server's per-kind rules (whether it tracks
//! `metadata.generation`, whether a PUT may omit the resourceVersion, how names are validated).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::status::{ApiError, ApiResult, Cause};
use crate::validation::NameRule;

/// A group and a plural: the identity of a stored collection, whatever version it is read in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    /// The API group, `""` for the core group.
    pub group: String,
    /// The plural resource name.
    pub plural: String,
}

impl GroupResource {
    /// A group and a plural.
    pub fn new(group: &str, plural: &str) -> Self {
        GroupResource {
            group: group.to_string(),
            plural: plural.to_string(),
        }
    }
}

impl std::fmt::Display for GroupResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.plural)
        } else {
            write!(f, "{}.{}", self.plural, self.group)
        }
    }
}

/// An `additionalPrinterColumns` entry (and the built-in `Name` and `Age`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// `name`, `date`, ... (the Table's `format`).
    pub format: String,
    /// A simple JSONPath (`.spec.size`) into the object.
    pub json_path: String,
    /// Shown with `-o wide` only when > 0.
    pub priority: i64,
    /// Column description.
    pub description: String,
}

/// One served version of a kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    /// `v1`, `v1beta1`, ...
    pub name: String,
    /// Whether `/status` is served.
    pub status: bool,
    /// Whether `/scale` is served, and the paths it maps (spec replicas, status replicas).
    pub scale: Option<(String, String)>,
    /// The `openAPIV3Schema` of a custom resource, for pruning and validation.
    pub schema: Option<Value>,
    /// Extra printer columns for `kubectl get`.
    pub columns: Vec<PrinterColumn>,
}

/// Everything the emulator knows about one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// The API group, `""` for core.
    pub group: String,
    /// Served versions, the preferred one first.
    pub versions: Vec<Version>,
    /// The version objects are stored in (their `apiVersion` as kept).
    pub storage_version: String,
    /// Plural name (`widgets`).
    pub plural: String,
    /// Singular name (`widget`).
    pub singular: String,
    /// Kind (`Widget`).
    pub kind: String,
    /// List kind (`WidgetList`).
    pub list_kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// `kubectl` short names.
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Whether the kind keeps `metadata.generation`.
    pub generation: bool,
    /// Whether a PUT may omit `metadata.resourceVersion` (false for custom resources).
    pub unconditional_update: bool,
    /// How names are validated.
    pub name_rule: NameRule,
    /// Whether this kind comes from a CustomResourceDefinition.
    pub custom: bool,
}

impl ResourceType {
    /// The collection's identity.
    pub fn group_resource(&self) -> GroupResource {
        GroupResource::new(&self.group, &self.plural)
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    /// A served version by name.
    pub fn version(&self, name: &str) -> Option<&Version> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// Whether the stored object has a status subresource in its storage version.
    pub fn has_status(&self) -> bool {
        self.version(&self.storage_version)
            .or(self.versions.first())
            .is_some_and(|v| v.status)
    }

    /// The discovery entries of this kind (and its subresources) in one version.
    pub fn discovery(&self, version: &Version) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "storageVersionHash": storage_version_hash(&self.group, &self.storage_version, &self.kind),
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut entries = vec![main];
        if version.status {
            entries.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if version.scale.is_some() {
            entries.push(json!({
                "name": format!("{}/scale", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        entries
    }
}

/// A stable hash, as the API server publishes one, so clients can tell storage versions apart.
fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    use base64::Engine;
    let hash = fnv1a(&format!("{group}/{version}/{kind}"));
    base64::engine::general_purpose::STANDARD.encode(hash.to_be_bytes())
}

/// FNV-1a: a stable, dependency-free hash for the fingerprints the API server publishes.
pub(crate) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100000001b3)
    })
}

/// A built-in kind; every one the emulator serves is in the `v1` of its group.
struct Builtin {
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    generation: bool,
    name_rule: NameRule,
}

const fn builtin(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status: bool,
    generation: bool,
) -> Builtin {
    Builtin {
        group,
        plural,
        kind,
        namespaced,
        short_names,
        categories: &[],
        status,
        generation,
        name_rule: NameRule::Subdomain,
    }
}

/// The built-in kinds, stored as plain objects (no controllers act on them).
#[allow(
    clippy::too_many_lines,
    reason = "a table of the built-in kinds, one entry each"
)]
fn builtins() -> Vec<Builtin> {
    const ALL: &[&str] = &["all"];
    let mut list = vec![
        Builtin {
            name_rule: NameRule::Label,
            ..builtin("", "namespaces", "Namespace", false, &["ns"], true, false)
        },
        builtin("", "configmaps", "ConfigMap", true, &["cm"], false, false),
        builtin("", "secrets", "Secret", true, &[], false, false),
        Builtin {
            categories: ALL,
            ..builtin("", "pods", "Pod", true, &["po"], true, false)
        },
        Builtin {
            categories: ALL,
            name_rule: NameRule::Label,
            ..builtin("", "services", "Service", true, &["svc"], true, false)
        },
        builtin("", "events", "Event", true, &["ev"], false, false),
        builtin(
            "",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
            false,
        ),
        builtin(
            "",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            true,
            &["pvc"],
            true,
            false,
        ),
        builtin(
            "",
            "persistentvolumes",
            "PersistentVolume",
            false,
            &["pv"],
            true,
            false,
        ),
        builtin("", "nodes", "Node", false, &["no"], true, false),
        builtin("", "endpoints", "Endpoints", true, &["ep"], false, false),
        Builtin {
            categories: ALL,
            ..builtin(
                "apps",
                "deployments",
                "Deployment",
                true,
                &["deploy"],
                true,
                true,
            )
        },
        Builtin {
            categories: ALL,
            ..builtin(
                "apps",
                "replicasets",
                "ReplicaSet",
                true,
                &["rs"],
                true,
                true,
            )
        },
        Builtin {
            categories: ALL,
            ..builtin(
                "apps",
                "statefulsets",
                "StatefulSet",
                true,
                &["sts"],
                true,
                true,
            )
        },
        Builtin {
            categories: ALL,
            ..builtin("apps", "daemonsets", "DaemonSet", true, &["ds"], true, true)
        },
        Builtin {
            categories: ALL,
            ..builtin("batch", "jobs", "Job", true, &[], true, true)
        },
        Builtin {
            categories: ALL,
            ..builtin("batch", "cronjobs", "CronJob", true, &["cj"], true, true)
        },
        Builtin {
            categories: ALL,
            ..builtin(
                "",
                "replicationcontrollers",
                "ReplicationController",
                true,
                &["rc"],
                true,
                true,
            )
        },
        builtin(
            "",
            "resourcequotas",
            "ResourceQuota",
            true,
            &["quota"],
            true,
            false,
        ),
        builtin(
            "",
            "limitranges",
            "LimitRange",
            true,
            &["limits"],
            false,
            false,
        ),
        builtin("", "podtemplates", "PodTemplate", true, &[], false, false),
        builtin(
            "networking.k8s.io",
            "ingresses",
            "Ingress",
            true,
            &["ing"],
            true,
            true,
        ),
        builtin(
            "networking.k8s.io",
            "ingressclasses",
            "IngressClass",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "networking.k8s.io",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
            false,
            true,
        ),
        builtin(
            "policy",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            &["pdb"],
            true,
            true,
        ),
        builtin(
            "scheduling.k8s.io",
            "priorityclasses",
            "PriorityClass",
            false,
            &["pc"],
            false,
            true,
        ),
        builtin(
            "coordination.k8s.io",
            "leases",
            "Lease",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "events.k8s.io",
            "events",
            "Event",
            true,
            &["ev"],
            false,
            false,
        ),
        builtin(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
            &[],
            false,
            true,
        ),
    ];
    for (plural, kind, namespaced) in [
        ("roles", "Role", true),
        ("rolebindings", "RoleBinding", true),
        ("clusterroles", "ClusterRole", false),
        ("clusterrolebindings", "ClusterRoleBinding", false),
    ] {
        list.push(Builtin {
            name_rule: NameRule::PathSegment,
            ..builtin(
                "rbac.authorization.k8s.io",
                plural,
                kind,
                namespaced,
                &[],
                false,
                false,
            )
        });
    }
    list
}

/// The built-in kinds as resource types.
pub fn builtin_types() -> Vec<Arc<ResourceType>> {
    builtins()
        .into_iter()
        .map(|b| {
            let scale = matches!(
                b.plural,
                "deployments" | "replicasets" | "statefulsets" | "replicationcontrollers"
            )
            .then(|| ("/spec/replicas".to_string(), "/status/replicas".to_string()));
            Arc::new(ResourceType {
                group: b.group.to_string(),
                versions: vec![Version {
                    name: "v1".to_string(),
                    status: b.status,
                    scale,
                    schema: None,
                    columns: Vec::new(),
                }],
                storage_version: "v1".to_string(),
                plural: b.plural.to_string(),
                singular: b.kind.to_lowercase(),
                kind: b.kind.to_string(),
                list_kind: format!("{}List", b.kind),
                namespaced: b.namespaced,
                short_names: b.short_names.iter().map(|s| s.to_string()).collect(),
                categories: b.categories.iter().map(|s| s.to_string()).collect(),
                generation: b.generation,
                unconditional_update: true,
                name_rule: b.name_rule,
                custom: false,
            })
        })
        .collect()
}

/// Reads a CustomResourceDefinition into the resource type it serves, or says why it is invalid.
#[allow(
    clippy::too_many_lines,
    reason = "the API server's checks of a CRD, in its order, one after the other"
)]
pub fn from_crd(crd: &Value) -> ApiResult<ResourceType> {
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let spec = &crd["spec"];
    let mut causes = Vec::new();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let group = text(&spec["group"]);
    let names = &spec["names"];
    let plural = text(&names["plural"]);
    let kind = text(&names["kind"]);
    if group.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.group",
            "Required value",
        ));
    } else if !group.contains('.') {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.group",
            format!("{group:?}: should be a domain with at least one dot"),
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.plural",
            "Required value",
        ));
    } else if !crate::validation::is_dns_label(&plural) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.names.plural",
            format!("{plural:?}: a lowercase RFC 1123 label is required"),
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.kind",
            "Required value",
        ));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("{name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let scope = spec["scope"].as_str().unwrap_or_default();
    if !matches!(scope, "Namespaced" | "Cluster") {
        causes.push(Cause::new(
            "FieldValueNotSupported",
            "spec.scope",
            format!("{scope:?}: supported values: \"Cluster\", \"Namespaced\""),
        ));
    }
    let mut versions = Vec::new();
    let mut storage = Vec::new();
    for (i, version) in spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let version_name = text(&version["name"]);
        if version_name.is_empty() {
            causes.push(Cause::new(
                "FieldValueRequired",
                format!("spec.versions[{i}].name"),
                "Required value",
            ));
            continue;
        }
        if version["storage"] == Value::Bool(true) {
            storage.push(version_name.clone());
        }
        if version["served"] != Value::Bool(true) {
            continue;
        }
        let subresources = version
            .get("subresources")
            .or(spec.get("subresources"))
            .cloned()
            .unwrap_or(Value::Null);
        let scale = subresources.get("scale").map(|scale| {
            let path = |field: &str| {
                format!(
                    "/{}",
                    text(&scale[field])
                        .trim_start_matches('.')
                        .replace('.', "/")
                )
            };
            (path("specReplicasPath"), path("statusReplicasPath"))
        });
        let schema = version
            .pointer("/schema/openAPIV3Schema")
            .or(spec.pointer("/validation/openAPIV3Schema"))
            .cloned();
        let columns = version
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| PrinterColumn {
                name: text(&c["name"]),
                type_: text(&c["type"]),
                format: text(&c["format"]),
                json_path: text(&c["jsonPath"]),
                priority: c["priority"].as_i64().unwrap_or(0),
                description: text(&c["description"]),
            })
            .collect();
        versions.push(Version {
            name: version_name,
            status: subresources.get("status").is_some(),
            scale,
            schema,
            columns,
        });
    }
    if spec["versions"].as_array().is_none_or(Vec::is_empty) {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    } else if storage.len() != 1 {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            name,
            causes,
        ));
    }
    versions.sort_by_key(|v| std::cmp::Reverse(version_priority(&v.name)));
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    };
    Ok(ResourceType {
        singular: names["singular"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map_or_else(|| kind.to_lowercase(), String::from),
        list_kind: names["listKind"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map_or_else(|| format!("{kind}List"), String::from),
        short_names: strings(&names["shortNames"]),
        categories: strings(&names["categories"]),
        group,
        versions,
        storage_version: storage.remove(0),
        plural,
        kind,
        namespaced: scope == "Namespaced",
        generation: true,
        unconditional_update: false,
        name_rule: NameRule::Subdomain,
        custom: true,
    })
}

/// Kubernetes' version ordering: GA before beta before alpha, higher numbers first, others last.
pub fn version_priority(version: &str) -> (u8, u64, u64, std::cmp::Reverse<String>) {
    let parse = |s: &str| -> Option<(u8, u64, u64)> {
        let rest = s.strip_prefix('v')?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let major: u64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((3, major, 0));
        }
        for (prefix, rank) in [("beta", 2), ("alpha", 1)] {
            if let Some(minor) = tail.strip_prefix(prefix) {
                return Some((rank, major, minor.parse().ok()?));
            }
        }
        None
    };
    match parse(version) {
        Some((rank, major, minor)) => (rank, major, minor, std::cmp::Reverse(String::new())),
        None => (0, 0, 0, std::cmp::Reverse(version.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false},
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                     "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]},
                    {"name": "v2alpha1", "served": false, "storage": false}
                ]
            }
        })
    }

    #[test]
    fn crd_serves_its_served_versions_preferred_first() {
        let rt = from_crd(&crd()).unwrap();
        let names: Vec<_> = rt.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["v1", "v1beta1"]);
        assert_eq!(rt.storage_version, "v1");
        assert!(rt.has_status());
        assert_eq!(rt.list_kind, "WidgetList");
        assert_eq!(rt.versions[0].columns[0].json_path, ".spec.size");
    }

    #[test]
    fn crd_name_must_be_plural_dot_group() {
        let mut bad = crd();
        bad["metadata"]["name"] = json!("widgets");
        let error = from_crd(&bad).unwrap_err();
        assert_eq!(error.code, 422);
        assert!(error.message.contains("metadata.name"));
    }

    #[test]
    fn versions_sort_as_kubernetes_sorts_them() {
        let mut versions = vec!["v1alpha1", "v2", "foo", "v1beta2", "v1", "v1beta1", "v10"];
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(
            versions,
            ["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }
}
