//! Never two operators on the same objects: Kopf-compatible peering ([`peering`]) and Lease-based
//! leader election ([`lease`]). Both decide whether this operator may work and say so through the
//! reactor's [`PauseSwitch`](kactor_reactor::pausing::PauseSwitch); neither knows what is paused.
//! Sharding ([`sharding`]) splits one resource's objects among replicas by Leases and labels.

pub mod lease;
mod leases;
pub mod peering;
pub mod sharding;
