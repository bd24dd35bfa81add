//! The names every layer shares: what happened to an object ([`EventType`]), how a handler's
//! attempt ended ([`Verdict`]), why a watch stream was reopened ([`RestartReason`]), daemon or timer
//! ([`SpawningKind`]). A leaf: it depends on nothing of the crate, so that the watch stream, the
//! metrics hooks and the handlers can all speak of them without depending on one another.

/// What happened to an object, as a watch stream tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Seen in a listing (Kopf's event type `None`).
    Listed,
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl EventType {
    /// The wire name, or None for a listing (as Kopf's `event['type']`).
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            EventType::Listed => None,
            EventType::Added => Some("ADDED"),
            EventType::Modified => Some("MODIFIED"),
            EventType::Deleted => Some("DELETED"),
        }
    }
}

/// Why a watch stream was reopened (for metrics: `kactor_watch_restarts_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RestartReason {
    /// The stream ended (server timeout, disconnect); resumed from the last resourceVersion.
    Reconnect,
    /// The server answered 410 Gone; listed again.
    Relist410,
    /// Nothing came for the inactivity timeout; resumed from the last resourceVersion.
    Inactivity,
    /// A request failed; retried after a backoff.
    Error,
}

impl RestartReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::Reconnect => "reconnect",
            RestartReason::Relist410 => "relist_410",
            RestartReason::Inactivity => "inactivity",
            RestartReason::Error => "error",
        }
    }

    /// Every reason, in a fixed order.
    pub const ALL: [RestartReason; 4] = [
        RestartReason::Reconnect,
        RestartReason::Relist410,
        RestartReason::Inactivity,
        RestartReason::Error,
    ];
}

/// How an attempt ended, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It succeeded.
    Success,
    /// It failed and will be retried.
    Temporary,
    /// It failed for good.
    Permanent,
    /// It failed and the failure is ignored.
    Ignored,
    /// It ran out of time or attempts.
    Timeout,
    /// It ran, but its sub-handlers are not all finished: it runs again when the earliest is due.
    Unfinished,
}

impl Verdict {
    /// Every verdict, in a fixed order.
    pub const ALL: [Verdict; 6] = [
        Verdict::Success,
        Verdict::Temporary,
        Verdict::Permanent,
        Verdict::Ignored,
        Verdict::Timeout,
        Verdict::Unfinished,
    ];

    /// The metric label: `success`, `temporary`, `permanent`, `ignored`, `timeout`, `unfinished`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Success => "success",
            Verdict::Temporary => "temporary",
            Verdict::Permanent => "permanent",
            Verdict::Ignored => "ignored",
            Verdict::Timeout => "timeout",
            Verdict::Unfinished => "unfinished",
        }
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

/// What became of a message to an object actor, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageOutcome {
    /// The actor handled it.
    Handled,
    /// The actor's method panicked while handling it.
    Panicked,
    /// No actor of that object runs here (the object does not exist, is not served, or is gone).
    NotFound,
    /// The actor's mailbox was full (`try_tell`).
    Full,
    /// No reply came within the ask's timeout.
    Timeout,
}

impl MessageOutcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [MessageOutcome; 5] = [
        MessageOutcome::Handled,
        MessageOutcome::Panicked,
        MessageOutcome::NotFound,
        MessageOutcome::Full,
        MessageOutcome::Timeout,
    ];

    /// The metric label: `handled`, `panicked`, `not_found`, `full`, `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageOutcome::Handled => "handled",
            MessageOutcome::Panicked => "panicked",
            MessageOutcome::NotFound => "not_found",
            MessageOutcome::Full => "full",
            MessageOutcome::Timeout => "timeout",
        }
    }
}
