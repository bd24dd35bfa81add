//! Conditions in `status.conditions`, kept as Kubernetes' API conventions and apimachinery's
//! `meta.SetStatusCondition`, `RemoveStatusCondition`, `FindStatusCondition` and
//! `IsStatusConditionTrue` keep them (the way Operator SDK's operators report their state): one
//! entry per `type`, whose `lastTransitionTime` moves only when its `status` does.
//!
//! Two ways in, with the same rules:
//!
//! * typed: [`set_condition`], [`remove_condition`], [`find_condition`], [`is_condition_true`] and
//!   co. on a `Vec<Condition>` (k8s-openapi's [`Condition`]), as a `#[derive(CustomResource)]`
//!   status holds them;
//! * JSON: [`Conditions`], a view of a status as handlers read it (`ctx.status()`, a
//!   `DynamicObject`'s `status`), which gives the list back for the cycle's patch.
//!
//! The expected flow, in a handler: read the conditions from the status
//! ([`Conditions::from_status`], with the object's generation and the time), set the ones the handler
//! knows about, and send the list back if something changed
//! (`ctx.patch().status("conditions", conditions.to_value())`).
//!
//! Guarantees:
//!
//! * The order is stable: a condition keeps its place, a new type is appended. A merge patch
//!   replaces the list whole, so this order is the one everybody sees.
//! * Setting a condition changes `lastTransitionTime` only when `status` changes: to the new
//!   condition's time, or, if that is unset, to `now`. `now` is always given (a parameter, or
//!   [`Conditions::at`]), so tests are exact. `reason`, `message` and `observedGeneration` are
//!   updated as given.
//! * A condition is checked as the API server checks it (apimachinery's `ValidateCondition`)
//!   before anything changes. A wrong one is a [`ConditionError`], never a panic or a half-made
//!   change.
//! * The JSON view keeps what it does not know: other fields of an entry (a Deployment-style
//!   `lastUpdateTime`), entries that are not conditions, and other types' values as they were.
//!
//! A time is *unset* when it is the Unix epoch (jiff's default, what [`new_condition`] gives) or
//! Go's zero time (`0001-01-01T00:00:00Z`); a JSON entry without a readable `lastTransitionTime`
//! reads as unset.
//!
//! ```
//! use jiff::Timestamp;
//! use kactor_reactor::conditions::{is_condition_true, new_condition, set_condition, ConditionStatus};
//!
//! let now: Timestamp = "2024-05-01T10:00:00Z".parse().unwrap();
//! let mut conditions = Vec::new();
//! let ready = new_condition("Ready", ConditionStatus::True, "Available", "2 replicas ready");
//! assert!(set_condition(&mut conditions, ready.clone(), now)?);
//! assert!(!set_condition(&mut conditions, ready, now)?, "nothing changed");
//! assert!(is_condition_true(&conditions, "Ready"));
//! assert_eq!(conditions[0].last_transition_time.0, now);
//! # Ok::<(), kactor_reactor::conditions::ConditionError>(())
//! ```

use std::fmt;

use jiff::Timestamp;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::DynamicObject;
use serde_json::{json, Map, Value};

/// The longest `reason` the API server accepts, in bytes.
pub const MAX_REASON_LENGTH: usize = 1024;

/// The longest `message` the API server accepts, in bytes.
pub const MAX_MESSAGE_LENGTH: usize = 32 * 1024;

/// The longest name part of a qualified name (a `type`).
const MAX_NAME_LENGTH: usize = 63;

/// The longest prefix of a qualified name (a DNS subdomain).
const MAX_PREFIX_LENGTH: usize = 253;

/// Go's zero time, `0001-01-01T00:00:00Z`.
const GO_ZERO: Timestamp = Timestamp::constant(-62_135_596_800, 0);

/// The first second RFC 3339 can write (`0000-01-01T00:00:00Z`), as Go's `metav1.Time`; jiff's
/// timestamps end before the last one (year 9999).
const EARLIEST: Timestamp = Timestamp::constant(-62_167_219_200, 0);

/// Why a condition, or the conditions of a status, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    /// `type` is not a qualified name (`Ready`, `example.com/Ready`).
    #[error("condition type {type_:?} is invalid: {why}")]
    Type {
        /// The condition's type.
        type_: String,
        /// What is wrong with it.
        why: String,
    },
    /// `status` is not `True`, `False` or `Unknown`.
    #[error("condition {type_}: status {status:?} is not one of \"True\", \"False\", \"Unknown\"")]
    Status {
        /// The condition's type.
        type_: String,
        /// The status given.
        status: String,
    },
    /// `reason` is empty, too long, or not CamelCase-like (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`).
    #[error("condition {type_}: reason {reason:?} is invalid: {why}")]
    Reason {
        /// The condition's type.
        type_: String,
        /// The reason given.
        reason: String,
        /// What is wrong with it.
        why: String,
    },
    /// `message` is longer than [`MAX_MESSAGE_LENGTH`] bytes.
    #[error("condition {type_}: message is {length} bytes long, at most 32768 are allowed")]
    Message {
        /// The condition's type.
        type_: String,
        /// The message's length, in bytes.
        length: usize,
    },
    /// `observedGeneration` is negative.
    #[error(
        "condition {type_}: observedGeneration {generation} must be greater than or equal to zero"
    )]
    ObservedGeneration {
        /// The condition's type.
        type_: String,
        /// The generation given.
        generation: i64,
    },
    /// `lastTransitionTime` is unset (in a list being validated) or cannot be written in RFC 3339.
    #[error("condition {type_}: lastTransitionTime {why}")]
    LastTransitionTime {
        /// The condition's type.
        type_: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Two conditions of a list have the same type.
    #[error("condition type {type_:?} appears more than once")]
    Duplicate {
        /// The repeated type.
        type_: String,
    },
    /// The status, or its `conditions`, is not what a status is (an object, a list).
    #[error("the conditions cannot be read: {0}")]
    Malformed(String),
}

