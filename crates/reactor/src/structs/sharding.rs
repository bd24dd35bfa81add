//! Sharding (kactor's addition): where this replica stands in a ring of replicas that share one
//! operator's objects, and the write fence that keeps a replica whose objects moved from writing them.
//!
//! An object belongs to the replica its label `shard.kactor.dev/<ring>` names; the ring's assigner
//! writes it, and asks the owner to hand the object over by adding `drain.kactor.dev/<ring>: "true"`.
//! [`Shard`] is one replica's view: which objects are its own ([`Shard::standing`]), the label
//! selector its watches use ([`Shard::selector`]), the JSON-Patch `test` operations every write to an
//! object carries ([`Shard::fence`]), and the handover patch ([`Shard::release`]).
//!
//! **The fence**: the API server applies a JSON patch only if all its `test`s pass, atomically with the
//! write. A replica that was paused, partitioned or simply late, and whose object moved meanwhile,
//! gets 422 instead of a write: the label no longer names it, or the drain label is there. A `test`
//! with the value `null` passes where the key is absent (as the API server's JSON-patch library
//! reads it; the emulator does the same). Only writes to the object itself are fenced: side effects
//! elsewhere (other objects, external systems) are not, so handlers stay idempotent.
//!
//! Merge patches cannot carry tests, so a fenced write goes as a JSON patch made from the merge
//! patch and the object as last seen ([`merge_to_ops`]): a key added where its parent is missing is
//! guarded by a `test` of that parent's absence, so a concurrent writer's map is never replaced.

use std::sync::atomic::{AtomicU64, Ordering};

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation};
use kube::api::DynamicObject;
use serde_json::{Map, Value};

/// The label that names an object's owner in the ring `<ring>`: `shard.kactor.dev/<ring>`.
pub const SHARD_LABEL_PREFIX: &str = "shard.kactor.dev/";
/// The label with which the assigner asks the owner to hand the object over: `drain.kactor.dev/<ring>`.
pub const DRAIN_LABEL_PREFIX: &str = "drain.kactor.dev/";
/// The drain label's value.
pub const DRAINING: &str = "true";
/// The label that marks the ring's member Leases: `kactor.dev/ring=<ring>`.
pub const RING_LABEL: &str = "kactor.dev/ring";

/// Why a ring or a member name cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// The ring's name cannot be the name part of a label key.
    #[error("sharding: the ring name {0:?} must be a label name (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit); it is the name part of the labels shard.kactor.dev/<ring> and drain.kactor.dev/<ring>")]
    Ring(String),
    /// The member's identity cannot be a label value.
    #[error("sharding: the replica identity {0:?} must be a label value (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit), as it is written to shard.kactor.dev/<ring>; the pod name will do")]
    Member(String),
}

/// Whether `text` is a label name (and value): 1-63 characters of `[A-Za-z0-9._-]`, alphanumeric at
/// both ends.
pub fn is_label_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// A member name from a process identity: a label value that can also end the name of its Lease
/// (`<ring>-<member>`): the identity itself if it is lowercase letters, digits, '-' and '.' (a pod's
/// name is), else the identity lowercased, other characters as `-`, trimmed to 63 and to
/// alphanumeric ends (Kopf's default `user@host/20260301100000/abc` becomes
/// `user-host-20260301100000-abc`).
pub fn member_name(identity: &str) -> String {
    let fits = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.');
    if is_label_name(identity) && identity.chars().all(fits) {
        return identity.to_string();
    }
    let mapped: String = identity
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if fits(c) { c } else { '-' })
        .collect();
    let trimmed = |s: &str| -> String {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string()
    };
    let mut name = trimmed(&mapped);
    if name.len() > 63 {
        // The end carries the random part of Kopf's identities.
        name = trimmed(&name[name.len() - 63..]);
    }
    if name.is_empty() {
        "member".to_string()
    } else {
        name
    }
}

