//! The `Operator` builder, and the run loop that turns its handlers into watched resources: the
//! builder here, the run sequence in `run`, peering and leader election in `coordination`, the
//! supervisors (resources × namespaces) in `orchestra`.
//!
//! **Expected flow** of [`Operator::run_until`]:
//! 1. connect (the given client, or credentials from the usual places: in-cluster service account,
//!    `KUBECONFIG`, `~/.kube/config`);
//! 2. run the startup activities, in order; a failure stops the operator (as in Kopf);
//! 3. discover what the cluster serves and resolve every handler's resource; a name that matches
//!    nothing, or several things, is an error; a full group/version/plural that is not served yet is
//!    served as soon as its CRD appears;
//! 4. start a [`ResourceSupervisor`] per (resource, namespace): cluster-wide, or per namespace matching
//!    the patterns, following namespaces as they are created and deleted, and CRDs as they appear and
//!    go;
//! 5. on the stop signal: stop watching, give running handlers `queueing.exit_timeout` to finish and
//!    cancel the rest; daemons and timers are asked to stop (`OPERATOR_EXITING`) and get the longest
//!    of their stopping stages (or `exit_timeout`); then run the cleanup activities; a second signal
//!    returns at once.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;

use actix::Addr;
use futures::FutureExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kactor_actors::objects::{ActorOptions, Actors, ObjectActor, ObjectHost};
use kactor_actors::supervisor::{Pause, ResourceSupervisor, Resume, Shutdown, SupervisorConfig};
use kactor_actors::system::ActorSystem;
use kactor_actors::tracker::Tracker;
use kactor_health::{Check, HealthActor, HealthServer, HealthState, Metrics};
use kactor_peering::lease::{LeaderElector, LeaseSettings};
use kactor_peering::peering::{PeeringMode, PeeringSettings};
use kactor_peering::sharding::RingSettings;
use kactor_reactor::admission::{
    admission_fn, Admission, AdmissionCtx, AdmissionError, AdmissionHandler, AdmissionKind,
};
use kactor_reactor::causes::Reason;
use kactor_reactor::daemons::{Daemon, Timer};
use kactor_reactor::discovery::{self, ResolveError};
use kactor_reactor::handlers::{
    handler_fn, Activity, ActivityCtx, ChangingHandler, Ctx, ErrorsMode, EventHandler,
    HandlerError, HandlerResult, IndexHandler, Memo, On, Probe, Registry, ResourceHandlers,
    Spawning, SpawningHandler,
};
use kactor_reactor::metered::{metered, MeteredLayer};
use kactor_reactor::observe::{BoardEntry, Observer, Tee, WatchBoard};
use kactor_reactor::pausing::PauseSwitch;
use kactor_reactor::posting::EventPoster;
use kactor_reactor::reconcile::{reconcile_fn, Action, Reconcile, ReconcileHandler};
use kactor_reactor::resources::{Resource, Selector};
use kactor_reactor::settings::Settings;
use kactor_reactor::sharding::Shard;
use kactor_reactor::watching::{WatchItem, Watcher};
use kube::api::{Api, DynamicObject};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::scope::{Scope, Served};

mod admission;
mod coordination;
mod orchestra;
mod run;

/// An operator: handlers, settings, and where to run them.
///
/// ```no_run
/// use kactor::prelude::*;
///
/// # async fn example() -> kactor::Result<()> {
/// Operator::new()
///     .on_event("widgets.example.com", "log_event", |ctx: Ctx| async move {
///         tracing::info!("{:?} {}", ctx.kopf_type(), ctx.name());
///         Ok(())
///     })
///     .run_from_args()
///     .await
/// # }
/// ```
pub struct Operator {
    registry: Registry,
    settings: Settings,
    connection: Option<Connection>,
    scope: Scope,
    memo: Memo,
    switch: PauseSwitch,
    peering: PeeringSettings,
    leader_election: Option<LeaseSettings>,
    /// The ring this replica shares the objects in ([`Operator::shards`]).
    sharding: Option<RingSettings>,
    pub(crate) identity: Option<String>,
    /// kactor's Prometheus metrics (the first observer).
    metrics: Arc<Metrics>,
    /// The application's own observers, told everything the metrics are.
    observers: Vec<Arc<dyn Observer>>,
    /// `--liveness`: where health and metrics are served.
    liveness: Option<String>,
    liveness_checks: Vec<(String, Check)>,
    readiness_checks: Vec<(String, Check)>,
    /// The CRDs this operator owns, printed by `crds`.
    crds: Vec<CustomResourceDefinition>,
    /// What the handlers do with their own clients, for `rbac generate`.
    permissions: Vec<Extra>,
    /// The object actors, by the resource they serve.
    hosts: Vec<(Selector, Arc<dyn ObjectHost>)>,
    /// The object actors' tables, by actor type, for [`Operator::actors`].
    actor_types: HashMap<std::any::TypeId, Box<dyn std::any::Any + Send + Sync>>,
}

impl Default for Operator {
    fn default() -> Self {
        Operator::new()
    }
}

impl Operator {
    /// An operator with no handlers, Kopf's default settings, serving the whole cluster.
    pub fn new() -> Self {
        Operator {
            registry: Registry::default(),
            settings: Settings::default(),
            connection: None,
            scope: Scope::ClusterWide,
            memo: Memo::default(),
            switch: PauseSwitch::new(),
            peering: PeeringSettings::default(),
            leader_election: None,
            sharding: None,
            identity: None,
            metrics: Arc::new(
                Metrics::new().expect("kactor's metrics register on a fresh registry"),
            ),
            observers: Vec::new(),
            liveness: None,
            liveness_checks: Vec::new(),
            readiness_checks: Vec::new(),
            crds: Vec::new(),
            permissions: Vec::new(),
            hosts: Vec::new(),
            actor_types: HashMap::new(),
        }
    }

