//! Self-test scenarios for the stream operations. They run on both backends: on CUDA the
//! operations are enqueued on a stream of the PE's GPU, on the host backend they complete in
//! the calling thread. Checks read the symmetric buffers back after `sync_stream`.

use std::time::{Duration, Instant};

use symheap::{Cmp, Context, Engine, ErrorKind, SignalOp, SymmetricBuffer};

use super::scenarios::{e2s, Outcome, PeArgs};

/// A stream of this PE's GPU (on the host backend, the calling thread).
fn stream(ctx: &Context) -> Result<symheap::Stream, String> {
    ctx.create_stream().map_err(e2s)
}

fn bytes_of(seed: u64, pe: usize, tag: u64, n: usize) -> Vec<u8> {
    let mut r =
        fastrand::Rng::with_seed(seed ^ ((pe as u64 + 1) << 40) ^ tag.wrapping_mul(0x9e37_79b9));
    (0..n).map(|_| r.u8(..)).collect()
}

fn read(b: &SymmetricBuffer, off: usize, n: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; n];
    b.read(off, &mut v).map_err(e2s)?;
    Ok(v)
}

/// Ring put and get on a stream with each engine, odd sizes and offsets.
pub fn stream_ring(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let s = stream(ctx)?;
    for (i, &size) in [1usize, 4096 + 3, (3 << 20) + 5].iter().enumerate() {
        for (j, engine) in [Engine::Sm, Engine::CopyEngine, Engine::Auto]
            .into_iter()
            .enumerate()
        {
            let tag = (i * 3 + j) as u64;
            let src = ctx.malloc(size as u64 + 64).map_err(e2s)?;
            let dst = ctx.malloc(size as u64 + 64).map_err(e2s)?;
            let back = ctx.malloc(size as u64 + 64).map_err(e2s)?;
            src.write(3, &bytes_of(a.seed, me, tag, size))
                .map_err(e2s)?;
            dst.write(0, &vec![0x5au8; size + 64]).map_err(e2s)?;
            back.write(0, &vec![0x5au8; size + 64]).map_err(e2s)?;
            ctx.barrier_all().map_err(e2s)?;
            ctx.put_on_stream_with(
                dst.addr() + 1,
                src.addr() + 3,
                size as u64,
                next,
                &s,
                engine,
            )
            .map_err(e2s)?;
            ctx.sync_stream(&s).map_err(e2s)?;
            ctx.barrier_all().map_err(e2s)?;
            let got = read(&dst, 0, size + 2)?;
            ensure!(
                got[0] == 0x5a && got[size + 1] == 0x5a,
                "{engine:?} put of {size} B wrote outside its range"
            );
            ensure!(
                got[1..=size] == bytes_of(a.seed, prev, tag, size)[..],
                "{engine:?} put of {size} B from PE {prev}"
            );
            // Get the next PE's source back into our own buffer.
            ctx.get_on_stream_with(
                back.addr() + 2,
                src.addr() + 3,
                size as u64,
                next,
                &s,
                engine,
            )
            .map_err(e2s)?;
            ctx.sync_stream(&s).map_err(e2s)?;
            ensure!(
                read(&back, 2, size)? == bytes_of(a.seed, next, tag, size),
                "{engine:?} get of {size} B from PE {next}"
            );
            ctx.barrier_all().map_err(e2s)?;
        }
    }
    Ok(())
}