/// Whether an object is leaving this replica (sharding): set by its worker when a newer event shows
/// another owner or the drain label, read by the cycle under way before each handler it starts,
/// and awaited while that cycle waits for a handler slot, so that it stops waiting at once.
#[derive(Debug, Default)]
pub struct Leaving {
    flag: std::sync::atomic::AtomicBool,
    changed: tokio::sync::Notify,
}

impl Leaving {
    /// Says whether the object is leaving now.
    pub fn set(&self, leaving: bool) {
        self.flag
            .store(leaving, std::sync::atomic::Ordering::Release);
        if leaving {
            self.changed.notify_waiters();
        }
    }

    /// Whether the object is leaving.
    pub fn is_set(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Completes once the object is leaving.
    pub async fn wait(&self) {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if self.is_set() {
                return;
            }
            changed.await;
        }
    }
}

/// Whether this replica may start work on its objects now (sharding): its membership of the ring,
/// as cycles, handlers, timers and daemons read it right before they start.
///
/// Two things must both be true:
/// * **The deadline**: less than the renew deadline has passed since the last successful write of
///   the member Lease was sent. The member sets it at each join and renewal ([`Tenure::hold_until`]).
///   It is read from the clock, not from a timer: a process frozen past its deadline (SIGSTOP, a
///   stalled virtual machine, a starved node) runs its overdue timers and queued events all at once
///   when it thaws, before the member's pause can reach its workers, and its objects may have moved
///   meanwhile. Those find the tenure lapsed and start nothing.
/// * **The operator has paused since the membership last ended** ([`Tenure::end`],
///   [`Tenure::quiesced`]). Events, retries and bodies from before a lost membership are stale: the
///   objects may have moved and come back. A replica back in the ring could otherwise rejoin within
///   milliseconds of thawing, before the pause reached its workers, and run them. So the tenure
///   holds again only once the operator has paused every worker (they then wait for the listing
///   after the resume).
///
/// A tenure made with [`Tenure::default`] holds for ever: a replica whose membership nobody bounds
/// (the tests of one processor) works as before.
///
/// ```
/// use kactor_reactor::sharding::Tenure;
/// use std::time::Duration;
/// let tenure = Tenure::default();
/// assert!(tenure.holds(), "unbounded until a member bounds it");
/// tenure.end();
/// assert!(!tenure.holds());
/// tenure.hold_until(tokio::time::Instant::now() + Duration::from_secs(10));
/// assert!(!tenure.holds(), "rejoined, but the operator has not paused since it ended");
/// tenure.quiesced(tenure.ended());
/// assert!(tenure.holds());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Tenure(std::sync::Arc<TenureState>);

#[derive(Debug)]
struct TenureState {
    /// The origin of `until`.
    base: tokio::time::Instant,
    /// The deadline as nanoseconds after `base`, plus one: 0 means ended, `u64::MAX` unbounded; so
    /// that reading it is one atomic load.
    until: AtomicU64,
    /// How many times the membership ended.
    ended: AtomicU64,
    /// Up to which of those ends the operator has paused since.
    quiesced: AtomicU64,
}

impl Default for TenureState {
    fn default() -> Self {
        TenureState {
            base: tokio::time::Instant::now(),
            until: AtomicU64::new(u64::MAX),
            ended: AtomicU64::new(0),
            quiesced: AtomicU64::new(0),
        }
    }
}

