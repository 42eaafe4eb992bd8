//! Self-test scenario of the uneven alltoall: split sizes given on the host (host and stream
//! forms) and counts in symmetric memory (all_to_all_vdev, host and stream forms), on random
//! uneven splits with zeros, exact against the split matrix every PE draws from the shared
//! seed; disagreeing split sizes and bad counts refused on every PE, the context usable after.

use symheap::{BackendKind, Context, DType, ErrorKind, SymmetricBuffer};

use super::ops_scenarios::rng;
use super::scenarios::{e2s, Outcome, PeArgs};

const POISON: i64 = -1;

/// Rows member i sends member j (`m[i][j]`): 1 to 39, about a quarter of them zero.
fn matrix(r: &mut fastrand::Rng, n: usize) -> Vec<Vec<usize>> {
    (0..n)
        .map(|_| {
            (0..n)
                .map(|_| if r.f32() < 0.25 { 0 } else { r.usize(1..40) })
                .collect()
        })
        .collect()
}

/// The values member `i` sends member `j` in round `round`: `len` of them, all distinct.
fn values(round: usize, i: usize, j: usize, len: usize) -> Vec<i64> {
    let base = ((round * 1_000_003 + i * 10_007 + j * 101) * 1000) as i64;
    (0..len as i64).map(|k| base + k).collect()
}

/// The four ways to call it.
#[derive(Debug, Clone, Copy)]
enum Form {
    Host,
    Stream,
    DeviceCounts,
    DeviceCountsStream,
}

/// Buffers of one round: source, destination (one spare row past what any member receives),
/// counts and outputs.
struct Bufs {
    src: SymmetricBuffer,
    dst: SymmetricBuffer,
    counts: SymmetricBuffer,
    out: SymmetricBuffer,
    src_rows: usize,
    dst_rows: usize,
}

fn bufs(ctx: &Context, m: &[Vec<usize>], row: usize) -> Result<Bufs, String> {
    let n = m.len();
    let src_rows = m.iter().map(|r| r.iter().sum::<usize>()).max().unwrap_or(0);
    let dst_rows = (0..n)
        .map(|j| m.iter().map(|r| r[j]).sum::<usize>())
        .max()
        .unwrap_or(0)
        + 1;
    let alloc = |elems: usize| ctx.malloc((elems.max(1) * 8) as u64).map_err(e2s);
    Ok(Bufs {
        src: alloc(src_rows * row)?,
        dst: alloc(dst_rows * row)?,
        counts: alloc(n)?,
        out: alloc(2 * n)?,
        src_rows,
        dst_rows,
    })
}

/// One call in `form` of round `round` with the sizes of `m`, checked exactly: the blocks, the
/// spare row untouched, and the device-counts outputs.
fn one(ctx: &Context, m: &[Vec<usize>], row: usize, round: usize, form: Form) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let b = bufs(ctx, m, row)?;
    let send: Vec<usize> = m[me].iter().map(|&c| c * row).collect();
    let recv: Vec<usize> = (0..n).map(|i| m[i][me] * row).collect();
    let mine: Vec<i64> = (0..n).flat_map(|j| values(round, me, j, send[j])).collect();
    b.src.write(0, &mine).map_err(e2s)?;
    b.dst
        .write(0, &vec![POISON; b.dst_rows * row])
        .map_err(e2s)?;
    b.counts
        .write(0, &m[me].iter().map(|&c| c as i64).collect::<Vec<_>>())
        .map_err(e2s)?;
    b.out.write(0, &vec![POISON; 2 * n]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let s = ctx.create_stream().map_err(e2s)?;
    let (d, sr, t) = (b.dst.addr(), b.src.addr(), DType::I64);
    let vdev = |stream| {
        let (c, o) = (b.counts.addr(), b.out.addr());
        ctx.alltoall_vdev(&world, d, sr, c, o, row, b.src_rows, b.dst_rows, t, stream)
    };
    let what = format!("{form:?} round {round} (rows of {row})");
    match form {
        Form::Host => ctx.alltoallv_raw(&world, d, sr, &send, &recv, t),
        Form::Stream => ctx.alltoallv_on_stream(&world, d, sr, &send, &recv, t, &s),
        Form::DeviceCounts => vdev(None),
        Form::DeviceCountsStream => vdev(Some(&s)),
    }
    .map_err(|e| format!("{what}: {e}"))?;
    ctx.sync_stream(&s).map_err(|e| format!("{what}: {e}"))?;
    let got = b.dst.to_vec::<i64>().map_err(e2s)?;
    let want: Vec<i64> = (0..n).flat_map(|i| values(round, i, me, recv[i])).collect();
    ensure!(got[..want.len()] == want[..], "{what}: blocks differ");
    ensure!(
        got[want.len()..].iter().all(|&v| v == POISON),
        "{what}: written past the received rows"
    );
    if matches!(form, Form::DeviceCounts | Form::DeviceCountsStream) {
        let out = b.out.to_vec::<i64>().map_err(e2s)?;
        let mut at = 0;
        for i in 0..n {
            let rows = m[i][me] as i64;
            ensure!(
                out[i] == rows && out[n + i] == at,
                "{what}: out_splits_offsets {out:?}, member {i} sent {rows} rows at {at}"
            );
            at += rows;
        }
    }
    ctx.barrier_all().map_err(e2s)
}

