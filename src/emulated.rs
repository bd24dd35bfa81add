//! `--emulator`, as a piece a program can run its own task beside: kactor's embedded API server with
//! the operator's CRDs installed, a kubeconfig for kubectl, health and metrics on a local port, and
//! (with a state file) what was created kept across restarts.
//!
//! [`Operator::run_from_args`] uses it for `--emulator`; a program with its own command line (the
//! examples play a demo beside the operator) calls [`Operator::on_emulator`] and runs the operator
//! it returns.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kactor_emulator::Emulator;

use crate::error::{Error, Result};
use crate::operator::Operator;

/// How often the state file is written while something changes.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The embedded API server an operator runs on, from [`Operator::on_emulator`]. Closing it
/// ([`close`](Self::close)) saves the state file one last time and removes the kubeconfig; dropping
/// it removes the kubeconfig.
pub struct Emulated {
    emulator: Arc<Emulator>,
    kubeconfig: PathBuf,
    liveness: String,
    state: Option<PathBuf>,
    restored: Option<usize>,
    saver: Option<tokio::task::JoinHandle<()>>,
    crds: Vec<String>,
}

impl Operator {
    /// Starts kactor's embedded API server for this operator: restores `state` if the file exists
    /// (and saves to it every second while something changes, and at [`Emulated::close`]), installs
    /// the CRDs declared with [`Operator::crd`], and writes a kubeconfig for kubectl. Returns the
    /// operator set to run there (the emulator's client, standalone, health and metrics at its
    /// `liveness` URL or on a free local port) and the emulator.
    ///
    /// A state file that cannot be read as one is an error, and is left as it is.
    ///
    /// ```no_run
    /// # async fn example(operator: kactor::Operator) -> kactor::Result<()> {
    /// let (operator, emulated) = operator.on_emulator(None).await?;
    /// println!("{}", emulated.summary());
    /// let client = emulated.client();
    /// tokio::spawn(async move { /* a demo, with `client` */ });
    /// let result = operator.run().await;                // until Ctrl-C
    /// emulated.close().await?;
    /// result
    /// # }
    /// ```
    pub async fn on_emulator(self, state: Option<&Path>) -> Result<(Operator, Emulated)> {
        let failed = |e: kactor_emulator::Error| Error::Emulator(e.to_string());
        let emulator = Arc::new(Emulator::start().await.map_err(failed)?);
        let restored = match state {
            Some(path) => emulator.load_state(path).map_err(failed)?,
            None => None,
        };
        let client = emulator.client();
        self.install_crds(&client).await?;
        let program = crate::cli::program_name().unwrap_or_else(|| crate::cli::DEFAULT_NAME.into());
        let kubeconfig = std::env::temp_dir().join(format!(
            "{program}-emulator-{}.kubeconfig",
            emulator.addr().port()
        ));
        emulator.write_kubeconfig(&kubeconfig).map_err(failed)?;
        let liveness = match self.liveness_url() {
            Some(url) => url.to_string(),
            None => {
                let port = std::net::TcpListener::bind(("127.0.0.1", 0))
                    .and_then(|l| l.local_addr())
                    .map_err(|e| Error::Emulator(format!("cannot find a free port: {e}")))?
                    .port();
                format!("http://127.0.0.1:{port}/healthz")
            }
        };
        let saver =
            state.map(|path| tokio::spawn(save_while_running(emulator.clone(), path.into())));
        let crds = self
            .declared_crds()
            .iter()
            .filter_map(|crd| crd.metadata.name.clone())
            .collect();
        // Built from the configuration, not handed the emulator's client: one request buffer.
        let operator = self
            .kube_config(emulator.config())
            .standalone()
            .liveness(&liveness);
        let emulated = Emulated {
            emulator,
            kubeconfig,
            liveness,
            state: state.map(Path::to_path_buf),
            restored,
            saver,
            crds,
        };
        Ok((operator, emulated))
    }
}

