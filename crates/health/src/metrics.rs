//! The Prometheus metrics: an [`Observer`] that counts what the reactor tells it, in a
//! [`prometheus::Registry`] that `/metrics` renders.
//!
//! Names and labels mirror controller-runtime's where the meaning is the same (the handler
//! duration buckets, `leader_election_master_status{name}`), so that dashboards carry over. Labels
//! are bounded: a resource in kubectl's form, a handler id, a verb, a status code, a reason; never
//! an object's name or uid.
//!
//! **Guarantees**: every hook is a hash lookup of label values already seen (no allocation) and an
//! atomic update; nothing blocks but the registry's short read lock on a new label value. The
//! shared caches' sizes are asked when scraped instead (`kactor_cache_objects`,
//! `kactor_cache_bytes`): a scrape measures the objects that changed since the last one, outside
//! the caches' locks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor_reactor::daemons::SpawningKind;
use kactor_reactor::observe::{CacheSize, HandlerRun, MessageOutcome, Observer, Verdict};
use kactor_reactor::watching::RestartReason;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// controller-runtime's buckets for `controller_runtime_reconcile_time_seconds`.
const HANDLER_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// From a millisecond to ten seconds: a timer is late by its scheduling, not by its work.
const LATENESS_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// From 10 µs (a message that updates a counter) to 10 s (one that calls out and waits).
const MESSAGE_BUCKETS: [f64; 19] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// From 5 ms (a cached answer nearby) to a minute (a slow list of a large collection).
const API_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The operator's metrics, and the registry they are in.
///
/// Give it to the operator as its [`Observer`] (in a [`Tee`](kactor_reactor::observe::Tee) with
/// others if needed), and to the [`HealthServer`](crate::HealthServer) to serve `/metrics`.
///
/// ```no_run
/// let metrics = kactor_health::Metrics::new().expect("no metric is registered twice");
/// let widgets = prometheus::IntCounter::new("widgets_made_total", "Widgets made.").unwrap();
/// metrics.registry().register(Box::new(widgets.clone())).unwrap();
/// print!("{}", metrics.render());
/// ```
pub struct Metrics {
    registry: Registry,
    events_received: IntCounterVec,
    watch_restarts: IntCounterVec,
    handler_runs: IntCounterVec,
    handler_duration: HistogramVec,
    handler_retries: IntCounterVec,
    active_handlers: IntGauge,
    object_workers: IntGaugeVec,
    coalesced_events: IntCounterVec,
    undecodable_objects: IntCounterVec,
    daemons_running: IntGaugeVec,
    timers_running: IntGaugeVec,
    timer_lateness: HistogramVec,
    operator_paused: IntGauge,
    leader: IntGaugeVec,
    api_requests: IntCounterVec,
    api_duration: HistogramVec,
    actors: IntGaugeVec,
    mailbox_depth: IntGaugeVec,
    actor_messages: IntCounterVec,
    message_duration: HistogramVec,
    caches: CacheGauges,
    shard_member: IntGaugeVec,
    shard_objects: IntGaugeVec,
    shard_moves: IntCounterVec,
    fence_rejections: IntCounterVec,
    handover_duration: HistogramVec,
}

