//! Self-test scenarios for the host-called collectives and teams, checked against sequential
//! references on inputs every PE regenerates from the shared seed; collective argument errors
//! and divergences named on every PE.

use std::time::Duration;

use half::{bf16, f16};
use symheap::{AllReduceAlgo, Cmp, Context, DType, ErrorKind, ReduceOp, SignalOp, Team};

use super::ops_scenarios::{close, data, poison, reference, rng, TestElem};
use super::scenarios::{e2s, Outcome, PeArgs};

/// Alltoall where PE p receives `peer*100+p`, then on random data.
pub fn alltoall(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let k = 3;
    let src = ctx.malloc((n * k * 8) as u64).map_err(e2s)?;
    let dst = ctx.malloc((n * k * 8) as u64).map_err(e2s)?;
    let pattern: Vec<i64> = (0..n)
        .flat_map(|j| vec![(me * 100 + j) as i64; k])
        .collect();
    src.write(0, &pattern).map_err(e2s)?;
    poison(&dst)?;
    ctx.alltoall::<i64>(&world, &dst, &src, k).map_err(e2s)?;
    let got = dst.to_vec::<i64>().map_err(e2s)?;
    for peer in 0..n {
        for i in 0..k {
            ensure!(
                got[peer * k + i] == (peer * 100 + me) as i64,
                "block from PE {peer}: {}",
                got[peer * k + i]
            );
        }
    }
    let count = rng(a.seed, 3, 3).usize(1..3000);
    let src = ctx.malloc((n * count * 4) as u64).map_err(e2s)?;
    let dst = ctx.malloc((n * count * 4) as u64).map_err(e2s)?;
    src.write(0, &data::<f32>(a.seed, me, 99, n * count))
        .map_err(e2s)?;
    poison(&dst)?;
    ctx.alltoall::<f32>(&world, &dst, &src, count)
        .map_err(e2s)?;
    let got = dst.to_vec::<f32>().map_err(e2s)?;
    for peer in 0..n {
        let theirs = data::<f32>(a.seed, peer, 99, n * count);
        ensure!(
            got[peer * count..(peer + 1) * count] == theirs[me * count..(me + 1) * count],
            "random block from PE {peer}"
        );
    }
    Ok(())
}

