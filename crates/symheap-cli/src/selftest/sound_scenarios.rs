//! Self-test scenario of the safe Rust API's soundness: the calls that take integer addresses
//! refuse every local range that is not a live allocation they may touch (host memory, a range
//! past the end of a device allocation, an address nothing maps), and work on the ones they
//! may (symmetric buffers, and on CUDA a plain `cuMemAlloc` buffer). A stream of another device
//! is refused where a second GPU is visible.

use symheap::{Context, Stream};

use super::scenarios::{e2s, Outcome, PeArgs};
use symheap::tools::DeviceBuffer;
use symheap::tools::DeviceMem;

/// Runs `f`, which must fail with an invalid-argument error whose text contains `says`.
fn refused(what: &str, says: &str, r: symheap::Result<()>) -> Outcome {
    match r {
        Ok(()) => Err(format!("{what} was accepted")),
        Err(e)
            if matches!(e.kind(), symheap::ErrorKind::InvalidArgument(_))
                && e.to_string().contains(says) =>
        {
            Ok(())
        }
        Err(e) => Err(format!("{what}: wrong error: {e}")),
    }
}

/// Each PE's stream copies refuse local ranges outside what they may touch; a symmetric
/// buffer and (on CUDA) a device buffer work, checked by value.
pub fn local_ranges(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let s = ctx.create_stream().map_err(e2s)?;
    const BYTES: u64 = 4096;
    let sym = ctx.malloc(BYTES).map_err(e2s)?;
    let pattern: Vec<u8> = (0..BYTES)
        .map(|i| (i ^ a.seed ^ (me as u64 * 131)) as u8)
        .collect();
    sym.write(0, &pattern).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;

    // Host memory of this process: a Vec the copy engines must not be pointed at.
    let mut host = vec![0u8; BYTES as usize];
    let hp = host.as_mut_ptr() as u64;
    let host_says = if ctx.cuda().is_some() {
        "the address"
    } else {
        "not in this PE's symmetric heap"
    };
    refused(
        "get_on_stream into host memory",
        host_says,
        ctx.get_on_stream(hp, sym.addr(), BYTES, next, &s),
    )?;
    refused(
        "put_on_stream from host memory",
        host_says,
        ctx.put_on_stream(sym.addr(), hp, BYTES, next, &s),
    )?;
    refused(
        "get_on_stream into an unmapped address",
        if ctx.cuda().is_some() {
            "not in any CUDA allocation"
        } else {
            "symmetric heap"
        },
        ctx.get_on_stream(0x1000, sym.addr(), 8, next, &s),
    )?;
    ensure!(host.iter().all(|&b| b == 0), "host memory was written");
    if ctx.cuda().is_some() {
        device_buffers(ctx, &sym, &s, a)?;
        foreign_stream(ctx, &sym)?;
    }
    ctx.sync_stream(&s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)
}

/// A plain device buffer works as the local side, by value; one byte past its end is refused.
fn device_buffers(ctx: &Context, sym: &symheap::SymmetricBuffer, s: &Stream, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let next = (me + 1) % n;
    let bytes = sym.len_bytes();
    ctx.cuda().ok_or("CUDA only")?.bind().map_err(e2s)?;
    let dev = DeviceBuffer::zeroed(bytes).map_err(e2s)?;
    // A range that starts inside a 1 MiB device buffer and ends half a block past it (the
    // symmetric side of the copy is in bounds, so only the device side can be refused).
    let big = DeviceBuffer::zeroed(1 << 20).map_err(e2s)?;
    refused(
        "get_on_stream past the end of a device buffer",
        "runs past the end",
        ctx.get_on_stream(
            big.addr() + (1 << 20) - bytes / 2,
            sym.addr(),
            bytes,
            next,
            s,
        ),
    )?;
    // The next PE's bytes into the device buffer, then back into this PE's own symmetric copy
    // of a second buffer, which the host can read.
    let out = ctx.malloc(bytes).map_err(e2s)?;
    ctx.get_on_stream(dev.addr(), sym.addr(), bytes, next, s)
        .map_err(e2s)?;
    ctx.put_on_stream(out.addr(), dev.addr(), bytes, me, s)
        .map_err(e2s)?;
    ctx.sync_stream(s).map_err(e2s)?;
    let got = out.to_vec::<u8>().map_err(e2s)?;
    let want: Vec<u8> = (0..bytes)
        .map(|i| (i ^ a.seed ^ (next as u64 * 131)) as u8)
        .collect();
    ensure!(got == want, "bytes through a device buffer differ");
    Ok(())
}

