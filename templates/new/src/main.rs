//! The {{name}} program: `{{name}} --emulator` tries it without a cluster, `{{name}} -A` runs it
//! against the cluster of your kubeconfig, `{{name}} --help` lists the rest.

#[tokio::main]
async fn main() -> kactor::Result<()> {
    {{crate}}::operator().run_from_args().await
}
