//! Symmetric buffers: one allocation of the heap, seen from this PE.

use std::sync::Arc;

use super::Inner;
use crate::element::Element;
use crate::error::{invalid, Result};
use crate::heap::Block;
use crate::table::{PeerMask, SymmetricAddressMap};

/// One symmetric allocation. Every PE holds one for the same allocation, at the same heap
/// offset.
///
/// Dropping it (or [`free`](Self::free)) releases it locally and never blocks, so it is safe
/// in destructors and from any thread; the memory is reused only after every PE released it,
/// at a later collective point.
pub struct SymmetricBuffer {
    inner: Arc<Inner>,
    block: Block,
    addr: u64,
    released: bool,
}

impl std::fmt::Debug for SymmetricBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("pe", &self.inner.rank)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("bytes", &self.block.bytes)
            .field("offset", &self.block.offset)
            .finish()
    }
}

impl SymmetricBuffer {
    pub(crate) fn new(inner: Arc<Inner>, block: Block) -> Self {
        let base = inner
            .backend
            .slot_base(inner.rank)
            .expect("a PE's own heap is always mapped");
        SymmetricBuffer {
            addr: base + block.offset,
            inner,
            block,
            released: false,
        }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Address of this PE's copy (a host pointer on the host backend, a device pointer on
    /// CUDA).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.block.bytes
    }

    /// Offset from the heap base, the same on every PE.
    pub fn offset(&self) -> u64 {
        self.block.offset
    }

    /// The contract's table: `peer_bases[r]` is PE r's copy in this process, 0 when not
    /// directly addressable; `peer_bases[my_pe] == addr()`.
    pub fn peer_bases(&self) -> Vec<u64> {
        (0..self.inner.world)
            .map(|pe| {
                self.inner
                    .backend
                    .slot_base(pe)
                    .map(|b| b + self.block.offset)
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Address of this allocation's peer table (`n_pes` little-endian int64 entries, the same
    /// values as [`peer_bases`](Self::peer_bases)) in this PE's heap: device memory on the
    /// CUDA backend, ready to pass to a kernel. Written at allocation (or left in place by an
    /// earlier block at the same place), on the buffer's device, without synchronising any
    /// other stream.
    pub fn peer_bases_addr(&self) -> u64 {
        self.addr - self.block.offset + self.block.table_offset()
    }

    /// The richer descriptor: the table plus the direct mask and the allocation's extent.
    pub fn address_map(&self) -> SymmetricAddressMap {
        let peer_bases = self.peer_bases();
        let mut direct = PeerMask::new(self.inner.world);
        for (pe, &b) in peer_bases.iter().enumerate() {
            if b != 0 {
                direct.set(pe);
            }
        }
        SymmetricAddressMap {
            local_rank: self.inner.rank,
            allocation_base: self.addr,
            allocation_bytes: self.block.bytes,
            peer_bases,
            direct,
        }
    }

    /// A view of PE `pe`'s copy of this buffer.
    pub fn peer_view(&self, pe: usize) -> Result<PeerView<'_>> {
        self.inner.pe_in_range(pe, "peer_view")?;
        let base = self.inner.backend.slot_base(pe).ok_or_else(|| {
            invalid(
                "peer_view",
                format!("PE {pe}'s memory is not directly addressable from this PE"),
            )
            .with_pe(self.inner.rank)
        })?;
        Ok(PeerView {
            buf: self,
            pe,
            addr: base + self.block.offset,
        })
    }

    fn range_check(&self, call: &'static str, byte_off: u64, bytes: u64) -> Result<()> {
        self.inner.check(call)?;
        if self.is_revoked() {
            return Err(invalid(
                call,
                format!(
                    "the {}-byte allocation at {:#x} was revoked (freed) on this PE",
                    self.block.bytes, self.addr
                ),
            )
            .with_pe(self.inner.rank));
        }
        if byte_off
            .checked_add(bytes)
            .is_none_or(|end| end > self.block.bytes)
        {
            return Err(invalid(
                call,
                format!(
                    "{bytes} bytes at offset {byte_off} exceed the buffer's {} bytes",
                    self.block.bytes
                ),
            )
            .with_pe(self.inner.rank));
        }
        Ok(())
    }

    /// Writes `data` into this PE's copy, starting `elem_offset` elements in.
    pub fn write<T: Element>(&self, elem_offset: usize, data: &[T]) -> Result<()> {
        self.at(self.addr).write(elem_offset, data, "write")
    }

    /// Reads this PE's copy, starting `elem_offset` elements in, into `out`.
    pub fn read<T: Element>(&self, elem_offset: usize, out: &mut [T]) -> Result<()> {
        self.at(self.addr).read(elem_offset, out, "read")
    }

    /// This PE's copy as a vector of whole elements.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let n = self.block.bytes as usize / std::mem::size_of::<T>();
        let mut v = vec![T::zeroed(); n];
        self.read(0, &mut v)?;
        Ok(v)
    }

    pub(crate) fn fill_zero(&self) -> Result<()> {
        let zeros = vec![0u8; self.block.bytes as usize];
        self.write(0, &zeros)
    }

    fn at(&self, addr: u64) -> Access<'_> {
        Access { buf: self, addr }
    }