    /// Changes the settings.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().settings(|s| s.watching.inactivity_timeout = std::time::Duration::from_secs(30));
    /// ```
    pub fn settings(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(&mut self.settings);
        self
    }

    /// Uses this client instead of finding credentials.
    ///
    /// Every request of the operator is counted in its metrics, whoever built the client. A client
    /// handed in ready-made is counted through a second request buffer wrapped around it (one more
    /// task hop per request); where you have the client's configuration,
    /// [`kube_config`](Self::kube_config) avoids that.
    pub fn client(mut self, client: kube::Client) -> Self {
        self.connection = Some(Connection::Client(client));
        self
    }

    /// Connects with this configuration instead of finding credentials: a kubeconfig's context of
    /// your choosing, a token, an emulator's `config()`. The operator builds its client from it as
    /// it does from the credentials it finds, with its request metering inside kube's one request
    /// buffer. The last of `client` and `kube_config` given is used. A cluster reached over plain
    /// `http://` with no CA in the configuration is connected to without loading the machine's
    /// trust store (it has no certificate to verify), unless a proxy other than a plain-HTTP one
    /// is set.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let options = kube::config::KubeConfigOptions {
    ///     context: Some("staging".into()),
    ///     ..Default::default()
    /// };
    /// let config = kube::Config::from_kubeconfig(&options).await?;
    /// let operator = Operator::new().kube_config(config);
    /// # Ok(()) }
    /// ```
    pub fn kube_config(mut self, config: kube::Config) -> Self {
        self.connection = Some(Connection::Config(Box::new(config)));
        self
    }

    /// Serves only the namespaces matching these patterns (`-n`).
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().namespaces(["team-*", "!team-legacy"]);
    /// ```
    pub fn namespaces<I: IntoIterator<Item = S>, S: Into<String>>(mut self, patterns: I) -> Self {
        self.scope = Scope::Namespaces(patterns.into_iter().map(Into::into).collect());
        self
    }

    /// Serves the whole cluster (`-A`, the default).
    pub fn cluster_wide(mut self) -> Self {
        self.scope = Scope::ClusterWide;
        self
    }

    /// Sets the scope.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// The operator's pause switch: any toggle on pauses watching (peering and leader election set
    /// theirs; an embedding application may set its own). Paused, the supervisors stop their streams
    /// and keep every object's memory; resumed, they list again.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new();
    /// let switch = operator.pause_switch();
    /// switch.set("maintenance", Some("the database is being migrated".into()));
    /// ```
    pub fn pause_switch(&self) -> PauseSwitch {
        self.switch.clone()
    }

    /// Runs alone, without peering (Kopf's `--standalone`). By default an operator peers through the
    /// peering object `default` when its CRD is installed, and runs alone (with a warning) when not.
    pub fn standalone(mut self) -> Self {
        self.peering.mode = PeeringMode::Standalone;
        self
    }

    /// Peers through the peering object `name`, and stays paused while it or its CRD is missing
    /// (Kopf's `--peering NAME`). The highest priority among live peers works; the others pause;
    /// equal priorities all pause.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().peering("team-a").priority(100);
    /// ```
    pub fn peering(mut self, name: &str) -> Self {
        self.peering.name = name.to_string();
        self.peering.mode = PeeringMode::Mandatory;
        self
    }

    /// This operator's peering priority (Kopf's `--priority`; `--dev` is 666).
    pub fn priority(mut self, priority: i64) -> Self {
        self.peering.priority = priority;
        self
    }

    /// Changes the other peering settings (lifetime, stealth, ...), with Kopf's defaults.
    pub fn peering_settings(mut self, change: impl FnOnce(&mut PeeringSettings)) -> Self {
        change(&mut self.peering);
        self
    }

    /// This operator's identity among peers and lease holders (default: `POD_ID`, else
    /// `user@host/timestamp/random`, as Kopf).
    pub fn identity(mut self, identity: &str) -> Self {
        self.identity = Some(identity.to_string());
        self
    }

    /// Works only while holding a `coordination.k8s.io/v1` Lease, as controller-runtime's leader
    /// election (15 s / 10 s / 2 s by default): the other instances wait as warm standbys, a leader
    /// that cannot renew stops working at once, and a graceful exit releases the lease.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// use kactor::peering::lease::LeaseSettings;
    /// let operator = Operator::new().leader_election(LeaseSettings::new("my-operator", "operators", "pod-1"));
    /// ```
    pub fn leader_election(mut self, settings: LeaseSettings) -> Self {
        self.leader_election = Some(settings);
        self
    }

    /// Shares the objects with the other replicas of this operator (`docs/sharding.md`): each object
    /// belongs to one live replica, named by its label `shard.kactor.dev/<ring>`, and this replica
    /// watches, caches and handles only its own. Every replica keeps a `coordination.k8s.io/v1` Lease
    /// of its own (`<ring>-<identity>`, 15 s / 10 s / 2 s by default) and pauses when it cannot renew
    /// it; the holder of the leader Lease `<ring>` assigns the objects (rendezvous hashing by uid),
    /// moves them from live replicas through a handover (`drain.kactor.dev/<ring>`) and from dead ones
    /// once it has taken their Lease over. Every write to an object is fenced: it is rejected once the
    /// object is no longer this replica's. One replica alone works as without sharding.
    ///
    /// Not with [`Operator::leader_election`] (the leader Lease elects the assigner here).
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// use kactor::sharding::RingSettings;
    /// let operator = Operator::new().shards(RingSettings::new("my-operator", "operators", "pod-1"));
    /// ```
    pub fn shards(mut self, settings: RingSettings) -> Self {
        self.sharding = Some(settings);
        self
    }

