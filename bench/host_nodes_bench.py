"""Host collectives across simulated nodes (issue 24, host part): all_reduce and broadcast of 8 B,
4 KiB and 256 KiB float32 from Python (the NumPy front), median [min-max] of 5 trials of 200
calls, printed by PE 0. Under Open MPI's mpirun::

    XNODE=1 mpirun -n 2 python3 bench/host_nodes_bench.py   # every PE its own node: Open MPI
    XNODE=0 mpirun -n 2 python3 bench/host_nodes_bench.py   # one node: shared memory

With ``XNODE=1`` each PE sets ``SYMHEAP_NODE_ID`` from its rank, so the PEs share no memory and
every collective is checked at a rendezvous point (the ledger) and then run by Open MPI; with
``XNODE=0`` the same job runs symheap's shared-memory path. The difference is what a collective
across nodes costs on top of the data movement on this machine (loopback, no network)."""

import os
import statistics
import sys
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
if os.environ.get("XNODE") == "1":
    os.environ["SYMHEAP_NODE_ID"] = f"xnode-{rank}"

import numpy as np  # noqa: E402
import symheap  # noqa: E402
import symheap.numpy as sn  # noqa: E402


def median_us(fn, calls: int = 200, trials: int = 5):
    for _ in range(20):
        fn()
    ts = []
    for _ in range(trials):
        symheap.barrier_all()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ts.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(ts), min(ts), max(ts)


def main() -> int:
    symheap.init()
    me = symheap.my_pe()
    where = "a node per PE (Open MPI)" if os.environ.get("XNODE") == "1" else "one node (shared memory)"
    if me == 0:
        print(f"host_nodes_bench: {symheap.n_pes()} PEs, {where}")
    for nbytes in (8, 4096, 262144):
        src = sn.empty(nbytes // 4, dtype=np.float32)
        src[...] = 1
        dst = sn.empty(nbytes // 4, dtype=np.float32)
        for name, fn in (
            ("all_reduce", lambda d=dst, s=src: symheap.all_reduce(d, s)),
            ("broadcast", lambda d=dst, s=src: symheap.broadcast(d, s, root=0)),
        ):
            med, lo, hi = median_us(fn)
            if me == 0:
                print(f"{name} {nbytes} B: {med:.1f} us [{lo:.1f}-{hi:.1f}]", flush=True)
    symheap.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
