//! GPU-only self-test scenarios: user kernels compiled with NVRTC against `symheap.cuh`, driving
//! symmetric memory from inside the kernel.

use symheap::cuda::{CudaModule, KernelArg};
use symheap::Context;

use super::scenarios::{e2s, Outcome, PeArgs};

const TEST_KERNELS: &str = r#"
#include "symheap.cuh"

__device__ __forceinline__ float xval(unsigned long long seed, int from, int to, int i) {
  unsigned long long x = seed ^ ((unsigned long long)from * 1000003ull) ^ ((unsigned long long)to * 7919ull)
                         ^ ((unsigned long long)i * 2654435761ull);
  x ^= x >> 29;
  return (float)(unsigned)(x & 0xffffffull);
}

// Writes this PE's slot of buffer B on every peer, translating B's address with the table of
// another allocation A: valid because the per-peer offset is the same across the heap.
extern "C" __global__ void xlate_write(const int64_t* table_a, float* b_slot, int me, int n,
                                       int words, unsigned long long seed) {
  for (int j = 0; j < n; ++j) {
    float* remote = symheap::translate(b_slot, me, j, table_a);
    if (remote == nullptr) continue;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
      remote[i] = xval(seed, me, j, i);
  }
}

// Every thread adds 1 to every PE's counter, `iters` times, and fetch-adds a second counter on
// the next PE (its old values are recorded to check they are all distinct).
extern "C" __global__ void hammer(uint64_t* counter, const int64_t* table, int me, int n, int iters,
                                  uint64_t* olds) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  for (int k = 0; k < iters; ++k) {
    for (int j = 0; j < n; ++j) symheap::atomic_add(counter, (uint64_t)1, me, j, table);
    olds[(uint64_t)t * iters + k] = symheap::atomic_fetch_add(counter + 1, (uint64_t)1, me, (me + 1) % n, table);
  }
}
"#;

fn module(ctx: &Context, src: &str, name: &str) -> Result<CudaModule, String> {
    let cu = ctx.cuda().ok_or("this scenario needs the CUDA backend")?;
    cu.compile_module(src, name).map_err(e2s)
}

fn xval(seed: u64, from: usize, to: usize, i: usize) -> f32 {
    let mut x = seed
        ^ (from as u64 * 1_000_003)
        ^ (to as u64 * 7919)
        ^ (i as u64).wrapping_mul(2_654_435_761);
    x ^= x >> 29;
    (x & 0xff_ffff) as u32 as f32
}

/// Cross-allocation translation inside a kernel: B is written through A's device table.
pub fn kernel_translate(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let m = module(ctx, TEST_KERNELS, "selftest_kernels.cu")?;
    let stream = ctx.cuda().unwrap().create_stream().map_err(e2s)?;
    let words = 10_000usize;
    let buf_a = ctx.malloc(4096).map_err(e2s)?;
    let _grow = ctx.malloc(96 << 20).map_err(e2s)?; // B lands past the first chunk
    let buf_b = ctx.malloc((n * words * 4) as u64).map_err(e2s)?;
    // The device table must hold what the host table says.
    let mut dev_table = vec![0u64; n];
    ctx.read_at(buf_a.peer_bases_addr(), &mut dev_table)
        .map_err(e2s)?;
    ensure!(
        dev_table == buf_a.peer_bases(),
        "device peer table differs from the host one"
    );
    buf_b.write(0, &vec![-1.0f32; n * words]).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let slot = buf_b.addr() + (me * words * 4) as u64;
    // SAFETY: xlate_write(const int64_t*, float*, int, int, int, unsigned long long) matches
    // these arguments; the table holds n entries and every PE's B copy holds n*words floats.
    unsafe {
        m.launch(
            "xlate_write",
            8,
            256,
            0,
            &stream,
            &[
                KernelArg::U64(buf_a.peer_bases_addr()),
                KernelArg::U64(slot),
                KernelArg::I32(me as i32),
                KernelArg::I32(n as i32),
                KernelArg::I32(words as i32),
                KernelArg::U64(a.seed),
            ],
        )
    }
    .map_err(e2s)?;
    ctx.sync_stream(&stream).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let got = buf_b.to_vec::<f32>().map_err(e2s)?;
    for from in 0..n {
        for i in 0..words {
            let want = xval(a.seed, from, me, i);
            ensure!(
                got[from * words + i] == want,
                "slot of PE {from}, word {i}: {} != {want}",
                got[from * words + i]
            );
        }
    }
    ctx.barrier_all().map_err(e2s)
}

