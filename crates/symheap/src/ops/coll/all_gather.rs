//! all_gather: member j's block lands at block j of every member's destination. Its entries
//! and its steps on every engine.
//!
//! Host engine: every member copies every member's source between two barriers. Device
//! engine: on the team that owns the scratch, up to 4 MiB per member (less from 3 PEs up:
//! `(n - 1) × bytes` about 4 MiB), data and flags travel together (the exchange kernel, one
//! one-way latency); otherwise push after an entry round. Across nodes (node-major layouts):
//! between nodes into the workspace, in the node, then a strided copy into place.
//!
//! In place when the source is exactly this PE's block of the destination; the ledger records
//! it as in place, the same on every PE (each passes its own block). Collective-order rule:
//! every member of the team calls it in the same order with the same count and dtype.

use super::params::Params;
use super::plan::{exchange_kernel, grid_for, stays_local, StreamColl};
use super::request::{Collective, OneCall, Plan, Request};
use super::transport::device::{DevicePlan, Launch, XCHG_ALL_GATHER};
use super::transport::host::Coll;
use super::transport::nccl::{SpanCall, BYTES};
use crate::backend::cuda::coll_args::{ByteKernel, CollArgs, CollKernel};
use crate::backend::cuda::CudaBackend;
use crate::context::team::Team;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::Result;
use crate::ops::alias::CollKind;
use crate::stream::Stream;
use crate::SymmetricBuffer;

/// all_gather.
pub(crate) struct AllGather;

impl Collective for AllGather {
    const NAME: &'static str = "all_gather";
    const STREAM_NAME: &'static str = "all_gather_on_stream";
    const SHAPE: CollKind = CollKind::AllGather;

    fn from_params(_: &mut Params<'_>) -> Result<Self> {
        Ok(AllGather)
    }

    fn text(&self, _: &Context, count: usize, dtype: DType) -> String {
        format!("{count} x {dtype}")
    }

    fn host(&self, cx: &Context, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, bytes) = (p.hd, p.hs, p.bytes);
        let nums = [r.count as u64, r.dtype as u64, 0, 0, 0, 0, dest, src];
        let args = || r.text(cx, p, None, false);
        let Some(c) = Coll::begin(&cx.inner, r.team, Self::NAME, nums, args)? else {
            return Ok(());
        };
        // In place, member j's contribution is its block j of `dest` (the host form's
        // dest == src).
        let in_place = dest == src;
        for j in 0..c.n() {
            let from = if in_place {
                c.at(j, dest + (j * bytes) as u64)
            } else {
                c.at(j, src)
            };
            c.copy(dest + (j * bytes) as u64, from, bytes)?;
        }
        c.end()
    }

    fn one_call(&self) -> OneCall {
        OneCall::AllGather
    }

    /// Node-major layouts: between nodes into the workspace, in the node, then a strided
    /// copy into place; otherwise NCCL over the world.
    fn nccl_world(&self, c: &mut SpanCall<'_>, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src) = (r.dest, r.src);
        let (bytes, world) = (p.bytes as u64, p.n() as u64);
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
        let kb = (k * bytes) as usize;
        c.ctx
            .all_gather_on_stream(&node, w2, w1, kb, DType::U8, c.stream)?;
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

    fn device_plan(&self, cu: &CudaBackend, r: &Request<'_, Self>, p: &Plan<'_>) -> DevicePlan {
        // The exchange kernel reaches only scratch on peers: places are not part of the call.
        // Otherwise in place ("my contribution already at my block of dest") is recorded as
        // such: the same call on every PE, although src differs per PE.
        DevicePlan {
            local: stays_local(cu, StreamColl::AllGather, r.team, p.bytes as u64),
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
        let bytes = p.bytes as u64;
        if let Some(k) = exchange_kernel(l.cu, l.team, bytes) {
            return l.exchange(k, r.src, r.dest, bytes, XCHG_ALL_GATHER, 0);
        }
        let grid = grid_for(l.cu, bytes * p.n() as u64, 16 << 10, 1, 2);
        let args = CollArgs {
            src: r.src,
            dst: r.dest,
            count: bytes,
            ..CollArgs::default()
        };
        l.run(CollKernel::Bytes(ByteKernel::AllGather), grid, args)
    }
}

impl Context {
    /// Collective over `team`: member j's `count` elements at `src` land at
    /// `dest + j × count` on every member. In place when `src == dest + me × count` (this PE's
    /// contribution already sits at its own block of `dest`); any other overlap of `src` and
    /// `dest` is an invalid argument (see `ops/alias.rs`).
    pub fn all_gather_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
    ) -> Result<()> {
        self.run_collective(Request::host(AllGather, team, dest, src, count, dtype))
    }

    /// Collective over `team`: member j's `count` elements at `src` land at `dest + j × count`
    /// on every member, enqueued on `stream`. In place when `src == dest + me × count`; any
    /// other overlap is an invalid argument (see `ops/alias.rs`). On the world team, up to 4 MiB
    /// per member (less from 3 PEs up: `(n - 1) × bytes` about 4 MiB), data and flags travel
    /// together (one one-way latency); otherwise push after an entry round.
    pub fn all_gather_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: &Stream,
    ) -> Result<()> {
        let r = Request::host(AllGather, team, dest, src, count, dtype).on(stream);
        self.run_collective(r)
    }

    /// Typed `all_gather_raw` on buffers (`dest` holds `n × count`).
    pub fn all_gather<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
    ) -> Result<()> {
        self.all_gather_raw(team, dest.addr(), src.addr(), count, T::DTYPE)
    }
}
