//! Collectives on a stream: on CUDA, one kernel per call (coll.cu) that synchronises with the
//! other members through flags in symmetric memory, so it can be captured in a CUDA graph; on
//! the host backend the host collectives, run to completion.
//!
//! Collective-order rule: every member of the team calls each collective in the same order with
//! the same arguments; the calls are recorded in the team's ledger and compared at the next host
//! collective point.

use crate::backend::cuda::driver::Arg;
use crate::backend::cuda::{CudaBackend, COLL_DTYPES};
use crate::backend::ReduceOp;
use crate::context::device_state::{DeviceTeams, LL128_PART, MAX_BLOCKS, ONE_SHOT_SLOT};
use crate::context::team::{Team, TeamInner};
use crate::context::Context;
use crate::element::DType;
use crate::error::{err, ErrorKind, Result};
use crate::ops::alias::CollKind;
use crate::ops::coll::AllReduceAlgo;
use crate::ops::coll_check::host_form;
use crate::ops::coll_plan::*;
use crate::stream::Stream;

/// `symheap_exchange_ll` modes (coll.cu).
const XCHG_ALL_GATHER: i32 = 0;
const XCHG_ALLTOALL: i32 = 1;
const XCHG_BROADCAST: i32 = 2;

fn dtype_suffix(d: DType) -> Option<&'static str> {
    COLL_DTYPES.iter().find(|(t, _)| *t == d).map(|(_, s)| *s)
}

fn op_code(op: ReduceOp) -> i32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Min => 1,
        ReduceOp::Max => 2,
        ReduceOp::Prod => 3,
    }
}

/// One collective launch on CUDA: the team's trailing kernel arguments.
struct Launch<'a> {
    cu: &'a CudaBackend,
    team: &'a TeamInner,
    own: u64,
    dt: DeviceTeams,
}

