//! The keep-alive records in a peering object's `status`, as Kopf writes and reads them
//! (`reference/kopf.md` §2.8):
//!
//! ```yaml
//! status:
//!   <identity>:
//!     priority: 0                                   # int
//!     lifetime: 60                                  # int seconds
//!     lastseen: "2026-03-01T10:00:00.123456+00:00"  # Python's datetime.now(utc).isoformat()
//! ```
//!
//! Writing is exact; reading is tolerant, as Kopf's `Peer(**record)`: a missing lifetime is 60 s, a
//! missing lastseen is now, unknown fields are ignored.

use std::fmt;
use std::time::Duration;

use jiff::{civil, tz::TimeZone, SignedDuration, Timestamp};
use serde_json::{json, Map, Value};

/// The lifetime of a record that does not say (Kopf's hard-coded fallback).
const DEFAULT_LIFETIME_SECS: i64 = 60;

/// This operator's own record, as written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    /// The priority.
    pub priority: i64,
    /// The lifetime in whole seconds.
    pub lifetime: i64,
    /// When it is written.
    pub lastseen: Timestamp,
}

impl Record {
    /// A record written now. The lifetime is in whole seconds, as Kopf's `int`.
    pub(crate) fn now(priority: i64, lifetime: Duration) -> Record {
        Record {
            priority,
            lifetime: i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX),
            lastseen: Timestamp::now(),
        }
    }

    /// What goes under `status.<identity>`: the record, or null for a record that is dead as it is
    /// written (a lifetime of 0, as Kopf's `resume` writes), which removes it.
    pub(crate) fn as_patch_value(&self) -> Value {
        if self.lifetime <= 0 {
            return Value::Null;
        }
        json!({
            "priority": self.priority,
            "lifetime": self.lifetime,
            "lastseen": format_lastseen(self.lastseen),
        })
    }
}

/// A peer as read from the peering object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Peer {
    /// The key of its record.
    pub identity: String,
    /// Its priority (0 if the record does not say).
    pub priority: i64,
    /// When its record expires: `lastseen + lifetime`.
    pub deadline: Timestamp,
}

impl Peer {
    /// Reads one record; `None` if it is not an object at all (which Kopf could not read either).
    pub(crate) fn read(identity: &str, record: &Value, now: Timestamp) -> Option<Peer> {
        let record = record.as_object()?;
        let priority = record.get("priority").and_then(integer).unwrap_or(0);
        let lifetime = record
            .get("lifetime")
            .and_then(integer)
            .unwrap_or(DEFAULT_LIFETIME_SECS);
        let lastseen = record
            .get("lastseen")
            .and_then(Value::as_str)
            .and_then(parse_lastseen)
            .unwrap_or(now);
        let deadline = lastseen
            .checked_add(SignedDuration::from_secs(lifetime))
            .unwrap_or(if lifetime < 0 {
                Timestamp::MIN
            } else {
                Timestamp::MAX
            });
        Some(Peer {
            identity: identity.to_string(),
            priority,
            deadline,
        })
    }

    /// Whether its record has expired (Kopf: `deadline <= now`).
    pub(crate) fn is_dead(&self, now: Timestamp) -> bool {
        self.deadline <= now
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (priority {})", self.identity, self.priority)
    }
}

/// Every record of a peering object's status, in key order; entries that are not objects are skipped.
pub(crate) fn read_peers(status: Option<&Map<String, Value>>, now: Timestamp) -> Vec<Peer> {
    status
        .into_iter()
        .flatten()
        .filter_map(|(identity, record)| Peer::read(identity, record, now))
        .collect()
}

/// An integer as Python's `int()` takes it: an integer, a float (truncated) or a numeric string.
fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite())
                .map(|f| f.trunc().clamp(i64::MIN as f64, i64::MAX as f64) as i64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(i64::from(*b)),
        _ => None,
    }
}

/// `lastseen` as Kopf writes it: Python's `datetime.now(timezone.utc).isoformat()`, always with
/// microseconds here (Python omits them when they are zero; every reader takes both).
pub(crate) fn format_lastseen(at: Timestamp) -> String {
    let utc = at.to_zoned(TimeZone::UTC).datetime();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        utc.year(),
        utc.month(),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second(),
        utc.subsec_nanosecond() / 1_000,
    )
}

/// An ISO-8601 time as Kopf's `iso8601.parse_date` takes it: with an offset or `Z`, or without one
/// (then UTC).
pub(crate) fn parse_lastseen(text: &str) -> Option<Timestamp> {
    let text = text.trim();
    if let Ok(at) = text.parse::<Timestamp>() {
        return Some(at);
    }
    let civil: civil::DateTime = text.parse().ok()?;
    civil.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp())
}

