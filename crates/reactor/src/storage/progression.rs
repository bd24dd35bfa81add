//! Progression: the state of an object's changing handlers across processing cycles, kept in the
//! object's progress annotations between cycles (`reference/kopf.md` §1.5, §2.2; Kopf's
//! `progression.py`).
//!
//! **Expected flow**: a cycle reads the records of the resource's handlers from the body
//! ([`State::from_storage`]), gives the cause's purpose to the cause's handlers (superseding a half-done
//! cause of another purpose), runs the awakened ones per the lifecycle, merges their outcomes
//! ([`State::with_outcomes`]), stores the records that changed ([`State::store`]), and, once every
//! handler of the cause is finished, purges them all ([`State::purge`]).
//!
//! **Guarantees**: a record is written only when it differs from what was read, so a cycle that ran
//! nothing writes nothing; purging nulls only the keys of this operator's handlers (and their
//! sub-handlers), never another operator's.

use std::time::Duration;

use jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::storage::progress::{ProgressRecord, ProgressStorage};

/// What one attempt of a handler came to.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// No more attempts for this cause: succeeded or failed for good.
    pub final_: bool,
    /// The error, when it failed (for now or for good).
    pub error: Option<String>,
    /// When to try again (for a temporary failure).
    pub delay: Option<Duration>,
    /// What the handler returned (null: nothing to store).
    pub result: Option<Value>,
    /// Its sub-handlers' ids, any depth (added to its record's).
    pub subrefs: Vec<String>,
}

/// One handler's state.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerState {
    /// Used for this cycle's `done` and `delays` (the cause's handlers), or only carried for counting
    /// and purging (records of other causes).
    pub active: bool,
    /// When the first attempt started.
    pub started: Timestamp,
    /// When it finished (succeeded or failed for good).
    pub stopped: Option<Timestamp>,
    /// Not before this moment (a retry delay).
    pub delayed: Option<Timestamp>,
    /// The reason it runs for (`create`, `update`, ...).
    pub purpose: Option<String>,
    /// Attempts so far.
    pub retries: u32,
    /// Succeeded.
    pub success: bool,
    /// Failed for good.
    pub failure: bool,
    /// The last error.
    pub message: Option<String>,
    /// Sub-handler ids, any depth.
    pub subrefs: Vec<String>,
    /// The record as read, to write only what changed.
    origin: Option<ProgressRecord>,
}

impl HandlerState {
    /// A handler never attempted.
    pub fn from_scratch(now: Timestamp, purpose: Option<&str>) -> Self {
        HandlerState {
            active: true,
            started: now,
            stopped: None,
            delayed: None,
            purpose: purpose.map(str::to_string),
            retries: 0,
            success: false,
            failure: false,
            message: None,
            subrefs: Vec::new(),
            origin: None,
        }
    }

    /// A stored record (inactive until the cause claims it).
    pub fn from_record(record: ProgressRecord, now: Timestamp) -> Self {
        HandlerState {
            active: false,
            started: record.started.unwrap_or(now),
            stopped: record.stopped,
            delayed: record.delayed,
            purpose: record.purpose.clone().filter(|p| !p.is_empty()),
            retries: record.retries.unwrap_or(0),
            success: record.success.unwrap_or(false),
            failure: record.failure.unwrap_or(false),
            message: record.message.clone(),
            subrefs: record.subrefs.clone().unwrap_or_default(),
            origin: Some(record),
        }
    }

    /// Succeeded or failed for good.
    pub fn finished(&self) -> bool {
        self.success || self.failure
    }

    /// Waiting for a retry delay.
    pub fn sleeping(&self, now: Timestamp) -> bool {
        !self.finished() && self.delayed.is_some_and(|d| d > now)
    }

    /// Due to run.
    pub fn awakened(&self, now: Timestamp) -> bool {
        !self.finished() && !self.sleeping(now)
    }

    /// Time since the first attempt.
    pub fn runtime(&self, now: Timestamp) -> Duration {
        now.duration_since(self.started)
            .try_into()
            .unwrap_or(Duration::ZERO)
    }

