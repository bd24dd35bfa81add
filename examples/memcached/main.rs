//! The memcached operator of the Operator SDK quickstart, written with kactor.
//!
//! ```sh
//! cargo run --example memcached                      # no cluster configured: a demo on the embedded emulator
//! cargo run --example memcached -- --emulator        # the same, even with a cluster configured
//! cargo run --example memcached -- --actor           # the same operator written as an actor per Memcached
//! cargo run --example memcached -- --reconcile       # the same, as the Operator SDK quickstart: one reconcile handler
//! cargo run --example memcached -- crds | kubectl apply -f -
//! cargo run --example memcached -- run -A --liveness http://0.0.0.0:8080/healthz   # against the cluster
//! cargo run --example memcached -- run -A --webhook-host 127.0.0.1   # also validating sizes (at most 16)
//! ```
//!
//! `--webhook-host` adds a validating admission webhook (`operator::validating`): the API server
//! asks the operator before it stores a `Memcached`, and a size over 16 is refused. The host is
//! where the API server reaches the operator: `127.0.0.1` when the API server runs on this
//! machine, a Service's name in a cluster.
//!
//! The operator itself is in `operator.rs` (handlers), `actor.rs` (an actor per Memcached) and
//! `reconcile.rs` (one reconcile handler, the quickstart's controller); this file is its command
//! line: kactor's `run` options
//! (`-n`, `-A`, `--liveness`, `-v`, ... see `--help`) plus `--emulator`, and the demo.

#[path = "../common/mod.rs"]
mod common;
mod operator;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::builder::BoolishValueParser;
use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};
use k8s_openapi::api::apps::v1::Deployment;
use kactor::actors::Actors;
use kactor::cli::RunArgs;
use kactor::logging::LogFormat;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use operator::actor::{MemcachedActor, Request};
use operator::{Memcached, MemcachedSpec};

/// The memcached operator: a `Memcached` (cache.example.com/v1alpha1) gets a Deployment of
/// `spec.size` memcached pods.
///
/// `run` is the default command: `memcached -n team-a` is `memcached run -n team-a`.
#[derive(Parser)]
#[command(
    name = "memcached",
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

/// The options of `run`: kactor's (`--emulator` plays the demo), and the actor switch.
#[derive(clap::Args)]
struct Run {
    /// Run the operator written as one actor per Memcached (`actor.rs`) instead of the one written
    /// as handlers (`operator.rs`): the same behaviour, another way to write it.
    #[arg(
        long,
        env = "MEMCACHED_ACTOR",
        action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new(),
    )]
    actor: bool,
    /// Run the operator written as the Operator SDK quickstart writes it (`reconcile.rs`): one
    /// reconcile handler, which owns the Deployments and watches the pods.
    #[arg(
        long,
        env = "MEMCACHED_RECONCILE",
        action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new(),
        conflicts_with = "actor",
    )]
    reconcile: bool,
    /// Validate every Memcached's size (at most 16) with an admission webhook of the operator's
    /// own, which the API server reaches at this host (a Service's name in a cluster, 127.0.0.1
    /// when the API server runs on this machine); kactor keeps its webhook configuration.
    #[arg(long, env = "MEMCACHED_WEBHOOK_HOST", value_name = "HOST")]
    webhook_host: Option<String>,
    /// The webhook server's port.
    #[arg(long, env = "MEMCACHED_WEBHOOK_PORT", default_value_t = 9443)]
    webhook_port: u16,
    #[command(flatten)]
    args: RunArgs,
}

impl Run {
    /// The operator, written as handlers, as an actor, or as a reconcile handler; validating
    /// sizes with `--webhook-host`.
    fn build(&self) -> kactor::Result<kactor::Operator> {
        let operator = if self.actor {
            operator::actor::operator(std::time::Duration::from_secs(30))
        } else if self.reconcile {
            operator::reconcile::operator()
        } else {
            operator::operator(operator::drift_check())
        }?;
        Ok(match &self.webhook_host {
            Some(host) => operator::validating(operator, host, self.webhook_port),
            None => operator,
        })
    }
}

/// The demo's namespace and object.
const NAMESPACE: &str = "default";
const DEMO_NAME: &str = "example-memcached";

