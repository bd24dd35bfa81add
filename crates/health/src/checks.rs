//! The liveness and readiness checks, and the [`HealthState`] they read.
//!
//! Liveness (`/healthz`) tells whether the operator still does its work; a failure makes the
//! kubelet restart it. The checks, in order:
//!
//! 1. `watches`: a watch stream that is not paused and has shown no life (no event, no bookmark, no
//!    answered request) for longer than `health.silent_watch_timeout` (120 s), and never less than
//!    the inactivity timeout plus a margin for its reconnect: the "deaf" operator.
//! 2. `actors`: the actors' thread has not beaten for `health.heartbeat_timeout` (10 s).
//! 3. `executor`: the operator's runtime has not run a heartbeat task, or one of its worker threads
//!    has been stuck in one poll, for `health.heartbeat_timeout`.
//! 4. `probes`: a probe handler failed, panicked or ran past `health.probe_timeout`.
//! 5. The user's liveness checks ([`HealthState::add_liveness_check`]).
//!
//! Readiness (`/readyz`) tells whether the operator has started: `startup` (the startup activities
//! succeeded), `listing` (every stream that is not paused has listed its objects once), then the
//! user's readiness checks.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactor_reactor::handlers::{ActivityCtx, Probe};
use kactor_reactor::observe::WatchBoard;
use kactor_reactor::settings::{Health, Settings};
use serde_json::Value;
use tokio::runtime::Handle;

use crate::executor::{Clock, Executor};
use crate::format::seconds;
use crate::probes::Probes;
use kactor_reactor::execution::panic_message;

/// A user's check: `Ok` when healthy, or why not. It runs on the health server's thread for every
/// request that includes it, so it must be quick and must not block.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The built-in liveness checks, in order.
const LIVENESS: [&str; 4] = ["watches", "actors", "executor", "probes"];

/// The built-in readiness checks, in order.
const READINESS: [&str; 2] = ["startup", "listing"];

/// Why a check cannot be added.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The name is taken by a built-in check or one added before.
    #[error("a {probe} check named {name:?} exists already; choose another name")]
    Duplicate {
        /// `healthz` or `readyz`.
        probe: &'static str,
        /// The name.
        name: String,
    },
    /// The name cannot be a path segment (`/healthz/<name>`).
    #[error("{name:?} cannot name a check: use letters, digits, '-', '_' and '.'")]
    InvalidName {
        /// The name.
        name: String,
    },
}

/// What the health checks read: the watch streams, the heartbeats, the probes, the startup.
///
/// Made once per operator and shared (by [`Arc`]) by the [`HealthActor`](crate::HealthActor),
/// the [`HealthServer`](crate::HealthServer) and the operator's startup.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use kactor_reactor::{observe::WatchBoard, settings::Settings};
/// # async fn demo() {
/// let state = kactor_health::HealthState::new(
///     &Settings::default(),
///     WatchBoard::new(),
///     tokio::runtime::Handle::current(),
/// );
/// state
///     .add_readiness_check("cache-warm", Arc::new(|| Ok(())))
///     .expect("a new name");
/// state.startup_done();
/// assert!(state.readiness().passed());
/// # }
/// ```
pub struct HealthState {
    health: Health,
    silence_limit: Duration,
    watches: WatchBoard,
    runtime: Handle,
    clock: Clock,
    /// When the actors' thread last beat (the clock's milliseconds; 0: never).
    actors_beat: AtomicU64,
    /// When each object thread last beat, by its number (0: never); set once they start.
    object_beats: std::sync::OnceLock<Box<[AtomicU64]>>,
    started: AtomicBool,
    executor: Executor,
    probes: Probes,
    liveness_checks: Mutex<Vec<(Arc<str>, Check)>>,
    readiness_checks: Mutex<Vec<(Arc<str>, Check)>>,
}

impl HealthState {
    /// The state of an operator with these settings, watch streams and runtime (the one its
    /// handlers run on).
    pub fn new(settings: &Settings, watches: WatchBoard, runtime: Handle) -> Arc<HealthState> {
        let clock = Clock::new();
        Arc::new(HealthState {
            health: settings.health.clone(),
            silence_limit: silence_limit(
                settings.health.silent_watch_timeout,
                settings.watching.inactivity_timeout,
            ),
            watches,
            runtime,
            clock,
            actors_beat: AtomicU64::new(0),
            object_beats: std::sync::OnceLock::new(),
            started: AtomicBool::new(false),
            executor: Executor::new(clock),
            probes: Probes::default(),
            liveness_checks: Mutex::default(),
            readiness_checks: Mutex::default(),
        })
    }

