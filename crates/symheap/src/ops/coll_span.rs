//! Stream collectives of the world team when it spans nodes (CUDA backend). Hierarchical where
//! the layout allows (see `context/span.rs`): symheap's kernels among the PEs of each node, NCCL
//! between nodes over the communicator of the PEs with the same node index (one per node);
//! otherwise NCCL over the whole world. Stream-ordered, and capturable in a CUDA graph once the
//! first collective across nodes (which sets up NCCL) and the largest workspace ran eagerly.
//!
//! - all_reduce: reduce_scatter in the node into the workspace, all_reduce of each PE's shard
//!   between nodes, all_gather in the node, pipelined in pieces (NCCL's step of one piece on a
//!   stream of symheap's own, overlapping the node's steps of the next). Latency-bound sizes (up
//!   to `NODES_ALL_REDUCE_SMALL`) and the ragged tail: all_reduce in the node, then the whole
//!   vector between nodes.
//! - broadcast: between nodes among the PEs with the root's node index, then in each node.
//! - all_gather (node-major layouts): between nodes into the workspace, in the node, then a
//!   strided copy into place; reduce_scatter: the same steps backwards.
//! - alltoall: NCCL over the world (grouped send/receive).
//! - barrier_all_on_stream: a one-element all_reduce in the node, then between nodes.
//!
//! A split of the world that spans nodes runs each of them as one NCCL call over its own
//! communicator instead (`ops/coll_team_span.rs`), ranked as the team.
//!
//! Reductions in the node run where symheap's kernels have the dtype (f32, f16, bf16, i32);
//! other dtypes go through NCCL over the world. Collective-order rule: as for every collective,
//! the same calls in the same order on every PE; the world's ledger records each call and the
//! next host collective point compares them across the job.

use std::sync::MutexGuard;

use crate::backend::cuda::driver;
use crate::backend::cuda::nccl::{self, Comm};
use crate::backend::ReduceOp;
use crate::context::span::Span;
use crate::context::team::{Team, TeamInner};
use crate::context::Context;
use crate::element::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::coll::AllReduceAlgo;
use crate::ops::coll_team_span::TeamCall;
use crate::stream::Stream;

use crate::ops::coll::NODES_ALL_REDUCE_SMALL as SMALL;

/// NCCL's code for bytes.
const BYTES: i32 = 1;

/// Bytes per node member of one piece of a pipelined all_reduce, and the most pieces.
const PIECE: u64 = 4 << 20;
const MAX_PIECES: u64 = 16;

/// An all_reduce's buffers and reduction: the caller's, the workspace, symheap's and NCCL's
/// codes for the dtype, the op.
struct Reduction {
    dest: u64,
    src: u64,
    w: u64,
    dtype: DType,
    code: i32,
    op: ReduceOp,
}

/// One collective across nodes in flight: the set-up state, locked for the call (NCCL wants
/// one call at a time on a communicator), and the stream.
struct SpanCall<'a> {
    ctx: &'a Context,
    call: &'static str,
    g: MutexGuard<'a, Option<Span>>,
    raw: u64,
}

