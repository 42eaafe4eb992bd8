//! Host collectives over a team that spans nodes: the call is checked across the job (the
//! world ledger, exchanged over the rendezvous, so diverging calls are still named on every
//! PE), then Open MPI moves the data (`backend/host/mpi.rs`: no TCP data path of symheap's
//! own). Only the world team, and only under Open MPI's mpirun: otherwise every PE gets the
//! same error saying what is missing.

use crate::backend::host::mpi::Mpi;
use crate::backend::ReduceOp;
use crate::context::team::Team;
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
        if t.members.len() != inner.world {
            return Err(unsupported(
                inner.rank,
                call,
                format!(
                    "{} spans nodes; across nodes the host backend runs collectives of the world team only \
                     (through Open MPI)",
                    t.name
                ),
            ));
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
        let me = inner.rank;
        let r = match what {
            NodesOp::AllReduce { count, dtype, op } => mpi.all_reduce(dest, src, count, dtype, op),
            NodesOp::Broadcast { bytes, root } => mpi.broadcast(dest, src, bytes, root, me),
            NodesOp::AllGather { bytes } => mpi.all_gather(dest, src, bytes),
            NodesOp::ReduceScatter { count, dtype, op } => {
                mpi.reduce_scatter(dest, src, count, dtype, op, t.me)
            }
            NodesOp::AllToAll { bytes } => mpi.alltoall(dest, src, bytes),
        };
        r.map_err(|why| Error::new(Some(me), call, ErrorKind::Backend(why)))?;
        Ok(true)
    }
}

fn nodes_why(why: &str) -> String {
    format!("members of this team are on other nodes, where the host backend's collectives run through Open MPI: {why}")
}
