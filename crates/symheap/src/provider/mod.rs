//! Providers: allocators whose allocations satisfy the contract, so one kernel runs over memory
//! from any of them.
//!
//! An [`Allocation`] on PE `me` is a pointer `ptr` plus a peer table `peer_bases` (`n_pes`
//! entries): `peer_bases[me] == ptr`, `peer_bases[r]` is PE r's copy of the same allocation as
//! this process addresses it, 0 when PE r's copy is not load/store-addressable from here. A
//! pointer translates as `peer_bases[to] + (p - peer_bases[from])`. The same table sits in
//! memory kernels can read, at [`Allocation::table_addr`].
//!
//! Two providers live here: [`NativeHeap`] (symheap's own heap, on the host and CUDA backends)
//! and [`Nvshmem`] (NVSHMEM 3.x, loaded at run time, CUDA backend only). The Python package
//! adds torch SymmetricMemory on top.
//!
//! Collective-order rule: `allocate`, `free`, `barrier` (and creating or finalising a provider)
//! are collective: every PE calls them in the same order, interleaved with its other collective
//! symheap calls in the same order, with the same arguments. symheap records them in the world
//! ledger and checks it before handing a call to the provider, so a divergence is an error on
//! every PE naming the first differing call, and a PE that never arrives is named by a timeout,
//! instead of a hang inside the provider.

mod native;
mod nvshmem;
mod nvshmem_rma;
mod nvshmem_sys;

use std::sync::atomic::{AtomicU64, Ordering};

pub use native::NativeHeap;
pub use nvshmem::{Nvshmem, NvshmemLibrary};

use crate::context::SymmetricBuffer;
use crate::error::{invalid, Result};
use crate::table::{PeerMask, SymmetricAddressMap};

/// An allocator producing allocations that satisfy the contract.
///
/// Collective-order rule: see the [module documentation](self). Methods marked collective
/// must be called by every PE, in the same order.
pub trait Provider: Send + Sync {
    /// A short name (`"native"`, `"nvshmem"`).
    fn name(&self) -> &str;

    /// This PE's rank (the index into every peer table).
    fn my_pe(&self) -> usize;

    /// Number of PEs (the length of every peer table).
    fn n_pes(&self) -> usize;

    /// Collective: allocates `bytes` (at least 1) on every PE. Contents are unspecified; a peer
    /// may write into this PE's copy only after a [`barrier`](Self::barrier).
    fn allocate(&self, bytes: u64) -> Result<Allocation>;

    /// Releases an allocation made by this provider. Collective for providers whose release is
    /// (NVSHMEM); portable code calls it in the same order on every PE. Dropping an
    /// `Allocation` without calling this releases it only for providers whose release is
    /// local (the native heap); see each provider.
    fn free(&self, a: Allocation) -> Result<()>;

    /// Collective: returns once every PE has called it; memory operations issued before it on
    /// any PE (host writes, completed kernels, the provider's own operations) are visible
    /// after it on every PE.
    fn barrier(&self) -> Result<()>;

    /// `Some(d)` when the provider promises that `peer_bases[r] - ptr == d[r]` for every
    /// allocation and every direct PE r, so a table made for one allocation translates
    /// pointers into another. Entries for PEs that are not direct are 0 and meaningless.
    fn peer_offsets(&self) -> Option<Vec<i64>>;

    /// Not collective: copies `data` into this PE's copy of `a`, `offset` bytes in.
    fn write_bytes(&self, a: &Allocation, offset: u64, data: &[u8]) -> Result<()>;

    /// Not collective: copies this PE's copy of `a`, from `offset` bytes in, into `out`.
    fn read_bytes(&self, a: &Allocation, offset: u64, out: &mut [u8]) -> Result<()>;

    /// Not collective: reads back the table at [`Allocation::table_addr`] (for checks).
    fn read_table(&self, a: &Allocation) -> Result<Vec<u64>>;
}

/// One allocation from a [`Provider`], seen from this PE: the contract's pointer and table.
///
/// For the native heap it holds the [`SymmetricBuffer`], which it keeps alive (and releases
/// locally when dropped). An NVSHMEM allocation must be released with [`Provider::free`]
/// (collective); dropping it leaks it until the provider is finalised.
pub struct Allocation {
    provider: u64,
    serial: u64,
    my_pe: usize,
    ptr: u64,
    bytes: u64,
    peer_bases: Vec<u64>,
    direct: Vec<bool>,
    table_addr: u64,
    native: Option<SymmetricBuffer>,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("pe", &self.my_pe)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("table_addr", &format_args!("{:#x}", self.table_addr))
            .field("direct", &self.direct)
            .finish()
    }
}

