//! Team creation by a split: collective over the parent team, whose every member calls it with
//! the same arguments. The new team holds any members of the parent in any order
//! ([`Context::team_split_ranks`]); [`Context::team_split_strided`] is its strided form. The
//! members agree on a team slot free on all of them, the split is recorded in the parent's
//! ledger (so a member that asked for other members fails every member, naming the call), and
//! the team is installed on each member the same way as one made by its members alone
//! (`ops/team_members.rs`).

use std::sync::{Arc, MutexGuard};

use crate::backend::cuda::nccl::UNIQUE_ID_BYTES;
use crate::backend::host::mpi::MpiComm;
use crate::context::area::MAX_TEAMS;
use crate::context::comms::TeamComm;
use crate::context::team::{ranks_text, Team, TeamInner};
use crate::context::team_span::SplitHello;
use crate::context::Context;
use crate::error::{invalid, Error, ErrorKind, Result};

/// A new team as every member agreed on it, ready to install on this PE.
pub(super) struct NewTeam {
    pub call: &'static str,
    pub slot: usize,
    /// World ranks, in team order.
    pub members: Vec<usize>,
    /// This PE's index in `members`.
    pub me: usize,
    pub name: String,
    pub id: u64,
    pub spans: bool,
    /// CUDA, a team across nodes: the NCCL id of its communicator.
    pub nccl_id: Option<[u8; UNIQUE_ID_BYTES]>,
    /// Host backend, a team across nodes: this member's Open MPI communicator.
    pub mpi: Option<MpiComm>,
}

/// The lowest slot of `common` (the slots free on every member), or the error every member
/// reports alike when there is none.
pub(super) fn pick_slot(rank: usize, call: &'static str, common: u64, of: &str) -> Result<usize> {
    let common = common & ((1u64 << MAX_TEAMS) - 1);
    if common == 0 {
        return Err(Error::new(
            Some(rank),
            call,
            ErrorKind::Unsupported(format!(
                "no free team slot common to the members of {of} (at most {MAX_TEAMS} teams; \
                 destroy unused teams)"
            )),
        ));
    }
    Ok(common.trailing_zeros() as usize)
}

