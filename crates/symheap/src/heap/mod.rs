//! The symmetric heap: which offsets are in use, growth decisions, and the agreed free.
//!
//! Releasing a block is local and never blocks, so it is safe from a destructor, a finalizer
//! or the garbage collector. A released block is only handed out again after every PE has
//! released it: PEs exchange their releases at collective points (see
//! [`Heap::take_releases`]/[`Heap::apply_releases`]), and because every PE applies the same
//! exchanged lists in the same order, the allocators stay identical.

pub mod allocator;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use allocator::{align_up, Allocator};

use crate::backend::Fence;

/// Identity of an allocation: its index in the job's sequence of allocations, the same on
/// every PE.
pub type BlockId = u64;

/// A live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Allocation sequence number.
    pub id: BlockId,
    /// Offset from the heap base (the same on every PE).
    pub offset: u64,
    /// Requested bytes.
    pub bytes: u64,
    /// Bytes reserved in the heap (the request plus symheap's trailer).
    pub span: u64,
}

impl Block {
    /// Where the block's trailer (its peer table) starts, relative to the heap base: after the
    /// request rounded up to 16 bytes. Everything before it is the user's.
    pub fn table_offset(&self) -> u64 {
        self.offset + self.bytes.div_ceil(16) * 16
    }
}

/// Allocator state that only changes at points every PE reaches in the same order.
#[derive(Debug, Default)]
pub struct HeapState {
    alloc: Allocator,
    next_id: BlockId,
    live: BTreeMap<BlockId, Block>,
    /// Live blocks by offset, for address lookups.
    by_offset: BTreeMap<u64, BlockId>,
    /// For each block released somewhere but not yet reclaimed: how many PEs released it.
    release_counts: HashMap<BlockId, usize>,
    /// Blocks symheap allocated for itself (device tables, team state): never reachable
    /// through an address a user passes.
    internal: HashSet<BlockId>,
    /// Allocations that had to meet the other PEs (to reclaim or to grow).
    allocation_syncs: u64,
    /// Heap offsets where this PE's copy holds a block's peer table that no block handed out
    /// since has covered: a block placed at the same offset whose size rounds to the same 16
    /// bytes finds its table already there (the table of heap offset `o` is the same for every
    /// block at `o`, the slot bases being fixed for the heap's life). On CUDA writing it costs
    /// a host-to-device copy and a wait for it on every allocation.
    tables: BTreeSet<u64>,
}

impl HeapState {
    /// Places `bytes` (with `span` bytes reserved in total) without growing. Deterministic.
    pub fn try_alloc(&mut self, bytes: u64, span: u64, align: u64) -> Option<Block> {
        let offset = self.alloc.alloc(span, align)?;
        let id = self.next_id;
        self.next_id += 1;
        let b = Block {
            id,
            offset,
            bytes,
            span,
        };
        self.live.insert(id, b);
        self.by_offset.insert(offset, id);
        Some(b)
    }

    /// Whether `b`'s trailer already holds its peer table (`table_bytes` long), having
    /// forgotten every table that `b`'s user bytes cover: call once for each block placed,
    /// before anything writes into it, and [`HeapState::note_table`] once the table is written.
    pub fn table_in_place(&mut self, b: &Block, table_bytes: u64) -> bool {
        let at = b.table_offset();
        // A table at `t` spans `[t, t + table_bytes)`: it overlaps the block's user bytes and
        // its own table, `[offset, at + table_bytes)`, when it starts before that ends and ends
        // after that starts. Only a table exactly at `at` is the block's own.
        let from = (b.offset + 1).saturating_sub(table_bytes);
        let covered: Vec<u64> = self
            .tables
            .range(from..at.saturating_add(table_bytes))
            .copied()
            .filter(|&t| t != at)
            .collect();
        for t in covered {
            self.tables.remove(&t);
        }
        self.tables.contains(&at)
    }

    /// Notes that `b`'s peer table is written in its trailer.
    pub fn note_table(&mut self, b: &Block) {
        self.tables.insert(b.table_offset());
    }

    /// The heap size needed for `try_alloc(bytes, align)` to succeed.
    pub fn end_needed_for(&self, bytes: u64, align: u64) -> Option<u64> {
        self.alloc.end_needed_for(bytes, align)
    }

    /// Records that `[end, new_end)` is now backed by memory.
    pub fn extend(&mut self, new_end: u64) {
        self.alloc.extend(new_end);
    }

