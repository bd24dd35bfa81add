//! One neighbourhood: one peering object (a `ClusterKopfPeering`, or a `KopfPeering` in one
//! namespace), its keep-alive ([`Neighbourhood::keepalive`]) and its observer
//! ([`Neighbourhood::observe`]), which turns every look at the object into the neighbourhood's toggle
//! of the pause switch.
//!
//! Only the keep-alive writes this operator's own record, so that the removal at the end is the last
//! write; the observer asks it for an early touch through [`Neighbourhood::kick`].

use std::time::Duration;

use jiff::Timestamp;
use kactor_reactor::pausing::PauseSwitch;
use kactor_reactor::settings::{Networking, Watching};
use kactor_reactor::watching::{EventType, WatchError, WatchItem, Watcher};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use super::decision::{decide, list, ring_conflict, State};
use super::identity::random_below;
use super::records::{self, Record};
use super::resources::PeeringResource;
use super::{PeeringMode, PeeringSettings, Stop};

/// The longest a write of the own record (a keep-alive, the removal) or a clean-up may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long after a failed creation of the missing peering object it is tried again.
const CREATE_RETRY: Duration = Duration::from_secs(5);

/// How an observer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It was told to stop.
    Stopped,
    /// The peering resource is not served any more (its CRD is gone), or cannot be watched.
    Lost,
}

/// One peering object, as this operator peers through it.
pub(crate) struct Neighbourhood {
    api: Api<DynamicObject>,
    /// The same, for the watch: objects decoded without their managedFields.
    watch_api: Api<kactor_reactor::slim::Slim>,
    resource: PeeringResource,
    namespace: Option<String>,
    name: String,
    identity: String,
    priority: i64,
    /// Whole seconds, at least 1.
    lifetime: i64,
    stealth: bool,
    mode: PeeringMode,
    /// Create the object when it is missing (mandatory mode only).
    create_missing: bool,
    /// The toggle's key in the pause switch.
    key: String,
    /// Asks the keep-alive for a touch now.
    kick: Notify,
}

/// What the observer keeps between two looks.
struct Observation {
    state: State,
    /// Whether the missing object was already warned about (auto-detection warns once).
    warned_missing: bool,
}

impl Neighbourhood {
    pub(crate) fn new(
        client: &kube::Client,
        resource: PeeringResource,
        namespace: Option<String>,
        settings: &PeeringSettings,
        identity: &str,
    ) -> Self {
        let namespace = namespace.filter(|_| resource.namespaced);
        let key = match &namespace {
            Some(namespace) => format!("peering {}@{namespace} ({resource})", settings.name),
            None => format!("peering {} ({resource})", settings.name),
        };
        Neighbourhood {
            api: resource.api(client, namespace.as_deref()),
            watch_api: resource.api(client, namespace.as_deref()),
            resource,
            namespace,
            name: settings.name.clone(),
            identity: identity.to_string(),
            priority: settings.priority,
            lifetime: i64::try_from(settings.lifetime.as_secs())
                .unwrap_or(i64::MAX)
                .max(1),
            stealth: settings.stealth,
            mode: settings.mode,
            create_missing: settings.create_missing && settings.mode == PeeringMode::Mandatory,
            key,
            kick: Notify::new(),
        }
    }

