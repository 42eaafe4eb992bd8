//! The sync area: each PE's block of the host control area (see
//! [`crate::backend::shared::SharedArea`]), used for symheap's own host-side synchronisation
//! whatever backend holds the data. Its layout, per PE:
//!
//! ```text
//! 0      doorbell: u32    bumped by every PE that stores into this PE; waiters sleep on it
//! 4      sleepers: u32    how many threads of this PE sleep on the doorbell (writers skip the
//!                         doorbell and the wake-up syscall when zero)
//! 8      data_sleepers: u32  how many of those wait for heap data (`signal_wait_until`): only
//!                         they need waking by puts and atomics; barrier waits are woken by
//!                         the arrivals they wait for
//! 64     mailbox_len: u64, then MAILBOX bytes: a ledger copy for mismatch diagnostics
//! ...    per team slot, per member `src` of the world, entry[2] (one 64-byte line each,
//!        double-buffered by barrier parity): what `src` pushed here at its arrival at a
//!        barrier of the slot's team, two cache lines: {epoch, count, hash, flags, aux, NARROW
//!        payload bytes} and {epoch, the rest of INLINE payload bytes}
//!        then, per member `root` of the world, `eager_slots` eager-broadcast slots
//!        (EAGER_SLOT bytes each: {sequence, count, hash, bytes, EAGER_INLINE data bytes}) that
//!        `root` writes here, then one line: how many eager broadcasts of the team this PE consumed
//! ...    the watch (see `context/watch.rs`): the wait this PE is blocked in (WAIT_WORDS words),
//!        per team slot a ring of RING recent calls (ENTRY_WORDS words each), and a verdict
//!        (VERDICT_WORDS words; only PE 0's is used: the first PE to name a divergence
//!        writes its message there, so every PE reports the same text), then per team slot
//!        the record of the team this PE holds there ([`SyncArea::team_record_words`] words:
//!        team id, size, the members' world ranks two per word), so that any team, whatever
//!        its members, can be named and checked by PEs that are not in it
//! ...    per target PE of the world, {signals, last}: how many put_signal calls this PE made
//!        to that PE and the heap offset the last one updated (`context/signals.rs`)
//! ...    per team slot, payload[2] of PAYLOAD bytes (double-buffered by barrier parity, like
//!        the boards): what a one-pass collective publishes with its arrival
//! ```

/// Team slots (WORLD is slot 0). Like NVSHMEM's team limit, a fixed pool keeps the heap
/// symmetric no matter which PEs create which teams.
pub const MAX_TEAMS: usize = 32;
/// Bytes for a ledger copy in the mailbox.
pub const MAILBOX: u64 = 16 << 10;
/// Words of the wait record.
pub const WAIT_WORDS: u64 = 8;
/// Recent calls kept per team slot (more than a root may run ahead: see [`EAGER_SLOTS_MAX`]).
pub const RING: u64 = 64;
/// Words of one ring entry: seq, position, hash, text length, then the text.
pub const ENTRY_WORDS: u64 = 32;
/// Words of call text in a ring entry (after seq, position, hash, team id, length).
pub const TEXT_WORDS: u64 = ENTRY_WORDS - 5;
/// Bytes a one-pass collective publishes per member, team and barrier parity.
pub const PAYLOAD: u64 = 4 << 10;
/// Words of the verdict: owner, ready, length, then the text.
pub const VERDICT_WORDS: u64 = 3 + 512;

/// Payload bytes an arrival carries in its entry (see [`SyncArea::entry`]): [`NARROW`] in the
/// line with the header, the rest in the second line.
pub const INLINE: u64 = NARROW + 64 - 8;
/// Payload bytes that fit in an entry's first line, after epoch, count, hash, flags and aux.
pub const NARROW: u64 = 64 - 8 * 5;

/// The most eager-broadcast slots per (receiver, root, team) (see [`SyncArea::eager_slots`]).
/// Fewer than [`RING`] - 1, so a receiver that finds the root diverged still finds the root's
/// call in the root's ring of recent calls.
pub const EAGER_SLOTS_MAX: u64 = 32;
const _: () = assert!(EAGER_SLOTS_MAX < RING - 1);
/// Bytes of one eager-broadcast slot (two cache lines).
pub const EAGER_SLOT: u64 = 128;
/// Words of an eager slot before its data: sequence, count, hash, bytes.
pub const EAGER_HEADER_WORDS: u64 = 4;
/// Data bytes an eager broadcast carries in its slot.
pub const EAGER_INLINE: u64 = EAGER_SLOT - 8 * EAGER_HEADER_WORDS;

