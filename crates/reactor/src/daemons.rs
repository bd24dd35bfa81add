//! Daemons and timers: the spawning handlers (`reference/kopf.md` §1.8, §1.9), what they are given to
//! know when to stop ([`Stopped`]), and the live body they read.
//!
//! * A **daemon** ([`Daemon`]) is one long-running task per (object, handler): started when the object
//!   is first seen, after an optional initial delay; retried after errors; stopped when the object is
//!   deleted, its filters stop matching, or the operator pauses or exits.
//! * A **timer** ([`Timer`]) calls its handler on a schedule: every `interval` (from the end of one
//!   call to the start of the next, or on a fixed grid when `sharp`), only after `idle` without
//!   essential changes, or both. A timer never overlaps itself.
//!
//! Both hold the object's finalizer while they may run, and both store their results in
//! `status.<id>` and send their patches after each run. Running them is `kactor-actors`' job (the
//! object's worker owns them); this module has the domain: the options, the stop reasons and signal,
//! (their metrics go through [`crate::observe::Observer`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kube::api::DynamicObject;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::filters::Filters;
use crate::handlers::{Ctx, HandlerFn, Options};
use crate::resources::Selector;
use crate::watching::EventType;

/// Why a daemon or timer is stopping (Kopf's `DaemonStoppingReason`). Several can hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// Its task has ended, whatever the reason.
    Done,
    /// The object no longer matches the handler's filters.
    FiltersMismatch,
    /// The object is being deleted (or is gone).
    ResourceDeleted,
    /// The operator is pausing (peering, leader election, or the pause switch).
    OperatorPausing,
    /// The operator is exiting.
    OperatorExiting,
    /// It was asked to exit and has `cancellation_backoff` to do so.
    DaemonSignalled,
    /// It did not exit within `cancellation_backoff`: its task is cancelled.
    DaemonCancelled,
    /// It did not end within `cancellation_timeout` after the cancellation: it is left running, and
    /// no longer holds the object's finalizer.
    DaemonAbandoned,
}

impl StopReason {
    const ALL: [StopReason; 8] = [
        StopReason::Done,
        StopReason::FiltersMismatch,
        StopReason::ResourceDeleted,
        StopReason::OperatorPausing,
        StopReason::OperatorExiting,
        StopReason::DaemonSignalled,
        StopReason::DaemonCancelled,
        StopReason::DaemonAbandoned,
    ];

    fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// Kopf's name of the reason (`RESOURCE_DELETED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Done => "DONE",
            StopReason::FiltersMismatch => "FILTERS_MISMATCH",
            StopReason::ResourceDeleted => "RESOURCE_DELETED",
            StopReason::OperatorPausing => "OPERATOR_PAUSING",
            StopReason::OperatorExiting => "OPERATOR_EXITING",
            StopReason::DaemonSignalled => "DAEMON_SIGNALLED",
            StopReason::DaemonCancelled => "DAEMON_CANCELLED",
            StopReason::DaemonAbandoned => "DAEMON_ABANDONED",
        }
    }
}

/// A set of [`StopReason`]s; empty while the daemon may run.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct StopReasons(u16);

impl StopReasons {
    /// Whether no reason is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `reason` is set.
    pub fn contains(self, reason: StopReason) -> bool {
        self.0 & reason.bit() != 0
    }

    /// The set with `reason` added.
    pub fn with(self, reason: StopReason) -> Self {
        StopReasons(self.0 | reason.bit())
    }

    /// The set without `reason`.
    pub fn without(self, reason: StopReason) -> Self {
        StopReasons(self.0 & !reason.bit())
    }

    /// The reasons set, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = StopReason> {
        StopReason::ALL
            .into_iter()
            .filter(move |r| self.contains(*r))
    }
}

impl From<StopReason> for StopReasons {
    fn from(reason: StopReason) -> Self {
        StopReasons(reason.bit())
    }
}

impl fmt::Display for StopReasons {
    /// Kopf's flag notation: `RESOURCE_DELETED|DAEMON_SIGNALLED`, or `-` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let names: Vec<&str> = self.iter().map(StopReason::as_str).collect();
        f.write_str(&names.join("|"))
    }
}

impl fmt::Debug for StopReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The stop signal's sending side, held by whoever owns the daemon. Not `Clone`: one owner decides.
#[derive(Debug)]
pub struct Stopper(Arc<watch::Sender<StopReasons>>);

impl Default for Stopper {
    fn default() -> Self {
        Stopper(Arc::new(watch::channel(StopReasons::default()).0))
    }
}

