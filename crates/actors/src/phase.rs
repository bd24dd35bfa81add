//! The object worker's state machine, pure: what the worker is doing ([`Phase`]), what can happen to
//! it ([`Input`]), and what it must do about it ([`Effect`]), decided by [`step`] with no actor, no
//! timer and no task, so that every transition is tested by a table (as the peering decision is).
//!
//! The worker ([`crate::worker::ObjectWorker`]) keeps the data (the pending event, the last one,
//! the object's memory, the version it waits for) and carries the effects out in order.

use std::time::Duration;

use kactor_reactor::processing::Next;
use smallvec::{smallvec, SmallVec};

/// What the worker is doing: exactly one of these at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing runs and nothing is scheduled. The idle timer runs, unless daemons or timers hold
    /// the object (their reports come to the worker).
    Idle,
    /// A task runs (a cycle, or a touch after a retry sleep). Events that come meanwhile wait,
    /// coalesced to the newest.
    Busy(Task),
    /// The next step waits on the timer.
    Scheduled(Wait),
    /// The operator is paused: nothing starts until the next delivery (an event or a trigger, which
    /// the supervisor sends only after the resume). A task that ran when the pause came finishes.
    Paused(Option<Task>),
    /// Asked to stop: the actor stops as soon as no task runs.
    Stopping(Option<Task>),
}

/// A task of the worker, run on the operator's runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// A processing cycle (it has the object's memory).
    Cycle,
    /// A touch of the object, so that its event starts the next cycle after a retry sleep.
    Touch,
}

/// What a scheduled step waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Our own patch to come back through the watch (until the consistency deadline); then the
    /// cycle runs again on what it has. An event ends the wait at once.
    Consistency,
    /// Delayed handlers: sleep, then touch the object. An event ends the sleep at once.
    Retry,
    /// Throttling after an unexpected error; events are held until the pause ends.
    Throttle,
}

/// What happens to the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// An event for the object.
    Event,
    /// The cycle ended: what comes next, or None when it failed unexpectedly.
    CycleDone(Option<Next>),
    /// The touch ended (false: it failed).
    TouchDone(bool),
    /// The timer fired (the idle timer, or the scheduled step's).
    TimerFired,
    /// The operator pauses.
    Pause,
    /// Stop (idling, or the operator exits).
    Stop,
    /// The last daemon or timer holding the object stopped: a cycle should release (or drop) the
    /// finalizer now rather than at the next event.
    Released,
}

/// What the worker knows besides its phase, as far as the transitions need it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// An event waits to be processed.
    pub pending: bool,
    /// Daemons or timers hold the object.
    pub holding: bool,
    /// The daemons let go during the running cycle: run it again when it ends.
    pub recheck: bool,
    /// The last event processed was the object's deletion (nothing to run again).
    pub last_deleted: bool,
    /// The cycle that ended asked to be woken (a reconcile handler's requeue or retry).
    pub wake: bool,
}

/// What the worker must do, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Cancel the timer, whatever it was for.
    CancelTimer,
    /// Keep the event as the pending one (it replaces an older one, which is counted as
    /// coalesced).
    Hold,
    /// Forget the pending event.
    DropPending,
    /// Start a cycle on the pending event, else on the last one.
    Cycle,
    /// Touch the object.
    Touch,
    /// Arm the timer for the consistency deadline of our last patch.
    AwaitConsistency,
    /// Arm the timer for a retry sleep this long.
    Sleep(Duration),
    /// Arm the timer for the next throttling delay (and log the error).
    Throttle,
    /// The throttling delays start again from the first (a cycle or touch went through).
    Unthrottle,
    /// Arm the idle timer.
    ArmIdle,
    /// Tell the idle timer's end to the supervisor (it stops the worker if no event is in flight).
    ReportIdle,
    /// Tell the supervisor that work was dropped: its next listing dispatches the object again.
    Interrupted,
    /// Remember to run the cycle again when the running one ends.
    Recheck,
    /// That was done: forget it.
    Rechecked,
    /// Stop the actor.
    StopActor,
}

