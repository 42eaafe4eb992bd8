//! Self-test scenario of the collectives' aliasing rules (`symheap::alias`), on both backends:
//! every in-place form (all_gather from this PE's own block, reduce_scatter into it,
//! all_reduce and broadcast on one buffer) gives exact results through the host and the
//! stream forms, on the world and on a team whose member indices are not the world's, at sizes
//! that take every path (eager, inline, one-pass, one-shot, two-shot, the kernels), and is no
//! false mismatch (a host barrier compares the ledgers after each); every other overlap is
//! refused on every PE, naming both ranges, and leaves the context usable.

use symheap::alias::ByteRange;
use symheap::{AllReduceAlgo, Context, DType, ErrorKind, ReduceOp, Stream, Team};

use super::ops_scenarios::{data, poison, TestElem};
use super::scenarios::{e2s, Outcome, PeArgs};

/// Which entry a call goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Host,
    Stream,
}

/// One collective, as far as this scenario varies it.
#[derive(Debug, Clone, Copy)]
enum Call {
    Broadcast(usize),
    AllGather,
    ReduceScatter,
    AllReduce(AllReduceAlgo),
    AllToAll,
}

/// What every call of a round shares.
struct Ctx<'a> {
    ctx: &'a Context,
    team: &'a Team,
    /// The team's size, known to non-members too (so that every PE makes the same calls).
    size: usize,
    s: &'a Stream,
}

impl Ctx<'_> {
    /// Runs `call` on `count` elements of `dtype` per block through `form` (a stream form
    /// waits for its stream).
    fn run(
        &self,
        form: Form,
        call: Call,
        d: u64,
        s: u64,
        count: usize,
        t: DType,
    ) -> symheap::Result<()> {
        let (ctx, team, st, sum) = (self.ctx, self.team, self.s, ReduceOp::Sum);
        match (form, call) {
            (Form::Host, Call::Broadcast(r)) => ctx.broadcast_raw(team, d, s, count, t, r),
            (Form::Host, Call::AllGather) => ctx.all_gather_raw(team, d, s, count, t),
            (Form::Host, Call::ReduceScatter) => ctx.reduce_scatter_raw(team, d, s, count, t, sum),
            (Form::Host, Call::AllReduce(a)) => ctx.all_reduce_raw(team, d, s, count, t, sum, a),
            (Form::Host, Call::AllToAll) => ctx.alltoall_raw(team, d, s, count, t),
            (Form::Stream, c) => {
                match c {
                    Call::Broadcast(r) => ctx.broadcast_on_stream(team, d, s, count, t, r, st),
                    Call::AllGather => ctx.all_gather_on_stream(team, d, s, count, t, st),
                    Call::ReduceScatter => {
                        ctx.reduce_scatter_on_stream(team, d, s, count, t, sum, st)
                    }
                    Call::AllReduce(a) => {
                        ctx.all_reduce_on_stream(team, d, s, count, t, sum, a, st)
                    }
                    Call::AllToAll => ctx.alltoall_on_stream(team, d, s, count, t, st),
                }?;
                ctx.sync_stream(st)
            }
        }
    }
}

/// The element sums of `inputs` (exact: small integers).
fn sums<T: TestElem>(inputs: &[Vec<T>]) -> Vec<f64> {
    (0..inputs[0].len())
        .map(|i| inputs.iter().map(|v| v[i].to_f64()).sum())
        .collect()
}

fn same<T: TestElem>(got: &[T], want: &[f64], what: &str) -> Outcome {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!(
            g.to_f64() == *w,
            "{what}: element {i} = {}, expected {w}",
            g.to_f64()
        );
    }
    ensure!(
        got.len() == want.len(),
        "{what}: {} elements, expected {}",
        got.len(),
        want.len()
    );
    Ok(())
}

