//! What the examples' programs share: deciding between a cluster and the embedded emulator,
//! waiting for the demo's steps, and kactor's `rbac`/`crds`/`manifests` commands.
//! (Not an example itself: cargo builds `examples/*.rs` and `examples/*/main.rs` only.)

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use kactor::prelude::*;

/// How long the demo waits for the operator at each step before it gives up: far more than it
/// needs, even on a loaded machine.
pub const DEMO_WAIT: Duration = Duration::from_secs(60);

/// Whether credentials for a cluster are configured where kube's client looks for them: a
/// `KUBECONFIG`, a `~/.kube/config`, or a pod's service account.
pub fn cluster_configured() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let home_config = std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .is_some_and(|home| Path::new(&home).join(".kube").join("config").is_file());
    set("KUBECONFIG") || home_config || set("KUBERNETES_SERVICE_HOST")
}

/// Asks until `check` says yes, for up to [`DEMO_WAIT`].
pub async fn until<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + DEMO_WAIT;
    while !check().await? {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("waited {DEMO_WAIT:?} for {what}, in vain");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// `PROGRAM rbac generate|verify` and `PROGRAM crds`, as every kactor operator has them.
pub async fn manifests(
    program: &str,
    operator: kactor::Result<Operator>,
    command: kactor::cli::Manifests,
) -> ExitCode {
    let result = match operator {
        Ok(operator) => {
            command
                .execute(
                    &operator,
                    &mut std::io::stdin(),
                    &mut std::io::stdout(),
                    &mut std::io::stderr(),
                )
                .await
        }
        Err(error) => Err(error),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: error: {error}");
            ExitCode::FAILURE
        }
    }
}
