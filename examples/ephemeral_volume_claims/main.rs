//! Kopf's walkthrough operator (ephemeral volume claims), written with kactor.
//!
//! ```sh
//! cargo run --example ephemeral_volume_claims                  # no cluster configured: a demo on the embedded emulator
//! cargo run --example ephemeral_volume_claims -- --emulator    # the same, even with a cluster configured
//! cargo run --example ephemeral_volume_claims -- crds | kubectl apply -f -
//! cargo run --example ephemeral_volume_claims -- run -A        # against the cluster
//! ```
//!
//! The operator itself is in `operator.rs`; this file is its command line: kactor's `run` options
//! (`-n`, `-A`, `--liveness`, `-v`, ... see `--help`) plus `--emulator`, and the demo. It has the
//! shape of the memcached example's `main.rs`.

#[path = "../common/mod.rs"]
mod common;
mod operator;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kactor::cli::RunArgs;
use kactor::logging::LogFormat;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use operator::{EphemeralVolumeClaim, EphemeralVolumeClaimSpec};

/// Kopf's walkthrough operator: an `EphemeralVolumeClaim` (kopf.dev/v1, `evc`) gets a
/// PersistentVolumeClaim of `spec.size`, labelled as it is, and deleted with it.
///
/// `run` is the default command: `ephemeral_volume_claims -n team-a` is `... run -n team-a`.
#[derive(Parser)]
#[command(
    name = "ephemeral_volume_claims",
    version,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: Run,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator (the default command).
    Run(Run),
    /// kactor's `rbac generate`, `rbac verify` and `crds`: what the operator needs in a cluster.
    #[command(flatten)]
    Manifests(kactor::cli::Manifests),
}

/// The options of `run`: kactor's (`--emulator` plays the demo).
#[derive(clap::Args)]
struct Run {
    #[command(flatten)]
    args: RunArgs,
}

/// The demo's namespace and object.
const NAMESPACE: &str = "default";
const DEMO_NAME: &str = "my-claim";

