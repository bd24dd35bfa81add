//! The operator end to end, against kactor's embedded Kubernetes API server (no cluster needed):
//! a `{{Kind}}` is created, changed and deleted, and each time the operator's result shows on it.

use std::time::Duration;

use kactor::emulator::Emulator;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use {{crate}}::{ {{Kind}}, {{Kind}}Spec };

/// The longest anything is waited for.
const WAIT: Duration = Duration::from_secs(30);

/// Waits until the object passes `check` (None: it is gone).
async fn until(api: &Api<DynamicObject>, name: &str, what: &str, check: impl Fn(Option<&DynamicObject>) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let object = api.get_opt(name).await.unwrap();
        if check(object.as_ref()) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}: {object:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The result a handler left in the object's status, under its id.
fn result<'a>(object: Option<&'a DynamicObject>, id: &str) -> Option<&'a Value> {
    object?.data.get("status")?.get(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_{{kind}}_is_greeted_when_created_and_changed_and_let_go_when_deleted() {
    let emulator = Emulator::start().await.unwrap();
    let operator = {{crate}}::operator().client(emulator.client()).standalone();
    operator.install_crds(&emulator.client()).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));

    let api: Api<{{Kind}}> = Api::namespaced(emulator.client(), "default");
    // The same objects as they are stored, results included (the typed status keeps none of them).
    let raw: Api<DynamicObject> =
        Api::namespaced_with(emulator.client(), "default", &ApiResource::erase::<{{Kind}}>(&()));
    let object = {{Kind}}::new("first", {{Kind}}Spec { message: "world".into() });
    api.create(&PostParams::default(), &object).await.unwrap();
    until(&raw, "first", "the greeting", |o| {
        result(o, "{{create_id}}").is_some_and(|r| r["greeting"] == "hello, world")
    })
    .await;

    let change = json!({"spec": {"message": "kactor"}});
    api.patch("first", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap();
    until(&raw, "first", "the second greeting", |o| {
        result(o, "{{update_id}}").is_some_and(|r| r["greeting"] == "hello again, kactor")
    })
    .await;

    // The operator's finalizer holds the object until its delete handler has run.
    api.delete("first", &DeleteParams::default()).await.unwrap();
    until(&raw, "first", "the object to go", |o| o.is_none()).await;

    let _ = stop.send(());
    tokio::time::timeout(WAIT, running).await.unwrap().unwrap().unwrap();
}