impl Metrics {
    /// The metrics in a registry of their own, with the process's own metrics (CPU, memory, open
    /// files: `process_*`, on Linux).
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Metrics::with_registry(registry)
    }

    /// The metrics in the user's registry (which may hold the process collector already: it is not
    /// added here). Fails if a family of the same name is registered there already.
    #[allow(
        clippy::too_many_lines,
        reason = "the table of every metric family, one registration each"
    )]
    pub fn with_registry(registry: Registry) -> Result<Metrics, prometheus::Error> {
        let counter = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<_> {
            let family = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(family.clone()))?;
            Ok(family)
        };
        let gauges = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<_> {
            let family = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(family.clone()))?;
            Ok(family)
        };
        let gauge = |name: &str, help: &str| -> prometheus::Result<_> {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let histogram =
            |name: &str, help: &str, labels: &[&str], buckets: &[f64]| -> prometheus::Result<_> {
                let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
                let family = HistogramVec::new(opts, labels)?;
                registry.register(Box::new(family.clone()))?;
                Ok(family)
            };
        let metrics = Metrics {
            events_received: counter(
                "kactor_events_received_total",
                "Objects and events received from watch streams (listings included).",
                &["resource"],
            )?,
            watch_restarts: counter(
                "kactor_watch_restarts_total",
                "Watch streams reopened, by reason: reconnect, relist_410, inactivity, error.",
                &["resource", "reason"],
            )?,
            handler_runs: counter(
                "kactor_handler_runs_total",
                "Handler attempts finished, by result: success, temporary, permanent, ignored, \
                 timeout.",
                &["resource", "handler", "result"],
            )?,
            handler_duration: histogram(
                "kactor_handler_duration_seconds",
                "How long handler attempts took (for a daemon: its lifetime).",
                &["resource", "handler"],
                &HANDLER_BUCKETS,
            )?,
            handler_retries: counter(
                "kactor_handler_retries_total",
                "Handler attempts that were retries of a failed attempt.",
                &["resource", "handler"],
            )?,
            active_handlers: gauge(
                "kactor_active_handlers",
                "Handler attempts running now (daemons not counted).",
            )?,
            object_workers: gauges(
                "kactor_object_workers",
                "Per-object workers alive now.",
                &["resource"],
            )?,
            caches: {
                let caches = CacheGauges {
                    objects: IntGaugeVec::new(
                        Opts::new(
                            "kactor_cache_objects",
                            "Objects held by the shared cache of a resource.",
                        ),
                        &["resource"],
                    )?,
                    bytes: IntGaugeVec::new(
                        Opts::new(
                            "kactor_cache_bytes",
                            "The size, as JSON, of the objects held by the shared cache of a resource.",
                        ),
                        &["resource"],
                    )?,
                    served: Arc::default(),
                };
                registry.register(Box::new(caches.clone()))?;
                caches
            },
            coalesced_events: counter(
                "kactor_coalesced_events_total",
                "Queued events replaced by a newer event of the same object before processing.",
                &["resource"],
            )?,
            undecodable_objects: counter(
                "kactor_undecodable_objects_total",
                "Objects of a listing, or watch events, that could not be decoded and were left out.",
                &["resource"],
            )?,
            daemons_running: gauges(
                "kactor_daemons_running",
                "Daemons running now.",
                &["resource"],
            )?,
            timers_running: gauges(
                "kactor_timers_running",
                "Timers running now.",
                &["resource"],
            )?,
            timer_lateness: histogram(
                "kactor_timer_lateness_seconds",
                "How late timer calls started after they were due.",
                &["resource"],
                &LATENESS_BUCKETS,
            )?,
            operator_paused: gauge(
                "kactor_operator_paused",
                "1 while the operator is paused (by peering or by request), 0 otherwise.",
            )?,
            leader: gauges(
                "leader_election_master_status",
                "1 while this operator leads the election, 0 otherwise.",
                &["name"],
            )?,
            api_requests: counter(
                "kactor_api_requests_total",
                "Kubernetes API requests answered, by verb and HTTP status (\"<error>\": no answer).",
                &["verb", "code"],
            )?,
            api_duration: histogram(
                "kactor_api_request_duration_seconds",
                "How long Kubernetes API requests took until the response's headers.",
                &["verb"],
                &API_BUCKETS,
            )?,
            actors: gauges(
                "kactor_actors",
                "Object actors alive now, by actor (the name of their lifecycle).",
                &["actor"],
            )?,
            mailbox_depth: gauges(
                "kactor_actor_mailbox_depth",
                "Messages and lifecycle calls waiting in the mailboxes of the actors, summed.",
                &["actor"],
            )?,
            actor_messages: counter(
                "kactor_actor_messages_total",
                "Messages to object actors, by result: handled, panicked, not_found, full, timeout.",
                &["actor", "result"],
            )?,
            message_duration: histogram(
                "kactor_actor_message_duration_seconds",
                "How long object actors took to handle a message.",
                &["actor"],
                &MESSAGE_BUCKETS,
            )?,
            shard_member: gauges(
                "kactor_shard_member",
                "Sharding: 1 while this replica is a member of the ring (its Lease held), 0 otherwise.",
                &["ring"],
            )?,
            shard_objects: gauges(
                "kactor_shard_objects",
                "Sharding, on the assigner's replica: objects per member, as its last resync counted.",
                &["ring", "member"],
            )?,
            shard_moves: counter(
                "kactor_shard_moves_total",
                "Sharding, on the assigner's replica: objects assigned, drained (handover asked), \
                 relabelled (from a dead member), and members' Leases taken over.",
                &["ring", "kind"],
            )?,
            fence_rejections: counter(
                "kactor_shard_fence_rejections_total",
                "Sharding: writes to objects rejected by the fence (the object had moved or was \
                 being handed over).",
                &["resource"],
            )?,
            handover_duration: histogram(
                "kactor_shard_handover_seconds",
                "Sharding: from an object's drain label reaching this replica to its handover.",
                &["resource"],
                &API_BUCKETS,
            )?,
            registry,
        };
        Ok(metrics)
    }

    /// The registry: register the operator's own metrics on it to have them served at `/metrics`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Every metric of the registry in Prometheus's text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let families = self.registry.gather();
        let mut text = String::with_capacity(16 * 1024);
        if let Err(error) = TextEncoder::new().encode_utf8(&families, &mut text) {
            // Only a collector producing a malformed family gets here; serve the rest.
            tracing::warn!(%error, "cannot render the metrics");
        }
        text
    }
}

