//! The operator's settings, grouped and defaulted as Kopf's `OperatorSettings` (`reference/kopf.md`
//! §1.19), with kactor's additions marked as such. Groups and fields arrive with the features that use
//! them (throttling, persistence, posting and peering come with their issues).

use std::time::Duration;

/// All settings. `Settings::default()` is Kopf's defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// How watch streams are run.
    pub watching: Watching,
    /// Per-object workers.
    pub queueing: Queueing,
    /// API requests.
    pub networking: Networking,
    /// Handler execution.
    pub execution: Execution,
    /// The process as a whole.
    pub process: Process,
    /// Where handling state is kept on objects.
    pub persistence: Persistence,
    /// Kubernetes Events about objects.
    pub posting: PostingSettings,
    /// What `/healthz` counts as unhealthy, and how probes and metrics are served (kactor).
    pub health: Health,
    /// The admission webhooks' server and their configurations.
    pub admission: AdmissionSettings,
    /// This replica's place in a ring of replicas that share the objects (kactor's addition; see
    /// [`crate::sharding`]): its watches select only its objects, and every write to an object is
    /// fenced. Set by the operator when it runs sharded; None: one replica has every object.
    pub shard: Option<crate::structs::sharding::Shard>,
}

/// `settings.admission`: where admission handlers are served, and whether the operator keeps the
/// webhook configurations that point the API server at them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdmissionSettings {
    /// The webhook server (Kopf's `settings.admission.server`). Required when there are admission
    /// handlers: the operator does not start without it.
    pub server: Option<WebhookServer>,
    /// The name of the `ValidatingWebhookConfiguration` and `MutatingWebhookConfiguration` the
    /// operator creates and keeps pointed at its server, its webhooks named `<id>.<managed>`
    /// (Kopf's `settings.admission.managed`, e.g. `auto.kopf.dev`). None: they are the user's.
    pub managed: Option<String>,
}

/// The operator's HTTPS server for admission webhooks (Kopf's `kopf.WebhookServer`).
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookServer {
    /// The address to listen on (`0.0.0.0` by default: any).
    pub addr: std::net::IpAddr,
    /// The port (0: any free one, as Kopf's `port=None`).
    pub port: u16,
    /// The host name or address the API server reaches the server by, in the webhooks' URLs
    /// (`localhost` by default; in a cluster, a Service's DNS name).
    pub host: String,
    /// A path prefix of every webhook's URL.
    pub path: String,
    /// The server's certificate (PEM), with `pkeyfile`; without them, a self-signed one is made.
    /// Both are read again when they change on disk (checked every `file_check_interval`).
    pub certfile: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    pub pkeyfile: Option<std::path::PathBuf>,
    /// The CA that signed `certfile` (PEM), for the webhooks' `caBundle`; the certificate itself
    /// when not given.
    pub cafile: Option<std::path::PathBuf>,
    /// Names and addresses the self-signed certificate is also valid for (besides `host`,
    /// `localhost` and `127.0.0.1`).
    pub extra_sans: Vec<String>,
    /// How often the certificate files are checked for changes (60 s, as Kopf).
    pub file_check_interval: Duration,
}

impl Default for WebhookServer {
    fn default() -> Self {
        WebhookServer {
            addr: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            port: 0,
            host: "localhost".to_string(),
            path: String::new(),
            certfile: None,
            pkeyfile: None,
            cafile: None,
            extra_sans: Vec::new(),
            file_check_interval: Duration::from_secs(60),
        }
    }
}

/// `settings.watching`.
#[derive(Debug, Clone, PartialEq)]
pub struct Watching {
    /// `timeoutSeconds` asked of the server for each watch request; None: the server's choice
    /// (as in Kopf). The stream is then simply reopened from the last resourceVersion.
    pub server_timeout: Option<Duration>,
    /// The pause between two watch requests of one stream (Kopf: 0.1 s).
    pub reconnect_backoff: Duration,
    /// A stream with no event and no bookmark for this long is considered dead and reopened
    /// (Kopf: 70 s; the API server sends bookmarks about every minute).
    pub inactivity_timeout: Duration,
    /// Objects per page of the initial listing (kactor; 0: no pagination). 500 as in client-go's
    /// reflector.
    pub list_page_size: u32,
}