/// Whether the API said 404: the peering object (or its resource) is not there.
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// `cluster-wide` or `in namespace NS`, for messages.
pub(crate) fn place(namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => format!("in namespace {namespace}"),
        None => "cluster-wide".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn lastseen_is_written_as_pythons_isoformat_with_microseconds() {
        assert_eq!(
            format_lastseen(at("2026-03-01T10:00:00.123456789Z")),
            "2026-03-01T10:00:00.123456+00:00"
        );
        assert_eq!(
            format_lastseen(at("2026-03-01T10:00:00Z")),
            "2026-03-01T10:00:00.000000+00:00"
        );
    }

    #[test]
    fn lastseen_is_read_with_or_without_an_offset_or_fraction() {
        let expected = at("2026-03-01T10:00:00.123456Z");
        for text in [
            "2026-03-01T10:00:00.123456+00:00",
            "2026-03-01T10:00:00.123456Z",
            "2026-03-01T12:00:00.123456+02:00",
            "2026-03-01T10:00:00.123456",
        ] {
            assert_eq!(parse_lastseen(text), Some(expected), "{text}");
        }
        assert_eq!(
            parse_lastseen("2026-03-01T10:00:00+00:00"),
            Some(at("2026-03-01T10:00:00Z"))
        );
        assert_eq!(parse_lastseen("yesterday"), None);
    }

    #[test]
    fn a_record_is_written_with_kopfs_fields_and_types() {
        let record = Record {
            priority: 100,
            lifetime: 60,
            lastseen: at("2026-03-01T10:00:00.5Z"),
        };
        let value = record.as_patch_value();
        assert_eq!(
            value,
            json!({"priority": 100, "lifetime": 60, "lastseen": "2026-03-01T10:00:00.500000+00:00"})
        );
        assert!(value["priority"].is_i64() && value["lifetime"].is_i64());
        let gone = Record {
            lifetime: 0,
            ..record
        };
        assert_eq!(gone.as_patch_value(), Value::Null);
    }

    #[test]
    fn a_record_without_lifetime_lives_60_s_and_without_lastseen_is_seen_now() {
        let now = at("2026-03-01T10:00:00Z");
        let peer = Peer::read("a", &json!({"priority": 5}), now).unwrap();
        assert_eq!(peer.priority, 5);
        assert_eq!(peer.deadline, at("2026-03-01T10:01:00Z"));
        let peer = Peer::read("b", &json!({}), now).unwrap();
        assert_eq!(peer.priority, 0);
        assert!(!peer.is_dead(now));
    }

    #[test]
    fn records_are_read_tolerantly() {
        let now = at("2026-03-01T10:00:00Z");
        let peer = Peer::read(
            "a",
            &json!({"priority": "7", "lifetime": 30.9, "lastseen": "2026-03-01T09:59:40+00:00", "namespace": "x"}),
            now,
        )
        .unwrap();
        assert_eq!(peer.priority, 7);
        assert_eq!(peer.deadline, at("2026-03-01T10:00:10Z"));
        assert_eq!(Peer::read("junk", &json!("text"), now), None);
        let status = json!({"a": {"priority": 1}, "junk": 3, "b": {"priority": 2}});
        let peers = read_peers(status.as_object(), now);
        let ids: Vec<&str> = peers.iter().map(|p| p.identity.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
    }

    #[test]
    fn a_record_is_dead_exactly_at_its_deadline() {
        let now = at("2026-03-01T10:00:00Z");
        let record = json!({"lifetime": 60, "lastseen": "2026-03-01T09:59:00+00:00"});
        assert!(Peer::read("a", &record, now).unwrap().is_dead(now));
        let record = json!({"lifetime": 60, "lastseen": "2026-03-01T09:59:00.000001+00:00"});
        assert!(!Peer::read("a", &record, now).unwrap().is_dead(now));
    }

    /// Garbage in a peering object (written by anyone with access to it): every record is read
    /// or skipped, never a panic, whatever its priority, lifetime and lastseen hold.
    mod garbage {
        use super::*;
        use proptest::prelude::*;

        fn any_field() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(Value::from),
                any::<String>().prop_map(Value::from),
                Just(json!("9223372036854775807")),
                Just(json!("-9223372036854775808")),
                Just(json!("2026-03-01T10:00:00")),
                Just(json!("99999-01-01T00:00:00+00:00")),
                prop::collection::vec(any::<i64>(), 0..3).prop_map(Value::from),
            ]
        }

        fn any_record() -> impl Strategy<Value = Value> {
            prop_oneof![
                any_field(),
                (any_field(), any_field(), any_field()).prop_map(
                    |(priority, lifetime, lastseen)| {
                        json!({"priority": priority, "lifetime": lifetime, "lastseen": lastseen})
                    }
                ),
            ]
        }

        proptest! {
            #[test]
            fn any_status_is_read_record_by_record(
                status in prop::collection::btree_map(any::<String>(), any_record(), 0..8),
                now in any::<i64>(),
            ) {
                let status: Map<String, Value> = status.into_iter().collect();
                let now = Timestamp::from_second(now.rem_euclid(250_000_000_000) - 125_000_000_000)
                    .unwrap_or(Timestamp::UNIX_EPOCH);
                let peers = read_peers(Some(&status), now);
                prop_assert!(peers.len() <= status.len());
                for peer in &peers {
                    let _ = peer.is_dead(now);
                    let _ = peer.to_string();
                }
            }

            #[test]
            fn any_lastseen_is_a_time_or_absent(text in any::<String>()) {
                let _ = parse_lastseen(&text);
            }
        }
    }
}
