//! Kubernetes Events posted against the cluster over real HTTP, with the real `kube::Client` and the
//! emulator's fault injection.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace};
use kactor_emulator::{samples, Failure, Matcher};
use kactor_reactor::posting::{EventPoster, ObjectRef, PostingSettings};
use kactor_reactor::resources::Resource;
use kactor_testenv::{Backend, TestCluster};
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(10);

/// A cluster with the widget CRD and a client without kube's own retries.
async fn setup() -> (TestCluster, kube::Client) {
    let cluster = TestCluster::start().await.unwrap();
    let client = client_of(&cluster, None);
    samples::install_widgets(&client).await.unwrap();
    (cluster, client)
}

fn client_of(cluster: &TestCluster, namespace: Option<&str>) -> kube::Client {
    let mut config = cluster.config();
    config.default_retry = false;
    if let Some(namespace) = namespace {
        config.default_namespace = namespace.to_owned();
    }
    kube::Client::try_from(config).unwrap()
}

/// Kopf's settings, with quick retries.
fn quick() -> PostingSettings {
    PostingSettings {
        default_backoffs: vec![Duration::from_millis(10); 3],
        ..Default::default()
    }
}

fn resource(group: &str, plural: &str, kind: &str, namespaced: bool) -> Resource {
    Resource {
        group: group.into(),
        version: "v1".into(),
        plural: plural.into(),
        kind: kind.into(),
        singular: kind.to_lowercase(),
        short_names: vec![],
        categories: vec![],
        namespaced,
        preferred: true,
        verbs: vec!["list".into(), "watch".into()],
        subresources: vec![],
    }
}

fn widgets() -> Resource {
    resource("example.com", "widgets", "Widget", true)
}

async fn create_widget(client: &kube::Client, name: &str) -> DynamicObject {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &samples::widget_api_resource());
    let widget = serde_json::from_value(samples::widget(name, 1)).unwrap();
    api.create(&PostParams::default(), &widget).await.unwrap()
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &namespace)
        .await
        .unwrap();
}

/// Every core `v1` Event that kactor posted (source `kopf`; a real cluster posts its own too), as
/// stored (raw JSON), oldest first.
async fn events(client: &kube::Client) -> Vec<Value> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<Event>(&()));
    let mut events = api.list(&Default::default()).await.unwrap().items;
    events.retain(|event| event.data["source"]["component"] == "kopf");
    events.sort_by_key(|event| {
        event
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse::<u64>().ok())
    });
    events
        .into_iter()
        .map(|event| serde_json::to_value(event).unwrap())
        .collect()
}

/// Drops the poster and waits for its task to post what is queued and end.
async fn flush(poster: EventPoster, task: JoinHandle<()>) {
    drop(poster);
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the posting task ends once every poster is dropped")
        .expect("the posting task does not panic");
}

fn reasons(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["reason"].as_str().unwrap())
        .collect()
}

/// Asserts a timestamp is Python's `datetime.now(UTC).isoformat()`, as Kopf sends it and the emulator
/// keeps it; a real API server keeps it in its own form (`...Z`, seconds or microseconds).
fn assert_kopf_timestamp(backend: Backend, text: &str) {
    if backend == Backend::ApiServer {
        text.parse::<jiff::Timestamp>()
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        return;
    }
    let (seconds, fraction) = text
        .strip_suffix("+00:00")
        .unwrap_or_else(|| panic!("{text} ends with +00:00"))
        .split_once('.')
        .unwrap_or((text, "000000"));
    assert_eq!(seconds.len(), "2024-05-01T12:00:00".len(), "{text}");
    assert_eq!(fraction.len(), 6, "{text}");
    let utc = format!("{}Z", text.strip_suffix("+00:00").unwrap());
    utc.parse::<jiff::Timestamp>()
        .unwrap_or_else(|e| panic!("{text}: {e}"));
}

