//! all_reduce: every member's destination gets the element-wise reduction of all members'
//! sources. Its entries and its steps on every engine.
//!
//! Host engine: one-shot (every member reduces the whole vector from every peer) for small
//! messages and two-shot (reduce-scatter, then all-gather of the reduced chunks) for large
//! ones, the same structure the GPU kernels use; up to `PAYLOAD` bytes in one pass through the
//! entry barrier's payloads. Device engine: one-shot through the scratch of the team that owns
//! it while `(n - 1) × bytes <= 4 MiB`, two-shot otherwise. Across nodes: reduce-scatter in
//! the node, all_reduce of each PE's shard between nodes (pipelined), all-gather in the node.
//!
//! Collective-order rule: every member of the team calls it in the same order with the same
//! count, dtype and op; symheap checks it at the entry barrier (the stream form: at the next
//! host collective point).

use super::params::Params;
use super::plan::{ar_one_shot, grid_for, stays_local, StreamColl};
use super::request::{Collective, OneCall, Plan, Request};
use super::transport::device::{op_code, DevicePlan, Launch};
use super::transport::host::{one_pass, with_sources, Coll, INLINE_MEMBERS};
use super::transport::nccl::{nccl_code, SpanCall};
use super::{AllReduceAlgo, NODES_ALL_REDUCE_SMALL as SMALL, ONE_SHOT_MAX_BYTES};
use crate::backend::cuda::coll_args::{CollArgs, CollDType, CollKernel, ReduceKernel};
use crate::backend::cuda::driver;
use crate::backend::cuda::CudaBackend;
use crate::backend::ReduceOp;
use crate::context::area::INLINE;
use crate::context::team::Team;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::Result;
use crate::ops::alias::CollKind;
use crate::stream::Stream;
use crate::SymmetricBuffer;

/// Bytes per node member of one piece of a pipelined all_reduce across nodes, and the most
/// pieces.
const PIECE: u64 = 4 << 20;
const MAX_PIECES: u64 = 16;

/// all_reduce with its reduction and algorithm request.
pub(crate) struct AllReduce {
    pub(crate) op: ReduceOp,
    pub(crate) algo: AllReduceAlgo,
}

impl Collective for AllReduce {
    const NAME: &'static str = "all_reduce";
    const STREAM_NAME: &'static str = "all_reduce_on_stream";
    const SHAPE: CollKind = CollKind::AllReduce;

    fn from_params(p: &mut Params<'_>) -> Result<Self> {
        Ok(AllReduce {
            op: p.op()?,
            algo: p.algo()?,
        })
    }

    fn text(&self, _: &Context, count: usize, dtype: DType) -> String {
        format!("{} {count} x {dtype}", self.op.name())
    }

    fn reduces(&self) -> bool {
        true
    }