impl Tenure {
    /// Joined or renewed: work may start until `deadline` (on `tokio::time`'s clock, which tests
    /// can pause), once the operator has paused since the last end.
    pub fn hold_until(&self, deadline: tokio::time::Instant) {
        let nanos = deadline
            .checked_duration_since(self.0.base)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1));
        self.0
            .until
            .store(nanos.saturating_add(1).min(u64::MAX - 1), Ordering::Release);
    }

    /// The membership ended: no work may start until it holds again, and the operator has paused.
    /// Ending a tenure that does not hold any more counts once.
    pub fn end(&self) {
        if self.0.until.swap(0, Ordering::AcqRel) != 0 {
            self.0.ended.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// How many times the membership has ended. The operator reads it before it pauses, and
    /// gives it to [`Tenure::quiesced`] once every worker has taken the pause.
    pub fn ended(&self) -> u64 {
        self.0.ended.load(Ordering::Acquire)
    }

    /// Whether the membership ended since the operator last paused: the operator must pause (even
    /// if it is told to resume at once) before the tenure can hold again.
    pub fn needs_pause(&self) -> bool {
        self.0.quiesced.load(Ordering::Acquire) < self.ended()
    }

    /// The operator has paused every worker since the membership's `ended`-th end (or has just
    /// started, with nothing from before): nothing stale from before it can start any more.
    pub fn quiesced(&self, ended: u64) {
        self.0.quiesced.fetch_max(ended, Ordering::AcqRel);
    }

    /// Whether work may start now.
    pub fn holds(&self) -> bool {
        let within = match self.0.until.load(Ordering::Acquire) {
            0 => false,
            u64::MAX => true,
            until => {
                let now = tokio::time::Instant::now().saturating_duration_since(self.0.base);
                u64::try_from(now.as_nanos()).unwrap_or(u64::MAX) < until - 1
            }
        };
        within && !self.needs_pause()
    }

    /// Whether `other` is this tenure (a clone of it), not only one with the same deadline.
    pub fn same(&self, other: &Tenure) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Where an object stands for this replica, by its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The shard label names this replica and there is no drain label: handle it.
    Mine,
    /// The shard label names this replica and the assigner asks for it back: hand it over.
    Draining,
    /// The shard label names another replica, or none: do nothing with it.
    NotMine,
}

/// This replica's place in a ring.
///
/// ```
/// use kactor_reactor::sharding::{Shard, Standing};
/// let shard = Shard::new("my-operator", "pod-a")?;
/// assert_eq!(shard.selector(), "shard.kactor.dev/my-operator=pod-a");
/// let object: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "metadata": {"name": "x", "labels": {"shard.kactor.dev/my-operator": "pod-a"}}
/// }))?;
/// assert_eq!(shard.standing(&object), Standing::Mine);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Shard {
    ring: String,
    member: String,
    shard_label: String,
    drain_label: String,
    tenure: Tenure,
}

/// Two shards are equal when they place the same member in the same ring and share one tenure.
impl PartialEq for Shard {
    fn eq(&self, other: &Self) -> bool {
        self.ring == other.ring && self.member == other.member && self.tenure.same(&other.tenure)
    }
}

impl Eq for Shard {}

impl Shard {
    /// The member `member` of the ring `ring`; both must be label names.
    pub fn new(ring: impl Into<String>, member: impl Into<String>) -> Result<Self, ShardError> {
        let (ring, member) = (ring.into(), member.into());
        if !is_label_name(&ring) {
            return Err(ShardError::Ring(ring));
        }
        if !is_label_name(&member) {
            return Err(ShardError::Member(member));
        }
        Ok(Shard {
            shard_label: shard_label(&ring),
            drain_label: drain_label(&ring),
            ring,
            member,
            tenure: Tenure::default(),
        })
    }

    /// How long this replica may still start work on its objects: unbounded until the ring's
    /// member bounds it (see [`Tenure`]).
    pub fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    /// The ring's name.
    pub fn ring(&self) -> &str {
        &self.ring
    }

    /// This replica's name in the ring (the shard label's value on its objects).
    pub fn member(&self) -> &str {
        &self.member
    }

    /// `shard.kactor.dev/<ring>`.
    pub fn shard_label(&self) -> &str {
        &self.shard_label
    }

    /// `drain.kactor.dev/<ring>`.
    pub fn drain_label(&self) -> &str {
        &self.drain_label
    }

