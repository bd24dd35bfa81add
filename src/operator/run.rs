//! Running an operator: the sequence from the first request to the last (health, startup
//! activities, coordination, the supervisors, then the graceful shutdown), and the signals that
//! end it.

use super::*;
use coordination::Coordination;
use orchestra::Orchestra;

/// A cluster reached over plain HTTP (the emulator, `kubectl proxy`) has no certificate to verify,
/// yet without a CA of its own kube's client loads the system's whole trust store for every client
/// made from the configuration: a few milliseconds of the operator's start each, once for the
/// operator and once per object thread. An empty set of roots stands in for it there. A CA given
/// is kept, and behind any proxy but a plain-HTTP one (TLS, SOCKS) kube's default stays.
fn without_trust_store_over_plain_http(config: &mut kube::Config) {
    let plain = config.cluster_url.scheme_str() == Some("http");
    let other_proxy = config
        .proxy_url
        .as_ref()
        .is_some_and(|proxy| proxy.scheme_str() != Some("http"));
    if plain && !other_proxy && config.root_cert.is_none() {
        config.root_cert = Some(Vec::new());
    }
}

impl Operator {
    /// Runs until SIGINT or SIGTERM, then shuts down gracefully; a second signal returns at once.
    /// The signals are caught from the call on, before the operator has even connected.
    pub async fn run(self) -> Result<()> {
        let stop = stop_signal();
        // The second signal's listener starts when the first has been received (when `serve`
        // first polls it, during the shutdown), so that the first signal does not count twice.
        self.serve(stop, async { stop_signal().await }).await
    }

    /// Runs until `stop` completes, then shuts down gracefully. It installs no signal handlers: it is
    /// for embedding, where the application owns the signals.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send) -> Result<()> {
        self.serve(stop, std::future::pending()).await
    }

    /// Sharded: checks the ring's settings and places this replica in it (`settings.shard`), which
    /// its supervisors and workers follow.
    fn place_in_ring(&mut self) -> Result<()> {
        let Some(ring) = &self.sharding else {
            return Ok(());
        };
        ring.validate()?;
        if self.leader_election.is_some() {
            return Err(Error::ShardingConflict(
                "leader election cannot be on as well: in a ring, the leader Lease elects the assigner and every replica works; drop leader_election (--leader-election)".to_string(),
            ));
        }
        let shard = Shard::new(&ring.ring, &ring.identity)
            .map_err(|e| Error::ShardingConflict(e.to_string()))?;
        self.settings.shard = Some(shard);
        Ok(())
    }

    /// Serves until `stop`; then shuts down, unless `interrupt` completes first.
    async fn serve(
        mut self,
        stop: impl Future<Output = ()> + Send,
        interrupt: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        self.place_in_ring()?;
        let observer: Arc<dyn Observer> = if self.observers.is_empty() {
            self.metrics.clone()
        } else {
            let mut all: Vec<Arc<dyn Observer>> = vec![self.metrics.clone()];
            all.extend(self.observers.iter().cloned());
            Arc::new(Tee(all))
        };
        // Every request of the operator is counted, whoever built the client.
        let credentials = |e: kube::Error| Error::Credentials(discovery::one_line(&e.to_string()));
        let connection = Connection::resolve(self.connection.as_ref())
            .await
            .map_err(|e| credentials(kube::Error::InferConfig(e)))?;
        // By configuration, each object thread gets a client of its own too (see
        // `Orchestra::connect_object_threads`); a ready-made client is shared.
        let mut thread_client = None;
        let client = match connection {
            Connection::Client(client) => metered(client, observer.clone()),
            Connection::Config(mut config) => {
                without_trust_store_over_plain_http(&mut config);
                let observer = observer.clone();
                let make = move || {
                    kube::client::ClientBuilder::try_from((*config).clone())
                        .map(|builder| builder.with_layer(&MeteredLayer(observer.clone())).build())
                };
                let client = make().map_err(credentials)?;
                thread_client = Some(make);
                client
            }
        };
        let activity_ctx = ActivityCtx {
            memo: self.memo.clone(),
            client: client.clone(),
        };
        let watches = WatchBoard::new();
        let health = HealthState::new(
            &self.settings,
            watches.clone(),
            tokio::runtime::Handle::current(),
        );
        health.set_probes(self.registry.probes.clone(), activity_ctx.clone());
        for (name, check) in &self.liveness_checks {
            health.add_liveness_check(name, check.clone())?;
        }
        for (name, check) in &self.readiness_checks {
            health.add_readiness_check(name, check.clone())?;
        }
        // Served from the start: during the startup activities, /readyz says why it is not ready.
        let _server = match &self.liveness {
            Some(url) => {
                let endpoint = crate::liveness::endpoint(url)?;
                let server = HealthServer::start(
                    endpoint.addr,
                    &endpoint.path,
                    health.clone(),
                    self.metrics.clone(),
                )
                .map_err(|source| Error::HealthServer {
                    addr: endpoint.addr,
                    source,
                })?;
                tracing::info!(address = %server.local_addr(), path = %endpoint.path, "serving health and metrics");
                Some(server)
            }
            None => None,
        };
        for activity in &self.registry.startup {
            tracing::debug!(activity = %activity.id, "running the startup activity");
            if let Err(error) = run_activity(activity, activity_ctx.clone()).await {
                return Err(Error::Startup {
                    id: activity.id.clone(),
                    message: error,
                });
            }
        }
        // Before anything is watched: the first objects are admitted by the operator already.
        let webhooks = admission::start(&self, &client).await?;
        let mut coordination = Coordination::start(&self, &client, &observer)?;
        let mut orchestra =
            Orchestra::new(&self, client.clone(), observer.clone(), watches).await?;
        if let Some(make) = thread_client {
            orchestra.connect_object_threads(make).await?;
        }
        if self.sharding.is_some() {
            coordination.start_assigner(&self, &client, &observer, orchestra.shard_targets()?);
        }
        if self.liveness.is_some() {
            // Its heartbeats are read only by the health server.
            orchestra.start_health(health.clone()).await?;
        }
        // Ready once the supervisors exist (each then waits for its listing).
        orchestra.serve(stop, || health.startup_done()).await?;
        let ultimate = self.settings.process.ultimate_exiting_timeout;
        let graceful = async {
            orchestra.shutdown(&self.registry, activity_ctx).await;
            // Admission is served to the end; then the non-persistent webhooks are withdrawn.
            if let Some(webhooks) = webhooks {
                webhooks.stop().await;
            }
            // Last: the lease is released and the peering record removed only once nothing works.
            coordination.stop().await;
        };
        let graceful = tokio::time::timeout(ultimate, graceful);
        tokio::select! {
            finished = graceful => finished.map_err(|_| Error::ExitTimeout(ultimate)),
            () = interrupt => Err(Error::Interrupted),
        }
    }
}

