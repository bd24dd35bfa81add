//! Reconcile handlers end to end, on both test clusters: owned and watched kinds routed to their
//! owner's worker, predicates, the shared cache read without requests, and one handler at a time
//! per object. (The memcached example's reconcile version is in `examples.rs`; backoff and requeue
//! timing, under paused time, in the reactor's handling suite.)

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kactor::cache::{Cache, Slim};
use kactor::observe::Observer;
use kactor::pausing::PauseSwitch;
use kactor::prelude::*;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::Value;
use support::*;

const WIDGETS: (&str, &str, &str) = ("example.com", "v1", "widgets");

/// Makes a widget.
async fn create_widget(widgets: &Api<DynamicObject>, name: &str, size: i64) -> DynamicObject {
    let body = serde_json::from_value(kactor::emulator::samples::widget(name, size)).unwrap();
    widgets.create(&PostParams::default(), &body).await.unwrap()
}

/// The ConfigMap a widget owns, as a reconcile handler makes it: named after it, owned by it.
fn config_map_of(ctx: &Ctx) -> Result<DynamicObject, HandlerError> {
    let mut config_map = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": ctx.name()},
        "data": {"size": ctx.spec()["size"].to_string()},
    });
    ctx.adopt(&mut config_map)?;
    Ok(serde_json::from_value(config_map)?)
}

/// Makes the widget's ConfigMap through the cache's API (`Cache::api`) and keeps the answer in
/// the cache (our own write, read back before the watch brings it); returns the answer.
async fn make_config_map(ctx: &Ctx, cache: &Cache) -> Result<DynamicObject, HandlerError> {
    let made = cache
        .api(ctx.client(), ctx.namespace())
        .create(&PostParams::default(), &Slim(config_map_of(ctx)?))
        .await?
        .into_inner();
    cache.remember(made.clone());
    Ok(made)
}

/// The reconcile handler of the owning tests: the widget's ConfigMap is made if the cache has
/// none.
async fn ensure_config_map(ctx: Ctx) -> Result<Action, HandlerError> {
    let cache = ctx.cache("configmaps")?;
    if cache.get(ctx.namespace(), ctx.name()).is_none() {
        make_config_map(&ctx, &cache).await?;
    }
    Ok(Action::await_change())
}

/// Deletes the ConfigMap `first` by hand, and waits until its owner made it again (a new uid).
async fn delete_and_see_it_made_again(config_maps: &Api<ConfigMap>, first: &ConfigMap) {
    let name = first.name_any();
    config_maps
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let again = config_maps.get_opt(&name).await.unwrap();
        if again.as_ref().is_some_and(|c| c.uid() != first.uid()) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ConfigMap is not made again"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_object_deleted_by_hand_is_made_again_by_its_owner() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let related: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = related.clone();
    let operator = operator(&cluster).on_reconcile(
        WIDGETS,
        Reconcile::id("own").owns("configmaps"),
        move |ctx: Ctx| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .extend(ctx.triggers().related.iter().map(ToString::to_string));
                ensure_config_map(ctx).await
            }
        },
    );
    let running = spawn(operator);
    create_widget(&widgets, "w1", 1).await;
    let first = eventually_get(&config_maps, "w1").await;
    delete_and_see_it_made_again(&config_maps, &first).await;
    // The handler was told what changed: its ConfigMap, deleted.
    eventually("the deletion among the triggers", || {
        related
            .lock()
            .unwrap()
            .iter()
            .any(|t| t == "configmaps.v1 default/w1 deleted")
    })
    .await;
    running.stop().await;
}

/// What a handler saw of the child it made through its cache's API (`Cache::api`).
#[derive(Debug, Clone)]
struct Made {
    /// The answer to the create, as `Slim` decoded it.
    answer: DynamicObject,
    /// The cache's read of the child right after `remember`, before any event of it came.
    read_back: Option<DynamicObject>,
}

