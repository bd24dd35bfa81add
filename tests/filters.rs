//! Filters and handler options end to end: real operators against the cluster over real HTTP,
//! checking Kopf's semantics (`reference/kopf.md` §1.1, §1.2, §1.10): which objects and which changes
//! a handler runs for, what it is given, where its result lands, and when the finalizer is kept.
//!
//! "Must not happen" is proven by a later event of the same object: a witness handler with no filters
//! whose completion (the diff-base, written once every handler of the cause is done) shows the cycle
//! that would have run the filtered handler has passed.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor::emulator::samples;
use kactor::prelude::*;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::Value;
use support::*;

const WIDGETS: &str = "widgets.example.com";

/// One call of a handler, with what it was given.
#[derive(Debug, Clone)]
struct Call {
    id: String,
    name: String,
    reason: Option<Reason>,
    event_type: EventType,
    version: Option<String>,
    annotations: BTreeMap<String, String>,
    param: Option<Value>,
}

/// Calls of handlers, in order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record(&self, ctx: &Ctx) {
        self.0.lock().unwrap().push(Call {
            id: ctx.id().to_string(),
            name: ctx.name().to_string(),
            reason: ctx.reason(),
            event_type: ctx.event_type,
            version: ctx.meta().resource_version.clone(),
            annotations: ctx.annotations().clone(),
            param: ctx.param().cloned(),
        });
    }

    fn of(&self, id: &str, name: &str) -> Vec<Call> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.id == id && c.name == name)
            .cloned()
            .collect()
    }

    fn count(&self, id: &str, name: &str) -> usize {
        self.of(id, name).len()
    }

    fn all(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until `check` passes over the calls, or fails showing them.
    async fn until(&self, what: &str, check: impl Fn(&[Call]) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if check(&self.all()) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; the calls: {:#?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// A handler that records its calls and returns nothing.
fn recorder(
    calls: &Calls,
) -> impl Fn(Ctx) -> std::future::Ready<Result<(), HandlerError>> + Send + Sync + 'static {
    let calls = calls.clone();
    move |ctx: Ctx| {
        calls.record(&ctx);
        std::future::ready(Ok(()))
    }
}

/// Creates a widget labelled `app: demo` plus `labels`, annotated with `annotations`.
async fn create(
    api: &Api<DynamicObject>,
    name: &str,
    spec: Value,
    labels: Value,
    annotations: Value,
) {
    let mut body = samples::widget(name, 0);
    body["spec"] = spec;
    if let (Some(all), Some(extra)) = (
        body["metadata"]["labels"].as_object_mut(),
        labels.as_object(),
    ) {
        all.extend(extra.clone());
    }
    if !annotations.is_null() {
        body["metadata"]["annotations"] = annotations;
    }
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
    .unwrap();
}

/// Creates a plain widget of a size, labelled `app: demo`.
async fn create_sized(api: &Api<DynamicObject>, name: &str, size: i64) {
    create(api, name, json!({"size": size}), json!({}), Value::Null).await;
}

async fn merge(api: &Api<DynamicObject>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// Waits until the object's diff-base passes `check`: every handler of the cause that produced it is
/// done.
async fn until_handled(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> DynamicObject {
    until(api, name, what, |o| {
        o.and_then(parsed_diff_base)
            .is_some_and(|base| check(&base))
    })
    .await
    .unwrap()
}

/// Waits until the object was handled at least once (it has a diff-base).
async fn handled(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    until_handled(api, name, &format!("{name} to be handled"), |_| true).await
}

fn parsed_diff_base(object: &DynamicObject) -> Option<Value> {
    let text = diff_base(object)?;
    serde_json::from_str(text).ok()
}

// ---------------------------------------------------------------------------------------------
// Labels and annotations.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_filter_with_a_value_runs_only_for_objects_with_that_exact_value() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("gold").label("tier", "gold"),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    create(
        &widgets,
        "w-gold",
        spec.clone(),
        json!({"tier": "gold"}),
        Value::Null,
    )
    .await;
    create(
        &widgets,
        "w-silver",
        spec.clone(),
        json!({"tier": "silver"}),
        Value::Null,
    )
    .await;
    create(
        &widgets,
        "w-empty",
        spec.clone(),
        json!({"tier": ""}),
        Value::Null,
    )
    .await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-gold", "w-silver", "w-empty", "w-none"] {
        handled(&widgets, name).await;
        assert_eq!(calls.count("witness", name), 1, "{:?}", calls.all());
    }
    assert_eq!(calls.count("gold", "w-gold"), 1);
    assert_eq!(calls.count("gold", "w-silver"), 0);
    assert_eq!(calls.count("gold", "w-empty"), 0);
    assert_eq!(calls.count("gold", "w-none"), 0);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_filter_present_runs_for_any_value_the_empty_string_included() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("tiered").label("tier", MetaFilter::Present),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    create(
        &widgets,
        "w-gold",
        spec.clone(),
        json!({"tier": "gold"}),
        Value::Null,
    )
    .await;
    create(
        &widgets,
        "w-empty",
        spec.clone(),
        json!({"tier": ""}),
        Value::Null,
    )
    .await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-gold", "w-empty", "w-none"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("tiered", "w-gold"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("tiered", "w-empty"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("tiered", "w-none"), 0, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_filter_absent_runs_only_for_objects_without_the_label() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("untiered").label("tier", MetaFilter::Absent),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    create(
        &widgets,
        "w-empty",
        spec.clone(),
        json!({"tier": ""}),
        Value::Null,
    )
    .await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-empty", "w-none"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("untiered", "w-empty"), 0, "{:?}", calls.all());
    assert_eq!(calls.count("untiered", "w-none"), 1, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_callback_gets_the_value_or_none_when_absent() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let values = seen.clone();
    let check = MetaFilter::check(move |value| {
        values.lock().unwrap().push(value.map(str::to_string));
        value != Some("skip")
    });
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("checked").label("tier", check),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    create(
        &widgets,
        "w-go",
        spec.clone(),
        json!({"tier": "go"}),
        Value::Null,
    )
    .await;
    create(
        &widgets,
        "w-skip",
        spec.clone(),
        json!({"tier": "skip"}),
        Value::Null,
    )
    .await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-go", "w-skip", "w-none"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("checked", "w-go"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("checked", "w-skip"), 0, "{:?}", calls.all());
    assert_eq!(calls.count("checked", "w-none"), 1, "{:?}", calls.all());
    let seen = seen.lock().unwrap().clone();
    for value in [Some("go".to_string()), Some("skip".to_string()), None] {
        assert!(seen.contains(&value), "{value:?} not in {seen:?}");
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotation_filter_with_a_value_runs_only_for_objects_with_that_exact_value() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("owned").annotation("example.com/owner", "alice"),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    let owner = |who: &str| json!({ "example.com/owner": who });
    create(&widgets, "w-alice", spec.clone(), json!({}), owner("alice")).await;
    create(&widgets, "w-bob", spec.clone(), json!({}), owner("bob")).await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-alice", "w-bob", "w-none"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("owned", "w-alice"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("owned", "w-bob"), 0, "{:?}", calls.all());
    assert_eq!(calls.count("owned", "w-none"), 0, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotation_filter_present_runs_for_any_value_the_empty_string_included() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("owned").annotation("example.com/owner", MetaFilter::Present),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    let owner = |who: &str| json!({ "example.com/owner": who });
    create(&widgets, "w-bob", spec.clone(), json!({}), owner("bob")).await;
    create(&widgets, "w-empty", spec.clone(), json!({}), owner("")).await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-bob", "w-empty", "w-none"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("owned", "w-bob"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("owned", "w-empty"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("owned", "w-none"), 0, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotation_filter_absent_runs_only_for_objects_without_the_annotation() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("unowned").annotation("example.com/owner", MetaFilter::Absent),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    let owner = json!({"example.com/owner": "bob"});
    create(&widgets, "w-bob", spec.clone(), json!({}), owner).await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-bob", "w-none"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("unowned", "w-bob"), 0, "{:?}", calls.all());
    assert_eq!(calls.count("unowned", "w-none"), 1, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotation_callback_decides_over_the_value() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("numbered").annotation(
                    "example.com/count",
                    MetaFilter::check(|v| v.and_then(|v| v.parse::<u32>().ok()).is_some()),
                ),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    let count = |c: &str| json!({ "example.com/count": c });
    create(&widgets, "w-number", spec.clone(), json!({}), count("7")).await;
    create(&widgets, "w-word", spec.clone(), json!({}), count("seven")).await;
    create(&widgets, "w-none", spec, json!({}), Value::Null).await;
    for name in ["w-number", "w-word", "w-none"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("numbered", "w-number"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("numbered", "w-word"), 0, "{:?}", calls.all());
    assert_eq!(calls.count("numbered", "w-none"), 0, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_annotation_filters_must_all_pass() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("both")
                    .label("tier", "gold")
                    .label("app", MetaFilter::Present)
                    .annotation("example.com/owner", MetaFilter::Present),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    let gold = json!({"tier": "gold"});
    let owner = json!({"example.com/owner": "alice"});
    create(
        &widgets,
        "w-both",
        spec.clone(),
        gold.clone(),
        owner.clone(),
    )
    .await;
    create(&widgets, "w-label", spec.clone(), gold, Value::Null).await;
    create(&widgets, "w-annotation", spec.clone(), json!({}), owner).await;
    create(&widgets, "w-neither", spec, json!({}), Value::Null).await;
    for name in ["w-both", "w-label", "w-annotation", "w-neither"] {
        handled(&widgets, name).await;
    }
    assert_eq!(calls.count("both", "w-both"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("both", "w-label"), 0, "{:?}", calls.all());
    assert_eq!(calls.count("both", "w-annotation"), 0, "{:?}", calls.all());
    assert_eq!(calls.count("both", "w-neither"), 0, "{:?}", calls.all());
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Fields and values.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_handler_with_a_field_value_runs_only_for_that_value() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("three").field("spec.size").value(json!(3)),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w3", 3).await;
    create_sized(&widgets, "w4", 4).await;
    handled(&widgets, "w3").await;
    handled(&widgets, "w4").await;
    assert_eq!(calls.count("three", "w3"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("three", "w4"), 0, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_handler_with_a_field_and_no_value_runs_only_when_the_field_is_present() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("colored").field("spec.color"),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    let labels = json!({});
    create(
        &widgets,
        "w-red",
        json!({"size": 1, "color": "red"}),
        labels.clone(),
        Value::Null,
    )
    .await;
    create(&widgets, "w-plain", json!({"size": 1}), labels, Value::Null).await;
    handled(&widgets, "w-red").await;
    handled(&widgets, "w-plain").await;
    assert_eq!(calls.count("colored", "w-red"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("colored", "w-plain"), 0, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_handler_with_a_field_value_runs_when_either_the_old_or_the_new_value_matches() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_update(
                WIDGETS,
                On::id("three").field("spec.size").value(json!(3)),
                recorder(&calls),
            )
            .on_update(WIDGETS, "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    handled(&widgets, "w1").await;
    // 1→2: neither matches; 2→3: the new value; 3→4: the old value; 4→5: neither.
    for (step, (size, expected)) in [(2, 0), (3, 1), (4, 2), (5, 2)].into_iter().enumerate() {
        merge(&widgets, "w1", json!({"spec": {"size": size}})).await;
        until_handled(&widgets, "w1", &format!("size {size}"), |b| {
            b["spec"]["size"] == json!(size)
        })
        .await;
        assert_eq!(calls.count("witness", "w1"), step + 1, "{:?}", calls.all());
        assert_eq!(
            calls.count("three", "w1"),
            expected,
            "after size {size}: {:?}",
            calls.all()
        );
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_handler_with_a_field_runs_only_when_that_field_changed() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_update(
                WIDGETS,
                On::id("resized").field("spec.size"),
                recorder(&calls),
            )
            .on_update(WIDGETS, "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    handled(&widgets, "w1").await;
    assert_eq!(calls.count("resized", "w1"), 0, "no update for a creation");

    merge(&widgets, "w1", json!({"spec": {"color": "red"}})).await;
    until_handled(&widgets, "w1", "the colour", |b| {
        b["spec"]["color"] == json!("red")
    })
    .await;
    assert_eq!(calls.count("witness", "w1"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("resized", "w1"), 0, "{:?}", calls.all());

    merge(&widgets, "w1", json!({"spec": {"size": 2}})).await;
    until_handled(&widgets, "w1", "the size", |b| {
        b["spec"]["size"] == json!(2)
    })
    .await;
    assert_eq!(calls.count("witness", "w1"), 2, "{:?}", calls.all());
    assert_eq!(calls.count("resized", "w1"), 1, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_handler_with_old_and_new_runs_only_for_that_transition() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_update(
                WIDGETS,
                On::id("one_to_two")
                    .field("spec.size")
                    .old(json!(1))
                    .new(json!(2)),
                recorder(&calls),
            )
            .on_update(WIDGETS, "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    handled(&widgets, "w1").await;
    // 1→3: the new value fails; 3→2: the old value fails; 2→1: both fail; 1→2: both pass.
    for (step, size) in [3, 2, 1, 2].into_iter().enumerate() {
        merge(&widgets, "w1", json!({"spec": {"size": size}})).await;
        until_handled(&widgets, "w1", &format!("size {size}"), |b| {
            b["spec"]["size"] == json!(size)
        })
        .await;
        assert_eq!(calls.count("witness", "w1"), step + 1, "{:?}", calls.all());
        let expected = usize::from(step == 3);
        assert_eq!(
            calls.count("one_to_two", "w1"),
            expected,
            "after size {size}: {:?}",
            calls.all()
        );
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_handler_with_an_old_value_runs_only_when_leaving_that_value() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_field(
                WIDGETS,
                "spec.size",
                On::id("from_one").old(json!(1)),
                recorder(&calls),
            )
            .on_field(WIDGETS, "spec.size", "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    handled(&widgets, "w1").await;
    assert_eq!(
        calls.count("witness/spec.size", "w1"),
        1,
        "{:?}",
        calls.all()
    );
    assert_eq!(
        calls.count("from_one/spec.size", "w1"),
        0,
        "the creation has no old value"
    );
    for (step, size) in [2, 3].into_iter().enumerate() {
        merge(&widgets, "w1", json!({"spec": {"size": size}})).await;
        until_handled(&widgets, "w1", &format!("size {size}"), |b| {
            b["spec"]["size"] == json!(size)
        })
        .await;
        assert_eq!(
            calls.count("witness/spec.size", "w1"),
            step + 2,
            "{:?}",
            calls.all()
        );
    }
    // 1→2 passes, 2→3 does not.
    let from_one = calls.of("from_one/spec.size", "w1");
    assert_eq!(from_one.len(), 1, "{:?}", calls.all());
    assert_eq!(from_one[0].reason, Some(Reason::Update));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_handler_with_new_absent_runs_only_when_the_field_is_removed() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_field(
                WIDGETS,
                "spec.color",
                On::id("uncolored").new(ValueFilter::Absent),
                recorder(&calls),
            )
            .on_update(WIDGETS, "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    handled(&widgets, "w1").await;
    merge(&widgets, "w1", json!({"spec": {"color": "red"}})).await;
    until_handled(&widgets, "w1", "the colour", |b| {
        b["spec"]["color"] == json!("red")
    })
    .await;
    assert_eq!(calls.count("witness", "w1"), 1, "{:?}", calls.all());
    assert_eq!(
        calls.count("uncolored/spec.color", "w1"),
        0,
        "{:?}",
        calls.all()
    );

    merge(&widgets, "w1", json!({"spec": {"color": null}})).await;
    until_handled(&widgets, "w1", "no colour", |b| {
        b["spec"].get("color").is_none()
    })
    .await;
    assert_eq!(calls.count("witness", "w1"), 2, "{:?}", calls.all());
    assert_eq!(
        calls.count("uncolored/spec.color", "w1"),
        1,
        "{:?}",
        calls.all()
    );
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// `when`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_when_callback_decides_over_the_whole_context() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("big").when(|ctx: &Ctx| {
                    ctx.reason() == Some(Reason::Create)
                        && ctx.name().starts_with("w")
                        && ctx.spec()["size"].as_i64().unwrap_or(0) > 2
                }),
                recorder(&calls),
            )
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w-small", 1).await;
    create_sized(&widgets, "w-big", 5).await;
    handled(&widgets, "w-small").await;
    handled(&widgets, "w-big").await;
    assert_eq!(calls.count("big", "w-big"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("big", "w-small"), 0, "{:?}", calls.all());
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Deletion and the finalizer.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_delete_handler_adds_no_finalizer_and_blocks_nothing() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_delete(WIDGETS, On::id("goodbye").optional(), recorder(&calls))
            .on_create(WIDGETS, "witness", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    let object = handled(&widgets, "w1").await;
    assert!(!has_finalizer(&object), "{:?}", object.metadata.finalizers);
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    until(&widgets, "w1", "the object to go", |o| o.is_none()).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_delete_handler_runs_when_another_delete_handler_holds_the_finalizer() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_delete(WIDGETS, On::id("goodbye").optional(), recorder(&calls))
            .on_delete(WIDGETS, "guard", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    until(&widgets, "w1", "the finalizer", |o| {
        o.is_some_and(has_finalizer)
    })
    .await;
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    until(&widgets, "w1", "the object to go", |o| o.is_none()).await;
    assert_eq!(calls.count("goodbye", "w1"), 1, "{:?}", calls.all());
    assert_eq!(calls.count("guard", "w1"), 1, "{:?}", calls.all());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_handler_adds_the_finalizer_and_runs_before_the_object_goes() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(operator(&cluster).on_delete(WIDGETS, "goodbye", recorder(&calls)));
    create_sized(&widgets, "w1", 1).await;
    until(&widgets, "w1", "the finalizer", |o| {
        o.is_some_and(has_finalizer)
    })
    .await;
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    until(&widgets, "w1", "the object to go", |o| o.is_none()).await;
    let goodbyes = calls.of("goodbye", "w1");
    assert_eq!(goodbyes.len(), 1, "{:?}", calls.all());
    assert_eq!(goodbyes[0].reason, Some(Reason::Delete));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_stops_matching_the_delete_handler_loses_the_finalizer() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(operator(&cluster).on_delete(
        WIDGETS,
        On::id("goodbye").label("guarded", "yes"),
        recorder(&calls),
    ));
    create(
        &widgets,
        "w1",
        json!({"size": 1}),
        json!({"guarded": "yes"}),
        Value::Null,
    )
    .await;
    until(&widgets, "w1", "the finalizer", |o| {
        o.is_some_and(has_finalizer)
    })
    .await;
    merge(
        &widgets,
        "w1",
        json!({"metadata": {"labels": {"guarded": null}}}),
    )
    .await;
    until(&widgets, "w1", "the finalizer to be removed", |o| {
        o.is_some_and(|o| !has_finalizer(o))
    })
    .await;
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    until(&widgets, "w1", "the object to go", |o| o.is_none()).await;
    assert_eq!(calls.count("goodbye", "w1"), 0, "{:?}", calls.all());
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Stealth mode.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_no_changing_handler_matches_gets_no_annotations() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("managed").label("managed", "yes"),
                recorder(&calls),
            )
            .on_update(
                WIDGETS,
                On::id("updated").label("managed", "yes"),
                recorder(&calls),
            )
            .on_delete(
                WIDGETS,
                On::id("deleted").label("managed", "yes"),
                recorder(&calls),
            )
            .on_event(WIDGETS, "events", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    calls
        .until("the creation to be seen", |c| {
            c.iter().any(|c| c.id == "events" && c.name == "w1")
        })
        .await;
    // Objects are processed one event at a time: once the next event is seen, the first cycle is over.
    merge(&widgets, "w1", json!({"spec": {"poke": 1}})).await;
    calls
        .until("the poke to be seen", |c| {
            c.iter()
                .any(|c| c.id == "events" && c.event_type == EventType::Modified)
        })
        .await;
    let object = widgets.get("w1").await.unwrap();
    assert_eq!(
        object.metadata.annotations.unwrap_or_default(),
        BTreeMap::new()
    );
    assert!(!has_finalizer(&widgets.get("w1").await.unwrap()));
    assert_eq!(status(&widgets.get("w1").await.unwrap()), &Value::Null);
    for call in calls.all() {
        assert_eq!(call.id, "events", "{call:?}");
        assert!(call.annotations.is_empty(), "{call:?}");
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_starts_matching_later_is_handled_as_a_creation() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("created").label("managed", "yes"),
                recorder(&calls),
            )
            .on_update(
                WIDGETS,
                On::id("updated").label("managed", "yes"),
                recorder(&calls),
            )
            .on_event(WIDGETS, "events", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    calls
        .until("the creation to be seen", |c| {
            c.iter().any(|c| c.id == "events" && c.name == "w1")
        })
        .await;
    merge(
        &widgets,
        "w1",
        json!({"metadata": {"labels": {"managed": "yes"}}}),
    )
    .await;
    let object = until_handled(&widgets, "w1", "the label", |b| {
        b["metadata"]["labels"]["managed"] == json!("yes")
    })
    .await;
    let created = calls.of("created", "w1");
    assert_eq!(created.len(), 1, "{:?}", calls.all());
    assert_eq!(created[0].reason, Some(Reason::Create));
    assert_eq!(calls.count("updated", "w1"), 0, "{:?}", calls.all());
    assert_eq!(annotation(&object, &format!("{PREFIX}/created")), None);
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// What handlers are given, and where their results go.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_param_and_the_id_reach_the_handler() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let running = spawn(
        operator(&cluster)
            .on_create(
                WIDGETS,
                On::id("given").param(json!({"mode": "fast"})),
                |ctx: Ctx| async move { Ok(json!({"id": ctx.id(), "param": ctx.param()})) },
            )
            .on_field(WIDGETS, "spec.size", "sized", |ctx: Ctx| async move {
                Ok(json!({"id": ctx.id(), "no_param": ctx.param().is_none()}))
            }),
    );
    create_sized(&widgets, "w1", 1).await;
    let object = handled(&widgets, "w1").await;
    assert_eq!(
        status(&object)["given"],
        json!({"id": "given", "param": {"mode": "fast"}})
    );
    assert_eq!(
        status(&object)["sized/spec.size"],
        json!({"id": "sized/spec.size", "no_param": true})
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_param_and_the_id_reach_an_event_handler() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(operator(&cluster).on_event(
        WIDGETS,
        On::id("audit").param(json!(["a", 1])),
        recorder(&calls),
    ));
    create_sized(&widgets, "w1", 1).await;
    calls
        .until("the event handler", |c| c.iter().any(|c| c.name == "w1"))
        .await;
    let call = calls.all().remove(0);
    assert_eq!(call.id, "audit");
    assert_eq!(call.param, Some(json!(["a", 1])));
    running.stop().await;
}

/// Creates `w1` with a status the operator finds already there.
async fn create_with_status(api: &Api<DynamicObject>, status: Value) {
    create_sized(api, "w1", 1).await;
    api.patch_status(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_result_is_merged_into_the_status_of_the_handler() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create_with_status(&widgets, json!({"result": {"kept": true, "changed": 0}})).await;
    let running = spawn(
        operator(&cluster).on_create(WIDGETS, "result", |_: Ctx| async {
            Ok(json!({"changed": 1, "added": "yes"}))
        }),
    );
    let object = handled(&widgets, "w1").await;
    assert_eq!(
        status(&object)["result"],
        json!({"kept": true, "changed": 1, "added": "yes"})
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scalar_result_replaces_the_status_of_the_handler() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create_with_status(&widgets, json!({"result": {"kept": true}})).await;
    let running = spawn(operator(&cluster).on_create(WIDGETS, "result", |_: Ctx| async { Ok(42) }));
    let object = handled(&widgets, "w1").await;
    assert_eq!(status(&object)["result"], json!(42));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_result_stores_nothing() {
    let (cluster, widgets) = cluster_with_widgets().await;
    create_with_status(&widgets, json!({"kept": {"here": true}})).await;
    let running = spawn(
        operator(&cluster)
            .on_create(WIDGETS, "unit", |_: Ctx| async { Ok(()) })
            .on_create(WIDGETS, "kept", |_: Ctx| async { Ok(()) }),
    );
    let object = handled(&widgets, "w1").await;
    assert_eq!(status(&object), &json!({"kept": {"here": true}}));
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// `on_event`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_handler_with_a_label_filter_sees_only_matching_objects_and_stores_its_result() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let seen = calls.clone();
    let running = spawn(
        operator(&cluster)
            .on_event(
                WIDGETS,
                On::id("watched").label("watch", "yes"),
                move |ctx: Ctx| {
                    seen.record(&ctx);
                    async { Ok("seen") }
                },
            )
            // Registered after, so it runs after the filtered one in the same cycle.
            .on_event(WIDGETS, "all", recorder(&calls)),
    );
    let spec = json!({"size": 1});
    create(
        &widgets,
        "w-watched",
        spec.clone(),
        json!({"watch": "yes"}),
        Value::Null,
    )
    .await;
    create(
        &widgets,
        "w-other",
        spec,
        json!({"watch": "no"}),
        Value::Null,
    )
    .await;
    let object = until(&widgets, "w-watched", "the event handler's result", |o| {
        o.is_some_and(|o| status(o)["watched"] == json!("seen"))
    })
    .await
    .unwrap();
    assert_eq!(status(&object), &json!({"watched": "seen"}));
    calls
        .until("both objects to be seen", |c| {
            ["w-watched", "w-other"]
                .iter()
                .all(|n| c.iter().any(|c| c.id == "all" && c.name == *n))
        })
        .await;
    assert_eq!(calls.count("watched", "w-other"), 0, "{:?}", calls.all());
    let other = widgets.get("w-other").await.unwrap();
    assert_eq!(status(&other), &Value::Null);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_handler_with_a_field_value_checks_the_current_body() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_event(
                WIDGETS,
                On::id("three").field("spec.size").value(json!(3)),
                recorder(&calls),
            )
            .on_event(WIDGETS, "all", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 3).await;
    calls
        .until("size 3 to be seen", |c| {
            c.iter().any(|c| c.id == "three" && c.name == "w1")
        })
        .await;
    merge(&widgets, "w1", json!({"spec": {"size": 4}})).await;
    calls
        .until("the change to size 4 to be seen", |c| {
            c.iter()
                .any(|c| c.id == "all" && c.event_type == EventType::Modified)
        })
        .await;
    // The old value was 3, but an event handler has no old: only the current body counts.
    let threes = calls.of("three", "w1");
    assert!(
        threes.iter().all(|c| c.event_type != EventType::Modified),
        "{:?}",
        calls.all()
    );
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Lifecycles.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_one_handler_runs_per_cycle_with_progress_stored_in_between() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .on_create(WIDGETS, "first", recorder(&calls))
            .on_create(WIDGETS, "second", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    let object = handled(&widgets, "w1").await;
    let (first, second) = (calls.of("first", "w1"), calls.of("second", "w1"));
    assert_eq!((first.len(), second.len()), (1, 1), "{:?}", calls.all());
    // The second ran in a later cycle, over the body that the first one's cycle patched.
    assert_ne!(first[0].version, second[0].version);
    let progress = second[0]
        .annotations
        .get(&format!("{PREFIX}/first"))
        .expect("the first handler's progress, stored between the cycles");
    let progress: Value = serde_json::from_str(progress).unwrap();
    assert_eq!(progress["success"], json!(true), "{progress}");
    assert!(first[0].annotations.is_empty(), "{:?}", first[0]);
    assert_eq!(annotation(&object, &format!("{PREFIX}/first")), None);
    assert_eq!(annotation(&object, &format!("{PREFIX}/second")), None);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_at_once_runs_every_handler_in_one_cycle() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let calls = Calls::default();
    let running = spawn(
        operator(&cluster)
            .settings(|s| s.execution.lifecycle = Lifecycle::AllAtOnce)
            .on_create(WIDGETS, "first", recorder(&calls))
            .on_create(WIDGETS, "second", recorder(&calls)),
    );
    create_sized(&widgets, "w1", 1).await;
    handled(&widgets, "w1").await;
    let (first, second) = (calls.of("first", "w1"), calls.of("second", "w1"));
    assert_eq!((first.len(), second.len()), (1, 1), "{:?}", calls.all());
    assert_eq!(first[0].version, second[0].version, "the same cycle");
    assert!(second[0].annotations.is_empty(), "{:?}", second[0]);
    let order: Vec<String> = calls.all().into_iter().map(|c| c.id).collect();
    assert_eq!(order, ["first", "second"]);
    running.stop().await;
}
