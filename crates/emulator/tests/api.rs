//! The emulator's API semantics, checked over real HTTP with the real `kube::Client`.
//!
//! Each test starts its own emulator and names the behaviour it checks.

use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kactor_emulator::{samples, Emulator, Failure, Matcher};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    PropagationPolicy, WatchEvent, WatchParams,
};
use kube::discovery::ApiResource;
use kube::Client;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

fn widgets(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &samples::widget_api_resource())
}

fn crds(client: &Client) -> Api<DynamicObject> {
    let resource = samples::crd_api_resource();
    Api::all_with(client.clone(), &resource)
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

/// A client that does not retry 429/503 answers itself (kube's default client does), to see injected faults.
fn no_retry(emulator: &Emulator) -> Client {
    let mut config = emulator.config();
    config.default_retry = false;
    Client::try_from(config).expect("a client")
}

/// An emulator with the sample `widgets.example.com` CRD installed.
async fn with_widgets() -> (Emulator, Api<DynamicObject>) {
    let emulator = Emulator::start().await.expect("emulator starts");
    crds(&emulator.client())
        .create(&PostParams::default(), &object(samples::widget_crd()))
        .await
        .expect("CRD created");
    let api = widgets(&emulator.client(), "default");
    (emulator, api)
}

async fn create_widget(api: &Api<DynamicObject>, name: &str, size: i64) -> DynamicObject {
    api.create(&PostParams::default(), &object(samples::widget(name, size)))
        .await
        .expect("widget created")
}

fn status_of(error: kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn rv(object: &DynamicObject) -> u64 {
    object
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default()
        .parse()
        .expect("numeric resourceVersion")
}

/// One raw request: status, JSON body (or Null), and headers.
async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value, hyper::HeaderMap) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .expect("a valid request");
    let response = client.send(request).await.expect("the request is answered");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("a body")
        .to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

async fn next_event<S, K>(stream: &mut S) -> WatchEvent<K>
where
    S: Stream<Item = kube::Result<WatchEvent<K>>> + Unpin,
{
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event in time")
        .expect("the stream is open")
        .expect("a valid event")
}

fn name_of(event: &WatchEvent<DynamicObject>) -> (&'static str, String) {
    match event {
        WatchEvent::Added(o) => ("ADDED", o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Modified(o) => ("MODIFIED", o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Deleted(o) => ("DELETED", o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Bookmark(b) => ("BOOKMARK", b.metadata.resource_version.clone()),
        WatchEvent::Error(e) => ("ERROR", e.reason.clone()),
    }
}

// ---- start-up and discovery ----

#[tokio::test]
async fn emulators_start_on_distinct_free_ports_and_serve_the_standard_namespaces() {
    let (a, b) = (
        Emulator::start().await.unwrap(),
        Emulator::start().await.unwrap(),
    );
    assert_ne!(a.url(), b.url());
    let namespaces: Api<Namespace> = Api::all(a.client());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for expected in ["default", "kube-system"] {
        assert!(
            names.contains(&expected.to_string()),
            "{expected} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn the_written_kubeconfig_gives_a_working_client() {
    let emulator = Emulator::start().await.unwrap();
    let config = kube::Config::from_custom_kubeconfig(emulator.kubeconfig(), &Default::default())
        .await
        .unwrap();
    assert_eq!(config.default_namespace, "default");
    let client = Client::try_from(config).unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, kactor_emulator::KUBERNETES_VERSION);
}

#[tokio::test]
async fn discovery_lists_built_in_and_custom_resources_with_verbs_short_names_and_status() {
    let (emulator, _) = with_widgets().await;
    let discovery = kube::Discovery::new(emulator.client()).run().await.unwrap();
    let find = |group: &str, plural: &str| {
        discovery
            .groups()
            .filter(|g| g.name() == group)
            .flat_map(|g| g.recommended_resources())
            .find(|(r, _)| r.plural == plural)
            .unwrap_or_else(|| panic!("{plural}.{group} not discovered"))
    };
    for (group, plural) in [
        ("", "namespaces"),
        ("", "configmaps"),
        ("", "secrets"),
        ("", "pods"),
        ("", "services"),
        ("", "events"),
        ("events.k8s.io", "events"),
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("apps", "statefulsets"),
        ("coordination.k8s.io", "leases"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
        ),
    ] {
        let (_, caps) = find(group, plural);
        assert!(
            caps.supports_operation(kube::discovery::verbs::WATCH),
            "{plural} is watchable"
        );
    }
    let (widget, caps) = find("example.com", "widgets");
    assert_eq!(widget.kind, "Widget");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(
        caps.subresources.iter().any(|(r, _)| r.plural == "status"),
        "status subresource discovered"
    );
    let (_, list, _) = raw(
        &emulator.client(),
        "GET",
        "/apis/example.com/v1",
        "application/json",
        "",
    )
    .await;
    let entry = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "widgets")
        .unwrap()
        .clone();
    assert_eq!(entry["shortNames"], json!(["wd"]));
    assert_eq!(entry["singularName"], "widget");
    assert_eq!(entry["categories"], json!(["all"]));
}

#[tokio::test]
async fn openapi_documents_are_served_for_kubectl() {
    let (emulator, _) = with_widgets().await;
    let (code, root, _) = raw(
        &emulator.client(),
        "GET",
        "/openapi/v3",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 200);
    let url = root["paths"]["apis/example.com/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, doc, _) = raw(&emulator.client(), "GET", &url, "application/json", "").await;
    assert_eq!(code, 200);
    assert!(
        doc["components"]["schemas"]["com.example.v1.Widget"]["properties"]["spec"].is_object()
    );
    let (code, v2, _) = raw(
        &emulator.client(),
        "GET",
        "/openapi/v2",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(v2["swagger"], "2.0");

    // kubectl asks for v2 in protobuf (gnostic's openapi.v2.Document) when it validates a kind the v3
    // documents do not list yet; a real server answers in protobuf, and so does the emulator.
    let request = http::Request::get("/openapi/v2")
        .header(
            "Accept",
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        )
        .body(Vec::new())
        .unwrap();
    let response = emulator
        .client()
        .send(request.map(Into::into))
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    );
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    // Field 1 (swagger) first: "2.0"; the widgets' definition and its group-version-kind within.
    assert!(
        body.starts_with(&[0x0A, 3, b'2', b'.', b'0']),
        "{:?}",
        &body[..16]
    );
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("com.example.v1.Widget"));
    assert!(text.contains("x-kubernetes-group-version-kind"));
    assert!(text.contains("fieldValidation"));
}

// ---- built-in kinds ----

#[tokio::test]
async fn built_in_kinds_are_stored_as_plain_objects_without_controllers() {
    let emulator = Emulator::start().await.unwrap();
    let deployments: Api<Deployment> = Api::default_namespaced(emulator.client());
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .unwrap();
    let created = deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::default_namespaced(emulator.client());
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no controller makes pods"
    );
    let scale = deployments.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));

    let leases: Api<Lease> = Api::default_namespaced(emulator.client());
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}})).unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(
        leases
            .get("leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("me")
    );

    let core_events: Api<k8s_openapi::api::core::v1::Event> =
        Api::default_namespaced(emulator.client());
    let event = serde_json::from_value(json!({"metadata": {"generateName": "kopf-event-"}, "involvedObject": {"kind": "Widget", "name": "w"}, "reason": "Logging", "message": "hi", "type": "Normal"})).unwrap();
    let posted = core_events
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
    assert!(posted.metadata.name.unwrap().starts_with("kopf-event-"));
    let new_events: Api<k8s_openapi::api::events::v1::Event> =
        Api::default_namespaced(emulator.client());
    let event = serde_json::from_value(json!({"metadata": {"name": "e1"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reason": "R", "action": "A", "reportingController": "c", "reportingInstance": "i"})).unwrap();
    new_events
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

#[tokio::test]
async fn secrets_store_string_data_as_base64_data() {
    let emulator = Emulator::start().await.unwrap();
    let secrets: Api<Secret> = Api::default_namespaced(emulator.client());
    let secret = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}),
    )
    .unwrap();
    let created = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert_eq!(created.data.unwrap()["password"].0, b"hunter2");
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
    assert!(created.string_data.is_none());
}

// ---- CRDs ----

#[tokio::test]
async fn creating_a_crd_serves_its_kind_at_once_and_marks_it_established() {
    let (emulator, api) = with_widgets().await;
    let crd = crds(&emulator.client())
        .get("widgets.example.com")
        .await
        .unwrap();
    let conditions = crd.data["status"]["conditions"].as_array().unwrap().clone();
    assert!(conditions
        .iter()
        .any(|c| c["type"] == "Established" && c["status"] == "True"));
    assert_eq!(crd.data["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(crd.data["status"]["storedVersions"], json!(["v1"]));
    create_widget(&api, "w1", 1).await;
    assert_eq!(api.get("w1").await.unwrap().data["spec"]["size"], 1);
}

#[tokio::test]
async fn a_crd_serves_every_served_version_and_its_scope() {
    let emulator = Emulator::start().await.unwrap();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusterthings.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster", "names": {"plural": "clusterthings", "kind": "ClusterThing"},
                 "versions": [{"name": "v1beta1", "served": true, "storage": false},
                              {"name": "v1", "served": true, "storage": true},
                              {"name": "v1alpha1", "served": false, "storage": false}]}
    });
    crds(&emulator.client())
        .create(&PostParams::default(), &object(crd))
        .await
        .unwrap();
    let resource = |version: &str| ApiResource {
        group: "example.com".into(),
        version: version.into(),
        api_version: format!("example.com/{version}"),
        kind: "ClusterThing".into(),
        plural: "clusterthings".into(),
    };
    let v1: Api<DynamicObject> = Api::all_with(emulator.client(), &resource("v1"));
    v1.create(&PostParams::default(), &object(json!({"apiVersion": "example.com/v1", "kind": "ClusterThing", "metadata": {"name": "t"}}))).await.unwrap();
    let v1beta1: Api<DynamicObject> = Api::all_with(emulator.client(), &resource("v1beta1"));
    let read = v1beta1.get("t").await.unwrap();
    assert_eq!(read.types.unwrap().api_version, "example.com/v1beta1");
    assert!(
        read.metadata.namespace.is_none(),
        "cluster-scoped objects have no namespace"
    );
    let (code, _, _) = raw(
        &emulator.client(),
        "GET",
        "/apis/example.com/v1alpha1/clusterthings",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 404, "unserved versions are not served");
    let group = kube::discovery::oneshot::group(&emulator.client(), "example.com")
        .await
        .unwrap();
    assert_eq!(group.preferred_version_or_latest(), "v1");
}

#[tokio::test]
async fn deleting_a_crd_stops_serving_it_and_drops_its_objects() {
    let (emulator, api) = with_widgets().await;
    create_widget(&api, "w1", 1).await;
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "w1".into())
    );
    crds(&emulator.client())
        .delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("DELETED", "w1".into())
    );
    let end = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the stream ends");
    assert!(
        end.is_none(),
        "the watch ends when the kind is no longer served"
    );
    let (code, _, _) = raw(
        &emulator.client(),
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 404);
    crds(&emulator.client())
        .create(&PostParams::default(), &object(samples::widget_crd()))
        .await
        .unwrap();
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "a re-created CRD starts empty"
    );
}