#[tokio::test]
async fn posts_info_warn_and_exception_about_a_namespaced_widget() {
    let (cluster, client) = setup().await;
    let widget = create_widget(&client, "w1").await;
    let uid = widget.metadata.uid.clone().unwrap();
    let object = ObjectRef::of(&widget, &widgets());

    let (poster, task) = EventPoster::start(client.clone(), quick());
    poster.info(&object, "Created", "The widget is ready.");
    poster.warn(&object, "Slow", "The widget is slow.");
    poster.exception(&object, "Broken", "The widget broke.");
    flush(poster, task).await;

    let events = events(&client).await;
    assert_eq!(events.len(), 3);
    let expected = [
        ("Normal", "Created", "The widget is ready."),
        ("Warning", "Slow", "The widget is slow."),
        ("Error", "Broken", "The widget broke."),
    ];
    for (event, (type_, reason, message)) in events.iter().zip(expected) {
        assert_eq!(event["type"], type_);
        assert_eq!(event["reason"], reason);
        assert_eq!(event["message"], message);
        assert_eq!(event["action"], "Action?");
        assert_eq!(event["reportingComponent"], "kopf");
        assert_eq!(event["reportingInstance"], "dev");
        assert_eq!(event["source"], json!({"component": "kopf"}));
        assert_eq!(
            event["involvedObject"],
            json!({
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "name": "w1",
                "uid": uid,
                "namespace": "default",
            })
        );
        assert_eq!(event["metadata"]["namespace"], "default");
        assert_eq!(event["metadata"]["generateName"], "kopf-event-");
        let name = event["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("kopf-event-"), "{name}");
        for field in ["firstTimestamp", "lastTimestamp", "eventTime"] {
            assert_kopf_timestamp(cluster.backend(), event[field].as_str().unwrap());
        }
        // The same moment (a real server keeps the first in seconds, the event time in microseconds).
        let moment = |field: &str| {
            let time: jiff::Timestamp = event[field]
                .as_str()
                .unwrap()
                .replace("+00:00", "Z")
                .parse()
                .unwrap();
            time.as_second()
        };
        assert_eq!(moment("firstTimestamp"), moment("eventTime"));
    }
}

#[tokio::test]
async fn posts_events_about_cluster_scoped_objects_into_the_clients_default_namespace() {
    let (cluster, client) = setup().await;
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &samples::crd_api_resource());
    let crd = crds.get("widgets.example.com").await.unwrap();
    let resource = resource(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
    );
    let object = ObjectRef::of(&crd, &resource);
    assert_eq!(object.namespace, None);
    create_namespace(&client, "operators").await;

    for namespace in [None, Some("operators")] {
        let (poster, task) = EventPoster::start(client_of(&cluster, namespace), quick());
        poster.info(&object, "Installed", "The CRD is installed.");
        flush(poster, task).await;
    }

    let events = events(&client).await;
    assert_eq!(events.len(), 2);
    for (event, namespace) in events.iter().zip(["default", "operators"]) {
        assert_eq!(event["metadata"]["namespace"], namespace);
        assert_eq!(
            event["involvedObject"],
            json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "name": "widgets.example.com",
                "uid": crd.metadata.uid.clone().unwrap(),
                "namespace": namespace,
            })
        );
    }
}

#[tokio::test]
async fn shortens_long_messages_to_1024_characters() {
    let (_emulator, client) = setup().await;
    let object = ObjectRef::of(&create_widget(&client, "w1").await, &widgets());

    let (poster, task) = EventPoster::start(client.clone(), quick());
    let long = format!("{}{}", "a".repeat(1000), "z".repeat(1000));
    poster.info(&object, "Long", &long);
    flush(poster, task).await;

    let events = events(&client).await;
    let message = events[0]["message"].as_str().unwrap();
    assert_eq!(message.chars().count(), 1024);
    assert_eq!(
        message,
        format!("{}...{}", "a".repeat(511), "z".repeat(510))
    );
}

#[tokio::test]
async fn does_not_post_events_about_events() {
    let (_emulator, client) = setup().await;
    let widget = ObjectRef::of(&create_widget(&client, "w1").await, &widgets());
    let event = ObjectRef {
        api_version: "v1".into(),
        kind: "Event".into(),
        name: Some("kopf-event-abcde".into()),
        uid: Some("event-uid".into()),
        namespace: Some("default".into()),
    };

    let (poster, task) = EventPoster::start(client.clone(), quick());
    poster.info(&event, "Seen", "An event about an event.");
    poster.warn(&event, "Seen", "An event about an event.");
    poster.info(&widget, "Created", "An event about a widget.");
    flush(poster, task).await;

    assert_eq!(reasons(&events(&client).await), ["Created"]);
}

#[tokio::test]
async fn ignores_a_missing_namespace_without_retrying() {
    let (_emulator, client) = setup().await;
    let widget = create_widget(&client, "w1").await;
    let gone = ObjectRef {
        namespace: Some("gone".into()),
        ..ObjectRef::of(&widget, &widgets())
    };
    // Were the 404 retried, the hour-long backoff would hold up the flush.
    let settings = PostingSettings {
        default_backoffs: vec![Duration::from_secs(3600)],
        ..quick()
    };

    let (poster, task) = EventPoster::start(client.clone(), settings);
    poster.info(&gone, "Gone", "The namespace is gone.");
    poster.info(
        &ObjectRef::of(&widget, &widgets()),
        "Posted",
        "Gets through.",
    );
    flush(poster, task).await;

    assert_eq!(reasons(&events(&client).await), ["Posted"]);
}

#[tokio::test]
async fn dropping_every_poster_flushes_the_queue_then_ends_the_task() {
    let (_emulator, client) = setup().await;
    let (poster, task) = EventPoster::start(client.clone(), quick());
    let clone = poster.clone();
    for i in 0..30 {
        let object = ObjectRef::of(&create_widget(&client, &format!("w{i}")).await, &widgets());
        clone.info(&object, "Created", "Queued before the drop.");
    }
    drop(clone);
    assert!(!task.is_finished(), "a poster is still alive");
    flush(poster, task).await;

    assert_eq!(events(&client).await.len(), 30);
}

