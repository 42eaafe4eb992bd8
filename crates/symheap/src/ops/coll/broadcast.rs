//! broadcast: every member's destination gets the root's source. Its entries and its steps on
//! every engine.
//!
//! Host engine: up to `PAYLOAD` bytes the root's data rides on its arrival at the entry barrier
//! (one pass, no exit barrier); larger, every member copies from the root's source between two
//! barriers. A broadcast of at most 96 bytes with every PE of the job on this node is eager
//! (`engine/eager.rs`): the root returns without waiting for the receivers. Device engine: the
//! exchange kernel (data and flags together) on the team that owns the scratch up to 4 MiB;
//! otherwise the root pushes into every member's destination once they arrived. Across nodes:
//! between nodes among the PEs with the root's node index, then in each node.
//!
//! Collective-order rule: every member of the team calls it in the same order with the same
//! root, count and dtype; symheap checks it at the entry barrier (the root of an eager
//! broadcast: at its next call that waits, or at finalize).

use super::params::Params;
use super::plan::{exchange_kernel, grid_for, stays_local, StreamColl};
use super::request::{Collective, OneCall, Plan, Request};
use super::transport::device::{DevicePlan, Launch, XCHG_BROADCAST};
use super::transport::host::{one_pass, Coll};
use super::transport::nccl::{SpanCall, BYTES};
use crate::backend::cuda::coll_args::{ByteKernel, CollArgs, CollKernel};
use crate::backend::cuda::CudaBackend;
use crate::context::area::INLINE;
use crate::context::team::Team;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::Result;
use crate::ops::alias::CollKind;
use crate::stream::Stream;
use crate::SymmetricBuffer;

/// broadcast from team member `root`.
pub(crate) struct Broadcast {
    pub(crate) root: usize,
}

impl Collective for Broadcast {
    const NAME: &'static str = "broadcast";
    const STREAM_NAME: &'static str = "broadcast_on_stream";
    const SHAPE: CollKind = CollKind::Broadcast;

    /// First, with nothing else worked out: a small broadcast in a loop is the eager path
    /// (host backend), and each instruction before it was a measurable part of its cost (see
    /// `engine/eager.rs`).
    #[inline]
    fn enter(cx: &Context, r: Request<'_, Self>) -> Result<()> {
        if let Some(host) = r
            .count
            .checked_mul(r.dtype.size())
            .and_then(|bytes| cx.inner.eager_host(bytes))
        {
            let (t, d, s, c, dt) = (r.team, r.dest, r.src, r.count, r.dtype);
            return cx.broadcast_eager(host, t, d, s, c, dt, r.kind.root);
        }
        cx.broadcast_synced(r)
    }

    fn from_params(p: &mut Params<'_>) -> Result<Self> {
        let root = p.int("root")?.unwrap_or(0);
        let root = usize::try_from(root)
            .map_err(|_| p.error(format!("root {root} is not a team member")))?;
        Ok(Broadcast { root })
    }

    fn check(&self, cx: &Context, r: &Request<'_, Self>) -> Result<()> {
        let n = r.team.n_pes();
        if r.team.is_valid() && self.root >= n {
            return Err(cx.bad_root(r.call(), self.root, n));
        }
        Ok(())
    }

    fn text(&self, _: &Context, count: usize, dtype: DType) -> String {
        format!("root {}, {count} x {dtype}", self.root)
    }

    fn host(&self, cx: &Context, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, root, bytes) = (r.dest, r.src, self.root, p.bytes);
        let nums = [
            root as u64,
            r.count as u64,
            r.dtype as u64,
            0,
            0,
            0,
            dest,
            src,
        ];
        let args = || r.text(cx, p, None, false);
        if one_pass(cx, bytes) {
            // One pass: the root's data rides on its arrival at the entry barrier, which also
            // checks the ledgers; no exit barrier (see `AllReduce::one_pass`).
            let be = &cx.inner.backend;
            let is_root = r.team.my_pe() == Some(root);
            let inline = if bytes as u64 <= INLINE { bytes } else { 0 };
            let mut stage = |at: u64| {
                if !is_root {
                    return Ok(0);
                }
                be.copy(at, src, bytes)?;
                Ok(inline)
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
            if inline == 0 {
                return c.copy(dest, c.payload(root), bytes);
            }
            let mut buf = [0u8; INLINE as usize];
            c.read_inline(root, &mut buf[..bytes]);
            return be.write_bytes(dest, &buf[..bytes]);
        }
        let Some(c) = Coll::begin(&cx.inner, r.team, Self::NAME, nums, args)? else {
            return Ok(());
        };
        c.copy(dest, c.at(root, src), bytes)?;
        c.end()
    }

