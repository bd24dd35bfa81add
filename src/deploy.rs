//! `manifests`: everything an operator needs in a cluster, as YAML for one
//! `kubectl apply --server-side -f -` on an empty cluster.
//!
//! In the order a cluster accepts them: the operator's namespace; its CRDs (declared with
//! [`Operator::crd`]) and, with `--peering`, the peering CRDs; its RBAC as [`crate::rbac`] derives
//! it (ServiceAccount, roles, bindings); a Deployment that runs the image with the options given
//! (their command line, [`RunArgs::to_args`](crate::cli::RunArgs::to_args)), probed on `/healthz`
//! and `/readyz`; a Service for `/metrics`.
//!
//! One apply cannot create an object of a CRD it creates in the same run (kubectl maps every
//! object's kind before the CRD is established: "no matches for kind"), so the peering object is not
//! among them: with `--peering`, the Deployment runs with `--create-peering`, and the operator
//! creates the object itself when it is missing.
//!
//! `olm bundle` ([`crate::olm`]) puts the same Deployment, RBAC and Service in an OLM
//! ClusterServiceVersion: both work from one plan of the options.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service};
use serde_json::{json, Value};

use crate::cli::{DeployArgs, RbacArgs, RunArgs};
use crate::error::{Error, Result};
use crate::operator::Operator;

/// Where health and metrics are served in the pod when `--liveness` is not given.
pub const DEFAULT_LIVENESS: &str = "http://0.0.0.0:8080/healthz";

/// The manifests for `operator` run as `args` say, as YAML documents.
///
/// ```no_run
/// # async fn example() -> kactor::Result<()> {
/// use kactor::cli::{Command, Manifests, OperatorCli};
/// use kactor::prelude::*;
///
/// let operator = Operator::new().on_create(("example.com", "v1", "widgets"), "create_fn", |_: Ctx| async { Ok(()) });
/// let cli = OperatorCli::parse_from(["my-operator", "manifests", "--image", "my-operator:1.0", "-A"]).unwrap();
/// if let Command::Manifests(Manifests::All(args)) = cli.command() {
///     println!("{}", kactor::deploy::manifests(&operator, &args).await?);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn manifests(operator: &Operator, args: &DeployArgs) -> Result<String> {
    let plan = Plan::new(
        Workload {
            name: args.name(),
            namespace: args.operator_namespace(),
            image: &args.image,
            replicas: args.replicas,
            run: &args.run,
        },
        Error::Deploy,
    )?;
    let rbac = crate::rbac::generate(operator, &plan.rbac).await?;
    let mut out = format!(
        "# Everything the operator `{name}` needs, in the order a cluster accepts it, as \
         `{name} manifests` prints it:\n#   {program}\n# Apply it in one go: kubectl apply \
         --server-side -f <this file>\n",
        name = plan.name,
        program = plan.command_line(),
    );
    document(&mut out, None, &plan.namespace())?;
    let crds = operator.declared_crds();
    for crd in crds {
        document(&mut out, None, crd)?;
    }
    if plan.peering {
        for crd in kactor_peering::peering::crds() {
            document(
                &mut out,
                Some("The peering CRDs (as `kactor peering crds` prints them); the operator creates its peering object (--create-peering)."),
                &crd,
            )?;
        }
    }
    out.push_str(&rbac);
    document(&mut out, None, &plan.deployment())?;
    document(
        &mut out,
        Some("Lets Prometheus find /metrics through a Service (ServiceMonitors point at the port `http`)."),
        &plan.service(),
    )?;
    Ok(out)
}

/// One YAML document, after `---` and an optional comment.
fn document<T: serde::Serialize>(out: &mut String, comment: Option<&str>, value: &T) -> Result<()> {
    let yaml = serde_saphyr::to_string(value).map_err(|e| Error::Output {
        what: "the manifests as YAML".to_string(),
        reason: e.to_string(),
    })?;
    out.push_str("---\n");
    if let Some(comment) = comment {
        out.push_str(&format!("# {comment}\n"));
    }
    out.push_str(&yaml);
    if !yaml.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}

/// The longest operator name: its metrics Service, `NAME-metrics`, is a DNS-1035 label (63).
pub const MAX_NAME: usize = 63 - "-metrics".len();

