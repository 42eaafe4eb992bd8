//! Synchronisation calls: barriers and syncs on a team, team destruction (creation is in
//! `team.rs` and `team_members.rs`). The waiting and barrier machinery they use is the
//! context's (`context/sync.rs`).

use std::sync::atomic::Ordering;

use crate::context::team::Team;
use crate::context::Context;
use crate::error::{invalid, Error, ErrorKind, Result};

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

    /// Collective over `team`: the largest of the members' `value`s, met on the host with no
    /// device work (small control data, such as the number of rounds every member of a staged
    /// collective must run, which each member alone does not know). Every member calls it in
    /// the same order with its other collectives (the call is ledger-checked). On INVALID it
    /// returns `value`; a team whose members span nodes is `Unsupported` (its members share no
    /// memory to meet in; the world team is not: it meets through the bootstrap).
    pub fn team_max(&self, team: &Team, value: u64) -> Result<u64> {
        const CALL: &str = "team_max";
        let Some(t) = self.inner.team_inner(team, CALL)? else {
            return Ok(value);
        };
        if t.slot == 0 {
            let parts = self.all_gather_bytes(&value.to_le_bytes())?;
            return Ok(parts.iter().fold(value, |m, p| m.max(le_u64(p))));
        }
        if t.spans {
            return Err(Error::new(
                Some(self.my_pe()),
                CALL,
                ErrorKind::Unsupported("a team whose members span nodes".into()),
            ));
        }
        let mut st = t.lock();
        self.inner.record_on(t, &mut st, CALL, String::new());
        let mut stage = |at: u64| {
            self.inner.control.write(at, &value.to_le_bytes());
            Ok(0)
        };
        self.inner
            .team_sync_staged(t, &mut st, CALL, 0, false, &mut stage)?;
        // The members' payloads stay readable until this PE's barrier after next on the team.
        let a = self.inner.area();
        let mut top = value;
        for &m in &t.members {
            let mut w = [0u8; 8];
            self.inner
                .control
                .read(a.payload(m, t.slot, st.epoch), &mut w);
            top = top.max(u64::from_le_bytes(w));
        }
        Ok(top)
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

/// The first eight bytes of `p` as a little-endian u64 (zeros where `p` is shorter).
fn le_u64(p: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = p.len().min(8);
    w[..n].copy_from_slice(&p[..n]);
    u64::from_le_bytes(w)
}
