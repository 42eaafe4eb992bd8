//! Peer tables: the allocator-agnostic contract device code relies on.
//!
//! For an allocation at `p` on PE `me`, `peer_bases[r]` is the address in this process of PE
//! r's copy (0 when not directly addressable) and `peer_bases[me] == p`. A pointer translates
//! as `peer_bases[to] + (ptr - peer_bases[from])`. On symheap's heap the per-peer delta
//! `peer_bases[r] - peer_bases[me]` is the same for every heap address, so a table made for
//! one allocation also translates pointers into another.

/// One bit per PE.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerMask {
    words: Vec<u64>,
    len: usize,
}

impl PeerMask {
    /// All clear, for `len` PEs.
    pub fn new(len: usize) -> Self {
        PeerMask {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// Sets PE `pe`'s bit.
    pub fn set(&mut self, pe: usize) {
        assert!(pe < self.len, "PE {pe} out of range");
        self.words[pe / 64] |= 1 << (pe % 64);
    }

    /// Whether PE `pe`'s bit is set (false out of range).
    pub fn get(&self, pe: usize) -> bool {
        pe < self.len && self.words[pe / 64] & (1 << (pe % 64)) != 0
    }

    /// Number of PEs covered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a mask over zero PEs.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The words, bit `pe % 64` of word `pe / 64`, for passing to device code.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Set PEs, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len).filter(|&p| self.get(p))
    }
}

/// Everything device-side translation needs about one allocation, plus the direct mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymmetricAddressMap {
    /// This PE's index into `peer_bases` (its rank in the world team).
    pub local_rank: usize,
    /// Start of this PE's copy (`peer_bases[local_rank]`).
    pub allocation_base: u64,
    /// Size of the allocation in bytes.
    pub allocation_bytes: u64,
    /// Address of every PE's copy in this process, 0 where not directly addressable.
    pub peer_bases: Vec<u64>,
    /// PEs whose copy is directly load/store-addressable from here.
    pub direct: PeerMask,
}

impl SymmetricAddressMap {
    /// Translates `ptr` (inside PE `from`'s copy of this allocation's heap) to PE `to`'s copy.
    /// None when either PE is not direct or `from`/`to` is out of range.
    pub fn translate(&self, ptr: u64, from: usize, to: usize) -> Option<u64> {
        translate(&self.peer_bases, ptr, from, to)
    }
}

/// The contract's translation over any table. None when either entry is 0 or out of range.
pub fn translate(peer_bases: &[u64], ptr: u64, from: usize, to: usize) -> Option<u64> {
    let f = *peer_bases.get(from)?;
    let t = *peer_bases.get(to)?;
    if f == 0 || t == 0 {
        return None;
    }
    Some(t.wrapping_add(ptr.wrapping_sub(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_and_translate() {
        let mut m = PeerMask::new(70);
        m.set(0);
        m.set(69);
        assert!(m.get(69) && !m.get(68) && !m.get(70));
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 69]);
        let t = [1000, 5000, 0];
        assert_eq!(translate(&t, 1010, 0, 1), Some(5010));
        assert_eq!(translate(&t, 5010, 1, 0), Some(1010));
        assert_eq!(translate(&t, 1010, 0, 2), None);
        assert_eq!(translate(&t, 1010, 0, 3), None);
    }
}
