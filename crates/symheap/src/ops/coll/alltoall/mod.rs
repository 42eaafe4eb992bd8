//! alltoall: member i's block j lands at block i of member j's destination; with equal blocks,
//! or uneven ones (split sizes per member given on the host, as torch's
//! `all_to_all_single(output_split_sizes=, input_split_sizes=)`; or counts in device memory, as
//! torch's `all_to_all_vdev`, for MoE). Its entries and its steps on every engine.
//!
//! Equal blocks. Host engine: every member copies its block from every member between two
//! barriers. Device engine: on the team that owns the scratch up to 4 MiB per pair (less from
//! 3 PEs up: `(n - 1) × bytes` about 4 MiB), data and flags travel together (the exchange
//! kernel); otherwise push after an entry round. Across nodes: NCCL's grouped send and receive.
//!
//! Split sizes on the host ([`Splits::Host`]): member i sends `send[j]` units to member j, its
//! blocks packed in member order in its source; member j receives `recv[i]` from member i,
//! packed in member order in its destination. Every member learns every member's sizes where
//! it meets them (the entry barrier's payloads on one node, Open MPI's all_gather, the
//! rendezvous across nodes) and every member refuses a disagreeing pair with the same error
//! naming it. Host engine: each member pulls its blocks between two barriers. Device engine:
//! the members meet on the host at enqueue (the sizes), then on the stream a team barrier,
//! one copy-engine pull per member and a team barrier (the sizes baked into a captured graph,
//! as NCCL's are). Open MPI: MPI_Alltoallv. NCCL: grouped send and receive.
//!
//! Counts in device memory ([`Splits::Device`], all_to_all_vdev): `in_splits` (n int64,
//! symmetric) holds the rows this member sends each member, its blocks packed in member order
//! in its source; the call writes `out_splits_offsets` (2 × n int64, symmetric): the rows
//! received from each member and where they start in the destination (rows, member order).
//! The source holds `src_rows` rows and the destination `dst_rows` on every member (recorded in
//! the ledger). Every member reads every member's counts, so all reach the same verdict: a
//! negative count, or a member sending more than `src_rows` or receiving more than `dst_rows`,
//! moves nothing on any member. Host engine and Open MPI: the counts are read on the host
//! (refused with the error naming the member). Device engine: one kernel (`symheap_alltoallv`,
//! capturable; refused counts report error 4 at the stream's next synchronisation). Not
//! across nodes on CUDA (NCCL needs the counts on the host: refused).
//!
//! Never in place: the destination and source must not overlap (see `ops/alias.rs`).
//! Collective-order rule: every member of the team calls it in the same order with the same
//! dtype, unit and buffers (and, for equal blocks, count).

mod splits;

use splits::{check_counts, gather_u64, heap_at, mine, prefix, read_counts, too_many, Matrix};
pub(crate) use splits::{DeviceSplits, Splits};

use super::params::Params;
use super::plan::{exchange_kernel, grid_for, stays_local, StreamColl};
use super::request::{Collective, OneCall, Plan, Request};
use super::transport::device::{DevicePlan, Launch, XCHG_ALLTOALL};
use super::transport::host::Coll;
use super::transport::nccl::SpanCall;
use crate::backend::cuda::coll_args::{ByteKernel, CollArgs, CollKernel};
use crate::backend::cuda::nccl::Comm;
use crate::backend::cuda::CudaBackend;
use crate::backend::host::mpi::{Mpi, MpiComm};
use crate::context::team::Team;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::ops::alias::CollKind;
use crate::stream::Stream;
use crate::SymmetricBuffer;

/// alltoall with its blocks' sizes.
pub(crate) struct AllToAll {
    pub(crate) splits: Splits,
}