    /// The label selector of this replica's objects: `shard.kactor.dev/<ring>=<member>`.
    pub fn selector(&self) -> String {
        format!("{}={}", self.shard_label, self.member)
    }

    /// Where `object` stands for this replica.
    pub fn standing(&self, object: &DynamicObject) -> Standing {
        let labels = object.metadata.labels.as_ref();
        let owner = labels.and_then(|l| l.get(&self.shard_label));
        if owner.map(String::as_str) != Some(self.member.as_str()) {
            Standing::NotMine
        } else if labels.is_some_and(|l| l.contains_key(&self.drain_label)) {
            Standing::Draining
        } else {
            Standing::Mine
        }
    }

    /// The tests every write to an object of this replica starts with: the shard label names this
    /// replica, and there is no drain label.
    pub fn fence(&self) -> Vec<PatchOperation> {
        vec![
            test(
                &self.label_path(&self.shard_label),
                self.member.clone().into(),
            ),
            test(&self.label_path(&self.drain_label), Value::Null),
        ]
    }

    /// The tests of the handover's writes: the shard label names this replica, and the drain label
    /// asks for the object back.
    pub fn drain_fence(&self) -> Vec<PatchOperation> {
        vec![
            test(
                &self.label_path(&self.shard_label),
                self.member.clone().into(),
            ),
            test(&self.label_path(&self.drain_label), DRAINING.into()),
        ]
    }

    /// The handover: [`Shard::drain_fence`], then both labels removed. The assigner labels the
    /// object for its next owner once it sees it without them.
    pub fn release(&self) -> Vec<PatchOperation> {
        let mut ops = self.drain_fence();
        for label in [&self.shard_label, &self.drain_label] {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: self.label_path(label),
            }));
        }
        ops
    }

    fn label_path(&self, label: &str) -> PointerBuf {
        PointerBuf::from_tokens(["metadata", "labels", label])
    }
}

/// `shard.kactor.dev/<ring>`.
pub fn shard_label(ring: &str) -> String {
    format!("{SHARD_LABEL_PREFIX}{ring}")
}

/// `drain.kactor.dev/<ring>`.
pub fn drain_label(ring: &str) -> String {
    format!("{DRAIN_LABEL_PREFIX}{ring}")
}

fn test(path: &PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: path.clone(),
        value,
    })
}

/// The JSON-patch operations that do to `current` what the merge patch `merge` (RFC 7386) does:
/// a `null` removes a key that is there (and is nothing where it is not), an object merges into an
/// object, anything else is set. A map the merge creates (its parent has no such key) is added
/// whole, after a `test` that it is still absent: if another writer made it meanwhile, the patch
/// fails instead of replacing theirs (the caller reads the object again and retries).
pub fn merge_to_ops(current: &Value, merge: &Map<String, Value>) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let mut path = PointerBuf::root();
    merge_ops(current, merge, &mut path, &mut ops);
    ops
}

fn merge_ops(
    current: &Value,
    merge: &Map<String, Value>,
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) {
    for (key, value) in merge {
        path.push_back(key.as_str());
        let existing = current.get(key);
        match (existing, value) {
            (None, Value::Null) => {}
            (Some(_), Value::Null) => ops.push(PatchOperation::Remove(RemoveOperation {
                path: path.clone(),
            })),
            (Some(existing @ Value::Object(_)), Value::Object(inner)) => {
                merge_ops(existing, inner, path, ops)
            }
            (None, value) => {
                if value.is_object() {
                    ops.push(test(path, Value::Null));
                }
                ops.push(PatchOperation::Add(AddOperation {
                    path: path.clone(),
                    value: without_nulls(value),
                }));
            }
            (Some(_), value) => ops.push(PatchOperation::Replace(ReplaceOperation {
                path: path.clone(),
                value: without_nulls(value),
            })),
        }
        path.pop_back();
    }
}

