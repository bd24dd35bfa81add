//! The handlers' progress records, in the wire format of Kopf's `SmartProgressStorage`: one
//! compact-JSON annotation per handler (`kopf.zalando.org/<handler-id>`), with the legacy
//! `status.kopf.progress.<handler-id>` objects still read and purged; and the touch annotation
//! (`kopf.zalando.org/touch-dummy`) that provokes a new watch event after a delay.
//!
//! Records written by kactor are byte-identical to Kopf's, and records written by any Kopf
//! version since 0.2x are read, so an operator can move between the two mid-flight.
//!
//! This module also holds the JSON writer that reproduces Python's
//! `json.dumps(..., separators=(',', ':'))` byte for byte (ASCII-only output, Python's float
//! formatting), shared with [`crate::storage::diffbase`].

use jiff::tz::TimeZone;
use jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::structs::diffs::{ensure, remove, resolve};
use crate::structs::keys::KeyForming;

/// Why a stored progress record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The annotation is not JSON at all.
    #[error("the progress record is not valid JSON: {0}")]
    InvalidJson(#[from] serde_json::Error),
    /// The JSON is not an object (e.g. `[]` or `"text"`).
    #[error("the progress record is not a JSON object but {found}")]
    NotAnObject {
        /// The JSON type found instead: `an array`, `a string`, ...
        found: &'static str,
    },
    /// A known key holds a value of the wrong type.
    #[error("the progress record's `{key}` is not {expected}")]
    WrongType {
        /// The record key, e.g. `retries`.
        key: &'static str,
        /// What it should be, e.g. `a non-negative integer`.
        expected: &'static str,
    },
    /// A timestamp key holds a string that is not an ISO-8601 timestamp.
    #[error("the progress record's `{key}` is not an ISO-8601 timestamp: {value:?}")]
    BadTimestamp {
        /// The record key, e.g. `delayed`.
        key: &'static str,
        /// The text found.
        value: String,
    },
}

/// The persisted state of one handler for the cause being handled, as Kopf's `ProgressRecord`.
///
/// Every key is optional, since other Kopf versions write other subsets; a key missing and a
/// key with `null` are the same.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ProgressRecord {
    /// When the handler was first attempted.
    pub started: Option<Timestamp>,
    /// When the handler succeeded or permanently failed.
    pub stopped: Option<Timestamp>,
    /// When the handler is to be retried (after an error or a requested delay).
    pub delayed: Option<Timestamp>,
    /// The cause the record is for: `create`, `update`, `delete` or `resume`.
    pub purpose: Option<String>,
    /// How many attempts were made.
    pub retries: Option<u32>,
    /// Whether the handler has succeeded (a final state).
    pub success: Option<bool>,
    /// Whether the handler has permanently failed (a final state).
    pub failure: Option<bool>,
    /// The message of the last error.
    pub message: Option<String>,
    /// The ids of the handler's sub-handlers, of any depth.
    pub subrefs: Option<Vec<String>>,
}