impl Allocation {
    /// Address of this PE's copy (a host pointer on the host backend, a device pointer on
    /// CUDA).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes, as requested.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The peer table: `peer_bases()[r]` is PE r's copy in this process, 0 when PE r is not
    /// direct; `peer_bases()[my_pe] == ptr()`.
    pub fn peer_bases(&self) -> &[u64] {
        &self.peer_bases
    }

    /// Which PEs' copies are directly load/store-addressable from here.
    pub fn direct(&self) -> &[bool] {
        &self.direct
    }

    /// Address of an `int64[n_pes]` table holding `peer_bases()`, where kernels can read it:
    /// device memory on the CUDA backend, host memory on the host backend. It lives as long
    /// as the allocation.
    pub fn table_addr(&self) -> u64 {
        self.table_addr
    }

    /// This PE's rank.
    pub fn my_pe(&self) -> usize {
        self.my_pe
    }

    /// The contract's translation with this allocation's table: `ptr` in PE `from`'s copy to
    /// PE `to`'s copy. None when either PE is not direct or out of range.
    pub fn translate(&self, ptr: u64, from: usize, to: usize) -> Option<u64> {
        crate::table::translate(&self.peer_bases, ptr, from, to)
    }

    /// The richer descriptor (table, direct mask, extent).
    pub fn address_map(&self) -> SymmetricAddressMap {
        let mut direct = PeerMask::new(self.direct.len());
        for (pe, &d) in self.direct.iter().enumerate() {
            if d {
                direct.set(pe);
            }
        }
        SymmetricAddressMap {
            local_rank: self.my_pe,
            allocation_base: self.ptr,
            allocation_bytes: self.bytes,
            peer_bases: self.peer_bases.clone(),
            direct,
        }
    }

    /// The place `offset` bytes into this allocation, on whichever PE a call names (every
    /// PE's copy has it at the same offset). Data-path calls check it lies in the allocation.
    pub fn at(&self, offset: u64) -> At<'_> {
        At {
            alloc: self,
            offset,
        }
    }

    /// The native heap's buffer behind this allocation (None for other providers), for the
    /// rest of symheap's API (RMA, atomics, collectives).
    pub fn buffer(&self) -> Option<&SymmetricBuffer> {
        self.native.as_ref()
    }

    /// Checks `a` came from provider `id` and `[offset, offset+len)` lies in it.
    fn check_range(&self, id: u64, call: &'static str, offset: u64, len: usize) -> Result<()> {
        self.check_owner(id, call)?;
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.bytes)
        {
            return Err(invalid(
                call,
                format!(
                    "{len} bytes at offset {offset} exceed the allocation's {} bytes",
                    self.bytes
                ),
            )
            .with_pe(self.my_pe));
        }
        Ok(())
    }

    fn check_owner(&self, id: u64, call: &'static str) -> Result<()> {
        if self.provider != id {
            return Err(invalid(
                call,
                format!(
                    "the allocation at {:#x} was made by another provider",
                    self.ptr
                ),
            )
            .with_pe(self.my_pe));
        }
        Ok(())
    }
}

/// A place in an [`Allocation`]: `offset` bytes into it, on the PE a call names (from
/// [`Allocation::at`]).
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    alloc: &'a Allocation,
    offset: u64,
}

impl At<'_> {
    /// This PE's address of the place, once `[offset, offset + len)` is checked to lie in an
    /// allocation of provider `id`.
    fn addr(&self, id: u64, call: &'static str, len: u64) -> Result<u64> {
        let n = usize::try_from(len).map_err(|_| invalid(call, format!("{len} bytes")))?;
        self.alloc.check_range(id, call, self.offset, n)?;
        Ok(self.alloc.ptr + self.offset)
    }
}

/// A process-unique id for each provider instance (so an allocation cannot be freed by a
/// provider that did not make it).
fn next_provider_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Little-endian bytes of a table.
fn table_bytes(t: &[u64]) -> Vec<u8> {
    t.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn table_from_bytes(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .collect()
}