impl Stopper {
    /// A stopper with no reason set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `reason`; returns whether it was not set before.
    pub fn stop(&self, reason: StopReason) -> bool {
        self.0.send_if_modified(|reasons| {
            let added = !reasons.contains(reason);
            *reasons = reasons.with(reason);
            added
        })
    }

    /// The reasons set so far.
    pub fn reasons(&self) -> StopReasons {
        *self.0.borrow()
    }

    /// The receiving side, for the daemon.
    pub fn stopped(&self) -> Stopped {
        Stopped(Some(self.0.subscribe()))
    }

    /// Waits up to `timeout` for the daemon's task to report its end (`Done`); returns whether it did.
    pub async fn exited_within(&self, timeout: Duration) -> bool {
        let mut receiver = self.0.subscribe();
        let waiting = receiver.wait_for(|reasons| reasons.contains(StopReason::Done));
        let exited = matches!(tokio::time::timeout(timeout, waiting).await, Ok(Ok(_)));
        exited
    }

    /// A second handle on the same signal, for the daemon's own task to report `Done` on exit.
    pub fn share(&self) -> Stopper {
        Stopper(self.0.clone())
    }
}

/// What a daemon or timer sees of its stop signal (Kopf's `stopped` kwarg). Cheap to clone. Other
/// handlers get one that never fires.
///
/// ```
/// # use kactor_reactor::daemons::Stopped;
/// # use std::time::Duration;
/// async fn poll(stopped: Stopped) {
///     while !stopped.is_stopped() {
///         // ... one round of work ...
///         if stopped.wait_timeout(Duration::from_secs(10)).await {
///             break;
///         }
///     }
///     println!("stopping because of {}", stopped.reasons());
/// }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Stopped(Option<watch::Receiver<StopReasons>>);

impl Stopped {
    /// A signal that never fires (for handlers that are not daemons or timers).
    pub fn never() -> Self {
        Stopped(None)
    }

    /// Whether the daemon is asked to stop.
    pub fn is_stopped(&self) -> bool {
        !self.reasons().is_empty()
    }

    /// Why it is asked to stop (empty while it may run).
    pub fn reasons(&self) -> StopReasons {
        self.0
            .as_ref()
            .map_or_else(StopReasons::default, |r| *r.borrow())
    }

    /// Waits until the daemon is asked to stop; returns why. Never returns for a signal that never
    /// fires.
    pub async fn wait(&self) -> StopReasons {
        let Some(receiver) = &self.0 else {
            return std::future::pending().await;
        };
        let mut receiver = receiver.clone();
        let reasons = match receiver.wait_for(|reasons| !reasons.is_empty()).await {
            Ok(reasons) => *reasons,
            // The owner is gone: nobody will ever ask again, which is a request to stop.
            Err(_) => StopReasons::from(StopReason::Done),
        };
        reasons
    }

    /// Sleeps up to `timeout`, waking early when asked to stop; returns whether it is asked to stop
    /// (Kopf's `await stopped.wait(timeout)`).
    pub async fn wait_timeout(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.wait()).await.is_ok()
    }

    /// Sleeps until `deadline`, waking early when asked to stop; returns whether it is asked to stop.
    pub async fn wait_until(&self, deadline: Instant) -> bool {
        tokio::time::timeout_at(deadline, self.wait()).await.is_ok()
    }
}

/// The object as its daemons and timers see it: replaced on every event.
#[derive(Clone, Debug)]
pub struct Live {
    /// The newest body.
    pub body: Arc<DynamicObject>,
    /// The type of the newest event.
    pub event_type: EventType,
    /// The last essential change (a non-empty diff against the last handled essence, or, when none
    /// is kept, against the previous event's essence; Kopf counts every event then): the start of
    /// the `idle` period of timers.
    pub changed: Instant,
}

/// A delay before the first run, fixed or computed from the object (Kopf's `initial_delay`, a float
/// or a callable).
#[derive(Clone)]
pub enum InitialDelay {
    /// A fixed delay.
    Fixed(Duration),
    /// A delay computed from the context when the daemon or timer starts.
    Computed(Arc<dyn Fn(&Ctx) -> Duration + Send + Sync>),
}

impl InitialDelay {
    /// The delay for this context.
    pub fn of(&self, ctx: &Ctx) -> Duration {
        match self {
            InitialDelay::Fixed(delay) => *delay,
            InitialDelay::Computed(f) => f(ctx),
        }
    }
}

