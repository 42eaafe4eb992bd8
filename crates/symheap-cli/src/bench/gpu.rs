//! The GPU sweep (`symheap bench` on a machine with GPUs, `symheap bench coll`): symheap against
//! NCCL in the same processes, on the same buffers, with the same method: the median over trials
//! of an event-timed loop of K back-to-back operations, divided by K, both launched eagerly and
//! replayed from a CUDA graph. RMA: put/get bandwidth (SM kernel and copy engine) against a plain
//! peer-to-peer copy-engine copy, put+signal ping-pong against NCCL send/recv, and the latency of
//! allocate_symmetric.

use std::path::Path;

use symheap::tools::Nccl;
use symheap::tools::{DeviceBuffer, Event, PeerCopy};
use symheap::{AllReduceAlgo, Cmp, Context, DType, Engine, ReduceOp, SignalOp, SymmetricBuffer};

use super::gpu_time::{k_for, time_graph, time_stream, GpuRow};

/// SYMHEAP_BENCH_TRACE=1: a line per stage on stderr, to find where a run stalls.
fn trace(ctx: &Context, what: &str) {
    if std::env::var_os("SYMHEAP_BENCH_TRACE").is_some() {
        eprintln!("bench PE {}: {what}", ctx.my_pe());
    }
}

fn e2s(e: symheap::Error) -> String {
    e.to_string()
}

/// Collectives the sweep knows.
pub const COLL_OPS: &[&str] = &[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "alltoall",
];

fn fill(b: &SymmetricBuffer, seed: u64) -> Result<(), String> {
    // Real data (not zeros): small integers as bf16/f32/i32 bit patterns are all finite.
    let n = b.len_bytes() as usize / 2;
    let mut r = fastrand::Rng::with_seed(seed);
    let pattern: Vec<u16> = (0..65536).map(|_| 0x3c00 + r.u16(0..0x200)).collect();
    let v: Vec<u16> = pattern.iter().copied().cycle().take(n).collect();
    b.write(0, &v).map_err(e2s)
}

/// Per-rank send and receive sizes for a sweep point of `bytes` under NCCL-tests' convention,
/// and the bus-bandwidth factor that makes the collectives comparable.
fn coll_shape(op: &str, bytes: u64, n: u64) -> Result<(u64, u64, f64), String> {
    Ok(match op {
        "all_reduce" => (bytes, bytes, 2.0 * (n - 1) as f64 / n as f64),
        "all_gather" => (bytes / n, bytes, (n - 1) as f64 / n as f64),
        "reduce_scatter" => (bytes, bytes / n, (n - 1) as f64 / n as f64),
        "broadcast" => (bytes, bytes, 1.0),
        "alltoall" => (bytes, bytes, (n - 1) as f64 / n as f64),
        other => return Err(format!("unknown collective {other}")),
    })
}

/// One collective at one size, on symheap's buffers and on NCCL's copies of them, so that both
/// sides of a row run the same operation on the same data.
struct CollCase<'a> {
    ctx: &'a Context,
    s: &'a symheap::Stream,
    w: symheap::Team,
    op: &'a str,
    dtype: DType,
    algo: AllReduceAlgo,
    n: usize,
    count_send: usize,
    count_recv: usize,
    src: &'a SymmetricBuffer,
    dst: &'a SymmetricBuffer,
    psrc: &'a DeviceBuffer,
    pdst: &'a DeviceBuffer,
}

impl CollCase<'_> {
    /// Enqueues the collective once through symheap.
    fn symheap(&self) -> symheap::Result<()> {
        let CollCase {
            ctx,
            s,
            ref w,
            op,
            dtype,
            algo,
            n,
            count_send,
            count_recv,
            src,
            dst,
            ..
        } = *self;
        match op {
            "all_reduce" => ctx.all_reduce_on_stream(
                w,
                dst.addr(),
                src.addr(),
                count_send,
                dtype,
                ReduceOp::Sum,
                algo,
                s,
            ),
            "all_gather" => {
                ctx.all_gather_on_stream(w, dst.addr(), src.addr(), count_send, dtype, s)
            }
            "reduce_scatter" => ctx.reduce_scatter_on_stream(
                w,
                dst.addr(),
                src.addr(),
                count_recv,
                dtype,
                ReduceOp::Sum,
                s,
            ),
            "broadcast" => {
                ctx.broadcast_on_stream(w, dst.addr(), src.addr(), count_send, dtype, 0, s)
            }
            _ => ctx.alltoall_on_stream(w, dst.addr(), src.addr(), count_send / n, dtype, s),
        }
    }

    /// Enqueues the same collective once through NCCL.
    fn nccl(&self, nc: &mut Nccl) -> symheap::Result<()> {
        let CollCase {
            s,
            op,
            dtype,
            n,
            count_send,
            count_recv,
            psrc,
            pdst,
            ..
        } = *self;
        match op {
            "all_reduce" => nc.all_reduce(pdst, psrc, count_send, dtype, ReduceOp::Sum, s),
            "all_gather" => nc.all_gather(pdst, psrc, count_send, dtype, s),
            "reduce_scatter" => nc.reduce_scatter(pdst, psrc, count_recv, dtype, ReduceOp::Sum, s),
            "broadcast" => nc.broadcast(pdst, psrc, count_send, dtype, 0, s),
            _ => nc.alltoall(pdst, psrc, count_send / n, dtype, s),
        }
    }
}