#[tokio::test]
async fn posts_only_warnings_when_disabled_as_kopf_does() {
    let (_emulator, client) = setup().await;
    let object = ObjectRef::of(&create_widget(&client, "w1").await, &widgets());
    let settings = PostingSettings {
        enabled: false,
        ..quick()
    };

    let (poster, task) = EventPoster::start(client.clone(), settings);
    poster.event(&object, "Normal", "Event", "Not posted.");
    poster.info(&object, "Info", "Not posted.");
    poster.warn(&object, "Warning", "Posted: Kopf's warn ignores `enabled`.");
    poster.exception(&object, "Exception", "Not posted.");
    flush(poster, task).await;

    assert_eq!(reasons(&events(&client).await), ["Warning"]);

    let disabled = EventPoster::disabled();
    disabled.warn(&object, "Warning", "Never posted.");
    assert_eq!(events(&client).await.len(), 1);
}

#[tokio::test]
async fn describes_errors_as_kopfs_exception_does() {
    let (_emulator, client) = setup().await;
    let object = ObjectRef::of(&create_widget(&client, "w1").await, &widgets());
    let error = std::io::Error::other("disk full");

    let (poster, task) = EventPoster::start(client.clone(), quick());
    poster.exception_from(&object, "", "Saving failed:", &error);
    poster.exception_from(&object, "SaveFailed", "", &error);
    flush(poster, task).await;

    let events = events(&client).await;
    assert_eq!(events[0]["reason"], "Error");
    assert_eq!(events[0]["message"], "Saving failed: disk full");
    assert_eq!(events[1]["reason"], "SaveFailed");
    assert_eq!(events[1]["message"], "disk full");
}

/// Tests that inject faults, which only the emulator can: `scripts/test` skips them on the real
/// API server (`--skip emulator_only`).
mod emulator_only {
    use super::*;

    #[tokio::test]
    async fn keeps_posting_after_the_api_fails() {
        let (cluster, client) = setup().await;
        let object = ObjectRef::of(&create_widget(&client, "w1").await, &widgets());
        cluster
            .faults()
            .fail(Failure::new(500).verb("create").resource("events").times(4));

        let (poster, task) = EventPoster::start(client.clone(), quick());
        poster.info(&object, "Lost", "Fails on every attempt.");
        poster.info(&object, "Posted", "Gets through.");
        flush(poster, task).await;

        assert_eq!(reasons(&events(&client).await), ["Posted"]);
    }

    #[tokio::test]
    async fn retries_a_failing_post_until_it_gets_through() {
        let (cluster, client) = setup().await;
        let object = ObjectRef::of(&create_widget(&client, "w1").await, &widgets());
        cluster
            .faults()
            .fail(Failure::new(503).verb("create").resource("events").times(3));

        let (poster, task) = EventPoster::start(client.clone(), quick());
        poster.warn(&object, "Retried", "Gets through on the last attempt.");
        flush(poster, task).await;

        assert_eq!(reasons(&events(&client).await), ["Retried"]);
    }

    #[tokio::test]
    async fn posts_one_objects_events_in_order() {
        let (cluster, client) = setup().await;
        let object = ObjectRef::of(&create_widget(&client, "w1").await, &widgets());
        cluster.faults().add_latency(
            Matcher::any().verb("create").resource("events"),
            Duration::from_millis(5),
        );

        let (poster, task) = EventPoster::start(client.clone(), quick());
        let sent: Vec<String> = (0..20).map(|i| format!("Step{i}")).collect();
        for reason in &sent {
            poster.info(&object, reason, "In order.");
        }
        flush(poster, task).await;

        assert_eq!(reasons(&events(&client).await), sent);
    }

    #[tokio::test]
    async fn drops_events_beyond_the_queue_capacity() {
        let (cluster, client) = setup().await;
        let mut objects = Vec::new();
        for i in 0..10 {
            objects.push(ObjectRef::of(
                &create_widget(&client, &format!("w{i}")).await,
                &widgets(),
            ));
        }
        cluster.faults().add_latency(
            Matcher::any().verb("create").resource("events"),
            Duration::from_millis(200),
        );

        let settings = PostingSettings {
            queue_capacity: 3,
            ..quick()
        };
        let (poster, task) = EventPoster::start(client.clone(), settings);
        for object in &objects {
            poster.info(object, "Created", "Only the first three fit.");
        }
        flush(poster, task).await;

        let events = events(&client).await;
        let mut names: Vec<&str> = events
            .iter()
            .map(|event| event["involvedObject"]["name"].as_str().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["w0", "w1", "w2"]);
    }
}
