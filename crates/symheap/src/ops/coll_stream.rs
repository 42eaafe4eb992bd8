//! Collectives on a stream: on CUDA, one kernel per call (coll.cu) that synchronises with the
//! other members through flags in symmetric memory, so it can be captured in a CUDA graph; on
//! the host backend the host collectives, run to completion.
//!
//! Collective-order rule: every member of the team calls each collective in the same order with
//! the same arguments; the calls are recorded in the team's ledger and compared at the next host
//! collective point.

use super::area::MAX_TEAMS;
use super::team::{Team, TeamInner};
use crate::backend::cuda::driver::Arg;
use crate::backend::cuda::{CudaBackend, COLL_DTYPES};
use crate::backend::ReduceOp;
use crate::context::{Context, Inner};
use crate::element::DType;
use crate::error::{err, invalid, ErrorKind, Result};
use crate::heap::align_up;
use crate::ops::coll::AllReduceAlgo;

/// Blocks a collective launch may use (the flag areas are sized for it).
pub const MAX_BLOCKS: u64 = 1024;
/// Bytes per member slot of the world's one-shot scratch: the largest one-shot all_reduce.
/// The kernels' packed small-message path also needs `2 × n × bytes <= slot` for messages up to
/// 256 KiB, which 4 MiB covers up to 8 PEs.
pub const ONE_SHOT_SLOT: u64 = 4 << 20;
/// Auto picks one-shot while `(n - 1) × bytes` (what each PE pushes) stays under this.
pub const ONE_SHOT_PUSH_MAX: u64 = 4 << 20;

/// Device-resident state of every team slot, and the world's one-shot scratch, in this PE's
/// heap (CUDA only). Per slot: `flags[2][MAX_BLOCKS][W]`, `ctl[2]` (epoch, blocks done),
/// `bases[W]` (member heap bases), `peer_flags[W]` (member flag areas); W = world size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceTeams {
    offset: u64,
    world: usize,
    stride: u64,
    scratch: u64,
}

impl DeviceTeams {
    fn flags_bytes(world: usize) -> u64 {
        2 * MAX_BLOCKS * world as u64 * 8
    }

    fn stride(world: usize) -> u64 {
        align_up(Self::flags_bytes(world) + 256 + 16 * world as u64, 256).expect("small")
    }

    /// Bytes for the team slots; the scratch follows: `2 × W × ONE_SHOT_SLOT` plus the
    /// member scratch table.
    pub(crate) fn bytes(world: usize) -> u64 {
        MAX_TEAMS as u64 * Self::stride(world) + 2 * world as u64 * ONE_SHOT_SLOT + 8 * world as u64
    }

    pub(crate) fn new(offset: u64, world: usize) -> DeviceTeams {
        DeviceTeams {
            offset,
            world,
            stride: Self::stride(world),
            scratch: offset + MAX_TEAMS as u64 * Self::stride(world),
        }
    }

    pub(crate) fn flags(&self, slot: usize) -> u64 {
        self.offset + slot as u64 * self.stride
    }
    pub(crate) fn ctl(&self, slot: usize) -> u64 {
        self.flags(slot) + Self::flags_bytes(self.world)
    }
    pub(crate) fn bases(&self, slot: usize) -> u64 {
        self.ctl(slot) + 256
    }
    pub(crate) fn peer_flags(&self, slot: usize) -> u64 {
        self.bases(slot) + 8 * self.world as u64
    }
    /// The world's one-shot scratch.
    pub(crate) fn scratch(&self) -> u64 {
        self.scratch
    }
    /// The table of every PE's scratch address.
    pub(crate) fn peer_scratch(&self) -> u64 {
        self.scratch + 2 * self.world as u64 * ONE_SHOT_SLOT
    }
    /// Bytes of a slot's flags and control words (what team_destroy clears).
    pub(crate) fn slot_state_bytes(&self) -> u64 {
        Self::flags_bytes(self.world) + 16
    }
}

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

