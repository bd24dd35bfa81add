//! Lease-based leader election against the cluster over real HTTP, with the real `kube::Client`:
//! never two leaders at a sampled moment (also while lease writes fail, conflict and lag), takeover after
//! a crash and after a release, and a leader that pauses itself when it cannot renew.
//!
//! Timings are short (lease 1 s, renew deadline 600 ms, retry 100 ms). Waits have generous deadlines;
//! assertions are about exclusivity and order (who led, what the Lease says), never about speed.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kactor_emulator::{Failure, Matcher};
use kactor_peering::lease::{LeaderElector, LeaseError, LeaseSettings, PAUSE_TOGGLE};
use kactor_reactor::pausing::PauseSwitch;
use kactor_testenv::TestCluster;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

const NAMESPACE: &str = "kube-system";
const NAME: &str = "my-op";
/// How long to wait for something that should happen within a second or two.
const WAIT: Duration = Duration::from_secs(15);

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Lease 1 s, renew deadline 600 ms, retry period 100 ms.
fn quick(identity: &str) -> LeaseSettings {
    LeaseSettings::new(NAME, NAMESPACE, identity)
        .with_timings(ms(1000), ms(600), ms(100))
        .unwrap()
}

/// A client of its own for each candidate, without kube's own retries, so injected faults reach us.
fn client(cluster: &TestCluster) -> kube::Client {
    let mut config = cluster.config();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn leases(cluster: &TestCluster) -> Api<Lease> {
    Api::namespaced(client(cluster), NAMESPACE)
}

async fn lease(cluster: &TestCluster) -> Lease {
    leases(cluster).get(NAME).await.unwrap()
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

fn transitions(lease: &Lease) -> Option<i32> {
    lease.spec.as_ref().and_then(|s| s.lease_transitions)
}

/// Polls `condition` every 10 ms until it holds; panics after [`WAIT`].
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// One elector running in a task, with its own switch and client.
struct Candidate {
    identity: String,
    switch: PauseSwitch,
    leader: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), LeaseError>>,
}

impl Candidate {
    fn start(cluster: &TestCluster, settings: LeaseSettings) -> Candidate {
        let identity = settings.identity.clone();
        let switch = PauseSwitch::new();
        let elector = LeaderElector::new(client(cluster), settings, switch.clone());
        let leader = elector.is_leader();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(elector.run(async move {
            let _ = stopped.await;
        }));
        Candidate {
            identity,
            switch,
            leader,
            stop: Some(stop),
            task,
        }
    }

    /// Whether it leads: its `is_leader`, or its operator not paused (either alone would be a bug).
    fn active(&self) -> bool {
        *self.leader.borrow() || !self.switch.is_paused()
    }

    fn reason(&self) -> String {
        self.switch
            .reasons()
            .get(PAUSE_TOGGLE)
            .cloned()
            .unwrap_or_default()
    }

    /// A graceful stop: `run` releases the lease and returns.
    async fn stop(mut self) -> Result<(), LeaseError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("run returns after stop")
            .expect("run does not panic")
    }

    /// A crash: the `run` future is dropped where it stands, without a release.
    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn leader_of(candidates: &[Candidate]) -> &Candidate {
    wait_until("one of the candidates leads", || {
        candidates.iter().any(Candidate::active)
    })
    .await;
    candidates
        .iter()
        .find(|c| c.active())
        .expect("a leader was just seen")
}

/// Every candidate ever started, as the sampler sees them.
#[derive(Clone, Default)]
struct Watched(Arc<Mutex<Vec<Seen>>>);

/// A candidate's identity, switch and `is_leader`.
type Seen = (String, PauseSwitch, watch::Receiver<bool>);

impl Watched {
    fn add(&self, candidate: &Candidate) {
        self.0.lock().unwrap().push((
            candidate.identity.clone(),
            candidate.switch.clone(),
            candidate.leader.clone(),
        ));
    }
}

#[derive(Debug, Default)]
struct Samples {
    taken: usize,
    with_no_leader: usize,
    violations: Vec<String>,
    leaders: BTreeSet<String>,
}

/// Looks at every watched candidate every 20 ms. The tests run on a current-thread runtime, so one
/// look at all of them happens at one moment: no elector runs in between.
struct Sampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Samples>,
    taken: Arc<AtomicUsize>,
}