impl Default for Watching {
    fn default() -> Self {
        Watching {
            server_timeout: None,
            reconnect_backoff: Duration::from_millis(100),
            inactivity_timeout: Duration::from_secs(70),
            list_page_size: 500,
        }
    }
}

/// `settings.queueing`.
#[derive(Debug, Clone, PartialEq)]
pub struct Queueing {
    /// An object's worker stops after this long without events (Kopf: 5 s); the object's memory stays.
    pub idle_timeout: Duration,
    /// At exit, how long running handlers may take to finish before they are cancelled (Kopf: 2 s).
    pub exit_timeout: Duration,
    /// Per-object throttling after an unexpected processing error (an API error that outlived its
    /// retries, a bug): the pauses before the next attempt, stepping forward on each consecutive error
    /// and reset by a success (Kopf's `queueing.error_delays`: 1, 1, 2, 3, 5, ... 610 s).
    pub error_delays: Vec<Duration>,
    /// Reconcile handlers: the delay before retrying after an error, per object, doubling from
    /// `.0` at each consecutive error up to `.1`, and reset by a success (controller-runtime's
    /// per-item exponential backoff: 5 ms to 1000 s).
    pub reconcile_backoff: (Duration, Duration),
    /// At most this many listed objects wait for, or run, their first processing cycle at once
    /// (kactor; 0: no limit, as Kopf). The listing goes on fetching pages only as fast as the
    /// objects already listed get through their first cycle, so that listing 100,000 objects
    /// does not hold 100,000 bodies and workers while they wait for the
    /// [`max_concurrent_handlers`](Execution::max_concurrent_handlers). Default 2048.
    pub admission_window: usize,
    /// How long the listing waits for room in the [`admission_window`](Queueing::admission_window)
    /// before it routes the next page anyway: slow or stuck first cycles slow the listing down but
    /// never stop it (kactor). Default 1 s.
    pub admission_patience: Duration,
}

impl Queueing {
    /// The delay before the reconcile attempt that follows `failures` consecutive errors (the first
    /// retry: `failures` = 1): `base * 2^(failures - 1)`, at most `max`.
    pub fn reconcile_delay(&self, failures: u32) -> Duration {
        let (base, max) = self.reconcile_backoff;
        let exponent = failures.saturating_sub(1);
        if exponent >= 32 {
            return max;
        }
        base.checked_mul(1u32 << exponent)
            .map_or(max, |delay| delay.min(max))
    }
}