/// Waits for this PE's stream, then for every PE, so that no measurement overlaps the next.
fn settle(ctx: &Context, s: &symheap::Stream) -> Result<(), String> {
    ctx.sync_stream(s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)
}

/// Microseconds per op of one collective case, both libraries, eager and graph-replayed.
struct CollTimes {
    eager: f64,
    graph: f64,
    peer_eager: f64,
    peer_graph: f64,
}

/// Times `case` on symheap and on NCCL, eager then graph, every PE in step.
fn time_coll(case: &CollCase<'_>, nccl: &mut Nccl, bytes: u64) -> Result<CollTimes, String> {
    let (ctx, s, op) = (case.ctx, case.s, case.op);
    let (k, trials) = k_for(bytes);
    let phase = |what: &str| trace(ctx, &format!("{op} {bytes} B: {what}"));
    phase("warm-up");
    // Warm up both (NCCL sets up its channels lazily).
    for _ in 0..3 {
        case.symheap().map_err(e2s)?;
        case.nccl(nccl).map_err(e2s)?;
    }
    settle(ctx, s)?;
    phase("symheap eager");
    let eager = time_stream(s, trials, k, || case.symheap().map_err(e2s))?;
    settle(ctx, s)?;
    phase("symheap graph");
    let graph = time_graph(s, trials, k, || case.symheap())?;
    settle(ctx, s)?;
    phase("NCCL eager");
    let peer_eager = time_stream(s, trials, k, || case.nccl(nccl).map_err(e2s))?;
    settle(ctx, s)?;
    phase("NCCL graph");
    let peer_graph = time_graph(s, trials, k, || case.nccl(nccl))?;
    settle(ctx, s)?;
    Ok(CollTimes {
        eager,
        graph,
        peer_eager,
        peer_graph,
    })
}

/// The in-process peer's column name, with the version of the libnccl.so.2 the loader found.
fn nccl_name() -> String {
    match Nccl::version() {
        Ok(v) => format!("NCCL {}", symheap::tools::nccl_version_string(v)),
        Err(_) => "NCCL".into(),
    }
}

/// The row's name: all_reduce rows say which algorithm they forced.
fn coll_label(op: &str, algo: AllReduceAlgo) -> String {
    match (op, algo) {
        ("all_reduce", AllReduceAlgo::OneShot) => "all_reduce one-shot".to_string(),
        ("all_reduce", AllReduceAlgo::TwoShot) => "all_reduce two-shot".to_string(),
        _ => op.to_string(),
    }
}