    /// The toggle's key in the pause switch.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    fn place(&self) -> String {
        records::place(self.namespace.as_deref())
    }

    /// Sets the toggle as it is before the first look: on in mandatory mode (as Kopf's
    /// pre-activated toggles), off otherwise.
    pub(crate) fn preactivate(&self, switch: &PauseSwitch) {
        let reason = State::Unknown.pause_reason(self.mode, &self.name, &self.place());
        switch.set(&self.key, reason);
    }

    /// Writes the own record now and every `min(lifetime, max(1, lifetime - rand(5..=10)))` seconds
    /// (or at once when kicked) until stopped; then removes it.
    pub(crate) async fn keepalive(&self, mut stop: Stop) {
        while !stop.is_set() {
            let record = Record::now(self.priority, Duration::from_secs(self.lifetime as u64));
            self.touch(record.as_patch_value()).await;
            tokio::select! {
                () = stop.wait() => break,
                () = tokio::time::sleep(keepalive_interval(self.lifetime, random_below(6) as i64 + 5)) => {}
                () = self.kick.notified() => {}
            }
        }
        self.touch(Value::Null).await;
    }

    /// Merge-patches `status.<identity>` with this record (null removes it), and logs as Kopf does.
    async fn touch(&self, record: Value) {
        let leaving = record.is_null();
        let patch = json!({"status": {self.identity.as_str(): record}});
        let result = tokio::time::timeout(WRITE_TIMEOUT, self.patch(&patch)).await;
        let (name, place) = (&self.name, self.place());
        match result {
            Ok(Ok(())) => {
                if !self.stealth {
                    tracing::debug!(peering = %name, "Keep-alive in '{name}' {place}: ok.");
                }
            }
            Ok(Err(error)) if records::is_not_found(&error) => {
                tracing::debug!(peering = %name, "Keep-alive in '{name}' {place}: not found.");
            }
            Ok(Err(error)) if leaving => {
                tracing::warn!(peering = %name, %error, "Couldn't remove self from the peering '{name}' {place}. Ignoring.");
            }
            Ok(Err(error)) => {
                tracing::warn!(peering = %name, %error, "Keep-alive in '{name}' {place} failed; retrying at the next keep-alive.");
            }
            Err(_) => {
                tracing::warn!(peering = %name, "Keep-alive in '{name}' {place} took over {WRITE_TIMEOUT:?}; given up.");
            }
        }
    }

    async fn patch(&self, patch: &Value) -> Result<(), kube::Error> {
        let params = PatchParams::default();
        let patch = Patch::Merge(patch);
        if self.resource.has_status {
            self.api.patch_status(&self.name, &params, &patch).await?;
        } else {
            self.api.patch(&self.name, &params, &patch).await?;
        }
        Ok(())
    }

    /// Watches the peering object and sets this neighbourhood's toggle after every look at it, until
    /// stopped or until the peering resource is not served any more.
    pub(crate) async fn observe(&self, switch: &PauseSwitch, mut stop: Stop) -> Outcome {
        let label = format!("{} {}", self.resource, self.place());
        let mut watcher = Watcher::new(
            self.watch_api.clone(),
            label,
            Watching::default(),
            Networking::default(),
        );
        let mut observation = Observation {
            state: State::Unknown,
            warned_missing: false,
        };
        // The newest body of the peering object, once listed; what a listing in progress found.
        let mut object: Option<DynamicObject> = None;
        let mut listing: Option<DynamicObject> = None;
        let mut listed = false;
        let mut wake_at: Option<Timestamp> = None;
        loop {
            let nap = wake_at.map_or(Duration::ZERO, until);
            tokio::select! {
                () = stop.wait() => return Outcome::Stopped,
                () = tokio::time::sleep(nap), if wake_at.is_some() => {
                    // The earliest blocking peer expires now. As in Kopf, touch the own record, so
                    // that the object comes back afresh through the watch and is judged again. A
                    // missing object whose creation failed is looked at (and created) again.
                    wake_at = None;
                    if object.is_none() {
                        wake_at = self.look(switch, &mut observation, None).await;
                    } else {
                        self.kick.notify_one();
                    }
                }
                batch = watcher.next_batch() => {
                    let items = match batch {
                        Ok(items) => items,
                        Err(WatchError::NotServed { resource, .. }) => {
                            tracing::warn!(peering = %self.name, "{resource} is not served any more.");
                            return Outcome::Lost;
                        }
                        Err(error) => {
                            tracing::error!(peering = %self.name, %error, "The peering object cannot be watched.");
                            return Outcome::Lost;
                        }
                    };
                    let mut changed = false;
                    for item in items {
                        match item {
                            WatchItem::Listed(found) if self.is_ours(&found) => listing = Some(found),
                            WatchItem::Listed(_) => {}
                            WatchItem::ListDone => {
                                object = listing.take();
                                listed = true;
                                changed = true;
                            }
                            WatchItem::Event(EventType::Deleted, gone) if self.is_ours(&gone) => {
                                object = None;
                                changed = true;
                            }
                            WatchItem::Event(_, found) if self.is_ours(&found) => {
                                object = Some(found);
                                changed = true;
                            }
                            WatchItem::Event(..) => {}
                        }
                    }
                    if listed && changed {
                        wake_at = self.look(switch, &mut observation, object.as_ref()).await;
                    }
                }
            }
        }
    }

    fn is_ours(&self, object: &DynamicObject) -> bool {
        object.metadata.name.as_deref() == Some(self.name.as_str())
    }

    /// One look at the peering object (None: it does not exist): decide, clean up the dead, set the
    /// toggle. Returns when to look again, if peers block.
    async fn look(
        &self,
        switch: &PauseSwitch,
        observation: &mut Observation,
        object: Option<&DynamicObject>,
    ) -> Option<Timestamp> {
        let (state, wake_at) = match object {
            None if self.create_missing => (State::NoObject, self.create().await),
            None => (State::NoObject, None),
            Some(object) => {
                let status = object.data.get("status").and_then(Value::as_object);
                let decision = decide(status, &self.identity, self.priority, Timestamp::now());
                if !decision.dead.is_empty() {
                    self.clean(&decision.dead).await;
                }
                if !decision.own_record_alive
                    && matches!(observation.state, State::Unknown | State::NoObject)
                {
                    // The object appeared (or was first seen) without this operator's record: write
                    // it now rather than at the next keep-alive, so that peers see this one at once.
                    self.kick.notify_one();
                }
                (decision.state, decision.wake_at)
            }
        };
        self.log_transition(observation, &state);
        let reason = state
            .pause_reason(self.mode, &self.name, &self.place())
            .map(|reason| match &state {
                State::Conflicting(peers) => ring_conflict(&self.identity, peers).unwrap_or(reason),
                _ => reason,
            });
        switch.set(&self.key, reason);
        observation.state = state;
        wake_at
    }

    /// Creates the missing peering object (`--create-peering`); it then comes through the watch.
    /// Returns when to try again if it could not.
    async fn create(&self) -> Option<Timestamp> {
        let (name, place) = (&self.name, self.place());
        let object = super::resources::peering_object(name, self.namespace.as_deref());
        let object: DynamicObject =
            serde_json::from_value(object).expect("a peering object is a Kubernetes object");
        let result = tokio::time::timeout(
            WRITE_TIMEOUT,
            self.api.create(&PostParams::default(), &object),
        )
        .await;
        let error = match result {
            Ok(Ok(_)) => {
                tracing::info!(peering = %name, "Created the missing peering object '{name}' {place} (--create-peering).");
                return None;
            }
            // Someone else created it first: it comes through the watch all the same.
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => return None,
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {WRITE_TIMEOUT:?}"),
        };
        tracing::error!(peering = %name, %error, "Cannot create the missing peering object '{name}' {place}; trying again in {CREATE_RETRY:?}.");
        Some(Timestamp::now() + CREATE_RETRY)
    }

    /// Removes the records of dead peers (as Kopf's autoclean); a failure is left for the next look.
    async fn clean(&self, dead: &[String]) {
        let records: Map<String, Value> = dead
            .iter()
            .map(|identity| (identity.clone(), Value::Null))
            .collect();
        let patch = json!({"status": records});
        match tokio::time::timeout(WRITE_TIMEOUT, self.patch(&patch)).await {
            Ok(Ok(())) => {
                tracing::debug!(peering = %self.name, ?dead, "Removed the records of dead peers.")
            }
            Ok(Err(error)) => {
                tracing::debug!(peering = %self.name, ?dead, %error, "Cannot remove the records of dead peers; will try again.")
            }
            Err(_) => {
                tracing::debug!(peering = %self.name, ?dead, "Removing the records of dead peers took too long; will try again.")
            }
        }
    }

    /// Logs what changed, in Kopf's words where Kopf has them.
    fn log_transition(&self, observation: &mut Observation, new: &State) {
        let old = &observation.state;
        let (name, place) = (&self.name, self.place());
        let was_paused = old.pause_reason(self.mode, name, &place).is_some();
        match new {
            State::Outranked(peers) if !same_peers(old, new) => {
                let peers = list(peers);
                tracing::info!(peering = %name, "Pausing operations in favour of {peers}.");
            }
            State::Conflicting(peers) if !same_peers(old, new) => {
                let peers = list(peers);
                tracing::warn!(peering = %name, "Possibly conflicting operators with the same priority: {peers}.");
                tracing::warn!(peering = %name, "Pausing all operators, including self ({}).", self.identity);
            }
            State::NoObject if self.mode == PeeringMode::Mandatory => {
                let newly = !matches!(old, State::NoObject);
                if newly {
                    tracing::error!(peering = %name, "Pausing operations: peering object '{name}' is missing {place}; create it or run with --standalone.");
                }
            }
            State::NoObject => {
                if !observation.warned_missing {
                    tracing::warn!(peering = %name, "Peering object '{name}' not found {place}: running without peering, next to whatever other operators run. Create it to peer, or run with --standalone to silence this.");
                    observation.warned_missing = true;
                }
                if was_paused {
                    tracing::info!(peering = %name, "Resuming operations after the pause: the peering object is gone.");
                }
            }
            State::Free if was_paused => {
                tracing::info!(peering = %name, "Resuming operations after the pause. Conflicting operators with the same or higher priority are gone.");
            }
            _ => {}
        }
        if matches!(old, State::NoObject) && !matches!(new, State::NoObject) {
            tracing::info!(peering = %name, "Peering object '{name}' found {place}: peering.");
        }
    }
}