    fn one_call(&self) -> OneCall {
        OneCall::Broadcast { root: self.root }
    }

    /// Between nodes among the PEs with the root's node index, then in each node.
    fn nccl_world(&self, c: &mut SpanCall<'_>, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, root, n) = (r.dest, r.src, self.root, p.bytes);
        if n == 0 {
            return Ok(());
        }
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
            let node = c.node();
            c.ctx
                .broadcast_on_stream(&node, dest, dest, n, DType::U8, root_local, c.stream)?;
        }
        Ok(())
    }

    fn device_plan(&self, cu: &CudaBackend, r: &Request<'_, Self>, p: &Plan<'_>) -> DevicePlan {
        // The exchange kernel reaches only scratch on peers: places are not part of the call.
        DevicePlan {
            local: stays_local(cu, StreamColl::Broadcast, r.team, p.bytes as u64),
            ..DevicePlan::default()
        }
    }

    fn device(
        &self,
        _cx: &Context,
        l: &Launch<'_>,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        _: &DevicePlan,
    ) -> Result<()> {
        let (bytes, root) = (p.bytes as u64, self.root as i32);
        if let Some(k) = exchange_kernel(l.cu, l.team, bytes) {
            return l.exchange(k, r.src, r.dest, bytes, XCHG_BROADCAST, root);
        }
        let grid = grid_for(l.cu, bytes, 16 << 10, 1, 2);
        let args = CollArgs {
            src: r.src,
            dst: r.dest,
            count: bytes,
            root,
            ..CollArgs::default()
        };
        l.run(CollKernel::Bytes(ByteKernel::Broadcast), grid, args)
    }
}

impl Context {
    /// The pipeline for a broadcast that is not eager. Not inlined into the entries: its frame
    /// and saved registers were a tenth of an eager broadcast's instructions.
    #[inline(never)]
    fn broadcast_synced(&self, r: Request<'_, Broadcast>) -> Result<()> {
        self.pipeline(r)
    }

    /// Collective over `team`: every member's `dest` gets `count` elements of `dtype` from
    /// team member `root`'s `src`. Addresses are in this PE's heap; in place when `dest == src`,
    /// any other overlap an invalid argument (see `ops/alias.rs`).
    /// On the host backend a broadcast of at most 96 bytes is eager: the root returns without
    /// waiting for the receivers, and learns of a divergence (a member making another call)
    /// at its next call that waits, or at finalize, instead of in this call.
    pub fn broadcast_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        let kind = Broadcast { root };
        self.run_collective(Request::host(kind, team, dest, src, count, dtype))
    }

    /// Collective over `team`: every member's `dest` gets `count` elements from member
    /// `root`'s `src`, enqueued on `stream`. On the world team up to 4 MiB (less from 3 PEs up:
    /// `(n - 1) × bytes` about 4 MiB), data and flags travel together; otherwise the root pushes
    /// into every member's `dest` once they arrived. On the host backend, whose stream work
    /// runs on the calling thread, as `broadcast_raw` (a small one is eager).
    #[allow(clippy::too_many_arguments)]
    pub fn broadcast_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let kind = Broadcast { root };
        self.run_collective(Request::host(kind, team, dest, src, count, dtype).on(stream))
    }

    /// Typed `broadcast_raw` on buffers.
    pub fn broadcast<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
        root: usize,
    ) -> Result<()> {
        self.broadcast_raw(team, dest.addr(), src.addr(), count, T::DTYPE, root)
    }
}
