//! `olm bundle`: the operator as an Operator Lifecycle Manager bundle (registry+v1, the format
//! `operator-sdk generate bundle` writes), for catalogs and OperatorHub.
//!
//! A bundle is a directory:
//! * `manifests/PACKAGE.clusterserviceversion.yaml`: the ClusterServiceVersion
//!   (`operators.coreos.com/v1alpha1`), named `PACKAGE.vVERSION`;
//! * `manifests/GROUP_PLURAL.yaml`: each CRD the operator declared ([`Operator::crd`]), and with
//!   `--peering` the peering CRDs, all owned by the CSV;
//! * `manifests/NAME-metrics_v1_service.yaml`: the Service for `/metrics`, as `manifests` makes it;
//! * `metadata/annotations.yaml`: the `operators.operatorframework.io.bundle.*` annotations
//!   (mediatype, the two directories, package, channels, default channel);
//! * `bundle.Dockerfile`: the bundle image, with the same annotations as labels.
//!
//! The CSV is made of what `manifests` makes, not of a second description of it: its deployment is
//! [`crate::deploy`]'s Deployment (the same arguments, probes, security context), and its
//! `permissions` and `clusterPermissions` are the rules [`crate::rbac::requirements`] derives
//! from the handlers and options, namespaced rules in the first and cluster-wide ones in the second.
//! OLM creates the service account those name, and the Deployment runs as it.
//!
//! Where the operator serves is OLM's to decide, through an OperatorGroup, so the install modes
//! follow the scope the options give: cluster-wide (`-A`, or no `-n`) supports `AllNamespaces`
//! only (the operator lists and watches cluster-wide, with a ClusterRole); namespaced (`-n`)
//! supports `OwnNamespace`, `SingleNamespace` and `MultiNamespace`, and the Deployment takes the
//! namespaces from the OperatorGroup (OLM writes them into the pod's `olm.targetNamespaces`
//! annotation, read into `KACTOR_NAMESPACE`), not from `-n`: OLM grants the namespaced rules in each
//! of those namespaces. The operator's own namespace is OLM's too (the lease's and the events'
//! about cluster-scoped objects), so a `--lease-namespace` elsewhere cannot be bundled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DeploymentSpec;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde_json::Value;

use crate::cli::BundleArgs;
use crate::deploy::{is_label, Plan, Workload};
use crate::error::{Error, Result};
use crate::operator::Operator;
use crate::rbac::Place;
use crate::scope::Scope;

/// The API version of ClusterServiceVersions.
pub const CSV_API_VERSION: &str = "operators.coreos.com/v1alpha1";

/// The pod's field where OLM lists the namespaces the operator serves (its OperatorGroup's target
/// namespaces, comma-separated; empty for all namespaces).
pub const TARGET_NAMESPACES_FIELD: &str = "metadata.annotations['olm.targetNamespaces']";

/// The namespace OLM installs the operator in, unknown when the bundle is made: the RBAC is derived
/// for this name, and every rule placed there becomes one of the CSV's `permissions`. It is never
/// written into the bundle.
const INSTALL_NAMESPACE: &str = "olm-install-namespace";

/// The bundle annotations (and labels of the bundle image), as operator-registry names them.
const MEDIATYPE: &str = "operators.operatorframework.io.bundle.mediatype.v1";
const MANIFESTS: &str = "operators.operatorframework.io.bundle.manifests.v1";
const METADATA: &str = "operators.operatorframework.io.bundle.metadata.v1";
const PACKAGE: &str = "operators.operatorframework.io.bundle.package.v1";
const CHANNELS: &str = "operators.operatorframework.io.bundle.channels.v1";
const DEFAULT_CHANNEL: &str = "operators.operatorframework.io.bundle.channel.default.v1";
const BUILDER: &str = "operators.operatorframework.io.metrics.builder";
const METRICS_MEDIATYPE: &str = "operators.operatorframework.io.metrics.mediatype.v1";

/// What writes the bundle, in the builder annotation (as `operator-sdk-v1.39.1`).
const BUILT_BY: &str = concat!("kactor-v", env!("CARGO_PKG_VERSION"));

/// An OLM bundle of an operator, ready to be written ([`Bundle::write`]) or looked at.
#[derive(Debug, Clone)]
pub struct Bundle {
    csv: ClusterServiceVersion,
    crds: Vec<CustomResourceDefinition>,
    service: Service,
    package: String,
    /// The annotations of `metadata/annotations.yaml`, and the image's labels.
    annotations: BTreeMap<&'static str, String>,
}