impl ProgressRecord {
    /// Parses a record from its annotation text. Unknown keys are ignored (a newer Kopf may add
    /// some); timestamps may be naive (as Kopf before 1.37 wrote them; taken as UTC), `Z` or with
    /// an offset; a known key with a value of the wrong type is an error.
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        Self::from_value(&serde_json::from_str(text)?)
    }

    /// Reads a record from a JSON object, as found in the legacy `status.kopf.progress.<id>`.
    /// The same rules as [`ProgressRecord::parse`] apply.
    pub fn from_value(value: &Value) -> Result<Self, FormatError> {
        let Value::Object(object) = value else {
            return Err(FormatError::NotAnObject {
                found: json_type(value),
            });
        };
        let get = |key: &str| object.get(key).filter(|v| !v.is_null());
        let timestamp = |key: &'static str| -> Result<Option<Timestamp>, FormatError> {
            match get(key) {
                None => Ok(None),
                Some(Value::String(text)) => {
                    parse_timestamp(text)
                        .map(Some)
                        .ok_or_else(|| FormatError::BadTimestamp {
                            key,
                            value: text.clone(),
                        })
                }
                Some(_) => Err(FormatError::WrongType {
                    key,
                    expected: "a timestamp string",
                }),
            }
        };
        let string = |key: &'static str| -> Result<Option<String>, FormatError> {
            match get(key) {
                None => Ok(None),
                Some(Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => Err(FormatError::WrongType {
                    key,
                    expected: "a string",
                }),
            }
        };
        let boolean = |key: &'static str| -> Result<Option<bool>, FormatError> {
            match get(key) {
                None => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(_) => Err(FormatError::WrongType {
                    key,
                    expected: "a boolean",
                }),
            }
        };
        let retries = match get("retries") {
            None => None,
            Some(v) => Some(v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or(
                FormatError::WrongType {
                    key: "retries",
                    expected: "a non-negative integer",
                },
            )?),
        };
        let subrefs = match get("subrefs") {
            None => None,
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|item| item.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(FormatError::WrongType {
                        key: "subrefs",
                        expected: "a list of strings",
                    })?,
            ),
            Some(_) => {
                return Err(FormatError::WrongType {
                    key: "subrefs",
                    expected: "a list of strings",
                })
            }
        };
        Ok(Self {
            started: timestamp("started")?,
            stopped: timestamp("stopped")?,
            delayed: timestamp("delayed")?,
            purpose: string("purpose")?,
            retries,
            success: boolean("success")?,
            failure: boolean("failure")?,
            message: string("message")?,
            subrefs,
        })
    }

    /// The annotation text, byte-identical to Kopf's: compact JSON with the keys in Kopf's order
    /// (`started`, `stopped`, `delayed`, `purpose`, `retries`, `success`, `failure`, `message`,
    /// `subrefs`), unset keys left out, `subrefs` sorted and left out when empty, non-ASCII
    /// escaped as `\uXXXX`, and timestamps as `2026-03-01T10:00:00.123456+00:00`.
    pub fn to_annotation(&self) -> String {
        let mut fields: Vec<(&str, Value)> = Vec::new();
        let mut timestamp = |key, t: Option<Timestamp>| {
            if let Some(t) = t {
                fields.push((key, Value::String(format_timestamp(t))));
            }
        };
        timestamp("started", self.started);
        timestamp("stopped", self.stopped);
        timestamp("delayed", self.delayed);
        if let Some(purpose) = &self.purpose {
            fields.push(("purpose", Value::from(purpose.as_str())));
        }
        if let Some(retries) = self.retries {
            fields.push(("retries", Value::from(retries)));
        }
        if let Some(success) = self.success {
            fields.push(("success", Value::Bool(success)));
        }
        if let Some(failure) = self.failure {
            fields.push(("failure", Value::Bool(failure)));
        }
        if let Some(message) = &self.message {
            fields.push(("message", Value::from(message.as_str())));
        }
        if let Some(subrefs) = self.subrefs.as_ref().filter(|s| !s.is_empty()) {
            let mut sorted = subrefs.clone();
            sorted.sort();
            fields.push(("subrefs", Value::from(sorted)));
        }

        let mut out = String::from("{");
        for (index, (key, value)) in fields.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            write_json_str(key, &mut out);
            out.push(':');
            write_json(value, &mut out);
        }
        out.push('}');
        out
    }

    /// Whether the handler is finished: succeeded or permanently failed.
    pub fn is_done(&self) -> bool {
        self.success == Some(true) || self.failure == Some(true)
    }

    /// Whether the handler is not finished and must not be retried before `delayed`.
    pub fn is_waiting(&self, now: Timestamp) -> bool {
        !self.is_done() && self.delayed.is_some_and(|delayed| delayed > now)
    }
}

/// Where and how the handlers' progress is stored, as Kopf's default `SmartProgressStorage`:
/// written to annotations, read from annotations and then from the legacy status field, purged
/// from both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressStorage {
    /// The annotation keys (prefix, V1 keys).
    pub keys: KeyForming,
    /// The name of the touch annotation (default `touch-dummy`, as in Kopf).
    pub touch_key: String,
    /// The path of the legacy progress objects inside `status` (default `["kopf", "progress"]`,
    /// as in Kopf). Only read and purged, never written, as in Kopf since 1.44.
    pub status_field: Vec<String>,
}