/// `kactor_cache_objects` and `kactor_cache_bytes`: asked of the caches when scraped (a cache's
/// size changes with each of its events; measuring it then cost more than every scrape does).
#[derive(Clone)]
struct CacheGauges {
    objects: IntGaugeVec,
    bytes: IntGaugeVec,
    /// The caches served, by resource (a resource's caches, if several, are summed).
    served: Arc<Mutex<Vec<Served>>>,
}

/// A cache served: its resource, and its size when asked.
type Served = (String, Arc<dyn CacheSize>);

impl CacheGauges {
    fn serve(&self, resource: &str, size: Arc<dyn CacheSize>) {
        self.objects.with_label_values(&[resource]).set(0);
        self.bytes.with_label_values(&[resource]).set(0);
        self.served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((resource.to_string(), size));
    }

    /// Sets the gauges from the caches; a resource whose caches are all gone reads 0.
    fn refresh(&self) {
        let mut served = self
            .served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut sizes: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        served.retain(|(resource, size)| {
            let total = sizes.entry(resource.clone()).or_default();
            let Some((objects, bytes)) = size.size() else {
                return false;
            };
            total.0 += objects;
            total.1 += bytes;
            true
        });
        drop(served);
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (resource, (objects, bytes)) in sizes {
            self.objects
                .with_label_values(&[&resource])
                .set(gauge(objects));
            self.bytes.with_label_values(&[&resource]).set(gauge(bytes));
        }
    }
}