impl AllToAll {
    /// The host engine's entry barrier of split sizes: records the call and publishes this
    /// member's sizes (`mine`) with its arrival; then every member's, checked. None on a team
    /// this PE is not in.
    fn host_met<'a>(
        cx: &'a Context,
        r: &Request<'a, Self>,
        nums: [u64; 8],
        args: impl FnOnce() -> String,
        mine: &[u64],
    ) -> Result<Option<(Coll<'a>, Matrix)>> {
        let n = mine.len() / 2;
        let payload: &[u8] = bytemuck::cast_slice(mine);
        if payload.len() as u64 > crate::context::area::PAYLOAD {
            return Err(too_many(cx, Self::NAME, n));
        }
        let mut stage = |at: u64| {
            cx.inner.control.write(at, payload);
            Ok(0)
        };
        let Some(c) = Coll::begin_staged(&cx.inner, r.team, Self::NAME, nums, args, 0, &mut stage)?
        else {
            return Ok(None);
        };
        let all = (0..n)
            .map(|j| {
                let mut w = vec![0u64; 2 * n];
                cx.inner
                    .control
                    .read(c.payload(j), bytemuck::cast_slice_mut(&mut w));
                w
            })
            .collect::<Vec<_>>();
        let m = Matrix::agreed(cx, Self::NAME, &all, r.count)?;
        Ok(Some((c, m)))
    }

    /// Split sizes on the device engine: the members meet on the host (the sizes, with the
    /// arrivals of a team barrier whose ledger check also catches a diverging call), then on
    /// the stream: a team barrier kernel (every member's source ready), one copy-engine pull
    /// from each member, a team barrier kernel (every member done reading the sources).
    fn device_host_splits(
        cx: &Context,
        l: &Launch<'_>,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        send: &[usize],
        recv: &[usize],
    ) -> Result<()> {
        let (t, call, n) = (p.t, r.call(), p.n());
        let mine = mine(send, recv);
        let payload: &[u8] = bytemuck::cast_slice(&mine);
        if payload.len() as u64 > crate::context::area::PAYLOAD {
            return Err(too_many(cx, call, n));
        }
        let all = {
            let mut st = t.lock();
            let mut stage = |at: u64| {
                cx.inner.control.write(at, payload);
                Ok(0)
            };
            cx.inner
                .team_sync_staged(t, &mut st, call, 0, false, &mut stage)?;
            let a = cx.inner.area();
            (0..n)
                .map(|j| {
                    let mut w = vec![0u64; 2 * n];
                    let at = a.payload(t.members[j], t.slot, st.epoch);
                    cx.inner.control.read(at, bytemuck::cast_slice_mut(&mut w));
                    w
                })
                .collect::<Vec<_>>()
        };
        let m = Matrix::agreed(cx, call, &all, r.count)?;
        let (me, unit) = (t.me, p.bytes as u64);
        if n > 1 {
            l.run(
                CollKernel::Bytes(ByteKernel::TeamBarrier),
                1,
                CollArgs::default(),
            )?;
        }
        let own = cx.inner.mem.own_base;
        for j in 0..n {
            let (off, len) = m.sent(j, me);
            let peer = cx
                .inner
                .mem
                .slot_base(t.members[j])
                .expect("checked direct");
            let from = peer + (r.src + off * unit - own);
            let to = r.dest + m.landing(j, me) * unit;
            let e = crate::backend::cuda::Engine::CopyEngine;
            l.cu.copy_on_stream(to, from, len * unit, l.stream, e)?;
        }
        if n > 1 {
            l.run(
                CollKernel::Bytes(ByteKernel::TeamBarrier),
                1,
                CollArgs::default(),
            )?;
        }
        Ok(())
    }
}

impl Collective for AllToAll {
    const NAME: &'static str = "alltoall";
    const STREAM_NAME: &'static str = "alltoall_on_stream";
    const SHAPE: CollKind = CollKind::AllToAll;

    /// No parameters: equal blocks. `send_counts` and `recv_counts` (lists, units of `count`):
    /// split sizes on the host. `in_splits` and `out_splits_offsets` (addresses), `src_rows`
    /// and `dst_rows`: counts in device memory, rows of `count` elements.
    fn from_params(p: &mut Params<'_>) -> Result<Self> {
        Ok(AllToAll {
            splits: Splits::from_params(p)?,
        })
    }

    fn check(&self, cx: &Context, r: &Request<'_, Self>) -> Result<()> {
        let (call, n) = (r.call(), r.team.n_pes());
        if !r.team.is_valid() {
            return Ok(());
        }
        match &self.splits {
            Splits::Even => Ok(()),
            Splits::Host { send, recv } => {
                if send.len() != n || recv.len() != n {
                    return Err(invalid(
                        call,
                        format!(
                            "{} send sizes and {} receive sizes for a team of {n} (one per member)",
                            send.len(),
                            recv.len()
                        ),
                    )
                    .with_pe(cx.my_pe()));
                }
                Ok(())
            }
            Splits::Device(d) => {
                let t = r.team.0.as_deref().expect("valid");
                if cx.inner.spans_nodes(t) {
                    return Err(Error::new(
                        Some(cx.my_pe()),
                        call,
                        ErrorKind::Unsupported(
                            "an alltoall with counts in device memory across nodes (NCCL needs \
                             the counts on the host: pass them as split sizes)"
                                .into(),
                        ),
                    ));
                }
                check_counts(cx, call, d, n)
            }
        }
    }

