//! Operations over the backend: RMA, atomics, signals, synchronisation, teams and collectives.
//! Written once against the [`crate::backend::Backend`] trait; the host backend runs them with
//! CPU loads, stores and atomics on the shared heap.

pub mod alias;
pub mod atomics;
pub mod coll;
pub mod rma;
pub mod stream;
pub(crate) mod sync;
mod team;
mod team_members;

pub use crate::context::team::Team;
pub use atomics::{AtomicBitwise, AtomicElement, AtomicInt};
pub use coll::{
    AllReduceAlgo, CollParam, CollParams, StreamColl, COLLECTIVES, NODES_ALL_REDUCE_SMALL,
};
pub use rma::{Cmp, SignalOp};
