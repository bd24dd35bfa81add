//! Whether the operator's tokio runtime still runs tasks: a heartbeat task as a whole, and each
//! worker thread on its own (one blocked worker stalls every task queued behind it while the other
//! workers, and so the heartbeat, look fine).
//!
//! **Expected flow**: every `heartbeat_interval`, [`Executor::sample`] (on the health server's
//! thread) spawns a tiny task on the runtime that stamps the time, and reads each worker's
//! park/unpark count and busy time from [`tokio::runtime::RuntimeMetrics`]; the liveness check
//! compares the stamp and the time of each worker's last change with `heartbeat_timeout`.
//!
//! **Assumptions**: tokio publishes a worker's counters when it parks, right after it unparks, and
//! at its maintenance (every 61 polls). So an active worker (an even park/unpark count) whose
//! counters have not moved for the timeout has been inside one poll all that time: a handler is
//! blocking the thread.
//!
//! **Caveats**: nothing is known before the first sample (the check passes). A worker stuck inside
//! `block_in_place` is not a stall: tokio hands its queue to another thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::format::seconds;

/// The runtime's heartbeat and the last sample of each worker.
pub(crate) struct Executor {
    clock: Clock,
    /// When the heartbeat task last ran (the clock's milliseconds; 0: never sampled).
    beat: Arc<AtomicU64>,
    /// Whether a heartbeat task waits to run: a blocked runtime is not sent one more each interval.
    pending: Arc<AtomicBool>,
    workers: Mutex<Vec<WorkerSample>>,
}

/// What one worker showed when its counters last changed.
#[derive(Debug, Clone, Copy)]
struct WorkerSample {
    park_unpark: u64,
    busy: Duration,
    changed_at: u64,
}

/// Milliseconds since a start, in an atomic, +1 so that 0 means "never".
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(Instant);

impl Clock {
    pub(crate) fn new() -> Self {
        Clock(Instant::now())
    }

    pub(crate) fn now(self) -> u64 {
        self.0.elapsed().as_millis() as u64 + 1
    }

    /// How long ago `stamp` was; None for never.
    pub(crate) fn since(self, stamp: u64) -> Option<Duration> {
        (stamp != 0).then(|| Duration::from_millis(self.now().saturating_sub(stamp)))
    }
}

impl Executor {
    pub(crate) fn new(clock: Clock) -> Self {
        Executor {
            clock,
            beat: Arc::default(),
            pending: Arc::default(),
            workers: Mutex::default(),
        }
    }

    /// Sends a heartbeat task to `runtime` and reads its workers' counters.
    pub(crate) fn sample(&self, runtime: &Handle) {
        let now = self.clock.now();
        // The first sample starts the heartbeat's clock.
        let _ = self
            .beat
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        if !self.pending.swap(true, Ordering::AcqRel) {
            let (beat, pending, clock) = (self.beat.clone(), self.pending.clone(), self.clock);
            runtime.spawn(async move {
                beat.store(clock.now(), Ordering::Relaxed);
                pending.store(false, Ordering::Release);
            });
        }

        let metrics = runtime.metrics();
        let count = metrics.num_workers();
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        workers.truncate(count);
        for i in 0..count {
            let park_unpark = metrics.worker_park_unpark_count(i);
            let busy = metrics.worker_total_busy_duration(i);
            match workers.get_mut(i) {
                Some(seen) if seen.park_unpark == park_unpark && seen.busy == busy => {}
                Some(seen) => {
                    *seen = WorkerSample {
                        park_unpark,
                        busy,
                        changed_at: now,
                    }
                }
                None => workers.push(WorkerSample {
                    park_unpark,
                    busy,
                    changed_at: now,
                }),
            }
        }
    }

    /// Fails when the heartbeat task has not run, or a worker has been in one poll, for longer
    /// than `timeout`.
    pub(crate) fn check(&self, timeout: Duration) -> Result<(), String> {
        let mut failures = Vec::new();
        if let Some(silence) = self.clock.since(self.beat.load(Ordering::Relaxed)) {
            if silence > timeout {
                failures.push(format!(
                    "the operator's runtime has not run a task for {} s (limit {} s): all its \
                     threads are busy or blocked",
                    seconds(silence),
                    seconds(timeout)
                ));
            }
        }
        let workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let count = workers.len();
        for (i, worker) in workers.iter().enumerate() {
            let active = worker.park_unpark % 2 == 0;
            let still = self
                .clock
                .since(worker.changed_at)
                .unwrap_or(Duration::ZERO);
            if active && still > timeout {
                failures.push(format!(
                    "runtime worker thread {i} of {count} has been stuck in one poll for {} s \
                     (limit {} s): a handler is blocking the thread; run blocking code with \
                     tokio::task::spawn_blocking",
                    seconds(still),
                    seconds(timeout)
                ));
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(workers: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Samples every 100 ms until `done` says so, or panics after 20 s.
    fn sample_until(
        executor: &Executor,
        runtime: &Handle,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Result<(), String>) -> bool,
    ) -> Result<(), String> {
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            executor.sample(runtime);
            let result = executor.check(timeout);
            if done(&result) {
                return result;
            }
            assert!(Instant::now() < give_up, "{what}: still {result:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn a_worker_blocked_in_one_poll_fails_the_check_until_it_is_released() {
        let runtime = runtime(2);
        let executor = Executor::new(Clock::new());
        let timeout = Duration::from_millis(500);
        executor.sample(runtime.handle());
        assert_eq!(executor.check(timeout), Ok(()));

        let blocker = runtime.spawn(async {
            std::thread::sleep(Duration::from_secs(3));
        });
        let failure = sample_until(
            &executor,
            runtime.handle(),
            timeout,
            "the blocked worker is noticed",
            Result::is_err,
        )
        .unwrap_err();
        assert!(
            failure.contains("of 2 has been stuck in one poll"),
            "{failure}"
        );
        assert!(failure.contains("spawn_blocking"), "{failure}");
        assert!(
            !failure.contains("has not run a task"),
            "the other worker runs the heartbeat: {failure}"
        );

        sample_until(
            &executor,
            runtime.handle(),
            timeout,
            "the released worker passes",
            Result::is_ok,
        )
        .unwrap();
        assert!(blocker.is_finished());
    }

    #[test]
    fn a_runtime_with_every_worker_blocked_misses_its_heartbeat() {
        let runtime = runtime(1);
        let executor = Executor::new(Clock::new());
        let timeout = Duration::from_millis(300);
        executor.sample(runtime.handle());
        let release = Arc::new(AtomicBool::new(false));
        let blocked = release.clone();
        runtime.spawn(async move {
            while !blocked.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let failure = sample_until(
            &executor,
            runtime.handle(),
            timeout,
            "the missed heartbeat is noticed",
            |r| r.as_ref().is_err_and(|e| e.contains("has not run a task")),
        )
        .unwrap_err();
        assert!(failure.contains("limit 0.3 s"), "{failure}");
        release.store(true, Ordering::Relaxed);
        sample_until(
            &executor,
            runtime.handle(),
            timeout,
            "the heartbeat comes back",
            Result::is_ok,
        )
        .unwrap();
    }

    #[test]
    fn an_idle_runtime_passes() {
        let runtime = runtime(2);
        let executor = Executor::new(Clock::new());
        let timeout = Duration::from_secs(1);
        for _ in 0..12 {
            executor.sample(runtime.handle());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(executor.check(timeout), Ok(()));
    }

    #[test]
    fn nothing_fails_before_the_first_sample() {
        let executor = Executor::new(Clock::new());
        assert_eq!(executor.check(Duration::ZERO), Ok(()));
    }
}