impl fmt::Debug for InitialDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitialDelay::Fixed(delay) => write!(f, "{delay:?}"),
            InitialDelay::Computed(_) => f.write_str("<callback>"),
        }
    }
}

/// How a daemon is stopped when asked to (Kopf's `cancellation_backoff` and `cancellation_timeout`).
///
/// **Expected flow**: the stop flag is set at once with the reason. With a `backoff`, the daemon has
/// that long to exit on its own (`DAEMON_SIGNALLED`); then, with a `timeout`, its task is cancelled
/// (`DAEMON_CANCELLED`: dropped at its next `.await`) and it has that long to end; then it is
/// abandoned (`DAEMON_ABANDONED`) with a warning, and the object's finalizer is released. With no
/// `timeout` it is never cancelled (even with a `backoff`): it is waited for however long it takes,
/// and the finalizer is kept meanwhile, as in Kopf.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cancellation {
    /// How long a stopping daemon may take to exit on its own before it is cancelled.
    pub backoff: Option<Duration>,
    /// How long a cancelled daemon may take to end before it is abandoned.
    pub timeout: Option<Duration>,
}

/// A daemon's options (besides the [`crate::handlers::On`] ones: id, errors, retries, backoff,
/// filters).
///
/// ```
/// # use kactor_reactor::daemons::Daemon;
/// # use std::time::Duration;
/// let daemon = Daemon::new()
///     .initial_delay(Duration::from_secs(5))
///     .cancellation_backoff(Duration::from_secs(10))
///     .cancellation_timeout(Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Daemon {
    /// A delay before the daemon starts (interrupted by a stop).
    pub initial_delay: Option<InitialDelay>,
    /// How it is stopped.
    pub cancellation: Cancellation,
}

impl Daemon {
    /// A daemon that starts at once and is waited for however long it takes to stop.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts after this delay.
    pub fn initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = Some(InitialDelay::Fixed(delay));
        self
    }

    /// Starts after a delay computed from the object.
    pub fn initial_delay_with(
        mut self,
        f: impl Fn(&Ctx) -> Duration + Send + Sync + 'static,
    ) -> Self {
        self.initial_delay = Some(InitialDelay::Computed(Arc::new(f)));
        self
    }

    /// When asked to stop, it has this long to exit on its own before its task is cancelled.
    pub fn cancellation_backoff(mut self, backoff: Duration) -> Self {
        self.cancellation.backoff = Some(backoff);
        self
    }

    /// Once cancelled, it has this long to end before it is abandoned (and the finalizer released).
    pub fn cancellation_timeout(mut self, timeout: Duration) -> Self {
        self.cancellation.timeout = Some(timeout);
        self
    }
}

/// A timer's options (besides the [`crate::handlers::On`] ones).
///
/// ```
/// # use kactor_reactor::daemons::Timer;
/// # use std::time::Duration;
/// // Every 10 s on a fixed grid, but only once the object has not changed for 30 s.
/// let timer = Timer::every(Duration::from_secs(10)).sharp().idle(Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Timer {
    /// The time between the end of one call and the start of the next (or, `sharp`, between starts).
    pub interval: Option<Duration>,
    /// Keep the grid: sleep `interval - (elapsed % interval)` after a call.
    pub sharp: bool,
    /// Call only after this long without essential changes of the object.
    pub idle: Option<Duration>,
    /// A delay before the first call.
    pub initial_delay: Option<InitialDelay>,
    /// How it is stopped (Kopf has none for timers: the call under way is waited for).
    pub cancellation: Cancellation,
}

impl Timer {
    /// A timer with no interval and no idle period: it runs once (Kopf's one-shot timer).
    pub fn new() -> Self {
        Self::default()
    }

    /// A timer that runs every `interval`.
    pub fn every(interval: Duration) -> Self {
        Timer {
            interval: Some(interval),
            ..Timer::default()
        }
    }

    /// Keeps the grid: the interval is from the start of one call to the start of the next (a call
    /// longer than the interval skips grid points).
    pub fn sharp(mut self) -> Self {
        self.sharp = true;
        self
    }