    fn lens(&self, unit: usize, n: usize) -> Option<(usize, usize)> {
        let sum = |v: &[usize]| v.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        match &self.splits {
            Splits::Even => Some((unit.checked_mul(n)?, unit.checked_mul(n)?)),
            Splits::Host { send, recv } => {
                Some((sum(recv)?.checked_mul(unit)?, sum(send)?.checked_mul(unit)?))
            }
            Splits::Device(d) => {
                Some((d.dst_rows.checked_mul(unit)?, d.src_rows.checked_mul(unit)?))
            }
        }
    }

    fn text(&self, cx: &Context, count: usize, dtype: DType) -> String {
        match &self.splits {
            Splits::Even => format!("{count} x {dtype}"),
            Splits::Host { .. } => format!("split sizes in units of {count} x {dtype}"),
            Splits::Device(d) => format!(
                "counts at {} in rows of {count} x {dtype}, {} rows in, {} rows out, out at {}",
                heap_at(cx, d.in_splits),
                d.src_rows,
                d.dst_rows,
                heap_at(cx, d.out)
            ),
        }
    }

    fn host(&self, cx: &Context, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let (dest, src, bytes) = (r.dest, r.src, p.bytes);
        let args = || r.text(cx, p, None, false);
        let dt = r.dtype as u64;
        let (c, m) = match &self.splits {
            Splits::Even => {
                let nums = [r.count as u64, dt, 0, 0, 0, 0, dest, src];
                let Some(c) = Coll::begin(&cx.inner, r.team, Self::NAME, nums, args)? else {
                    return Ok(());
                };
                let me = c.me();
                for j in 0..c.n() {
                    let from = c.at(j, src + (me * bytes) as u64);
                    c.copy(dest + (j * bytes) as u64, from, bytes)?;
                }
                return c.end();
            }
            Splits::Host { send, recv } => {
                let nums = [r.count as u64, dt | 1 << 32, 0, 0, 0, 0, dest, src];
                let mine = mine(send, recv);
                match Self::host_met(cx, r, nums, args, &mine)? {
                    Some(met) => met,
                    None => return Ok(()),
                }
            }
            Splits::Device(d) => {
                let (ins, out) = (d.in_splits, d.out);
                let (s, o) = (d.src_rows as u64, d.dst_rows as u64);
                let nums = [r.count as u64, dt | 2 << 32, ins, out, s, o, dest, src];
                let Some(c) = Coll::begin(&cx.inner, r.team, Self::NAME, nums, args)? else {
                    return Ok(());
                };
                let all = (0..c.n())
                    .map(|j| read_counts(cx, c.at(j, ins), c.n()))
                    .collect::<Result<Vec<_>>>()?;
                // Refused, every member still waits for the others to have read its counts
                // (which it may change for its next call as soon as it returns).
                let m = match Matrix::counted(cx, Self::NAME, &all, d) {
                    Ok(m) => m,
                    Err(e) => return c.end().and(Err(e)),
                };
                cx.inner.backend.write_bytes(out, &m.outputs(c.me()))?;
                (c, m)
            }
        };
        // Every member pulls its blocks; the exit barrier keeps the sources until all did.
        let (me, unit) = (c.me(), bytes as u64);
        for j in 0..c.n() {
            let (off, len) = m.sent(j, me);
            let from = c.at(j, src + off * unit);
            c.copy(dest + m.landing(j, me) * unit, from, (len * unit) as usize)?;
        }
        c.end()
    }

    /// Equal blocks; split sizes are more than one call (`mpi` and `nccl_team` below).
    fn one_call(&self) -> OneCall {
        OneCall::AllToAll
    }