/// The bundle of `operator` run as `args` say.
///
/// ```no_run
/// # async fn example() -> kactor::Result<()> {
/// use kactor::cli::{Command, Manifests, OlmCommand, OperatorCli};
/// use kactor::prelude::*;
///
/// let operator = Operator::new().on_create(("example.com", "v1", "widgets"), "create_fn", |_: Ctx| async { Ok(()) });
/// let cli = OperatorCli::parse_from(["my-operator", "olm", "bundle", "--image", "my-operator:1.0", "--version", "1.0.0", "-A"]).unwrap();
/// if let Command::Manifests(Manifests::Olm(OlmCommand::Bundle(args))) = cli.command() {
///     let bundle = kactor::olm::bundle(&operator, &args).await?;
///     bundle.write(&args.output_dir)?;
/// }
/// # Ok(())
/// # }
/// ```
pub async fn bundle(operator: &Operator, args: &BundleArgs) -> Result<Bundle> {
    let release = Release::new(args)?;
    // Namespaced: the rules are derived for one namespace, the one OLM installs in; OLM grants them
    // in each namespace the OperatorGroup targets too.
    let namespaced = matches!(args.run.scope(), Scope::Namespaces(_));
    let mut run = args.run.clone();
    if namespaced {
        run.namespaces = vec![INSTALL_NAMESPACE.to_string()];
    }
    let name = args.name();
    let mut plan = Plan::new(
        Workload {
            name: name.clone(),
            namespace: INSTALL_NAMESPACE.to_string(),
            image: &args.image,
            replicas: args.replicas,
            run: &run,
        },
        Error::Bundle,
    )?;
    if namespaced {
        plan.namespaces_from_field(TARGET_NAMESPACES_FIELD);
    }
    let (permissions, cluster_permissions) = strategy_permissions(operator, &plan).await?;
    let mut crds = operator.declared_crds().to_vec();
    if plan.peering {
        crds.extend(kactor_peering::peering::crds().into_iter().map(|crd| {
            serde_json::from_value::<CustomResourceDefinition>(crd)
                .expect("the peering CRDs are CRDs")
        }));
    }
    let display_name = args
        .display_name
        .clone()
        .unwrap_or_else(|| words(&release.package));
    let csv = ClusterServiceVersion {
        api_version: CSV_API_VERSION,
        kind: "ClusterServiceVersion",
        metadata: CsvMetadata {
            name: release.csv_name.clone(),
            annotations: BTreeMap::from([
                ("capabilities", "Basic Install".to_string()),
                ("containerImage", args.image.clone()),
                (
                    "operators.operatorframework.io/builder",
                    BUILT_BY.to_string(),
                ),
            ]),
        },
        spec: CsvSpec {
            description: args.description.clone().unwrap_or_else(|| {
                format!("{display_name}: a Kubernetes operator made with kactor.")
            }),
            display_name,
            version: release.version.clone(),
            min_kube_version: release.min_kube_version.clone(),
            install_modes: install_modes(namespaced),
            customresourcedefinitions: CrdDescriptions {
                owned: crds.iter().flat_map(owned).collect(),
            },
            install: Install {
                strategy: "deployment",
                spec: InstallSpec {
                    deployments: vec![DeploymentEntry {
                        name,
                        label: serde_json::from_value(plan.labels()).expect("labels are strings"),
                        spec: plan.deployment().spec.unwrap_or_default(),
                    }],
                    permissions,
                    cluster_permissions,
                },
            },
        },
    };
    let mut service = plan.service();
    // OLM creates it in the namespace it installs the operator in.
    service.metadata.namespace = None;
    Ok(Bundle {
        csv,
        crds,
        service,
        annotations: release.annotations(),
        package: release.package,
    })
}

/// What names this release of the package, checked: the package, the version, the CSV's name, the
/// channels.
struct Release {
    package: String,
    version: String,
    csv_name: String,
    channels: Vec<String>,
    default_channel: String,
    min_kube_version: Option<String>,
}

