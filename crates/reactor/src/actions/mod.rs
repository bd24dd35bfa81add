//! Doing it: running a handler once (its timeout, its verdict) and one object's processing cycle, which
//! turns an event into handler runs and one patch.

pub mod execution;
pub mod processing;