impl Inner {
    /// Writes this PE's copy of `team`'s member tables (heap bases and flag areas) for the
    /// collective kernels. Local; flags and counters of a fresh slot are already zero.
    pub(crate) fn init_device_team(&self, team: &TeamInner) -> Result<()> {
        let Some(dt) = self.dteams.get() else {
            return Ok(());
        };
        let own = self.backend.slot_base(self.rank).expect("own heap");
        let mut bases = Vec::with_capacity(8 * team.members.len());
        let mut flags = Vec::with_capacity(8 * team.members.len());
        for &m in &team.members {
            let b = self.backend.slot_base(m).unwrap_or(0);
            bases.extend_from_slice(&b.to_le_bytes());
            let f = if b == 0 { 0 } else { b + dt.flags(team.slot) };
            flags.extend_from_slice(&f.to_le_bytes());
        }
        self.backend
            .write_bytes(own + dt.bases(team.slot), &bases)?;
        self.backend
            .write_bytes(own + dt.peer_flags(team.slot), &flags)
    }

    /// Clears this PE's flags and counters of a destroyed team's slot.
    pub(crate) fn clear_device_team(&self, slot: usize) -> Result<()> {
        let Some(dt) = self.dteams.get() else {
            return Ok(());
        };
        let own = self.backend.slot_base(self.rank).expect("own heap");
        self.backend.write_bytes(
            own + dt.flags(slot),
            &vec![0u8; dt.slot_state_bytes() as usize],
        )
    }

    /// CUDA only, collective at init: the device team state for every slot and the world's.
    pub(crate) fn init_device_teams(&self) -> Result<()> {
        if self.backend.as_cuda().is_none() {
            return Ok(());
        }
        let block = self.allocate(DeviceTeams::bytes(self.world), 256, "init")?;
        let dt = DeviceTeams::new(block.offset, self.world);
        let own = self.backend.slot_base(self.rank).expect("own heap");
        self.backend
            .write_bytes(own + block.offset, &vec![0u8; block.bytes as usize])?;
        let table: Vec<u8> = (0..self.world)
            .flat_map(|pe| {
                self.backend
                    .slot_base(pe)
                    .map_or(0, |b| b + dt.scratch())
                    .to_le_bytes()
            })
            .collect();
        self.backend.write_bytes(own + dt.peer_scratch(), &table)?;
        let _ = self.dteams.set(dt);
        self.init_device_team(&self.world_team)
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

    fn run(&self, name: &str, grid: u64, stream: u64, head: &[Arg]) -> Result<()> {
        let mut args: Vec<Arg> = head.to_vec();
        args.extend_from_slice(&self.team_args());
        self.cu
            .launch_coll(name, grid.clamp(1, MAX_BLOCKS) as u32, stream, &args)
    }
}

/// Blocks for moving `bytes` at about `per_block` bytes each, between `min` and `sms_x` times
/// the SM count (grids are what the kernels were measured fastest with on H200; every member
/// computes the same grid, which the kernels require).
fn grid_for(cu: &CudaBackend, bytes: u64, per_block: u64, min: u64, sms_x: u64) -> u64 {
    let max = (cu.sm_count().max(1) as u64 * sms_x).min(MAX_BLOCKS);
    bytes.div_ceil(per_block).clamp(min.min(max), max)
}

impl Context {
    fn coll_prepare<'a>(
        &'a self,
        team: &'a Team,
        call: &'static str,
        args: String,
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
        t.ledger().record(call, args);
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

    fn check_range(&self, call: &'static str, addr: u64, bytes: u64) -> Result<()> {
        self.inner.own_offset(addr, bytes.max(1), call).map(drop)
    }

