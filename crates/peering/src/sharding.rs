//! Sharding (kactor's addition): several replicas of one operator share one resource's objects, each
//! object owned by one replica at a time, coordinated only through the Kubernetes API (Leases and
//! labels), as timebertt/kubernetes-controller-sharding does it.
//!
//! * Every replica runs a [`Member`]: its own `coordination.k8s.io/v1` Lease `<ring>-<member>`
//!   (labels `kactor.dev/ring=<ring>`, `kactor.dev/member=<member>`), renewed every `retry_period`.
//!   While it is not renewed in time (or was taken over), the reactor's [`PauseSwitch`] toggle
//!   [`MEMBER_TOGGLE`] is on, and the shard's [`Tenure`] has lapsed (read by every cycle and
//!   handler before it starts, so that it holds even when the pause comes late).
//! * Every replica runs an [`Assigner`] too, which acts only while the replica leads (leader
//!   election's `is_leader`): it reads the members' Leases, labels each object for its owner
//!   (`shard.kactor.dev/<ring>=<member>`, by rendezvous hashing: [`owner`]), asks owners to hand
//!   objects over when the ring grows (`drain.kactor.dev/<ring>: "true"`), takes over the Leases of
//!   dead members and moves their objects.
//! * The owners' side (which objects a replica handles, the handover, the write fence) is the
//!   reactor's [`kactor_reactor::sharding`]; [`RingSettings`] says which ring, as whom, how fast.
//!
//! The protocols are the state machines in this file: `Phase` for a member (`Outside`, `Joined`,
//! `Evicted`), [`MemberState`] for the assigner's view of each member's Lease.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures::{stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kactor_reactor::pausing::PauseSwitch;
use kactor_reactor::settings::{Networking, Watching};
use kactor_reactor::sharding::{
    drain_label, is_label_name, shard_label, Tenure, DRAINING, RING_LABEL,
};
use kactor_reactor::slim;
use kactor_reactor::watching::{EventType, WatchItem, Watcher};
use kube::api::{
    Api, ApiResource, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::leases::{
    check_timings, duration_seconds, hold, holder, is_conflict, is_not_found, micro_now, released,
    Observed, TimingFault,
};

/// The [`PauseSwitch`] toggle that a [`Member`] holds on while this replica is not a member of its
/// ring (its Lease not renewed in time, taken over, or not acquired yet).
pub const MEMBER_TOGGLE: &str = "shard-membership";

/// The label that names the member of a ring's member Lease: `kactor.dev/member=<member>`.
pub const MEMBER_LABEL: &str = "kactor.dev/member";

/// The start of the `holderIdentity` an assigner writes when it takes over a dead member's Lease:
/// `assigner/<the assigner's identity>`.
pub const ASSIGNER_PREFIX: &str = "assigner/";

/// How many objects one page of a resync's list holds.
const RESYNC_PAGE: u32 = 500;

/// The field manager of a member's writes to its Lease (as the Lease's `managedFields` show it).
pub const MEMBER_FIELD_MANAGER: &str = "kactor-ring-member";

/// The field manager of the assigner's writes: the Leases it takes over, the labels it writes.
pub const ASSIGNER_FIELD_MANAGER: &str = "kactor-ring-assigner";

/// Parameters of a write by `manager`.
fn writes(manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(manager.to_string()),
        ..PostParams::default()
    }
}

/// Why sharding cannot run with these settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// No namespace for the members' Leases.
    #[error("sharding ring {ring:?}: the namespace of the members' Leases is empty; set it, e.g. to the operator's own namespace")]
    NoNamespace {
        /// The ring's name.
        ring: String,
    },
    /// The ring's name cannot be the name part of a label key.
    #[error("sharding: the ring name {ring:?} must be a label name (1-63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit); it is the name part of the labels shard.kactor.dev/<ring> and drain.kactor.dev/<ring>")]
    Ring {
        /// The ring's name.
        ring: String,
    },
    /// The identity cannot be a label value.
    #[error("sharding ring {ring:?}: the identity {identity:?} must be a label value (1-63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit), as it is written to shard.kactor.dev/{ring}; the pod name will do")]
    Identity {
        /// The ring's name.
        ring: String,
        /// The identity given.
        identity: String,
    },
    /// `<ring>-<member>` cannot be a Lease's name.
    #[error("sharding ring {ring:?}: the member Lease's name {name:?} (<ring>-<identity>) must be a valid object name (at most 253 characters: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit); use a lowercase ring name and identity without '_'")]
    LeaseName {
        /// The ring's name.
        ring: String,
        /// The Lease's name.
        name: String,
    },
    /// The lease duration does not fit `leaseDurationSeconds`.
    #[error("sharding ring {ring:?}: lease_duration {lease_duration:?} must be a whole number of seconds, at least 1 s (the Lease records it as leaseDurationSeconds)")]
    LeaseDuration {
        /// The ring's name.
        ring: String,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// A member would not stop working before the assigner may take its Lease over.
    #[error("sharding ring {ring:?}: renew_deadline {renew_deadline:?} must be shorter than lease_duration {lease_duration:?}, so that a member that cannot renew stops before the assigner may move its objects")]
    RenewDeadline {
        /// The ring's name.
        ring: String,
        /// The renew deadline given.
        renew_deadline: Duration,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// A member would get no second try to renew.
    #[error("sharding ring {ring:?}: retry_period {retry_period:?} must be positive and shorter than renew_deadline {renew_deadline:?}, so that a failed renewal is retried before the deadline")]
    RetryPeriod {
        /// The ring's name.
        ring: String,
        /// The retry period given.
        retry_period: Duration,
        /// The renew deadline given.
        renew_deadline: Duration,
    },
    /// The resync period is zero.
    #[error("sharding ring {ring:?}: resync_period must be positive (e.g. the default 30 s)")]
    ResyncPeriod {
        /// The ring's name.
        ring: String,
    },
    /// No label write could ever run.
    #[error("sharding ring {ring:?}: concurrent_moves must be at least 1 (e.g. the default 100)")]
    ConcurrentMoves {
        /// The ring's name.
        ring: String,
    },
}

/// What an object's owner is picked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashBy {
    /// The object's uid: objects spread evenly, whatever their namespace.
    #[default]
    Uid,
    /// The object's namespace: all the objects of a namespace go to one member (for operators whose
    /// handlers look at their neighbours). Cluster-scoped objects go by their uid.
    Namespace,
}

/// Which ring, as whom, and how fast.
///
/// ```
/// use std::time::Duration;
/// use kactor_peering::sharding::RingSettings;
///
/// let settings = RingSettings::new("my-operator", "kube-system", "my-operator-7d9f-xk2p")
///     .with_timings(Duration::from_secs(30), Duration::from_secs(20), Duration::from_secs(4))?;
/// assert_eq!(settings.lease_name(), "my-operator-my-operator-7d9f-xk2p");
/// # Ok::<(), kactor_peering::sharding::RingError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingSettings {
    /// The ring's name: the name part of the labels `shard.kactor.dev/<ring>` and
    /// `drain.kactor.dev/<ring>`, and the start of the members' Lease names. Usually the operator's name.
    pub ring: String,
    /// The namespace of the members' Leases, usually the operator's own.
    pub namespace: String,
    /// This replica's name in the ring, written to its objects' shard label and to its Lease's
    /// `holderIdentity`: unique per replica and stable for the life of the process (the pod name).
    pub identity: String,
    /// How long a member's Lease lasts without renewal before the assigner may take it over, from
    /// when the assigner last saw it change. Written as whole seconds to `leaseDurationSeconds`.
    /// Default [`RingSettings::DEFAULT_LEASE_DURATION`].
    pub lease_duration: Duration,
    /// How long after its last successful renewal a member goes on trying to renew before it pauses;
    /// shorter than `lease_duration`. Default [`RingSettings::DEFAULT_RENEW_DEADLINE`].
    pub renew_deadline: Duration,
    /// How often a member renews its Lease, and how often the assigner reads the ring's Leases.
    /// Default [`RingSettings::DEFAULT_RETRY_PERIOD`].
    pub retry_period: Duration,
    /// What an object's owner is picked by. Default [`HashBy::Uid`].
    pub hash_by: HashBy,
    /// How often the assigner lists every object to check its owner (besides at once when members
    /// come or go). Default [`RingSettings::DEFAULT_RESYNC_PERIOD`].
    pub resync_period: Duration,
    /// At most this many label writes of the assigner run at once.
    /// Default [`RingSettings::DEFAULT_CONCURRENT_MOVES`].
    pub concurrent_moves: usize,
}

impl RingSettings {
    /// 15 s, as leader election's default.
    pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
    /// 10 s, as leader election's default.
    pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
    /// 2 s, as leader election's default.
    pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
    /// 30 s.
    pub const DEFAULT_RESYNC_PERIOD: Duration = Duration::from_secs(30);
    /// 100 label writes at once.
    pub const DEFAULT_CONCURRENT_MOVES: usize = 100;

    /// Settings for the member `identity` of the ring `ring`, with its Lease in `namespace`, and the
    /// defaults: 15 s lease, 10 s renew deadline, 2 s retry period, by uid, 30 s resync, 100 moves.
    pub fn new(
        ring: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        RingSettings {
            ring: ring.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Self::DEFAULT_LEASE_DURATION,
            renew_deadline: Self::DEFAULT_RENEW_DEADLINE,
            retry_period: Self::DEFAULT_RETRY_PERIOD,
            hash_by: HashBy::default(),
            resync_period: Self::DEFAULT_RESYNC_PERIOD,
            concurrent_moves: Self::DEFAULT_CONCURRENT_MOVES,
        }
    }

