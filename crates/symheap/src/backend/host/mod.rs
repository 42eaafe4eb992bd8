//! The host backend: PE memory is memfd chunks shared between the processes of one node.
//!
//! Each process reserves one `PROT_NONE` range of `world × capacity` bytes and maps PE r's
//! chunks at slot r. Growing creates this PE's next chunk, passes its descriptor to the other
//! PEs of the node (SCM_RIGHTS over the node channel) and maps theirs. PEs on other nodes keep
//! unmapped slots and are not direct.

pub(crate) mod futex;
pub(crate) mod membarrier;
pub(crate) mod mpi;
pub(crate) mod reservation;

use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use reservation::{memfd, Reservation};

use super::reduce::reduce_bytes;
use super::{AtomicOp, Backend, BackendKind, ChunkInfo, GrowVote, ReduceOp};
use crate::bootstrap::{Bootstrap, NodeChannel, NodeInfo};
use crate::element::DType;
use crate::error::{backend, invalid, ErrorKind, Result};
use crate::util::human_bytes;

/// Sources a reduction lists without allocating (node-local PEs beyond this are rare).
const MAX_INLINE_SOURCES: usize = 16;

/// Shared-memory backend for CPU processes.
pub struct HostBackend {
    rank: usize,
    capacity: u64,
    page: u64,
    reservation: Reservation,
    direct: Vec<bool>,
    node: NodeInfo,
    channel: NodeChannel,
    boot: Arc<dyn Bootstrap>,
    state: Mutex<Vec<ChunkInfo>>,
}

impl HostBackend {
    /// Reserves the slots. `capacity` is rounded up to the page size.
    pub fn new(
        boot: Arc<dyn Bootstrap>,
        node: NodeInfo,
        channel: NodeChannel,
        capacity: u64,
    ) -> Result<HostBackend> {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u64;
        let capacity = capacity.div_ceil(page) * page;
        let world = boot.size();
        // Every PE reserves a slot for every PE; a capacity the address space cannot hold is
        // the caller's setting to change, so it is an invalid argument, worded once.
        let too_big = |why: &str| {
            invalid(
                "init",
                format!(
                    "a heap capacity of {} per PE needs {world} x {} of address space on every \
                     PE, which {why}; lower SYMHEAP_HEAP_CAPACITY (or capacity=)",
                    human_bytes(capacity),
                    human_bytes(capacity)
                ),
            )
        };
        let total = capacity
            .checked_mul(world as u64)
            .ok_or_else(|| too_big("is more than 64-bit addresses hold"))?;
        let reservation =
            Reservation::new(total, "symmetric heap").map_err(|e| match e.kind() {
                ErrorKind::Backend(why) => {
                    let errno = why
                        .rsplit_once("address space: ")
                        .map_or(why.as_str(), |x| x.1);
                    too_big(&format!("the kernel does not grant ({errno})"))
                }
                _ => e,
            })?;
        let direct = (0..world)
            .map(|r| node.node_of[r] == node.node_index)
            .collect();
        Ok(HostBackend {
            rank: boot.rank(),
            capacity,
            page,
            reservation,
            direct,
            node,
            channel,
            boot,
            state: Mutex::new(Vec::new()),
        })
    }

    fn slot_addr(&self, pe: usize) -> u64 {
        self.reservation.base() + pe as u64 * self.capacity
    }

    /// Maps `fd` (a chunk of `len` bytes) at `offset` of PE `pe`'s slot.
    fn map_at(&self, pe: usize, offset: u64, len: u64, fd: &OwnedFd) -> Result<()> {
        self.reservation
            .map_fixed(pe as u64 * self.capacity + offset, len, fd)
            .map_err(|e| e.during("grow"))
    }
}

