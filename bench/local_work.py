"""Each operation's own work at one PE on one GPU, against the best local reference in the same
process (issue 44's table): what a single GPU can measure exactly while the multi-GPU peers
(NCCL, FlashInfer, DeepEP) are out of reach.

    python3 bench/local_work.py [--json FILE] [--only fused,gemm,host,alloc] [--quick]

Sections (one PE, CUDA backend; no launcher needed):
  fused   symheap.fused.all_reduce_residual_rmsnorm against torch.compile'd ``x + r`` then
          ``F.rms_norm`` (compiled per shape, static), bf16 and fp16, hidden 2880 / 5120 / 7168
          / 8192, tokens 1 to 8192; CUDA-graph median (graphs of 50 calls / 50); at >= 2048
          tokens the bandwidth over the bytes the op must move (x, residual in; residual_out,
          out out) as a fraction of the HBM peak (memory clock x bus width) and of a measured
          device copy.
  gemm    all_gather_matmul and matmul_reduce_scatter against cuBLAS on the same operands with
          the same numerics (fp32 reductions: torch.mm with reduced-precision reductions off),
          M 256 to 16384, K and N 1024 to 16384; also the Triton engine's own GEMM (its
          heuristic configuration at npes = 1, the local work it does at n >= 2), for reference;
          medians of 5 alternated rounds, with cuBLAS timed twice a round ("cuBLAS again": the
          spread of the method on an unchanged kernel) and whether the ops launch the kernels
          cuBLAS does (torch's profiler).
  host    host time per small eager call (16 float32, median over trials of 300-call loops)
          of all_reduce, all_gather, reduce_scatter, broadcast and all_to_all by each entry:
          symheap.* (symmetric tensors), symheap.ops.*, symheap.distributed.* and
          torch.distributed over the ``cuda:symheap`` backend, against torch.distributed over
          NCCL, one rank, same tensors; the two torch.distributed columns again with
          ``async_op=True`` then ``wait()`` (symheap's twice: torch's future-backed Work and
          symheap's C++ Work, symheap/distributed/cpp_work.py, compiled when missing).
  alloc   symheap.torch.allocate_symmetric / symheap.torch.empty of 1 MiB, each freed, against
          torch's caching allocator.

Prints one table per section; ``ratio`` is symheap's speed relative to the reference
(reference time / symheap time: >= 1 means symheap is as fast or faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

HIDDEN = (2880, 5120, 7168, 8192)
TOKENS = (1, 32, 128, 512, 2048, 8192)
GEMM_M = (256, 2048, 16384)
GEMM_KN = ((1024, 1024), (4096, 4096), (1024, 16384), (16384, 1024), (16384, 16384))
GEMM_ROUNDS = 5


def graph_us(fn: Callable[[], Any], iters: int = 50, trials: int = 7) -> float:
    """Median over ``trials`` of (a CUDA graph of ``iters`` calls) / ``iters``, in µs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    del g
    return statistics.median(times)


def gpu_us(fn: Callable[[], Any]) -> float:
    """:func:`graph_us` with as many calls per graph as fill ~20 ms (at most 50): the GPU time
    of kernels of any length, without the host's launch cost."""
    est = event_us(fn, trials=1, min_ms=0.5)
    return graph_us(fn, iters=max(3, min(50, int(20000 / max(est, 1.0)))), trials=5)