impl Default for ProgressStorage {
    /// As in Kopf: prefix `kopf.zalando.org` with V1 keys, `touch-dummy`, `status.kopf.progress`.
    fn default() -> Self {
        Self {
            keys: KeyForming::default(),
            touch_key: "touch-dummy".to_string(),
            status_field: vec!["kopf".to_string(), "progress".to_string()],
        }
    }
}

impl ProgressStorage {
    /// The record of a handler: from the annotations first (V2 key, then V1), then from the
    /// legacy `status.kopf.progress.<handler-id>`.
    ///
    /// A `null` is absent, as in Kopf. Garbage (invalid JSON, not an object, a known key of the
    /// wrong type) is logged as a warning and treated as absent, and the next place is tried;
    /// Kopf would fail the processing of the object instead, for good.
    pub fn fetch(&self, body: &DynamicObject, handler_id: &str) -> Option<ProgressRecord> {
        let annotations = body.metadata.annotations.as_ref();
        for key in self.keys.each(handler_id) {
            let Some(text) = annotations.and_then(|a| a.get(&key)) else {
                continue;
            };
            let parsed = serde_json::from_str::<Value>(text)
                .map_err(FormatError::from)
                .and_then(|value| match value {
                    Value::Null => Ok(None),
                    value => ProgressRecord::from_value(&value).map(Some),
                });
            match parsed {
                Ok(Some(record)) => return Some(record),
                Ok(None) => {}
                Err(error) => tracing::warn!(
                    handler = handler_id,
                    key = %key,
                    %error,
                    "Ignoring the unreadable progress annotation {key}; the handler's progress there is treated as absent."
                ),
            }
        }

        let field = self.status_path(handler_id);
        match resolve(&body.data, &field).filter(|v| !v.is_null()) {
            None => None,
            Some(value) => match ProgressRecord::from_value(value) {
                Ok(record) => Some(record),
                Err(error) => {
                    let field = field.join(".");
                    tracing::warn!(
                        handler = handler_id,
                        field = %field,
                        %error,
                        "Ignoring the unreadable progress in {field}; the handler's progress there is treated as absent."
                    );
                    None
                }
            },
        }
    }

    /// Adds the record to a JSON merge patch under every key of the handler (V2, and V1 if it
    /// differs), plus the `<prefix>/kopf-managed: "yes"` marker for a non-Kopf prefix.
    ///
    /// Kopf skips the marker when the body already has it; this function has no body, so it
    /// writes the marker every time (the same value, so the object is the same).
    pub fn store(&self, handler_id: &str, record: &ProgressRecord, patch: &mut Value) {
        let encoded = record.to_annotation();
        for key in self.keys.each(handler_id) {
            ensure(
                patch,
                &annotation_path(&key),
                Value::String(encoded.clone()),
            );
        }
        self.store_marker(None, patch);
    }

    /// Adds to a merge patch the removal (`null`) of the handler's record, as Kopf's `purge`:
    /// for each of the handler's annotation keys present on the body, and for
    /// `status.kopf.progress.<handler-id>` if present. A key absent on the body but already in
    /// the patch (stored earlier in this cycle) is taken out of the patch instead.
    pub fn purge(&self, body: &DynamicObject, handler_id: &str, patch: &mut Value) {
        let annotations = body.metadata.annotations.as_ref();
        for key in self.keys.each(handler_id) {
            let path = annotation_path(&key);
            if annotations.is_some_and(|a| a.contains_key(&key)) {
                ensure(patch, &path, Value::Null);
            } else if resolve(patch, &path).is_some() {
                remove(patch, &path);
            }
        }

        // The body's `status` is in `data`, the patch's is at the top: the same path in both.
        let path = self.status_path(handler_id);
        if resolve(&body.data, &path).is_some() {
            ensure(patch, &path, Value::Null);
        } else if resolve(patch, &path).is_some() {
            remove(patch, &path);
        }
    }

