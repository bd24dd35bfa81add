//! How daemons and timers are told to stop ([`Stopper`], [`Stopped`], [`StopReason`]) and the live
//! body they read ([`Live`]): the runtime side of [`crate::intents::daemons`], apart from their options, so
//! that a handler's context can carry them without depending on how daemons are registered.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kube::api::DynamicObject;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::structs::names::EventType;

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
    /// The object is handed over to another replica of a sharded operator (kactor's addition),
    /// where its daemons and timers start again.
    OperatorDraining,
}

impl StopReason {
    const ALL: [StopReason; 9] = [
        StopReason::Done,
        StopReason::FiltersMismatch,
        StopReason::ResourceDeleted,
        StopReason::OperatorPausing,
        StopReason::OperatorExiting,
        StopReason::DaemonSignalled,
        StopReason::DaemonCancelled,
        StopReason::DaemonAbandoned,
        StopReason::OperatorDraining,
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
            StopReason::OperatorDraining => "OPERATOR_DRAINING",
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