impl Release {
    fn new(args: &BundleArgs) -> Result<Release> {
        let invalid = Error::Bundle;
        let package = args.package();
        let version = semantic(&args.version)
            .map_err(|reason| invalid(format!("--version {:?} {reason}", args.version)))?
            .to_string();
        let csv_name = format!("{package}.v{version}");
        if !is_subdomain(&package) || !is_subdomain(&csv_name) {
            return Err(invalid(format!(
                "the CSV's name {csv_name:?} (PACKAGE.vVERSION) is not a Kubernetes name: \
                 lowercase letters, digits, `-` and `.` (no `+build` metadata in the version), at \
                 most 253 characters; choose another --package or --version"
            )));
        }
        let channels = channels(args)?;
        let default_channel = args.default_channel();
        if !channels.contains(&default_channel) {
            return Err(invalid(format!(
                "--default-channel {default_channel:?} is not one of --channels {}: the bundle \
                 must be in its package's default channel",
                channels.join(",")
            )));
        }
        let min_kube_version = match &args.min_kube_version {
            Some(given) => Some(
                tolerant(given)
                    .map_err(|reason| invalid(format!("--min-kube-version {given:?} {reason}")))?,
            ),
            None => None,
        };
        Ok(Release {
            package,
            version,
            csv_name,
            channels,
            default_channel,
            min_kube_version,
        })
    }

    /// The annotations of `metadata/annotations.yaml`, and the image's labels.
    fn annotations(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            (MEDIATYPE, "registry+v1".to_string()),
            (MANIFESTS, "manifests/".to_string()),
            (METADATA, "metadata/".to_string()),
            (PACKAGE, self.package.clone()),
            (CHANNELS, self.channels.join(",")),
            (DEFAULT_CHANNEL, self.default_channel.clone()),
            (BUILDER, BUILT_BY.to_string()),
            (METRICS_MEDIATYPE, "metrics+v1".to_string()),
        ])
    }
}

/// The CSV's `permissions` and `clusterPermissions`: the rules the operator's RBAC blueprint
/// ([`crate::rbac::requirements`]) places in the operator's namespace, and cluster-wide.
async fn strategy_permissions(
    operator: &Operator,
    plan: &Plan,
) -> Result<(Vec<Permissions>, Vec<Permissions>)> {
    let requirements = crate::rbac::requirements(operator, &plan.rbac).await?;
    let mut namespaced = Vec::new();
    let mut cluster = Vec::new();
    for permission in &requirements.permissions {
        match &permission.place {
            Place::Cluster => cluster.push(rule(permission)),
            Place::Namespace(namespace) if namespace == INSTALL_NAMESPACE => {
                namespaced.push(rule(permission))
            }
            Place::Namespace(namespace) => {
                return Err(Error::Bundle(format!(
                    "the operator needs permissions in the namespace {namespace:?} (the Lease's, \
                     --lease-namespace), but OLM grants namespaced permissions only in the \
                     operator's own namespace and those it serves: leave --lease-namespace out, \
                     and the Lease is in the operator's namespace"
                )))
            }
        }
    }
    let permissions = |rules: Vec<PolicyRule>| -> Vec<Permissions> {
        if rules.is_empty() {
            return Vec::new();
        }
        vec![Permissions {
            service_account_name: requirements.account.name.clone(),
            rules,
        }]
    };
    Ok((permissions(namespaced), permissions(cluster)))
}

impl Bundle {
    /// The ClusterServiceVersion, as JSON.
    pub fn csv(&self) -> Value {
        serde_json::to_value(&self.csv).expect("a CSV is JSON")
    }

    /// The CRDs the CSV owns, each a file of `manifests/`.
    pub fn crds(&self) -> &[CustomResourceDefinition] {
        &self.crds
    }