/// A condition's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl ConditionStatus {
    /// As it is written: `True`, `False` or `Unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    /// The status this text is, exactly as written (the API server accepts no other spelling).
    pub fn parse(text: &str) -> Option<ConditionStatus> {
        match text {
            "True" => Some(ConditionStatus::True),
            "False" => Some(ConditionStatus::False),
            "Unknown" => Some(ConditionStatus::Unknown),
            _ => None,
        }
    }
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// A condition to set: no `observedGeneration`, and an unset `lastTransitionTime` (setting it
/// puts the time of the transition there).
pub fn new_condition(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: None,
        last_transition_time: unset_time(),
    }
}

/// The unset time (the Unix epoch): "when it is set", for [`set_condition`].
pub fn unset_time() -> Time {
    Time(Timestamp::UNIX_EPOCH)
}

/// Whether a time is unset: the Unix epoch or Go's zero time.
pub fn is_unset(time: &Time) -> bool {
    time.0 == Timestamp::UNIX_EPOCH || time.0 == GO_ZERO
}

/// apimachinery's `SetStatusCondition`: sets `new` in `conditions`, and says whether anything
/// changed.
///
/// A new type is appended, with `new`'s `lastTransitionTime`, or `now` if that is unset. A type
/// already there keeps its place; its `lastTransitionTime` changes only with its `status` (to
/// `new`'s, or `now`), its `reason`, `message` and `observedGeneration` become `new`'s. An invalid
/// `new` ([`validate_condition`]) changes nothing and is the error.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    new: Condition,
    now: Timestamp,
) -> Result<bool, ConditionError> {
    let new = prepared(new, now)?;
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => Ok(update(existing, new).any()),
        None => {
            conditions.push(new);
            Ok(true)
        }
    }
}

/// apimachinery's `RemoveStatusCondition`: removes the conditions of this type, and says whether
/// there was one.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// apimachinery's `FindStatusCondition`: the (first) condition of this type.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// apimachinery's `IsStatusConditionTrue`: the condition of this type is there, and `True`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    is_condition_present_and_equal(conditions, type_, ConditionStatus::True)
}

/// apimachinery's `IsStatusConditionFalse`: the condition of this type is there, and `False`.
pub fn is_condition_false(conditions: &[Condition], type_: &str) -> bool {
    is_condition_present_and_equal(conditions, type_, ConditionStatus::False)
}

/// apimachinery's `IsStatusConditionPresentAndEqual`: the condition of this type is there, with
/// this status.
pub fn is_condition_present_and_equal(
    conditions: &[Condition],
    type_: &str,
    status: ConditionStatus,
) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == status.as_str())
}

/// apimachinery's `ValidateCondition`, as the API server checks a condition (its first problem, in
/// the same order): `type` a qualified name, `status` one of `True`, `False`, `Unknown`,
/// `observedGeneration` not negative, `lastTransitionTime` set (and writable in RFC 3339), `reason`
/// set, CamelCase-like and at most [`MAX_REASON_LENGTH`] bytes, `message` at most
/// [`MAX_MESSAGE_LENGTH`] bytes.
pub fn validate_condition(condition: &Condition) -> Result<(), ConditionError> {
    let type_ = || condition.type_.clone();
    if let Some(why) = qualified_name_error(&condition.type_) {
        return Err(ConditionError::Type {
            type_: type_(),
            why,
        });
    }
    if ConditionStatus::parse(&condition.status).is_none() {
        return Err(ConditionError::Status {
            type_: type_(),
            status: condition.status.clone(),
        });
    }
    if let Some(generation) = condition.observed_generation.filter(|g| *g < 0) {
        return Err(ConditionError::ObservedGeneration {
            type_: type_(),
            generation,
        });
    }
    let time = &condition.last_transition_time;
    if is_unset(time) {
        return Err(ConditionError::LastTransitionTime {
            type_: type_(),
            why: "must be set",
        });
    }
    if time.0 < EARLIEST {
        return Err(ConditionError::LastTransitionTime {
            type_: type_(),
            why: "must be within the years 0000 to 9999",
        });
    }
    if let Some(why) = reason_error(&condition.reason) {
        return Err(ConditionError::Reason {
            type_: type_(),
            reason: condition.reason.clone(),
            why,
        });
    }
    if condition.message.len() > MAX_MESSAGE_LENGTH {
        return Err(ConditionError::Message {
            type_: type_(),
            length: condition.message.len(),
        });
    }
    Ok(())
}

/// apimachinery's `ValidateConditions`: each condition valid, no type twice.
pub fn validate_conditions(conditions: &[Condition]) -> Result<(), ConditionError> {
    for (at, condition) in conditions.iter().enumerate() {
        if conditions[..at].iter().any(|c| c.type_ == condition.type_) {
            return Err(ConditionError::Duplicate {
                type_: condition.type_.clone(),
            });
        }
        validate_condition(condition)?;
    }
    Ok(())
}

