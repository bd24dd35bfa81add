//! Lifecycles: which of an object's pending changing handlers run in one processing cycle
//! (`reference/kopf.md` §1.1, Kopf's `kopf.lifecycles`).
//!
//! Every cycle ends with one combined patch, and that patch's own watch event starts the next cycle,
//! so a lifecycle that runs one handler per cycle persists progress after every handler.

/// How the pending handlers of a cycle are chosen. The default is Kopf's: [`Lifecycle::Asap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lifecycle {
    /// One handler per cycle: the one retried the least so far, in registration order among equals;
    /// a failing handler does not hold the others back (Kopf's `asap`, the default).
    #[default]
    Asap,
    /// Every pending handler in one cycle, in registration order (Kopf's `all_at_once`).
    AllAtOnce,
    /// One handler per cycle, strictly in registration order: a retrying handler holds the others
    /// back (Kopf's `one_by_one`).
    OneByOne,
}

impl Lifecycle {
    /// From the pending handlers (registration order) with their retry counts, the indices to run now.
    pub fn plan(self, pending: &[u32]) -> Vec<usize> {
        match self {
            Lifecycle::AllAtOnce => (0..pending.len()).collect(),
            Lifecycle::OneByOne => (0..pending.len().min(1)).collect(),
            Lifecycle::Asap => pending
                .iter()
                .enumerate()
                .min_by_key(|(index, retries)| (**retries, *index))
                .map(|(index, _)| vec![index])
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asap_picks_the_least_retried_handler_first() {
        assert_eq!(Lifecycle::Asap.plan(&[2, 0, 1, 0]), vec![1]);
        assert_eq!(Lifecycle::Asap.plan(&[]), Vec::<usize>::new());
    }

    #[test]
    fn one_by_one_keeps_registration_order() {
        assert_eq!(Lifecycle::OneByOne.plan(&[3, 0]), vec![0]);
    }

    #[test]
    fn all_at_once_runs_everything() {
        assert_eq!(Lifecycle::AllAtOnce.plan(&[3, 0, 1]), vec![0, 1, 2]);
    }
}
