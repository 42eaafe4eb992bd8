//! What each PE runs for the host-backend sweep (`symheap bench-pe`): the parts, collectives,
//! sizes and dtype that `symheap bench` was asked for.

use std::hint::black_box;
use std::path::Path;

use symheap::{AllReduceAlgo, Context, DType, ReduceOp};

use super::{iters, time_loop, Row};

const TRIALS: usize = 9;

/// What one host sweep measures (every PE gets the same plan).
#[derive(Debug, Clone)]
pub struct HostPlan {
    /// put/get bandwidth at these sizes (empty: no RMA rows).
    pub rma_sizes: Vec<u64>,
    /// The barrier row.
    pub barrier: bool,
    /// Collectives (`all_reduce`, `all_gather`, ...), each at every size of `coll_sizes`.
    pub ops: Vec<String>,
    /// Message sizes of the collectives (NCCL-tests convention, as the GPU sweep).
    pub coll_sizes: Vec<u64>,
    /// Element type of the collectives.
    pub dtype: DType,
}

fn e2s(e: symheap::Error) -> String {
    e.to_string()
}

fn rma_rows(ctx: &Context, sizes: &[u64], rows: &mut Vec<Row>) -> Result<(), String> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let target = if n > 1 { 1 } else { 0 };
    let max = sizes.iter().copied().max().unwrap_or(1);
    let buf = ctx.malloc(max).map_err(e2s)?;
    let src: Vec<u8> = (0..max).map(|i| (i * 31 % 251) as u8).collect();
    let mut dst = vec![0u8; max as usize];
    for &s in sizes {
        let s_us = s as usize;
        ctx.barrier_all().map_err(e2s)?;
        if me == 0 {
            let k = iters(s);
            let put = time_loop(TRIALS, k, || {
                ctx.put_bytes(buf.addr(), &src[..s_us], target)
                    .map_err(e2s)?;
                ctx.quiet().map_err(e2s)
            })?;
            let get = time_loop(TRIALS, k, || {
                ctx.get_bytes(&mut dst[..s_us], buf.addr(), target)
                    .map_err(e2s)
            })?;
            let memcpy = time_loop(TRIALS, k, || {
                dst[..s_us].copy_from_slice(black_box(&src[..s_us]));
                black_box(&dst);
                Ok(())
            })?;
            for (op, t) in [("put (PE 0 -> PE 1)", put), ("get (PE 0 <- PE 1)", get)] {
                rows.push(Row {
                    op: op.into(),
                    bytes: s,
                    symheap_s: t,
                    peer: "memcpy, same process".into(),
                    peer_s: Some(memcpy),
                });
            }
        }
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}

/// The row label of collective `op` on `dtype`, such as `all_reduce f32 sum` (the MPI peer's
/// rows are matched on it).
pub fn coll_label(op: &str, dtype: DType) -> String {
    let short = match dtype {
        DType::U8 => "u8",
        DType::I8 => "i8",
        DType::U16 => "u16",
        DType::I16 => "i16",
        DType::U32 => "u32",
        DType::I32 => "i32",
        DType::U64 => "u64",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
    };
    let reduces = matches!(op, "all_reduce" | "reduce_scatter");
    format!("{op} {short}{}", if reduces { " sum" } else { "" })
}

fn coll_row(ctx: &Context, op: &str, bytes: u64, dtype: DType) -> Result<Row, String> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes() as u64);
    let el = dtype.size() as u64;
    let (send, recv) = match op {
        "all_gather" => (bytes / n, bytes),
        "reduce_scatter" => (bytes, bytes / n),
        _ => (bytes, bytes),
    };
    let (cs, cr) = ((send / el) as usize, (recv / el) as usize);
    let a = ctx.malloc(send.max(el)).map_err(e2s)?;
    let b = ctx.malloc(recv.max(el)).map_err(e2s)?;
    let data: Vec<u8> = (0..send)
        .map(|i| ((i * 7 + me as u64) % 13) as u8)
        .collect();
    a.write(0, &data).map_err(e2s)?;
    let w = ctx.world_team();
    let (dst, src) = (b.addr(), a.addr());
    // The operation is chosen once, outside the timed loop: matching `op` by name in every
    // iteration cost the loop string comparisons that the MPI peer's loop does not make.
    let call: Box<dyn Fn() -> symheap::Result<()> + '_> = match op {
        "all_reduce" => Box::new(|| {
            ctx.all_reduce_raw(&w, dst, src, cs, dtype, ReduceOp::Sum, AllReduceAlgo::Auto)
        }),
        "all_gather" => Box::new(|| ctx.all_gather_raw(&w, dst, src, cs, dtype)),
        "reduce_scatter" => {
            Box::new(|| ctx.reduce_scatter_raw(&w, dst, src, cr, dtype, ReduceOp::Sum))
        }
        "broadcast" => Box::new(|| ctx.broadcast_raw(&w, dst, src, cs, dtype, 0)),
        _ => Box::new(|| ctx.alltoall_raw(&w, dst, src, cs / n as usize, dtype)),
    };
    let run = || call().map_err(e2s);
    for _ in 0..3 {
        run()?;
    }
    ctx.barrier_all().map_err(e2s)?;
    let t = if op == "broadcast" {
        time_loop_slowest(ctx, 15, iters(bytes), run)?
    } else {
        time_loop(15, iters(bytes), run)?
    };
    let peer = if op == "all_reduce" && dtype == DType::F32 {
        "Open MPI MPI_Allreduce"
    } else if op == "broadcast" {
        super::mpi::MPI_BCAST_PEER
    } else {
        "none on the host backend"
    };
    Ok(Row {
        op: coll_label(op, dtype),
        bytes,
        symheap_s: t,
        peer: peer.into(),
        peer_s: None,
    })
}