    /// The same settings with other timings, checked by [`RingSettings::validate`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kactor_peering::sharding::RingSettings;
    /// let too_tight = RingSettings::new("op", "default", "me")
    ///     .with_timings(Duration::from_secs(10), Duration::from_secs(10), Duration::from_secs(2));
    /// assert!(too_tight.is_err(), "the renew deadline must be shorter than the lease");
    /// ```
    pub fn with_timings(
        self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, RingError> {
        let settings = RingSettings {
            lease_duration,
            renew_deadline,
            retry_period,
            ..self
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Checks that the ring and the identity are label names, `<ring>-<identity>` is an object name,
    /// the namespace is set, `lease_duration` is whole seconds, `renew_deadline < lease_duration`,
    /// `0 < retry_period < renew_deadline`, and the resync period and concurrency are positive.
    pub fn validate(&self) -> Result<(), RingError> {
        let ring = self.ring.clone();
        if !is_label_name(&self.ring) {
            return Err(RingError::Ring { ring });
        }
        if !is_label_name(&self.identity) {
            return Err(RingError::Identity {
                ring,
                identity: self.identity.clone(),
            });
        }
        if !is_object_name(&self.lease_name()) {
            return Err(RingError::LeaseName {
                ring,
                name: self.lease_name(),
            });
        }
        if self.namespace.is_empty() {
            return Err(RingError::NoNamespace { ring });
        }
        match check_timings(self.lease_duration, self.renew_deadline, self.retry_period) {
            Ok(()) => {}
            Err(TimingFault::LeaseDuration) => {
                return Err(RingError::LeaseDuration {
                    ring,
                    lease_duration: self.lease_duration,
                })
            }
            Err(TimingFault::RenewDeadline) => {
                return Err(RingError::RenewDeadline {
                    ring,
                    renew_deadline: self.renew_deadline,
                    lease_duration: self.lease_duration,
                })
            }
            Err(TimingFault::RetryPeriod) => {
                return Err(RingError::RetryPeriod {
                    ring,
                    retry_period: self.retry_period,
                    renew_deadline: self.renew_deadline,
                })
            }
        }
        if self.resync_period.is_zero() {
            return Err(RingError::ResyncPeriod { ring });
        }
        if self.concurrent_moves == 0 {
            return Err(RingError::ConcurrentMoves { ring });
        }
        Ok(())
    }

    /// This member's Lease: `<ring>-<identity>`.
    pub fn lease_name(&self) -> String {
        member_lease_name(&self.ring, &self.identity)
    }

    /// `namespace/<ring>-<identity>`, for messages.
    fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name())
    }

    /// `leaseDurationSeconds`; [`RingSettings::validate`] has made sure it fits.
    fn lease_duration_seconds(&self) -> i32 {
        duration_seconds(self.lease_duration)
    }

    /// How long one attempt (a read and a write) may take: half the renew deadline, as leader
    /// election bounds each renewal, so that a hung request leaves time for another try.
    fn attempt_timeout(&self) -> Duration {
        self.renew_deadline / 2
    }

    /// The label selector of the ring's member Leases.
    fn ring_selector(&self) -> String {
        format!("{RING_LABEL}={}", self.ring)
    }
}

fn member_lease_name(ring: &str, member: &str) -> String {
    format!("{ring}-{member}")
}

/// Whether `name` is a DNS subdomain (RFC 1123), as object names are: at most 253 characters of
/// lowercase letters, digits, '-' and '.', alphanumeric at both ends of every dot-separated part.
fn is_object_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|part| {
            let bytes = part.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes[0] != b'-'
                && bytes[bytes.len() - 1] != b'-'
        })
}

// ------------------------------------------------------------------------------------------------
// Rendezvous hashing.

/// The member that owns `key` among `members`, by rendezvous (highest-random-weight) hashing: each
/// member scores the key with a stable 64-bit hash of the member and the key, and the highest score
/// wins (ties, which take a 64-bit collision, go to the smallest name). `None` if there is no member.
///
/// When a member joins, only the keys it now wins move, all to it (about `1/n` of them); when one
/// leaves, only its keys move. The order of `members` does not matter, and every replica computes
/// the same owner.
///
/// ```
/// use kactor_peering::sharding::owner;
/// let members = vec!["a".to_string(), "b".to_string(), "c".to_string()];
/// let first = owner("6b3c0d0a-uid", &members);
/// assert!(first.is_some());
/// let mut reversed = members.clone();
/// reversed.reverse();
/// assert_eq!(owner("6b3c0d0a-uid", &reversed), first);
/// assert_eq!(owner("anything", &[]), None);
/// ```
pub fn owner<'a>(key: &str, members: &'a [String]) -> Option<&'a str> {
    members
        .iter()
        .map(|member| (score(member, key), member.as_str()))
        .max_by(|(a, a_name), (b, b_name)| a.cmp(b).then_with(|| b_name.cmp(a_name)))
        .map(|(_, member)| member)
}

/// The weight of `key` for `member`: FNV-1a over the member, a 0 byte and the key, then the
/// splitmix64 finaliser, so that similar names and keys give unrelated scores.
fn score(member: &str, key: &str) -> u64 {
    mix(fnv1a(member.bytes().chain([0]).chain(key.bytes())))
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.into_iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

/// splitmix64's finaliser (Stafford's Mix13).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ------------------------------------------------------------------------------------------------
// The member.

/// This replica's membership of a ring: its own Lease, and the reactor paused while it does not
/// hold it.
///
/// ```no_run
/// # async fn example(client: kube::Client) -> Result<(), kactor_peering::sharding::RingError> {
/// use kactor_peering::sharding::{Member, RingSettings};
/// use kactor_reactor::pausing::PauseSwitch;
///
/// let switch = PauseSwitch::new();
/// let settings = RingSettings::new("my-operator", "kube-system", "my-operator-7d9f-xk2p");
/// let member = Member::new(client, settings, switch.clone());
/// let joined = member.joined(); // for metrics
/// member.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
///
/// **Expected flow**: the toggle [`MEMBER_TOGGLE`] is on from [`Member::new`]. [`Member::run`] reads
/// its Lease `<ring>-<identity>`: it creates it if absent, or takes it with a write conditional on
/// the resourceVersion read if it names this member or nobody. Once a write succeeds it has joined:
/// the toggle goes off and it renews every `retry_period`, each renewal conditional on the
/// resourceVersion of the last. When renewals keep failing until `renew_deadline` has passed since
/// the last successful one, the toggle goes on at once (an error logged) and it keeps trying. When the
/// Lease names another holder (the assigner took it over: [`ASSIGNER_PREFIX`]) the toggle goes on and
/// it waits, never taking that Lease back, until the assigner deletes it (once it has moved all this
/// member's objects); then it creates a fresh Lease and joins again. A Lease deleted under it also
/// pauses it until it has created a fresh one. When `stop` completes, the toggle goes on and, if the
/// Lease is its own, it is released (empty holder, `leaseDurationSeconds: 1`): the assigner then
/// moves its objects at once.
///
/// **Guarantees**
/// * The toggle is off only while the last successful write of its Lease was sent less than
///   `renew_deadline` ago; the assigner takes a Lease over only `lease_duration` after it last saw it
///   change. So a member pauses `lease_duration - renew_deadline` before its objects may move.
/// * The tenure ([`Member::with_tenure`]) holds only while that write was sent less than
///   `renew_deadline` ago, by the clock at the moment it is read: it needs no timer to run, so it
///   holds true even for a process that was frozen. After the membership ended, it holds again
///   only once the operator has paused its workers since ([`Tenure::quiesced`]).
/// * A Lease taken over is never written by the member again: it joins again only under a fresh
///   Lease, created after the assigner deleted the old one.
/// * [`Member::joined`] turns true before the toggle goes off and false after it goes on.
/// * If the `run` future is dropped (a crash, an aborted task), the toggle goes on at once; the Lease,
///   not released, expires and is taken over.
///
/// **Assumptions**: every replica has a unique identity; the clocks of the replicas run at about
/// the same rate; nobody but the member and the assigner writes the member's Lease.
///
/// **Caveats**
/// * A member whose Lease was taken over stays paused until the assigner has moved all its objects,
///   which needs a live member and a resync (at once after the takeover).
/// * A process frozen past its renew deadline pauses only when it runs again. Its tenure has
///   lapsed by then, so no cycle or handler starts; but the handlers it had under way when it froze
///   finish after its objects moved (the reactor's write fence stops their writes to them).
/// * API errors are logged and retried every `retry_period`, never returned.
pub struct Member {
    client: kube::Client,
    settings: RingSettings,
    switch: PauseSwitch,
    joined: watch::Sender<bool>,
    tenure: Tenure,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("settings", &self.settings)
            .field("joined", &*self.joined.borrow())
            .finish_non_exhaustive()
    }
}

impl Member {
    /// The member `settings.identity` of the ring `settings.ring`; the toggle [`MEMBER_TOGGLE`] of
    /// `switch` goes on at once, so that nothing works before it has joined.
    pub fn new(client: kube::Client, settings: RingSettings, switch: PauseSwitch) -> Self {
        switch.set(MEMBER_TOGGLE, Some(not_joined_yet(&settings)));
        Member {
            client,
            settings,
            switch,
            joined: watch::channel(false).0,
            tenure: Tenure::default(),
        }
    }

    /// Bounds `tenure` (the reactor's [`Shard::tenure`](kactor_reactor::sharding::Shard::tenure))
    /// by this membership: ended at once, then held until `renew_deadline` after each successful
    /// write of the Lease was sent, and ended whenever the member leaves. Cycles and handlers read
    /// it before they start, so a process frozen past its deadline starts nothing when it thaws,
    /// before the pause reaches its workers.
    pub fn with_tenure(mut self, tenure: Tenure) -> Self {
        tenure.end();
        self.tenure = tenure;
        self
    }