    fn mpi(
        &self,
        cx: &Context,
        mpi: &Mpi,
        comm: MpiComm,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
    ) -> Result<()> {
        let err = |why| r.mpi_error(cx, why);
        let (n, me) = (p.n(), p.t.me);
        let m = match &self.splits {
            Splits::Even => return OneCall::AllToAll.mpi(cx, mpi, comm, r, p),
            Splits::Host { send, recv } => {
                let all = gather_u64(mpi, comm, &mine(send, recv), n).map_err(err)?;
                Matrix::agreed(cx, Self::NAME, &all, r.count)?
            }
            Splits::Device(d) => {
                let own = read_counts(cx, d.in_splits, n)?;
                let own: Vec<u64> = own.iter().map(|&c| c as u64).collect();
                let all = gather_u64(mpi, comm, &own, n).map_err(err)?;
                let all: Vec<Vec<i64>> = all
                    .iter()
                    .map(|r| r.iter().map(|&c| c as i64).collect())
                    .collect();
                let m = Matrix::counted(cx, Self::NAME, &all, d)?;
                cx.inner.backend.write_bytes(d.out, &m.outputs(me))?;
                m
            }
        };
        let (send, recv) = m.ranges(me, p.bytes as u64);
        mpi.alltoallv(comm, p.hd, p.hs, &send, &recv).map_err(err)
    }

    /// Split sizes: grouped send and receive, the sizes not compared across the team (its
    /// members meet in NCCL only; NCCL fails a pair whose sizes differ). Device counts never
    /// come here (refused in `check`).
    fn nccl_team(
        &self,
        comm: &Comm,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        stream: u64,
    ) -> std::result::Result<(), String> {
        match &self.splits {
            Splits::Host { send, recv } => {
                let unit = p.bytes as u64;
                let (soff, roff) = (prefix(send), prefix(recv));
                comm.exchange(
                    |j| (r.src + soff[j] * unit, send[j] as u64 * unit),
                    |j| (r.dest + roff[j] * unit, recv[j] as u64 * unit),
                    stream,
                )
            }
            _ => OneCall::AllToAll.nccl_team(comm, r, p, stream),
        }
    }

    /// NCCL over the world (grouped send and receive); split sizes are compared across the job
    /// over the rendezvous first.
    fn nccl_world(&self, c: &mut SpanCall<'_>, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()> {
        let Splits::Host { send, recv } = &self.splits else {
            if p.bytes == 0 {
                return Ok(());
            }
            return c.nccl(c.all().alltoall(r.dest, r.src, p.bytes as u64, c.raw));
        };
        let cx = c.ctx;
        let mine: Vec<u8> = bytemuck::cast_slice(&mine(send, recv)).to_vec();
        let parts = cx
            .inner
            .boot
            .all_gather(c.call, &mine)
            .map_err(|e| e.during(c.call).with_pe(cx.my_pe()))?;
        let all: Vec<Vec<u64>> = parts
            .iter()
            .map(|b| bytemuck::pod_collect_to_vec::<u8, u64>(b))
            .collect();
        let m = Matrix::agreed(cx, c.call, &all, r.count)?;
        let (s, rv) = m.ranges(p.t.me, p.bytes as u64);
        let (src, dest) = (r.src, r.dest);
        c.nccl(c.all().exchange(
            |j| (src + s[j].0 as u64, s[j].1 as u64),
            |j| (dest + rv[j].0 as u64, rv[j].1 as u64),
            c.raw,
        ))
    }

    fn device_plan(&self, cu: &CudaBackend, r: &Request<'_, Self>, p: &Plan<'_>) -> DevicePlan {
        // The exchange kernel reaches only scratch on peers: places are not part of the call.
        let local = matches!(self.splits, Splits::Even)
            && stays_local(cu, StreamColl::Alltoall, r.team, p.bytes as u64);
        DevicePlan {
            local,
            ..DevicePlan::default()
        }
    }

    fn device_alone(
        &self,
        cx: &Context,
        l: &Launch<'_>,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
    ) -> Result<()> {
        self.device(cx, l, r, p, &DevicePlan::default())
    }

