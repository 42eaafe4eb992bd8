//! Self-test scenarios for RMA, atomics and signals, and the seeded test data that every
//! scenario checking exact values shares: every PE can regenerate every other PE's input from
//! the shared seed.

use half::{bf16, f16};
use symheap::{Cmp, Context, DType, Element, ErrorKind, ReduceOp, SignalOp, SymmetricBuffer};

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

/// How many times a reduction may round to its dtype on the way (symheap's kernels: once, the
/// default; through NCCL, as collectives across nodes run, once per NCCL step): the float
/// tolerance grows with it.
static ROUNDINGS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// Runs `f` with float results allowed `k` roundings (see [`ROUNDINGS`]).
pub(super) fn with_roundings<R>(k: u32, f: impl FnOnce() -> R) -> R {
    use std::sync::atomic::Ordering::Relaxed;
    let before = ROUNDINGS.swap(k.max(1), Relaxed);
    let r = f();
    ROUNDINGS.store(before, Relaxed);
    r
}

pub(super) fn close<T: TestElem>(got: T, want: f64, scale: f64) -> bool {
    if T::TOL == 0.0 {
        got.to_f64() == want
    } else {
        let k = ROUNDINGS.load(std::sync::atomic::Ordering::Relaxed) as f64;
        (got.to_f64() - want).abs() <= k * T::TOL * scale.max(1.0)
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
    atomic_swaps(ctx, &w, right, &mut r)?;
    atomic_arith(ctx, &w, right, &mut r)?;
    atomic_bits(ctx, &w, right, &mut r)?;
    atomic_errors(ctx, &w, right)?;
    ctx.barrier_all().map_err(e2s)
}

/// set, fetch and swap on every dtype, on word 0 of `right`'s `w`.
fn atomic_swaps(
    ctx: &Context,
    w: &SymmetricBuffer,
    right: usize,
    r: &mut fastrand::Rng,
) -> Outcome {
    macro_rules! fss {
        ($t:ty, $v1:expr, $v2:expr) => {{
            let (v1, v2): ($t, $t) = ($v1, $v2);
            ctx.atomic_set::<$t>(w, 0, v1, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch::<$t>(w, 0, right).map_err(e2s)? == v1,
                "set/fetch {}",
                stringify!($t)
            );
            ensure!(
                ctx.atomic_swap::<$t>(w, 0, v2, right).map_err(e2s)? == v1,
                "swap old {}",
                stringify!($t)
            );
            ensure!(
                ctx.atomic_fetch::<$t>(w, 0, right).map_err(e2s)? == v2,
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
    Ok(())
}

/// compare_swap (failing and succeeding), fetch_add, add, fetch_inc and inc on every integer
/// dtype, on word 1 of `right`'s `w`.
fn atomic_arith(
    ctx: &Context,
    w: &SymmetricBuffer,
    right: usize,
    r: &mut fastrand::Rng,
) -> Outcome {
    macro_rules! ints {
        ($t:ty) => {{
            let x: $t = (r.u32(..) as $t) / 4;
            let d: $t = (r.u32(1..1000) as $t);
            ctx.atomic_set::<$t>(w, 1, x, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_compare_swap::<$t>(w, 1, x.wrapping_add(1), d, right)
                    .map_err(e2s)?
                    == x,
                "failed cas returns old"
            );
            ensure!(
                ctx.atomic_fetch::<$t>(w, 1, right).map_err(e2s)? == x,
                "failed cas must not write"
            );
            ensure!(
                ctx.atomic_compare_swap::<$t>(w, 1, x, d, right)
                    .map_err(e2s)?
                    == x,
                "cas returns old"
            );
            ensure!(
                ctx.atomic_fetch_add::<$t>(w, 1, x, right).map_err(e2s)? == d,
                "fetch_add old"
            );
            ctx.atomic_add::<$t>(w, 1, d, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_inc::<$t>(w, 1, right).map_err(e2s)?
                    == d.wrapping_add(x).wrapping_add(d),
                "fetch_inc old"
            );
            ctx.atomic_inc::<$t>(w, 1, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch::<$t>(w, 1, right).map_err(e2s)?
                    == d.wrapping_add(x).wrapping_add(d).wrapping_add(2),
                "after inc"
            );
        }};
    }
    ints!(i32);
    ints!(u32);
    ints!(i64);
    ints!(u64);
    Ok(())
}

/// The bitwise operations on the unsigned dtypes, on word 2 of `right`'s `w`.
fn atomic_bits(ctx: &Context, w: &SymmetricBuffer, right: usize, r: &mut fastrand::Rng) -> Outcome {
    macro_rules! bits {
        ($t:ty) => {{
            let (x, m): ($t, $t) = (r.u64(..) as $t, r.u64(..) as $t);
            ctx.atomic_set::<$t>(w, 2, x, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_and::<$t>(w, 2, m, right).map_err(e2s)? == x,
                "fetch_and"
            );
            ctx.atomic_or::<$t>(w, 2, m << 1, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_xor::<$t>(w, 2, m, right).map_err(e2s)? == (x & m) | (m << 1),
                "fetch_or/xor"
            );
            ctx.atomic_xor::<$t>(w, 2, 1, right).map_err(e2s)?;
            ctx.atomic_and::<$t>(w, 2, !0, right).map_err(e2s)?;
            ensure!(
                ctx.atomic_fetch_or::<$t>(w, 2, 0, right).map_err(e2s)?
                    == (((x & m) | (m << 1)) ^ m ^ 1),
                "bitwise result"
            );
        }};
    }
    bits!(u32);
    bits!(u64);
    Ok(())
}

/// A wrong dtype for an op and a misaligned address are errors.
fn atomic_errors(ctx: &Context, w: &SymmetricBuffer, right: usize) -> Outcome {
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
    Ok(())
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

/// Nanoseconds since the epoch: a clock every process of the machine shares.
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A plain put wakes a PE asleep in `signal_wait_until` on its bytes: at once after the
/// putter's `quiet` (the put itself rings no one, so that it costs no fence), and within the
/// wait's nap when no quiet follows (before the barrier after it, 200 ms later, rings). PE 1
/// waits; PE 0 puts after PE 1 has had time to fall asleep; the two clocks are the machine's,
/// compared on PE 0.
pub fn put_wake(ctx: &Context, _a: PeArgs) -> Outcome {
    let me = ctx.my_pe();
    let flag = ctx.calloc(1, 8).map_err(e2s)?;
    let times = ctx.calloc(16, 8).map_err(e2s)?;
    let rounds: u64 = 5;
    for r in 1..=rounds + 1 {
        ctx.barrier_all().map_err(e2s)?;
        if me == 1 {
            ctx.signal_wait_until(&flag, 0, Cmp::Ge, r).map_err(e2s)?;
            ctx.put::<u64>(&times, r as usize, &[wall_ns()], 0)
                .map_err(e2s)?;
            ctx.quiet().map_err(e2s)?;
        } else if me == 0 {
            // Asleep by then, and mid-nap: PE 1 naps 10 ms at a time from the barrier on, so
            // a put at a multiple of 10 ms would meet a nap's end and hide a missing ring.
            std::thread::sleep(std::time::Duration::from_millis(65));
            ctx.put::<u64>(&flag, 0, &[r], 1).map_err(e2s)?;
            // The last round has no quiet before the barrier's wait.
            if r <= rounds {
                ctx.quiet().map_err(e2s)?;
            }
            let done = wall_ns();
            ctx.put::<u64>(&times, 8 + r as usize, &[done], 0)
                .map_err(e2s)?;
            // Nothing else rings PE 1 for a while: not the next barrier's arrival either.
            std::thread::sleep(std::time::Duration::from_millis(if r > rounds {
                200
            } else {
                40
            }));
        }
    }
    ctx.barrier_all().map_err(e2s)?;
    if me == 0 && ctx.n_pes() > 1 {
        let t = times.to_vec::<u64>().map_err(e2s)?;
        // Microseconds from PE 0's quiet (or put) to PE 1's wake.
        let late = |r: usize| t[r].saturating_sub(t[8 + r]) / 1000;
        let us: Vec<u64> = (1..=rounds as usize).map(late).collect();
        // The quickest round: a loaded machine delays some wakes by a scheduling slice, while
        // without the quiet's ring every round waits for a nap's end, about 5 ms here.
        let best = us.iter().copied().min().unwrap_or(u64::MAX);
        ensure!(
            best < 2500,
            "PE 1 woke at best {best} us after PE 0's quiet ({us:?} us): the quiet rang no one"
        );
        let no_quiet = late(rounds as usize + 1);
        ensure!(
            no_quiet < 150_000,
            "without a quiet PE 1 woke {no_quiet} us after the put (its nap is 10 ms)"
        );
    }
    Ok(())
}
