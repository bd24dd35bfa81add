//! The `Operator` builder, and the run loop that turns its handlers into watched resources.
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
use kactor_actors::supervisor::{Pause, ResourceSupervisor, Resume, Shutdown, SupervisorConfig};
use kactor_actors::system::ActorSystem;
use kactor_actors::tracker::Tracker;
use kactor_health::{Check, HealthActor, HealthServer, HealthState, Metrics};
use kactor_peering::lease::{LeaderElector, LeaseSettings};
use kactor_peering::peering::{PeeringMode, PeeringSettings};
use kactor_reactor::causes::Reason;
use kactor_reactor::daemons::{Daemon, Timer};
use kactor_reactor::discovery::{self, ResolveError};
use kactor_reactor::handlers::{
    handler_fn, Activity, ActivityCtx, ChangingHandler, Ctx, EventHandler, HandlerError,
    HandlerResult, Memo, On, Probe, Registry, ResourceHandlers, Spawning, SpawningHandler,
};
use kactor_reactor::metered::{metered, MeteredLayer};
use kactor_reactor::observe::{BoardEntry, Observer, Tee, WatchBoard};
use kactor_reactor::pausing::PauseSwitch;
use kactor_reactor::posting::EventPoster;
use kactor_reactor::resources::{Resource, Selector};
use kactor_reactor::settings::Settings;
use kactor_reactor::watching::{WatchItem, Watcher};
use kube::api::{Api, DynamicObject};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::scope::{Scope, Served};

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
    client: Option<kube::Client>,
    scope: Scope,
    memo: Memo,
    switch: PauseSwitch,
    peering: PeeringSettings,
    leader_election: Option<LeaseSettings>,
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
            client: None,
            scope: Scope::ClusterWide,
            memo: Memo::default(),
            switch: PauseSwitch::new(),
            peering: PeeringSettings::default(),
            leader_election: None,
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
    pub fn client(mut self, client: kube::Client) -> Self {
        self.client = Some(client);
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
    pub(crate) fn blueprint(&self) -> Blueprint<'_> {
        Blueprint {
            registry: &self.registry,
            peering: &self.peering,
            leader_election: self.leader_election.as_ref(),
            client: self.client.as_ref(),
            crds: &self.crds,
            extra: &self.permissions,
        }
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully; a second signal returns at once.
    pub async fn run(self) -> Result<()> {
        self.serve(stop_signal(), stop_signal()).await
    }

    /// Runs until `stop` completes, then shuts down gracefully. It installs no signal handlers: it is
    /// for embedding, where the application owns the signals.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send) -> Result<()> {
        self.serve(stop, std::future::pending()).await
    }

    /// Serves until `stop`; then shuts down, unless `interrupt` completes first.
    async fn serve(
        self,
        stop: impl Future<Output = ()> + Send,
        interrupt: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        let observer: Arc<dyn Observer> = if self.observers.is_empty() {
            self.metrics.clone()
        } else {
            let mut all: Vec<Arc<dyn Observer>> = vec![self.metrics.clone()];
            all.extend(self.observers.iter().cloned());
            Arc::new(Tee(all))
        };
        // Every request of the operator is counted, whoever built the client.
        let client = match self.client.clone() {
            Some(client) => metered(client, observer.clone()),
            None => {
                let credentials =
                    |e: kube::Error| Error::Credentials(discovery::one_line(&e.to_string()));
                let config = kube::Config::infer()
                    .await
                    .map_err(|e| credentials(kube::Error::InferConfig(e)))?;
                kube::client::ClientBuilder::try_from(config)
                    .map_err(credentials)?
                    .with_layer(&MeteredLayer(observer.clone()))
                    .build()
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
        let coordination = Coordination::start(&self, &client, &observer)?;
        let mut orchestra = Orchestra::new(&self, client.clone(), observer, watches).await?;
        if self.liveness.is_some() {
            // Its heartbeats are read only by the health server.
            orchestra.start_health(health.clone()).await?;
        }
        // Ready once the supervisors exist (each then waits for its listing).
        orchestra.serve(stop, || health.startup_done()).await?;
        let ultimate = self.settings.process.ultimate_exiting_timeout;
        let graceful = async {
            orchestra.shutdown(&self.registry, activity_ctx).await;
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

/// What an operator's RBAC derives from, borrowed from it (see [`Operator`]'s `blueprint`).
pub(crate) struct Blueprint<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) peering: &'a PeeringSettings,
    pub(crate) leader_election: Option<&'a LeaseSettings>,
    pub(crate) client: Option<&'a kube::Client>,
    pub(crate) crds: &'a [CustomResourceDefinition],
    pub(crate) extra: &'a [Extra],
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

/// The tasks that decide whether this operator may work (peering, leader election). They run from
/// before the first watch until after the last handler, and are never paused themselves.
struct Coordination {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Coordination {
    fn start(
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
            if settings.mode == PeeringMode::Mandatory {
                // Paused from the start: the peering lifts this once it has seen that nobody outranks us.
                operator.switch.set(
                    kactor_peering::peering::CRD_MISSING,
                    Some(format!("waiting for the peering `{}`", settings.name)),
                );
            }
            let (client, switch, stopped) =
                (client.clone(), operator.switch.clone(), until_stopped());
            tasks.push(tokio::spawn(kactor_peering::peering::run(
                client, settings, identity, switch, stopped,
            )));
        }
        Ok(Coordination { stop, tasks })
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

async fn run_activity(activity: &Activity, ctx: ActivityCtx) -> std::result::Result<(), String> {
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

/// SIGINT (Ctrl-C) or SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match terminate.as_mut() {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A supervisor's identity: the resource (kubectl form) and the namespace (None: cluster-wide).
type SupervisorKey = (String, Option<String>);

/// What one resource is served with.
struct Target {
    selector: Selector,
    resolved: Option<Arc<Resource>>,
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
struct Orchestra {
    client: kube::Client,
    settings: Arc<Settings>,
    registry: Registry,
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
    switch: PauseSwitch,
    /// Whether the supervisors are paused: changed only by the loop that follows the switch, so that
    /// a supervisor started in between is started in the state the others are in.
    paused: bool,
}

impl Orchestra {
    async fn new(
        operator: &Operator,
        client: kube::Client,
        observer: Arc<dyn Observer>,
        watches: WatchBoard,
    ) -> Result<Self> {
        let resources = discovery::scan(&client).await?;
        let mut targets = Vec::new();
        for selector in operator.registry.selectors() {
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
            actors: ActorSystem::start()?,
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
            switch: operator.switch.clone(),
            paused: false,
        })
    }

    /// Starts the health actor on the actors' thread: its heartbeats prove the thread is not stuck.
    async fn start_health(&mut self, state: Arc<HealthState>) -> Result<()> {
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
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource.api_resource());
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
    async fn serve(
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
                    if reasons.is_empty() == self.paused {
                        self.paused = !reasons.is_empty();
                        self.pause_all(self.paused, &reasons);
                    }
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

    /// Pauses every supervisor (streams stop, memories stay) or resumes them (they list again).
    fn pause_all(&self, paused: bool, reasons: &std::collections::BTreeMap<String, String>) {
        self.observer.paused(paused);
        if paused {
            let why: Vec<&str> = reasons.values().map(String::as_str).collect();
            tracing::info!("Pausing operations: {}.", why.join("; "));
            for supervisor in self.running.values() {
                supervisor.do_send(Pause);
            }
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
        let mut desired: HashMap<SupervisorKey, (Arc<Resource>, ResourceHandlers)> = HashMap::new();
        for target in &self.targets {
            let Some(resource) = &target.resolved else {
                continue;
            };
            let handlers = self.registry.handlers_for(&target.selector);
            let namespaces: Vec<Option<String>> = match (&self.served, resource.namespaced) {
                (Served::ClusterWide, _) | (_, false) => vec![None],
                (Served::Fixed(names), true) => names.iter().cloned().map(Some).collect(),
                (Served::Patterns { .. }, true) => {
                    self.followed.current.iter().cloned().map(Some).collect()
                }
            };
            for namespace in namespaces {
                let entry = desired
                    .entry((resource.to_string(), namespace))
                    .or_insert_with(|| (resource.clone(), ResourceHandlers::default()));
                entry.1.event.extend(handlers.event.iter().cloned());
                entry.1.changing.extend(handlers.changing.iter().cloned());
                entry.1.spawning.extend(handlers.spawning.iter().cloned());
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
        for (key, (resource, handlers)) in desired {
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
                limiter: self.limiter.clone(),
                tracker: self.tracker.clone(),
                daemon_tracker: self.daemon_tracker.clone(),
                observer: self.observer.clone(),
                watches: self.watches.clone(),
                start_paused: self.paused,
            };
            let supervisor = self
                .actors
                .start_actor(move || ResourceSupervisor::new(config))
                .await?;
            self.running.insert(key, supervisor);
        }
        Ok(())
    }

    /// Stops watching, lets handlers finish within `exit_timeout`, runs cleanup.
    async fn shutdown(&mut self, registry: &Registry, activity_ctx: ActivityCtx) {
        for (_, supervisor) in self.running.drain() {
            let _ = supervisor.send(Shutdown).await;
        }
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

#[cfg(test)]
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
}