impl Sampler {
    /// Starts sampling, and returns once the first samples are taken.
    async fn start(watched: &Watched) -> Sampler {
        let watched = watched.clone();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let taken = Arc::new(AtomicUsize::new(0));
        let sampler_taken = taken.clone();
        let task = tokio::spawn(async move {
            let taken = sampler_taken;
            let mut samples = Samples::default();
            let mut ticks = tokio::time::interval(ms(20));
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticks.tick() => {}
                }
                let active: Vec<String> = watched
                    .0
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, switch, leader)| *leader.borrow() || !switch.is_paused())
                    .map(|(identity, _, _)| identity.clone())
                    .collect();
                samples.taken += 1;
                taken.fetch_add(1, Ordering::SeqCst);
                match active.len() {
                    0 => samples.with_no_leader += 1,
                    1 => {
                        samples.leaders.extend(active);
                    }
                    _ => samples
                        .violations
                        .push(format!("sample {}: {active:?} lead at once", samples.taken)),
                }
            }
            samples
        });
        let sampler = Sampler { stop, task, taken };
        sampler.settle().await;
        sampler
    }

    /// Waits until two more samples are taken, so that what stands now has been seen.
    async fn settle(&self) {
        let target = self.taken.load(Ordering::SeqCst) + 2;
        wait_until("the sampler looks", || {
            self.taken.load(Ordering::SeqCst) >= target
        })
        .await;
    }

    async fn finish(self) -> Samples {
        self.settle().await;
        let _ = self.stop.send(());
        let samples = self.task.await.unwrap();
        assert!(
            samples.violations.is_empty(),
            "two leaders at once: {:?}",
            samples.violations
        );
        samples
    }
}

