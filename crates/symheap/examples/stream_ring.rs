//! A ring on a stream: every PE puts a block of random values into the next PE's copy with a
//! signal, waits on its own signal on the same stream, then sums every PE's block with an
//! all_reduce on the stream, and checks both exactly. The same program runs on GPUs (work is
//! enqueued on a stream of this PE's device) and on the host backend (the stream is the calling
//! thread). Run: `symheap launch -n 4 -- target/debug/examples/stream_ring`.

use symheap::{AllReduceAlgo, Cmp, Context, DType, ReduceOp, SignalOp};

/// The value PE `pe` sends at index `i` (seeded, exact in an f32 sum of up to 16 PEs).
fn value(seed: u64, pe: usize, i: usize) -> f32 {
    let x = (seed ^ (pe as u64 * 0x9e37_79b9) ^ (i as u64 * 0x85eb_ca6b)).wrapping_mul(0xc2b2_ae35);
    ((x >> 40) & 0xfffff) as f32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::init()?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    const COUNT: usize = 1 << 16;
    let bytes = (COUNT * 4) as u64;

    // Symmetric buffers: what this PE sends, what it receives, the ring signal, the sum.
    let send = ctx.malloc(bytes)?;
    let recv = ctx.malloc(bytes)?;
    let sig = ctx.calloc(1, 8)?;
    let sum = ctx.malloc(bytes)?;
    let mine: Vec<f32> = (0..COUNT).map(|i| value(seed, me, i)).collect();
    send.write(0, &mine)?;
    ctx.barrier_all()?;

    // A stream owned by this program: on CUDA a non-blocking stream of this PE's GPU, destroyed
    // when `stream` is dropped (symheap keeps it alive while released buffers still need it).
    let stream = ctx.create_stream()?;
    ctx.put_signal_on_stream(
        recv.addr(),
        send.addr(),
        bytes,
        sig.addr(),
        1,
        SignalOp::Set,
        next,
        &stream,
    )?;
    ctx.signal_wait_until_on_stream(sig.addr(), Cmp::Eq, 1, &stream)?;
    ctx.all_reduce_on_stream(
        &ctx.world_team(),
        sum.addr(),
        send.addr(),
        COUNT,
        DType::F32,
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
        &stream,
    )?;
    ctx.sync_stream(&stream)?;

    let got = recv.to_vec::<f32>()?;
    if let Some(i) = (0..COUNT).find(|&i| got[i] != value(seed, prev, i)) {
        return Err(format!("PE {me}: element {i} from PE {prev} is {}", got[i]).into());
    }
    let total = sum.to_vec::<f32>()?;
    let want = |i: usize| (0..n).map(|p| value(seed, p, i)).sum::<f32>();
    if let Some(i) = (0..COUNT).find(|&i| total[i] != want(i)) {
        return Err(format!("PE {me}: sum at {i} is {}, expected {}", total[i], want(i)).into());
    }
    println!("PE {me} of {n}: ring and all_reduce of {COUNT} f32 on a stream: ok");
    ctx.finalize()?;
    Ok(())
}