    /// The health settings in force.
    pub fn settings(&self) -> &Health {
        &self.health
    }

    /// Sets the probe handlers (Kopf's `@kopf.on.probe`) and what they are given; the `probes`
    /// check and the liveness JSON use them from now on.
    pub fn set_probes(&self, probes: Vec<Probe>, ctx: ActivityCtx) {
        self.probes.set(probes, ctx);
    }

    /// The startup activities succeeded and watching began: `startup` passes from now on.
    pub fn startup_done(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Adds a liveness check (as controller-runtime's `AddHealthzCheck`), run after the built-in
    /// ones, in the order added, and served alone at `/healthz/<name>`.
    pub fn add_liveness_check(&self, name: &str, check: Check) -> Result<(), CheckError> {
        add_check(&self.liveness_checks, &LIVENESS, "healthz", name, check)
    }

    /// Adds a readiness check (as controller-runtime's `AddReadyzCheck`), run after the built-in
    /// ones, in the order added, and served alone at `/readyz/<name>`.
    pub fn add_readiness_check(&self, name: &str, check: Check) -> Result<(), CheckError> {
        add_check(&self.readiness_checks, &READINESS, "readyz", name, check)
    }

    /// The actors' thread is alive (the [`HealthActor`](crate::HealthActor) calls it every
    /// `heartbeat_interval`).
    pub fn beat_actors(&self) {
        self.actors_beat.store(self.clock.now(), Ordering::Relaxed);
    }

    /// There are `count` object threads (where the objects' workers and handlers run), each
    /// with a [`HealthActor`](crate::HealthActor) beating for it; the `actors` check covers them
    /// from their first beat. Set once: a second call changes nothing.
    pub fn expect_object_threads(&self, count: usize) {
        let _ = self
            .object_beats
            .set((0..count).map(|_| AtomicU64::new(0)).collect());
    }

    /// Object thread `number` is alive.
    pub fn beat_object_thread(&self, number: usize) {
        if let Some(beat) = self.object_beats.get().and_then(|beats| beats.get(number)) {
            beat.store(self.clock.now(), Ordering::Relaxed);
        }
    }

    /// Sends the operator's runtime a heartbeat task and samples its worker threads. The health
    /// server calls it every `heartbeat_interval`; until the first call, `executor` passes.
    pub fn sample(&self) {
        self.executor.sample(&self.runtime);
    }

    /// Runs every liveness check.
    pub async fn liveness(&self) -> Report {
        self.liveness_of(&Select::All).await
    }

    /// Runs every readiness check.
    pub fn readiness(&self) -> Report {
        self.readiness_of(&Select::All)
    }

    /// Runs the selected liveness checks.
    pub(crate) async fn liveness_of(&self, select: &Select<'_>) -> Report {
        let mut collect = Collect::new(Kind::Liveness, select);
        collect.run("watches", || self.watches_check());
        collect.run("actors", || self.actors_check());
        let heartbeat_timeout = self.health.heartbeat_timeout;
        collect.run("executor", || self.executor.check(heartbeat_timeout));
        let probes = Name::BuiltIn("probes");
        if collect.wants(&probes) {
            let (timeout, max_age) = (self.health.probe_timeout, self.health.probe_cache);
            match self.probes.check(&self.runtime, timeout, max_age).await {
                Ok(json) => {
                    collect.report.probes = Some(json);
                    collect.push(probes, Ok(()));
                }
                Err(failure) => collect.push(probes, Err(failure)),
            }
        }
        collect.run_user_checks(&self.liveness_checks);
        collect.finish()
    }

    /// Runs the selected readiness checks.
    pub(crate) fn readiness_of(&self, select: &Select<'_>) -> Report {
        let mut collect = Collect::new(Kind::Readiness, select);
        collect.run("startup", || match self.started.load(Ordering::Relaxed) {
            true => Ok(()),
            false => Err(
                "the startup activities have not finished yet, or watching has not begun"
                    .to_string(),
            ),
        });
        collect.run("listing", || self.listing_check());
        collect.run_user_checks(&self.readiness_checks);
        collect.finish()
    }

    fn watches_check(&self) -> Result<(), String> {
        let limit = self.silence_limit;
        let failures: Vec<String> = self
            .watches
            .streams()
            .iter()
            .filter(|(_, status)| !status.is_paused())
            .filter_map(|(label, status)| {
                let idle = status.idle_for();
                (idle > limit).then(|| {
                    let mut failure = format!(
                        "{label}: no event, bookmark or answer for {} s (limit {} s)",
                        seconds(idle),
                        seconds(limit)
                    );
                    if let Some(error) = status.failing() {
                        failure.push_str("; last error: ");
                        failure.push_str(&error);
                    }
                    failure
                })
            })
            .collect();
        match failures.is_empty() {
            true => Ok(()),
            false => Err(failures.join("; ")),
        }
    }

    fn actors_check(&self) -> Result<(), String> {
        let limit = self.health.heartbeat_timeout;
        // Never beaten: the thread has not started yet.
        let silent = |beat: &AtomicU64| {
            self.clock
                .since(beat.load(Ordering::Relaxed))
                .filter(|silence| *silence > limit)
        };
        let mut failures = Vec::new();
        if let Some(silence) = silent(&self.actors_beat) {
            failures.push(format!(
                "the actors' thread is stuck: no heartbeat for {} s (limit {} s); an actor or \
                 user code blocks the actors' thread",
                seconds(silence),
                seconds(limit)
            ));
        }
        let beats = self.object_beats.get().map_or(&[][..], |beats| &beats[..]);
        for (number, beat) in beats.iter().enumerate() {
            if let Some(silence) = silent(beat) {
                failures.push(format!(
                    "object thread {number} is stuck: no heartbeat for {} s (limit {} s); a \
                     handler blocks it (handlers must not block: run blocking work with \
                     tokio::task::spawn_blocking)",
                    seconds(silence),
                    seconds(limit)
                ));
            }
        }
        match failures.is_empty() {
            true => Ok(()),
            false => Err(failures.join("; ")),
        }
    }

    fn listing_check(&self) -> Result<(), String> {
        let unlisted: Vec<Arc<str>> = self
            .watches
            .streams()
            .into_iter()
            .filter(|(_, status)| !status.is_paused() && !status.is_listed())
            .map(|(label, _)| label)
            .collect();
        match unlisted.is_empty() {
            true => Ok(()),
            false => Err(format!("not listed yet: {}", unlisted.join(", "))),
        }
    }
}

impl fmt::Debug for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthState")
            .field("health", &self.health)
            .field("watches", &self.watches)
            .field("started", &self.started.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn add_check(
    checks: &Mutex<Vec<(Arc<str>, Check)>>,
    built_in: &[&str],
    probe: &'static str,
    name: &str,
    check: Check,
) -> Result<(), CheckError> {
    let valid = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if name.is_empty() || !valid {
        return Err(CheckError::InvalidName {
            name: name.to_string(),
        });
    }
    let mut checks = checks.lock().unwrap_or_else(|p| p.into_inner());
    if built_in.contains(&name) || checks.iter().any(|(n, _)| &**n == name) {
        return Err(CheckError::Duplicate {
            probe,
            name: name.to_string(),
        });
    }
    checks.push((name.into(), check));
    Ok(())
}

/// How long a stream that is not paused may stay silent: `silent_watch_timeout`, but at least the
/// inactivity timeout (after which the watcher reopens a quiet stream) plus a margin for that
/// reconnect to be answered: 10 s, or the inactivity timeout itself when it is shorter (so that
/// sub-second timeouts, as in tests, keep sub-second limits).
pub(crate) fn silence_limit(silent_watch_timeout: Duration, inactivity: Duration) -> Duration {
    let margin = inactivity.min(Duration::from_secs(10));
    silent_watch_timeout.max(inactivity + margin)
}

/// Which checks a request asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Select<'a> {
    /// All of them.
    All,
    /// All but these (controller-runtime's `?exclude=`).
    Except(&'a [String]),
    /// This one alone (`/healthz/<name>`).
    Only(&'a str),
}

/// Liveness or readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Liveness,
    Readiness,
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Ok,
    /// It was not run: the request excluded it.
    Excluded,
    /// It failed, for this reason.
    Failed(String),
}

/// A check's name: a built-in one's, or a user's (shared with the registration, not copied).
#[derive(Debug, Clone)]
enum Name {
    BuiltIn(&'static str),
    User(Arc<str>),
}

impl std::ops::Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Name::BuiltIn(name) => name,
            Name::User(name) => name,
        }
    }
}

/// A report being made: which checks the request selected, and their outcomes so far.
struct Collect<'a> {
    select: &'a Select<'a>,
    report: Report,
}

