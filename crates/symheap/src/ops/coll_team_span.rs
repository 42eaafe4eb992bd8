//! What a team other than the world that spans nodes runs its collectives and barriers on
//! (see `context/team_span.rs`): on CUDA, NCCL over the team's own communicator, whose ranks are
//! the team's member indices (each collective of `ops/coll_span.rs` is one call of it,
//! stream-ordered and capturable in a CUDA graph: the communicator exists from the split on);
//! on the host backend, Open MPI's (`ops/coll_nodes.rs`). Collective-order rule: as for every
//! collective, the same calls in the same order on every member; the team's ledger records
//! each call.

use crate::backend::cuda::nccl::{self, Comm};
use crate::backend::ReduceOp;
use crate::context::team::TeamInner;
use crate::context::team_span::TeamComm;
use crate::context::Context;
use crate::element::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::stream::Stream;

/// A collective on a team that spans nodes: its name, ledger text and checked buffers.
pub(super) struct TeamCall<'a> {
    t: &'a TeamInner,
    call: &'static str,
    args: String,
    bufs: &'a [(u64, u64)],
}

impl<'a> TeamCall<'a> {
    pub(super) fn new(
        t: &'a TeamInner,
        call: &'static str,
        args: String,
        bufs: &'a [(u64, u64)],
    ) -> Self {
        TeamCall {
            t,
            call,
            args,
            bufs,
        }
    }
}

impl Context {
    /// Runs `op` on `c.t`'s communicator on `stream`, after the checks every stream collective
    /// makes (symmetric buffers, the stream's context), ordered after the team's previous
    /// collective and recorded in its ledger.
    pub(super) fn team_span_run(
        &self,
        c: TeamCall<'_>,
        stream: &Stream,
        op: impl FnOnce(&Comm, u64) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let raw = self.inner.stream_handle(stream, c.call)?;
        for &(addr, bytes) in c.bufs {
            self.check_range(c.call, addr, bytes, stream)?;
        }
        self.inner.backend.as_cuda().expect("CUDA only").bind()?;
        super::coll_stream::order_team(c.t, stream, raw)?;
        self.inner.record_on(c.t, &mut c.t.lock(), c.call, c.args);
        let comms = self.inner.team_comms();
        let Some(TeamComm::Nccl(comm)) = comms.get(&c.t.slot) else {
            return Err(Error::new(
                Some(self.my_pe()),
                c.call,
                ErrorKind::Backend(format!("{} has no NCCL communicator", c.t.name)),
            ));
        };
        op(comm, raw).map_err(|e| {
            let more = comm
                .async_error()
                .map_or(String::new(), |a| format!(" (NCCL reports: {a})"));
            Error::new(
                Some(self.my_pe()),
                c.call,
                ErrorKind::Backend(format!("NCCL on {} across nodes: {e}{more}", c.t.name)),
            )
        })
    }

    fn nccl_code(&self, call: &'static str, dtype: DType) -> Result<i32> {
        nccl::dtype(dtype).ok_or_else(|| {
            Error::new(
                Some(self.my_pe()),
                call,
                ErrorKind::Unsupported(format!(
                    "collectives across nodes run through NCCL, which has no {dtype}"
                )),
            )
        })
    }

    /// `barrier` / `team_sync` on a team that spans nodes (either backend).
    pub(super) fn barrier_spanning(&self, t: &TeamInner, call: &'static str) -> Result<()> {
        if self.inner.backend.as_cuda().is_some() {
            self.barrier_team_span(t, call)
        } else {
            self.inner.backend.fence();
            self.mpi_team_point(t, call, String::new()).map(|_| ())
        }
    }

    /// Frees the communicator of `t` (a team that spans nodes), at its destruction after a
    /// barrier.
    pub(super) fn free_team_comm(&self, t: &TeamInner) -> Result<()> {
        match self.inner.team_comms().remove(&t.slot) {
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
    fn barrier_team_span(&self, t: &TeamInner, call: &'static str) -> Result<()> {
        let cu = self.inner.backend.as_cuda().expect("CUDA only");
        cu.bind()?;
        self.inner.backend.fence();
        let w = self.inner.team_span_word(t)?;
        let code = self.nccl_code(call, DType::I32)?;
        let s = cu.internal_stream();
        let c = TeamCall {
            t,
            call,
            args: String::new(),
            bufs: &[],
        };
        self.team_span_run(c, s, |comm, raw| {
            comm.all_reduce(w, w, 1, code, ReduceOp::Sum, raw)
        })?;
        self.sync_stream(s)
    }
}