#[tokio::test]
async fn a_single_candidate_becomes_the_leader_and_resumes_the_operator() {
    let cluster = TestCluster::start().await.unwrap();
    let switch = PauseSwitch::new();
    let elector = LeaderElector::new(client(&cluster), quick("solo"), switch.clone());
    assert!(
        switch.reasons().contains_key(PAUSE_TOGGLE),
        "the operator is paused before the first acquisition"
    );
    let mut is_leader = elector.is_leader();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(elector.run(async move {
        let _ = stopped.await;
    }));

    tokio::time::timeout(WAIT, is_leader.wait_for(|leads| *leads))
        .await
        .expect("it leads in time")
        .unwrap();
    assert!(!switch.is_paused(), "the leader's operator works");

    let raw = Api::<DynamicObject>::namespaced_with(
        client(&cluster),
        NAMESPACE,
        &ApiResource::erase::<Lease>(&()),
    );
    let created = raw.get(NAME).await.unwrap();
    let spec = &created.data["spec"];
    assert_eq!(spec["holderIdentity"], "solo");
    assert_eq!(spec["leaseDurationSeconds"], 1);
    assert_eq!(spec["leaseTransitions"], 0);
    for field in ["acquireTime", "renewTime"] {
        let time = spec[field].as_str().unwrap_or_default();
        let (seconds, fraction) = time.split_once('.').unwrap_or_default();
        assert!(
            seconds.len() == 19
                && fraction.len() == 7
                && fraction.ends_with('Z')
                && fraction[..6].chars().all(|c| c.is_ascii_digit()),
            "{field} is RFC 3339 with microseconds: {time:?}"
        );
    }

    let first_renewal = spec["renewTime"].clone();
    let mut renewed = false;
    for _ in 0..(WAIT.as_millis() / 50) {
        tokio::time::sleep(ms(50)).await;
        let now = raw.get(NAME).await.unwrap();
        if now.data["spec"]["renewTime"] != first_renewal {
            assert_eq!(now.data["spec"]["holderIdentity"], "solo");
            assert_eq!(
                now.data["spec"]["acquireTime"], spec["acquireTime"],
                "a renewal keeps the acquisition time"
            );
            renewed = true;
            break;
        }
    }
    assert!(renewed, "the leader renews its lease");
    assert!(!switch.is_paused());

    let _ = stop.send(());
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_candidate_stays_paused_while_another_holds_a_live_lease() {
    let cluster = TestCluster::start().await.unwrap();
    let watched = Watched::default();
    let a = Candidate::start(&cluster, quick("a"));
    watched.add(&a);
    wait_until("a leads", || a.active()).await;
    let b = Candidate::start(&cluster, quick("b"));
    watched.add(&b);
    wait_until("b knows who holds the lease", || {
        b.reason().contains("is held by a")
    })
    .await;
    assert_eq!(
        b.reason(),
        "not the leader: lease kube-system/my-op is held by a"
    );

    // Several lease durations: a renews, so b must never take over.
    let sampler = Sampler::start(&watched).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let samples = sampler.finish().await;
    assert_eq!(samples.leaders, BTreeSet::from(["a".to_string()]));
    assert!(b.switch.is_paused() && !*b.leader.borrow());
    assert_eq!(holder(&lease(&cluster).await).as_deref(), Some("a"));

    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

#[tokio::test]
async fn of_two_candidates_exactly_one_leads_at_every_sampled_moment() {
    let cluster = TestCluster::start().await.unwrap();
    let watched = Watched::default();
    let candidates = vec![
        Candidate::start(&cluster, quick("a")),
        Candidate::start(&cluster, quick("b")),
    ];
    candidates.iter().for_each(|c| watched.add(c));
    leader_of(&candidates).await;

    let sampler = Sampler::start(&watched).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let samples = sampler.finish().await;
    assert!(samples.taken > 10, "{samples:?}");
    assert_eq!(
        samples.with_no_leader, 0,
        "once elected, a leader keeps renewing: {samples:?}"
    );
    assert_eq!(samples.leaders.len(), 1, "{samples:?}");

    for candidate in candidates {
        candidate.stop().await.unwrap();
    }
}

#[tokio::test]
async fn leadership_moves_on_but_never_to_two_at_once_as_leaders_stop_or_crash() {
    let cluster = TestCluster::start().await.unwrap();
    let watched = Watched::default();
    let sampler = Sampler::start(&watched).await;
    let mut candidates = Vec::new();
    for identity in ["c0", "c1", "c2"] {
        let candidate = Candidate::start(&cluster, quick(identity));
        watched.add(&candidate);
        candidates.push(candidate);
    }
    let mut leaders = Vec::new();
    for round in 0..4 {
        let identity = leader_of(&candidates).await.identity.clone();
        leaders.push(identity.clone());
        sampler.settle().await;
        let index = candidates
            .iter()
            .position(|c| c.identity == identity)
            .unwrap();
        let leader = candidates.remove(index);
        if round % 2 == 0 {
            leader.stop().await.unwrap();
        } else {
            leader.crash().await;
        }
        let newcomer = Candidate::start(&cluster, quick(&format!("c{}", round + 3)));
        watched.add(&newcomer);
        candidates.push(newcomer);
    }
    leaders.push(leader_of(&candidates).await.identity.clone());
    sampler.settle().await;

    let samples = sampler.finish().await;
    let distinct: BTreeSet<_> = leaders.iter().cloned().collect();
    assert_eq!(distinct.len(), 5, "a new leader each round: {leaders:?}");
    assert!(
        distinct.is_subset(&samples.leaders),
        "{leaders:?} vs {samples:?}"
    );
    for candidate in candidates {
        candidate.stop().await.unwrap();
    }
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_once_its_lease_expires_and_not_before() {
    let cluster = TestCluster::start().await.unwrap();
    let watched = Watched::default();
    let a = Candidate::start(&cluster, quick("a"));
    watched.add(&a);
    wait_until("a leads", || a.active()).await;
    let b = Candidate::start(&cluster, quick("b"));
    watched.add(&b);
    wait_until("b sees a's lease", || b.reason().contains("is held by a")).await;
    let sampler = Sampler::start(&watched).await;

    let a_switch = a.switch.clone();
    a.crash().await;
    assert!(
        a_switch.is_paused(),
        "a dropped elector leaves its operator paused"
    );
    let last_renewal = lease(&cluster).await;
    assert_eq!(
        holder(&last_renewal).as_deref(),
        Some("a"),
        "a crash releases nothing"
    );

    wait_until("b takes over", || b.active()).await;
    let taken = lease(&cluster).await;
    assert_eq!(holder(&taken).as_deref(), Some("b"));
    assert_eq!(transitions(&taken), Some(1));
    let renewed_by_a = last_renewal.spec.and_then(|s| s.renew_time).unwrap().0;
    let acquired_by_b = taken.spec.and_then(|s| s.acquire_time).unwrap().0;
    assert!(
        acquired_by_b >= renewed_by_a + Duration::from_secs(1),
        "b took over a full lease duration after a's last renewal at the earliest: {renewed_by_a} -> {acquired_by_b}"
    );

    let samples = sampler.finish().await;
    assert_eq!(
        samples.leaders,
        BTreeSet::from(["a".to_string(), "b".to_string()]),
        "{samples:?}"
    );
    b.stop().await.unwrap();
}

#[tokio::test]
async fn a_stopped_leader_leaves_the_lease_free_and_its_operator_paused() {
    let cluster = TestCluster::start().await.unwrap();
    let a = Candidate::start(&cluster, quick("a"));
    wait_until("a leads", || a.active()).await;
    let switch = a.switch.clone();
    let is_leader = a.leader.clone();

    a.stop().await.unwrap();
    assert!(switch.is_paused() && !*is_leader.borrow());
    assert!(
        switch.reasons()[PAUSE_TOGGLE].contains("stopped"),
        "{:?}",
        switch.reasons()
    );
    let released = lease(&cluster).await;
    assert_eq!(holder(&released), None);
    let spec = released.spec.unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(1));
    assert_eq!(
        spec.lease_transitions,
        Some(0),
        "a release is no transition"
    );
}

#[tokio::test]
async fn a_stopped_leader_releases_the_lease_so_another_takes_over_before_it_would_expire() {
    let cluster = TestCluster::start().await.unwrap();
    // A 10 s lease: without the release, b could not lead for 10 s.
    let slow = |identity: &str| {
        LeaseSettings::new(NAME, NAMESPACE, identity)
            .with_timings(Duration::from_secs(10), Duration::from_secs(5), ms(100))
            .unwrap()
    };
    let watched = Watched::default();
    let a = Candidate::start(&cluster, slow("a"));
    watched.add(&a);
    wait_until("a leads", || a.active()).await;
    let b = Candidate::start(&cluster, slow("b"));
    watched.add(&b);
    wait_until("b sees a's lease", || b.reason().contains("is held by a")).await;
    let sampler = Sampler::start(&watched).await;

    let last_renewal = lease(&cluster).await;
    a.stop().await.unwrap();
    wait_until("b takes over", || b.active()).await;

    let taken = lease(&cluster).await;
    assert_eq!(holder(&taken).as_deref(), Some("b"));
    assert_eq!(transitions(&taken), Some(1));
    let renewed_by_a = last_renewal.spec.and_then(|s| s.renew_time).unwrap().0;
    let acquired_by_b = taken.spec.and_then(|s| s.acquire_time).unwrap().0;
    assert!(
        acquired_by_b < renewed_by_a + Duration::from_secs(10),
        "b took over before a's lease would have expired: {renewed_by_a} -> {acquired_by_b}"
    );
    let samples = sampler.finish().await;
    assert_eq!(
        samples.leaders,
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
    b.stop().await.unwrap();
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_over_pauses_at_its_next_renewal() {
    let cluster = TestCluster::start().await.unwrap();
    // A long renew deadline: only seeing another holder can make it pause in this test.
    let settings = LeaseSettings::new(NAME, NAMESPACE, "a")
        .with_timings(Duration::from_secs(30), Duration::from_secs(20), ms(100))
        .unwrap();
    let a = Candidate::start(&cluster, settings);
    wait_until("a leads", || a.active()).await;

    let api = leases(&cluster);
    loop {
        let mut current = api.get(NAME).await.unwrap();
        if let Some(spec) = current.spec.as_mut() {
            spec.holder_identity = Some("intruder".into());
        }
        match api.replace(NAME, &PostParams::default(), &current).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => panic!("cannot overwrite the lease: {error}"),
        }
    }

    wait_until("a pauses", || !a.active()).await;
    assert_eq!(
        a.reason(),
        "not the leader: lease kube-system/my-op is held by intruder"
    );
    assert_eq!(holder(&lease(&cluster).await).as_deref(), Some("intruder"));
    a.stop().await.unwrap();
    assert_eq!(
        holder(&lease(&cluster).await).as_deref(),
        Some("intruder"),
        "a stopping candidate releases only its own lease"
    );
}

#[tokio::test]
async fn invalid_timings_are_refused_and_the_operator_stays_paused() {
    let cluster = TestCluster::start().await.unwrap();
    let mut settings = LeaseSettings::new(NAME, NAMESPACE, "a");
    settings.renew_deadline = settings.lease_duration;
    let switch = PauseSwitch::new();
    let elector = LeaderElector::new(client(&cluster), settings, switch.clone());
    let error = elector.run(std::future::pending()).await.unwrap_err();
    assert!(matches!(error, LeaseError::RenewDeadline { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("must be shorter than lease_duration"),
        "{error}"
    );
    assert!(switch.is_paused());
    assert!(leases(&cluster).get_opt(NAME).await.unwrap().is_none());
}

/// Tests that inject faults, which only the emulator can: `scripts/test` skips them on the real
/// API server (`--skip emulator_only`).
mod emulator_only {
    use super::*;

    #[tokio::test]
    async fn of_three_candidates_at_most_one_leads_while_lease_writes_fail_conflict_and_lag() {
        let cluster = TestCluster::start().await.unwrap();
        cluster
            .faults()
            .add_latency(Matcher::any().resource("leases"), ms(20));
        let watched = Watched::default();
        let sampler = Sampler::start(&watched).await;
        let candidates = vec![
            Candidate::start(&cluster, quick("a")),
            Candidate::start(&cluster, quick("b")),
            Candidate::start(&cluster, quick("c")),
        ];
        candidates.iter().for_each(|c| watched.add(c));

        // Bursts of failures on lease writes (and a read now and then), enough to make leaders lose
        // their lease and others take it over.
        for round in 0..25 {
            let faults = cluster.faults();
            faults.fail(Failure::new(500).verb("update").resource("leases").times(2));
            faults.fail(Failure::new(409).verb("update").resource("leases").times(2));
            if round % 3 == 0 {
                faults.fail(Failure::new(500).verb("get").resource("leases"));
            }
            if round % 5 == 0 {
                faults.fail(Failure::new(409).verb("create").resource("leases"));
            }
            tokio::time::sleep(ms(150)).await;
        }
        cluster.faults().reset();
        let leader = leader_of(&candidates).await.identity.clone();
        tokio::time::sleep(ms(500)).await;

        let samples = sampler.finish().await;
        assert!(samples.taken > 50, "{samples:?}");
        assert!(samples.leaders.contains(&leader), "{samples:?}");
        for candidate in candidates {
            candidate.stop().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_leader_whose_renewals_fail_pauses_itself_before_the_lease_expires() {
        let cluster = TestCluster::start().await.unwrap();
        // Lease 2 s, renew deadline 1 s: the leader must pause in the second between.
        let settings = LeaseSettings::new(NAME, NAMESPACE, "a")
            .with_timings(Duration::from_secs(2), Duration::from_secs(1), ms(100))
            .unwrap();
        let a = Candidate::start(&cluster, settings);
        wait_until("a leads", || a.active()).await;

        cluster.faults().fail(
            Failure::new(500)
                .verb("update")
                .resource("leases")
                .times(u32::MAX),
        );
        let mut reasons = a.switch.subscribe();
        tokio::time::timeout(WAIT, reasons.wait_for(|r| r.contains_key(PAUSE_TOGGLE)))
            .await
            .expect("a pauses in time")
            .unwrap();
        let paused_at = jiff::Timestamp::now();
        assert!(!*a.leader.borrow());
        assert!(a.reason().contains("lost lease"), "{}", a.reason());

        let lease = lease(&cluster).await;
        assert_eq!(holder(&lease).as_deref(), Some("a"));
        let renewed = lease.spec.and_then(|s| s.renew_time).unwrap().0;
        assert!(
            paused_at < renewed + Duration::from_secs(2),
            "a paused ({paused_at}) before its lease could expire for others ({renewed} + 2 s)"
        );

        cluster.faults().reset();
        a.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_leader_that_lost_its_lease_to_failures_takes_it_back_when_the_api_recovers() {
        let cluster = TestCluster::start().await.unwrap();
        let a = Candidate::start(&cluster, quick("a"));
        wait_until("a leads", || a.active()).await;

        cluster.faults().fail(
            Failure::new(500)
                .verb("update")
                .resource("leases")
                .times(u32::MAX),
        );
        wait_until("a pauses", || !a.active()).await;
        cluster.faults().reset();
        wait_until("a leads again", || a.active()).await;

        let lease = lease(&cluster).await;
        assert_eq!(holder(&lease).as_deref(), Some("a"));
        assert_eq!(transitions(&lease), Some(0), "the holder never changed");
        a.stop().await.unwrap();
    }
}
