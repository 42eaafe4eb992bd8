//! Self-test scenarios of "no silent data loss" on the GPU: stream-ordered release, collectives
//! of one team issued from several streams (eager and captured), a divergence whose calls wait
//! on the device, symheap's own device state out of reach of raw addresses, and the protocol
//! selection by link type.

use std::time::{Duration, Instant};

use symheap::tools::Graph;
use symheap::{AllReduceAlgo, Cmp, Context, DType, ErrorKind, ReduceOp};

use super::scenarios::{e2s, Outcome, PeArgs};

fn cuda(ctx: &Context) -> Result<&symheap::cuda::CudaBackend, String> {
    ctx.cuda()
        .ok_or_else(|| "this scenario needs the CUDA backend".to_string())
}

/// A buffer released while a put into it is still pending on a stream is not reused until the
/// put has finished: the next allocation goes elsewhere, the put lands in the released memory,
/// and once the stream has finished, the memory is reclaimed at the next collective point.
pub fn release_order(ctx: &Context, a: PeArgs) -> Outcome {
    let cu = cuda(ctx)?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let s = cu.create_stream().map_err(e2s)?;
    const BYTES: usize = 1 << 20;
    let gate = ctx.calloc(1, 8).map_err(e2s)?;
    let src = ctx.malloc(BYTES as u64).map_err(e2s)?;
    let pattern: Vec<u8> = (0..BYTES)
        .map(|i| (i as u64 ^ a.seed ^ me as u64) as u8 | 1)
        .collect();
    src.write(0, &pattern).map_err(e2s)?;
    let target = ctx.malloc(BYTES as u64).map_err(e2s)?;
    let freed_at = target.addr();
    ctx.barrier_all().map_err(e2s)?;
    // The stream waits on a gate nobody has opened, then puts into the next PE's `target`.
    ctx.signal_wait_until_on_stream(gate.addr(), Cmp::Ge, 1, &s)
        .map_err(e2s)?;
    ctx.put_on_stream(target.addr(), src.addr(), BYTES as u64, next, &s)
        .map_err(e2s)?;
    drop(target);
    // A collective point: every PE released `target`, but its put is still pending everywhere.
    ctx.barrier_all().map_err(e2s)?;
    let fresh = ctx.malloc(BYTES as u64).map_err(e2s)?;
    fresh.write(0, &vec![0u8; BYTES]).map_err(e2s)?;
    ensure!(
        fresh.addr() != freed_at,
        "the heap reused released memory while a put into it was still pending on a stream"
    );
    ctx.barrier_all().map_err(e2s)?;
    gate.write(0, &[1u64]).map_err(e2s)?;
    ctx.sync_stream(&s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let mut got = vec![0u8; BYTES];
    fresh.read(0, &mut got).map_err(e2s)?;
    ensure!(
        got.iter().all(|&b| b == 0),
        "the pending put landed in the new buffer"
    );
    // Every stream finished: the next collective point reclaims the released memory.
    ctx.barrier_all().map_err(e2s)?;
    let again = ctx.malloc(BYTES as u64).map_err(e2s)?;
    ensure!(
        again.addr() == freed_at,
        "the released memory was not reclaimed after its stream finished (got {:#x}, released {freed_at:#x})",
        again.addr()
    );
    ctx.barrier_all().map_err(e2s)
}

/// Collectives of one team from 2 to 4 streams in a random order (the same on every PE): each
/// on its own buffer, exact results; then a graph captured on one stream, replayed, with eager
/// collectives on another stream in between. Without ordering, two kernels of one team would
/// run at once and corrupt each other's epochs (a hang).
pub fn multi_stream(ctx: &Context, a: PeArgs) -> Outcome {
    let cu = cuda(ctx)?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let mut rng = fastrand::Rng::with_seed(a.seed);
    let streams: Vec<symheap::Stream> = (0..rng.usize(2..=4))
        .map(|_| cu.create_stream())
        .collect::<Result<_, _>>()
        .map_err(e2s)?;
    let steps = 24;
    let mut bufs = Vec::new();
    for k in 0..steps {
        let count = [300usize, 5000, 70_000][rng.usize(..3)];
        let b = ctx.malloc((count * 4) as u64).map_err(e2s)?;
        let v: Vec<i32> = (0..count)
            .map(|i| ((i * 7 + k * 3 + me) % 11) as i32)
            .collect();
        b.write(0, &v).map_err(e2s)?;
        bufs.push((b, count, k));
    }
    ctx.barrier_all().map_err(e2s)?;
    for (b, count, _) in &bufs {
        let s = &streams[rng.usize(..streams.len())];
        if rng.bool() {
            ctx.barrier_all_on_stream(s).map_err(e2s)?;
        }
        ctx.all_reduce_on_stream(
            &world,
            b.addr(),
            b.addr(),
            *count,
            DType::I32,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            s,
        )
        .map_err(e2s)?;
    }
    for s in &streams {
        ctx.sync_stream(s).map_err(e2s)?;
    }
    for (b, count, k) in &bufs {
        let got = b.to_vec::<i32>().map_err(e2s)?;
        for (i, &g) in got.iter().take(*count).enumerate() {
            let want: i32 = (0..n).map(|p| ((i * 7 + k * 3 + p) % 11) as i32).sum();
            ensure!(g == want, "step {k}: element {i} is {g}, expected {want}");
        }
    }
    graph_and_eager(ctx, &streams, me, n)
}

/// A graph of in-place sums captured on one stream, replayed between eager sums on another.
/// symheap orders the collectives it is asked for; a graph replay is not one of them, so it is
/// ordered by the stream it is launched on, as any CUDA graph: here each replay goes on the
/// stream of the team's previous collective, and the eager sums that follow on the other stream
/// are ordered after it by symheap.
fn graph_and_eager(ctx: &Context, streams: &[symheap::Stream], me: usize, n: usize) -> Outcome {
    let world = ctx.world_team();
    let (g, e) = (&streams[0], &streams[1]);
    let count = 4096usize;
    let gb = ctx.malloc((count * 4) as u64).map_err(e2s)?;
    let eb = ctx.malloc((count * 4) as u64).map_err(e2s)?;
    gb.write(0, &vec![1i32; count]).map_err(e2s)?;
    eb.write(0, &vec![me as i32; count]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let sum = |addr: u64, s: &symheap::Stream| {
        ctx.all_reduce_on_stream(
            &world,
            addr,
            addr,
            count,
            DType::I32,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            s,
        )
    };
    let graph = Graph::capture(g, || sum(gb.addr(), g)).map_err(e2s)?;
    let replays = 3;
    for _ in 0..replays {
        // The team's last collective was on `g` (the capture, then the eager sums' stream is
        // synchronised below), so the replay needs no more ordering than its stream's.
        sum(gb.addr(), g).map_err(e2s)?;
        graph.launch(g).map_err(e2s)?;
        // symheap orders this after everything enqueued on `g` so far, the replay included.
        sum(eb.addr(), e).map_err(e2s)?;
        sum(eb.addr(), g).map_err(e2s)?;
    }
    ctx.sync_stream(g).map_err(e2s)?;
    ctx.sync_stream(e).map_err(e2s)?;
    // gb: each round an eager sum and a replayed one (x n each); eb: two eager sums per round.
    let want_g = (n as i32).wrapping_pow(2 * replays);
    let got = gb.to_vec::<i32>().map_err(e2s)?;
    ensure!(
        got.iter().all(|&v| v == want_g),
        "graph replays gave {:?}, expected {want_g}",
        &got[..4]
    );
    let mut want_e = (0..n as i32).sum::<i32>();
    for _ in 1..2 * replays {
        want_e = want_e.wrapping_mul(n as i32);
    }
    let got = eb.to_vec::<i32>().map_err(e2s)?;
    ensure!(
        got.iter().all(|&v| v == want_e),
        "eager sums gave {:?}, expected {want_e}",
        &got[..4]
    );
    ctx.barrier_all().map_err(e2s)
}

/// The last PE enqueues a broadcast where the others enqueue an all_reduce, on a stream: no
/// host code of any PE waits in symheap, so only the watchdog sees the divergence. Every PE
/// must get the named mismatch within a second (the kernels end through the abort word).
pub fn device_divergence(ctx: &Context, _a: PeArgs) -> Outcome {
    let cu = cuda(ctx)?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let s = cu.create_stream().map_err(e2s)?;
    let count = 1 << 16;
    let b = ctx.malloc((count * 4) as u64).map_err(e2s)?;
    b.write(0, &vec![1i32; count]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let t0 = Instant::now();
    let issued = if me == n - 1 {
        ctx.broadcast_on_stream(&world, b.addr(), b.addr(), count, DType::I32, 0, &s)
    } else {
        ctx.all_reduce_on_stream(
            &world,
            b.addr(),
            b.addr(),
            count,
            DType::I32,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            &s,
        )
    };
    let e = match issued
        .and_then(|()| ctx.sync_stream(&s))
        .and_then(|()| ctx.barrier_all())
    {
        Ok(()) => return Err("the divergence was not reported".into()),
        Err(e) => e,
    };
    let dt = t0.elapsed();
    println!(
        "got the expected error after {:.3} s: {e}",
        dt.as_secs_f64()
    );
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(m) if m.contains("broadcast") && m.contains("all_reduce")),
        "wrong error: {e}"
    );
    ensure!(dt < Duration::from_secs(1), "named after {dt:?}");
    Ok(())
}

/// symheap's own device state (the first allocation of the heap on CUDA) is out of reach of the
/// raw-address calls; the caller's allocations are not.
pub fn internal_state(ctx: &Context, _a: PeArgs) -> Outcome {
    cuda(ctx)?;
    let me = ctx.my_pe();
    let base = ctx.heap_bases()[me];
    let e = ctx
        .write_at(base, &[0u8; 8])
        .err()
        .ok_or("write_at reached symheap's own device state")?;
    ensure!(
        e.to_string().contains("symheap's own state"),
        "wrong error: {e}"
    );
    let e = ctx
        .put_bytes(base, &[0u8; 8], me)
        .err()
        .ok_or("put reached symheap's own device state")?;
    ensure!(e.to_string().contains("own state"), "wrong error: {e}");
    let mine = ctx.malloc(64).map_err(e2s)?;
    ctx.write_at(mine.addr(), &[7u8; 8]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)
}

/// The protocols the PEs agreed on follow `SYMHEAP_TOPOLOGY` (the scenario's environment sets
/// it; `expect` is whether LL128 must be on), and the sizes LL128 would serve are exact either
/// way.
fn protocols(ctx: &Context, expect: bool, why: &str) -> Outcome {
    let cu = cuda(ctx)?;
    let p = cu.protocols();
    println!("protocols: {}", p.why);
    ensure!(p.ll128 == expect, "LL128 {} ({})", p.ll128, p.why);
    ensure!(
        p.why.contains(why),
        "reason `{}` does not say `{why}`",
        p.why
    );
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let s = cu.create_stream().map_err(e2s)?;
    for count in [64 << 10usize, 256 << 10] {
        let b = ctx.malloc((count * 4) as u64).map_err(e2s)?;
        let out = ctx.malloc((count * 4) as u64).map_err(e2s)?;
        b.write(
            0,
            &(0..count)
                .map(|i| ((i + me) % 5) as i32)
                .collect::<Vec<_>>(),
        )
        .map_err(e2s)?;
        ctx.barrier_all().map_err(e2s)?;
        ctx.all_reduce_on_stream(
            &world,
            out.addr(),
            b.addr(),
            count,
            DType::I32,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            &s,
        )
        .map_err(e2s)?;
        ctx.sync_stream(&s).map_err(e2s)?;
        let got = out.to_vec::<i32>().map_err(e2s)?;
        for (i, &g) in got.iter().enumerate() {
            let want: i32 = (0..n).map(|p| ((i + p) % 5) as i32).sum();
            ensure!(g == want, "{count}: element {i} is {g}, expected {want}");
        }
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}

/// `SYMHEAP_TOPOLOGY=pcie`: LL128 off, flag kernels exact.
pub fn protocols_pcie(ctx: &Context, _a: PeArgs) -> Outcome {
    protocols(ctx, false, "SYMHEAP_TOPOLOGY=pcie")
}

/// `SYMHEAP_TOPOLOGY=nvlink` on a verified architecture: LL128 on, exact.
pub fn protocols_nvlink(ctx: &Context, _a: PeArgs) -> Outcome {
    let on = matches!(
        ctx.cuda().map(|c| c.compute_capability()),
        Some(cc) if symheap::cuda::topology::LL128_VERIFIED.contains(&cc)
    );
    protocols(ctx, on, if on { "LL128 on" } else { "verified" })
}

/// The victim kills itself with SIGKILL while every other PE waits for it on the device (a
/// stream collective the victim never enqueues): with `SYMHEAP_TIMEOUT` far away, every
/// survivor's kernel must end and its next symheap call report the victim within 2 s.
pub fn kill_device(ctx: &Context, a: PeArgs) -> Outcome {
    let cu = cuda(ctx)?;
    let world = ctx.world_team();
    let s = cu.create_stream().map_err(e2s)?;
    let count = 1 << 12;
    let b = ctx.malloc((count * 4) as u64).map_err(e2s)?;
    b.write(0, &vec![1i32; count]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    // One collective everybody finishes first: across nodes it sets NCCL up, so the victim
    // dies with the others waiting on the device (in symheap's kernels or in NCCL's).
    let sum = |s: &symheap::Stream| {
        let (i32_, op, algo) = (DType::I32, ReduceOp::Sum, AllReduceAlgo::Auto);
        ctx.all_reduce_on_stream(&world, b.addr(), b.addr(), count, i32_, op, algo, s)
    };
    sum(&s).map_err(e2s)?;
    ctx.sync_stream(&s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    if ctx.my_pe() == a.victim {
        std::thread::sleep(Duration::from_millis(200));
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        std::thread::sleep(Duration::from_secs(60));
        return Err("SIGKILL did not kill".into());
    }
    sum(&s).map_err(e2s)?;
    let t0 = Instant::now();
    let e = match ctx.sync_stream(&s) {
        Ok(()) => return Err("a collective with a dead PE completed".into()),
        Err(e) => e,
    };
    let dt = t0.elapsed();
    println!(
        "got the expected error after {:.3} s: {e}",
        dt.as_secs_f64()
    );
    ensure!(
        matches!(e.kind(), ErrorKind::PeerExited { peer, .. } if *peer == a.victim),
        "wrong error (victim PE {}): {e}",
        a.victim
    );
    // 0.2 s of the victim's own sleep before it dies, plus at most 2 s to notice.
    ensure!(dt < Duration::from_millis(2200), "noticed after {dt:?}");
    Ok(())
}