#[tokio::test]
async fn an_invalid_crd_is_rejected_as_invalid() {
    let emulator = Emulator::start().await.unwrap();
    let mut crd = samples::widget_crd();
    crd["metadata"]["name"] = json!("wrong.example.com");
    let error = crds(&emulator.client())
        .create(&PostParams::default(), &object(crd))
        .await
        .unwrap_err();
    assert_eq!(status_of(error), (422, "Invalid".into()));
}

#[tokio::test]
async fn custom_resources_are_pruned_and_validated_by_their_schema() {
    let (_emulator, api) = with_widgets().await;
    let mut body = samples::widget("w1", 2);
    body["unknown"] = json!("dropped");
    let created = api
        .create(&PostParams::default(), &object(body))
        .await
        .unwrap();
    assert!(
        created.data.get("unknown").is_none(),
        "undeclared top-level fields are pruned"
    );
    let error = api
        .create(&PostParams::default(), &object(samples::widget("w2", -1)))
        .await
        .unwrap_err();
    assert_eq!(status_of(error), (422, "Invalid".into()));
    let mut wrong_type = samples::widget("w3", 1);
    wrong_type["spec"]["size"] = json!("three");
    assert_eq!(
        status_of(
            api.create(&PostParams::default(), &object(wrong_type))
                .await
                .unwrap_err()
        )
        .0,
        422
    );
}