    /// Bytes in use (allocated and not reclaimed).
    pub fn in_use(&self) -> u64 {
        self.alloc.in_use()
    }

    /// Bytes of the managed range not handed out (in one piece or several).
    pub fn free_bytes(&self) -> u64 {
        self.alloc.end() - self.alloc.in_use()
    }

    /// Counts an allocation that had to meet the other PEs.
    pub fn note_allocation_sync(&mut self) {
        self.allocation_syncs += 1;
    }

    /// Allocations so far that had to meet the other PEs.
    pub fn allocation_syncs(&self) -> u64 {
        self.allocation_syncs
    }

    /// Number of live (not reclaimed) blocks.
    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }

    /// The live block containing heap offset `off`.
    pub fn block_at(&self, off: u64) -> Option<Block> {
        let (_, id) = self.by_offset.range(..=off).next_back()?;
        let b = self.live.get(id)?;
        (off < b.offset + b.bytes).then_some(*b)
    }

    /// The live block starting at or before heap offset `off` (`off` may be past its end).
    pub fn block_before(&self, off: u64) -> Option<Block> {
        let (_, id) = self.by_offset.range(..=off).next_back()?;
        self.live.get(id).copied()
    }

    /// Marks `id` as symheap's own: [`Heap::user_block`] refuses it.
    pub fn mark_internal(&mut self, id: BlockId) {
        self.internal.insert(id);
    }

    /// Whether `id` is one of symheap's own blocks.
    pub fn is_internal(&self, id: BlockId) -> bool {
        self.internal.contains(&id)
    }
}

/// Why a heap range is not one a caller may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeError {
    /// Not inside any live allocation (never allocated, or already reclaimed).
    NotAllocated,
    /// The allocation holding it was released on this PE.
    Freed(Block),
    /// It belongs to symheap's internal state.
    Internal,
    /// It starts in the allocation but runs past its end.
    PastEnd(Block),
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap")
            .field("world", &self.world)
            .field("deferred", &self.deferred_count())
            .finish()
    }
}

/// What keeps a stream alive until symheap has enqueued its last work there.
pub type KeepAlive = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// A stream that used a block, as noted for its stream-ordered release.
pub struct StreamUse {
    /// The stream's handle.
    pub raw: u64,
    _keep: Option<KeepAlive>,
}

/// The heap of one PE.
pub struct Heap {
    world: usize,
    /// Changed only at collective points.
    pub state: Mutex<HeapState>,
    /// Released here, not yet told to the other PEs. Its own lock, so releasing never waits
    /// for a collective in progress.
    released: Mutex<Vec<BlockId>>,
    /// Released here and not yet reclaimed: every access through them is refused, even while
    /// the other PEs still use their copies.
    freed_here: Mutex<HashSet<BlockId>>,
    /// The device streams each live block was used on (CUDA): its release waits for them.
    uses: Mutex<HashMap<BlockId, Vec<StreamUse>>>,
    /// Released here while device work may still use them: announced once their fence is done.
    deferred: Mutex<Vec<(BlockId, Box<dyn Fence>)>>,
    /// Changes whenever a block stops being usable (released here, reclaimed, made internal):
    /// lookups remembered under an older value are stale. Drawn from [`GENERATIONS`], so no
    /// two heaps of a process ever share a value.
    generation: AtomicU64,
}

/// Source of heap generations, process-wide.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// User blocks a thread remembers (see [`Heap::remembered`]): a collective checks its
/// destination and its source, a loop may alternate between a few buffers.
const REMEMBERED: usize = 4;

thread_local! {
    /// The last user blocks this thread validated, newest first: (heap generation, start, end
    /// offset). Puts, gets and collectives mostly hit the same buffers again, and checking
    /// them here costs a few loads instead of the heap lock, two tree and two hash lookups.
    static LAST_BLOCKS: Cell<[(u64, u64, u64); REMEMBERED]> =
        const { Cell::new([(0, 0, 0); REMEMBERED]) };
}

