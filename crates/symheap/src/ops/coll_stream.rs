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
use crate::error::{err, invalid, ErrorKind, Result};
use crate::ops::coll::AllReduceAlgo;
use crate::stream::Stream;

/// One-shot messages up to this many bytes take the LL kernel (`SYMHEAP_COLL_LL_MAX` overrides).
/// Measured on 2 x H200: LL and LL128 tie up to 32 KiB, LL128 is 0.1 to 1 us faster above.
const LL_MAX: u64 = 32 << 10;
/// Larger one-shot messages up to this many bytes take the LL128 kernel when their buffers are
/// 16-byte aligned (`SYMHEAP_COLL_LL128_MAX` overrides; 0 turns it off).
const LL128_MAX: u64 = 4 << 20;
/// Auto picks one-shot while `(n - 1) × bytes` (what each PE pushes) stays under this
/// (`SYMHEAP_COLL_ONESHOT_MAX` overrides).
pub const ONE_SHOT_PUSH_MAX: u64 = 4 << 20;
/// reduce_scatter goes one-shot (through the world's scratch) while `(n - 1) × bytes` per member
/// stays under this (`SYMHEAP_COLL_RS_ONESHOT_MAX` overrides).
pub const RS_ONE_SHOT_PUSH_MAX: u64 = 4 << 20;
/// all_gather, alltoall and broadcast on the world team go through the LL exchange kernel while
/// the bytes per member stay under this (`SYMHEAP_COLL_XCHG_LL_MAX` overrides), then through
/// the LL128 exchange kernel up to [`LL128_MAX`] (`SYMHEAP_COLL_XCHG_LL128_MAX` overrides).
const XCHG_LL_MAX: u64 = 64 << 10;
/// `symheap_exchange_ll` modes (coll.cu).
const XCHG_ALL_GATHER: i32 = 0;
const XCHG_ALLTOALL: i32 = 1;
const XCHG_BROADCAST: i32 = 2;

