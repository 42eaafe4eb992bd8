//! The context's device and communicator part: the CUDA backend's device collective and
//! barrier state, and the communicators made on demand (Open MPI for the host backend's teams
//! across nodes; NCCL for the CUDA backend's world and teams across nodes). The collectives
//! (`ops/coll/`), the stream ops and `span.rs` / `team_span.rs` go through it.

use std::sync::{Mutex, MutexGuard, OnceLock};

use super::device_state::{DeviceSync, DeviceTeams};
use super::span::Span;
use super::team_span::TeamComms;
use crate::backend::host::mpi::Mpi;

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
