"""Host µs per call of the pieces of an asynchronous collective's Work (one rank, one GPU):
torch's CUDA future with and without a value, its Work, ``wait()``, ``record_stream``, and the
whole ``dist.*(async_op=True).wait()`` on symheap's backend (with torch's future-backed Work and
with symheap's C++ Work, symheap/distributed/cpp_work.py, compiled here when missing) and on
NCCL, synchronous forms beside. Median of 9 interleaved trials of 300 calls. Why the
asynchronous form costs what it costs (BENCHMARKS.md, "The asynchronous form").

    python3 bench/async_work_cost.py        # on a CUDA machine; nothing to do without one
"""

import os
import statistics
import sys
import time

import symheap.distributed  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
from symheap import ops
from symheap.distributed import _work, cpp_work
from torch._C._distributed_c10d import _create_work_from_future

if not torch.cuda.is_available():
    print("async_work_cost: needs a CUDA device (torch sees none)")
    sys.exit(0)
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
torch.cuda.set_device(0)
dist.init_process_group("cuda:symheap")
nccl = dist.new_group(backend="nccl")
dev = torch.device("cuda", 0)
x = torch.ones(16, device=dev)
big = torch.empty(16, device=dev)
F = torch._C.Future
s = torch.cuda.current_stream()
done_fut = F([dev])
done_fut.set_result([x])
w0 = _create_work_from_future(done_fut)
try:
    cpp = cpp_work._import(cpp_work.build())
except Exception as e:  # the table still has every other row
    print(f"async_work_cost: symheap's C++ Work not built ({e}); its rows are left out")
    cpp = None


def fut_value():
    f = F([dev])
    f.set_result([big])


def fut_empty():
    f = F([dev])
    f.set_result([])


def fut_cpu():
    f = F([])
    f.set_result([big])


cases = {
    "_Future([dev])": lambda: F([dev]),
    "_Future([dev]).set_result([t])": fut_value,
    "_Future([dev]).set_result([])": fut_empty,
    "_Future([]).set_result([t]) (CPU)": fut_cpu,
    "_create_work_from_future(done)": lambda: _create_work_from_future(done_fut),
    "work.wait() (done CUDA future)": lambda: w0.wait(),
    "_work.done([t], None)": lambda: _work.done([big], None),
    "t.record_stream(s)": lambda: big.record_stream(s),
    "ops._record([t, t2])": lambda: ops._record([big, x]),
    "torch.cuda.Event() + record": lambda: torch.cuda.Event().record(),
    "symheap all_gather sync": lambda: dist.all_gather_into_tensor(big, x),
    "symheap all_gather async+wait": lambda: dist.all_gather_into_tensor(big, x, async_op=True).wait(),
    "symheap all_gather async+wait, C++ Work": lambda: dist.all_gather_into_tensor(big, x, async_op=True).wait(),
    "NCCL all_gather sync": lambda: dist.all_gather_into_tensor(big, x, group=nccl),
    "NCCL all_gather async+wait": lambda: dist.all_gather_into_tensor(big, x, group=nccl, async_op=True).wait(),
}
if cpp is not None:
    cases["C++ done([t])"] = lambda: cpp.done([big])
    cases["C++ done([t]).wait()"] = lambda: cpp.done([big]).wait()
    cases["C++ done([t]).get_future()"] = lambda: cpp.done([big]).get_future()
else:
    del cases["symheap all_gather async+wait, C++ Work"]
res = {k: [] for k in cases}
for _ in range(9):
    for k, fn in cases.items():
        # The backend's Work for this row: symheap's C++ one or torch's future-backed one.
        _work._cpp_done = cpp.done if "C++ Work" in k else None
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(300):
            fn()
        res[k].append((time.perf_counter() - t) / 300 * 1e6)
        torch.cuda.synchronize()
for k, v in res.items():
    print(f"{k:<44} {statistics.median(v):7.2f} us")
dist.destroy_process_group()