pub(super) async fn run_activity(
    activity: &Activity,
    ctx: ActivityCtx,
) -> std::result::Result<(), String> {
    match std::panic::AssertUnwindSafe((activity.func)(ctx))
        .catch_unwind()
        .await
    {
        Ok(Ok(())) => {
            tracing::info!("Activity '{}' succeeded.", activity.id);
            Ok(())
        }
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("the activity panicked".to_string()),
    }
}

/// SIGINT (Ctrl-C) or SIGTERM, caught from this call on: a signal that comes before the future is
/// first polled is not lost (nor does it kill the process, as it would with no handler).
fn stop_signal() -> impl Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut terminate = signal(SignalKind::terminate()).ok();
        async move {
            let interrupted = async {
                match interrupt.as_mut() {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            let terminated = async {
                match terminate.as_mut() {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = interrupted => {}
                () = terminated => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(all(test, feature = "emulator"))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_signal_during_a_slow_shutdown_returns_at_once() {
        let emulator = kactor_emulator::Emulator::start().await.unwrap();
        let operator = Operator::new()
            .client(emulator.client())
            .standalone()
            .on_cleanup("slow", |_: ActivityCtx| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            });
        // The first "signal" stops serving; the second comes while the cleanup hangs.
        let interrupt = async { tokio::time::sleep(Duration::from_millis(300)).await };
        let result =
            tokio::time::timeout(Duration::from_secs(30), operator.serve(async {}, interrupt))
                .await
                .expect("no hang");
        assert!(matches!(result, Err(Error::Interrupted)), "{result:?}");
    }

    #[tokio::test]
    async fn a_client_over_plain_http_without_the_trust_store_still_talks_to_the_cluster() {
        let emulator = kactor_emulator::Emulator::start().await.unwrap();
        let mut config = emulator.config();
        assert_eq!(config.cluster_url.scheme_str(), Some("http"));
        without_trust_store_over_plain_http(&mut config);
        assert_eq!(config.root_cert, Some(Vec::new()));
        let client = kube::Client::try_from(config).unwrap();
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let listed = namespaces.list(&Default::default()).await.unwrap();
        assert!(listed
            .items
            .iter()
            .any(|ns| ns.metadata.name.as_deref() == Some("default")));
    }
}

#[cfg(test)]
mod trust_store {
    use super::without_trust_store_over_plain_http;

    fn config(url: &str, proxy: Option<&str>) -> kube::Config {
        let mut config = kube::Config::new(url.parse().unwrap());
        config.proxy_url = proxy.map(|proxy| proxy.parse().unwrap());
        config
    }

    #[test]
    fn only_a_plain_http_cluster_without_a_ca_or_a_tls_proxy_goes_without_it() {
        let mut plain = config("http://127.0.0.1:8001", None);
        without_trust_store_over_plain_http(&mut plain);
        assert_eq!(plain.root_cert, Some(Vec::new()));

        let mut plain_proxied = config("http://10.0.0.1", Some("http://proxy:3128"));
        without_trust_store_over_plain_http(&mut plain_proxied);
        assert_eq!(plain_proxied.root_cert, Some(Vec::new()));

        // TLS somewhere on the way: the trust store (or the CA given) is what verifies it.
        let mut tls = config("https://10.0.0.1:6443", None);
        without_trust_store_over_plain_http(&mut tls);
        assert_eq!(tls.root_cert, None);

        let mut tls_proxy = config("http://10.0.0.1", Some("https://proxy:3128"));
        without_trust_store_over_plain_http(&mut tls_proxy);
        assert_eq!(tls_proxy.root_cert, None);

        let mut socks = config("http://10.0.0.1", Some("socks5://proxy:1080"));
        without_trust_store_over_plain_http(&mut socks);
        assert_eq!(socks.root_cert, None);

        let mut with_ca = config("http://127.0.0.1:8001", None);
        with_ca.root_cert = Some(vec![b"a CA".to_vec()]);
        without_trust_store_over_plain_http(&mut with_ca);
        assert_eq!(with_ca.root_cert, Some(vec![b"a CA".to_vec()]));
    }
}