const HEADER: u64 = 64;
const MAILBOX_AT: u64 = HEADER;
const SLOTS_AT: u64 = MAILBOX_AT + 64 + MAILBOX;
/// Two cache lines, each with the epoch: a waiter polls both, so what it waits for and what it
/// then reads arrive in transfers that overlap (the second only for payloads over [`NARROW`]).
const ENTRY: u64 = 128;

/// Addresses inside every PE's sync area, given the heap bases.
#[derive(Debug, Clone)]
pub struct SyncArea {
    /// Start of the area on every PE (0 where not direct).
    bases: Vec<u64>,
    world: usize,
    slot_stride: u64,
    /// Every base is non-zero (asked by every small collective: kept, not recomputed).
    all_direct: bool,
    /// `eager_slots_for(world)`, kept.
    eager_slots: u64,
    /// `watch_at(world)` and `payload_at(world)`, kept: every published call and one-pass
    /// collective asks, and working them out took an eager broadcast's publishing a fifth of
    /// its instructions.
    watch_at: u64,
    records_at: u64,
    tally_at: u64,
    payload_at: u64,
}

impl SyncArea {
    /// Bytes the area needs for `world` PEs.
    pub fn bytes(world: usize) -> u64 {
        Self::payload_at(world) + MAX_TEAMS as u64 * 2 * PAYLOAD
    }

    fn payload_at(world: usize) -> u64 {
        let end = Self::tally_at(world) + 16 * world as u64;
        end.div_ceil(64) * 64
    }

    /// Where the signal tallies start, after the watch and the team records.
    fn tally_at(world: usize) -> u64 {
        Self::records_at(world) + 8 * MAX_TEAMS as u64 * Self::team_record_words(world)
    }

    /// Where the team records start, after the verdict.
    fn records_at(world: usize) -> u64 {
        Self::watch_at(world)
            + 8 * (WAIT_WORDS + MAX_TEAMS as u64 * RING * ENTRY_WORDS + VERDICT_WORDS)
    }

    /// Words of one team record for a world of `world` PEs: the team id (0 while being
    /// written), the member count, then the members' world ranks as `u32`, two per word.
    pub fn team_record_words(world: usize) -> u64 {
        2 + (world as u64).div_ceil(2)
    }

    /// Word `w` of PE `pe`'s record of the team it holds in `slot`.
    pub fn team_word(&self, pe: usize, slot: usize, w: u64) -> u64 {
        let n = Self::team_record_words(self.world);
        debug_assert!(slot < MAX_TEAMS && w < n);
        self.bases[pe] + self.records_at + 8 * (slot as u64 * n + w)
    }

    /// Word `w` (0: count, 1: last heap offset) of PE `pe`'s signal tally towards PE `to`.
    pub fn tally_word(&self, pe: usize, to: usize, w: u64) -> u64 {
        debug_assert!(to < self.world && w < 2);
        self.bases[pe] + self.tally_at + 16 * to as u64 + 8 * w
    }

    /// PE `pe`'s payload for team `slot` at barrier parity `parity`: the data a one-pass
    /// collective publishes with its arrival (see `Inner::barrier_staged`).
    pub fn payload(&self, pe: usize, slot: usize, parity: u64) -> u64 {
        debug_assert!(slot < MAX_TEAMS);
        let i = slot as u64 * 2 + (parity & 1);
        self.bases[pe] + self.payload_at + i * PAYLOAD
    }

    fn watch_at(world: usize) -> u64 {
        SLOTS_AT + MAX_TEAMS as u64 * Self::stride(world)
    }

    /// Word `w` of PE `pe`'s wait record.
    pub fn wait_word(&self, pe: usize, w: u64) -> u64 {
        debug_assert!(w < WAIT_WORDS);
        self.bases[pe] + self.watch_at + 8 * w
    }

    /// Word `w` of entry `i` of PE `pe`'s ring of recent calls on team `slot`.
    pub fn ring_word(&self, pe: usize, slot: usize, i: u64, w: u64) -> u64 {
        debug_assert!(slot < MAX_TEAMS && i < RING && w < ENTRY_WORDS);
        let entry = (slot as u64 * RING + i) * ENTRY_WORDS + w;
        self.bases[pe] + self.watch_at + 8 * (WAIT_WORDS + entry)
    }

    /// Word `w` of PE `pe`'s verdict.
    pub fn verdict_word(&self, pe: usize, w: u64) -> u64 {
        debug_assert!(w < VERDICT_WORDS);
        let at = WAIT_WORDS + MAX_TEAMS as u64 * RING * ENTRY_WORDS + w;
        self.bases[pe] + self.watch_at + 8 * at
    }