/// A merge patch's value as it lands where nothing was: its `null`s remove nothing, so they go.
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(labels: Value) -> DynamicObject {
        serde_json::from_value(json!({"metadata": {"name": "x", "labels": labels}})).unwrap()
    }

    /// What `ops` do to `current`, by the json-patch crate's reading (which, unlike the API server,
    /// fails a null test of an absent key; such tests are dropped here and checked by the tests
    /// against both servers).
    fn applied(current: &Value, ops: &[PatchOperation]) -> Value {
        let mut result = current.clone();
        let ops: Vec<PatchOperation> = ops
            .iter()
            .filter(|op| !matches!(op, PatchOperation::Test(t) if t.value.is_null()))
            .cloned()
            .collect();
        json_patch::patch(&mut result, &ops).unwrap();
        result
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenure_lapses_by_the_clock_alone_and_is_shared_by_its_clones() {
        use std::time::Duration;
        use tokio::time::Instant;
        let tenure = Tenure::default();
        let shard = Shard::new("op", "a").unwrap();
        assert!(
            tenure.holds() && shard.tenure().holds(),
            "unbounded at first"
        );
        let read = tenure.clone();
        tenure.hold_until(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(read.holds());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            !read.holds(),
            "not at the deadline itself: no timer needed to run"
        );
        tenure.hold_until(Instant::now() + Duration::from_secs(1));
        assert!(read.holds(), "renewed: nothing ended meanwhile");
        tenure.end();
        assert!(!read.holds(), "ended");
        assert!(read.needs_pause());
        let ended = read.ended();
        tenure.hold_until(Instant::now() + Duration::from_secs(1));
        assert!(
            !read.holds(),
            "joined again, but the operator has not paused since"
        );
        tenure.quiesced(ended);
        assert!(read.holds() && !read.needs_pause(), "paused since");
        tenure.end();
        tenure.end();
        assert_eq!(
            read.ended(),
            ended + 1,
            "ended once, however often it is said"
        );
        tenure.quiesced(ended);
        tenure.hold_until(Instant::now() + Duration::from_secs(1));
        assert!(
            !read.holds(),
            "a pause before the latest end does not count"
        );
        tenure.quiesced(read.ended());
        tenure.hold_until(Instant::now() - Duration::from_secs(1));
        assert!(!read.holds(), "a deadline already past holds nothing");
        assert!(read.same(&tenure) && !read.same(&Tenure::default()));
        let mut other = shard.clone();
        assert_eq!(other, shard, "a clone shares the tenure");
        other.tenure = Tenure::default();
        assert_ne!(other, shard, "another tenure is another shard");
    }

    #[tokio::test(start_paused = true)]
    async fn leaving_wakes_whoever_waits_for_it() {
        let leaving = std::sync::Arc::new(Leaving::default());
        let waiting = tokio::spawn({
            let leaving = leaving.clone();
            async move { leaving.wait().await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!waiting.is_finished() && !leaving.is_set());
        leaving.set(true);
        waiting.await.unwrap();
        leaving.wait().await; // already set: at once
        leaving.set(false);
        assert!(!leaving.is_set());
    }

    #[test]
    fn names_must_be_label_names() {
        assert!(Shard::new("my-operator", "pod-1.a_b").is_ok());
        assert!(matches!(Shard::new("", "a"), Err(ShardError::Ring(_))));
        assert!(matches!(Shard::new("a/b", "a"), Err(ShardError::Ring(_))));
        assert!(matches!(Shard::new("a", "-a"), Err(ShardError::Member(_))));
        assert!(matches!(
            Shard::new("a", "x".repeat(64)),
            Err(ShardError::Member(_))
        ));
        let error = Shard::new("op", "my pod").unwrap_err().to_string();
        assert!(
            error.contains("\"my pod\"") && error.contains("label value"),
            "{error}"
        );
    }

    #[test]
    fn member_names_are_label_values() {
        assert_eq!(member_name("my-op-7d9f-xk2p"), "my-op-7d9f-xk2p");
        assert_eq!(
            member_name("root@host/20260301100000/abc"),
            "root-host-20260301100000-abc"
        );
        let long = format!("{}@h/{}/xyz", "u".repeat(80), 1);
        let name = member_name(&long);
        assert!(is_label_name(&name) && name.ends_with("xyz"), "{name}");
        assert_eq!(member_name("@@@"), "member");
        assert_eq!(member_name("Root@My_Host/1/abc"), "root-my-host-1-abc");
    }

    #[test]
    fn standing_follows_the_labels() {
        let shard = Shard::new("op", "a").unwrap();
        assert_eq!(
            shard.standing(&object(json!({"shard.kactor.dev/op": "a"}))),
            Standing::Mine
        );
        assert_eq!(
            shard.standing(&object(
                json!({"shard.kactor.dev/op": "a", "drain.kactor.dev/op": "true"})
            )),
            Standing::Draining
        );
        assert_eq!(
            shard.standing(&object(json!({"shard.kactor.dev/op": "b"}))),
            Standing::NotMine
        );
        assert_eq!(
            shard.standing(&object(json!({"shard.kactor.dev/other": "a"}))),
            Standing::NotMine
        );
        assert_eq!(shard.standing(&object(Value::Null)), Standing::NotMine);
        // A drain label without ours: not ours (the assigner is moving it from someone else).
        assert_eq!(
            shard.standing(&object(json!({"drain.kactor.dev/op": "true"}))),
            Standing::NotMine
        );
    }

    #[test]
    fn the_fence_tests_the_owner_and_the_drain_label_with_escaped_paths() {
        let shard = Shard::new("op", "a").unwrap();
        assert_eq!(
            serde_json::to_value(shard.fence()).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/labels/shard.kactor.dev~1op", "value": "a"},
                {"op": "test", "path": "/metadata/labels/drain.kactor.dev~1op", "value": null},
            ])
        );
        assert_eq!(
            serde_json::to_value(shard.release()).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/labels/shard.kactor.dev~1op", "value": "a"},
                {"op": "test", "path": "/metadata/labels/drain.kactor.dev~1op", "value": "true"},
                {"op": "remove", "path": "/metadata/labels/shard.kactor.dev~1op"},
                {"op": "remove", "path": "/metadata/labels/drain.kactor.dev~1op"},
            ])
        );
    }

    #[test]
    fn merge_to_ops_does_what_the_merge_patch_does() {
        let current = json!({
            "metadata": {"name": "x", "annotations": {"keep": "1", "drop": "2", "a/b": "3"}},
            "spec": {"size": 1},
            "status": {"old": {"x": 1}, "scalar": 5},
        });
        let merges = [
            json!({"metadata": {"annotations": {"drop": null, "a/b": "4", "new": "5", "gone": null}}}),
            json!({"status": {"fresh": {"deep": {"k": 1, "n": null}}, "old": {"x": null, "y": 2}}}),
            json!({"status": {"scalar": {"now": "a map"}}, "metadata": {"labels": {"l": "v"}}}),
            json!({"spec": null, "kind": "Thing"}),
            json!({}),
        ];
        for merge in merges {
            let mut expected = current.clone();
            json_patch::merge(&mut expected, &merge);
            let ops = merge_to_ops(&current, merge.as_object().unwrap());
            assert_eq!(applied(&current, &ops), expected, "merge {merge}");
        }
    }

    #[test]
    fn a_map_made_by_the_merge_is_guarded_by_a_test_of_its_absence() {
        let current = json!({"metadata": {"name": "x"}});
        let merge = json!({"metadata": {"annotations": {"a": "1", "b": null}}});
        let ops = merge_to_ops(&current, merge.as_object().unwrap());
        assert_eq!(
            serde_json::to_value(ops).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/annotations", "value": null},
                {"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}},
            ])
        );
    }
}