    /// Whether this replica is a member now (its Lease held and renewed in time), and every change
    /// of it (for metrics and tests). False after `run` ends.
    pub fn joined(&self) -> watch::Receiver<bool> {
        self.joined.subscribe()
    }

    /// Holds this member's Lease until `stop` completes, then releases it if it is its own.
    ///
    /// Returns an error only for invalid settings (see [`RingSettings::validate`]), at once, leaving
    /// the toggle on. See [`Member`] for the protocol.
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<(), RingError> {
        self.settings.validate()?;
        let Member {
            client,
            settings,
            switch,
            joined,
            tenure,
        } = self;
        let membership = Membership {
            api: Api::namespaced(client, &settings.namespace),
            label: settings.label(),
            settings,
            switch,
            joined,
            tenure,
        };
        membership.run(stop).await;
        Ok(())
    }
}

/// Where a member stands in its ring.
#[derive(Debug, Clone)]
enum Phase {
    /// Not joined: no Lease read yet, or creating, taking or renewing it failed (or lost a race), or
    /// its Lease was deleted or released by someone else. Paused.
    Outside,
    /// Joined: `lease` is the object as our last successful write returned it (its resourceVersion
    /// conditions the next renewal), written by a request sent at `renewed_at`. The operator works
    /// until `renewed_at + renew_deadline` unless a renewal succeeds first.
    Joined {
        lease: Box<Lease>,
        renewed_at: Instant,
    },
    /// The Lease names `holder` (the assigner took it over): paused until the Lease is deleted.
    Evicted { holder: String },
}

/// How a renewal went.
enum Renewal {
    /// The Lease is ours for another term: the object written, and when the write was sent.
    Renewed(Box<Lease>, Instant),
    /// The Lease names another holder now.
    Taken(String),
    /// The Lease names nobody: someone released it, and the assigner may move our objects.
    Freed,
    /// The Lease is gone.
    Deleted,
    /// The request failed; try again while the deadline allows.
    Failed(String),
}

/// One run of a member. Dropping it (at the end of `run`, or when the `run` future is dropped)
/// pauses the operator.
struct Membership {
    api: Api<Lease>,
    settings: RingSettings,
    switch: PauseSwitch,
    joined: watch::Sender<bool>,
    label: String,
    tenure: Tenure,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.leave(stopped(&self.settings));
    }
}

impl Membership {
    async fn run(&self, stop: impl Future<Output = ()>) {
        self.leave(not_joined_yet(&self.settings));
        let (phase, in_flight) = hold(
            stop,
            Phase::Outside,
            self.settings.retry_period,
            |phase| self.step(phase),
            |phase| match phase {
                Phase::Joined { renewed_at, .. } => {
                    Some(*renewed_at + self.settings.renew_deadline)
                }
                _ => None,
            },
        )
        .await;
        self.leave(stopped(&self.settings));
        self.release(&phase, in_flight).await;
        tracing::debug!(lease = %self.label, "ring membership stopped");
    }

    async fn step(&self, phase: Phase) -> Phase {
        match phase {
            Phase::Outside | Phase::Evicted { .. } => self.try_join(phase).await,
            Phase::Joined { lease, renewed_at } => self.try_renew(lease, renewed_at).await,
        }
    }

    /// One attempt to join, bounded in time.
    async fn try_join(&self, phase: Phase) -> Phase {
        let timeout = self.settings.attempt_timeout();
        match tokio::time::timeout(timeout, self.join(&phase)).await {
            Ok(next) => next,
            Err(_elapsed) => {
                tracing::warn!(lease = %self.label, ?timeout, "joining the ring timed out; retrying");
                phase
            }
        }
    }

    async fn join(&self, phase: &Phase) -> Phase {
        let name = self.settings.lease_name();
        let current = match self.api.get_opt(&name).await {
            Ok(current) => current,
            Err(error) => {
                tracing::warn!(lease = %self.label, %error, "cannot read the member lease; retrying");
                return phase.clone();
            }
        };
        let params = writes(MEMBER_FIELD_MANAGER);
        let sent_at = Instant::now();
        let written = match current {
            None => self.api.create(&params, &self.fresh_lease()).await,
            Some(current) => {
                let spec = current.spec.clone().unwrap_or_default();
                let mine = holder(&spec).is_none_or(|h| h == self.settings.identity);
                // Taken over: never taken back, whatever it says now; only its deletion frees us.
                if !mine || matches!(phase, Phase::Evicted { .. }) {
                    return self.evicted(phase, holder(&spec).unwrap_or("nobody"));
                }
                self.api
                    .replace(&name, &params, &self.claim(&current))
                    .await
            }
        };
        match written {
            Ok(lease) => self.became_member(lease, sent_at, phase),
            Err(error) if is_conflict(&error) => {
                tracing::debug!(lease = %self.label, "the member lease changed while joining; looking again");
                phase.clone()
            }
            Err(error) => {
                tracing::warn!(lease = %self.label, %error, "cannot write the member lease; retrying");
                phase.clone()
            }
        }
    }

    /// The Lease names `holder`: paused until it is deleted.
    fn evicted(&self, phase: &Phase, holder: &str) -> Phase {
        let reason = format!(
            "not a member of ring {}: lease {} is held by {holder} (taken over); waiting until it is deleted, once this replica's objects have moved",
            self.settings.ring, self.label
        );
        self.leave(reason);
        if !matches!(phase, Phase::Evicted { holder: h } if h == holder) {
            tracing::info!(lease = %self.label, holder, "the member lease is taken over; waiting until the assigner deletes it");
        }
        Phase::Evicted {
            holder: holder.to_string(),
        }
    }

    /// One renewal, bounded by the renew deadline.
    async fn try_renew(&self, lease: Box<Lease>, renewed_at: Instant) -> Phase {
        let deadline = renewed_at + self.settings.renew_deadline;
        let now = Instant::now();
        if now >= deadline {
            return self.lose("renewals failed until the renew deadline");
        }
        let until = (now + self.settings.attempt_timeout()).min(deadline);
        let error = match tokio::time::timeout_at(until, self.renew(&lease)).await {
            Ok(Renewal::Renewed(lease, renewed_at)) => {
                tracing::trace!(lease = %self.label, "renewed the member lease");
                self.tenure
                    .hold_until(renewed_at + self.settings.renew_deadline);
                return Phase::Joined { lease, renewed_at };
            }
            Ok(Renewal::Taken(holder)) => {
                tracing::error!(lease = %self.label, identity = %self.settings.identity, holder, "the member lease was taken over; pausing");
                let phase = Phase::Evicted {
                    holder: holder.clone(),
                };
                return self.evicted(&phase, &holder);
            }
            Ok(Renewal::Freed) => return self.lose("the lease was released by someone else"),
            Ok(Renewal::Deleted) => return self.lose("the lease was deleted"),
            Ok(Renewal::Failed(error)) => error,
            Err(_elapsed) => "the request timed out".to_string(),
        };
        if Instant::now() >= deadline {
            self.lose(&format!(
                "renewals failed until the renew deadline; the last one: {error}"
            ))
        } else {
            tracing::warn!(lease = %self.label, %error, "cannot renew the member lease; retrying");
            Phase::Joined { lease, renewed_at }
        }
    }

    async fn renew(&self, lease: &Lease) -> Renewal {
        let name = self.settings.lease_name();
        let params = writes(MEMBER_FIELD_MANAGER);
        let sent_at = Instant::now();
        match self.api.replace(&name, &params, &self.claim(lease)).await {
            Ok(lease) => return Renewal::Renewed(Box::new(lease), sent_at),
            // Our copy is stale (perhaps our last renewal landed after we gave up on it) or gone: look.
            Err(error) if is_conflict(&error) || is_not_found(&error) => {}
            Err(error) => return Renewal::Failed(error.to_string()),
        }
        let current = match self.api.get_opt(&name).await {
            Ok(Some(current)) => current,
            Ok(None) => return Renewal::Deleted,
            Err(error) => return Renewal::Failed(error.to_string()),
        };
        let spec = current.spec.clone().unwrap_or_default();
        match holder(&spec) {
            None => return Renewal::Freed,
            Some(other) if other != self.settings.identity => {
                return Renewal::Taken(other.to_string())
            }
            Some(_) => {}
        }
        let sent_at = Instant::now();
        match self
            .api
            .replace(&name, &params, &self.claim(&current))
            .await
        {
            Ok(lease) => Renewal::Renewed(Box::new(lease), sent_at),
            Err(error) => Renewal::Failed(error.to_string()),
        }
    }

    /// Stops working now: the renew deadline passed, or the Lease was deleted or freed under us.
    fn lose(&self, why: &str) -> Phase {
        self.leave(format!(
            "not a member of ring {}: lost lease {} ({why})",
            self.settings.ring, self.label
        ));
        tracing::error!(lease = %self.label, identity = %self.settings.identity, reason = %why, deadline = ?self.settings.renew_deadline, "lost the member lease; pausing");
        Phase::Outside
    }

    fn became_member(&self, lease: Lease, renewed_at: Instant, phase: &Phase) -> Phase {
        let uid = lease.metadata.uid.clone().unwrap_or_default();
        if let Phase::Evicted { .. } = phase {
            tracing::info!(lease = %self.label, identity = %self.settings.identity, %uid, "the taken-over lease was deleted; joined the ring again under a fresh lease");
        } else {
            tracing::info!(lease = %self.label, identity = %self.settings.identity, %uid, "joined the ring");
        }
        self.joined
            .send_if_modified(|joined| !std::mem::replace(joined, true));
        self.tenure
            .hold_until(renewed_at + self.settings.renew_deadline);
        self.switch.set(MEMBER_TOGGLE, None);
        Phase::Joined {
            lease: Box::new(lease),
            renewed_at,
        }
    }