impl Launch<'_> {
    fn team_args(&self) -> [Arg; 8] {
        let s = self.team.slot;
        [
            Arg::U64(self.own + self.dt.bases(s)),
            Arg::U64(self.own + self.dt.flags(s)),
            Arg::U64(self.own + self.dt.peer_flags(s)),
            Arg::U64(self.own + self.dt.ctl(s)),
            Arg::I32(self.team.me as i32),
            Arg::I32(self.team.members.len() as i32),
            Arg::U64(self.cu.wait_bound_ns()),
            Arg::U64(self.cu.coll_error_word()),
        ]
    }

    /// The one-shot kernel (all_reduce: stride 0; reduce_scatter: stride = count) through the
    /// world's scratch.
    #[allow(clippy::too_many_arguments)]
    fn oneshot(
        &self,
        sfx: &str,
        src: u64,
        dest: u64,
        count: u64,
        stride: u64,
        esize: u64,
        op: ReduceOp,
        stream: u64,
    ) -> Result<()> {
        let n = self.team.members.len() as u64;
        let cu = self.cu;
        let sms = cu.sm_count().max(1) as u64;
        let aligned = src % 16 == 0 && dest % 16 == 0 && (stride * esize) % 16 == 0;
        let (kernel, grid) =
            oneshot_kernel(count * esize, n, sms, aligned, |k, d| cu.coll_tuning(k, d));
        let mut args = vec![
            Arg::U64(src),
            Arg::U64(dest),
            Arg::U64(count),
            Arg::U64(stride),
            Arg::I32(op_code(op)),
        ];
        args.extend(self.scratch_args(kernel == LL128_KERNEL));
        self.run(&format!("{kernel}_{sfx}"), grid, stream, &args)
    }

    /// The arguments that end the one-shot and exchange kernels' own: the table of the team
    /// members' scratch addresses and my scratch, then the LL128 region's offset and parity
    /// size (`ll128`), or the scratch slot size.
    fn scratch_args(&self, ll128: bool) -> Vec<Arg> {
        let mut args = vec![
            Arg::U64(self.own + self.dt.scratch_table(self.team.slot)),
            Arg::U64(self.own + self.dt.scratch()),
        ];
        if ll128 {
            args.extend([Arg::U64(self.dt.ll128()), Arg::U64(LL128_PART)]);
        } else {
            args.push(Arg::U64(ONE_SHOT_SLOT));
        }
        args
    }

    /// The exchange kernel (small and mid-size all_gather, alltoall, broadcast) for `bytes` per
    /// member, if one applies: only on the world team itself (whose scratch and epochs they
    /// use) and never for an empty message (a launch without data would wait for nobody, see
    /// coll.cu, ar_oneshot). `symheap_exchange_ll` up to `SYMHEAP_COLL_XCHG_LL_MAX` with room
    /// for its lines in a scratch slot, then `symheap_exchange_ll128` up to
    /// `SYMHEAP_COLL_XCHG_LL128_MAX` with room in the LL128 region.
    fn exchange_kernel(&self, bytes: u64) -> Option<&'static str> {
        exchange_kernel(self.cu, self.team, bytes)
    }

    /// Runs exchange `kernel` (from [`Launch::exchange_kernel`]); grids as the one-shot's LL and
    /// LL128 paths, over the bytes per member.
    #[allow(clippy::too_many_arguments)]
    fn exchange(
        &self,
        kernel: &str,
        src: u64,
        dest: u64,
        bytes: u64,
        mode: i32,
        root: i32,
        stream: u64,
    ) -> Result<()> {
        let cu = self.cu;
        let sms = cu.sm_count().max(1) as u64;
        let tune = |k: &str, d| cu.coll_tuning(k, d);
        let mut args = vec![
            Arg::U64(src),
            Arg::U64(dest),
            Arg::U64(bytes),
            Arg::I32(mode),
            Arg::I32(root),
        ];
        let ll128 = kernel == XCHG_LL128_KERNEL;
        args.extend(self.scratch_args(ll128));
        let grid = if ll128 {
            ll128_grid(bytes, sms, mode != XCHG_BROADCAST, tune)
        } else {
            ll_grid(bytes, sms, tune)
        };
        self.run(kernel, grid, stream, &args)
    }

    /// A team of one: every collective is a copy of `bytes` from `src` to `dest` (none in
    /// place), by the copy engine, with no kernel and no flags.
    fn copy_local(&self, dest: u64, src: u64, bytes: u64, stream: u64) -> Result<()> {
        if dest == src || bytes == 0 {
            return Ok(());
        }
        self.cu.copy_on_stream(
            dest,
            src,
            bytes,
            stream,
            crate::backend::cuda::Engine::CopyEngine,
        )
    }

    fn run(&self, name: &str, grid: u64, stream: u64, head: &[Arg]) -> Result<()> {
        let mut args: Vec<Arg> = head.to_vec();
        args.extend_from_slice(&self.team_args());
        self.cu
            .launch_coll(name, grid.clamp(1, MAX_BLOCKS) as u32, stream, &args)
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
    fn coll_prepare<'a>(
        &'a self,
        team: &'a Team,
        call: &'static str,
        args: String,
        s: &Stream,
        stream: u64,
    ) -> Result<Option<(Launch<'a>, &'a TeamInner)>> {
        let Some(t) = self.inner.team_inner(team, call)? else {
            return Ok(None);
        };
        let cu = self.inner.backend.as_cuda().expect("called on CUDA only");
        if let Some(&m) = t
            .members
            .iter()
            .find(|&&m| self.inner.backend.slot_base(m).is_none())
        {
            return Err(err(
                call,
                ErrorKind::Unsupported(format!(
                    "PE {m}'s GPU memory is not directly reachable from this GPU"
                )),
            )
            .with_pe(self.my_pe()));
        }
        let dt = *self.inner.dteams.get().expect("device teams exist on CUDA");
        cu.bind()?;
        order_team(t, s, stream)?;
        self.inner.record_on(t, &mut t.lock(), call, args);
        let own = self
            .inner
            .backend
            .slot_base(self.my_pe())
            .expect("own heap");
        Ok(Some((
            Launch {
                cu,
                team: t,
                own,
                dt,
            },
            t,
        )))
    }

    /// Checks a collective's buffer and notes that `stream` uses it (see stream-ordered release).
    pub(super) fn check_range(
        &self,
        call: &'static str,
        addr: u64,
        bytes: u64,
        stream: &Stream,
    ) -> Result<()> {
        let off = self.inner.own_offset(addr, bytes.max(1), call)?;
        self.inner.note_stream(off, stream);
        Ok(())
    }

    /// Checks a collective's buffer: symmetric memory as [`Context::check_range`]; with `local`
    /// (the kernel touches the buffer only on this PE) also any device memory of this PE's GPU
    /// outside every heap, which the caller keeps alive until the stream has run the kernel.
    fn check_buf(
        &self,
        call: &'static str,
        addr: u64,
        bytes: u64,
        stream: &Stream,
        local: bool,
    ) -> Result<()> {
        match self.inner.backend.as_cuda() {
            Some(cu) if local && !self.inner.in_any_heap(addr) => cu
                .check_local_range(addr, bytes, call)
                .map_err(|e| e.with_pe(self.my_pe())),
            _ => self.check_range(call, addr, bytes, stream),
        }
    }

    /// Whether `coll` of `bytes` per member on `team` runs a kernel that reads its source and
    /// writes its destination on the calling PE only (one-shot all_reduce and reduce_scatter;
    /// the exchange kernels of all_gather, alltoall and broadcast): then the `*_on_stream` call
    /// takes any device memory of this PE's GPU for both, not only symmetric memory, with no
    /// copy. The answer is the same on every PE for the same call (it depends on the team, the
    /// size and the tuning variables only). Always false on the host backend, whose
    /// collectives read peers' copies.
    pub fn coll_takes_local_buffers(&self, coll: StreamColl, team: &Team, bytes: u64) -> bool {
        let Some(cu) = self.inner.backend.as_cuda() else {
            return false;
        };
        stays_local(cu, coll, team, bytes)
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
        const CALL: &str = "all_reduce_on_stream";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = self.coll_bytes(CALL, count, dtype, 1)? as u64;
        if self.inner.backend.as_cuda().is_none() {
            return self.all_reduce_raw(team, dest, src, count, dtype, op, algo);
        }
        let kind = CollKind::AllReduce;
        self.placement(CALL, kind, team, dest, src, count, dtype)?;
        if let Some(t) = self.span_team(team) {
            return self.all_reduce_span(t, dest, src, count, dtype, op, s);
        }
        let (Some(cu), Some(sfx)) = (self.inner.backend.as_cuda(), dtype_suffix(dtype)) else {
            return self.all_reduce_raw(team, dest, src, count, dtype, op, algo);
        };
        if !team.is_valid() {
            return Ok(());
        }
        // The algorithm is a request, as on the host backend: one-shot runs through the world's
        // scratch, so another team or a message larger than a slot goes two-shot.
        let one_shot = ar_one_shot(cu, team, bytes, algo);
        let local = stays_local(cu, StreamColl::AllReduce(algo), team, bytes);
        self.check_buf(CALL, dest, bytes, s, local)?;
        self.check_buf(CALL, src, bytes, s, local)?;
        let args = format!(
            "{} {count} x {dtype}, {}",
            op.name(),
            if one_shot { "one-shot" } else { "two-shot" }
        );
        // Where the buffers lie matters only to kernels that reach peers' copies of them: the
        // one-shot one reaches only scratch, so PEs may pass different (or ordinary) buffers.
        let args = if local {
            args
        } else {
            self.inner.coll_args(args, dest, src)
        };
        let Some((l, t)) = self.coll_prepare(team, CALL, args, s, stream)? else {
            return Ok(());
        };
        if t.members.len() == 1 {
            return l.copy_local(dest, src, bytes, stream);
        }
        if one_shot {
            l.oneshot(
                sfx,
                src,
                dest,
                count as u64,
                0,
                dtype.size() as u64,
                op,
                stream,
            )
        } else {
            let grid = grid_for(cu, bytes, 64 << 10, 16, 2);
            l.run(
                &format!("symheap_ar_twoshot_{sfx}"),
                grid,
                stream,
                &[
                    Arg::U64(src),
                    Arg::U64(dest),
                    Arg::U64(count as u64),
                    Arg::I32(op_code(op)),
                ],
            )
        }
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
        const CALL: &str = "all_gather_on_stream";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = self.coll_bytes(CALL, count, dtype, team.n_pes())? as u64;
        let Some(cu) = self.inner.backend.as_cuda() else {
            return self.all_gather_raw(team, dest, src, count, dtype);
        };
        let kind = CollKind::AllGather;
        let placed = self.placement(CALL, kind, team, dest, src, count, dtype)?;
        if let Some(t) = self.span_team(team) {
            return self.all_gather_span(t, dest, src, count, dtype, s);
        }
        if !team.is_valid() {
            return Ok(());
        }
        let local = stays_local(cu, StreamColl::AllGather, team, bytes);
        self.check_buf(CALL, dest, bytes * team.n_pes() as u64, s, local)?;
        self.check_buf(CALL, src, bytes, s, local)?;
        let args = format!("{count} x {dtype}");
        // The exchange kernel reaches only scratch on peers: places are not part of the call.
        // Otherwise in place ("my contribution already at my block of dest") is recorded as
        // such: the same call on every PE, although src differs per PE.
        let args = if local {
            args
        } else {
            let (d, s) = host_form(kind, placed, dest, src);
            self.inner.coll_args(args, d, s)
        };
        let Some((l, t)) = self.coll_prepare(team, CALL, args, s, stream)? else {
            return Ok(());
        };
        if t.members.len() == 1 {
            return l.copy_local(dest, src, bytes, stream);
        }
        if let Some(k) = l.exchange_kernel(bytes) {
            return l.exchange(k, src, dest, bytes, XCHG_ALL_GATHER, 0, stream);
        }
        let grid = grid_for(cu, bytes * t.members.len() as u64, 16 << 10, 1, 2);
        l.run(
            "symheap_allgather",
            grid,
            stream,
            &[Arg::U64(src), Arg::U64(dest), Arg::U64(bytes)],
        )
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
        const CALL: &str = "reduce_scatter_on_stream";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = self.coll_bytes(CALL, count, dtype, team.n_pes())? as u64;
        if self.inner.backend.as_cuda().is_none() {
            return self.reduce_scatter_raw(team, dest, src, count, dtype, op);
        }
        let kind = CollKind::ReduceScatter;
        let placed = self.placement(CALL, kind, team, dest, src, count, dtype)?;
        if let Some(t) = self.span_team(team) {
            return self.reduce_scatter_span(t, dest, src, count, dtype, op, s);
        }
        let (Some(cu), Some(sfx)) = (self.inner.backend.as_cuda(), dtype_suffix(dtype)) else {
            return self.reduce_scatter_raw(team, dest, src, count, dtype, op);
        };
        if !team.is_valid() {
            return Ok(());
        }
        let n = team.n_pes() as u64;
        let one_shot = rs_one_shot(cu, team, bytes);
        let local = stays_local(cu, StreamColl::ReduceScatter, team, bytes);
        self.check_buf(CALL, src, bytes * n, s, local)?;
        self.check_buf(CALL, dest, bytes, s, local)?;
        let args = format!(
            "{} {count} x {dtype}, {}",
            op.name(),
            if one_shot { "one-shot" } else { "two-round" }
        );
        // One-shot reaches only scratch on peers: places are not part of the call. Otherwise
        // in place (the result in my block of src) is the same call on every PE; see all_gather.
        let args = if local {
            args
        } else {
            let (d, s) = host_form(kind, placed, dest, src);
            self.inner.coll_args(args, d, s)
        };
        let Some((l, t)) = self.coll_prepare(team, CALL, args, s, stream)? else {
            return Ok(());
        };
        if t.members.len() == 1 {
            return l.copy_local(dest, src, bytes, stream);
        }
        if one_shot {
            let (c, es) = (count as u64, dtype.size() as u64);
            return l.oneshot(sfx, src, dest, c, c, es, op, stream);
        }
        let grid = grid_for(cu, bytes * n, 16 << 10, 1, 2);
        l.run(
            &format!("symheap_reduce_scatter_{sfx}"),
            grid,
            stream,
            &[
                Arg::U64(src),
                Arg::U64(dest),
                Arg::U64(count as u64),
                Arg::I32(op_code(op)),
            ],
        )
    }

    /// Collective over `team`: every member's `dest` gets `count` elements from member
    /// `root`'s `src`, enqueued on `stream`. On the world team up to 4 MiB (less from 3 PEs up:
    /// `(n - 1) × bytes` about 4 MiB), data and flags travel together; otherwise the root pushes
    /// into every member's `dest` once they arrived.
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
        const CALL: &str = "broadcast_on_stream";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = self.coll_bytes(CALL, count, dtype, 1)? as u64;
        let Some(cu) = self.inner.backend.as_cuda() else {
            return self.broadcast_raw(team, dest, src, count, dtype, root);
        };
        if !team.is_valid() {
            return Ok(());
        }
        if root >= team.n_pes() {
            return Err(self.bad_root(CALL, root, team.n_pes()));
        }
        self.placement(CALL, CollKind::Broadcast, team, dest, src, count, dtype)?;
        if let Some(t) = self.span_team(team) {
            return self.broadcast_span(t, dest, src, count, dtype, root, s);
        }
        let local = stays_local(cu, StreamColl::Broadcast, team, bytes);
        self.check_buf(CALL, dest, bytes, s, local)?;
        self.check_buf(CALL, src, bytes, s, local)?;
        let args = format!("root {root}, {count} x {dtype}");
        // The exchange kernel reaches only scratch on peers: places are not part of the call.
        let args = if local {
            args
        } else {
            self.inner.coll_args(args, dest, src)
        };
        let Some((l, t)) = self.coll_prepare(team, CALL, args, s, stream)? else {
            return Ok(());
        };
        if t.members.len() == 1 {
            return l.copy_local(dest, src, bytes, stream);
        }
        if let Some(k) = l.exchange_kernel(bytes) {
            return l.exchange(k, src, dest, bytes, XCHG_BROADCAST, root as i32, stream);
        }
        let grid = grid_for(cu, bytes, 16 << 10, 1, 2);
        l.run(
            "symheap_broadcast",
            grid,
            stream,
            &[
                Arg::U64(src),
                Arg::U64(dest),
                Arg::U64(bytes),
                Arg::I32(root as i32),
            ],
        )
    }

    /// Collective over `team`: member i's block j (`count` elements at `src + j × count`) lands
    /// at member j's `dest + i × count`, enqueued on `stream`. Never in place: `dest` and `src`
    /// must not overlap (see `ops/alias.rs`). On the world team up
    /// to 4 MiB per pair (less from 3 PEs up: `(n - 1) × bytes` about 4 MiB), data and flags
    /// travel together; otherwise push after an entry round.
    pub fn alltoall_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "alltoall_on_stream";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = self.coll_bytes(CALL, count, dtype, team.n_pes())? as u64;
        let Some(cu) = self.inner.backend.as_cuda() else {
            return self.alltoall_raw(team, dest, src, count, dtype);
        };
        if !team.is_valid() {
            return Ok(());
        }
        self.placement(CALL, CollKind::AllToAll, team, dest, src, count, dtype)?;
        if let Some(t) = self.span_team(team) {
            return self.alltoall_span(t, dest, src, count, dtype, s);
        }
        let total = bytes * team.n_pes() as u64;
        let local = stays_local(cu, StreamColl::Alltoall, team, bytes);
        self.check_buf(CALL, dest, total, s, local)?;
        self.check_buf(CALL, src, total, s, local)?;
        let args = format!("{count} x {dtype}");
        // The exchange kernel reaches only scratch on peers: places are not part of the call.
        let args = if local {
            args
        } else {
            self.inner.coll_args(args, dest, src)
        };
        let Some((l, t)) = self.coll_prepare(team, CALL, args, s, stream)? else {
            return Ok(());
        };
        if t.members.len() == 1 {
            return l.copy_local(dest, src, bytes, stream);
        }
        if let Some(k) = l.exchange_kernel(bytes) {
            return l.exchange(k, src, dest, bytes, XCHG_ALLTOALL, 0, stream);
        }
        let grid = grid_for(cu, total, 16 << 10, 1, 2);
        l.run(
            "symheap_alltoall",
            grid,
            stream,
            &[Arg::U64(src), Arg::U64(dest), Arg::U64(bytes)],
        )
    }
}