/// Every in-place form of `count` elements of `T` on `c.team`, through `form`, exact, each
/// followed by a host barrier (the ledger comparison). Non-members call too (their calls do
/// nothing) so that every PE allocates and meets alike.
fn in_place_round<T: TestElem>(
    c: &Ctx<'_>,
    a: PeArgs,
    form: Form,
    count: usize,
    tag: u64,
) -> Outcome {
    let ctx = c.ctx;
    let (me, world) = (ctx.my_pe(), ctx.n_pes());
    let members = c.team.members().to_vec();
    let (n, tme) = (c.size, c.team.my_pe());
    let sz = std::mem::size_of::<T>();
    let what = |k: &str| {
        format!(
            "in-place {k} {form:?} of {count} x {} on {n} of {world} PEs",
            T::DTYPE
        )
    };
    let buf = ctx
        .malloc((world * count * sz).max(8) as u64)
        .map_err(e2s)?;
    let block = (count * sz) as u64;
    let mine = data::<T>(a.seed, me, tag, count);
    // all_gather: this PE's contribution already at its own block.
    poison(&buf)?;
    if let Some(t) = tme {
        buf.write(t * count, &mine).map_err(e2s)?;
    }
    ctx.barrier_all().map_err(e2s)?;
    let own = buf.addr() + block * tme.unwrap_or(0) as u64;
    c.run(form, Call::AllGather, buf.addr(), own, count, T::DTYPE)
        .map_err(e2s)?;
    if tme.is_some() {
        let want: Vec<f64> = members
            .iter()
            .flat_map(|&p| data::<T>(a.seed, p, tag, count))
            .map(|x| x.to_f64())
            .collect();
        same(
            &buf.to_vec::<T>().map_err(e2s)?[..n * count],
            &want,
            &what("all_gather"),
        )?;
    }
    ctx.barrier_all()
        .map_err(|e| format!("{}: {e}", what("all_gather")))?;
    // reduce_scatter: the result replaces this PE's own block of the source.
    buf.write(0, &data::<T>(a.seed, me, tag + 1, world * count))
        .map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    c.run(form, Call::ReduceScatter, own, buf.addr(), count, T::DTYPE)
        .map_err(e2s)?;
    if let Some(t) = tme {
        let inputs: Vec<Vec<T>> = members
            .iter()
            .map(|&p| {
                data::<T>(a.seed, p, tag + 1, world * count)[t * count..(t + 1) * count].to_vec()
            })
            .collect();
        let mut got = vec![T::zeroed(); count];
        buf.read(t * count, &mut got).map_err(e2s)?;
        same(&got, &sums(&inputs), &what("reduce_scatter"))?;
    }
    ctx.barrier_all()
        .map_err(|e| format!("{}: {e}", what("reduce_scatter")))?;
    // all_reduce on one buffer, with every algorithm.
    for (k, algo) in [
        AllReduceAlgo::Auto,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
    ]
    .into_iter()
    .enumerate()
    {
        let tag = tag + 2 + k as u64;
        buf.write(0, &data::<T>(a.seed, me, tag, count))
            .map_err(e2s)?;
        ctx.barrier_all().map_err(e2s)?;
        c.run(
            form,
            Call::AllReduce(algo),
            buf.addr(),
            buf.addr(),
            count,
            T::DTYPE,
        )
        .map_err(e2s)?;
        if tme.is_some() {
            let inputs: Vec<Vec<T>> = members
                .iter()
                .map(|&p| data::<T>(a.seed, p, tag, count))
                .collect();
            let mut got = vec![T::zeroed(); count];
            buf.read(0, &mut got).map_err(e2s)?;
            same(&got, &sums(&inputs), &what(&format!("all_reduce {algo:?}")))?;
        }
        ctx.barrier_all().map_err(e2s)?;
    }
    // broadcast on one buffer, from every root.
    for root in 0..n {
        let tag = tag + 10 + root as u64;
        buf.write(0, &data::<T>(a.seed, me, tag, count))
            .map_err(e2s)?;
        ctx.barrier_all().map_err(e2s)?;
        c.run(
            form,
            Call::Broadcast(root),
            buf.addr(),
            buf.addr(),
            count,
            T::DTYPE,
        )
        .map_err(e2s)?;
        // (Non-members know no members: they only make the calls.)
        if let Some(&from) = members.get(root) {
            let want: Vec<f64> = data::<T>(a.seed, from, tag, count)
                .iter()
                .map(|x| x.to_f64())
                .collect();
            let mut got = vec![T::zeroed(); count];
            buf.read(0, &mut got).map_err(e2s)?;
            same(&got, &want, &what(&format!("broadcast from {root}")))?;
        }
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}

/// `call` at (`d`, `s`) must fail with an invalid-argument error naming both ranges.
fn refused(
    c: &Ctx<'_>,
    form: Form,
    call: Call,
    d: ByteRange,
    s: ByteRange,
    count: usize,
) -> Outcome {
    let what = format!("{call:?} {form:?} with destination {d} and source {s}");
    let e = match c.run(form, call, d.start, s.start, count, DType::I32) {
        Ok(()) => return Err(format!("{what} was accepted")),
        Err(e) => e,
    };
    ensure!(
        matches!(e.kind(), ErrorKind::InvalidArgument(_)),
        "{what}: {e}"
    );
    let text = e.to_string();
    ensure!(
        text.contains(&d.to_string()) && text.contains(&s.to_string()),
        "{what}: {text}"
    );
    Ok(())
}

/// Every overlap that is not an in-place form, through `form`, refused on every PE; then the
/// adjacent (apart) layout of the same allocation works.
fn refusals(c: &Ctx<'_>, a: PeArgs, form: Form) -> Outcome {
    const COUNT: usize = 8;
    let (ctx, n) = (c.ctx, c.size);
    // Room for the widest layout: n blocks of source after n of destination.
    let buf = ctx.malloc((2 * n * COUNT * 4 + 64) as u64).map_err(e2s)?;
    let base = buf.addr();
    if let Some(tme) = c.team.my_pe() {
        refuse_all(c, base, tme, form, COUNT)?;
    }
    // Nothing was recorded or moved: the ledgers agree, and the same allocation laid out apart
    // (source right after the destination) works.
    ctx.barrier_all().map_err(e2s)?;
    let src = base + (n * COUNT * 4) as u64;
    let mine = data::<i32>(a.seed, ctx.my_pe(), 77, COUNT);
    buf.write(n * COUNT, &mine).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    c.run(form, Call::AllGather, base, src, COUNT, DType::I32)
        .map_err(e2s)?;
    if c.team.is_valid() {
        let want: Vec<f64> = c
            .team
            .members()
            .iter()
            .flat_map(|&p| data::<i32>(a.seed, p, 77, COUNT))
            .map(|x| x as f64)
            .collect();
        let got = buf.to_vec::<i32>().map_err(e2s)?;
        same(&got[..n * COUNT], &want, "all_gather apart, adjacent")?;
    }
    ctx.barrier_all().map_err(e2s)
}

/// The overlaps of `refusals` on a member (`tme` in a team of `c.size`) at `base`.
fn refuse_all(c: &Ctx<'_>, base: u64, tme: usize, form: Form, count: usize) -> Outcome {
    let n = c.size;
    let (block, nb) = ((count * 4) as u128, (n * count * 4) as u128);
    let at = |x: u64, len: u128| ByteRange::new(x, len);
    // Two elements in: straddles blocks, never this PE's block exactly.
    let skew = base + 8;
    let mut cases = vec![
        (Call::AllGather, at(base, nb), at(skew, block)),
        (Call::ReduceScatter, at(skew, block), at(base, nb)),
        (
            Call::AllReduce(AllReduceAlgo::Auto),
            at(skew, block),
            at(base, block),
        ),
        (Call::Broadcast(0), at(skew, block), at(base, block)),
        (Call::AllToAll, at(base, nb), at(base, nb)),
        (Call::AllToAll, at(skew, nb), at(base, nb)),
    ];
    if n > 1 {
        // Another member's block: the all_gather(d, d[:count]) on every member but 0.
        let theirs = base + (((tme + 1) % n) * count * 4) as u64;
        cases.push((Call::AllGather, at(base, nb), at(theirs, block)));
        cases.push((Call::ReduceScatter, at(theirs, block), at(base, nb)));
    }
    for (call, d, s) in cases {
        refused(c, form, call, d, s, count)?;
    }
    Ok(())
}

/// The scenario (see the module documentation).
pub fn coll_alias(ctx: &Context, a: PeArgs) -> Outcome {
    let world = ctx.world_team();
    let n = ctx.n_pes();
    let s = ctx.create_stream().map_err(e2s)?;
    // From 3 PEs, a team without PE 0: its member indices are not the world's.
    let sub = if n >= 3 {
        Some(ctx.team_split_strided(&world, 1, 1, n - 1).map_err(e2s)?)
    } else {
        None
    };
    let teams: Vec<(&Team, usize)> = std::iter::once((&world, n))
        .chain(sub.as_ref().map(|t| (t, n - 1)))
        .collect();
    for (k, (team, size)) in teams.into_iter().enumerate() {
        let c = Ctx {
            ctx,
            team,
            size,
            s: &s,
        };
        for form in [Form::Host, Form::Stream] {
            refusals(&c, a, form).map_err(|e| format!("team {k}: {e}"))?;
            // i32: 1 element, narrow and wide inline, eager broadcast, one-pass, one-shot,
            // two-shot sizes; i64 (no GPU kernel: the host-driven path on CUDA) two of them.
            for (j, count) in [1usize, 5, 18, 24, 600, 5000, 40_000]
                .into_iter()
                .enumerate()
            {
                in_place_round::<i32>(&c, a, form, count, 100 * j as u64)?;
            }
            for count in [3usize, 3000] {
                in_place_round::<i64>(&c, a, form, count, 900)?;
            }
        }
    }
    Ok(())
}
