//! The aliasing rules of the collectives, in one place: whether a collective's source and
//! destination may overlap, and when an overlap means "in place".
//!
//! Every collective (host forms, `*_on_stream` forms, the Python and torch-op entries) asks
//! [`check`] once, before anything moves. The in-place forms that MPI, NCCL and torch users
//! rely on are accepted, and every other overlap is refused:
//!
//! - broadcast, all_reduce: in place is `dest == src` (the same range);
//! - all_gather: in place is the source being exactly this PE's block of the destination
//!   (`src == dest + me × count`, what FSDP2 and NCCL's in-place all_gather pass);
//! - reduce_scatter: in place is the destination being exactly this PE's block of the source
//!   (`dest == src + me × count`);
//! - alltoall: never in place. Every member's block j goes to member j while member j's block
//!   of the same buffer is being replaced, so an in-place alltoall needs a staging copy of the
//!   whole buffer on every path (MPI implementations make one); symheap asks the caller for a
//!   separate destination instead, on every backend alike, rather than copy behind their back.
//!
//! An empty range overlaps nothing, so a collective of zero elements is never refused; ranges
//! are worked out in `u128` with saturating products, so no length or end wraps whatever the
//! arguments (a count whose byte size overflows is refused before, see `Context::coll_bytes`).
//!
//! The check is per PE: it depends on this PE's index in the team (which block is its own),
//! so `all_gather(d, d)` (the source at block 0) is in place on member 0 and an overlap
//! elsewhere. The ledger records an in-place call as "in place" (not by its source's offset,
//! which differs per PE when each passes its own block), wherever it records the buffers at
//! all: there a peer reads this PE's buffers at this PE's offsets, so members that disagree on
//! in place vs. apart would read the wrong data, and that is a mismatch, as MPI_IN_PLACE must
//! be used by all members or none. Where the kernel touches the buffers on this PE only (the
//! CUDA exchange and one-shot kernels), the buffers are not part of the call, and neither is
//! in place.

use std::fmt;

/// A collective, as far as its buffers' shapes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// `dest` and `src` each hold one block.
    Broadcast,
    /// `dest` holds `n` blocks, `src` one.
    AllGather,
    /// `dest` holds one block, `src` `n`.
    ReduceScatter,
    /// `dest` and `src` each hold one block.
    AllReduce,
    /// `dest` and `src` each hold `n` blocks.
    AllToAll,
}

impl CollKind {
    /// The collective's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            CollKind::Broadcast => "broadcast",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllReduce => "all_reduce",
            CollKind::AllToAll => "alltoall",
        }
    }

    /// The kind of `name` ([`CollKind::name`]'s), if any.
    pub fn from_name(name: &str) -> Option<CollKind> {
        [
            CollKind::Broadcast,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::AllReduce,
            CollKind::AllToAll,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }

    /// Blocks of `count` elements in (destination, source) on a team of `n`.
    pub(crate) fn blocks(self, n: u128) -> (u128, u128) {
        match self {
            CollKind::Broadcast | CollKind::AllReduce => (1, 1),
            CollKind::AllGather => (n, 1),
            CollKind::ReduceScatter => (1, n),
            CollKind::AllToAll => (n, n),
        }
    }
}

/// The bytes `[start, start + len)`; the end may lie past `u64::MAX` (it never wraps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u128,
}

impl ByteRange {
    /// `[start, start + len)`.
    pub fn new(start: u64, len: u128) -> Self {
        ByteRange { start, len }
    }

    /// One past the last byte (saturating: a length near `u128::MAX` covers the rest).
    pub fn end(&self) -> u128 {
        (self.start as u128).saturating_add(self.len)
    }

    /// Whether the two share a byte (an empty range shares none).
    pub fn overlaps(&self, other: &ByteRange) -> bool {
        self.len > 0
            && other.len > 0
            && (self.start as u128) < other.end()
            && (other.start as u128) < self.end()
    }
}

impl fmt::Display for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}, {:#x})", self.start, self.end())
    }
}