/// A stream of another GPU is refused (needs a second visible GPU; said when there is none).
fn foreign_stream(ctx: &Context, sym: &symheap::SymmetricBuffer) -> Outcome {
    let cu = ctx.cuda().ok_or("CUDA only")?;
    if symheap::cuda::gpu_count() < 2 {
        println!("local-ranges: one GPU visible, the other-device stream case needs two");
        return Ok(());
    }
    let other = (cu.device_ordinal() + 1) % symheap::cuda::gpu_count();
    let foreign = symheap::tools::ForeignStream::new(other).map_err(e2s)?;
    let r = ctx.put_on_stream(sym.addr(), sym.addr(), 8, ctx.my_pe(), foreign.stream());
    cu.bind().map_err(e2s)?;
    refused("a stream of another device", "another CUDA context", r)
}

/// Collectives on a stream take a plain device buffer exactly where their kernel touches its
/// buffers on this PE only (one-shot all_reduce, the exchange all_gather; any collective of a
/// team of one, which is a local copy), by value; where the kernel reaches peers' copies
/// (two-shot) and on the host backend (whose collectives read peers' copies) they refuse it, as
/// they refuse host memory everywhere.
pub fn coll_local(ctx: &Context, a: PeArgs) -> Outcome {
    use symheap::{AllReduceAlgo, StreamColl};
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let s = ctx.create_stream().map_err(e2s)?;
    let sym = ctx.malloc(LOCAL_BYTES * n as u64).map_err(e2s)?;
    sym.write(0, &local_vals(me, a.seed)).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let cuda = ctx.cuda().is_some();
    let auto = StreamColl::AllReduce(AllReduceAlgo::Auto);
    let two_shot = StreamColl::AllReduce(AllReduceAlgo::TwoShot);
    let takes = ctx.coll_takes_local_buffers(auto, &world, LOCAL_BYTES);
    let two_takes = ctx.coll_takes_local_buffers(two_shot, &world, LOCAL_BYTES);
    // Local buffers on CUDA teams of up to two (larger ones stage them for now).
    ensure!(
        takes == (cuda && n <= 2),
        "one-shot all_reduce at {n} PEs: takes local buffers {takes}, CUDA {cuda}"
    );
    ensure!(
        two_takes == (cuda && n == 1),
        "two-shot all_reduce at {n} PEs: takes local buffers {two_takes}"
    );
    let mut host = vec![0i32; LOCAL_COUNT];
    let r = local_all_reduce(
        ctx,
        &s,
        sym.addr(),
        host.as_mut_ptr() as u64,
        AllReduceAlgo::Auto,
    );
    // On CUDA the address is checked as device memory ("the address is host memory" or "is
    // not in any CUDA allocation", as cuPointerGetAttributes sees a pageable Vec).
    let says = if takes {
        "the address"
    } else {
        "symmetric heap"
    };
    refused("one-shot all_reduce from host memory", says, r)?;
    ensure!(host.iter().all(|&v| v == 0), "host memory was written");
    if cuda {
        coll_local_device(ctx, &s, &sym, takes, a)?;
    }
    ctx.barrier_all().map_err(e2s)
}

const LOCAL_COUNT: usize = 2048;
const LOCAL_BYTES: u64 = (LOCAL_COUNT * 4) as u64;

