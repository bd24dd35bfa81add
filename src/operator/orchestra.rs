//! The supervisors of an operator, and what decides them: the resources its handlers name (as
//! discovery resolves them, followed as CRDs come and go) × the namespaces it serves (followed as
//! they come and go, for patterns). Beside them, the same way, the streams of the kinds that
//! reconcile handlers own, watch or read ([`RelatedWatch`]): started first, and listed before
//! the supervisors of the resources that read them start (as controller-runtime waits for its
//! caches to sync), so that a reconcile never acts on an empty cache.

use std::time::Duration;

use kactor_actors::related::{Directory, RelatedConfig, RelatedWatch, Route, RouteKind};
use kactor_actors::supervisor::label_of;
use kactor_reactor::cache::Caches;
use kactor_reactor::indexes::Indexes;
use kactor_reactor::sharding::Tenure;

use super::run::run_activity;
use super::*;

/// How long the supervisors wait for the caches they read to list, before starting anyway.
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// A supervisor's identity: the resource (kubectl form) and the namespace (None: cluster-wide).
type SupervisorKey = (String, Option<String>);

/// The users' object actors of one resource.
type Hosts = Vec<Arc<dyn ObjectHost>>;

/// What one resource is served with.
struct Target {
    selector: Selector,
    resolved: Option<Arc<Resource>>,
}

/// A related kind's stream, running.
struct RelatedStream {
    task: tokio::task::JoinHandle<()>,
    /// On the watch board while it runs.
    _entry: BoardEntry,
}

impl Drop for RelatedStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The namespaces matching the scope's patterns, as known now (followed only for
/// [`Served::Patterns`]).
#[derive(Default)]
struct Followed {
    /// Those that exist now.
    current: BTreeSet<String>,
    /// Those seen by the listing under way.
    listing: BTreeSet<String>,
}

/// The supervisors of an operator, and what decides them: resources × namespaces.
pub(super) struct Orchestra {
    client: kube::Client,
    settings: Arc<Settings>,
    registry: Registry,
    /// The users' object actors, by the resource they serve.
    hosts: Vec<(Selector, Arc<dyn ObjectHost>)>,
    actors: ActorSystem,
    limiter: Arc<Semaphore>,
    tracker: Arc<Tracker>,
    daemon_tracker: Arc<Tracker>,
    observer: Arc<dyn Observer>,
    /// The watch streams' health, for `/healthz` and `/readyz`.
    watches: WatchBoard,
    /// The operator's own streams (namespaces, CRDs) on the board.
    own_watches: Vec<BoardEntry>,
    /// The health actor (kept to keep it beating).
    health: Option<Addr<HealthActor>>,
    poster: EventPoster,
    targets: Vec<Target>,
    served: Served,
    followed: Followed,
    resources: Vec<Resource>,
    running: HashMap<SupervisorKey, Addr<ResourceSupervisor>>,
    /// The running supervisors, for the related streams' triggers.
    directory: Directory,
    /// The shared caches.
    caches: Caches,
    /// The indexes.
    indexes: Indexes,
    /// The related kinds' streams, by (kind, namespace).
    related: HashMap<SupervisorKey, RelatedStream>,
    switch: PauseSwitch,
    /// Whether the supervisors are paused: changed only by the loop that follows the switch, so that
    /// a supervisor started in between is started in the state the others are in.
    paused: bool,
}

impl Orchestra {
    pub(super) async fn new(
        operator: &Operator,
        client: kube::Client,
        observer: Arc<dyn Observer>,
        watches: WatchBoard,
    ) -> Result<Self> {
        let resources = discovery::scan(&client).await?;
        let mut targets = Vec::new();
        for selector in operator.selectors() {
            let resolved = match selector.resolve(&resources) {
                Ok(resource) => Some(Arc::new(resource.clone())),
                Err(ResolveError::NotFound { .. }) if selector.exact => {
                    tracing::warn!(resource = %selector, "the resource is not served yet; it is served as soon as its CRD appears");
                    None
                }
                Err(error) => return Err(error.into()),
            };
            targets.push(Target { selector, resolved });
        }
        let served = operator.scope.served()?;
        // The poster's task ends when the last handle is dropped, after posting what is queued.
        let (poster, _) = EventPoster::start(client.clone(), operator.settings.posting.clone());
        Ok(Orchestra {
            client,
            settings: Arc::new(operator.settings.clone()),
            registry: operator.registry.clone(),
            hosts: operator.hosts.clone(),
            actors: ActorSystem::start(
                operator.settings.execution.actors_scheduling,
                operator.settings.execution.object_threads,
            )?,
            limiter: Arc::new(Semaphore::new(
                operator.settings.execution.max_concurrent_handlers.max(1),
            )),
            tracker: Arc::new(Tracker::default()),
            daemon_tracker: Arc::new(Tracker::default()),
            observer,
            watches,
            own_watches: Vec::new(),
            health: None,
            poster,
            targets,
            served,
            followed: Followed::default(),
            resources,
            running: HashMap::new(),
            directory: Directory::default(),
            caches: Caches::default(),
            indexes: {
                let indexes = Indexes::default();
                for handler in &operator.registry.index_handlers {
                    indexes.declare(&handler.id);
                }
                indexes
            },
            related: HashMap::new(),
            switch: operator.switch.clone(),
            paused: false,
        })
    }