// ---- objects ----

#[tokio::test]
async fn created_objects_get_uid_timestamp_resource_version_generation_and_namespace() {
    let (_emulator, api) = with_widgets().await;
    let mut body = samples::widget("w1", 1);
    body["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    let created = api
        .create(&PostParams::default(), &object(body))
        .await
        .unwrap();
    assert_eq!(created.metadata.uid.as_ref().map(String::len), Some(36));
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.metadata.namespace.as_deref(),
        Some("default"),
        "the namespace comes from the URL"
    );
    assert!(rv(&created) > 0);
}

#[tokio::test]
async fn generate_name_makes_a_unique_name_with_the_prefix() {
    let (_emulator, api) = with_widgets().await;
    let mut names = Vec::new();
    for _ in 0..3 {
        let body = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"generateName": "w-"}, "spec": {"size": 1}});
        let created = api
            .create(&PostParams::default(), &object(body))
            .await
            .unwrap();
        let name = created.metadata.name.unwrap();
        assert!(name.starts_with("w-") && name.len() == 7, "{name}");
        names.push(name);
    }
    names.dedup();
    assert_eq!(names.len(), 3);
}

#[tokio::test]
async fn resource_versions_increase_across_every_kind() {
    let (emulator, api) = with_widgets().await;
    let a = create_widget(&api, "w1", 1).await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(emulator.client());
    let cm = configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
        )
        .await
        .unwrap();
    let b = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    let cm_rv: u64 = cm.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv(&a) < cm_rv && cm_rv < rv(&b));
}

#[tokio::test]
async fn generation_grows_on_spec_changes_only() {
    let (_emulator, api) = with_widgets().await;
    create_widget(&api, "w1", 1).await;
    let labelled = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(1),
        "metadata changes keep the generation"
    );
    let status = api
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ok": true}})),
        )
        .await
        .unwrap();
    assert_eq!(
        status.metadata.generation,
        Some(1),
        "status changes keep the generation"
    );
    let spec = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
}

#[tokio::test]
async fn a_no_op_patch_changes_no_resource_version() {
    let (_emulator, api) = with_widgets().await;
    let created = create_widget(&api, "w1", 1).await;
    let patched = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(rv(&patched), rv(&created));
}