/// Whether both states block with the same peers (so that nothing new is to be logged).
fn same_peers(a: &State, b: &State) -> bool {
    let ids = |peers: &[records::Peer]| {
        peers
            .iter()
            .map(|p| (p.identity.clone(), p.priority))
            .collect::<Vec<_>>()
    };
    match (a, b) {
        (State::Outranked(a), State::Outranked(b))
        | (State::Conflicting(a), State::Conflicting(b)) => ids(a) == ids(b),
        _ => false,
    }
}

/// The time from now until `at` (zero if it has passed).
fn until(at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO)
}

/// The pause between two keep-alives, as Kopf: `min(lifetime, max(1, lifetime - jitter))` seconds
/// with `jitter` in 5..=10, and at least 1 s.
fn keepalive_interval(lifetime: i64, jitter: i64) -> Duration {
    let seconds = lifetime.min((lifetime - jitter).max(1)).max(1);
    Duration::from_secs(seconds.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalives_come_5_to_10_s_before_the_record_expires_and_at_least_every_second() {
        assert_eq!(keepalive_interval(60, 5), Duration::from_secs(55));
        assert_eq!(keepalive_interval(60, 10), Duration::from_secs(50));
        assert_eq!(keepalive_interval(8, 10), Duration::from_secs(1));
        assert_eq!(keepalive_interval(2, 7), Duration::from_secs(1));
        assert_eq!(keepalive_interval(1, 5), Duration::from_secs(1));
    }

    #[test]
    fn same_peers_compares_identities_and_priorities_not_deadlines() {
        let peer = |id: &str, deadline: &str| records::Peer {
            identity: id.to_string(),
            priority: 1,
            deadline: deadline.parse().unwrap(),
        };
        let a = State::Outranked(vec![peer("x", "2026-03-01T10:00:00Z")]);
        let b = State::Outranked(vec![peer("x", "2026-03-01T10:01:00Z")]);
        let c = State::Conflicting(vec![peer("x", "2026-03-01T10:01:00Z")]);
        assert!(same_peers(&a, &b));
        assert!(!same_peers(&a, &c));
        assert!(!same_peers(&State::Free, &State::Free));
    }
}
