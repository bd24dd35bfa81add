//! The test clusters themselves, on whichever server `KACTOR_TEST_CLUSTER` names: what every test
//! relies on (the version, namespaces, owner-reference garbage collection, RBAC with service-account
//! clients), and, for the real server (`apiserver_only`), that it leaves nothing behind.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kactor_testenv::{Backend, TestCluster};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

/// The longest anything is waited for (the garbage collector and the namespace controller of a real
/// server work in the background).
const WAIT: Duration = Duration::from_secs(60);

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn configmap(name: &str, owner: Option<&ConfigMap>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|owner| {
                vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: owner.metadata.name.clone().unwrap(),
                        uid: owner.metadata.uid.clone().unwrap(),
                        ..Default::default()
                    },
                ]
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn code(error: kube::Error) -> u16 {
    match error {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn a_cluster_reports_its_server_version() {
    let cluster = TestCluster::start().await.unwrap();
    let version = cluster.client().apiserver_version().await.unwrap();
    let expected = match cluster.backend() {
        Backend::Emulator => kactor_testenv::emulator::KUBERNETES_VERSION,
        Backend::ApiServer => kactor_testenv::apiserver::KUBERNETES_VERSION,
    };
    assert_eq!(version.git_version, expected);
    assert!(cluster.url().starts_with(match cluster.backend() {
        Backend::Emulator => "http://127.0.0.1:",
        Backend::ApiServer => "https://127.0.0.1:",
    }));
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_deleted_namespace_takes_its_objects_with_it() {
    let cluster = TestCluster::start().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some("doomed".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), "doomed");
    configmaps
        .create(&PostParams::default(), &configmap("inside", None))
        .await
        .unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace to go", || async {
        namespaces.get_opt("doomed").await.unwrap().is_none()
    })
    .await;
    // A namespace created again under the same name starts empty.
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    assert!(configmaps.get_opt("inside").await.unwrap().is_none());
}

#[tokio::test]
async fn an_owners_deletion_collects_its_dependents() {
    let cluster = TestCluster::start().await.unwrap();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(cluster.client());
    let owner = configmaps
        .create(&PostParams::default(), &configmap("owner", None))
        .await
        .unwrap();
    configmaps
        .create(
            &PostParams::default(),
            &configmap("dependent", Some(&owner)),
        )
        .await
        .unwrap();
    configmaps
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the dependent to be collected", || async {
        configmaps.get_opt("dependent").await.unwrap().is_none()
    })
    .await;
}