/// Broadcast from every root, out of place and in place; all_gather.
pub fn broadcast(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let count = rng(a.seed, 5, 5).usize(1..20_000);
    let src = ctx.malloc((count * 8) as u64).map_err(e2s)?;
    let dst = ctx.malloc((count * 8) as u64).map_err(e2s)?;
    for root in 0..n {
        src.write(0, &data::<f64>(a.seed, me, root as u64, count))
            .map_err(e2s)?;
        poison(&dst)?;
        ctx.broadcast::<f64>(&world, &dst, &src, count, root)
            .map_err(e2s)?;
        ensure!(
            dst.to_vec::<f64>().map_err(e2s)? == data::<f64>(a.seed, root, root as u64, count),
            "broadcast from {root}"
        );
        // In place: the root's data goes out of the same buffer.
        ctx.broadcast::<f64>(&world, &src, &src, count, root)
            .map_err(e2s)?;
        ensure!(
            src.to_vec::<f64>().map_err(e2s)? == data::<f64>(a.seed, root, root as u64, count),
            "in-place broadcast from {root}"
        );
    }
    // Small broadcasts take one pass (the root's data rides on its arrival at the entry
    // barrier, with no exit barrier): back to back from every root, the root rewriting its
    // source as soon as the call returns, which a peer still reading it would see.
    for round in 0..3u64 {
        for root in 0..n {
            // The buffers hold `count` elements, which may be fewer than 512.
            for c in [1usize, 7, 512].map(|c| c.min(count)) {
                let tag = 1000 + 10 * round + root as u64;
                src.write(0, &data::<f64>(a.seed, me, tag, c))
                    .map_err(e2s)?;
                ctx.broadcast::<f64>(&world, &dst, &src, c, root)
                    .map_err(e2s)?;
                src.write(0, &vec![-1.0f64; c]).map_err(e2s)?;
                let got = dst.to_vec::<f64>().map_err(e2s)?;
                ensure!(
                    got[..c] == data::<f64>(a.seed, root, tag, c)[..],
                    "small broadcast of {c} from {root}, round {round}"
                );
            }
        }
    }
    // all_gather, out of place and in place.
    let c = count.min(999);
    let mine = data::<i32>(a.seed, me, 1234, c);
    let s = ctx.malloc((c * 4) as u64).map_err(e2s)?;
    let d = ctx.malloc((n * c * 4) as u64).map_err(e2s)?;
    s.write(0, &mine).map_err(e2s)?;
    poison(&d)?;
    ctx.all_gather::<i32>(&world, &d, &s, c).map_err(e2s)?;
    let want: Vec<i32> = (0..n)
        .flat_map(|p| data::<i32>(a.seed, p, 1234, c))
        .collect();
    ensure!(d.to_vec::<i32>().map_err(e2s)? == want, "all_gather");
    // In place: the source is exactly this PE's block of the destination.
    poison(&d)?;
    d.write(me * c, &mine).map_err(e2s)?;
    let own = d.addr() + (me * c * 4) as u64;
    ctx.all_gather_raw(&world, d.addr(), own, c, DType::I32)
        .map_err(e2s)?;
    ensure!(
        d.to_vec::<i32>().map_err(e2s)? == want,
        "in-place all_gather"
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn reduce_case<T: TestElem>(
    ctx: &Context,
    team: &Team,
    a: PeArgs,
    count: usize,
    op: ReduceOp,
    algo: AllReduceAlgo,
    in_place: bool,
    tag: u64,
) -> Outcome {
    let me = ctx.my_pe();
    let members = team.members().to_vec();
    let sz = std::mem::size_of::<T>();
    let src = ctx.malloc((count * sz).max(1) as u64).map_err(e2s)?;
    let dst = ctx.malloc((count * sz).max(1) as u64).map_err(e2s)?;
    src.write(0, &data::<T>(a.seed, me, tag, count))
        .map_err(e2s)?;
    poison(&dst)?;
    let (d, s) = if in_place { (&src, &src) } else { (&dst, &src) };
    ctx.all_reduce_raw(team, d.addr(), s.addr(), count, T::DTYPE, op, algo)
        .map_err(e2s)?;
    if !team.is_valid() {
        return Ok(());
    }
    let inputs: Vec<Vec<T>> = members
        .iter()
        .map(|&p| data::<T>(a.seed, p, tag, count))
        .collect();
    let (want, scale) = reference(&inputs, op);
    let mut got = vec![T::zeroed(); count];
    d.read(0, &mut got).map_err(e2s)?;
    for i in 0..count {
        ensure!(
            close(got[i], want[i], scale[i]),
            "all_reduce {} {} {:?} in_place={in_place} count {count}: element {i} = {}, expected {}",
            op.name(),
            T::DTYPE,
            algo,
            got[i].to_f64(),
            want[i]
        );
    }
    Ok(())
}

/// all_reduce against a sequential reference for every op and dtype, one-shot and two-shot,
/// in and out of place, odd sizes; reduce_scatter likewise.
pub fn all_reduce(ctx: &Context, a: PeArgs) -> Outcome {
    let world = ctx.world_team();
    let mut r = rng(a.seed, 11, 11);
    // 10 and 20 elements: at and past the 80 inline bytes an arrival carries (f32, f64).
    let sizes = [1, 7, 10, 20, r.usize(100..3000), 70_001];
    let mut tag = 0;
    for &count in &sizes {
        for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod] {
            for algo in [
                AllReduceAlgo::OneShot,
                AllReduceAlgo::TwoShot,
                AllReduceAlgo::Auto,
            ] {
                for in_place in [false, true] {
                    if count > 10_000 && (op == ReduceOp::Prod || algo == AllReduceAlgo::Auto) {
                        continue;
                    }
                    tag += 1;
                    reduce_case::<f32>(ctx, &world, a, count, op, algo, in_place, tag)?;
                    reduce_case::<i32>(ctx, &world, a, count, op, algo, in_place, tag)?;
                    if count < 10_000 {
                        reduce_case::<f64>(ctx, &world, a, count, op, algo, in_place, tag)?;
                        reduce_case::<i64>(ctx, &world, a, count, op, algo, in_place, tag)?;
                        reduce_case::<f16>(ctx, &world, a, count, op, algo, in_place, tag)?;
                        reduce_case::<bf16>(ctx, &world, a, count, op, algo, in_place, tag)?;
                    }
                }
            }
        }
    }
    // reduce_scatter, out of place and in place.
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let count = r.usize(1..2000);
    let src = ctx.malloc((n * count * 8) as u64).map_err(e2s)?;
    let dst = ctx.malloc((count * 8) as u64).map_err(e2s)?;
    for in_place in [false, true] {
        src.write(0, &data::<i64>(a.seed, me, 555, n * count))
            .map_err(e2s)?;
        poison(&dst)?;
        // In place: the destination is exactly this PE's block of the source.
        let (d, to) = if in_place {
            (&src, src.addr() + (me * count * 8) as u64)
        } else {
            (&dst, dst.addr())
        };
        ctx.reduce_scatter_raw(&world, to, src.addr(), count, DType::I64, ReduceOp::Sum)
            .map_err(e2s)?;
        let inputs: Vec<Vec<i64>> = (0..n)
            .map(|p| data::<i64>(a.seed, p, 555, n * count)[me * count..(me + 1) * count].to_vec())
            .collect();
        let (want, _) = reference(&inputs, ReduceOp::Sum);
        let mut got = vec![0i64; count];
        d.read(if in_place { me * count } else { 0 }, &mut got)
            .map_err(e2s)?;
        ensure!(
            got.iter().zip(&want).all(|(g, w)| *g as f64 == *w),
            "reduce_scatter in_place={in_place}"
        );
    }
    Ok(())
}

/// Teams: even split (odd PEs get INVALID), nested split, translate_pe round trip, team
/// collectives, a non-member not blocked by a team barrier, destroy and slot reuse.
pub fn teams(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    ensure!(
        world.my_pe() == Some(me) && world.n_pes() == n,
        "world team"
    );
    let even = even_team(ctx, &world)?;
    // A non-member is not blocked: odd PEs wait for a signal that even PEs send only after
    // their team barrier; if the barrier needed odd PEs this would time out.
    let sig = ctx.calloc(1, 8).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    ctx.barrier(&even).map_err(e2s)?;
    ctx.team_sync(&even).map_err(e2s)?;
    if me % 2 == 0 && me + 1 < n {
        ctx.put_signal::<u64>(&sig, 0, &[], &sig, 0, 1, SignalOp::Set, me + 1)
            .map_err(e2s)?;
    }
    if me % 2 == 1 {
        ctx.signal_wait_until(&sig, 0, Cmp::Eq, 1).map_err(e2s)?;
    }
    // Team collective: the sum covers even PEs only; INVALID calls are no-ops.
    let count = 333;
    reduce_case::<i64>(
        ctx,
        &even,
        a,
        count,
        ReduceOp::Sum,
        AllReduceAlgo::TwoShot,
        false,
        777,
    )?;
    reduce_case::<f32>(
        ctx,
        &even,
        a,
        count,
        ReduceOp::Max,
        AllReduceAlgo::OneShot,
        true,
        778,
    )?;
    let b = ctx.malloc((n * 8) as u64).map_err(e2s)?;
    b.write(0, &vec![me as u64; n]).map_err(e2s)?;
    ctx.broadcast::<u64>(&even, &b, &b, n, 0).map_err(e2s)?;
    let want = if me % 2 == 0 { 0 } else { me as u64 };
    ensure!(
        b.to_vec::<u64>().map_err(e2s)? == vec![want; n],
        "team broadcast (or INVALID no-op)"
    );
    let quarter = nested_team(ctx, a, &even)?;
    team_errors_and_reuse(ctx, a, &world, even, quarter)
}

/// The even PEs' team, split from the world, with its membership, ranks and translate_pe
/// round trip checked on every PE.
fn even_team(ctx: &Context, world: &Team) -> Result<Team, String> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let even = ctx
        .team_split_strided(world, 0, 2, n.div_ceil(2))
        .map_err(e2s)?;
    ensure!(
        even.is_valid() == (me % 2 == 0),
        "membership of the even team"
    );
    if me % 2 == 0 {
        ensure!(
            even.my_pe() == Some(me / 2) && even.n_pes() == n.div_ceil(2),
            "even team rank"
        );
        for t in 0..even.n_pes() {
            let w = even.translate_pe(t, world).ok_or("translate to world")?;
            ensure!(w == 2 * t, "team PE {t} is world PE {w}");
            ensure!(world.translate_pe(w, &even) == Some(t), "round trip");
        }
    } else {
        ensure!(
            even.my_pe().is_none() && even.n_pes() == 0,
            "INVALID team reports no rank"
        );
        ensure!(
            world.translate_pe(me, &even).is_none(),
            "odd PE in even team"
        );
    }
    Ok(even)
}