use Effect::*;

/// The effects of a step, inline: a step has at most four (a worker steps on every message, and a
/// heap allocation each time was 1.5 % of the actors' thread's work).
pub type Effects = SmallVec<[Effect; 4]>;

/// The transition of `phase` on `input`: the next phase and the effects, in order.
pub fn step(phase: Phase, input: Input, facts: Facts) -> (Phase, Effects) {
    match input {
        Input::Event => on_event(phase),
        Input::CycleDone(next) => on_cycle_done(phase, next, facts),
        Input::TouchDone(ok) => on_touch_done(phase, ok, facts),
        Input::TimerFired => on_timer(phase, facts),
        Input::Pause => on_pause(phase, facts),
        Input::Stop => on_stop(phase, facts),
        Input::Released => on_released(phase, facts),
    }
}

/// An event starts a cycle at once, ending an idle wait, a retry sleep or a consistency wait; it
/// waits while a task runs or a throttling pause lasts. The first event after a resume unpauses.
fn on_event(phase: Phase) -> (Phase, Effects) {
    match phase {
        Phase::Stopping(_) => (phase, smallvec![]),
        Phase::Busy(task) | Phase::Paused(Some(task)) => (Phase::Busy(task), smallvec![Hold]),
        Phase::Scheduled(Wait::Throttle) => (phase, smallvec![Hold]),
        Phase::Idle | Phase::Paused(None) | Phase::Scheduled(Wait::Consistency | Wait::Retry) => (
            Phase::Busy(Task::Cycle),
            smallvec![Hold, CancelTimer, Cycle],
        ),
    }
}

fn on_cycle_done(phase: Phase, next: Option<Next>, facts: Facts) -> (Phase, Effects) {
    match phase {
        Phase::Stopping(Some(Task::Cycle)) => (Phase::Stopping(None), smallvec![StopActor]),
        Phase::Paused(Some(Task::Cycle)) => {
            // Work the cycle scheduled is dropped, its wake too: the listing after the resume
            // brings it back, or the supervisor, told after that listing, dispatches it again.
            let dropped = facts.wake
                || next.is_none_or(|n| matches!(n, Next::AwaitOwnPatch | Next::RetryAfter(_)));
            let mut effects = Effects::new();
            if dropped {
                effects.push(Interrupted);
            }
            if next.is_some() {
                effects.push(Unthrottle);
            }
            settle_paused(effects, facts)
        }
        Phase::Busy(Task::Cycle) => match next {
            None => (Phase::Scheduled(Wait::Throttle), smallvec![Throttle]),
            Some(next) => after_cycle(next, facts),
        },
        // A cycle ends only where one runs: anything else is a stale message.
        other => (other, smallvec![]),
    }
}

/// After a successful cycle: a newer event first, then a recheck for released daemons, then what
/// the cycle asked for.
fn after_cycle(next: Next, facts: Facts) -> (Phase, Effects) {
    let mut effects = smallvec![Unthrottle];
    if facts.pending {
        effects.push(Cycle);
        return (Phase::Busy(Task::Cycle), effects);
    }
    if facts.recheck {
        effects.push(Rechecked);
        return rerun(effects, facts);
    }
    match next {
        Next::AwaitOwnPatch => {
            effects.push(AwaitConsistency);
            (Phase::Scheduled(Wait::Consistency), effects)
        }
        Next::RetryAfter(delay) => {
            effects.push(Sleep(delay));
            (Phase::Scheduled(Wait::Retry), effects)
        }
        Next::AwaitDaemons | Next::Idle => settle(effects, facts),
    }
}

