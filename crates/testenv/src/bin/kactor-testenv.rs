//! `kactor-testenv`: the real test cluster from the command line.
//!
//! ```sh
//! kactor-testenv build                 # build kube-apiserver once (cached); prints the binary's path
//! kactor-testenv apiserver [--rbac]    # run it until Ctrl-C; prints its URL and kubeconfig
//! ```

use clap::{Parser, Subcommand};
use kactor_testenv::apiserver::{self, ApiServer};

#[derive(Parser)]
#[command(about = "The real kube-apiserver of kactor's test clusters")]
struct Args {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Builds the server unless it is cached, and prints the binary's path.
    Build,
    /// Runs the server until Ctrl-C.
    Apiserver {
        /// Authorize requests with RBAC.
        #[arg(long)]
        rbac: bool,
        /// Also copy the administrator's kubeconfig here.
        #[arg(long)]
        kubeconfig: Option<std::path::PathBuf>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kactor-testenv: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), kactor_testenv::Error> {
    match args.command {
        Commands::Build => println!("{}", apiserver::binary().await?.display()),
        Commands::Apiserver { rbac, kubeconfig } => {
            let server = ApiServer::start(rbac).await?;
            let path = match kubeconfig {
                Some(path) => {
                    server.write_kubeconfig(&path)?;
                    path
                }
                None => server.kubeconfig_path().to_path_buf(),
            };
            println!(
                "kube-apiserver {} at {}",
                apiserver::KUBERNETES_VERSION,
                server.url()
            );
            println!("export KUBECONFIG={}", path.display());
            let _ = tokio::signal::ctrl_c().await;
            server.shutdown().await;
        }
    }
    Ok(())
}
