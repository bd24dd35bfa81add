//! The `kactor` command line.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kactor::emulator::{samples, Emulator};

mod new;

#[derive(Parser)]
#[command(
    name = "kactor",
    version,
    about = "Kubernetes operators in Rust, the Kopf way, on actors"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a new operator crate: a typed CRD, its handlers (or an actor per object), a test on the
    /// embedded API server, a Dockerfile and a README. It builds and its test passes as written.
    New(new::NewArgs),
    /// Serve an in-memory Kubernetes API server that kubectl, client libraries and operators can use.
    Emulator {
        /// The port to listen on (on 127.0.0.1); 0 picks a free one.
        #[arg(long, default_value_t = 8001, env = "KACTOR_EMULATOR_PORT")]
        port: u16,
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1", env = "KACTOR_EMULATOR_HOST")]
        host: std::net::IpAddr,
        /// Where to write a kubeconfig for it.
        #[arg(
            long,
            default_value = "emulator.kubeconfig",
            env = "KACTOR_EMULATOR_KUBECONFIG"
        )]
        kubeconfig: PathBuf,
        /// Start empty, without the sample `widgets.example.com` CRD and widget.
        #[arg(long)]
        empty: bool,
        /// Log more (repeat for even more).
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
    },
    /// The peering objects: `kactor peering crds | kubectl apply -f -`.
    Peering {
        #[command(subcommand)]
        command: PeeringCommand,
    },
    /// Pause the operators of a peering: write a record with a high priority for a while (as `kopf freeze`).
    Freeze {
        /// How long the freeze lasts, in seconds (it ends early with `kactor resume`).
        #[arg(short = 't', long, value_name = "SECONDS")]
        lifetime: u64,
        /// The priority of the freeze: operators with a lower or equal one pause.
        #[arg(
            short = 'p',
            long,
            default_value_t = 100,
            allow_negative_numbers = true
        )]
        priority: i64,
        #[command(flatten)]
        target: PeeringTarget,
    },
    /// End a freeze: remove its record from the peering object (as `kopf resume`).
    Resume {
        #[command(flatten)]
        target: PeeringTarget,
    },
    /// Print every event of a resource as kactor's reactor sees it: an operator with one `on_event`
    /// handler, with every option an operator has (credentials from KUBECONFIG, ~/.kube/config or
    /// the in-cluster service account).
    Events {
        /// The resource, as operators name it: `widgets.example.com`, `Widget`, `wd`, `pods`,
        /// `deployments.v1.apps`.
        resource: String,
        #[command(flatten)]
        run: kactor::cli::RunArgs,
    },
}

/// What `kactor peering` does.
#[derive(Subcommand)]
enum PeeringCommand {
    /// Print the CRDs of ClusterKopfPeering and KopfPeering (`kopf.dev/v1`, as Kopf's) as YAML.
    Crds,
}

/// Which peering object `freeze` and `resume` write to, and as whom.
#[derive(clap::Args)]
struct PeeringTarget {
    /// The peering object's name.
    #[arg(short = 'P', long, default_value = "default", env = "KACTOR_PEERING")]
    peering: String,
    /// The namespace of a KopfPeering (without it: the cluster-wide ClusterKopfPeering).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// The identity of the record (default: `user@host`, as Kopf's).
    #[arg(short = 'i', long)]
    id: Option<String>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::New(args) => new::run(&args),
        Command::Emulator {
            port,
            host,
            kubeconfig,
            empty,
            verbose,
        } => {
            let level = match verbose {
                0 => "info",
                1 => "debug",
                _ => "trace",
            };
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| level.into()),
                )
                .init();
            serve_emulator(port, host, kubeconfig, empty).await
        }
        Command::Events { resource, run } => print_events(&resource, run)
            .await
            .map_err(anyhow::Error::from),
        Command::Peering {
            command: PeeringCommand::Crds,
        } => print_peering_crds(),
        Command::Freeze {
            lifetime,
            priority,
            target,
        } => freeze(lifetime, priority, target).await,
        Command::Resume { target } => resume(target).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // One line: what happened and what to do; the causes are already in the message.
            eprintln!("kactor: error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn print_peering_crds() -> anyhow::Result<()> {
    print!(
        "{}",
        serde_saphyr::to_string_multiple(&kactor::peering::peering::crds())?
    );
    Ok(())
}