    /// The record as stored (Kopf's `for_storage`).
    pub fn to_record(&self) -> ProgressRecord {
        let mut subrefs = self.subrefs.clone();
        subrefs.sort();
        ProgressRecord {
            started: Some(self.started),
            stopped: self.stopped,
            delayed: self.delayed,
            purpose: self.purpose.clone(),
            retries: Some(self.retries),
            success: Some(self.success),
            failure: Some(self.failure),
            message: self.message.clone(),
            subrefs: (!subrefs.is_empty()).then_some(subrefs),
        }
    }

    fn with_outcome(&self, outcome: &Outcome, now: Timestamp) -> Self {
        HandlerState {
            active: self.active,
            started: self.started,
            stopped: self.stopped.or(outcome.final_.then_some(now)),
            delayed: outcome.delay.map(|d| add(now, d)),
            purpose: self.purpose.clone(),
            retries: self.retries + 1,
            success: outcome.final_ && outcome.error.is_none(),
            failure: outcome.final_ && outcome.error.is_some(),
            message: outcome.error.clone(),
            subrefs: union(&self.subrefs, &outcome.subrefs),
            origin: self.origin.clone(),
        }
    }
}

/// Sorted, without duplicates (Kopf's `sorted(set(a) | set(b))`).
fn union(known: &[String], added: &[String]) -> Vec<String> {
    let mut all: Vec<String> = known.iter().chain(added).cloned().collect();
    all.sort();
    all.dedup();
    all
}

fn add(now: Timestamp, delay: Duration) -> Timestamp {
    jiff::SignedDuration::try_from(delay)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Counts of handlers by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Succeeded.
    pub success: usize,
    /// Failed for good.
    pub failure: usize,
    /// Not finished.
    pub running: usize,
}

/// The states of an object's handlers, in a stable order (the resource's handlers first, in
/// registration order, then records of handlers no longer registered).
#[derive(Debug, Clone, Default)]
pub struct State {
    states: Vec<(String, HandlerState)>,
    purpose: Option<String>,
}