    /// Adds the touch annotation with the time `now` to a merge patch (and the marker for a
    /// non-Kopf prefix), to provoke a new watch event, as Kopf does after a delay has been slept.
    pub fn touch(&self, patch: &mut Value, now: Timestamp) {
        let value = Value::String(format_timestamp(now));
        for key in self.keys.each(&self.touch_key) {
            ensure(patch, &annotation_path(&key), value.clone());
        }
        self.store_marker(None, patch);
    }

    /// Adds the removal (`null`) of the touch annotation to a merge patch if the body has it
    /// (with a non-null value), as Kopf does on every real patch (and, as Kopf, the marker too).
    pub fn clear_touch(&self, body: &DynamicObject, patch: &mut Value) {
        let annotations = body.metadata.annotations.as_ref();
        for key in self.keys.each(&self.touch_key) {
            if annotations.is_some_and(|a| a.contains_key(&key)) {
                ensure(patch, &annotation_path(&key), Value::Null);
                self.store_marker(Some(body), patch);
            }
        }
    }

    /// `status.<status_field…>.<handler_id>`, borrowed from `self` and the id.
    fn status_path<'a>(&'a self, handler_id: &'a str) -> Vec<&'a str> {
        let mut path = Vec::with_capacity(self.status_field.len() + 2);
        path.push("status");
        path.extend(self.status_field.iter().map(String::as_str));
        path.push(handler_id);
        path
    }

    fn store_marker(&self, body: Option<&DynamicObject>, patch: &mut Value) {
        store_marker(&self.keys, body, patch);
    }

    /// What [`store`](Self::store) leaves in a merge patch once [`purge`](Self::purge) has taken
    /// the record out again in the same cycle: the marker of a non-Kopf prefix (Kopf's purge
    /// keeps it). A cycle that finishes its handlers calls this instead of encoding records that
    /// would not be sent.
    pub fn mark(&self, patch: &mut Value) {
        self.store_marker(None, patch);
    }
}

/// Adds `<prefix>/kopf-managed: "yes"` to the patch for a non-Kopf prefix, unless the body or
/// the patch has it already, as Kopf's `_store_marker`.
pub(crate) fn store_marker(keys: &KeyForming, body: Option<&DynamicObject>, patch: &mut Value) {
    let Some(marker) = keys.marker() else {
        return;
    };
    let on_body = body
        .and_then(|b| b.metadata.annotations.as_ref())
        .is_some_and(|a| a.contains_key(&marker));
    let path = annotation_path(&marker);
    if !on_body && resolve(patch, &path).is_none() {
        ensure(patch, &path, Value::from("yes"));
    }
}

pub(crate) fn annotation_path(key: &str) -> [&str; 3] {
    ["metadata", "annotations", key]
}

/// A timestamp as Kopf writes it: Python's `isoformat(timespec='microseconds')` of an aware UTC
/// datetime, e.g. `2026-03-01T10:00:00.123456+00:00`. Nanoseconds are truncated.
pub fn format_timestamp(t: Timestamp) -> String {
    let dt = t.to_zoned(TimeZone::UTC).datetime();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.subsec_nanosecond() / 1000,
    )
}

/// Parses a timestamp as Kopf reads them: ISO-8601 with `Z` or a `±hh:mm` offset, or naive
/// (no offset, as Kopf before 1.37 wrote them), which is taken as UTC. `None` if unparseable.
///
/// Kopf keeps a non-UTC offset as it was and writes it back; kactor converts to UTC, so such a
/// record is rewritten with `+00:00` (the same instant).
pub fn parse_timestamp(s: &str) -> Option<Timestamp> {
    if let Ok(t) = s.parse::<Timestamp>() {
        return Some(t);
    }
    let naive = s.parse::<jiff::civil::DateTime>().ok()?;
    naive.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp())
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Writes `value` as Python's `json.dumps(value, separators=(',', ':'))` would: no spaces,
/// ASCII only, Python's float formatting, object keys in the map's (sorted) order.
pub(crate) fn write_json(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                out.push_str(&python_float(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Value::String(s) => write_json_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Object(object) => {
            out.push('{');
            for (index, (key, item)) in object.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_json_str(key, out);
                out.push(':');
                write_json(item, out);
            }
            out.push('}');
        }
    }
}

