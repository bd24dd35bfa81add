//! The tasks that decide whether the operator may work: peering and leader election, started
//! before the first watch and stopped after the last handler.

use super::*;

/// The tasks that decide whether this operator may work (peering, leader election). They run from
/// before the first watch until after the last handler, and are never paused themselves.
pub(super) struct Coordination {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Coordination {
    pub(super) fn start(
        operator: &Operator,
        client: &kube::Client,
        observer: &Arc<dyn Observer>,
    ) -> Result<Self> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until_stopped = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }
        };
        let identity = operator
            .identity
            .clone()
            .unwrap_or_else(kactor_peering::peering::identity);
        let mut tasks = Vec::new();
        if let Some(lease) = &operator.leader_election {
            lease.validate()?;
            // The elector pauses the operator as it is made, before anything could be watched.
            let elector =
                LeaderElector::new(client.clone(), lease.clone(), operator.switch.clone());
            // leader_election_master_status{name}: 0 from the start, then every change.
            let mut leading = elector.is_leader();
            let (observer, name) = (observer.clone(), lease.name.clone());
            observer.leadership(&name, false);
            tasks.push(tokio::spawn(async move {
                while leading.changed().await.is_ok() {
                    let now = *leading.borrow_and_update();
                    observer.leadership(&name, now);
                }
            }));
            let stopped = until_stopped();
            tasks.push(tokio::spawn(async move {
                if let Err(error) = elector.run(stopped).await {
                    tracing::error!(%error, "leader election stopped");
                }
            }));
        }
        if operator.peering.mode != PeeringMode::Standalone {
            let mut settings = operator.peering.clone();
            match operator.scope.served()? {
                Served::ClusterWide => settings.clusterwide = true,
                Served::Fixed(names) => {
                    settings.clusterwide = false;
                    settings.namespaces = names;
                }
                Served::Patterns { .. } => {
                    // Kopf keeps a KopfPeering per served namespace as they come and go; with
                    // glob patterns, kactor peers through the cluster-wide object instead.
                    tracing::info!("namespace patterns with globs: peering through the ClusterKopfPeering `{}`", settings.name);
                    settings.clusterwide = true;
                }
            }
            let (client, switch, stopped) =
                (client.clone(), operator.switch.clone(), until_stopped());
            tasks.push(tokio::spawn(kactor_peering::peering::run(
                client, settings, identity, switch, stopped,
            )));
        }
        Ok(Coordination { stop, tasks })
    }

    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
