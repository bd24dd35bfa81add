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
    /// The object's name (requests for one object only), or any.
    #[serde(default)]
    pub name: Option<String>,
    /// The writer's `fieldManager` (one writer's requests only), or any.
    #[serde(default)]
    pub field_manager: Option<String>,
}

/// A request, as the faults see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) verb: &'a str,
    pub(crate) group: &'a str,
    pub(crate) plural: &'a str,
    pub(crate) name: Option<&'a str>,
    pub(crate) field_manager: Option<&'a str>,
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

    /// Only requests for the object of this name (a get, update, patch or delete of it).
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Only the writes of this field manager (`fieldManager`), as one writer's among several.
    pub fn field_manager(mut self, manager: &str) -> Self {
        self.field_manager = Some(manager.to_string());
        self
    }

    pub(crate) fn matches(&self, request: Request<'_>) -> bool {
        let Request {
            verb,
            group,
            plural,
            name,
            field_manager,
        } = request;
        self.verb.as_ref().is_none_or(|v| v == verb)
            && self.name.as_ref().is_none_or(|n| Some(n.as_str()) == name)
            && self
                .field_manager
                .as_ref()
                .is_none_or(|m| Some(m.as_str()) == field_manager)
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

    /// Only requests for the object of this name.
    pub fn name(mut self, name: &str) -> Self {
        self.matcher = self.matcher.name(name);
        self
    }

    /// Only the writes of this field manager.
    pub fn field_manager(mut self, manager: &str) -> Self {
        self.matcher = self.matcher.field_manager(manager);
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
    pub(crate) fn take_failure(&self, request: Request<'_>) -> Option<ApiError> {
        let mut rules = self.rules();
        let index = rules
            .failures
            .iter()
            .position(|f| f.matcher.matches(request))?;
        let failure = &mut rules.failures[index];
        failure.count -= 1;
        let error = ApiError::injected(failure.code, failure.retry_after, failure.message.clone());
        if failure.count == 0 {
            rules.failures.remove(index);
        }
        Some(error)
    }

    /// The delay for this request.
    pub(crate) fn latency(&self, request: Request<'_>) -> Duration {
        let rules = self.rules();
        rules
            .latency
            .iter()
            .filter(|(m, _)| m.matches(request))
            .map(|(_, d)| *d)
            .sum()
    }

    /// Whether a watch on this resource is to stay silent.
    pub(crate) fn is_silenced(&self, group: &str, plural: &str) -> bool {
        self.rules().silenced.iter().any(|m| {
            m.matches(Request {
                verb: "watch",
                group,
                plural,
                name: None,
                field_manager: None,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(
        verb: &'a str,
        group: &'a str,
        plural: &'a str,
        name: Option<&'a str>,
    ) -> Request<'a> {
        Request {
            verb,
            group,
            plural,
            name,
            field_manager: None,
        }
    }

    #[test]
    fn a_failure_for_one_writer_spares_the_others() {
        let faults = Faults::new(Arc::new(Mutex::new(State::new(10))));
        faults.fail(Failure::new(500).field_manager("member").times(5));
        let by = |manager| Request {
            field_manager: manager,
            ..request("update", "coordination.k8s.io", "leases", Some("op-a"))
        };
        assert!(faults.take_failure(by(Some("assigner"))).is_none());
        assert!(faults.take_failure(by(None)).is_none());
        assert!(faults.take_failure(by(Some("member"))).is_some());
    }

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
            .take_failure(request("get", "example.com", "widgets", None))
            .is_none());
        assert!(faults
            .take_failure(request("list", "other.com", "widgets", None))
            .is_none());
        assert_eq!(
            faults
                .take_failure(request("list", "example.com", "widgets", None))
                .unwrap()
                .code,
            503
        );
        assert_eq!(
            faults
                .take_failure(request("list", "example.com", "widgets", None))
                .unwrap()
                .retry_after,
            Some(1)
        );
        assert!(faults
            .take_failure(request("list", "example.com", "widgets", None))
            .is_none());
    }

    #[test]
    fn a_failure_for_one_object_spares_the_others() {
        let faults = Faults::new(Arc::new(Mutex::new(State::new(10))));
        faults.fail(Failure::new(500).verb("update").name("op-a").times(5));
        assert!(faults
            .take_failure(request(
                "update",
                "coordination.k8s.io",
                "leases",
                Some("op-b")
            ))
            .is_none());
        assert!(faults
            .take_failure(request("update", "coordination.k8s.io", "leases", None))
            .is_none());
        assert!(faults
            .take_failure(request(
                "update",
                "coordination.k8s.io",
                "leases",
                Some("op-a")
            ))
            .is_some());
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