    /// The operator-wide memo given to activities.
    pub fn memo(&self) -> Memo {
        self.memo.clone()
    }

    /// Registers a handler for every watch event of a resource's objects, the initial listing
    /// included (event type `Listed`, Kopf's `None`). Errors are logged and never retried.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_event(("example.com", "v1", "widgets"), "audit", |ctx: Ctx| async move {
    ///     println!("{:?} {}/{}", ctx.event_type, ctx.namespace().unwrap_or_default(), ctx.name());
    ///     Ok(())
    /// });
    /// ```
    ///
    /// A returned value other than `()` lands in `status.<id>`; filters apply as for other
    /// handlers (`On::id("audit").label("app", "web")`).
    pub fn on_event<S, O, F, Fut, R>(mut self, resource: S, on: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        let on = on.into();
        self.registry.event_handlers.push(EventHandler {
            id: on.id,
            selector: resource.into(),
            filters: on.filters,
            param: on.options.param,
            func: handler_fn(handler),
        });
        self
    }

    /// Registers a validating admission handler (Kopf's `@kopf.on.validate`): the API server asks
    /// it before it stores a change of `resource`, through the operator's webhook server
    /// (`settings.admission.server`, required). `Ok` allows; [`AdmissionError::deny`] refuses with
    /// a message and a code (any other error refuses with code 500); `ctx.warn(..)` adds a warning
    /// the client is shown either way. See `docs/admission.md`.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// # use kactor::admission::{Admission, AdmissionCtx, AdmissionError, Operation};
    /// # use std::sync::Arc;
    /// let operator = Operator::new()
    ///     .settings(|s| {
    ///         s.admission.server = Some(Default::default());
    ///         s.admission.managed = Some("auto.example.com".into());
    ///     })
    ///     .on_validate(
    ///         "widgets.example.com",
    ///         Admission::id("check-size").operations([Operation::Create, Operation::Update]),
    ///         |ctx: Arc<AdmissionCtx>| async move {
    ///             match ctx.spec()["size"].as_i64() {
    ///                 Some(size) if size > 100 => Err(AdmissionError::deny("size is at most 100").code(400)),
    ///                 Some(_) => Ok(()),
    ///                 None => Err(AdmissionError::deny("spec.size is required").code(400)),
    ///             }
    ///         },
    ///     );
    /// ```
    pub fn on_validate<S, A, F, Fut>(self, resource: S, admission: A, handler: F) -> Self
    where
        S: Into<Selector>,
        A: Into<Admission>,
        F: Fn(Arc<AdmissionCtx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), AdmissionError>> + Send + 'static,
    {
        self.admission(AdmissionKind::Validating, resource, admission, handler)
    }

    /// Registers a mutating admission handler (Kopf's `@kopf.on.mutate`): as
    /// [`Operator::on_validate`], and what it adds to `ctx.patch()` is applied to the object
    /// before it is stored (answered as a JSON patch). It does not run for deletions unless
    /// `DELETE` is its only operation.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// # use kactor::admission::AdmissionCtx;
    /// # use std::sync::Arc;
    /// let operator = Operator::new().on_mutate("widgets.example.com", "defaults", |ctx: Arc<AdmissionCtx>| async move {
    ///     if ctx.spec().get("size").is_none() {
    ///         ctx.patch().set(&["spec", "size"], json!(1));
    ///     }
    ///     Ok(())
    /// });
    /// ```
    pub fn on_mutate<S, A, F, Fut>(self, resource: S, admission: A, handler: F) -> Self
    where
        S: Into<Selector>,
        A: Into<Admission>,
        F: Fn(Arc<AdmissionCtx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), AdmissionError>> + Send + 'static,
    {
        self.admission(AdmissionKind::Mutating, resource, admission, handler)
    }

    fn admission<S, A, F, Fut>(
        mut self,
        kind: AdmissionKind,
        resource: S,
        admission: A,
        f: F,
    ) -> Self
    where
        S: Into<Selector>,
        A: Into<Admission>,
        F: Fn(Arc<AdmissionCtx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), AdmissionError>> + Send + 'static,
    {
        self.registry.admission_handlers.push(AdmissionHandler {
            kind,
            selector: resource.into(),
            admission: admission.into(),
            func: admission_fn(f),
        });
        self
    }

    /// Registers a conversion of a custom resource from the version `from` to the version `to`
    /// (a CRD conversion webhook, served by the operator's webhook server; controller-runtime
    /// has them, Kopf does not). The function is typed: `From` and `To` are the two versions'
    /// Rust types (or `serde_json::Value`). The API server asks for a conversion whenever a
    /// client reads or writes another version than the stored one; kactor chains registered
    /// conversions when no direct one exists, and keeps the object's metadata (only labels and
    /// annotations may change). With `settings.admission.managed`, the CRD's `spec.conversion` is
    /// pointed at the server. See `docs/admission.md`.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new()
    ///     .convert("widgets.example.com", "v1", "v2", |mut widget: serde_json::Value| {
    ///         // v2 keeps the size under spec.dimensions.
    ///         let size = widget["spec"]["size"].take();
    ///         widget["spec"] = json!({"dimensions": {"size": size}});
    ///         Ok(widget)
    ///     })
    ///     .convert("widgets.example.com", "v2", "v1", |mut widget: serde_json::Value| {
    ///         let size = widget["spec"]["dimensions"]["size"].take();
    ///         widget["spec"] = json!({"size": size});
    ///         Ok(widget)
    ///     });
    /// ```
    pub fn convert<S, From, To, F>(mut self, resource: S, from: &str, to: &str, f: F) -> Self
    where
        S: Into<Selector>,
        From: serde::de::DeserializeOwned,
        To: serde::Serialize,
        F: Fn(From) -> std::result::Result<To, HandlerError> + Send + Sync + 'static,
    {
        self.registry
            .conversion_handlers
            .push(kactor_reactor::admission::ConversionHandler {
                selector: resource.into(),
                from: from.to_string(),
                to: to.to_string(),
                func: kactor_reactor::admission::convert_fn(f),
            });
        self
    }