#[tokio::test]
async fn errors_carry_the_api_servers_codes_and_reasons() {
    let (emulator, api) = with_widgets().await;
    let created = create_widget(&api, "w1", 1).await;
    assert_eq!(
        status_of(api.get("missing").await.unwrap_err()),
        (404, "NotFound".into())
    );
    assert_eq!(
        status_of(
            api.create(&PostParams::default(), &object(samples::widget("w1", 1)))
                .await
                .unwrap_err()
        ),
        (409, "AlreadyExists".into())
    );

    let mut stale = created.clone();
    stale.metadata.resource_version = Some((rv(&created) - 1).to_string());
    assert_eq!(
        status_of(
            api.replace("w1", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        (409, "Conflict".into())
    );
    let stale_patch = json!({"metadata": {"resourceVersion": "1"}, "spec": {"size": 2}});
    assert_eq!(
        status_of(
            api.patch("w1", &PatchParams::default(), &Patch::Merge(stale_patch))
                .await
                .unwrap_err()
        ),
        (409, "Conflict".into())
    );

    let bad_name = samples::widget("Bad_Name", 1);
    assert_eq!(
        status_of(
            api.create(&PostParams::default(), &object(bad_name))
                .await
                .unwrap_err()
        ),
        (422, "Invalid".into())
    );
    let failed_test: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/spec/size", "value": 99}])).unwrap();
    assert_eq!(
        status_of(
            api.patch(
                "w1",
                &PatchParams::default(),
                &Patch::Json::<()>(failed_test)
            )
            .await
            .unwrap_err()
        ),
        (422, "Invalid".into())
    );

    let (code, body, _) = raw(
        &emulator.client(),
        "POST",
        "/apis/example.com/v1/namespaces/default/widgets",
        "application/json",
        "{not json",
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(body["kind"], "Status");
    let (code, body, _) = raw(
        &emulator.client(),
        "POST",
        "/apis/example.com/v1/namespaces/nowhere/widgets",
        "application/json",
        &json!({"metadata": {"name": "w"}, "spec": {"size": 1}}).to_string(),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (404, Some("NotFound")),
        "objects need an existing namespace"
    );
    let (code, body, _) = raw(
        &emulator.client(),
        "PATCH",
        "/apis/example.com/v1/namespaces/default/widgets/w1",
        "text/plain",
        "{}",
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
}

#[tokio::test]
async fn custom_resources_need_a_resource_version_to_be_replaced() {
    let (_emulator, api) = with_widgets().await;
    let mut created = create_widget(&api, "w1", 1).await;
    created.metadata.resource_version = None;
    assert_eq!(
        status_of(
            api.replace("w1", &PostParams::default(), &created)
                .await
                .unwrap_err()
        ),
        (422, "Invalid".into())
    );
}

// ---- verbs ----

#[tokio::test]
async fn label_selectors_filter_lists_with_equality_and_set_expressions() {
    let (_emulator, api) = with_widgets().await;
    for (name, env) in [("a", "dev"), ("b", "qa"), ("c", "prod")] {
        let mut body = samples::widget(name, 1);
        body["metadata"]["labels"] = json!({"env": env});
        api.create(&PostParams::default(), &object(body))
            .await
            .unwrap();
    }
    let names = |list: kube::core::ObjectList<DynamicObject>| {
        list.items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("env=qa"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("env!=qa"))
                .await
                .unwrap()
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("env in (dev,prod)"))
                .await
                .unwrap()
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("env notin (dev)"))
                .await
                .unwrap()
        ),
        ["b", "c"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("!env"))
                .await
                .unwrap()
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("env"))
                .await
                .unwrap()
        )
        .len(),
        3
    );
}

