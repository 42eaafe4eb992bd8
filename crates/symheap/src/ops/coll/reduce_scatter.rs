//! reduce_scatter: the source holds one block per member; member j's destination gets the
//! reduction of every member's block j. Its entries and its steps on every engine.
//!
//! Host engine: each member reduces its block from every member between two barriers. Device
//! engine: on the team that owns the scratch, while the `(n - 1) × count` elements a member
//! sends take at most 4 MiB, one-shot (every member pushes each block into its owner's
//! scratch; one synchronisation); otherwise each member pulls its block from every member.
//! Across nodes (node-major layouts): a strided copy into the workspace, in the node, then
//! between nodes.
//!
//! In place when the destination is exactly this PE's block of the source; the ledger records
//! it as in place. Collective-order rule: every member of the team calls it in the same order
//! with the same count, dtype and op.

use super::params::Params;
use super::plan::{grid_for, rs_one_shot, stays_local, StreamColl};
use super::request::{Collective, OneCall, Plan, Request};
use super::transport::device::{op_code, DevicePlan, Launch};
use super::transport::host::Coll;
use super::transport::nccl::{nccl_code, SpanCall};
use crate::backend::cuda::coll_args::{CollArgs, CollDType, CollKernel, ReduceKernel};
use crate::backend::cuda::CudaBackend;
use crate::backend::ReduceOp;
use crate::context::team::Team;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::Result;
use crate::ops::alias::CollKind;
use crate::stream::Stream;
use crate::SymmetricBuffer;

/// reduce_scatter with its reduction.
pub(crate) struct ReduceScatter {
    pub(crate) op: ReduceOp,
}

impl Collective for ReduceScatter {
    const NAME: &'static str = "reduce_scatter";
    const STREAM_NAME: &'static str = "reduce_scatter_on_stream";
    const SHAPE: CollKind = CollKind::ReduceScatter;

    fn from_params(p: &mut Params<'_>) -> Result<Self> {
        Ok(ReduceScatter { op: p.op()? })
    }

    fn text(&self, _: &Context, count: usize, dtype: DType) -> String {
        format!("{} {count} x {dtype}", self.op.name())
    }

    fn reduces(&self) -> bool {
        true
    }

    fn host(&self, cx: &Context, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, bytes, op) = (p.hd, p.hs, p.bytes, self.op);
        let nums = [
            r.count as u64,
            r.dtype as u64,
            op as u64,
            0,
            0,
            0,
            dest,
            src,
        ];
        let args = || r.text(cx, p, None, false);
        let Some(c) = Coll::begin(&cx.inner, r.team, Self::NAME, nums, args)? else {
            return Ok(());
        };
        let block = src + (c.me() * bytes) as u64;
        // In place (the host form's dest == src), the result goes to this PE's block.
        let out = if dest == src { block } else { dest };
        c.reduce_from_all(out, block, r.count, r.dtype, op)?;
        c.end()
    }

    fn one_call(&self) -> OneCall {
        OneCall::ReduceScatter(self.op)
    }

    /// Node-major layouts: the blocks reordered into the workspace, reduce-scattered in the
    /// node, then between nodes; otherwise NCCL over the world.
    fn nccl_world(&self, c: &mut SpanCall<'_>, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, count, dtype, op) = (r.dest, r.src, r.count, r.dtype, self.op);
        let code = nccl_code(c.ctx, c.call, dtype)?;
        let (bytes, world) = (p.bytes as u64, p.n() as u64);
        if bytes == 0 {
            return Ok(());
        }
        let l = c.sp().layout.clone();
        if !c.sp().hier || !l.node_major || !crate::backend::cuda::coll_supports(dtype) {
            return c.nccl(c.all().reduce_scatter(dest, src, count, code, op, c.raw));
        }
        if l.ppn == 1 {
            return c.nccl(c.inter().reduce_scatter(dest, src, count, code, op, c.raw));
        }
        let (k, ppn) = (l.nodes as u64, l.ppn as u64);
        let w2 = c.work(world * bytes + k * bytes)?;
        let w1 = w2 + world * bytes;
        // w2[j][i]: the block for the PE with node index j on node i.
        for j in 0..ppn {
            c.strided(
                w2 + j * k * bytes,
                bytes,
                src + j * bytes,
                ppn * bytes,
                bytes,
                k,
            )?;
        }
        // w1[i]: this node's reduction of the block for the PE with this node index on node i.
        let node = c.node();
        let kc = k as usize * count;
        c.ctx
            .reduce_scatter_on_stream(&node, w1, w2, kc, dtype, op, c.stream)?;
        c.nccl(c.inter().reduce_scatter(dest, w1, count, code, op, c.raw))
    }

    fn device_plan(&self, cu: &CudaBackend, r: &Request<'_, Self>, p: &Plan<'_>) -> DevicePlan {
        // One-shot reaches only scratch on peers: places are not part of the call. Otherwise
        // in place (the result in my block of src) is the same call on every PE.
        let bytes = p.bytes as u64;
        let one_shot = rs_one_shot(cu, r.team, bytes);
        DevicePlan {
            local: stays_local(cu, StreamColl::ReduceScatter, r.team, bytes),
            one_shot,
            detail: Some(if one_shot { "one-shot" } else { "two-round" }),
        }
    }

    fn device(
        &self,
        _cx: &Context,
        l: &Launch<'_>,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        dp: &DevicePlan,
    ) -> Result<()> {
        let dt = CollDType::of(r.dtype).expect("accepted for the kernels' dtypes only");
        let c = r.count as u64;
        if dp.one_shot {
            return l.oneshot(dt, r.src, r.dest, c, c, self.op);
        }
        let grid = grid_for(l.cu, p.bytes as u64 * p.n() as u64, 16 << 10, 1, 2);
        let args = CollArgs {
            src: r.src,
            dst: r.dest,
            count: c,
            op: op_code(self.op),
            ..CollArgs::default()
        };
        l.run(
            CollKernel::Reduce(ReduceKernel::ReduceScatter, dt),
            grid,
            args,
        )
    }
}

impl Context {
    /// Collective over `team`: `src` holds `n × count` elements on every member; member j's
    /// `dest` gets the reduction of every member's block j. In place when
    /// `dest == src + me × count` (the result replaces this PE's own block of `src`); any other
    /// overlap is an invalid argument (see `ops/alias.rs`).
    pub fn reduce_scatter_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let kind = ReduceScatter { op };
        self.run_collective(Request::host(kind, team, dest, src, count, dtype))
    }

    /// Collective over `team`: `src` holds `n × count` elements; member j's `dest` gets the
    /// reduction of every member's block j, enqueued on `stream`. In place when
    /// `dest == src + me × count`; any other overlap is an invalid argument. On the world team
    /// while the `(n - 1) × count` elements a member sends take at most 4 MiB: one-shot (every
    /// member pushes each block into its owner's scratch; one synchronisation); otherwise each
    /// member pulls its block from every member.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let kind = ReduceScatter { op };
        self.run_collective(Request::host(kind, team, dest, src, count, dtype).on(stream))
    }

    /// Typed `reduce_scatter_raw` on buffers (`src` holds `n × count`).
    pub fn reduce_scatter<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_raw(team, dest.addr(), src.addr(), count, T::DTYPE, op)
    }
}
