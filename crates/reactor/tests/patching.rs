//! A cycle's changes sent to a cluster (`kactor_reactor::patches::apply`) over real HTTP: the order
//! of the requests is what keeps a handler's result when the cycle is cut off halfway.

use kactor_emulator::samples;
use kactor_reactor::patches::{self, Patch};
use kactor_reactor::resources::Resource;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;

fn widgets() -> Resource {
    Resource {
        group: "example.com".into(),
        version: "v1".into(),
        plural: "widgets".into(),
        kind: "Widget".into(),
        singular: "widget".into(),
        short_names: vec![],
        categories: vec![],
        namespaced: true,
        preferred: true,
        verbs: vec!["get".into(), "list".into(), "watch".into(), "patch".into()],
        subresources: vec!["status".into()],
    }
}

async fn widget(cluster: &TestCluster) -> (Api<DynamicObject>, DynamicObject) {
    let api = samples::install_widgets(&cluster.client()).await.unwrap();
    let body = serde_json::from_value(samples::widget("w1", 1)).unwrap();
    let body = api.create(&PostParams::default(), &body).await.unwrap();
    (api, body)
}

/// The patch sent to the widget `body` as a cycle sends it, without retries.
async fn send(
    cluster: &TestCluster,
    body: &DynamicObject,
    patch: &Patch,
) -> Result<patches::Applied, patches::ApplyError> {
    patches::apply(&cluster.client(), &widgets(), body, patch.take(), &[], None).await
}

/// The body's patch fails after the status's went through, as a crash between the two would cut the
/// cycle: the result is kept, and the record that would have said the handler succeeded is not, so
/// the handler runs again instead of its result being lost.
#[tokio::test]
async fn a_result_is_stored_before_the_record_that_its_handler_succeeded() {
    let cluster = TestCluster::start().await.unwrap();
    let (api, body) = widget(&cluster).await;
    let patch = Patch::new();
    patch.status("create_fn", json!({"message": "done"}));
    patch.annotation("kopf.zalando.org/create_fn", Some(r#"{"success":true}"#));
    // An invalid label makes the server refuse the body's patch (422), whole.
    patch.label("not a valid label key!", Some("x"));

    let error = send(&cluster, &body, &patch)
        .await
        .err()
        .expect("the body's patch is refused");
    assert!(error.to_string().contains("the object"), "{error}");

    let stored = api.get("w1").await.unwrap();
    assert_eq!(
        stored.data["status"]["create_fn"],
        json!({"message": "done"})
    );
    let annotations = stored.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key("kopf.zalando.org/create_fn"),
        "{annotations:?}"
    );
}

/// Kopf's status storage of a diff-base (`status.kopf`) is bookkeeping too: it is sent after the
/// body's progress and annotations, and the results before both.
#[tokio::test]
async fn the_status_bookkeeping_goes_after_the_body_and_the_results_before_it() {
    let cluster = TestCluster::start().await.unwrap();
    let (api, body) = widget(&cluster).await;
    let patch = Patch::new();
    patch.status("create_fn", json!("done"));
    patch.set(
        &["status", "kopf", "last-handled-configuration"],
        json!("{}"),
    );
    patch.annotation("kopf.zalando.org/create_fn", Some(r#"{"success":true}"#));
    patch.label("not a valid label key!", Some("x"));
    let refused = send(&cluster, &body, &patch).await;
    assert!(refused.is_err(), "the body's patch is refused");
    let stored = api.get("w1").await.unwrap();
    assert_eq!(stored.data["status"]["create_fn"], json!("done"));
    assert!(stored.data["status"].get("kopf").is_none(), "{stored:?}");

    // Without the failure, everything lands.
    let patch = Patch::new();
    patch.status("create_fn", json!("again"));
    patch.set(
        &["status", "kopf", "last-handled-configuration"],
        json!("{}"),
    );
    patch.annotation("kopf.zalando.org/create_fn", Some(r#"{"success":true}"#));
    let applied = send(&cluster, &stored, &patch).await.unwrap();
    let stored = api.get("w1").await.unwrap();
    assert_eq!(stored.data["status"]["create_fn"], json!("again"));
    assert_eq!(
        stored.data["status"]["kopf"]["last-handled-configuration"],
        json!("{}")
    );
    assert!(stored
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key("kopf.zalando.org/create_fn"));
    // The version to wait for is the last request's.
    assert_eq!(applied.resource_version, stored.metadata.resource_version);
}

/// The answers to the merge patches are read for what each request changed (and the metadata):
/// the object the cycle goes on with has the status its status request wrote and the annotation its
/// body request wrote, at the version of the last request, and not the spec, which nothing
/// patched. When a transformation follows, the last answer is its starting point and is read
/// whole.
#[tokio::test]
async fn the_answers_are_read_for_what_the_requests_changed() {
    let cluster = TestCluster::start().await.unwrap();
    let (api, body) = widget(&cluster).await;
    let patch = Patch::new();
    patch.status("create_fn", json!({"message": "done"}));
    patch.annotation("kopf.zalando.org/create_fn", Some(r#"{"success":true}"#));
    let applied = send(&cluster, &body, &patch).await.unwrap();
    let stored = api.get("w1").await.unwrap();
    let answer = applied.body.expect("an answer");
    assert_eq!(
        answer.metadata.resource_version,
        stored.metadata.resource_version
    );
    assert_eq!(applied.resource_version, stored.metadata.resource_version);
    // The body's request came last: its answer has the annotation, and of the data only what that
    // request patched (nothing: the annotation is metadata).
    assert_eq!(
        answer.metadata.annotations.unwrap_or_default()["kopf.zalando.org/create_fn"],
        r#"{"success":true}"#
    );
    assert_eq!(answer.data, json!({}), "{:?}", answer.data);
    assert_eq!(answer.types, stored.types);
    assert_eq!(stored.data["spec"]["size"], json!(1));

    // A status request alone: its answer has the status (all of it, as stored), not the spec.
    let patch = Patch::new();
    patch.status("update_fn", json!("done"));
    let applied = send(&cluster, &stored, &patch).await.unwrap();
    let answer = applied.body.expect("an answer");
    let stored = api.get("w1").await.unwrap();
    assert_eq!(answer.data["status"], stored.data["status"]);
    assert!(answer.data.get("spec").is_none(), "{:?}", answer.data);

    // With a transformation after the merge, the merge's answer is read whole: the transformation
    // works on it and reads the spec.
    let patch = Patch::new();
    patch.annotation("example.com/seen", Some("yes"));
    patch.transform(|body| {
        let size = body["spec"]["size"].to_string();
        body["metadata"]["finalizers"] = json!([format!("example.com/hold-{size}")]);
    });
    let applied = send(&cluster, &stored, &patch).await.unwrap();
    let stored = api.get("w1").await.unwrap();
    let answer = applied.body.expect("an answer");
    assert_eq!(
        stored.metadata.finalizers.as_deref(),
        Some(&["example.com/hold-1".to_string()][..])
    );
    assert_eq!(stored.data["spec"]["size"], json!(1));
    assert_eq!(answer.data["spec"], stored.data["spec"]);
    assert_eq!(applied.resource_version, stored.metadata.resource_version);
}