impl SpanCall<'_> {
    fn sp(&mut self) -> &mut Span {
        self.g.as_mut().expect("set up by Inner::span")
    }

    fn nccl(&self, r: std::result::Result<(), String>) -> Result<()> {
        r.map_err(|e| {
            let sp = self.g.as_ref().expect("set up");
            let more = sp
                .inter
                .iter()
                .chain(std::iter::once(&sp.all))
                .find_map(Comm::async_error)
                .map_or(String::new(), |a| format!(" (NCCL reports: {a})"));
            Error::new(
                Some(self.ctx.my_pe()),
                self.call,
                ErrorKind::Backend(format!("NCCL between nodes: {e}{more}")),
            )
        })
    }

    fn inter(&self) -> &Comm {
        self.g
            .as_ref()
            .and_then(|s| s.inter.as_ref())
            .expect("hierarchical with several nodes")
    }

    fn all(&self) -> &Comm {
        &self.g.as_ref().expect("set up").all
    }

    fn node(&self) -> Team {
        self.g
            .as_ref()
            .and_then(|s| s.node_team.clone())
            .expect("hierarchical with several PEs per node")
    }

    fn work(&mut self, bytes: u64) -> Result<u64> {
        let (inner, call, raw) = (&self.ctx.inner, self.call, self.raw);
        let sp = self.g.as_mut().expect("set up");
        inner.span_work(sp, bytes, call, raw)
    }

    /// `rows` blocks of `width` bytes from `src + r × spitch` to `dst + r × dpitch`.
    fn strided(
        &self,
        dst: u64,
        dpitch: u64,
        src: u64,
        spitch: u64,
        width: u64,
        rows: u64,
    ) -> Result<()> {
        driver::copy_2d_async(dst, dpitch, src, spitch, width, rows, self.raw)
            .map_err(|e| e.during(self.call).with_pe(self.ctx.my_pe()))
    }
}

fn no_nccl_type(rank: usize, call: &'static str, dtype: DType) -> Error {
    Error::new(
        Some(rank),
        call,
        ErrorKind::Unsupported(format!(
            "collectives across nodes run through NCCL, which has no {dtype}"
        )),
    )
}

