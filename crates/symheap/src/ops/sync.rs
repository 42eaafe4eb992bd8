//! Synchronisation calls: barriers and syncs on a team, team creation and destruction. The
//! waiting and barrier machinery they use is the context's (`context/sync.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backend::cuda::nccl::UNIQUE_ID_BYTES;
use crate::context::area::MAX_TEAMS;
use crate::context::team::{Team, TeamInner};
use crate::context::team_span::{SplitHello, TeamComm};
use crate::context::Context;
use crate::error::{invalid, Error, ErrorKind, Result};

impl Context {
    /// The team of all PEs.
    pub fn world_team(&self) -> Team {
        Team(Some(self.inner.world_team.clone()))
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

    /// Collective over `parent`: a new team of the members `start, start + stride, ...`
    /// (`size` of them, indices in `parent`). Members get the team, other members of `parent`
    /// get [`Team::INVALID`]. Recorded in `parent`'s ledger. At most 32 teams exist at once.
    /// A new team whose members are on different nodes must be a split of the world; it gets a
    /// communicator of its own for its collectives and barriers, made here: NCCL's on the CUDA
    /// backend (NCCL must load on each member), Open MPI's on the host backend (every PE must
    /// run under Open MPI's mpirun). It cannot be split further; from another parent it is
    /// refused on every member of `parent`.
    pub fn team_split_strided(
        &self,
        parent: &Team,
        start: usize,
        stride: usize,
        size: usize,
    ) -> Result<Team> {
        const CALL: &str = "team_split_strided";
        let Some(p) = self.inner.team_inner(parent, CALL)? else {
            return Ok(Team::INVALID);
        };
        let n = p.members.len();
        if size == 0 || stride == 0 || start >= n || start + (size - 1) * stride >= n {
            return Err(invalid(
                CALL,
                format!("start {start}, stride {stride}, size {size} do not select members of a team of {n}"),
            )
            .with_pe(self.inner.rank));
        }
        let members: Vec<usize> = (0..size).map(|k| p.members[start + k * stride]).collect();
        let node_of = &self.inner.node.node_of;
        let spans = members.iter().any(|&m| node_of[m] != node_of[members[0]]);
        if spans || p.spans {
            // Decided from the node map and the parent, which every PE has: every member of
            // `parent` fails alike.
            let what = format!("start {start}, stride {stride}, size {size} of {}", p.name);
            self.inner.check_spanning_split(p, &what)?;
        }
        let args = format!("start {start}, stride {stride}, size {size}");
        let free = !*self
            .inner
            .slots_used
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut nccl_id = None;
        let (split_at, common) = if p.slot == 0 && !self.inner.area().all_direct() {
            let (split_at, common, id) =
                self.split_world_across_nodes(&members, spans, args, free)?;
            nccl_id = id;
            (split_at, common)
        } else {
            let mut st = p.lock();
            self.inner.record_on(p, &mut st, CALL, args);
            let split_at = st.ledger.digest();
            let met = self.inner.team_sync_point(p, &mut st, CALL, free)?;
            (split_at, met.aux)
        };
        let common = common & ((1u64 << MAX_TEAMS) - 1);
        if common == 0 {
            return Err(Error::new(
                Some(self.inner.rank),
                CALL,
                ErrorKind::Unsupported(format!("no free team slot common to the members of {} (at most {MAX_TEAMS} teams; destroy unused teams)", p.name)),
            ));
        }
        let slot = common.trailing_zeros() as usize;
        let index = members.iter().position(|&m| m == self.inner.rank);
        // Host backend: Open MPI's split involves every PE of its world, members or not.
        let mpi_comm = if spans && self.inner.backend.as_cuda().is_none() {
            self.inner.split_mpi(index.is_some(), index.unwrap_or(0))?
        } else {
            None
        };
        let Some(me) = index else {
            return Ok(Team::INVALID);
        };
        *self
            .inner
            .slots_used
            .lock()
            .unwrap_or_else(|e| e.into_inner()) |= 1 << slot;
        let name = format!(
            "team {slot} (start {start}, stride {stride}, size {size} of {})",
            p.name
        );
        let id = crate::util::fnv1a(
            &[p.id, split_at.0, split_at.1, slot as u64]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .max(1);
        let inner = Arc::new(TeamInner::new(slot, members, me, name, id).with_spans(spans));
        if let Some(nccl_id) = nccl_id {
            self.inner.make_team_comm(&inner, &nccl_id)?;
        }
        if let Some(c) = mpi_comm {
            self.inner.team_comms().insert(slot, TeamComm::Mpi(c));
        }
        self.inner.register_team(&inner);
        // This PE's copy of the slot's member tables for the collective kernels; peers only
        // write our (zeroed) flags, so no further agreement is needed before the first launch.
        self.inner.init_device_team(&inner)?;
        Ok(Team(Some(inner)))
    }

    /// The agreement of `team_split_strided` on a world that spans nodes, whose PEs meet over
    /// the rendezvous rather than in shared memory: the split's place in the world ledger, the
    /// team slots free on every new member and, for a new team that spans nodes, its NCCL id
    /// once every member said it can use NCCL (see `context/team_span.rs`).
    #[allow(clippy::type_complexity)]
    fn split_world_across_nodes(
        &self,
        members: &[usize],
        spans: bool,
        args: String,
        free: u64,
    ) -> Result<((u64, u64), u64, Option<[u8; UNIQUE_ID_BYTES]>)> {
        const CALL: &str = "team_split_strided";
        let hello = self.inner.split_hello(members, spans, free);
        let parts = self.inner.collective(CALL, args, &hello.encode())?;
        let split_at = self.inner.world_team.lock().ledger.digest();
        let all: Vec<SplitHello> = parts
            .iter()
            .enumerate()
            .map(|(r, b)| {
                SplitHello::decode(b).ok_or_else(|| {
                    Error::new(
                        Some(self.inner.rank),
                        CALL,
                        ErrorKind::Bootstrap(format!("PE {r} sent a malformed split message")),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let common = members.iter().fold(!0u64, |c, &m| c & all[m].free);
        let id = if spans {
            self.inner.spanning_id(members, &all)?
        } else {
            None
        };
        Ok((split_at, common, id))
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
        *self
            .inner
            .slots_used
            .lock()
            .unwrap_or_else(|e| e.into_inner()) &= !(1 << t.slot);
        Ok(())
    }
}