/// A child made through the cache's API comes back decoded as the cache keeps objects: without
/// `managedFields` (which the real API server sends with every answer), otherwise what the server
/// holds; remembered, the very next read of the cache sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_made_through_the_caches_api_is_read_back_without_managed_fields() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let made: Arc<Mutex<Option<Made>>> = Arc::default();
    let seen = made.clone();
    let operator = operator(&cluster).on_reconcile(
        WIDGETS,
        Reconcile::id("own").owns("configmaps"),
        move |ctx: Ctx| {
            let seen = seen.clone();
            async move {
                let cache = ctx.cache("configmaps")?;
                if cache.get(ctx.namespace(), ctx.name()).is_none() {
                    let answer = make_config_map(&ctx, &cache).await?;
                    let read_back = cache.get(ctx.namespace(), ctx.name()).map(|c| (*c).clone());
                    *seen.lock().unwrap() = Some(Made { answer, read_back });
                }
                Ok(Action::await_change())
            }
        },
    );
    let running = spawn(operator);
    create_widget(&widgets, "w1", 4).await;
    eventually("the child made", || made.lock().unwrap().is_some()).await;
    let Made { answer, read_back } = made.lock().unwrap().clone().unwrap();
    running.stop().await;

    assert_eq!(answer.metadata.managed_fields, None, "{answer:?}");
    assert_eq!(answer.data["data"]["size"], "4");
    assert_eq!(
        answer
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].name.as_str()),
        Some("w1")
    );
    // What the server holds, read in full: the same object, but for managedFields.
    let config_maps = Api::<DynamicObject>::namespaced_with(
        cluster.client(),
        "default",
        &kube::api::ApiResource::erase::<ConfigMap>(&()),
    );
    let mut held = config_maps.get("w1").await.unwrap();
    held.metadata.managed_fields = None;
    assert_eq!(answer, held);
    // Remembered: read back at once, as answered.
    assert_eq!(read_back.as_ref(), Some(&answer));
}

/// A kind cached as metadata alone (`Operator::cache_metadata_only`): its objects still reach their
/// owners through their owner references, and the cache holds no body, not even of a child the
/// handler remembered after making it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_only_cache_routes_owned_objects_and_keeps_no_bodies() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let cached: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = cached.clone();
    let operator = operator(&cluster)
        .cache_metadata_only("configmaps")
        .on_reconcile(
            WIDGETS,
            Reconcile::id("own").owns("configmaps"),
            move |ctx: Ctx| {
                let seen = seen.clone();
                async move {
                    let child = ctx.cache("configmaps")?.get(ctx.namespace(), ctx.name());
                    if let Some(child) = child {
                        seen.lock().unwrap().push(child.data.clone());
                    }
                    ensure_config_map(ctx).await
                }
            },
        );
    let running = spawn(operator);
    create_widget(&widgets, "w1", 1).await;
    let first = eventually_get(&config_maps, "w1").await;
    assert!(first.data.is_some(), "the ConfigMap itself has its data");
    // A change of the child's data (its metadata changes with it: a new resourceVersion) runs
    // the owner, which sees the child in its cache without the data.
    config_maps
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"size": "7"}})),
        )
        .await
        .unwrap();
    eventually("a run that found its child in the cache", || {
        !cached.lock().unwrap().is_empty()
    })
    .await;
    delete_and_see_it_made_again(&config_maps, &first).await;
    let cached = cached.lock().unwrap().clone();
    assert!(
        cached.iter().all(|data| *data == json!({})),
        "the cache kept bodies: {cached:?}"
    );
    running.stop().await;
}

/// The watch event of a child the handler made and remembered (`Cache::remember`) is its own
/// write coming back: it triggers no run; a change made by someone else does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_echo_of_a_remembered_write_triggers_nothing_and_a_change_by_another_does() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let runs: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen = runs.clone();
    let operator = operator(&cluster).on_reconcile(
        WIDGETS,
        Reconcile::id("own").owns("configmaps"),
        move |ctx: Ctx| {
            let seen = seen.clone();
            async move {
                let triggers = ctx.triggers().related.iter().map(ToString::to_string);
                seen.lock().unwrap().push(triggers.collect());
                ensure_config_map(ctx).await
            }
        },
    );
    let running = spawn(operator);
    create_widget(&widgets, "w1", 1).await;
    eventually_get(&config_maps, "w1").await;
    // Another writer labels the child: that is a change the owner must hear of.
    let label = json!({"metadata": {"labels": {"touched": "by-hand"}}});
    config_maps
        .patch("w1", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    eventually("the owner told of the other writer's change", || {
        runs.lock()
            .unwrap()
            .iter()
            .flatten()
            .any(|t| t == "configmaps.v1 default/w1 modified")
    })
    .await;
    // Its own child's creation (the event came before the label's, in the same stream) never
    // made a run of its own, nor joined that one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs,
        [
            vec![],
            vec!["configmaps.v1 default/w1 modified".to_string()]
        ],
        "one run for the widget, one for the other writer's change"
    );
    running.stop().await;
}

