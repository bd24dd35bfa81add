//! The memcached operator of the Operator SDK quickstart, the kactor way.
//!
//! A `Memcached` (`cache.example.com/v1alpha1`) asks for `spec.size` memcached pods; the operator
//! keeps a Deployment of that many replicas, named after the `Memcached` and owned by it:
//!
//! | when                                   | handler             | what it does                           |
//! |----------------------------------------|---------------------|----------------------------------------|
//! | a `Memcached` appears                  | `create_deployment` | applies the Deployment                 |
//! | the operator starts and finds one      | `resume_deployment` | applies it again (it may have drifted) |
//! | `spec.size` changes                    | `scale/spec.size`   | patches the Deployment's replicas      |
//! | every 30 s, after 10 s without changes | `check_drift`       | repairs drift, fills `status.nodes`    |
//! | the `Memcached` is deleted             | `delete_deployment` | deletes the Deployment                 |
//!
//! Where controller-runtime has one `Reconcile` that works out what happened, kactor calls the
//! handler for what happened, and keeps on the object (Kopf's way) which handlers have succeeded: a
//! restarted operator does not redo what was done.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kactor::hierarchies::{append_owner_reference, Owner};
use kactor::prelude::*;
use kactor::prometheus::{IntCounterVec, Opts};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The same operator written as one actor per `Memcached`.
#[path = "actor.rs"]
pub mod actor;

/// The same operator written as the Operator SDK quickstart writes it: one reconcile handler.
#[path = "reconcile.rs"]
pub mod reconcile;

/// The image of the memcached containers, as in the quickstart.
pub const IMAGE: &str = "memcached:1.6-alpine";

/// Who the operator's server-side applies are from: the API server records which fields this
/// manager owns (`kubectl get deployment -o yaml --show-managed-fields`).
pub const FIELD_MANAGER: &str = "memcached-operator";

/// The label that ties a Deployment and its pods to their `Memcached`.
pub const CR_LABEL: &str = "memcached_cr";

/// How soon a failed API call is tried again. A handler that fails with another error is retried
/// after kactor's default backoff (60 s, as in Kopf), which is long for a busy API server.
const RETRY_DELAY: Duration = Duration::from_secs(10);

// The CRD comes from these types: `Memcached::crd()` (`kube::CustomResourceExt`). Their doc
// comments become its descriptions, which `kubectl explain memcached.spec` shows.

/// The desired state of a Memcached.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cache.example.com",
    version = "v1alpha1",
    kind = "Memcached",
    doc = "A memcached cluster: a Deployment of spec.size memcached pods, kept by the memcached operator.",
    namespaced,
    status = "MemcachedStatus",
    shortname = "mc",
    printcolumn(name = "Size", type_ = "integer", json_path = ".spec.size"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct MemcachedSpec {
    /// How many memcached pods to run.
    #[schemars(range(min = 0))]
    pub size: i32,
}

/// The observed state of a Memcached. Besides nodes, the operator keeps each handler's result
/// here, under the handler's id.
//
// kactor stores handler results under `status.<handler id>`, as Kopf does: the schema must keep
// fields it does not name (`x-kubernetes-preserve-unknown-fields`), or the API server drops them.
// This type reads `nodes` only; `ctx.status()` has all of it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MemcachedStatus {
    /// The names of the memcached pods.
    #[serde(default)]
    pub nodes: Vec<String>,
}

/// The drift check's schedule: every 30 s, once the `Memcached` has not changed for 10 s (so it
/// never competes with the handlers reacting to a change).
pub fn drift_check() -> Timer {
    Timer::every(Duration::from_secs(30)).idle(Duration::from_secs(10))
}

/// The operator: its handlers for `Memcached` objects, a probe, and a metric. Tests pass a fast
/// `drift_check`; `main` passes [`drift_check()`].
///
/// It fails only if the metric cannot be registered (a name clash on the operator's registry).
pub fn operator(drift_check: Timer) -> kactor::Result<Operator> {
    let memcacheds = Selector::of::<Memcached>();
    let (operator, changes) = base()?;
    // Each handler owns a handle on the counters (an `Arc` inside: cloning is cheap).
    Ok(operator
        .on_create(memcacheds.clone(), "create_deployment", {
            let changes = changes.clone();
            move |ctx: Ctx| ensure_deployment(ctx, changes.clone())
        })
        .on_resume(memcacheds.clone(), "resume_deployment", {
            let changes = changes.clone();
            move |ctx: Ctx| ensure_deployment(ctx, changes.clone())
        })
        // A new `Memcached` has no old size: its Deployment is the create handler's job.
        .on_field(
            memcacheds.clone(),
            "spec.size",
            On::id("scale").old(ValueFilter::Present),
            {
                let changes = changes.clone();
                move |ctx: Ctx| scale(ctx, changes.clone())
            },
        )
        .timer(memcacheds.clone(), "check_drift", drift_check, {
            let changes = changes.clone();
            move |ctx: Ctx| check_drift(ctx, changes.clone())
        })
        // A delete handler holds kactor's finalizer on every `Memcached`, so it runs even if the
        // operator was down when the object was deleted.
        .on_delete(memcacheds, "delete_deployment", {
            let changes = changes.clone();
            move |ctx: Ctx| delete_deployment(ctx, changes.clone())
        })
        .on_probe("deployment_changes", probe(changes)))
}