#[tokio::main]
async fn main() -> ExitCode {
    let mut command = Cli::command();
    let matches = command.get_matches_mut();
    let cli =
        Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.format(&mut command).exit());
    let (run, run_matches) = match (cli.command, matches.subcommand()) {
        (Some(Command::Manifests(command)), _) => {
            return common::manifests("ephemeral_volume_claims", Ok(operator::operator()), command)
                .await
        }
        (Some(Command::Run(run)), Some((_, run_matches))) => (run, run_matches),
        (_, _) => (cli.run, &matches),
    };
    let emulator = run.args.emulator || !common::cluster_configured();
    let mut logging = run.args.log_settings();
    if emulator && run_matches.value_source("log_format") == Some(ValueSource::DefaultValue) {
        // On a terminal, next to the demo's lines, the message alone reads best.
        logging.format = LogFormat::Plain;
    }
    if let Err(error) = kactor::logging::init(&logging) {
        eprintln!("ephemeral_volume_claims: error: {error}");
        return ExitCode::FAILURE;
    }
    let result = if emulator {
        let why = if run.args.emulator {
            "--emulator"
        } else {
            "no cluster configured: no KUBECONFIG, no ~/.kube/config, not in a pod"
        };
        on_emulator(run.args, why).await
    } else {
        on_cluster(run.args).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ephemeral_volume_claims: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the operator against the configured cluster: the CRD must be installed
/// (`ephemeral_volume_claims crds | kubectl apply -f -`).
async fn on_cluster(args: RunArgs) -> anyhow::Result<()> {
    if let Some(warning) = args.scope_warning() {
        tracing::warn!("{warning}");
    }
    operator::operator().with_args(&args).run().await?;
    Ok(())
}

/// Runs the operator on kactor's embedded API server (`Operator::on_emulator`, what `--emulator`
/// does for any operator), plays the demo beside it, and serves until Ctrl-C.
async fn on_emulator(args: RunArgs, why: &str) -> anyhow::Result<()> {
    let (operator, emulated) = operator::operator()
        .with_args(&args)
        .on_emulator(args.emulator_state.as_deref())
        .await?;
    println!(
        "Kopf's walkthrough operator, made with kactor, on an embedded Kubernetes API emulator"
    );
    println!("({why}; no volumes are really bound).");
    println!();
    println!("{}", emulated.summary());
    println!();
    let demo = tokio::spawn(demo(emulated.client(), emulated.kubeconfig().to_path_buf()));
    // Until SIGINT (Ctrl-C) or SIGTERM.
    let result = operator.run().await;
    demo.abort();
    let closed = emulated.close().await;
    println!("Stopped.");
    result?;
    closed?;
    Ok(())
}

/// The demo: what a user would do with kubectl, done through the API, with what the operator did
/// in response. A failed step ends the demo, not the operator.
async fn demo(client: kube::Client, kubeconfig: PathBuf) {
    if let Err(error) = play(&client).await {
        println!("The demo stopped: {error:#}");
        return;
    }
    println!();
    println!("Demo finished. The operator keeps running; try it yourself, in another terminal:");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!(
        r#"  echo '{{"apiVersion": "kopf.dev/v1", "kind": "EphemeralVolumeClaim", "metadata": {{"name": "mine"}}, "spec": {{"size": "5Gi"}}}}' | kubectl apply -f -"#
    );
    println!("  kubectl get evc,pvc");
    println!("  kubectl label evc mine application=some-app owner=me");
    println!("  kubectl delete evc mine");
    println!("Ctrl-C to stop.");
}

async fn play(client: &kube::Client) -> anyhow::Result<()> {
    let evcs: Api<EphemeralVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let object = format!("{NAMESPACE}/{DEMO_NAME}");
    println!(
        "Demo: the life of an EphemeralVolumeClaim. The operator's log lines come in between."
    );
    println!();

    println!("1. Creating the EVC {object} with spec.size=1Gi and the label app=demo.");
    let evc = EphemeralVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DEMO_NAME.to_string()),
            labels: Some(BTreeMap::from([("app".to_string(), "demo".to_string())])),
            ..ObjectMeta::default()
        },
        ..EphemeralVolumeClaim::new(
            DEMO_NAME,
            EphemeralVolumeClaimSpec {
                size: "1Gi".to_string(),
            },
        )
    };
    evcs.create(&PostParams::default(), &evc)
        .await
        .context("cannot create the EVC")?;
    let pvc = until_pvc(&pvcs, "the PVC of 1Gi", |p| storage(p) == Some("1Gi")).await?;
    println!(
        "   Its create handler made the PVC {object}: {}, labels {}, owned by the EVC.",
        storage(Some(&pvc)).unwrap_or("?"),
        labels(Some(&pvc))
    );

    println!("2. Resizing: spec.size 1Gi -> 2Gi.");
    let patch = serde_json::json!({"spec": {"size": "2Gi"}});
    evcs.patch(DEMO_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("cannot change spec.size")?;
    until_pvc(&pvcs, "the PVC of 2Gi", |p| storage(p) == Some("2Gi")).await?;
    println!("   Its spec.size handler patched the PVC's requested storage to 2Gi.");

    println!("3. Relabelling: removing app, adding owner=me.");
    let patch = serde_json::json!({"metadata": {"labels": {"app": null, "owner": "me"}}});
    evcs.patch(DEMO_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("cannot relabel the EVC")?;
    let pvc = until_pvc(&pvcs, "the PVC relabelled", |p| labels(p) == "owner=me").await?;
    println!(
        "   Its metadata.labels handler relabelled the PVC: labels {}.",
        labels(Some(&pvc))
    );

    println!("4. Deleting the EVC.");
    evcs.delete(DEMO_NAME, &DeleteParams::default())
        .await
        .context("cannot delete the EVC")?;
    let evcs = &evcs;
    common::until("the EVC to go", move || async move {
        Ok(evcs.get_opt(DEMO_NAME).await?.is_none())
    })
    .await?;
    println!("   No finalizer held it: the EVC is gone.");
    let pvcs = &pvcs;
    common::until("the PVC to go", move || async move {
        Ok(pvcs.get_opt(DEMO_NAME).await?.is_none())
    })
    .await?;
    println!("   The garbage collector deleted the PVC after its owner: the PVC is gone.");
    Ok(())
}

/// The PVC's requested storage.
fn storage(pvc: Option<&PersistentVolumeClaim>) -> Option<&str> {
    let requests = pvc?.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    requests.get("storage").map(|quantity| quantity.0.as_str())
}

/// The PVC's labels as `key=value,...` (sorted).
fn labels(pvc: Option<&PersistentVolumeClaim>) -> String {
    let labels = pvc
        .and_then(|p| p.metadata.labels.clone())
        .unwrap_or_default();
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// Waits until the demo PVC passes `check`, and returns it.
async fn until_pvc(
    pvcs: &Api<PersistentVolumeClaim>,
    what: &str,
    check: impl Fn(Option<&PersistentVolumeClaim>) -> bool,
) -> anyhow::Result<PersistentVolumeClaim> {
    let check = &check;
    common::until(what, move || async move {
        Ok(check(pvcs.get_opt(DEMO_NAME).await?.as_ref()))
    })
    .await?;
    pvcs.get(DEMO_NAME).await.context("cannot read the PVC")
}