    /// Collective over `team`: all_reduce of `count` elements of `dtype` from `src` into `dest`
    /// (symmetric addresses; `dest == src` allowed), enqueued on `stream`. One-shot through a
    /// scratch buffer (one synchronisation) up to 512 KiB on the world team, two-shot otherwise;
    /// `algo` overrides. f32, f16, bf16 and i32 run on the GPU; other dtypes fall back to the
    /// host-driven path (synchronous).
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
        stream: u64,
    ) -> Result<()> {
        const CALL: &str = "all_reduce_on_stream";
        let bytes = (count * dtype.size()) as u64;
        let (Some(cu), Some(sfx)) = (self.inner.backend.as_cuda(), dtype_suffix(dtype)) else {
            return self.all_reduce_raw(team, dest, src, count, dtype, op, algo);
        };
        if !team.is_valid() {
            return Ok(());
        }
        self.check_range(CALL, dest, bytes)?;
        self.check_range(CALL, src, bytes)?;
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
                    && (team.n_pes() as u64 - 1) * bytes <= ONE_SHOT_PUSH_MAX
            }
        };
        let args = format!(
            "{} {count} x {dtype}, {}",
            op.name(),
            if one_shot { "one-shot" } else { "two-shot" }
        );
        let Some((l, t)) = self.coll_prepare(team, CALL, args)? else {
            return Ok(());
        };
        let n = t.members.len() as u64;
        if one_shot {
            // The packed small-message path moves 2 KiB per block best; the flagged path 8 KiB.
            let packed = bytes <= 256 << 10 && ONE_SHOT_SLOT >= 2 * n * bytes;
            let grid = if packed {
                grid_for(cu, bytes, 2 << 10, 1, 2)
            } else {
                grid_for(cu, bytes, 8 << 10, 1, 1)
            };
            l.run(
                &format!("symheap_ar_oneshot_{sfx}"),
                grid,
                stream,
                &[
                    Arg::U64(src),
                    Arg::U64(dest),
                    Arg::U64(count as u64),
                    Arg::I32(op_code(op)),
                    Arg::U64(l.own + l.dt.peer_scratch()),
                    Arg::U64(l.own + l.dt.scratch()),
                    Arg::U64(ONE_SHOT_SLOT),
                ],
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
    /// on every member, enqueued on `stream`. In place when `src == dest + me × count`.
    pub fn all_gather_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<()> {
        const CALL: &str = "all_gather_on_stream";
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
        self.check_range(CALL, dest, bytes * team.n_pes() as u64)?;
        self.check_range(CALL, src, bytes)?;
        let Some((l, t)) = self.coll_prepare(team, CALL, format!("{count} x {dtype}"))? else {
            return Ok(());
        };
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
    /// `dest == src + me × count`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: u64,
    ) -> Result<()> {
        const CALL: &str = "reduce_scatter_on_stream";
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
        self.check_range(CALL, src, bytes * team.n_pes() as u64)?;
        self.check_range(CALL, dest, bytes)?;
        let Some((l, _)) =
            self.coll_prepare(team, CALL, format!("{} {count} x {dtype}", op.name()))?
        else {
            return Ok(());
        };
        let grid = grid_for(cu, bytes * team.n_pes() as u64, 16 << 10, 1, 2);
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
    /// `root`'s `src`, enqueued on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn broadcast_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        const CALL: &str = "broadcast_on_stream";
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
        self.check_range(CALL, dest, bytes)?;
        self.check_range(CALL, src, bytes)?;
        let Some((l, _)) =
            self.coll_prepare(team, CALL, format!("root {root}, {count} x {dtype}"))?
        else {
            return Ok(());
        };
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
    /// at member j's `dest + i × count`, enqueued on `stream`. Not in place.
    pub fn alltoall_on_stream(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<()> {
        const CALL: &str = "alltoall_on_stream";
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
        self.check_range(CALL, dest, total)?;
        self.check_range(CALL, src, total)?;
        let Some((l, _)) = self.coll_prepare(team, CALL, format!("{count} x {dtype}"))? else {
            return Ok(());
        };
        let grid = grid_for(cu, total, 16 << 10, 1, 2);
        l.run(
            "symheap_alltoall",
            grid,
            stream,
            &[Arg::U64(src), Arg::U64(dest), Arg::U64(bytes)],
        )
    }
}