/// What both ways of writing the operator share: the CRD and the permissions for the manifests,
/// and the metric of the changes made to Deployments.
///
/// It fails only if the metric cannot be registered (a name clash on the operator's registry).
/// The largest `spec.size` the validating webhook admits: a bigger cache is a typo more often
/// than a plan (the CRD's schema already refuses a negative one).
pub const MAX_SIZE: i64 = 16;

/// The operator, validating every `Memcached`'s size before it is stored: a webhook of its own
/// (`on_validate`), served on `host:port` (`--webhook-host`; the API server must reach it there,
/// with the certificate kactor makes for `host` unless you give one), its configuration kept by
/// the operator (`memcached.cache.example.com`). The same for each way the operator is written.
pub fn validating(operator: Operator, host: &str, port: u16) -> Operator {
    use kactor::admission::{Admission, AdmissionCtx, AdmissionError, Operation, WebhookServer};
    let host = host.to_string();
    operator
        .settings(move |s| {
            s.admission.server = Some(WebhookServer {
                host: host.clone(),
                port,
                ..WebhookServer::default()
            });
            s.admission.managed = Some("memcached.cache.example.com".into());
        })
        .on_validate(
            Selector::of::<Memcached>(),
            Admission::id("validate-size").operations([Operation::Create, Operation::Update]),
            |ctx: std::sync::Arc<AdmissionCtx>| async move {
                let size = ctx.spec()["size"].as_i64().unwrap_or_default();
                if size > MAX_SIZE {
                    let message = format!("spec.size {size} is more than {MAX_SIZE} pods");
                    return Err(AdmissionError::deny(message).code(422));
                }
                Ok(())
            },
        )
}

fn base() -> kactor::Result<(Operator, IntCounterVec)> {
    let operator = Operator::new();
    // Served at /metrics with kactor's own metrics. Labels name kinds of change, never objects.
    let changes = IntCounterVec::new(
        Opts::new(
            "memcached_deployment_changes_total",
            "Changes the memcached operator made to Deployments, by kind of change",
        ),
        &["change"],
    )?;
    operator
        .metrics()
        .registry()
        .register(Box::new(changes.clone()))?;
    let operator = operator
        // `memcached crds` prints it; `rbac generate` reads its scope and status subresource.
        .crd(Memcached::crd())
        // What the handlers do with their own client, for `rbac generate`.
        .permission(
            "apps",
            "deployments",
            &["get", "create", "patch", "delete"],
            "each Memcached owns a Deployment: created (server-side apply), scaled, checked, deleted",
        )
        .permission("", "pods", &["list"], "status.nodes lists the memcached pods")
        // The reconcile version (`--reconcile`) caches the Deployments and pods it reads: kactor
        // derives their list and watch from its handler, but the manifests are printed from this
        // version and must serve all three.
        .permission(
            "apps",
            "deployments",
            &["list", "watch"],
            "--reconcile: the reconcile handler owns the Deployments (cached: listed and watched)",
        )
        .permission(
            "",
            "pods",
            &["watch"],
            "--reconcile: the reconcile handler watches the pods (cached: listed and watched)",
        );
    Ok((operator, changes))
}

/// The probe: its result is part of what /healthz answers:
/// `{"deployment_changes": {"applied": 1, ...}}`.
fn probe(
    changes: IntCounterVec,
) -> impl Fn(ActivityCtx) -> std::future::Ready<Result<BTreeMap<&'static str, u64>, HandlerError>>
       + Send
       + Sync
       + 'static {
    move |_ctx: ActivityCtx| {
        let counts = CHANGES
            .into_iter()
            .map(|change| (change, changes.with_label_values(&[change]).get()))
            .collect();
        std::future::ready(Ok(counts))
    }
}