impl Context {
    /// Collective over `parent`: a new team of the members `start, start + stride, ...`
    /// (`size` of them, indices in `parent`). Members get the team, other members of `parent`
    /// get [`Team::INVALID`]. Recorded in `parent`'s ledger. At most 32 teams exist at once.
    /// A new team whose members are on different nodes must be a split of the world; it gets a
    /// communicator of its own for its collectives and barriers, made here: NCCL's on the CUDA
    /// backend (NCCL must load on each member), Open MPI's on the host backend (every PE must
    /// run under Open MPI's mpirun). It cannot be split further; from another parent it is
    /// refused on every member of `parent`. The same as [`team_split_ranks`](Self::team_split_ranks)
    /// with the members `start, start + stride, ...`.
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
        let indices: Vec<usize> = (0..size).map(|k| start + k * stride).collect();
        let args = format!("start {start}, stride {stride}, size {size}");
        self.split(p, CALL, &indices, args.clone(), args)
    }

    /// Collective over `parent` (every member of `parent` calls it, in the same order as its
    /// other collective calls on `parent`, with the same list): a new team of the members
    /// `ranks` of `parent` (member indices of `parent`, in any order, each at most once), whose
    /// member `i` is `ranks[i]`. Members get the team, other members of `parent` get
    /// [`Team::INVALID`]. Recorded in `parent`'s ledger: a member that passed another list
    /// fails every member of `parent` with the call named. At most 32 teams exist at once.
    ///
    /// Across nodes it is [`team_split_strided`](Self::team_split_strided)'s rule: a team whose
    /// members are on different nodes must be a split of the world, gets a communicator of its
    /// own (NCCL's on the CUDA backend, Open MPI's on the host backend, ranked in team order),
    /// and cannot be split further.
    pub fn team_split_ranks(&self, parent: &Team, ranks: &[usize]) -> Result<Team> {
        const CALL: &str = "team_split_ranks";
        let Some(p) = self.inner.team_inner(parent, CALL)? else {
            return Ok(Team::INVALID);
        };
        check_ranks(ranks, p.members.len(), &p.name)
            .map_err(|why| invalid(CALL, why).with_pe(self.inner.rank))?;
        // The whole list goes into the ledger text (two lists alike up to the display's cut must
        // still differ there); the label is what names the team.
        let full: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
        let args = format!("ranks [{}]", full.join(", "));
        self.split(
            p,
            CALL,
            ranks,
            args,
            format!("members {}", ranks_text(ranks)),
        )
    }

    /// The split of `p` into its members `indices` (in that order), for `call` recorded with
    /// `args`; `label` describes the members in the team's name.
    fn split(
        &self,
        p: &Arc<TeamInner>,
        call: &'static str,
        indices: &[usize],
        args: String,
        label: String,
    ) -> Result<Team> {
        let members: Vec<usize> = indices.iter().map(|&i| p.members[i]).collect();
        let node_of = &self.inner.node.node_of;
        let spans = members.iter().any(|&m| node_of[m] != node_of[members[0]]);
        if spans || p.spans {
            // Decided from the node map and the parent, which every PE has: every member of
            // `parent` fails alike.
            self.inner
                .check_spanning_split(call, p, &format!("{label} of {}", p.name))?;
        }
        let creating = self.creating();
        let free = !*self.inner.teams.slots();
        let mut nccl_id = None;
        let (split_at, common) = if p.slot == 0 && !self.inner.area().all_direct() {
            let (split_at, common, id) =
                self.split_world_across_nodes(call, &members, spans, args, free)?;
            nccl_id = id;
            (split_at, common)
        } else {
            let mut st = p.lock();
            self.inner.record_on(p, &mut st, call, args);
            let split_at = st.ledger.digest();
            let met = self.inner.team_sync_point(p, &mut st, call, free)?;
            (split_at, met.aux)
        };
        let slot = pick_slot(self.inner.rank, call, common, &p.name)?;
        let index = members.iter().position(|&m| m == self.inner.rank);
        // Host backend: Open MPI's split involves every PE of its world, members or not; its
        // key orders the communicator's ranks as the team's.
        let mpi = if spans && self.inner.backend.is_host() {
            self.inner
                .split_mpi(call, index.is_some(), index.unwrap_or(0))?
        } else {
            None
        };
        let Some(me) = index else {
            return Ok(Team::INVALID);
        };
        let id = crate::util::fnv1a(
            &[p.id, split_at.0, split_at.1, slot as u64]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .max(1);
        let name = format!("team {slot} ({label} of {})", p.name);
        let made = NewTeam {
            call,
            slot,
            members,
            me,
            name,
            id,
            spans,
            nccl_id,
            mpi,
        };
        self.install_team(made, creating)
    }

    /// Team creation on this PE, one at a time: the slots read free stay free until the new
    /// team claims one. A thread creating a team waits here while another thread of this PE
    /// creates one (make teams from one thread, in the same order on every member).
    pub(super) fn creating(&self) -> MutexGuard<'_, ()> {
        self.inner.teams.creating()
    }

    /// Claims the agreed slot on this PE and sets up the team: its communicator when it spans
    /// nodes, its record for the watch, its device member tables. `_creating` is held until
    /// the slot is claimed.
    pub(super) fn install_team(&self, t: NewTeam, _creating: MutexGuard<'_, ()>) -> Result<Team> {
        *self.inner.teams.slots() |= 1 << t.slot;
        let inner =
            Arc::new(TeamInner::new(t.slot, t.members, t.me, t.name, t.id).with_spans(t.spans));
        if let Some(nccl_id) = t.nccl_id {
            self.inner.make_team_comm(t.call, &inner, &nccl_id)?;
        }
        if let Some(c) = t.mpi {
            self.inner
                .comms
                .team_comms()
                .insert(t.slot, TeamComm::Mpi(c));
        }
        self.inner.register_team(&inner);
        // This PE's copy of the slot's member tables for the collective kernels; peers only
        // write our (zeroed) flags, so no further agreement is needed before the first launch.
        self.inner.init_device_team(&inner)?;
        Ok(Team(Some(inner)))
    }

    /// The agreement of a split of a world that spans nodes, whose PEs meet over the
    /// rendezvous rather than in shared memory: the split's place in the world ledger, the
    /// team slots free on every new member and, for a new team that spans nodes, its NCCL id
    /// once every member said it can use NCCL (see `context/team_span.rs`).
    #[allow(clippy::type_complexity)]
    fn split_world_across_nodes(
        &self,
        call: &'static str,
        members: &[usize],
        spans: bool,
        args: String,
        free: u64,
    ) -> Result<((u64, u64), u64, Option<[u8; UNIQUE_ID_BYTES]>)> {
        let hello = self.inner.split_hello(members, spans, free);
        let parts = self.inner.collective(call, args, Some(&hello.encode()))?;
        let split_at = self.inner.teams.world_team.lock().ledger.digest();
        let all: Vec<SplitHello> = parts
            .iter()
            .enumerate()
            .map(|(r, b)| {
                SplitHello::decode(b).ok_or_else(|| {
                    Error::new(
                        Some(self.inner.rank),
                        call,
                        ErrorKind::Bootstrap(format!("PE {r} sent a malformed split message")),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let common = members.iter().fold(!0u64, |c, &m| c & all[m].free);
        let id = if spans {
            self.inner.spanning_id(call, members, &all)?
        } else {
            None
        };
        Ok((split_at, common, id))
    }
}

/// Why `ranks` is not a list of distinct members of a team of `n` (`team` names it), if it is
/// not.
pub(super) fn check_ranks(
    ranks: &[usize],
    n: usize,
    team: &str,
) -> std::result::Result<(), String> {
    if ranks.is_empty() {
        return Err("the list of ranks is empty".into());
    }
    if let Some(&r) = ranks.iter().find(|&&r| r >= n) {
        return Err(format!("rank {r} is not a member of {team} ({n} members)"));
    }
    let mut seen = vec![false; n];
    for &r in ranks {
        if std::mem::replace(&mut seen[r], true) {
            return Err(format!("rank {r} appears twice in the list"));
        }
    }
    Ok(())
}
