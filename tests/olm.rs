//! `olm bundle`, end to end: the bundle it writes is what a cluster with OLM accepts. OLM's own
//! ClusterServiceVersion CRD (vendored from operator-framework/api, `tests/data/olm/`) is installed
//! in the test cluster, and the bundle's manifests are applied to it as `kubectl apply
//! --server-side` would (strict field validation): the server validates the CSV against OLM's
//! OpenAPI schema, refuses a field it does not declare, and stores it whole. Then what OLM makes of
//! the CSV (the service account, Roles and ClusterRoles of its permissions, the Deployment of its
//! deployment spec) is created too, so that the API server validates those as the built-in kinds
//! they become.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kactor::cli::{Command, OperatorCli};
use kactor::emulator::samples;
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope as ApiScope;
use serde_json::Value;

/// OLM's ClusterServiceVersion CRD, as operator-framework/api publishes it.
const CSV_CRD: &str = include_str!("data/olm/operators.coreos.com_clusterserviceversions.yaml");
/// The namespace OLM installs the operator in, in these tests.
const NAMESPACE: &str = "operators";

/// Handles widgets (whose CRD it declares) and owns a Deployment per widget.
fn operator() -> Operator {
    let crd: CustomResourceDefinition = serde_json::from_value(samples::widget_crd()).unwrap();
    Operator::new()
        .crd(crd)
        .on_create(
            ("example.com", "v1", "widgets"),
            "create_fn",
            |_: Ctx| async { Ok(()) },
        )
        .permission(
            "apps",
            "deployments",
            &["get", "create", "patch"],
            "each widget owns a Deployment",
        )
}

/// A fresh directory for a bundle.
fn directory(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kactor-olm-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `my-op olm bundle --image ... --output-dir DIR ARGS...` as the command line does, and
/// returns what it said.
async fn olm_bundle(dir: &Path, args: &[&str]) -> String {
    let mut argv = vec![
        "my-op",
        "olm",
        "bundle",
        "--image",
        "registry.example.com/my-op:1.0.0",
        "--name",
        "my-op",
        "--output-dir",
        dir.to_str().unwrap(),
    ];
    argv.extend_from_slice(args);
    let Command::Manifests(command) = OperatorCli::parse_from(argv).unwrap().command() else {
        panic!("not a manifests command")
    };
    let mut messages = Vec::new();
    command
        .execute(
            &operator(),
            &mut std::io::empty(),
            &mut std::io::sink(),
            &mut messages,
        )
        .await
        .unwrap();
    String::from_utf8(messages).unwrap()
}

/// The bundle's manifests, CRDs first (a cluster needs them before their objects).
fn manifests(dir: &Path) -> Vec<Value> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.join("manifests"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    paths.sort();
    let mut objects: Vec<Value> = paths
        .iter()
        .map(|path| serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap())
        .collect();
    objects.sort_by_key(|object| object["kind"] != "CustomResourceDefinition");
    objects
}

/// A test cluster with OLM's ClusterServiceVersion CRD, and the namespace OLM installs in.
async fn cluster_with_olm() -> TestCluster {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(CSV_CRD).unwrap();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .expect("OLM's CSV CRD installs");
    samples::until_established(&client, "clusterserviceversions.operators.coreos.com")
        .await
        .unwrap();
    samples::until_discovered(
        &client,
        "operators.coreos.com",
        "v1alpha1",
        "clusterserviceversions",
    )
    .await
    .unwrap();
    apply(
        &client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    )
    .await
    .unwrap();
    cluster
}

/// Applies `object` server-side with strict field validation (as `kubectl apply --server-side`),
/// in [`NAMESPACE`] if its kind is namespaced; its kind is resolved through discovery.
async fn apply(client: &kube::Client, object: &Value) -> kube::Result<DynamicObject> {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", object["apiVersion"].as_str().unwrap()),
    };
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match capabilities.scope {
        ApiScope::Namespaced => Api::namespaced_with(client.clone(), NAMESPACE, &resource),
        ApiScope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let name = object["metadata"]["name"].as_str().unwrap();
    let params = PatchParams::apply("kactor-olm-test").validation_strict();
    api.patch(name, &params, &Patch::Apply(object)).await
}

/// Applies every manifest of the bundle; returns the CSV as sent and as stored.
async fn apply_the_bundle(client: &kube::Client, dir: &Path) -> (Value, DynamicObject) {
    let mut csv = None;
    for object in manifests(dir) {
        let stored = apply(client, &object)
            .await
            .unwrap_or_else(|e| panic!("{} is refused: {e}", object["metadata"]["name"]));
        match object["kind"].as_str().unwrap() {
            "CustomResourceDefinition" => {
                let name = object["metadata"]["name"].as_str().unwrap();
                samples::until_established(client, name).await.unwrap();
            }
            "ClusterServiceVersion" => csv = Some((object, stored)),
            _ => {}
        }
    }
    csv.expect("the bundle has a ClusterServiceVersion")
}

/// Creates what OLM makes of the CSV: the service account of each permission, a Role (and
/// RoleBinding) in the operator's namespace for `permissions`, a ClusterRole (and
/// ClusterRoleBinding) for `clusterPermissions`, and the Deployment.
async fn install_as_olm_does(client: &kube::Client, csv: &Value) {
    let install = &csv["spec"]["install"]["spec"];
    let rbac = "rbac.authorization.k8s.io/v1";
    for (field, role, binding) in [
        ("permissions", "Role", "RoleBinding"),
        ("clusterPermissions", "ClusterRole", "ClusterRoleBinding"),
    ] {
        for permission in install[field].as_array().into_iter().flatten() {
            let account = permission["serviceAccountName"].as_str().unwrap();
            let name = format!("{account}-{}", role.to_lowercase());
            for object in [
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}),
                json!({"apiVersion": rbac, "kind": role, "metadata": {"name": name},
                       "rules": permission["rules"]}),
                json!({"apiVersion": rbac, "kind": binding, "metadata": {"name": name},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": name},
                       "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]}),
            ] {
                apply(client, &object)
                    .await
                    .unwrap_or_else(|e| panic!("{object} is refused: {e}"));
            }
        }
    }
    for deployment in install["deployments"].as_array().unwrap() {
        let object = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": deployment["name"], "labels": deployment["label"]},
            "spec": deployment["spec"],
        });
        apply(client, &object)
            .await
            .unwrap_or_else(|e| panic!("the Deployment is refused: {e}"));
    }
}

