//! Synchronisation calls: barriers and syncs on a team, team destruction (creation is in
//! `team.rs` and `team_members.rs`). The waiting and barrier machinery they use is the
//! context's (`context/sync.rs`).

use std::sync::atomic::Ordering;

use crate::context::team::Team;
use crate::context::Context;
use crate::error::{invalid, Result};

impl Context {
    /// The team of all PEs.
    pub fn world_team(&self) -> Team {
        Team(Some(self.inner.teams.world_team.clone()))
    }

    /// Collective over `team`: returns once every member has called it, with every member's
    /// earlier stores and atomics complete and visible. A no-op on INVALID.
    pub fn barrier(&self, team: &Team) -> Result<()> {
        self.team_sync_impl(team, "barrier")
    }

    /// Collective over `team`: synchronises the members' execution and orders memory like
    /// `barrier` (on this backend every store completes when issued, so the two coincide).
    pub fn team_sync(&self, team: &Team) -> Result<()> {
        self.team_sync_impl(team, "team_sync")
    }

    /// Collective over the world: like `barrier_all` (OpenSHMEM's `sync_all`).
    pub fn sync_all(&self) -> Result<()> {
        self.barrier_all()
    }

    fn team_sync_impl(&self, team: &Team, call: &'static str) -> Result<()> {
        let Some(t) = self.inner.team_inner(team, call)? else {
            return Ok(());
        };
        if t.slot == 0 {
            return self.barrier_all();
        }
        if t.spans {
            return self.barrier_spanning(t, call);
        }
        let mut st = t.lock();
        self.inner.record_on(t, &mut st, call, String::new());
        self.inner.backend.fence();
        self.inner.team_sync_point(t, &mut st, call, 0).map(|_| ())
    }

    /// Collective over `team`: destroys it, freeing its slot. A no-op on INVALID; the world team
    /// cannot be destroyed.
    pub fn team_destroy(&self, team: Team) -> Result<()> {
        const CALL: &str = "team_destroy";
        let Some(t) = self.inner.team_inner(&team, CALL)? else {
            return Ok(());
        };
        if t.slot == 0 {
            return Err(
                invalid(CALL, "the world team cannot be destroyed").with_pe(self.inner.rank)
            );
        }
        if t.spans {
            // Its members meet in their communicator only; once every member passed this
            // barrier, none uses it again.
            self.barrier_spanning(t, CALL)?;
            self.free_team_comm(t)?;
        } else {
            let mut st = t.lock();
            self.inner.record_on(t, &mut st, CALL, String::new());
            self.inner.team_sync_point(t, &mut st, CALL, 0)?;
            // Once a second barrier completes, every member has made its last write into this
            // PE's entries of the slot (its arrival at this barrier, seen here) and read the
            // last payload of ours it will, so clearing our copy is safe.
            self.inner.barrier_core(t, &mut st, CALL, 0, 0)?;
            let (at, len) = self.inner.area().slot_range(self.inner.rank, t.slot);
            self.inner.control.write(at, &vec![0u8; len as usize]);
        }
        self.inner.clear_device_team(t.slot)?;
        t.destroyed.store(true, Ordering::Release);
        *self.inner.teams.slots() &= !(1 << t.slot);
        Ok(())
    }
}