#[tokio::test]
async fn field_selectors_filter_by_name_and_namespace() {
    let (emulator, api) = with_widgets().await;
    let namespaces: Api<Namespace> = Api::all(emulator.client());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
        )
        .await
        .unwrap();
    create_widget(&api, "a", 1).await;
    create_widget(&api, "b", 1).await;
    let mut body = samples::widget("a", 1);
    body["metadata"]["namespace"] = json!("other");
    widgets(&emulator.client(), "other")
        .create(&PostParams::default(), &object(body))
        .await
        .unwrap();
    let all: Api<DynamicObject> = Api::all_with(emulator.client(), &samples::widget_api_resource());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        3,
        "all-namespace lists see every namespace"
    );
    assert_eq!(
        all.list(&ListParams::default().fields("metadata.name=a"))
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    assert_eq!(
        all.list(&ListParams::default().fields("metadata.namespace=other"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        api.list(&ListParams::default().fields("metadata.name!=a"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        status_of(
            api.list(&ListParams::default().fields("spec.size=1"))
                .await
                .unwrap_err()
        )
        .0,
        400
    );
}

#[tokio::test]
async fn limit_and_continue_page_through_a_consistent_list() {
    let (_emulator, api) = with_widgets().await;
    for i in 0..5 {
        create_widget(&api, &format!("w{i}"), i).await;
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    api.delete("w3", &DeleteParams::default()).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    let names: Vec<_> = second
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        ["w2", "w3"],
        "later pages show the list as of the first page"
    );
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let third = api
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(third.items.len(), 1);
    assert!(third.metadata.continue_.is_none());
}

#[tokio::test]
async fn replace_merge_json_and_strategic_patches_change_objects() {
    let (emulator, api) = with_widgets().await;
    let mut current = create_widget(&api, "w1", 1).await;
    current.data["spec"]["size"] = json!(2);
    let replaced = api
        .replace("w1", &PostParams::default(), &current)
        .await
        .unwrap();
    assert_eq!(replaced.data["spec"]["size"], 2);
    let merged = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"color": "red"}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.data["spec"], json!({"size": 2, "color": "red"}));
    let operations: json_patch::Patch = serde_json::from_value(json!([{"op": "remove", "path": "/spec/color"}, {"op": "replace", "path": "/spec/size", "value": 3}])).unwrap();
    let jsoned = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Json::<()>(operations),
        )
        .await
        .unwrap();
    assert_eq!(jsoned.data["spec"], json!({"size": 3}));
    let configmaps: Api<ConfigMap> = Api::default_namespaced(emulator.client());
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    let strategic = configmaps
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Strategic(json!({"data": {"b": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(strategic.data.unwrap().len(), 2);
    let applied = configmaps.patch("d", &PatchParams::apply("test"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}, "data": {"x": "y"}}))).await.unwrap();
    assert_eq!(
        applied.data.unwrap()["x"],
        "y",
        "server-side apply creates a missing object"
    );
}

#[tokio::test]
async fn delete_collection_deletes_the_selected_objects() {
    let (_emulator, api) = with_widgets().await;
    for name in ["a", "b"] {
        create_widget(&api, name, 1).await;
    }
    let mut keep = samples::widget("c", 1);
    keep["metadata"]["labels"] = json!({"app": "other"});
    api.create(&PostParams::default(), &object(keep))
        .await
        .unwrap();
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=demo"),
    )
    .await
    .unwrap();
    let left: Vec<_> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    assert_eq!(left, ["c"]);
}

// ---- status subresource ----

#[tokio::test]
async fn the_main_endpoint_ignores_status_and_status_endpoint_changes_only_status() {
    let (_emulator, api) = with_widgets().await;
    let mut body = samples::widget("w1", 1);
    body["status"] = json!({"phase": "ignored on create"});
    let created = api
        .create(&PostParams::default(), &object(body))
        .await
        .unwrap();
    assert!(created.data.get("status").is_none());
    let main = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "x"}})),
        )
        .await
        .unwrap();
    assert!(
        main.data.get("status").is_none(),
        "the main endpoint ignores status"
    );
    let status = api
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "ok"}, "spec": {"size": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(status.data["status"]["phase"], "ok");
    assert_eq!(
        status.data["spec"]["size"], 1,
        "/status ignores spec changes"
    );
    let mut replaced = status.clone();
    replaced.data["status"] = json!({"phase": "replaced"});
    let replaced = api
        .replace_status("w1", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(replaced.data["status"]["phase"], "replaced");
}

// ---- finalizers, deletion, garbage collection, namespaces ----

#[tokio::test]
async fn finalizers_hold_an_object_until_the_last_is_removed() {
    let (_emulator, api) = with_widgets().await;
    let mut body = samples::widget("w1", 1);
    body["metadata"]["finalizers"] =
        json!(["kopf.zalando.org/KopfFinalizerMarker", "example.com/other"]);
    api.create(&PostParams::default(), &object(body))
        .await
        .unwrap();
    api.delete("w1", &DeleteParams::default()).await.unwrap();
    let marked = api.get("w1").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let add = json!({"metadata": {"finalizers": ["kopf.zalando.org/KopfFinalizerMarker", "example.com/other", "example.com/new"]}});
    let error = api
        .patch("w1", &PatchParams::default(), &Patch::Merge(add))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(error),
        (422, "Invalid".into()),
        "no new finalizers on an object being deleted"
    );
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/other"]}})),
    )
    .await
    .unwrap();
    assert!(api.get("w1").await.is_ok(), "one finalizer still holds it");
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(
        status_of(api.get("w1").await.unwrap_err()).0,
        404,
        "removing the last finalizer deletes it"
    );
}

#[tokio::test]
async fn deleting_an_object_without_finalizers_removes_it_at_once() {
    let (_emulator, api) = with_widgets().await;
    create_widget(&api, "w1", 1).await;
    api.delete("w1", &DeleteParams::default()).await.unwrap();
    assert_eq!(status_of(api.get("w1").await.unwrap_err()).0, 404);
}

fn owned_configmap(name: &str, owners: &[&DynamicObject]) -> ConfigMap {
    let refs: Vec<Value> = owners
        .iter()
        .map(|o| json!({"apiVersion": "example.com/v1", "kind": "Widget", "name": o.metadata.name, "uid": o.metadata.uid}))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": refs}})).unwrap()
}