    /// Gives each object thread a client of its own, made there with `make`, so that the requests
    /// of the handlers that run on a thread (and their connections) stay on it. Before any
    /// supervisor starts.
    pub(super) async fn connect_object_threads<F>(&mut self, make: F) -> Result<()>
    where
        F: Fn() -> Result<kube::Client, kube::Error> + Send + Sync + 'static,
    {
        self.actors.connect_object_threads(make).await?;
        Ok(())
    }

    /// Starts the health actors on the actors' thread and on each object thread: their heartbeats
    /// prove the threads are not stuck.
    pub(super) async fn start_health(&mut self, state: Arc<HealthState>) -> Result<()> {
        use actix::Actor as _;
        let threads = self.actors.object_threads();
        state.expect_object_threads(threads.len());
        for (number, thread) in threads.iter().enumerate() {
            let state = state.clone();
            HealthActor::start_in_arbiter(&thread.arbiter, move |_| {
                HealthActor::for_object_thread(state, number)
            });
        }
        self.health = Some(
            self.actors
                .start_actor(move || HealthActor::new(state))
                .await?,
        );
        Ok(())
    }

    /// A watcher of the operator's own (namespaces, CRDs), on the health board while it lives.
    fn watcher_for(&mut self, group: &str, plural: &str, label: &str) -> Option<Watcher> {
        let resource = self
            .resources
            .iter()
            .find(|r| r.group == group && r.plural == plural && r.preferred)?;
        let api = kactor_reactor::slim::api(self.client.clone(), None, &resource.api_resource());
        let watcher = Watcher::new(
            api,
            label,
            self.settings.watching.clone(),
            self.settings.networking.clone(),
        )
        .observed(self.observer.clone(), resource.to_string());
        self.own_watches
            .push(self.watches.register(label, watcher.status()));
        Some(watcher)
    }