impl Default for Queueing {
    fn default() -> Self {
        Queueing {
            idle_timeout: Duration::from_secs(5),
            exit_timeout: Duration::from_secs(2),
            error_delays: [1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            reconcile_backoff: (Duration::from_millis(5), Duration::from_secs(1000)),
            admission_window: 2048,
            admission_patience: Duration::from_secs(1),
        }
    }
}

/// `settings.networking`.
#[derive(Debug, Clone, PartialEq)]
pub struct Networking {
    /// The delays between retries of a failing API request (5xx, 429, 403 during upgrades); when
    /// they run out, the failure is reported (Kopf: 1, 1, 2, 3, 5, 8, 13, 21 s).
    pub error_backoffs: Vec<Duration>,
    /// At most this many of the operator's own writes to a resource's objects (the patches of its
    /// processing cycles: progress, results, the diff-base, finalizers) are in flight at once per
    /// object thread, or in all when there are none (kactor; Kopf has no limit). They share
    /// [`max_concurrent_handlers`](Execution::max_concurrent_handlers) too. Over HTTP/1.1 each
    /// write in flight holds a connection of its own: a burst with hundreds in flight makes the
    /// operator and the server juggle hundreds of connections, which costs both of them CPU and
    /// makes neither faster. Handlers' own requests and the watch streams are not counted. 0: no
    /// limit of its own. Default 32.
    pub max_concurrent_writes: usize,
}

impl Default for Networking {
    fn default() -> Self {
        Networking {
            error_backoffs: [1, 1, 2, 3, 5, 8, 13, 21]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            max_concurrent_writes: 32,
        }
    }
}

/// `settings.execution`.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// At most this many handlers run, and patches are sent, at once in the whole operator (kactor;
    /// Kopf has no limit; long-running daemons do not count). It protects the process and the API
    /// server when thousands of objects are listed at startup.
    pub max_concurrent_handlers: usize,
    /// The retry delay after an arbitrary error of a handler with the `temporary` errors mode, when the
    /// handler sets no `backoff` of its own (Kopf: 60 s).
    pub default_backoff: Duration,
    /// Which of an object's pending handlers run in one processing cycle (Kopf: `asap`).
    pub lifecycle: crate::structs::lifecycles::Lifecycle,
    /// How the OS schedules the actors' thread (kactor). Default
    /// [`ActorsScheduling::Batch`].
    pub actors_scheduling: ActorsScheduling,
    /// How many object threads run the objects' workers and their handlers (kactor). Default: the
    /// CPUs the process may use (`std::thread::available_parallelism`, which reads the cgroup's
    /// CPU quota).
    ///
    /// Each object's worker is placed on one of them when it starts (in turn), and every
    /// processing cycle of that object, its handlers included, runs on that thread, in its
    /// single-threaded runtime, beside the worker: an object's event, its cycle and the cycle's
    /// end never cross threads. An operator that connects by configuration (not handed a ready
    /// `kube::Client`) makes a client on each object thread too, so that the handlers' requests
    /// and their connections stay there. The watch streams, daemons, timers, the users' object
    /// actors and the operator's own client stay on the operator's runtime.
    ///
    /// Handlers are async code and must not block: a handler that blocks its thread holds up the
    /// other objects of that thread (and fails `/healthz` once `health.heartbeat_timeout`
    /// passes). Run blocking work with `tokio::task::spawn_blocking`;
    /// `tokio::task::block_in_place` needs a multi-threaded runtime and fails in a handler here.
    ///
    /// `0`: no object threads. The workers run on the actors' thread and every cycle is a task on
    /// the operator's runtime (multi-threaded, where `block_in_place` works), at the cost of two
    /// crossings between threads per cycle.
    pub object_threads: usize,
}

/// The default number of object threads: the CPUs the process may use.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

impl Default for Execution {
    fn default() -> Self {
        Execution {
            max_concurrent_handlers: 256,
            default_backoff: Duration::from_secs(60),
            lifecycle: crate::structs::lifecycles::Lifecycle::default(),
            actors_scheduling: ActorsScheduling::default(),
            object_threads: available_cpus(),
        }
    }
}

/// How the OS schedules the actors' thread, where the supervisors and the object workers run
/// (`settings.execution.actors_scheduling`).
///
/// That thread does little per message (it routes events and starts and ends cycles), but it gets
/// a message for nearly every event and every cycle's end. Under Linux's default policy each of
/// those messages wakes it at once, preempting a thread that runs handlers or decodes JSON: on a
/// busy 2-core machine, one context switch per cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActorsScheduling {
    /// Linux's `SCHED_BATCH`, at the process's nice value: a message does not preempt a running
    /// thread; the actors' thread runs at the next scheduling point (at once on an idle core; at
    /// most a time slice, a few milliseconds, on a saturated machine) and then handles every
    /// message that came meanwhile. It gets the same share of the CPU as before. Where the policy
    /// cannot be set (not Linux, or refused), the thread runs under the default policy.
    #[default]
    Batch,
    /// The OS's default policy (Linux's `SCHED_OTHER`): the lowest latency per message, at a
    /// context switch per message on a busy machine.
    Normal,
}

