//! The tasks that decide whether the operator may work: peering and leader election, started
//! before the first watch and stopped after the last handler.

use super::*;
use kactor_peering::sharding::{Assigner, Member, RingView};

/// The tasks that decide whether this operator may work (peering, leader election). They run from
/// before the first watch until after the last handler, and are never paused themselves.
pub(super) struct Coordination {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Sharded: whether this replica holds the leader Lease, which makes it the assigner.
    assigns: Option<tokio::sync::watch::Receiver<bool>>,
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
        let identity = match &operator.sharding {
            // Members of one ring do not pause each other (see `peering::ring_identity`).
            Some(ring) => kactor_peering::peering::ring_identity(&ring.ring, &ring.identity),
            None => operator
                .identity
                .clone()
                .unwrap_or_else(kactor_peering::peering::identity),
        };
        let mut tasks = Vec::new();
        let mut assigns = None;
        if let Some(ring) = &operator.sharding {
            ring.validate()?;
            // The member pauses the operator as it is made, until it has joined the ring.
            let mut member = Member::new(client.clone(), ring.clone(), operator.switch.clone());
            // The shard (placed in the ring before this) reads its tenure before each cycle and
            // handler: bounded by this membership.
            if let Some(shard) = &operator.settings.shard {
                member = member.with_tenure(shard.tenure().clone());
            }
            // kactor_shard_member{ring}: 0 from the start, then every change.
            let (told, name) = (observer.clone(), ring.ring.clone());
            tasks.push(follow(member.joined(), move |joined| {
                told.shard_member(&name, joined);
            }));
            let stopped = until_stopped();
            tasks.push(tokio::spawn(async move {
                if let Err(error) = member.run(stopped).await {
                    tracing::error!(%error, "the ring membership stopped");
                }
            }));
            // The leader Lease elects the assigner; it gates no work (its own pause switch).
            let lease = LeaseSettings::new(&ring.ring, &ring.namespace, &ring.identity)
                .with_timings(ring.lease_duration, ring.renew_deadline, ring.retry_period)?;
            let elector = LeaderElector::new(client.clone(), lease, PauseSwitch::new());
            assigns = Some(elector.is_leader());
            tasks.extend(elect(elector, &ring.ring, observer, until_stopped()));
        }
        if let Some(lease) = &operator.leader_election {
            lease.validate()?;
            // The elector pauses the operator as it is made, before anything could be watched.
            let elector =
                LeaderElector::new(client.clone(), lease.clone(), operator.switch.clone());
            tasks.extend(elect(elector, &lease.name, observer, until_stopped()));
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
        Ok(Coordination {
            stop,
            tasks,
            assigns,
        })
    }

    /// Sharded: starts the assigner of the objects of `targets`, which works while this replica
    /// holds the leader Lease.
    pub(super) fn start_assigner(
        &mut self,
        operator: &Operator,
        client: &kube::Client,
        observer: &Arc<dyn Observer>,
        targets: Vec<kactor_peering::sharding::Target>,
    ) {
        let (Some(ring), Some(assigns)) = (&operator.sharding, &self.assigns) else {
            return;
        };
        let assigner = Assigner::new(client.clone(), ring.clone(), targets);
        self.tasks.push(tokio::spawn(report_ring(
            assigner.view(),
            observer.clone(),
            ring.ring.clone(),
        )));
        let mut stopped = self.stop.subscribe();
        let assigns = assigns.clone();
        self.tasks.push(tokio::spawn(async move {
            let stopped = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            if let Err(error) = assigner.run(assigns, stopped).await {
                tracing::error!(%error, "the assigner stopped");
            }
        }));
    }

    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// The assigner's doings as metrics: the objects per member after each resync, and its moves.
async fn report_ring(
    mut view: tokio::sync::watch::Receiver<RingView>,
    observer: Arc<dyn Observer>,
    ring: String,
) {
    let mut told = RingView::default();
    while view.changed().await.is_ok() {
        let now = view.borrow_and_update().clone();
        for (kind, before, after) in [
            ("assigned", told.assigned, now.assigned),
            ("drained", told.drained, now.drained),
            ("relabelled", told.relabelled, now.relabelled),
            ("takeover", told.takeovers, now.takeovers),
        ] {
            if after > before {
                observer.shard_moves(&ring, kind, after - before);
            }
        }
        if now.resyncs != told.resyncs {
            let owners: Vec<(&str, usize)> =
                now.objects.iter().map(|(m, n)| (m.as_str(), *n)).collect();
            observer.shard_objects(&ring, &owners);
        }
        told = now;
    }
}

/// Runs `elector` until `stopped`, with `leader_election_master_status{name}` at 0 from the start,
/// then every change: the tasks.
fn elect(
    elector: LeaderElector,
    name: &str,
    observer: &Arc<dyn Observer>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> [tokio::task::JoinHandle<()>; 2] {
    let (told, name) = (observer.clone(), name.to_string());
    let leadership = follow(elector.is_leader(), move |leading| {
        told.leadership(&name, leading);
    });
    let running = tokio::spawn(async move {
        if let Err(error) = elector.run(stopped).await {
            tracing::error!(%error, "leader election stopped");
        }
    });
    [leadership, running]
}

/// Tells `tell` the value of `flag` now, then every change of it, until its sender goes.
fn follow(
    mut flag: tokio::sync::watch::Receiver<bool>,
    tell: impl Fn(bool) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tell(*flag.borrow_and_update());
    tokio::spawn(async move {
        while flag.changed().await.is_ok() {
            tell(*flag.borrow_and_update());
        }
    })
}