/// Whether `name` can name an operator and what `manifests` makes for it (its Deployment, service
/// account, roles, the `NAME-metrics` Service): lowercase letters, digits and `-`, a letter first,
/// not `-` last, at most [`MAX_NAME`] characters. `kactor new` checks its names with it too.
pub fn check_operator_name(name: &str) -> std::result::Result<(), String> {
    if is_label(name, MAX_NAME, true) {
        return Ok(());
    }
    Err(format!(
        "{name:?} is not a Kubernetes name for an operator: lowercase letters, digits and `-`, a \
         letter first, not `-` last, at most {MAX_NAME} characters"
    ))
}

/// A DNS label of at most `most` characters, a letter first if `letter_first` (DNS-1035) or a
/// letter or digit (DNS-1123).
pub(crate) fn is_label(value: &str, most: usize, letter_first: bool) -> bool {
    !value.is_empty()
        && value.len() <= most
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && value
            .starts_with(|c: char| c.is_ascii_lowercase() || (!letter_first && c.is_ascii_digit()))
        && !value.ends_with('-')
}

/// What a deployment of the operator is made from: the options of `manifests`, or of `olm bundle`
/// ([`crate::olm`]).
pub(crate) struct Workload<'a> {
    /// The name of the Deployment, its service account, roles and Service.
    pub(crate) name: String,
    /// The namespace the operator runs in.
    pub(crate) namespace: String,
    /// The container image.
    pub(crate) image: &'a str,
    /// How many replicas.
    pub(crate) replicas: u32,
    /// The options the operator runs with.
    pub(crate) run: &'a RunArgs,
}

/// What the manifests are made of, worked out from the options: `manifests` prints all of it, and
/// `olm bundle` puts the same Deployment, RBAC and Service in a ClusterServiceVersion.
pub(crate) struct Plan {
    name: String,
    namespace: String,
    image: String,
    replicas: u32,
    /// The options of `run` the Deployment passes.
    run: RunArgs,
    /// The options of `run` as given to `manifests`, for the header.
    given: Vec<String>,
    /// Who the operator runs as, and how (for the RBAC).
    pub(crate) rbac: RbacArgs,
    /// The port and path of the health server in the pod.
    port: u16,
    liveness_path: String,
    /// Whether the operator peers through a named peering object (`--peering`, not standalone).
    pub(crate) peering: bool,
    /// The pod's field the served namespaces come from (`KACTOR_NAMESPACE`, by the downward API)
    /// instead of `--namespace` in the arguments; see [`Plan::namespaces_from_field`].
    namespaces_field: Option<String>,
}

impl Plan {
    /// Works out the plan, or says which option cannot be deployed, as `invalid` words it
    /// ([`Error::Deploy`] for `manifests`).
    pub(crate) fn new(workload: Workload<'_>, invalid: fn(String) -> Error) -> Result<Plan> {
        let Workload {
            name,
            namespace,
            image,
            replicas,
            run: given,
        } = workload;
        check_operator_name(&name).map_err(|reason| invalid(format!("--name {reason}")))?;
        if !is_label(&namespace, 63, false) {
            return Err(invalid(format!(
                "--operator-namespace {namespace:?} is not a Kubernetes name: lowercase letters, \
                 digits and `-`, a letter or digit first, not `-` last, at most 63 characters"
            )));
        }
        if image.trim().is_empty() {
            return Err(invalid("--image is empty".to_string()));
        }
        let mut run = given.clone();
        if run.emulator {
            return Err(invalid(
                "--emulator runs the operator here; the manifests deploy it to a cluster"
                    .to_string(),
            ));
        }
        let peering = run.peering.is_some() && !run.standalone;
        if replicas > 1 && !peering && !run.leader_election && run.shards.is_none() {
            return Err(invalid(format!(
                "{replicas} replicas would all handle the same objects at once: add \
                 --leader-election (or --peering NAME) so that one works and the others wait, \
                 or --shards auto so that they share the objects"
            )));
        }
        if peering {
            run.create_peering = true;
        }
        if (run.leader_election || run.shards.as_deref() == Some("auto"))
            && run.lease_name.is_none()
        {
            // In the pod the program is `operator` (deploy/Dockerfile): name the lease explicitly.
            run.lease_name = Some(name.clone());
        }
        let liveness = run
            .liveness
            .get_or_insert_with(|| DEFAULT_LIVENESS.to_string())
            .clone();
        let endpoint = crate::liveness::endpoint(&liveness)?;
        if endpoint.addr.ip().is_loopback() {
            return Err(invalid(format!(
                "--liveness {liveness} listens on a loopback address, which the kubelet's probes \
                 cannot reach: use http://0.0.0.0:PORT/PATH"
            )));
        }
        let mut rbac_run = run.clone();
        // In the pod, POD_NAMESPACE is the operator's namespace: the lease is there unless told.
        rbac_run
            .lease_namespace
            .get_or_insert_with(|| namespace.clone());
        Ok(Plan {
            rbac: RbacArgs {
                service_account: Some(name.clone()),
                service_account_namespace: Some(namespace.clone()),
                run: rbac_run,
            },
            name,
            namespace,
            image: image.to_string(),
            replicas,
            port: endpoint.addr.port(),
            liveness_path: endpoint.path,
            run,
            given: given.to_args(),
            peering,
            namespaces_field: None,
        })
    }

