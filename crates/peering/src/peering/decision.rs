//! The peering decision: from a peering object's records to whether this operator pauses.
//!
//! [`decide`] is a pure function of the records, this operator's identity and priority, and the
//! time, exactly as Kopf's `process_peering_event`. [`State`] is what one peering object tells, and
//! [`State::pause_reason`] turns it into the toggle of the pause switch for the peering mode.

use jiff::Timestamp;
use serde_json::{Map, Value};

use super::records::{read_peers, Peer};
use super::PeeringMode;

/// What one peering object (one neighbourhood) tells about this operator.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    /// Nothing is known yet: the peering object has not been listed.
    Unknown,
    /// The peering object does not exist.
    NoObject,
    /// No live peer has a higher or the same priority: work.
    Free,
    /// Live peers with a higher priority: pause in their favour.
    Outranked(Vec<Peer>),
    /// Live peers with the same priority (and none higher): everyone of that priority pauses, this
    /// operator included, as there is no tie-break.
    Conflicting(Vec<Peer>),
}

impl State {
    /// Why this state pauses the operator, or None if it does not. `name` and `place` say which
    /// peering object this is, for the messages.
    pub(crate) fn pause_reason(
        &self,
        mode: PeeringMode,
        name: &str,
        place: &str,
    ) -> Option<String> {
        let mandatory = mode == PeeringMode::Mandatory;
        match self {
            State::Unknown if mandatory => {
                Some(format!("peering object `{name}` {place} is not seen yet"))
            }
            State::NoObject if mandatory => Some(format!(
                "peering object `{name}` is missing {place}; create it or run with --standalone"
            )),
            State::Unknown | State::NoObject | State::Free => None,
            State::Outranked(peers) => {
                Some(format!("Pausing operations in favour of {}", list(peers)))
            }
            State::Conflicting(peers) => Some(format!(
                "Possibly conflicting operators with the same priority: {}; pausing all operators, \
                 including self",
                list(peers)
            )),
        }
    }
}

/// The peers, for messages: `a (priority 1), b (priority 2)`.
pub(crate) fn list(peers: &[Peer]) -> String {
    peers
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What to do after a look at the peering object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    /// What the object tells: [`State::Free`], [`State::Outranked`] or [`State::Conflicting`].
    pub state: State,
    /// The identities of the dead records, to remove (this operator's own is never among them).
    pub dead: Vec<String>,
    /// Whether this operator's own record is there and alive.
    pub own_record_alive: bool,
    /// When the earliest blocking peer expires, if any blocks: the time to look again.
    pub wake_at: Option<Timestamp>,
}

/// Decides from a peering object's `status` (Kopf's `process_peering_event`): a live peer other than
/// `identity` with a higher priority outranks this operator; else one with the same priority
/// conflicts with it; else it is free. Dead records are listed for removal.
pub(crate) fn decide(
    status: Option<&Map<String, Value>>,
    identity: &str,
    priority: i64,
    now: Timestamp,
) -> Decision {
    let peers = read_peers(status, now);
    let dead = peers
        .iter()
        .filter(|p| p.is_dead(now) && p.identity != identity)
        .map(|p| p.identity.clone())
        .collect();
    let own_record_alive = peers
        .iter()
        .any(|p| p.identity == identity && !p.is_dead(now));
    let team = ring_of(identity);
    let live: Vec<&Peer> = peers
        .iter()
        .filter(|p| !p.is_dead(now) && p.identity != identity)
        // The other replicas of a sharded operator share its objects: they are not rivals.
        .filter(|p| team.is_none_or(|team| ring_of(&p.identity) != Some(team)))
        .collect();
    let higher: Vec<Peer> = live
        .iter()
        .filter(|p| p.priority > priority)
        .map(|p| (*p).clone())
        .collect();
    let same: Vec<Peer> = live
        .iter()
        .filter(|p| p.priority == priority)
        .map(|p| (*p).clone())
        .collect();
    let wake_at = higher.iter().chain(&same).map(|p| p.deadline).min();
    let state = if !higher.is_empty() {
        State::Outranked(higher)
    } else if !same.is_empty() {
        State::Conflicting(same)
    } else {
        State::Free
    };
    Decision {
        state,
        dead,
        own_record_alive,
        wake_at,
    }
}