impl Collector for CacheGauges {
    fn desc(&self) -> Vec<&Desc> {
        let mut desc = self.objects.desc();
        desc.extend(self.bytes.desc());
        desc
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.refresh();
        let mut families = self.objects.collect();
        families.extend(self.bytes.collect());
        families
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Observer for Metrics {
    /// Every counter and gauge of the resource and its handlers, at 0 (as controller-runtime does
    /// for each controller): a dashboard's `rate()` and `absent()` work from the first scrape, not
    /// only once something happened. Histograms appear with their first sample.
    fn resource_served(&self, resource: &str, handlers: &[&str]) {
        self.events_received
            .with_label_values(&[resource])
            .inc_by(0);
        for reason in RestartReason::ALL {
            self.watch_restarts
                .with_label_values(&[resource, reason.as_str()])
                .inc_by(0);
        }
        self.object_workers.with_label_values(&[resource]).add(0);
        self.coalesced_events
            .with_label_values(&[resource])
            .inc_by(0);
        self.undecodable_objects
            .with_label_values(&[resource])
            .inc_by(0);
        self.daemons_running.with_label_values(&[resource]).add(0);
        self.timers_running.with_label_values(&[resource]).add(0);
        for handler in handlers {
            for verdict in Verdict::ALL {
                self.handler_runs
                    .with_label_values(&[resource, handler, verdict.as_str()])
                    .inc_by(0);
            }
            self.handler_retries
                .with_label_values(&[resource, handler])
                .inc_by(0);
        }
    }

    fn events_received(&self, resource: &str, count: usize) {
        self.events_received
            .with_label_values(&[resource])
            .inc_by(count as u64);
    }

    fn watch_restarted(&self, resource: &str, reason: RestartReason) {
        self.watch_restarts
            .with_label_values(&[resource, reason.as_str()])
            .inc();
    }

    fn handler_started(&self) {
        self.active_handlers.inc();
    }

    fn handler_finished(&self, run: &HandlerRun<'_>) {
        if run.active {
            self.active_handlers.dec();
        }
        self.handler_runs
            .with_label_values(&[run.resource, run.handler, run.verdict.as_str()])
            .inc();
        self.handler_duration
            .with_label_values(&[run.resource, run.handler])
            .observe(run.duration.as_secs_f64());
        if run.attempt > 0 {
            self.handler_retries
                .with_label_values(&[run.resource, run.handler])
                .inc();
        }
    }

    fn handler_dropped(&self) {
        self.active_handlers.dec();
    }

    fn workers_changed(&self, resource: &str, delta: i64) {
        self.object_workers
            .with_label_values(&[resource])
            .add(delta);
    }

    fn cache_served(&self, resource: &str, size: Arc<dyn CacheSize>) {
        self.caches.serve(resource, size);
    }

    fn events_coalesced(&self, resource: &str, count: u64) {
        self.coalesced_events
            .with_label_values(&[resource])
            .inc_by(count);
    }

    fn objects_undecodable(&self, resource: &str, count: usize) {
        self.undecodable_objects
            .with_label_values(&[resource])
            .inc_by(count as u64);
    }

    fn daemon_started(&self, resource: &str, kind: SpawningKind) {
        self.running(kind).with_label_values(&[resource]).inc();
    }

    fn daemon_exited(&self, resource: &str, kind: SpawningKind) {
        self.running(kind).with_label_values(&[resource]).dec();
    }

    fn timer_lateness(&self, resource: &str, _handler: &str, lateness: Duration) {
        self.timer_lateness
            .with_label_values(&[resource])
            .observe(lateness.as_secs_f64());
    }

    fn paused(&self, paused: bool) {
        self.operator_paused.set(i64::from(paused));
    }

    fn shard_member(&self, ring: &str, joined: bool) {
        self.shard_member
            .with_label_values(&[ring])
            .set(i64::from(joined));
    }

    fn shard_objects(&self, ring: &str, owners: &[(&str, usize)]) {
        // Members gone since the last count are dropped, not left at their last value.
        let family = prometheus::core::Collector::collect(&self.shard_objects);
        for metric in family.iter().flat_map(|f| f.get_metric()) {
            let labels: Vec<(&str, &str)> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            let member = labels
                .iter()
                .find(|(name, _)| *name == "member")
                .map(|(_, v)| *v);
            let same_ring = labels.iter().any(|(name, v)| *name == "ring" && *v == ring);
            if let Some(member) = member {
                if same_ring && !owners.iter().any(|(owner, _)| *owner == member) {
                    let _ = self.shard_objects.remove_label_values(&[ring, member]);
                }
            }
        }
        for (member, count) in owners {
            self.shard_objects
                .with_label_values(&[ring, member])
                .set(i64::try_from(*count).unwrap_or(i64::MAX));
        }
    }

    fn shard_moves(&self, ring: &str, kind: &'static str, count: u64) {
        self.shard_moves
            .with_label_values(&[ring, kind])
            .inc_by(count);
    }

    fn fence_rejected(&self, resource: &str) {
        self.fence_rejections.with_label_values(&[resource]).inc();
    }

    fn handed_over(&self, resource: &str, took: Duration) {
        self.handover_duration
            .with_label_values(&[resource])
            .observe(took.as_secs_f64());
    }

    fn leadership(&self, name: &str, leading: bool) {
        self.leader
            .with_label_values(&[name])
            .set(i64::from(leading));
    }

    fn actors_served(&self, actor: &str) {
        self.actors.with_label_values(&[actor]).add(0);
        self.mailbox_depth.with_label_values(&[actor]).add(0);
        for outcome in MessageOutcome::ALL {
            self.actor_messages
                .with_label_values(&[actor, outcome.as_str()])
                .inc_by(0);
        }
    }

    fn actors_changed(&self, actor: &str, delta: i64) {
        self.actors.with_label_values(&[actor]).add(delta);
    }

    fn mailboxes_changed(&self, actor: &str, delta: i64) {
        self.mailbox_depth.with_label_values(&[actor]).add(delta);
    }

    fn actor_message(&self, actor: &str, outcome: MessageOutcome, duration: Duration) {
        self.actor_messages
            .with_label_values(&[actor, outcome.as_str()])
            .inc();
        if matches!(outcome, MessageOutcome::Handled | MessageOutcome::Panicked) {
            self.message_duration
                .with_label_values(&[actor])
                .observe(duration.as_secs_f64());
        }
    }

    fn api_request(&self, verb: &'static str, code: Option<u16>, duration: Duration) {
        let mut digits = [0; 5];
        let code = match code {
            Some(code) => status_text(code, &mut digits),
            // As client-go's rest_client_requests_total.
            None => "<error>",
        };
        self.api_requests.with_label_values(&[verb, code]).inc();
        self.api_duration
            .with_label_values(&[verb])
            .observe(duration.as_secs_f64());
    }
}

impl Metrics {
    fn running(&self, kind: SpawningKind) -> &IntGaugeVec {
        match kind {
            SpawningKind::Daemon => &self.daemons_running,
            SpawningKind::Timer => &self.timers_running,
        }
    }
}

/// A status code in decimal, written into `digits` rather than allocated (one per API request).
fn status_text(code: u16, digits: &mut [u8; 5]) -> &str {
    let mut start = digits.len();
    let mut rest = code;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&digits[start..]).unwrap_or("<error>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::proto::{MetricFamily, MetricType};

    fn run<'a>(handler: &'a str, verdict: Verdict, attempt: u32, active: bool) -> HandlerRun<'a> {
        HandlerRun {
            resource: "widgets.v1.example.com",
            handler,
            verdict,
            attempt,
            duration: Duration::from_millis(30),
            active,
        }
    }