/// Like `time_loop`, but each trial starts at a barrier and counts the slowest PE's loop (the
/// maximum over PEs): a broadcast is done when every PE has the data, while the root alone
/// returns as soon as its eager sends are out and may run ahead of its receivers. The MPI peer
/// (`mpi_peer.c`) times `MPI_Bcast` the same way.
fn time_loop_slowest(
    ctx: &Context,
    trials: usize,
    k: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let mut mine = Vec::with_capacity(trials);
    for _ in 0..trials {
        ctx.barrier_all().map_err(e2s)?;
        let t0 = std::time::Instant::now();
        for _ in 0..k {
            f()?;
        }
        mine.push(t0.elapsed().as_secs_f64() / k as f64);
    }
    let w = ctx.world_team();
    let src = ctx.malloc(8 * trials as u64).map_err(e2s)?;
    let dst = ctx.malloc(8 * trials as u64).map_err(e2s)?;
    src.write(0, &mine).map_err(e2s)?;
    ctx.all_reduce::<f64>(&w, &dst, &src, trials, ReduceOp::Max)
        .map_err(e2s)?;
    let mut slowest = vec![0f64; trials];
    dst.read(0, &mut slowest).map_err(e2s)?;
    slowest.sort_by(f64::total_cmp);
    Ok(slowest[trials / 2])
}

fn run(ctx: &Context, plan: &HostPlan) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    if !plan.rma_sizes.is_empty() {
        rma_rows(ctx, &plan.rma_sizes, &mut rows)?;
    }
    if plan.barrier {
        for _ in 0..50 {
            ctx.barrier_all().map_err(e2s)?;
        }
        let barrier = time_loop(15, 200, || ctx.barrier_all().map_err(e2s))?;
        rows.push(Row {
            op: "barrier".into(),
            bytes: 0,
            symheap_s: barrier,
            peer: "Open MPI MPI_Barrier".into(),
            peer_s: None,
        });
    }
    for op in &plan.ops {
        for &s in &plan.coll_sizes {
            rows.push(coll_row(ctx, op, s, plan.dtype)?);
        }
    }
    Ok(rows)
}

/// Binds this PE to one CPU of those it may run on (the `local_rank`-th), when the node's PEs
/// are no more than those CPUs: what mpirun does to the MPI peer's ranks by default (`bind to
/// core` for 2 ranks), so both sides are measured alike. Unbound, two PEs that the scheduler
/// puts on one core (other work holding the second) wait for each other's time slices: a
/// barrier measured 5-6 us unbound and 0.5 us bound on the 2-core VM. Best effort: a PE that
/// cannot be bound runs unbound.
fn bind_to_cpu(local_rank: usize, local_size: usize) {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let Ok(allowed) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    if local_size > cpus.len() {
        return;
    }
    let mut one = CpuSet::new();
    if one.set(cpus[local_rank]).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &one);
    }
}

/// One PE of the host sweep; PE 0 writes the rows to `out` as JSON.
pub fn bench_pe_host(plan: &HostPlan, out: &Path) -> i32 {
    let ctx = match Context::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    bind_to_cpu(ctx.local_rank(), ctx.local_size());
    match run(&ctx, plan) {
        Ok(rows) => {
            if ctx.my_pe() == 0 {
                let json = serde_json::to_vec(&rows).unwrap_or_default();
                if let Err(e) = std::fs::write(out, json) {
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
