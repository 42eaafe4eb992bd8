//! The context: init and finalize, rank information, the heap, the ledger and host collective
//! points. Everything a PE does goes through one [`Context`].
//!
//! A context's state is [`Inner`] (`inner.rs`): settings, bootstrap, backend and the host sync
//! area at the top, the rest in parts that own one role each: `memory.rs` (the heap and the
//! slot bases), `teams.rs` (the world team, team slots, live teams, eager channel state, the
//! watchdog) and `comms.rs` (device state and the NCCL / Open MPI communicators). The other
//! files add what the context does with them (`impl Inner`); neither `inner.rs` nor a part
//! names them, so no import circle runs through the state.

mod alloc;
pub(crate) mod area;
mod banner;
mod buffer;
pub(crate) mod comms;
mod device_setup;
pub(crate) mod device_state;
pub(crate) mod eager;
pub(crate) mod eager_state;
mod init;
mod inner;
pub(crate) mod memory;
mod ranges;
pub(crate) mod recent;
mod signals;
pub(crate) mod span;
mod spin;
mod sync;
pub(crate) mod team;
pub(crate) mod team_span;
pub(crate) mod teams;
pub(crate) mod watch;

use std::sync::Arc;

pub use buffer::{PeerView, SymmetricBuffer};
pub use init::ContextBuilder;
pub(crate) use inner::Inner;

use crate::backend::BackendKind;
use crate::bootstrap::NodeInfo;
use crate::config::{Config, DEFAULT_ALIGNMENT};
use crate::element::{DType, Element};
use crate::error::{invalid, Result};
use crate::table::{PeerMask, SymmetricAddressMap};

/// How much of the heap is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapUsage {
    /// Bytes allocated and not yet reclaimed (block sizes rounded to the allocator's granule).
    pub in_use: u64,
    /// Bytes backed by memory.
    pub mapped: u64,
    /// Address space per PE (the most the heap can grow to).
    pub capacity: u64,
    /// Allocations not yet reclaimed.
    pub live_blocks: usize,
    /// Allocations so far that could not be placed at once and met the other PEs to reclaim
    /// released blocks or grow the heap (a host round trip each; the rest need no
    /// communication).
    pub allocation_syncs: u64,
    /// Released on this PE but not yet offered for reclaim: device work on the streams they
    /// were used on had not finished at the last look (see stream-ordered release).
    pub waiting_releases: usize,
}

/// A PE's handle on the job: rank information, the symmetric heap, and collective calls.
///
/// Collective-order rule: the calls documented as collective (init, allocation, barrier,
/// finalize, and later the team and collective operations) must be made by every PE in the
/// same order with the same arguments. symheap checks this at every host collective point and
/// fails every PE with the first differing call named.
///
/// Dropping a context finalizes it (collectively); dropping it while panicking aborts the job
/// instead, so the other PEs fail at once rather than wait.
pub struct Context {
    pub(crate) inner: Arc<Inner>,
}