impl<'a> Collect<'a> {
    fn new(kind: Kind, select: &'a Select<'a>) -> Self {
        Collect {
            select,
            report: Report {
                kind,
                checks: Vec::new(),
                probes: None,
                unknown: Vec::new(),
            },
        }
    }

    /// Whether the check is to run; an excluded one is listed as such.
    fn wants(&mut self, name: &Name) -> bool {
        match self.select {
            Select::All => true,
            Select::Only(only) => *only == &**name,
            Select::Except(excluded) => {
                let run = !excluded.iter().any(|n| n == &**name);
                if !run {
                    self.report.checks.push((name.clone(), Outcome::Excluded));
                }
                run
            }
        }
    }

    /// Runs a built-in check if selected.
    fn run(&mut self, name: &'static str, check: impl FnOnce() -> Result<(), String>) {
        let name = Name::BuiltIn(name);
        if self.wants(&name) {
            self.push(name, check());
        }
    }

    fn push(&mut self, name: Name, result: Result<(), String>) {
        let outcome = match result {
            Ok(()) => Outcome::Ok,
            Err(message) => Outcome::Failed(message),
        };
        self.report.checks.push((name, outcome));
    }

    fn run_user_checks(&mut self, checks: &Mutex<Vec<(Arc<str>, Check)>>) {
        // Copied out (a few pointers), so that no lock is held while user code runs.
        let checks = checks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (name, check) in checks {
            let name = Name::User(name);
            if self.wants(&name) {
                let result = catch_unwind(AssertUnwindSafe(|| check()))
                    .unwrap_or_else(|panic| Err(format!("panicked: {}", panic_message(&panic))));
                self.push(name, result);
            }
        }
    }

