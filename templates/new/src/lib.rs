//! The {{name}} operator: a `{{Kind}}` ({{group}}/v1) gets a greeting in its status when it is
//! created, another when its message changes, and a farewell in the log when it is deleted.
//!
//! Change the spec, the status and the handlers to what your operator does.

{{imports}}use kactor::prelude::*;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired state of a `{{Kind}}`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "{{group}}", version = "v1", kind = "{{Kind}}", namespaced)]
#[kube(status = "{{Kind}}Status")]
#[kube(printcolumn = r#"{"name": "Message", "type": "string", "jsonPath": ".spec.message"}"#)]
pub struct {{Kind}}Spec {
    /// What the operator answers to.
    pub message: String,
}

/// The observed state of a `{{Kind}}`: kactor keeps each handler's result here, under the handler's
/// id (`status["{{create_id}}"]`, `status["{{update_id}}"]`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct {{Kind}}Status {}

/// The operator: its CRD (installed by `--emulator`, printed by `crds` and `manifests`) and its
/// handlers.
pub fn operator() -> Operator {
{{operator}}