#[tokio::test]
async fn dependents_are_garbage_collected_when_all_their_owners_are_gone() {
    let (emulator, api) = with_widgets().await;
    let (a, b) = (
        create_widget(&api, "a", 1).await,
        create_widget(&api, "b", 1).await,
    );
    let configmaps: Api<ConfigMap> = Api::default_namespaced(emulator.client());
    configmaps
        .create(&PostParams::default(), &owned_configmap("only-a", &[&a]))
        .await
        .unwrap();
    configmaps
        .create(&PostParams::default(), &owned_configmap("both", &[&a, &b]))
        .await
        .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        status_of(configmaps.get("only-a").await.unwrap_err()).0,
        404,
        "its only owner is gone"
    );
    assert!(configmaps.get("both").await.is_ok(), "one owner remains");
    api.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(status_of(configmaps.get("both").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn orphan_and_foreground_propagation_are_honoured() {
    let (emulator, api) = with_widgets().await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(emulator.client());
    let a = create_widget(&api, "a", 1).await;
    configmaps
        .create(&PostParams::default(), &owned_configmap("kept", &[&a]))
        .await
        .unwrap();
    api.delete(
        "a",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let kept = configmaps.get("kept").await.unwrap();
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "orphans lose the owner reference"
    );

    let b = create_widget(&api, "b", 1).await;
    let mut held = owned_configmap("held", &[&b]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    configmaps
        .create(&PostParams::default(), &held)
        .await
        .unwrap();
    api.delete("b", &DeleteParams::foreground()).await.unwrap();
    let owner = api.get("b").await.unwrap();
    assert!(
        owner
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"foregroundDeletion".to_string()),
        "the owner waits for its dependents"
    );
    assert!(configmaps
        .get("held")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_some());
    configmaps
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert_eq!(
        status_of(api.get("b").await.unwrap_err()).0,
        404,
        "the owner goes once its dependents are gone"
    );
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_objects_then_itself() {
    let (emulator, _) = with_widgets().await;
    let namespaces: Api<Namespace> = Api::all(emulator.client());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
        )
        .await
        .unwrap();
    let api = widgets(&emulator.client(), "doomed");
    let mut body = samples::widget("w1", 1);
    body["metadata"]["namespace"] = json!("doomed");
    body["metadata"]["finalizers"] = json!(["example.com/hold"]);
    api.create(&PostParams::default(), &object(body))
        .await
        .unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get("doomed").await.unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let error = api.create(&PostParams::default(), &object(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "late"}, "spec": {"size": 1}}))).await.unwrap_err();
    assert_eq!(
        status_of(error).0,
        403,
        "no new objects in a terminating namespace"
    );
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(
        status_of(namespaces.get("doomed").await.unwrap_err()).0,
        404
    );
    assert_eq!(
        status_of(
            namespaces
                .delete("default", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .0,
        403
    );
}

// ---- watches ----

#[tokio::test]
async fn a_watch_from_a_resource_version_gets_strictly_later_events() {
    let (_emulator, api) = with_widgets().await;
    let a = create_widget(&api, "a", 1).await;
    create_widget(&api, "b", 1).await;
    let mut stream = api
        .watch(
            &WatchParams::default(),
            &a.metadata.resource_version.unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "b".into())
    );
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 2}})),
    )
    .await
    .unwrap();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("MODIFIED", "a".into())
    );
    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("DELETED", "a".into())
    );
}

#[tokio::test]
async fn a_watch_without_a_resource_version_starts_with_the_current_objects() {
    let (emulator, api) = with_widgets().await;
    create_widget(&api, "a", 1).await;
    create_widget(&api, "b", 1).await;
    let (code, _, _) = raw(
        &emulator.client(),
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets?watch=true&timeoutSeconds=1",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 200);
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "a".into())
    );
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "b".into())
    );
    create_widget(&api, "c", 1).await;
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "c".into())
    );
}

#[tokio::test]
async fn bookmarks_arrive_periodically_with_the_current_resource_version() {
    let emulator = Emulator::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    crds(&emulator.client())
        .create(&PostParams::default(), &object(samples::widget_crd()))
        .await
        .unwrap();
    let api = widgets(&emulator.client(), "default");
    let created = create_widget(&api, "a", 1).await;
    let mut stream = api
        .watch(
            &WatchParams::default(),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let (kind, version) = name_of(&next_event(&mut stream).await);
    assert_eq!(kind, "BOOKMARK");
    assert!(version.parse::<u64>().unwrap() >= rv(&created));
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream() {
    let (_emulator, api) = with_widgets().await;
    let mut stream = api
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap()
        .boxed();
    let end = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the stream ends in time");
    assert!(end.is_none());
}

#[tokio::test]
async fn a_resource_version_older_than_the_history_gets_410_gone() {
    let (emulator, api) = with_widgets().await;
    let a = create_widget(&api, "a", 1).await;
    create_widget(&api, "b", 1).await;
    emulator.faults().compact();
    let mut stream = api
        .watch(
            &WatchParams::default(),
            &a.metadata.resource_version.unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match next_event(&mut stream).await {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn a_continue_token_older_than_the_history_gets_410_gone() {
    let (emulator, api) = with_widgets().await;
    for name in ["a", "b", "c"] {
        create_widget(&api, name, 1).await;
    }
    let first = api.list(&ListParams::default().limit(1)).await.unwrap();
    create_widget(&api, "d", 1).await;
    emulator.faults().compact();
    let error = api
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(first.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(error), (410, "Expired".into()));
}

#[tokio::test]
async fn send_initial_events_ends_with_the_initial_events_end_bookmark() {
    let (_emulator, api) = with_widgets().await;
    create_widget(&api, "a", 1).await;
    let mut stream = api
        .watch(&WatchParams::streaming_lists(), "")
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "a".into())
    );
    match next_event(&mut stream).await {
        WatchEvent::Bookmark(bookmark) => assert_eq!(
            bookmark
                .metadata
                .annotations
                .get("k8s.io/initial-events-end")
                .map(String::as_str),
            Some("true")
        ),
        other => panic!("expected the initial-events-end bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn selectors_filter_watches_and_objects_leaving_or_entering_are_deleted_or_added() {
    let (_emulator, api) = with_widgets().await;
    let created = create_widget(&api, "a", 1).await;
    let mut stream = api
        .watch(
            &WatchParams::default().labels("app=demo"),
            &created.metadata.resource_version.unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let mut other = samples::widget("ignored", 1);
    other["metadata"]["labels"] = json!({"app": "other"});
    api.create(&PostParams::default(), &object(other))
        .await
        .unwrap();
    let left = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "gone"}}})),
        )
        .await
        .unwrap();
    let event = next_event(&mut stream).await;
    assert_eq!(
        name_of(&event),
        ("DELETED", "a".into()),
        "leaving the selector is a deletion"
    );
    // As the API server's watch cache sends it: the object as the watcher last saw it, at the
    // version of the change that made it leave.
    let WatchEvent::Deleted(gone) = event else {
        unreachable!()
    };
    let labels = gone.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("app").map(String::as_str), Some("demo"));
    assert_eq!(
        gone.metadata.resource_version,
        left.metadata.resource_version
    );
    api.patch(
        "ignored",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "demo"}}})),
    )
    .await
    .unwrap();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "ignored".into()),
        "entering the selector is an addition"
    );
}