    fn device(
        &self,
        cx: &Context,
        l: &Launch<'_>,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        _: &DevicePlan,
    ) -> Result<()> {
        match &self.splits {
            Splits::Even if p.n() == 1 => l.copy_local(r.dest, r.src, p.bytes as u64),
            Splits::Even => {
                let bytes = p.bytes as u64;
                if let Some(k) = exchange_kernel(l.cu, l.team, bytes) {
                    return l.exchange(k, r.src, r.dest, bytes, XCHG_ALLTOALL, 0);
                }
                let grid = grid_for(l.cu, p.dest_len as u64, 16 << 10, 1, 2);
                let args = CollArgs {
                    src: r.src,
                    dst: r.dest,
                    count: bytes,
                    ..CollArgs::default()
                };
                l.run(CollKernel::Bytes(ByteKernel::Alltoall), grid, args)
            }
            Splits::Host { send, recv } => Self::device_host_splits(cx, l, r, p, send, recv),
            Splits::Device(d) => {
                let s = r.stream.unwrap_or_else(|| l.cu.internal_stream());
                let n = p.n() as u64;
                cx.check_range(r.call(), d.in_splits, 8 * n, s)?;
                cx.check_range(r.call(), d.out, 16 * n, s)?;
                let grid = grid_for(l.cu, p.dest_len.max(p.src_len) as u64, 16 << 10, 1, 2);
                let args = CollArgs {
                    src: r.src,
                    dst: r.dest,
                    splits: d.in_splits,
                    out: d.out,
                    count: p.bytes as u64,
                    src_rows: d.src_rows as u64,
                    dst_rows: d.dst_rows as u64,
                    ..CollArgs::default()
                };
                l.run(CollKernel::Bytes(ByteKernel::Alltoallv), grid, args)
            }
        }
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
        let kind = AllToAll {
            splits: Splits::Even,
        };
        self.run_collective(Request::host(kind, team, dest, src, count, dtype))
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
        let kind = AllToAll {
            splits: Splits::Even,
        };
        let r = Request::host(kind, team, dest, src, count, dtype).on(stream);
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

    /// Collective over `team`, an alltoall of uneven blocks (as torch's `all_to_all_single`
    /// with split sizes): this member sends `send_counts[j]` elements to member j, its blocks
    /// packed in member order at `src`, and receives `recv_counts[j]` from member j, packed in
    /// member order at `dest`. What member i sends member j must be what member j expects from
    /// member i: every member checks every pair where the members meet and fails naming the
    /// first that disagrees. Never in place. On a team across nodes on CUDA the sizes are
    /// compared over the rendezvous (the world) or not at all (a split of it: NCCL's own
    /// checks). Collective-order rule: every member calls it in the same order with the same
    /// dtype and buffers.
    pub fn alltoallv_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        send_counts: &[usize],
        recv_counts: &[usize],
        dtype: DType,
    ) -> Result<()> {
        let kind = AllToAll {
            splits: Splits::Host {
                send: send_counts.into(),
                recv: recv_counts.into(),
            },
        };
        self.run_collective(Request::host(kind, team, dest, src, 1, dtype))
    }

    /// `alltoallv_raw` enqueued on `stream` (CUDA: the members meet on the host as it is
    /// enqueued, then a team barrier, the copies and a team barrier run on the stream,
    /// capturable in a CUDA graph with the sizes baked in).
    #[allow(clippy::too_many_arguments)]
    pub fn alltoallv_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        send_counts: &[usize],
        recv_counts: &[usize],
        dtype: DType,
        stream: &Stream,
    ) -> Result<()> {
        let kind = AllToAll {
            splits: Splits::Host {
                send: send_counts.into(),
                recv: recv_counts.into(),
            },
        };
        let r = Request::host(kind, team, dest, src, 1, dtype).on(stream);
        self.run_collective(r)
    }

    /// Collective over `team`, an alltoall whose counts are in symmetric memory (as torch's
    /// `all_to_all_vdev`, for MoE): `in_splits` holds n int64, the rows of `row` elements this
    /// member sends each member (its blocks packed in member order at `src`, which holds
    /// `src_rows` rows); the blocks land packed in member order at `dest` (`dst_rows` rows),
    /// and the call writes `out_splits_offsets` (2 × n int64): the rows received from each
    /// member, then where each starts in `dest` (rows). `src_rows`, `dst_rows` and every buffer
    /// must be the same on every member. A negative count, or counts past either buffer, move
    /// nothing on any member: an invalid-argument error on the host backend; on CUDA, where the
    /// kernel reads the counts, error 4 at the stream's next synchronisation. On `stream` when
    /// given (capturable), else complete on return. Not across nodes on CUDA.
    #[allow(clippy::too_many_arguments)]
    pub fn alltoall_vdev(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        in_splits: u64,
        out_splits_offsets: u64,
        row: usize,
        src_rows: usize,
        dst_rows: usize,
        dtype: DType,
        stream: Option<&Stream>,
    ) -> Result<()> {
        let kind = AllToAll {
            splits: Splits::Device(DeviceSplits {
                in_splits,
                out: out_splits_offsets,
                src_rows,
                dst_rows,
            }),
        };
        let mut r = Request::host(kind, team, dest, src, row, dtype);
        r.stream = stream;
        self.run_collective(r)
    }
}