    /// Runs only once the object has not changed essentially for this long (with no interval: once
    /// per quiet period).
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// Starts after this delay.
    pub fn initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = Some(InitialDelay::Fixed(delay));
        self
    }

    /// Starts after a delay computed from the object.
    pub fn initial_delay_with(
        mut self,
        f: impl Fn(&Ctx) -> Duration + Send + Sync + 'static,
    ) -> Self {
        self.initial_delay = Some(InitialDelay::Computed(Arc::new(f)));
        self
    }

    /// When asked to stop during a call, the call has this long before it is cancelled.
    pub fn cancellation_backoff(mut self, backoff: Duration) -> Self {
        self.cancellation.backoff = Some(backoff);
        self
    }

    /// Once cancelled, the call has this long to end before it is abandoned.
    pub fn cancellation_timeout(mut self, timeout: Duration) -> Self {
        self.cancellation.timeout = Some(timeout);
        self
    }
}

/// Daemon or timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpawningKind {
    /// A daemon.
    Daemon,
    /// A timer.
    Timer,
}

impl SpawningKind {
    /// `daemon` or `timer`.
    pub fn as_str(self) -> &'static str {
        match self {
            SpawningKind::Daemon => "daemon",
            SpawningKind::Timer => "timer",
        }
    }
}

/// What a spawning handler runs as.
#[derive(Debug, Clone)]
pub enum Spawning {
    /// A daemon.
    Daemon(Daemon),
    /// A timer.
    Timer(Timer),
}

/// A registered daemon or timer.
#[derive(Clone)]
pub struct SpawningHandler {
    /// The id: the key of its result in `status`.
    pub id: String,
    /// Which resource it serves.
    pub selector: Selector,
    /// Daemon or timer, with their options.
    pub spawning: Spawning,
    /// Errors, retries, timeout, backoff, param.
    pub options: Options,
    /// Which objects it runs for (re-checked on every event).
    pub filters: Filters,
    /// The function.
    pub func: HandlerFn,
}

impl SpawningHandler {
    /// Daemon or timer.
    pub fn kind(&self) -> SpawningKind {
        match self.spawning {
            Spawning::Daemon(_) => SpawningKind::Daemon,
            Spawning::Timer(_) => SpawningKind::Timer,
        }
    }

    /// How it is stopped.
    pub fn cancellation(&self) -> Cancellation {
        match &self.spawning {
            Spawning::Daemon(daemon) => daemon.cancellation,
            Spawning::Timer(timer) => timer.cancellation,
        }
    }

    /// Its initial delay.
    pub fn initial_delay(&self) -> Option<&InitialDelay> {
        match &self.spawning {
            Spawning::Daemon(daemon) => daemon.initial_delay.as_ref(),
            Spawning::Timer(timer) => timer.initial_delay.as_ref(),
        }
    }
}

impl fmt::Display for SpawningHandler {
    /// Kopf's wording: `Daemon 'monitor'`, `Timer 'ping'`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            SpawningKind::Daemon => write!(f, "Daemon '{}'", self.id),
            SpawningKind::Timer => write!(f, "Timer '{}'", self.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_combine_and_print_as_kopf_flags() {
        let reasons =
            StopReasons::from(StopReason::ResourceDeleted).with(StopReason::DaemonSignalled);
        assert!(reasons.contains(StopReason::ResourceDeleted));
        assert!(!reasons.contains(StopReason::OperatorExiting));
        assert_eq!(reasons.to_string(), "RESOURCE_DELETED|DAEMON_SIGNALLED");
        assert_eq!(StopReasons::default().to_string(), "-");
        assert!(reasons
            .without(StopReason::ResourceDeleted)
            .without(StopReason::DaemonSignalled)
            .is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn stopped_wakes_its_waiters_with_the_reason() {
        let stopper = Stopper::new();
        let stopped = stopper.stopped();
        assert!(!stopped.is_stopped());
        assert!(
            !stopped.wait_timeout(Duration::from_secs(5)).await,
            "not stopped: times out"
        );
        let waiter = tokio::spawn({
            let stopped = stopped.clone();
            async move { stopped.wait().await }
        });
        assert!(stopper.stop(StopReason::OperatorPausing));
        assert!(!stopper.stop(StopReason::OperatorPausing), "already set");
        assert_eq!(
            waiter.await.unwrap(),
            StopReasons::from(StopReason::OperatorPausing)
        );
        assert!(stopped.wait_timeout(Duration::from_secs(3600)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_never_signal_never_fires() {
        let stopped = Stopped::never();
        assert!(!stopped.wait_timeout(Duration::from_secs(3600)).await);
        assert!(!stopped.is_stopped());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_stopper_counts_as_a_stop() {
        let stopper = Stopper::new();
        let stopped = stopper.stopped();
        drop(stopper);
        assert_eq!(stopped.wait().await, StopReasons::from(StopReason::Done));
    }
}