#[tokio::main]
async fn main() -> ExitCode {
    let mut command = Cli::command();
    let matches = command.get_matches_mut();
    let cli =
        Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.format(&mut command).exit());
    let (run, run_matches) = match (cli.command, matches.subcommand()) {
        (Some(Command::Manifests(command)), _) => {
            return common::manifests(
                "memcached",
                operator::operator(operator::drift_check()),
                command,
            )
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
        eprintln!("memcached: error: {error}");
        return ExitCode::FAILURE;
    }
    let result = if emulator {
        let why = if run.args.emulator {
            "--emulator"
        } else {
            "no cluster configured: no KUBECONFIG, no ~/.kube/config, not in a pod"
        };
        on_emulator(run, why).await
    } else {
        on_cluster(run).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line: what happened, with its causes.
            eprintln!("memcached: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the operator against the configured cluster, as any operator: the CRD must be installed
/// (`memcached crds | kubectl apply -f -`).
async fn on_cluster(run: Run) -> anyhow::Result<()> {
    let args = &run.args;
    if let Some(warning) = args.scope_warning() {
        tracing::warn!("{warning}");
    }
    run.build()?.with_args(args).run().await?;
    Ok(())
}

/// Runs the operator on kactor's embedded API server (`Operator::on_emulator`, what `--emulator`
/// does for any operator), plays the demo beside it, and serves until Ctrl-C.
async fn on_emulator(run: Run, why: &str) -> anyhow::Result<()> {
    let operator = run.build()?;
    let (mut args, actor) = (run.args, run.actor);
    if args.liveness.is_none() {
        args.liveness = Some(format!("http://127.0.0.1:{}/healthz", health_port()?));
    }
    let (operator, emulated) = operator
        .with_args(&args)
        .on_emulator(args.emulator_state.as_deref())
        .await?;
    println!("The memcached operator, made with kactor, on an embedded Kubernetes API emulator");
    println!("({why}; no pods really run: the emulator has no controllers).");
    println!();
    println!("{}", emulated.summary());
    println!();
    let actors = actor.then(|| operator.actors::<MemcachedActor>());
    let kubeconfig = emulated.kubeconfig().to_path_buf();
    let demo = tokio::spawn(demo(emulated.client(), kubeconfig, actors));
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
async fn demo(client: kube::Client, kubeconfig: PathBuf, actors: Option<Actors<MemcachedActor>>) {
    if let Err(error) = play(&client, actors.as_ref()).await {
        println!("The demo stopped: {error:#}");
        return;
    }
    println!();
    println!("Demo finished. The operator keeps running; try it yourself, in another terminal:");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!(
        r#"  echo '{{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "metadata": {{"name": "mine"}}, "spec": {{"size": 2}}}}' | kubectl apply -f -"#
    );
    println!("  kubectl get memcacheds,deployments");
    println!(r#"  kubectl patch memcached mine --type=merge -p '{{"spec": {{"size": 4}}}}'"#);
    println!("  kubectl delete memcached mine");
    println!("Ctrl-C to stop.");
}

async fn play(
    client: &kube::Client,
    actors: Option<&Actors<MemcachedActor>>,
) -> anyhow::Result<()> {
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), NAMESPACE);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let object = format!("{NAMESPACE}/{DEMO_NAME}");
    println!("Demo: the life of a Memcached. The operator's log lines come in between.");
    println!();

    println!("1. Creating the Memcached {object} with spec.size=3.");
    memcacheds
        .create(
            &PostParams::default(),
            &Memcached::new(DEMO_NAME, MemcachedSpec { size: 3 }),
        )
        .await
        .context("cannot create the Memcached")?;
    until_replicas(&deployments, Some(3)).await?;
    println!(
        "   The operator made the Deployment {object}: 3 replicas of {}, owned by the Memcached.",
        operator::IMAGE
    );
    println!(
        "   kactor's finalizer on the Memcached makes its deletion wait for the operator's cleanup."
    );

    println!("2. Scaling: spec.size 3 -> 5.");
    let patch = serde_json::json!({"spec": {"size": 5}});
    memcacheds
        .patch(DEMO_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("cannot change spec.size")?;
    until_replicas(&deployments, Some(5)).await?;
    println!("   The operator scaled the Deployment {object} to 5 replicas.");
    if let Some(actors) = actors {
        let report = actors
            .ask((NAMESPACE, DEMO_NAME), Request::Report)
            .await
            .context("cannot ask the Memcached's actor")?;
        println!(
            "   Asked its actor: it set {:?} replicas, ran {} drift checks.",
            report.replicas, report.checks
        );
    }

    println!("3. Deleting the Memcached.");
    memcacheds
        .delete(DEMO_NAME, &DeleteParams::default())
        .await
        .context("cannot delete the Memcached")?;
    until_replicas(&deployments, None).await?;
    println!("   The operator deleted the Deployment {object}: the Deployment is gone.");
    let memcacheds = &memcacheds;
    common::until("the Memcached to go", move || async move {
        Ok(memcacheds.get_opt(DEMO_NAME).await?.is_none())
    })
    .await?;
    println!("   kactor removed its finalizer: the Memcached is gone.");
    Ok(())
}

/// Waits until the demo Deployment has `expected` replicas (`None`: until it is gone).
async fn until_replicas(
    deployments: &Api<Deployment>,
    expected: Option<i32>,
) -> anyhow::Result<()> {
    let what = match expected {
        Some(n) => format!("the Deployment to have {n} replicas"),
        None => "the Deployment to go".to_string(),
    };
    common::until(&what, move || async move {
        let deployment = deployments.get_opt(DEMO_NAME).await?;
        let replicas = deployment.map(|d| d.spec.and_then(|s| s.replicas).unwrap_or(1));
        Ok(replicas == expected)
    })
    .await
}

/// The health server's port for the demo: 8080, or any free one if 8080 is taken.
fn health_port() -> anyhow::Result<u16> {
    // The probe listener closes at once: the operator's health server binds the port next.
    if TcpListener::bind(("127.0.0.1", 8080)).is_ok() {
        return Ok(8080);
    }
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}
