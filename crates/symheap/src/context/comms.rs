//! The context's device and communicator part: the CUDA backend's device collective and
//! barrier state, and the communicators made on demand (Open MPI for the host backend's teams
//! across nodes; NCCL for the CUDA backend's world and teams across nodes), with the types they
//! are held in ([`Span`] and its [`Layout`], [`TeamComm`]). Making them is `span.rs`,
//! `team_span.rs` and `device_setup.rs`; the collectives (`ops/coll/`) and the stream ops use
//! them through [`Comms`].

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::device_state::{DeviceSync, DeviceTeams};
use super::team::Team;
use crate::backend::cuda::nccl::{self, Comm};
use crate::backend::host::mpi::{Mpi, MpiComm};

/// Device state and communicators, owned by the context; each is made once, when first needed.
#[derive(Default)]
pub(crate) struct Comms {
    /// Device collective state (CUDA backend only), set at init.
    pub(crate) dteams: OnceLock<DeviceTeams>,
    /// Device barrier state (CUDA backend only), set at init.
    pub(crate) dsync: OnceLock<DeviceSync>,
    /// Open MPI for host collectives over teams that span nodes, opened at the first one
    /// (or why it could not be: the same answer for every later call).
    pub(crate) mpi: OnceLock<std::result::Result<Mpi, String>>,
    /// CUDA, world spanning nodes: the node team, NCCL communicators and workspace of the
    /// collectives across nodes, made at the first one (see `span.rs`).
    pub(crate) span: Mutex<Option<Span>>,
    /// CUDA: the NCCL communicators of this PE's teams that span nodes, by slot (see
    /// `team_span.rs`).
    team_comms: Mutex<TeamComms>,
}

impl Comms {
    /// The communicators of this PE's teams that span nodes (locked: NCCL wants one call at a
    /// time on a communicator).
    pub(crate) fn team_comms(&self) -> MutexGuard<'_, TeamComms> {
        self.team_comms.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where the job's PEs sit on its nodes (the same on every PE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Nodes of the job.
    pub nodes: usize,
    /// PEs on every node when every node holds the same number, else 0.
    pub ppn: usize,
    /// This PE's node.
    pub node: usize,
    /// This PE's index among its node's PEs.
    pub local: usize,
    /// World rank r sits on node r / ppn at index r % ppn.
    pub node_major: bool,
    /// The world ranks on each node, ascending.
    pub peers: Vec<Vec<usize>>,
}

impl Layout {
    /// The layout given every PE's node index (`NodeInfo::node_of`).
    pub(crate) fn of(node_of: &[usize], rank: usize) -> Layout {
        let nodes = node_of.iter().map(|&n| n + 1).max().unwrap_or(1);
        let mut peers = vec![Vec::new(); nodes];
        for (r, &n) in node_of.iter().enumerate() {
            peers[n].push(r);
        }
        let ppn = peers[0].len();
        let ppn = if peers.iter().all(|p| p.len() == ppn) {
            ppn
        } else {
            0
        };
        let node = node_of[rank];
        Layout {
            nodes,
            ppn,
            node,
            local: peers[node].iter().position(|&r| r == rank).unwrap_or(0),
            node_major: ppn > 0 && node_of.iter().enumerate().all(|(r, &n)| n == r / ppn),
            peers,
        }
    }

    /// The world rank of the PE at index `local` on node `node`.
    pub(crate) fn rank_of(&self, node: usize, local: usize) -> usize {
        self.peers[node][local]
    }
}

/// The collectives-across-nodes state of this PE.
pub(crate) struct Span {
    pub layout: Layout,
    /// The hierarchical algorithms apply: every PE allows them (`SYMHEAP_NODES_ALGO`), every
    /// node holds the same number of PEs, and each PE reaches every PE of its node directly.
    pub hier: bool,
    /// This PE's node team (hierarchical, more than one PE per node).
    pub node_team: Option<Team>,
    /// NCCL over the PEs with this PE's node index, one per node, ranked by node
    /// (hierarchical).
    pub inter: Option<Comm>,
    /// NCCL over every PE, ranked as the world.
    pub all: Comm,
    /// A stream of symheap's own for the NCCL steps of a pipelined all_reduce, which overlap
    /// the node's steps on the caller's stream (see `ops/coll/engine/nccl.rs` and each kind's `nccl_world`).
    pub side: crate::Stream,
    /// The workspace (address, bytes): the largest asked for so far. Earlier, smaller ones
    /// stay allocated, since a CUDA graph may have captured them.
    pub work: Option<(u64, u64)>,
    /// NCCL's version code and where it was loaded from.
    pub nccl: (i32, std::path::PathBuf),
}

impl Span {
    /// What runs the world's collectives, for messages and tests.
    pub(crate) fn describe(&self) -> String {
        let l = &self.layout;
        let shape = if l.ppn > 0 {
            format!("{} nodes x {} PEs", l.nodes, l.ppn)
        } else {
            let counts: Vec<String> = l.peers.iter().map(|p| p.len().to_string()).collect();
            format!("{} nodes of {} PEs", l.nodes, counts.join(", "))
        };
        let how = if self.hier {
            "hierarchical (symheap inside each node, NCCL between nodes)"
        } else {
            "NCCL over the world"
        };
        format!(
            "{how}; {shape}; NCCL {} from {}",
            nccl::version_string(self.nccl.0),
            self.nccl.1.display()
        )
    }
}

/// The communicator of a team that spans nodes.
pub(crate) enum TeamComm {
    /// CUDA backend.
    Nccl(Comm),
    /// Host backend.
    Mpi(MpiComm),
}

/// The communicators of this PE's teams that span nodes, by team slot.
pub(crate) type TeamComms = HashMap<usize, TeamComm>;
