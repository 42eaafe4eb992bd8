//! Self-test scenarios for RMA, atomics, signals, teams and collectives. Every PE can regenerate
//! every other PE's input from the shared seed, so each checks exact expected values.

use std::time::Duration;

use half::{bf16, f16};
use symheap::{
    AllReduceAlgo, Cmp, Context, DType, Element, ErrorKind, ReduceOp, SignalOp, SymmetricBuffer,
    Team,
};

use super::scenarios::{e2s, Outcome, PeArgs};

pub(super) fn rng(seed: u64, a: u64, b: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(
        seed ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f),
    )
}

/// Random test data of one dtype, as f64 for references and as bytes for buffers.
pub(super) trait TestElem: Element + Copy {
    fn random(r: &mut fastrand::Rng) -> Self;
    fn to_f64(self) -> f64;
    /// Tolerance relative to the sum of magnitudes; 0 = exact.
    const TOL: f64;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn random(r: &mut fastrand::Rng) -> Self { (r.i64(-1000..1000)) as $t }
            fn to_f64(self) -> f64 { self as f64 }
            const TOL: f64 = 0.0;
        }
    )*};
}
int_elem!(i32, i64);

impl TestElem for f32 {
    fn random(r: &mut fastrand::Rng) -> Self {
        r.f32() * 4.0 - 2.0
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const TOL: f64 = 1e-6;
}
impl TestElem for f64 {
    fn random(r: &mut fastrand::Rng) -> Self {
        r.f64() * 4.0 - 2.0
    }
    fn to_f64(self) -> f64 {
        self
    }
    const TOL: f64 = 1e-12;
}
impl TestElem for f16 {
    fn random(r: &mut fastrand::Rng) -> Self {
        f16::from_f32(r.f32() * 4.0 - 2.0)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    const TOL: f64 = 2e-3;
}
impl TestElem for bf16 {
    fn random(r: &mut fastrand::Rng) -> Self {
        bf16::from_f32(r.f32() * 4.0 - 2.0)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    const TOL: f64 = 1e-2;
}

pub(super) fn data<T: TestElem>(seed: u64, pe: usize, tag: u64, n: usize) -> Vec<T> {
    let mut r = rng(seed, pe as u64 + 1, tag);
    (0..n).map(|_| T::random(&mut r)).collect()
}

const POISON: u8 = 0xa5;

pub(super) fn poison(b: &SymmetricBuffer) -> Outcome {
    b.write(0, &vec![POISON; b.len_bytes() as usize])
        .map_err(e2s)
}

pub(super) fn close<T: TestElem>(got: T, want: f64, scale: f64) -> bool {
    if T::TOL == 0.0 {
        got.to_f64() == want
    } else {
        (got.to_f64() - want).abs() <= T::TOL * scale.max(1.0)
    }
}

/// Ring put and get, blocking and non-blocking, on several dtypes.
pub fn ring(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    #[allow(clippy::items_after_statements)]
    fn one<T: TestElem>(ctx: &Context, a: PeArgs, len: usize, nbi: bool, tag: u64) -> Outcome {
        let (me, n) = (ctx.my_pe(), ctx.n_pes());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let dst = ctx
            .malloc((len * std::mem::size_of::<T>()) as u64 + 64)
            .map_err(e2s)?;
        poison(&dst)?;
        ctx.barrier_all().map_err(e2s)?;
        let mine: Vec<T> = data(a.seed, me, tag, len);
        if nbi {
            ctx.put_nbi(&dst, 1, &mine, next).map_err(e2s)?;
            ctx.quiet().map_err(e2s)?;
        } else {
            ctx.put(&dst, 1, &mine, next).map_err(e2s)?;
        }
        ctx.barrier_all().map_err(e2s)?;
        let want: Vec<T> = data(a.seed, prev, tag, len);
        let mut got = vec![T::zeroed(); len];
        dst.read(1, &mut got).map_err(e2s)?;
        ensure!(got == want, "put from PE {prev}: {} data differs", T::DTYPE);
        // Element 0 was not written by anyone: still poison.
        let mut head = [0u8; 1];
        dst.read(0, &mut head).map_err(e2s)?;
        ensure!(head[0] == POISON, "put wrote outside its range");
        // The next PE's copy holds what this PE put there.
        let mut back = vec![T::zeroed(); len];
        if nbi {
            ctx.get_nbi(&mut back, &dst, 1, next).map_err(e2s)?;
            ctx.quiet().map_err(e2s)?;
        } else {
            ctx.get(&mut back, &dst, 1, next).map_err(e2s)?;
        }
        ensure!(
            back == mine,
            "get from PE {next}: {} data differs",
            T::DTYPE
        );
        ctx.barrier_all().map_err(e2s)
    }
    let mut r = rng(a.seed, 7, 7);
    for (i, nbi) in [false, true].into_iter().enumerate() {
        let len = r.usize(1..5000);
        one::<f32>(ctx, a, len, nbi, 10 + i as u64)?;
        one::<i64>(ctx, a, len + 3, nbi, 20 + i as u64)?;
        one::<bf16>(ctx, a, 1, nbi, 30 + i as u64)?;
        one::<u8>(ctx, a, 100_001, nbi, 40 + i as u64)?;
    }
    // Byte form on raw addresses.
    let b = ctx.malloc(64).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    ctx.put_bytes(b.addr() + 3, &[me as u8; 5], next)
        .map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let mut got = [0u8; 5];
    ctx.get_bytes(&mut got, b.addr() + 3, me).map_err(e2s)?;
    ensure!(got == [prev as u8; 5], "byte put");
    ctx.barrier_all().map_err(e2s)
}

impl TestElem for u8 {
    fn random(r: &mut fastrand::Rng) -> Self {
        r.u8(..)
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const TOL: f64 = 0.0;
}

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
    poison(&d)?;
    d.write(me * c, &mine).map_err(e2s)?;
    ctx.all_gather::<i32>(&world, &d, &d, c).map_err(e2s)?;
    ensure!(
        d.to_vec::<i32>().map_err(e2s)? == want,
        "in-place all_gather"
    );
    Ok(())
}

pub(super) fn reference<T: TestElem>(inputs: &[Vec<T>], op: ReduceOp) -> (Vec<f64>, Vec<f64>) {
    let len = inputs[0].len();
    let mut out = vec![0f64; len];
    let mut scale = vec![0f64; len];
    for i in 0..len {
        let mut acc = inputs[0][i].to_f64();
        let mut mag = acc.abs();
        for inp in &inputs[1..] {
            let x = inp[i].to_f64();
            mag += x.abs();
            acc = match op {
                ReduceOp::Sum => acc + x,
                ReduceOp::Prod => acc * x,
                ReduceOp::Min => acc.min(x),
                ReduceOp::Max => acc.max(x),
            };
        }
        if T::TOL == 0.0 {
            // Integers wrap like the runtime's arithmetic.
            let mut w = inputs[0][i].to_f64() as i128;
            for inp in &inputs[1..] {
                let x = inp[i].to_f64() as i128;
                w = match op {
                    ReduceOp::Sum => w + x,
                    ReduceOp::Prod => w * x,
                    ReduceOp::Min => w.min(x),
                    ReduceOp::Max => w.max(x),
                };
            }
            let bits = 8 * std::mem::size_of::<T>() as u32;
            let m = 1i128 << bits;
            let mut v = w.rem_euclid(m);
            if v >= m / 2 {
                v -= m;
            }
            acc = v as f64;
        }
        if op == ReduceOp::Prod {
            mag = inputs
                .iter()
                .map(|v| v[i].to_f64().abs().max(1.0))
                .product();
        }
        out[i] = acc;
        scale[i] = mag;
    }
    (out, scale)
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
    let sizes = [1, 7, r.usize(100..3000), 70_001];
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
        let d = if in_place { &src } else { &dst };
        ctx.reduce_scatter::<i64>(&world, d, &src, count, ReduceOp::Sum)
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

/// A fetch_add counter under contention; the atomics matrix with exact values.
pub fn atomics(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let k = 300usize;
    let ctr = ctx.calloc(2, 8).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let mut fetched = Vec::with_capacity(k);
    for i in 0..k {
        fetched.push(ctx.atomic_fetch_add::<u64>(&ctr, 0, 1, 0).map_err(e2s)?);
        // Also hammer every PE's second word.
        ctx.atomic_inc::<u64>(&ctr, 1, (me + i) % n).map_err(e2s)?;
    }
    ctx.barrier_all().map_err(e2s)?;
    let total = ctx.atomic_fetch::<u64>(&ctr, 0, 0).map_err(e2s)?;
    ensure!(
        total == (n * k) as u64,
        "counter {total}, expected {}",
        n * k
    );
    let mine_total = ctx.atomic_fetch::<u64>(&ctr, 1, me).map_err(e2s)?;
    let want: u64 = (0..n)
        .map(|p| (0..k).filter(|i| (p + i) % n == me).count() as u64)
        .sum();
    ensure!(
        mine_total == want,
        "inc counter {mine_total}, expected {want}"
    );
    // Every fetched value is unique across PEs: together exactly 0..n*k.
    let bytes: Vec<u8> = fetched.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = ctx.all_gather_bytes(&bytes).map_err(e2s)?;
    let mut vals: Vec<u64> = all
        .iter()
        .flat_map(|b| {
            b.chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        })
        .collect();
    vals.sort_unstable();
    ensure!(
        vals == (0..(n * k) as u64).collect::<Vec<_>>(),
        "fetch_add results are not a permutation of 0..{}",
        n * k
    );

    // The matrix, each PE on its right neighbour's word, values from the seed.
    let right = (me + 1) % n;
    let w = ctx.calloc(8, 8).map_err(e2s)?;
    let mut r = rng(a.seed, 13, me as u64);
    ctx.barrier_all().map_err(e2s)?;
    macro_rules! fss {
        ($t:ty, $v1:expr, $v2:expr) => {{
            let (v1, v2): ($t, $t) = ($v1, $v2);
            ctx.atomic_set::<$t>(&w, 0, v1, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch::<$t>(&w, 0, right).map_err(e2s)? == v1,
                "set/fetch {}",
                stringify!($t)
            );
            ensure!(
                ctx.atomic_swap::<$t>(&w, 0, v2, right).map_err(e2s)? == v1,
                "swap old {}",
                stringify!($t)
            );
            ensure!(
                ctx.atomic_fetch::<$t>(&w, 0, right).map_err(e2s)? == v2,
                "swap new {}",
                stringify!($t)
            );
        }};
    }
    fss!(i32, r.i32(..), r.i32(..));
    fss!(u32, r.u32(..), r.u32(..));
    fss!(i64, r.i64(..), r.i64(..));
    fss!(u64, r.u64(..), r.u64(..));
    fss!(f32, r.f32() - 0.5, r.f32() * 1e6);
    fss!(f64, r.f64() - 0.5, -r.f64() * 1e300);
    macro_rules! ints {
        ($t:ty) => {{
            let x: $t = (r.u32(..) as $t) / 4;
            let d: $t = (r.u32(1..1000) as $t);
            ctx.atomic_set::<$t>(&w, 1, x, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_compare_swap::<$t>(&w, 1, x.wrapping_add(1), d, right)
                    .map_err(e2s)?
                    == x,
                "failed cas returns old"
            );
            ensure!(
                ctx.atomic_fetch::<$t>(&w, 1, right).map_err(e2s)? == x,
                "failed cas must not write"
            );
            ensure!(
                ctx.atomic_compare_swap::<$t>(&w, 1, x, d, right)
                    .map_err(e2s)?
                    == x,
                "cas returns old"
            );
            ensure!(
                ctx.atomic_fetch_add::<$t>(&w, 1, x, right).map_err(e2s)? == d,
                "fetch_add old"
            );
            ctx.atomic_add::<$t>(&w, 1, d, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_inc::<$t>(&w, 1, right).map_err(e2s)?
                    == d.wrapping_add(x).wrapping_add(d),
                "fetch_inc old"
            );
            ctx.atomic_inc::<$t>(&w, 1, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch::<$t>(&w, 1, right).map_err(e2s)?
                    == d.wrapping_add(x).wrapping_add(d).wrapping_add(2),
                "after inc"
            );
        }};
    }
    ints!(i32);
    ints!(u32);
    ints!(i64);
    ints!(u64);
    macro_rules! bits {
        ($t:ty) => {{
            let (x, m): ($t, $t) = (r.u64(..) as $t, r.u64(..) as $t);
            ctx.atomic_set::<$t>(&w, 2, x, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_and::<$t>(&w, 2, m, right).map_err(e2s)? == x,
                "fetch_and"
            );
            ctx.atomic_or::<$t>(&w, 2, m << 1, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_xor::<$t>(&w, 2, m, right).map_err(e2s)? == (x & m) | (m << 1),
                "fetch_or/xor"
            );
            ctx.atomic_xor::<$t>(&w, 2, 1, right).map_err(e2s)?;
            ctx.atomic_and::<$t>(&w, 2, !0, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_or::<$t>(&w, 2, 0, right).map_err(e2s)?
                    == (((x & m) | (m << 1)) ^ m ^ 1),
                "bitwise result"
            );
        }};
    }
    bits!(u32);
    bits!(u64);
    // Wrong dtype for an op and a misaligned address are errors.
    let e = ctx
        .atomic_op(w.addr(), right, symheap::AtomicOp::Add, DType::F32, 0, 0)
        .unwrap_err();
    ensure!(
        matches!(e.kind(), ErrorKind::InvalidArgument(_)),
        "float add accepted: {e}"
    );
    let e = ctx
        .atomic_op(
            w.addr() + 4,
            right,
            symheap::AtomicOp::Load,
            DType::U64,
            0,
            0,
        )
        .unwrap_err();
    ensure!(
        matches!(e.kind(), ErrorKind::InvalidArgument(_)),
        "misaligned accepted: {e}"
    );
    ctx.barrier_all().map_err(e2s)
}

/// A compare_swap spin lock on PE 0 protecting a counter updated with plain get and put.
pub fn lock(ctx: &Context, _a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let rounds = 50;
    let lock = ctx.calloc(1, 8).map_err(e2s)?;
    let counter = ctx.calloc(1, 8).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    for _ in 0..rounds {
        while ctx
            .atomic_compare_swap::<u64>(&lock, 0, 0, me as u64 + 1, 0)
            .map_err(e2s)?
            != 0
        {
            std::thread::yield_now();
        }
        let mut v = [0u64];
        ctx.get(&mut v, &counter, 0, 0).map_err(e2s)?;
        // Widen the window a race would need.
        std::thread::yield_now();
        ctx.put(&counter, 0, &[v[0] + 1], 0).map_err(e2s)?;
        ctx.quiet().map_err(e2s)?;
        let old = ctx.atomic_swap::<u64>(&lock, 0, 0, 0).map_err(e2s)?;
        ensure!(
            old == me as u64 + 1,
            "lock held by {old} while PE {me} owned it"
        );
    }
    ctx.barrier_all().map_err(e2s)?;
    let mut v = [0u64];
    ctx.get(&mut v, &counter, 0, 0).map_err(e2s)?;
    ensure!(
        v[0] == (n * rounds) as u64,
        "counter {} after {} locked increments",
        v[0],
        n * rounds
    );
    ctx.barrier_all().map_err(e2s)
}

/// Producer/consumer around the ring through put_signal and signal_wait_until: the data is
/// always complete once the signal is seen. Every comparison operator is exercised.
pub fn signal(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let words = 512;
    let rounds: u64 = 200;
    let buf = ctx.malloc((words * 8) as u64).map_err(e2s)?;
    let sig = ctx.calloc(4, 8).map_err(e2s)?; // 0: data ready (SET), 1: ack (ADD), 2: cmp tests
    ctx.barrier_all().map_err(e2s)?;
    for round in 1..=rounds {
        // Wait until the consumer has read the previous round before overwriting.
        if round > 1 {
            ctx.signal_wait_until(&sig, 1, Cmp::Ge, round - 1)
                .map_err(e2s)?;
        }
        let payload: Vec<u64> = data::<i64>(a.seed, me, round, words)
            .iter()
            .map(|&x| x as u64)
            .collect();
        let op = if round % 2 == 0 {
            SignalOp::Set
        } else {
            SignalOp::Add
        };
        let value = if op == SignalOp::Set { round } else { 1 };
        ctx.put_signal(&buf, 0, &payload, &sig, 0, value, op, next)
            .map_err(e2s)?;
        let seen = ctx
            .signal_wait_until(&sig, 0, Cmp::Ge, round)
            .map_err(e2s)?;
        ensure!(seen == round, "signal {seen} in round {round}");
        let want: Vec<u64> = data::<i64>(a.seed, prev, round, words)
            .iter()
            .map(|&x| x as u64)
            .collect();
        ensure!(
            buf.to_vec::<u64>().map_err(e2s)? == want,
            "round {round}: data not complete when the signal arrived"
        );
        ctx.atomic_add::<u64>(&sig, 1, 1, prev).map_err(e2s)?;
    }
    ctx.signal_wait_until(&sig, 1, Cmp::Eq, rounds)
        .map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    // Every comparison, with the value moved by the previous PE.
    let steps: [(Cmp, u64, u64); 6] = [
        (Cmp::Eq, 10, 10),
        (Cmp::Ne, 10, 11),
        (Cmp::Gt, 10, 11),
        (Cmp::Ge, 12, 12),
        (Cmp::Lt, 5, 4),
        (Cmp::Le, 3, 3),
    ];
    for (i, (cmp, value, set)) in steps.into_iter().enumerate() {
        ctx.barrier_all().map_err(e2s)?;
        let seeded = if matches!(cmp, Cmp::Lt | Cmp::Le) {
            1000
        } else {
            0
        };
        sig.write(2, &[seeded]).map_err(e2s)?;
        ctx.barrier_all().map_err(e2s)?;
        ctx.put_signal(&buf, 0, &[i as u64], &sig, 2, set, SignalOp::Set, next)
            .map_err(e2s)?;
        let got = ctx.signal_wait_until(&sig, 2, cmp, value).map_err(e2s)?;
        ensure!(got == set, "{cmp:?} {value}: woke with {got}");
        ensure!(
            ctx.signal_fetch(&sig, 2).map_err(e2s)? == set,
            "signal_fetch"
        );
    }
    ctx.barrier_all().map_err(e2s)
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
    let even = ctx
        .team_split_strided(&world, 0, 2, n.div_ceil(2))
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
            let w = even.translate_pe(t, &world).ok_or("translate to world")?;
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
    // Nested: every other member of the even team (world PEs 0, 4, 8...).
    let quarter = ctx
        .team_split_strided(&even, 0, 2, even.n_pes().div_ceil(2).max(1))
        .map_err(e2s)?;
    ensure!(quarter.is_valid() == (me % 4 == 0), "nested membership");
    if quarter.is_valid() {
        ensure!(
            quarter.world_pe(quarter.my_pe().unwrap()) == Some(me),
            "nested rank"
        );
        ensure!(
            quarter.translate_pe(quarter.n_pes() - 1, &even) == Some(quarter.n_pes() * 2 - 2),
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
    // Bad split arguments are errors; a destroyed team is unusable; slots are reused.
    let e = ctx.team_split_strided(&world, 0, 0, 1).unwrap_err();
    ensure!(
        matches!(e.kind(), ErrorKind::InvalidArgument(_)),
        "stride 0 accepted"
    );
    let e = ctx.team_split_strided(&world, n - 1, 1, 2).unwrap_err();
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
            made.push(ctx.team_split_strided(&world, 0, 1, n).map_err(e2s)?);
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
    let all_but_last = ctx.team_split_strided(&world, 0, 1, n - 1).map_err(e2s)?;
    let b = ctx.malloc(64).map_err(e2s)?;
    if !all_but_last.is_valid() {
        // The last PE is not in the team and is not held up.
        std::thread::sleep(Duration::from_millis(50));
        return Ok(());
    }
    let r = if me == 0 {
        ctx.broadcast::<u32>(&all_but_last, &b, &b, 4, 0)
    } else {
        ctx.all_gather::<u32>(&all_but_last, &b, &b, 1)
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