fn on_touch_done(phase: Phase, ok: bool, facts: Facts) -> (Phase, Effects) {
    match phase {
        Phase::Stopping(Some(Task::Touch)) => (Phase::Stopping(None), smallvec![StopActor]),
        Phase::Paused(Some(Task::Touch)) if ok => settle_paused(smallvec![Unthrottle], facts),
        // The failed touch is not retried while paused: the listing after the resume is.
        Phase::Paused(Some(Task::Touch)) => settle_paused(smallvec![Interrupted], facts),
        Phase::Busy(Task::Touch) if ok => settle(smallvec![Unthrottle], facts),
        Phase::Busy(Task::Touch) => (Phase::Scheduled(Wait::Throttle), smallvec![Throttle]),
        other => (other, smallvec![]),
    }
}

fn on_timer(phase: Phase, facts: Facts) -> (Phase, Effects) {
    match phase {
        Phase::Idle | Phase::Paused(None) => (phase, smallvec![ReportIdle]),
        // The retry sleep is over: the touch's event starts the next cycle.
        Phase::Scheduled(Wait::Retry) => (Phase::Busy(Task::Touch), smallvec![Touch]),
        // The consistency wait or the throttling pause is over: the cycle again, on the newest.
        Phase::Scheduled(Wait::Consistency | Wait::Throttle) => {
            if facts.pending {
                (Phase::Busy(Task::Cycle), smallvec![Cycle])
            } else {
                rerun(smallvec![], facts)
            }
        }
        // A timer that fired as it was being cancelled.
        Phase::Busy(_) | Phase::Paused(Some(_)) | Phase::Stopping(_) => (phase, smallvec![]),
    }
}

/// A pause drops what is scheduled and pending (told to the supervisor, so that the listing after
/// the resume dispatches the object again) and lets a running task finish.
fn on_pause(phase: Phase, facts: Facts) -> (Phase, Effects) {
    let scheduled = matches!(phase, Phase::Scheduled(_));
    let mut effects = Effects::new();
    if scheduled || facts.pending || facts.holding {
        effects.push(Interrupted);
    }
    effects.push(DropPending);
    match phase {
        Phase::Stopping(_) => (phase, smallvec![]),
        Phase::Busy(task) | Phase::Paused(Some(task)) => (Phase::Paused(Some(task)), effects),
        Phase::Idle | Phase::Scheduled(_) | Phase::Paused(None) => {
            effects.push(CancelTimer);
            settle_paused(effects, facts)
        }
    }
}

/// A stop drops what is scheduled and pending, and stops the actor once no task runs.
fn on_stop(phase: Phase, facts: Facts) -> (Phase, Effects) {
    let running = match phase {
        Phase::Busy(task) | Phase::Paused(Some(task)) | Phase::Stopping(Some(task)) => Some(task),
        Phase::Idle | Phase::Scheduled(_) | Phase::Paused(None) | Phase::Stopping(None) => None,
    };
    let mut effects = Effects::new();
    if running.is_some() || matches!(phase, Phase::Scheduled(_)) || facts.pending {
        effects.push(Interrupted);
    }
    effects.extend([DropPending, CancelTimer]);
    if running.is_none() {
        effects.push(StopActor);
    }
    (Phase::Stopping(running), effects)
}

/// Nothing holds the object any more: a cycle releases (or drops) the finalizer now.
fn on_released(phase: Phase, facts: Facts) -> (Phase, Effects) {
    match phase {
        Phase::Busy(_) => (phase, smallvec![Recheck]),
        Phase::Idle | Phase::Scheduled(Wait::Consistency | Wait::Retry) if !facts.pending => {
            rerun(smallvec![CancelTimer], facts)
        }
        // Nothing holds the worker from idling any more.
        Phase::Paused(None) => (phase, smallvec![ArmIdle]),
        _ => (phase, smallvec![]),
    }
}

/// The cycle again on the last event, unless that was the deletion.
fn rerun(mut effects: Effects, facts: Facts) -> (Phase, Effects) {
    if facts.last_deleted {
        return settle(effects, facts);
    }
    effects.push(Cycle);
    (Phase::Busy(Task::Cycle), effects)
}