/// Why `value` is not a qualified name (apimachinery's `IsQualifiedName`, as label keys are): an
/// optional DNS subdomain prefix and `/`, then a name of at most 63 alphanumerics, `-`, `_`, `.`,
/// starting and ending with an alphanumeric.
fn qualified_name_error(value: &str) -> Option<String> {
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Some("its prefix part must be non-empty".into());
            }
            if let Some(why) = dns_subdomain_error(prefix) {
                return Some(format!("its prefix part {why}"));
            }
            name
        }
        _ => {
            return Some(
                "a qualified name has at most one '/', after an optional DNS subdomain prefix \
                 (e.g. 'example.com/MyName')"
                    .into(),
            )
        }
    };
    if name.is_empty() {
        return Some("its name part must be non-empty".into());
    }
    if name.len() > MAX_NAME_LENGTH {
        return Some(format!(
            "its name part must be no more than {MAX_NAME_LENGTH} characters"
        ));
    }
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !(name.chars().all(inner) && starts_and_ends(name, |c| c.is_ascii_alphanumeric())) {
        return Some(
            "its name part must consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character (e.g. 'MyName', 'my.name', '123-abc')"
                .into(),
        );
    }
    None
}

/// Why `value` is not a DNS subdomain (RFC 1123): at most 253 characters, dot-separated labels of
/// lower-case alphanumerics and `-`, each starting and ending with an alphanumeric.
fn dns_subdomain_error(value: &str) -> Option<String> {
    if value.len() > MAX_PREFIX_LENGTH {
        return Some(format!(
            "must be no more than {MAX_PREFIX_LENGTH} characters"
        ));
    }
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let label = |label: &str| {
        label.chars().all(|c| alphanumeric(c) || c == '-') && starts_and_ends(label, alphanumeric)
    };
    (!value.split('.').all(label)).then(|| {
        "must be a lowercase RFC 1123 subdomain: lower case alphanumeric characters, '-' or '.', \
         starting and ending with an alphanumeric character (e.g. 'example.com')"
            .into()
    })
}

/// Why `reason` is not one: empty, longer than [`MAX_REASON_LENGTH`], or not matching
/// `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`.
fn reason_error(reason: &str) -> Option<String> {
    if reason.is_empty() {
        return Some("must be set".into());
    }
    if reason.len() > MAX_REASON_LENGTH {
        return Some(format!(
            "must be no more than {MAX_REASON_LENGTH} characters"
        ));
    }
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':');
    let last = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let first_is_letter = reason.starts_with(|c: char| c.is_ascii_alphabetic());
    if !(first_is_letter && reason.chars().all(inner) && reason.ends_with(last)) {
        return Some(
            "must start with a letter, consist of letters, digits, '_', ',' or ':', and end \
             with a letter, a digit or '_' (e.g. 'MyReason', 'my_reason', 'My:Reason')"
                .into(),
        );
    }
    None
}

/// Whether `text` is non-empty and starts and ends with a character `edge` accepts.
fn starts_and_ends(text: &str, edge: impl Fn(char) -> bool) -> bool {
    text.starts_with(&edge) && text.ends_with(&edge)
}

/// `new`, its unset time made `now`, if valid.
fn prepared(mut new: Condition, now: Timestamp) -> Result<Condition, ConditionError> {
    if is_unset(&new.last_transition_time) {
        new.last_transition_time = Time(now);
    }
    validate_condition(&new)?;
    Ok(new)
}

/// Which fields setting a condition changed in the one of its type.
#[derive(Debug, Default)]
struct Changed {
    status: bool,
    reason: bool,
    message: bool,
    generation: bool,
}

impl Changed {
    fn any(&self) -> bool {
        self.status || self.reason || self.message || self.generation
    }
}

/// `SetStatusCondition`'s update of the condition already there (`new` is prepared: its time set).
fn update(existing: &mut Condition, new: Condition) -> Changed {
    let mut changed = Changed::default();
    if existing.status != new.status {
        existing.status = new.status;
        existing.last_transition_time = new.last_transition_time;
        changed.status = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason;
        changed.reason = true;
    }
    if existing.message != new.message {
        existing.message = new.message;
        changed.message = true;
    }
    if existing.observed_generation != new.observed_generation {
        existing.observed_generation = new.observed_generation;
        changed.generation = true;
    }
    changed
}

/// The conditions of a status as JSON, as handlers read it: find, set and remove them with
/// [`set_condition`]'s rules, then send [`to_value`](Conditions::to_value) back.
///
/// What it does not know is kept as it was: other fields of an entry, entries that are not
/// conditions (each is left in its place), the values of types not set. An entry whose fields are
/// missing or of the wrong kind reads as empty ones (an unreadable `lastTransitionTime` as unset).
///
/// ```
/// use kactor_reactor::conditions::{ConditionStatus, Conditions};
/// use serde_json::json;
///
/// let status = json!({"replicas": 2, "conditions": [
///     {"type": "Ready", "status": "False", "reason": "Starting", "message": "",
///      "lastTransitionTime": "2024-05-01T10:00:00Z", "observedGeneration": 2},
/// ]});
/// let now = "2024-05-01T10:05:00Z".parse().unwrap();
/// let mut conditions = Conditions::from_status(&status)?
///     .observed_generation(3) // in a handler: ctx.meta().generation
///     .at(now);
/// conditions.set("Ready", ConditionStatus::True, "Available", "2 replicas ready")?;
/// conditions.set("Degraded", ConditionStatus::False, "AsExpected", "")?;
/// assert!(conditions.is_true("Ready") && conditions.is_changed());
/// // In a handler: ctx.patch().status("conditions", conditions.to_value());
/// assert_eq!(conditions.to_patch(), json!({"status": {"conditions": [
///     {"type": "Ready", "status": "True", "reason": "Available", "message": "2 replicas ready",
///      "lastTransitionTime": "2024-05-01T10:05:00Z", "observedGeneration": 3},
///     {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
///      "lastTransitionTime": "2024-05-01T10:05:00Z", "observedGeneration": 3},
/// ]}}));
/// # Ok::<(), kactor_reactor::conditions::ConditionError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conditions {
    entries: Vec<Value>,
    generation: Option<i64>,
    now: Option<Timestamp>,
    changed: bool,
}

