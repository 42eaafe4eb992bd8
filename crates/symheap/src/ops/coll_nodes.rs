//! Host collectives over a team that spans nodes: the call is checked across the job (the
//! world ledger, exchanged over the rendezvous, so diverging calls are still named on every
//! PE), then Open MPI moves the data (`backend/host/mpi.rs`: no TCP data path of symheap's
//! own). The world team, or a split of it that spans nodes (over the communicator Open MPI
//! split off for it, its ledger compared among its members over that communicator), and only
//! under Open MPI's mpirun: otherwise every PE gets the same error saying what is missing.

use crate::backend::host::mpi::{Mpi, MpiComm};
use crate::backend::ReduceOp;
use crate::context::team::{Team, TeamInner};
use crate::context::team_span::TeamComm;
use crate::context::Context;
use crate::element::DType;
use crate::error::{Error, ErrorKind, Result};

/// A collective as Open MPI runs it (byte counts for the data movers).
pub(super) enum NodesOp {
    AllReduce {
        count: usize,
        dtype: DType,
        op: ReduceOp,
    },
    Broadcast {
        bytes: usize,
        root: usize,
    },
    AllGather {
        bytes: usize,
    },
    ReduceScatter {
        count: usize,
        dtype: DType,
        op: ReduceOp,
    },
    AllToAll {
        bytes: usize,
    },
}

fn unsupported(rank: usize, call: &'static str, why: String) -> Error {
    Error::new(Some(rank), call, ErrorKind::Unsupported(why))
}

impl Context {
    /// Runs `what` through Open MPI when `team` (valid, host backend) has members on other
    /// nodes, after checking the call against every PE's ledger; returns false when the team
    /// is all on this node (the shared-memory path runs it). `dest`/`src` are checked ranges.
    pub(super) fn across_nodes(
        &self,
        team: &Team,
        call: &'static str,
        args: impl FnOnce() -> String,
        dest: u64,
        src: u64,
        what: NodesOp,
    ) -> Result<bool> {
        let inner = &self.inner;
        // The common case first, in a few loads: the whole job on one node.
        if inner.area.all_direct() || inner.backend.as_cuda().is_some() {
            return Ok(false);
        }
        let Some(t) = inner.team_inner(team, call)? else {
            return Ok(false);
        };
        if t.members
            .iter()
            .all(|&m| inner.backend.slot_base(m).is_some())
        {
            return Ok(false);
        }
        if t.spans {
            // A split of the world across nodes: its own communicator, made at the split.
            let comm = self.mpi_team_point(t, call, args())?;
            let mpi = inner
                .mpi()
                .map_err(|e| unsupported(inner.rank, call, e.clone()))?;
            return self.run_mpi(mpi, comm, t, call, dest, src, what);
        }
        let opened = inner.mpi.get_or_init(|| Mpi::open(inner.rank, inner.world));
        // Every PE says whether it has MPI with the ledger check, so all fail alike rather
        // than some entering MPI and waiting there for the others.
        let status: &[u8] = if opened.is_ok() { &[1] } else { &[0] };
        let all = inner.collective(call, args(), status)?;
        let missing: Vec<usize> = (0..all.len())
            .filter(|&r| all[r].first() != Some(&1))
            .collect();
        let mpi = match (opened, missing.is_empty()) {
            (Ok(m), true) => m,
            (Err(why), _) => return Err(unsupported(inner.rank, call, nodes_why(why))),
            (Ok(_), false) => {
                let why = format!("PEs {missing:?} could not open Open MPI (their errors say why)");
                return Err(unsupported(inner.rank, call, nodes_why(&why)));
            }
        };
        self.run_mpi(mpi, mpi.world(), t, call, dest, src, what)
    }

