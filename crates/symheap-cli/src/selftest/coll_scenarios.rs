//! Self-test scenarios for the collectives on streams (both backends), their CUDA-graph replay
//! and their agreement with NCCL (GPU only).
#![allow(clippy::needless_range_loop, clippy::neg_cmp_op_on_partial_ord)]

use half::{bf16, f16};
use symheap::tools::Graph;
use symheap::tools::Nccl;
use symheap::{AllReduceAlgo, Context, DType, ReduceOp, SymmetricBuffer, Team};

use super::ops_scenarios::{close, data, poison, reference, TestElem};
use super::scenarios::{e2s, Outcome, PeArgs};

/// A stream of this PE's GPU (on the host backend, the calling thread).
fn stream(ctx: &Context) -> Result<symheap::Stream, String> {
    ctx.create_stream().map_err(e2s)
}

/// Launches one collective case and waits for it; errors name the case. With
/// SYMHEAP_SELFTEST_TRACE set each case is printed before it starts (to find a faulting kernel).
fn launch_case(
    ctx: &Context,
    s: &symheap::Stream,
    what: &str,
    f: impl FnOnce() -> symheap::Result<()>,
) -> Outcome {
    if std::env::var_os("SYMHEAP_SELFTEST_TRACE").is_some() {
        eprintln!("case: {what}");
    }
    f().map_err(|e| format!("{what}: {e}"))?;
    ctx.sync_stream(s).map_err(|e| format!("{what}: {e}"))
}

fn check_vec<T: TestElem>(got: &[T], want: &[f64], scale: &[f64], what: &str) -> Outcome {
    for i in 0..got.len() {
        ensure!(
            close(got[i], want[i], scale[i]),
            "{what}: element {i} = {}, expected {}",
            got[i].to_f64(),
            want[i]
        );
    }
    Ok(())
}

/// One all_reduce on the stream against the sequential reference, with source and destination
/// `off` elements into their allocations (an odd `off` makes them not 16-byte aligned, which the
/// vector and LL128 paths require).
#[allow(clippy::too_many_arguments)]
fn ar_case<T: TestElem>(
    ctx: &Context,
    team: &Team,
    s: &symheap::Stream,
    a: PeArgs,
    count: usize,
    op: ReduceOp,
    algo: AllReduceAlgo,
    in_place: bool,
    tag: u64,
    off: usize,
) -> Outcome {
    let me = ctx.my_pe();
    let sz = std::mem::size_of::<T>();
    let src = ctx.malloc(((off + count) * sz) as u64).map_err(e2s)?;
    let dst = ctx.malloc(((off + count) * sz) as u64).map_err(e2s)?;
    src.write(off, &data::<T>(a.seed, me, tag, count))
        .map_err(e2s)?;
    poison(&dst)?;
    let d = if in_place { &src } else { &dst };
    ctx.barrier_all().map_err(e2s)?;
    let what = format!(
        "all_reduce {} {} {algo:?} in_place={in_place} count {count} offset {off} on {} PEs",
        op.name(),
        T::DTYPE,
        team.n_pes()
    );
    let at = (off * sz) as u64;
    launch_case(ctx, s, &what, || {
        ctx.all_reduce_on_stream(
            team,
            d.addr() + at,
            src.addr() + at,
            count,
            T::DTYPE,
            op,
            algo,
            s,
        )
    })?;
    let inputs: Vec<Vec<T>> = team
        .members()
        .iter()
        .map(|&p| data::<T>(a.seed, p, tag, count))
        .collect();
    let (want, scale) = reference(&inputs, op);
    let mut got = vec![T::zeroed(); count];
    d.read(off, &mut got).map_err(e2s)?;
    check_vec(&got, &want, &scale, &what)?;
    ctx.barrier_all().map_err(e2s)
}

/// Sum all_reduces, out of place and in place, with the buffers `off` elements into their
/// allocations (not 16-byte aligned for odd `off`).
fn ar_unaligned<T: TestElem>(
    ctx: &Context,
    team: &Team,
    s: &symheap::Stream,
    a: PeArgs,
    count: usize,
    tag: u64,
    off: usize,
) -> Outcome {
    let (op, algo) = (ReduceOp::Sum, AllReduceAlgo::Auto);
    for in_place in [false, true] {
        ar_case::<T>(ctx, team, s, a, count, op, algo, in_place, tag, off)?;
    }
    Ok(())
}

