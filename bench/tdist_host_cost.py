"""Host cost of the symheap torch.distributed backend per small eager collective, against
``symheap.distributed.*`` called directly and against torch's own backend for the device (gloo
on CPU tensors, NCCL on CUDA tensors), in the same run on the same tensors.

    python bench/tdist_host_cost.py                     # 1 rank, CPU tensors, host backend
    python bench/tdist_host_cost.py --cuda              # 1 rank, CUDA tensors: cuda:symheap vs NCCL
    python -m symheap.launch -n 2 -- python bench/tdist_host_cost.py
    python bench/tdist_host_cost.py --cuda --profile    # also: where each call's host time goes
    python bench/tdist_host_cost.py --cuda --layers     # also: each layer's time alone (1 rank)
    python bench/tdist_host_cost.py --cuda --graph      # also: the calls captured in a CUDA graph


Prints on rank 0 a table of host time per call: the median over trials of a back-to-back
loop's time until its last call returned, divided by the calls (the issue's measure: what the
CPU spends per call). On CUDA a second table gives the time per call until the GPU finished
the loop (each trial ends with a synchronize): when it is larger, the GPU, not the host, set
the pace. With ``--graph``, a third table: the device time per call of a CUDA graph holding
GRAPH_CALLS of them, replayed (the backend's host layers are not in the graph: its time should
be the direct call's).
"""

from __future__ import annotations

import cProfile
import functools
import io
import os
import pstats
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import symheap.distributed as sd
import torch
import torch.distributed as dist
from local_work import graph_us  # bench/ is on the path when this file runs as a script
from symheap.distributed import _work

ITERS = int(os.environ.get("ITERS", "300"))
TRIALS = int(os.environ.get("TRIALS", "7"))
GRAPH_CALLS = int(os.environ.get("GRAPH_CALLS", "50"))


CUDA = "--cuda" in sys.argv[1:]
PROFILE = "--profile" in sys.argv[1:]


def drain() -> None:
    if CUDA:
        torch.cuda.synchronize()