impl State {
    /// The records of these handlers stored on the body (missing or garbage records are absent).
    pub fn from_storage<'a>(
        body: &DynamicObject,
        storage: &ProgressStorage,
        handler_ids: impl IntoIterator<Item = &'a str>,
        now: Timestamp,
    ) -> Self {
        let mut states: Vec<(String, HandlerState)> = Vec::new();
        for id in handler_ids {
            if states.iter().any(|(known, _)| known == id) {
                continue;
            }
            if let Some(record) = storage.fetch(body, id) {
                states.push((id.to_string(), HandlerState::from_record(record, now)));
            }
        }
        State {
            states,
            purpose: None,
        }
    }

    /// The state of one handler.
    pub fn get(&self, id: &str) -> Option<&HandlerState> {
        self.states.iter().find(|(k, _)| k == id).map(|(_, s)| s)
    }

    fn get_mut(&mut self, id: &str) -> Option<&mut HandlerState> {
        self.states
            .iter_mut()
            .find(|(k, _)| k == id)
            .map(|(_, s)| s)
    }

    /// Every handler's id and state.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &HandlerState)> {
        self.states.iter().map(|(k, s)| (k.as_str(), s))
    }

    /// The purpose of this cycle; the given handlers (already known) are re-purposed to it.
    pub fn with_purpose<'a>(
        mut self,
        purpose: &str,
        handler_ids: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        for id in handler_ids {
            if let Some(state) = self.get_mut(id) {
                state.purpose = Some(purpose.to_string());
            }
        }
        self.purpose = Some(purpose.to_string());
        self
    }

    /// The cause's handlers become active; unknown ones start from scratch.
    pub fn with_handlers<'a>(
        mut self,
        handler_ids: impl IntoIterator<Item = &'a str>,
        now: Timestamp,
    ) -> Self {
        for id in handler_ids {
            match self.get_mut(id) {
                Some(state) => state.active = true,
                None => {
                    let state = HandlerState::from_scratch(now, self.purpose.as_deref());
                    self.states.push((id.to_string(), state));
                }
            }
        }
        self
    }

    /// The outcomes of this cycle's attempts merged in.
    pub fn with_outcomes<'a>(
        mut self,
        outcomes: impl IntoIterator<Item = (&'a str, &'a Outcome)>,
        now: Timestamp,
    ) -> Self {
        for (id, outcome) in outcomes {
            if let Some(state) = self.get_mut(id) {
                *state = state.with_outcome(outcome, now);
            }
        }
        self
    }

    /// Records of other purposes, counted per purpose: a half-done cause being superseded.
    pub fn extras(&self) -> Vec<(String, Counts)> {
        let mut extras: Vec<(String, Counts)> = Vec::new();
        for (_, state) in &self.states {
            let Some(purpose) = &state.purpose else {
                continue;
            };
            if Some(purpose) == self.purpose.as_ref() {
                continue;
            }
            let index = match extras.iter().position(|(p, _)| p == purpose) {
                Some(index) => index,
                None => {
                    extras.push((purpose.clone(), Counts::default()));
                    extras.len() - 1
                }
            };
            count(&mut extras[index].1, state);
        }
        extras
    }

    /// Counts of the handlers of this cycle's purpose (and of records with no purpose).
    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for (_, state) in &self.states {
            let purposeful =
                self.purpose.is_none() || state.purpose.is_none() || state.purpose == self.purpose;
            if purposeful {
                count(&mut counts, state);
            }
        }
        counts
    }

    /// Every active handler finished.
    pub fn done(&self) -> bool {
        self.states.iter().all(|(_, s)| !s.active || s.finished())
    }

    /// How long until each unfinished active handler is due (zero: due now).
    pub fn delays(&self, now: Timestamp) -> Vec<Duration> {
        self.states
            .iter()
            .filter(|(_, s)| s.active && !s.finished())
            .map(|(_, s)| match s.delayed {
                Some(delayed) if delayed > now => delayed
                    .duration_since(now)
                    .try_into()
                    .unwrap_or(Duration::ZERO),
                _ => Duration::ZERO,
            })
            .collect()
    }

    /// Adds to the merge patch the records that differ from what was read.
    pub fn store(&self, storage: &ProgressStorage, patch: &mut Value) {
        for (id, state) in &self.states {
            let record = state.to_record();
            if state.origin.as_ref() != Some(&record) {
                storage.store(id, &record, patch);
            }
        }
    }

    /// [`store`](Self::store) for a state that is purged in the same cycle: no record is encoded
    /// (the purge would take it out of the patch, or write `null` over it), only what a store
    /// leaves behind a purge (see [`ProgressStorage::mark`]).
    pub fn store_purged(&self, storage: &ProgressStorage, patch: &mut Value) {
        if self
            .states
            .iter()
            .any(|(_, state)| state.origin.as_ref() != Some(&state.to_record()))
        {
            storage.mark(patch);
        }
    }

    /// Adds to the merge patch the removal of every record of these handlers, of the records this
    /// state knows, and of their sub-handlers.
    pub fn purge<'a>(
        &self,
        body: &DynamicObject,
        storage: &ProgressStorage,
        handler_ids: impl IntoIterator<Item = &'a str>,
        patch: &mut Value,
    ) {
        let mut purged: Vec<&str> = Vec::new();
        for id in handler_ids {
            if !purged.contains(&id) {
                storage.purge(body, id, patch);
                purged.push(id);
            }
        }
        for (id, state) in &self.states {
            if !purged.contains(&id.as_str()) {
                storage.purge(body, id, patch);
                purged.push(id);
            }
            for subref in &state.subrefs {
                storage.purge(body, subref, patch);
            }
        }
    }
}

