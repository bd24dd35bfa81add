//! The actors' thread: one actix System on a thread of its own, so that no user code and no JSON
//! decoding ever runs where the actors run, and the operator's `run()` future stays `Send`.

use std::future::Future;

use actix::prelude::*;
use kactor_reactor::settings::ActorsScheduling;
use tokio::sync::oneshot;

/// A handle to the actors' thread; dropping it stops the thread.
pub struct ActorSystem {
    system: actix::System,
    arbiter: actix::ArbiterHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The actors' thread could not be started or is gone.
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    /// The OS refused the thread.
    #[error("cannot start the actors' thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// The thread is gone (it panicked, or was stopped).
    #[error("the actors' thread is not running")]
    Gone,
}

impl ActorSystem {
    /// Starts the actors' thread, scheduled as `scheduling` says.
    pub fn start(scheduling: ActorsScheduling) -> Result<Self, SystemError> {
        let (ready, handles) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kactor-actors".into())
            .spawn(move || {
                schedule(scheduling);
                let runner = actix::System::new();
                runner.block_on(async {
                    let _ = ready.send((actix::System::current(), actix::Arbiter::current()));
                });
                let _ = runner.run();
            })?;
        let (system, arbiter) = handles.recv().map_err(|_| SystemError::Gone)?;
        Ok(ActorSystem {
            system,
            arbiter,
            thread: Some(thread),
        })
    }

    /// Runs `make` on the actors' thread (to start actors there) and returns what it made.
    pub async fn run<F, T>(&self, make: F) -> Result<T, SystemError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        if !self.arbiter.spawn_fn(move || {
            let _ = tx.send(make());
        }) {
            return Err(SystemError::Gone);
        }
        rx.await.map_err(|_| SystemError::Gone)
    }

    /// Starts an actor on the actors' thread.
    pub async fn start_actor<A, F>(&self, make: F) -> Result<Addr<A>, SystemError>
    where
        A: Actor<Context = Context<A>>,
        F: FnOnce() -> A + Send + 'static,
    {
        self.run(move || make().start()).await
    }

    /// Spawns a future on the actors' thread.
    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) -> bool {
        self.arbiter.spawn(future)
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.system.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ActorSystem {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Sets the calling thread's scheduling policy (see [`ActorsScheduling`]). A refusal (a seccomp
/// profile, say) leaves the default policy: the operator works the same, a little slower.
fn schedule(scheduling: ActorsScheduling) {
    match scheduling {
        ActorsScheduling::Normal => {}
        #[cfg(target_os = "linux")]
        ActorsScheduling::Batch => {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: sets the policy of the calling thread (pid 0) from a valid sched_param.
            let result = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
            if result != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "The actors' thread keeps the default scheduling policy: SCHED_BATCH was refused.");
            }
        }
        #[cfg(not(target_os = "linux"))]
        ActorsScheduling::Batch => {}
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The policy the actors' thread runs under, asked on that thread.
    async fn policy(scheduling: ActorsScheduling) -> libc::c_int {
        let actors = ActorSystem::start(scheduling).unwrap();
        // SAFETY: asks the calling thread's policy (pid 0).
        let policy = actors
            .run(|| unsafe { libc::sched_getscheduler(0) })
            .await
            .unwrap();
        actors.stop();
        policy
    }

    #[tokio::test]
    async fn the_actors_thread_runs_under_the_policy_the_settings_name() {
        // SAFETY: asks the calling thread's policy (pid 0).
        let here = || unsafe { libc::sched_getscheduler(0) };
        let inherited = here();
        assert_eq!(policy(ActorsScheduling::Batch).await, libc::SCHED_BATCH);
        assert_eq!(
            policy(ActorsScheduling::Normal).await,
            inherited,
            "Normal keeps the policy the thread inherits"
        );
        assert_eq!(here(), inherited, "only the actors' thread changes");
    }
}
