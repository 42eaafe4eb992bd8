//! symheap: symmetric memory across GPUs and CPU processes.
//!
//! Every PE (one process per GPU, or per CPU slot on the host backend) allocates the same
//! buffers in the same order; any PE can then read, write and atomically update any other PE's
//! copy directly. The allocator-agnostic contract is a pointer plus a peer table:
//! `peer_bases[r]` is PE r's copy in this process, `peer_bases[my_pe] == ptr`, and
//! `remote = peer_bases[to] + (ptr - peer_bases[from])`.
//!
//! ```no_run
//! let ctx = symheap::Context::init()?;
//! let (buf, peer_bases) = ctx.allocate_symmetric::<u64>(1024)?;
//! assert_eq!(peer_bases[ctx.my_pe()], buf.addr());
//! ctx.barrier_all()?;
//! let next = (ctx.my_pe() + 1) % ctx.n_pes();
//! buf.peer_view(next)?.write(0, &[ctx.my_pe() as u64])?;
//! ctx.barrier_all()?;
//! # Ok::<(), symheap::Error>(())
//! ```

pub(crate) mod backend;
pub mod bootstrap;
pub mod config;
mod context;
pub mod element;
pub mod error;
pub(crate) mod heap;
pub(crate) mod ledger;
pub(crate) mod ops;
pub mod provider;
mod stream;
pub(crate) mod table;
#[doc(hidden)]
pub mod tools;
mod util;

/// The CUDA backend's public parts: the backend a context runs on ([`Context::cuda`]), users'
/// modules compiled against `symheap.cuh`, NVRTC and the kernels symheap ships.
pub mod cuda {
    pub use crate::backend::cuda::*;
}
pub use backend::cuda::Engine;
pub use backend::{AtomicOp, BackendKind, ReduceOp};
pub use config::{BackendChoice, Config};
pub use context::{Context, ContextBuilder, HeapUsage, PeerView, SymmetricBuffer};
pub use element::{DType, Element};
pub use error::{Error, ErrorKind, Result};
pub use ops::alias;
pub use ops::{
    AllReduceAlgo, AtomicBitwise, AtomicElement, AtomicInt, Cmp, CollParam, CollParams, SignalOp,
    StreamColl, Team, COLLECTIVES, NODES_ALL_REDUCE_SMALL,
};
pub use provider::{Allocation, At, NativeHeap, Nvshmem, NvshmemLibrary, Provider};
pub use stream::Stream;
pub use table::{translate, PeerMask, SymmetricAddressMap};
pub use util::human_bytes;

/// Tells symheap which Python directories (`sys.path`) to search for NVIDIA's pip wheels
/// (`nvidia-cuda-nvrtc`, `nvidia-nvshmem-cu13`) instead of asking the `python3` on PATH. The
/// Python package calls it when it is imported; a Rust program rarely needs it. Affects only
/// libraries not loaded yet.
pub fn set_python_search_path(dirs: Vec<std::path::PathBuf>) {
    util::libsearch::set_python_path(dirs);
}