#[tokio::test]
async fn kube_runtime_watcher_lists_then_watches() {
    let (_emulator, api) = with_widgets().await;
    create_widget(&api, "a", 1).await;
    let mut events =
        kube::runtime::watcher(api.clone(), kube::runtime::watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(WAIT, events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match event {
            kube::runtime::watcher::Event::InitApply(o)
            | kube::runtime::watcher::Event::Apply(o) => seen.push(o.metadata.name.unwrap()),
            kube::runtime::watcher::Event::InitDone => {
                seen.push("<init-done>".into());
                create_widget(&api, "b", 1).await;
            }
            _ => {}
        }
    }
    assert_eq!(seen, ["a", "<init-done>", "b"]);
}

// ---- faults ----

#[tokio::test]
async fn ending_watches_closes_every_open_stream() {
    let (emulator, api) = with_widgets().await;
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    emulator.faults().end_watches();
    let end = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the stream ends");
    assert!(end.is_none());
}

#[tokio::test]
async fn injected_failures_hit_the_next_matching_requests_only() {
    let (emulator, api) = with_widgets().await;
    create_widget(&api, "a", 1).await;
    let api = widgets(&no_retry(&emulator), "default");
    emulator
        .faults()
        .fail(Failure::new(503).verb("list").resource("widgets").times(2));
    assert_eq!(
        api.get("a").await.unwrap().metadata.name.as_deref(),
        Some("a"),
        "other verbs are unaffected"
    );
    for _ in 0..2 {
        assert_eq!(
            status_of(api.list(&ListParams::default()).await.unwrap_err()),
            (503, "ServiceUnavailable".into())
        );
    }
    assert!(api.list(&ListParams::default()).await.is_ok());
    for (code, reason) in [
        (500, "InternalError"),
        (403, "Forbidden"),
        (409, "Conflict"),
    ] {
        emulator.faults().fail(Failure::new(code).verb("patch"));
        let error = api
            .patch("a", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err();
        assert_eq!(status_of(error), (code, reason.into()));
    }
}

#[tokio::test]
async fn injected_429_carries_retry_after() {
    let (emulator, _api) = with_widgets().await;
    emulator.faults().fail(Failure::new(429).retry_after(2));
    let (code, body, headers) = raw(
        &no_retry(&emulator),
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets",
        "application/json",
        "",
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (429, Some("TooManyRequests"))
    );
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("2")
    );
    assert_eq!(body["details"]["retryAfterSeconds"], 2);
}

#[tokio::test]
async fn added_latency_delays_matching_requests() {
    let (emulator, api) = with_widgets().await;
    emulator
        .faults()
        .add_latency(Matcher::any().verb("list"), Duration::from_millis(300));
    let started = std::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "a sleep never ends early"
    );
}

#[tokio::test]
async fn a_silenced_watch_stays_open_but_sends_nothing_until_reset() {
    let emulator = Emulator::builder()
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    crds(&emulator.client())
        .create(&PostParams::default(), &object(samples::widget_crd()))
        .await
        .unwrap();
    let api = widgets(&emulator.client(), "default");
    let start = create_widget(&api, "a", 1).await;
    emulator
        .faults()
        .silence_watches(Matcher::any().resource("widgets"));
    let mut stream = api
        .watch(
            &WatchParams::default(),
            &start.metadata.resource_version.unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    create_widget(&api, "b", 1).await;
    let quiet = tokio::time::timeout(Duration::from_millis(400), stream.next()).await;
    assert!(
        quiet.is_err(),
        "no event and no bookmark while silenced: {quiet:?}"
    );
    emulator.faults().reset();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "b".into())
    );
}

#[tokio::test]
async fn faults_are_controlled_over_the_admin_endpoint() {
    let (emulator, api) = with_widgets().await;
    let client = emulator.client();
    let (code, _, _) = raw(
        &client,
        "POST",
        "/_emulator/faults/fail",
        "application/json",
        r#"{"code": 500, "verb": "get", "resource": "widgets.example.com"}"#,
    )
    .await;
    assert_eq!(code, 200);
    create_widget(&api, "a", 1).await;
    assert_eq!(status_of(api.get("a").await.unwrap_err()).0, 500);
    assert!(api.get("a").await.is_ok());
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    next_event(&mut stream).await;
    raw(
        &client,
        "POST",
        "/_emulator/faults/end-watches",
        "application/json",
        "",
    )
    .await;
    assert!(tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .is_none());
    let (code, stats, _) = raw(&client, "GET", "/_emulator/stats", "application/json", "").await;
    assert_eq!(code, 200);
    assert!(stats["objects"].as_u64().unwrap() >= 1);
}

