#!/usr/bin/env python3
"""What the NVLinks between GPU 0 and GPU 1 carry when the SMs, the copy engines, or both drive
them, one way and both ways at once. Needs CuPy and two GPUs with peer access (the GPU machine).

Run by scripts/gpu_suite.sh; alone: python3 scripts/nvlink_probe.py. Two tables:

1. Large transfers (64 MiB to 1 GiB per direction), each the median of event-timed repetitions
   of one transfer. "SM" is a grid-stride 16-byte copy kernel (2 blocks of 512 threads per SM,
   four loads in flight per thread) writing into the peer's memory; "SM TMA" moves the same
   bytes with the SMs' bulk-copy unit (cp.async.bulk: global to shared memory, then shared
   memory to the peer, two 32 KiB stages per warp, 2 warps per block, a block per SM); "CE" is
   cuMemcpyPeerAsync; "SM+CE" splits the bytes between the two, each on its own stream.
2. 4 MiB per direction, timed as a CUDA graph of 20 back-to-back transfers (the method of
   `symheap bench`): CE, SM stores (push), SM loads (pull: each GPU reads the peer's data), TMA.
   A 2-PE all_reduce must move its whole message once each way, so "both ways" is the floor
   under any 2-PE all_reduce of that size.
"""

import sys

import cupy as cp
import numpy as np

rt = cp.cuda.runtime
KERNELS = r"""
extern "C" __global__ void __launch_bounds__(512)
copy16(const int4* __restrict__ s, int4* __restrict__ d, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long st = (unsigned long long)gridDim.x * blockDim.x;
  for (; i + 3 * st < n; i += 4 * st) {
    int4 a = s[i], b = s[i + st], c = s[i + 2 * st], e = s[i + 3 * st];
    d[i] = a; d[i + st] = b; d[i + 2 * st] = c; d[i + 3 * st] = e;
  }
  for (; i < n; i += st) d[i] = s[i];
}

#define STAGES 2
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
// Lane 0 of each warp runs its own pipeline over chunks c = warp id + k * (all warps): bulk load
// of the chunk into a shared-memory stage (completion on an mbarrier), then a bulk store of the
// stage to dst; a stage is reused once the store that read it has finished reading.
extern "C" __global__ void tma_copy(const char* __restrict__ src, char* __restrict__ dst,
                                    unsigned long long nbytes, unsigned chunk) {
  extern __shared__ __align__(128) unsigned char buf[];
  __shared__ __align__(8) unsigned long long bar[32 * STAGES];
  const unsigned warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) != 0) return;
  const unsigned nw = blockDim.x >> 5;
  unsigned long long* mb = bar + warp * STAGES;
  unsigned char* sb = buf + (size_t)warp * STAGES * chunk;
  for (int i = 0; i < STAGES; i++)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&mb[i])) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const unsigned long long pipes = (unsigned long long)gridDim.x * nw;
  const unsigned long long nchunks = (nbytes + chunk - 1) / chunk;
  unsigned phase = 0;
  unsigned long long it = 0;
  for (unsigned long long c = (unsigned long long)blockIdx.x * nw + warp; c < nchunks;
       c += pipes, ++it) {
    const unsigned s = it % STAGES;
    if (it >= STAGES) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(STAGES - 1) : "memory");
    const unsigned long long off = c * chunk;
    const unsigned long long left = nbytes - off;
    const unsigned bytes = left < chunk ? (unsigned)left : chunk;
    const unsigned sa = smem_u32(sb + (size_t)s * chunk), ba = smem_u32(&mb[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ba), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(sa), "l"(src + off), "r"(bytes), "r"(ba) : "memory");
    asm volatile(
        "{\n .reg .pred p;\n LAB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra LAB_WAIT;\n}" ::"r"(ba), "r"((phase >> s) & 1u) : "memory");
    phase ^= 1u << s;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 ::"l"(dst + off), "r"(sa), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
"""
TMA_WARPS, TMA_CHUNK = 2, 32 << 10
LARGE = [64 << 20, 256 << 20, 1 << 30]
SMALL, SMALL_REPS = 4 << 20, 20