    /// Registers a reconcile handler (Operator SDK's and kube-rs's model): level-based, given the
    /// object as it is now, run when it changes (as its predicate says), when an object it
    /// [owns](Reconcile::owns) or [watches](Reconcile::watches) changes, and when the requeue it
    /// asked for comes due; errors are retried per object with an exponential backoff (5 ms to
    /// 1000 s), reset by a success. It runs in the object's worker, after the object's changing
    /// handlers, never at the same time as another handler of the object. See `docs/reconcile.md`.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// # use std::time::Duration;
    /// let operator = Operator::new().on_reconcile(
    ///     ("cache.example.com", "v1alpha1", "memcacheds"),
    ///     Reconcile::id("memcached").owns("deployments.v1.apps"),
    ///     |ctx: Ctx| async move {
    ///         let deployments = ctx.cache("deployments.v1.apps")?;
    ///         let ns = ctx.namespace();
    ///         if deployments.get(ns, ctx.name()).is_none() {
    ///             // ... create it (ctx.client()), owned by the object (ctx.adopt(&mut deployment))
    ///         }
    ///         Ok(Action::requeue(Duration::from_secs(300)))
    ///     },
    /// );
    /// ```
    pub fn on_reconcile<S, O, F, Fut>(mut self, resource: S, options: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<Reconcile>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Action, HandlerError>> + Send + 'static,
    {
        self.registry.reconcile_handlers.push(ReconcileHandler {
            selector: resource.into(),
            options: options.into(),
            func: reconcile_fn(handler),
        });
        self
    }

    /// Registers an index handler (Kopf's `@kopf.index`): an in-memory index of the resource's
    /// objects, read by any handler with `ctx.index(id)`. What it returns for an object is kept
    /// until the object's next event: a map is merged per key (each entry's value under its key),
    /// any other value goes under the key `None`, null keeps what the object gave before. An
    /// object's values go when it is deleted or stops passing the filters. Errors are ignored by
    /// default (the stale values stay); `On::errors` changes it, as in Kopf. Resource handlers of
    /// every resource start only once the indexes are populated (every indexed resource listed,
    /// and each listed object indexed).
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new()
    ///     .index("pods", "by_node", |ctx: Ctx| async move {
    ///         let node = ctx.spec()["nodeName"].as_str().unwrap_or_default().to_string();
    ///         Ok(json!({ node: ctx.name() }))
    ///     })
    ///     .on_create("nodes", "count_pods", |ctx: Ctx| async move {
    ///         let pods = ctx.index("by_node")?.get(Some(ctx.name())).len();
    ///         Ok(json!({"pods": pods}))
    ///     });
    /// ```
    pub fn index<S, O, F, Fut, R>(mut self, resource: S, on: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        let on = on.into();
        self.registry.index_handlers.push(IndexHandler {
            id: on.id,
            selector: resource.into(),
            filters: on.filters,
            errors: on.options.errors.unwrap_or(ErrorsMode::Ignored),
            backoff: on.options.backoff,
            param: on.options.param,
            func: handler_fn(handler),
        });
        self
    }

    /// Registers a handler of an owned kind's changes, Kopf-style: it runs in the worker of the
    /// object of `parent` that owns the changed object of `child` (its controller owner reference),
    /// serialised with that object's other handlers, and is told what changed in
    /// `ctx.triggers().related`; `ctx.cache(child)` has the children. Errors are retried with the
    /// reconcile backoff (5 ms doubling to 1000 s), the retry told the same changes.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_owned(
    ///     ("example.com", "v1", "widgets"),
    ///     "configmaps",
    ///     "config_changed",
    ///     |ctx: Ctx| async move {
    ///         for change in &ctx.triggers().related {
    ///             ctx.logger().info(format!("{change}")); // "configmaps.v1 default/w1 modified"
    ///         }
    ///         Ok(())
    ///     },
    /// );
    /// ```
    pub fn on_owned<P, C, F, Fut>(self, parent: P, child: C, id: &str, handler: F) -> Self
    where
        P: Into<Selector>,
        C: Into<Selector>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        self.on_reconcile(
            parent,
            Reconcile::id(id).owns(child).related_only(),
            move |ctx: Ctx| {
                let run = handler(ctx);
                async move { run.await.map(|()| Action::await_change()) }
            },
        )
    }

    /// Changes the objects of `resource` before the shared cache keeps them, when `resource` is a
    /// kind that reconcile handlers own, watch or read (kube-rs's `modify`, controller-runtime's
    /// `TransformFunc`): to keep only what handlers read, and so bound the cache's memory.
    /// `metadata.managedFields` is always dropped first.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().cache_transform("pods", |pod| {
    ///     pod.data["spec"] = json!({}); // only labels and status are read
    /// });
    /// ```
    pub fn cache_transform<S: Into<Selector>>(
        mut self,
        resource: S,
        transform: impl Fn(&mut DynamicObject) + Send + Sync + 'static,
    ) -> Self {
        self.registry
            .cache_transforms
            .push((resource.into(), Arc::new(transform)));
        self
    }

    /// The shared cache of `resource`, a kind that reconcile handlers own, watch or read, keeps
    /// the objects' metadata alone: it is listed and watched as `PartialObjectMetadata`
    /// (controller-runtime's metadata-only watches, kube-rs's `metadata_watcher`). Owner
    /// references, labels and annotations route, select and trigger as ever; what the server
    /// sends and the cache keeps is a fraction of the bodies. A handler reading `ctx.cache`
    /// of this kind finds empty data (no `spec`, no `status`): fetch a body when one is needed.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// // The memcached controller needs to know its pods exist and whose they are, not their specs.
    /// let operator = Operator::new().cache_metadata_only("pods");
    /// ```
    pub fn cache_metadata_only<S: Into<Selector>>(mut self, resource: S) -> Self {
        self.registry.metadata_only.push(resource.into());
        self
    }

