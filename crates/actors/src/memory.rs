//! Giving memory back to the system after a burst.
//!
//! glibc's allocator keeps what a burst freed (a listing of 100,000 objects, every worker with its
//! object's body) in its arenas, so the process's resident memory (what a container's memory limit
//! sees) stays at its peak long after the workers idled out. `malloc_trim` returns the free pages.
//! The supervisors report the workers that stopped; a trim follows each wave of them, once it has
//! been quiet for [`SETTLE`], on a blocking thread. Elsewhere (other allocators, other systems)
//! this does nothing: jemalloc and mimalloc return memory by themselves.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

/// How long after the last stopped worker the trim waits (more may follow in the same wave).
pub const SETTLE: Duration = Duration::from_secs(2);
/// Fewer stopped workers than this since the last trim are not worth one.
pub const WORTH_TRIMMING: usize = 256;

struct Trimmer {
    released: AtomicUsize,
    wake: Notify,
}

static TRIMMER: OnceLock<Arc<Trimmer>> = OnceLock::new();
static TRIMS: AtomicUsize = AtomicUsize::new(0);

/// How many trims this process has made.
pub fn trims() -> usize {
    TRIMS.load(Ordering::Relaxed)
}

/// A worker stopped (its object's body and cycle state are freed); `runtime` runs the trimming task,
/// started on the first call (an operator has one runtime; a process that makes several, as tests
/// do, trims on the first one's while it lives).
pub fn worker_released(runtime: &tokio::runtime::Handle) {
    let trimmer = TRIMMER.get_or_init(|| {
        let trimmer = Arc::new(Trimmer {
            released: AtomicUsize::new(0),
            wake: Notify::new(),
        });
        runtime.spawn(trim_after_waves(trimmer.clone()));
        trimmer
    });
    if trimmer.released.fetch_add(1, Ordering::Relaxed) + 1 == WORTH_TRIMMING {
        trimmer.wake.notify_one();
    }
}

async fn trim_after_waves(trimmer: Arc<Trimmer>) {
    loop {
        trimmer.wake.notified().await;
        // The wave goes on while workers keep stopping: trim once it has settled.
        loop {
            let before = trimmer.released.load(Ordering::Relaxed);
            tokio::time::sleep(SETTLE).await;
            if trimmer.released.load(Ordering::Relaxed) == before {
                break;
            }
        }
        let released = trimmer.released.swap(0, Ordering::Relaxed);
        let trimmed = tokio::task::spawn_blocking(trim).await.unwrap_or(false);
        TRIMS.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            released,
            trimmed,
            "Free memory returned to the system after workers stopped."
        );
    }
}

/// Returns the allocator's free pages to the system; whether any were.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim only walks glibc's own arenas; it takes their locks itself.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wave_of_stopped_workers_is_followed_by_one_trim_once_it_settles() {
        let runtime = tokio::runtime::Handle::current();
        let before = trims();
        for _ in 0..WORTH_TRIMMING {
            worker_released(&runtime);
        }
        // The wave goes on: no trim while workers keep stopping.
        for _ in 0..3 {
            tokio::time::sleep(SETTLE / 2).await;
            worker_released(&runtime);
        }
        assert_eq!(trims(), before);
        tokio::time::sleep(SETTLE * 3).await;
        while trims() == before {
            tokio::task::yield_now().await;
        }
        assert_eq!(trims(), before + 1);
        // A few more are not worth another.
        worker_released(&runtime);
        tokio::time::sleep(SETTLE * 3).await;
        assert_eq!(trims(), before + 1);
    }
}
