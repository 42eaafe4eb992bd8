//! What each PE runs for the host-backend sweep (`symheap bench-pe`).

use std::hint::black_box;
use std::path::Path;

use symheap::{Context, ReduceOp};

use super::{iters, time_loop, Row, HOST_ALLREDUCE_SIZES};

const RMA_SIZES: [u64; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
const TRIALS: usize = 9;

fn e2s(e: symheap::Error) -> String {
    e.to_string()
}

fn run(ctx: &Context) -> Result<Vec<Row>, String> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let target = if n > 1 { 1 } else { 0 };
    let max = *RMA_SIZES.last().unwrap();
    let buf = ctx.malloc(max).map_err(e2s)?;
    let src: Vec<u8> = (0..max).map(|i| (i * 31 % 251) as u8).collect();
    let mut dst = vec![0u8; max as usize];
    let mut rows = Vec::new();
    for &s in &RMA_SIZES {
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
    let world = ctx.world_team();
    for &s in &HOST_ALLREDUCE_SIZES {
        let count = (s / 4) as usize;
        let a = ctx.malloc(s).map_err(e2s)?;
        let b = ctx.malloc(s).map_err(e2s)?;
        let data: Vec<f32> = (0..count)
            .map(|i| ((i * 7 + me) % 13) as f32 * 0.25)
            .collect();
        a.write(0, &data).map_err(e2s)?;
        for _ in 0..3 {
            ctx.all_reduce::<f32>(&world, &b, &a, count, ReduceOp::Sum)
                .map_err(e2s)?;
        }
        ctx.barrier_all().map_err(e2s)?;
        let t = time_loop(15, iters(s), || {
            ctx.all_reduce::<f32>(&world, &b, &a, count, ReduceOp::Sum)
                .map_err(e2s)
        })?;
        rows.push(Row {
            op: "all_reduce f32 sum".into(),
            bytes: s,
            symheap_s: t,
            peer: "Open MPI MPI_Allreduce".into(),
            peer_s: None,
        });
    }
    let _ = n;
    Ok(rows)
}

/// One PE of the host sweep; PE 0 writes the rows to `out` as JSON.
pub fn bench_pe_host(out: &Path) -> i32 {
    let ctx = match Context::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    match run(&ctx) {
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