def main() -> int:
    if rt.getDeviceCount() < 2:
        print("nvlink_probe: needs two GPUs")
        return 1
    nsm = cp.cuda.Device(0).attributes["MultiProcessorCount"]
    copy, tma, buf, streams = {}, {}, {}, {}
    for d in (0, 1):
        with cp.cuda.Device(d):
            rt.deviceEnablePeerAccess(1 - d)
            mod = cp.RawModule(code=KERNELS, options=("-arch=sm_90",))
            copy[d] = mod.get_function("copy16")
            tma[d] = mod.get_function("tma_copy")
            tma[d].max_dynamic_shared_size_bytes = TMA_WARPS * 2 * TMA_CHUNK
            n = max(LARGE) // 4
            buf[d] = (cp.arange(n, dtype=cp.int32) * (d + 3), cp.zeros(n, dtype=cp.int32))
            streams[d] = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]

    # Each transfer: fn(d, stream, nbytes, off) moves bytes [off, off+nbytes) of GPU d's source
    # into the other GPU's destination (pull: GPU d reads the other GPU's source into its own
    # destination, which is the same data movement driven from the receiving side).
    def sm(d, st, nbytes, off=0):
        src, dst = buf[d][0].data.ptr + off, buf[1 - d][1].data.ptr + off
        copy[d]((2 * nsm,), (512,), (src, dst, np.uint64(nbytes // 16)), stream=st)

    def pull(d, st, nbytes, off=0):
        src, dst = buf[1 - d][0].data.ptr + off, buf[d][1].data.ptr + off
        copy[d]((2 * nsm,), (512,), (src, dst, np.uint64(nbytes // 16)), stream=st)

    def tma_put(d, st, nbytes, off=0):
        src, dst = buf[d][0].data.ptr + off, buf[1 - d][1].data.ptr + off
        tma[d](
            (nsm,),
            (32 * TMA_WARPS,),
            (src, dst, np.uint64(nbytes), np.uint32(TMA_CHUNK)),
            stream=st,
            shared_mem=TMA_WARPS * 2 * TMA_CHUNK,
        )

    def ce(d, st, nbytes, off=0):
        src, dst = buf[d][0].data.ptr + off, buf[1 - d][1].data.ptr + off
        # cudaMemcpyDefault (not memcpyPeer) so that it can be captured into a graph.
        rt.memcpyAsync(dst, src, nbytes, rt.memcpyDefault, st.ptr)

    def check(nbytes, mover):
        """Each GPU's destination holds the other's source (both-ways runs write both)."""
        ok = True
        for d in (0, 1):
            with cp.cuda.Device(d):
                src = buf[d][0][: nbytes // 4]
            with cp.cuda.Device(1 - d):
                dst = buf[1 - d][1]
                ok = ok and bool(cp.array_equal(cp.asarray(src), dst[: nbytes // 4]))
                dst[:] = 0
        if not ok:
            print(f"nvlink_probe: {mover} moved wrong bytes", file=sys.stderr)
        return ok

    def timed(work, reps):
        """work: (device, stream index, enqueue) started together; us from GPU 0's first stream."""
        s0 = streams[0][0]
        ts = []
        for r in range(reps + 2):
            with cp.cuda.Device(0):
                e0 = cp.cuda.Event()
                e0.record(s0)
            ends = []
            for d, si, fn in work:
                st = streams[d][si]
                with cp.cuda.Device(d):
                    if st is not s0:
                        st.wait_event(e0)
                    fn(st)
                    e = cp.cuda.Event()
                    e.record(st)
                    ends.append(e)
            with cp.cuda.Device(0):
                for e in ends:
                    s0.wait_event(e)
                e1 = cp.cuda.Event()
                e1.record(s0)
                e1.synchronize()
            if r >= 2:
                ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        return float(np.median(ts))

    def graph_timed(fn, devs, nbytes):
        """us per transfer: a graph of SMALL_REPS back-to-back transfers per device, the graphs
        of all `devs` launched together, timed on GPU 0; median of 5."""
        graphs = {}
        for d in devs:
            with cp.cuda.Device(d):
                st = streams[d][0]
                st.begin_capture()
                for _ in range(SMALL_REPS):
                    fn(d, st, nbytes)
                graphs[d] = st.end_capture()
                graphs[d].upload(st)
        ts = []
        for r in range(7):
            for d in devs:
                with cp.cuda.Device(d):
                    streams[d][0].synchronize()
            with cp.cuda.Device(0):
                e0 = cp.cuda.Event()
                e0.record(streams[0][0])
            ends = []
            for d in devs:
                with cp.cuda.Device(d):
                    graphs[d].launch(streams[d][0])
                    e = cp.cuda.Event()
                    e.record(streams[d][0])
                    ends.append(e)
            with cp.cuda.Device(0):
                for e in ends:
                    streams[0][0].wait_event(e)
                e1 = cp.cuda.Event()
                e1.record(streams[0][0])
                e1.synchronize()
            if r >= 2:
                ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / SMALL_REPS)
        return float(np.median(ts))

    # Untimed first: the first transfers of a process run slower (clocks, first touch of the
    # peer mappings), which would land on the first rows only.
    for fn in (ce, sm, tma_put):
        timed([(d, 0, lambda st, d=d, fn=fn: fn(d, st, max(LARGE))) for d in (0, 1)], 1)
    ok = True
    print("| transfer | size | us | GB/s per direction | / CE one way |")
    print("|---|---|---|---|---|")
    for nbytes in LARGE:
        reps = 8 if nbytes < (1 << 30) else 4
        rows = []

        def one(fn, name, rows=rows, nbytes=nbytes, reps=reps):
            nonlocal ok
            rows.append((name + " one way", timed([(0, 0, lambda st: fn(0, st, nbytes))], reps)))
            both = [(d, 0, lambda st, d=d: fn(d, st, nbytes)) for d in (0, 1)]
            rows.append((name + " both ways", timed(both, reps)))
            ok = check(nbytes, name) and ok

        one(ce, "CE")
        one(sm, "SM")
        one(tma_put, "SM TMA")
        for frac in (0.35, 0.5):
            ceb = int(nbytes * frac) // 4096 * 4096
            smb = nbytes - ceb
            work = [
                (0, 0, lambda st, smb=smb, ceb=ceb: sm(0, st, smb, ceb)),
                (0, 1, lambda st, ceb=ceb: ce(0, st, ceb)),
            ]
            rows.append((f"SM+CE one way ({frac:.0%} CE)", timed(work, reps)))
        both = []
        half = nbytes // 2 // 4096 * 4096
        for d in (0, 1):
            both.append((d, 0, lambda st, d=d, nbytes=nbytes, half=half: sm(d, st, nbytes - half, half)))
            both.append((d, 1, lambda st, d=d, half=half: ce(d, st, half)))
        rows.append(("SM+CE both ways (50% CE)", timed(both, reps)))
        ok = check(nbytes, "SM+CE") and ok
        base = rows[0][1]
        for name, us in rows:
            print(f"| {name} | {nbytes >> 20} MiB | {us:.1f} | {nbytes / us / 1e3:.1f} | {base / us:.2f}x |")
        sys.stdout.flush()

    print()
    print(f"4 MiB per direction, CUDA graph of {SMALL_REPS} back-to-back transfers (us per transfer):")
    print()
    print("| transfer | one way us | both ways us | GB/s per direction both ways |")
    print("|---|---|---|---|")
    for name, fn in (("CE", ce), ("SM push", sm), ("SM pull", pull), ("SM TMA", tma_put)):
        one_us = graph_timed(fn, (0,), SMALL)
        both_us = graph_timed(fn, (0, 1), SMALL)
        ok = check(SMALL, name) and ok
        print(f"| {name} | {one_us:.2f} | {both_us:.2f} | {SMALL / both_us / 1e3:.1f} |")
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