fn count(counts: &mut Counts, state: &HandlerState) {
    if state.success {
        counts.success += 1;
    }
    if state.failure {
        counts.failure += 1;
    }
    if !state.finished() {
        counts.running += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-03-01T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_temporary_failure_delays_and_counts_an_attempt() {
        let state = State::default()
            .with_purpose("create", [])
            .with_handlers(["a", "b"], now());
        let failed = Outcome {
            final_: false,
            error: Some("not yet".into()),
            delay: Some(Duration::from_secs(30)),
            ..Outcome::default()
        };
        let state = state.with_outcomes([("a", &failed)], now());
        let a = state.get("a").unwrap();
        assert_eq!(a.retries, 1);
        assert!(a.sleeping(now()));
        assert!(!state.done());
        assert_eq!(
            state.delays(now()),
            vec![Duration::from_secs(30), Duration::ZERO]
        );
        let record = a.to_record();
        assert_eq!(record.purpose.as_deref(), Some("create"));
        assert_eq!(record.message.as_deref(), Some("not yet"));
    }

    #[test]
    fn success_and_permanent_failure_both_finish() {
        let state = State::default()
            .with_purpose("update", [])
            .with_handlers(["a", "b"], now());
        let ok = Outcome {
            final_: true,
            ..Outcome::default()
        };
        let failed = Outcome {
            final_: true,
            error: Some("no".into()),
            ..Outcome::default()
        };
        let state = state.with_outcomes([("a", &ok), ("b", &failed)], now());
        assert!(state.done());
        assert_eq!(
            state.counts(),
            Counts {
                success: 1,
                failure: 1,
                running: 0
            }
        );
        assert!(state.get("a").unwrap().stopped.is_some());
    }

    #[test]
    fn records_of_another_purpose_are_extras() {
        let mut state = State::default();
        let mut old = HandlerState::from_scratch(now(), Some("create"));
        old.active = false;
        old.success = true;
        state.states.push(("c".into(), old));
        let state = state
            .with_purpose("update", ["u"])
            .with_handlers(["u"], now());
        let extras = state.extras();
        assert_eq!(extras.len(), 1);
        assert_eq!(extras[0].0, "create");
        assert_eq!(extras[0].1.success, 1);
        // The inactive record does not hold the new cause back.
        assert!(!state.done());
        let ok = Outcome {
            final_: true,
            ..Outcome::default()
        };
        assert!(state.with_outcomes([("u", &ok)], now()).done());
    }

    #[test]
    fn a_purged_state_patches_as_a_store_then_a_purge_would() {
        use crate::structs::keys::KeyForming;
        let ok = Outcome {
            final_: true,
            ..Outcome::default()
        };
        let earlier = serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1", "annotations": {
                "kopf.zalando.org/a": "{\"started\":\"2026-03-01T09:00:00.000000+00:00\",\"retries\":1}",
                "my-op.example.com/a": "{\"started\":\"2026-03-01T09:00:00.000000+00:00\",\"retries\":1}",
            }},
            "status": {"kopf": {"progress": {"b": {"retries": 1}}}},
        });
        let fresh = serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"},
        });
        for prefix in ["kopf.zalando.org", "my-op.example.com"] {
            let storage = ProgressStorage {
                keys: KeyForming::new(prefix).unwrap(),
                ..ProgressStorage::default()
            };
            for body in [&earlier, &fresh] {
                let body: DynamicObject = serde_json::from_value(body.clone()).unwrap();
                let state = State::from_storage(&body, &storage, ["a", "b"], now())
                    .with_purpose("create", [])
                    .with_handlers(["a", "b"], now())
                    .with_outcomes([("a", &ok), ("b", &ok)], now());
                assert!(state.done());
                let mut stored = serde_json::json!({"spec": {"x": 1}});
                state.store(&storage, &mut stored);
                state.purge(&body, &storage, ["a", "b"], &mut stored);
                let mut marked = serde_json::json!({"spec": {"x": 1}});
                state.store_purged(&storage, &mut marked);
                state.purge(&body, &storage, ["a", "b"], &mut marked);
                assert_eq!(marked, stored, "{prefix}, {:?}", body.metadata.annotations);
            }
        }
    }
}