    /// Serves until `stop`: starts the supervisors, then follows namespaces and CRDs.
    pub(super) async fn serve(
        &mut self,
        stop: impl Future<Output = ()> + Send,
        started: impl FnOnce() + Send,
    ) -> Result<()> {
        // Subscribe before the first supervisor starts: no change of the switch can fall in between.
        let mut pauses = self.switch.subscribe();
        self.paused = !pauses.borrow_and_update().is_empty();
        self.observer.paused(self.paused);
        if self.paused {
            tracing::info!(reasons = ?self.switch.reasons(), "Starting paused.");
        }
        if let Some(tenure) = self.tenure() {
            // Nothing is held from before: a start counts as a pause since every end so far.
            tenure.quiesced(tenure.ended());
        }
        self.reconcile().await?;
        let mut namespaces = match self.served {
            Served::Patterns { .. } => self.watcher_for("", "namespaces", "namespaces"),
            _ => None,
        };
        let mut crds = self.watcher_for(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "customresourcedefinitions",
        );
        // Every stream readiness waits for is on the board now.
        started();
        tokio::pin!(stop);
        loop {
            let namespace_batch = async {
                match namespaces.as_mut() {
                    Some(watcher) => watcher.next_batch().await,
                    None => std::future::pending().await,
                }
            };
            let crd_batch = async {
                match crds.as_mut() {
                    Some(watcher) => watcher.next_batch().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut stop => return Ok(()),
                changed = pauses.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    let reasons = pauses.borrow_and_update().clone();
                    self.follow_switch(&reasons).await;
                }
                batch = namespace_batch => match batch {
                    Ok(items) => {
                        if self.follow_namespaces(items) {
                            self.reconcile().await?;
                        }
                    }
                    Err(error) => {
                        tracing::error!(%error, "cannot follow namespaces any more");
                        namespaces = None;
                    }
                },
                batch = crd_batch => match batch {
                    Ok(items) => {
                        if items.iter().any(|item| matches!(item, WatchItem::Event(..))) {
                            self.rescan().await;
                            self.reconcile().await?;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot follow CRDs any more; resources appearing later will not be served");
                        crds = None;
                    }
                },
            }
        }
    }

    /// Sharded: this replica's tenure in its ring.
    fn tenure(&self) -> Option<Tenure> {
        self.settings
            .shard
            .as_ref()
            .map(|shard| shard.tenure().clone())
    }

    /// Pauses or resumes the supervisors as the switch now says. Sharded, a membership of the ring
    /// that ended since the last pause makes a pause first, even when the switch says resume already
    /// (the member left and joined again before this loop looked): what the workers hold is from
    /// before it, and the tenure holds again only once every worker has taken that pause.
    async fn follow_switch(&mut self, reasons: &std::collections::BTreeMap<String, String>) {
        if let Some(tenure) = self.tenure().filter(Tenure::needs_pause) {
            let ended = tenure.ended();
            if !self.paused {
                let why = std::collections::BTreeMap::from([(
                    String::new(),
                    "the ring membership ended since the last pause".to_string(),
                )]);
                self.paused = true;
                self.pause_all(true, &why).await;
            }
            // Paused (now, or since before the end: nothing resumed since).
            tenure.quiesced(ended);
        }
        if reasons.is_empty() == self.paused {
            self.paused = !reasons.is_empty();
            self.pause_all(self.paused, reasons).await;
        }
    }

    /// Pauses every supervisor (streams stop, memories stay), until each has paused all its workers;
    /// or resumes them (they list again).
    async fn pause_all(&self, paused: bool, reasons: &std::collections::BTreeMap<String, String>) {
        self.observer.paused(paused);
        if paused {
            let why: Vec<&str> = reasons.values().map(String::as_str).collect();
            tracing::info!("Pausing operations: {}.", why.join("; "));
            let pausing = self
                .running
                .values()
                .map(|supervisor| supervisor.send(Pause));
            futures::future::join_all(pausing).await;
        } else {
            tracing::info!("Resuming operations.");
            for supervisor in self.running.values() {
                supervisor.do_send(Resume);
            }
        }
    }

    /// Updates the served namespaces; true if they changed.
    fn follow_namespaces(&mut self, items: Vec<WatchItem>) -> bool {
        let Served::Patterns { patterns, .. } = &self.served else {
            return false;
        };
        let Followed { current, listing } = &mut self.followed;
        let before = current.clone();
        for item in items {
            match item {
                WatchItem::Listed(ns) => {
                    let name = ns.metadata.name.unwrap_or_default();
                    if patterns.matches(&name) {
                        listing.insert(name);
                    }
                }
                WatchItem::ListDone => *current = std::mem::take(listing),
                WatchItem::Event(kind, ns) => {
                    let name = ns.metadata.name.unwrap_or_default();
                    if kind == kactor_reactor::watching::EventType::Deleted {
                        current.remove(&name);
                    } else if patterns.matches(&name) {
                        current.insert(name);
                    }
                }
            }
        }
        *current != before
    }

    /// Rescans discovery after a CRD changed, and re-resolves every handler's resource.
    async fn rescan(&mut self) {
        match discovery::scan(&self.client).await {
            Ok(resources) => self.resources = resources,
            Err(error) => {
                tracing::warn!(%error, "discovery failed after a CRD changed; keeping what was served");
                return;
            }
        }
        for target in &mut self.targets {
            let resolved = target
                .selector
                .resolve(&self.resources)
                .ok()
                .map(|r| Arc::new(r.clone()));
            if resolved.as_deref() != target.resolved.as_deref() {
                match &resolved {
                    Some(resource) => {
                        tracing::info!(resource = %resource, "serving a resource that appeared")
                    }
                    None => {
                        tracing::info!(resource = %target.selector, "the resource is no longer served")
                    }
                }
                target.resolved = resolved;
            }
        }
    }

    /// Starts the supervisors that should run and stops those that should not.
    async fn reconcile(&mut self) -> Result<()> {
        let mut desired: HashMap<SupervisorKey, (Arc<Resource>, ResourceHandlers, Hosts)> =
            HashMap::new();
        for target in &self.targets {
            let Some(resource) = &target.resolved else {
                continue;
            };
            let handlers = self.registry.handlers_for(&target.selector);
            for namespace in self.namespaces_of(resource) {
                let entry = desired
                    .entry((resource.to_string(), namespace))
                    .or_insert_with(|| (resource.clone(), ResourceHandlers::default(), Vec::new()));
                entry.1.extend(&handlers);
                entry.2.extend(
                    self.hosts
                        .iter()
                        .filter(|(selector, _)| *selector == target.selector)
                        .map(|(_, host)| host.clone()),
                );
            }
        }
        let obsolete: Vec<_> = self
            .running
            .keys()
            .filter(|k| !desired.contains_key(*k))
            .cloned()
            .collect();
        for key in obsolete {
            if let Some(supervisor) = self.running.remove(&key) {
                tracing::debug!(resource = %key.0, namespace = ?key.1, "stopping a supervisor");
                supervisor.do_send(Shutdown);
            }
        }
        self.reconcile_related().await;
        // Every indexed stream counts for the indexes' readiness before any stream starts.
        for (key, (resource, handlers, _)) in &desired {
            if !handlers.index.is_empty() && !self.running.get(key).is_some_and(Addr::connected) {
                self.indexes
                    .expect_stream(&label_of(resource, key.1.as_deref()));
            }
        }
        for (key, (resource, handlers, actors)) in desired {
            if self.running.get(&key).is_some_and(Addr::connected) {
                continue;
            }
            let config = SupervisorConfig {
                resource,
                namespace: key.1.clone(),
                client: self.client.clone(),
                handlers: Arc::new(handlers),
                poster: self.poster.clone(),
                settings: self.settings.clone(),
                runtime: tokio::runtime::Handle::current(),
                object_threads: self.actors.object_threads(),
                limiter: self.limiter.clone(),
                tracker: self.tracker.clone(),
                daemon_tracker: self.daemon_tracker.clone(),
                observer: self.observer.clone(),
                watches: self.watches.clone(),
                start_paused: self.paused,
                actors,
                caches: Some(self.caches.clone()),
                indexes: Some(self.indexes.clone()),
            };
            let supervisor = self
                .actors
                .start_actor(move || ResourceSupervisor::new(config))
                .await?;
            self.running.insert(key, supervisor);
        }
        let mut directory = self
            .directory
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        directory.clone_from(&self.running);
        Ok(())
    }

    /// Sharded: what the assigner assigns, every served resource in every served namespace. Namespace
    /// patterns with globs are refused (the assigner does not follow namespaces as they come).
    pub(super) fn shard_targets(&self) -> Result<Vec<kactor_peering::sharding::Target>> {
        if let Served::Patterns { .. } = self.served {
            return Err(Error::ShardingConflict(
                "namespace patterns with globs are not supported: serve the whole cluster (-A) or name the namespaces".to_string(),
            ));
        }
        let mut targets = Vec::new();
        for resource in self.targets.iter().filter_map(|t| t.resolved.as_ref()) {
            for namespace in self.namespaces_of(resource) {
                targets.push(kactor_peering::sharding::Target::new(
                    resource.api_resource(),
                    namespace,
                ));
            }
        }
        Ok(targets)
    }

    /// The namespaces a resource is served in, as supervisors and related streams are.
    fn namespaces_of(&self, resource: &Resource) -> Vec<Option<String>> {
        match (&self.served, resource.namespaced) {
            (Served::ClusterWide, _) | (_, false) => vec![None],
            (Served::Fixed(names), true) => names.iter().cloned().map(Some).collect(),
            (Served::Patterns { .. }, true) => {
                self.followed.current.iter().cloned().map(Some).collect()
            }
        }
    }

    /// The routes from a related kind to the reconciled resources that own or watch it.
    fn routes_to(&self, child: &Resource) -> Vec<Route> {
        let mut routes = Vec::new();
        for handler in &self.registry.reconcile_handlers {
            let parent = self
                .targets
                .iter()
                .find(|t| t.selector == handler.selector)
                .and_then(|t| t.resolved.clone());
            let Some(parent) = parent else {
                continue;
            };
            let names = |selector: &Selector| {
                selector
                    .resolve(&self.resources)
                    .is_ok_and(|resource| resource == child)
            };
            for owns in handler.options.owns.iter().filter(|o| names(&o.selector)) {
                routes.push(Route {
                    parent: parent.clone(),
                    kind: RouteKind::Owns(owns.owners),
                });
            }
            for watches in handler
                .options
                .watches
                .iter()
                .filter(|w| names(&w.selector))
            {
                routes.push(Route {
                    parent: parent.clone(),
                    kind: RouteKind::Watches(watches.map.clone()),
                });
            }
        }
        routes
    }

    /// Starts the related streams that should run and stops those that should not; waits (up to
    /// [`CACHE_SYNC_TIMEOUT`]) for those it started to list.
    async fn reconcile_related(&mut self) {
        let mut desired: HashMap<SupervisorKey, Arc<Resource>> = HashMap::new();
        for selector in self.registry.cached_kinds() {
            match selector.resolve(&self.resources) {
                Ok(resource) => {
                    let resource = Arc::new(resource.clone());
                    for namespace in self.namespaces_of(&resource) {
                        desired.insert((resource.to_string(), namespace), resource.clone());
                    }
                }
                Err(error) => {
                    tracing::warn!(resource = %selector.name, %error, "a kind that reconcile handlers read is not served; it is not cached")
                }
            }
        }
        self.related.retain(|key, _| desired.contains_key(key));
        let mut started = Vec::new();
        for (key, resource) in desired {
            if self
                .related
                .get(&key)
                .is_some_and(|s| !s.task.is_finished())
            {
                continue;
            }
            let observer = self.observer.clone();
            let watch = RelatedWatch::new(RelatedConfig {
                store: self.caches.store(&resource, &observer),
                routes: self.routes_to(&resource),
                resource: resource.clone(),
                namespace: key.1.clone(),
                client: self.client.clone(),
                settings: self.settings.clone(),
                observer,
                directory: self.directory.clone(),
                transform: self
                    .registry
                    .cache_transforms
                    .iter()
                    .find(|(selector, _)| selector.matches(&resource))
                    .map(|(_, transform)| transform.clone()),
                metadata_only: self
                    .registry
                    .metadata_only
                    .iter()
                    .any(|selector| selector.matches(&resource)),
            });
            let status = watch.status();
            let entry = self.watches.register(watch.label(), status.clone());
            let task = tokio::spawn(watch.run());
            started.push(status);
            self.related.insert(
                key,
                RelatedStream {
                    task,
                    _entry: entry,
                },
            );
        }
        let synced = async {
            while !started.iter().all(|status| status.is_listed()) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(CACHE_SYNC_TIMEOUT, synced)
            .await
            .is_err()
        {
            tracing::warn!(
                "the caches of related kinds did not list within {} seconds; serving anyway",
                CACHE_SYNC_TIMEOUT.as_secs()
            );
        }
    }

    /// Stops watching, lets handlers finish within `exit_timeout`, runs cleanup.
    pub(super) async fn shutdown(&mut self, registry: &Registry, activity_ctx: ActivityCtx) {
        for (_, supervisor) in self.running.drain() {
            let _ = supervisor.send(Shutdown).await;
        }
        self.related.clear();
        let cancelled = self
            .tracker
            .drain(self.settings.queueing.exit_timeout)
            .await;
        if cancelled > 0 {
            tracing::warn!(cancelled, "handlers still running at exit were cancelled");
        }
        // Daemons and timers were asked to stop (OPERATOR_EXITING) and go through their stopping
        // stages; they get the longest of those stages, or `exit_timeout`, then are cancelled.
        let stages = registry
            .spawning_handlers
            .iter()
            .map(|h| {
                let c = h.cancellation();
                c.backoff.unwrap_or_default() + c.timeout.unwrap_or_default()
            })
            .max()
            .unwrap_or_default();
        let wait = stages.max(self.settings.queueing.exit_timeout);
        let cancelled = self.daemon_tracker.drain(wait).await;
        if cancelled > 0 {
            tracing::warn!(
                cancelled,
                "daemons and timers still running at exit were cancelled"
            );
        }
        for activity in &registry.cleanup {
            if let Err(error) = run_activity(activity, activity_ctx.clone()).await {
                tracing::error!(activity = %activity.id, %error, "the cleanup activity failed");
            }
        }
    }
}
