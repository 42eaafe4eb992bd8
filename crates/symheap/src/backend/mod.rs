//! Backends: where PE memory physically lives, how every PE's copy is mapped into this process,
//! and how bytes move between the host and those mappings.
//!
//! Every backend uses the same slot layout: one reservation of `world × capacity` bytes of
//! address space per process, PE r's heap at `base + r × capacity`. That layout is what makes
//! the per-peer delta of a peer table the same for every heap address.

pub mod cuda;
mod fence;
pub mod host;
pub mod reduce;
pub(crate) mod shared;

use std::time::Duration;

pub use fence::Fence;
pub use reduce::ReduceOp;

use crate::element::DType;
use crate::error::{Error, Result};

/// How [`Backend::grow`] learns whether every PE got its new memory: called with this PE's own
/// failure (None when it got the memory), it returns Ok only when no PE failed.
pub type GrowVote<'a> = &'a dyn Fn(Option<&Error>) -> Result<()>;

/// An atomic read-modify-write on a 4- or 8-byte word. Every variant returns the old value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Read.
    Load,
    /// Write `operand`.
    Store,
    /// Write `operand`, return the old value.
    Swap,
    /// Write `operand` if the word equals `compare`.
    CompareSwap,
    /// Wrapping add.
    Add,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// Bitwise xor.
    Xor,
}

impl AtomicOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Load => "fetch",
            AtomicOp::Store => "set",
            AtomicOp::Swap => "swap",
            AtomicOp::CompareSwap => "compare_swap",
            AtomicOp::Add => "add",
            AtomicOp::And => "and",
            AtomicOp::Or => "or",
            AtomicOp::Xor => "xor",
        }
    }
}

/// Which backend a context runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Shared host memory (memfd + mmap) between CPU processes.
    Host,
    /// CUDA VMM device memory.
    Cuda,
}

impl BackendKind {
    /// Lower-case name, as in `SYMHEAP_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// One mapped chunk of physical memory, for the banner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    /// Offset in the heap.
    pub offset: u64,
    /// Size.
    pub bytes: u64,
}

/// What the heap and the ops need from the memory system.
///
/// Collective-order rule: `grow` is collective over the job; every PE calls it with the same
/// arguments in the same order.
pub trait Backend: Send + Sync {
    /// Which backend.
    fn kind(&self) -> BackendKind;
    /// One line about the device or mechanism, for the banner.
    fn describe(&self) -> String;
    /// Physical memory is added in multiples of this.
    fn granularity(&self) -> u64;
    /// Address space per PE.
    fn capacity(&self) -> u64;
    /// Bytes of each PE's heap backed by memory (`0..mapped()`).
    fn mapped(&self) -> u64;
    /// The chunks mapped so far.
    fn chunks(&self) -> Vec<ChunkInfo>;
    /// Start of PE `pe`'s heap in this process, or None if its memory is not directly
    /// addressable from here (another node, no peer-to-peer path).
    fn slot_base(&self, pe: usize) -> Option<u64>;
    /// Collective. Backs `[mapped(), new_mapped)` of every reachable PE's heap with memory.
    ///
    /// Calls `vote` exactly once, after this PE got (or failed to get) its new memory and
    /// before any peer's memory is touched, passing its own failure if any. `vote` returns Ok
    /// only when every PE got its memory; otherwise the backend gives its new memory back and
    /// returns `vote`'s error, so that either every PE grows or none does (one PE short of
    /// memory must not leave the others waiting for its handles).
    fn grow(&self, new_mapped: u64, vote: GrowVote<'_>) -> Result<()>;
    /// Whether this PE could back `bytes` more without crowding out other users of the
    /// memory: asked before growing the heap for headroom no allocation needs yet. The
    /// default says yes (memory that costs nothing until touched).
    fn can_spare(&self, _bytes: u64) -> bool {
        true
    }
    /// Copies host bytes to `addr`, which the caller has checked lies in a mapped part of a
    /// direct PE's heap.
    fn write_bytes(&self, addr: u64, src: &[u8]) -> Result<()>;
    /// Copies from `addr` (checked like `write_bytes`) into host bytes.
    fn read_bytes(&self, addr: u64, dst: &mut [u8]) -> Result<()>;

    // The data plane. Addresses are heap addresses of direct PEs, checked by the ops layer.

    /// Copies `bytes` from `src` to `dst` (may be different PEs' heaps; must not overlap).
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Atomic `op` on the `width`-byte (4 or 8) word at `addr`; returns the old bits.
    fn atomic(
        &self,
        addr: u64,
        width: usize,
        op: AtomicOp,
        operand: u64,
        compare: u64,
    ) -> Result<u64>;
    /// `dst = srcs[0] op srcs[1] op ...` over `count` elements, inputs in the given order.
    /// `dst` may equal one of the sources.
    fn reduce(
        &self,
        dst: u64,
        srcs: &[u64],
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;
    /// Orders this PE's earlier stores to any PE before its later ones, as a sequentially
    /// consistent fence of the calling thread at least (`quiet` relies on that for the
    /// doorbell handshake with sleeping waiters, `Inner::ring_data_all`).
    fn fence(&self);
    /// A fence over everything enqueued so far on `streams` (device work that may still use a
    /// block being released), or None when nothing can be pending (the host backend completes
    /// every operation before it returns).
    fn fence_streams(&self, _streams: &[u64]) -> Option<Box<dyn Fence>> {
        None
    }
    /// How often host-side waits on heap memory must re-read it. None when every change is
    /// made by a host thread that rings the waiter's doorbell (host backend); a GPU backend,
    /// whose kernels ring no doorbells, returns a short interval.
    fn poll_interval(&self) -> Option<Duration> {
        None
    }
}

/// A context's backend: one of the two. What both do is [`Backend`] (through `Deref`); code that
/// needs what only one has (the CUDA backend's streams and kernels, the host backend's copies
/// as static calls on hot paths) matches on the variant, which is as static as a call.
// One per context, made once at init: the variants' sizes do not matter, an indirection would.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyBackend {
    /// Shared host memory between CPU processes.
    Host(host::HostBackend),
    /// CUDA VMM device memory.
    Cuda(cuda::CudaBackend),
}

impl AnyBackend {
    /// Whether this is the host backend (shared host memory between CPU processes): for the
    /// ops that only choose a path by backend, without asking for either backend object.
    pub(crate) fn is_host(&self) -> bool {
        matches!(self, Self::Host(_))
    }

    /// The CUDA backend, when it is this one.
    pub(crate) fn as_cuda(&self) -> Option<&cuda::CudaBackend> {
        match self {
            Self::Cuda(cu) => Some(cu),
            Self::Host(_) => None,
        }
    }

    /// The host backend, when it is this one: its byte copies are then static calls, which the
    /// eager broadcast's few words take inline instead of through [`Backend`].
    pub(crate) fn as_host(&self) -> Option<&host::HostBackend> {
        match self {
            Self::Host(h) => Some(h),
            Self::Cuda(_) => None,
        }
    }
}

impl std::ops::Deref for AnyBackend {
    type Target = dyn Backend;

    fn deref(&self) -> &(dyn Backend + 'static) {
        match self {
            Self::Host(h) => h,
            Self::Cuda(cu) => cu,
        }
    }
}
