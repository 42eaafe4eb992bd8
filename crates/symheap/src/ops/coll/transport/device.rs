//! The device engine's transport: one launch of a collective kernel (`backend/cuda/coll/*.cu`)
//! on a stream ([`Launch`]: the team's part of the argument block filled in, the kernel found
//! by its key), a kind's plan on it ([`DevicePlan`]), and the order between launches of one
//! team on different streams ([`order_team`]). The kinds' device steps are written with it;
//! `engine/device.rs` decides when it runs.

use crate::backend::cuda::coll_args::{
    ByteKernel, CollArgs, CollDType, CollKernel, CollTeam, ReduceKernel,
};
use crate::backend::cuda::CudaBackend;
use crate::backend::ReduceOp;
use crate::context::device_state::{DeviceTeams, LL128_PART, MAX_BLOCKS, ONE_SHOT_SLOT};
use crate::context::team::TeamInner;
use crate::context::Context;
use crate::error::Result;
use crate::ops::coll::plan::{ll128_grid, ll_grid, oneshot_kernel};
use crate::stream::Stream;

/// `symheap_exchange_ll` modes (coll.cu).
pub(in crate::ops::coll) const XCHG_ALL_GATHER: i32 = 0;
pub(in crate::ops::coll) const XCHG_ALLTOALL: i32 = 1;
pub(in crate::ops::coll) const XCHG_BROADCAST: i32 = 2;

/// The kernels' code for `op`.
pub(in crate::ops::coll) fn op_code(op: ReduceOp) -> i32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Min => 1,
        ReduceOp::Max => 2,
        ReduceOp::Prod => 3,
    }
}

/// A kind's plan on the device engine (see `Collective::device_plan`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DevicePlan {
    /// The kernel touches the buffers on this PE only: then they may be any device memory of
    /// this PE's GPU, and where they lie is not part of the call.
    pub(crate) local: bool,
    /// The one-shot kernel (all_reduce, reduce_scatter).
    pub(crate) one_shot: bool,
    /// The algorithm, in the ledger's text.
    pub(crate) detail: Option<&'static str>,
}

/// One collective launch on CUDA: the team's part of every kernel's argument block, and the
/// stream.
pub(in crate::ops::coll) struct Launch<'a> {
    pub(in crate::ops::coll) cu: &'a CudaBackend,
    pub(in crate::ops::coll) team: &'a TeamInner,
    own: u64,
    dt: DeviceTeams,
    /// The stream's handle.
    pub(in crate::ops::coll) stream: u64,
}

impl<'a> Launch<'a> {
    /// A launch of `cx`'s collective on team `team` on the stream with handle `stream`.
    pub(in crate::ops::coll) fn new(
        cx: &Context,
        cu: &'a CudaBackend,
        team: &'a TeamInner,
        stream: u64,
    ) -> Self {
        Launch {
            cu,
            team,
            own: cx.inner.backend.slot_base(cx.my_pe()).expect("own heap"),
            dt: *cx
                .inner
                .comms
                .dteams
                .get()
                .expect("device teams exist on CUDA"),
            stream,
        }
    }

    /// The team's part of the argument block (coll.cu's `coll::Team`).
    fn team_part(&self) -> CollTeam {
        let s = self.team.slot;
        CollTeam {
            bases: self.own + self.dt.bases(s),
            flags: self.own + self.dt.flags(s),
            peer_flags: self.own + self.dt.peer_flags(s),
            ctl: self.own + self.dt.ctl(s),
            me: self.team.me as i32,
            n: self.team.members.len() as i32,
            timeout_ns: self.cu.wait_bound_ns(),
            error: self.cu.coll_error_word(),
        }
    }

    /// The one-shot kernel for `dtype` (all_reduce: stride 0; reduce_scatter: stride = count)
    /// through the world's scratch.
    pub(in crate::ops::coll) fn oneshot(
        &self,
        dtype: CollDType,
        src: u64,
        dest: u64,
        count: u64,
        stride: u64,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.team.members.len() as u64;
        let cu = self.cu;
        let sms = cu.sm_count().max(1) as u64;
        let esize = dtype.dtype().size() as u64;
        let aligned = src % 16 == 0 && dest % 16 == 0 && (stride * esize) % 16 == 0;
        let (kernel, grid) =
            oneshot_kernel(count * esize, n, sms, aligned, |k, d| cu.coll_tuning(k, d));
        let args = CollArgs {
            src,
            dst: dest,
            count,
            stride,
            op: op_code(op),
            ..self.scratch(kernel == ReduceKernel::ArLl128)
        };
        self.run(CollKernel::Reduce(kernel, dtype), grid, args)
    }