/// A team split from a team: every other member of the even team (world PEs 0, 4, 8...), its
/// ranks and translation checked, then used.
fn nested_team(ctx: &Context, a: PeArgs, even: &Team) -> Result<Team, String> {
    let me = ctx.my_pe();
    let quarter = ctx
        .team_split_strided(even, 0, 2, even.n_pes().div_ceil(2).max(1))
        .map_err(e2s)?;
    ensure!(quarter.is_valid() == (me % 4 == 0), "nested membership");
    if quarter.is_valid() {
        ensure!(
            quarter.world_pe(quarter.my_pe().unwrap()) == Some(me),
            "nested rank"
        );
        ensure!(
            quarter.translate_pe(quarter.n_pes() - 1, even) == Some(quarter.n_pes() * 2 - 2),
            "nested translate"
        );
    }
    ctx.barrier(&quarter).map_err(e2s)?;
    reduce_case::<i32>(
        ctx,
        &quarter,
        a,
        50,
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
        false,
        779,
    )?;
    Ok(quarter)
}

/// Bad split arguments are errors; a destroyed team is unusable; slots are reused; operations on
/// INVALID do nothing.
fn team_errors_and_reuse(
    ctx: &Context,
    a: PeArgs,
    world: &Team,
    even: Team,
    quarter: Team,
) -> Outcome {
    let n = ctx.n_pes();
    let e = ctx.team_split_strided(world, 0, 0, 1).unwrap_err();
    ensure!(
        matches!(e.kind(), ErrorKind::InvalidArgument(_)),
        "stride 0 accepted"
    );
    let e = ctx.team_split_strided(world, n - 1, 1, 2).unwrap_err();
    ensure!(
        matches!(e.kind(), ErrorKind::InvalidArgument(_)),
        "split past the end accepted"
    );
    ctx.team_destroy(quarter.clone()).map_err(e2s)?;
    ensure!(
        ctx.barrier(&quarter).is_err() == quarter.is_valid(),
        "destroyed team still usable"
    );
    ctx.team_destroy(even).map_err(e2s)?;
    for round in 0..3 {
        let mut made = Vec::new();
        for _ in 0..10 {
            made.push(ctx.team_split_strided(world, 0, 1, n).map_err(e2s)?);
        }
        for t in &made {
            ctx.barrier(t).map_err(e2s)?;
        }
        reduce_case::<i64>(
            ctx,
            &made[round],
            a,
            10,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            false,
            780 + round as u64,
        )?;
        for t in made {
            ctx.team_destroy(t).map_err(e2s)?;
        }
    }
    // Team operations on INVALID do nothing.
    ctx.barrier(&Team::INVALID).map_err(e2s)?;
    ctx.team_destroy(Team::INVALID).map_err(e2s)?;
    ensure!(
        !ctx.team_split_strided(&Team::INVALID, 0, 1, 1)
            .map_err(e2s)?
            .is_valid(),
        "split of INVALID"
    );
    ctx.barrier_all().map_err(e2s)
}