fn local_vals(pe: usize, seed: u64) -> Vec<i32> {
    (0..LOCAL_COUNT)
        .map(|i| ((i as u64 * 7 + pe as u64 * 131 + seed) % 1000) as i32)
        .collect()
}

fn local_all_reduce(
    ctx: &Context,
    s: &Stream,
    dest: u64,
    src: u64,
    algo: symheap::AllReduceAlgo,
) -> symheap::Result<()> {
    use symheap::{DType, ReduceOp};
    let world = ctx.world_team();
    ctx.all_reduce_on_stream(
        &world,
        dest,
        src,
        LOCAL_COUNT,
        DType::I32,
        ReduceOp::Sum,
        algo,
        s,
    )
}

/// [`coll_local`] with plain device buffers: refused by two-shot (unless alone), by value
/// through one-shot all_reduce and the exchange all_gather.
fn coll_local_device(
    ctx: &Context,
    s: &Stream,
    sym: &symheap::SymmetricBuffer,
    takes: bool,
    a: PeArgs,
) -> Outcome {
    use symheap::{AllReduceAlgo, DType, StreamColl};
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let bytes = LOCAL_BYTES;
    ctx.cuda().ok_or("CUDA only")?.bind().map_err(e2s)?;
    let src = DeviceBuffer::zeroed(bytes).map_err(e2s)?;
    let dest = DeviceBuffer::zeroed(bytes * n as u64).map_err(e2s)?;
    ctx.get_on_stream(src.addr(), sym.addr(), bytes, me, s)
        .map_err(e2s)?;
    let two = local_all_reduce(ctx, s, dest.addr(), src.addr(), AllReduceAlgo::TwoShot);
    if n > 1 {
        refused(
            "two-shot all_reduce into a device buffer",
            "symmetric heap",
            two,
        )?;
    } else {
        two.map_err(e2s)?;
    }
    let one = local_all_reduce(ctx, s, dest.addr(), src.addr(), AllReduceAlgo::Auto);
    if !takes {
        return refused(
            "one-shot all_reduce into a device buffer",
            "symmetric heap",
            one,
        );
    }
    one.map_err(e2s)?;
    let out = ctx.malloc(bytes * n as u64).map_err(e2s)?;
    ctx.put_on_stream(out.addr(), dest.addr(), bytes, me, s)
        .map_err(e2s)?;
    ctx.sync_stream(s).map_err(e2s)?;
    let want: Vec<i32> = (0..LOCAL_COUNT)
        .map(|i| (0..n).map(|p| local_vals(p, a.seed)[i]).sum())
        .collect();
    let got = out.to_vec::<i32>().map_err(e2s)?;
    if let Some(i) = (0..LOCAL_COUNT).find(|&i| got[i] != want[i]) {
        let bad = (0..LOCAL_COUNT).filter(|&i| got[i] != want[i]).count();
        return Err(format!(
            "all_reduce through device buffers differs at {bad} of {LOCAL_COUNT} elements, \
             first [{i}]: {} != {} (own value {})",
            got[i],
            want[i],
            local_vals(me, a.seed)[i]
        ));
    }
    // all_gather through the exchange kernel (a copy when alone), from and into device buffers.
    ensure!(
        ctx.coll_takes_local_buffers(StreamColl::AllGather, &ctx.world_team(), bytes),
        "all_gather of 8 KiB does not take local buffers"
    );
    let world = ctx.world_team();
    ctx.all_gather_on_stream(&world, dest.addr(), src.addr(), LOCAL_COUNT, DType::I32, s)
        .map_err(e2s)?;
    ctx.put_on_stream(out.addr(), dest.addr(), bytes * n as u64, me, s)
        .map_err(e2s)?;
    ctx.sync_stream(s).map_err(e2s)?;
    let want: Vec<i32> = (0..n).flat_map(|p| local_vals(p, a.seed)).collect();
    ensure!(
        out.to_vec::<i32>().map_err(e2s)? == want,
        "all_gather through device buffers differs"
    );
    Ok(())
}