/// The kinds of change counted in `memcached_deployment_changes_total{change}`.
const CHANGES: [&str; 4] = ["applied", "scaled", "repaired", "deleted"];

/// Create and resume: makes the Deployment what the `Memcached` asks for, creating it if missing.
///
/// Server-side apply is "create or update" in one idempotent call: running it twice, or on a
/// Deployment that exists already, is no error (no 409 to handle).
async fn ensure_deployment(ctx: Ctx, changes: IntCounterVec) -> Result<Value, HandlerError> {
    let memcached = memcached_of(&ctx)?;
    let deployment = apply_deployment(ctx.client(), &memcached).await?;
    changes.with_label_values(&["applied"]).inc();
    let message = format!(
        "Deployment {} has {} replicas of {IMAGE}.",
        deployment.name_any(),
        memcached.spec.size
    );
    ctx.logger().info(&message);
    ctx.info("Deployment", &message); // a Kubernetes Event: `kubectl describe memcached ...`
    Ok(json!({
        "deployment": deployment.name_any(),
        "replicas": memcached.spec.size,
    }))
}

/// `spec.size` changed: scales the Deployment. Returns `{"replicas": N}`, stored by kactor in
/// `status["scale/spec.size"]`.
async fn scale(ctx: Ctx, changes: IntCounterVec) -> Result<Value, HandlerError> {
    let memcached = memcached_of(&ctx)?;
    let size = memcached.spec.size;
    scale_deployment(ctx.client(), &memcached).await?;
    changes.with_label_values(&["scaled"]).inc();
    let old = ctx.old().map_or_else(|| "?".to_string(), Value::to_string);
    let message = format!("Scaled the Deployment from {old} to {size} replicas.");
    ctx.logger().info(&message);
    ctx.info("Scaled", &message);
    Ok(json!({"replicas": size}))
}

/// Gives the Deployment `spec.size` replicas, making it again if someone deleted it.
async fn scale_deployment(client: kube::Client, memcached: &Memcached) -> Result<(), HandlerError> {
    // A merge patch changes only what it names: the rest of the Deployment stays as it is.
    let patch = json!({"spec": {"replicas": memcached.spec.size}});
    match deployments_of(client.clone(), memcached)
        .patch(
            &memcached.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Someone deleted it: make it again, at the new size.
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            apply_deployment(client, memcached).await.map(|_| ())
        }
        Err(error) => Err(retry("cannot scale the Deployment", error)),
    }
}

/// The `Memcached` is being deleted: deletes its Deployment before kactor releases the finalizer.
///
/// The owner reference alone would have the garbage collector delete the Deployment once the
/// `Memcached` is gone. A delete handler is where cleanup goes that no owner reference can do
/// (anything outside the cluster); here it makes the deletion explicit, and logged.
async fn delete_deployment(ctx: Ctx, changes: IntCounterVec) -> Result<(), HandlerError> {
    let memcached = memcached_of(&ctx)?;
    let name = memcached.name_any();
    // Background: the Deployment goes now, its ReplicaSets and pods right after.
    match deployments_of(ctx.client(), &memcached)
        .delete(&name, &DeleteParams::background())
        .await
    {
        Ok(_) => {
            changes.with_label_values(&["deleted"]).inc();
            ctx.logger()
                .info(format!("Deleted the Deployment {name}: cleanup done."));
        }
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            ctx.logger().info(format!(
                "The Deployment {name} is gone already: cleanup done."
            ));
        }
        Err(error) => return Err(retry("cannot delete the Deployment", error)),
    }
    Ok(())
}

/// The drift check: what the handlers made may have been changed by others since (a deleted
/// Deployment, replicas scaled by hand); this puts it back, and lists the pods in `status.nodes`.
///
/// A timer's context holds the newest body of its object: the size checked is the current one. It
/// runs only after 10 s without changes, so it never fights the handlers reacting to a change.
async fn check_drift(ctx: Ctx, changes: IntCounterVec) -> Result<(), HandlerError> {
    if ctx.meta().deletion_timestamp.is_some() {
        return Ok(()); // the delete handler's turn
    }
    let memcached = memcached_of(&ctx)?;
    let name = memcached.name_any();
    let size = memcached.spec.size;
    let deployments = deployments_of(ctx.client(), &memcached);
    let current = deployments
        .get_opt(&name)
        .await
        .map_err(|error| retry("cannot read the Deployment", error))?;
    let replicas = current
        .as_ref()
        .map(|d| d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1));
    match replicas {
        None => {
            ctx.logger().warn(format!(
                "Drift: the Deployment {name} is missing; recreating it."
            ));
            apply_deployment(ctx.client(), &memcached).await?;
            changes.with_label_values(&["repaired"]).inc();
        }
        Some(replicas) if replicas != size => {
            ctx.logger().warn(format!(
                "Drift: the Deployment {name} has {replicas} replicas instead of {size}; scaling it back."
            ));
            let patch = json!({"spec": {"replicas": size}});
            deployments
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|error| retry("cannot scale the Deployment", error))?;
            changes.with_label_values(&["repaired"]).inc();
        }
        Some(_) => {}
    }
    let nodes = nodes_of(ctx.client(), &memcached).await?;
    if memcached.status.map(|s| s.nodes) != Some(nodes.clone()) {
        // Sent by kactor after the call, to the status subresource.
        ctx.patch().status("nodes", json!(nodes));
    }
    Ok(())
}

