//! What leader election ([`crate::lease`]) and ring membership ([`crate::sharding`]) share about
//! `coordination.k8s.io/v1` Leases: the rules their timings follow, how a Lease is observed (by the
//! observer's clock, never the holder's), and the small reads and writes of a Lease's spec.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::Instant;

/// Steps a holder of a Lease until `stop`: `step` from the state it left, then a sleep until the
/// next `retry_period` from the step's start, or until `deadline` of the new state if that is sooner
/// (the renew deadline of a held Lease). Returns the last state, and whether `stop` interrupted a
/// step (whose request may have made, or kept, us the holder unseen).
pub(crate) async fn hold<S, F>(
    stop: impl std::future::Future<Output = ()>,
    mut state: S,
    retry_period: Duration,
    step: impl Fn(S) -> F,
    deadline: impl Fn(&S) -> Option<Instant>,
) -> (S, bool)
where
    S: Clone,
    F: std::future::Future<Output = S>,
{
    let mut stop = std::pin::pin!(stop);
    let in_flight = loop {
        let started = Instant::now();
        tokio::select! {
            biased;
            () = &mut stop => break true,
            next = step(state.clone()) => state = next,
        }
        let wake = deadline(&state).map_or(started + retry_period, |deadline| {
            deadline.min(started + retry_period)
        });
        tokio::select! {
            biased;
            () = &mut stop => break false,
            () = tokio::time::sleep_until(wake) => {}
        }
    };
    (state, in_flight)
}

/// Which rule a Lease's timings break (each caller says so in its own error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimingFault {
    /// `lease_duration` is not a whole number of seconds from 1 to `i32::MAX`.
    LeaseDuration,
    /// `renew_deadline` is not shorter than `lease_duration`.
    RenewDeadline,
    /// `retry_period` is zero, or not shorter than `renew_deadline`.
    RetryPeriod,
}

/// Checks that `lease_duration` is whole seconds, `renew_deadline < lease_duration` and
/// `0 < retry_period < renew_deadline`: a holder that cannot renew stops before anyone may take over,
/// and a failed renewal is retried before the deadline.
pub(crate) fn check_timings(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), TimingFault> {
    let whole_seconds = lease_duration.subsec_nanos() == 0
        && (1..=i32::MAX as u64).contains(&lease_duration.as_secs());
    if !whole_seconds {
        Err(TimingFault::LeaseDuration)
    } else if renew_deadline >= lease_duration {
        Err(TimingFault::RenewDeadline)
    } else if retry_period.is_zero() || retry_period >= renew_deadline {
        Err(TimingFault::RetryPeriod)
    } else {
        Ok(())
    }
}

/// `leaseDurationSeconds` for `lease_duration`; [`check_timings`] has made sure it fits.
pub(crate) fn duration_seconds(lease_duration: Duration) -> i32 {
    i32::try_from(lease_duration.as_secs()).unwrap_or(i32::MAX)
}

/// A Lease as an observer last saw it, and since when it has looked like that.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub(crate) spec: LeaseSpec,
    /// When we first saw `spec` as it is (client-go's `observedTime`): a renewal changes `renewTime`,
    /// so an unchanged spec means no renewal since then, whatever the holder's clock says.
    pub(crate) since: Instant,
}

impl Observed {
    /// What we know after reading `spec` at `now`: the time of the earlier observation if it is
    /// unchanged; a Lease first seen counts as just changed.
    pub(crate) fn see(previous: Option<&Observed>, spec: LeaseSpec, now: Instant) -> Observed {
        match previous {
            Some(previous) if previous.spec == spec => Observed {
                spec,
                since: previous.since,
            },
            _ => Observed { spec, since: now },
        }
    }

    /// The holder, if there is one (a released Lease has an empty or no holder).
    pub(crate) fn holder(&self) -> Option<&str> {
        holder(&self.spec)
    }

    /// When others may take it over. A Lease without a duration gets `fallback` (ours), to be safe.
    pub(crate) fn expires_at(&self, fallback: Duration) -> Instant {
        let duration = self
            .spec
            .lease_duration_seconds
            .map_or(fallback, |seconds| {
                Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
            });
        self.since + duration
    }
}

/// The holder named by `spec`, if any (empty is none).
pub(crate) fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// Now, written with microseconds (`2025-01-02T03:04:05.678901Z`) as `MicroTime` is.
pub(crate) fn micro_now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// `lease` given up: `holder` (none, or empty), and a 1 s duration for clients that ignore an empty
/// holder (as client-go does).
pub(crate) fn released(lease: &Lease, holder: Option<String>) -> Lease {
    let now = micro_now();
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = holder;
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    lease
}

/// 409: Conflict on a write with a stale resourceVersion, AlreadyExists on a create.
pub(crate) fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// 404: the Lease is not there.
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn timings_must_let_a_holder_stop_before_others_take_over() {
        assert_eq!(check_timings(secs(15), secs(10), secs(2)), Ok(()));
        let half = Duration::from_millis(1500);
        assert_eq!(
            check_timings(half, secs(1), Duration::from_millis(100)),
            Err(TimingFault::LeaseDuration)
        );
        assert_eq!(
            check_timings(secs(0), secs(1), secs(1)),
            Err(TimingFault::LeaseDuration)
        );
        assert_eq!(
            check_timings(secs(10), secs(10), secs(2)),
            Err(TimingFault::RenewDeadline)
        );
        assert_eq!(
            check_timings(secs(10), secs(5), secs(5)),
            Err(TimingFault::RetryPeriod)
        );
        assert_eq!(
            check_timings(secs(10), secs(5), Duration::ZERO),
            Err(TimingFault::RetryPeriod)
        );
    }
}
