//! Setting up symheap's own device state (CUDA backend) at init and for each new team: the
//! member tables of [`DeviceTeams`] and the barrier state of [`DeviceSync`].

use super::device_state::{DeviceSync, DeviceTeams};
use super::team::TeamInner;
use super::Inner;
use crate::error::Result;

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
