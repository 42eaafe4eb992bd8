//! The deterministic allocator: a first-fit free list over heap offsets.
//!
//! Every PE runs the same sequence of `alloc`, `free` and `extend` calls (the ledger checks
//! that), and this structure's result depends on nothing else, so every PE computes the same
//! offsets without talking to the others.

use std::collections::BTreeMap;

/// Sizes are kept in multiples of this, so neighbouring blocks never share a cache line's tail
/// by accident of odd sizes and offsets stay 16-byte vector aligned.
pub const GRANULE: u64 = 16;

/// First-fit allocator over `[0, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocator {
    /// Free ranges by start offset, never adjacent (always coalesced).
    free: BTreeMap<u64, u64>,
    end: u64,
    in_use: u64,
}

/// Rounds `x` up to a multiple of `a` (a power of two). None on overflow.
pub fn align_up(x: u64, a: u64) -> Option<u64> {
    debug_assert!(a.is_power_of_two());
    Some(x.checked_add(a - 1)? & !(a - 1))
}

impl Allocator {
    /// An allocator with nothing to hand out until `extend`.
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// End of the managed range.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Bytes handed out and not freed.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Size actually reserved for a request of `size` bytes.
    pub fn rounded(size: u64) -> Option<u64> {
        align_up(size.max(1), GRANULE)
    }

    /// Adds `[end, new_end)` to the managed range.
    pub fn extend(&mut self, new_end: u64) {
        assert!(new_end >= self.end, "the heap never shrinks");
        if new_end > self.end {
            let start = self.end;
            self.end = new_end;
            self.insert_free(start, new_end - start);
        }
    }

    /// First fit: the lowest offset where an `align`-aligned block of `size` bytes fits.
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        let size = Self::rounded(size)?;
        let align = align.max(GRANULE);
        let (start, len, at) = self.free.iter().find_map(|(&start, &len)| {
            let at = align_up(start, align)?;
            (at.checked_add(size)? <= start + len).then_some((start, len, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let tail = start + len - (at + size);
        if tail > 0 {
            self.free.insert(at + size, tail);
        }
        self.in_use += size;
        Some(at)
    }

    /// Returns a block to the free list.
    pub fn free(&mut self, offset: u64, size: u64) {
        let size = Self::rounded(size).expect("sizes were checked at allocation");
        debug_assert!(offset + size <= self.end);
        self.in_use -= size;
        self.insert_free(offset, size);
    }

    fn insert_free(&mut self, mut start: u64, mut len: u64) {
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "double free or overlap at {start}");
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nl;
        }
        self.free.insert(start, len);
    }

    /// How far the range must extend so that `alloc(size, align)` succeeds: the block goes at
    /// the free tail (or at `end` if the tail is in use).
    pub fn end_needed_for(&self, size: u64, align: u64) -> Option<u64> {
        let size = Self::rounded(size)?;
        let tail_start = match self.free.iter().next_back() {
            Some((&s, &l)) if s + l == self.end => s,
            _ => self.end,
        };
        align_up(tail_start, align.max(GRANULE))?.checked_add(size)
    }

    /// Free ranges, for tests and diagnostics.
    #[cfg(test)]
    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&s, &l)| (s, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { size: u64, align_log2: u32 },
        Free { pick: usize },
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                3 => (1u64..20_000, 0u32..13).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
                2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
            ],
            1..200,
        )
    }

    /// Runs a sequence, growing like the heap does, and returns every offset handed out.
    fn run(ops: &[Op], check: bool) -> Vec<u64> {
        let mut a = Allocator::new();
        a.extend(64 << 10);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut offsets = Vec::new();
        for op in ops {
            match *op {
                Op::Alloc { size, align_log2 } => {
                    let align = 1u64 << align_log2;
                    let off = match a.alloc(size, align) {
                        Some(o) => o,
                        None => {
                            let need = a.end_needed_for(size, align).unwrap();
                            a.extend(align_up(need, 64 << 10).unwrap());
                            a.alloc(size, align)
                                .expect("fits after growing to end_needed_for")
                        }
                    };
                    if check {
                        assert_eq!(off % align, 0, "alignment");
                        assert!(off + size <= a.end());
                        for &(o, s) in &live {
                            assert!(off + size <= o || o + s <= off, "overlap");
                        }
                    }
                    live.push((off, size));
                    offsets.push(off);
                }
                Op::Free { pick } => {
                    if !live.is_empty() {
                        let (o, s) = live.swap_remove(pick % live.len());
                        a.free(o, s);
                    }
                }
            }
            if check {
                let used: u64 = live
                    .iter()
                    .map(|&(_, s)| Allocator::rounded(s).unwrap())
                    .sum();
                assert_eq!(a.in_use(), used);
                let free: u64 = a.free_ranges().map(|(_, l)| l).sum();
                assert_eq!(free + used, a.end(), "free + used covers the range exactly");
            }
        }
        for (o, s) in live.drain(..) {
            a.free(o, s);
        }
        assert_eq!(a.in_use(), 0);
        assert_eq!(
            a.free_ranges().collect::<Vec<_>>(),
            vec![(0, a.end())],
            "fully coalesced"
        );
        offsets
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn no_overlap_alignment_kept_and_deterministic(ops in ops()) {
            let first = run(&ops, true);
            // A second allocator (another PE) fed the same calls computes the same offsets.
            prop_assert_eq!(first, run(&ops, false));
        }
    }

    #[test]
    fn freed_space_is_reused_first_fit() {
        let mut a = Allocator::new();
        a.extend(4096);
        let x = a.alloc(1000, 256).unwrap();
        let y = a.alloc(1000, 256).unwrap();
        assert_eq!((x, y), (0, 1024));
        a.free(x, 1000);
        assert_eq!(a.alloc(500, 256).unwrap(), 0);
        assert!(a.alloc(4096, 256).is_none());
        assert_eq!(a.end_needed_for(4096, 256), Some(2048 + 4096));
    }
}