    /// The annotations of `metadata/annotations.yaml`, which are also the image's labels.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.annotations
            .iter()
            .map(|(key, value)| (key.to_string(), value.clone()))
            .collect()
    }

    /// Every file of the bundle: its path in the bundle's directory, and its text.
    pub fn files(&self) -> Result<Vec<(PathBuf, String)>> {
        let mut files = vec![(
            PathBuf::from(format!(
                "manifests/{}.clusterserviceversion.yaml",
                self.package
            )),
            yaml(&self.csv)?,
        )];
        for crd in &self.crds {
            files.push((
                PathBuf::from(format!(
                    "manifests/{}_{}.yaml",
                    crd.spec.group, crd.spec.names.plural
                )),
                yaml(crd)?,
            ));
        }
        files.push((
            PathBuf::from(format!(
                "manifests/{}_v1_service.yaml",
                self.service.metadata.name.as_deref().unwrap_or_default()
            )),
            yaml(&self.service)?,
        ));
        files.push((
            PathBuf::from("metadata/annotations.yaml"),
            yaml(&serde_json::json!({"annotations": self.annotations}))?,
        ));
        files.push((PathBuf::from("bundle.Dockerfile"), self.dockerfile()));
        Ok(files)
    }

    /// Writes the bundle into `dir` (created if missing; files of the same names are replaced, others
    /// left as they are), and returns the paths written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut written = Vec::new();
        for (path, text) in self.files()? {
            let path = dir.join(path);
            let failed = |e: std::io::Error| Error::Output {
                what: path.display().to_string(),
                reason: e.to_string(),
            };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(failed)?;
            }
            std::fs::write(&path, text).map_err(failed)?;
            written.push(path);
        }
        Ok(written)
    }

    /// The bundle image's Dockerfile, for `docker build -f DIR/bundle.Dockerfile DIR`: the
    /// annotations as labels, as operator-sdk writes them, and the two directories.
    fn dockerfile(&self) -> String {
        let label = |key: &str| format!("LABEL {key}={}\n", self.annotations[key]);
        let mut out = String::from("FROM scratch\n\n# Core bundle labels.\n");
        for key in [
            MEDIATYPE,
            MANIFESTS,
            METADATA,
            PACKAGE,
            CHANNELS,
            DEFAULT_CHANNEL,
            BUILDER,
            METRICS_MEDIATYPE,
        ] {
            out.push_str(&label(key));
        }
        out.push_str(
            "\n# Copy files to locations specified by labels.\nCOPY manifests /manifests/\nCOPY \
             metadata /metadata/\n",
        );
        out
    }
}

/// A ClusterServiceVersion, with the fields kactor writes, in the order operator-sdk writes them.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterServiceVersion {
    api_version: &'static str,
    kind: &'static str,
    metadata: CsvMetadata,
    spec: CsvSpec,
}

#[derive(Debug, Clone, Serialize)]
struct CsvMetadata {
    name: String,
    annotations: BTreeMap<&'static str, String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct CsvSpec {
    display_name: String,
    description: String,
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_kube_version: Option<String>,
    install_modes: Vec<InstallMode>,
    customresourcedefinitions: CrdDescriptions,
    install: Install,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct InstallMode {
    #[serde(rename = "type")]
    type_: &'static str,
    supported: bool,
}

#[derive(Debug, Clone, Serialize)]
struct CrdDescriptions {
    owned: Vec<OwnedCrd>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct OwnedCrd {
    name: String,
    version: String,
    kind: String,
    display_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct Install {
    strategy: &'static str,
    spec: InstallSpec,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct InstallSpec {
    deployments: Vec<DeploymentEntry>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    permissions: Vec<Permissions>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cluster_permissions: Vec<Permissions>,
}

#[derive(Debug, Clone, Serialize)]
struct DeploymentEntry {
    name: String,
    label: BTreeMap<String, String>,
    spec: DeploymentSpec,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Permissions {
    service_account_name: String,
    rules: Vec<PolicyRule>,
}

/// The install modes of a cluster-wide or a namespaced operator.
fn install_modes(namespaced: bool) -> Vec<InstallMode> {
    [
        ("OwnNamespace", namespaced),
        ("SingleNamespace", namespaced),
        ("MultiNamespace", namespaced),
        ("AllNamespaces", !namespaced),
    ]
    .into_iter()
    .map(|(type_, supported)| InstallMode { type_, supported })
    .collect()
}

/// One RBAC rule of the blueprint, as a CSV's rules are written.
fn rule(permission: &crate::rbac::Permission) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![permission.group.clone()]),
        resources: Some(vec![permission.resource.clone()]),
        resource_names: (!permission.resource_names.is_empty())
            .then(|| permission.resource_names.clone()),
        verbs: permission.verbs.clone(),
        non_resource_urls: None,
    }
}

/// The CSV's description of a CRD: one entry per served version, as operator-sdk lists them.
fn owned(crd: &CustomResourceDefinition) -> Vec<OwnedCrd> {
    let kind = &crd.spec.names.kind;
    crd.spec
        .versions
        .iter()
        .filter(|version| version.served)
        .map(|version| OwnedCrd {
            name: crd
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| format!("{}.{}", crd.spec.names.plural, crd.spec.group)),
            version: version.name.clone(),
            kind: kind.clone(),
            display_name: words(kind),
            description: version
                .schema
                .as_ref()
                .and_then(|schema| schema.open_api_v3_schema.as_ref())
                .and_then(|schema| schema.description.clone()),
        })
        .collect()
}

/// The channels, checked: names of letters, digits, `-`, `.` and `_`.
fn channels(args: &BundleArgs) -> Result<Vec<String>> {
    let channels: Vec<String> = args.channels.iter().map(|c| c.trim().to_string()).collect();
    if channels.is_empty() {
        return Err(Error::Bundle("--channels is empty".to_string()));
    }
    for channel in &channels {
        if !is_channel(channel) {
            return Err(Error::Bundle(format!(
                "--channels: {channel:?} is not a channel's name: letters, digits, `-`, `.` and \
                 `_`, a letter or digit first"
            )));
        }
    }
    Ok(channels)
}

fn is_channel(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

/// A DNS-1123 subdomain: labels joined by `.`, at most 253 characters.
fn is_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(|label| is_label(label, 63, false))
}

/// A semantic version, as OLM reads the CSV's `version` (`1.2.3`, `1.2.3-rc.1`).
fn semantic(given: &str) -> std::result::Result<semver::Version, String> {
    semver::Version::parse(given)
        .map_err(|e| format!("is not a semantic version such as 1.2.3 ({e})"))
}

/// A semantic version read tolerantly, as OLM reads `minKubeVersion`: a leading `v`, and missing
/// minor and patch numbers (`v1.28` is `1.28.0`).
fn tolerant(given: &str) -> std::result::Result<String, String> {
    let bare = given.trim().trim_start_matches('v');
    let (numbers, rest) = match bare.find(['-', '+']) {
        Some(at) => bare.split_at(at),
        None => (bare, ""),
    };
    let mut numbers = numbers.to_string();
    for _ in numbers.split('.').count()..3 {
        numbers.push_str(".0");
    }
    semantic(&format!("{numbers}{rest}")).map(|version| version.to_string())
}

/// A name in words, for display: `my-operator` is `My Operator`, `MemcachedBackup` is
/// `Memcached Backup`.
fn words(name: &str) -> String {
    let mut out = String::new();
    let mut previous: Option<char> = None;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            out.push(' ');
        } else if previous.is_none_or(|p| matches!(p, '-' | '_' | '.')) {
            out.extend(c.to_uppercase());
        } else {
            if c.is_uppercase() && previous.is_some_and(char::is_lowercase) {
                out.push(' ');
            }
            out.push(c);
        }
        previous = Some(c);
    }
    out
}

