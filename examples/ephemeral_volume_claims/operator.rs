//! Kopf's walkthrough operator (docs.kopf.dev, "Walkthrough"), the kactor way.
//!
//! An `EphemeralVolumeClaim` (`kopf.dev/v1`, short name `evc`) asks for a volume of `spec.size`;
//! the operator keeps a `PersistentVolumeClaim` of that size, named after the EVC, labelled as it
//! is, and owned by it:
//!
//! | when                        | handler                   | what it does                            |
//! |-----------------------------|---------------------------|-----------------------------------------|
//! | an EVC appears              | `create_fn`               | creates the PVC                         |
//! | `spec.size` changes         | `update_fn/spec.size`     | patches the PVC's requested storage     |
//! | `metadata.labels` change    | `relabel/metadata.labels` | sets and removes the PVC's labels       |
//!
//! As in the walkthrough's "Cascaded deletion" step, nothing deletes the PVC explicitly: its owner
//! reference has Kubernetes' garbage collector delete it once the EVC is gone. So there is no
//! delete handler, hence no finalizer: deleting an EVC never waits for the operator. (Cleanup that
//! must happen, outside Kubernetes for instance, belongs in an `on_delete` handler; that one holds
//! kactor's finalizer, so it runs even if the operator was down at the time. An `optional()` one
//! holds none, and runs only if some other handler's finalizer keeps the object long enough.)

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kactor::hierarchies::{adopt, Adoption, Owner};
use kactor::prelude::*;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How soon a failed API call is tried again. A handler that fails with another error is retried
/// after kactor's default backoff (60 s, as in Kopf), which is long for a busy API server.
const RETRY_DELAY: Duration = Duration::from_secs(10);

/// The desired state of an EphemeralVolumeClaim.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kopf.dev",
    version = "v1",
    kind = "EphemeralVolumeClaim",
    plural = "ephemeralvolumeclaims",
    doc = "An ephemeral volume claim: a PersistentVolumeClaim of spec.size, deleted with it.",
    namespaced,
    status = "EphemeralVolumeClaimStatus",
    shortname = "evc",
    printcolumn(name = "Size", type_ = "string", json_path = ".spec.size"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct EphemeralVolumeClaimSpec {
    /// The size of the volume, a Kubernetes quantity such as `1Gi` or `500G`.
    #[serde(default = "default_size")]
    pub size: String,
}

/// The size when `spec.size` is not given, as in the walkthrough's examples.
pub fn default_size() -> String {
    "1Gi".to_string()
}

/// The observed state of an EVC: the operator keeps each handler's result here, under the
/// handler's id (`status.create_fn.pvc-name`).
//
// The schema must keep fields it does not name (`x-kubernetes-preserve-unknown-fields`), or the
// API server drops the handlers' results.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct EphemeralVolumeClaimStatus {}

/// The operator: its handlers for `EphemeralVolumeClaim` objects.
pub fn operator() -> Operator {
    let evcs = Selector::of::<EphemeralVolumeClaim>();
    Operator::new()
        // `ephemeral_volume_claims crds` prints it; `rbac generate` reads its scope.
        .crd(EphemeralVolumeClaim::crd())
        // What the handlers do with their own client, for `rbac generate`.
        .permission(
            "",
            "persistentvolumeclaims",
            &["get", "create", "patch"],
            "each EphemeralVolumeClaim owns a PersistentVolumeClaim: created, resized, relabelled",
        )
        .on_create(evcs.clone(), "create_fn", create_fn)
        // A new EVC's PVC is made with its size and labels: the field handlers are for changes.
        .on_field(
            evcs.clone(),
            "spec.size",
            On::id("update_fn").when(not_creation),
            update_fn,
        )
        .on_field(
            evcs.clone(),
            "metadata.labels",
            On::id("relabel").when(not_creation),
            relabel,
        )
}

/// Whether the change is not the EVC's creation (which `create_fn` handles whole).
fn not_creation(ctx: &Ctx) -> bool {
    ctx.reason() != Some(Reason::Create)
}

/// Creates the PVC; returns `{"pvc-name": NAME}`, stored by kactor in `status.create_fn`.
async fn create_fn(ctx: Ctx) -> Result<Value, HandlerError> {
    let evc = evc_of(&ctx)?;
    let name = create_pvc(&ctx, &evc).await?;
    let message = format!("PVC child {name} is created, of {}.", evc.spec.size);
    ctx.logger().info(&message);
    ctx.info("Created", &message); // a Kubernetes Event: `kubectl describe evc ...`
    Ok(json!({"pvc-name": name}))
}

/// `spec.size` changed: patches the PVC's requested storage (recreating a PVC deleted by hand).
/// Returns the new size, stored in `status["update_fn/spec.size"]`.
async fn update_fn(ctx: Ctx) -> Result<Value, HandlerError> {
    let evc = evc_of(&ctx)?;
    let size = evc.spec.size.clone();
    let name = pvc_name(&ctx);
    let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
    match patch_pvc(&ctx, &name, &patch).await {
        Ok(()) => {}
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            create_pvc(&ctx, &evc).await?;
        }
        Err(error) => return Err(api_error("cannot resize the PVC", error)),
    }
    let old = ctx.old().map_or_else(|| "?".to_string(), Value::to_string);
    let message = format!("PVC child {name} is resized from {old} to {size:?}.");
    ctx.logger().info(&message);
    ctx.info("Resized", &message);
    Ok(json!(size))
}

