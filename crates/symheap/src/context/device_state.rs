//! symheap's own state in device memory (CUDA backend), which the context allocates at init
//! and owns: the per-team flag areas, member tables and one-shot scratch the collective
//! kernels use ([`DeviceTeams`]), and the stream barrier's per-team flags and counters
//! ([`DeviceSync`]). The ops layer reads the layouts to pass addresses to its kernels.

use super::area::MAX_TEAMS;
use super::team::TeamInner;
use super::Inner;
use crate::error::Result;
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

impl Inner {
    /// Writes this PE's copy of `team`'s member tables (heap bases, flag areas and, for the
    /// team owning the scratch, scratch addresses) for the collective kernels. Local; flags and
    /// counters of a fresh slot are already zero.
    pub(crate) fn init_device_team(&self, team: &TeamInner) -> Result<()> {
        let Some(dt) = self.comms.dteams.get() else {
            return Ok(());
        };
        let own = self.backend.slot_base(self.rank).expect("own heap");
        let n = team.members.len();
        let (mut bases, mut flags, mut scratch) = (
            Vec::with_capacity(8 * n),
            Vec::with_capacity(8 * n),
            Vec::with_capacity(8 * n),
        );
        for &m in &team.members {
            let b = self.backend.slot_base(m).unwrap_or(0);
            let at = |off: u64| if b == 0 { 0u64 } else { b + off };
            bases.extend_from_slice(&b.to_le_bytes());
            flags.extend_from_slice(&at(dt.flags(team.slot)).to_le_bytes());
            scratch.extend_from_slice(&at(dt.scratch()).to_le_bytes());
        }
        self.backend
            .write_bytes(own + dt.bases(team.slot), &bases)?;
        self.backend
            .write_bytes(own + dt.peer_flags(team.slot), &flags)?;
        if team.scratch {
            self.backend
                .write_bytes(own + dt.scratch_table(team.slot), &scratch)?;
        }
        Ok(())
    }

    /// Clears this PE's flags and counters of a destroyed team's slot.
    pub(crate) fn clear_device_team(&self, slot: usize) -> Result<()> {
        let Some(dt) = self.comms.dteams.get() else {
            return Ok(());
        };
        let own = self.backend.slot_base(self.rank).expect("own heap");
        self.backend.write_bytes(
            own + dt.flags(slot),
            &vec![0u8; dt.slot_state_bytes() as usize],
        )
    }

    /// CUDA only, collective at init: the device team state for every slot and the world's.
    pub(crate) fn init_device_teams(&self) -> Result<()> {
        if self.backend.as_cuda().is_none() {
            return Ok(());
        }
        let dt = DeviceTeams::new(
            self.zeroed_state(DeviceTeams::bytes(self.world))?,
            self.world,
        );
        self.write_peer_table(dt.peer_scratch(), dt.scratch())?;
        let _ = self.comms.dteams.set(dt);
        self.init_device_team(&self.teams.world_team)
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

impl Inner {
    /// Collective (an internal allocation): `bytes` of symheap's own heap state, zeroed on this
    /// PE; returns its heap offset.
    fn zeroed_state(&self, bytes: u64) -> Result<u64> {
        let block = self.allocate_internal(bytes, 256)?;
        let own = self.backend.slot_base(self.rank).expect("own heap");
        self.backend
            .write_bytes(own + block.offset, &vec![0u8; block.bytes as usize])?;
        Ok(block.offset)
    }

    /// Writes, at heap offset `at` of this PE's copy, the table of every PE's address of heap
    /// offset `of` (0 for a PE whose memory is not directly reachable).
    fn write_peer_table(&self, at: u64, of: u64) -> Result<()> {
        let own = self.backend.slot_base(self.rank).expect("own heap");
        let table: Vec<u8> = (0..self.world)
            .flat_map(|pe| {
                self.backend
                    .slot_base(pe)
                    .map_or(0, |b| b + of)
                    .to_le_bytes()
            })
            .collect();
        self.backend.write_bytes(own + at, &table)
    }

    /// CUDA only: allocates and initialises the device barrier state (collective, at init).
    pub(crate) fn init_device_sync(&self) -> Result<()> {
        if self.backend.as_cuda().is_none() {
            return Ok(());
        }
        let ds = DeviceSync::new(
            self.zeroed_state(DeviceSync::bytes(self.world))?,
            self.world,
        );
        self.write_peer_table(ds.peer_flags(0), ds.flags(0))?;
        let _ = self.comms.dsync.set(ds);
        Ok(())
    }
}