/// Disagreeing split sizes (member 1 expects one row more from member 0) fail every member
/// with the same error naming the pair; a negative count in device memory moves nothing on
/// any member.
fn refused(ctx: &Context, m: &[Vec<usize>]) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let b = bufs(ctx, m, 1)?;
    let send = m[me].clone();
    let mut recv: Vec<usize> = (0..n).map(|i| m[i][me]).collect();
    if me == 1 {
        recv[0] += 1;
    }
    ctx.barrier_all().map_err(e2s)?;
    let (d, s) = (b.dst.addr(), b.src.addr());
    let e = ctx
        .alltoallv_raw(&world, d, s, &send, &recv, DType::I64)
        .err()
        .ok_or("disagreeing split sizes were accepted")?;
    let want = format!(
        "member 0 sends member 1 {} elements, member 1 expects {} from member 0",
        m[0][1],
        m[0][1] + 1
    );
    ensure!(
        matches!(e.kind(), ErrorKind::InvalidArgument(_)) && e.to_string().contains(&want),
        "disagreeing sizes: {e}"
    );
    let mut counts: Vec<i64> = m[me].iter().map(|&c| c as i64).collect();
    if me == 0 {
        counts[n - 1] = -3;
    }
    b.counts.write(0, &counts).map_err(e2s)?;
    let poison = vec![POISON; b.dst_rows];
    b.dst.write(0, &poison).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let (c, o) = (b.counts.addr(), b.out.addr());
    let r = ctx.alltoall_vdev(
        &world,
        d,
        s,
        c,
        o,
        1,
        b.src_rows,
        b.dst_rows,
        DType::I64,
        None,
    );
    // The host backend reads the counts on the host and names the member; CUDA's kernel
    // reports them at the synchronisation that ends the host form.
    let e = r.err().ok_or("a negative count was accepted")?;
    let named = format!("member 0 sends member {} a negative count, -3 rows", n - 1);
    ensure!(
        e.to_string().contains(&named) || e.to_string().contains("preconditions"),
        "negative count: {e}"
    );
    // At once, no barrier between: the next counts (the last member sends more rows than the
    // source holds) must not reach a member still checking the refused call's counts.
    let mut counts: Vec<i64> = m[me].iter().map(|&c| c as i64).collect();
    if me == n - 1 {
        counts[0] = b.src_rows as i64 + 1;
    }
    b.counts.write(0, &counts).map_err(e2s)?;
    let r = ctx.alltoall_vdev(
        &world,
        d,
        s,
        c,
        o,
        1,
        b.src_rows,
        b.dst_rows,
        DType::I64,
        None,
    );
    let e = r.err().ok_or("counts past the source were accepted")?;
    let named = format!("member {} sends {} rows", n - 1, counts.iter().sum::<i64>());
    let named = if me == n - 1 {
        named
    } else {
        format!("member {} sends", n - 1)
    };
    ensure!(
        e.to_string().contains(&named) || e.to_string().contains("preconditions"),
        "counts past the source: {e}"
    );
    ensure!(
        b.dst.to_vec::<i64>().map_err(e2s)? == poison,
        "a refused call moved data"
    );
    ctx.barrier_all().map_err(e2s)
}

/// On CUDA across nodes (NCCL), counts in device memory are refused as unsupported, on every
/// PE alike.
fn refused_across_nodes(ctx: &Context, m: &[Vec<usize>]) -> Outcome {
    let b = bufs(ctx, m, 1)?;
    let (d, s, c, o) = (b.dst.addr(), b.src.addr(), b.counts.addr(), b.out.addr());
    let (rs, rd) = (b.src_rows, b.dst_rows);
    let w = ctx.world_team();
    let r = ctx.alltoall_vdev(&w, d, s, c, o, 1, rs, rd, DType::I64, None);
    ensure!(
        matches!(
            r.as_ref().map_err(|e| e.kind()),
            Err(ErrorKind::Unsupported(_))
        ),
        "device counts across nodes: {r:?}"
    );
    ctx.barrier_all().map_err(e2s)
}

/// Random uneven splits with zeros in every form, rows of 1 and 3 elements; then the refusals,
/// then one more call (the context stays usable). On CUDA across nodes (where NCCL moves the
/// data) the split-size forms only, and device counts refused.
pub fn alltoallv(ctx: &Context, a: PeArgs) -> Outcome {
    let n = ctx.n_pes();
    let mut r = rng(a.seed, 41, 41);
    let nccl = ctx.backend_kind() == BackendKind::Cuda && ctx.direct_peers().iter().count() < n;
    let forms: &[Form] = if nccl {
        &[Form::Host, Form::Stream]
    } else {
        &[
            Form::Host,
            Form::Stream,
            Form::DeviceCounts,
            Form::DeviceCountsStream,
        ]
    };
    for round in 0..4 {
        let m = matrix(&mut r, n);
        let row = [1, 3][round % 2];
        for &form in forms {
            one(ctx, &m, row, round, form)?;
        }
    }
    if nccl {
        refused_across_nodes(ctx, &matrix(&mut r, n))?;
    } else if n > 1 {
        refused(ctx, &matrix(&mut r, n))?;
    }
    one(ctx, &matrix(&mut r, n), 2, 9, Form::Host)
}