impl Conditions {
    /// No conditions yet.
    pub fn new() -> Conditions {
        Conditions::default()
    }

    /// The conditions of a status (`ctx.status()`): its `conditions`, none if it has none or is
    /// null. A status that is not an object, or `conditions` that are not a list, are an error.
    pub fn from_status(status: &Value) -> Result<Conditions, ConditionError> {
        let list = match status {
            Value::Null => &Value::Null,
            Value::Object(status) => status.get("conditions").unwrap_or(&Value::Null),
            other => {
                return Err(ConditionError::Malformed(format!(
                    "the status is {}, not an object",
                    kind(other)
                )))
            }
        };
        let entries = match list {
            Value::Null => Vec::new(),
            Value::Array(entries) => entries.clone(),
            other => {
                return Err(ConditionError::Malformed(format!(
                    "status.conditions is {}, not a list",
                    kind(other)
                )))
            }
        };
        Ok(Conditions {
            entries,
            ..Conditions::default()
        })
    }

    /// The conditions of a stored object (a handler's body), with its `metadata.generation` as the
    /// observed generation of those [`set`](Conditions::set).
    pub fn of(object: &DynamicObject) -> Result<Conditions, ConditionError> {
        let status = object.data.get("status").unwrap_or(&Value::Null);
        Ok(Conditions::from_status(status)?.observed_generation(object.metadata.generation))
    }

    /// The `observedGeneration` of the conditions [`set`](Conditions::set) from now on (None: none).
    pub fn observed_generation(mut self, generation: impl Into<Option<i64>>) -> Conditions {
        self.generation = generation.into();
        self
    }

    /// The time a transition happens at from now on (default: the system's clock at each change).
    pub fn at(mut self, now: Timestamp) -> Conditions {
        self.now = Some(now);
        self
    }

    /// The (first) condition of this type.
    pub fn find(&self, type_: &str) -> Option<Condition> {
        self.position(type_).map(|at| read(&self.entries[at]))
    }

    /// The condition of this type is there, and `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.is_present_and_equal(type_, ConditionStatus::True)
    }

    /// The condition of this type is there, and `False`.
    pub fn is_false(&self, type_: &str) -> bool {
        self.is_present_and_equal(type_, ConditionStatus::False)
    }

    /// The condition of this type is there, with this status.
    pub fn is_present_and_equal(&self, type_: &str, status: ConditionStatus) -> bool {
        self.find(type_)
            .is_some_and(|c| c.status == status.as_str())
    }

    /// Every condition, in order (entries that are not objects left out).
    pub fn iter(&self) -> impl Iterator<Item = Condition> + '_ {
        self.entries.iter().filter(|e| e.is_object()).map(read)
    }

    /// Sets the condition of this type, with the observed generation given to this view (see
    /// [`set_condition`]); says whether anything changed.
    pub fn set(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> Result<bool, ConditionError> {
        let mut condition = new_condition(type_, status, reason, message);
        condition.observed_generation = self.generation;
        self.set_condition(condition)
    }

    /// Sets this condition exactly as given, its `observedGeneration` too (see [`set_condition`]);
    /// says whether anything changed. Of an entry already there, only the fields that change are
    /// written.
    pub fn set_condition(&mut self, condition: Condition) -> Result<bool, ConditionError> {
        let new = prepared(condition, self.now.unwrap_or_else(Timestamp::now))?;
        let changed = match self.position(&new.type_) {
            Some(at) => {
                let mut existing = read(&self.entries[at]);
                let changed = update(&mut existing, new);
                write(&mut self.entries[at], &existing, &changed);
                changed.any()
            }
            None => {
                self.entries.push(entry(&new));
                true
            }
        };
        self.changed |= changed;
        Ok(changed)
    }

    /// Removes the conditions of this type; says whether there was one.
    pub fn remove(&mut self, type_: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| type_of(e) != Some(type_));
        let removed = self.entries.len() != before;
        self.changed |= removed;
        removed
    }

    /// Whether a [`set`](Conditions::set) or [`remove`](Conditions::remove) changed anything since
    /// the conditions were read (nothing to send otherwise).
    pub fn is_changed(&self) -> bool {
        self.changed
    }

    /// The list, as `status.conditions` is: for `ctx.patch().status("conditions", ...)`.
    pub fn to_value(&self) -> Value {
        Value::Array(self.entries.clone())
    }

    /// `{"conditions": [...]}`: a merge patch of the status alone.
    pub fn to_status(&self) -> Value {
        json!({ "conditions": self.to_value() })
    }

    /// `{"status": {"conditions": [...]}}`: a merge patch of the object (for `ctx.patch().merge`,
    /// or kube's `Api::patch_status` with `Patch::Merge`).
    pub fn to_patch(&self) -> Value {
        json!({ "status": self.to_status() })
    }

    fn position(&self, type_: &str) -> Option<usize> {
        self.entries.iter().position(|e| type_of(e) == Some(type_))
    }
}

