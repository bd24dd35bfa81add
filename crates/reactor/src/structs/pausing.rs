//! Whether the operator may work: Kopf's `operator_paused`, a set of toggles of which any one pauses.
//!
//! Peering (a live peer with a higher or equal priority, a missing mandatory peering) and leader
//! election (not holding the lease) each hold a named toggle; the operator watches the whole switch and
//! stops watching, daemons and timers while it is paused, and resumes (relisting everything) when it
//! is not. Probes, metrics, peering and leader election themselves are never paused.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

/// The reasons the operator is paused now, by toggle; empty when it may work. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PauseSwitch {
    reasons: Arc<watch::Sender<BTreeMap<String, String>>>,
}

impl Default for PauseSwitch {
    fn default() -> Self {
        PauseSwitch {
            reasons: Arc::new(watch::channel(BTreeMap::new()).0),
        }
    }
}

impl PauseSwitch {
    /// A switch with no toggle on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Turns the toggle `key` on (with why) or off (None). Subscribers are woken only on a change.
    pub fn set(&self, key: &str, reason: Option<String>) {
        self.reasons.send_if_modified(|reasons| match reason {
            Some(why) => reasons.insert(key.to_string(), why.clone()).as_ref() != Some(&why),
            None => reasons.remove(key).is_some(),
        });
    }

    /// Whether any toggle is on.
    pub fn is_paused(&self) -> bool {
        !self.reasons.borrow().is_empty()
    }

    /// The toggles that are on, with their reasons.
    pub fn reasons(&self) -> BTreeMap<String, String> {
        self.reasons.borrow().clone()
    }

    /// A receiver that sees every change of the reasons.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, String>> {
        self.reasons.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn any_toggle_pauses_and_only_changes_wake_subscribers() {
        let switch = PauseSwitch::new();
        let mut changes = switch.subscribe();
        assert!(!switch.is_paused());
        switch.set("peering", Some("a peer with priority 100".into()));
        switch.set("lease", Some("not the leader".into()));
        assert!(switch.is_paused());
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        switch.set("lease", Some("not the leader".into()));
        assert!(
            !changes.has_changed().unwrap(),
            "the same reason again is no change"
        );
        switch.set("peering", None);
        assert!(switch.is_paused(), "the lease still pauses");
        switch.set("lease", None);
        assert!(!switch.is_paused());
    }
}