    /// Not a member: the operator pauses first, then `joined` turns false.
    fn leave(&self, reason: String) {
        self.tenure.end();
        self.switch.set(MEMBER_TOGGLE, Some(reason));
        self.joined
            .send_if_modified(|joined| std::mem::replace(joined, false));
    }

    /// Gives the Lease up if it may be ours, so that the assigner moves our objects at once.
    async fn release(&self, phase: &Phase, in_flight: bool) {
        let known = match phase {
            Phase::Joined { lease, .. } => Some(&**lease),
            Phase::Evicted { .. } if !in_flight => return,
            Phase::Outside | Phase::Evicted { .. } => None,
        };
        let timeout = self.settings.renew_deadline;
        match tokio::time::timeout(timeout, self.give_up(known)).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.label, identity = %self.settings.identity, "released the member lease");
            }
            Ok(Ok(false)) => {
                tracing::debug!(lease = %self.label, "nothing to release: the member lease is not ours");
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = %self.label, %error, "cannot release the member lease; it expires by itself");
            }
            Err(_elapsed) => {
                tracing::warn!(lease = %self.label, ?timeout, "releasing the member lease timed out; it expires by itself");
            }
        }
    }

    /// Writes the Lease as released; `Ok(false)` if it is not ours (any more).
    async fn give_up(&self, known: Option<&Lease>) -> Result<bool, kube::Error> {
        let name = self.settings.lease_name();
        let params = writes(MEMBER_FIELD_MANAGER);
        if let Some(lease) = known {
            match self
                .api
                .replace(&name, &params, &released(lease, Some(String::new())))
                .await
            {
                Ok(_) => return Ok(true),
                Err(error) => {
                    tracing::debug!(lease = %self.label, %error, "releasing the member lease as last renewed failed; reading it")
                }
            }
        }
        let Some(current) = self.api.get_opt(&name).await? else {
            return Ok(false);
        };
        if current.spec.as_ref().and_then(holder) != Some(self.settings.identity.as_str()) {
            return Ok(false);
        }
        self.api
            .replace(&name, &params, &released(&current, Some(String::new())))
            .await?;
        Ok(true)
    }

    /// A new Lease held by us, labelled as the ring's.
    fn fresh_lease(&self) -> Lease {
        let now = micro_now();
        Lease {
            metadata: ObjectMeta {
                name: Some(self.settings.lease_name()),
                namespace: Some(self.settings.namespace.clone()),
                labels: Some(self.labels()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.settings.identity.clone()),
                lease_duration_seconds: Some(self.settings.lease_duration_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        }
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (RING_LABEL.to_string(), self.settings.ring.clone()),
            (MEMBER_LABEL.to_string(), self.settings.identity.clone()),
        ])
    }

    /// `current` held (taken or renewed) by us from now, keeping its resourceVersion and other fields.
    fn claim(&self, current: &Lease) -> Lease {
        let now = micro_now();
        let mut lease = current.clone();
        lease
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .extend(self.labels());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if holder(spec) != Some(self.settings.identity.as_str()) {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.acquire_time.get_or_insert_with(|| now.clone());
        spec.lease_transitions.get_or_insert(0);
        spec.holder_identity = Some(self.settings.identity.clone());
        spec.lease_duration_seconds = Some(self.settings.lease_duration_seconds());
        spec.renew_time = Some(now);
        lease
    }
}

fn not_joined_yet(settings: &RingSettings) -> String {
    format!(
        "not a member of ring {} yet: lease {} is not held yet",
        settings.ring,
        settings.label()
    )
}

fn stopped(settings: &RingSettings) -> String {
    format!(
        "not a member of ring {}: membership (lease {}) stopped",
        settings.ring,
        settings.label()
    )
}

// ------------------------------------------------------------------------------------------------
// The assigner's view of the members.

/// A member's Lease as the assigner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Held by the member and changed less than `leaseDurationSeconds` ago (by the assigner's clock,
    /// since it first saw the Lease as it is): the member works, and gets objects.
    Ready,
    /// Held by the member but unchanged for `leaseDurationSeconds`: the member has paused itself. The
    /// assigner takes the Lease over before it moves the member's objects.
    Expired,
    /// Released (empty holder): the member stopped all work; its objects move at once.
    Released,
    /// Taken over by an assigner (a holder starting with [`ASSIGNER_PREFIX`]): the member cannot renew
    /// it any more; its objects move at once, then the Lease is deleted.
    TakenOver,
}

impl MemberState {
    /// Whether the member's objects may move at once (and its Lease be deleted once they have).
    pub fn is_dead(self) -> bool {
        matches!(self, MemberState::Released | MemberState::TakenOver)
    }
}

/// The state of `member`'s Lease, `observed` as it is since `observed.since`, at `now`. A Lease
/// without a duration gets `fallback` (ours). A holder that is neither the member, nor empty, nor
/// an assigner (nobody but the member and the assigner should write it) counts as the member's own:
/// it expires when nobody renews it, and is taken over.
fn member_state(
    member: &str,
    observed: &Observed,
    now: Instant,
    fallback: Duration,
) -> MemberState {
    match holder(&observed.spec) {
        None => MemberState::Released,
        Some(holder) if holder.starts_with(ASSIGNER_PREFIX) => MemberState::TakenOver,
        Some(holder) => {
            if holder != member {
                tracing::debug!(member, holder, "a member lease with a foreign holder");
            }
            if now < observed.expires_at(fallback) {
                MemberState::Ready
            } else {
                MemberState::Expired
            }
        }
    }
}

/// What the assigner knows of the ring and has done, for metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RingView {
    /// Whether this assigner acts now (its replica leads).
    pub leading: bool,
    /// The members by their Leases, as the last look (while leading) found them.
    pub members: BTreeMap<String, MemberState>,
    /// Owners named by objects' labels that have no Lease, as the last resync found them.
    pub unknown: BTreeSet<String>,
    /// Objects labelled for their first owner (or a new one after their owner handed them over).
    pub assigned: u64,
    /// Drain labels added: owners asked to hand an object over to the member that now wins it.
    pub drained: u64,
    /// Objects moved from a dead member to a live one.
    pub relabelled: u64,
    /// Leases of expired members taken over.
    pub takeovers: u64,
    /// Leases of dead members deleted once none of their objects was left.
    pub deleted_leases: u64,
    /// Label writes that found the object changed (409) and were skipped.
    pub conflicts: u64,
    /// Resyncs completed (every target listed).
    pub resyncs: u64,
    /// The objects each owner has, as the last complete resync left them.
    pub objects: BTreeMap<String, usize>,
}

impl RingView {
    /// The members that get objects now (their Leases [`MemberState::Ready`]), sorted.
    pub fn live(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|(_, state)| **state == MemberState::Ready)
            .map(|(member, _)| member.clone())
            .collect()
    }
}

/// A resource whose objects the ring shares, in one namespace or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The resource.
    pub resource: ApiResource,
    /// The namespace; `None` for all namespaces, or for a cluster-scoped resource.
    pub namespace: Option<String>,
}

impl Target {
    /// The objects of `resource` in `namespace`, or in all namespaces (or cluster-scoped) with `None`.
    pub fn new(resource: ApiResource, namespace: Option<String>) -> Self {
        Target {
            resource,
            namespace,
        }
    }

    /// `plural.group` (`configmaps` for the core group) and the namespace, for logs.
    fn label(&self) -> String {
        let resource = if self.resource.group.is_empty() {
            self.resource.plural.clone()
        } else {
            format!("{}.{}", self.resource.plural, self.resource.group)
        };
        match &self.namespace {
            Some(namespace) => format!("{resource} in {namespace}"),
            None => resource,
        }
    }
}

/// Assigns the ring's objects to its members while this replica leads.
///
/// ```no_run
/// # async fn example(client: kube::Client, is_leader: tokio::sync::watch::Receiver<bool>) -> Result<(), kactor_peering::sharding::RingError> {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kactor_peering::sharding::{Assigner, RingSettings, Target};
/// use kube::api::ApiResource;
///
/// let settings = RingSettings::new("my-operator", "kube-system", "my-operator-7d9f-xk2p");
/// let targets = vec![Target::new(ApiResource::erase::<ConfigMap>(&()), None)];
/// let assigner = Assigner::new(client, settings, targets);
/// let view = assigner.view(); // for metrics
/// // `is_leader`: the LeaderElector's (with a PauseSwitch of its own).
/// assigner.run(is_leader, async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
///
/// **Expected flow**: nothing while `is_leader` is false. While it is true: every `retry_period` the
/// ring's Leases are listed (`kactor.dev/ring=<ring>`) and each member's [`MemberState`] decided;
/// an `Expired` Lease is taken over by a write conditional on its resourceVersion (holder
/// `assigner/<identity>`). The live members are the `Ready` ones; the dead ones are `TakenOver`,
/// `Released`, and owners with no Lease at all for `lease_duration` since this assigner first saw
/// them missing. A metadata-only watch of each target's unlabelled objects
/// (`!shard.kactor.dev/<ring>`) labels each for [`owner`]`(uid, live)`. Every `resync_period`, and at
/// once when the live or dead members change, each target is listed metadata-only from the watch
/// cache (`resourceVersion=0`): unlabelled objects are labelled, a dead owner's objects relabelled
/// (and their drain label dropped), and a live owner's objects that another member now wins get the
/// drain label (unless being deleted); the owner hands them over by removing both labels, and the
/// watch brings them back to be labelled for their new owner. A dead member's Lease is deleted (on
/// its resourceVersion) once a resync leaves none of its objects, so that it may join again.
///
/// **Guarantees**
/// * Every label write is a merge patch carrying the resourceVersion the assigner saw: an object that
///   changed meanwhile (409) is skipped, and comes again by the watch or the next resync.
/// * An expired member's objects move only after the takeover write succeeded, which proves the
///   member had not renewed for `lease_duration` (and so had paused itself `renew_deadline` after its
///   last renewal).
/// * Writes run `concurrent_moves` at once; the assigner reads only the Leases, the metadata watch
///   and `resourceVersion=0` lists, never single objects, so its cost does not grow with the
///   handlers' load.
///
/// **Caveats**
/// * With no live member, nothing is assigned or moved; objects wait.
/// * An `Expired` member's objects stay where they are (unhandled) until the takeover.
/// * A `resourceVersion=0` list may lag behind the objects; writes on its stale versions get 409 and
///   the next resync catches up.
/// * API errors are logged and retried, never returned.
pub struct Assigner {
    client: kube::Client,
    settings: RingSettings,
    targets: Vec<Target>,
    view: watch::Sender<RingView>,
}

