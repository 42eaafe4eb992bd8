//! Stream collectives and barriers of a team other than the world that spans nodes (CUDA
//! backend, see `context/team_span.rs`): NCCL over the team's own communicator, whose ranks are
//! the team's member indices. Stream-ordered and capturable in a CUDA graph (the communicator
//! exists from the split on). Collective-order rule: as for every collective, the same calls in
//! the same order on every member; the team's ledger records each call.

use crate::backend::cuda::nccl::{self, Comm};
use crate::backend::ReduceOp;
use crate::context::team::TeamInner;
use crate::context::team_span::TeamComm;
use crate::context::Context;
use crate::element::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::stream::Stream;

/// NCCL's code for bytes.
const BYTES: i32 = 1;

/// A collective on a team that spans nodes: its name, ledger text and checked buffers.
struct TeamCall<'a> {
    t: &'a TeamInner,
    call: &'static str,
    args: String,
    bufs: &'a [(u64, u64)],
}

impl Context {
    /// Runs `op` on `c.t`'s communicator on `stream`, after the checks every stream collective
    /// makes (symmetric buffers, the stream's context), ordered after the team's previous
    /// collective and recorded in its ledger.
    fn team_span_run(
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

    /// all_reduce on a team that spans nodes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn all_reduce_team_span(
        &self,
        t: &TeamInner,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "all_reduce_on_stream";
        let code = self.nccl_code(CALL, dtype)?;
        let bytes = count as u64 * dtype.size() as u64;
        let args = format!("{} {count} x {dtype}, across nodes", op.name());
        let args = self.inner.coll_args(args, dest, src);
        let bufs = [(dest, bytes), (src, bytes)];
        let c = TeamCall {
            t,
            call: CALL,
            args,
            bufs: &bufs,
        };
        self.team_span_run(c, stream, |comm, raw| {
            comm.all_reduce(dest, src, count, code, op, raw)
        })
    }

    /// broadcast from team member `root` on a team that spans nodes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn broadcast_team_span(
        &self,
        t: &TeamInner,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "broadcast_on_stream";
        let bytes = count as u64 * dtype.size() as u64;
        let args = format!("root {root}, {count} x {dtype}, across nodes");
        let args = self.inner.coll_args(args, dest, src);
        let bufs = [(dest, bytes), (src, bytes)];
        let c = TeamCall {
            t,
            call: CALL,
            args,
            bufs: &bufs,
        };
        self.team_span_run(c, stream, |comm, raw| {
            comm.broadcast(dest, src, bytes as usize, BYTES, root, raw)
        })
    }

    /// all_gather of `count` elements per member on a team that spans nodes (member order).
    pub(super) fn all_gather_team_span(
        &self,
        t: &TeamInner,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "all_gather_on_stream";
        let bytes = count as u64 * dtype.size() as u64;
        let n = t.members.len() as u64;
        let mine = dest + t.me as u64 * bytes;
        let args = format!("{count} x {dtype}, across nodes");
        let args = self
            .inner
            .coll_args(args, dest, if src == mine { dest } else { src });
        let bufs = [(dest, bytes * n), (src, bytes)];
        let c = TeamCall {
            t,
            call: CALL,
            args,
            bufs: &bufs,
        };
        self.team_span_run(c, stream, |comm, raw| {
            comm.all_gather(dest, src, bytes as usize, BYTES, raw)
        })
    }

    /// reduce_scatter on a team that spans nodes: `src` holds one block of `count` elements
    /// per member.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_scatter_team_span(
        &self,
        t: &TeamInner,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "reduce_scatter_on_stream";
        let code = self.nccl_code(CALL, dtype)?;
        let bytes = count as u64 * dtype.size() as u64;
        let n = t.members.len() as u64;
        let mine = src + t.me as u64 * bytes;
        let args = format!("{} {count} x {dtype}, across nodes", op.name());
        let args = self
            .inner
            .coll_args(args, if dest == mine { src } else { dest }, src);
        let bufs = [(src, bytes * n), (dest, bytes)];
        let c = TeamCall {
            t,
            call: CALL,
            args,
            bufs: &bufs,
        };
        self.team_span_run(c, stream, |comm, raw| {
            comm.reduce_scatter(dest, src, count, code, op, raw)
        })
    }

    /// alltoall of `count` elements per pair on a team that spans nodes.
    pub(super) fn alltoall_team_span(
        &self,
        t: &TeamInner,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "alltoall_on_stream";
        let bytes = count as u64 * dtype.size() as u64;
        let total = bytes * t.members.len() as u64;
        let args = format!("{count} x {dtype}, across nodes");
        let args = self.inner.coll_args(args, dest, src);
        let bufs = [(dest, total), (src, total)];
        let c = TeamCall {
            t,
            call: CALL,
            args,
            bufs: &bufs,
        };
        self.team_span_run(c, stream, |comm, raw| comm.alltoall(dest, src, bytes, raw))
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