    /// Runs `what` through Open MPI over `comm` (whose ranks are `t`'s member indices).
    #[allow(clippy::too_many_arguments)]
    fn run_mpi(
        &self,
        mpi: &Mpi,
        comm: MpiComm,
        t: &TeamInner,
        call: &'static str,
        dest: u64,
        src: u64,
        what: NodesOp,
    ) -> Result<bool> {
        let me = t.me;
        let r = match what {
            NodesOp::AllReduce { count, dtype, op } => {
                mpi.all_reduce(comm, dest, src, count, dtype, op)
            }
            NodesOp::Broadcast { bytes, root } => mpi.broadcast(comm, dest, src, bytes, root, me),
            NodesOp::AllGather { bytes } => mpi.all_gather(comm, dest, src, bytes),
            NodesOp::ReduceScatter { count, dtype, op } => {
                mpi.reduce_scatter(comm, dest, src, count, dtype, op, me)
            }
            NodesOp::AllToAll { bytes } => mpi.alltoall(comm, dest, src, bytes),
        };
        r.map_err(|why| Error::new(Some(self.inner.rank), call, ErrorKind::Backend(why)))?;
        Ok(true)
    }

    /// A meeting point of `t`, a split of the world that spans nodes (host backend): records
    /// `call(args)` in the team's ledger and compares every member's ledger digest over the
    /// team's communicator (an MPI all_gather), so members that made different calls get the
    /// same named error instead of meeting in different MPI collectives. Returns the
    /// communicator.
    pub(super) fn mpi_team_point(
        &self,
        t: &TeamInner,
        call: &'static str,
        args: String,
    ) -> Result<MpiComm> {
        let inner = &self.inner;
        let comm = match inner.team_comms().get(&t.slot) {
            Some(TeamComm::Mpi(c)) => *c,
            _ => {
                let why = format!("{} has no Open MPI communicator", t.name);
                return Err(Error::new(Some(inner.rank), call, ErrorKind::Backend(why)));
            }
        };
        let mpi = inner
            .mpi()
            .map_err(|e| unsupported(inner.rank, call, e.clone()))?;
        let mut st = t.lock();
        inner.record_on(t, &mut st, call, args);
        let (n, h) = st.ledger.digest();
        let digest = [n, h];
        let mut all = vec![[0u64; 2]; t.members.len()];
        mpi.all_gather(
            comm,
            all.as_mut_ptr() as u64,
            digest.as_ptr() as u64,
            std::mem::size_of_val(&digest),
        )
        .map_err(|why| Error::new(Some(inner.rank), call, ErrorKind::Backend(why)))?;
        if all.iter().any(|d| *d != digest) {
            // Every member sees the same digests, so every member takes this path: exchange
            // the ledgers themselves (fixed-size, length-prefixed) and name the first
            // differing call, the same text on every member.
            const MAX: usize = 4096;
            let enc = st.ledger.encode_limited(MAX - 4);
            let mut mine = vec![0u8; MAX];
            mine[..4].copy_from_slice(&(enc.len() as u32).to_le_bytes());
            mine[4..4 + enc.len()].copy_from_slice(&enc);
            let mut every = vec![0u8; MAX * t.members.len()];
            mpi.all_gather(comm, every.as_mut_ptr() as u64, mine.as_ptr() as u64, MAX)
                .map_err(|why| Error::new(Some(inner.rank), call, ErrorKind::Backend(why)))?;
            let parts: Vec<&[u8]> = every
                .chunks(MAX)
                .map(|c| {
                    let len = u32::from_le_bytes(c[..4].try_into().expect("4 bytes")) as usize;
                    &c[4..4 + len.min(MAX - 4)]
                })
                .collect();
            let why = match st.ledger.compare_named(&parts, &t.members) {
                Err(why) => why,
                Ok(()) => format!("the ledgers of {} differ", t.name),
            };
            return Err(Error::new(
                Some(inner.rank),
                call,
                ErrorKind::CollectiveMismatch(why),
            ));
        }
        st.ledger.mark_agreed();
        Ok(comm)
    }
}

fn nodes_why(why: &str) -> String {
    format!("members of this team are on other nodes, where the host backend's collectives run through Open MPI: {why}")
}
