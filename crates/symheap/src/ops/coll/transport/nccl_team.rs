//! What a team other than the world that spans nodes runs its collectives and barriers on
//! (see `context/team_span.rs`): on CUDA, NCCL over the team's own communicator, whose ranks are
//! the team's member indices (each collective is one call of it, its kind's
//! `Collective::nccl_team`, stream-ordered and capturable in a CUDA graph: the communicator
//! exists from the split on); on the host backend, Open MPI's (`mpi.rs`). Collective-order rule: as for every
//! collective, the same calls in the same order on every member; the team's ledger records
//! each call.

use crate::backend::cuda::nccl::Comm;
use crate::backend::cuda::CudaBackend;
use crate::backend::{AnyBackend, Backend, ReduceOp};
use crate::context::comms::TeamComm;
use crate::context::team::TeamInner;
use crate::context::Context;
use crate::element::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::stream::Stream;

impl Context {
    /// Runs `op` on the communicator of `t` (a split of the world that spans nodes) on
    /// `stream` (handle `raw`, buffers checked), ordered after the team's previous collective
    /// and, unless `args` is None (the call met already), recorded in its ledger.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::ops::coll) fn team_span_run(
        &self,
        cu: &CudaBackend,
        t: &TeamInner,
        call: &'static str,
        args: Option<String>,
        stream: &Stream,
        raw: u64,
        op: impl FnOnce(&Comm, u64) -> std::result::Result<(), String>,
    ) -> Result<()> {
        cu.bind()?;
        super::device::order_team(t, stream, raw)?;
        if let Some(args) = args {
            self.inner.record_on(t, &mut t.lock(), call, args);
        }
        let comms = self.inner.comms.team_comms();
        let Some(TeamComm::Nccl(comm)) = comms.get(&t.slot) else {
            return Err(Error::new(
                Some(self.my_pe()),
                call,
                ErrorKind::Backend(format!("{} has no NCCL communicator", t.name)),
            ));
        };
        op(comm, raw).map_err(|e| {
            let more = comm
                .async_error()
                .map_or(String::new(), |a| format!(" (NCCL reports: {a})"));
            Error::new(
                Some(self.my_pe()),
                call,
                ErrorKind::Backend(format!("NCCL on {} across nodes: {e}{more}", t.name)),
            )
        })
    }

    /// `barrier` / `team_sync` on a team that spans nodes (either backend).
    pub(in crate::ops) fn barrier_spanning(&self, t: &TeamInner, call: &'static str) -> Result<()> {
        match &self.inner.backend {
            AnyBackend::Cuda(cu) => self.barrier_team_span(cu, t, call),
            AnyBackend::Host(host) => {
                host.fence();
                self.mpi_team_point(t, call, String::new()).map(|_| ())
            }
        }
    }

    /// Frees the communicator of `t` (a team that spans nodes), at its destruction after a
    /// barrier.
    pub(in crate::ops) fn free_team_comm(&self, t: &TeamInner) -> Result<()> {
        match self.inner.comms.team_comms().remove(&t.slot) {
            Some(TeamComm::Mpi(c)) => {
                let mpi = self.inner.mpi().map_err(|e| {
                    Error::new(
                        Some(self.my_pe()),
                        "team_destroy",
                        ErrorKind::Backend(e.clone()),
                    )
                })?;
                mpi.free(c).map_err(|e| {
                    Error::new(Some(self.my_pe()), "team_destroy", ErrorKind::Backend(e))
                })
            }
            // NCCL's is destroyed when dropped.
            Some(TeamComm::Nccl(_)) | None => Ok(()),
        }
    }

    /// `barrier` / `team_sync` on a team that spans nodes: a one-element NCCL all_reduce (in
    /// this team slot's device flags, which no kernel of such a team uses) on the internal
    /// stream, waited for.
    fn barrier_team_span(&self, cu: &CudaBackend, t: &TeamInner, call: &'static str) -> Result<()> {
        cu.bind()?;
        cu.fence();
        let w = self.inner.team_span_word(t)?;
        let code = super::nccl::nccl_code(self, call, DType::I32)?;
        let s = cu.internal_stream();
        let raw = self.inner.stream_handle(s, call)?;
        self.team_span_run(cu, t, call, Some(String::new()), s, raw, |comm, raw| {
            comm.all_reduce(w, w, 1, code, ReduceOp::Sum, raw)
        })?;
        self.sync_stream(s)
    }
}
