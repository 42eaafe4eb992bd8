//! Which kernel and grid a stream collective runs (one-shot or not, LL or LL128, the exchange
//! kernels), decided from the team, the size and the tuning variables alone: the same on every
//! PE for the same call, and what says whether a kernel touches its buffers on this PE only.

use crate::backend::cuda::coll_args::{ByteKernel, CollDType, ReduceKernel};
use crate::backend::cuda::CudaBackend;
use crate::backend::AnyBackend;
use crate::context::device_state::{LL128_PART, MAX_BLOCKS, ONE_SHOT_SLOT};
use crate::context::team::{Team, TeamInner};
use crate::context::Context;
use crate::element::DType;
use crate::ops::alias::CollKind;
use crate::ops::coll::AllReduceAlgo;

/// One-shot messages up to this many bytes take the LL kernel (`SYMHEAP_COLL_LL_MAX` overrides).
/// Measured on 2 x H200: LL and LL128 tie up to 32 KiB, LL128 is 0.1 to 1 us faster above.
pub(super) const LL_MAX: u64 = 32 << 10;
/// Larger one-shot messages up to this many bytes take the LL128 kernel when their buffers are
/// 16-byte aligned (`SYMHEAP_COLL_LL128_MAX` overrides; 0 turns it off).
pub(super) const LL128_MAX: u64 = 4 << 20;
/// Auto picks one-shot while `(n - 1) × bytes` (what each PE pushes) stays under this
/// (`SYMHEAP_COLL_ONESHOT_MAX` overrides).
pub(super) const ONE_SHOT_PUSH_MAX: u64 = 4 << 20;
/// reduce_scatter goes one-shot (through the scratch) while `(n - 1) × bytes` per member
/// stays under this (`SYMHEAP_COLL_RS_ONESHOT_MAX` overrides).
pub(super) const RS_ONE_SHOT_PUSH_MAX: u64 = 4 << 20;
/// all_gather, alltoall and broadcast on the team owning the scratch go through the LL exchange kernel while
/// the bytes per member stay under this (`SYMHEAP_COLL_XCHG_LL_MAX` overrides), then through
/// the LL128 exchange kernel up to [`LL128_MAX`] (`SYMHEAP_COLL_XCHG_LL128_MAX` overrides).
pub(super) const XCHG_LL_MAX: u64 = 64 << 10;

/// Data and wire bytes of one LL128 warp step (coll.cu: 4 lines of 128 bytes, 120 of data each).
pub(super) const LL128_STEP_DATA: u64 = 480;
pub(super) const LL128_STEP_WIRE: u64 = 512;

/// The exchange kernel (small and mid-size all_gather, alltoall, broadcast) for `bytes` per
/// member, if one applies: only on the team that owns the scratch (whose scratch and epochs
/// they use) and never for an empty message (a launch without data would wait for nobody, see
/// coll.cu, ar_oneshot). `symheap_exchange_ll` up to `SYMHEAP_COLL_XCHG_LL_MAX` with room for
/// its lines in a scratch slot, then `symheap_exchange_ll128` up to
/// `SYMHEAP_COLL_XCHG_LL128_MAX` with room in the LL128 region.
pub(super) fn exchange_kernel(
    cu: &CudaBackend,
    team: &TeamInner,
    bytes: u64,
) -> Option<ByteKernel> {
    let n = team.members.len() as u64;
    let tune = |k: &str, d| cu.coll_tuning(k, d);
    if !team.scratch || n < 2 || bytes == 0 {
        None
    } else if 2 * n * bytes <= ONE_SHOT_SLOT
        && bytes <= tune("SYMHEAP_COLL_XCHG_LL_MAX", XCHG_LL_MAX)
    {
        Some(ByteKernel::ExchangeLl)
    } else if ll128_fits(bytes, n) && bytes <= tune("SYMHEAP_COLL_XCHG_LL128_MAX", LL128_MAX) {
        Some(ByteKernel::ExchangeLl128)
    } else {
        None
    }
}

/// Whether all_reduce of `bytes` on `team` runs one-shot: through the scratch, so only on the
/// team that owns it (another team with the same members has other epochs; see
/// `TeamInner::scratch`) and only while a message fits a slot; `Auto` also while what each PE
/// pushes stays under the tuning.
pub(super) fn ar_one_shot(cu: &CudaBackend, team: &Team, bytes: u64, algo: AllReduceAlgo) -> bool {
    let owner = team.0.as_ref().is_some_and(|t| t.scratch);
    match algo {
        AllReduceAlgo::OneShot => owner && bytes <= ONE_SHOT_SLOT,
        AllReduceAlgo::TwoShot => false,
        AllReduceAlgo::Auto => {
            owner
                && bytes <= ONE_SHOT_SLOT
                && (team.n_pes() as u64 - 1) * bytes
                    <= cu.coll_tuning("SYMHEAP_COLL_ONESHOT_MAX", ONE_SHOT_PUSH_MAX)
        }
    }
}