    /// Serves the namespaces that the pod's field `field_path` lists (comma-separated, as `-n`
    /// takes them), read into `KACTOR_NAMESPACE` by the downward API, instead of those of
    /// `--namespace`: OLM writes the namespaces it chose into the pod's `olm.targetNamespaces`
    /// annotation. The RBAC stays derived from the options given.
    pub(crate) fn namespaces_from_field(&mut self, field_path: &str) {
        self.run.namespaces.clear();
        self.run.all_namespaces = false;
        self.namespaces_field = Some(field_path.to_string());
    }

    /// The command line that prints these manifests, for their header.
    fn command_line(&self) -> String {
        let mut words = vec![
            self.name.clone(),
            "manifests".to_string(),
            format!("--image={}", self.image),
        ];
        if self.replicas != 1 {
            words.push(format!("--replicas={}", self.replicas));
        }
        words.extend(self.given.iter().cloned());
        words.join(" ")
    }

    /// The labels of everything the plan makes, and the Deployment's selector.
    pub(crate) fn labels(&self) -> Value {
        json!({"app.kubernetes.io/name": self.name})
    }

    fn namespace(&self) -> Namespace {
        typed(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": self.labels()},
        }))
    }

    /// The Deployment that runs the image with the options, in the operator's namespace.
    pub(crate) fn deployment(&self) -> Deployment {
        let mut args = vec!["run".to_string()];
        args.extend(self.run.to_args());
        let mut env = vec![
            // The identity among peers, as Kopf's POD_ID.
            json!({"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
            json!({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}),
        ];
        if let Some(field_path) = &self.namespaces_field {
            env.push(json!({"name": "KACTOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": field_path}}}));
        }
        let scrape = json!({
            "prometheus.io/scrape": "true",
            "prometheus.io/port": self.port.to_string(),
            "prometheus.io/path": "/metrics",
        });
        // The old pods go before the new ones start: a new pod beside an old one would wait for it
        // (a lease, a peer of the same priority) and never be ready, and a rolling update would
        // wait for that.
        let strategy = json!({"type": "Recreate"});
        let liveness_path = if self.liveness_path == "/" {
            "/healthz"
        } else {
            self.liveness_path.as_str()
        };
        typed(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels()},
            "spec": {
                "replicas": self.replicas,
                "strategy": strategy,
                "selector": {"matchLabels": self.labels()},
                "template": {
                    "metadata": {"labels": self.labels(), "annotations": scrape},
                    "spec": {
                        "serviceAccountName": self.name,
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "operator",
                            "image": self.image,
                            "args": args,
                            "env": env,
                            "ports": [{"name": "http", "containerPort": self.port}],
                            "livenessProbe": {
                                "httpGet": {"path": liveness_path, "port": "http"},
                                "initialDelaySeconds": 5,
                                "periodSeconds": 10,
                                "failureThreshold": 3,
                            },
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": "http"},
                                "periodSeconds": 5,
                            },
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "64Mi"},
                                "limits": {"memory": "256Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }],
                    },
                },
            },
        }))
    }

    /// The Service for `/metrics`, in the operator's namespace.
    pub(crate) fn service(&self) -> Service {
        typed(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": format!("{}-metrics", self.name),
                "namespace": self.namespace,
                "labels": self.labels(),
            },
            "spec": {
                "selector": self.labels(),
                "ports": [{"name": "http", "port": self.port, "targetPort": "http"}],
            },
        }))
    }
}