/// Atomics from kernels on peers' memory: exact totals, distinct fetched values.
pub fn kernel_atomics(ctx: &Context, _a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let m = module(ctx, TEST_KERNELS, "selftest_kernels.cu")?;
    let stream = ctx.cuda().unwrap().create_stream().map_err(e2s)?;
    let (grid, block, iters) = (16u32, 128u32, 20usize);
    let threads = (grid * block) as usize;
    let counter = ctx.calloc(2, 8).map_err(e2s)?;
    let olds = ctx.calloc((threads * iters) as u64, 8).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    // SAFETY: hammer(uint64_t*, const int64_t*, int, int, int, uint64_t*) matches; `olds` holds
    // threads*iters words and the counter's table has n entries.
    unsafe {
        m.launch(
            "hammer",
            grid,
            block,
            0,
            &stream,
            &[
                KernelArg::U64(counter.addr()),
                KernelArg::U64(counter.peer_bases_addr()),
                KernelArg::I32(me as i32),
                KernelArg::I32(n as i32),
                KernelArg::I32(iters as i32),
                KernelArg::U64(olds.addr()),
            ],
        )
    }
    .map_err(e2s)?;
    ctx.sync_stream(&stream).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let c = counter.to_vec::<u64>().map_err(e2s)?;
    let per = (threads * iters) as u64;
    ensure!(
        c[0] == n as u64 * per,
        "counter {} after {} adds",
        c[0],
        n as u64 * per
    );
    ensure!(c[1] == per, "fetch_add counter {} after {per} adds", c[1]);
    let mut v = olds.to_vec::<u64>().map_err(e2s)?;
    v.sort_unstable();
    ensure!(
        v == (0..per).collect::<Vec<_>>(),
        "fetched values are not exactly 0..{per}"
    );
    ctx.barrier_all().map_err(e2s)
}

/// The repository's example kernel (examples/cuda/ring_put.cu) over several rounds.
pub fn example_kernel(ctx: &Context, _a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let src = include_str!("../../../../examples/cuda/ring_put.cu");
    let m = module(ctx, src, "ring_put.cu")?;
    let stream = ctx.cuda().unwrap().create_stream().map_err(e2s)?;
    let elems = 100_000u64;
    let recv = ctx.malloc(elems * 4).map_err(e2s)?;
    let send = ctx.malloc(elems * 4).map_err(e2s)?;
    let sig = ctx.calloc(1, 8).map_err(e2s)?;
    let out = ctx.calloc(1, 4).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let timeout_ns = ctx.config().timeout.as_nanos() as u64;
    for round in 1..=5u64 {
        // SAFETY: the arguments follow ring_put's signature in examples/cuda/ring_put.cu:
        // (float*, float*, uint64_t, uint64_t*, const int64_t*, const int64_t*, int, int,
        // uint64_t, uint64_t, uint32_t*), with buffers of `elems` floats.
        unsafe {
            m.launch(
                "ring_put",
                1,
                256,
                0,
                &stream,
                &[
                    KernelArg::U64(recv.addr()),
                    KernelArg::U64(send.addr()),
                    KernelArg::U64(elems),
                    KernelArg::U64(sig.addr()),
                    KernelArg::U64(recv.peer_bases_addr()),
                    KernelArg::U64(sig.peer_bases_addr()),
                    KernelArg::I32(me as i32),
                    KernelArg::I32(n as i32),
                    KernelArg::U64(round),
                    KernelArg::U64(timeout_ns),
                    KernelArg::U64(out.addr()),
                ],
            )
        }
        .map_err(e2s)?;
        ctx.sync_stream(&stream).map_err(e2s)?;
        let bad = out.to_vec::<u32>().map_err(e2s)?[0];
        ensure!(
            bad == 0,
            "round {round}: {bad} wrong elements (0xffffffff = no signal)"
        );
        ctx.barrier_all().map_err(e2s)?;
    }
    Ok(())
}