/// Whether reduce_scatter of `bytes` per member on `team` runs one-shot (push into the
/// receivers' scratch, one signal): on the team that owns the scratch, while a member's block
/// fits a scratch slot.
pub(super) fn rs_one_shot(cu: &CudaBackend, team: &Team, bytes: u64) -> bool {
    let n = team.n_pes() as u64;
    team.0.as_ref().is_some_and(|t| t.scratch)
        && n > 1
        && bytes <= ONE_SHOT_SLOT
        && (n - 1) * bytes <= cu.coll_tuning("SYMHEAP_COLL_RS_ONESHOT_MAX", RS_ONE_SHOT_PUSH_MAX)
}

/// A collective on a stream, for [`crate::Context::coll_takes_local_buffers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamColl {
    /// all_reduce with this algorithm request.
    AllReduce(AllReduceAlgo),
    /// reduce_scatter.
    ReduceScatter,
    /// all_gather.
    AllGather,
    /// broadcast.
    Broadcast,
    /// alltoall.
    Alltoall,
}

impl StreamColl {
    /// The kind's buffer shapes (for its lengths and the aliasing rules).
    pub(crate) fn shape(self) -> CollKind {
        match self {
            StreamColl::AllReduce(_) => CollKind::AllReduce,
            StreamColl::ReduceScatter => CollKind::ReduceScatter,
            StreamColl::AllGather => CollKind::AllGather,
            StreamColl::Broadcast => CollKind::Broadcast,
            StreamColl::Alltoall => CollKind::AllToAll,
        }
    }
}

impl Context {
    /// Whether `coll` of `bytes` per member on `team` runs a kernel that reads its source and
    /// writes its destination on the calling PE only (one-shot all_reduce and reduce_scatter;
    /// the exchange kernels of all_gather, alltoall and broadcast): then the `*_on_stream` call
    /// takes any device memory of this PE's GPU for both, not only symmetric memory, with no
    /// copy. The answer is the same on every PE for the same call (it depends on the team, the
    /// size and the tuning variables only). Always false on the host backend, whose
    /// collectives read peers' copies.
    pub fn coll_takes_local_buffers(&self, coll: StreamColl, team: &Team, bytes: u64) -> bool {
        let AnyBackend::Cuda(cu) = &self.inner.backend else {
            return false;
        };
        stays_local(cu, coll, team, bytes)
    }

    /// Whether stream collective `coll` on `team` can take its buffers as they are, with
    /// `count` elements of `dtype` per block at `dest` and `src` (this PE's addresses, each as
    /// long as the kind says): `Some((dest_symmetric, src_symmetric))` when each buffer lies in
    /// this PE's heap or the kernel touches it on this PE only
    /// ([`Context::coll_takes_local_buffers`], a reduction of a dtype the kernels have), None
    /// when one must be staged into symmetric memory first (or this PE is not a member). One
    /// question for a binding's fast path, instead of one per buffer and one for the kernel;
    /// the collective itself still checks every range (a buffer taken as local must be device
    /// memory of this PE's GPU, or the call fails naming it).
    pub fn coll_direct_buffers(
        &self,
        coll: StreamColl,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
    ) -> Option<(bool, bool)> {
        team.my_pe()?;
        let bytes = (count as u64).checked_mul(dtype.size() as u64)?;
        let (d, s) = coll.shape().blocks(team.n_pes() as u128);
        let sym = |addr: u64, blocks: u128| {
            let len = u64::try_from(blocks.checked_mul(bytes as u128)?).ok()?;
            let last = addr.checked_add(len.max(1) - 1);
            Some(last.is_some_and(|last| self.is_symmetric(addr) && self.is_symmetric(last)))
        };
        let ds = sym(dest, d)?;
        let ss = sym(src, s)?;
        if ds && ss {
            return Some((true, true));
        }
        let reduces = matches!(coll, StreamColl::AllReduce(_) | StreamColl::ReduceScatter);
        if reduces && CollDType::of(dtype).is_none() {
            return None;
        }
        self.coll_takes_local_buffers(coll, team, bytes)
            .then_some((ds, ss))
    }
}

