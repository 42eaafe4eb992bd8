//! Backends: where PE memory physically lives, how every PE's copy is mapped into this process,
//! and how bytes move between the host and those mappings.
//!
//! Every backend uses the same slot layout: one reservation of `world × capacity` bytes of
//! address space per process, PE r's heap at `base + r × capacity`. That layout is what makes
//! the per-peer delta of a peer table the same for every heap address.

pub mod host;

use crate::error::Result;

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
    fn grow(&self, new_mapped: u64) -> Result<()>;
    /// Copies host bytes to `addr`, which the caller has checked lies in a mapped part of a
    /// direct PE's heap.
    fn write_bytes(&self, addr: u64, src: &[u8]) -> Result<()>;
    /// Copies from `addr` (checked like `write_bytes`) into host bytes.
    fn read_bytes(&self, addr: u64, dst: &mut [u8]) -> Result<()>;
}