/// `settings.persistence`: the names under which handling state is kept on objects. The defaults are
/// Kopf's, so that objects handled by Kopf are picked up where Kopf left them, and the other way round.
#[derive(Debug, Clone, PartialEq)]
pub struct Persistence {
    /// The finalizer that blocks deletion while delete handlers (and daemons) need the object
    /// (Kopf: `kopf.zalando.org/KopfFinalizerMarker`).
    pub finalizer: String,
    /// The prefix of the progress, diff-base and touch annotations (Kopf: `kopf.zalando.org`). A prefix
    /// that does not start with `kopf.` also marks objects with `<prefix>/kopf-managed: "yes"`.
    pub prefix: String,
    /// Also write Kopf's older (V1) annotation keys when they differ from the current ones (Kopf: true),
    /// so that older Kopf versions keep reading the state.
    pub v1_keys: bool,
    /// How long changing handlers wait for the object's version written by our own last patch to come
    /// back through the watch stream before they run on what they have (Kopf: 5 s; zero: never wait).
    pub consistency_timeout: Duration,
}

impl Default for Persistence {
    fn default() -> Self {
        Persistence {
            finalizer: "kopf.zalando.org/KopfFinalizerMarker".to_string(),
            prefix: "kopf.zalando.org".to_string(),
            v1_keys: true,
            consistency_timeout: Duration::from_secs(5),
        }
    }
}

/// `settings.process`.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    /// After a stop signal, the longest the operator takes to exit before it gives up waiting (Kopf: 600 s).
    pub ultimate_exiting_timeout: Duration,
}

impl Default for Process {
    fn default() -> Self {
        Process {
            ultimate_exiting_timeout: Duration::from_secs(600),
        }
    }
}

/// `settings.health` (kactor; Kopf's liveness endpoint only proves that its reporter task runs).
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// A watch stream that showed no life (no event, no bookmark, no answered request) for this
    /// long while not paused fails `/healthz`. A quiet but healthy stream shows life at least every
    /// `watching.inactivity_timeout` (70 s), when it reconnects; so the default, 120 s, means that
    /// reconnecting has failed for 50 s. Kept above the inactivity timeout whatever is set.
    pub silent_watch_timeout: Duration,
    /// The actors' thread, or the runtime (as a whole, or one of its worker threads stuck in one
    /// poll), that does not answer a heartbeat for this long fails `/healthz`. Default 10 s.
    pub heartbeat_timeout: Duration,
    /// How often heartbeats are sent and executor threads sampled. Default 1 s.
    pub heartbeat_interval: Duration,
    /// How long probe handlers' results (successes and failures) are reused (Kopf: 10 s).
    pub probe_cache: Duration,
    /// The longest one probe handler may run before it counts as failed. Default 10 s.
    pub probe_timeout: Duration,
    /// How long one rendering of `/metrics` is reused, so that a burst of scrapes costs the operator
    /// one rendering per period. Default 1 s; zero renders every scrape.
    pub metrics_cache: Duration,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            silent_watch_timeout: Duration::from_secs(120),
            heartbeat_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            probe_cache: Duration::from_secs(10),
            probe_timeout: Duration::from_secs(10),
            metrics_cache: Duration::from_secs(1),
        }
    }
}

/// The least severity of events that are posted, as Kopf's `settings.posting.level` (a Python
/// logging level).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// `logging.DEBUG`.
    Debug,
    /// `logging.INFO`: everything is posted (Kopf's default).
    #[default]
    Info,
    /// `logging.WARNING`: `info` events are not posted.
    Warning,
    /// `logging.ERROR`: only `exception` events (and plain `event`s) are posted.
    Error,
    /// `logging.CRITICAL`: only plain `event`s are posted.
    Critical,
}

