//! The handler tasks in flight, so that shutdown can let them finish within a timeout and cancel the rest.

use foldhash::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Tracks spawned tasks. Cheap to share (`Arc<Tracker>`).
#[derive(Debug, Default)]
pub struct Tracker {
    next: AtomicU64,
    running: Mutex<HashMap<u64, AbortHandle>>,
    changed: Notify,
}

impl Tracker {
    /// Spawns a task on `runtime` and tracks it until it ends; the handle cancels it.
    pub fn spawn<F>(self: &Arc<Self>, runtime: &Handle, task: F) -> AbortHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let tracker = self.clone();
        // The lock is held while spawning, so the task's own removal (which takes it) comes after the insert.
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        // A guard, so that a cancelled task is forgotten too.
        struct Finished(Arc<Tracker>, u64);
        impl Drop for Finished {
            fn drop(&mut self) {
                self.0.finished(self.1);
            }
        }
        let handle = runtime.spawn(async move {
            let _finished = Finished(tracker, id);
            task.await;
        });
        let abort = handle.abort_handle();
        running.insert(id, abort.clone());
        abort
    }

    fn finished(&self, id: u64) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.remove(&id);
        if running.is_empty() {
            self.changed.notify_waiters();
        }
    }

    /// How many tasks are running.
    pub fn running(&self) -> usize {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Waits up to `timeout` for every task to end, then cancels those still running; returns how many
    /// were cancelled.
    pub async fn drain(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if self.running() == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        let running = std::mem::take(&mut *self.running.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in running.values() {
            handle.abort();
        }
        running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_waits_for_quick_tasks_and_cancels_slow_ones() {
        let tracker = Arc::new(Tracker::default());
        let runtime = Handle::current();
        tracker.spawn(&runtime, async {
            tokio::time::sleep(Duration::from_millis(10)).await
        });
        assert_eq!(tracker.drain(Duration::from_secs(5)).await, 0);
        tracker.spawn(&runtime, std::future::pending());
        assert_eq!(tracker.drain(Duration::from_millis(50)).await, 1);
        assert_eq!(tracker.running(), 0);
    }
}
