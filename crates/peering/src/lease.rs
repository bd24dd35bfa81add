//! Lease-based leader election, as client-go's `leaderelection` does it (and so controller-runtime and
//! java-operator-sdk): of all the candidates for one `coordination.k8s.io/v1` Lease, at most one leads,
//! and only the leader works; every other candidate keeps the reactor's [`PauseSwitch`] toggle
//! [`PAUSE_TOGGLE`] on.
//!
//! Start with [`LeaderElector`]; [`LeaseSettings`] says which Lease, as whom, and how fast. The protocol
//! is the state machine `State` in this file: `Standby` until the lease is free or expired, `Leading`
//! while renewals succeed, `Released` after a stop.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kactor_reactor::pausing::PauseSwitch;

use crate::leases::{
    check_timings, duration_seconds, hold, holder, is_conflict, is_not_found, micro_now, released,
    Observed, TimingFault,
};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

/// The [`PauseSwitch`] toggle that leader election holds on while this candidate is not the leader.
pub const PAUSE_TOGGLE: &str = "leader-election";

/// Why leader election cannot run with these settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The Lease has no name or no namespace.
    #[error("leader election needs a lease name and namespace (got {namespace:?}/{name:?}); set both, e.g. the operator's name and namespace")]
    NoLease {
        /// The name given.
        name: String,
        /// The namespace given.
        namespace: String,
    },
    /// The identity is empty, which a Lease reads as "nobody holds me".
    #[error("leader election for lease {lease}: the identity is empty; give every candidate a unique one (e.g. the pod name)")]
    NoIdentity {
        /// `namespace/name` of the Lease.
        lease: String,
    },
    /// The lease duration does not fit `leaseDurationSeconds`.
    #[error("leader election for lease {lease}: lease_duration {lease_duration:?} must be a whole number of seconds, at least 1 s (the Lease records it as leaseDurationSeconds)")]
    LeaseDuration {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// The leader would not stop working before others may take its lease.
    #[error("leader election for lease {lease}: renew_deadline {renew_deadline:?} must be shorter than lease_duration {lease_duration:?}, so that a leader that cannot renew stops before others may take the lease")]
    RenewDeadline {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The renew deadline given.
        renew_deadline: Duration,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// The leader would get no second try to renew.
    #[error("leader election for lease {lease}: retry_period {retry_period:?} must be positive and shorter than renew_deadline {renew_deadline:?}, so that a failed renewal is retried before the deadline")]
    RetryPeriod {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The retry period given.
        retry_period: Duration,
        /// The renew deadline given.
        renew_deadline: Duration,
    },
}

/// Which Lease to compete for, as whom, and how fast.
///
/// ```
/// use std::time::Duration;
/// use kactor_peering::lease::LeaseSettings;
///
/// let settings = LeaseSettings::new("my-operator", "kube-system", "my-operator-7d9f-xk2p")
///     .with_timings(Duration::from_secs(30), Duration::from_secs(20), Duration::from_secs(4))?;
/// assert_eq!(settings.renew_deadline, Duration::from_secs(20));
/// # Ok::<(), kactor_peering::lease::LeaseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// The Lease's name, usually the operator's name.
    pub name: String,
    /// The Lease's namespace, usually the operator's own.
    pub namespace: String,
    /// Who this candidate is, written as `holderIdentity`: unique per candidate and stable for the life of
    /// the process (controller-runtime uses `hostname_uuid`; the pod name will do).
    pub identity: String,
    /// How long a lease lasts without renewal before another candidate may take it, from when that
    /// candidate last saw it change. Written as whole seconds to `leaseDurationSeconds`.
    /// Default [`LeaseSettings::DEFAULT_LEASE_DURATION`].
    pub lease_duration: Duration,
    /// How long after its last successful renewal the leader goes on trying to renew before it gives up
    /// leadership; shorter than `lease_duration`, so that it stops before anyone may take over.
    /// Default [`LeaseSettings::DEFAULT_RENEW_DEADLINE`].
    pub renew_deadline: Duration,
    /// How often a candidate tries to acquire the lease, and how often the leader renews it.
    /// Default [`LeaseSettings::DEFAULT_RETRY_PERIOD`].
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// 15 s, as in controller-runtime and java-operator-sdk (client-go's `LeaseDuration`).
    pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
    /// 10 s, as in controller-runtime and java-operator-sdk (client-go's `RenewDeadline`).
    pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
    /// 2 s, as in controller-runtime and java-operator-sdk (client-go's `RetryPeriod`).
    pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

    /// Settings for the Lease `namespace/name` as `identity`, with the timings of controller-runtime:
    /// 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseSettings {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Self::DEFAULT_LEASE_DURATION,
            renew_deadline: Self::DEFAULT_RENEW_DEADLINE,
            retry_period: Self::DEFAULT_RETRY_PERIOD,
        }
    }

    /// The same settings with other timings, checked by [`LeaseSettings::validate`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kactor_peering::lease::LeaseSettings;
    /// let too_tight = LeaseSettings::new("op", "default", "me")
    ///     .with_timings(Duration::from_secs(10), Duration::from_secs(10), Duration::from_secs(2));
    /// assert!(too_tight.is_err(), "the renew deadline must be shorter than the lease");
    /// ```
    pub fn with_timings(
        self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, LeaseError> {
        let settings = LeaseSettings {
            lease_duration,
            renew_deadline,
            retry_period,
            ..self
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Checks that the Lease is named, the identity is not empty, `lease_duration` is whole seconds,
    /// `renew_deadline < lease_duration` and `0 < retry_period < renew_deadline`.
    pub fn validate(&self) -> Result<(), LeaseError> {
        let lease = self.label();
        if self.name.is_empty() || self.namespace.is_empty() {
            return Err(LeaseError::NoLease {
                name: self.name.clone(),
                namespace: self.namespace.clone(),
            });
        }
        if self.identity.is_empty() {
            return Err(LeaseError::NoIdentity { lease });
        }
        match check_timings(self.lease_duration, self.renew_deadline, self.retry_period) {
            Ok(()) => {}
            Err(TimingFault::LeaseDuration) => {
                return Err(LeaseError::LeaseDuration {
                    lease,
                    lease_duration: self.lease_duration,
                })
            }
            Err(TimingFault::RenewDeadline) => {
                return Err(LeaseError::RenewDeadline {
                    lease,
                    renew_deadline: self.renew_deadline,
                    lease_duration: self.lease_duration,
                })
            }
            Err(TimingFault::RetryPeriod) => {
                return Err(LeaseError::RetryPeriod {
                    lease,
                    retry_period: self.retry_period,
                    renew_deadline: self.renew_deadline,
                })
            }
        }
        Ok(())
    }

    /// `namespace/name`, for messages.
    fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `leaseDurationSeconds`; [`LeaseSettings::validate`] has made sure it fits.
    fn lease_duration_seconds(&self) -> i32 {
        duration_seconds(self.lease_duration)
    }

    /// How long one attempt (a read and a write) may take: half the renew deadline, as controller-runtime
    /// bounds each renewal call, so that a hung request leaves time for another try.
    fn attempt_timeout(&self) -> Duration {
        self.renew_deadline / 2
    }
}

/// Competes for a Lease and pauses the operator while it does not hold it.
///
/// ```no_run
/// # async fn example(client: kube::Client) -> Result<(), kactor_peering::lease::LeaseError> {
/// use kactor_peering::lease::{LeaderElector, LeaseSettings};
/// use kactor_reactor::pausing::PauseSwitch;
///
/// let switch = PauseSwitch::new();
/// let settings = LeaseSettings::new("my-operator", "kube-system", "my-operator-7d9f-xk2p");
/// let elector = LeaderElector::new(client, settings, switch.clone());
/// let is_leader = elector.is_leader(); // for `leader_election_master_status{name}`
/// elector.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
///
/// **Expected flow**: the toggle [`PAUSE_TOGGLE`] is on from [`LeaderElector::new`]. [`LeaderElector::run`]
/// reads the Lease every `retry_period`: it creates it if absent; it waits while another identity holds
/// it and it changed less than `leaseDurationSeconds` ago (by this process's clock, from when this
/// candidate saw it change); otherwise it takes it over with a write carrying the resourceVersion it
/// read. Once a write succeeds it leads: the toggle goes off and it renews every `retry_period`. When
/// renewals keep failing until `renew_deadline` has passed since the last successful one, or the Lease
/// names another holder, it stops leading at once (toggle on, an error logged) and competes again. When
/// `stop` completes it turns the toggle on and, if it holds the lease, releases it (empty holder,
/// `leaseDurationSeconds: 1`), so that the next candidate takes over within a `retry_period` (client-go's
/// `ReleaseOnCancel`).
///
/// **Guarantees**
/// * Never two holders: every acquisition and renewal is a write conditional on the resourceVersion
///   read, so of two racing candidates one gets 409 Conflict and stays a candidate.
/// * The toggle is off only while this candidate holds a lease it renewed less than `renew_deadline`
///   ago, counted from before the renewal was sent; others wait `lease_duration` from after they saw it.
///   So the leader pauses `lease_duration - renew_deadline` before anyone may take over.
/// * [`LeaderElector::is_leader`] turns true before the toggle goes off and false after it goes on.
/// * If the `run` future is dropped (a crash, an aborted task), the toggle goes on at once; the lease,
///   not released, expires by itself after `lease_duration`.
///
/// **Assumptions**: every candidate has a unique identity; the clocks of the candidates run at about
/// the same rate (their wall clocks may disagree: only time since an observation counts); nobody but
/// the candidates writes the Lease.
///
/// **Caveats**
/// * A candidate that starts while a dead leader's lease is in place waits a full `lease_duration` from
///   its first look, however old the lease's `renewTime` is.
/// * Deleting the Lease lets a candidate create it and lead at once; the old leader notices at its next
///   renewal, up to one `retry_period` later.
/// * Losing the lease pauses the operator but does not exit the process (controller-runtime exits);
///   the candidate competes again and may lead again.
/// * A process frozen past its renew deadline (a stopped VM, `SIGSTOP`) pauses only when it runs again;
///   work it had in flight may finish after another candidate took over, as with every lease.
/// * API errors are logged and retried every `retry_period`, never returned.
pub struct LeaderElector {
    client: kube::Client,
    settings: LeaseSettings,
    switch: PauseSwitch,
    leader: watch::Sender<bool>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("settings", &self.settings)
            .field("is_leader", &*self.leader.borrow())
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// An elector for `settings.namespace/settings.name` as `settings.identity`; the toggle
    /// [`PAUSE_TOGGLE`] of `switch` goes on at once, so that nothing works before it leads.
    pub fn new(client: kube::Client, settings: LeaseSettings, switch: PauseSwitch) -> Self {
        switch.set(PAUSE_TOGGLE, Some(not_yet(&settings.label())));
        LeaderElector {
            client,
            settings,
            switch,
            leader: watch::channel(false).0,
        }
    }

    /// Whether this candidate leads now, and every change of it (for metrics such as
    /// `leader_election_master_status{name}`, and for tests). False after `run` ends.
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    /// Competes for the lease until `stop` completes, then releases it if it holds it.
    ///
    /// Returns an error only for invalid settings (see [`LeaseSettings::validate`]), at once, leaving the
    /// toggle on. See [`LeaderElector`] for the protocol.
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<(), LeaseError> {
        self.settings.validate()?;
        let LeaderElector {
            client,
            settings,
            switch,
            leader,
        } = self;
        let campaign = Campaign {
            api: Api::namespaced(client, &settings.namespace),
            label: settings.label(),
            settings,
            switch,
            leader,
        };
        campaign.run(stop).await;
        Ok(())
    }
}

/// Where this candidate stands in the election.
#[derive(Debug, Clone)]
enum State {
    /// Not leading: no lease read yet, another identity holds a live one, or acquiring it failed (or
    /// lost a race). Candidates here pause the operator. `observed` is the lease as last read and when
    /// it was first read that way; it expires `leaseDurationSeconds` after that, by our clock.
    Standby { observed: Option<Observed> },
    /// Leading: `lease` is the object as our last successful write returned it (its resourceVersion
    /// conditions the next renewal), written by a request sent at `renewed_at`. The operator works until
    /// `renewed_at + renew_deadline` unless a renewal succeeds first.
    Leading {
        lease: Box<Lease>,
        renewed_at: Instant,
    },
    /// Stopped: the lease was released if it was ours; the operator stays paused. Final.
    Released,
}

/// How a renewal went.
enum Renewal {
    /// The lease is ours for another term: the object written, and when the write was sent.
    Renewed(Box<Lease>, Instant),
    /// The Lease names another holder now (or was created again by another candidate).
    Taken(Option<Observed>, String),
    /// The request failed; try again while the deadline allows.
    Failed(String),
}

/// One run of an elector. Dropping it (at the end of `run`, or when the `run` future is dropped)
/// pauses the operator.
struct Campaign {
    api: Api<Lease>,
    settings: LeaseSettings,
    switch: PauseSwitch,
    leader: watch::Sender<bool>,
    label: String,
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.stand_by(stopped(&self.label));
    }
}

impl Campaign {
    async fn run(&self, stop: impl Future<Output = ()>) {
        self.stand_by(not_yet(&self.label));
        let (state, in_flight) = hold(
            stop,
            State::Standby { observed: None },
            self.settings.retry_period,
            |state| self.step(state),
            |state| match state {
                State::Leading { renewed_at, .. } => {
                    Some(*renewed_at + self.settings.renew_deadline)
                }
                _ => None,
            },
        )
        .await;
        self.stand_by(stopped(&self.label));
        let state = self.release(&state, in_flight).await;
        tracing::debug!(lease = %self.label, ?state, "leader election stopped");
    }

    async fn step(&self, state: State) -> State {
        match state {
            State::Standby { observed } => self.try_acquire(observed).await,
            State::Leading { lease, renewed_at } => self.try_renew(lease, renewed_at).await,
            State::Released => State::Released,
        }
    }

    /// One attempt of a standby candidate, bounded in time.
    async fn try_acquire(&self, observed: Option<Observed>) -> State {
        let timeout = self.settings.attempt_timeout();
        match tokio::time::timeout(timeout, self.acquire(observed.clone())).await {
            Ok(state) => state,
            Err(_elapsed) => {
                tracing::warn!(lease = %self.label, ?timeout, "acquiring the lease timed out; retrying");
                State::Standby { observed }
            }
        }
    }

    async fn acquire(&self, previous: Option<Observed>) -> State {
        let current = match self.api.get_opt(&self.settings.name).await {
            Ok(current) => current,
            Err(error) => {
                tracing::warn!(lease = %self.label, %error, "cannot read the lease; retrying");
                return State::Standby { observed: previous };
            }
        };
        let Some(current) = current else {
            let sent_at = Instant::now();
            return match self
                .api
                .create(&PostParams::default(), &self.fresh_lease())
                .await
            {
                Ok(lease) => self.became_leader(lease, sent_at),
                Err(error) if is_conflict(&error) => {
                    tracing::debug!(lease = %self.label, "another candidate created the lease first");
                    State::Standby { observed: previous }
                }
                Err(error) => {
                    tracing::warn!(lease = %self.label, %error, "cannot create the lease; retrying");
                    State::Standby { observed: previous }
                }
            };
        };
        let now = Instant::now();
        let observed = Observed::see(
            previous.as_ref(),
            current.spec.clone().unwrap_or_default(),
            now,
        );
        match observed.holder() {
            // Ours from before (a renewal that timed out but landed, or a lost lease nobody took): renew.
            Some(holder) if holder == self.settings.identity => {}
            Some(holder) if now < observed.expires_at(self.settings.lease_duration) => {
                if previous.as_ref().and_then(Observed::holder) != Some(holder) {
                    tracing::info!(lease = %self.label, holder, "the lease is held by another candidate");
                }
                self.stand_by(format!(
                    "not the leader: lease {} is held by {holder}",
                    self.label
                ));
                return State::Standby {
                    observed: Some(observed),
                };
            }
            // Free (released) or expired: take it over.
            _ => {}
        }
        let sent_at = Instant::now();
        match self
            .api
            .replace(
                &self.settings.name,
                &PostParams::default(),
                &self.claim(&current),
            )
            .await
        {
            Ok(lease) => self.became_leader(lease, sent_at),
            Err(error) if is_conflict(&error) => {
                tracing::debug!(lease = %self.label, "another candidate took the lease first");
                State::Standby {
                    observed: Some(observed),
                }
            }
            Err(error) => {
                tracing::warn!(lease = %self.label, %error, "cannot take the lease; retrying");
                State::Standby {
                    observed: Some(observed),
                }
            }
        }
    }

    /// One renewal of the leader, bounded by the renew deadline.
    async fn try_renew(&self, lease: Box<Lease>, renewed_at: Instant) -> State {
        let deadline = renewed_at + self.settings.renew_deadline;
        let now = Instant::now();
        if now >= deadline {
            return self.lose(
                &lease,
                renewed_at,
                "renewals failed until the renew deadline",
            );
        }
        let until = (now + self.settings.attempt_timeout()).min(deadline);
        let error = match tokio::time::timeout_at(until, self.renew(&lease)).await {
            Ok(Renewal::Renewed(lease, renewed_at)) => {
                tracing::trace!(lease = %self.label, "renewed the lease");
                return State::Leading { lease, renewed_at };
            }
            Ok(Renewal::Taken(observed, holder)) => {
                self.stand_by(format!(
                    "not the leader: lease {} is held by {holder}",
                    self.label
                ));
                let why = format!("the lease is now held by {holder}");
                tracing::error!(lease = %self.label, identity = %self.settings.identity, reason = %why, "lost the lease; pausing");
                return State::Standby { observed };
            }
            Ok(Renewal::Failed(error)) => error,
            Err(_elapsed) => "the request timed out".to_string(),
        };
        if Instant::now() >= deadline {
            self.lose(
                &lease,
                renewed_at,
                &format!("renewals failed until the renew deadline; the last one: {error}"),
            )
        } else {
            tracing::warn!(lease = %self.label, %error, "cannot renew the lease; retrying");
            State::Leading { lease, renewed_at }
        }
    }

    async fn renew(&self, lease: &Lease) -> Renewal {
        let sent_at = Instant::now();
        let name = &self.settings.name;
        let params = PostParams::default();
        match self.api.replace(name, &params, &self.claim(lease)).await {
            Ok(lease) => return Renewal::Renewed(Box::new(lease), sent_at),
            // Our copy is stale (perhaps our last renewal landed after we gave up on it) or gone: look.
            Err(error) if is_conflict(&error) || is_not_found(&error) => {}
            Err(error) => return Renewal::Failed(error.to_string()),
        }
        let current = match self.api.get_opt(name).await {
            Ok(current) => current,
            Err(error) => return Renewal::Failed(error.to_string()),
        };
        let Some(current) = current else {
            // Deleted under us: create it again, as client-go does; if another did first, it leads.
            let sent_at = Instant::now();
            return match self.api.create(&params, &self.fresh_lease()).await {
                Ok(lease) => Renewal::Renewed(Box::new(lease), sent_at),
                Err(error) if is_conflict(&error) => Renewal::Taken(
                    None,
                    "another candidate (it was deleted and created again)".into(),
                ),
                Err(error) => Renewal::Failed(error.to_string()),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        if holder(&spec) != Some(self.settings.identity.as_str()) {
            let holder = holder(&spec).unwrap_or("nobody").to_string();
            let observed = Observed::see(None, spec, Instant::now());
            return Renewal::Taken(Some(observed), holder);
        }
        let sent_at = Instant::now();
        match self.api.replace(name, &params, &self.claim(&current)).await {
            Ok(lease) => Renewal::Renewed(Box::new(lease), sent_at),
            Err(error) => Renewal::Failed(error.to_string()),
        }
    }

    /// Stops leading now: the renew deadline passed, so the lease may be taken soon.
    fn lose(&self, lease: &Lease, renewed_at: Instant, why: &str) -> State {
        self.stand_by(format!("not the leader: lost lease {} ({why})", self.label));
        tracing::error!(lease = %self.label, identity = %self.settings.identity, reason = %why, deadline = ?self.settings.renew_deadline, "lost the lease; pausing");
        State::Standby {
            observed: Some(Observed {
                spec: lease.spec.clone().unwrap_or_default(),
                since: renewed_at,
            }),
        }
    }

    fn became_leader(&self, lease: Lease, renewed_at: Instant) -> State {
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
        tracing::info!(lease = %self.label, identity = %self.settings.identity, transitions, "became the leader");
        self.lead();
        State::Leading {
            lease: Box::new(lease),
            renewed_at,
        }
    }

    /// Gives the lease up if it may be ours, so that the next candidate need not wait for it to expire.
    async fn release(&self, state: &State, in_flight: bool) -> State {
        let known = match state {
            State::Leading { lease, .. } => Some(&**lease),
            State::Standby { .. } | State::Released => None,
        };
        let named = matches!(state, State::Standby { observed: Some(o) } if o.holder() == Some(self.settings.identity.as_str()));
        if known.is_none() && !in_flight && !named {
            return State::Released;
        }
        let timeout = self.settings.renew_deadline;
        match tokio::time::timeout(timeout, self.give_up(known)).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.label, identity = %self.settings.identity, "released the lease");
            }
            Ok(Ok(false)) => {
                tracing::debug!(lease = %self.label, "nothing to release: the lease is not ours");
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = %self.label, %error, "cannot release the lease; it expires by itself");
            }
            Err(_elapsed) => {
                tracing::warn!(lease = %self.label, ?timeout, "releasing the lease timed out; it expires by itself");
            }
        }
        State::Released
    }

    /// Writes the lease as free; `Ok(false)` if it is not ours (any more).
    async fn give_up(&self, known: Option<&Lease>) -> Result<bool, kube::Error> {
        let name = &self.settings.name;
        let params = PostParams::default();
        if let Some(lease) = known {
            match self
                .api
                .replace(name, &params, &released(lease, None))
                .await
            {
                Ok(_) => return Ok(true),
                // Stale, gone or failed: look at the lease as it is, once.
                Err(error) => {
                    tracing::debug!(lease = %self.label, %error, "releasing the lease as last renewed failed; reading it")
                }
            }
        }
        let Some(current) = self.api.get_opt(name).await? else {
            return Ok(false);
        };
        if current.spec.as_ref().and_then(holder) != Some(self.settings.identity.as_str()) {
            return Ok(false);
        }
        self.api
            .replace(name, &params, &released(&current, None))
            .await?;
        Ok(true)
    }

    /// A new Lease held by us.
    fn fresh_lease(&self) -> Lease {
        let now = micro_now();
        Lease {
            metadata: ObjectMeta {
                name: Some(self.settings.name.clone()),
                namespace: Some(self.settings.namespace.clone()),
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

    /// `current` held (taken over or renewed) by us from now, keeping its resourceVersion and other fields.
    fn claim(&self, current: &Lease) -> Lease {
        let now = micro_now();
        let mut lease = current.clone();
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

    /// Leads: `is_leader` first, then the operator may work.
    fn lead(&self) {
        self.leader
            .send_if_modified(|leads| !std::mem::replace(leads, true));
        self.switch.set(PAUSE_TOGGLE, None);
    }

    /// Does not lead: the operator pauses first, then `is_leader` turns false.
    fn stand_by(&self, reason: String) {
        self.switch.set(PAUSE_TOGGLE, Some(reason));
        self.leader
            .send_if_modified(|leads| std::mem::replace(leads, false));
    }
}

fn stopped(label: &str) -> String {
    format!("not the leader: leader election for lease {label} stopped")
}

fn not_yet(label: &str) -> String {
    format!("not the leader yet: lease {label} is not acquired yet")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LeaseSettings {
        LeaseSettings::new("op", "kube-system", "me")
    }

    #[test]
    fn defaults_are_controller_runtimes_and_valid() {
        let settings = settings();
        assert_eq!(settings.lease_duration, Duration::from_secs(15));
        assert_eq!(settings.renew_deadline, Duration::from_secs(10));
        assert_eq!(settings.retry_period, Duration::from_secs(2));
        assert_eq!(settings.validate(), Ok(()));
    }

    #[test]
    fn timings_that_could_let_two_lead_are_refused() {
        let ms = Duration::from_millis;
        let refused = |lease, renew, retry| settings().with_timings(lease, renew, retry).err();
        assert!(matches!(
            refused(ms(1000), ms(1000), ms(100)),
            Some(LeaseError::RenewDeadline { .. })
        ));
        assert!(matches!(
            refused(ms(1000), ms(600), ms(600)),
            Some(LeaseError::RetryPeriod { .. })
        ));
        assert!(matches!(
            refused(ms(1000), ms(600), ms(0)),
            Some(LeaseError::RetryPeriod { .. })
        ));
        assert!(matches!(
            refused(ms(1500), ms(600), ms(100)),
            Some(LeaseError::LeaseDuration { .. })
        ));
        assert!(matches!(
            refused(ms(0), ms(0), ms(0)),
            Some(LeaseError::LeaseDuration { .. })
        ));
        assert!(refused(ms(1000), ms(600), ms(100)).is_none());
        let nobody = LeaseSettings::new("op", "kube-system", "");
        assert_eq!(
            nobody.validate(),
            Err(LeaseError::NoIdentity {
                lease: "kube-system/op".into()
            })
        );
        let message = refused(ms(1000), ms(1000), ms(100))
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            message.contains("kube-system/op") && message.contains("renew_deadline"),
            "{message}"
        );
    }

    #[test]
    fn an_observed_lease_expires_after_its_duration_from_when_it_last_changed() {
        let start = Instant::now();
        let spec = |renewed: &str| LeaseSpec {
            holder_identity: Some("other".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                renewed.parse().unwrap_or_default(),
            )),
            ..LeaseSpec::default()
        };
        let first = Observed::see(None, spec("2020-01-01T00:00:00Z"), start);
        let later = start + Duration::from_secs(10);
        let same = Observed::see(Some(&first), spec("2020-01-01T00:00:00Z"), later);
        assert_eq!(
            same.expires_at(Duration::ZERO),
            start + Duration::from_secs(15),
            "an unchanged lease keeps its first observation, however old its renewTime"
        );
        let renewed = Observed::see(Some(&same), spec("2020-01-01T00:00:02Z"), later);
        assert_eq!(
            renewed.expires_at(Duration::ZERO),
            later + Duration::from_secs(15)
        );
        let no_duration = Observed::see(None, LeaseSpec::default(), start);
        assert_eq!(
            no_duration.expires_at(Duration::from_secs(7)),
            start + Duration::from_secs(7)
        );
        assert_eq!(no_duration.holder(), None);
        let empty = LeaseSpec {
            holder_identity: Some(String::new()),
            ..LeaseSpec::default()
        };
        assert_eq!(holder(&empty), None, "an empty holder is no holder");
    }
}