/// The type of an entry, if it is an object with a string `type`.
fn type_of(entry: &Value) -> Option<&str> {
    entry.get("type").and_then(Value::as_str)
}

/// A JSON entry as a condition, missing or wrong fields read as empty (the time as unset).
fn read(entry: &Value) -> Condition {
    let text = |key: &str| {
        entry
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let time = entry
        .get("lastTransitionTime")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok());
    Condition {
        type_: text("type"),
        status: text("status"),
        reason: text("reason"),
        message: text("message"),
        observed_generation: entry.get("observedGeneration").and_then(Value::as_i64),
        last_transition_time: time.map_or_else(unset_time, Time),
    }
}

/// A new entry, with the fields k8s-openapi's `Condition` writes.
fn entry(condition: &Condition) -> Value {
    let mut map = Map::new();
    map.insert("type".into(), json!(condition.type_));
    map.insert("status".into(), json!(condition.status));
    map.insert("reason".into(), json!(condition.reason));
    map.insert("message".into(), json!(condition.message));
    map.insert(
        "lastTransitionTime".into(),
        time_value(&condition.last_transition_time),
    );
    if let Some(generation) = condition.observed_generation {
        map.insert("observedGeneration".into(), json!(generation));
    }
    Value::Object(map)
}

/// Writes into an entry the fields that changed (the others, and the fields it does not know,
/// stay as they were).
fn write(entry: &mut Value, condition: &Condition, changed: &Changed) {
    let Some(map) = entry.as_object_mut() else {
        return;
    };
    if changed.status {
        map.insert("status".into(), json!(condition.status));
        map.insert(
            "lastTransitionTime".into(),
            time_value(&condition.last_transition_time),
        );
    }
    if changed.reason {
        map.insert("reason".into(), json!(condition.reason));
    }
    if changed.message {
        map.insert("message".into(), json!(condition.message));
    }
    if changed.generation {
        match condition.observed_generation {
            Some(generation) => map.insert("observedGeneration".into(), json!(generation)),
            None => map.remove("observedGeneration"),
        };
    }
}

/// A time as `metav1.Time` writes it: RFC 3339 in UTC, to the second (as k8s-openapi's `Time`; a
/// validated time is within the years RFC 3339 can write).
fn time_value(time: &Time) -> Value {
    let second = Timestamp::from_second(time.0.as_second()).unwrap_or(time.0);
    Value::String(second.to_string())
}