    /// Registers a creation handler: it runs for objects that have never been handled (no diff-base
    /// stored), retried until it succeeds or fails for good; what it returns lands in `status.<id>`.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_create(("example.com", "v1", "widgets"), "create_fn", |ctx: Ctx| async move {
    ///     let size = ctx.spec()["size"].as_i64().unwrap_or(1);
    ///     if size > 100 {
    ///         return Err(HandlerError::permanent("too big"));
    ///     }
    ///     Ok(json!({"message": format!("created with size {size}")}))
    /// });
    /// ```
    pub fn on_create<S, O, F, Fut, R>(self, resource: S, on: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.changing(resource.into(), on.into(), Some(Reason::Create), handler)
    }

    /// Registers an update handler: it runs when the object's essence (spec, labels, annotations)
    /// changed since it was last handled. With `On::field`, only when that field changed, and
    /// `ctx.old()`/`ctx.new_value()`/`ctx.diff()` are reduced to it.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_update(("example.com", "v1", "widgets"), "update_fn", |ctx: Ctx| async move {
    ///     for item in ctx.diff().iter() {
    ///         println!("{:?} {:?}: {:?} -> {:?}", item.op, item.field, item.old, item.new);
    ///     }
    ///     Ok(())
    /// });
    /// ```
    pub fn on_update<S, O, F, Fut, R>(self, resource: S, on: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.changing(resource.into(), on.into(), Some(Reason::Update), handler)
    }

    /// Registers a deletion handler. Unless `On::optional()`, the object carries the finalizer
    /// `kopf.zalando.org/KopfFinalizerMarker` while it matches, so the handler runs before the object
    /// goes, even when the operator was down at the time of deletion.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_delete(("example.com", "v1", "widgets"), "cleanup", |ctx: Ctx| async move {
    ///     println!("{} is going", ctx.name());
    ///     Ok(())
    /// });
    /// ```
    pub fn on_delete<S, O, F, Fut, R>(self, resource: S, on: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.changing(resource.into(), on.into(), Some(Reason::Delete), handler)
    }

    /// Registers a resume handler: it runs once per operator process for every object found at
    /// startup (the initial listing) that was handled before, whatever else happens to it; with
    /// `On::deleted()` also for objects being deleted.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_resume(("example.com", "v1", "widgets"), "reconnect", |ctx: Ctx| async move {
    ///     Ok(())
    /// });
    /// ```
    pub fn on_resume<S, O, F, Fut, R>(self, resource: S, on: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.changing(resource.into(), on.into(), None, handler)
    }

    /// Registers a field handler: it runs for creation, update and deletion whenever `field` differs
    /// between the old and new essence (`field` may name something outside `spec`, such as
    /// `status.phase` or `metadata.labels.app`). Its id is `<id>/<field>`, as in Kopf.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_field(("example.com", "v1", "widgets"), "spec.size", "resize", |ctx: Ctx| async move {
    ///     println!("size: {:?} -> {:?}", ctx.old(), ctx.new_value());
    ///     Ok(())
    /// });
    /// ```
    pub fn on_field<S, O, F, Fut, R>(self, resource: S, field: &str, on: O, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        let mut on = on.into().field(field);
        let path = on.filters.field.clone().unwrap_or_default().join(".");
        on.id = format!("{}/{path}", on.id);
        self.changing(resource.into(), on, Some(Reason::Noop), handler)
    }