/// A cluster in RBAC mode with the service account `default/reader`, bound to a Role that may get
/// and list ConfigMaps, once the binding has taken effect; the cluster and the reader's client.
async fn cluster_with_a_reader() -> (TestCluster, kube::Client) {
    let cluster = TestCluster::builder().rbac(true).start().await.unwrap();
    let admin = cluster.client();
    let post = PostParams::default();
    Api::<ServiceAccount>::default_namespaced(admin.clone())
        .create(
            &post,
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("reader".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<Role>::default_namespaced(admin.clone())
        .create(
            &post,
            &Role {
                metadata: ObjectMeta {
                    name: Some("read-configmaps".into()),
                    ..Default::default()
                },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["".into()]),
                    resources: Some(vec!["configmaps".into()]),
                    verbs: vec!["get".into(), "list".into()],
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    Api::<RoleBinding>::default_namespaced(admin.clone())
        .create(
            &post,
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some("reader".into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: "read-configmaps".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "reader".into(),
                    namespace: Some("default".into()),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();

    let reader = cluster
        .client_as_service_account("default", "reader")
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(reader.clone());
    // A real server's authorizer sees a new binding a moment after it is created.
    eventually("the binding to take effect", || async {
        configmaps.list(&Default::default()).await.is_ok()
    })
    .await;
    (cluster, reader)
}

#[tokio::test]
async fn in_rbac_mode_a_service_account_may_do_only_what_its_role_grants() {
    let (_cluster, reader) = cluster_with_a_reader().await;
    let post = PostParams::default();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(reader.clone());
    let denied = configmaps
        .create(&post, &configmap("written", None))
        .await
        .unwrap_err();
    assert_eq!(code(denied), 403);
    let secrets: Api<Secret> = Api::default_namespaced(reader.clone());
    assert_eq!(
        code(secrets.list(&Default::default()).await.unwrap_err()),
        403
    );
}

#[tokio::test]
async fn in_rbac_mode_a_self_subject_access_review_answers_what_the_bindings_allow() {
    let (_cluster, reader) = cluster_with_a_reader().await;
    // What `kubectl auth can-i` asks: any user may, and the answer is what RBAC decides.
    let reviews: Api<SelfSubjectAccessReview> = Api::all(reader);
    let can = |verb: &str, resource: &str| {
        let reviews = reviews.clone();
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some(resource.into()),
                    namespace: Some("default".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        async move {
            let answered = reviews
                .create(&PostParams::default(), &review)
                .await
                .unwrap();
            answered.status.expect("a review's answer").allowed
        }
    };
    assert!(can("list", "configmaps").await);
    assert!(!can("create", "configmaps").await);
    assert!(!can("list", "secrets").await);
}

/// What only the real server's process has to prove; `scripts/test` runs these on its pass only.
mod apiserver_only {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    #[tokio::test]
    async fn a_server_that_shuts_down_removes_its_state() {
        let server = kactor_testenv::ApiServer::start(false).await.unwrap();
        let url = server.url().to_string();
        let state = server.kubeconfig_path().parent().unwrap().to_path_buf();
        assert!(state.is_dir());
        server.shutdown().await;
        assert_unreachable(&url).await;
        assert!(!state.exists(), "{} is left behind", state.display());
    }

    #[tokio::test]
    async fn its_kubeconfig_serves_other_programs() {
        let cluster = TestCluster::builder()
            .backend(Backend::ApiServer)
            .start()
            .await
            .unwrap();
        let path =
            std::env::temp_dir().join(format!("kactor-testenv-{}.kubeconfig", std::process::id()));
        cluster.write_kubeconfig(&path).unwrap();
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        assert_eq!(
            config.cluster_url.to_string().trim_end_matches('/'),
            cluster.url()
        );
        let client = kube::Client::try_from(config).unwrap();
        let namespaces: Api<Namespace> = Api::all(client);
        assert!(namespaces.get_opt("kube-system").await.unwrap().is_some());
    }

    /// A test process killed by SIGKILL runs no destructor: its server must still go.
    #[tokio::test]
    async fn a_killed_parent_takes_its_server_with_it() {
        let mut parent = Command::new(env!("CARGO_BIN_EXE_kactor-testenv"))
            .arg("apiserver")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(parent.stdout.take().unwrap());
        let mut url = None;
        let mut kubeconfig = None;
        for line in stdout.lines() {
            let line = line.unwrap();
            if let Some((_, at)) = line.split_once(" at ") {
                url = Some(at.to_string());
            }
            if let Some(path) = line.strip_prefix("export KUBECONFIG=") {
                kubeconfig = Some(std::path::PathBuf::from(path));
                break;
            }
        }
        let (url, kubeconfig) = (url.expect("a URL line"), kubeconfig.expect("a kubeconfig"));
        assert!(kubeconfig.is_file());
        parent.kill().unwrap(); // SIGKILL
        parent.wait().unwrap();
        assert_unreachable(&url).await;
        // The server removed its state directory (the kubeconfig was in it).
        eventually("the state directory to go", || async {
            !kubeconfig.exists()
        })
        .await;
    }

    async fn assert_unreachable(url: &str) {
        let address = url.trim_start_matches("https://").to_string();
        eventually("the server to stop listening", || {
            let address = address.clone();
            async move { tokio::net::TcpStream::connect(address).await.is_err() }
        })
        .await;
    }
}