/// One row of the collective sweep: `op` of `bytes` on symheap and on NCCL.
#[allow(clippy::too_many_arguments)]
fn bench_coll(
    ctx: &Context,
    nccl: &mut Nccl,
    s: &symheap::Stream,
    op: &str,
    bytes: u64,
    dtype: DType,
    algo: AllReduceAlgo,
    rows: &mut Vec<GpuRow>,
) -> Result<(), String> {
    let n = ctx.n_pes() as u64;
    let el = dtype.size() as u64;
    let (send, recv, factor) = coll_shape(op, bytes, n)?;
    let count_send = (send / el) as usize;
    let count_recv = (recv / el) as usize;
    let src = ctx.malloc(send.max(256)).map_err(e2s)?;
    let dst = ctx.malloc(recv.max(256)).map_err(e2s)?;
    fill(&src, bytes ^ ctx.my_pe() as u64)?;
    // NCCL gets ordinary cuMemAlloc buffers with the same contents, as its users give it (and
    // NCCL 2.28's graph-time registration of VMM memory hangs graph-captured alltoall of
    // 64 MiB on symheap's heap; see BENCHMARKS.md).
    let nsrc = DeviceBuffer::copy_of(&src).map_err(e2s)?;
    let ndst = DeviceBuffer::copy_of(&dst).map_err(e2s)?;
    let case = CollCase {
        ctx,
        s,
        w: ctx.world_team(),
        op,
        dtype,
        algo,
        n: n as usize,
        count_send,
        count_recv,
        src: &src,
        dst: &dst,
        psrc: &nsrc,
        pdst: &ndst,
    };
    let t = time_coll(&case, nccl, bytes)?;
    rows.push(GpuRow {
        group: "coll".into(),
        op: coll_label(op, algo),
        dtype: dtype.name().into(),
        bytes,
        graph_us: Some(t.graph),
        eager_us: Some(t.eager),
        peer: nccl_name(),
        peer_graph_us: Some(t.peer_graph),
        peer_eager_us: Some(t.peer_eager),
        bus_factor: factor,
        ..Default::default()
    });
    Ok(())
}

/// The RMA and allocation rows: bandwidth (PE 0 to PE 1), put+signal ping-pong, and the
/// latency of allocate_symmetric. The buffers of the earlier rows stay allocated to the end, so
/// the allocation rows are measured on the heap those rows left.
fn bench_rma(
    ctx: &Context,
    nccl: &mut Nccl,
    s: &symheap::Stream,
    sizes: &[u64],
    rows: &mut Vec<GpuRow>,
) -> Result<(), String> {
    let me = ctx.my_pe();
    let cu = ctx.cuda().ok_or("no CUDA backend")?;
    let max = *sizes.iter().max().unwrap_or(&4096);
    let src = ctx.malloc(max).map_err(e2s)?;
    let dst = ctx.malloc(max).map_err(e2s)?;
    fill(&src, 7)?;
    ctx.barrier_all().map_err(e2s)?;
    if me == 0 {
        rma_bandwidth(ctx, cu, s, &src, &dst, max, sizes, rows)?;
    }
    ctx.barrier_all().map_err(e2s)?;

    trace(ctx, "RMA bandwidth done");
    let sig = ctx.calloc(1, 8).map_err(e2s)?;
    let buf = ctx.calloc(1, 64 << 10).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    ping_pong(ctx, nccl, s, &sig, &buf, rows)?;
    ctx.barrier_all().map_err(e2s)?;

    trace(ctx, "ping-pong done");
    alloc_latency(ctx, rows)?;
    ctx.barrier_all().map_err(e2s)
}

/// PE 0 only: put and get to PE 1 with each engine, against a plain peer-to-peer copy of the
/// same size between the same two GPUs (`max` bytes: the largest of `sizes`).
#[allow(clippy::too_many_arguments)]
fn rma_bandwidth(
    ctx: &Context,
    cu: &symheap::cuda::CudaBackend,
    s: &symheap::Stream,
    src: &SymmetricBuffer,
    dst: &SymmetricBuffer,
    max: u64,
    sizes: &[u64],
    rows: &mut Vec<GpuRow>,
) -> Result<(), String> {
    let peer_dev = if cu.device_ordinal() == 0 { 1 } else { 0 };
    let plain = PeerCopy::new(cu.device_ordinal(), peer_dev, max).map_err(e2s)?;
    cu.bind().map_err(e2s)?;
    for &b in sizes {
        let (k, trials) = k_for(b);
        let base = time_stream(s, trials, k, || plain.enqueue(b, s).map_err(e2s))?;
        cu.bind().map_err(e2s)?;
        for (name, engine, get) in [
            ("put SM", Engine::Sm, false),
            ("put copy engine", Engine::CopyEngine, false),
            ("get SM", Engine::Sm, true),
            ("get copy engine", Engine::CopyEngine, true),
        ] {
            let f = || {
                if get {
                    ctx.get_on_stream_with(dst.addr(), src.addr(), b, 1, s, engine)
                        .map_err(e2s)
                } else {
                    ctx.put_on_stream_with(dst.addr(), src.addr(), b, 1, s, engine)
                        .map_err(e2s)
                }
            };
            let t = time_stream(s, trials, k, f)?;
            rows.push(GpuRow {
                group: "rma".into(),
                op: name.into(),
                dtype: "bytes".into(),
                bytes: b,
                eager_us: Some(t),
                peer: "plain P2P copy (cuMemcpyPeerAsync)".into(),
                peer_eager_us: Some(base),
                bus_factor: 1.0,
                ..Default::default()
            });
        }
    }
    ctx.sync_stream(s).map_err(e2s)?;
    drop(plain);
    cu.bind().map_err(e2s)
}