fn yaml<T: Serialize>(value: &T) -> Result<String> {
    serde_saphyr::to_string(value).map_err(|e| Error::Output {
        what: "the OLM bundle as YAML".to_string(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::{Command, Manifests, OlmCommand, RbacArgs};

    fn bundle_args(args: &[&str]) -> BundleArgs {
        let mut argv = vec!["olm", "bundle", "--image", "op:1"];
        if !args.contains(&"--version") {
            argv.extend(["--version", "1.2.3"]);
        }
        argv.extend_from_slice(args);
        match crate::cli::tests::cli(&argv).unwrap().command() {
            Command::Manifests(Manifests::Olm(OlmCommand::Bundle(args))) => *args,
            other => panic!("{other:?}"),
        }
    }

    fn widget_crd() -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                     "schema": {"openAPIV3Schema": {"type": "object", "description": "A widget.",
                                "x-kubernetes-preserve-unknown-fields": true}}},
                    {"name": "v1beta1", "served": false, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object",
                                "x-kubernetes-preserve-unknown-fields": true}}},
                ],
            },
        }))
        .unwrap()
    }

    /// Handles widgets and declares their CRD; owns Deployments and reads nodes (cluster-scoped).
    fn widgets() -> Operator {
        Operator::new()
            .crd(widget_crd())
            .on_create(
                ("example.com", "v1", "widgets"),
                "create_fn",
                |_: kactor_reactor::handlers::Ctx| async { Ok(()) },
            )
            .permission(
                "apps",
                "deployments",
                &["get", "create"],
                "each widget owns one",
            )
            .permission("", "nodes", &["list"], "widgets are spread over nodes")
    }

    async fn csv_of(args: &[&str]) -> Value {
        bundle(&widgets(), &bundle_args(args)).await.unwrap().csv()
    }

    fn supported(csv: &Value) -> Vec<&str> {
        csv["spec"]["installModes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|mode| mode["supported"] == true)
            .map(|mode| mode["type"].as_str().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn the_csv_names_the_package_and_version_and_owns_the_declared_crds() {
        let csv = csv_of(&["-A", "--name", "my-op"]).await;
        assert_eq!(csv["apiVersion"], "operators.coreos.com/v1alpha1");
        assert_eq!(csv["kind"], "ClusterServiceVersion");
        assert_eq!(csv["metadata"]["name"], "my-op.v1.2.3");
        assert_eq!(csv["metadata"]["annotations"]["containerImage"], "op:1");
        assert_eq!(csv["spec"]["version"], "1.2.3");
        assert_eq!(csv["spec"]["displayName"], "My Op");
        assert!(csv["spec"].get("minKubeVersion").is_none());
        assert_eq!(csv["spec"]["install"]["strategy"], "deployment");
        // One entry per served version; the schema's description describes it.
        assert_eq!(
            csv["spec"]["customresourcedefinitions"]["owned"],
            json!([{"name": "widgets.example.com", "version": "v1", "kind": "Widget",
                    "displayName": "Widget", "description": "A widget."}])
        );
        let csv = csv_of(&[
            "--package",
            "widgets",
            "--display-name",
            "Widgets",
            "--description",
            "Makes widgets.",
            "--min-kube-version",
            "v1.28",
        ])
        .await;
        assert_eq!(csv["metadata"]["name"], "widgets.v1.2.3");
        assert_eq!(csv["spec"]["displayName"], "Widgets");
        assert_eq!(csv["spec"]["description"], "Makes widgets.");
        assert_eq!(csv["spec"]["minKubeVersion"], "1.28.0");
    }

    /// The CSV's deployment is `manifests`' Deployment for the same options, not a copy of it.
    #[tokio::test]
    async fn the_deployment_is_the_one_manifests_makes() {
        let options = [
            "-A",
            "--name",
            "my-op",
            "--peering",
            "ops",
            "--replicas",
            "2",
            "--log-format",
            "json",
        ];
        let csv = csv_of(&options).await;
        let mut argv = vec!["manifests", "--image", "op:1"];
        argv.extend_from_slice(&options);
        let Command::Manifests(Manifests::All(deploy)) =
            crate::cli::tests::cli(&argv).unwrap().command()
        else {
            panic!("not manifests")
        };
        let yaml = crate::deploy::manifests(&widgets(), &deploy).await.unwrap();
        let documents: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        let deployment = documents
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .unwrap();
        let entry = &csv["spec"]["install"]["spec"]["deployments"];
        assert_eq!(entry.as_array().unwrap().len(), 1);
        assert_eq!(entry[0]["name"], "my-op");
        assert_eq!(entry[0]["label"], deployment["metadata"]["labels"]);
        assert_eq!(entry[0]["spec"], deployment["spec"]);
        // With --peering, the peering CRDs come too, owned.
        let owned: Vec<&str> = csv["spec"]["customresourcedefinitions"]["owned"]
            .as_array()
            .unwrap()
            .iter()
            .map(|crd| crd["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            owned,
            [
                "widgets.example.com",
                "clusterkopfpeerings.kopf.dev",
                "kopfpeerings.kopf.dev"
            ]
        );
    }

    #[tokio::test]
    async fn install_modes_follow_the_scope() {
        for args in [&["-A"][..], &[]] {
            let csv = csv_of(args).await;
            assert_eq!(supported(&csv), ["AllNamespaces"], "{args:?}");
            let container = &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]
                ["spec"]["containers"][0];
            assert!(!serde_json::to_string(&container["env"])
                .unwrap()
                .contains("KACTOR_NAMESPACE"));
        }
        let csv = csv_of(&["-n", "team-a", "-n", "team-b"]).await;
        assert_eq!(
            supported(&csv),
            ["OwnNamespace", "SingleNamespace", "MultiNamespace"]
        );
        // The namespaces are the OperatorGroup's, not those given to -n.
        let container = &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]
            ["spec"]["containers"][0];
        let args = serde_json::to_string(&container["args"]).unwrap();
        assert!(
            !args.contains("--namespace") && !args.contains("team-"),
            "{args}"
        );
        assert!(container["env"].as_array().unwrap().contains(&json!({
            "name": "KACTOR_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['olm.targetNamespaces']"}},
        })));
    }

    /// The rules of `permission` in the order the blueprint has them.
    fn rules_of(permissions: &[crate::rbac::Permission], place: &Place) -> Value {
        serde_json::to_value(
            permissions
                .iter()
                .filter(|p| p.place == *place)
                .map(rule)
                .collect::<Vec<_>>(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn permissions_are_the_rbac_blueprints() {
        // Cluster-wide: the ClusterRole's rules are the clusterPermissions; the lease's Role in the
        // operator's namespace is the permissions.
        let args = bundle_args(&["-A", "--name", "my-op", "--leader-election"]);
        let csv = bundle(&widgets(), &args).await.unwrap().csv();
        let mut run = args.run.clone();
        run.lease_name = Some("my-op".into());
        run.lease_namespace = Some("ops".into());
        let blueprint = crate::rbac::requirements(
            &widgets(),
            &RbacArgs {
                service_account: Some("my-op".into()),
                service_account_namespace: Some("ops".into()),
                run,
            },
        )
        .await
        .unwrap();
        let install = &csv["spec"]["install"]["spec"];
        assert_eq!(
            install["clusterPermissions"],
            json!([{"serviceAccountName": "my-op",
                    "rules": rules_of(&blueprint.permissions, &Place::Cluster)}])
        );
        assert_eq!(
            install["permissions"],
            json!([{"serviceAccountName": "my-op",
                    "rules": rules_of(&blueprint.permissions, &Place::Namespace("ops".into()))}])
        );
        let leases = serde_json::to_string(&install["permissions"]).unwrap();
        assert!(leases.contains("leases"), "{leases}");

        // Namespaced: the Role of one served namespace is the permissions; what is cluster-scoped
        // (CRDs, nodes) stays in clusterPermissions.
        let args = bundle_args(&["-n", "team-a", "--name", "my-op"]);
        let csv = bundle(&widgets(), &args).await.unwrap().csv();
        let blueprint = crate::rbac::requirements(
            &widgets(),
            &RbacArgs {
                service_account: Some("my-op".into()),
                service_account_namespace: Some("team-a".into()),
                run: args.run.clone(),
            },
        )
        .await
        .unwrap();
        let install = &csv["spec"]["install"]["spec"];
        assert_eq!(
            install["permissions"][0]["rules"],
            rules_of(&blueprint.permissions, &Place::Namespace("team-a".into()))
        );
        assert_eq!(
            install["clusterPermissions"][0]["rules"],
            rules_of(&blueprint.permissions, &Place::Cluster)
        );
        let cluster = serde_json::to_string(&install["clusterPermissions"]).unwrap();
        assert!(cluster.contains("nodes") && !cluster.contains("widgets"));
    }

    /// OLM installs the operator in `ops` for the OperatorGroup targeting `team-a`: the permissions
    /// become a Role in `ops` and in `team-a`, the clusterPermissions a ClusterRole, each bound to the
    /// service account. The operator, run there as the pod runs it, needs nothing else.
    #[tokio::test]
    async fn what_olm_grants_from_the_csv_is_all_the_operator_needs() {
        let args = bundle_args(&["-n", "x", "--name", "my-op", "--leader-election", "-P", "p"]);
        let csv = bundle(&widgets(), &args).await.unwrap().csv();
        let install = &csv["spec"]["install"]["spec"];
        let account = json!([{"kind": "ServiceAccount", "name": "my-op", "namespace": "ops"}]);
        let mut objects = vec![
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "my-op"}, "rules": install["clusterPermissions"][0]["rules"]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "my-op"}, "subjects": account,
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "my-op"}}),
        ];
        for namespace in ["ops", "team-a"] {
            objects.push(
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "my-op", "namespace": namespace},
                "rules": install["permissions"][0]["rules"]}),
            );
            objects.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "my-op", "namespace": namespace}, "subjects": account,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "my-op"}}));
        }
        let manifests =
            serde_saphyr::to_string(&json!({"kind": "List", "items": objects})).unwrap();
        // The pod's options: the target namespaces from OLM, the lease where the pod is.
        let container =
            &install["deployments"][0]["spec"]["template"]["spec"]["containers"][0]["args"];
        let mut argv: Vec<String> = vec!["my-op".into()];
        argv.extend(
            container
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string()),
        );
        argv.extend([
            "-n".into(),
            "team-a".into(),
            "--lease-namespace".into(),
            "ops".into(),
        ]);
        let run = crate::cli::OperatorCli::parse_from(argv)
            .unwrap()
            .into_run_args();
        let verification = crate::rbac::verify(
            &widgets(),
            &RbacArgs {
                service_account: Some("my-op".into()),
                service_account_namespace: Some("ops".into()),
                run,
            },
            &manifests,
        )
        .await
        .unwrap();
        assert!(verification.is_complete(), "{verification}");
    }

    #[tokio::test]
    async fn the_files_are_a_registry_v1_bundle() {
        let bundle = bundle(
            &widgets(),
            &bundle_args(&[
                "-n",
                "a",
                "--name",
                "my-op",
                "--channels",
                "alpha,stable",
                "--default-channel",
                "stable",
            ]),
        )
        .await
        .unwrap();
        let files = bundle.files().unwrap();
        let paths: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
        assert_eq!(
            paths,
            [
                "manifests/my-op.clusterserviceversion.yaml",
                "manifests/example.com_widgets.yaml",
                "manifests/my-op-metrics_v1_service.yaml",
                "metadata/annotations.yaml",
                "bundle.Dockerfile",
            ]
        );
        for (path, text) in &files {
            assert!(!text.contains(INSTALL_NAMESPACE), "{path:?}:\n{text}");
        }
        let annotations: Value = serde_saphyr::from_str(&files[3].1).unwrap();
        assert_eq!(
            annotations["annotations"],
            json!({
                "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
                "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
                "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
                "operators.operatorframework.io.bundle.package.v1": "my-op",
                "operators.operatorframework.io.bundle.channels.v1": "alpha,stable",
                "operators.operatorframework.io.bundle.channel.default.v1": "stable",
                "operators.operatorframework.io.metrics.builder": BUILT_BY,
                "operators.operatorframework.io.metrics.mediatype.v1": "metrics+v1",
            })
        );
        // The image's labels are the annotations.
        let dockerfile = &files[4].1;
        assert!(dockerfile.starts_with("FROM scratch\n"));
        for (key, value) in annotations["annotations"].as_object().unwrap() {
            let label = format!("LABEL {key}={}\n", value.as_str().unwrap());
            assert!(dockerfile.contains(&label), "{label} in\n{dockerfile}");
        }
        assert!(dockerfile.ends_with("COPY manifests /manifests/\nCOPY metadata /metadata/\n"));
        let service: Value = serde_saphyr::from_str(&files[2].1).unwrap();
        assert_eq!(service["metadata"]["name"], "my-op-metrics");
        assert!(service["metadata"].get("namespace").is_none());
        // Written, then read back.
        let dir = std::env::temp_dir().join(format!("kactor-olm-unit-{}", std::process::id()));
        let written = bundle.write(&dir).unwrap();
        assert_eq!(written.len(), files.len());
        for ((path, text), written) in files.iter().zip(&written) {
            assert_eq!(*written, dir.join(path));
            assert_eq!(std::fs::read_to_string(written).unwrap(), *text);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn what_cannot_be_bundled_is_a_clear_error() {
        for (args, says) in [
            (&["--emulator"][..], "--emulator runs the operator here"),
            (
                &["--replicas", "3"],
                "3 replicas would all handle the same objects",
            ),
            (&["--name", "My_Op"], "is not a Kubernetes name"),
            (&["-L", "http://127.0.0.1:8080/healthz"], "loopback"),
            (&["--version", "1.0"], "\"1.0\" is not a semantic version"),
            (&["--version", "1.0.0+build.5"], "no `+build` metadata"),
            (&["--version", "1.0.0-RC1"], "is not a Kubernetes name"),
            (&["--package", "My.Pkg"], "choose another --package"),
            (&["--channels", "alpha,"], "\"\" is not a channel's name"),
            (&["--channels", "a b"], "\"a b\" is not a channel's name"),
            (
                &["--default-channel", "stable"],
                "--default-channel \"stable\" is not one of --channels alpha",
            ),
            (
                &["--min-kube-version", "one"],
                "--min-kube-version \"one\" is not a semantic version",
            ),
            (
                &["-A", "--leader-election", "--lease-namespace", "elsewhere"],
                "leave --lease-namespace out",
            ),
        ] {
            let error = bundle(&widgets(), &bundle_args(args))
                .await
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("cannot make the OLM bundle: "),
                "{args:?}: {error}"
            );
            assert!(error.contains(says), "{args:?}: {error}");
        }
    }

    #[test]
    fn names_read_as_words() {
        assert_eq!(words("my-operator"), "My Operator");
        assert_eq!(words("MemcachedBackup"), "Memcached Backup");
        assert_eq!(words("KopfPeering"), "Kopf Peering");
        assert_eq!(words("etcd"), "Etcd");
    }

    #[test]
    fn min_kube_version_is_read_as_olm_reads_it() {
        assert_eq!(tolerant("1.28.3").unwrap(), "1.28.3");
        assert_eq!(tolerant("v1.28").unwrap(), "1.28.0");
        assert_eq!(tolerant("1").unwrap(), "1.0.0");
        assert!(tolerant("1.x").is_err());
    }
}