#[tokio::test]
async fn strict_field_validation_rejects_fields_the_schema_does_not_declare() {
    let (emulator, _api) = with_widgets().await;
    let mut body = samples::widget("w1", 1);
    body["extra"] = json!(true);
    let path = "/apis/example.com/v1/namespaces/default/widgets";
    let (code, status, _) = raw(
        &emulator.client(),
        "POST",
        &format!("{path}?fieldValidation=Strict"),
        "application/json",
        &body.to_string(),
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"extra\""),
        "{status}"
    );
    let (code, created, _) = raw(
        &emulator.client(),
        "POST",
        &format!("{path}?fieldValidation=Ignore"),
        "application/json",
        &body.to_string(),
    )
    .await;
    assert_eq!(code, 201);
    assert!(
        created.get("extra").is_none(),
        "without Strict, undeclared fields are dropped"
    );
}

// ---- saved state ----

/// What one emulator saved, another restores as it was: CRDs served, custom objects with their uids,
/// finalizers and deletion marks, owner references still collected by the garbage collector; a file
/// that is not a state is a clear error and restores nothing.
#[tokio::test]
async fn a_saved_state_is_restored_as_it_was_by_another_emulator() {
    let (first, widgets) = with_widgets().await;
    let mut held = samples::widget("held", 2);
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    let held = widgets
        .create(&PostParams::default(), &object(held))
        .await
        .unwrap();
    widgets
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let owner = widgets
        .create(&PostParams::default(), &object(samples::widget("owner", 1)))
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(first.client());
    configmaps
        .create(&PostParams::default(), &owned_configmap("owned", &[&owner]))
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("kactor-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.json");
    first.save_state(&file).unwrap();
    let saved_rv = first.resource_version();
    drop(first);

    let second = Emulator::start().await.unwrap();
    let restored = second
        .load_state(&file)
        .unwrap()
        .expect("the file is there");
    assert!(restored >= 4, "{restored}");
    assert!(
        second.resource_version() > saved_rv,
        "resourceVersions go on from the saved one"
    );
    let widgets = self::widgets(&second.client(), "default");
    let again = widgets.get("held").await.unwrap();
    assert_eq!(again.metadata.uid, held.metadata.uid);
    assert!(
        again.metadata.deletion_timestamp.is_some(),
        "still being deleted"
    );
    assert_eq!(
        again.metadata.finalizers,
        Some(vec!["example.com/hold".to_string()])
    );
    // Releasing the finalizer finishes the deletion begun before the restart.
    widgets
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(widgets.get_opt("held").await.unwrap().is_none());
    // The owner's dependents are still its own: deleting it collects them.
    let configmaps: Api<ConfigMap> = Api::default_namespaced(second.client());
    assert!(configmaps.get_opt("owned").await.unwrap().is_some());
    widgets
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    for _ in 0..100 {
        if configmaps.get_opt("owned").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        configmaps.get_opt("owned").await.unwrap().is_none(),
        "collected"
    );

    // No file: no state. Not a state: an error naming the file, and nothing restored.
    assert_eq!(second.load_state(dir.join("none.json")).unwrap(), None);
    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, "{not json").unwrap();
    let error = second.load_state(&garbage).unwrap_err().to_string();
    assert!(error.contains("garbage.json is not JSON"), "{error}");
    std::fs::write(&garbage, r#"{"kind": "EmulatorState", "resourceVersion": "1", "objects": [{"apiVersion": "nowhere.example/v1", "kind": "Ghost", "metadata": {"name": "g"}}]}"#).unwrap();
    let count = second.object_count();
    let error = second.load_state(&garbage).unwrap_err().to_string();
    assert!(
        error.contains("Ghost") && error.contains("no such kind"),
        "{error}"
    );
    assert_eq!(second.object_count(), count, "nothing restored");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn with_tls_it_serves_https_that_its_client_and_kubeconfig_trust() {
    let emulator = Emulator::builder().tls(true).start().await.unwrap();
    assert!(
        emulator.url().starts_with("https://127.0.0.1:"),
        "{}",
        emulator.url()
    );
    let version = emulator.client().apiserver_version().await.unwrap();
    assert!(!version.git_version.is_empty());
    // The kubeconfig carries the certificate, so any client of it trusts the server.
    let kubeconfig = emulator.kubeconfig();
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert!(cluster.certificate_authority_data.is_some());
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    assert!(namespaces.get_opt("default").await.unwrap().is_some());
    assert!(emulator
        .ca_pem()
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    // Plain HTTP to the TLS port gets no answer.
    let plain = format!("http://{}/version", emulator.addr());
    let mut config = kube::Config::new(plain.parse().unwrap());
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(2));
    let http = kube::Client::try_from(config).unwrap();
    assert!(http.apiserver_version().await.is_err());
}