/// Saves the state whenever the resourceVersion moved since the last save.
async fn save_while_running(emulator: Arc<Emulator>, path: PathBuf) {
    let mut saved = emulator.resource_version();
    loop {
        tokio::time::sleep(SAVE_EVERY).await;
        let now = emulator.resource_version();
        if now == saved {
            continue;
        }
        let (emulator, file) = (emulator.clone(), path.clone());
        match tokio::task::spawn_blocking(move || emulator.save_state(&file)).await {
            Ok(Ok(())) => saved = now,
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot save the emulator's state; trying again")
            }
            Err(_) => return,
        }
    }
}

impl Emulated {
    /// A client of the embedded API server, as its administrator.
    pub fn client(&self) -> kube::Client {
        self.emulator.client()
    }

    /// The embedded API server.
    pub fn emulator(&self) -> &Emulator {
        &self.emulator
    }

    /// The kubeconfig written for kubectl (`export KUBECONFIG=...`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Where the liveness probe is answered (`http://127.0.0.1:PORT/healthz`).
    pub fn liveness(&self) -> &str {
        &self.liveness
    }

    /// `http://host:port` of the health server, which answers `/readyz` and `/metrics` too.
    pub fn health_base(&self) -> &str {
        let authority = self.liveness.find("://").map_or(0, |at| at + 3);
        let end = self.liveness[authority..]
            .find('/')
            .map_or(self.liveness.len(), |at| authority + at);
        &self.liveness[..end]
    }

    /// How many objects the state file brought back (None: no state file, or none yet).
    pub fn restored(&self) -> Option<usize> {
        self.restored
    }

    /// Where everything is, a line each: the API server, the kubeconfig, the CRDs, health,
    /// readiness, metrics and the state file.
    pub fn summary(&self) -> String {
        let base = self.health_base();
        let mut lines = vec![
            format!("  API server  {} (in this process)", self.emulator.url()),
            format!(
                "  kubectl     export KUBECONFIG={}",
                self.kubeconfig.display()
            ),
            format!("  CRDs        {}", self.crds.join(", ")),
            format!("  liveness    {}", self.liveness),
            format!("  readiness   {base}/readyz"),
            format!("  metrics     {base}/metrics"),
        ];
        lines.push(match (&self.state, self.restored) {
            (Some(path), Some(count)) => format!(
                "  state       {} ({count} objects restored; kept at exit)",
                path.display()
            ),
            (Some(path), None) => format!("  state       {} (new; kept at exit)", path.display()),
            (None, _) => "  state       in memory only: nothing is kept after the exit (--emulator-state FILE keeps it)".to_string(),
        });
        lines.join("\n")
    }

    /// Saves the state file one last time (if there is one), removes the kubeconfig and stops the
    /// server.
    pub async fn close(mut self) -> Result<()> {
        if let Some(saver) = self.saver.take() {
            saver.abort();
            let _ = saver.await;
        }
        if let Some(path) = &self.state {
            let (emulator, file) = (self.emulator.clone(), path.clone());
            tokio::task::spawn_blocking(move || emulator.save_state(&file))
                .await
                .map_err(|e| Error::Emulator(format!("saving the state: {e}")))?
                .map_err(|e| Error::Emulator(e.to_string()))?;
        }
        Ok(())
    }
}

impl Drop for Emulated {
    fn drop(&mut self) {
        if let Some(saver) = self.saver.take() {
            saver.abort();
        }
        if let Err(error) = std::fs::remove_file(&self.kubeconfig) {
            tracing::debug!(%error, "cannot remove the emulator's kubeconfig");
        }
        self.emulator.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_health_base_is_the_liveness_url_without_its_path() {
        let (_, emulated) = Operator::new()
            .liveness("http://127.0.0.1:18081/live/here")
            .on_emulator(None)
            .await
            .unwrap();
        assert_eq!(emulated.health_base(), "http://127.0.0.1:18081");
        let summary = emulated.summary();
        assert!(
            summary.contains("readiness   http://127.0.0.1:18081/readyz"),
            "{summary}"
        );
        assert!(summary.contains("in memory only"), "{summary}");
        let kubeconfig = emulated.kubeconfig().to_path_buf();
        assert!(kubeconfig.is_file());
        emulated.close().await.unwrap();
        assert!(!kubeconfig.exists(), "the kubeconfig is removed");
    }
}