impl std::fmt::Debug for Assigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assigner")
            .field("settings", &self.settings)
            .field("targets", &self.targets)
            .field("view", &*self.view.borrow())
            .finish_non_exhaustive()
    }
}

impl Assigner {
    /// The assigner of `settings.ring` for the objects of `targets`, as `settings.identity`.
    pub fn new(client: kube::Client, settings: RingSettings, targets: Vec<Target>) -> Self {
        Assigner {
            client,
            settings,
            targets,
            view: watch::channel(RingView::default()).0,
        }
    }

    /// What the assigner knows and has done, and every change of it.
    pub fn view(&self) -> watch::Receiver<RingView> {
        self.view.subscribe()
    }

    /// Assigns while `is_leader` is true, until `stop` completes. A closed `is_leader` counts as false.
    ///
    /// Returns an error only for invalid settings (see [`RingSettings::validate`]), at once. See
    /// [`Assigner`] for the protocol.
    pub async fn run(
        self,
        mut is_leader: watch::Receiver<bool>,
        stop: impl Future<Output = ()>,
    ) -> Result<(), RingError> {
        self.settings.validate()?;
        let ring = Ring::new(self);
        let mut stop = std::pin::pin!(stop);
        loop {
            let leads = tokio::select! {
                biased;
                () = &mut stop => break,
                () = ring.keep_observing() => break,
                leads = async {
                    let leads = is_leader.wait_for(|leads| *leads).await.is_ok();
                    // A closed channel keeps its last value: true then means nothing.
                    leads && is_leader.has_changed().is_ok()
                } => leads,
            };
            if !leads {
                // Nobody will ever say we lead.
                stop.as_mut().await;
                break;
            }
            tracing::info!(ring = %ring.settings.ring, identity = %ring.settings.identity, "leading: assigning the ring's objects");
            ring.view.send_modify(|view| view.leading = true);
            let term = Term::new(&ring);
            let stopped = tokio::select! {
                biased;
                () = &mut stop => true,
                _ = async { is_leader.wait_for(|leads| !*leads).await.is_ok() } => false,
                () = term.run() => false,
            };
            ring.view.send_modify(|view| view.leading = false);
            tracing::info!(ring = %ring.settings.ring, identity = %ring.settings.identity, "not leading: the assigner stands by");
            if stopped {
                break;
            }
        }
        Ok(())
    }
}

/// The assigner's settings and clients, for all its terms.
struct Ring {
    client: kube::Client,
    settings: RingSettings,
    targets: Vec<Target>,
    view: watch::Sender<RingView>,
    leases: Api<Lease>,
    shard_label: String,
    drain_label: String,
    /// `assigner/<identity>`.
    holder: String,
    /// The member Leases as this replica last saw them, by name, and since when: kept while it
    /// stands by too, so that an assigner that takes over knows how long each has been unchanged
    /// (instead of starting every clock at its first look, and a dead member's after it).
    observed: Mutex<BTreeMap<String, Observed>>,
}

impl Ring {
    fn new(assigner: Assigner) -> Ring {
        let Assigner {
            client,
            settings,
            targets,
            view,
        } = assigner;
        Ring {
            leases: Api::namespaced(client.clone(), &settings.namespace),
            shard_label: shard_label(&settings.ring),
            drain_label: drain_label(&settings.ring),
            holder: format!("{ASSIGNER_PREFIX}{}", settings.identity),
            client,
            settings,
            targets,
            view,
            observed: Mutex::new(BTreeMap::new()),
        }
    }

    /// The ring's member Leases, listed once within the attempt timeout; the error says why not.
    async fn list_members(&self) -> Result<Vec<Lease>, String> {
        let params = ListParams::default().labels(&self.settings.ring_selector());
        let timeout = self.settings.attempt_timeout();
        match tokio::time::timeout(timeout, self.leases.list(&params)).await {
            Ok(Ok(list)) => Ok(list.items),
            Ok(Err(error)) => Err(format!("cannot list the member leases: {error}")),
            Err(_elapsed) => Err(format!(
                "listing the member leases timed out after {timeout:?}"
            )),
        }
    }

    /// Standing by, every replica looks at the ring's Leases every retry period (and writes
    /// nothing), keeping `observed` up to date for when it leads. Never completes.
    async fn keep_observing(&self) {
        loop {
            let started = Instant::now();
            match self.list_members().await {
                Ok(leases) => {
                    let now = Instant::now();
                    let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
                    let seen = leases
                        .into_iter()
                        .filter_map(|lease| {
                            let name = lease.metadata.name?;
                            let spec = lease.spec.unwrap_or_default();
                            let look = Observed::see(observed.get(&name), spec, now);
                            Some((name, look))
                        })
                        .collect();
                    *observed = seen;
                }
                // The member's own Lease loop says so when the API fails; this look is a spare.
                Err(problem) => {
                    tracing::debug!(ring = %self.settings.ring, %problem, "standing by; retrying")
                }
            }
            tokio::time::sleep_until(started + self.settings.retry_period).await;
        }
    }

    /// The key an object's owner is picked by.
    fn key<'m>(&self, metadata: &'m ObjectMeta) -> &'m str {
        let by_namespace = match self.settings.hash_by {
            HashBy::Namespace => metadata.namespace.as_deref(),
            HashBy::Uid => None,
        };
        by_namespace
            .or(metadata.uid.as_deref())
            .or(metadata.name.as_deref())
            .unwrap_or_default()
    }

    /// The owner an object's labels name, if any (an empty value names nobody).
    fn owner_of<'m>(&self, metadata: &'m ObjectMeta) -> Option<&'m str> {
        metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(&self.shard_label))
            .map(String::as_str)
            .filter(|owner| !owner.is_empty())
    }

    fn draining(&self, metadata: &ObjectMeta) -> bool {
        metadata
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key(&self.drain_label))
    }
}

/// The members as one look at the Leases found them: who gets objects, whose objects move.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Members {
    /// `Ready` members, sorted.
    live: Vec<String>,
    /// `TakenOver` and `Released` members, and owners without a Lease for `lease_duration`.
    dead: BTreeSet<String>,
    /// Members that have a Lease (in any state).
    with_lease: BTreeSet<String>,
    /// The Leases that may be deleted once their members' objects are gone (`TakenOver`,
    /// `Released`): member, Lease name, uid, resourceVersion.
    deletable: Vec<(String, String, String, String)>,
}

/// What the assigner does to one object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// Label an unlabelled object for `to`.
    Assign { to: String },
    /// Label a dead owner's object for `to`, dropping any drain label.
    Relabel { from: String, to: String },
    /// Ask the live owner `from` to hand the object over (to `to`, once it is unlabelled).
    Drain { from: String, to: String },
}

/// What to do with an object whose labels name `owner` (and a drain label if `draining`), being
/// deleted if `deleting`, that `pick` wins now, with these `live` and `dead` members.
fn decide(
    owner: Option<&str>,
    draining: bool,
    deleting: bool,
    pick: Option<&str>,
    live: &[String],
    dead: &BTreeSet<String>,
) -> Option<Action> {
    let pick = pick?;
    match owner {
        None => Some(Action::Assign { to: pick.into() }),
        Some(owner) if dead.contains(owner) => Some(Action::Relabel {
            from: owner.into(),
            to: pick.into(),
        }),
        Some(owner)
            if owner != pick
                && !draining
                && !deleting
                && live.iter().any(|member| member == owner) =>
        {
            Some(Action::Drain {
                from: owner.into(),
                to: pick.into(),
            })
        }
        Some(_) => None,
    }
}

/// One label write: the object, the resourceVersion it was seen at, and what to do.
#[derive(Debug, Clone)]
struct Move {
    namespace: Option<String>,
    name: String,
    resource_version: String,
    action: Action,
}

/// How a write went.
enum Outcome {
    Done(Action),
    /// The object changed since it was seen (or is gone): skipped.
    Stale,
    Failed,
}

/// The counts of one batch of writes.
#[derive(Debug, Default)]
struct Tally {
    assigned: u64,
    relabelled: u64,
    drained: u64,
    conflicts: u64,
    failed: u64,
    /// Objects moved away from each dead owner.
    moved_from: BTreeMap<String, usize>,
}

impl Tally {
    /// Adds another batch's counts.
    fn merge(&mut self, other: Tally) {
        self.assigned += other.assigned;
        self.relabelled += other.relabelled;
        self.drained += other.drained;
        self.conflicts += other.conflicts;
        self.failed += other.failed;
        for (owner, moved) in other.moved_from {
            *self.moved_from.entry(owner).or_default() += moved;
        }
    }

    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Done(Action::Assign { .. }) => self.assigned += 1,
            Outcome::Done(Action::Relabel { from, .. }) => {
                self.relabelled += 1;
                *self.moved_from.entry(from).or_default() += 1;
            }
            Outcome::Done(Action::Drain { .. }) => self.drained += 1,
            Outcome::Stale => self.conflicts += 1,
            Outcome::Failed => self.failed += 1,
        }
    }

    fn writes(&self) -> u64 {
        self.assigned + self.relabelled + self.drained + self.conflicts + self.failed
    }
}

