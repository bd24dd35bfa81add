//! What kactor keeps on the objects, in Kopf's formats: the handlers' progress, the diff-base, and the
//! bookkeeping of which handler runs next.

pub mod diffbase;
pub mod progress;
pub mod progression;
