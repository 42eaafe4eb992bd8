//! Which addresses a call may use: ranges inside live allocations of the caller (never freed
//! here, never symheap's own state), their translation to a peer's copy, and how a
//! collective's buffers are recorded in the ledger.

use super::Inner;
use crate::element::DType;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::heap::{Block, RangeError};

impl Inner {
    /// Checks `[addr, addr+len)` lies in one live user allocation of a directly reachable PE's
    /// heap (any PE's copy: the heaps are symmetric, so this PE's allocator knows every PE's
    /// allocations); returns that PE.
    /// `read` also admits an allocation's own peer table (its trailer), which is documented as
    /// readable ([`SymmetricBuffer::peer_bases_addr`]); nothing may write it.
    pub(super) fn locate(
        &self,
        addr: u64,
        len: u64,
        read: bool,
        call: &'static str,
    ) -> Result<usize> {
        let mapped = self.backend.mapped();
        for pe in 0..self.world {
            if let Some(base) = self.mem.slot_base(pe) {
                if addr >= base && addr < base + mapped {
                    let off = addr - base;
                    return match self.user_range(pe, off, len, call) {
                        Ok(_) => Ok(pe),
                        Err(_) if read && self.in_user_table(off, len) => Ok(pe),
                        Err(e) => Err(e),
                    };
                }
            }
        }
        Err(invalid(
            call,
            format!("address {addr:#x} is not in the symmetric heap of any directly reachable PE"),
        )
        .with_pe(self.rank))
    }

    /// Whether `[off, off + len)` lies in the peer table of a live user allocation.
    pub(super) fn in_user_table(&self, off: u64, len: u64) -> bool {
        let st = self.mem.lock_heap();
        let Some(b) = st.block_before(off) else {
            return false;
        };
        let t = b.table_offset();
        !st.is_internal(b.id)
            && !self.mem.heap.is_freed_here(b.id)
            && off >= t
            && off.saturating_add(len) <= t + 8 * self.world as u64
    }

    /// Checks `[off, off+bytes)` of the heap is a range of one live user allocation (not freed
    /// on this PE, not symheap's own), naming what is wrong otherwise; `pe` is whose copy the
    /// address was in, for the message.
    pub(super) fn user_range(
        &self,
        pe: usize,
        off: u64,
        bytes: u64,
        call: &'static str,
    ) -> Result<Block> {
        let base = self.mem.slot_base(pe).unwrap_or(0);
        let addr = base + off;
        let g = self.mem.heap.generation();
        let st = self.mem.lock_heap();
        let why = match self.mem.heap.user_block(&st, off, bytes) {
            Ok(b) => {
                self.mem.heap.remember(g, &b);
                return Ok(b);
            }
            Err(e) => e,
        };
        drop(st);
        let whose = if pe == self.rank {
            "this PE's".to_string()
        } else {
            format!("PE {pe}'s")
        };
        let why = match why {
            RangeError::NotAllocated => format!(
                "address {addr:#x} is in {whose} symmetric heap but not in a live allocation"
            ),
            RangeError::Freed(b) => format!(
                "address {addr:#x} is in a {}-byte allocation (at {:#x}) that was freed on this PE; nothing made from a freed buffer may be used",
                b.bytes,
                base + b.offset
            ),
            RangeError::Internal => format!(
                "address {addr:#x} is in symheap's own state, not in an allocation of yours"
            ),
            RangeError::PastEnd(b) => format!(
                "{bytes} bytes at {addr:#x} run past the end of their {}-byte allocation (which starts at {:#x})",
                b.bytes,
                base + b.offset
            ),
        };
        Err(invalid(call, why).with_pe(self.rank))
    }

    /// Checks `[addr, addr+bytes)` is local memory a stream copy may read (`write` false) or
    /// write: a live user allocation in the heap of a directly reachable PE, or on CUDA, device
    /// memory of this PE's GPU outside the heap (a torch tensor, a `cuMemAlloc` buffer). On the
    /// host backend only the heap qualifies: anything else is the process's own memory, which
    /// a call taking an integer address must not touch.
    pub(crate) fn local_range(
        &self,
        addr: u64,
        bytes: u64,
        write: bool,
        call: &'static str,
    ) -> Result<()> {
        match self.backend.as_cuda() {
            _ if self.in_any_heap(addr) => self.locate(addr, bytes, !write, call).map(drop),
            Some(cu) => cu
                .check_local_range(addr, bytes, call)
                .map_err(|e| e.with_pe(self.rank)),
            None => self.own_offset(addr, bytes, call).map(drop),
        }
    }

    /// Checks host memory `[addr, addr+bytes)` that a call is about to read (`write` false) or
    /// write through a pointer it was handed: a range inside any PE's mapped heap must lie in
    /// one live user allocation (never one freed on this PE, never symheap's own state);
    /// memory outside every heap is the caller's own and is not checked here.
    pub(crate) fn host_range(
        &self,
        addr: u64,
        bytes: u64,
        write: bool,
        call: &'static str,
    ) -> Result<()> {
        if !self.in_any_heap(addr) {
            let last = addr.saturating_add(bytes.max(1) - 1);
            if !self.in_any_heap(last) {
                return Ok(());
            }
            return Err(invalid(
                call,
                format!(
                    "{bytes} bytes of host memory at {addr:#x} run into a symmetric heap \
                     (its byte at {last:#x}); they are not one live allocation"
                ),
            )
            .with_pe(self.rank));
        }
        self.locate(addr, bytes, !write, call).map(drop)
    }