    fn host(&self, cx: &Context, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, count, dtype, op) = (r.dest, r.src, r.count, r.dtype, self.op);
        let bytes = p.bytes;
        // One-shot reads peers' sources while they write their destinations, so in place it
        // would read half-reduced data; two-shot only ever writes chunks no one else reads.
        let algo = match self.algo {
            // One pass through the payloads: in place is fine (every source is copied before
            // any destination is written).
            AllReduceAlgo::Auto | AllReduceAlgo::OneShot if one_pass(cx, bytes) => {
                AllReduceAlgo::OneShot
            }
            AllReduceAlgo::Auto if dest != src && bytes <= ONE_SHOT_MAX_BYTES => {
                AllReduceAlgo::OneShot
            }
            AllReduceAlgo::Auto | AllReduceAlgo::TwoShot => AllReduceAlgo::TwoShot,
            AllReduceAlgo::OneShot if dest == src => AllReduceAlgo::TwoShot,
            AllReduceAlgo::OneShot => AllReduceAlgo::OneShot,
        };
        let nums = [
            count as u64,
            dtype as u64,
            op as u64,
            algo as u64,
            0,
            0,
            dest,
            src,
        ];
        let args = || r.text(cx, p, Some(algo.name()), false);
        if algo == AllReduceAlgo::OneShot && one_pass(cx, bytes) {
            return self.one_pass(cx, r, nums, args);
        }
        let Some(mut c) = Coll::begin(&cx.inner, r.team, Self::NAME, nums, args)? else {
            return Ok(());
        };
        if algo == AllReduceAlgo::OneShot {
            c.reduce_from_all(dest, src, count, dtype, op)?;
            return c.end();
        }
        let n = c.n();
        let per = count.div_ceil(n);
        let chunk = |j: usize| {
            let lo = (j * per).min(count);
            let hi = ((j + 1) * per).min(count);
            ((lo * dtype.size()) as u64, hi - lo)
        };
        let (off, len) = chunk(c.me());
        c.reduce_from_all(dest + off, src + off, len, dtype, op)?;
        c.barrier()?;
        for j in 0..n {
            if j != c.me() {
                let (off, len) = chunk(j);
                c.copy(dest + off, c.at(j, dest + off), len * dtype.size())?;
            }
        }
        c.end()
    }

    fn one_call(&self) -> OneCall {
        OneCall::AllReduce(self.op)
    }

    fn nccl_world(&self, c: &mut SpanCall<'_>, r: &Request<'_, Self>, _: &Plan<'_>) -> Result<()> {
        let (dest, src, count, dtype, op) = (r.dest, r.src, r.count, r.dtype, self.op);
        let code = nccl_code(c.ctx, c.call, dtype)?;
        let es = dtype.size() as u64;
        let bytes = count as u64 * es;
        let (hier, ppn) = (c.sp().hier, c.sp().layout.ppn);
        if count == 0 {
            return Ok(());
        }
        if !hier || !crate::backend::cuda::coll_supports(dtype) {
            return c.nccl(c.all().all_reduce(dest, src, count, code, op, c.raw));
        }
        if ppn == 1 {
            return c.nccl(c.inter().all_reduce(dest, src, count, code, op, c.raw));
        }
        let node = c.node();
        let shard = if bytes <= SMALL { 0 } else { count / ppn };
        let main = shard * ppn;
        if shard > 0 {
            let w = c.work(shard as u64 * es)?;
            let red = Reduction {
                dest,
                src,
                w,
                dtype,
                code,
                op,
            };
            pipelined(c, &node, &red, shard)?;
        }
        if main < count {
            let (d, s) = (dest + main as u64 * es, src + main as u64 * es);
            let rest = count - main;
            let auto = AllReduceAlgo::Auto;
            c.ctx
                .all_reduce_on_stream(&node, d, s, rest, dtype, op, auto, c.stream)?;
            c.nccl(c.inter().all_reduce(d, d, rest, code, op, c.raw))?;
        }
        Ok(())
    }

    fn device_plan(&self, cu: &CudaBackend, r: &Request<'_, Self>, p: &Plan<'_>) -> DevicePlan {
        // The algorithm is a request, as on the host backend: one-shot runs through the
        // scratch of the team that owns it, so another team or a message larger than a slot
        // goes two-shot. Where the buffers lie matters only to kernels that reach peers'
        // copies of them: the one-shot one reaches only scratch, so PEs may pass different
        // (or ordinary) buffers.
        let bytes = p.bytes as u64;
        let one_shot = ar_one_shot(cu, r.team, bytes, self.algo);
        DevicePlan {
            local: stays_local(cu, StreamColl::AllReduce(self.algo), r.team, bytes),
            one_shot,
            detail: Some(if one_shot { "one-shot" } else { "two-shot" }),
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
        let count = r.count as u64;
        if dp.one_shot {
            return l.oneshot(dt, r.src, r.dest, count, 0, self.op);
        }
        let grid = grid_for(l.cu, p.bytes as u64, 64 << 10, 16, 2);
        let args = CollArgs {
            src: r.src,
            dst: r.dest,
            count,
            op: op_code(self.op),
            ..CollArgs::default()
        };
        l.run(CollKernel::Reduce(ReduceKernel::ArTwoshot, dt), grid, args)
    }
}

impl AllReduce {
    /// A small all_reduce in one pass: every member's source rides on its arrival at the
    /// entry barrier (after which the ledgers are known to agree), and each member reduces
    /// the payloads into its own destination. No exit barrier: on return this PE's
    /// destination is complete and its source reusable (what MPI_Allreduce and OpenSHMEM
    /// promise; order other PEs' accesses to it with a barrier, as for any heap data). Nobody
    /// reads this PE's heap, and its payload stays until its barrier after next, which needs
    /// every member's arrival at the next one.
    fn one_pass(
        &self,
        cx: &Context,
        r: &Request<'_, Self>,
        nums: [u64; 8],
        args: impl FnOnce() -> String,
    ) -> Result<()> {
        let (dest, src, count, dtype) = (r.dest, r.src, r.count, r.dtype);
        let bytes = count * dtype.size();
        let be = &cx.inner.backend;
        let inline = if bytes as u64 <= INLINE && r.team.n_pes() <= INLINE_MEMBERS {
            bytes
        } else {
            0
        };
        // Inline, this PE's source is read once, onto the stack, and reduced from there.
        let mut mine = [0u64; INLINE as usize / 8];
        let mut stage = |at: u64| {
            if inline > 0 {
                let m = &mut bytemuck::cast_slice_mut(&mut mine)[..bytes];
                be.read_bytes(src, m)?;
                cx.inner.control.write(at, m);
                return Ok(bytes);
            }
            be.copy(at, src, bytes).map(|_| 0)
        };
        let Some(c) = Coll::begin_staged(
            &cx.inner,
            r.team,
            Self::NAME,
            nums,
            args,
            inline,
            &mut stage,
        )?
        else {
            return Ok(());
        };
        if count == 0 {
            return Ok(());
        }
        if inline > 0 {
            let mine = &bytemuck::cast_slice(&mine)[..bytes];
            return c.reduce_inline(dest, mine, dtype, self.op);
        }
        with_sources(
            c.n(),
            |j| c.payload(j),
            |srcs| be.reduce(dest, srcs, count, dtype, self.op),
        )
    }
}