/// put+signal ping-pong, PE 0 <-> PE 1, on streams; and NCCL send/recv of the same size. PEs
/// past the first two take no part.
fn ping_pong(
    ctx: &Context,
    nccl: &mut Nccl,
    s: &symheap::Stream,
    sig: &SymmetricBuffer,
    buf: &SymmetricBuffer,
    rows: &mut Vec<GpuRow>,
) -> Result<(), String> {
    // 8 bytes and 4 KiB take the fused single-launch put with signal, 64 KiB its largest size.
    const PING_SIZES: [u64; 3] = [8, 4096, 64 << 10];
    let me = ctx.my_pe();
    // The signal only grows, over every size, so that a wait never sees an earlier round's value.
    let mut epoch = 0u64;
    for bytes in PING_SIZES {
        if me >= 2 {
            break;
        }
        let sym_us = put_signal_ping_pong(ctx, s, sig, buf, bytes, &mut epoch)?;
        let nccl_us = nccl_ping_pong(ctx, nccl, s, buf, bytes)?;
        if me == 0 {
            rows.push(GpuRow {
                group: "rma".into(),
                op: "put+signal one-way latency (ping-pong / 2)".into(),
                dtype: "bytes".into(),
                bytes,
                eager_us: Some(sym_us),
                peer: format!("{} send/recv ping-pong / 2", nccl_name()),
                peer_eager_us: Some(nccl_us),
                bus_factor: 0.0,
                ..Default::default()
            });
        }
    }
    Ok(())
}

/// One-way latency in µs of symheap's put+signal between PE 0 and PE 1 (callers are those two),
/// half the mean round trip; the stream is idle again on return.
fn put_signal_ping_pong(
    ctx: &Context,
    s: &symheap::Stream,
    sig: &SymmetricBuffer,
    buf: &SymmetricBuffer,
    bytes: u64,
    epoch: &mut u64,
) -> Result<f64, String> {
    let me = ctx.my_pe();
    let other = 1 - me;
    let rounds = 2000u64;
    let put = |i: u64| {
        ctx.put_signal_on_stream(
            buf.addr(),
            buf.addr(),
            bytes,
            sig.addr(),
            i,
            SignalOp::Set,
            other,
            s,
        )
        .map_err(e2s)
    };
    let wait = |i: u64| {
        ctx.signal_wait_until_on_stream(sig.addr(), Cmp::Ge, i, s)
            .map_err(e2s)
    };
    let (a, b) = (Event::new().map_err(e2s)?, Event::new().map_err(e2s)?);
    a.record(s).map_err(e2s)?;
    for _ in 0..rounds {
        *epoch += 1;
        if me == 0 {
            put(*epoch)?;
            wait(*epoch)?;
        } else {
            wait(*epoch)?;
            put(*epoch)?;
        }
    }
    b.record(s).map_err(e2s)?;
    let sym_us = a.elapsed_ms(&b).map_err(e2s)? as f64 * 1e3 / rounds as f64 / 2.0;
    ctx.sync_stream(s).map_err(e2s)?;
    Ok(sym_us)
}

/// The same for NCCL send/recv of `bytes` in `buf`, after a few warm-up round trips.
fn nccl_ping_pong(
    ctx: &Context,
    nccl: &mut Nccl,
    s: &symheap::Stream,
    buf: &SymmetricBuffer,
    bytes: u64,
) -> Result<f64, String> {
    let nrounds = 500;
    let (c, d) = (Event::new().map_err(e2s)?, Event::new().map_err(e2s)?);
    for _ in 0..5 {
        nccl.ping_pong(buf, bytes, s).map_err(e2s)?;
    }
    c.record(s).map_err(e2s)?;
    for _ in 0..nrounds {
        nccl.ping_pong(buf, bytes, s).map_err(e2s)?;
    }
    d.record(s).map_err(e2s)?;
    let nccl_us = c.elapsed_ms(&d).map_err(e2s)? as f64 * 1e3 / nrounds as f64 / 2.0;
    ctx.sync_stream(s).map_err(e2s)?;
    Ok(nccl_us)
}