impl Heap {
    /// An empty heap for `world` PEs.
    pub fn new(world: usize) -> Heap {
        Heap {
            world,
            state: Mutex::new(HeapState::default()),
            released: Mutex::new(Vec::new()),
            freed_here: Mutex::new(HashSet::new()),
            uses: Mutex::new(HashMap::new()),
            deferred: Mutex::new(Vec::new()),
            generation: AtomicU64::new(GENERATIONS.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The current generation (see [`Heap::remembered`]).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Forgets every remembered lookup: call after anything that makes a live block unusable.
    pub fn invalidate_lookups(&self) {
        let g = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        self.generation.store(g, Ordering::Release);
    }

    /// Whether `[off, off + bytes)` lies in a user block this thread validated recently with
    /// [`Heap::remember`], and that block is still usable (nothing was released, reclaimed or
    /// made internal since).
    pub fn remembered(&self, off: u64, bytes: u64) -> bool {
        let g = self.generation();
        let end = off.checked_add(bytes);
        LAST_BLOCKS
            .with(Cell::get)
            .iter()
            .any(|&(bg, lo, hi)| bg == g && off >= lo && off < hi && end.is_some_and(|e| e <= hi))
    }

    /// Remembers `b`, validated by [`Heap::user_block`] while the generation was `g` (read
    /// before the lookup, so a change during it makes the memory stale, never wrong).
    pub fn remember(&self, g: u64, b: &Block) {
        LAST_BLOCKS.with(|c| {
            let mut v = c.get();
            v.copy_within(0..REMEMBERED - 1, 1);
            v[0] = (g, b.offset, b.offset + b.bytes);
            c.set(v);
        });
    }

    /// Notes that device work on `stream` uses block `id`; `keep` holds an owned stream alive
    /// until the release has recorded its event there.
    pub fn note_use(&self, id: BlockId, stream: u64, keep: Option<KeepAlive>) {
        let mut u = self.uses.lock().unwrap_or_else(|p| p.into_inner());
        let list = u.entry(id).or_default();
        if !list.iter().any(|s| s.raw == stream) {
            list.push(StreamUse {
                raw: stream,
                _keep: keep,
            });
        }
    }

    /// The streams block `id` was used on, forgetting them.
    pub fn take_uses(&self, id: BlockId) -> Vec<StreamUse> {
        self.uses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
            .unwrap_or_default()
    }

    /// Holds back the announcement of released block `id` until `fence` is done.
    pub fn defer(&self, id: BlockId, fence: Box<dyn Fence>) {
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, fence));
    }

    /// Announces the deferred releases whose device work has finished (never waits).
    pub fn poll_deferred(&self) {
        let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if d.is_empty() {
            return;
        }
        let mut done = Vec::new();
        d.retain_mut(|(id, f)| {
            let finished = f.done();
            if finished {
                done.push(*id);
            }
            !finished
        });
        drop(d);
        for id in done {
            self.announce(id);
        }
    }

    /// Released blocks whose announcement waits for device work.
    pub fn deferred_count(&self) -> usize {
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Local, non-blocking release. Safe from any thread and from destructors.
    #[cfg(test)]
    pub fn release(&self, id: BlockId) {
        self.mark_freed(id);
        self.announce(id);
    }

    /// From now on, accesses to `id` on this PE are refused (see [`Heap::user_block`]).
    pub fn mark_freed(&self, id: BlockId) {
        self.freed_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        self.invalidate_lookups();
    }

    /// Queues `id` for the next exchange of releases (once no device work uses it).
    pub fn announce(&self, id: BlockId) {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(id);
    }

    /// Whether `id` was released on this PE and not reclaimed yet.
    pub fn is_freed_here(&self, id: BlockId) -> bool {
        self.freed_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    /// The allocation `[off, off + bytes)` lies in, if a caller may use it: a live block that
    /// is neither symheap's own nor released on this PE, holding the whole range.
    pub fn user_block(&self, st: &HeapState, off: u64, bytes: u64) -> Result<Block, RangeError> {
        let b = match st.block_at(off) {
            Some(b) => b,
            // An empty range may start one past its allocation's last byte: the empty slice
            // `buf[n:]` of an `n`-element buffer (a PE that sends nothing from the end).
            None if bytes == 0 => st
                .block_before(off)
                .filter(|b| b.offset + b.bytes == off)
                .ok_or(RangeError::NotAllocated)?,
            None => return Err(RangeError::NotAllocated),
        };
        if st.is_internal(b.id) {
            return Err(RangeError::Internal);
        }
        if self.is_freed_here(b.id) {
            return Err(RangeError::Freed(b));
        }
        if off.saturating_add(bytes) > b.offset + b.bytes {
            return Err(RangeError::PastEnd(b));
        }
        Ok(b)
    }

    /// Whether releases are waiting to be exchanged.
    pub fn has_pending_releases(&self) -> bool {
        !self
            .released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Takes this PE's pending releases, encoded for the exchange.
    pub fn take_releases(&self) -> Vec<u8> {
        let mut r = self.released.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(r.len() * 8);
        r.sort_unstable();
        for id in r.drain(..) {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// Applies every PE's exchanged releases (in rank order, the same on every PE) and
    /// reclaims blocks all PEs have released. Returns the reclaimed blocks.
    pub fn apply_releases(&self, st: &mut HeapState, per_pe: &[&[u8]]) -> Vec<Block> {
        let mut done = Vec::new();
        for bytes in per_pe {
            for c in bytes.chunks_exact(8) {
                let id = u64::from_le_bytes(c.try_into().expect("8 bytes"));
                let n = st.release_counts.entry(id).or_insert(0);
                *n += 1;
                if *n == self.world {
                    done.push(id);
                }
            }
        }
        done.sort_unstable();
        let mut out = Vec::with_capacity(done.len());
        let mut freed = self.freed_here.lock().unwrap_or_else(|p| p.into_inner());
        for id in done {
            st.release_counts.remove(&id);
            freed.remove(&id);
            st.internal.remove(&id);
            if let Some(b) = st.live.remove(&id) {
                st.by_offset.remove(&b.offset);
                st.alloc.free(b.offset, b.span);
                out.push(b);
            }
        }
        drop(freed);
        if !out.is_empty() {
            self.invalidate_lookups();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaimed_only_when_every_pe_released() {
        let heaps: Vec<Heap> = (0..3).map(|_| Heap::new(3)).collect();
        for h in &heaps {
            h.state.lock().unwrap().extend(1 << 20);
        }
        let blocks: Vec<Vec<Block>> = heaps
            .iter()
            .map(|h| {
                let mut s = h.state.lock().unwrap();
                (0..4)
                    .map(|i| s.try_alloc(1000 * (i + 1), 1000 * (i + 1), 256).unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(blocks[0], blocks[2]);
        // Different orders, different subsets.
        heaps[0].release(3);
        heaps[0].release(1);
        heaps[1].release(1);
        heaps[2].release(1);
        heaps[2].release(3);
        let exchange = |heaps: &[Heap]| {
            let parts: Vec<Vec<u8>> = heaps.iter().map(|h| h.take_releases()).collect();
            let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            heaps
                .iter()
                .map(|h| h.apply_releases(&mut h.state.lock().unwrap(), &refs))
                .collect::<Vec<_>>()
        };
        let r = exchange(&heaps);
        assert!(r.iter().all(|x| x.len() == 1 && x[0].id == 1));
        heaps[1].release(3);
        let r = exchange(&heaps);
        assert!(r.iter().all(|x| x.len() == 1 && x[0].id == 3));
        for h in &heaps {
            assert_eq!(h.state.lock().unwrap().live_blocks(), 2);
        }
    }

    #[test]
    fn a_table_is_in_place_only_where_no_user_bytes_or_other_table_covered_it() {
        let tb = 24; // three PEs: tables 24 bytes long at 16-byte steps may overlap
        let mut s = HeapState::default();
        s.extend(1 << 20);
        let place = |s: &mut HeapState, bytes: u64| {
            let b = s
                .try_alloc(bytes, bytes.div_ceil(16) * 16 + tb, 256)
                .unwrap();
            let in_place = s.table_in_place(&b, tb);
            s.note_table(&b);
            (b, in_place)
        };
        let (a, fresh) = place(&mut s, 1000);
        assert!(!fresh, "a new heap holds no table");
        s.alloc.free(a.offset, a.span);
        // The same place and size: the table is there.
        let (a2, again) = place(&mut s, 1000);
        assert_eq!((a2.offset, again), (a.offset, true));
        s.alloc.free(a2.offset, a2.span);
        // A longer block over it covers the table with user bytes...
        let (big, _) = place(&mut s, 4000);
        assert_eq!(big.offset, a.offset);
        s.alloc.free(big.offset, big.span);
        // ...so the short block writes its table again, and that write covers the long one's.
        let (a3, after_cover) = place(&mut s, 1000);
        assert_eq!((a3.offset, after_cover), (a.offset, false));
        s.alloc.free(a3.offset, a3.span);
        // A block whose own table overlaps another table without being it (992 bytes: its
        // table at 992 runs into the one at 1008): written, and the other one is gone.
        let (b, shifted) = place(&mut s, 992);
        assert_eq!((b.offset, shifted), (a.offset, false));
        s.alloc.free(b.offset, b.span);
        let (a4, overwritten) = place(&mut s, 1000);
        assert_eq!((a4.offset, overwritten), (a.offset, false));
    }
}