/// One term of leadership: its state is dropped when the term ends, and a new term starts afresh
/// (every Lease first seen counts as just changed).
struct Term<'r> {
    ring: &'r Ring,
    /// The last look at the Leases; `None` until the first.
    membership: watch::Sender<Option<Members>>,
    /// Owners named by labels but without a Lease, and when a resync first saw them so.
    missing: Mutex<BTreeMap<String, Instant>>,
}

impl<'r> Term<'r> {
    fn new(ring: &'r Ring) -> Self {
        Term {
            ring,
            membership: watch::channel(None).0,
            missing: Mutex::new(BTreeMap::new()),
        }
    }

    fn settings(&self) -> &RingSettings {
        &self.ring.settings
    }

    /// Runs until dropped: the Leases every `retry_period`; once they are known, a first resync,
    /// then the watches of unlabelled objects and the periodic resyncs.
    async fn run(&self) {
        let assignment = async {
            let mut changes = self.membership.subscribe();
            if changes.wait_for(Option::is_some).await.is_err() {
                return;
            }
            // The ring forms: replicas started together create their Leases moments apart. The
            // first assignment waits until a look at the Leases changed nothing (the membership is
            // published only when it changes), so that it does not give every object to the first
            // members seen and drain most of them back at once.
            let settle = self.settings().retry_period * 2;
            loop {
                match tokio::time::timeout(settle, changes.changed()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => return,
                    Err(_settled) => break,
                }
            }
            changes.borrow_and_update();
            self.resync().await;
            let watches = futures::future::join_all(
                self.ring
                    .targets
                    .iter()
                    .map(|target| self.watch_unlabelled(target)),
            );
            let dead = self.membership.subscribe();
            tokio::join!(self.resyncs(changes), watches, self.relabel_dead(dead));
        };
        tokio::join!(self.look_at_leases(), assignment);
    }

    // --- membership ---

    async fn look_at_leases(&self) {
        loop {
            let started = Instant::now();
            match self.ring.list_members().await {
                Ok(leases) => {
                    // Taken out while looking (a takeover awaits), put back after.
                    let mut observed = std::mem::take(
                        &mut *self.ring.observed.lock().unwrap_or_else(|p| p.into_inner()),
                    );
                    self.look(leases, &mut observed).await;
                    *self.ring.observed.lock().unwrap_or_else(|p| p.into_inner()) = observed;
                }
                Err(problem) => {
                    tracing::warn!(ring = %self.settings().ring, %problem, "retrying")
                }
            }
            tokio::time::sleep_until(started + self.settings().retry_period).await;
        }
    }

    /// Decides every member's state from the Leases just listed, takes expired ones over, and
    /// publishes the membership.
    async fn look(&self, leases: Vec<Lease>, observed: &mut BTreeMap<String, Observed>) {
        let now = Instant::now();
        let mut seen = BTreeMap::new();
        let mut states = BTreeMap::new();
        let mut membership = Members::default();
        for lease in leases {
            let Some(member) = self.member_of(&lease) else {
                continue;
            };
            let name = member_lease_name(&self.settings().ring, &member);
            let mut lease = lease;
            let mut look = Observed::see(
                observed.get(&name),
                lease.spec.clone().unwrap_or_default(),
                now,
            );
            let mut state = member_state(&member, &look, now, self.settings().lease_duration);
            if state == MemberState::Expired {
                if let Some(taken) = self.take_over(&member, &lease).await {
                    look = Observed::see(None, taken.spec.clone().unwrap_or_default(), now);
                    state = MemberState::TakenOver;
                    lease = taken;
                }
            }
            seen.insert(name.clone(), look);
            match state {
                MemberState::Ready => membership.live.push(member.clone()),
                MemberState::Expired => {}
                MemberState::Released | MemberState::TakenOver => {
                    membership.dead.insert(member.clone());
                    let uid = lease.metadata.uid.clone().unwrap_or_default();
                    let rv = lease.metadata.resource_version.clone().unwrap_or_default();
                    membership.deletable.push((member.clone(), name, uid, rv));
                }
            }
            membership.with_lease.insert(member.clone());
            states.insert(member, state);
        }
        *observed = seen;
        membership.live.sort();
        let lease_duration = self.settings().lease_duration;
        let unknown: BTreeSet<String> = {
            let missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
            for (owner, since) in missing.iter() {
                if !membership.with_lease.contains(owner) && now >= *since + lease_duration {
                    membership.dead.insert(owner.clone());
                }
            }
            missing
                .keys()
                .filter(|owner| !membership.with_lease.contains(*owner))
                .cloned()
                .collect()
        };
        self.ring.view.send_if_modified(|view| {
            let changed = view.members != states || view.unknown != unknown;
            view.members = states;
            view.unknown = unknown;
            changed
        });
        self.membership.send_if_modified(|current| {
            let changed = current
                .as_ref()
                .is_none_or(|c| c.live != membership.live || c.dead != membership.dead);
            if changed {
                tracing::info!(ring = %self.settings().ring, live = ?membership.live, dead = ?membership.dead, "the ring's members changed");
            }
            *current = Some(membership);
            changed
        });
    }

    /// The member a Lease of the ring is for: its member label, if its name is `<ring>-<member>`.
    fn member_of(&self, lease: &Lease) -> Option<String> {
        let member = lease.metadata.labels.as_ref()?.get(MEMBER_LABEL)?;
        let name = lease.metadata.name.as_deref()?;
        if name != member_lease_name(&self.settings().ring, member) {
            tracing::debug!(ring = %self.settings().ring, lease = name, member, "a lease of the ring not named <ring>-<member>; ignored");
            return None;
        }
        Some(member.clone())
    }