/// A JSON string as Python's `json.dumps` with `ensure_ascii=True` writes it.
pub(crate) fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-tripping digits, in positional notation for
/// decimal exponents from -4 to 15, else scientific with a signed two-digit exponent (`1e+20`).
fn python_float(f: f64) -> String {
    if !f.is_finite() {
        // serde_json cannot hold these; Python would write NaN/Infinity.
        return if f.is_nan() {
            "NaN".to_string()
        } else if f > 0.0 {
            "Infinity".to_string()
        } else {
            "-Infinity".to_string()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-tripping digits, e.g. `-1.5e-5`.
    let scientific = format!("{:e}", f.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    let point = exponent + 1; // where the decimal point goes, counted in digits
    let body = if !(-3..=16).contains(&point) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        format!("{first}{fraction}e{exponent:+03}")
    } else if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn body_with(annotations: &[(&str, &str)], data: Value) -> DynamicObject {
        let mut body: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": "x"}
        }))
        .unwrap();
        if !annotations.is_empty() {
            body.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            );
        }
        body.data = data;
        body
    }

    #[test]
    fn timestamps_are_formatted_with_microseconds_and_utc_offset() {
        let t = ts("2026-03-01T10:00:00.123456789Z");
        assert_eq!(format_timestamp(t), "2026-03-01T10:00:00.123456+00:00");
        assert_eq!(
            format_timestamp(ts("2026-03-01T10:00:00Z")),
            "2026-03-01T10:00:00.000000+00:00"
        );
    }

    #[test]
    fn naive_timestamps_are_taken_as_utc() {
        assert_eq!(
            parse_timestamp("2020-02-14T16:58:25.396364"),
            Some(ts("2020-02-14T16:58:25.396364Z"))
        );
        assert_eq!(
            parse_timestamp("2020-02-14T16:58:25.5-01:30"),
            Some(ts("2020-02-14T18:28:25.5Z"))
        );
        assert_eq!(
            parse_timestamp("2020-02-14 16:58:25.396364"),
            Some(ts("2020-02-14T16:58:25.396364Z"))
        );
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    #[test]
    fn unset_keys_are_left_out_of_the_annotation() {
        let record = ProgressRecord {
            retries: Some(0),
            success: Some(false),
            ..Default::default()
        };
        assert_eq!(record.to_annotation(), r#"{"retries":0,"success":false}"#);
    }

    #[test]
    fn empty_subrefs_are_left_out_and_others_sorted() {
        let mut record = ProgressRecord {
            subrefs: Some(vec![]),
            ..Default::default()
        };
        assert_eq!(record.to_annotation(), "{}");
        record.subrefs = Some(vec!["b".into(), "a".into()]);
        assert_eq!(record.to_annotation(), r#"{"subrefs":["a","b"]}"#);
    }

    #[test]
    fn a_record_is_waiting_only_until_delayed_and_while_not_done() {
        let mut record = ProgressRecord {
            delayed: Some(ts("2026-03-01T10:01:00Z")),
            ..Default::default()
        };
        assert!(record.is_waiting(ts("2026-03-01T10:00:00Z")));
        assert!(!record.is_waiting(ts("2026-03-01T10:01:00Z")));
        record.success = Some(true);
        assert!(record.is_done());
        assert!(!record.is_waiting(ts("2026-03-01T10:00:00Z")));
    }

    #[test]
    fn wrong_types_are_errors() {
        assert!(matches!(
            ProgressRecord::parse(r#"{"retries":"x"}"#),
            Err(FormatError::WrongType { key: "retries", .. })
        ));
        assert!(matches!(
            ProgressRecord::parse(r#"{"retries":-1}"#),
            Err(FormatError::WrongType { key: "retries", .. })
        ));
        assert!(matches!(
            ProgressRecord::parse("[]"),
            Err(FormatError::NotAnObject { found: "an array" })
        ));
        assert!(matches!(
            ProgressRecord::parse(r#"{"started":"soon"}"#),
            Err(FormatError::BadTimestamp { key: "started", .. })
        ));
        assert!(matches!(
            ProgressRecord::parse("{"),
            Err(FormatError::InvalidJson(_))
        ));
    }

    #[test]
    fn fetch_prefers_annotations_over_status() {
        let body = body_with(
            &[("kopf.zalando.org/fn", r#"{"retries":2}"#)],
            json!({"status": {"kopf": {"progress": {"fn": {"retries": 5}}}}}),
        );
        let record = ProgressStorage::default().fetch(&body, "fn").unwrap();
        assert_eq!(record.retries, Some(2));
    }

    #[test]
    fn fetch_falls_back_to_the_legacy_status() {
        let body = body_with(
            &[],
            json!({"status": {"kopf": {"progress": {"fn/sub": {"retries": 5}}}}}),
        );
        let record = ProgressStorage::default().fetch(&body, "fn/sub").unwrap();
        assert_eq!(record.retries, Some(5));
    }

    #[test]
    fn garbage_in_annotations_falls_through_to_the_next_place() {
        let body = body_with(
            &[("kopf.zalando.org/fn", "not json")],
            json!({"status": {"kopf": {"progress": {"fn": {"retries": 5}}}}}),
        );
        let record = ProgressStorage::default().fetch(&body, "fn").unwrap();
        assert_eq!(record.retries, Some(5));
    }

    #[test]
    fn store_writes_every_key_and_the_marker() {
        let storage = ProgressStorage {
            keys: KeyForming::new("my-op.example.com").unwrap(),
            ..Default::default()
        };
        let mut patch = json!({});
        let record = ProgressRecord {
            retries: Some(1),
            ..Default::default()
        };
        storage.store(&"x".repeat(50), &record, &mut patch);
        let annotations = patch["metadata"]["annotations"].as_object().unwrap();
        assert_eq!(annotations.len(), 3);
        assert_eq!(annotations["my-op.example.com/kopf-managed"], "yes");
    }

    #[test]
    fn purge_nulls_present_keys_and_unstores_patched_ones() {
        let body = body_with(
            &[("kopf.zalando.org/a", "{}")],
            json!({"status": {"kopf": {"progress": {"a": {}}}}}),
        );
        let storage = ProgressStorage::default();
        let mut patch = json!({"metadata": {"annotations": {"kopf.zalando.org/b": "{}"}}});
        storage.purge(&body, "a", &mut patch);
        storage.purge(&body, "b", &mut patch);
        storage.purge(&body, "c", &mut patch);
        assert_eq!(
            patch,
            json!({
                "metadata": {"annotations": {"kopf.zalando.org/a": null}},
                "status": {"kopf": {"progress": {"a": null}}},
            })
        );
    }

    #[test]
    fn touch_sets_and_clear_touch_resets_the_dummy() {
        let storage = ProgressStorage::default();
        let mut patch = json!({});
        storage.touch(&mut patch, ts("2026-03-01T10:00:00Z"));
        assert_eq!(
            patch,
            json!({"metadata": {"annotations": {
                "kopf.zalando.org/touch-dummy": "2026-03-01T10:00:00.000000+00:00"}}})
        );

        let mut patch = json!({});
        storage.clear_touch(&body_with(&[], Value::Null), &mut patch);
        assert_eq!(patch, json!({}));
        let body = body_with(&[("kopf.zalando.org/touch-dummy", "x")], Value::Null);
        storage.clear_touch(&body, &mut patch);
        assert_eq!(
            patch,
            json!({"metadata": {"annotations": {"kopf.zalando.org/touch-dummy": null}}})
        );
    }

    #[test]
    fn floats_are_written_as_python_does() {
        let cases = [
            (1.5, "1.5"),
            (1e20, "1e+20"),
            (1e-7, "1e-07"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-300, "-2.5e-300"),
            (123.456, "123.456"),
            (1.0, "1.0"),
            (0.1, "0.1"),
        ];
        for (f, expected) in cases {
            assert_eq!(python_float(f), expected, "{f}");
        }
    }

    #[test]
    fn strings_are_escaped_to_ascii_as_python_does() {
        let mut out = String::new();
        write_json_str("a\"\\\n\t\u{7f}\u{1}ü🦀", &mut out);
        assert_eq!(out, r#""a\"\\\n\t\u007f\u0001\u00fc\ud83e\udd80""#);
    }
}