/// `settings.posting`: Kopf's defaults, plus kactor's bounded queue.
#[derive(Debug, Clone, PartialEq)]
pub struct PostingSettings {
    /// Whether events are posted at all (Kopf: true). As in Kopf, [`EventPoster::warn`](crate::clients::posting::EventPoster::warn) does not
    /// look at it, only at [`PostingSettings::level`].
    pub enabled: bool,
    /// Whether the object's log lines are posted as Events too (Kopf's `posting.loggers`; Kopf:
    /// `false` since 1.44): the outcomes of handlers (`Handler 'fn' succeeded.`, `... failed
    /// temporarily: ...`) and what handlers log through [`Ctx::logger`](crate::intents::context::Ctx::logger),
    /// with the reason `Logging` and the type by severity (`Debug`, `Normal`, `Warning`, `Error`,
    /// `Fatal`), from [`PostingSettings::level`] up. Off, an operator makes no request beyond its
    /// own patches per handled change; on, one more per outcome, as Kopf before 1.44 did. The
    /// events a handler posts itself (`ctx.info`, `ctx.warn`, ...) are posted either way.
    pub loggers: bool,
    /// The least severity posted (Kopf: `logging.INFO`, so everything).
    pub level: Level,
    /// The delays between retries of a failing post (Kopf's `default_backoffs`: 1, 1, 2, 3, 5, 8, 13,
    /// 21 s), with the rules of [`retrying`](crate::clients::api::retrying).
    pub default_backoffs: Vec<Duration>,
    /// At most this many posts in flight at once; `None`: no limit (Kopf: `None`). Each object's
    /// events are posted one after another whatever the limit.
    pub worker_limit: Option<usize>,
    /// `reportingComponent` and `source.component`, the "From" column of `kubectl describe` (Kopf:
    /// `kopf`, kept so that tools filtering on it see kactor's events).
    pub reporting_component: String,
    /// `reportingInstance` (Kopf: `dev`).
    pub reporting_instance: String,
    /// The `generateName` of events (Kopf: `kopf-event-`).
    pub event_name_prefix: String,
    /// At most this many events wait or are in flight (kactor: 10 000; Kopf's queue is unbounded).
    /// Beyond it, new events are dropped with one warning per burst, so a cluster that refuses
    /// events cannot make an operator grow without end.
    pub queue_capacity: usize,
}

impl Default for PostingSettings {
    fn default() -> Self {
        PostingSettings {
            enabled: true,
            loggers: false,
            level: Level::Info,
            default_backoffs: [1, 1, 2, 3, 5, 8, 13, 21]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            worker_limit: None,
            reporting_component: "kopf".to_owned(),
            reporting_instance: "dev".to_owned(),
            event_name_prefix: "kopf-event-".to_owned(),
            queue_capacity: 10_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_errors_back_off_exponentially_up_to_the_cap() {
        let queueing = Queueing::default();
        let ms = |failures| queueing.reconcile_delay(failures).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4), ms(11)], [5, 10, 20, 40, 5120]);
        assert_eq!(ms(18), 655_360);
        assert_eq!(ms(19), 1_000_000, "capped at 1000 s");
        assert_eq!(ms(40), 1_000_000);
        assert_eq!(ms(u32::MAX), 1_000_000);
    }

    #[test]
    fn defaults_are_kopfs() {
        let settings = Settings::default();
        assert_eq!(
            settings.watching.inactivity_timeout,
            Duration::from_secs(70)
        );
        assert_eq!(
            settings.watching.reconnect_backoff,
            Duration::from_millis(100)
        );
        assert_eq!(settings.queueing.idle_timeout, Duration::from_secs(5));
        assert_eq!(settings.queueing.exit_timeout, Duration::from_secs(2));
        assert_eq!(settings.networking.error_backoffs.len(), 8);
        assert_eq!(
            settings.process.ultimate_exiting_timeout,
            Duration::from_secs(600)
        );
    }
}
