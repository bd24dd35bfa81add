//! The HealthActor: the heartbeat of the actors' thread, and of each object thread.
//!
//! **Expected flow**: the operator starts one on its actors' thread (where its supervisors run)
//! and one on each object thread (where the objects' workers and handlers run); each beats at once
//! and then every `health.heartbeat_interval`. While an actor or user code blocks its thread, its
//! beats stop, and once `health.heartbeat_timeout` has passed, the `actors` liveness check fails,
//! naming the thread.
//!
//! **Caveats**: the actor proves that the thread's event loop runs, not that every actor's mailbox
//! is drained; a stopped actor system (at shutdown) stops the beats too.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, Message};

use crate::checks::HealthState;

/// The shortest beat interval: a zero setting would make the actor spin.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Beats for the thread it runs on (see the [module docs](self)).
///
/// ```no_run
/// # use actix::Actor;
/// # fn demo(state: std::sync::Arc<kactor_health::HealthState>) {
/// // On the actors' thread, inside the actix System:
/// let health = kactor_health::HealthActor::new(state).start();
/// # }
/// ```
#[derive(Debug)]
pub struct HealthActor {
    state: Arc<HealthState>,
    /// None: the actors' thread; else the object thread's number.
    object_thread: Option<usize>,
}

impl HealthActor {
    /// An actor beating for the actors' thread.
    pub fn new(state: Arc<HealthState>) -> Self {
        HealthActor {
            state,
            object_thread: None,
        }
    }

    /// An actor beating for object thread `number` (see
    /// [`HealthState::expect_object_threads`]), to be started on that thread.
    pub fn for_object_thread(state: Arc<HealthState>, number: usize) -> Self {
        HealthActor {
            state,
            object_thread: Some(number),
        }
    }

    fn beat(&self) {
        match self.object_thread {
            None => self.state.beat_actors(),
            Some(number) => self.state.beat_object_thread(number),
        }
    }
}

impl Actor for HealthActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.beat();
        let interval = self.state.settings().heartbeat_interval.max(MIN_INTERVAL);
        ctx.run_interval(interval, |actor, _| actor.beat());
    }
}

/// Beats now (for tests, and for whoever wants a beat on demand).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Ping;

impl Handler<Ping> for HealthActor {
    type Result = ();

    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {
        self.beat();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::{Outcome, Select};
    use kactor_reactor::observe::WatchBoard;
    use kactor_reactor::settings::Settings;
    use std::time::Instant;

    fn state(interval: Duration) -> Arc<HealthState> {
        let mut settings = Settings::default();
        settings.health.heartbeat_interval = interval;
        settings.health.heartbeat_timeout = Duration::from_millis(600);
        HealthState::new(
            &settings,
            WatchBoard::new(),
            tokio::runtime::Handle::current(),
        )
    }

    async fn actors(state: &HealthState) -> Outcome {
        let report = state.liveness_of(&Select::Only("actors")).await;
        report.outcome("actors").cloned().expect("the actors check")
    }

    /// Runs an actix System with a HealthActor on a thread of its own, until `stop` is sent.
    fn actors_thread(
        state: Arc<HealthState>,
    ) -> (
        actix::Addr<HealthActor>,
        actix::System,
        std::thread::JoinHandle<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let system = actix::System::new();
            let addr = system.block_on(async { HealthActor::new(state).start() });
            tx.send((addr, actix::System::current())).unwrap();
            system.run().unwrap();
        });
        let (addr, system) = rx.recv().unwrap();
        (addr, system, thread)
    }

    #[tokio::test]
    async fn the_actor_beats_while_its_system_runs_and_the_check_fails_once_it_stops() {
        let state = state(Duration::from_millis(50));
        assert_eq!(actors(&state).await, Outcome::Ok, "not started yet");
        let (_addr, system, thread) = actors_thread(state.clone());
        // Well past the timeout: only the beats keep the check passing.
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            assert_eq!(actors(&state).await, Outcome::Ok);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        system.stop();
        thread.join().unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        match actors(&state).await {
            Outcome::Failed(message) => assert!(message.contains("stuck"), "{message}"),
            other => panic!("the beats stopped, yet {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_object_threads_silence_fails_the_check_and_names_the_thread() {
        let state = state(Duration::from_millis(50));
        state.expect_object_threads(2);
        let (_addr, system, thread) = actors_thread(state.clone());
        // Object thread 0 beats once and then stops; 1 never beats (not started yet).
        let beat = HealthActor::for_object_thread(state.clone(), 0);
        beat.beat();
        assert_eq!(actors(&state).await, Outcome::Ok);
        tokio::time::sleep(Duration::from_millis(800)).await;
        match actors(&state).await {
            Outcome::Failed(message) => {
                assert!(message.contains("object thread 0 is stuck"), "{message}");
                assert!(!message.contains("object thread 1"), "{message}");
                assert!(!message.contains("actors' thread"), "{message}");
            }
            other => panic!("object thread 0 stopped beating, yet {other:?}"),
        }
        beat.beat();
        assert_eq!(actors(&state).await, Outcome::Ok);
        system.stop();
        thread.join().unwrap();
    }

    #[tokio::test]
    async fn a_ping_beats() {
        let state = state(Duration::from_secs(3600));
        let (addr, system, thread) = actors_thread(state.clone());
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(matches!(actors(&state).await, Outcome::Failed(_)));
        addr.send(Ping).await.unwrap();
        assert_eq!(actors(&state).await, Outcome::Ok);
        system.stop();
        thread.join().unwrap();
    }
}
