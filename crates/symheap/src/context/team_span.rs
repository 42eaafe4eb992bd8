//! Teams other than the world whose members sit on more than one node: a split of the world
//! such as the PEs with one node index (the data-parallel group of a tensor-parallel job). Such
//! a team has no shared memory to meet in, so its collectives and barriers run through a
//! communicator of its own, made at the split (collective over the world, so every PE is there
//! to make it): NCCL's on the CUDA backend (`ops/coll/transport/nccl_team.rs`), Open MPI's on the host
//! backend (`ops/coll/engine/mpi.rs`), either ranked in team order (any members in any order).
//! symheap moves no byte between nodes itself. A team that spans nodes cannot be split further:
//! refused on every PE of the split. A team made by its members alone (`ops/team_members.rs`)
//! may span nodes on the CUDA backend (its NCCL id travels in the members' exchange); Open
//! MPI's split needs every PE of the job, so the host backend refuses it.

use super::comms::TeamComm;
use super::team::TeamInner;
use super::Inner;
use crate::backend::cuda::nccl::{self, Comm, UNIQUE_ID_BYTES};
use crate::backend::host::mpi::{Mpi, MpiComm};
use crate::error::{Error, ErrorKind, Result};

/// What every PE sends at a split of a world that spans nodes.
pub(crate) struct SplitHello {
    /// Team slots free on this PE.
    pub free: u64,
    /// The new team spans nodes and this PE cannot take part in its communicator (CUDA: a
    /// member without NCCL; host: any PE without Open MPI, whose split involves every PE): why.
    pub broken: Option<String>,
    /// The new team's NCCL id (from its first member, when the team spans nodes).
    pub id: Option<[u8; UNIQUE_ID_BYTES]>,
}

impl SplitHello {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = self.free.to_le_bytes().to_vec();
        b.push(self.id.is_some() as u8);
        b.extend_from_slice(&self.id.unwrap_or([0; UNIQUE_ID_BYTES]));
        b.extend_from_slice(self.broken.as_deref().unwrap_or("").as_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<SplitHello> {
        let fixed = 9 + UNIQUE_ID_BYTES;
        if b.len() < fixed {
            return None;
        }
        let free = u64::from_le_bytes(b[..8].try_into().ok()?);
        let id = (b[8] == 1).then(|| b[9..fixed].try_into().expect("sized"));
        let why = String::from_utf8_lossy(&b[fixed..]).into_owned();
        Some(SplitHello {
            free,
            broken: (!why.is_empty()).then_some(why),
            id,
        })
    }
}

fn unsupported(rank: usize, call: &'static str, why: String) -> Error {
    Error::new(Some(rank), call, ErrorKind::Unsupported(why))
}

impl Inner {
    /// Refuses a split of a team that spans nodes (only the world may be split across nodes; a
    /// team inside one node cannot hold members of several). Decided from the parent, which
    /// every PE of the parent has, so all of them fail alike.
    pub(crate) fn check_spanning_split(
        &self,
        call: &'static str,
        parent: &TeamInner,
        what: &str,
    ) -> Result<()> {
        if parent.slot != 0 {
            return Err(unsupported(
                self.rank,
                call,
                format!(
                    "{} spans nodes, and only the world may be split across nodes: split the \
                     world instead (asked for {what})",
                    parent.name
                ),
            ));
        }
        Ok(())
    }

    /// Open MPI, opened at the first need (the same answer for every later call).
    pub(crate) fn mpi(&self) -> std::result::Result<&Mpi, &String> {
        self.comms
            .mpi
            .get_or_init(|| Mpi::open(self.rank, self.world))
            .as_ref()
    }

    /// This PE's message for a split of a world that spans nodes: its free slots, and when
    /// the new team (`members`) spans nodes, whether it can take part in its communicator and
    /// (CUDA, its first member) the team's NCCL id.
    pub(crate) fn split_hello(&self, members: &[usize], spans: bool, free: u64) -> SplitHello {
        let mut hello = SplitHello {
            free,
            broken: None,
            id: None,
        };
        if spans && self.backend.as_cuda().is_none() {
            hello.broken = self.mpi().err().cloned();
            return hello;
        }
        if !spans || !members.contains(&self.rank) {
            return hello;
        }
        match nccl::load() {
            Err(why) => hello.broken = Some(why),
            Ok(api) if members[0] == self.rank => match api.unique_id() {
                Ok(id) => hello.id = Some(id),
                Err(why) => hello.broken = Some(why),
            },
            Ok(_) => {}
        }
        hello
    }