/// A manifest written as JSON, read into its k8s-openapi type: a typo in a field name or type fails
/// the tests, and the YAML comes out in the type's field order (apiVersion, kind, metadata, spec).
fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("the manifests are written as their k8s-openapi types")
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::cli::{Command, Manifests};

    fn deploy_args(args: &[&str]) -> DeployArgs {
        let mut argv = vec!["manifests", "--image", "op:1"];
        argv.extend_from_slice(args);
        match crate::cli::tests::cli(&argv).unwrap().command() {
            Command::Manifests(Manifests::All(args)) => args,
            other => panic!("{other:?}"),
        }
    }

    fn widgets() -> Operator {
        Operator::new().on_create(
            ("example.com", "v1", "widgets"),
            "create_fn",
            |_: kactor_reactor::handlers::Ctx| async { Ok(()) },
        )
    }

    async fn documents(args: &[&str]) -> Vec<Value> {
        let yaml = manifests(&widgets(), &deploy_args(args)).await.unwrap();
        serde_saphyr::from_multiple(&yaml).unwrap()
    }

    fn kinds(documents: &[Value]) -> Vec<String> {
        documents
            .iter()
            .map(|d| {
                format!(
                    "{} {}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn everything_comes_in_the_order_a_cluster_accepts() {
        let documents = documents(&["-A", "--name", "my-op", "--peering", "ops"]).await;
        assert_eq!(
            kinds(&documents),
            [
                "Namespace my-op",
                "CustomResourceDefinition clusterkopfpeerings.kopf.dev",
                "CustomResourceDefinition kopfpeerings.kopf.dev",
                "ServiceAccount my-op",
                "ClusterRole my-op",
                "ClusterRoleBinding my-op",
                "Deployment my-op",
                "Service my-op-metrics",
            ]
        );
        let deployment = &documents[6];
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "op:1");
        assert_eq!(
            container["args"],
            serde_json::json!([
                "run",
                "--all-namespaces",
                "--peering=ops",
                "--create-peering",
                "--liveness=http://0.0.0.0:8080/healthz"
            ])
        );
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(
            deployment["spec"]["template"]["spec"]["serviceAccountName"],
            "my-op"
        );
        assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        // The RBAC grants creating the peering object, which is not among the manifests.
        let role = serde_json::to_string(&documents[4]).unwrap();
        assert!(role.contains(r#""verbs":["create"]"#), "{role}");
        assert!(!kinds(&documents)
            .iter()
            .any(|k| k.starts_with("ClusterKopfPeering")));
    }

    #[tokio::test]
    async fn options_shape_the_deployment_and_the_rbac() {
        let documents = documents(&[
            "-n",
            "team-a",
            "--name",
            "my-op",
            "--operator-namespace",
            "ops",
            "--leader-election",
            "--replicas",
            "2",
            "--liveness",
            "http://0.0.0.0:9090/live",
            "--log-format",
            "json",
        ])
        .await;
        let kinds = kinds(&documents);
        assert_eq!(kinds[0], "Namespace ops");
        // No peering CRDs without --peering; a Role where the lease lives, in the operator's namespace.
        assert!(!kinds.iter().any(|k| k.contains("kopf.dev")), "{kinds:?}");
        let lease_role = documents
            .iter()
            .find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "ops")
            .expect("a Role for the lease in the operator's namespace");
        assert!(serde_json::to_string(lease_role)
            .unwrap()
            .contains("leases"));
        let deployment = documents
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .unwrap();
        assert_eq!(deployment["spec"]["replicas"], 2);
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(args.contains(&"--namespace=team-a"), "{args:?}");
        assert!(
            args.contains(&"--lease-name=my-op"),
            "named: the program is `operator` in the image"
        );
        assert!(args.contains(&"--log-format=json"));
        assert_eq!(container["ports"][0]["containerPort"], 9090);
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/live");
        let service = documents.iter().find(|d| d["kind"] == "Service").unwrap();
        assert_eq!(service["spec"]["ports"][0]["port"], 9090);
    }

    #[tokio::test]
    async fn what_cannot_be_deployed_is_a_clear_error() {
        for (args, says) in [
            (&["--emulator"][..], "--emulator runs the operator here"),
            (
                &["--replicas", "3"],
                "3 replicas would all handle the same objects",
            ),
            (&["--name", "My_Op"], "is not a Kubernetes name"),
            (&["--operator-namespace=ops-"], "is not a Kubernetes name"),
            (&["--name", "1op"], "a letter first"),
            (&["-L", "http://127.0.0.1:8080/healthz"], "loopback"),
            (&["-L", "https://0.0.0.0:8080/healthz"], "only http"),
        ] {
            let error = manifests(&widgets(), &deploy_args(args))
                .await
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{args:?}: {error}");
        }
        // With a way to take turns, replicas are fine.
        let documents = documents(&["-A", "--replicas", "3", "--leader-election"]).await;
        assert!(documents.iter().any(|d| d["spec"]["replicas"] == 3));
    }
}