/// Producer/consumer on streams: every round puts data with a signal; the consumer's stream
/// waits for the signal and copies what it sees into a log at once. Any round whose data was
/// not complete when its signal was seen shows up in the log.
pub fn stream_signal(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let s = stream(ctx)?;
    let rounds = 40usize;
    // Each path of put_signal_on_stream in turn: a few odd bytes and a few KiB in the fused
    // single-block launch (its largest size too), above it a copy-engine copy and a signal
    // launch, from just above the fused limit to over 1 MiB.
    let fused = symheap::cuda::FUSED_PUT_SIGNAL_MAX as usize;
    let size = |r: usize| match r % 5 {
        0 => (1 << 20) + 8 * r,
        1 => 1 + r % 13,
        2 => 4096 + r,
        3 if r % 2 == 1 => fused,
        _ => fused + 1 + r,
    };
    let slot = |r: usize| -> usize { (0..r).map(|q| size(q).div_ceil(256) * 256).sum() };
    let total = slot(rounds + 1) as u64;
    let src = ctx.malloc(total).map_err(e2s)?;
    let data = ctx.malloc(total).map_err(e2s)?;
    let log = ctx.malloc(total).map_err(e2s)?;
    let sig = ctx.calloc(2, 8).map_err(e2s)?;
    for r in 1..=rounds {
        src.write(slot(r), &bytes_of(a.seed, me, r as u64, size(r)))
            .map_err(e2s)?;
    }
    data.write(0, &vec![0xeeu8; total as usize]).map_err(e2s)?;
    log.write(0, &vec![0x11u8; total as usize]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let t0 = Instant::now();
    for r in 1..=rounds {
        let (off, len) = (slot(r) as u64, size(r) as u64);
        let op = if r % 3 == 0 {
            SignalOp::Add
        } else {
            SignalOp::Set
        };
        let value = if op == SignalOp::Add { 1 } else { r as u64 };
        ctx.put_signal_on_stream(
            data.addr() + off,
            src.addr() + off,
            len,
            sig.addr(),
            value,
            op,
            next,
            &s,
        )
        .map_err(e2s)?;
        ctx.signal_wait_until_on_stream(sig.addr(), Cmp::Ge, r as u64, &s)
            .map_err(e2s)?;
        ctx.put_on_stream(log.addr() + off, data.addr() + off, len, me, &s)
            .map_err(e2s)?;
    }
    ctx.quiet_on_stream(&s).map_err(e2s)?;
    ctx.sync_stream(&s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    for r in 1..=rounds {
        let want = bytes_of(a.seed, prev, r as u64, size(r));
        ensure!(
            read(&log, slot(r), size(r))? == want,
            "round {r}: data seen with the signal was incomplete"
        );
    }
    ensure!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t0.elapsed()
    );
    Ok(())
}

/// Barriers on a stream order every PE's stream work: after it, each PE's stream copies what its
/// neighbour put before it, round after round.
pub fn stream_barrier(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let s = stream(ctx)?;
    let rounds = 30usize;
    let w = 1024usize;
    let src = ctx.malloc((rounds * w) as u64).map_err(e2s)?;
    let inbox = ctx.malloc((rounds * w) as u64).map_err(e2s)?;
    let log = ctx.malloc((rounds * w) as u64).map_err(e2s)?;
    for r in 0..rounds {
        src.write(r * w, &bytes_of(a.seed, me, 1000 + r as u64, w))
            .map_err(e2s)?;
    }
    inbox.write(0, &vec![0u8; rounds * w]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    for r in 0..rounds {
        let off = (r * w) as u64;
        ctx.put_on_stream(inbox.addr() + off, src.addr() + off, w as u64, next, &s)
            .map_err(e2s)?;
        ctx.barrier_all_on_stream(&s).map_err(e2s)?;
        ctx.put_on_stream(log.addr() + off, inbox.addr() + off, w as u64, me, &s)
            .map_err(e2s)?;
    }
    ctx.sync_stream(&s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    for r in 0..rounds {
        ensure!(
            read(&log, r * w, w)? == bytes_of(a.seed, prev, 1000 + r as u64, w),
            "round {r}: stream barrier did not order the put"
        );
    }
    Ok(())
}

/// A device-side wait that is never satisfied is reported as a timeout by `sync_stream`, and the
/// context stays usable (GPU only: on the host backend the wait blocks the thread).
pub fn stream_timeout(ctx: &Context, _a: PeArgs) -> Outcome {
    ensure!(ctx.cuda().is_some(), "this scenario needs the CUDA backend");
    let s = stream(ctx)?;
    let sig = ctx.calloc(1, 8).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let t0 = Instant::now();
    ctx.signal_wait_until_on_stream(sig.addr(), Cmp::Eq, 42, &s)
        .map_err(e2s)?;
    let e = match ctx.sync_stream(&s) {
        Ok(()) => return Err("a wait nobody satisfies completed".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    ensure!(
        matches!(e.kind(), ErrorKind::Timeout { .. }),
        "wrong kind: {e}"
    );
    ensure!(
        t0.elapsed() < ctx.config().timeout + Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    // Still usable.
    ctx.barrier_all().map_err(e2s)?;
    ctx.put_signal_on_stream(
        sig.addr(),
        sig.addr(),
        0,
        sig.addr(),
        42,
        SignalOp::Set,
        ctx.my_pe(),
        &s,
    )
    .map_err(e2s)?;
    ctx.signal_wait_until_on_stream(sig.addr(), Cmp::Eq, 42, &s)
        .map_err(e2s)?;
    ctx.sync_stream(&s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)
}