    /// Checks `addr` is aligned to the size of one `dtype` element: the rule of every data
    /// operation (put, get and collectives: element alignment of their dtype; atomics: the
    /// natural alignment of their word; signals: 8 bytes, a u64 word). `what` names the
    /// address (e.g. "destination") in the error.
    #[inline]
    pub(crate) fn aligned(
        &self,
        call: &'static str,
        what: &str,
        addr: u64,
        dtype: DType,
    ) -> Result<()> {
        if addr & (dtype.size() as u64 - 1) != 0 {
            return Err(self.misaligned(call, what, addr, dtype));
        }
        Ok(())
    }

    /// [`Inner::aligned`] of a collective's destination and source.
    #[inline]
    pub(crate) fn aligned_pair(
        &self,
        call: &'static str,
        dest: u64,
        src: u64,
        dtype: DType,
    ) -> Result<()> {
        if (dest | src) & (dtype.size() as u64 - 1) != 0 {
            let (what, addr) = if dest & (dtype.size() as u64 - 1) != 0 {
                ("destination", dest)
            } else {
                ("source", src)
            };
            return Err(self.misaligned(call, what, addr, dtype));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn misaligned(&self, call: &'static str, what: &str, addr: u64, dtype: DType) -> Error {
        let a = dtype.size();
        invalid(
            call,
            format!(
                "the {what} address {addr:#x} is not aligned to {a} bytes: {dtype} data needs \
                 {a}-byte aligned addresses"
            ),
        )
        .with_pe(self.rank)
    }

    /// Whether `addr` lies in the mapped heap of any directly reachable PE (this one's too).
    pub(crate) fn in_any_heap(&self, addr: u64) -> bool {
        let mapped = self.backend.mapped();
        (0..self.world)
            .filter_map(|pe| self.mem.slot_base(pe))
            .any(|b| addr >= b && addr < b + mapped)
    }

    /// The handle to enqueue on: on CUDA once `stream` is known to belong to this PE's device
    /// (the host backend runs stream work on the calling thread and never uses it).
    pub(crate) fn stream_handle(&self, stream: &crate::Stream, call: &'static str) -> Result<u64> {
        match self.backend.as_cuda() {
            Some(cu) => cu
                .stream_handle(stream, call)
                .map_err(|e| e.with_pe(self.rank)),
            None => Ok(stream.raw()),
        }
    }

    /// Checks `[addr, addr+bytes)` lies inside one live user allocation of this PE's heap and
    /// returns its heap offset.
    #[inline]
    pub(crate) fn own_offset(&self, addr: u64, bytes: u64, call: &'static str) -> Result<u64> {
        // The common case, the block this thread used last: no lock, no lookup, inlined into
        // every put and get (what remains of their cost is a few loads and compares).
        let off = addr.wrapping_sub(self.mem.own_base);
        if addr >= self.mem.own_base && self.mem.heap.remembered(off, bytes) {
            return Ok(off);
        }
        self.own_offset_lookup(addr, bytes, call)
    }

    /// `own_offset` past the remembered blocks: the heap's lookup, and the errors.
    #[cold]
    #[inline(never)]
    fn own_offset_lookup(&self, addr: u64, bytes: u64, call: &'static str) -> Result<u64> {
        let base = self.mem.own_base;
        let mapped = self.backend.mapped();
        if addr < base || addr >= base + mapped {
            return Err(invalid(
                call,
                format!(
                    "address {addr:#x} is not in this PE's symmetric heap ({base:#x}..{:#x})",
                    base + mapped
                ),
            )
            .with_pe(self.rank));
        }
        let off = addr - base;
        self.user_range(self.rank, off, bytes, call)?;
        Ok(off)
    }

    /// A collective's ledger arguments with the heap offsets of its buffers appended: the same
    /// symmetric buffer is at the same offset on every PE, so a PE that passes a different
    /// buffer of the same size is a named mismatch instead of a silent wrong result.
    pub(crate) fn coll_args(&self, args: String, dest: u64, src: u64) -> String {
        let base = self.mem.slot_base(self.rank).unwrap_or(0);
        let end = base + self.backend.mapped();
        // An address outside the heap (a PE's own device memory, which the one-shot and
        // exchange kernels take, or one refused later) has no meaning on another PE: it is
        // recorded as such, the same on every PE, instead of as a value that differs per PE.
        let at = |a: u64| {
            if (base..end).contains(&a) {
                format!("heap+{:#x}", a - base)
            } else {
                "local memory".to_string()
            }
        };
        if dest == src {
            format!("{args}, in place at {}", at(dest))
        } else {
            format!("{args}, dest {}, src {}", at(dest), at(src))
        }
    }

    /// PE `pe`'s copy of the symmetric range `[addr, addr+bytes)` of this PE's heap.
    #[inline]
    pub(crate) fn remote(
        &self,
        addr: u64,
        bytes: u64,
        pe: usize,
        call: &'static str,
    ) -> Result<u64> {
        self.pe_in_range(pe, call)?;
        let off = self.own_offset(addr, bytes, call)?;
        match self.mem.slot_base(pe) {
            Some(b) => Ok(b + off),
            None => Err(self.not_direct(pe, call)),
        }
    }

    #[cold]
    #[inline(never)]
    fn not_direct(&self, pe: usize, call: &'static str) -> Error {
        Error::new(
            Some(self.rank),
            call,
            ErrorKind::Unsupported(format!(
                "PE {pe} is on another node; the {} backend reaches only PEs of this node",
                self.backend.kind().name()
            )),
        )
    }

    #[inline]
    pub(crate) fn pe_in_range(&self, pe: usize, call: &'static str) -> Result<()> {
        if pe >= self.world {
            return Err(self.pe_out_of_range(pe, call));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn pe_out_of_range(&self, pe: usize, call: &'static str) -> Error {
        invalid(
            call,
            format!("PE {pe} is out of range (n_pes = {})", self.world),
        )
        .with_pe(self.rank)
    }
}
