//! Fault injection: the failures a real cluster shows an operator, on demand.
//!
//! In-process through [`Faults`] (from `Emulator::faults()`), and over HTTP on the standalone server:
//!
//! | request | effect |
//! |---|---|
//! | `POST /_emulator/faults/end-watches` | ends every open watch stream (clients reconnect) |
//! | `POST /_emulator/faults/compact` | drops the kept history: older resourceVersions get 410 Gone |
//! | `POST /_emulator/faults/fail` `{"code": 503, "count": 2, "verb": "list", "resource": "widgets", "retryAfter": 1}` | the next matching requests fail |
//! | `POST /_emulator/faults/latency` `{"millis": 200, "verb": "patch"}` | matching requests wait first |
//! | `POST /_emulator/faults/silence` `{"resource": "widgets"}` | matching watch streams stay open but send nothing |
//! | `POST /_emulator/faults/reset` | clears failures, latency and silence |
//!
//! `verb` is the API verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`) and `resource` a plural (`widgets`) or `plural.group`; both default to any.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;

use crate::status::ApiError;
use crate::store::State;

/// Which requests a fault applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Matcher {
    /// The API verb, or any.
    #[serde(default)]
    pub verb: Option<String>,
    /// The resource (`widgets` or `widgets.example.com`), or any.
    #[serde(default)]
    pub resource: Option<String>,
}

impl Matcher {
    /// Matches every request.
    pub fn any() -> Self {
        Matcher::default()
    }

    /// Only this verb.
    pub fn verb(mut self, verb: &str) -> Self {
        self.verb = Some(verb.to_string());
        self
    }

    /// Only this resource (`widgets` or `widgets.example.com`).
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }

    pub(crate) fn matches(&self, verb: &str, group: &str, plural: &str) -> bool {
        self.verb.as_ref().is_none_or(|v| v == verb)
            && self.resource.as_ref().is_none_or(|r| {
                r == plural
                    || r.split_once('.')
                        .is_some_and(|(p, g)| p == plural && g == group)
            })
    }
}

/// Failures to inject: the next `count` matching requests get `code`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// Which requests.
    #[serde(flatten)]
    pub matcher: Matcher,
    /// The HTTP status (500, 503, 403, 409, 429, ...).
    pub code: u16,
    /// How many requests fail.
    #[serde(default = "one")]
    pub count: u32,
    /// Seconds for the `Retry-After` header.
    #[serde(default)]
    pub retry_after: Option<u32>,
    /// The Status message.
    #[serde(default)]
    pub message: Option<String>,
}

fn one() -> u32 {
    1
}

impl Failure {
    /// The next matching request fails with `code`.
    pub fn new(code: u16) -> Self {
        Failure {
            matcher: Matcher::any(),
            code,
            count: 1,
            retry_after: None,
            message: None,
        }
    }

    /// Only requests of this verb.
    pub fn verb(mut self, verb: &str) -> Self {
        self.matcher = self.matcher.verb(verb);
        self
    }

    /// Only requests for this resource.
    pub fn resource(mut self, resource: &str) -> Self {
        self.matcher = self.matcher.resource(resource);
        self
    }