    /// Takes an expired member's Lease over, conditional on the resourceVersion seen: success proves
    /// the member can no longer renew it.
    async fn take_over(&self, member: &str, lease: &Lease) -> Option<Lease> {
        let mut taken = lease.clone();
        let now = micro_now();
        let spec = taken.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.ring.holder.clone());
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        let name = lease.metadata.name.clone().unwrap_or_default();
        let timeout = self.settings().attempt_timeout();
        let params = writes(ASSIGNER_FIELD_MANAGER);
        let write = self.ring.leases.replace(&name, &params, &taken);
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(taken)) => {
                tracing::info!(ring = %self.settings().ring, member, lease = %name, holder = %self.ring.holder, "took over the lease of an expired member; moving its objects");
                self.ring.view.send_modify(|view| view.takeovers += 1);
                Some(taken)
            }
            Ok(Err(error)) if is_conflict(&error) || is_not_found(&error) => {
                tracing::debug!(ring = %self.settings().ring, member, %error, "the expired member's lease changed before the takeover");
                None
            }
            Ok(Err(error)) => {
                tracing::warn!(ring = %self.settings().ring, member, %error, "cannot take over the expired member's lease; retrying");
                None
            }
            Err(_elapsed) => {
                tracing::warn!(ring = %self.settings().ring, member, ?timeout, "taking over the expired member's lease timed out; retrying");
                None
            }
        }
    }

    // --- resyncs ---

    /// A dead member's objects, as soon as it is found dead (its Lease taken over or released),
    /// listed by its label (the API server filters them) and relabelled for the live members: in
    /// time proportional to their number, without waiting for a resync under way over every object.
    async fn relabel_dead(&self, mut changes: watch::Receiver<Option<Members>>) {
        let mut done: BTreeSet<String> = BTreeSet::new();
        loop {
            let membership = changes.borrow_and_update().clone();
            if let Some(membership) = membership {
                // A member that is dead no more (it rejoined) may die again later.
                done.retain(|member| membership.dead.contains(member));
                let fresh: Vec<&String> = membership
                    .dead
                    .iter()
                    .filter(|d| !done.contains(*d))
                    .collect();
                for dead in fresh {
                    let selector = format!("{}={dead}", self.ring.shard_label);
                    let mut complete = true;
                    for target in &self.ring.targets {
                        let pass = self.resync_target(target, &membership, Some(&selector));
                        if let Err(error) = pass.await {
                            complete = false;
                            tracing::warn!(ring = %self.settings().ring, target = %target.label(), member = %dead, %error, "cannot list a dead member's objects; the next resync moves them");
                        }
                    }
                    if complete {
                        done.insert(dead.clone());
                    }
                }
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// A resync every `resync_period`, and at once when the live or dead members change.
    async fn resyncs(&self, mut changes: watch::Receiver<Option<Members>>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.settings().resync_period) => {}
                changed = changes.changed() => if changed.is_err() { return },
            }
            self.resync().await;
        }
    }

    /// Lists every target and puts every object where it belongs; then deletes the Leases of dead
    /// members none of whose objects is left.
    async fn resync(&self) {
        let Some(membership) = self.membership.borrow().clone() else {
            return;
        };
        let mut left: BTreeMap<String, usize> = BTreeMap::new();
        let mut complete = true;
        for target in &self.ring.targets {
            match self.resync_target(target, &membership, None).await {
                Ok(owners) => {
                    for (owner, count) in owners {
                        *left.entry(owner).or_default() += count;
                    }
                }
                Err(error) => {
                    complete = false;
                    tracing::warn!(ring = %self.settings().ring, target = %target.label(), %error, "cannot list the objects for a resync; retrying at the next");
                }
            }
        }
        let now = Instant::now();
        {
            let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
            if complete {
                missing.retain(|owner, _| left.get(owner).is_some_and(|count| *count > 0));
            }
            for (owner, count) in &left {
                if *count > 0 && !membership.with_lease.contains(owner) {
                    missing.entry(owner.clone()).or_insert(now);
                }
            }
        }
        if !complete {
            return;
        }
        self.ring.view.send_modify(|view| {
            view.resyncs += 1;
            view.objects = left.clone();
        });
        for (member, name, uid, rv) in &membership.deletable {
            if left.get(member).copied().unwrap_or(0) == 0 {
                self.delete_lease(member, name, uid, rv).await;
            }
        }
    }

    /// One target's objects (those `selector` selects, or all): the objects whose owner each label
    /// names, left after the moves.
    async fn resync_target(
        &self,
        target: &Target,
        membership: &Members,
        selector: Option<&str>,
    ) -> Result<BTreeMap<String, usize>, kube::Error> {
        let api = slim::api(
            self.ring.client.clone(),
            target.namespace.as_deref(),
            &target.resource,
        );
        let mut owners: BTreeMap<String, usize> = BTreeMap::new();
        let mut tally = Tally::default();
        // Page by page, each page's moves written before the next is read: the assigner holds one
        // page of metadata at a time, however many objects there are.
        let select = |params: ListParams| match selector {
            Some(selector) => params.labels(selector),
            None => params,
        };
        let mut params = select(ListParams::default().match_any().limit(RESYNC_PAGE));
        loop {
            let list = api.list_metadata(&params).await?;
            let mut moves = Vec::new();
            for object in list.items {
                let metadata = object.metadata;
                let labelled = self.ring.owner_of(&metadata);
                if let Some(labelled) = labelled {
                    *owners.entry(labelled.to_string()).or_default() += 1;
                }
                let pick = owner(self.ring.key(&metadata), &membership.live);
                let action = decide(
                    labelled,
                    self.ring.draining(&metadata),
                    metadata.deletion_timestamp.is_some(),
                    pick,
                    &membership.live,
                    &membership.dead,
                );
                if let Some(action) = action {
                    moves.extend(to_move(metadata, action));
                }
            }
            tally.merge(self.write_all(target, moves).await);
            match list.metadata.continue_.filter(|token| !token.is_empty()) {
                // The next pages come from the same snapshot, which the token names.
                Some(token) => {
                    params = select(
                        ListParams::default()
                            .limit(RESYNC_PAGE)
                            .continue_token(&token),
                    )
                }
                None => break,
            }
        }
        for (owner, moved) in &tally.moved_from {
            if let Some(count) = owners.get_mut(owner) {
                *count = count.saturating_sub(*moved);
            }
        }
        if tally.writes() > 0 {
            tracing::info!(ring = %self.settings().ring, target = %target.label(), assigned = tally.assigned, relabelled = tally.relabelled, drained = tally.drained, conflicts = tally.conflicts, failed = tally.failed, "resync: moved objects");
        } else {
            tracing::debug!(ring = %self.settings().ring, target = %target.label(), "resync: every object is where it belongs");
        }
        Ok(owners)
    }

    async fn delete_lease(&self, member: &str, name: &str, uid: &str, rv: &str) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(rv.to_string()).filter(|rv| !rv.is_empty()),
                uid: Some(uid.to_string()).filter(|uid| !uid.is_empty()),
            }),
            ..DeleteParams::default()
        };
        let timeout = self.settings().attempt_timeout();
        match tokio::time::timeout(timeout, self.ring.leases.delete(name, &params)).await {
            Ok(Ok(_)) => {
                tracing::info!(ring = %self.settings().ring, member, lease = name, "deleted the lease of a departed member: none of its objects is left");
                self.ring.view.send_modify(|view| view.deleted_leases += 1);
            }
            Ok(Err(error)) if is_conflict(&error) || is_not_found(&error) => {
                tracing::debug!(ring = %self.settings().ring, member, %error, "the departed member's lease changed; not deleted");
            }
            Ok(Err(error)) => {
                tracing::warn!(ring = %self.settings().ring, member, %error, "cannot delete the departed member's lease; retrying at the next resync");
            }
            Err(_elapsed) => {
                tracing::warn!(ring = %self.settings().ring, member, ?timeout, "deleting the departed member's lease timed out; retrying at the next resync");
            }
        }
    }

    // --- the unlabelled objects ---

    /// Watches a target's unlabelled objects and labels each for its owner; a watch that ends for
    /// good (the resource not served, the selector rejected) is started again after a resync period.
    async fn watch_unlabelled(&self, target: &Target) {
        loop {
            let api = slim::api(
                self.ring.client.clone(),
                target.namespace.as_deref(),
                &target.resource,
            );
            let label = format!(
                "unlabelled {} of ring {}",
                target.label(),
                self.settings().ring
            );
            let mut watcher = Watcher::new(api, label, Watching::default(), Networking::default())
                .metadata_only()
                .labels(&format!("!{}", self.ring.shard_label));
            let error = loop {
                match watcher.next_batch().await {
                    Ok(items) => self.assign(target, items).await,
                    Err(error) => break error,
                }
            };
            tracing::error!(ring = %self.settings().ring, target = %target.label(), %error, "the watch of unlabelled objects ended; starting it again after a resync period");
            tokio::time::sleep(self.settings().resync_period).await;
        }
    }

    /// Labels the unlabelled objects of one watch batch for their owners.
    async fn assign(&self, target: &Target, items: Vec<WatchItem>) {
        let Some(membership) = self.membership.borrow().clone() else {
            return;
        };
        // The last version of each object in the batch.
        let mut latest: BTreeMap<(Option<String>, String), ObjectMeta> = BTreeMap::new();
        for item in items {
            let (deleted, object) = match item {
                WatchItem::Listed(object) => (false, object),
                WatchItem::Event(event, object) => (event == EventType::Deleted, object),
                WatchItem::ListDone => continue,
            };
            let metadata = object.metadata;
            let key = (
                metadata.namespace.clone(),
                metadata.name.clone().unwrap_or_default(),
            );
            if deleted {
                latest.remove(&key);
            } else {
                latest.insert(key, metadata);
            }
        }
        let moves: Vec<Move> = latest
            .into_values()
            .filter(|metadata| self.ring.owner_of(metadata).is_none())
            .filter_map(|metadata| {
                let pick = owner(self.ring.key(&metadata), &membership.live)?;
                to_move(metadata, Action::Assign { to: pick.into() })
            })
            .collect();
        if moves.is_empty() {
            return;
        }
        let tally = self.write_all(target, moves).await;
        tracing::info!(ring = %self.settings().ring, target = %target.label(), assigned = tally.assigned, conflicts = tally.conflicts, failed = tally.failed, "assigned unlabelled objects");
    }

    // --- writes ---

    /// Runs `moves`, `concurrent_moves` at once, and counts them in the view.
    async fn write_all(&self, target: &Target, moves: Vec<Move>) -> Tally {
        let mut tally = Tally::default();
        let mut outcomes = stream::iter(moves)
            .map(|one| self.write(target, one))
            .buffer_unordered(self.settings().concurrent_moves);
        while let Some(outcome) = outcomes.next().await {
            tally.add(outcome);
        }
        self.ring.view.send_modify(|view| {
            view.assigned += tally.assigned;
            view.relabelled += tally.relabelled;
            view.drained += tally.drained;
            view.conflicts += tally.conflicts;
        });
        tally
    }

    /// One label write: a merge patch conditional on the resourceVersion seen.
    async fn write(&self, target: &Target, one: Move) -> Outcome {
        let ring = self.ring;
        let mut labels = serde_json::Map::new();
        match &one.action {
            Action::Assign { to } | Action::Relabel { to, .. } => {
                labels.insert(ring.shard_label.clone(), json!(to));
                labels.insert(ring.drain_label.clone(), json!(null));
            }
            Action::Drain { .. } => {
                labels.insert(ring.drain_label.clone(), json!(DRAINING));
            }
        }
        let patch =
            json!({"metadata": {"resourceVersion": one.resource_version, "labels": labels}});
        let api = slim::api(
            ring.client.clone(),
            one.namespace.as_deref(),
            &target.resource,
        );
        let result = api
            .patch_metadata(
                &one.name,
                &PatchParams {
                    field_manager: Some(ASSIGNER_FIELD_MANAGER.to_string()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await;
        let object = match &one.namespace {
            Some(namespace) => format!("{namespace}/{}", one.name),
            None => one.name.clone(),
        };
        match result {
            Ok(_) => {
                tracing::debug!(ring = %ring.settings.ring, %object, action = ?one.action, "moved");
                Outcome::Done(one.action)
            }
            Err(error) if is_conflict(&error) || is_not_found(&error) => {
                tracing::debug!(ring = %ring.settings.ring, %object, action = ?one.action, "the object changed since it was seen; skipped");
                Outcome::Stale
            }
            Err(error) => {
                tracing::warn!(ring = %ring.settings.ring, %object, action = ?one.action, %error, "cannot label the object; it is retried at the next resync");
                Outcome::Failed
            }
        }
    }
}

/// The write of `action` to the object of `metadata`, at the resourceVersion seen.
fn to_move(metadata: ObjectMeta, action: Action) -> Option<Move> {
    Some(Move {
        name: metadata.name?,
        resource_version: metadata.resource_version?,
        namespace: metadata.namespace,
        action,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `score("pod-a", "uid-1")`, as first computed: a change of the hash moves every object.
    const GOLDEN: u64 = 0xf8b3_d443_32f9_3cec;

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// `count` uid-like keys from a fixed seed.
    fn uids(count: usize, seed: u64) -> Vec<String> {
        let mut state = seed;
        (0..count)
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let a = mix(state);
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let b = mix(state);
                format!(
                    "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xffff,
                    b >> 48,
                    b & 0xffff_ffff_ffff
                )
            })
            .collect()
    }

    #[test]
    fn the_owner_is_deterministic_and_independent_of_the_members_order() {
        let four = members(&["pod-a", "pod-b", "pod-c", "pod-d"]);
        let mut shuffled = four.clone();
        shuffled.rotate_left(2);
        shuffled.swap(0, 3);
        for key in uids(500, 1) {
            let first = owner(&key, &four);
            assert!(first.is_some());
            assert_eq!(owner(&key, &four), first);
            assert_eq!(owner(&key, &shuffled), first, "{key}");
        }
        assert_eq!(owner("x", &[]), None);
        assert_eq!(owner("x", &members(&["only"])), Some("only"));
        // Stable across builds, platforms and versions: every replica must pick the same owner.
        assert_eq!(
            fnv1a(*b"a"),
            0xaf63_dc4c_8601_ec8c,
            "the FNV-1a test vector"
        );
        assert_eq!(score("pod-a", "uid-1"), GOLDEN);
        assert_ne!(score("a", "b"), score("b", "a"));
        assert_ne!(score("ab", "c"), score("a", "bc"), "the 0 byte separates");
    }

    #[test]
    fn four_members_get_a_quarter_each() {
        let four = members(&["pod-a", "pod-b", "pod-c", "pod-d"]);
        let keys = uids(10_000, 2);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for key in &keys {
            *counts.entry(owner(key, &four).unwrap()).or_default() += 1;
        }
        assert_eq!(counts.len(), 4);
        for (member, count) in counts {
            assert!(
                (2000..=3000).contains(&count),
                "{member} got {count} of 10000"
            );
        }
    }

    #[test]
    fn a_fifth_member_takes_about_a_fifth_and_only_it_gains() {
        let four = members(&["pod-a", "pod-b", "pod-c", "pod-d"]);
        let mut five = four.clone();
        five.push("pod-e".into());
        let keys = uids(10_000, 3);
        let mut moved = 0;
        for key in &keys {
            let before = owner(key, &four).unwrap();
            let after = owner(key, &five).unwrap();
            if before != after {
                moved += 1;
                assert_eq!(after, "pod-e", "{key} moved from {before} to {after}");
            }
        }
        assert!((1500..=2500).contains(&moved), "{moved} of 10000 moved");
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_keys() {
        let four = members(&["pod-a", "pod-b", "pod-c", "pod-d"]);
        let three = members(&["pod-a", "pod-c", "pod-d"]);
        for key in uids(10_000, 4) {
            let before = owner(&key, &four).unwrap();
            let after = owner(&key, &three).unwrap();
            if before != "pod-b" {
                assert_eq!(before, after, "{key} moved though its owner stayed");
            }
        }
    }

    #[test]
    fn defaults_are_valid_and_bad_settings_say_what_to_change() {
        let settings = RingSettings::new("op", "kube-system", "pod-a");
        assert_eq!(settings.validate(), Ok(()));
        assert_eq!(settings.lease_duration, Duration::from_secs(15));
        assert_eq!(settings.renew_deadline, Duration::from_secs(10));
        assert_eq!(settings.retry_period, Duration::from_secs(2));
        assert_eq!(settings.resync_period, Duration::from_secs(30));
        assert_eq!(settings.concurrent_moves, 100);
        assert_eq!(settings.hash_by, HashBy::Uid);
        assert_eq!(settings.lease_name(), "op-pod-a");

        let ms = Duration::from_millis;
        let refused =
            |lease, renew, retry| settings.clone().with_timings(lease, renew, retry).err();
        assert!(matches!(
            refused(ms(2000), ms(2000), ms(100)),
            Some(RingError::RenewDeadline { .. })
        ));
        assert!(matches!(
            refused(ms(2000), ms(600), ms(600)),
            Some(RingError::RetryPeriod { .. })
        ));
        assert!(matches!(
            refused(ms(1500), ms(600), ms(100)),
            Some(RingError::LeaseDuration { .. })
        ));
        assert!(refused(ms(2000), ms(1200), ms(200)).is_none());

        let check = |ring: &str, namespace: &str, identity: &str| {
            RingSettings::new(ring, namespace, identity)
                .validate()
                .err()
        };
        assert!(matches!(
            check("a/b", "ns", "x"),
            Some(RingError::Ring { .. })
        ));
        assert!(matches!(check("", "ns", "x"), Some(RingError::Ring { .. })));
        assert!(matches!(
            check("op", "ns", "-x"),
            Some(RingError::Identity { .. })
        ));
        assert!(matches!(
            check("op", "ns", "Pod_A"),
            Some(RingError::LeaseName { .. })
        ));
        assert!(matches!(
            check("op", "", "x"),
            Some(RingError::NoNamespace { .. })
        ));
        let mut zero = settings.clone();
        zero.concurrent_moves = 0;
        assert!(matches!(
            zero.validate(),
            Err(RingError::ConcurrentMoves { .. })
        ));
        zero.concurrent_moves = 1;
        zero.resync_period = Duration::ZERO;
        assert!(matches!(
            zero.validate(),
            Err(RingError::ResyncPeriod { .. })
        ));

        let message = check("op", "ns", "my pod").unwrap().to_string();
        assert!(
            message.contains("\"my pod\"") && message.contains("label value"),
            "{message}"
        );
        let message = check("op", "ns", "Pod_A").unwrap().to_string();
        assert!(
            message.contains("op-Pod_A") && message.contains("lowercase"),
            "{message}"
        );
    }

    #[test]
    fn object_names_are_dns_subdomains() {
        assert!(is_object_name("op-pod-a.b"));
        assert!(!is_object_name("op-Pod"));
        assert!(!is_object_name("op_pod"));
        assert!(!is_object_name("op..pod"));
        assert!(!is_object_name("op-"));
        assert!(!is_object_name(&"a".repeat(254)));
    }

    fn spec(holder: Option<&str>, duration: Option<i32>, renewed: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: duration,
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                renewed.parse().unwrap_or_default(),
            )),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_member_is_ready_until_its_lease_is_unchanged_for_its_duration() {
        let start = Instant::now();
        let fallback = Duration::from_secs(7);
        let s = Duration::from_secs;
        let first = Observed::see(
            None,
            spec(Some("a"), Some(15), "2020-01-01T00:00:00Z"),
            start,
        );
        assert_eq!(
            member_state("a", &first, start, fallback),
            MemberState::Ready,
            "a lease first seen counts as just changed, however old its renewTime"
        );
        let later = start + s(14);
        let same = Observed::see(
            Some(&first),
            spec(Some("a"), Some(15), "2020-01-01T00:00:00Z"),
            later,
        );
        assert_eq!(
            member_state("a", &same, later, fallback),
            MemberState::Ready
        );
        assert_eq!(
            member_state("a", &same, start + s(15), fallback),
            MemberState::Expired
        );
        let renewed = Observed::see(
            Some(&same),
            spec(Some("a"), Some(15), "2020-01-01T00:00:02Z"),
            start + s(15),
        );
        assert_eq!(
            member_state("a", &renewed, start + s(29), fallback),
            MemberState::Ready
        );
        assert_eq!(
            member_state("a", &renewed, start + s(30), fallback),
            MemberState::Expired
        );

        let no_duration = Observed::see(None, spec(Some("a"), None, ""), start);
        assert_eq!(
            member_state("a", &no_duration, start + s(6), fallback),
            MemberState::Ready
        );
        assert_eq!(
            member_state("a", &no_duration, start + s(7), fallback),
            MemberState::Expired
        );

        for empty in [None, Some("")] {
            let released = Observed::see(None, spec(empty, Some(1), ""), start);
            assert_eq!(
                member_state("a", &released, start, fallback),
                MemberState::Released
            );
        }
        let taken = Observed::see(None, spec(Some("assigner/pod-b"), Some(15), ""), start);
        assert_eq!(
            member_state("a", &taken, start, fallback),
            MemberState::TakenOver
        );
        assert_eq!(
            member_state("a", &taken, start + s(100), fallback),
            MemberState::TakenOver,
            "a taken-over lease stays taken over"
        );
        assert!(MemberState::TakenOver.is_dead() && MemberState::Released.is_dead());
        assert!(!MemberState::Ready.is_dead() && !MemberState::Expired.is_dead());
    }

    #[test]
    fn objects_go_to_their_pick_dead_owners_lose_them_and_live_ones_are_asked() {
        let live = members(&["a", "b"]);
        let dead: BTreeSet<String> = ["c".to_string()].into();
        let assign = |to: &str| Some(Action::Assign { to: to.into() });
        assert_eq!(
            decide(None, false, false, Some("a"), &live, &dead),
            assign("a")
        );
        assert_eq!(
            decide(None, true, true, Some("b"), &live, &dead),
            assign("b")
        );
        assert_eq!(
            decide(None, false, false, None, &[], &dead),
            None,
            "no live member"
        );
        assert_eq!(
            decide(Some("c"), true, true, Some("a"), &live, &dead),
            Some(Action::Relabel {
                from: "c".into(),
                to: "a".into()
            })
        );
        assert_eq!(
            decide(Some("a"), false, false, Some("b"), &live, &dead),
            Some(Action::Drain {
                from: "a".into(),
                to: "b".into()
            })
        );
        assert_eq!(
            decide(Some("a"), true, false, Some("b"), &live, &dead),
            None,
            "asked already"
        );
        assert_eq!(
            decide(Some("a"), false, true, Some("b"), &live, &dead),
            None,
            "being deleted"
        );
        assert_eq!(
            decide(Some("a"), false, false, Some("a"), &live, &dead),
            None,
            "in place"
        );
        assert_eq!(
            decide(Some("x"), false, false, Some("a"), &live, &dead),
            None,
            "an owner neither live nor dead (expired, or unknown for now) keeps its objects"
        );
    }
}