async fn eventually_get(config_maps: &Api<ConfigMap>, name: &str) -> ConfigMap {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(found) = config_maps.get_opt(name).await.unwrap() {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ConfigMap {name}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The generations each handler saw, in order.
#[derive(Clone, Default)]
struct Generations(Arc<Mutex<HashMap<&'static str, Vec<i64>>>>);

impl Generations {
    fn record(&self, id: &'static str, ctx: &Ctx) {
        let generation = ctx.meta().generation.unwrap_or_default();
        self.0
            .lock()
            .unwrap()
            .entry(id)
            .or_default()
            .push(generation);
    }

    fn of(&self, id: &str) -> Vec<i64> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_update_does_not_trigger_a_handler_with_the_generation_predicate() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let generations = Generations::default();
    let recorder = |id: &'static str| {
        let generations = generations.clone();
        move |ctx: Ctx| {
            generations.record(id, &ctx);
            async { Ok(Action::await_change()) }
        }
    };
    // Both decide in the same cycle of the same event: the one without a predicate is the control.
    let operator = operator(&cluster)
        .on_reconcile(WIDGETS, "any", recorder("any"))
        .on_reconcile(
            WIDGETS,
            Reconcile::id("spec").predicate(Predicate::generation_changed()),
            recorder("spec"),
        );
    let running = spawn(operator);
    create_widget(&widgets, "w1", 1).await;
    eventually("the first runs", || generations.of("spec") == [1]).await;
    let status = json!({"status": {"seen": true}});
    widgets
        .patch_status("w1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    eventually("the control to see the status update", || {
        generations.of("any").len() == 2
    })
    .await;
    assert_eq!(generations.of("spec"), [1], "the status update was ignored");
    let spec = json!({"spec": {"size": 2}});
    widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    eventually("the spec change", || generations.of("spec") == [1, 2]).await;
    assert_eq!(generations.of("any"), [1, 1, 2]);
    running.stop().await;
}

/// Counts the operator's reading requests.
#[derive(Default)]
struct Reads(AtomicUsize);

impl Observer for Reads {
    fn api_request(&self, verb: &'static str, _code: Option<u16>, _duration: Duration) {
        if verb == "get" || verb == "list" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_read_the_cache_without_requests_and_never_older_than_their_trigger() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let reads = Arc::new(Reads::default());
    // What each run read: the version of the ConfigMap that triggered it, and the cache's.
    let stale: Arc<Mutex<Vec<String>>> = Arc::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let (stale_seen, run_count) = (stale.clone(), runs.clone());
    let operator = operator(&cluster).observer(reads.clone()).on_reconcile(
        WIDGETS,
        // Not owned: labelled with the widget's name, and mapped to it.
        Reconcile::id("watching").watches("configmaps", |cm: &DynamicObject| {
            cm.labels()
                .get("widget")
                .map(|w| vec![(cm.namespace(), w.clone())])
                .unwrap_or_default()
        }),
        move |ctx: Ctx| {
            let (stale, runs) = (stale_seen.clone(), run_count.clone());
            async move {
                let cache = ctx.cache("configmaps")?;
                let widgets = ctx.cache(WIDGETS)?;
                let me = widgets.get(ctx.namespace(), ctx.name());
                if me.is_none() {
                    stale
                        .lock()
                        .unwrap()
                        .push("the widget is not in its own cache".into());
                }
                for related in &ctx.triggers().related {
                    let cached = cache.get(related.namespace.as_deref(), &related.name);
                    let counter = cached
                        .as_ref()
                        .and_then(|c| c.data["data"]["counter"].as_str().map(String::from));
                    let expected = related.event != EventType::Deleted;
                    if expected && counter.is_none() {
                        stale.lock().unwrap().push(format!("{related}: not cached"));
                    }
                }
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(Action::await_change())
            }
        },
    );
    let running = spawn(operator);
    create_widget(&widgets, "w1", 1).await;
    eventually("the first run", || runs.load(Ordering::SeqCst) >= 1).await;
    let before = reads.0.load(Ordering::SeqCst);
    let base = runs.load(Ordering::SeqCst);
    let labelled: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings", "labels": {"widget": "w1"}},
        "data": {"counter": "0"},
    }))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &labelled)
        .await
        .unwrap();
    for counter in 1..=10 {
        let now = runs.load(Ordering::SeqCst);
        let patch = json!({"data": {"counter": counter.to_string()}});
        config_maps
            .patch("settings", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        // Each change runs the handler.
        eventually("a run after the change", || {
            runs.load(Ordering::SeqCst) > now
        })
        .await;
    }
    // At least one run after each change (the creation's may join the first change's).
    assert!(runs.load(Ordering::SeqCst) >= base + 10);
    assert_eq!(
        reads.0.load(Ordering::SeqCst),
        before,
        "runs read the cache, never the API server"
    );
    assert!(
        stale.lock().unwrap().is_empty(),
        "{:?}",
        stale.lock().unwrap()
    );
    running.stop().await;
}