    fn stride(world: usize) -> u64 {
        Self::eager_at(world) + Self::eager_slots_for(world) * EAGER_SLOT * world as u64 + 64
    }

    /// Eager-broadcast slots per (receiver, root, team) in a world of `world` PEs: how far a
    /// root may run ahead of its slowest receiver (see `context/eager.rs`). A power of two.
    /// Deep where the world is small: with 8 slots a root in a loop of 8-byte broadcasts
    /// between 2 PEs polled its receiver's consumed count every 4 calls, a line transfer each,
    /// and 32 slots made such a loop 10-15 % faster on the 2-vCPU VM (64: no better). The slots
    /// take `world` x slots x 128 bytes per team slot of every PE's area, so large worlds keep
    /// the 8 they had.
    fn eager_slots_for(world: usize) -> u64 {
        match world {
            0..=8 => EAGER_SLOTS_MAX,
            9..=16 => EAGER_SLOTS_MAX / 2,
            _ => EAGER_SLOTS_MAX / 4,
        }
    }

    /// This area's eager-broadcast slots per (receiver, root, team).
    pub fn eager_slots(&self) -> u64 {
        self.eager_slots
    }

    /// Where a slot's eager-broadcast slots start, after its entries.
    fn eager_at(world: usize) -> u64 {
        2 * ENTRY * world as u64
    }

    /// The area placed at `bases[pe]` on every PE.
    pub fn new(bases: Vec<u64>) -> SyncArea {
        let world = bases.len();
        SyncArea {
            all_direct: bases.iter().all(|&b| b != 0),
            bases,
            world,
            slot_stride: Self::stride(world),
            eager_slots: Self::eager_slots_for(world),
            watch_at: Self::watch_at(world),
            records_at: Self::records_at(world),
            tally_at: Self::tally_at(world),
            payload_at: Self::payload_at(world),
        }
    }

    /// Whether every PE's area is directly addressable.
    pub fn all_direct(&self) -> bool {
        self.all_direct
    }

    /// Whether PE `pe`'s area is directly addressable.
    pub fn is_direct(&self, pe: usize) -> bool {
        self.bases.get(pe).is_some_and(|&b| b != 0)
    }

    /// PE `pe`'s doorbell word.
    pub fn doorbell(&self, pe: usize) -> u64 {
        self.bases[pe]
    }

    /// PE `pe`'s sleeper count.
    pub fn sleepers(&self, pe: usize) -> u64 {
        self.bases[pe] + 4
    }

    /// PE `pe`'s count of sleepers waiting for heap data (a subset of `sleepers`).
    pub fn data_sleepers(&self, pe: usize) -> u64 {
        self.bases[pe] + 8
    }

    /// PE `pe`'s mailbox length word; the bytes follow 64 bytes later.
    pub fn mailbox_len(&self, pe: usize) -> u64 {
        self.bases[pe] + MAILBOX_AT
    }

    /// PE `pe`'s mailbox bytes.
    pub fn mailbox(&self, pe: usize) -> u64 {
        self.bases[pe] + MAILBOX_AT + 64
    }

    fn slot(&self, pe: usize, slot: usize) -> u64 {
        debug_assert!(slot < MAX_TEAMS);
        self.bases[pe] + SLOTS_AT + slot as u64 * self.slot_stride
    }

    /// Where member `src` pushes its arrivals at the barriers of team `slot` with parity
    /// `parity` into PE `pe`'s area: two cache lines, word 0 the epoch (stored last, with
    /// release), words 1-4 the ledger count and hash, flags and aux of that barrier, words 5-7
    /// the first [`NARROW`] payload bytes; word 8 the epoch again (a wide arrival's, stored
    /// last in its line), words 9-15 the rest of [`INLINE`] payload bytes. Each line has one
    /// writer, so senders never contend for a line.
    pub fn entry(&self, pe: usize, slot: usize, src: usize, parity: u64) -> u64 {
        debug_assert!(src < self.world);
        self.slot(pe, slot) + (2 * src as u64 + (parity & 1)) * ENTRY
    }

    /// Byte offset, inside an entry, of inline payload word `k` (of `INLINE / 8`).
    pub fn inline_word(k: u64) -> u64 {
        debug_assert!(k < INLINE / 8);
        if k < NARROW / 8 {
            8 * (5 + k)
        } else {
            8 * (9 + k - NARROW / 8)
        }
    }

