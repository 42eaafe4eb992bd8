"""Host cost of the symheap torch.distributed backend per small eager collective, against
``symheap.distributed.*`` called directly and against torch's own backend for the device (gloo
on CPU tensors, NCCL on CUDA tensors), in the same run on the same tensors.

    python bench/tdist_host_cost.py                     # 1 rank, CPU tensors, host backend
    python bench/tdist_host_cost.py --cuda              # 1 rank, CUDA tensors: cuda:symheap vs NCCL
    python -m symheap.launch -n 2 -- python bench/tdist_host_cost.py

Prints a table (median over trials of the mean of a back-to-back loop, microseconds per call;
on CUDA each trial ends with a stream synchronize, so a call queued faster than the GPU runs it
is not counted as free) on rank 0.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import symheap.distributed as sd
import torch
import torch.distributed as dist

ITERS = int(os.environ.get("ITERS", "300"))
TRIALS = int(os.environ.get("TRIALS", "7"))


CUDA = "--cuda" in sys.argv[1:]


def drain() -> None:
    if CUDA:
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    for _ in range(20):
        fn()
    drain()
    dist.barrier()
    runs: List[float] = []
    for _ in range(TRIALS):
        t0 = time.perf_counter()
        for _ in range(ITERS):
            fn()
        drain()
        runs.append((time.perf_counter() - t0) / ITERS * 1e6)
    return statistics.median(runs)


def main() -> None:
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    if CUDA:
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        torch.cuda.set_device(local % torch.cuda.device_count())
        torch.set_default_device("cuda")
    dist.init_process_group("cuda:symheap" if CUDA else "cpu:symheap")
    n = dist.get_world_size()
    peer_name = "nccl" if CUDA else "gloo"
    gloo = dist.new_group(backend=peer_name)
    x = torch.ones(16)
    big = torch.empty(16 * n)
    small = torch.empty(16)
    cases: Dict[str, Dict[str, Callable[[], object]]] = {
        "all_reduce": {
            "backend": lambda: dist.all_reduce(x),
            "direct": lambda: sd.all_reduce(x),
            "gloo": lambda: dist.all_reduce(x, group=gloo),
        },
        "all_gather_into_tensor": {
            "backend": lambda: dist.all_gather_into_tensor(big, x),
            "direct": lambda: sd.all_gather_into_tensor(big, x),
            "gloo": lambda: dist.all_gather_into_tensor(big, x, group=gloo),
        },
        "reduce_scatter_tensor": {
            "backend": lambda: dist.reduce_scatter_tensor(small, big),
            "direct": lambda: sd.reduce_scatter_tensor(small, big),
            "gloo": lambda: dist.reduce_scatter_tensor(small, big, group=gloo),
        },
        "broadcast": {
            "backend": lambda: dist.broadcast(x, src=0),
            "direct": lambda: sd.broadcast(x, src=0),
            "gloo": lambda: dist.broadcast(x, src=0, group=gloo),
        },
        "all_to_all_single": {
            "backend": lambda: dist.all_to_all_single(big, big.clone()),
            "direct": lambda: sd.all_to_all_single(big, big.clone()),
            "gloo": lambda: dist.all_to_all_single(big, big.clone(), group=gloo),
        },
    }
    rows = []
    for name, impls in cases.items():
        got = {}
        for impl, fn in impls.items():
            try:
                got[impl] = timed(fn)
            except RuntimeError as e:  # gloo lacks some collectives on CPU (reduce_scatter)
                drain()
                got[impl] = float("nan")
                if dist.get_rank() == 0:
                    print(f"# {name} {impl}: {str(e).splitlines()[0][:100]}")
        rows.append((name, got))
    if dist.get_rank() == 0:
        where = "CUDA" if CUDA else "CPU"
        print(
            f"# {n} rank(s), 16 float32 {where} tensors, us per call (median of {TRIALS} x {ITERS}); "
            f"ratios: dist.* symheap / direct, dist.* symheap / dist.* {peer_name}"
        )
        head = f"{'collective':<24} {'dist.* symheap':>15} {'direct':>9} {peer_name:>9}"
        print(f"{head} {'/direct':>8} {'/' + peer_name:>8}")
        for name, g in rows:
            print(
                f"{name:<24} {g['backend']:>15.1f} {g['direct']:>9.1f} {g['gloo']:>9.1f} "
                f"{g['backend'] / g['direct']:>8.2f} {g['backend'] / g['gloo']:>8.2f}"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
