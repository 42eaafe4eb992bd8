#!/usr/bin/env python3
"""What the NVLinks between GPU 0 and GPU 1 carry when the SMs, the copy engines, or both drive
them, one way and both ways at once. Needs CuPy and two GPUs with peer access (the GPU machine).

Run by scripts/gpu_suite.sh; alone: python3 scripts/nvlink_probe.py. Each row is the median of
event-timed repetitions of one transfer of SIZE bytes per direction (large sizes only: every
transfer is enqueued from Python, so small ones would time the host). "SM" is a grid-stride
16-byte copy kernel (528 blocks of 512 threads, four loads in flight per thread) writing into the
peer's memory; "CE" is cuMemcpyPeerAsync; "SM+CE" splits the bytes between the two, each on its
own stream, started together.
"""
import sys

import cupy as cp
import numpy as np

rt = cp.cuda.runtime
KERNEL = r"""
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
"""
GRID = 528
SIZES = [64 << 20, 256 << 20, 1 << 30]


def main() -> int:
    if rt.getDeviceCount() < 2:
        print("nvlink_probe: needs two GPUs")
        return 1
    kern, buf, streams = {}, {}, {}
    for d in (0, 1):
        with cp.cuda.Device(d):
            rt.deviceEnablePeerAccess(1 - d)
            kern[d] = cp.RawModule(code=KERNEL, options=("-arch=sm_90",)).get_function("copy16")
            n = max(SIZES) // 4
            buf[d] = (cp.ones(n, dtype=cp.int32), cp.zeros(n, dtype=cp.int32))
            streams[d] = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]

    def sm(d, st, nbytes, off):
        src, dst = buf[d][0], buf[1 - d][1]
        with cp.cuda.Device(d):
            kern[d]((GRID,), (512,), (src.data.ptr + off, dst.data.ptr + off, np.uint64(nbytes // 16)), stream=st)

    def ce(d, st, nbytes, off):
        src, dst = buf[d][0], buf[1 - d][1]
        with cp.cuda.Device(d):
            rt.memcpyPeerAsync(dst.data.ptr + off, 1 - d, src.data.ptr + off, d, nbytes, st.ptr)

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

    print("| transfer | size | us | GB/s per direction | / CE one way |")
    print("|---|---|---|---|---|")
    for nbytes in SIZES:
        reps = 8 if nbytes < (1 << 30) else 4
        rows = []
        rows.append(("CE one way", timed([(0, 0, lambda st: ce(0, st, nbytes, 0))], reps)))
        rows.append(("CE both ways", timed([(d, 0, lambda st, d=d: ce(d, st, nbytes, 0)) for d in (0, 1)], reps)))
        rows.append(("SM one way", timed([(0, 0, lambda st: sm(0, st, nbytes, 0))], reps)))
        rows.append(("SM both ways", timed([(d, 0, lambda st, d=d: sm(d, st, nbytes, 0)) for d in (0, 1)], reps)))
        for frac in (0.35, 0.5):
            ceb = int(nbytes * frac) // 4096 * 4096
            smb = nbytes - ceb
            one = [(0, 0, lambda st: sm(0, st, smb, ceb)), (0, 1, lambda st: ce(0, st, ceb, 0))]
            rows.append((f"SM+CE one way ({frac:.0%} CE)", timed(one, reps)))
        both = []
        half = nbytes // 2 // 4096 * 4096
        for d in (0, 1):
            both.append((d, 0, lambda st, d=d: sm(d, st, nbytes - half, half)))
            both.append((d, 1, lambda st, d=d: ce(d, st, half, 0)))
        rows.append(("SM+CE both ways (50% CE)", timed(both, reps)))
        base = rows[0][1]
        for name, us in rows:
            print(f"| {name} | {nbytes >> 20} MiB | {us:.1f} | {nbytes / us / 1e3:.1f} | {base / us:.2f}x |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
