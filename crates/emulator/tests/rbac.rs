//! RBAC mode, over real HTTP with the real `kube::Client`: service accounts are allowed what the
//! stored Roles and bindings grant them, and denied the rest with the API server's 403.

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kactor_emulator::{samples, Emulator};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use serde_json::json;

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(String::from),
        ..Default::default()
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |items: &[&str]| Some(items.iter().map(|s| s.to_string()).collect());
    PolicyRule {
        api_groups: strings(groups),
        resources: strings(resources),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn the_operator() -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: "my-op".into(),
        namespace: Some("default".into()),
        ..Default::default()
    }]
}

/// An emulator in RBAC mode with the widgets CRD, a widget `w1`, and the service account
/// `default/my-op` (with no permissions yet).
async fn emulator() -> Emulator {
    let emulator = Emulator::builder().rbac(true).start().await.unwrap();
    let widgets = samples::install_widgets(&emulator.client()).await.unwrap();
    let widget = serde_json::from_value(samples::widget("w1", 1)).unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(emulator.client(), "default");
    let account = ServiceAccount {
        metadata: meta("my-op", None),
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    emulator
}

fn widgets(client: kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client, "default", &samples::widget_api_resource())
}

fn status(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn without_rbac_mode_a_service_account_may_do_anything() {
    let emulator = Emulator::start().await.unwrap();
    let client = emulator
        .client_as_service_account("nowhere", "nobody")
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    assert_eq!(configmaps.namespace(), Some("nowhere"));
    let configmaps: Api<ConfigMap> = Api::namespaced(configmaps.into_client(), "default");
    assert!(configmaps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

#[tokio::test]
async fn a_service_account_without_permissions_gets_the_api_servers_403() {
    let emulator = emulator().await;
    let client = emulator
        .client_as_service_account("default", "my-op")
        .unwrap();
    let error = widgets(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap_err();
    let status = status(error);
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "widgets.example.com is forbidden: User \"system:serviceaccount:default:my-op\" cannot \
         list resource \"widgets\" in API group \"example.com\" in the namespace \"default\""
    );
    // Discovery stays open.
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    assert!(discovery.has_group("example.com"));
}

#[tokio::test]
async fn a_role_and_its_binding_grant_exactly_their_rules() {
    let emulator = emulator().await;
    let admin = emulator.client();
    let roles: Api<Role> = Api::namespaced(admin.clone(), "default");
    let role = Role {
        metadata: meta("widgets", None),
        rules: Some(vec![
            rule(&["example.com"], &["widgets"], &["list", "watch", "patch"]),
            rule(&["example.com"], &["widgets/status"], &["patch"]),
        ]),
    };
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin, "default");
    let binding = RoleBinding {
        metadata: meta("widgets", None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "widgets".into(),
        },
        subjects: Some(the_operator()),
    };
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let api = widgets(
        emulator
            .client_as_service_account("default", "my-op")
            .unwrap(),
    );
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let patch = Patch::Merge(json!({"status": {"done": true}}));
    api.patch_status("w1", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let error = status(api.get("w1").await.unwrap_err());
    assert_eq!(
        error.message,
        "widgets.example.com \"w1\" is forbidden: User \"system:serviceaccount:default:my-op\" \
         cannot get resource \"widgets\" in API group \"example.com\" in the namespace \"default\""
    );
    // The Role is in `default` only.
    let elsewhere: Api<DynamicObject> = Api::namespaced_with(
        emulator
            .client_as_service_account("default", "my-op")
            .unwrap(),
        "kube-system",
        &samples::widget_api_resource(),
    );
    let error = status(elsewhere.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(error.code, 403);
}

#[tokio::test]
async fn a_cluster_role_binding_grants_everywhere_and_at_the_cluster_scope() {
    let emulator = emulator().await;
    let admin = emulator.client();
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let role = ClusterRole {
        metadata: meta("widget-reader", None),
        rules: Some(vec![rule(&["example.com"], &["widgets"], &["list"])]),
        ..Default::default()
    };
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(admin);
    let binding = ClusterRoleBinding {
        metadata: meta("widget-reader", None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "widget-reader".into(),
        },
        subjects: Some(the_operator()),
    };
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let client = emulator
        .client_as_service_account("default", "my-op")
        .unwrap();
    let all: Api<DynamicObject> = Api::all_with(client, &samples::widget_api_resource());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}

#[tokio::test]
async fn the_admin_may_do_anything_and_unknown_tokens_are_unauthorized() {
    let emulator = emulator().await;
    let configmaps: Api<ConfigMap> = Api::namespaced(emulator.client(), "kube-system");
    configmaps.list(&ListParams::default()).await.unwrap();

    let mut config = emulator.config();
    config.auth_info.token = Some("forged".to_string().into());
    let forged: Api<ConfigMap> =
        Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let error = status(forged.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((error.code, error.reason.as_str()), (401, "Unauthorized"));

    // The token of a service account that does not exist (any more) is refused too.
    let accounts: Api<ServiceAccount> = Api::namespaced(emulator.client(), "default");
    accounts.delete("my-op", &Default::default()).await.unwrap();
    let gone: Api<ConfigMap> = Api::namespaced(
        emulator
            .client_as_service_account("default", "my-op")
            .unwrap(),
        "default",
    );
    let error = status(gone.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(error.code, 401);
}