impl Backend for HostBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn describe(&self) -> String {
        format!(
            "host shared memory (memfd + mmap), {} PEs on this node, page {} B",
            self.node.local_size(),
            self.page
        )
    }

    fn granularity(&self) -> u64 {
        self.page
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn mapped(&self) -> u64 {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.last().map(|c| c.offset + c.bytes).unwrap_or(0)
    }

    fn chunks(&self) -> Vec<ChunkInfo> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn slot_base(&self, pe: usize) -> Option<u64> {
        (pe < self.direct.len() && self.direct[pe]).then(|| self.slot_addr(pe))
    }

    fn grow(&self, new_mapped: u64, vote: GrowVote<'_>) -> Result<()> {
        let mut chunks = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let from = chunks.last().map(|c| c.offset + c.bytes).unwrap_or(0);
        if new_mapped <= from || new_mapped > self.capacity || new_mapped % self.page != 0 {
            return Err(backend(
                "grow",
                format!(
                    "cannot grow from {from} to {new_mapped} bytes (capacity {})",
                    self.capacity
                ),
            ));
        }
        let len = new_mapped - from;
        let fd = memfd(&format!("symheap-pe{}-at{:x}", self.rank, from), len)
            .map_err(|e| e.during("grow"));
        // Sizing the memfd is where a PE runs short (memory or file-size limits); until every PE
        // has its chunk nothing is mapped, so a failed vote only drops the memfd.
        vote(fd.as_ref().err())?;
        let fd = fd?;
        self.map_at(self.rank, from, len, &fd)?;
        let all = self
            .channel
            .exchange_fds(std::slice::from_ref(&fd), self.boot.as_ref())
            .map_err(|e| e.during("grow"))?;
        for (lr, fds) in all.iter().enumerate() {
            let pe = self.node.local_peers[lr];
            if pe == self.rank {
                continue;
            }
            let fd = fds
                .first()
                .ok_or_else(|| backend("grow", format!("PE {pe} passed no chunk")))?;
            self.map_at(pe, from, len, fd)?;
        }
        chunks.push(ChunkInfo {
            offset: from,
            bytes: len,
        });
        Ok(())
    }

    #[inline]
    fn write_bytes(&self, addr: u64, src: &[u8]) -> Result<()> {
        // SAFETY: the caller checked that `addr..addr+src.len()` lies in a mapped, writable
        // chunk of a direct PE's slot, which stays mapped while `self` lives. This process
        // touches heap bytes only atomically or through `util::racy`, so threads racing on them
        // are well defined; ordering against other PEs is the SHMEM program's business
        // (barriers, signals), exactly as for the device-side stores this mirrors.
        unsafe { crate::util::racy::store(addr as *mut u8, src) };
        Ok(())
    }

    #[inline]
    fn read_bytes(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: as in `write_bytes`, for reading.
        unsafe { crate::util::racy::load(addr as *const u8, dst) };
        Ok(())
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: the ops layer checked both ranges lie in mapped heap chunks of direct PEs, which
        // stay mapped while `self` lives; distinct ranges of one allocation or different PEs'
        // copies do not overlap (checked by the caller). Concurrent access by other PEs is
        // ordered by the program's synchronisation, as for the stores this mirrors.
        unsafe { crate::util::racy::copy(dst as *mut u8, src as *const u8, bytes) };
        Ok(())
    }

    fn atomic(
        &self,
        addr: u64,
        width: usize,
        op: AtomicOp,
        operand: u64,
        compare: u64,
    ) -> Result<u64> {
        macro_rules! run {
            ($a:expr, $t:ty) => {{
                let a = $a;
                let v = operand as $t;
                let c = compare as $t;
                const O: Ordering = Ordering::SeqCst;
                let old = match op {
                    AtomicOp::Load => a.load(O),
                    AtomicOp::Store => a.swap(v, O),
                    AtomicOp::Swap => a.swap(v, O),
                    AtomicOp::CompareSwap => match a.compare_exchange(c, v, O, O) {
                        Ok(x) | Err(x) => x,
                    },
                    AtomicOp::Add => a.fetch_add(v, O),
                    AtomicOp::And => a.fetch_and(v, O),
                    AtomicOp::Or => a.fetch_or(v, O),
                    AtomicOp::Xor => a.fetch_xor(v, O),
                };
                old as u64
            }};
        }
        match width {
            4 if addr % 4 == 0 => {
                // SAFETY: `addr` is 4-byte aligned (checked above) and lies in a mapped, shared heap
                // chunk (checked by the ops layer) that outlives this call. Every access symheap
                // makes to the word for atomics goes through atomic instructions, which are
                // coherent across processes mapping the same memory.
                let a = unsafe { AtomicU32::from_ptr(addr as *mut u32) };
                Ok(run!(a, u32))
            }
            8 if addr % 8 == 0 => {
                // SAFETY: as above, with 8-byte alignment.
                let a = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
                Ok(run!(a, u64))
            }
            4 | 8 => Err(invalid(
                "atomic",
                format!("address {addr:#x} is not aligned to {width} bytes"),
            )),
            _ => Err(invalid("atomic", format!("unsupported width {width}"))),
        }
    }

    fn reduce(
        &self,
        dst: u64,
        srcs: &[u64],
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        // Segment by segment: every source segment is read in full before the destination
        // segment is written, so `dst` may be one of the sources. Each source segment is first
        // copied into a private buffer (a slice over the shared heap would claim the bytes
        // cannot change while another thread or PE may write them); 16 KiB segments keep those
        // copies in the core's caches (64 KiB ones made a 64 KiB all_reduce 8x slower, 4 KiB
        // ones cost more per segment than they saved: measured with `symheap bench coll`).
        // The private buffers are the thread's, kept between calls: allocating and zeroing
        // them per call was most of a small all_reduce's cost.
        const SEG: usize = 16 << 10;
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let bytes = count * dtype.size();
        let seg = SEG.min(bytes);
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let need = seg * (srcs.len() + 1);
            if scratch.len() < need {
                scratch.resize(need, 0);
            }
            let (tmp, inputs) = scratch[..need].split_at_mut(seg);
            let mut off = 0;
            while off < bytes {
                let len = SEG.min(bytes - off);
                for (&s, buf) in srcs.iter().zip(inputs.chunks_exact_mut(seg)) {
                    self.read_bytes(s + off as u64, &mut buf[..len])?;
                }
                let mut views = [&[][..]; MAX_INLINE_SOURCES];
                let many: Vec<&[u8]>;
                let views: &[&[u8]] = if srcs.len() <= MAX_INLINE_SOURCES {
                    for (v, b) in views.iter_mut().zip(inputs.chunks_exact(seg)) {
                        *v = &b[..len];
                    }
                    &views[..srcs.len()]
                } else {
                    many = inputs.chunks_exact(seg).map(|b| &b[..len]).collect();
                    &many
                };
                reduce_bytes(&mut tmp[..len], views, dtype, op);
                self.write_bytes(dst + off as u64, &tmp[..len])?;
                off += len;
            }
            Ok(())
        })
    }

    fn fence(&self) {
        fence(Ordering::SeqCst);
    }
}
