//! What the engines run on, below both them and the kinds (whose steps are written with these):
//! [`device::Launch`] (a kernel launch on a stream), [`host::Coll`] (barriers and copies through
//! the backend), [`nccl::SpanCall`] (NCCL and the node's kernels for the world across nodes),
//! and `nccl_team.rs` (the communicator of a split of the world that spans nodes). None of them
//! names a request, a kind or an engine.

pub(super) mod device;
pub(super) mod host;
pub(super) mod nccl;
mod nccl_team;