    /// The scratch fields of the one-shot and exchange kernels' blocks: the table of the team
    /// members' scratch addresses and my scratch, then the LL128 region's offset and parity
    /// size (`ll128`), or the scratch slot size.
    fn scratch(&self, ll128: bool) -> CollArgs {
        let mut a = CollArgs {
            peer_scratch: self.own + self.dt.scratch_table(self.team.slot),
            scratch: self.own + self.dt.scratch(),
            ..CollArgs::default()
        };
        if ll128 {
            (a.ll_off, a.part) = (self.dt.ll128(), LL128_PART);
        } else {
            a.slot_bytes = ONE_SHOT_SLOT;
        }
        a
    }

    /// Runs exchange `kernel` (from `plan::exchange_kernel`: small and mid-size all_gather,
    /// alltoall, broadcast); grids as the one-shot's LL and LL128 paths, over the bytes per
    /// member.
    pub(in crate::ops::coll) fn exchange(
        &self,
        kernel: ByteKernel,
        src: u64,
        dest: u64,
        bytes: u64,
        mode: i32,
        root: i32,
    ) -> Result<()> {
        let cu = self.cu;
        let sms = cu.sm_count().max(1) as u64;
        let tune = |k: &str, d| cu.coll_tuning(k, d);
        let ll128 = kernel == ByteKernel::ExchangeLl128;
        let args = CollArgs {
            src,
            dst: dest,
            count: bytes,
            mode,
            root,
            ..self.scratch(ll128)
        };
        let grid = if ll128 {
            ll128_grid(bytes, sms, mode != XCHG_BROADCAST, tune)
        } else {
            ll_grid(bytes, sms, tune)
        };
        self.run(CollKernel::Bytes(kernel), grid, args)
    }

    /// A copy of `bytes` from `src` to `dest` (nothing in place) by the copy engine, with no
    /// kernel and no flags: a team of one's collective.
    pub(in crate::ops::coll) fn copy_local(&self, dest: u64, src: u64, bytes: u64) -> Result<()> {
        if dest == src || bytes == 0 {
            return Ok(());
        }
        self.cu.copy_on_stream(
            dest,
            src,
            bytes,
            self.stream,
            crate::backend::cuda::Engine::CopyEngine,
        )
    }

    /// Launches `kernel` with `grid` blocks and `args`, whose team part this fills in (the
    /// kernel reads the fields its family uses; see `CollKernel`).
    pub(in crate::ops::coll) fn run(
        &self,
        kernel: CollKernel,
        grid: u64,
        args: CollArgs,
    ) -> Result<()> {
        let args = CollArgs {
            team: self.team_part(),
            ..args
        };
        let grid = grid.clamp(1, MAX_BLOCKS) as u32;
        self.cu.launch_coll_kernel(kernel, grid, self.stream, &args)
    }
}

/// Orders a launch of `team` on `stream` after the team's previous launch: the team's device
/// state admits one launch at a time, so two streams must not run its collectives at once (they
/// would corrupt each other's epochs and wait forever). On the same stream, stream order does it;
/// on another, `stream` first waits for what the previous stream has enqueued so far, without a
/// host synchronisation. Inside a capture both streams must belong to it (the wait becomes a graph
/// edge); between a capture and eager work the order is the user's (as with any graph: replay it
/// on the stream whose work it follows). The team keeps the previous stream alive (when symheap
/// made it) until the next launch on another stream, so that stream may be dropped meanwhile.
pub(crate) fn order_team(team: &TeamInner, s: &Stream, stream: u64) -> Result<()> {
    let mut last = team.last_stream.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((prev, _)) = &*last {
        let prev = *prev;
        if prev != stream {
            let (a, b) = (
                crate::backend::cuda::driver::is_capturing(prev)?,
                crate::backend::cuda::driver::is_capturing(stream)?,
            );
            if a == b {
                crate::backend::cuda::driver::stream_after(stream, prev)?;
            }
        }
    }
    if last.as_ref().is_none_or(|(prev, _)| *prev != stream) {
        *last = Some((stream, s.keep_alive()));
    }
    Ok(())
}

impl Context {
    /// Checks a collective's buffer and notes that `stream` uses it (see stream-ordered release).
    pub(in crate::ops::coll) fn check_range(
        &self,
        call: &'static str,
        addr: u64,
        bytes: u64,
        stream: &Stream,
    ) -> Result<()> {
        // An empty buffer may sit just past its allocation's end (nothing there to note).
        let off = self.inner.own_offset(addr, bytes, call)?;
        self.inner.note_stream(off, stream);
        Ok(())
    }
}