/// A collective's buffers on this PE: what [`check`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollBuffers {
    /// Which collective.
    pub kind: CollKind,
    /// The destination's bytes.
    pub dest: ByteRange,
    /// The source's bytes.
    pub src: ByteRange,
    /// Elements per block.
    pub count: u64,
    /// Bytes per element.
    pub elem: u64,
    /// Members of the team.
    pub n: u64,
    /// This PE's index in the team (`< n`).
    pub me: u64,
}

impl CollBuffers {
    /// The buffers of a collective on contiguous memory: each as long as its kind says
    /// (`count` elements of `elem` bytes per block, `n` blocks where it holds one per member).
    pub fn contiguous(
        kind: CollKind,
        dest: u64,
        src: u64,
        count: u64,
        elem: u64,
        n: u64,
        me: u64,
    ) -> Self {
        let block = count as u128 * elem as u128;
        let (d, s) = kind.blocks(n as u128);
        CollBuffers {
            kind,
            dest: ByteRange::new(dest, block.saturating_mul(d)),
            src: ByteRange::new(src, block.saturating_mul(s)),
            count,
            elem,
            n,
            me,
        }
    }

    /// The bytes of one block.
    fn block(&self) -> u128 {
        self.count as u128 * self.elem as u128
    }

    /// Block `me` of a buffer of blocks that starts at `start`: where in place puts this PE's
    /// part (None when it lies past the address space, so nothing can equal it).
    fn own_block(&self, start: u64) -> Option<ByteRange> {
        let off = (self.me as u128).saturating_mul(self.block());
        let at = u64::try_from((start as u128).saturating_add(off)).ok()?;
        Some(ByteRange::new(at, self.block()))
    }

    /// The range that makes the call in place, if the kind has one.
    fn in_place_range(&self) -> Option<(ByteRange, ByteRange)> {
        match self.kind {
            CollKind::Broadcast | CollKind::AllReduce => Some((self.dest, self.dest)),
            CollKind::AllGather => Some((self.dest, self.own_block(self.dest.start)?)),
            CollKind::ReduceScatter => Some((self.own_block(self.src.start)?, self.src)),
            CollKind::AllToAll => None,
        }
    }
}

/// How a collective's source and destination lie, once [`check`] accepted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// They share no byte.
    Apart,
    /// The kind's in-place form (see the module documentation).
    InPlace,
}

/// A refused overlap: both ranges, and what the collective would have accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The collective.
    pub kind: CollKind,
    /// The destination's bytes.
    pub dest: ByteRange,
    /// The source's bytes.
    pub src: ByteRange,
    /// The in-place form's (destination, source), if the kind has one.
    pub in_place: Option<(ByteRange, ByteRange)>,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the destination {} and the source {} overlap",
            self.dest, self.src
        )?;
        match (self.kind, self.in_place) {
            (CollKind::AllGather, Some((_, s))) => write!(
                f,
                "; in place, the source must be exactly this PE's block of the destination, {s}"
            ),
            (CollKind::ReduceScatter, Some((d, _))) => write!(
                f,
                "; in place, the destination must be exactly this PE's block of the source, {d}"
            ),
            (CollKind::AllToAll, _) => {
                f.write_str("; alltoall cannot run in place, use separate buffers")
            }
            _ => f.write_str("; in place, pass the same range as both"),
        }
    }
}

impl std::error::Error for Overlap {}

/// The aliasing rules: whether `b`'s destination and source may be used as they lie (see the
/// module documentation). Pure and per PE; costs a few comparisons. (The refusal is boxed: it
/// is the cold path, and keeps the result small.)
pub fn check(b: &CollBuffers) -> Result<Placement, Box<Overlap>> {
    let in_place = b.in_place_range();
    if in_place == Some((b.dest, b.src)) {
        return Ok(Placement::InPlace);
    }
    if b.dest.overlaps(&b.src) {
        return Err(Box::new(Overlap {
            kind: b.kind,
            dest: b.dest,
            src: b.src,
            in_place,
        }));
    }
    Ok(Placement::Apart)
}

#[cfg(test)]
#[path = "alias_tests.rs"]
mod tests;