/// The largest team whose one-shot and exchange kernels take local buffers (see
/// [`stays_local`]).
pub(super) const LOCAL_MAX_MEMBERS: usize = 2;

/// Whether `coll` of `bytes` per member on `team` touches its buffers on this PE only: a team
/// of one (every collective is a local copy), one-shot all_reduce and reduce_scatter (which
/// reach only peers' scratch), and the exchange kernels of all_gather, alltoall and broadcast.
pub(super) fn stays_local(cu: &CudaBackend, coll: StreamColl, team: &Team, bytes: u64) -> bool {
    let Some(t) = team.0.as_ref() else {
        return false;
    };
    if t.members.len() == 1 {
        return true;
    }
    if t.spans {
        // NCCL over the team's communicator, on symmetric buffers (checked as such).
        return false;
    }
    // Verified by value at 2 PEs only: at 4 and 8 PEs (sharing one GPU) the coll-local
    // self-test saw a wrong all_reduce through device buffers, not yet explained, so larger
    // teams stage ordinary buffers until it is (BENCHMARKS.md, 2026-12-01 fifth session).
    if t.members.len() > LOCAL_MAX_MEMBERS {
        return false;
    }
    match coll {
        StreamColl::AllReduce(algo) => ar_one_shot(cu, team, bytes, algo),
        StreamColl::ReduceScatter => rs_one_shot(cu, team, bytes),
        StreamColl::AllGather | StreamColl::Broadcast | StreamColl::Alltoall => {
            exchange_kernel(cu, t, bytes).is_some()
        }
    }
}

/// Whether `bytes` to each of `n - 1` members fit the LL128 region's sub-region per sender.
pub(super) fn ll128_fits(bytes: u64, n: u64) -> bool {
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
pub(super) fn oneshot_kernel(
    bytes: u64,
    n: u64,
    sms: u64,
    aligned: bool,
    tune: impl Fn(&str, u64) -> u64,
) -> (ReduceKernel, u64) {
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
        (ReduceKernel::ArOneshot, ll_grid(bytes, sms, &tune))
    } else if ll128 {
        (ReduceKernel::ArLl128, ll128_grid(bytes, sms, true, &tune))
    } else {
        let per = tune("SYMHEAP_COLL_ONESHOT_BLOCK", 8 << 10);
        let sms_x = tune("SYMHEAP_COLL_ONESHOT_SMS", 1);
        (ReduceKernel::ArFlag, blocks(bytes, per, sms, sms_x))
    }
}

/// `ceil(bytes / per)` blocks, at least 1, at most `sms_x` per SM (and MAX_BLOCKS).
pub(super) fn blocks(bytes: u64, per: u64, sms: u64, sms_x: u64) -> u64 {
    let max = (sms.max(1) * sms_x.max(1)).min(MAX_BLOCKS);
    bytes.div_ceil(per.max(16)).clamp(1, max)
}

/// Grid of the LL kernels: 2 KiB per block, up to 2 blocks per SM (`SYMHEAP_COLL_LL_BLOCK`,
/// `SYMHEAP_COLL_LL_SMS`).
pub(super) fn ll_grid(bytes: u64, sms: u64, tune: impl Fn(&str, u64) -> u64) -> u64 {
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
pub(super) fn ll128_grid(bytes: u64, sms: u64, wide: bool, tune: impl Fn(&str, u64) -> u64) -> u64 {
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
pub(super) fn grid_for(cu: &CudaBackend, bytes: u64, per_block: u64, min: u64, sms_x: u64) -> u64 {
    let max = (cu.sm_count().max(1) as u64 * sms_x).min(MAX_BLOCKS);
    bytes.div_ceil(per_block).clamp(min.min(max), max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::device_state::DeviceTeams;

    fn plan_with(
        bytes: u64,
        n: u64,
        aligned: bool,
        defines: &[(&str, u64)],
    ) -> (ReduceKernel, u64) {
        oneshot_kernel(bytes, n, 132, aligned, |k, d| {
            defines
                .iter()
                .find(|(name, _)| *name == k)
                .map_or(d, |&(_, v)| v)
        })
    }
    fn plan(bytes: u64, n: u64, defines: &[(&str, u64)]) -> (ReduceKernel, u64) {
        plan_with(bytes, n, true, defines)
    }

    const LL: ReduceKernel = ReduceKernel::ArOneshot;
    const FLAG: ReduceKernel = ReduceKernel::ArFlag;
    const LL128: ReduceKernel = ReduceKernel::ArLl128;

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