/// Who is in a handler of which object now, and what overlapped.
#[derive(Clone, Default)]
struct Inside {
    busy: Arc<Mutex<HashMap<String, &'static str>>>,
    overlaps: Arc<Mutex<Vec<String>>>,
    runs: Arc<Mutex<HashMap<&'static str, usize>>>,
}

impl Inside {
    async fn run(&self, id: &'static str, ctx: &Ctx) {
        let uid = ctx.uid().unwrap_or_default().to_string();
        if let Some(other) = self.busy.lock().unwrap().insert(uid.clone(), id) {
            self.overlaps
                .lock()
                .unwrap()
                .push(format!("{id} entered {} while {other} ran", ctx.name()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.busy.lock().unwrap().remove(&uid);
        *self.runs.lock().unwrap().entry(id).or_default() += 1;
    }

    fn runs(&self, id: &str) -> usize {
        self.runs
            .lock()
            .unwrap()
            .get(id)
            .copied()
            .unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_handler_never_runs_beside_another_handler_of_its_object() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let inside = Inside::default();
    let (a, b, c) = (inside.clone(), inside.clone(), inside.clone());
    let operator = operator(&cluster)
        .on_reconcile(
            WIDGETS,
            Reconcile::id("reconcile").owns("configmaps"),
            move |ctx: Ctx| {
                let inside = a.clone();
                async move {
                    inside.run("reconcile", &ctx).await;
                    // Asks again soon: requeues meet events and the other handlers.
                    Ok(Action::requeue(Duration::from_millis(7)))
                }
            },
        )
        .on_update(WIDGETS, "update", move |ctx: Ctx| {
            let inside = b.clone();
            async move {
                inside.run("update", &ctx).await;
                Ok(())
            }
        })
        .on_field(WIDGETS, "spec.size", "size", move |ctx: Ctx| {
            let inside = c.clone();
            async move {
                inside.run("size", &ctx).await;
                Ok(Value::Null)
            }
        });
    let running = spawn(operator);
    for n in 0..4 {
        create_widget(&widgets, &format!("w{n}"), 1).await;
    }
    // Served: the changes below are updates, not part of the creation.
    eventually("the creations", || inside.runs("size") == 4).await;
    for size in 2..12 {
        for n in 0..4 {
            let patch = json!({"spec": {"size": size}});
            widgets
                .patch(
                    &format!("w{n}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .unwrap();
        }
    }
    eventually("every kind of handler to run for the updates", || {
        inside.runs("reconcile") > 40 && inside.runs("update") >= 4 && inside.runs("size") >= 8
    })
    .await;
    running.stop().await;
    assert!(
        inside.overlaps.lock().unwrap().is_empty(),
        "{:?}",
        inside.overlaps.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kopf_style_handler_of_owned_objects_hears_of_each_change_in_its_owner_worker() {
    let (cluster, widgets) = cluster_with_widgets().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let heard: Arc<Mutex<Vec<String>>> = Arc::default();
    let ears = heard.clone();
    let served = Arc::new(AtomicUsize::new(0));
    let serving = served.clone();
    let operator = operator(&cluster)
        // Its run says the operator serves (the related streams list before the supervisors).
        .on_create(WIDGETS, "created", move |_: Ctx| {
            serving.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })
        .cache_transform("configmaps", |cm| {
            if let Some(data) = cm.data["data"].as_object_mut() {
                data.remove("secret");
            }
        })
        .on_owned(WIDGETS, "configmaps", "children", move |ctx: Ctx| {
            let heard = ears.clone();
            async move {
                let cache = ctx.cache("configmaps")?;
                for change in &ctx.triggers().related {
                    let kept = cache.get(change.namespace.as_deref(), &change.name);
                    // Kept as the transform left it, without managedFields.
                    let shape = kept.map(|cm| {
                        (
                            cm.metadata.managed_fields.is_some(),
                            cm.data["data"].get("secret").is_some(),
                        )
                    });
                    heard
                        .lock()
                        .unwrap()
                        .push(format!("{} {change} {shape:?}", ctx.name()));
                }
                Ok(())
            }
        });
    let running = spawn(operator);
    let widget = create_widget(&widgets, "w1", 1).await;
    let owner = json!([{
        "apiVersion": "example.com/v1", "kind": "Widget", "name": "w1",
        "uid": widget.uid().unwrap(), "controller": true,
    }]);
    let child: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "child", "ownerReferences": owner},
        "data": {"secret": "s3cret", "size": "1"},
    }))
    .unwrap();
    // Only once the operator serves: the creation is an event it hears, not part of its listing.
    eventually("the operator to serve", || {
        served.load(Ordering::SeqCst) == 1
    })
    .await;
    config_maps
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    // Heard before the next change (changes that come together are told once, as the newest).
    eventually("the creation heard", || heard.lock().unwrap().len() == 1).await;
    let patch = json!({"data": {"size": "2"}});
    config_maps
        .patch("child", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("both changes heard", || heard.lock().unwrap().len() >= 2).await;
    let heard = heard.lock().unwrap().clone();
    assert_eq!(
        heard[..2],
        [
            "w1 configmaps.v1 default/child added Some((false, false))",
            "w1 configmaps.v1 default/child modified Some((false, false))",
        ]
    );
    running.stop().await;
}

/// A running operator whose widget `w1` owns the ConfigMap `w1` (made by its reconcile handler),
/// and the operator's pause switch.
struct Owning {
    _cluster: kactor_testenv::TestCluster,
    config_maps: Api<ConfigMap>,
    switch: PauseSwitch,
    running: Running,
    /// The ConfigMap as first made.
    first: ConfigMap,
}

impl Owning {
    async fn start() -> Owning {
        let (cluster, widgets) = cluster_with_widgets().await;
        let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
        let operator = operator(&cluster).on_reconcile(
            WIDGETS,
            Reconcile::id("own").owns("configmaps"),
            ensure_config_map,
        );
        let switch = operator.pause_switch();
        let running = spawn(operator);
        create_widget(&widgets, "w1", 1).await;
        let first = eventually_get(&config_maps, "w1").await;
        Owning {
            _cluster: cluster,
            config_maps,
            switch,
            running,
            first,
        }
    }
}

/// A pause and a resume with nothing changed (a leadership flap): the listing after the resume
/// passes the unchanged widget, whose worker still waits for its first event after the pause. A
/// child deleted by hand then is made again at once: its deletion is that event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_deleted_just_after_a_pause_and_a_resume_is_made_again() {
    let owning = Owning::start().await;
    let (config_maps, switch, first) = (&owning.config_maps, &owning.switch, &owning.first);
    switch.set("test", Some("a leadership flap".into()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    switch.set("test", None);
    // The listing after the resume, which finds nothing changed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    delete_and_see_it_made_again(config_maps, first).await;
    owning.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_changed_during_a_pause_is_reconciled_after_the_resume() {
    let owning = Owning::start().await;
    let (config_maps, switch, first) = (&owning.config_maps, &owning.switch, &owning.first);
    // Paused (as by a peer of higher priority): the widget does not change, its child goes.
    switch.set("test", Some("a pause".into()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    config_maps
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        config_maps.get_opt("w1").await.unwrap().is_none(),
        "nothing is done while paused"
    );
    // Resumed: the listing brings the unchanged widget back for the change it missed.
    switch.set("test", None);
    let again = eventually_get(config_maps, "w1").await;
    assert_ne!(again.uid(), first.uid());
    owning.running.stop().await;
}