/// What every collective of one `others` call shares: the team, the stream, the element count
/// per block and the tag the data is drawn with.
struct Round<'a> {
    ctx: &'a Context,
    team: &'a Team,
    s: &'a symheap::Stream,
    a: PeArgs,
    count: usize,
    tag: u64,
    /// This PE in the world.
    me: usize,
    /// This PE in the team.
    tme: usize,
    /// The team's size.
    n: usize,
    /// The team's members, as world PEs.
    members: Vec<usize>,
}

/// all_gather of `count` elements into `dst`, out of place (from `src`) and in place.
fn all_gather_case<T: TestElem>(
    r: &Round<'_>,
    src: &SymmetricBuffer,
    dst: &SymmetricBuffer,
) -> Outcome {
    let Round {
        ctx,
        team,
        s,
        a,
        count,
        tag,
        me,
        tme,
        n,
        ..
    } = *r;
    let sz = std::mem::size_of::<T>();
    let mine = data::<T>(a.seed, me, tag, count);
    let want: Vec<T> = r
        .members
        .iter()
        .flat_map(|&p| data::<T>(a.seed, p, tag, count))
        .collect();
    for in_place in [false, true] {
        poison(dst)?;
        let from = if in_place {
            dst.write(tme * count, &mine).map_err(e2s)?;
            dst.addr() + (tme * count * sz) as u64
        } else {
            src.write(0, &mine).map_err(e2s)?;
            src.addr()
        };
        ctx.barrier_all().map_err(e2s)?;
        let what = format!("all_gather {} count {count} in_place={in_place}", T::DTYPE);
        launch_case(ctx, s, &what, || {
            ctx.all_gather_on_stream(team, dst.addr(), from, count, T::DTYPE, s)
        })?;
        ensure!(
            dst.to_vec::<T>().map_err(e2s)?[..n * count] == want[..],
            "all_gather {} count {count} in_place={in_place}",
            T::DTYPE
        );
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}

/// reduce_scatter (sum) of `big`'s team-size blocks, out of place (into `out`) and in place.
fn reduce_scatter_case<T: TestElem>(
    r: &Round<'_>,
    big: &SymmetricBuffer,
    out: &SymmetricBuffer,
) -> Outcome {
    let Round {
        ctx,
        team,
        s,
        a,
        count,
        tag,
        me,
        tme,
        n,
        ..
    } = *r;
    let sz = std::mem::size_of::<T>();
    for in_place in [false, true] {
        big.write(0, &data::<T>(a.seed, me, tag + 1, n * count))
            .map_err(e2s)?;
        poison(out)?;
        let dest = if in_place {
            big.addr() + (tme * count * sz) as u64
        } else {
            out.addr()
        };
        ctx.barrier_all().map_err(e2s)?;
        let what = format!(
            "reduce_scatter {} count {count} in_place={in_place}",
            T::DTYPE
        );
        launch_case(ctx, s, &what, || {
            ctx.reduce_scatter_on_stream(team, dest, big.addr(), count, T::DTYPE, ReduceOp::Sum, s)
        })?;
        let inputs: Vec<Vec<T>> = r
            .members
            .iter()
            .map(|&p| {
                data::<T>(a.seed, p, tag + 1, n * count)[tme * count..(tme + 1) * count].to_vec()
            })
            .collect();
        let (w, sc) = reference(&inputs, ReduceOp::Sum);
        let mut got = vec![T::zeroed(); count];
        if in_place {
            big.read(tme * count, &mut got)
        } else {
            out.read(0, &mut got)
        }
        .map_err(e2s)?;
        check_vec(
            &got,
            &w,
            &sc,
            &format!(
                "reduce_scatter {} count {count} in_place={in_place}",
                T::DTYPE
            ),
        )?;
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}

/// broadcast of `src` from every root, into a fresh buffer each time.
fn broadcast_case<T: TestElem>(r: &Round<'_>, src: &SymmetricBuffer) -> Outcome {
    let Round {
        ctx,
        team,
        s,
        a,
        count,
        tag,
        me,
        n,
        ..
    } = *r;
    let sz = std::mem::size_of::<T>();
    let mine = data::<T>(a.seed, me, tag, count);
    for root in 0..n {
        src.write(0, &mine).map_err(e2s)?;
        let out = ctx.malloc((count * sz) as u64).map_err(e2s)?;
        poison(&out)?;
        ctx.barrier_all().map_err(e2s)?;
        let what = format!("broadcast {} count {count} root {root}", T::DTYPE);
        launch_case(ctx, s, &what, || {
            ctx.broadcast_on_stream(team, out.addr(), src.addr(), count, T::DTYPE, root, s)
        })?;
        ensure!(
            out.to_vec::<T>().map_err(e2s)?[..count]
                == data::<T>(a.seed, r.members[root], tag, count)[..],
            "broadcast from {root}"
        );
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}

/// alltoall of `count`-element blocks from `s2` into `d2`.
fn alltoall_case<T: TestElem>(
    r: &Round<'_>,
    s2: &SymmetricBuffer,
    d2: &SymmetricBuffer,
) -> Outcome {
    let Round {
        ctx,
        team,
        s,
        a,
        count,
        tag,
        me,
        tme,
        n,
        ..
    } = *r;
    s2.write(0, &data::<T>(a.seed, me, tag + 2, n * count))
        .map_err(e2s)?;
    poison(d2)?;
    ctx.barrier_all().map_err(e2s)?;
    let what = format!("alltoall {} count {count}", T::DTYPE);
    launch_case(ctx, s, &what, || {
        ctx.alltoall_on_stream(team, d2.addr(), s2.addr(), count, T::DTYPE, s)
    })?;
    let got = d2.to_vec::<T>().map_err(e2s)?;
    for (j, &p) in r.members.iter().enumerate() {
        let theirs = data::<T>(a.seed, p, tag + 2, n * count);
        ensure!(
            got[j * count..(j + 1) * count] == theirs[tme * count..(tme + 1) * count],
            "alltoall block from member {j}"
        );
    }
    Ok(())
}

/// all_gather, reduce_scatter, broadcast from every root and alltoall on `team`, each against
/// the data every member drew. Allocation is collective: the buffers are made here, in one
/// visible order, and live to the end of the call (`src` serves the broadcast too).
fn others<T: TestElem>(
    ctx: &Context,
    team: &Team,
    s: &symheap::Stream,
    a: PeArgs,
    count: usize,
    tag: u64,
) -> Outcome {
    let n = team.n_pes();
    let sz = std::mem::size_of::<T>();
    let r = Round {
        ctx,
        team,
        s,
        a,
        count,
        tag,
        me: ctx.my_pe(),
        tme: team.my_pe().unwrap(),
        n,
        members: team.members().to_vec(),
    };
    let src = ctx.malloc((count * sz) as u64).map_err(e2s)?;
    let dst = ctx.malloc((n * count * sz) as u64).map_err(e2s)?;
    all_gather_case::<T>(&r, &src, &dst)?;
    let big = ctx.malloc((n * count * sz) as u64).map_err(e2s)?;
    let out = ctx.malloc((count * sz) as u64).map_err(e2s)?;
    reduce_scatter_case::<T>(&r, &big, &out)?;
    broadcast_case::<T>(&r, &src)?;
    let s2 = ctx.malloc((n * count * sz) as u64).map_err(e2s)?;
    let d2 = ctx.malloc((n * count * sz) as u64).map_err(e2s)?;
    alltoall_case::<T>(&r, &s2, &d2)?;
    ctx.barrier_all().map_err(e2s)
}

/// Every stream collective, dtype and size class against the sequential reference, on the world
/// and on a sub-team.
pub fn coll_stream(ctx: &Context, a: PeArgs) -> Outcome {
    let s = stream(ctx)?;
    let world = ctx.world_team();
    world_cases(ctx, &world, &s, a)?;
    // A second team with the same members: it runs in its own team slot (its own device flags
    // and epochs) and, not being the world, always two-shot. Teams with non-members are covered
    // by the `teams` scenario, whose collectives run these kernels on the CUDA backend.
    let n = ctx.n_pes();
    let sub = ctx.team_split_strided(&world, 0, 1, n).map_err(e2s)?;
    team_cases(ctx, &sub, &s, a)?;
    ctx.barrier_all().map_err(e2s)?;
    ctx.team_destroy(sub).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)
}

/// A few collectives on `team` (a sub-team) against the reference.
pub(super) fn team_cases(ctx: &Context, team: &Team, s: &symheap::Stream, a: PeArgs) -> Outcome {
    let (sum, max) = (ReduceOp::Sum, ReduceOp::Max);
    ar_case::<f32>(
        ctx,
        team,
        s,
        a,
        5000,
        sum,
        AllReduceAlgo::Auto,
        false,
        9001,
        0,
    )?;
    ar_case::<i32>(
        ctx,
        team,
        s,
        a,
        77,
        max,
        AllReduceAlgo::TwoShot,
        true,
        9002,
        0,
    )?;
    others::<i32>(ctx, team, s, a, 333, 9003)
}

/// One all_reduce (sum, out of place and in place) of `T` on `team`: for the dtypes the GPU
/// kernels lack, which run elsewhere (the host path, or NCCL across nodes).
pub(super) fn sum_case<T: TestElem>(
    ctx: &Context,
    team: &Team,
    s: &symheap::Stream,
    a: PeArgs,
    count: usize,
    tag: u64,
) -> Outcome {
    let algo = AllReduceAlgo::Auto;
    for in_place in [false, true] {
        ar_case::<T>(
            ctx,
            team,
            s,
            a,
            count,
            ReduceOp::Sum,
            algo,
            in_place,
            tag,
            0,
        )?;
    }
    Ok(())
}

/// Every collective on `world` for every dtype the kernels have, every op and the size classes
/// from one element to past 4 MiB (ragged counts), in and out of place, aligned and not.
pub(super) fn world_cases(ctx: &Context, world: &Team, s: &symheap::Stream, a: PeArgs) -> Outcome {
    let mut tag = 0;
    for &count in &[1usize, 7, 1000, 100_003, (1 << 20) + 1] {
        for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod] {
            if op == ReduceOp::Prod && count > 1000 {
                continue;
            }
            for algo in [AllReduceAlgo::Auto, AllReduceAlgo::TwoShot] {
                for in_place in [false, true] {
                    tag += 10;
                    ar_case::<f32>(ctx, world, s, a, count, op, algo, in_place, tag, 0)?;
                    ar_case::<bf16>(ctx, world, s, a, count, op, algo, in_place, tag, 0)?;
                    if count <= 100_003 {
                        ar_case::<f16>(ctx, world, s, a, count, op, algo, in_place, tag, 0)?;
                        ar_case::<i32>(ctx, world, s, a, count, op, algo, in_place, tag, 0)?;
                    }
                }
            }
        }
        tag += 10;
        // Buffers off 16-byte alignment: the one-shot's flag path above the LL sizes.
        ar_unaligned::<f32>(ctx, world, s, a, count, tag, 1)?;
        ar_unaligned::<bf16>(ctx, world, s, a, count, tag, 3)?;
        others::<f32>(ctx, world, s, a, count.min(300_001), tag)?;
        others::<bf16>(ctx, world, s, a, count.min(1001), tag + 5)?;
    }
    Ok(())
}

/// All_reduces captured in a CUDA graph stay correct over many replays (their barriers' epochs
/// live on the device): in-place i32 sums grow as S * n^(k-1), exactly. A broadcast (push, no
/// exit round; and a small one through the LL exchange) from a changing root, each followed by
/// an in-place all_reduce of its buffer, runs in between: the result is n^k times the first
/// root's initial data.
pub fn coll_graph(ctx: &Context, _a: PeArgs) -> Outcome {
    graph_replays(ctx, false)
}

/// A world collective on a stream dropped right after (its work still queued), then one on
/// another stream, which must first wait for the dropped one's: exact sums. (The team used to
/// keep only the dropped stream's handle and give the driver a destroyed stream: an error or a
/// crash.)
fn dropped_stream_then_another(ctx: &Context) -> Outcome {
    let cu = ctx.cuda().ok_or("this scenario needs the CUDA backend")?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let b = ctx.malloc(4 * 4096).map_err(e2s)?;
    b.write(0, &vec![me as i32 + 1; 4096]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let sum = |s: &symheap::Stream| {
        let (i32_, op, algo) = (DType::I32, ReduceOp::Sum, AllReduceAlgo::Auto);
        ctx.all_reduce_on_stream(&world, b.addr(), b.addr(), 4096, i32_, op, algo, s)
    };
    {
        let first = cu.create_stream().map_err(e2s)?;
        sum(&first).map_err(e2s)?;
    }
    let second = cu.create_stream().map_err(e2s)?;
    sum(&second).map_err(e2s)?;
    ctx.sync_stream(&second).map_err(e2s)?;
    let want = (n * (n + 1) / 2 * n) as i32;
    let got = b.to_vec::<i32>().map_err(e2s)?;
    ensure!(
        got.iter().all(|&v| v == want),
        "two in-place sums on two streams, the first dropped: {} (expected {want})",
        got[0]
    );
    ctx.barrier_all().map_err(e2s)
}

/// `coll_graph`'s replays; with `warm_up`, the captured work runs once eagerly first (what a
/// world across nodes needs before a capture: NCCL's set-up and the workspace), the data is
/// written afresh before the capture, and a 24 MiB all_reduce joins the others.
pub(super) fn graph_replays(ctx: &Context, warm_up: bool) -> Outcome {
    let cu = ctx.cuda().ok_or("this scenario needs the CUDA backend")?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    dropped_stream_then_another(ctx)?;
    let s = cu.create_stream().map_err(e2s)?;
    let world = ctx.world_team();
    // Across nodes (warm_up) also 24 MiB: the pipelined all_reduce (pieces on two streams).
    let counts: &[usize] = if warm_up {
        &[1000, 300_000, 6_000_000]
    } else {
        &[1000, 300_000]
    };
    let bufs: Vec<_> = counts
        .iter()
        .map(|&c| ctx.malloc((c * 4) as u64))
        .collect::<Result<_, _>>()
        .map_err(e2s)?;
    let fill = || -> Outcome {
        for (b, &c) in bufs.iter().zip(counts) {
            b.write(
                0,
                &(0..c).map(|i| ((i + me) % 3) as i32).collect::<Vec<_>>(),
            )
            .map_err(e2s)?;
        }
        Ok(())
    };
    fill()?;
    // Broadcasts: a large one (push kernel) and a small one (LL exchange), roots offset by 0 / 1.
    let bc_init =
        |c: usize, p: usize| -> Vec<i32> { (0..c).map(|i| ((i * 7 + p * 3) % 5) as i32).collect() };
    let bcs: Vec<_> = [(300_000usize, 0usize), (1000, 1)]
        .iter()
        .map(|&(c, shift)| Ok((ctx.malloc((c * 4) as u64)?, c, shift)))
        .collect::<Result<_, symheap::Error>>()
        .map_err(e2s)?;
    let fill_bcs = || -> Outcome {
        for (b, c, _) in &bcs {
            b.write(0, &bc_init(*c, me)).map_err(e2s)?;
        }
        Ok(())
    };
    fill_bcs()?;
    ctx.barrier_all().map_err(e2s)?;
    let per_graph = 4;
    // An in-place i32 sum of `c` elements at `addr` over the world.
    let sum_in_place = |addr: u64, c: usize| {
        ctx.all_reduce_on_stream(
            &world,
            addr,
            addr,
            c,
            DType::I32,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            &s,
        )
    };
    let body = || -> symheap::Result<()> {
        for it in 0..per_graph {
            for (b, &c) in bufs.iter().zip(counts) {
                sum_in_place(b.addr(), c)?;
            }
            for (b, c, shift) in &bcs {
                let root = (it + shift) % n;
                ctx.broadcast_on_stream(&world, b.addr(), b.addr(), *c, DType::I32, root, &s)?;
                sum_in_place(b.addr(), *c)?;
            }
        }
        Ok(())
    };
    if warm_up {
        body().map_err(e2s)?;
        ctx.sync_stream(&s).map_err(e2s)?;
        ctx.barrier_all().map_err(e2s)?;
        fill()?;
        fill_bcs()?;
        ctx.barrier_all().map_err(e2s)?;
    }
    let graph = Graph::capture(&s, body).map_err(e2s)?;
    let replays = 5;
    for _ in 0..replays {
        graph.launch(&s).map_err(e2s)?;
    }
    ctx.sync_stream(&s).map_err(e2s)?;
    let k = (per_graph * replays) as u32;
    for (b, &c) in bufs.iter().zip(counts) {
        let got = b.to_vec::<i32>().map_err(e2s)?;
        for i in 0..c {
            let sum: i32 = (0..n).map(|p| ((i + p) % 3) as i32).sum();
            let want = sum.wrapping_mul((n as i32).wrapping_pow(k - 1));
            ensure!(
                got[i] == want,
                "count {c} element {i}: {} after {k} replayed all_reduces, expected {want}",
                got[i]
            );
        }
    }
    let factor = (n as i32).wrapping_pow(k);
    for (b, c, shift) in &bcs {
        let got = b.to_vec::<i32>().map_err(e2s)?;
        // The first broadcast's root decides: afterwards every member holds the same data.
        for (i, &r) in bc_init(*c, shift % n).iter().enumerate() {
            let want = r.wrapping_mul(factor);
            ensure!(
                got[i] == want,
                "broadcast + all_reduce count {c} element {i}: {} after {k} replays, expected \
                 {want}",
                got[i]
            );
        }
    }
    ctx.barrier_all().map_err(e2s)
}

fn nccl_ar<T: TestElem>(
    ctx: &Context,
    nccl: &mut Nccl,
    s: &symheap::Stream,
    a: PeArgs,
    count: usize,
    op: ReduceOp,
    tag: u64,
) -> Outcome {
    let me = ctx.my_pe();
    let sz = std::mem::size_of::<T>() as u64;
    let src = ctx.malloc(count as u64 * sz).map_err(e2s)?;
    let ours = ctx.malloc(count as u64 * sz).map_err(e2s)?;
    let theirs = ctx.malloc(count as u64 * sz).map_err(e2s)?;
    src.write(0, &data::<T>(a.seed, me, tag, count))
        .map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    ctx.all_reduce_on_stream(
        &ctx.world_team(),
        ours.addr(),
        src.addr(),
        count,
        T::DTYPE,
        op,
        AllReduceAlgo::Auto,
        s,
    )
    .map_err(e2s)?;
    nccl.all_reduce(&theirs, &src, count, T::DTYPE, op, s)
        .map_err(e2s)?;
    ctx.sync_stream(s).map_err(e2s)?;
    let x = ours.to_vec::<T>().map_err(e2s)?;
    let y = theirs.to_vec::<T>().map_err(e2s)?;
    let n = ctx.n_pes() as f64;
    for i in 0..count {
        let (p, q) = (x[i].to_f64(), y[i].to_f64());
        let tol = if T::TOL == 0.0 {
            0.0
        } else {
            T::TOL * 4.0 * n * q.abs().max(1.0)
        };
        ensure!(
            (p - q).abs() <= tol,
            "all_reduce {} {} count {count}: element {i} symheap {p} NCCL {q}",
            op.name(),
            T::DTYPE
        );
    }
    ctx.barrier_all().map_err(e2s)
}

fn nccl_rest<T: TestElem>(
    ctx: &Context,
    nccl: &mut Nccl,
    s: &symheap::Stream,
    a: PeArgs,
    count: usize,
    tag: u64,
) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let sz = std::mem::size_of::<T>() as u64;
    let nc = (n * count) as u64;
    let src = ctx.malloc(nc * sz).map_err(e2s)?;
    let a1 = ctx.malloc(nc * sz).map_err(e2s)?;
    let b1 = ctx.malloc(nc * sz).map_err(e2s)?;
    src.write(0, &data::<T>(a.seed, me, tag, n * count))
        .map_err(e2s)?;
    let w = ctx.world_team();
    type Step<'a> = (
        &'a str,
        Box<dyn Fn(&Context, &mut Nccl) -> symheap::Result<()> + 'a>,
    );
    let steps: Vec<Step> = vec![
        (
            "all_gather",
            Box::new(|c: &Context, nc: &mut Nccl| {
                c.all_gather_on_stream(&w, a1.addr(), src.addr(), count, T::DTYPE, s)?;
                nc.all_gather(&b1, &src, count, T::DTYPE, s)
            }),
        ),
        (
            "reduce_scatter",
            Box::new(|c: &Context, nc: &mut Nccl| {
                c.reduce_scatter_on_stream(
                    &w,
                    a1.addr(),
                    src.addr(),
                    count,
                    T::DTYPE,
                    ReduceOp::Max,
                    s,
                )?;
                nc.reduce_scatter(&b1, &src, count, T::DTYPE, ReduceOp::Max, s)
            }),
        ),
        (
            "broadcast",
            Box::new(|c: &Context, nc: &mut Nccl| {
                c.broadcast_on_stream(&w, a1.addr(), src.addr(), count, T::DTYPE, n - 1, s)?;
                nc.broadcast(&b1, &src, count, T::DTYPE, n - 1, s)
            }),
        ),
        (
            "alltoall",
            Box::new(|c: &Context, nc: &mut Nccl| {
                c.alltoall_on_stream(&w, a1.addr(), src.addr(), count, T::DTYPE, s)?;
                nc.alltoall(&b1, &src, count, T::DTYPE, s)
            }),
        ),
    ];
    for (name, step) in steps {
        poison(&a1)?;
        poison(&b1)?;
        ctx.barrier_all().map_err(e2s)?;
        step(ctx, nccl).map_err(e2s)?;
        ctx.sync_stream(s).map_err(e2s)?;
        let len = match name {
            "reduce_scatter" | "broadcast" => count,
            _ => n * count,
        };
        let x = a1.to_vec::<T>().map_err(e2s)?;
        let y = b1.to_vec::<T>().map_err(e2s)?;
        ensure!(
            x[..len] == y[..len],
            "{name} {} count {count}: symheap and NCCL differ",
            T::DTYPE
        );
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}

/// Why `coll-nccl` cannot run: NCCL refuses two ranks on one GPU (a machine of one GPU still
/// runs it at one PE). Every PE gathers every PE's GPU, so all reach the same answer.
pub fn nccl_not_here(ctx: &Context) -> Result<Option<String>, String> {
    let Some(cu) = ctx.cuda() else {
        return Ok(None);
    };
    let all = ctx.all_gather_bytes(&cu.device_uuid()).map_err(e2s)?;
    let mut seen = std::collections::HashSet::new();
    Ok(all.iter().position(|u| !seen.insert(u.clone())).map(|pe| {
        format!("PE {pe} shares its GPU with another PE, and NCCL refuses two ranks on one GPU")
    }))
}

/// symheap's GPU collectives agree with NCCL on random data for every op, dtype and size class.
pub fn coll_nccl(ctx: &Context, a: PeArgs) -> Outcome {
    let cu = ctx.cuda().ok_or("this scenario needs the CUDA backend")?;
    let s = cu.create_stream().map_err(e2s)?;
    let mut nccl = Nccl::new(ctx).map_err(e2s)?;
    let mut tag = 50_000;
    for &count in &[1usize, 1000, 100_003, (1 << 20) + 1, 1 << 24] {
        for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
            tag += 1;
            nccl_ar::<f32>(ctx, &mut nccl, &s, a, count, op, tag)?;
            nccl_ar::<bf16>(ctx, &mut nccl, &s, a, count, op, tag)?;
            nccl_ar::<f16>(ctx, &mut nccl, &s, a, count, op, tag)?;
            nccl_ar::<i32>(ctx, &mut nccl, &s, a, count, op, tag)?;
        }
        nccl_rest::<f32>(ctx, &mut nccl, &s, a, count.min(1 << 22), tag + 7)?;
        nccl_rest::<bf16>(ctx, &mut nccl, &s, a, count.min(4099), tag + 8)?;
    }
    drop(nccl);
    ctx.barrier_all().map_err(e2s)
}