async fn freeze(lifetime: u64, priority: i64, target: PeeringTarget) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let id = target
        .id
        .unwrap_or_else(kactor::peering::peering::manual_identity);
    kactor::peering::peering::freeze(
        client,
        &target.peering,
        target.namespace.as_deref(),
        &id,
        priority,
        std::time::Duration::from_secs(lifetime),
    )
    .await?;
    println!(
        "Frozen the peering `{}` for {lifetime} s with priority {priority} as {id}.",
        target.peering
    );
    Ok(())
}

async fn resume(target: PeeringTarget) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let id = target
        .id
        .unwrap_or_else(kactor::peering::peering::manual_identity);
    kactor::peering::peering::resume(client, &target.peering, target.namespace.as_deref(), &id)
        .await?;
    println!(
        "Resumed the peering `{}` (removed the record of {id}).",
        target.peering
    );
    Ok(())
}

/// Runs an operator that prints each event of `resource` on a line of its own.
async fn print_events(resource: &str, run: kactor::cli::RunArgs) -> kactor::Result<()> {
    use kactor::prelude::*;
    match kactor::logging::init(&run.log_settings()) {
        Ok(()) | Err(kactor::logging::LoggingError::AlreadyInitialized) => {}
        Err(error) => return Err(error.into()),
    }
    if let Some(warning) = run.scope_warning() {
        tracing::warn!("{warning}");
    }
    Operator::new()
        .with_args(&run)
        .on_event(resource, "print", |ctx: Ctx| async move {
            let object = match ctx.namespace() {
                Some(namespace) => format!("{namespace}/{}", ctx.name()),
                None => ctx.name().to_string(),
            };
            let rv = ctx.meta().resource_version.as_deref().unwrap_or_default();
            println!(
                "{:<8} {object} resourceVersion={rv}",
                ctx.kopf_type().unwrap_or("LISTED")
            );
            Ok(())
        })
        .run()
        .await
}

async fn serve_emulator(
    port: u16,
    host: std::net::IpAddr,
    kubeconfig: PathBuf,
    empty: bool,
) -> anyhow::Result<()> {
    let emulator = Emulator::builder()
        .addr((host, port).into())
        .start()
        .await?;
    emulator.write_kubeconfig(&kubeconfig)?;
    if !empty {
        seed(&emulator)
            .await
            .context("cannot create the sample widget")?;
    }
    let path = kubeconfig.canonicalize().unwrap_or(kubeconfig);
    println!(
        "kactor emulator: Kubernetes {} API at {}",
        kactor::emulator::KUBERNETES_VERSION,
        emulator.url()
    );
    println!("kubeconfig written to {}", path.display());
    println!();
    println!("Point kubectl at it:");
    println!("  export KUBECONFIG={}", path.display());
    if !empty {
        println!("  kubectl get widgets                     # the sample custom resource");
        println!("  kubectl patch widget demo --type=merge -p '{{\"spec\": {{\"size\": 5}}}}'");
        println!("  kubectl get widgets -w                  # watch (Ctrl-C to stop)");
    }
    println!("  kubectl api-resources");
    println!();
    println!(
        "Faults: POST {}/_emulator/faults/{{end-watches,compact,fail,latency,silence,reset}}",
        emulator.url()
    );
    println!("Serving until Ctrl-C.");
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for Ctrl-C")?;
    emulator.shutdown();
    println!("kactor emulator: stopped.");
    Ok(())
}

/// Installs the sample CRD and one widget through the public API, as any client would.
async fn seed(emulator: &Emulator) -> anyhow::Result<()> {
    use kube::api::PostParams;
    let widgets = samples::install_widgets(&emulator.client()).await?;
    widgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(samples::widget("demo", 3))?,
        )
        .await?;
    Ok(())
}