    fn finish(mut self) -> Report {
        let asked: &[String] = match self.select {
            Select::All => &[],
            Select::Except(names) => names,
            Select::Only(name) => {
                if self.report.checks.is_empty() {
                    self.report.unknown.push(name.to_string());
                }
                &[]
            }
        };
        for name in asked {
            if !self.report.checks.iter().any(|(n, _)| **n == **name) {
                self.report.unknown.push(name.clone());
            }
        }
        self.report
    }
}

/// The results of the liveness or readiness checks, in order.
///
/// Its [`Display`](fmt::Display) is controller-runtime's verbose text: one line per check
/// (`[+]watches ok`, `[+]probes excluded: ok`, `[-]actors failed: <why>`), then
/// `healthz check passed` (or `failed`; `readyz` for readiness).
#[derive(Debug, Clone)]
pub struct Report {
    kind: Kind,
    checks: Vec<(Name, Outcome)>,
    probes: Option<Value>,
    /// Names asked to be excluded (or asked for alone) that match no check.
    unknown: Vec<String>,
}

impl Report {
    /// `healthz` or `readyz`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Liveness => "healthz",
            Kind::Readiness => "readyz",
        }
    }

    /// Whether every check that ran passed.
    pub fn passed(&self) -> bool {
        !self
            .checks
            .iter()
            .any(|(_, outcome)| matches!(outcome, Outcome::Failed(_)))
    }

    /// The checks, in order, with their outcomes.
    pub fn checks(&self) -> impl Iterator<Item = (&str, &Outcome)> {
        self.checks.iter().map(|(name, outcome)| (&**name, outcome))
    }

    /// The outcome of one check, if it was in the report.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.checks().find(|(n, _)| *n == name).map(|(_, o)| o)
    }

    /// The failed checks and why.
    pub fn failures(&self) -> impl Iterator<Item = (&str, &str)> {
        self.checks().filter_map(|(name, outcome)| match outcome {
            Outcome::Failed(message) => Some((name, message.as_str())),
            _ => None,
        })
    }

    /// The probes' results, Kopf's liveness body (`{"<probe id>": <result>, ...}`), when the
    /// `probes` check ran and passed.
    pub fn probes(&self) -> Option<&Value> {
        self.probes.as_ref()
    }

    /// The names asked to be excluded, or asked for alone, that match no check.
    pub fn unknown(&self) -> &[String] {
        &self.unknown
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, outcome) in self.checks() {
            match outcome {
                Outcome::Ok => writeln!(f, "[+]{name} ok")?,
                Outcome::Excluded => writeln!(f, "[+]{name} excluded: ok")?,
                Outcome::Failed(message) => writeln!(f, "[-]{name} failed: {message}")?,
            }
        }
        if !self.unknown.is_empty() {
            let names: Vec<String> = self.unknown.iter().map(|n| format!("{n:?}")).collect();
            writeln!(
                f,
                "warn: some health checks cannot be excluded: no matches for {}",
                names.join(", ")
            )?;
        }
        let verdict = if self.passed() { "passed" } else { "failed" };
        writeln!(f, "{} check {verdict}", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use kactor_reactor::handlers::{HandlerError, Memo};
    use kactor_reactor::watching::WatchStatus;
    use serde_json::json;
    use std::sync::atomic::AtomicUsize;

    fn settings(silent: Duration, inactivity: Duration) -> Settings {
        let mut settings = Settings::default();
        settings.health.silent_watch_timeout = silent;
        settings.watching.inactivity_timeout = inactivity;
        settings.health.heartbeat_timeout = Duration::from_millis(500);
        settings.health.probe_timeout = Duration::from_millis(300);
        settings
    }

    fn state(settings: &Settings, board: &WatchBoard) -> Arc<HealthState> {
        HealthState::new(settings, board.clone(), Handle::current())
    }

    fn small() -> Settings {
        settings(Duration::from_millis(200), Duration::from_millis(200))
    }

    fn failure(report: &Report, name: &str) -> Option<String> {
        match report.outcome(name) {
            Some(Outcome::Failed(message)) => Some(message.clone()),
            _ => None,
        }
    }

    fn ctx() -> ActivityCtx {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        ActivityCtx {
            memo: Memo::default(),
            client: kube::Client::try_from(config).unwrap(),
        }
    }

    fn probe<F, Fut>(id: &str, f: F) -> Probe
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Value, HandlerError>> + Send + 'static,
    {
        Probe {
            id: id.to_string(),
            func: Arc::new(move |_ctx| f().boxed()),
        }
    }

    #[test]
    fn the_silence_limit_keeps_a_margin_above_the_inactivity_timeout() {
        let s = Duration::from_secs;
        assert_eq!(silence_limit(s(120), s(70)), s(120), "the defaults");
        assert_eq!(silence_limit(s(60), s(70)), s(80), "10 s after a reconnect");
        assert_eq!(
            silence_limit(s(75), s(70)),
            s(80),
            "never within the margin"
        );
        let ms = Duration::from_millis;
        assert_eq!(silence_limit(ms(50), ms(50)), ms(100), "short timeouts");
        assert_eq!(silence_limit(ms(50), ms(10)), ms(50));
    }

    #[tokio::test]
    async fn a_silent_watch_fails_liveness_with_its_label_silence_limit_and_error() {
        let board = WatchBoard::new();
        let state = state(&small(), &board);
        let _quiet = board.register("pods.v1 in default", Arc::new(WatchStatus::new()));
        assert_eq!(failure(&state.liveness().await, "watches"), None);
        let status = Arc::new(WatchStatus::new());
        let _entry = board.register("widgets.v1.example.com in default", status.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let message = failure(&state.liveness().await, "watches").expect("silent streams fail");
        let streams: Vec<&str> = message.split("; ").collect();
        assert_eq!(streams.len(), 2, "both silent streams: {message}");
        assert!(streams[0].starts_with("pods.v1 in default: no event, bookmark or answer for "));
        assert!(streams[1].starts_with("widgets.v1.example.com in default: no event"));
        assert!(message.contains("s (limit 0.4 s)"), "{message}");
        assert!(!message.contains("last error"), "{message}");
    }

    #[tokio::test]
    async fn paused_streams_are_not_silent_and_resuming_restarts_their_clock() {
        let board = WatchBoard::new();
        let state = state(&small(), &board);
        let status = Arc::new(WatchStatus::new());
        let _entry = board.register("widgets.v1.example.com", status.clone());
        status.set_paused(true);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let report = state.liveness().await;
        assert_eq!(report.outcome("watches"), Some(&Outcome::Ok));
        status.set_paused(false);
        let report = state.liveness().await;
        assert_eq!(report.outcome("watches"), Some(&Outcome::Ok), "a new clock");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(failure(&state.liveness().await, "watches").is_some());
    }

    #[tokio::test]
    async fn a_stream_that_leaves_the_board_no_longer_fails() {
        let board = WatchBoard::new();
        let state = state(&small(), &board);
        let entry = board.register("widgets.v1.example.com", Arc::new(WatchStatus::new()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!state.liveness().await.passed());
        drop(entry);
        assert!(state.liveness().await.passed());
    }

    #[tokio::test]
    async fn readiness_waits_for_startup_and_listings_of_running_streams() {
        let board = WatchBoard::new();
        let state = state(&Settings::default(), &board);
        let report = state.readiness();
        assert_eq!(
            failure(&report, "startup").as_deref(),
            Some("the startup activities have not finished yet, or watching has not begun")
        );
        assert_eq!(report.outcome("listing"), Some(&Outcome::Ok));
        state.startup_done();
        assert!(state.readiness().passed());

        let unlisted = Arc::new(WatchStatus::new());
        let _entry = board.register("widgets.v1.example.com in default", unlisted.clone());
        let paused = Arc::new(WatchStatus::new());
        paused.set_paused(true);
        let _paused = board.register("pods.v1", paused);
        assert_eq!(
            failure(&state.readiness(), "listing").as_deref(),
            Some("not listed yet: widgets.v1.example.com in default")
        );
        unlisted.set_paused(true);
        assert!(
            state.readiness().passed(),
            "paused streams are not waited for"
        );
    }

    #[tokio::test]
    async fn the_actors_check_passes_before_the_first_beat_and_fails_once_beats_stop() {
        let state = state(&small(), &WatchBoard::new());
        assert_eq!(state.liveness().await.outcome("actors"), Some(&Outcome::Ok));
        state.beat_actors();
        assert_eq!(state.liveness().await.outcome("actors"), Some(&Outcome::Ok));
        tokio::time::sleep(Duration::from_millis(700)).await;
        let message = failure(&state.liveness().await, "actors").expect("no beat for 700 ms");
        assert!(message.contains("the actors' thread is stuck"), "{message}");
        assert!(message.contains("(limit 0.5 s)"), "{message}");
        state.beat_actors();
        assert!(state.liveness().await.passed());
    }

    #[tokio::test]
    async fn probes_results_are_kopfs_liveness_json() {
        let state = state(&small(), &WatchBoard::new());
        let report = state.liveness().await;
        assert_eq!(report.probes(), Some(&json!({})), "no probes");
        state.set_probes(
            vec![
                probe("db", || async { Ok(json!({"connections": 3})) }),
                probe("cache", || async { Ok(json!(true)) }),
            ],
            ctx(),
        );
        let report = state.liveness().await;
        assert!(report.passed(), "{report}");
        assert_eq!(
            report.probes(),
            Some(&json!({"db": {"connections": 3}, "cache": true}))
        );
    }

    #[tokio::test]
    async fn failing_panicking_and_hanging_probes_fail_liveness_each_named() {
        let state = state(&small(), &WatchBoard::new());
        state.set_probes(
            vec![
                probe("fine", || async { Ok(json!(1)) }),
                probe("db", || async {
                    Err(HandlerError::msg("connection refused"))
                }),
                probe("bug", || async { panic!("index out of bounds") }),
                probe("stuck", futures::future::pending),
            ],
            ctx(),
        );
        let report = state.liveness().await;
        assert!(report.probes().is_none());
        let message = failure(&report, "probes").expect("the probes fail");
        let failures: Vec<&str> = message.split("; ").collect();
        assert_eq!(
            failures,
            [
                "probe 'db' failed: connection refused",
                "probe 'bug' panicked: index out of bounds",
                "probe 'stuck' timed out after 0.3 s",
            ]
        );
    }

    #[tokio::test]
    async fn probe_results_are_reused_within_the_cache_period_and_shared_by_concurrent_checks() {
        let mut settings = small();
        settings.health.probe_cache = Duration::from_secs(1);
        let state = state(&settings, &WatchBoard::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        state.set_probes(
            vec![probe("counted", move || {
                let calls = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(json!(calls))
                }
            })],
            ctx(),
        );
        let (first, second) = tokio::join!(state.liveness(), state.liveness());
        assert_eq!(first.probes(), Some(&json!({"counted": 1})));
        assert_eq!(
            second.probes(),
            Some(&json!({"counted": 1})),
            "one shared run"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let again = state.liveness().await;
        assert_eq!(again.probes(), Some(&json!({"counted": 1})), "cached");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let fresh = state.liveness().await;
        assert_eq!(fresh.probes(), Some(&json!({"counted": 2})));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn probe_failures_are_cached_too() {
        let mut settings = small();
        settings.health.probe_cache = Duration::from_secs(60);
        let state = state(&settings, &WatchBoard::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        state.set_probes(
            vec![probe("db", move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Err(HandlerError::msg("down")) }
            })],
            ctx(),
        );
        for _ in 0..3 {
            assert!(!state.liveness().await.passed());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn user_checks_run_after_the_built_in_ones_and_panics_are_failures() {
        let state = state(&small(), &WatchBoard::new());
        state
            .add_liveness_check("db", Arc::new(|| Err("no connection".to_string())))
            .unwrap();
        state
            .add_liveness_check("bug", Arc::new(|| panic!("oops")))
            .unwrap();
        state
            .add_readiness_check("warm", Arc::new(|| Ok(())))
            .unwrap();
        let report = state.liveness().await;
        let names: Vec<&str> = report.checks().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["watches", "actors", "executor", "probes", "db", "bug"]
        );
        assert_eq!(failure(&report, "db").as_deref(), Some("no connection"));
        assert_eq!(failure(&report, "bug").as_deref(), Some("panicked: oops"));
        let readiness = state.readiness();
        let names: Vec<&str> = readiness.checks().map(|(n, _)| n).collect();
        assert_eq!(names, ["startup", "listing", "warm"]);
    }

    #[tokio::test]
    async fn check_names_must_be_new_and_fit_in_a_path() {
        let state = state(&small(), &WatchBoard::new());
        let ok: Check = Arc::new(|| Ok(()));
        assert!(matches!(
            state.add_liveness_check("watches", ok.clone()),
            Err(CheckError::Duplicate { .. })
        ));
        state.add_liveness_check("db", ok.clone()).unwrap();
        assert!(state.add_liveness_check("db", ok.clone()).is_err());
        state.add_readiness_check("db", ok.clone()).unwrap();
        for bad in ["", "a/b", "a b", "é"] {
            assert!(matches!(
                state.add_readiness_check(bad, ok.clone()),
                Err(CheckError::InvalidName { .. })
            ));
        }
    }

    #[tokio::test]
    async fn reports_render_as_controller_runtime_text_with_exclusions() {
        let board = WatchBoard::new();
        let state = state(&small(), &board);
        state
            .add_liveness_check("db", Arc::new(|| Err("no connection".to_string())))
            .unwrap();
        let report = state.liveness().await;
        assert_eq!(
            report.to_string(),
            "[+]watches ok\n[+]actors ok\n[+]executor ok\n[+]probes ok\n\
             [-]db failed: no connection\nhealthz check failed\n"
        );
        let exclude = ["db".to_string(), "nope".to_string()];
        let report = state.liveness_of(&Select::Except(&exclude)).await;
        assert!(report.passed());
        assert_eq!(
            report.to_string(),
            "[+]watches ok\n[+]actors ok\n[+]executor ok\n[+]probes ok\n[+]db excluded: ok\n\
             warn: some health checks cannot be excluded: no matches for \"nope\"\n\
             healthz check passed\n"
        );
        let only = state.liveness_of(&Select::Only("actors")).await;
        assert_eq!(only.checks().count(), 1);
        assert_eq!(only.outcome("actors"), Some(&Outcome::Ok));
        let unknown = state.readiness_of(&Select::Only("nope"));
        assert_eq!(unknown.checks().count(), 0);
        assert_eq!(unknown.unknown(), ["nope"]);
        assert!(state
            .readiness()
            .to_string()
            .ends_with("readyz check failed\n"));
    }
}
