"""Host time per call of one small all_reduce through each layer of symheap's torch front, and
the floors a Python-kernel op cannot go below, on whatever backend symheap picks (1 PE is
enough: the cost measured is the caller's, not the collective's).

    python3 -m symheap launch -n 1 -- python3 bench/op_overhead.py [--json FILE]

Rows: the native call with raw addresses; ``symheap.all_reduce(t)``; ``symheap.ops.all_reduce_(t)``
(the op's kernel without the dispatcher, as eager code runs it); ``torch.ops.symheap.all_reduce_``
(through the dispatcher, as compiled code without CUDA graphs runs it); and two floors with the
same schema: an op registered as symheap's are (one Python kernel) whose kernel does nothing,
and that empty function called directly. Minimum and median over interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable, Dict, List

import symheap
import symheap.ops as sops
import symheap.torch as st
import torch
from symheap import _core


def _noop(x: torch.Tensor, op: str = "sum", team: int = 0) -> None:
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    symheap.init()
    t = st.empty(2048, dtype=torch.float32)
    t.fill_(1)
    nat = _core.native()
    stream = None
    if nat.backend == "cuda":
        stream = int(torch.cuda.current_stream().cuda_stream)
    lib = torch.library.Library("symheap_overhead", "FRAGMENT")
    lib.define("noop_" + torch.library.infer_schema(_noop, mutates_args=("x",)))
    lib.impl("noop_", _noop, "CompositeExplicitAutograd")
    noop_op = torch.ops.symheap_overhead.noop_.default
    ptr, op = t.data_ptr(), torch.ops.symheap.all_reduce_.default
    cases: Dict[str, Callable[[], None]] = {
        "native all_reduce (raw addresses)": lambda: nat.all_reduce(
            None, ptr, ptr, 2048, "float32", "sum", "auto", stream
        ),
        "symheap.all_reduce(t)": lambda: symheap.all_reduce(t),
        "symheap.ops.all_reduce_(t) (eager)": lambda: sops.all_reduce_(t),
        "torch.ops.symheap.all_reduce_(t) (dispatcher)": lambda: op(t, "sum", 0),
        "floor: empty Python kernel through the dispatcher": lambda: noop_op(t, "sum", 0),
        "floor: the empty function called directly": lambda: _noop(t, "sum", 0),
    }
    got: Dict[str, List[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):  # interleaved, against drift
        for name, f in cases.items():
            for _ in range(50):
                f()
            symheap.barrier_all()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                f()
            got[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    if nat.backend == "cuda":
        torch.cuda.synchronize()
    rows = [{"name": k, "min_us": min(v), "median_us": statistics.median(v)} for k, v in got.items()]
    if nat.my_pe == 0:
        print(f"op_overhead: backend {nat.backend}, {nat.n_pes} PE(s), torch {torch.__version__}, 8 KiB float32")
        print("| call | min us | median us |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {r['name']} | {r['min_us']:.2f} | {r['median_us']:.2f} |")
        m = {r["name"]: r["min_us"] for r in rows}
        disp = m["torch.ops.symheap.all_reduce_(t) (dispatcher)"] - m["symheap.ops.all_reduce_(t) (eager)"]
        floor = m["floor: empty Python kernel through the dispatcher"] - m["floor: the empty function called directly"]
        print(
            f"dispatcher cost of symheap's op: {disp:.2f} us; of an empty Python-kernel op (the floor): {floor:.2f} us"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    st.free(t)
    symheap.finalize()


if __name__ == "__main__":
    main()