/// allocate_symmetric latency, 1 MiB (+ release; reclaim happens at collective points): the
/// median of 300, with the spread traced.
fn alloc_latency(ctx: &Context, rows: &mut Vec<GpuRow>) -> Result<(), String> {
    let mut t = Vec::new();
    for _ in 0..300 {
        let t0 = std::time::Instant::now();
        let (b, table) = ctx.allocate_symmetric::<u8>(1 << 20).map_err(e2s)?;
        t.push(t0.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(&table);
        drop(b);
    }
    t.sort_by(|x, y| x.partial_cmp(y).unwrap());
    trace(
        ctx,
        &format!(
            "allocate_symmetric 1 MiB: p10 {:.2} us, median {:.2}, p90 {:.2}, max {:.2}",
            t[t.len() / 10],
            t[t.len() / 2],
            t[t.len() * 9 / 10],
            t[t.len() - 1]
        ),
    );
    if ctx.my_pe() == 0 {
        rows.push(GpuRow {
            group: "alloc".into(),
            op: "allocate_symmetric 1 MiB (median of 300)".into(),
            dtype: "u8".into(),
            bytes: 1 << 20,
            eager_us: Some(t[t.len() / 2]),
            peer: "torch SymmetricMemory empty+rendezvous".into(),
            bus_factor: 0.0,
            ..Default::default()
        });
    }
    Ok(())
}

/// What one benchmark PE runs.
#[derive(Debug, Clone)]
pub struct GpuPlan {
    /// Collectives to sweep.
    pub ops: Vec<String>,
    /// Sizes in bytes.
    pub sizes: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Also the RMA and allocation rows.
    pub rma: bool,
}

fn run(ctx: &Context, plan: &GpuPlan) -> Result<Vec<GpuRow>, String> {
    let cu = ctx
        .cuda()
        .ok_or("the GPU benchmark needs the CUDA backend")?;
    let s = cu.create_stream().map_err(e2s)?;
    let mut nccl = Nccl::new(ctx).map_err(e2s)?;
    // Progress goes to logs as whole lines (a `\r` line would be lost if the job is killed).
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let end = if tty { "\r" } else { "\n" };
    if ctx.my_pe() == 0 {
        eprint!("bench: {} communicator ready{end}", nccl_name());
    }
    let mut rows = Vec::new();
    let total = plan.ops.len() * plan.sizes.len();
    let mut done = 0;
    for op in &plan.ops {
        for &b in &plan.sizes {
            done += 1;
            if ctx.my_pe() == 0 {
                let lead = if tty { "\r" } else { "" };
                eprint!(
                    "{lead}bench: [{done}/{total}] {op} {} {}        {end}",
                    plan.dtype,
                    symheap::human_bytes(b)
                );
            }
            bench_coll(
                ctx,
                &mut nccl,
                &s,
                op,
                b,
                plan.dtype,
                AllReduceAlgo::Auto,
                &mut rows,
            )?;
        }
    }
    if ctx.my_pe() == 0 && total > 0 && tty {
        eprintln!();
    }
    if plan.ops.iter().any(|o| o == "all_reduce") && ctx.node().node_count > 1 {
        super::nodes::stage_rows(ctx, &s, &plan.sizes, plan.dtype, &mut rows)?;
    }
    let note = |what: &str| trace(ctx, what);
    note("collectives done");
    if plan.rma && ctx.n_pes() >= 2 {
        // 64 B and 1 KiB too: where launch costs alone decide between the SM and the copy engine.
        let sizes: Vec<u64> = [64u64, 1024]
            .into_iter()
            .chain((0..=9).map(|i| 4096u64 << (2 * i)))
            .filter(|&b| b <= 1 << 30)
            .collect();
        bench_rma(ctx, &mut nccl, &s, &sizes, &mut rows)?;
    }
    note("RMA done");
    ctx.sync_stream(&s).map_err(e2s)?;
    drop(nccl);
    note("NCCL communicator destroyed");
    Ok(rows)
}

/// One PE of the GPU sweep; PE 0 writes the rows to `out`.
pub fn bench_pe_gpu(plan: &GpuPlan, out: &Path) -> i32 {
    let ctx = match Context::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    match run(&ctx, plan) {
        Ok(rows) => {
            if ctx.my_pe() == 0 {
                if let Err(e) = std::fs::write(out, serde_json::to_vec(&rows).unwrap()) {
                    eprintln!("cannot write {}: {e}", out.display());
                    return 1;
                }
            }
            match ctx.finalize() {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{e}");
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("bench PE {}: {e}", ctx.my_pe());
            1
        }
    }
}
