//! Indexes (Kopf's `@kopf.index`) end to end, on both test clusters: populated before any resource
//! handler runs, kept up to date by the watch, emptied of objects that go or stop passing the
//! filters, and the errors modes.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kactor::prelude::*;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::Value;
use support::*;

const WIDGETS: (&str, &str, &str) = ("example.com", "v1", "widgets");

async fn create_widget(widgets: &Api<DynamicObject>, name: &str, team: &str) {
    let mut body = kactor::emulator::samples::widget(name, 1);
    body["metadata"]["labels"]["team"] = json!(team);
    let body = serde_json::from_value(body).unwrap();
    widgets.create(&PostParams::default(), &body).await.unwrap();
}

async fn relabel(widgets: &Api<DynamicObject>, name: &str, labels: Value) {
    let patch = json!({"metadata": {"labels": labels}});
    widgets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// What the probe handler saw in the index, by key, sorted.
type Seen = Arc<Mutex<Vec<BTreeMap<String, Vec<String>>>>>;

/// The index as a sorted map, for asserting.
fn snapshot(ctx: &Ctx) -> BTreeMap<String, Vec<String>> {
    let index = ctx.index("by_team").expect("the index exists");
    index
        .keys()
        .into_iter()
        .map(|key| {
            let mut names: Vec<String> = index.get_as::<String>(key.as_deref());
            names.sort();
            (key.unwrap_or_else(|| "<none>".into()), names)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_is_whole_before_handlers_run_and_follows_the_objects() {
    let (cluster, widgets) = cluster_with_widgets().await;
    // Objects that exist before the operator starts: the first handler to run sees them all.
    for n in 0..20 {
        let team = if n % 2 == 0 { "red" } else { "blue" };
        create_widget(&widgets, &format!("w{n:02}"), team).await;
    }
    let seen: Seen = Arc::default();
    let first = seen.clone();
    let operator = operator(&cluster)
        // Only widgets with a team label are indexed, under their team.
        .index(
            WIDGETS,
            On::id("by_team").label("team", MetaFilter::Present),
            |ctx: Ctx| async move {
                let team = ctx.labels().get("team").cloned().unwrap_or_default();
                Ok(json!({ team: ctx.name() }))
            },
        )
        .on_event(WIDGETS, "look", move |ctx: Ctx| {
            let seen = first.clone();
            async move {
                seen.lock().unwrap().push(snapshot(&ctx));
                Ok(())
            }
        });
    let running = spawn(operator);
    eventually("the first event handler", || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    let at_first = seen.lock().unwrap()[0].clone();
    assert_eq!(at_first["red"].len(), 10, "{at_first:?}");
    assert_eq!(at_first["blue"].len(), 10, "{at_first:?}");

    // Moved to another team, out of the filter, deleted: the index follows.
    relabel(&widgets, "w00", json!({"team": "green"})).await;
    relabel(&widgets, "w01", json!({"team": null})).await;
    widgets
        .delete("w02", &DeleteParams::default())
        .await
        .unwrap();
    let last = || seen.lock().unwrap().last().cloned().unwrap_or_default();
    eventually("the index to follow", || {
        let index = last();
        index.get("green").is_some_and(|g| g == &["w00"])
            && index.get("red").is_some_and(|r| r.len() == 8)
            && index.get("blue").is_some_and(|b| b.len() == 9)
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_errors_keep_stale_values_or_remove_them_as_the_mode_says() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let seen: Seen = Arc::default();
    let look = seen.clone();
    // The index handler fails for widgets labelled `broken`; `by_team` ignores the errors (Kopf's
    // default), `strict` (the same function) fails them permanently.
    let indexer = |ctx: Ctx| async move {
        if ctx.labels().contains_key("broken") {
            return Err(HandlerError::msg("cannot index a broken widget"));
        }
        let team = ctx.labels().get("team").cloned().unwrap_or_default();
        Ok(json!({ team: ctx.name() }))
    };
    let operator = operator(&cluster)
        .index(WIDGETS, "by_team", indexer)
        .index(
            WIDGETS,
            On::id("strict").errors(ErrorsMode::Permanent),
            indexer,
        )
        .on_event(WIDGETS, "look", move |ctx: Ctx| {
            let seen = look.clone();
            async move {
                let strict = ctx.index("strict")?;
                let mut snapshot = snapshot(&ctx);
                let mut names = strict.get_as::<String>(Some("red"));
                names.sort();
                snapshot.insert("strict red".into(), names);
                seen.lock().unwrap().push(snapshot);
                Ok(())
            }
        });
    let running = spawn(operator);
    create_widget(&widgets, "w1", "red").await;
    create_widget(&widgets, "w2", "red").await;
    let last = || seen.lock().unwrap().last().cloned().unwrap_or_default();
    eventually("both indexed", || {
        last().get("strict red").is_some_and(|r| r.len() == 2)
    })
    .await;
    relabel(&widgets, "w1", json!({"team": "blue", "broken": "yes"})).await;
    eventually("the failure", || {
        last().get("strict red").is_some_and(|r| r == &["w2"])
    })
    .await;
    let index = last();
    // Ignored: w1 stays where it was; permanent: w1 is gone, and stays gone once fixed.
    assert_eq!(index["red"], ["w1", "w2"], "{index:?}");
    assert!(!index.contains_key("blue"), "{index:?}");
    relabel(&widgets, "w1", json!({"broken": null})).await;
    eventually("the fix", || {
        last().get("blue").is_some_and(|b| b == &["w1"])
    })
    .await;
    assert_eq!(last()["strict red"], ["w2"]);
    running.stop().await;
}
