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
//! (their metrics go through [`crate::clients::observe::Observer`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::intents::context::Ctx;
pub use crate::structs::names::SpawningKind;
pub use crate::structs::stopping::{Live, StopReason, StopReasons, Stopped, Stopper};

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

/// A daemon's options (besides the [`crate::intents::handlers::On`] ones: id, errors, retries, backoff,
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

/// A timer's options (besides the [`crate::intents::handlers::On`] ones).
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