/// `metadata.labels` changed: sets the added and changed labels on the PVC, and removes the
/// removed ones (null in a merge patch). Labels put on the PVC by others are left alone.
async fn relabel(ctx: Ctx) -> Result<(), HandlerError> {
    // For a field handler, old and new are the field's values: the label maps (None: no labels).
    let labels = labels_patch(ctx.old(), ctx.new_value());
    let name = pvc_name(&ctx);
    patch_pvc(&ctx, &name, &json!({"metadata": {"labels": labels}}))
        .await
        .map_err(|error| api_error("cannot relabel the PVC", error))?;
    ctx.logger()
        .info(format!("PVC child {name} is relabelled: {labels}."));
    Ok(())
}

/// The labels part of a merge patch from `old` labels to `new` ones: each removed label null, each
/// added or changed one its value (the walkthrough's `{field[0]: new for ... in diff}`).
pub fn labels_patch(old: Option<&Value>, new: Option<&Value>) -> Value {
    let keys = |labels: Option<&Value>| {
        labels
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (old, new) = (keys(old), keys(new));
    let mut patch: Map<String, Value> = old
        .keys()
        .filter(|key| !new.contains_key(*key))
        .map(|key| (key.clone(), Value::Null))
        .collect();
    for (key, value) in new {
        if old.get(&key) != Some(&value) {
            patch.insert(key, value);
        }
    }
    Value::Object(patch)
}

/// Creates the PVC for this EVC; one that exists already is fine (409: an earlier attempt made
/// it). Returns its name.
async fn create_pvc(ctx: &Ctx, evc: &EphemeralVolumeClaim) -> Result<String, HandlerError> {
    let pvc = desired_pvc(evc)?;
    let name = pvc.name_any();
    match pvcs_of(ctx).create(&PostParams::default(), &pvc).await {
        Ok(_) => Ok(name),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(name),
        Err(error) => Err(api_error("cannot create the PVC", error)),
    }
}

/// The PVC an EVC asks for: `ReadWriteOnce`, `storage: <size>`, adopted as Kopf's `kopf.adopt()`
/// does it: owned by the EVC (controller, blocking its foreground deletion), in its namespace, with
/// its labels, and here named exactly as it (`strict`).
pub fn desired_pvc(evc: &EphemeralVolumeClaim) -> Result<PersistentVolumeClaim, HandlerError> {
    let mut pvc = PersistentVolumeClaim {
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(evc.spec.size.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    adopt(
        &mut pvc,
        &Owner::of_resource(evc)?,
        &Adoption::default().strict(),
    )?;
    Ok(pvc)
}

/// A merge patch of the PVC: it changes only what it names.
async fn patch_pvc(ctx: &Ctx, name: &str, patch: &Value) -> kube::Result<()> {
    pvcs_of(ctx)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// The PVC's name, as `create_fn` returned it (the walkthrough's `status['create_fn']['pvc-name']`);
/// the EVC's own name before that result is stored.
fn pvc_name(ctx: &Ctx) -> String {
    ctx.status()["create_fn"]["pvc-name"]
        .as_str()
        .unwrap_or(ctx.name())
        .to_string()
}

/// The handler's object as a typed EVC. The API server validated it against the CRD's schema, so
/// this fails only for a spec that is invalid for good: no use retrying.
fn evc_of(ctx: &Ctx) -> Result<EphemeralVolumeClaim, HandlerError> {
    ctx.object::<EphemeralVolumeClaim>()
        .map_err(|error| HandlerError::permanent(format!("not a valid EVC: {error}")))
}

/// The PVCs of the EVC's namespace.
fn pvcs_of(ctx: &Ctx) -> Api<PersistentVolumeClaim> {
    Api::namespaced(ctx.client(), ctx.namespace().unwrap_or("default"))
}

/// An API error: a PVC the API server finds invalid (a `spec.size` that is no quantity) fails for
/// good; anything else is retried in [`RETRY_DELAY`].
fn api_error(what: &str, error: kube::Error) -> HandlerError {
    match &error {
        kube::Error::Api(status) if status.is_invalid() => {
            HandlerError::permanent(format!("{what}: {error}"))
        }
        _ => HandlerError::temporary(format!("{what}: {error}"), RETRY_DELAY),
    }
}