/// Collective argument errors, and diverging collectives named on every PE.
pub fn coll_errors(ctx: &Context, _a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let small = ctx.malloc(16).map_err(e2s)?;
    let big = ctx.malloc(64 * n as u64).map_err(e2s)?;
    let invalid = |r: symheap::Result<()>, what: &str| -> Outcome {
        match r {
            Err(e) if matches!(e.kind(), ErrorKind::InvalidArgument(_)) => Ok(()),
            Err(e) => Err(format!("{what}: wrong error {e}")),
            Ok(()) => Err(format!("{what}: accepted")),
        }
    };
    invalid(
        ctx.broadcast::<u64>(&world, &big, &big, 2, n),
        "root outside the team",
    )?;
    invalid(
        ctx.all_gather::<u64>(&world, &small, &big, 2),
        "all_gather destination too small",
    )?;
    invalid(
        ctx.reduce_scatter::<u64>(&world, &big, &small, 4, ReduceOp::Sum),
        "reduce_scatter source too small",
    )?;
    invalid(
        ctx.all_reduce::<u64>(&world, &small, &big, 4, ReduceOp::Sum),
        "all_reduce destination too small",
    )?;
    invalid(
        ctx.alltoall::<u64>(&world, &big, &big, 1),
        "alltoall in place",
    )?;
    invalid(
        ctx.all_reduce_raw(
            &world,
            12345,
            big.addr(),
            1,
            DType::F32,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
        ),
        "non-symmetric address",
    )?;
    // Still healthy after rejected calls.
    ctx.all_reduce::<u64>(&world, &big, &big, 2, ReduceOp::Sum)
        .map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    // Now diverge: PE 0 reduces with max, the others with sum.
    let op = if me == 0 {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    let e = match ctx.all_reduce::<f32>(&world, &big, &big, 4, op) {
        Ok(()) => return Err("diverging all_reduce succeeded".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_)),
        "wrong kind: {e}"
    );
    let s = e.to_string();
    ensure!(
        s.contains("PE 0 called all_reduce(max"),
        "PE 0's call not named: {s}"
    );
    ensure!(s.contains("all_reduce(sum"), "others' call not named: {s}");
    Ok(())
}