    /// Releases the buffer now (same as dropping it). Local and non-blocking.
    pub fn free(mut self) {
        self.release();
    }

    /// Refuses every access to this allocation on this PE from now on, by any address in it,
    /// as [`free`](Self::free) does, but keeps its memory from going back to the heap until
    /// this buffer is dropped. For owners that handed the memory out as views other code may
    /// still hold (an array or tensor made from it, which can only be told apart from one made
    /// from a later allocation by its address): while such a view exists the memory is not
    /// reused, so its address keeps being refused instead of reaching another allocation.
    pub fn revoke(&self) {
        self.inner.mem.heap.mark_freed(self.block.id);
    }

    /// Whether this allocation was revoked ([`revoke`](Self::revoke)) on this PE.
    pub fn is_revoked(&self) -> bool {
        self.inner.mem.heap.is_freed_here(self.block.id)
    }

    fn release(&mut self) {
        if !self.released {
            self.released = true;
            self.inner.release_block(self.block.id);
        }
    }

    /// Notes that work enqueued on CUDA `stream` (other than symheap's own operations, which
    /// note their streams themselves) uses this buffer, as PyTorch's `record_stream` does: its
    /// release then waits for everything enqueued there until the release. Does nothing on the
    /// host backend. A stream made by symheap is kept alive until then; a borrowed one
    /// ([`Stream::from_raw`](crate::Stream::from_raw)) its owner keeps alive, as that
    /// constructor's contract says. A stream of another device is refused.
    pub fn record_stream(&self, stream: &crate::Stream) -> crate::Result<()> {
        if self.inner.backend.as_cuda().is_some() {
            let raw = self.inner.stream_handle(stream, "record_stream")?;
            self.inner
                .mem
                .heap
                .note_use(self.block.id, raw, stream.keep_alive());
        }
        Ok(())
    }
}

impl Drop for SymmetricBuffer {
    fn drop(&mut self) {
        self.release();
    }
}

struct Access<'a> {
    buf: &'a SymmetricBuffer,
    addr: u64,
}

impl Access<'_> {
    fn write<T: Element>(&self, elem_offset: usize, data: &[T], call: &'static str) -> Result<()> {
        let sz = std::mem::size_of::<T>() as u64;
        let off = elem_offset as u64 * sz;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.buf.range_check(call, off, bytes.len() as u64)?;
        self.buf.inner.backend.write_bytes(self.addr + off, bytes)
    }

    fn read<T: Element>(
        &self,
        elem_offset: usize,
        out: &mut [T],
        call: &'static str,
    ) -> Result<()> {
        let sz = std::mem::size_of::<T>() as u64;
        let off = elem_offset as u64 * sz;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.buf.range_check(call, off, bytes.len() as u64)?;
        self.buf.inner.backend.read_bytes(self.addr + off, bytes)
    }
}

/// PE `pe`'s copy of a buffer, accessed directly from this process.
pub struct PeerView<'a> {
    buf: &'a SymmetricBuffer,
    pe: usize,
    addr: u64,
}

impl PeerView<'_> {
    /// Which PE's copy.
    pub fn pe(&self) -> usize {
        self.pe
    }

    /// Its address in this process.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Stores `data` into the peer's copy at `elem_offset`. Not ordered with the peer's own
    /// accesses: synchronise with a barrier or a signal.
    pub fn write<T: Element>(&self, elem_offset: usize, data: &[T]) -> Result<()> {
        self.buf
            .at(self.addr)
            .write(elem_offset, data, "peer write")
    }

    /// Loads from the peer's copy at `elem_offset` into `out`.
    pub fn read<T: Element>(&self, elem_offset: usize, out: &mut [T]) -> Result<()> {
        self.buf.at(self.addr).read(elem_offset, out, "peer read")
    }
}