    /// Registers a changing handler. `reason`: Some(Noop) marks a field handler (any reason, the
    /// field must change); None a resume handler.
    fn changing<F, Fut, R>(
        mut self,
        selector: Selector,
        on: On,
        reason: Option<Reason>,
        handler: F,
    ) -> Self
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.registry
            .changing_handlers
            .push(ChangingHandler::register(
                selector,
                on,
                reason,
                handler_fn(handler),
            ));
        self
    }

    /// Registers a daemon: one long-running task per matching object, started when the object is
    /// first seen (created, or found at startup), after `daemon`'s optional initial delay. It runs
    /// until it returns (it is then not started again in this process), fails for good, or is asked
    /// to stop: the object is deleted, its filters stop matching (it starts again when they match
    /// again), or the operator pauses (it starts again after the resume) or exits.
    ///
    /// The handler polls or awaits `ctx.stopped()`; `ctx.fresh()` has the newest body. An error
    /// retries it after the backoff (or the [`HandlerError::temporary`] delay); what it returns
    /// lands in `status.<id>`, and its patch is sent after each attempt.
    ///
    /// **Guarantees**: the object keeps the finalizer while the daemon may run, so it is not deleted
    /// before the daemon has stopped; never two instances at once for one object.
    ///
    /// **Caveats**: when asked to stop, a daemon has `cancellation_backoff` to exit on its own, then
    /// it is cancelled at its next `.await`, then after `cancellation_timeout` it is abandoned and
    /// the finalizer released; with no timeout, deletion waits however long it takes. Daemons do not
    /// count against `execution.max_concurrent_handlers`.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// # use std::time::Duration;
    /// let operator = Operator::new().daemon(
    ///     ("example.com", "v1", "widgets"),
    ///     "monitor",
    ///     Daemon::new().cancellation_timeout(Duration::from_secs(10)),
    ///     |ctx: Ctx| async move {
    ///         while !ctx.stopped().wait_timeout(Duration::from_secs(30)).await {
    ///             ctx.logger().info(format!("size is {}", ctx.fresh().spec()["size"]));
    ///         }
    ///         Ok(())
    ///     },
    /// );
    /// ```
    pub fn daemon<S, O, F, Fut, R>(self, resource: S, on: O, daemon: Daemon, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.spawning(
            resource.into(),
            on.into(),
            Spawning::Daemon(daemon),
            handler,
        )
    }

    /// Registers a timer: for every matching object, the handler is called on the schedule of
    /// `timer` (every `interval`, on a fixed grid when `sharp`, only after `idle` without essential
    /// changes, after an `initial_delay`). A call never overlaps the previous one. An error retries
    /// it after the backoff (or the [`HandlerError::temporary`] delay) instead of the interval; a
    /// permanent failure stops the timer for the rest of the process. What it returns lands in
    /// `status.<id>`, and its patch is sent after each call.
    ///
    /// Like daemons, timers hold the object's finalizer while they may run, stop when the object is
    /// deleted, their filters stop matching, or the operator pauses or exits, and start again when
    /// the filters match again or the operator resumes. Each call counts against
    /// `execution.max_concurrent_handlers`.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// # use std::time::Duration;
    /// let operator = Operator::new().timer(
    ///     ("example.com", "v1", "widgets"),
    ///     "check_drift",
    ///     Timer::every(Duration::from_secs(60)).idle(Duration::from_secs(30)),
    ///     |ctx: Ctx| async move {
    ///         Ok(json!({"checked": true}))       // lands in status.check_drift
    ///     },
    /// );
    /// ```
    pub fn timer<S, O, F, Fut, R>(self, resource: S, on: O, timer: Timer, handler: F) -> Self
    where
        S: Into<Selector>,
        O: Into<On>,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.spawning(resource.into(), on.into(), Spawning::Timer(timer), handler)
    }

    fn spawning<F, Fut, R>(
        mut self,
        selector: Selector,
        on: On,
        spawning: Spawning,
        handler: F,
    ) -> Self
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        self.registry.spawning_handlers.push(SpawningHandler {
            id: on.id,
            selector,
            spawning,
            options: on.options,
            filters: on.filters,
            func: handler_fn(handler),
        });
        self
    }

    /// Registers an actor type of the user's own ([`ObjectActor`]): one instance per object of
    /// `resource`, made by `factory` from the object when it is first seen in this process (its
    /// creation, or the listing at startup or after a pause), alive until the object is gone, the
    /// operator pauses or exits. Its lifecycle methods run as changing handlers, with every Kopf
    /// guarantee of closure handlers (progress, retries, results in `status.<id>`, a finalizer for
    /// `on_delete`), in the order of registration among the other handlers of the resource (as Kopf
    /// runs its handlers); messages reach it through
    /// [`Operator::actors`]. See `docs/actors.md`.
    ///
    /// ```no_run
    /// use kactor::prelude::*;
    /// use kactor::actors::{ActorCtx, ActorOptions, ActorRef, ObjectActor};
    /// use kube::api::DynamicObject;
    /// use serde_json::Value;
    ///
    /// struct Cache { hits: u64 }
    ///
    /// impl ObjectActor for Cache {
    ///     type Resource = DynamicObject;
    ///     type Message = ();
    ///     type Reply = u64;
    ///
    ///     async fn on_create(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
    ///         ctx.info("Created", "the cache is warm");
    ///         Ok(json!({"warm": true}))              // lands in status["cache/create"]
    ///     }
    ///
    ///     async fn on_message(&mut self, (): (), _me: &ActorRef<Self>) -> u64 {
    ///         self.hits += 1;
    ///         self.hits
    ///     }
    /// }
    ///
    /// # async fn example() -> kactor::Result<()> {
    /// let operator = Operator::new().actor(
    ///     ("example.com", "v1", "caches"),
    ///     ActorOptions::new("cache").delete(),
    ///     |_: &DynamicObject| Cache { hits: 0 },
    /// );
    /// let caches = operator.actors::<Cache>();
    /// tokio::spawn(async move {
    ///     let hits = caches.ask(("default", "c1"), ()).await;
    /// });
    /// operator.run_from_args().await
    /// # }
    /// ```
    ///
    /// # Panics
    /// If `A` is registered already: one type serves one resource (wrap it in a newtype to serve
    /// another).
    pub fn actor<A, S, L, F>(mut self, resource: S, lifecycle: L, factory: F) -> Self
    where
        A: ObjectActor,
        S: Into<Selector>,
        L: Into<ActorOptions>,
        F: Fn(&A::Resource) -> A + Send + Sync + 'static,
    {
        let selector = resource.into();
        let actors = Actors::<A>::new(lifecycle.into(), factory);
        let previous = self
            .actor_types
            .insert(std::any::TypeId::of::<A>(), Box::new(actors.clone()));
        assert!(
            previous.is_none(),
            "the actor type {} is registered twice; one type serves one resource",
            std::any::type_name::<A>()
        );
        for (reason, on, func) in actors.handlers() {
            self.registry
                .changing_handlers
                .push(ChangingHandler::register(
                    selector.clone(),
                    on,
                    reason,
                    func,
                ));
        }
        self.hosts.push((selector, Arc::new(actors)));
        self
    }

    /// The actors of the type `A` registered with [`Operator::actor`]: send them messages by
    /// object (`tell`, `try_tell`, `ask`) from anywhere: other handlers, daemons, the application's
    /// own code. Cheap to clone; take it before the operator runs.
    ///
    /// # Panics
    /// If `A` was not registered with [`Operator::actor`].
    pub fn actors<A: ObjectActor>(&self) -> Actors<A> {
        self.actor_types
            .get(&std::any::TypeId::of::<A>())
            .and_then(|actors| actors.downcast_ref::<Actors<A>>())
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "the actor type {} is not registered; register it with Operator::actor first",
                    std::any::type_name::<A>()
                )
            })
    }

    /// Adds an observer: it is told what the operator does (watch batches, handler runs, workers,
    /// daemons and timers, API requests, pauses), as the Prometheus metrics are; for another
    /// metrics system, or for tests. Its hooks run on hot paths: keep them cheap.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Serves health and metrics at this URL (Kopf's `--liveness`), e.g.
    /// `http://0.0.0.0:8080/healthz`: its path answers the liveness probe, and the same server
    /// answers `/healthz`, `/readyz` (with `/<check>` and `?verbose`) and `/metrics`.
    ///
    /// `/healthz` fails (500, naming the check and why) when a watch stream stays silent beyond
    /// `health.silent_watch_timeout` (it went deaf and cannot reconnect), when the actors' thread or
    /// the runtime misses heartbeats for `health.heartbeat_timeout` (a stuck actor, a handler blocking
    /// an executor thread), or when a probe fails. `/readyz` is ready once the startup activities
    /// succeeded and every watch stream has listed.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().liveness("http://0.0.0.0:8080/healthz");
    /// ```
    pub fn liveness(mut self, url: &str) -> Self {
        self.liveness = Some(url.to_string());
        self
    }

    /// kactor's metrics: register the application's own on [`Metrics::registry`], and they are
    /// served at `/metrics` with kactor's.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new();
    /// let reconciled = prometheus::IntCounter::new("myop_reconciled_total", "Widgets reconciled").unwrap();
    /// operator.metrics().registry().register(Box::new(reconciled.clone())).unwrap();
    /// ```
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Uses the application's Prometheus registry for kactor's metrics (they must not clash with
    /// what it holds already; the process collector included).
    pub fn metrics_registry(mut self, registry: prometheus::Registry) -> Result<Self> {
        self.metrics = Arc::new(Metrics::with_registry(registry)?);
        Ok(self)
    }

    /// Registers a probe (Kopf's `@kopf.on.probe`): when `/healthz` is asked, what it returns is its
    /// entry in the answer's JSON (`{"<id>": <result>}`); results are reused for
    /// `health.probe_cache` (10 s); its failure, or running beyond `health.probe_timeout`, fails
    /// `/healthz`.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_probe("now", |_ctx: ActivityCtx| async move {
    ///     Ok(json!(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()))
    /// });
    /// ```
    pub fn on_probe<F, Fut, R>(mut self, id: &str, probe: F) -> Self
    where
        F: Fn(ActivityCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, HandlerError>> + Send + 'static,
        R: serde::Serialize + 'static,
    {
        let probe = Arc::new(probe);
        self.registry.probes.push(Probe {
            id: id.to_string(),
            func: Arc::new(move |ctx| {
                let probe = probe.clone();
                async move {
                    let value = probe(ctx).await?;
                    serde_json::to_value(value).map_err(|e| {
                        HandlerError::msg(format!("the probe's result is not JSON: {e}"))
                    })
                }
                .boxed()
            }),
        });
        self
    }

    /// Adds a named liveness check (as controller-runtime's `AddHealthzCheck`): an error fails
    /// `/healthz`, naming the check; `/healthz/<name>` asks it alone. It is called for every probe:
    /// keep it cheap and non-blocking.
    pub fn healthz_check<F>(mut self, name: &str, check: F) -> Self
    where
        F: Fn() -> std::result::Result<(), String> + Send + Sync + 'static,
    {
        self.liveness_checks
            .push((name.to_string(), Arc::new(check) as Check));
        self
    }

    /// Adds a named readiness check (as controller-runtime's `AddReadyzCheck`), on `/readyz`.
    pub fn readyz_check<F>(mut self, name: &str, check: F) -> Self
    where
        F: Fn() -> std::result::Result<(), String> + Send + Sync + 'static,
    {
        self.readiness_checks
            .push((name.to_string(), Arc::new(check) as Check));
        self
    }

    /// Registers a startup activity: it runs before anything is watched; its failure stops the operator.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_startup("connect", |ctx: ActivityCtx| async move { Ok(()) });
    /// ```
    pub fn on_startup<F, Fut>(mut self, id: &str, activity: F) -> Self
    where
        F: Fn(ActivityCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.registry.startup.push(Activity {
            id: id.to_string(),
            func: Arc::new(move |ctx| activity(ctx).boxed()),
        });
        self
    }

    /// Registers a cleanup activity: it runs at exit, after watching stopped and handlers finished.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().on_cleanup("disconnect", |ctx: ActivityCtx| async move { Ok(()) });
    /// ```
    pub fn on_cleanup<F, Fut>(mut self, id: &str, activity: F) -> Self
    where
        F: Fn(ActivityCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.registry.cleanup.push(Activity {
            id: id.to_string(),
            func: Arc::new(move |ctx| activity(ctx).boxed()),
        });
        self
    }

    /// Declares a CRD this operator owns: printed by `crds` (`my-operator crds | kubectl apply -f -`).
    /// `rbac generate` also reads from it the scope and status subresource of the resource it
    /// defines. kactor never installs CRDs itself.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    /// let crd: CustomResourceDefinition = serde_json::from_value(json!({
    ///     "metadata": {"name": "widgets.example.com"},
    ///     "spec": {
    ///         "group": "example.com",
    ///         "scope": "Namespaced",
    ///         "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
    ///         "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
    ///                       "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
    ///     },
    /// })).unwrap();
    /// let operator = Operator::new().crd(crd);
    /// ```
    ///
    /// With a `#[derive(kube::CustomResource)]` type, `.crd(Widget::crd())`.
    pub fn crd(mut self, crd: CustomResourceDefinition) -> Self {
        self.crds.push(crd);
        self
    }

    /// Installs the CRDs declared with [`crd`](Self::crd) through `client` (server-side apply, so
    /// that CRDs already there are updated), and waits until each is established and served: what
    /// `--emulator` does before the operator starts, and what a test does against its own cluster.
    ///
    /// ```no_run
    /// # async fn example(operator: kactor::Operator) -> kactor::Result<()> {
    /// let emulator = kactor::emulator::Emulator::start().await.unwrap();
    /// operator.install_crds(&emulator.client()).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn install_crds(&self, client: &kube::Client) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let params = kube::api::PatchParams::apply("kactor").force();
        for crd in &self.crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let failed = |reason: String| Error::InstallCrd {
                name: name.clone(),
                reason,
            };
            let mut crd = crd.clone();
            crd.metadata.managed_fields = None;
            crd.metadata.resource_version = None;
            let body = serde_json::json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": name},
                "spec": crd.spec,
            });
            api.patch(&name, &params, &kube::api::Patch::Apply(&body))
                .await
                .map_err(|e| failed(e.to_string()))?;
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let now = api.get(&name).await.map_err(|e| failed(e.to_string()))?;
                let established = now.status.and_then(|s| s.conditions).is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
                if established {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(failed("not established within 30 s".to_string()));
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Declares what the handlers do with their own client, for `rbac generate` and `rbac verify`
    /// (kactor derives what it does itself, not what handlers do): `verbs` on `resource` (a plural,
    /// or `plural/subresource`) of API `group` (`""`: core), and why. The rule goes where the
    /// operator serves: a Role in each namespace with `-n`, else the ClusterRole; Kubernetes' own
    /// cluster-scoped resources always go in the ClusterRole.
    ///
    /// ```no_run
    /// # use kactor::prelude::*;
    /// let operator = Operator::new().permission(
    ///     "apps",
    ///     "deployments",
    ///     &["get", "create", "patch", "delete"],
    ///     "each Memcached owns a Deployment",
    /// );
    /// ```
    pub fn permission(mut self, group: &str, resource: &str, verbs: &[&str], why: &str) -> Self {
        self.permissions.push(Extra {
            group: group.to_string(),
            resource: resource.to_string(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            why: why.to_string(),
        });
        self
    }

    /// What `rbac generate`, `rbac verify` and `crds` read from this operator.
    /// The CRDs declared with [`Operator::crd`].
    pub(crate) fn declared_crds(&self) -> &[CustomResourceDefinition] {
        &self.crds
    }

    /// Where health and metrics are served, if set.
    #[cfg(feature = "emulator")]
    pub(crate) fn liveness_url(&self) -> Option<&str> {
        self.liveness.as_deref()
    }

    /// Every resource the operator serves: those its handlers name, and those of its object
    /// actors (an actor with no lifecycle method has no handler, and is served all the same).
    pub(crate) fn selectors(&self) -> Vec<Selector> {
        let mut selectors = self.registry.selectors();
        for (selector, _) in &self.hosts {
            if !selectors.contains(selector) {
                selectors.push(selector.clone());
            }
        }
        selectors
    }

    pub(crate) fn blueprint(&self) -> Blueprint<'_> {
        Blueprint {
            selectors: self.selectors(),
            registry: &self.registry,
            peering: &self.peering,
            leader_election: self.leader_election.as_ref(),
            sharding: self.sharding.as_ref(),
            connection: self.connection.as_ref(),
            crds: &self.crds,
            extra: &self.permissions,
            webhooks: (!self.registry.admission_handlers.is_empty())
                .then_some(self.settings.admission.managed.as_deref())
                .flatten(),
            conversions: if self.settings.admission.managed.is_some() {
                self.registry
                    .conversion_handlers
                    .iter()
                    .map(|c| c.selector.clone())
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}

/// How the operator connects, when told ([`Operator::client`], [`Operator::kube_config`]); else it
/// finds credentials as kubectl does.
pub(crate) enum Connection {
    Client(kube::Client),
    Config(Box<kube::Config>),
}

impl Connection {
    /// What to connect with: the client or configuration given, else the configuration found as
    /// kubectl finds it (`KUBECONFIG`, `~/.kube/config`, the pod's service account).
    pub(crate) async fn resolve(
        given: Option<&Connection>,
    ) -> std::result::Result<Connection, kube::config::InferConfigError> {
        Ok(match given {
            Some(Connection::Client(client)) => Connection::Client(client.clone()),
            Some(Connection::Config(config)) => Connection::Config(config.clone()),
            None => Connection::Config(Box::new(kube::Config::infer().await?)),
        })
    }
}

/// What an operator's RBAC derives from, borrowed from it (see [`Operator`]'s `blueprint`).
pub(crate) struct Blueprint<'a> {
    /// Every resource served ([`Operator::selectors`]).
    pub(crate) selectors: Vec<Selector>,
    pub(crate) registry: &'a Registry,
    pub(crate) peering: &'a PeeringSettings,
    pub(crate) leader_election: Option<&'a LeaseSettings>,
    pub(crate) sharding: Option<&'a RingSettings>,
    /// What the operator was told to connect with, if anything.
    pub(crate) connection: Option<&'a Connection>,
    pub(crate) crds: &'a [CustomResourceDefinition],
    pub(crate) extra: &'a [Extra],
    /// The managed webhook configurations' name, when there are admission handlers.
    pub(crate) webhooks: Option<&'a str>,
    /// The custom resources whose CRDs the operator points at its conversion webhook.
    pub(crate) conversions: Vec<Selector>,
}

/// What the handlers do with their own clients, declared with [`Operator::permission`]: placed
/// where the operator serves (a Role per namespace with `-n`, else cluster-wide), or cluster-wide
/// for Kubernetes' own cluster-scoped resources.
#[derive(Debug, Clone)]
pub(crate) struct Extra {
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) verbs: Vec<String>,
    pub(crate) why: String,
}
