//! symheap's own state in device memory (CUDA backend), which the context allocates at init
//! and owns: the per-team flag areas, member tables and one-shot scratch the collective
//! kernels use ([`DeviceTeams`]), and the stream barrier's per-team flags and counters
//! ([`DeviceSync`]). The ops layer reads the layouts to pass addresses to its kernels.

use super::area::MAX_TEAMS;
use crate::heap::align_up;

/// Blocks a collective launch may use (the flag areas are sized for it).
pub const MAX_BLOCKS: u64 = 1024;

/// Bytes per member slot of the world's one-shot scratch: the largest one-shot all_reduce.
/// The kernels' LL path also needs `2 × n × bytes <= slot` for its messages (up to 32 KiB for
/// all_reduce, 64 KiB for the exchange), which 4 MiB covers up to 32 PEs.
pub const ONE_SHOT_SLOT: u64 = 4 << 20;

/// Bytes per parity of the world's LL128 region: room for `(n - 1) × bytes <= 4 MiB` plus the
/// flags (128 wire bytes per 120 data bytes) at any team size.
pub const LL128_PART: u64 = 4608 << 10;

/// Device-resident state of every team slot, and the world's one-shot scratch, in this PE's
/// heap (CUDA only). Per slot: `flags[2][MAX_BLOCKS][W]`, `ctl[2]` (epoch, blocks done),
/// `bases[W]` (member heap bases), `peer_flags[W]` (member flag areas), `scratch_table[W]`
/// (member scratch addresses, written for the team that owns the scratch); W = world size.
/// Then the scratch `[2][W][ONE_SHOT_SLOT]`, the table of every PE's scratch address, and the
/// LL128 region `[2][LL128_PART]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceTeams {
    offset: u64,
    world: usize,
    stride: u64,
    scratch: u64,
}

impl DeviceTeams {
    fn flags_bytes(world: usize) -> u64 {
        2 * MAX_BLOCKS * world as u64 * 8
    }

    fn stride(world: usize) -> u64 {
        align_up(Self::flags_bytes(world) + 256 + 24 * world as u64, 256).expect("small")
    }

    /// Bytes from the scratch to the LL128 region (past the scratch and its table).
    fn ll128_off(world: usize) -> u64 {
        align_up(2 * world as u64 * ONE_SHOT_SLOT + 8 * world as u64, 256).expect("small")
    }

    /// Bytes for the team slots, the scratch, its table and the LL128 region.
    pub(crate) fn bytes(world: usize) -> u64 {
        MAX_TEAMS as u64 * Self::stride(world) + Self::ll128_off(world) + 2 * LL128_PART
    }

    pub(crate) fn new(offset: u64, world: usize) -> DeviceTeams {
        DeviceTeams {
            offset,
            world,
            stride: Self::stride(world),
            scratch: offset + MAX_TEAMS as u64 * Self::stride(world),
        }
    }

    pub(crate) fn flags(&self, slot: usize) -> u64 {
        self.offset + slot as u64 * self.stride
    }
    pub(crate) fn ctl(&self, slot: usize) -> u64 {
        self.flags(slot) + Self::flags_bytes(self.world)
    }
    pub(crate) fn bases(&self, slot: usize) -> u64 {
        self.ctl(slot) + 256
    }
    pub(crate) fn peer_flags(&self, slot: usize) -> u64 {
        self.bases(slot) + 8 * self.world as u64
    }
    /// Slot `slot`'s table of its members' scratch addresses (the kernels index it by member).
    pub(crate) fn scratch_table(&self, slot: usize) -> u64 {
        self.peer_flags(slot) + 8 * self.world as u64
    }
    /// The world's one-shot scratch.
    pub(crate) fn scratch(&self) -> u64 {
        self.scratch
    }
    /// The table of every PE's scratch address.
    pub(crate) fn peer_scratch(&self) -> u64 {
        self.scratch + 2 * self.world as u64 * ONE_SHOT_SLOT
    }
    /// Bytes from the scratch to the LL128 region.
    pub(crate) fn ll128(&self) -> u64 {
        Self::ll128_off(self.world)
    }
    /// Bytes of a slot's flags and control words (what team_destroy clears).
    pub(crate) fn slot_state_bytes(&self) -> u64 {
        Self::flags_bytes(self.world) + 16
    }
}

/// Per-team barrier state in device memory, one slot per team: the arrival flags (indexed by
/// team member), the address of every member's flags, and this PE's barrier counter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceSync {
    offset: u64,
    world: usize,
    stride: u64,
}

impl DeviceSync {
    fn stride(world: usize) -> u64 {
        align_up((2 * world as u64 + 1) * 8, 256).expect("small")
    }

    /// Bytes for `world` PEs.
    pub(crate) fn bytes(world: usize) -> u64 {
        MAX_TEAMS as u64 * Self::stride(world)
    }

    pub(crate) fn new(offset: u64, world: usize) -> DeviceSync {
        DeviceSync {
            offset,
            world,
            stride: Self::stride(world),
        }
    }

    /// Heap offset of `slot`'s flags.
    pub(crate) fn flags(&self, slot: usize) -> u64 {
        self.offset + slot as u64 * self.stride
    }

    /// Heap offset of `slot`'s table of member flag addresses.
    pub(crate) fn peer_flags(&self, slot: usize) -> u64 {
        self.flags(slot) + 8 * self.world as u64
    }

    /// Heap offset of `slot`'s barrier counter.
    pub(crate) fn epoch(&self, slot: usize) -> u64 {
        self.flags(slot) + 16 * self.world as u64
    }
}