/// Diverging calls inside a sub-team are named through the mailbox exchange.
pub fn team_mismatch(ctx: &Context, _a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    // Allocated before the split: the split is the last call the last PE makes, so the
    // members' divergence (which fails the whole job) cannot overtake a call of its.
    let b = ctx.malloc(64).map_err(e2s)?;
    let all_but_last = ctx.team_split_strided(&world, 0, 1, n - 1).map_err(e2s)?;
    if !all_but_last.is_valid() {
        // The last PE is not in the team and is not held up.
        std::thread::sleep(Duration::from_millis(50));
        return Ok(());
    }
    let r = if me == 0 {
        // A broadcast this small is eager: its root returns without meeting the others and
        // learns of the divergence at its next call on the team.
        ctx.broadcast::<u32>(&all_but_last, &b, &b, 4, 0)
            .and_then(|()| ctx.barrier(&all_but_last))
    } else {
        // In place (this PE's block of `b`), so that the call itself is valid.
        ctx.all_gather_raw(
            &all_but_last,
            b.addr(),
            b.addr() + 4 * me as u64,
            1,
            DType::U32,
        )
    };
    let e = match r {
        Ok(()) => return Err("diverging team collectives succeeded".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_)),
        "wrong kind: {e}"
    );
    let s = e.to_string();
    ensure!(
        s.contains("PE 0 called broadcast(root 0"),
        "PE 0's call not named: {s}"
    );
    ensure!(
        s.contains("all_gather(1 x uint32"),
        "others' call not named: {s}"
    );
    Ok(())
}
