//! The smallest operator: a `Greeting` (`example.com/v1`) gets a hello in its status. What
//! `docs/getting-started.md` builds first, runnable without a cluster:
//!
//! ```sh
//! cargo run --example hello -- --emulator     # on kactor's embedded API server; prints a kubeconfig
//! cargo run --example hello -- crds | kubectl apply -f -   # then, against a cluster:
//! cargo run --example hello -- -A
//! ```

use kactor::prelude::*;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whom to greet.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Greeting", namespaced)]
#[kube(status = "GreetingStatus", shortname = "greet")]
pub struct GreetingSpec {
    /// The name to greet.
    pub name: String,
}

/// What the operator said: each handler's result, under its id.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct GreetingStatus {}

#[tokio::main]
async fn main() -> kactor::Result<()> {
    let greetings = Selector::of::<Greeting>();
    Operator::new()
        .crd(Greeting::crd()) // installed by --emulator; printed by `crds`
        .on_create(greetings.clone(), "greet", |ctx: Ctx| async move {
            let name = ctx.spec()["name"].as_str().unwrap_or("world").to_string();
            ctx.info("Greeted", &format!("hello, {name}"));
            Ok(json!({"message": format!("hello, {name}")})) // lands in status.greet
        })
        .on_field(greetings, "spec.name", "regreet", |ctx: Ctx| async move {
            Ok(json!({"message": format!("hello again, {}", ctx.new_value().unwrap_or(&json!("?")))}))
        })
        .run_from_args() // run -A, -n NS, --emulator, --liveness URL, rbac generate, crds, ...
        .await
}