/// The peering identity of a member of a sharded operator's ring: `ring/<ring>/<member>`. Members of
/// one ring do not pause each other; any other peer with a higher priority (or `kactor freeze`)
/// pauses the whole ring, and one with the same priority conflicts with all of it.
pub fn ring_identity(ring: &str, member: &str) -> String {
    format!("{RING_PREFIX}{ring}/{member}")
}

const RING_PREFIX: &str = "ring/";

/// Why a conflict at the same priority pauses a sharded ring and an operator outside it: one of
/// them shards the objects and the other handles them all, so they would work on the same objects.
/// None when neither side is a ring member, or both are (of different rings: plain peers).
pub(crate) fn ring_conflict(identity: &str, peers: &[Peer]) -> Option<String> {
    let outside: Vec<Peer> = match ring_of(identity) {
        Some(_) => peers
            .iter()
            .filter(|p| ring_of(&p.identity).is_none())
            .cloned()
            .collect(),
        None => peers
            .iter()
            .filter(|p| ring_of(&p.identity).is_some())
            .cloned()
            .collect(),
    };
    if outside.is_empty() {
        return None;
    }
    let fix = "run every replica with the same --shards ring, or give them different peerings or \
               priorities";
    Some(match ring_of(identity) {
        Some(ring) => format!(
            "Refusing to work: this replica shards the objects in the ring `{ring}`, and {} peer at \
             the same priority outside the ring, handling the same objects; {fix}",
            list(&outside)
        ),
        None => format!(
            "Refusing to work: {} shard the objects in a ring, and this operator peers with them at \
             the same priority outside the ring, handling the same objects; {fix}",
            list(&outside)
        ),
    })
}