def event_us(fn: Callable[[], Any], trials: int = 5, min_ms: float = 2.0) -> float:
    """Median over ``trials`` of back-to-back eager calls timed by CUDA events (enough calls
    per trial for ``min_ms``); for kernels long enough that launch gaps do not count."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    reps = max(1, min(200, int(min_ms / max(a.elapsed_time(b), 1e-3))))
    times = []
    for _ in range(trials):
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / reps)
    return statistics.median(times)


def hbm_peak_bytes_per_s(dev: int) -> Optional[float]:
    """The HBM peak from the memory clock and bus width (cupy's device properties), or None."""
    try:
        import cupy

        p = cupy.cuda.runtime.getDeviceProperties(dev)
        return 2.0 * p["memoryClockRate"] * 1e3 * p["memoryBusWidth"] / 8
    except Exception:  # noqa: BLE001 - cupy missing or a property it lacks: no peak column
        return None


def copy_bytes_per_s(dev: torch.device, nbytes: int = 1 << 30) -> float:
    """A device-to-device copy of ``nbytes`` (read + write: twice that moved), the measured
    floor of a streaming kernel moving as many bytes."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = gpu_us(lambda: dst.copy_(src)) if nbytes < (1 << 30) else event_us(lambda: dst.copy_(src), min_ms=20.0)
    return 2.0 * src.numel() / (us * 1e-6)


# ---- fused all_reduce + residual + RMSNorm ---------------------------------------------------------


def _fused_one(
    dev: torch.device, dtype: Any, h: int, t: int, comp: Callable[..., Any], eps: float, fp8: Optional[str] = None
) -> Dict[str, Any]:
    import symheap.fused as fu

    g = torch.Generator(device=dev).manual_seed(t * 7 + h)
    x = torch.randn(t, h, dtype=dtype, device=dev, generator=g)
    r = torch.randn(t, h, dtype=dtype, device=dev, generator=g)
    w = torch.randn(h, dtype=dtype, device=dev, generator=g)
    out = torch.empty(t, h, dtype=torch.float8_e4m3fn if fp8 else dtype, device=dev)
    ro = torch.empty_like(x)
    mine = graph_us(lambda: fu.all_reduce_residual_rmsnorm(x, r, w, eps, out=out, residual_out=ro, fp8=fp8))
    want_y, want_r = comp(x, r, w)[:2]
    assert torch.equal(ro, want_r), f"fused residual_out differs from x + r at {t}x{h} {dtype}"
    theirs = graph_us(lambda: comp(x, r, w))
    diff = float((out.float() - want_y.float()).abs().max())
    return {
        "section": "fused", "dtype": str(dtype).split(".")[1] + (" fp8" if fp8 else ""), "hidden": h, "tokens": t,
        "symheap_us": mine,
        "compiled_us": theirs, "ratio": theirs / mine, "max_abs_diff": diff,
        "moved_bytes": 4 * t * h * x.element_size() + h * x.element_size(),
    }  # fmt: skip


def bench_fused(rows: List[Dict[str, Any]], dev: torch.device, quick: bool) -> None:
    torch._dynamo.config.cache_size_limit = 1024
    eps = 1e-6

    def ref(x, r, w):
        ro = x + r
        return torch.nn.functional.rms_norm(ro, (x.shape[-1],), w, eps), ro

    peak = hbm_peak_bytes_per_s(dev.index)
    floor = copy_bytes_per_s(dev)
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)
    for dtype in dtypes:
        for h in HIDDEN[-1:] if quick else HIDDEN:
            comp = torch.compile(ref, dynamic=False)
            for t in TOKENS:
                row = _fused_one(dev, dtype, h, t, comp, eps)
                bps = row["moved_bytes"] / (row["symheap_us"] * 1e-6)
                row.update(symheap_gbps=bps / 1e9, hbm_frac=bps / peak if peak else None, copy_frac=bps / floor)
                if t >= 2048:
                    row["same_copy_frac"] = bps / copy_bytes_per_s(dev, row["moved_bytes"] // 2)
                rows.append(row)

    # FP8 e4m3 output with a per-token scale; the reference quantises the same way, compiled.
    def ref_fp8(x, r, w):
        y, ro = ref(x, r, w)
        s = y.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
        return (y.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), ro, s

    comp = torch.compile(ref_fp8, dynamic=False)
    for t in TOKENS[::2] if quick else TOKENS:
        row = _fused_one(dev, torch.bfloat16, 8192, t, comp, eps, fp8="per_token")
        bps = (row["moved_bytes"] - t * 8192) / (row["symheap_us"] * 1e-6)  # out is 1 byte per element
        row.update(symheap_gbps=bps / 1e9, hbm_frac=bps / peak if peak else None, copy_frac=bps / floor)
        if t >= 2048:
            row["same_copy_frac"] = bps / copy_bytes_per_s(dev, (row["moved_bytes"] - t * 8192) // 2)
        rows.append(row)
    rows.append({"section": "fused-floor", "hbm_peak_gbps": peak / 1e9 if peak else None, "copy_gbps": floor / 1e9})


def report_fused(rows: List[Dict[str, Any]]) -> List[str]:
    fl = [r for r in rows if r["section"] == "fused-floor"]
    out = ["## fused all_reduce + residual + RMSNorm at 1 PE vs torch.compile'd add + rms_norm (CUDA-graph µs)"]
    if fl:
        pk = fl[0]["hbm_peak_gbps"]
        out.append(f"HBM peak {pk:.0f} GB/s; measured device copy {fl[0]['copy_gbps']:.0f} GB/s" if pk else "")
    out.append(
        "| dtype | hidden | tokens | symheap µs | compiled µs | ratio | GB/s | of HBM peak | of 1 GiB copy "
        "| of a copy moving as many bytes |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["section"] != "fused":
            continue
        big = r["tokens"] >= 2048
        hbm = f"{r['hbm_frac']:.0%}" if big and r["hbm_frac"] else ""
        cp = f"{r['copy_frac']:.0%}" if big else ""
        same = f"{r['same_copy_frac']:.0%}" if "same_copy_frac" in r else ""
        out.append(
            f"| {r['dtype']} | {r['hidden']} | {r['tokens']} | {r['symheap_us']:.2f} | {r['compiled_us']:.2f} | "
            f"{r['ratio']:.2f} | {r['symheap_gbps']:.0f} | {hbm} | {cp} | {same} |"
        )
    return out


# ---- GEMM-overlap operations -----------------------------------------------------------------------


def _gemm_one(dev: torch.device, m: int, k: int, n: int, sms: int, arch: Any) -> Dict[str, Any]:
    import symheap.gemm as gm
    import symheap.gemm._kernels as gk
    import symheap.gemm._tune as tune

    g = torch.Generator(device=dev).manual_seed(m + k + n)
    a = torch.randn(m, k, dtype=torch.bfloat16, device=dev, generator=g)
    b = torch.randn(n, k, dtype=torch.bfloat16, device=dev, generator=g).t()  # a Linear weight
    c = torch.empty(m, n, dtype=torch.bfloat16, device=dev)

    def cublas() -> None:
        with gk._ExactMath():
            torch.mm(a, b, out=c)

    # Alternated rounds, the reference timed twice in each (first and last): a clock that drifts
    # during the run falls on every column alike, and "cuBLAS again" (the same kernel measured
    # in the same rounds) shows how far this method's ratios move with nothing changed.
    times: Dict[str, List[float]] = {"ref": [], "ag": [], "rs": [], "again": []}
    for _ in range(GEMM_ROUNDS):
        times["ref"].append(gpu_us(cublas))
        times["ag"].append(gpu_us(lambda: gm.all_gather_matmul(a, b, out=c)))
        times["rs"].append(gpu_us(lambda: gm.matmul_reduce_scatter(a, b, out=c)))
        times["again"].append(gpu_us(cublas))
    ref, ag, rs, again = (statistics.median(times[k]) for k in ("ref", "ag", "rs", "again"))
    ref_kernels = _kernels(cublas)  # empty if the profiler saw no kernel: then "no", not "yes"
    same = bool(ref_kernels) and (
        ref_kernels
        == _kernels(lambda: gm.all_gather_matmul(a, b, out=c))
        == _kernels(lambda: gm.matmul_reduce_scatter(a, b, out=c))
    )
    want = c.clone()
    cublas()
    assert torch.equal(c, want), f"matmul_reduce_scatter differs from cuBLAS at {m}x{k}x{n}"
    try:
        tri = gpu_us(tune.local_runner("rs", gk.config(m, n, k, arch), a, b, sms, c))
    except Exception as e:  # noqa: BLE001 - a shape the heuristic cannot run: say so
        print(f"# triton engine {m}x{k}x{n}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        tri = float("nan")
    return {
        "section": "gemm", "m": m, "k": k, "n": n, "cublas_us": ref, "ag_us": ag, "rs_us": rs, "triton_us": tri,
        "ag_ratio": ref / ag, "rs_ratio": ref / rs, "triton_ratio": ref / tri, "again_ratio": ref / again,
        "same_kernels": same,
    }  # fmt: skip


def _kernels(fn: Callable[[], Any]) -> List[str]:
    """The names of the GPU kernels one call of ``fn`` launches, in order (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def bench_gemm(rows: List[Dict[str, Any]], dev: torch.device, quick: bool) -> None:
    import symheap.gemm._kernels as gk

    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    arch = gk._arch(dev)
    shapes = [(m, k, n) for m in GEMM_M for (k, n) in GEMM_KN]
    for m, k, n in shapes[:4] if quick else shapes:
        rows.append(_gemm_one(dev, m, k, n, sms, arch))


def report_gemm(rows: List[Dict[str, Any]]) -> List[str]:
    out = [
        "## GEMM-overlap ops at 1 PE vs cuBLAS (fp32 reductions), bf16, B a transposed Linear weight (CUDA-graph µs)",
        "| M | K | N | cuBLAS µs | all_gather_matmul ratio | matmul_reduce_scatter ratio | Triton GEMM ratio "
        "| cuBLAS again | the ops launch cuBLAS's kernels |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["section"] == "gemm":
            out.append(
                f"| {r['m']} | {r['k']} | {r['n']} | {r['cublas_us']:.1f} | {r['ag_ratio']:.2f} | "
                f"{r['rs_ratio']:.2f} | {r['triton_ratio']:.2f} | {r['again_ratio']:.2f} | "
                f"{'yes' if r['same_kernels'] else 'no'} |"
            )
    return out


# ---- host time per eager call ----------------------------------------------------------------------


def host_calls(dev: torch.device, nccl: Any) -> Dict[str, Dict[str, Callable[[], Any]]]:
    """Each collective by each eager entry, 16 float32 at one rank: ``symheap.*`` on symmetric
    tensors (its own form), ``symheap.ops.*`` and ``symheap.distributed.*`` on ordinary ones,
    torch.distributed on the symheap backend and on NCCL (the reference), and both again with
    ``async_op=True`` then ``wait()``: the form that keeps the tensors alive for the stream
    that used them, as ``symheap.ops.*`` always does."""
    import symheap
    import symheap.distributed as sd
    import symheap.ops as sops
    import symheap.torch as st

    n = dist.get_world_size()
    python_work, cpp_work = async_works()
    x, big, small = torch.ones(16, device=dev), torch.ones(16 * n, device=dev), torch.empty(16, device=dev)
    a2a_in, a2a_out = torch.ones(16 * n, device=dev), torch.empty(16 * n, device=dev)
    sx, sbig, ssmall, sa2a = (st.empty(k, dtype=torch.float32) for k in (16, 16 * n, 16, 16 * n))
    for t in (sx, sbig):
        t.fill_(1.0)
    # collective -> (symheap.*, symheap.ops.*, the call of torch.distributed's signature on module
    # m (torch.distributed or symheap.distributed) and group g, asynchronous or not)
    forms: Dict[str, Tuple[Callable[[], Any], Callable[[], Any], Callable[[Any, Any, bool], Any]]] = {
        "all_reduce": (
            lambda: symheap.all_reduce(sx),
            lambda: sops.all_reduce_(x),
            lambda m, g, a: m.all_reduce(x, group=g, async_op=a),
        ),
        "all_gather": (
            lambda: symheap.all_gather(sbig, sx),
            lambda: sops.all_gather(x, out=big),
            lambda m, g, a: m.all_gather_into_tensor(big, x, group=g, async_op=a),
        ),
        "reduce_scatter": (
            lambda: symheap.reduce_scatter(ssmall, sbig),
            lambda: sops.reduce_scatter(big, out=small),
            lambda m, g, a: m.reduce_scatter_tensor(small, big, group=g, async_op=a),
        ),
        "broadcast": (
            lambda: symheap.broadcast(sx),
            lambda: sops.broadcast_(x),
            lambda m, g, a: m.broadcast(x, src=0, group=g, async_op=a),
        ),
        "all_to_all": (
            lambda: symheap.alltoall(sa2a, sbig),
            lambda: sops.alltoall(a2a_in, out=a2a_out),
            lambda m, g, a: m.all_to_all_single(a2a_out, a2a_in, group=g, async_op=a),
        ),
    }
    out: Dict[str, Dict[str, Callable[[], Any]]] = {}
    for coll, (own, op, via) in forms.items():
        out[coll] = {
            "symheap.*": own,
            "symheap.ops.*": op,
            "symheap.distributed.*": lambda v=via: v(sd, None, False),
            "dist.* on cuda:symheap": lambda v=via: v(dist, None, False),
            "dist.* on NCCL": lambda v=via: v(dist, nccl, False),
            "async: cuda:symheap": lambda v=via: python_work(v),
            "async: NCCL": lambda v=via: v(dist, nccl, True).wait(),
        }
        if cpp_work is not None:
            out[coll]["async: cuda:symheap, C++ Work"] = lambda v=via: cpp_work(v)
    return out


def async_works() -> Tuple[Callable[[Any], Any], Optional[Callable[[Any], Any]]]:
    """The backend's asynchronous call then ``wait()`` with torch's future-backed Work, and with
    symheap's C++ Work (symheap/distributed/cpp_work.py, compiled here when missing; None with
    the reason printed when it cannot be). Each sets the backend's choice on every call (a
    module attribute: ~0.03 µs, the same in both)."""
    from symheap.distributed import _work, cpp_work

    def python_work(via: Callable[[Any, Any, bool], Any]) -> Any:
        _work._cpp_done = None
        return via(dist, None, True).wait()

    try:
        done = cpp_work._import(cpp_work.build()).done
    except Exception as e:
        print(f"local_work: symheap's C++ Work not built ({e}); its column is left out")
        return python_work, None

    def cpp(via: Callable[[Any, Any, bool], Any]) -> Any:
        _work._cpp_done = done
        return via(dist, None, True).wait()

    return python_work, cpp


def interleaved_host_us(calls: Dict[str, Callable[[], Any]], iters: int = 300, trials: int = 9) -> Dict[str, float]:
    """Host time per call of each of ``calls``: a back-to-back loop of ``iters`` calls timed until
    its last call returned, drained between loops, the trials interleaved (one loop of each call
    per trial): the GPU hosts drift by a third between seconds, which falls on
    every entry alike this way. Median over trials."""
    for fn in calls.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    got: Dict[str, List[float]] = {k: [] for k in calls}
    for _ in range(trials):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            got[name].append((time.perf_counter() - t0) / iters * 1e6)
            torch.cuda.synchronize()
    return {k: statistics.median(v) for k, v in got.items()}


def bench_host(rows: List[Dict[str, Any]], dev: torch.device, nccl: Any) -> None:
    for coll, calls in host_calls(dev, nccl).items():
        got = interleaved_host_us(calls)
        ref = got["dist.* on NCCL"]
        for name, us in got.items():
            rows.append({"section": "host", "coll": coll, "entry": name, "us": us, "ratio": ref / us})


def report_host(rows: List[Dict[str, Any]]) -> List[str]:
    host = [r for r in rows if r["section"] == "host"]
    entries = list(dict.fromkeys(r["entry"] for r in host))
    out = [
        "## host time per eager collective of 16 float32 at 1 rank, µs (ratio NCCL / entry; median of 9 "
        "trials of 300 calls, the entries' trials interleaved)",
        "| collective | " + " | ".join(entries) + " |",
        "|---" * (len(entries) + 1) + "|",
    ]
    for coll in dict.fromkeys(r["coll"] for r in host):
        cells = {r["entry"]: r for r in host if r["coll"] == coll}
        out.append(
            f"| {coll} | "
            + " | ".join(f"{cells[e]['us']:.1f} ({cells[e]['ratio']:.2f})" if e in cells else "-" for e in entries)
            + " |"
        )
    return out


# ---- allocation ------------------------------------------------------------------------------------


def bench_alloc(rows: List[Dict[str, Any]], dev: torch.device) -> None:
    import symheap.torch as st

    n = (1 << 20) // 4

    def sym_pair() -> None:
        t, bases = st.allocate_symmetric(n, dtype=torch.float32)
        st.free(t)

    def sym_empty() -> None:
        st.free(st.empty(n, dtype=torch.float32))

    def sym_drop() -> None:
        st.empty(n, dtype=torch.float32)

    def caching() -> None:
        torch.empty(n, dtype=torch.float32, device=dev)

    from symheap import _core

    ctx = _core.native()
    stream = torch.cuda.current_stream(dev).cuda_stream
    keep = _core.allocate((n,), "float32")

    def native_pair() -> None:
        ctx.allocate([n], "float32", align=256, zero=False).free()

    def core_pair() -> None:
        _core.allocate((n,), "float32").free()

    def with_record() -> None:
        b = _core.allocate((n,), "float32")
        b.record_stream(stream)
        b.free()

    def dlpack() -> None:
        torch.from_dlpack(keep)

    calls = {
        "native allocate + free": native_pair,
        "_core.allocate + free": core_pair,
        "_core.allocate + record_stream + free": with_record,
        "torch.from_dlpack of a buffer": dlpack,
        "allocate_symmetric + free": sym_pair,
        "empty + free": sym_empty,
        "empty, dropped": sym_drop,
        "torch.empty": caching,
    }
    got = interleaved_host_us(calls, iters=200)
    for name, us in got.items():
        rows.append({"section": "alloc", "what": name, "us": us, "ratio": got["torch.empty"] / us})


def report_alloc(rows: List[Dict[str, Any]]) -> List[str]:
    out = [
        "## allocation of 1 MiB at 1 PE (host µs per call, median of 9 trials of 200 calls, the calls' trials "
        "interleaved)",
        "| call | µs | ratio (torch caching allocator / call) |",
        "|---|---|---|",
    ]
    for r in rows:
        if r["section"] == "alloc":
            out.append(f"| {r['what']} | {r['us']:.1f} | {r['ratio']:.3f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", default="fused,gemm,host,alloc", help="sections, comma-separated")
    ap.add_argument("--quick", action="store_true", help="a few shapes per section (a smoke run)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    import symheap.distributed  # noqa: F401 - registers the backend

    dist.init_process_group("cuda:symheap")
    nccl = dist.new_group(backend="nccl")
    rows: List[Dict[str, Any]] = []
    lines: List[str] = [f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, one PE"]
    for name, bench, report in (
        ("fused", lambda: bench_fused(rows, dev, args.quick), report_fused),
        ("gemm", lambda: bench_gemm(rows, dev, args.quick), report_gemm),
        ("host", lambda: bench_host(rows, dev, nccl), report_host),
        ("alloc", lambda: bench_alloc(rows, dev), report_alloc),
    ):
        if name not in only:
            continue
        t0 = time.perf_counter()
        bench()
        lines += report(rows) + [f"({name}: {time.perf_counter() - t0:.0f} s)", ""]
        print("\n".join(report(rows)), flush=True)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