    /// This many requests.
    pub fn times(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    /// With a `Retry-After` header.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

#[derive(Debug, Default)]
struct Rules {
    failures: Vec<Failure>,
    latency: Vec<(Matcher, Duration)>,
    silenced: Vec<Matcher>,
}

/// The fault controls of one emulator; cheap to clone.
#[derive(Clone)]
pub struct Faults {
    rules: Arc<Mutex<Rules>>,
    /// Bumped to end every open watch stream.
    pub(crate) end_watches: Arc<watch::Sender<u64>>,
    /// Bumped when silence starts or ends, so silent streams re-check.
    pub(crate) silence_changed: Arc<watch::Sender<u64>>,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl Faults {
    pub(crate) fn new(state: Arc<Mutex<State>>) -> Self {
        Faults {
            rules: Arc::default(),
            end_watches: Arc::new(watch::channel(0).0),
            silence_changed: Arc::new(watch::channel(0).0),
            state,
        }
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        // A panic while holding this lock cannot leave the rules half-written: every change is one push or clear.
        self.rules
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ends every open watch stream now; clients see the stream close and reconnect.
    pub fn end_watches(&self) {
        self.end_watches.send_modify(|n| *n += 1);
    }

    /// Drops the kept history: watches and continue tokens from older resourceVersions get 410 Gone.
    pub fn compact(&self) {
        // A panic inside a State method cannot leave it half-written (checks come before writes).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .compact();
    }

    /// Makes the next matching requests fail.
    pub fn fail(&self, failure: Failure) {
        if failure.count > 0 {
            self.rules().failures.push(failure);
        }
    }

    /// Delays every matching request.
    pub fn add_latency(&self, matcher: Matcher, delay: Duration) {
        self.rules().latency.push((matcher, delay));
    }

    /// Keeps matching watch streams, open and new, silent: no events, no bookmarks, until [`Faults::reset`].
    pub fn silence_watches(&self, matcher: Matcher) {
        self.rules().silenced.push(matcher);
        self.silence_changed.send_modify(|n| *n += 1);
    }

    /// Clears failures, latency and silence (silent streams then deliver what they held back).
    pub fn reset(&self) {
        let mut rules = self.rules();
        *rules = Rules::default();
        drop(rules);
        self.silence_changed.send_modify(|n| *n += 1);
    }

    /// The failure for this request, if one is due (and counts it).
    pub(crate) fn take_failure(&self, verb: &str, group: &str, plural: &str) -> Option<ApiError> {
        let mut rules = self.rules();
        let index = rules
            .failures
            .iter()
            .position(|f| f.matcher.matches(verb, group, plural))?;
        let failure = &mut rules.failures[index];
        failure.count -= 1;
        let error = ApiError::injected(failure.code, failure.retry_after, failure.message.clone());
        if failure.count == 0 {
            rules.failures.remove(index);
        }
        Some(error)
    }

    /// The delay for this request.
    pub(crate) fn latency(&self, verb: &str, group: &str, plural: &str) -> Duration {
        let rules = self.rules();
        rules
            .latency
            .iter()
            .filter(|(m, _)| m.matches(verb, group, plural))
            .map(|(_, d)| *d)
            .sum()
    }

    /// Whether a watch on this resource is to stay silent.
    pub(crate) fn is_silenced(&self, group: &str, plural: &str) -> bool {
        self.rules()
            .silenced
            .iter()
            .any(|m| m.matches("watch", group, plural))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_count_down_and_match_verb_and_resource() {
        let faults = Faults::new(Arc::new(Mutex::new(State::new(10))));
        faults.fail(
            Failure::new(503)
                .verb("list")
                .resource("widgets.example.com")
                .times(2)
                .retry_after(1),
        );
        assert!(faults
            .take_failure("get", "example.com", "widgets")
            .is_none());
        assert!(faults
            .take_failure("list", "other.com", "widgets")
            .is_none());
        assert_eq!(
            faults
                .take_failure("list", "example.com", "widgets")
                .unwrap()
                .code,
            503
        );
        assert_eq!(
            faults
                .take_failure("list", "example.com", "widgets")
                .unwrap()
                .retry_after,
            Some(1)
        );
        assert!(faults
            .take_failure("list", "example.com", "widgets")
            .is_none());
    }

    #[test]
    fn failure_requests_parse_from_the_admin_json() {
        let failure: Failure =
            serde_json::from_str(r#"{"code": 429, "verb": "patch", "retryAfter": 2}"#).unwrap();
        assert_eq!(failure.count, 1);
        assert_eq!(failure.matcher.verb.as_deref(), Some("patch"));
        assert_eq!(failure.retry_after, Some(2));
    }
}
