//! The engines: one per transport, each able to decline a request. The pipeline (`../mod.rs`)
//! offers a checked request to them in [`run`]'s order and the first that accepts runs it:
//!
//! 1. [`nccl::NcclEngine`]: CUDA, a team whose members are on several nodes (the world, or a
//!    split of it that spans nodes): NCCL, with symheap's kernels inside each node.
//! 2. [`device::DeviceEngine`]: CUDA, a team inside one node: symheap's kernels on a stream
//!    (capturable in a CUDA graph); a reduction only of the dtypes the kernels have.
//! 3. [`mpi::MpiEngine`]: host backend, a team with members on other nodes: Open MPI (under
//!    mpirun).
//! 4. [`host::HostEngine`]: everything else: barriers and copies through the backend.
//!
//! Each engine does what its transport needs around any call (ordering on the stream, the
//! ledger record and the members' meeting, the communicator); the kind's own steps on it are
//! in the kind's file (`Collective::host`, `::mpi`, `::nccl_*`, `::device_*`).

mod device;
mod eager;
mod host;
mod mpi;
mod nccl;

use super::request::{Collective, Plan, Request};
use crate::context::Context;
use crate::error::Result;

/// A transport that runs collectives.
pub(super) trait Engine {
    /// Whether this engine runs `r` (planned as `p`); false passes it to the next one.
    fn accepts<K: Collective>(&self, cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> bool;

    /// Runs `r`: on return the host form is complete on this PE, the stream form enqueued.
    fn run<K: Collective>(&self, cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> Result<()>;
}

/// Offers `r` to the engines in order (see the module documentation).
pub(super) fn run<K: Collective>(cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> Result<()> {
    if nccl::NcclEngine.accepts(cx, r, p) {
        return nccl::NcclEngine.run(cx, r, p);
    }
    if device::DeviceEngine.accepts(cx, r, p) {
        return device::DeviceEngine.run(cx, r, p);
    }
    if mpi::MpiEngine.accepts(cx, r, p) {
        return mpi::MpiEngine.run(cx, r, p);
    }
    host::HostEngine.run(cx, r, p)
}