/// The names of the `Memcached`'s pods, sorted: the Deployment's (through its ReplicaSet), found
/// by their label.
async fn nodes_of(
    client: kube::Client,
    memcached: &Memcached,
) -> Result<Vec<String>, HandlerError> {
    let pods: Api<Pod> = Api::namespaced(client, &namespace_of(memcached));
    let listed = pods
        .list(&ListParams::default().labels(&format!("{CR_LABEL}={}", memcached.name_any())))
        .await
        .map_err(|error| retry("cannot list the pods", error))?;
    let mut nodes: Vec<String> = listed.items.iter().map(|pod| pod.name_any()).collect();
    nodes.sort();
    Ok(nodes)
}

/// Applies the Deployment for this `Memcached` (creates it, or makes it match).
async fn apply_deployment(
    client: kube::Client,
    memcached: &Memcached,
) -> Result<Deployment, HandlerError> {
    let deployment = desired_deployment(memcached)?;
    // `force`: this operator owns these fields, even if someone else changed them since.
    let params = PatchParams::apply(FIELD_MANAGER).force();
    deployments_of(client, memcached)
        .patch(&memcached.name_any(), &params, &Patch::Apply(&deployment))
        .await
        .map_err(|error| retry("cannot apply the Deployment", error))
}

/// The Deployment a `Memcached` asks for: `size` replicas of memcached, labelled with the
/// `Memcached`'s name, and owned by it (`kubectl delete memcached` takes it along, and
/// `kubectl get deployment -o yaml` shows whose it is).
pub fn desired_deployment(memcached: &Memcached) -> Result<Deployment, HandlerError> {
    let name = memcached.name_any();
    let labels = BTreeMap::from([
        ("app".to_string(), "memcached".to_string()),
        (CR_LABEL.to_string(), name.clone()),
    ]);
    let mut deployment = Deployment {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace_of(memcached)),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(memcached.spec.size),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "memcached".to_string(),
                        image: Some(IMAGE.to_string()),
                        command: Some(
                            ["memcached", "-m=64", "-o", "modern", "-v"]
                                .map(String::from)
                                .to_vec(),
                        ),
                        ports: Some(vec![ContainerPort {
                            container_port: 11211,
                            name: Some("memcached".to_string()),
                            ..ContainerPort::default()
                        }]),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    // Operator SDK's SetControllerReference, Kopf's append_owner_reference: controller=true (the
    // Memcached manages it), blockOwnerDeletion=true (with foreground deletion, the Memcached goes
    // only after it).
    append_owner_reference(&mut deployment, &Owner::of_resource(memcached)?)?;
    Ok(deployment)
}

/// The handler's object as a typed `Memcached`. The API server validated it against the CRD's
/// schema, so this fails only for a spec that is invalid for good: no use retrying.
fn memcached_of(ctx: &Ctx) -> Result<Memcached, HandlerError> {
    ctx.object::<Memcached>()
        .map_err(|error| HandlerError::permanent(format!("not a valid Memcached: {error}")))
}

/// The Deployments of the `Memcached`'s namespace.
fn deployments_of(client: kube::Client, memcached: &Memcached) -> Api<Deployment> {
    Api::namespaced(client, &namespace_of(memcached))
}

/// A namespaced object read from the API server always has its namespace.
fn namespace_of(memcached: &Memcached) -> String {
    memcached
        .namespace()
        .unwrap_or_else(|| "default".to_string())
}

/// An API error, retried in [`RETRY_DELAY`]: the API server may be busy, or the Deployment being
/// changed by someone else; the next attempt starts from what is there then.
fn retry(what: &str, error: kube::Error) -> HandlerError {
    HandlerError::temporary(format!("{what}: {error}"), RETRY_DELAY)
}