    /// Whether every PE a new team that spans nodes needs can take part in its communicator
    /// (else the same error on every PE of the split), and (CUDA) the team's NCCL id.
    pub(crate) fn spanning_id(
        &self,
        call: &'static str,
        members: &[usize],
        all: &[SplitHello],
    ) -> Result<Option<[u8; UNIQUE_ID_BYTES]>> {
        let engine = if self.backend.as_cuda().is_some() {
            "NCCL"
        } else {
            "Open MPI (launch the job with Open MPI's mpirun)"
        };
        if let Some((m, why)) = (0..all.len())
            .filter(|r| self.backend.as_cuda().is_none() || members.contains(r))
            .find_map(|m| all[m].broken.as_ref().map(|w| (m, w)))
        {
            return Err(unsupported(
                self.rank,
                call,
                format!(
                    "a team across nodes runs its collectives through {engine}, which PE {m} \
                     cannot use: {why}"
                ),
            ));
        }
        if self.backend.as_cuda().is_none() {
            return Ok(None);
        }
        all[members[0]].id.map(Some).ok_or_else(|| {
            Error::new(
                Some(self.rank),
                call,
                ErrorKind::Bootstrap(format!("PE {} sent no NCCL id", members[0])),
            )
        })
    }

    /// Makes this member's NCCL communicator of the new team `t` (collective over its members,
    /// who are all in the split), aborted when the job fails.
    pub(crate) fn make_team_comm(
        &self,
        call: &'static str,
        t: &TeamInner,
        id: &[u8; UNIQUE_ID_BYTES],
    ) -> Result<()> {
        let api = nccl::load().map_err(|e| unsupported(self.rank, call, e))?;
        self.backend.as_cuda().expect("CUDA only").bind()?;
        let comm = Comm::init(api, t.members.len(), t.me, id).map_err(|e| {
            let kind = ErrorKind::Backend(format!("setting up NCCL for {}: {e}", t.name));
            // A member whose communicator failed leaves the others waiting in theirs.
            self.boot.fail_all(kind.clone());
            Error::new(Some(self.rank), call, kind)
        })?;
        let aborter = comm.aborter();
        self.health.on_fail(Box::new(move || {
            let a = aborter.clone();
            let _ = std::thread::Builder::new()
                .name("symheap-nccl-abort".into())
                .spawn(move || a.abort());
        }));
        self.comms.team_comms().insert(t.slot, TeamComm::Nccl(comm));
        Ok(())
    }

    /// Host backend, every PE of a split of the world that spans nodes: Open MPI's split of
    /// its world (collective over it), this PE's communicator for the team when a member
    /// (`key`: its index in the team).
    pub(crate) fn split_mpi(
        &self,
        call: &'static str,
        member: bool,
        key: usize,
    ) -> Result<Option<MpiComm>> {
        let mpi = self
            .mpi()
            .map_err(|e| unsupported(self.rank, call, e.clone()))?;
        mpi.split(member, key)
            .map_err(|e| Error::new(Some(self.rank), call, ErrorKind::Backend(e)))
    }

    /// A device word of this PE's own for `t`'s barrier (the first of its slot's device flags,
    /// which no kernel of a team that spans nodes uses; zeroed when the slot is cleared).
    pub(crate) fn team_span_word(&self, t: &TeamInner) -> Result<u64> {
        let dt = self.comms.dteams.get().ok_or_else(|| {
            Error::new(
                Some(self.rank),
                "barrier",
                ErrorKind::Backend("the device team state is missing".into()),
            )
        })?;
        let own = self.mem.slot_base(self.rank).expect("own heap");
        Ok(own + dt.flags(t.slot))
    }
}
