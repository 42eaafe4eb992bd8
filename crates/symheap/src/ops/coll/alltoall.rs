//! alltoall: member i's block j lands at block i of member j's destination. Its entries and
//! its steps on every engine.
//!
//! Host engine: every member copies its block from every member between two barriers. Device
//! engine: on the team that owns the scratch up to 4 MiB per pair (less from 3 PEs up:
//! `(n - 1) × bytes` about 4 MiB), data and flags travel together (the exchange kernel);
//! otherwise push after an entry round. Across nodes: NCCL's grouped send and receive.
//!
//! Never in place: the destination and source must not overlap (see `ops/alias.rs`).
//! Collective-order rule: every member of the team calls it in the same order with the same
//! count and dtype.

use super::engine::device::{DevicePlan, Launch, XCHG_ALLTOALL};
use super::engine::host::Coll;
use super::engine::mpi::mpi_error;
use super::engine::nccl::SpanCall;
use super::plan::{exchange_kernel, grid_for, stays_local, StreamColl};
use super::request::{Collective, Plan, Request};
use super::table::Params;
use crate::backend::cuda::driver::Arg;
use crate::backend::cuda::nccl::Comm;
use crate::backend::cuda::CudaBackend;
use crate::backend::host::mpi::{Mpi, MpiComm};
use crate::context::team::Team;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::Result;
use crate::ops::alias::CollKind;
use crate::stream::Stream;
use crate::SymmetricBuffer;

/// alltoall of equal blocks.
pub(crate) struct AllToAll;

impl Collective for AllToAll {
    const NAME: &'static str = "alltoall";
    const STREAM_NAME: &'static str = "alltoall_on_stream";
    const SHAPE: CollKind = CollKind::AllToAll;

    fn from_params(_: &mut Params<'_>) -> Result<Self> {
        Ok(AllToAll)
    }

    fn text(&self, _: &Context, count: usize, dtype: DType) -> String {
        format!("{count} x {dtype}")
    }

    fn host(&self, cx: &Context, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, bytes) = (r.dest, r.src, p.bytes);
        let nums = [r.count as u64, r.dtype as u64, 0, 0, 0, 0, dest, src];
        let args = || r.text(cx, p, None, false);
        let Some(c) = Coll::begin(&cx.inner, r.team, Self::NAME, nums, args)? else {
            return Ok(());
        };
        let me = c.me();
        for j in 0..c.n() {
            let from = c.at(j, src + (me * bytes) as u64);
            c.copy(dest + (j * bytes) as u64, from, bytes)?;
        }
        c.end()
    }

    fn mpi(
        &self,
        cx: &Context,
        mpi: &Mpi,
        comm: MpiComm,
        _: &Request<'_, Self>,
        p: &Plan<'_>,
    ) -> Result<()> {
        mpi.alltoall(comm, p.hd, p.hs, p.bytes)
            .map_err(|why| mpi_error(cx, Self::NAME, why))
    }

    fn nccl_team(
        &self,
        _cx: &Context,
        comm: &Comm,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        stream: u64,
    ) -> std::result::Result<(), String> {
        comm.alltoall(r.dest, r.src, p.bytes as u64, stream)
    }

    /// NCCL over the world (grouped send and receive).
    fn nccl_world(&self, c: &mut SpanCall<'_>, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        if p.bytes == 0 {
            return Ok(());
        }
        c.nccl(c.all().alltoall(r.dest, r.src, p.bytes as u64, c.raw))
    }

    fn device_plan(&self, cu: &CudaBackend, r: &Request<'_, Self>, p: &Plan<'_>) -> DevicePlan {
        // The exchange kernel reaches only scratch on peers: places are not part of the call.
        DevicePlan {
            local: stays_local(cu, StreamColl::Alltoall, r.team, p.bytes as u64),
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
            return l.exchange(k, r.src, r.dest, bytes, XCHG_ALLTOALL, 0);
        }
        let grid = grid_for(l.cu, p.dest_len as u64, 16 << 10, 1, 2);
        l.run(
            "symheap_alltoall",
            grid,
            &[Arg::U64(r.src), Arg::U64(r.dest), Arg::U64(bytes)],
        )
    }
}

impl Context {
    /// Collective over `team`: member i's block j (`count` elements at `src + j × count`)
    /// lands at member j's `dest + i × count`. Never in place: `dest` and `src` must not
    /// overlap (see `ops/alias.rs`).
    pub fn alltoall_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
    ) -> Result<()> {
        self.run_collective(Request::host(AllToAll, team, dest, src, count, dtype))
    }

    /// Collective over `team`: member i's block j (`count` elements at `src + j × count`) lands
    /// at member j's `dest + i × count`, enqueued on `stream`. Never in place: `dest` and `src`
    /// must not overlap (see `ops/alias.rs`). On the world team up to 4 MiB per pair (less
    /// from 3 PEs up: `(n - 1) × bytes` about 4 MiB), data and flags travel together;
    /// otherwise push after an entry round.
    pub fn alltoall_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: &Stream,
    ) -> Result<()> {
        let r = Request::host(AllToAll, team, dest, src, count, dtype).on(stream);
        self.run_collective(r)
    }

    /// Typed `alltoall_raw` on buffers (both hold `n × count`).
    pub fn alltoall<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
    ) -> Result<()> {
        self.alltoall_raw(team, dest.addr(), src.addr(), count, T::DTYPE)
    }
}