impl Context {
    /// Starts `call` on the world team `t` across nodes: checks the buffers (symmetric, each
    /// `bytes` long), records the call in the world's ledger, orders the stream after the
    /// world's previous collective and sets up NCCL at the first call.
    fn span_begin<'a>(
        &'a self,
        t: &TeamInner,
        call: &'static str,
        args: String,
        bufs: &[(u64, u64)],
        stream: &'a Stream,
    ) -> Result<SpanCall<'a>> {
        let raw = self.inner.stream_handle(stream, call)?;
        for &(addr, bytes) in bufs {
            self.check_range(call, addr, bytes, stream)?;
        }
        let cu = self.inner.backend.as_cuda().expect("CUDA only");
        cu.bind()?;
        super::coll_stream::order_team(t, stream, raw)?;
        self.inner.record_on(t, &mut t.lock(), call, args);
        let g = self.inner.span(call, raw)?;
        Ok(SpanCall {
            ctx: self,
            call,
            g,
            raw,
        })
    }

    /// all_reduce across nodes (see the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn all_reduce_span(
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
        let code = nccl::dtype(dtype).ok_or_else(|| no_nccl_type(self.my_pe(), CALL, dtype))?;
        let es = dtype.size() as u64;
        let bytes = count as u64 * es;
        let args = format!("{} {count} x {dtype}, across nodes", op.name());
        let args = self.inner.coll_args(args, dest, src);
        let bufs = [(dest, bytes), (src, bytes)];
        if t.spans {
            let c = TeamCall::new(t, CALL, args, &bufs);
            return self.team_span_run(c, stream, |comm, raw| {
                comm.all_reduce(dest, src, count, code, op, raw)
            });
        }
        let mut c = self.span_begin(t, CALL, args, &bufs, stream)?;
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
            let r = Reduction {
                dest,
                src,
                w,
                dtype,
                code,
                op,
            };
            self.all_reduce_pipelined(&c, &node, &r, shard, stream)?;
        }
        if main < count {
            let (d, s) = (dest + main as u64 * es, src + main as u64 * es);
            let rest = count - main;
            self.all_reduce_on_stream(&node, d, s, rest, dtype, op, AllReduceAlgo::Auto, stream)?;
            c.nccl(c.inter().all_reduce(d, d, rest, code, op, c.raw))?;
        }
        Ok(())
    }

    /// The shard part of a hierarchical all_reduce: `shard` elements per node member, split
    /// into pieces of about [`PIECE`] bytes per member. Each piece is reduce-scattered in the
    /// node on the caller's stream, all-reduced between nodes by NCCL on the span's own stream,
    /// and all-gathered in the node on the caller's stream again; events order each piece's
    /// steps, so NCCL's step of one piece overlaps the node's steps of the neighbouring ones.
    /// The caller's stream ends waiting for every NCCL step (under capture: fork and join).
    fn all_reduce_pipelined(
        &self,
        c: &SpanCall<'_>,
        node: &Team,
        r: &Reduction,
        shard: usize,
        stream: &Stream,
    ) -> Result<()> {
        let es = r.dtype.size() as u64;
        let ppn = node.n_pes();
        let pieces = (shard as u64 * es).div_ceil(PIECE).clamp(1, MAX_PIECES) as usize;
        let p0 = shard / pieces;
        let side = c.g.as_ref().expect("set up").side.raw();
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
            self.all_gather_on_stream(node, r.dest + at, r.w + wat, len, r.dtype, stream)
        };
        let ev = |s: u64| driver::DoneEvent::record(s).map_err(|e| e.during(c.call));
        let mut reduced = Vec::with_capacity(pieces);
        for k in 0..pieces {
            let (at, wat, len) = piece(k);
            let w = r.w + wat;
            self.reduce_scatter_on_stream(node, w, r.src + at, len, r.dtype, r.op, stream)?;
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

    /// broadcast from world PE `root` across nodes (see the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn broadcast_span(
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
        if t.spans {
            let c = TeamCall::new(t, CALL, args, &bufs);
            return self.team_span_run(c, stream, |comm, raw| {
                comm.broadcast(dest, src, bytes as usize, BYTES, root, raw)
            });
        }
        let mut c = self.span_begin(t, CALL, args, &bufs, stream)?;
        if bytes == 0 {
            return Ok(());
        }
        let n = bytes as usize;
        let l = c.sp().layout.clone();
        if !c.sp().hier {
            return c.nccl(c.all().broadcast(dest, src, n, BYTES, root, c.raw));
        }
        let root_node = (0..l.nodes)
            .find(|&k| l.peers[k].contains(&root))
            .expect("every PE is on a node");
        let root_local = l.peers[root_node]
            .iter()
            .position(|&r| r == root)
            .expect("on it");
        if l.local == root_local {
            c.nccl(c.inter().broadcast(dest, src, n, BYTES, root_node, c.raw))?;
        }
        if l.ppn > 1 {
            self.broadcast_on_stream(&c.node(), dest, dest, n, DType::U8, root_local, stream)?;
        }
        Ok(())
    }

    /// all_gather of `count` elements per PE across nodes (see the module documentation).
    pub(super) fn all_gather_span(
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
        let world = t.members.len() as u64;
        let mine = dest + t.me as u64 * bytes;
        let args = format!("{count} x {dtype}, across nodes");
        let args = self
            .inner
            .coll_args(args, dest, if src == mine { dest } else { src });
        let bufs = [(dest, bytes * world), (src, bytes)];
        if t.spans {
            let c = TeamCall::new(t, CALL, args, &bufs);
            return self.team_span_run(c, stream, |comm, raw| {
                comm.all_gather(dest, src, bytes as usize, BYTES, raw)
            });
        }
        let mut c = self.span_begin(t, CALL, args, &bufs, stream)?;
        if bytes == 0 {
            return Ok(());
        }
        let l = c.sp().layout.clone();
        let n = bytes as usize;
        if !c.sp().hier || !l.node_major {
            return c.nccl(c.all().all_gather(dest, src, n, BYTES, c.raw));
        }
        if l.ppn == 1 {
            return c.nccl(c.inter().all_gather(dest, src, n, BYTES, c.raw));
        }
        let (k, ppn) = (l.nodes as u64, l.ppn as u64);
        let w1 = c.work(k * bytes + world * bytes)?;
        let w2 = w1 + k * bytes;
        // w1[i]: the block of the PE with this PE's node index on node i.
        c.nccl(c.inter().all_gather(w1, src, n, BYTES, c.raw))?;
        // w2[j][i]: the block of the PE with node index j on node i.
        let node = c.node();
        self.all_gather_on_stream(&node, w2, w1, (k * bytes) as usize, DType::U8, stream)?;
        for j in 0..ppn {
            c.strided(
                dest + j * bytes,
                ppn * bytes,
                w2 + j * k * bytes,
                bytes,
                bytes,
                k,
            )?;
        }
        Ok(())
    }

    /// reduce_scatter across nodes: `src` holds one block of `count` elements per PE
    /// (see the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_scatter_span(
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
        let code = nccl::dtype(dtype).ok_or_else(|| no_nccl_type(self.my_pe(), CALL, dtype))?;
        let bytes = count as u64 * dtype.size() as u64;
        let world = t.members.len() as u64;
        let mine = src + t.me as u64 * bytes;
        let args = format!("{} {count} x {dtype}, across nodes", op.name());
        let args = self
            .inner
            .coll_args(args, if dest == mine { src } else { dest }, src);
        let bufs = [(src, bytes * world), (dest, bytes)];
        if t.spans {
            let c = TeamCall::new(t, CALL, args, &bufs);
            return self.team_span_run(c, stream, |comm, raw| {
                comm.reduce_scatter(dest, src, count, code, op, raw)
            });
        }
        let mut c = self.span_begin(t, CALL, args, &bufs, stream)?;
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
        self.reduce_scatter_on_stream(&node, w1, w2, k as usize * count, dtype, op, stream)?;
        c.nccl(c.inter().reduce_scatter(dest, w1, count, code, op, c.raw))
    }

    /// alltoall across nodes: NCCL over the world.
    pub(super) fn alltoall_span(
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
        let args = self
            .inner
            .coll_args(format!("{count} x {dtype}, across nodes"), dest, src);
        let bufs = [(dest, total), (src, total)];
        if t.spans {
            let c = TeamCall::new(t, CALL, args, &bufs);
            return self.team_span_run(c, stream, |comm, raw| comm.alltoall(dest, src, bytes, raw));
        }
        let c = self.span_begin(t, CALL, args, &bufs, stream)?;
        if bytes == 0 {
            return Ok(());
        }
        c.nccl(c.all().alltoall(dest, src, bytes, c.raw))
    }

    /// barrier_all_on_stream across nodes: a one-element all_reduce (in the node, then between
    /// nodes; or NCCL over the world).
    pub(super) fn barrier_span(&self, stream: &Stream) -> Result<()> {
        const CALL: &str = "barrier_all_on_stream";
        let t = self.inner.world_team.clone();
        let mut c = self.span_begin(&t, CALL, String::new(), &[], stream)?;
        let w = c.work(256)?;
        let (i32c, sum) = (
            nccl::dtype(DType::I32).expect("NCCL has i32"),
            ReduceOp::Sum,
        );
        if !c.sp().hier {
            return c.nccl(c.all().all_reduce(w, w, 1, i32c, sum, c.raw));
        }
        if c.sp().layout.ppn > 1 {
            let node = c.node();
            self.all_reduce_on_stream(
                &node,
                w,
                w,
                1,
                DType::I32,
                sum,
                AllReduceAlgo::Auto,
                stream,
            )?;
        }
        c.nccl(c.inter().all_reduce(w, w, 1, i32c, sum, c.raw))
    }

    /// How the world's collectives reach PEs on other nodes, once the first of them set it up
    /// (None before, and when every PE's memory is reachable from this one): hierarchical or
    /// NCCL over the world, the layout, and the NCCL used.
    pub fn nodes_path(&self) -> Option<String> {
        let g = self.inner.span.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(Span::describe)
    }

    /// The team, when this PE's stream collectives on `team` run across nodes (the world, or
    /// a split of it that spans nodes).
    pub(super) fn span_team<'t>(&self, team: &'t Team) -> Option<&'t TeamInner> {
        team.0.as_deref().filter(|t| self.inner.spans_nodes(t))
    }
}
