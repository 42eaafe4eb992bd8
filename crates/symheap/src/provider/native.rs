//! [`NativeHeap`]: symheap's own symmetric heap as a [`Provider`].

use std::sync::Arc;

use super::{next_provider_id, table_from_bytes, Allocation, Provider};
use crate::config::DEFAULT_ALIGNMENT;
use crate::context::{Inner, SymmetricBuffer};
use crate::error::Result;
use crate::Context;

/// symheap's own heap as a provider, on the host and CUDA backends.
///
/// Every PE's heap sits at a fixed slot of one reservation, so the per-peer offset
/// `peer_bases[r] - ptr` is the same for every allocation ([`Provider::peer_offsets`] is
/// `Some`). Each allocation's table lives in the heap right after the allocation.
///
/// `allocate` and `barrier` are collective; `free` (and dropping an [`Allocation`]) releases
/// locally and never blocks, like [`SymmetricBuffer::free`]. The provider shares the context's
/// state: after the context is finalised every call fails with `Finalized`.
pub struct NativeHeap {
    inner: Arc<Inner>,
    id: u64,
}

impl NativeHeap {
    /// Not collective: a provider over `ctx`'s heap (any number may exist; they share it).
    pub fn new(ctx: &Context) -> NativeHeap {
        NativeHeap {
            inner: ctx.inner.clone(),
            id: next_provider_id(),
        }
    }

    /// Wraps a buffer allocated through the context (`malloc`, `allocate_symmetric`...) as an
    /// allocation of this provider.
    pub fn adopt(&self, buf: SymmetricBuffer) -> Allocation {
        let peer_bases = buf.peer_bases();
        Allocation {
            provider: self.id,
            serial: buf.offset(),
            my_pe: self.inner.rank,
            ptr: buf.addr(),
            bytes: buf.len_bytes(),
            direct: peer_bases.iter().map(|&b| b != 0).collect(),
            peer_bases,
            table_addr: buf.peer_bases_addr(),
            native: Some(buf),
        }
    }
}

impl Provider for NativeHeap {
    fn name(&self) -> &str {
        "native"
    }

    fn my_pe(&self) -> usize {
        self.inner.rank
    }

    fn n_pes(&self) -> usize {
        self.inner.world
    }

    /// Collective: allocates from the heap with the default 256-byte alignment (as
    /// `Context::malloc`), recorded in the world ledger.
    fn allocate(&self, bytes: u64) -> Result<Allocation> {
        let block = self
            .inner
            .allocate(bytes, DEFAULT_ALIGNMENT, "NativeHeap::allocate")?;
        Ok(self.adopt(SymmetricBuffer::new(self.inner.clone(), block)))
    }

    /// Local: releases the buffer (reclaimed at a later collective point once every PE
    /// released it). Never blocks.
    fn free(&self, a: Allocation) -> Result<()> {
        a.check_owner(self.id, "NativeHeap::free")?;
        drop(a);
        Ok(())
    }

    /// Collective: `Context::barrier_all`.
    fn barrier(&self) -> Result<()> {
        self.inner
            .collective("barrier_all", String::new(), None)
            .map(|_| ())
    }

    fn peer_offsets(&self) -> Option<Vec<i64>> {
        let be = &self.inner.backend;
        let own = be.slot_base(self.inner.rank)?;
        Some(
            (0..self.inner.world)
                .map(|pe| be.slot_base(pe).map_or(0, |b| b.wrapping_sub(own) as i64))
                .collect(),
        )
    }

    fn write_bytes(&self, a: &Allocation, offset: u64, data: &[u8]) -> Result<()> {
        const CALL: &str = "NativeHeap::write_bytes";
        self.inner.check(CALL)?;
        a.check_range(self.id, CALL, offset, data.len())?;
        self.inner.backend.write_bytes(a.ptr + offset, data)
    }

    fn read_bytes(&self, a: &Allocation, offset: u64, out: &mut [u8]) -> Result<()> {
        const CALL: &str = "NativeHeap::read_bytes";
        self.inner.check(CALL)?;
        a.check_range(self.id, CALL, offset, out.len())?;
        self.inner.backend.read_bytes(a.ptr + offset, out)
    }

    fn read_table(&self, a: &Allocation) -> Result<Vec<u64>> {
        const CALL: &str = "NativeHeap::read_table";
        self.inner.check(CALL)?;
        a.check_owner(self.id, CALL)?;
        let mut b = vec![0u8; 8 * self.inner.world];
        self.inner.backend.read_bytes(a.table_addr, &mut b)?;
        Ok(table_from_bytes(&b))
    }
}