    fn family(metrics: &Metrics, name: &str) -> MetricFamily {
        metrics
            .registry()
            .gather()
            .into_iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("no family {name}"))
    }

    /// The value of the series of `name` with exactly these labels (counters and gauges), or the
    /// sample count (histograms).
    fn value(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
        let family = family(metrics, name);
        let metric = family
            .get_metric()
            .iter()
            .find(|m| {
                m.get_label().len() == labels.len()
                    && labels.iter().all(|(k, v)| {
                        m.get_label()
                            .iter()
                            .any(|l| l.name() == *k && l.value() == *v)
                    })
            })
            .unwrap_or_else(|| panic!("no series {name}{labels:?}"));
        match family.get_field_type() {
            MetricType::COUNTER => metric.get_counter().get_value(),
            MetricType::GAUGE => metric.get_gauge().get_value(),
            MetricType::HISTOGRAM => metric.get_histogram().get_sample_count() as f64,
            other => panic!("unexpected type {other:?}"),
        }
    }

    const W: &str = "widgets.v1.example.com";

    #[test]
    fn handler_runs_are_counted_by_result_with_retries_and_durations() {
        let metrics = Metrics::new().unwrap();
        let verdicts = [
            Verdict::Success,
            Verdict::Temporary,
            Verdict::Permanent,
            Verdict::Ignored,
            Verdict::Timeout,
        ];
        for (attempt, verdict) in verdicts.into_iter().enumerate() {
            metrics.handler_started();
            metrics.handler_finished(&run("create_fn", verdict, attempt as u32, true));
        }
        metrics.handler_started();
        metrics.handler_finished(&run("create_fn", Verdict::Success, 0, true));
        for result in ["temporary", "permanent", "ignored", "timeout"] {
            let labels = [
                ("resource", W),
                ("handler", "create_fn"),
                ("result", result),
            ];
            assert_eq!(value(&metrics, "kactor_handler_runs_total", &labels), 1.0);
        }
        let success = [
            ("resource", W),
            ("handler", "create_fn"),
            ("result", "success"),
        ];
        assert_eq!(value(&metrics, "kactor_handler_runs_total", &success), 2.0);
        let handler = [("resource", W), ("handler", "create_fn")];
        assert_eq!(
            value(&metrics, "kactor_handler_retries_total", &handler),
            4.0,
            "attempts 1 to 4 were retries"
        );
        assert_eq!(
            value(&metrics, "kactor_handler_duration_seconds", &handler),
            6.0
        );
        let histogram = family(&metrics, "kactor_handler_duration_seconds");
        let histogram = histogram.get_metric()[0].get_histogram();
        assert_eq!(histogram.get_bucket().len(), HANDLER_BUCKETS.len());
        assert!((histogram.get_sample_sum() - 0.18).abs() < 1e-9);
        let le_0_05 = histogram
            .get_bucket()
            .iter()
            .find(|b| b.upper_bound() == 0.05)
            .unwrap();
        assert_eq!(le_0_05.cumulative_count(), 6, "30 ms runs fall under 0.05");
        assert_eq!(value(&metrics, "kactor_active_handlers", &[]), 0.0);
    }

    #[test]
    fn active_handlers_count_started_runs_only() {
        let metrics = Metrics::new().unwrap();
        metrics.handler_started();
        metrics.handler_started();
        metrics.handler_started();
        assert_eq!(value(&metrics, "kactor_active_handlers", &[]), 3.0);
        metrics.handler_finished(&run("h", Verdict::Success, 0, true));
        metrics.handler_dropped();
        assert_eq!(value(&metrics, "kactor_active_handlers", &[]), 1.0);
        // A daemon's attempt ends without having been counted as started.
        metrics.handler_finished(&run("daemon_fn", Verdict::Success, 0, false));
        assert_eq!(value(&metrics, "kactor_active_handlers", &[]), 1.0);
    }

    #[test]
    fn the_cache_is_gauged_in_objects_and_bytes_asked_when_scraped() {
        struct Size(Mutex<Option<(usize, usize)>>);
        impl CacheSize for Size {
            fn size(&self) -> Option<(usize, usize)> {
                *self.0.lock().unwrap()
            }
        }
        let metrics = Metrics::new().unwrap();
        let pods = Arc::new(Size(Mutex::new(Some((0, 0)))));
        metrics.cache_served("pods.v1", pods.clone());
        let gauged = |name| value(&metrics, name, &[("resource", "pods.v1")]);
        assert_eq!(gauged("kactor_cache_objects"), 0.0, "served at 0");
        *pods.0.lock().unwrap() = Some((3, 4096));
        assert_eq!(gauged("kactor_cache_objects"), 3.0);
        assert_eq!(gauged("kactor_cache_bytes"), 4096.0);
        // A second cache of the same resource (another namespace's supervisor) adds up.
        metrics.cache_served("pods.v1", Arc::new(Size(Mutex::new(Some((2, 1000))))));
        assert_eq!(gauged("kactor_cache_objects"), 5.0);
        assert_eq!(gauged("kactor_cache_bytes"), 5096.0);
        // Gone caches count no more, and the series stays, at 0 when none is left.
        *pods.0.lock().unwrap() = None;
        assert_eq!(gauged("kactor_cache_bytes"), 1000.0);
        assert!(metrics
            .render()
            .contains("kactor_cache_bytes{resource=\"pods.v1\"} 1000"));
    }

    #[test]
    fn workers_daemons_timers_and_lateness_are_gauged() {
        let metrics = Metrics::new().unwrap();
        metrics.workers_changed(W, 1);
        metrics.workers_changed(W, 1);
        metrics.workers_changed(W, -1);
        metrics.workers_changed("pods.v1", 1);
        assert_eq!(
            value(&metrics, "kactor_object_workers", &[("resource", W)]),
            1.0
        );
        assert_eq!(
            value(
                &metrics,
                "kactor_object_workers",
                &[("resource", "pods.v1")]
            ),
            1.0
        );
        metrics.events_coalesced(W, 3);
        metrics.events_coalesced(W, 2);
        assert_eq!(
            value(
                &metrics,
                "kactor_coalesced_events_total",
                &[("resource", W)]
            ),
            5.0
        );
        metrics.objects_undecodable(W, 1);
        assert_eq!(
            value(
                &metrics,
                "kactor_undecodable_objects_total",
                &[("resource", W)]
            ),
            1.0
        );
        metrics.daemon_started(W, SpawningKind::Daemon);
        metrics.daemon_started(W, SpawningKind::Daemon);
        metrics.daemon_started(W, SpawningKind::Timer);
        metrics.daemon_exited(W, SpawningKind::Daemon);
        assert_eq!(
            value(&metrics, "kactor_daemons_running", &[("resource", W)]),
            1.0
        );
        assert_eq!(
            value(&metrics, "kactor_timers_running", &[("resource", W)]),
            1.0
        );
        metrics.timer_lateness(W, "tick", Duration::from_millis(3));
        metrics.timer_lateness(W, "tick", Duration::from_secs(2));
        let lateness = family(&metrics, "kactor_timer_lateness_seconds");
        let histogram = lateness.get_metric()[0].get_histogram();
        assert_eq!(histogram.get_sample_count(), 2);
        let counts: Vec<(f64, u64)> = histogram
            .get_bucket()
            .iter()
            .map(|b| (b.upper_bound(), b.cumulative_count()))
            .collect();
        assert!(counts.contains(&(0.0025, 0)));
        assert!(counts.contains(&(0.005, 1)));
        assert!(counts.contains(&(1.0, 1)));
        assert!(counts.contains(&(2.5, 2)));
    }

    #[test]
    fn watch_streams_count_events_and_restarts_by_reason() {
        let metrics = Metrics::new().unwrap();
        metrics.events_received(W, 500);
        metrics.events_received(W, 12);
        metrics.watch_restarted(W, RestartReason::Relist410);
        metrics.watch_restarted(W, RestartReason::Inactivity);
        metrics.watch_restarted(W, RestartReason::Inactivity);
        assert_eq!(
            value(&metrics, "kactor_events_received_total", &[("resource", W)]),
            512.0
        );
        let restarts = |reason| {
            value(
                &metrics,
                "kactor_watch_restarts_total",
                &[("resource", W), ("reason", reason)],
            )
        };
        assert_eq!(restarts("relist_410"), 1.0);
        assert_eq!(restarts("inactivity"), 2.0);
    }

    #[test]
    fn api_requests_are_counted_by_verb_and_code_with_error_for_no_answer() {
        let metrics = Metrics::new().unwrap();
        metrics.api_request("list", Some(200), Duration::from_millis(10));
        metrics.api_request("list", Some(200), Duration::from_millis(10));
        metrics.api_request("patch", Some(409), Duration::from_millis(10));
        metrics.api_request("watch", None, Duration::from_secs(3));
        let requests = |verb, code| {
            value(
                &metrics,
                "kactor_api_requests_total",
                &[("verb", verb), ("code", code)],
            )
        };
        assert_eq!(requests("list", "200"), 2.0);
        assert_eq!(requests("patch", "409"), 1.0);
        assert_eq!(requests("watch", "<error>"), 1.0);
        assert_eq!(
            value(
                &metrics,
                "kactor_api_request_duration_seconds",
                &[("verb", "list")]
            ),
            2.0
        );
    }

    #[test]
    fn sharding_is_gauged_and_counted_and_gone_members_are_dropped() {
        let metrics = Metrics::new().unwrap();
        metrics.shard_member("ops", true);
        assert_eq!(
            value(&metrics, "kactor_shard_member", &[("ring", "ops")]),
            1.0
        );
        metrics.shard_objects("ops", &[("a", 3), ("b", 4)]);
        metrics.shard_objects("ops", &[("b", 7)]);
        let text = metrics.render();
        assert!(!text.contains("member=\"a\""), "{text}");
        assert_eq!(
            value(
                &metrics,
                "kactor_shard_objects",
                &[("ring", "ops"), ("member", "b")]
            ),
            7.0
        );
        metrics.shard_moves("ops", "drained", 5);
        metrics.fence_rejected(W);
        metrics.handed_over(W, Duration::from_millis(300));
        assert_eq!(
            value(
                &metrics,
                "kactor_shard_moves_total",
                &[("ring", "ops"), ("kind", "drained")]
            ),
            5.0
        );
        assert_eq!(
            value(
                &metrics,
                "kactor_shard_fence_rejections_total",
                &[("resource", W)]
            ),
            1.0
        );
        assert!(metrics
            .render()
            .contains("kactor_shard_handover_seconds_count{resource="));
    }

    #[test]
    fn pausing_and_leadership_are_gauged() {
        let metrics = Metrics::new().unwrap();
        assert_eq!(value(&metrics, "kactor_operator_paused", &[]), 0.0);
        metrics.paused(true);
        assert_eq!(value(&metrics, "kactor_operator_paused", &[]), 1.0);
        metrics.paused(false);
        assert_eq!(value(&metrics, "kactor_operator_paused", &[]), 0.0);
        metrics.leadership("kactor-leader", true);
        let leading = [("name", "kactor-leader")];
        assert_eq!(
            value(&metrics, "leader_election_master_status", &leading),
            1.0
        );
        metrics.leadership("kactor-leader", false);
        assert_eq!(
            value(&metrics, "leader_election_master_status", &leading),
            0.0
        );
    }

    #[test]
    fn every_counter_and_gauge_of_a_served_resource_is_at_zero_from_the_start() {
        let metrics = Metrics::new().unwrap();
        let handlers = ["log", "audit"];
        metrics.resource_served(W, &handlers);
        let resource = [("resource", W)];
        for name in [
            "kactor_events_received_total",
            "kactor_object_workers",
            "kactor_coalesced_events_total",
            "kactor_undecodable_objects_total",
            "kactor_daemons_running",
            "kactor_timers_running",
        ] {
            assert_eq!(value(&metrics, name, &resource), 0.0, "{name}");
        }
        for reason in RestartReason::ALL {
            let labels = [("resource", W), ("reason", reason.as_str())];
            assert_eq!(value(&metrics, "kactor_watch_restarts_total", &labels), 0.0);
        }
        for handler in ["log", "audit"] {
            for verdict in Verdict::ALL {
                let labels = [
                    ("resource", W),
                    ("handler", handler),
                    ("result", verdict.as_str()),
                ];
                assert_eq!(value(&metrics, "kactor_handler_runs_total", &labels), 0.0);
            }
            let labels = [("resource", W), ("handler", handler)];
            assert_eq!(
                value(&metrics, "kactor_handler_retries_total", &labels),
                0.0
            );
        }
        // Served again (another namespace's supervisor): what was counted stays.
        metrics.workers_changed(W, 2);
        metrics.watch_restarted(W, RestartReason::Error);
        metrics.resource_served(W, &handlers);
        assert_eq!(value(&metrics, "kactor_object_workers", &resource), 2.0);
        let errors = [("resource", W), ("reason", "error")];
        assert_eq!(value(&metrics, "kactor_watch_restarts_total", &errors), 1.0);
        let families = metrics.registry().gather();
        assert!(
            !families
                .iter()
                .any(|f| f.name() == "kactor_handler_duration_seconds"),
            "histograms appear with their first sample"
        );
    }

    #[test]
    fn actors_are_gauged_and_their_messages_counted_by_result_from_zero() {
        let metrics = Metrics::new().unwrap();
        metrics.actors_served("cache");
        let cache = [("actor", "cache")];
        assert_eq!(value(&metrics, "kactor_actors", &cache), 0.0);
        assert_eq!(value(&metrics, "kactor_actor_mailbox_depth", &cache), 0.0);
        for outcome in MessageOutcome::ALL {
            let labels = [("actor", "cache"), ("result", outcome.as_str())];
            assert_eq!(value(&metrics, "kactor_actor_messages_total", &labels), 0.0);
        }
        metrics.actors_changed("cache", 3);
        metrics.actors_changed("cache", -1);
        metrics.mailboxes_changed("cache", 5);
        metrics.mailboxes_changed("cache", -2);
        metrics.actor_message("cache", MessageOutcome::Handled, Duration::from_millis(3));
        metrics.actor_message("cache", MessageOutcome::Panicked, Duration::from_millis(1));
        metrics.actor_message("cache", MessageOutcome::NotFound, Duration::ZERO);
        metrics.actors_served("cache");
        assert_eq!(value(&metrics, "kactor_actors", &cache), 2.0);
        assert_eq!(value(&metrics, "kactor_actor_mailbox_depth", &cache), 3.0);
        let handled = [("actor", "cache"), ("result", "handled")];
        assert_eq!(
            value(&metrics, "kactor_actor_messages_total", &handled),
            1.0
        );
        let missing = [("actor", "cache"), ("result", "not_found")];
        assert_eq!(
            value(&metrics, "kactor_actor_messages_total", &missing),
            1.0
        );
        let histogram = family(&metrics, "kactor_actor_message_duration_seconds");
        assert_eq!(
            histogram.get_metric()[0].get_histogram().get_sample_count(),
            2,
            "only handled messages have a duration"
        );
    }

    #[test]
    fn status_codes_are_written_in_decimal() {
        let mut digits = [0; 5];
        assert_eq!(status_text(200, &mut digits), "200");
        assert_eq!(status_text(0, &mut digits), "0");
        assert_eq!(status_text(7, &mut digits), "7");
        assert_eq!(status_text(65535, &mut digits), "65535");
    }

    #[test]
    fn the_rendering_has_every_family_the_process_and_no_object_labels() {
        let metrics = Metrics::new().unwrap();
        metrics.events_received(W, 1);
        metrics.watch_restarted(W, RestartReason::Error);
        metrics.handler_started();
        metrics.handler_finished(&run("create_fn", Verdict::Success, 1, true));
        metrics.workers_changed(W, 1);
        metrics.events_coalesced(W, 1);
        metrics.daemon_started(W, SpawningKind::Daemon);
        metrics.daemon_started(W, SpawningKind::Timer);
        metrics.timer_lateness(W, "tick", Duration::from_millis(1));
        metrics.leadership("kactor", true);
        metrics.api_request("get", Some(404), Duration::from_millis(1));
        metrics.actors_changed("cache", 1);
        metrics.mailboxes_changed("cache", 1);
        metrics.actor_message("cache", MessageOutcome::Handled, Duration::from_millis(1));
        let text = metrics.render();
        for name in [
            "kactor_events_received_total{",
            "kactor_watch_restarts_total{",
            "kactor_handler_runs_total{",
            "kactor_handler_duration_seconds_bucket{",
            "kactor_handler_retries_total{",
            "kactor_active_handlers ",
            "kactor_object_workers{",
            "kactor_coalesced_events_total{",
            "kactor_daemons_running{",
            "kactor_timers_running{",
            "kactor_timer_lateness_seconds_bucket{",
            "kactor_operator_paused ",
            "leader_election_master_status{",
            "kactor_api_requests_total{",
            "kactor_api_request_duration_seconds_bucket{",
            "kactor_actors{",
            "kactor_actor_mailbox_depth{",
            "kactor_actor_messages_total{",
            "kactor_actor_message_duration_seconds_bucket{",
        ] {
            assert!(text.contains(name), "{name} is missing from:\n{text}");
        }
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_open_fds "), "{text}");
        let allowed = [
            "resource", "reason", "handler", "result", "name", "verb", "code", "le", "actor",
        ];
        for family in metrics.registry().gather() {
            for metric in family.get_metric() {
                for label in metric.get_label() {
                    assert!(allowed.contains(&label.name()), "label {}", label.name());
                    assert!(
                        !looks_like_uid(label.value()),
                        "{} has a uid-like label {}",
                        family.name(),
                        label.value()
                    );
                }
            }
        }
    }

    fn looks_like_uid(value: &str) -> bool {
        let parts: Vec<usize> = value.split('-').map(str::len).collect();
        parts == [8, 4, 4, 4, 12] && value.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    }

    #[test]
    fn metrics_go_to_the_users_registry_and_twice_is_an_error() {
        let registry = Registry::new();
        let metrics = Metrics::with_registry(registry.clone()).unwrap();
        metrics.paused(true);
        assert!(registry
            .gather()
            .iter()
            .any(|f| f.name() == "kactor_operator_paused"));
        assert!(Metrics::with_registry(registry).is_err());
    }
}