/// The ring of a ring member's identity (see [`ring_identity`]).
fn ring_of(identity: &str) -> Option<&str> {
    let rest = identity.strip_prefix(RING_PREFIX)?;
    rest.split_once('/').map(|(ring, _)| ring)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const ME: &str = "me@host/20260301100000/abc";

    fn now() -> Timestamp {
        "2026-03-01T10:00:00Z".parse().unwrap()
    }

    fn record(priority: i64, seconds_ago: i64, lifetime: i64) -> Value {
        let lastseen = now() - jiff::SignedDuration::from_secs(seconds_ago);
        json!({"priority": priority, "lifetime": lifetime,
               "lastseen": super::super::records::format_lastseen(lastseen)})
    }

    fn decide_on(status: Value, priority: i64) -> Decision {
        decide(status.as_object(), ME, priority, now())
    }

    fn ids(peers: &[Peer]) -> Vec<&str> {
        peers.iter().map(|p| p.identity.as_str()).collect()
    }

    #[test]
    fn alone_is_free() {
        let decision = decide_on(json!({ME: record(0, 1, 60)}), 0);
        assert_eq!(decision.state, State::Free);
        assert!(decision.own_record_alive);
        assert_eq!(decision.wake_at, None);
        assert!(decision.dead.is_empty());
    }

    #[test]
    fn no_status_is_free_and_has_no_own_record() {
        let decision = decide(None, ME, 0, now());
        assert_eq!(decision.state, State::Free);
        assert!(!decision.own_record_alive);
    }

    #[test]
    fn a_live_peer_with_a_higher_priority_outranks() {
        let decision = decide_on(
            json!({ME: record(0, 1, 60), "other": record(100, 10, 60)}),
            0,
        );
        let State::Outranked(peers) = &decision.state else {
            panic!("{decision:?}")
        };
        assert_eq!(ids(peers), ["other"]);
        assert_eq!(
            decision.wake_at,
            Some("2026-03-01T10:00:50Z".parse().unwrap()),
            "wakes at the blocking peer's expiry"
        );
        assert_eq!(
            decision
                .state
                .pause_reason(PeeringMode::AutoDetect, "default", "cluster-wide"),
            Some("Pausing operations in favour of other (priority 100)".to_string())
        );
    }

    #[test]
    fn members_of_ones_ring_do_not_pause_it_but_others_of_the_same_priority_do() {
        let me = ring_identity("op", "a");
        let status = json!({
            me.clone(): record(0, 1, 60),
            ring_identity("op", "b"): record(0, 1, 60),
            ring_identity("op", "c"): record(5, 1, 60),
        });
        let decision = decide(status.as_object(), &me, 0, now());
        assert_eq!(decision.state, State::Free);
        let mut status = status;
        status[ring_identity("other", "a")] = record(0, 1, 60);
        status["kopf@host/20260301/xyz"] = record(0, 1, 60);
        let decision = decide(status.as_object(), &me, 0, now());
        let State::Conflicting(peers) = &decision.state else {
            panic!("{decision:?}")
        };
        assert_eq!(ids(peers), ["kopf@host/20260301/xyz", "ring/other/a"]);
        // A ring member is a plain peer to an operator outside the ring.
        let decision = decide(status.as_object(), "kopf@host/20260301/xyz", 0, now());
        assert!(
            matches!(decision.state, State::Outranked(_)),
            "{decision:?}"
        );
        // A conflict between a ring and an operator outside it says so, on both sides.
        let kopf = read_peers(
            json!({"kopf@host/20260301/xyz": record(0, 1, 60)}).as_object(),
            now(),
        );
        let ring = read_peers(
            json!({ring_identity("op", "b"): record(0, 1, 60)}).as_object(),
            now(),
        );
        let inside = ring_conflict(&me, &kopf).unwrap();
        assert!(
            inside.contains("ring `op`") && inside.contains("kopf@host"),
            "{inside}"
        );
        let outside = ring_conflict("kopf@host/20260301/xyz", &ring).unwrap();
        assert!(
            outside.contains("ring/op/b") && outside.contains("--shards"),
            "{outside}"
        );
        assert_eq!(ring_conflict("kopf@host/1/a", &kopf), None);
    }

    #[test]
    fn a_live_peer_with_a_lower_priority_does_not_pause() {
        let decision = decide_on(json!({"other": record(-5, 1, 60)}), 0);
        assert_eq!(decision.state, State::Free);
        assert_eq!(decision.wake_at, None);
    }

    #[test]
    fn a_live_peer_with_the_same_priority_conflicts() {
        let decision = decide_on(json!({ME: record(7, 1, 60), "twin": record(7, 1, 60)}), 7);
        let State::Conflicting(peers) = &decision.state else {
            panic!("{decision:?}")
        };
        assert_eq!(ids(peers), ["twin"]);
        let reason = decision
            .state
            .pause_reason(PeeringMode::AutoDetect, "default", "cluster-wide")
            .unwrap();
        assert!(reason.starts_with("Possibly conflicting operators with the same priority: twin"));
    }

    #[test]
    fn a_higher_peer_wins_over_a_same_priority_peer_and_both_set_the_wake_up() {
        let decision = decide_on(
            json!({"twin": record(0, 50, 60), "boss": record(9, 0, 60)}),
            0,
        );
        assert!(matches!(&decision.state, State::Outranked(p) if ids(p) == ["boss"]));
        assert_eq!(
            decision.wake_at,
            Some("2026-03-01T10:00:10Z".parse().unwrap()),
            "the earliest blocking expiry, of whichever kind"
        );
    }

    #[test]
    fn dead_peers_neither_pause_nor_stay() {
        let decision = decide_on(
            json!({ME: record(0, 1, 60), "ghost": record(100, 61, 60), "gone": record(0, 60, 60)}),
            0,
        );
        assert_eq!(decision.state, State::Free);
        assert_eq!(decision.dead, ["ghost", "gone"]);
    }

    #[test]
    fn an_own_dead_record_is_not_removed_but_reported_as_not_alive() {
        let decision = decide_on(json!({ME: record(0, 120, 60)}), 0);
        assert!(decision.dead.is_empty());
        assert!(!decision.own_record_alive);
    }

    #[test]
    fn own_record_never_pauses_whatever_its_priority() {
        let decision = decide_on(json!({ME: record(1000, 1, 60)}), 0);
        assert_eq!(decision.state, State::Free);
    }

    #[test]
    fn a_record_without_lastseen_is_always_alive() {
        let decision = decide_on(json!({"odd": {"priority": 3}}), 0);
        assert!(matches!(decision.state, State::Outranked(_)));
        assert_eq!(
            decision.wake_at,
            Some("2026-03-01T10:01:00Z".parse().unwrap())
        );
    }

    #[test]
    fn mandatory_mode_pauses_while_the_object_is_unseen_or_missing() {
        for state in [State::Unknown, State::NoObject] {
            assert!(state
                .pause_reason(PeeringMode::Mandatory, "default", "in namespace ns1")
                .is_some());
            assert_eq!(
                state.pause_reason(PeeringMode::AutoDetect, "default", "in namespace ns1"),
                None
            );
        }
        assert_eq!(
            State::Free.pause_reason(PeeringMode::Mandatory, "default", "cluster-wide"),
            None
        );
    }
}