/// An all_reduce's buffers and reduction across nodes: the caller's, the workspace, symheap's
/// and NCCL's codes for the dtype, the op.
struct Reduction {
    dest: u64,
    src: u64,
    w: u64,
    dtype: DType,
    code: i32,
    op: ReduceOp,
}

/// The shard part of a hierarchical all_reduce: `shard` elements per node member, split into
/// pieces of about [`PIECE`] bytes per member. Each piece is reduce-scattered in the node on
/// the caller's stream, all-reduced between nodes by NCCL on the span's own stream, and
/// all-gathered in the node on the caller's stream again; events order each piece's steps, so
/// NCCL's step of one piece overlaps the node's steps of the neighbouring ones. The caller's
/// stream ends waiting for every NCCL step (under capture: fork and join).
fn pipelined(c: &SpanCall<'_>, node: &Team, r: &Reduction, shard: usize) -> Result<()> {
    let (cx, stream) = (c.ctx, c.stream);
    let es = r.dtype.size() as u64;
    let ppn = node.n_pes();
    let pieces = (shard as u64 * es).div_ceil(PIECE).clamp(1, MAX_PIECES) as usize;
    let p0 = shard / pieces;
    let side = c.span().side.raw();
    let piece = |k: usize| {
        let len = if k + 1 == pieces {
            shard - p0 * (pieces - 1)
        } else {
            p0
        };
        // Element offsets: of the piece in dest/src, and of its shard in the workspace.
        ((ppn * p0 * k) as u64 * es, (p0 * k) as u64 * es, len)
    };
    let gather = |k: usize| {
        let (at, wat, len) = piece(k);
        cx.all_gather_on_stream(node, r.dest + at, r.w + wat, len, r.dtype, stream)
    };
    let ev = |s: u64| driver::DoneEvent::record(s).map_err(|e| e.during(c.call));
    let mut reduced = Vec::with_capacity(pieces);
    for k in 0..pieces {
        let (at, wat, len) = piece(k);
        let w = r.w + wat;
        cx.reduce_scatter_on_stream(node, w, r.src + at, len, r.dtype, r.op, stream)?;
        if pieces == 1 {
            c.nccl(c.inter().all_reduce(w, w, len, r.code, r.op, c.raw))?;
            return gather(0);
        }
        driver::stream_wait(side, &ev(c.raw)?)?;
        c.nccl(c.inter().all_reduce(w, w, len, r.code, r.op, side))?;
        reduced.push(ev(side)?);
        if k >= 1 {
            driver::stream_wait(c.raw, &reduced[k - 1])?;
            gather(k - 1)?;
        }
    }
    driver::stream_wait(c.raw, &reduced[pieces - 1])?;
    gather(pieces - 1)
}

impl Context {
    /// Collective over `team`: every member's `dest` gets the element-wise reduction of all
    /// members' `src` (`count` elements). In place when `dest == src`; any other overlap is an
    /// invalid argument (see `ops/alias.rs`). On the host backend one-shot up to 64 KiB out of
    /// place, two-shot above; `algo` is a request (one-shot in place runs two-shot).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<()> {
        let kind = AllReduce { op, algo };
        self.run_collective(Request::host(kind, team, dest, src, count, dtype))
    }

    /// Collective over `team`: all_reduce of `count` elements of `dtype` from `src` into `dest`
    /// (symmetric addresses; in place when `dest == src`, any other overlap an invalid argument),
    /// enqueued on `stream`. One-shot through a scratch buffer on the world team while
    /// `(n - 1) × bytes <= 4 MiB`, two-shot otherwise; `algo` overrides. One-shot data carries
    /// its own flags (one one-way latency, no fence): LL up to 32 KiB, LL128 above when `src`
    /// and `dest` are 16-byte aligned (else one flag round). f32, f16, bf16 and i32 run on the
    /// GPU; other dtypes fall back to the host-driven path (synchronous).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        algo: AllReduceAlgo,
        stream: &Stream,
    ) -> Result<()> {
        let kind = AllReduce { op, algo };
        self.run_collective(Request::host(kind, team, dest, src, count, dtype).on(stream))
    }

    /// Typed `all_reduce_raw` on buffers, algorithm chosen by size.
    pub fn all_reduce<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let (d, s, auto) = (dest.addr(), src.addr(), AllReduceAlgo::Auto);
        self.all_reduce_raw(team, d, s, count, T::DTYPE, op, auto)
    }
}