/// Data and wire bytes of one LL128 warp step (coll.cu: 4 lines of 128 bytes, 120 of data each).
const LL128_STEP_DATA: u64 = 480;
const LL128_STEP_WIRE: u64 = 512;

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

    /// The arguments that end the one-shot and exchange kernels' own: every member's scratch
    /// address table and my scratch, then the LL128 region's offset and parity size (`ll128`),
    /// or the scratch slot size.
    fn scratch_args(&self, ll128: bool) -> Vec<Arg> {
        let mut args = vec![
            Arg::U64(self.own + self.dt.peer_scratch()),
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
        let n = self.team.members.len() as u64;
        let tune = |k: &str, d| self.cu.coll_tuning(k, d);
        if self.team.slot != 0 || n < 2 || bytes == 0 {
            None
        } else if 2 * n * bytes <= ONE_SHOT_SLOT
            && bytes <= tune("SYMHEAP_COLL_XCHG_LL_MAX", XCHG_LL_MAX)
        {
            Some(XCHG_LL_KERNEL)
        } else if ll128_fits(bytes, n) && bytes <= tune("SYMHEAP_COLL_XCHG_LL128_MAX", LL128_MAX) {
            Some(XCHG_LL128_KERNEL)
        } else {
            None
        }
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

    fn run(&self, name: &str, grid: u64, stream: u64, head: &[Arg]) -> Result<()> {
        let mut args: Vec<Arg> = head.to_vec();
        args.extend_from_slice(&self.team_args());
        self.cu
            .launch_coll(name, grid.clamp(1, MAX_BLOCKS) as u32, stream, &args)
    }
}

/// The one-shot's LL128 kernel (without its dtype suffix).
const LL128_KERNEL: &str = "symheap_ar_ll128";
/// The exchange kernels (all_gather, alltoall, broadcast on the world team).
const XCHG_LL_KERNEL: &str = "symheap_exchange_ll";
const XCHG_LL128_KERNEL: &str = "symheap_exchange_ll128";

/// Whether `bytes` to each of `n - 1` members fit the LL128 region's sub-region per sender.
fn ll128_fits(bytes: u64, n: u64) -> bool {
    n > 1 && bytes.div_ceil(LL128_STEP_DATA) * LL128_STEP_WIRE <= (LL128_PART / (n - 1)) & !127
}

/// Kernel and grid of a one-shot collective moving `bytes` to each of the other `n - 1`
/// members on a GPU with `sms` SMs: the LL kernel (`symheap_ar_oneshot_*`, data and flags
/// together) from 1 byte up to [`LL_MAX`] when the scratch slot has room for its lines
/// (`2 n bytes`), best with 2 KiB per block and up to 2 blocks per SM; above that the LL128
/// kernel (`symheap_ar_ll128_*`, one flag per 128-byte line) up to [`LL128_MAX`] when the
/// buffers are 16-byte `aligned` and its region has room; else the flag kernel
/// (`symheap_ar_flag_*`), best with 8 KiB per block and one block per SM. `tune` reads
/// `SYMHEAP_COLL_DEFINES` overrides; every member computes the same choice.
fn oneshot_kernel(
    bytes: u64,
    n: u64,
    sms: u64,
    aligned: bool,
    tune: impl Fn(&str, u64) -> u64,
) -> (&'static str, u64) {
    let ll = bytes > 0
        && n > 1
        && bytes <= tune("SYMHEAP_COLL_LL_MAX", LL_MAX)
        && 2 * n * bytes <= ONE_SHOT_SLOT;
    let ll128 = !ll
        && aligned
        && bytes > 0
        && bytes <= tune("SYMHEAP_COLL_LL128_MAX", LL128_MAX)
        && ll128_fits(bytes, n);
    if ll {
        ("symheap_ar_oneshot", ll_grid(bytes, sms, &tune))
    } else if ll128 {
        (LL128_KERNEL, ll128_grid(bytes, sms, true, &tune))
    } else {
        let per = tune("SYMHEAP_COLL_ONESHOT_BLOCK", 8 << 10);
        let sms_x = tune("SYMHEAP_COLL_ONESHOT_SMS", 1);
        ("symheap_ar_flag", blocks(bytes, per, sms, sms_x))
    }
}

/// `ceil(bytes / per)` blocks, at least 1, at most `sms_x` per SM (and MAX_BLOCKS).
fn blocks(bytes: u64, per: u64, sms: u64, sms_x: u64) -> u64 {
    let max = (sms.max(1) * sms_x.max(1)).min(MAX_BLOCKS);
    bytes.div_ceil(per.max(16)).clamp(1, max)
}

/// Grid of the LL kernels: 2 KiB per block, up to 2 blocks per SM (`SYMHEAP_COLL_LL_BLOCK`,
/// `SYMHEAP_COLL_LL_SMS`).
fn ll_grid(bytes: u64, sms: u64, tune: impl Fn(&str, u64) -> u64) -> u64 {
    let per = tune("SYMHEAP_COLL_LL_BLOCK", 2 << 10);
    blocks(bytes, per, sms, tune("SYMHEAP_COLL_LL_SMS", 2))
}

/// Grid of the LL128 kernels: 4 KiB per block, up to 2 blocks per SM (`SYMHEAP_COLL_LL128_BLOCK`,
/// `SYMHEAP_COLL_LL128_SMS`); when `wide` (traffic both ways) and from
/// `SYMHEAP_COLL_LL128_WIDE_MIN` bytes (3 MiB) up to `SYMHEAP_COLL_LL128_WIDE_SMS` (4) per SM,
/// i.e. two waves of resident blocks. Measured on 2 x H200 (bf16, graph), two waves against one:
/// all_reduce 3 MiB 13.6 against 14.2 us, 4 MiB 16.5 against 17.8, but 2 MiB 11.0 against 10.4;
/// all_gather and alltoall of 4 MiB per member 16.5 against 18.3 to 18.9; a broadcast (one way)
/// of 3 MiB 17.5 against 15.6.
fn ll128_grid(bytes: u64, sms: u64, wide: bool, tune: impl Fn(&str, u64) -> u64) -> u64 {
    let per = tune("SYMHEAP_COLL_LL128_BLOCK", 4 << 10);
    let sms_x = if wide && bytes >= tune("SYMHEAP_COLL_LL128_WIDE_MIN", 3 << 20) {
        tune("SYMHEAP_COLL_LL128_WIDE_SMS", 4)
    } else {
        tune("SYMHEAP_COLL_LL128_SMS", 2)
    };
    blocks(bytes, per, sms, sms_x)
}

/// Blocks for moving `bytes` at about `per_block` bytes each, between `min` and `sms_x` times
/// the SM count (grids are what the kernels were measured fastest with on H200; every member
/// computes the same grid, which the kernels require).
fn grid_for(cu: &CudaBackend, bytes: u64, per_block: u64, min: u64, sms_x: u64) -> u64 {
    let max = (cu.sm_count().max(1) as u64 * sms_x).min(MAX_BLOCKS);
    bytes.div_ceil(per_block).clamp(min.min(max), max)
}

/// Orders a launch of `team` on `stream` after the team's previous launch: the team's device
/// state admits one launch at a time, so two streams must not run its collectives at once (they
/// would corrupt each other's epochs and wait forever). On the same stream, stream order does it;
/// on another, `stream` first waits for what the previous stream has enqueued so far, without a
/// host synchronisation. Inside a capture both streams must belong to it (the wait becomes a graph
/// edge); between a capture and eager work the order is the user's (as with any graph: replay it
/// on the stream whose work it follows).
pub(crate) fn order_team(team: &TeamInner, stream: u64) -> Result<()> {
    let mut last = team.last_stream.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(prev) = *last {
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
    *last = Some(stream);
    Ok(())
}

impl Context {
    fn coll_prepare<'a>(
        &'a self,
        team: &'a Team,
        call: &'static str,
        args: String,
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
        order_team(t, stream)?;
        self.inner.record_on(t, call, args);
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
    fn check_range(
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

    /// Collective over `team`: all_reduce of `count` elements of `dtype` from `src` into `dest`
    /// (symmetric addresses; `dest == src` allowed), enqueued on `stream`. One-shot through a
    /// scratch buffer on the world team while `(n - 1) × bytes <= 4 MiB`, two-shot otherwise;
    /// `algo` overrides. One-shot data carries its own flags (one one-way latency, no fence):
    /// LL up to 32 KiB, LL128 above when `src` and `dest` are 16-byte aligned (else one flag
    /// round). f32, f16, bf16 and i32 run on the GPU; other dtypes fall back to the host-driven
    /// path (synchronous).
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
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = (count * dtype.size()) as u64;
        let (Some(cu), Some(sfx)) = (self.inner.backend.as_cuda(), dtype_suffix(dtype)) else {
            return self.all_reduce_raw(team, dest, src, count, dtype, op, algo);
        };
        if !team.is_valid() {
            return Ok(());
        }
        self.check_range(CALL, dest, bytes, s)?;
        self.check_range(CALL, src, bytes, s)?;
        // The world team itself, not a team with the same members: the one-shot scratch and its
        // LL flags follow the world slot's epochs, so another slot must not use them.
        let world = team.0.as_ref().is_some_and(|t| t.slot == 0);
        let one_shot = match algo {
            // The algorithm is a request, as on the host backend: one-shot runs through the
            // world's scratch, so another team or a message larger than a slot goes two-shot.
            AllReduceAlgo::OneShot => world && bytes <= ONE_SHOT_SLOT,
            AllReduceAlgo::TwoShot => false,
            AllReduceAlgo::Auto => {
                world
                    && bytes <= ONE_SHOT_SLOT
                    && (team.n_pes() as u64 - 1) * bytes
                        <= cu.coll_tuning("SYMHEAP_COLL_ONESHOT_MAX", ONE_SHOT_PUSH_MAX)
            }
        };
        let args = format!(
            "{} {count} x {dtype}, {}",
            op.name(),
            if one_shot { "one-shot" } else { "two-shot" }
        );
        let args = self.inner.coll_args(args, dest, src);
        let Some((l, _)) = self.coll_prepare(team, CALL, args, stream)? else {
            return Ok(());
        };
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
    /// on every member, enqueued on `stream`. In place when `src == dest + me × count`. On the
    /// world team, up to 4 MiB per member (less from 3 PEs up: `(n - 1) × bytes` about 4 MiB),
    /// data and flags travel together (one one-way latency); otherwise push after an entry
    /// round.
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
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = (count * dtype.size()) as u64;
        let Some(cu) = self.inner.backend.as_cuda() else {
            let in_place = team
                .my_pe()
                .is_some_and(|me| src == dest + me as u64 * bytes);
            return self.all_gather_raw(
                team,
                dest,
                if in_place { dest } else { src },
                count,
                dtype,
            );
        };
        if !team.is_valid() {
            return Ok(());
        }
        self.check_range(CALL, dest, bytes * team.n_pes() as u64, s)?;
        self.check_range(CALL, src, bytes, s)?;
        // In place is "my contribution already at my block of dest": the same call on every PE,
        // although src differs per PE, so it is recorded as dest == src.
        let mine = dest + team.my_pe().unwrap_or(0) as u64 * bytes;
        let args = self.inner.coll_args(
            format!("{count} x {dtype}"),
            dest,
            if src == mine { dest } else { src },
        );
        let Some((l, t)) = self.coll_prepare(team, CALL, args, stream)? else {
            return Ok(());
        };
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
    /// `dest == src + me × count`. On the world team while the `(n - 1) × count` elements a
    /// member sends take at most 4 MiB: one-shot (every member pushes each block into its
    /// owner's scratch; one synchronisation); otherwise each member pulls its block from every
    /// member.
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
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = (count * dtype.size()) as u64;
        let (Some(cu), Some(sfx)) = (self.inner.backend.as_cuda(), dtype_suffix(dtype)) else {
            let in_place = team
                .my_pe()
                .is_some_and(|me| dest == src + me as u64 * bytes);
            return self.reduce_scatter_raw(
                team,
                if in_place { src } else { dest },
                src,
                count,
                dtype,
                op,
            );
        };
        if !team.is_valid() {
            return Ok(());
        }
        self.check_range(CALL, src, bytes * team.n_pes() as u64, s)?;
        self.check_range(CALL, dest, bytes, s)?;
        let n = team.n_pes() as u64;
        // One-shot (push into the receivers' scratch, one signal) on the world team itself, whose
        // scratch it uses, while a member's block fits a scratch slot.
        let one_shot = team.0.as_ref().is_some_and(|t| t.slot == 0)
            && n > 1
            && bytes <= ONE_SHOT_SLOT
            && (n - 1) * bytes
                <= cu.coll_tuning("SYMHEAP_COLL_RS_ONESHOT_MAX", RS_ONE_SHOT_PUSH_MAX);
        let args = format!(
            "{} {count} x {dtype}, {}",
            op.name(),
            if one_shot { "one-shot" } else { "two-round" }
        );
        // In place (the result in my block of src) is the same call on every PE; see all_gather.
        let mine = src + team.my_pe().unwrap_or(0) as u64 * bytes;
        let args = self
            .inner
            .coll_args(args, if dest == mine { src } else { dest }, src);
        let Some((l, _)) = self.coll_prepare(team, CALL, args, stream)? else {
            return Ok(());
        };
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
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = (count * dtype.size()) as u64;
        let Some(cu) = self.inner.backend.as_cuda() else {
            return self.broadcast_raw(team, dest, src, count, dtype, root);
        };
        if !team.is_valid() {
            return Ok(());
        }
        if root >= team.n_pes() {
            return Err(invalid(
                CALL,
                format!("root {root} is not a member of a team of {}", team.n_pes()),
            )
            .with_pe(self.my_pe()));
        }
        self.check_range(CALL, dest, bytes, s)?;
        self.check_range(CALL, src, bytes, s)?;
        let args = self
            .inner
            .coll_args(format!("root {root}, {count} x {dtype}"), dest, src);
        let Some((l, _)) = self.coll_prepare(team, CALL, args, stream)? else {
            return Ok(());
        };
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
    /// at member j's `dest + i × count`, enqueued on `stream`. Not in place. On the world team up
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
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
        let bytes = (count * dtype.size()) as u64;
        let Some(cu) = self.inner.backend.as_cuda() else {
            return self.alltoall_raw(team, dest, src, count, dtype);
        };
        if !team.is_valid() {
            return Ok(());
        }
        if dest == src && bytes > 0 {
            return Err(invalid(
                CALL,
                "alltoall cannot run in place; use separate source and destination buffers",
            )
            .with_pe(self.my_pe()));
        }
        let total = bytes * team.n_pes() as u64;
        self.check_range(CALL, dest, total, s)?;
        self.check_range(CALL, src, total, s)?;
        let args = self
            .inner
            .coll_args(format!("{count} x {dtype}"), dest, src);
        let Some((l, _)) = self.coll_prepare(team, CALL, args, stream)? else {
            return Ok(());
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_with(
        bytes: u64,
        n: u64,
        aligned: bool,
        defines: &[(&str, u64)],
    ) -> (&'static str, u64) {
        oneshot_kernel(bytes, n, 132, aligned, |k, d| {
            defines
                .iter()
                .find(|(name, _)| *name == k)
                .map_or(d, |&(_, v)| v)
        })
    }
    fn plan(bytes: u64, n: u64, defines: &[(&str, u64)]) -> (&'static str, u64) {
        plan_with(bytes, n, true, defines)
    }

    const LL: &str = "symheap_ar_oneshot";
    const FLAG: &str = "symheap_ar_flag";
    const LL128: &str = LL128_KERNEL;

    #[test]
    fn oneshot_kernels_and_grids() {
        // LL: 2 KiB per block, at most 2 blocks per SM.
        assert_eq!(plan(2, 2, &[]), (LL, 1));
        assert_eq!(plan(8 << 10, 2, &[]), (LL, 4));
        assert_eq!(plan(LL_MAX, 2, &[]), (LL, 16));
        assert_eq!(plan(LL_MAX, 8, &[]), (LL, 16));
        // LL128 above: 4 KiB per block, at most 2 blocks per SM.
        assert_eq!(plan(LL_MAX + 16, 2, &[]), (LL128, 9));
        assert_eq!(plan(512 << 10, 2, &[]), (LL128, 128));
        assert_eq!(plan(2 << 20, 2, &[]), (LL128, 264));
        assert_eq!(plan(3 << 20, 2, &[]), (LL128, 528));
        assert_eq!(plan(4 << 20, 2, &[]), (LL128, 528));
        assert_eq!(plan(256 << 10, 16, &[]), (LL128, 64));
        // Flag: 8 KiB per block, at most one per SM: unaligned buffers, above LL128_MAX, for an
        // empty message (LL and LL128 would wait for nobody) and for a team of one.
        assert_eq!(plan_with(512 << 10, 2, false, &[]), (FLAG, 64));
        assert_eq!(plan((4 << 20) + 16, 2, &[]), (FLAG, 132));
        assert_eq!(plan(0, 2, &[]), (FLAG, 1));
        assert_eq!(plan(4096, 1, &[]), (FLAG, 1));
    }

    #[test]
    fn ll128_grid_goes_wide_only_both_ways_and_large() {
        let d = |_: &str, d: u64| d;
        assert_eq!(ll128_grid(4 << 20, 132, true, d), 528);
        assert_eq!(ll128_grid(4 << 20, 132, false, d), 264);
        assert_eq!(ll128_grid((3 << 20) - 1, 132, true, d), 264);
        assert_eq!(ll128_grid(64 << 10, 132, true, d), 16);
    }

    #[test]
    fn ll128_region_holds_what_auto_sends_one_shot() {
        // Auto goes one-shot while (n - 1) x bytes <= ONE_SHOT_PUSH_MAX: the largest such
        // message must fit every sender's sub-region, at every team size.
        for n in 2..=64u64 {
            let bytes = ONE_SHOT_PUSH_MAX / (n - 1);
            assert!(ll128_fits(bytes, n), "n = {n}, {bytes} bytes");
            assert_ne!(plan(bytes, n, &[]).0, FLAG, "n = {n}");
        }
        assert!(!ll128_fits(LL128_PART, 2));
        assert!(!ll128_fits(1, 1));
        // The region follows the scratch table, 256-byte aligned (the kernel needs 128).
        let dt = DeviceTeams::new(0, 3);
        assert_eq!(dt.ll128() % 256, 0);
        assert!(dt.scratch() + dt.ll128() >= dt.peer_scratch() + 8 * 3);
        assert_eq!(
            dt.scratch() + dt.ll128() + 2 * LL128_PART,
            DeviceTeams::bytes(3)
        );
    }

    #[test]
    fn oneshot_tuning() {
        let t = |b, d: &[(&str, u64)]| plan(b, 2, d);
        let flag = |b, d: &[(&str, u64)]| plan_with(b, 2, false, d);
        assert_eq!(
            flag(512 << 10, &[("SYMHEAP_COLL_ONESHOT_BLOCK", 4 << 10)]),
            (FLAG, 128)
        );
        assert_eq!(
            flag(4 << 20, &[("SYMHEAP_COLL_ONESHOT_SMS", 2)]),
            (FLAG, 264)
        );
        assert_eq!(t(512 << 10, &[("SYMHEAP_COLL_LL_MAX", 1 << 20)]), (LL, 256));
        assert_eq!(
            t(256 << 10, &[("SYMHEAP_COLL_LL_MAX", 256 << 10)]),
            (LL, 128)
        );
        assert_eq!(t(8 << 10, &[("SYMHEAP_COLL_LL_MAX", 0)]), (LL128, 2));
        assert_eq!(
            t(
                8 << 10,
                &[("SYMHEAP_COLL_LL_MAX", 0), ("SYMHEAP_COLL_LL128_MAX", 0)]
            ),
            (FLAG, 1)
        );
        assert_eq!(
            t(512 << 10, &[("SYMHEAP_COLL_LL128_MAX", 256 << 10)]),
            (FLAG, 64)
        );
        assert_eq!(
            t(512 << 10, &[("SYMHEAP_COLL_LL128_BLOCK", 16 << 10)]),
            (LL128, 32)
        );
        assert_eq!(t(2 << 20, &[("SYMHEAP_COLL_LL128_SMS", 1)]), (LL128, 132));
        assert_eq!(
            t(2 << 20, &[("SYMHEAP_COLL_LL128_WIDE_MIN", 2 << 20)]),
            (LL128, 512)
        );
        assert_eq!(
            t(4 << 20, &[("SYMHEAP_COLL_LL128_WIDE_SMS", 2)]),
            (LL128, 264)
        );
        assert_eq!(t(8 << 10, &[("SYMHEAP_COLL_LL_BLOCK", 1 << 10)]), (LL, 8));
        // Nonsense values stay in range.
        assert_eq!(t(8 << 10, &[("SYMHEAP_COLL_LL_BLOCK", 0)]), (LL, 264));
        assert_eq!(
            t(
                256 << 10,
                &[
                    ("SYMHEAP_COLL_LL_MAX", 256 << 10),
                    ("SYMHEAP_COLL_LL_SMS", 0)
                ]
            ),
            (LL, 128)
        );
    }
}