impl Context {
    /// This PE's rank.
    pub fn my_pe(&self) -> usize {
        self.inner.rank
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> usize {
        self.inner.world
    }

    /// `Ok` while the job is healthy, else its failure (a PE that exited, an abort, a
    /// divergence) as the error of `call`, as symheap's next operation would raise it. Local:
    /// never waits, never communicates. For code that waits on something symheap does not see
    /// (another library's store, a user's flag) and must not outlive a dead peer.
    pub fn check_alive(&self, call: &'static str) -> Result<()> {
        self.inner.check(call)
    }

    /// This PE's index among the PEs of its node.
    pub fn local_rank(&self) -> usize {
        self.inner.node.local_rank
    }

    /// Number of PEs on this node.
    pub fn local_size(&self) -> usize {
        self.inner.node.local_size()
    }

    /// Node membership.
    pub fn node(&self) -> &NodeInfo {
        &self.inner.node
    }

    /// The backend this context runs on.
    pub fn backend_kind(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// The CUDA backend, for CUDA-specific calls (user kernels, streams); None on the host
    /// backend.
    pub fn cuda(&self) -> Option<&crate::backend::cuda::CudaBackend> {
        self.inner.backend.as_cuda()
    }

    /// The settings in effect.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Collective: allocates `bytes` with the default 256-byte alignment.
    /// Contents are unspecified; a peer may write only after a barrier.
    pub fn malloc(&self, bytes: u64) -> Result<SymmetricBuffer> {
        self.allocate_bytes(bytes, DEFAULT_ALIGNMENT)
    }

    /// Collective: allocates `count × size` bytes and zeroes this PE's copy. Peers must still
    /// reach a barrier before writing into it.
    pub fn calloc(&self, count: u64, size: u64) -> Result<SymmetricBuffer> {
        let bytes = count
            .checked_mul(size)
            .ok_or_else(|| invalid("calloc", "count x size overflows").with_pe(self.my_pe()))?;
        let b = self.allocate_bytes(bytes, DEFAULT_ALIGNMENT)?;
        b.fill_zero()?;
        Ok(b)
    }

    /// Collective: allocates `bytes` aligned to `alignment` (any power of two).
    pub fn align(&self, alignment: u64, bytes: u64) -> Result<SymmetricBuffer> {
        self.allocate_bytes(bytes, alignment)
    }

    /// Collective: allocates `bytes` aligned to `alignment`. Allocation needs no communication
    /// unless the heap must grow or reclaim; it is not a synchronisation point.
    ///
    /// Fails with [`ErrorKind::OutOfMemory`](crate::ErrorKind::OutOfMemory) on every PE alike when the request does not fit
    /// the heap's capacity, or when some PE could not get the memory to grow its heap (the
    /// error names it; no PE's heap grows and the context stays usable).
    pub fn allocate_bytes(&self, bytes: u64, alignment: u64) -> Result<SymmetricBuffer> {
        let block = self.inner.allocate(bytes, alignment, "allocate")?;
        Ok(SymmetricBuffer::new(self.inner.clone(), block))
    }

    /// Collective: the contract. Allocates `count` elements of `T` and returns the buffer and
    /// its peer table (`peer_bases[my_pe()] == buffer.addr()`, 0 for PEs not directly
    /// addressable).
    pub fn allocate_symmetric<T: Element>(
        &self,
        count: usize,
    ) -> Result<(SymmetricBuffer, Vec<u64>)> {
        let bytes = (count as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .ok_or_else(|| invalid("allocate_symmetric", "size overflows").with_pe(self.my_pe()))?;
        let block = self
            .inner
            .allocate(bytes, DEFAULT_ALIGNMENT, "allocate_symmetric")?;
        let b = SymmetricBuffer::new(self.inner.clone(), block);
        let t = b.peer_bases();
        Ok((b, t))
    }

    /// Collective: like `allocate_symmetric`, returning the richer address map.
    pub fn allocate_symmetric_map<T: Element>(
        &self,
        count: usize,
    ) -> Result<(SymmetricBuffer, SymmetricAddressMap)> {
        let (b, _) = self.allocate_symmetric::<T>(count)?;
        let m = b.address_map();
        Ok((b, m))
    }

    /// Start of every PE's heap in this process (0 where not directly addressable).
    pub fn heap_bases(&self) -> Vec<u64> {
        (0..self.inner.world)
            .map(|pe| self.inner.backend.slot_base(pe).unwrap_or(0))
            .collect()
    }

    /// PEs whose heaps this process can load from and store to directly.
    pub fn direct_peers(&self) -> PeerMask {
        let mut m = PeerMask::new(self.inner.world);
        for pe in 0..self.inner.world {
            if self.inner.backend.slot_base(pe).is_some() {
                m.set(pe);
            }
        }
        m
    }

    /// Whether `addr` lies in this PE's own mapped heap.
    pub fn is_symmetric(&self, addr: u64) -> bool {
        match self.inner.backend.slot_base(self.inner.rank) {
            Some(base) => addr >= base && addr < base + self.inner.backend.mapped(),
            None => false,
        }
    }

    /// Checks that `[addr, addr + bytes)` lies in one live allocation of this PE's heap made by
    /// the caller (not released on this PE, not symheap's own state); the error says which of
    /// those it is not.
    pub fn check_symmetric(&self, addr: u64, bytes: u64) -> Result<()> {
        self.inner.check("check_symmetric")?;
        self.inner
            .own_offset(addr, bytes, "check_symmetric")
            .map(drop)
    }

    /// Checks host memory `[addr, addr + bytes)` that the caller is about to hand to a put
    /// (`write` false: read from) or a get (`write` true: written into) as a plain pointer:
    /// where it lies in a PE's mapped heap it must be one live allocation (not released on
    /// this PE, not symheap's own state). Memory outside every heap is not checked. For
    /// bindings that turn a foreign pointer into a slice: an alias of a freed buffer is refused
    /// instead of read or written.
    /// `call` names the operation in the error.
    pub fn check_host_range(
        &self,
        call: &'static str,
        addr: u64,
        bytes: u64,
        write: bool,
    ) -> Result<()> {
        self.inner.check(call)?;
        self.inner.host_range(addr, bytes, write, call)
    }

    /// Checks that `addr` is aligned to the size of one `dtype` element, the alignment every
    /// data operation asks of its addresses (collectives and atomics check their own); `call`
    /// and `what` ("destination", "source") name it in the error.
    pub fn check_aligned(
        &self,
        call: &'static str,
        what: &str,
        addr: u64,
        dtype: DType,
    ) -> Result<()> {
        self.inner.aligned(call, what, addr, dtype)
    }

    /// Translates `addr`, an address in PE `from`'s heap, to the same byte of PE `to`'s heap.
    /// `Ok(None)` when PE `to` is not directly addressable from here.
    pub fn translate(&self, addr: u64, from: usize, to: usize) -> Result<Option<u64>> {
        const CALL: &str = "translate";
        self.inner.pe_in_range(from, CALL)?;
        self.inner.pe_in_range(to, CALL)?;
        let Some(fb) = self.inner.backend.slot_base(from) else {
            return Err(invalid(
                CALL,
                format!("PE {from}'s heap is not directly addressable from this PE"),
            )
            .with_pe(self.my_pe()));
        };
        let mapped = self.inner.backend.mapped();
        if addr < fb || addr >= fb + mapped {
            return Err(invalid(
                CALL,
                format!("address {addr:#x} is not in PE {from}'s symmetric heap"),
            )
            .with_pe(self.my_pe()));
        }
        Ok(self.inner.backend.slot_base(to).map(|tb| tb + (addr - fb)))
    }

    /// Stores `data` at heap address `addr` of any directly addressable PE (for example an
    /// address from a peer table or `translate`). Not ordered with other PEs' accesses:
    /// synchronise with a barrier or a signal.
    pub fn write_at<T: Element>(&self, addr: u64, data: &[T]) -> Result<()> {
        self.inner.check("write_at")?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.inner
            .locate(addr, bytes.len() as u64, false, "write_at")?;
        self.inner.backend.write_bytes(addr, bytes)
    }

    /// Loads from heap address `addr` of any directly addressable PE into `out`.
    pub fn read_at<T: Element>(&self, addr: u64, out: &mut [T]) -> Result<()> {
        self.inner.check("read_at")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.inner
            .locate(addr, bytes.len() as u64, true, "read_at")?;
        self.inner.backend.read_bytes(addr, bytes)
    }

    /// Collective: returns once every PE has called it; all memory operations issued before it
    /// on any PE are visible after it on every PE. Also a point where the ledger is checked and
    /// released buffers are reclaimed.
    pub fn barrier_all(&self) -> Result<()> {
        self.inner
            .collective("barrier_all", String::new(), None)
            .map(|_| ())
    }

    /// Collective: every PE contributes `data`, every PE gets all contributions in rank order.
    /// A host-side exchange for small control data (seeds, sizes, pickled objects), ledger-
    /// checked; the contributions may differ in length (gathering them is what it is for).
    pub fn all_gather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.inner
            .collective("all_gather_bytes", String::new(), Some(data))
    }

    /// Heap occupancy on this PE (the same on every PE at collective points).
    pub fn heap_usage(&self) -> HeapUsage {
        let st = self.inner.mem.lock_heap();
        HeapUsage {
            in_use: st.in_use(),
            mapped: self.inner.backend.mapped(),
            capacity: self.inner.backend.capacity(),
            live_blocks: st.live_blocks(),
            allocation_syncs: st.allocation_syncs(),
            waiting_releases: self.inner.mem.heap.deferred_count(),
        }
    }

    /// Not collective: makes every PE fail with `reason` (they notice within milliseconds).
    pub fn abort(&self, reason: &str) {
        self.inner.boot.abort(reason);
    }

    /// The diagnostic banner: version, backend, PEs, node, heap layout, environment read.
    pub fn banner(&self) -> String {
        banner::render(&self.inner)
    }

    /// Collective: leaves the job. Buffers stay readable in this process until dropped, but
    /// every later symheap call fails with `Finalized`.
    pub fn finalize(&self) -> Result<()> {
        self.inner.finalize()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.inner
                .boot
                .abort(&format!("PE {} panicked", self.inner.rank));
            return;
        }
        if let Err(e) = self.inner.finalize() {
            tracing::debug!("finalize on drop: {e}");
        }
        crate::context::watch::stop_watchdog(&self.inner);
    }
}
