//! The context's memory part: the heap allocator's state and where every PE's heap slot lies.
//! Allocation (`alloc.rs`), the range checks (`ranges.rs`) and the buffers (`buffer.rs`) read
//! and change the heap through it.

use std::sync::MutexGuard;

use crate::heap::{Heap, HeapState};

/// The heap and the slot bases, owned by the context.
pub(crate) struct Memory {
    /// The allocator's state (blocks, releases, growth) and its lock.
    pub(crate) heap: Heap,
    /// Every PE's heap slot base as the backend maps it (None: on another node), fixed for the
    /// context's life: the hot paths (every put, get and collective) read it here instead of
    /// through a dynamic call.
    pub(crate) bases: Box<[Option<u64>]>,
    /// This PE's own slot base (`bases[rank]`, always mapped), for the range checks.
    pub(crate) own_base: u64,
}

impl Memory {
    /// A fresh heap for `world` PEs whose slots lie at `bases`.
    pub(crate) fn new(world: usize, bases: Box<[Option<u64>]>, own_base: u64) -> Memory {
        Memory {
            heap: Heap::new(world),
            bases,
            own_base,
        }
    }

    /// The allocator's state, locked (a poisoned lock is taken over: the state is consistent
    /// between calls).
    pub(crate) fn lock_heap(&self) -> MutexGuard<'_, HeapState> {
        self.heap.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// PE `pe`'s heap slot base here (None: on another node, or no such PE).
    #[inline]
    pub(crate) fn slot_base(&self, pe: usize) -> Option<u64> {
        self.bases.get(pe).copied().flatten()
    }
}