    /// Eager slot `j % eager_slots` that member `root` writes for its eager broadcast `j` on
    /// team `slot` into PE `pe`'s area.
    pub fn eager_slot(&self, pe: usize, slot: usize, root: usize, j: u64) -> u64 {
        debug_assert!(root < self.world);
        let n = self.eager_slots;
        let i = root as u64 * n + (j & (n - 1));
        self.slot(pe, slot) + Self::eager_at(self.world) + i * EAGER_SLOT
    }

    /// How many eager broadcasts of team `slot` PE `pe` has consumed, then the ledger hash after
    /// consuming broadcast `b` in word `1 + b % 2` (written by `pe` only, read by roots deciding
    /// whether a slot is free again or that their last broadcast was taken); a line of its own.
    pub fn eager_consumed(&self, pe: usize, slot: usize) -> u64 {
        self.slot(pe, slot) + self.slot_stride - 64
    }

    /// This slot's whole range on PE `pe` (for clearing on team destroy).
    pub fn slot_range(&self, pe: usize, slot: usize) -> (u64, u64) {
        (self.slot(pe, slot), self.slot_stride)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_disjoint_and_in_bounds() {
        for world in [1, 2, 5, 8, 9, 16, 17, 40] {
            layout_is_disjoint_and_in_bounds_at(world);
        }
    }

    #[test]
    fn eager_slots_are_a_power_of_two_below_the_ring() {
        for world in 1..200 {
            let n = SyncArea::new(vec![1 << 20; world]).eager_slots();
            assert!(
                n.is_power_of_two() && (8..RING - 1).contains(&n),
                "{world}: {n}"
            );
        }
        assert_eq!(SyncArea::new(vec![1 << 20; 2]).eager_slots(), 32);
        assert_eq!(SyncArea::new(vec![1 << 20; 64]).eager_slots(), 8);
    }

    fn layout_is_disjoint_and_in_bounds_at(world: usize) {
        let a = SyncArea::new(vec![1 << 20; world]);
        let end = (1 << 20) + SyncArea::bytes(world);
        let mut words = vec![
            a.doorbell(0),
            a.sleepers(0),
            a.data_sleepers(0),
            a.mailbox_len(0),
        ];
        for slot in 0..MAX_TEAMS {
            for s in 0..world {
                for p in 0..2 {
                    let e = a.entry(0, slot, s, p);
                    assert_eq!(e % 64, 0, "an entry is one cache line");
                    for w in 0..ENTRY / 8 {
                        words.push(e + 8 * w);
                    }
                }
            }
        }
        for slot in 0..MAX_TEAMS {
            for root in 0..world {
                let n = a.eager_slots();
                for j in 0..n {
                    let e = a.eager_slot(0, slot, root, j);
                    assert_eq!(e % 64, 0);
                    assert_eq!(e, a.eager_slot(0, slot, root, j + n));
                    for w in 0..EAGER_SLOT / 8 {
                        words.push(e + 8 * w);
                    }
                }
            }
            let c = a.eager_consumed(0, slot);
            assert_eq!(c % 64, 0);
            words.push(c);
            let (at, len) = a.slot_range(0, slot);
            assert!(c + 64 <= at + len && a.entry(0, slot, 0, 0) >= at);
        }
        for w in 0..WAIT_WORDS {
            words.push(a.wait_word(0, w));
        }
        for slot in 0..MAX_TEAMS {
            for i in 0..RING {
                for w in 0..ENTRY_WORDS {
                    words.push(a.ring_word(0, slot, i, w));
                }
            }
        }
        for w in 0..VERDICT_WORDS {
            words.push(a.verdict_word(0, w));
        }
        for slot in 0..MAX_TEAMS {
            for w in 0..SyncArea::team_record_words(world) {
                words.push(a.team_word(0, slot, w));
            }
        }
        for to in 0..world {
            for w in 0..2 {
                words.push(a.tally_word(0, to, w));
            }
        }
        let mut sorted = words.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), words.len(), "no two words share an address");
        assert!(words.iter().all(|&w| w + 8 <= end));
        assert!(a.mailbox(0) + MAILBOX <= a.entry(0, 0, 0, 0));
        assert_eq!((NARROW, INLINE), (24, 80));
        let offs: Vec<u64> = (0..INLINE / 8).map(SyncArea::inline_word).collect();
        assert_eq!(offs, [40, 48, 56, 72, 80, 88, 96, 104, 112, 120]);
        let last = *sorted.last().unwrap();
        for slot in 0..MAX_TEAMS {
            for p in 0..2 {
                let at = a.payload(0, slot, p);
                assert!(at >= last + 8 && at + PAYLOAD <= end);
                assert_eq!(at % 64, 0);
            }
        }
        assert_eq!(a.payload(0, 3, 1) + PAYLOAD, a.payload(0, 4, 0));
    }
}