/// What a JSON value is, for errors.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// An hour before and after `now`, as apimachinery's tests have them.
    fn before() -> Time {
        Time(at("2024-05-01T09:00:00Z"))
    }
    fn after() -> Time {
        Time(at("2024-05-01T11:00:00Z"))
    }
    fn now() -> Timestamp {
        at("2024-05-01T10:00:00Z")
    }

    /// `metav1.Condition{Type: type_}`: everything else empty.
    fn bare(type_: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: String::new(),
            reason: String::new(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: unset_time(),
        }
    }

    fn with_status(type_: &str, status: &str) -> Condition {
        Condition {
            status: status.into(),
            ..bare(type_)
        }
    }

    /// `{Type, Status, LastTransitionTime, Reason: "reason", Message: "message"}`.
    fn full(type_: &str, status: &str, time: Time) -> Condition {
        Condition {
            status: status.into(),
            last_transition_time: time,
            reason: "reason".into(),
            message: "message".into(),
            ..bare(type_)
        }
    }

    /// A case of setting a condition: (name, conditions, to set, changed, expected).
    type SetCase = (
        &'static str,
        Vec<Condition>,
        Condition,
        bool,
        Vec<Condition>,
    );

    /// apimachinery's `TestSetStatusCondition`.
    fn set_cases() -> Vec<SetCase> {
        let updated = Condition {
            observed_generation: Some(3),
            ..full("second", "True", before())
        };
        vec![
            (
                "should-add",
                vec![bare("first"), bare("third")],
                full("second", "True", before()),
                true,
                vec![
                    bare("first"),
                    bare("third"),
                    full("second", "True", before()),
                ],
            ),
            (
                "use-supplied-time",
                vec![bare("first"), with_status("second", "False"), bare("third")],
                full("second", "True", before()),
                true,
                vec![
                    bare("first"),
                    full("second", "True", before()),
                    bare("third"),
                ],
            ),
            (
                "update-fields",
                vec![
                    bare("first"),
                    Condition {
                        last_transition_time: before(),
                        ..with_status("second", "True")
                    },
                    bare("third"),
                ],
                Condition {
                    observed_generation: Some(3),
                    ..full("second", "True", after())
                },
                true,
                vec![bare("first"), updated, bare("third")],
            ),
            (
                "empty conditions",
                vec![],
                full("first", "True", before()),
                true,
                vec![full("first", "True", before())],
            ),
            (
                "equal conditions",
                vec![full("first", "True", before())],
                full("first", "True", before()),
                false,
                vec![full("first", "True", before())],
            ),
            (
                "equal conditions except last transition time",
                vec![full("first", "True", before())],
                full("first", "True", after()),
                false,
                vec![full("first", "True", before())],
            ),
        ]
    }

    #[test]
    fn setting_follows_apimachinery() {
        for (name, mut conditions, new, changed, expected) in set_cases() {
            assert_eq!(
                set_condition(&mut conditions, new, now()),
                Ok(changed),
                "{name}"
            );
            assert_eq!(conditions, expected, "{name}");
        }
    }

    #[test]
    fn an_unset_time_becomes_now_on_a_transition_only() {
        let mut conditions = Vec::new();
        let ready = new_condition("Ready", ConditionStatus::False, "Starting", "");
        assert_eq!(set_condition(&mut conditions, ready, now()), Ok(true));
        assert_eq!(conditions[0].last_transition_time, Time(now()), "added");

        let later = at("2024-05-01T10:30:00Z");
        let same = new_condition("Ready", ConditionStatus::False, "Waiting", "");
        assert_eq!(set_condition(&mut conditions, same, later), Ok(true));
        assert_eq!(
            (
                conditions[0].reason.as_str(),
                &conditions[0].last_transition_time
            ),
            ("Waiting", &Time(now())),
            "the reason changed, the status did not"
        );

        let flipped = new_condition("Ready", ConditionStatus::True, "Available", "");
        assert_eq!(set_condition(&mut conditions, flipped, later), Ok(true));
        assert_eq!(conditions[0].last_transition_time, Time(later));

        let go_zero = Condition {
            last_transition_time: Time(GO_ZERO),
            ..new_condition("Ready", ConditionStatus::Unknown, "Lost", "")
        };
        let latest = at("2024-05-01T11:00:00Z");
        assert_eq!(set_condition(&mut conditions, go_zero, latest), Ok(true));
        assert_eq!(conditions[0].last_transition_time, Time(latest));
    }

    #[test]
    fn an_observed_generation_is_set_and_unset_as_given() {
        let mut conditions = Vec::new();
        let mut ready = new_condition("Ready", ConditionStatus::True, "Available", "");
        ready.observed_generation = Some(4);
        set_condition(&mut conditions, ready.clone(), now()).unwrap();
        ready.observed_generation = None;
        assert_eq!(set_condition(&mut conditions, ready, now()), Ok(true));
        assert_eq!(conditions[0].observed_generation, None);
    }

    #[test]
    fn an_invalid_condition_changes_nothing() {
        let mut conditions = vec![full("first", "True", before())];
        let wrong = new_condition("first", ConditionStatus::False, "not a reason", "");
        assert!(matches!(
            set_condition(&mut conditions, wrong, now()),
            Err(ConditionError::Reason { .. })
        ));
        let mut unknown = full("first", "True", before());
        unknown.status = "true".into();
        assert!(matches!(
            set_condition(&mut conditions, unknown, now()),
            Err(ConditionError::Status { .. })
        ));
        assert_eq!(conditions, vec![full("first", "True", before())]);
    }

    #[test]
    fn removing_follows_apimachinery() {
        // TestRemoveStatusCondition (its nil_conditions case is the empty one: a Vec is never nil).
        let cases = [
            (
                "present",
                vec![bare("first"), bare("second"), bare("third")],
                "second",
                true,
                vec![bare("first"), bare("third")],
            ),
            (
                "not-present",
                vec![bare("first"), bare("third")],
                "second",
                false,
                vec![bare("first"), bare("third")],
            ),
            ("empty_conditions", vec![], "Foo", false, vec![]),
            (
                "every-one-of-the-type",
                vec![bare("first"), bare("second"), bare("first")],
                "first",
                true,
                vec![bare("second")],
            ),
        ];
        for (name, mut conditions, type_, removed, expected) in cases {
            assert_eq!(remove_condition(&mut conditions, type_), removed, "{name}");
            assert_eq!(conditions, expected, "{name}");
        }
    }

    #[test]
    fn finding_follows_apimachinery() {
        // TestFindStatusCondition.
        let cases = [
            ("not-present", vec![bare("first")], "second", None),
            (
                "present",
                vec![bare("first"), bare("second")],
                "second",
                Some(bare("second")),
            ),
            (
                "the-first-of-the-type",
                vec![with_status("x", "True"), with_status("x", "False")],
                "x",
                Some(with_status("x", "True")),
            ),
        ];
        for (name, conditions, type_, expected) in cases {
            assert_eq!(
                find_condition(&conditions, type_),
                expected.as_ref(),
                "{name}"
            );
        }
    }

    #[test]
    fn status_checks_follow_apimachinery() {
        // TestIsStatusConditionPresentAndEqual, and the True/False shorthands.
        use ConditionStatus::{False, True};
        let cases = [
            ("doesnt-match-true", "Unknown", True, false),
            ("does-match-true", "True", True, true),
            ("does-match-false", "False", False, true),
            ("doesnt-match-false", "True", False, false),
        ];
        for (name, status, asked, expected) in cases {
            let conditions = [with_status("first", status)];
            assert_eq!(
                is_condition_present_and_equal(&conditions, "first", asked),
                expected,
                "{name}"
            );
            assert!(
                !is_condition_present_and_equal(&conditions, "second", asked),
                "{name}: absent"
            );
        }
        let conditions = [with_status("a", "True"), with_status("b", "False")];
        assert!(is_condition_true(&conditions, "a") && !is_condition_false(&conditions, "a"));
        assert!(is_condition_false(&conditions, "b") && !is_condition_true(&conditions, "b"));
        assert!(!is_condition_true(&conditions, "c") && !is_condition_false(&conditions, "c"));
    }

    /// A valid condition of this type, with this reason and message.
    fn valid(type_: &str, reason: &str, message: &str) -> Condition {
        Condition {
            last_transition_time: Time(now()),
            ..new_condition(type_, ConditionStatus::True, reason, message)
        }
    }

    #[test]
    fn types_are_qualified_names() {
        let long_name = "a".repeat(63);
        let long_prefix = format!("{}.com/Ready", "a".repeat(250));
        let cases = [
            ("Ready", true),
            ("example.com/Ready", true),
            ("my.name", true),
            ("123-abc", true),
            ("a_b-c.d", true),
            (long_name.as_str(), true),
            ("", false),
            ("/Ready", false),
            ("example.com/", false),
            ("a/b/c", false),
            ("Example.com/Ready", false),
            ("-example.com/Ready", false),
            ("example..com/Ready", false),
            ("-Ready", false),
            ("Ready.", false),
            ("Ready!", false),
            ("Réady", false),
            (long_prefix.as_str(), false),
        ];
        for (type_, ok) in cases {
            let result = validate_condition(&valid(type_, "Reason", ""));
            assert_eq!(result.is_ok(), ok, "{type_:?}: {result:?}");
            if !ok {
                assert!(
                    matches!(result, Err(ConditionError::Type { .. })),
                    "{type_:?}"
                );
            }
        }
        let too_long = format!("{long_name}a");
        let error = validate_condition(&valid(&too_long, "Reason", "")).unwrap_err();
        assert!(error.to_string().contains("no more than 63"), "{error}");
    }

    #[test]
    fn reasons_are_camel_case_like_and_set() {
        let longest = "R".repeat(MAX_REASON_LENGTH);
        let too_long = "R".repeat(MAX_REASON_LENGTH + 1);
        let cases = [
            ("A", true),
            ("reason", true),
            ("MinimumReplicasAvailable", true),
            ("Some_Reason", true),
            ("Some:Reason,Other_", true),
            ("Reason2", true),
            (longest.as_str(), true),
            ("", false),
            ("1Reason", false),
            ("_Reason", false),
            ("Reason:", false),
            ("Reason,", false),
            ("With Space", false),
            ("With-Dash", false),
            ("Ünicode", false),
            (too_long.as_str(), false),
        ];
        for (reason, ok) in cases {
            let result = validate_condition(&valid("Ready", reason, ""));
            assert_eq!(result.is_ok(), ok, "{reason:?}: {result:?}");
            if !ok {
                assert!(
                    matches!(result, Err(ConditionError::Reason { .. })),
                    "{reason:?}"
                );
            }
        }
        let error = validate_condition(&valid("Ready", "", "")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "condition Ready: reason \"\" is invalid: must be set"
        );
    }

    #[test]
    fn statuses_messages_generations_and_times_are_checked() {
        let mut condition = valid("Ready", "Reason", &"m".repeat(MAX_MESSAGE_LENGTH));
        assert_eq!(validate_condition(&condition), Ok(()));
        condition.message.push('m');
        assert_eq!(
            validate_condition(&condition),
            Err(ConditionError::Message {
                type_: "Ready".into(),
                length: MAX_MESSAGE_LENGTH + 1
            })
        );

        for (status, ok) in [
            ("True", true),
            ("False", true),
            ("Unknown", true),
            ("true", false),
            ("", false),
        ] {
            let condition = Condition {
                status: status.into(),
                ..valid("Ready", "Reason", "")
            };
            assert_eq!(validate_condition(&condition).is_ok(), ok, "{status:?}");
        }

        for (generation, ok) in [(0, true), (7, true), (-1, false)] {
            let condition = Condition {
                observed_generation: Some(generation),
                ..valid("Ready", "Reason", "")
            };
            assert_eq!(validate_condition(&condition).is_ok(), ok, "{generation}");
        }

        let times = [
            (Timestamp::UNIX_EPOCH, false),
            (GO_ZERO, false),
            (EARLIEST, true),
            (Timestamp::MAX, true),
            (Timestamp::constant(EARLIEST.as_second() - 1, 0), false),
        ];
        for (time, ok) in times {
            let condition = Condition {
                last_transition_time: Time(time),
                ..valid("Ready", "Reason", "")
            };
            let result = validate_condition(&condition);
            assert_eq!(result.is_ok(), ok, "{time}: {result:?}");
        }
    }

    #[test]
    fn a_list_has_each_type_once() {
        let a = valid("A", "Reason", "");
        let b = valid("B", "Reason", "");
        assert_eq!(validate_conditions(&[a.clone(), b.clone()]), Ok(()));
        assert_eq!(
            validate_conditions(&[a.clone(), b, a]),
            Err(ConditionError::Duplicate { type_: "A".into() })
        );
        assert!(matches!(
            validate_conditions(&[valid("A", "Reason", ""), bare("B")]),
            Err(ConditionError::Status { .. })
        ));
    }

    #[test]
    fn statuses_read_write_and_come_from_booleans() {
        for status in [
            ConditionStatus::True,
            ConditionStatus::False,
            ConditionStatus::Unknown,
        ] {
            assert_eq!(ConditionStatus::parse(status.as_str()), Some(status));
            assert_eq!(status.to_string(), status.as_str());
        }
        assert_eq!(ConditionStatus::parse("true"), None);
        assert_eq!(ConditionStatus::from(true), ConditionStatus::True);
        assert_eq!(ConditionStatus::from(false), ConditionStatus::False);
    }

    #[test]
    fn the_json_view_agrees_with_the_typed_functions() {
        for (name, conditions, new, changed, expected) in set_cases() {
            let status = json!({ "conditions": conditions });
            let mut view = Conditions::from_status(&status).unwrap().at(now());
            assert_eq!(view.set_condition(new), Ok(changed), "{name}");
            assert_eq!(view.is_changed(), changed, "{name}");
            assert_eq!(view.to_value(), json!(expected), "{name}");
            assert_eq!(view.iter().collect::<Vec<_>>(), expected, "{name}");
        }
    }

    #[test]
    fn the_json_view_writes_times_as_k8s_openapi_does() {
        let time = Time(at("2024-05-01T10:00:00.123456789Z"));
        assert_eq!(time_value(&time), serde_json::to_value(&time).unwrap());
        assert_eq!(time_value(&time), json!("2024-05-01T10:00:00Z"));
        let condition = valid("Ready", "Reason", "text");
        assert_eq!(entry(&condition), serde_json::to_value(&condition).unwrap());
    }

    #[test]
    fn the_json_view_keeps_what_it_does_not_know() {
        let status = json!({"conditions": [
            "not a condition",
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
             "message": "", "lastTransitionTime": "2024-05-01T09:00:00Z",
             "lastUpdateTime": "2024-05-01T09:30:00Z"},
            {"type": "Ready", "status": "False", "lastTransitionTime": null, "extra": 1},
        ]});
        let mut view = Conditions::from_status(&status)
            .unwrap()
            .observed_generation(5)
            .at(now());
        assert_eq!(
            view.set(
                "Progressing",
                ConditionStatus::True,
                "NewReplicaSetAvailable",
                ""
            ),
            Ok(true),
            "the generation is new"
        );
        assert_eq!(
            view.set("Ready", ConditionStatus::False, "Starting", ""),
            Ok(true)
        );
        assert_eq!(
            view.to_value(),
            json!([
                "not a condition",
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                 "message": "", "lastTransitionTime": "2024-05-01T09:00:00Z",
                 "lastUpdateTime": "2024-05-01T09:30:00Z", "observedGeneration": 5},
                {"type": "Ready", "status": "False", "lastTransitionTime": null, "extra": 1,
                 "reason": "Starting", "observedGeneration": 5},
            ]),
            "the status did not change: no time is written, not even over a null one"
        );
        assert_eq!(
            view.find("Ready").map(|c| c.last_transition_time),
            Some(unset_time())
        );
        assert_eq!(view.iter().count(), 2);
    }

    #[test]
    fn the_json_view_sets_removes_and_reports_changes() {
        let status = json!({"conditions": [
            {"type": "Ready", "status": "True", "reason": "Available", "message": "",
             "lastTransitionTime": "2024-05-01T09:00:00Z", "observedGeneration": 2},
        ]});
        let mut view = Conditions::from_status(&status)
            .unwrap()
            .observed_generation(2)
            .at(now());
        assert_eq!(
            view.set("Ready", ConditionStatus::True, "Available", ""),
            Ok(false)
        );
        assert!(!view.is_changed());
        assert_eq!(view.to_value(), status["conditions"], "untouched");
        assert!(view.is_true("Ready") && !view.is_false("Ready"));

        assert_eq!(
            view.set("Ready", ConditionStatus::False, "Lost", "gone"),
            Ok(true)
        );
        assert!(view.is_false("Ready") && view.is_changed());
        assert_eq!(
            view.find("Ready").unwrap().last_transition_time,
            Time(now())
        );
        assert!(view.is_present_and_equal("Ready", ConditionStatus::False));

        assert!(!view.remove("Missing"));
        assert!(view.remove("Ready"));
        assert_eq!(view.find("Ready"), None);
        assert_eq!(view.to_status(), json!({"conditions": []}));
        assert_eq!(view.to_patch(), json!({"status": {"conditions": []}}));

        let error = view
            .set("Ready", ConditionStatus::True, "", "")
            .unwrap_err();
        assert!(matches!(error, ConditionError::Reason { .. }), "{error}");
        assert_eq!(view.to_value(), json!([]), "nothing set");
    }

    #[test]
    fn the_json_view_reads_a_status_or_says_why_not() {
        for status in [json!(null), json!({}), json!({"conditions": null})] {
            let view = Conditions::from_status(&status).unwrap();
            assert_eq!(view, Conditions::new(), "{status}");
        }
        let error = Conditions::from_status(&json!({"conditions": {}})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the conditions cannot be read: status.conditions is an object, not a list"
        );
        let error = Conditions::from_status(&json!("Ready")).unwrap_err();
        assert_eq!(
            error,
            ConditionError::Malformed("the status is a string, not an object".into())
        );
    }

    #[test]
    fn the_json_view_of_an_object_observes_its_generation() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1", "generation": 7},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
        }))
        .unwrap();
        let mut view = Conditions::of(&object).unwrap().at(now());
        assert!(view.is_present_and_equal("Ready", ConditionStatus::Unknown));
        view.set("Synced", ConditionStatus::True, "Done", "")
            .unwrap();
        assert_eq!(view.find("Synced").unwrap().observed_generation, Some(7));
        let bare: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"},
        }))
        .unwrap();
        assert_eq!(Conditions::of(&bare).unwrap(), Conditions::new());
    }
}
