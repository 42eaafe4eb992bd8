"""The torch SymmetricMemory side of symheap's GPU benchmark, run in the same job as
`symheap bench` (scripts/gpu_suite.sh): one_shot / two_shot all_reduce (bf16, CUDA-graph replay,
median over trials of K captured ops / K) at the sizes symheap measures, and the latency of
symm_mem.empty + rendezvous for 1 MiB. Writes a JSON list of {op, bytes, name, us} that
`symheap bench --peer-json` merges into its table.

Launch: torchrun --nproc-per-node 2 bench/torch_symm_mem.py OUT.json [SIZES...]"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem


def graph_time_us(fn, k, trials):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(k):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / k)
    return statistics.median(ts)


def main():
    out = sys.argv[1]
    sizes = [int(x) for x in sys.argv[2:]] or [8 << 10, 64 << 10, 512 << 10, 4 << 20, 32 << 20, 256 << 20, 1 << 30]
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    group = dist.group.WORLD.group_name
    dev = torch.device("cuda", local)
    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        k, trials = (50, 11) if nbytes <= 1 << 20 else (20, 7) if nbytes <= 64 << 20 else (3, 5)
        t = symm_mem.empty(n, dtype=torch.bfloat16, device=dev)
        t.copy_(torch.randn(n, device=dev, dtype=torch.bfloat16))
        symm_mem.rendezvous(t, group)
        out_t = torch.empty_like(t)
        for name, fn in [
            (
                f"torch {torch.__version__} symm_mem one_shot",
                lambda t=t, out_t=out_t: torch.ops.symm_mem.one_shot_all_reduce_out(t, "sum", group, out_t),
            ),
            (
                f"torch {torch.__version__} symm_mem two_shot",
                lambda t=t: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group),
            ),
        ]:
            try:
                us = graph_time_us(fn, k, trials)
                rows.append({"op": "all_reduce", "bytes": nbytes, "name": name, "us": us})
            except Exception as e:  # an op torch does not offer at this size
                if rank == 0:
                    print(f"torch_symm_mem: {name} at {nbytes} B: {type(e).__name__}: {e}"[:300], file=sys.stderr)
        del t, out_t
        torch.cuda.empty_cache()
    # Allocation: empty + rendezvous of 1 MiB, after a warm-up (first call sets things up).
    lat = []
    for _ in range(30):
        dist.barrier()
        t0 = time.perf_counter()
        t = symm_mem.empty(1 << 19, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(t, group)
        lat.append((time.perf_counter() - t0) * 1e6)
        del t
    rows.append(
        {
            "op": "allocate_symmetric",
            "bytes": 1 << 20,
            "name": f"torch {torch.__version__} SymmetricMemory empty+rendezvous",
            "us": statistics.median(lat[5:]),
        }
    )
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
        for r in rows:
            print(f"{r['name']:45s} {r['op']:20s} {r['bytes']:>12d} B {r['us']:10.2f} us")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