/// Nothing to do now: the pending event, or idle (with the idle timer unless daemons hold).
fn settle(mut effects: Effects, facts: Facts) -> (Phase, Effects) {
    if facts.pending {
        effects.push(Cycle);
        return (Phase::Busy(Task::Cycle), effects);
    }
    if !facts.holding {
        effects.push(ArmIdle);
    }
    (Phase::Idle, effects)
}

/// Paused with nothing running: the pending event is dropped (told), and the worker may idle out.
fn settle_paused(mut effects: Effects, facts: Facts) -> (Phase, Effects) {
    if facts.pending && !effects.contains(&DropPending) {
        effects.extend([Interrupted, DropPending]);
    }
    if !facts.holding {
        effects.push(ArmIdle);
    }
    (Phase::Paused(None), effects)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Facts = Facts {
        pending: false,
        holding: false,
        recheck: false,
        last_deleted: false,
        wake: false,
    };
    const PENDING: Facts = Facts {
        pending: true,
        ..NONE
    };
    const HOLDING: Facts = Facts {
        holding: true,
        ..NONE
    };
    const RECHECK: Facts = Facts {
        recheck: true,
        ..NONE
    };
    const DELETED: Facts = Facts {
        last_deleted: true,
        ..NONE
    };

    const CYCLE: Phase = Phase::Busy(Task::Cycle);
    const TOUCH: Phase = Phase::Busy(Task::Touch);
    const SECONDS_5: Duration = Duration::from_secs(5);

    /// Each row: from, input, facts, to, effects.
    fn check(rows: &[(Phase, Input, Facts, Phase, &[Effect])]) {
        for (i, (from, input, facts, to, effects)) in rows.iter().enumerate() {
            let (phase, done) = step(*from, *input, *facts);
            assert!(!done.spilled(), "row {i}: the effects fit inline");
            assert_eq!(
                (phase, done.as_slice()),
                (*to, *effects),
                "row {i}: {from:?} on {input:?} with {facts:?}"
            );
        }
    }

    #[test]
    fn events_start_a_cycle_unless_one_runs_or_a_throttle_or_a_stop_holds_them() {
        use Input::Event;
        check(&[
            (Phase::Idle, Event, NONE, CYCLE, &[Hold, CancelTimer, Cycle]),
            (
                Phase::Scheduled(Wait::Retry),
                Event,
                NONE,
                CYCLE,
                &[Hold, CancelTimer, Cycle],
            ),
            (
                Phase::Scheduled(Wait::Consistency),
                Event,
                NONE,
                CYCLE,
                &[Hold, CancelTimer, Cycle],
            ),
            (
                Phase::Scheduled(Wait::Throttle),
                Event,
                NONE,
                Phase::Scheduled(Wait::Throttle),
                &[Hold],
            ),
            (CYCLE, Event, NONE, CYCLE, &[Hold]),
            (TOUCH, Event, NONE, TOUCH, &[Hold]),
            // The first event after the resume.
            (
                Phase::Paused(None),
                Event,
                NONE,
                CYCLE,
                &[Hold, CancelTimer, Cycle],
            ),
            (
                Phase::Paused(Some(Task::Cycle)),
                Event,
                NONE,
                CYCLE,
                &[Hold],
            ),
            (
                Phase::Stopping(Some(Task::Cycle)),
                Event,
                NONE,
                Phase::Stopping(Some(Task::Cycle)),
                &[],
            ),
        ]);
    }

    #[test]
    fn a_cycle_is_followed_by_the_newer_event_then_a_recheck_then_what_it_asked_for() {
        let done = |next| Input::CycleDone(Some(next));
        check(&[
            (
                CYCLE,
                done(Next::Idle),
                NONE,
                Phase::Idle,
                &[Unthrottle, ArmIdle],
            ),
            (CYCLE, done(Next::Idle), HOLDING, Phase::Idle, &[Unthrottle]),
            (
                CYCLE,
                done(Next::AwaitDaemons),
                HOLDING,
                Phase::Idle,
                &[Unthrottle],
            ),
            (
                CYCLE,
                done(Next::Idle),
                PENDING,
                CYCLE,
                &[Unthrottle, Cycle],
            ),
            (
                CYCLE,
                done(Next::RetryAfter(SECONDS_5)),
                PENDING,
                CYCLE,
                &[Unthrottle, Cycle],
            ),
            (
                CYCLE,
                done(Next::Idle),
                RECHECK,
                CYCLE,
                &[Unthrottle, Rechecked, Cycle],
            ),
            (
                CYCLE,
                done(Next::Idle),
                Facts {
                    recheck: true,
                    last_deleted: true,
                    ..NONE
                },
                Phase::Idle,
                &[Unthrottle, Rechecked, ArmIdle],
            ),
            (
                CYCLE,
                done(Next::AwaitOwnPatch),
                NONE,
                Phase::Scheduled(Wait::Consistency),
                &[Unthrottle, AwaitConsistency],
            ),
            (
                CYCLE,
                done(Next::RetryAfter(SECONDS_5)),
                NONE,
                Phase::Scheduled(Wait::Retry),
                &[Unthrottle, Sleep(SECONDS_5)],
            ),
        ]);
    }

    #[test]
    fn failures_throttle_and_a_success_ends_the_throttling() {
        check(&[
            (
                CYCLE,
                Input::CycleDone(None),
                PENDING,
                Phase::Scheduled(Wait::Throttle),
                &[Throttle],
            ),
            (
                TOUCH,
                Input::TouchDone(false),
                NONE,
                Phase::Scheduled(Wait::Throttle),
                &[Throttle],
            ),
            (
                Phase::Scheduled(Wait::Throttle),
                Input::TimerFired,
                PENDING,
                CYCLE,
                &[Cycle],
            ),
            (
                Phase::Scheduled(Wait::Throttle),
                Input::TimerFired,
                NONE,
                CYCLE,
                &[Cycle],
            ),
            (
                TOUCH,
                Input::TouchDone(true),
                NONE,
                Phase::Idle,
                &[Unthrottle, ArmIdle],
            ),
            (
                TOUCH,
                Input::TouchDone(true),
                PENDING,
                CYCLE,
                &[Unthrottle, Cycle],
            ),
        ]);
    }

    #[test]
    fn timers_end_in_idling_a_touch_or_the_cycle_again() {
        use Input::TimerFired;
        check(&[
            (Phase::Idle, TimerFired, NONE, Phase::Idle, &[ReportIdle]),
            (
                Phase::Paused(None),
                TimerFired,
                NONE,
                Phase::Paused(None),
                &[ReportIdle],
            ),
            (
                Phase::Scheduled(Wait::Retry),
                TimerFired,
                NONE,
                TOUCH,
                &[Touch],
            ),
            (
                Phase::Scheduled(Wait::Consistency),
                TimerFired,
                NONE,
                CYCLE,
                &[Cycle],
            ),
            (
                Phase::Scheduled(Wait::Consistency),
                TimerFired,
                DELETED,
                Phase::Idle,
                &[ArmIdle],
            ),
            (CYCLE, TimerFired, NONE, CYCLE, &[]),
        ]);
    }

    #[test]
    fn a_pause_drops_what_is_scheduled_or_pending_and_tells_the_supervisor() {
        use Input::Pause;
        check(&[
            (
                Phase::Idle,
                Pause,
                NONE,
                Phase::Paused(None),
                &[DropPending, CancelTimer, ArmIdle],
            ),
            (
                Phase::Idle,
                Pause,
                HOLDING,
                Phase::Paused(None),
                &[Interrupted, DropPending, CancelTimer],
            ),
            (
                Phase::Scheduled(Wait::Retry),
                Pause,
                NONE,
                Phase::Paused(None),
                &[Interrupted, DropPending, CancelTimer, ArmIdle],
            ),
            (
                CYCLE,
                Pause,
                NONE,
                Phase::Paused(Some(Task::Cycle)),
                &[DropPending],
            ),
            (
                CYCLE,
                Pause,
                PENDING,
                Phase::Paused(Some(Task::Cycle)),
                &[Interrupted, DropPending],
            ),
            // The cycle that ran ends paused: what it scheduled is dropped, and told.
            (
                Phase::Paused(Some(Task::Cycle)),
                Input::CycleDone(Some(Next::RetryAfter(SECONDS_5))),
                NONE,
                Phase::Paused(None),
                &[Interrupted, Unthrottle, ArmIdle],
            ),
            (
                Phase::Paused(Some(Task::Cycle)),
                Input::CycleDone(Some(Next::Idle)),
                NONE,
                Phase::Paused(None),
                &[Unthrottle, ArmIdle],
            ),
            // A requeue or retry it asked to be woken for is dropped (not armed), and told.
            (
                Phase::Paused(Some(Task::Cycle)),
                Input::CycleDone(Some(Next::Idle)),
                Facts { wake: true, ..NONE },
                Phase::Paused(None),
                &[Interrupted, Unthrottle, ArmIdle],
            ),
            (
                Phase::Paused(Some(Task::Cycle)),
                Input::CycleDone(None),
                NONE,
                Phase::Paused(None),
                &[Interrupted, ArmIdle],
            ),
            (
                Phase::Paused(Some(Task::Touch)),
                Input::TouchDone(false),
                NONE,
                Phase::Paused(None),
                &[Interrupted, ArmIdle],
            ),
        ]);
    }

    #[test]
    fn a_stop_waits_for_the_running_task_only() {
        use Input::Stop;
        check(&[
            (
                Phase::Idle,
                Stop,
                NONE,
                Phase::Stopping(None),
                &[DropPending, CancelTimer, StopActor],
            ),
            (
                Phase::Scheduled(Wait::Retry),
                Stop,
                NONE,
                Phase::Stopping(None),
                &[Interrupted, DropPending, CancelTimer, StopActor],
            ),
            (
                CYCLE,
                Stop,
                NONE,
                Phase::Stopping(Some(Task::Cycle)),
                &[Interrupted, DropPending, CancelTimer],
            ),
            (
                Phase::Stopping(Some(Task::Cycle)),
                Input::CycleDone(Some(Next::Idle)),
                NONE,
                Phase::Stopping(None),
                &[StopActor],
            ),
            (
                Phase::Stopping(Some(Task::Touch)),
                Input::TouchDone(false),
                NONE,
                Phase::Stopping(None),
                &[StopActor],
            ),
            (
                Phase::Stopping(Some(Task::Cycle)),
                Input::Pause,
                NONE,
                Phase::Stopping(Some(Task::Cycle)),
                &[],
            ),
        ]);
    }

    #[test]
    fn released_daemons_run_the_cycle_again_now_or_after_the_running_one() {
        use Input::Released;
        check(&[
            (Phase::Idle, Released, NONE, CYCLE, &[CancelTimer, Cycle]),
            (
                Phase::Scheduled(Wait::Retry),
                Released,
                NONE,
                CYCLE,
                &[CancelTimer, Cycle],
            ),
            (
                Phase::Idle,
                Released,
                DELETED,
                Phase::Idle,
                &[CancelTimer, ArmIdle],
            ),
            (CYCLE, Released, NONE, CYCLE, &[Recheck]),
            (
                Phase::Scheduled(Wait::Throttle),
                Released,
                NONE,
                Phase::Scheduled(Wait::Throttle),
                &[],
            ),
            (
                Phase::Paused(None),
                Released,
                NONE,
                Phase::Paused(None),
                &[ArmIdle],
            ),
            (
                Phase::Stopping(None),
                Released,
                NONE,
                Phase::Stopping(None),
                &[],
            ),
        ]);
    }
}
