//! The memcached operator as the Operator SDK quickstart writes it: one reconcile handler, level-based.
//!
//! The quickstart's controller, concept by concept:
//!
//! | controller-runtime                                        | here                                          |
//! |-----------------------------------------------------------|-----------------------------------------------|
//! | `Watches(&Memcached{})`, `Reconcile(req)`                 | `on_reconcile(memcacheds, .., reconcile)`     |
//! | `Owns(&appsv1.Deployment{})` (`EnqueueRequestForOwner`)   | `Reconcile::owns("deployments.v1.apps")`      |
//! | pods mapped to their Memcached (`EnqueueRequestsFromMapFunc`) | `.watches("pods", memcached_of_pod)`      |
//! | a metadata-only watch of pods (`builder.OnlyMetadata`)    | `Operator::cache_metadata_only("pods")`      |
//! | `WithEventFilter(predicate.GenerationChangedPredicate{})` | `.predicate(Predicate::generation_changed())` |
//! | `r.Get(ctx, req.NamespacedName, &found)` from the cache   | `ctx.cache("deployments.v1.apps")?.get(..)`   |
//! | `controllerutil.SetControllerReference`                   | `append_owner_reference` (controller: true)   |
//! | `meta.SetStatusCondition`                                 | `kactor::conditions::Conditions`              |
//! | `r.Status().Update(ctx, memcached)`                       | `ctx.patch().status(..)`, after the handler   |
//! | `ctrl.Result{RequeueAfter: time.Minute}`                  | `Action::requeue(Duration::from_secs(60))`    |
//! | `return ctrl.Result{}, err` (backoff 5 ms .. 1000 s)      | `Err(..)` (the same backoff)                  |
//! | the memcached finalizer and `doFinalizerOperations`       | `.finalizer()`, and the deletion branch       |
//!
//! A Deployment deleted or scaled by hand is put back at once (its event goes to its owner's
//! worker); `status.nodes` follows the pods as they come and go; nothing else is written to the
//! `Memcached` (no progress annotations: the handler works from what is, not from what happened).

use k8s_openapi::api::apps::v1::Deployment;
use kactor::conditions::{ConditionStatus, Conditions};
use kactor::prelude::*;
use kactor::prometheus::IntCounterVec;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::Value;

use super::{
    apply_deployment, base, delete_deployment, deployments_of, memcached_of, Memcached, CR_LABEL,
};

/// The reconcile handler's id: `kactor_handler_runs_total{handler="memcached"}` counts its runs.
pub const ID: &str = "memcached";

/// The condition the quickstart reports.
const AVAILABLE: &str = "Available";

/// The operator: one reconcile handler for `Memcached` objects, the Deployments they own, and the
/// pods labelled with their name.
///
/// It fails only if the metric cannot be registered (a name clash on the operator's registry).
pub fn operator() -> kactor::Result<Operator> {
    let (operator, changes) = base()?;
    let options = Reconcile::id(ID)
        .owns("deployments.v1.apps")
        .watches("pods", memcached_of_pod)
        // Status updates (ours included) do not trigger it; spec changes, deletions, children and
        // pods do.
        .predicate(Predicate::generation_changed())
        .finalizer();
    Ok(operator
        // `status.nodes` needs the pods' names, labels and deletion marks: their metadata. The
        // pods' cache keeps nothing else, and the API server sends nothing else.
        .cache_metadata_only("pods")
        .on_reconcile(Selector::of::<Memcached>(), options, move |ctx: Ctx| {
            reconcile(ctx, changes.clone())
        }))
}

/// The `Memcached` a pod belongs to, by the label its Deployment's template gives it.
fn memcached_of_pod(pod: &DynamicObject) -> Vec<(Option<String>, String)> {
    pod.labels()
        .get(CR_LABEL)
        .map(|name| vec![(pod.namespace(), name.clone())])
        .unwrap_or_default()
}

/// The quickstart's `Reconcile`: make the Deployment match the `Memcached`, then report.
async fn reconcile(ctx: Ctx, changes: IntCounterVec) -> Result<Action, HandlerError> {
    let memcached = memcached_of(&ctx)?;
    let name = memcached.name_any();
    let mut conditions = Conditions::of(&ctx.body)?
        .observed_generation(ctx.meta().generation)
        .at(jiff::Timestamp::now());
    if ctx.meta().deletion_timestamp.is_some() {
        // The quickstart's `doFinalizerOperationsForMemcached`: the cleanup before the Memcached
        // goes. The Deployment is owned, so the garbage collector would delete it afterwards; this
        // deletes it now, and says so. kactor lets the finalizer go once this returns Ok.
        delete_deployment(ctx, changes).await?;
        return Ok(Action::await_change());
    }
    let size = memcached.spec.size;
    let deployments = ctx.cache("deployments.v1.apps")?;
    let found = deployments.get(ctx.namespace(), &name);
    let replicas = found
        .as_ref()
        .map(|d| d.data["spec"]["replicas"].as_i64().unwrap_or(1));
    match replicas {
        None => {
            ctx.logger().info(format!(
                "Creating the Deployment {name} with {size} replicas."
            ));
            let deployment = apply_deployment(ctx.client(), &memcached).await?;
            changes.with_label_values(&["applied"]).inc();
            // Read our own write: the next run finds it even before the watch brings it.
            deployments.remember(dynamic(&deployment)?);
        }
        Some(replicas) if replicas != i64::from(size) => {
            ctx.logger().info(format!(
                "The Deployment {name} has {replicas} replicas instead of {size}; scaling it."
            ));
            let patch = json!({"spec": {"replicas": size}});
            let scaled = deployments_of(ctx.client(), &memcached)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            match scaled {
                Ok(deployment) => {
                    changes.with_label_values(&["scaled"]).inc();
                    deployments.remember(dynamic(&deployment)?);
                }
                Err(error) => {
                    conditions.set(
                        AVAILABLE,
                        ConditionStatus::False,
                        "Reconciling",
                        &format!("Failed to update the size of the Deployment {name}: {error}"),
                    )?;
                    report(&ctx, &conditions, None);
                    // Retried with the backoff (5 ms, doubling).
                    return Err(error.into());
                }
            }
        }
        Some(_) => {}
    }
    conditions.set(
        AVAILABLE,
        ConditionStatus::True,
        "Reconciling",
        &format!(
            "Deployment for custom resource ({name}) with {size} replicas created successfully"
        ),
    )?;
    let mut nodes: Vec<String> = ctx
        .cache("pods")?
        .matching(ctx.namespace(), &[(CR_LABEL, name.as_str())])
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .map(|pod| pod.name_any())
        .collect();
    nodes.sort();
    report(&ctx, &conditions, Some(nodes));
    Ok(Action::await_change())
}

/// Writes what changed of the status (conditions, nodes) in the cycle's patch.
fn report(ctx: &Ctx, conditions: &Conditions, nodes: Option<Vec<String>>) {
    if conditions.is_changed() {
        ctx.patch().status("conditions", conditions.to_value());
    }
    if let Some(nodes) = nodes {
        let nodes = json!(nodes);
        if ctx.status().get("nodes") != Some(&nodes) {
            ctx.patch().status("nodes", nodes);
        }
    }
}

/// A typed object as the cache keeps it.
fn dynamic(deployment: &Deployment) -> Result<DynamicObject, HandlerError> {
    let value: Value = serde_json::to_value(deployment)?;
    Ok(serde_json::from_value(value)?)
}