class FloorGroup(dist.ProcessGroup):
    """The floor of any backend written in Python: a process group whose collectives do
    nothing. ``work=True``: each returns a new completed Work the way symheap's backend makes
    one (``symheap.distributed._work.done``: a torch Future with the outputs, wrapped by
    torch's C++); ``work=False``: one Work made once, returned every time (torch's call into a
    Python method and back, alone)."""

    def __init__(self, rank: int, size: int, work: bool) -> None:
        super().__init__(rank, size)
        self._work = work
        self._cached = _work.done([])

    def _done(self, outputs: List[torch.Tensor]) -> object:
        return _work.done(outputs) if self._work else self._cached

    def getBackendName(self) -> str:
        return "floor"

    def allreduce(self, tensors, opts=None):  # noqa: ANN001, ANN201 - torch's signature
        return self._done(tensors)

    def _allgather_base(self, output, input, opts=None):  # noqa: ANN001, ANN201
        return self._done([output])

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: ANN001, ANN201
        return self._done([output])

    def broadcast(self, tensors, opts=None):  # noqa: ANN001, ANN201
        return self._done(tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: ANN001, ANN201
        return self._done([output])


def floor_group(work: bool) -> object:
    """A group of every rank on :class:`FloorGroup` (registered under a name of its own)."""
    name = "floorwork" if work else "floorbare"
    if name.upper() not in getattr(dist.Backend, "_plugins", {}):
        dist.Backend.register_backend(
            name,
            lambda o, _b=None: FloorGroup(o.group_rank, o.group_size, work),
            extended_api=True,
            devices=["cpu", "cuda"],
        )
    return dist.new_group(backend=name)


def timed(fn: Callable[[], object]) -> Tuple[float, float]:
    """(host us per call, us per call until the device finished), medians over trials."""
    for _ in range(20):
        fn()
    drain()
    dist.barrier()
    host: List[float] = []
    wall: List[float] = []
    for _ in range(TRIALS):
        t0 = time.perf_counter()
        for _ in range(ITERS):
            fn()
        t1 = time.perf_counter()
        drain()
        t2 = time.perf_counter()
        host.append((t1 - t0) / ITERS * 1e6)
        wall.append((t2 - t0) / ITERS * 1e6)
    return statistics.median(host), statistics.median(wall)


def graph_table(cases: Dict[str, Dict[str, Callable[[], object]]], peer: str) -> None:
    """The third table (``--graph``): each collective captured through the backend, direct and
    through ``peer``; rank 0 prints."""
    rows = []
    for name, impls in cases.items():
        got = {}
        for k in ("backend", "direct", "gloo"):
            try:
                got[k] = graph_us(impls[k], GRAPH_CALLS, TRIALS)
            except RuntimeError as e:  # a capture refused: said, not hidden
                torch.cuda.synchronize()
                got[k] = float("nan")
                if dist.get_rank() == 0:
                    print(f"# graph {name} {k}: {str(e).splitlines()[0][:120]}")
        rows.append((name, got))
    if dist.get_rank() != 0:
        return
    print(
        f"# {dist.get_world_size()} rank(s), 16 float32 CUDA tensors, device us per call inside a CUDA graph of "
        f"{GRAPH_CALLS} calls (median of {TRIALS} replays); ratios: dist.* symheap / direct, / {peer}"
    )
    print(f"{'collective':<24} {'dist.* symheap':>15} {'direct':>9} {peer:>9} {'/direct':>8} {'/' + peer:>8}")
    for name, g in rows:
        b, d, p = g["backend"], g["direct"], g["gloo"]
        print(f"{name:<24} {b:>15.2f} {d:>9.2f} {p:>9.2f} {b / d:>8.2f} {b / p:>8.2f}")


def profile(label: str, fn: Callable[[], object]) -> None:
    """Prints the functions where ``fn``'s host time goes (cProfile, own time first)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(ITERS):
        fn()
    drain()
    prof.disable()
    if dist.get_rank() != 0:
        return
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    body = out.getvalue()
    print(f"## profile: {label} ({ITERS} calls)")
    print(body[body.find("ncalls") :].rstrip())


def layers(x: torch.Tensor) -> None:
    """Host time of each layer one ``dist.all_reduce`` on symheap's backend passes through,
    one call alone (rank 0 prints; 1 rank only: every step is a collective)."""
    import symheap.ops as sops
    from symheap.distributed import _reduce

    pg = dist.distributed_c10d._get_default_group()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    steps: Dict[str, Callable[[], object]] = {
        "dist.all_reduce(x)": lambda: dist.all_reduce(x),
        "pg.allreduce([x], opts) (no torch wrapper)": lambda: pg.allreduce([x], opts),
        "pg._all_reduce(x, SUM)": lambda: pg._all_reduce(x, dist.ReduceOp.SUM, "all_reduce"),
        "symheap.ops.all_reduce_(x)": lambda: sops.all_reduce_(x),
        "symheap.distributed.all_reduce(x)": lambda: sd.all_reduce(x),
        "_work.done([x])": lambda: _work.done([x]),
        "reduce_op + for_reduction": lambda: _reduce.for_reduction(x, _reduce.reduce_op(opts.reduceOp, "a")[0], "a"),
        "torch.futures.Future + set_result": lambda: torch.futures.Future(
            devices=[x.device] if CUDA else None
        ).set_result([x]),
    }
    print(f"## layers of dist.all_reduce on symheap, 16 float32 on {x.device} (us per call, median of {TRIALS})")
    for name, fn in steps.items():
        print(f"{name:<48} {timed(fn)[0]:>8.2f}")


def main() -> None:
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    if CUDA:
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("cuda:symheap" if CUDA else "cpu:symheap")
    n = dist.get_world_size()
    peer_name = "nccl" if CUDA else "gloo"
    gloo = dist.new_group(backend=peer_name)
    # The device given per tensor, not by torch.set_default_device: that installs a torch
    # function mode which adds ~1 us to every tensor method called from Python (symheap's
    # layers make ~20 per call, NCCL's C++ none), which is not the libraries' own cost.
    dev = torch.device("cuda", torch.cuda.current_device()) if CUDA else torch.device("cpu")
    x = torch.ones(16, device=dev)
    big = torch.empty(16 * n, device=dev)
    small = torch.empty(16, device=dev)
    # Each collective through torch on a group (None: the default, symheap's), and direct.
    calls: Dict[str, Tuple[Callable[[object], object], Callable[[], object]]] = {
        "all_reduce": (lambda g: dist.all_reduce(x, group=g), lambda: sd.all_reduce(x)),
        "all_gather_into_tensor": (
            lambda g: dist.all_gather_into_tensor(big, x, group=g),
            lambda: sd.all_gather_into_tensor(big, x),
        ),
        "reduce_scatter_tensor": (
            lambda g: dist.reduce_scatter_tensor(small, big, group=g),
            lambda: sd.reduce_scatter_tensor(small, big),
        ),
        "broadcast": (lambda g: dist.broadcast(x, src=0, group=g), lambda: sd.broadcast(x, src=0)),
        "all_to_all_single": (
            lambda g: dist.all_to_all_single(big, big.clone(), group=g),
            lambda: sd.all_to_all_single(big, big.clone()),
        ),
    }
    groups = {"backend": None, "gloo": gloo, "floor": floor_group(True), "bare": floor_group(False)}
    cases: Dict[str, Dict[str, Callable[[], object]]] = {}
    for name, (via, direct) in calls.items():
        cases[name] = {impl: functools.partial(via, g) for impl, g in groups.items()}
        cases[name]["direct"] = direct
    rows = []
    for name, impls in cases.items():
        got = {}
        for impl, fn in impls.items():
            try:
                got[impl] = timed(fn)
            except RuntimeError as e:  # gloo lacks some collectives on CPU (reduce_scatter)
                drain()
                got[impl] = (float("nan"), float("nan"))
                if dist.get_rank() == 0:
                    print(f"# {name} {impl}: {str(e).splitlines()[0][:100]}")
        rows.append((name, got))
    if "--layers" in sys.argv[1:] and n == 1:
        layers(x)
    if PROFILE:  # every rank runs the calls (they are collective), rank 0 prints
        for name, impls in cases.items():
            for impl in ("backend", "direct"):
                profile(f"{name} {impl}", impls[impl])
    if dist.get_rank() == 0:
        where = "CUDA" if CUDA else "CPU"
        tables = (("host time", 0), ("until the GPU finished", 1)) if CUDA else (("host time", 0),)
        for what, i in tables:
            print(
                f"# {n} rank(s), 16 float32 {where} tensors, us per call, {what} (median of {TRIALS} x {ITERS}); "
                f"ratios: dist.* symheap / direct, dist.* symheap / dist.* {peer_name}"
            )
            head = f"{'collective':<24} {'dist.* symheap':>15} {'direct':>9} {peer_name:>9} {'floor':>7} {'bare':>7}"
            print(f"{head} {'/direct':>8} {'/' + peer_name:>8} {'floor/' + peer_name:>12}")
            for name, g in rows:
                b, d, p, f, z = (g[k][i] for k in ("backend", "direct", "gloo", "floor", "bare"))
                print(
                    f"{name:<24} {b:>15.1f} {d:>9.1f} {p:>9.1f} {f:>7.1f} {z:>7.1f} {b / d:>8.2f} {b / p:>8.2f} "
                    f"{f / p:>12.2f}"
                )
        print(
            "# floor: a Python-written process group whose collectives do nothing and return a new completed Work "
            "as symheap's do; bare: the same returning one Work made once (torch's call into Python and back)"
        )
    # Last, so a capture that goes wrong cannot take the host tables with it.
    if CUDA and "--graph" in sys.argv[1:]:
        sys.stdout.flush()
        graph_table(cases, peer_name)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