/// Checks that every field `sent` has is `stored` with the same value: nothing was pruned or changed
/// (the server may add what the schema defaults, such as a port's `protocol: TCP`).
fn kept(sent: &Value, stored: &Value, path: &str) {
    match (sent, stored) {
        (Value::Object(sent), Value::Object(stored)) => {
            for (key, value) in sent {
                let at = format!("{path}.{key}");
                let stored = stored.get(key).unwrap_or_else(|| panic!("{at} was pruned"));
                kept(value, stored, &at);
            }
        }
        (Value::Array(sent), Value::Array(stored)) => {
            assert_eq!(sent.len(), stored.len(), "{path} changed length");
            for (i, (sent, stored)) in sent.iter().zip(stored).enumerate() {
                kept(sent, stored, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(sent, stored, "{path} changed"),
    }
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
async fn a_cluster_wide_bundle_is_valid_for_olms_own_schema() {
    let cluster = cluster_with_olm().await;
    let client = cluster.client();
    let dir = directory("cluster-wide");
    let said = olm_bundle(
        &dir,
        &[
            "--version",
            "1.0.0-rc.1",
            "-A",
            "--peering",
            "widgets",
            "--leader-election",
            "--replicas",
            "2",
            "--channels",
            "alpha,stable",
            "--default-channel",
            "stable",
            "--min-kube-version",
            "1.28",
        ],
    )
    .await;
    assert!(
        said.starts_with(&format!(
            "wrote the OLM bundle of my-op.v1.0.0-rc.1 (install modes: AllNamespaces) to {}:",
            dir.display()
        )),
        "{said}"
    );
    let (sent, stored) = apply_the_bundle(&client, &dir).await;
    // Stored whole: OLM's schema declares every field written, and prunes nothing.
    kept(&sent["spec"], &stored.data["spec"], "spec");
    assert_eq!(stored.metadata.name.as_deref(), Some("my-op.v1.0.0-rc.1"));
    assert_eq!(supported(&sent), ["AllNamespaces"]);
    let owned = sent["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .unwrap();
    assert_eq!(
        owned.len(),
        3,
        "widgets and the two peering CRDs: {owned:?}"
    );
    let install = &sent["spec"]["install"]["spec"];
    assert!(install["permissions"][0]["rules"]
        .to_string()
        .contains("leases"));
    assert!(install["clusterPermissions"][0]["rules"]
        .to_string()
        .contains("widgets"));
    install_as_olm_does(&client, &sent).await;
    let annotations: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("metadata/annotations.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        annotations["annotations"]["operators.operatorframework.io.bundle.channels.v1"],
        "alpha,stable"
    );
    let _ = std::fs::remove_dir_all(&dir);
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_namespaced_bundle_is_valid_for_olms_own_schema() {
    let cluster = cluster_with_olm().await;
    let client = cluster.client();
    let dir = directory("namespaced");
    let said = olm_bundle(&dir, &["--version", "0.3.1", "-n", "team-a"]).await;
    assert!(
        said.contains("(install modes: OwnNamespace, SingleNamespace, MultiNamespace)"),
        "{said}"
    );
    let (sent, stored) = apply_the_bundle(&client, &dir).await;
    kept(&sent["spec"], &stored.data["spec"], "spec");
    let install = &sent["spec"]["install"]["spec"];
    // The handled resources in the namespaces served, the CRDs cluster-wide.
    assert!(install["permissions"][0]["rules"]
        .to_string()
        .contains("widgets"));
    assert!(!install["clusterPermissions"][0]["rules"]
        .to_string()
        .contains("widgets"));
    let container = &install["deployments"][0]["spec"]["template"]["spec"]["containers"][0];
    assert!(container["env"]
        .to_string()
        .contains("olm.targetNamespaces"));
    install_as_olm_does(&client, &sent).await;
    let _ = std::fs::remove_dir_all(&dir);
    cluster.shutdown().await;
}

/// The schema is checked, not merely stored: a CSV that breaks it is refused, created (a wrong type,
/// a required field missing: 422 Invalid) or applied (a field the schema does not declare, under
/// strict field validation).
#[tokio::test]
async fn a_csv_that_breaks_olms_schema_is_refused() {
    let cluster = cluster_with_olm().await;
    let client = cluster.client();
    let dir = directory("broken");
    olm_bundle(&dir, &["--version", "1.0.0", "-A"]).await;
    let (sent, _) = apply_the_bundle(&client, &dir).await;
    let csvs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", "ClusterServiceVersion"),
            "clusterserviceversions",
        ),
    );
    let invalid = |name: &str, change: &dyn Fn(&mut Value)| {
        let mut csv = sent.clone();
        csv["metadata"]["name"] = json!(name);
        change(&mut csv);
        let csvs = csvs.clone();
        async move {
            let csv: DynamicObject = serde_json::from_value(csv).unwrap();
            match csvs.create(&PostParams::default(), &csv).await {
                Err(kube::Error::Api(status)) => status,
                other => panic!("not refused: {other:?}"),
            }
        }
    };
    let status = invalid("wrong-type.v1.0.0", &|csv| {
        csv["spec"]["installModes"][0]["supported"] = json!("yes");
    })
    .await;
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains("installModes[0].supported"),
        "{status:?}"
    );
    let status = invalid("missing.v1.0.0", &|csv| {
        csv["spec"].as_object_mut().unwrap().remove("displayName");
    })
    .await;
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("displayName"), "{status:?}");
    let mut unknown = sent;
    unknown["metadata"]["name"] = json!("unknown-field.v1.0.0");
    unknown["spec"]["install"]["spec"]["deployment"] = json!([]);
    match apply(&client, &unknown).await {
        Err(kube::Error::Api(status)) => {
            assert!(status.message.contains("deployment"), "{status:?}")
        }
        other => panic!("not refused: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
    cluster.shutdown().await;
}
