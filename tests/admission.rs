//! Admission webhooks of an operator end to end. On both servers: an operator without a webhook
//! server does not start, and one with `settings.admission.managed` keeps its configurations while
//! it runs and withdraws them at exit. On the real kube-apiserver, which calls the webhooks (the
//! emulator does not): a denial shown to the client with its message and code, a mutation on the
//! stored object, a warning printed by kubectl, and a mutation of the operator's own write handled
//! as an update.

#[allow(dead_code)]
#[path = "../crates/emulator/tests/common/mod.rs"]
mod common;
mod support;

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kactor::admission::{Admission, AdmissionCtx, AdmissionError, Operation, WebhookServer};
use kactor::prelude::*;
use kactor_testenv::TestCluster;
use kube::api::Api;
use support::{cluster_with_widgets, operator, spawn};

const MANAGED: &str = "auto.kactor.test";

/// The widgets, named exactly (group, version, plural): a resource that may be served later.
const WIDGETS: (&str, &str, &str) = ("example.com", "v1", "widgets");

/// An operator serving its admission webhooks on 127.0.0.1, their configurations managed under
/// the name `managed`.
fn serving_webhooks(cluster: &TestCluster, managed: &str) -> Operator {
    let managed = managed.to_string();
    operator(cluster).settings(move |s| {
        s.admission.server = Some(WebhookServer {
            addr: "127.0.0.1".parse().unwrap(),
            host: "127.0.0.1".into(),
            ..WebhookServer::default()
        });
        s.admission.managed = Some(managed);
    })
}

