//! The actors' thread: one actix System on a thread of its own, so that no user code and no JSON
//! decoding ever runs where the supervisors run, and the operator's `run()` future stays `Send`;
//! and the object threads, where the objects' workers and their cycles run
//! ([`Execution::object_threads`](kactor_reactor::settings::Execution::object_threads)).

use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;
use kactor_reactor::settings::ActorsScheduling;
use tokio::sync::oneshot;

/// A handle to the actors' thread and the object threads; dropping it stops them.
pub struct ActorSystem {
    system: actix::System,
    arbiter: actix::ArbiterHandle,
    thread: Option<std::thread::JoinHandle<()>>,
    objects: ObjectThreads,
    /// The object threads' arbiters, joined when the system stops.
    arbiters: Vec<actix::Arbiter>,
}

/// The object threads: each an actix arbiter (a thread with a single-threaded runtime) of the
/// actors' system, and a client of its own when the operator connects by configuration. Each
/// object's worker is started on one of them, and runs its cycles there. Cheap to clone; none: the
/// workers start on the caller's (the actors') thread.
#[derive(Clone, Default)]
pub struct ObjectThreads(Arc<[ObjectThread]>);

/// One object thread.
#[derive(Clone)]
pub struct ObjectThread {
    /// Where its actors start.
    pub arbiter: actix::ArbiterHandle,
    /// Its runtime (single-threaded), for tasks that run on this thread and are aborted by a
    /// handle: the watch streams of the supervisors placed here.
    pub runtime: tokio::runtime::Handle,
    /// A client made on this thread (see [`ActorSystem::connect_object_threads`]): its request
    /// buffer and its connections run here, so that a handler's requests do not cross threads.
    /// None: the thread's cycles use the operator's client.
    pub client: Option<kube::Client>,
}

impl ObjectThreads {
    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every object thread, by its number.
    pub fn iter(&self) -> impl Iterator<Item = &ObjectThread> {
        self.0.iter()
    }
}

impl std::fmt::Debug for ObjectThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectThreads({})", self.0.len())
    }
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
    /// Starts the actors' thread, scheduled as `scheduling` says, and `object_threads` object
    /// threads (scheduled as the OS does by default: they run handlers).
    pub fn start(scheduling: ActorsScheduling, object_threads: usize) -> Result<Self, SystemError> {
        let (ready, handles) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kactor-actors".into())
            .spawn(move || {
                schedule(scheduling);
                let runner = actix::System::new();
                runner.block_on(async {
                    // Arbiters are started from within their system, which stops them with it.
                    let arbiters: Vec<actix::Arbiter> =
                        (0..object_threads).map(|_| actix::Arbiter::new()).collect();
                    let mut threads = Vec::with_capacity(arbiters.len());
                    for arbiter in &arbiters {
                        let (tx, rx) = oneshot::channel();
                        arbiter.spawn_fn(move || {
                            let _ = tx.send(tokio::runtime::Handle::current());
                        });
                        if let Ok(runtime) = rx.await {
                            threads.push(ObjectThread {
                                arbiter: arbiter.handle(),
                                runtime,
                                client: None,
                            });
                        }
                    }
                    let _ = ready.send((
                        actix::System::current(),
                        actix::Arbiter::current(),
                        arbiters,
                        threads,
                    ));
                });
                let _ = runner.run();
            })?;
        let (system, arbiter, arbiters, threads) = handles.recv().map_err(|_| SystemError::Gone)?;
        if threads.len() != arbiters.len() {
            return Err(SystemError::Gone);
        }
        let objects = ObjectThreads(threads.into());
        Ok(ActorSystem {
            system,
            arbiter,
            thread: Some(thread),
            objects,
            arbiters,
        })
    }

    /// The object threads, for the supervisors to start their workers on.
    pub fn object_threads(&self) -> ObjectThreads {
        self.objects.clone()
    }

    /// Makes a client on each object thread with `make` (kube's client spawns its request buffer
    /// where it is made, and the buffer its connections), for the cycles that run there. A thread
    /// where `make` fails keeps using the operator's client. Call it before the supervisors start:
    /// they take the threads as they are then.
    pub async fn connect_object_threads<F>(&mut self, make: F) -> Result<(), SystemError>
    where
        F: Fn() -> Result<kube::Client, kube::Error> + Send + Sync + 'static,
    {
        let make = Arc::new(make);
        // Every thread makes its client at once (each loads its TLS settings, which takes a few
        // milliseconds of the operator's start), then each is awaited in turn.
        let mut made = Vec::with_capacity(self.objects.len());
        for thread in self.objects.iter() {
            let (tx, rx) = oneshot::channel();
            let make = make.clone();
            if !thread.arbiter.spawn_fn(move || {
                let _ = tx.send(make());
            }) {
                return Err(SystemError::Gone);
            }
            made.push(rx);
        }
        let mut threads = Vec::with_capacity(self.objects.len());
        for (thread, rx) in self.objects.iter().zip(made) {
            let client = match rx.await.map_err(|_| SystemError::Gone)? {
                Ok(client) => Some(client),
                Err(error) => {
                    tracing::warn!(%error, "cannot make a client on an object thread; its handlers use the operator's");
                    None
                }
            };
            threads.push(ObjectThread {
                arbiter: thread.arbiter.clone(),
                runtime: thread.runtime.clone(),
                client,
            });
        }
        self.objects = ObjectThreads(threads.into());
        Ok(())
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
        for arbiter in self.arbiters.drain(..) {
            arbiter.stop();
            let _ = arbiter.join();
        }
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
        let actors = ActorSystem::start(scheduling, 1).unwrap();
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