/// An operator validating widgets' sizes (over 10 is denied with 400, over 5 warned about) and
/// labelling every new widget, served on 127.0.0.1, its configurations managed.
fn admitting(cluster: &TestCluster) -> Operator {
    serving_webhooks(cluster, MANAGED)
        .on_validate(
            WIDGETS,
            Admission::id("check-size").operations([Operation::Create, Operation::Update]),
            |ctx: Arc<AdmissionCtx>| async move {
                let size = ctx.spec()["size"].as_i64().unwrap_or_default();
                if size > 5 {
                    ctx.warn(format!("size {size} is large"));
                }
                if size > 10 {
                    return Err(AdmissionError::deny(format!("size {size} is over 10")).code(400));
                }
                Ok(())
            },
        )
        .on_mutate(
            WIDGETS,
            Admission::id("label").operations([Operation::Create]),
            |ctx: Arc<AdmissionCtx>| async move {
                ctx.patch().label("admitted-by", Some("kactor"));
                Ok(())
            },
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_with_admission_handlers_and_no_webhook_server_does_not_start() {
    let (cluster, _) = cluster_with_widgets().await;
    let operator = operator(&cluster).on_validate(
        "widgets.example.com",
        "check",
        |_: Arc<AdmissionCtx>| async { Ok(()) },
    );
    let error = operator
        .run_until(std::future::pending())
        .await
        .expect_err("it must not start");
    let text = error.to_string();
    assert!(
        text.contains("check") && text.contains("settings.admission.server"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_webhook_configurations_live_as_long_as_the_operator() {
    let (cluster, _) = cluster_with_widgets().await;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(cluster.client());
    let running = spawn(admitting(&cluster));
    let deadline = tokio::time::Instant::now() + support::WAIT;
    // Written one after the other, at startup.
    let found = loop {
        let both = (
            validating.get_opt(MANAGED).await.unwrap(),
            mutating.get_opt(MANAGED).await.unwrap(),
        );
        if let (Some(found), Some(_)) = both {
            break found;
        }
        assert!(tokio::time::Instant::now() < deadline, "no {MANAGED}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    };
    let webhook = &found.webhooks.as_ref().unwrap()[0];
    assert_eq!(webhook.name, format!("check-size.{MANAGED}"));
    let url = webhook.client_config.url.clone().unwrap();
    assert!(
        url.starts_with("https://127.0.0.1:") && url.ends_with("/check-size"),
        "{url}"
    );
    running.stop().await;
    assert!(
        validating.get_opt(MANAGED).await.unwrap().is_none(),
        "withdrawn at exit"
    );
    assert!(
        mutating.get_opt(MANAGED).await.unwrap().is_none(),
        "withdrawn at exit"
    );
}

/// An operator deployed together with its CRD may start before the API server serves it: its
/// webhooks wait for the resource (a resource still missing after 30 s is an error), and are
/// configured once it is served, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_started_before_their_crd_is_served_are_configured_once_it_is() {
    let cluster = TestCluster::builder().start().await.unwrap();
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client());
    let mut running = spawn(admitting(&cluster));
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    running.assert_running().await;
    assert!(
        validating.get_opt(MANAGED).await.unwrap().is_none(),
        "nothing to configure before the widgets are served"
    );
    kactor::emulator::samples::install_widgets(&cluster.client())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while validating.get_opt(MANAGED).await.unwrap().is_none() {
        running.assert_running().await;
        assert!(tokio::time::Instant::now() < deadline, "no {MANAGED}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    running.stop().await;
}

/// The real API server calls the webhooks (the emulator does not call webhooks).
mod apiserver_only {
    use super::*;
    use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
    use kube::ResourceExt;
    use serde_json::json;

    /// These tests need a server that calls webhooks.
    fn webhooks_are_called(cluster: &TestCluster) {
        assert!(
            cluster.emulator().is_none(),
            "run on the real kube-apiserver (KACTOR_TEST_CLUSTER=apiserver): the emulator calls no webhooks"
        );
    }

    fn widget(name: &str, size: i64) -> DynamicObject {
        serde_json::from_value(kactor::emulator::samples::widget(name, size)).unwrap()
    }

    const DIFF_BASE: &str = "kopf.zalando.org/last-handled-configuration";

    /// Tries (a dry run, say) until the object it gives back carries `label`: the mutating
    /// webhook's configuration took effect.
    async fn until_mutated<F, Fut>(label: &str, mut attempt: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = DynamicObject>,
    {
        let deadline = tokio::time::Instant::now() + support::WAIT;
        while !attempt().await.labels().contains_key(label) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the mutating webhook never took effect"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// An operator with create and update handlers that record their runs in `runs`, and a
    /// mutating webhook that labels a widget (`stamped: yes`) in the write that first stores its
    /// diff-base: the operator's own.
    fn stamping(cluster: &TestCluster, runs: &Arc<std::sync::Mutex<Vec<String>>>) -> Operator {
        let (created, updated) = (runs.clone(), runs.clone());
        serving_webhooks(cluster, "echo.kactor.test")
            .on_mutate(
                WIDGETS,
                Admission::id("stamp").operations([Operation::Update]),
                |ctx: Arc<AdmissionCtx>| async move {
                    // The write that first stores a diff-base: the operator's own.
                    let had = ctx
                        .old
                        .as_ref()
                        .is_some_and(|old| old.annotations().contains_key(DIFF_BASE));
                    if !had && ctx.annotations().contains_key(DIFF_BASE) {
                        ctx.patch().label("stamped", Some("yes"));
                    }
                    Ok(())
                },
            )
            .on_create(WIDGETS, "create", move |ctx: Ctx| {
                let runs = created.clone();
                async move {
                    runs.lock().unwrap().push(format!("{} create", ctx.name()));
                    Ok(())
                }
            })
            .on_update(WIDGETS, "update", move |ctx: Ctx| {
                let runs = updated.clone();
                async move {
                    let stamped = ctx.labels().get("stamped").cloned().unwrap_or_default();
                    runs.lock()
                        .unwrap()
                        .push(format!("{} update stamped={stamped}", ctx.name()));
                    Ok(())
                }
            })
    }

    /// A mutating webhook changes the operator's own write: the write that stores the diff-base
    /// after the create handler also gets a label, in the same version. That version's event is
    /// the echo of the operator's last write (the status patch follows in the same cycle), and a
    /// cycle on a plain echo would find nothing to do, so the worker skips such echoes: but not
    /// this one, whose essence is not its diff-base. The update handler runs, as in Kopf.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_webhooks_change_to_the_operators_own_write_is_handled_as_an_update() {
        let (cluster, widgets) = cluster_with_widgets().await;
        webhooks_are_called(&cluster);
        let runs: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let running = spawn(stamping(&cluster, &runs));
        // Effective once a dry run of such a write comes back stamped.
        widgets
            .create(&PostParams::default(), &widget("probe", 1))
            .await
            .unwrap();
        let dry = PatchParams {
            dry_run: true,
            ..PatchParams::default()
        };
        let probe = Patch::Merge(json!({"metadata": {"annotations": {DIFF_BASE: null}}}));
        let stamp = Patch::Merge(json!({"metadata": {"annotations": {DIFF_BASE: "{}\n"}}}));
        until_mutated("stamped", || async {
            // Without the diff-base first (the operator may have stored it by now), then with it.
            widgets
                .patch("probe", &PatchParams::default(), &probe)
                .await
                .unwrap();
            widgets.patch("probe", &dry, &stamp).await.unwrap()
        })
        .await;

        widgets
            .create(&PostParams::default(), &widget("w1", 3))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + support::WAIT;
        let w1 = |runs: &[String]| -> Vec<String> {
            runs.iter()
                .filter(|r| r.starts_with("w1 "))
                .cloned()
                .collect()
        };
        while w1(&runs.lock().unwrap()).len() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                runs.lock().unwrap()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // Quiet afterwards: the update's own write is not stamped again (the diff-base was there).
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert_eq!(
            w1(&runs.lock().unwrap()),
            ["w1 create", "w1 update stamped=yes"]
        );
        let stored = widgets.get("w1").await.unwrap();
        assert_eq!(
            stored.labels().get("stamped").map(String::as_str),
            Some("yes")
        );
        let base: serde_json::Value =
            serde_json::from_str(&stored.annotations()[DIFF_BASE]).unwrap();
        assert_eq!(base["metadata"]["labels"]["stamped"], "yes", "{base}");
        running.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_api_server_asks_the_operators_webhooks() {
        const TEST: &str = "the_api_server_asks_the_operators_webhooks";
        let (cluster, widgets) = cluster_with_widgets().await;
        webhooks_are_called(&cluster);
        let running = spawn(admitting(&cluster));
        // The configuration takes effect once the API server has seen it: dry runs until denied.
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let deadline = tokio::time::Instant::now() + support::WAIT;
        let denial = loop {
            match widgets.create(&dry, &widget("probe", 11)).await {
                Err(kube::Error::Api(status)) => break status,
                Ok(_) => {}
                Err(other) => panic!("{other}"),
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the webhook never took effect"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        assert_eq!(denial.code, 400, "{denial:?}");
        assert!(denial.message.contains("size 11 is over 10"), "{denial:?}");
        assert!(widgets.get_opt("probe").await.unwrap().is_none());
        // The mutating configuration is written after the validating one: dry runs until an
        // allowed object comes back mutated too.
        until_mutated("admitted-by", || async {
            widgets.create(&dry, &widget("probe", 3)).await.unwrap()
        })
        .await;

        // Allowed and mutated: the stored object carries the mutation.
        let made = widgets
            .create(&PostParams::default(), &widget("w1", 3))
            .await
            .unwrap();
        assert_eq!(
            made.labels().get("admitted-by").map(String::as_str),
            Some("kactor")
        );

        // kubectl shows the warning (and the denial's message).
        if let Some(kubectl) = common::kubectl(TEST).await {
            let dir = common::Workdir::new(TEST, &cluster);
            let file = manifest("w7", 7);
            let mut apply = dir.command(&kubectl);
            apply.args(["create", "-f", &file]);
            let output = common::run(&mut apply, std::time::Duration::from_secs(60)).await;
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "{stderr}");
            assert!(stderr.contains("Warning: size 7 is large"), "{stderr}");
            let file = manifest("w12", 12);
            let mut denied = dir.command(&kubectl);
            denied.args(["create", "-f", &file]);
            let output = common::run(&mut denied, std::time::Duration::from_secs(60)).await;
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success());
            assert!(stderr.contains("size 12 is over 10"), "{stderr}");
        }
        running.stop().await;
    }

    /// A CRD served in two versions: v1 keeps `spec.size`, v2 `spec.dimensions.size`; v1 is
    /// stored.
    fn gadgets_crd() -> serde_json::Value {
        let schema = |spec: serde_json::Value| serde_json::json!({"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}});
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "gadgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                "versions": [
                    {"name": "v1", "served": true, "storage": true, "schema": schema(serde_json::json!(
                        {"type": "object", "properties": {"size": {"type": "integer"}}}))},
                    {"name": "v2", "served": true, "storage": false, "schema": schema(serde_json::json!(
                        {"type": "object", "properties": {"dimensions": {"type": "object",
                            "properties": {"size": {"type": "integer"}}}}}))},
                ],
            },
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_custom_resource_is_read_back_in_both_versions_through_the_conversion_webhook() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::api::ApiResource;
        let (cluster, _) = cluster_with_widgets().await;
        webhooks_are_called(&cluster);
        let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(gadgets_crd()).unwrap(),
        )
        .await
        .unwrap();
        let api = |version: &str| {
            let resource = ApiResource {
                group: "example.com".into(),
                version: version.into(),
                api_version: format!("example.com/{version}"),
                kind: "Gadget".into(),
                plural: "gadgets".into(),
            };
            Api::<DynamicObject>::namespaced_with(cluster.client(), "default", &resource)
        };
        // Served before the operator starts: it resolves the resources it converts at startup.
        kactor::emulator::samples::until_served(&api("v1"))
            .await
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let operator = admitting(&cluster)
            .convert("gadgets.example.com", "v1", "v2", v1_to_v2)
            .convert("gadgets.example.com", "v2", "v1", v2_to_v1);
        let mut task = tokio::spawn(operator.run_until(async {
            let _ = stopped.await;
        }));
        // Until the CRD points at the webhook (the operator does it at startup).
        let deadline = tokio::time::Instant::now() + support::WAIT;
        loop {
            let crd = serde_json::to_value(crds.get("gadgets.example.com").await.unwrap()).unwrap();
            if crd["spec"]["conversion"]["strategy"] == "Webhook" {
                break;
            }
            if task.is_finished() {
                panic!("the operator ended: {:?}", (&mut task).await);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the CRD is not pointed at the webhook"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let old: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Gadget",
            "metadata": {"name": "g1"}, "spec": {"size": 3},
        }))
        .unwrap();
        api("v1")
            .create(&PostParams::default(), &old)
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + support::WAIT;
        loop {
            let read = api("v2").get("g1").await.unwrap();
            if read.data["spec"] == serde_json::json!({"dimensions": {"size": 3}}) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not converted: {:?}",
                read.data
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // The other way: written in v2 (stored as v1), read back in both.
        let new: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v2", "kind": "Gadget",
            "metadata": {"name": "g2"}, "spec": {"dimensions": {"size": 5}},
        }))
        .unwrap();
        api("v2")
            .create(&PostParams::default(), &new)
            .await
            .unwrap();
        assert_eq!(
            api("v1").get("g2").await.unwrap().data["spec"],
            serde_json::json!({"size": 5})
        );
        assert_eq!(
            api("v2").get("g2").await.unwrap().data["spec"],
            serde_json::json!({"dimensions": {"size": 5}})
        );
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    }

    fn v1_to_v2(mut gadget: serde_json::Value) -> Result<serde_json::Value, HandlerError> {
        let size = gadget["spec"]["size"].take();
        gadget["spec"] = serde_json::json!({"dimensions": {"size": size}});
        Ok(gadget)
    }

    fn v2_to_v1(mut gadget: serde_json::Value) -> Result<serde_json::Value, HandlerError> {
        let size = gadget["spec"]["dimensions"]["size"].take();
        gadget["spec"] = serde_json::json!({"size": size});
        Ok(gadget)
    }

    /// A widget's manifest in a file of its own, for kubectl.
    fn manifest(name: &str, size: i64) -> String {
        let path = std::env::temp_dir().join(format!(
            "kactor-admission-{}-{name}.json",
            std::process::id()
        ));
        let widget = kactor::emulator::samples::widget(name, size);
        std::fs::write(&path, widget.to_string()).unwrap();
        path.to_string_lossy().into_owned()
    }
}
