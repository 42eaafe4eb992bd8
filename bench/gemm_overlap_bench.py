"""symheap's all_gather_matmul and matmul_reduce_scatter against the peers (issue 22, item 5).

Shapes (bf16, n ranks): all_gather_matmul with M (gathered rows) in {2048, 4096, 8192, 16384},
K = 8192, N in {1280*8/n, 3584*8/n}; matmul_reduce_scatter with the same M, K = 3584*8/n,
N = 8192. Variants per shape:

* ``symheap``: ``symheap.gemm.all_gather_matmul`` / ``matmul_reduce_scatter`` (overlapped);
* ``nccl+cublas``: ``torch.distributed.all_gather_into_tensor`` then ``torch.matmul`` (cuBLAS),
  or ``torch.matmul`` then ``reduce_scatter_tensor``;
* ``torch-symm-mem``: ``torch.ops.symm_mem.fused_all_gather_matmul`` /
  ``fused_matmul_reduce_scatter``;
* ``cublas``: ``torch.matmul`` alone on the same GEMM (the floor);
* ``comm``: the communication alone (NCCL's all_gather / reduce_scatter; symheap's own when
  NCCL cannot run).

Method: bench/peer_common.py's (median over trials of K back-to-back calls / K, eager and
replayed from a CUDA graph of K captured calls; the graph time is the one reported). Printed:
TFLOP/s (2*M*N*K per rank's GEMM / time), the ratio of each peer's time to symheap's (above 1:
symheap faster), the fraction of the communication hidden ``(t_comm + t_gemm - t) / t_comm``,
and the ideal overlap speedup ``(t_comm + t_gemm) / max(t_comm, t_gemm)`` next to the achieved
``(t_comm + t_gemm) / t``. JSON rows ``{op, M, N, K, name, us, eager_us}`` go to OUT.

Launch (one rank per GPU; NCCL and torch SymmetricMemory refuse two ranks on one GPU):

    torchrun --standalone --nproc-per-node 8 bench/gemm_overlap_bench.py OUT.json
    python3 -m symheap launch -n 2 -- python3 bench/gemm_overlap_bench.py OUT.json --symheap-only

With ranks sharing a GPU (``--symheap-only``, automatic then) symheap runs alone at the smallest
M: a code-path check, **not a speed comparison**; at one rank the peers run too, also only a
code-path check (no communication)."""

# Closures over loop variables are timed within their iteration only.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import peer_common as pc  # noqa: E402
import symheap  # noqa: E402
import symheap.gemm as gm  # noqa: E402
import symheap.torch as st  # noqa: E402

MS = (2048, 4096, 8192, 16384)
NOTES: List[str] = []
LIGHT = {"on": False}


def timed(boot: pc.DistBoot, rows: List[Dict[str, Any]], key: Dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """Appends ``key + {name, us, eager_us}``; a failure is printed with its reason."""
    k, trials = (2, 2) if LIGHT["on"] else (5, 5)
    try:
        e = pc.eager_us(boot, fn, k, trials)
        g = pc.graph_us(boot, fn, k, trials)
        rows.append(dict(key, name=name, us=g, eager_us=e))
    except Exception as ex:  # noqa: BLE001 - one variant's failure is a finding, not the end
        NOTES.append(f"{name} {key}: not measured: {type(ex).__name__}: {ex}"[:400])
        boot.say("gemm_overlap_bench: " + NOTES[-1])
        torch.cuda.synchronize()


@contextlib.contextmanager
def _engine(name: str) -> Iterator[None]:
    """all_gather_matmul with SYMHEAP_GEMM_ENGINE=name (read at each call; the same on every
    rank, as the setting must be)."""
    old = os.environ.get("SYMHEAP_GEMM_ENGINE")
    os.environ["SYMHEAP_GEMM_ENGINE"] = name
    try:
        yield
    finally:
        if old is None:
            del os.environ["SYMHEAP_GEMM_ENGINE"]
        else:
            os.environ["SYMHEAP_GEMM_ENGINE"] = old


def _symm_group(dist: Any) -> Optional[str]:
    try:
        import torch.distributed._symmetric_memory as symm

        name = dist.group.WORLD.group_name
        symm.enable_symm_mem_for_group(name)
        return name
    except Exception as ex:  # noqa: BLE001
        NOTES.append(f"torch SymmetricMemory unavailable: {type(ex).__name__}: {ex}"[:300])
        return None


def bench_ag(boot: pc.DistBoot, rows, peers: bool, group: Optional[str], ms: Sequence[int]) -> None:
    n = symheap.n_pes()
    dev, dist = st.device(), boot.dist
    k = 8192
    for nn in (1280 * 8 // n, 3584 * 8 // n):
        b = torch.randn(k, nn, dtype=torch.bfloat16, device=dev) / 64
        for m in ms:
            key = {"op": "all_gather_matmul", "M": m, "N": nn, "K": k}
            shard = torch.randn(m // n, k, dtype=torch.bfloat16, device=dev)
            # Random, not uninitialised: the floor multiplies the same kind of data as the op
            # (a GEMM's power draw, and so its clocks, can depend on the data).
            full = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            out = torch.empty(m, nn, dtype=torch.bfloat16, device=dev)
            timed(boot, rows, key, "symheap", lambda: gm.all_gather_matmul(shard, b, out=out))
            for eng in ("triton", "cublas"):  # each engine forced (the tuner picked one above)
                with _engine(eng):
                    timed(boot, rows, key, f"symheap-{eng}", lambda: gm.all_gather_matmul(shard, b, out=out))
            timed(boot, rows, key, "cublas", lambda: torch.matmul(full, b, out=out))
            if peers:
                timed(boot, rows, key, "comm", lambda: dist.all_gather_into_tensor(full, shard))

                def nccl() -> None:
                    dist.all_gather_into_tensor(full, shard)
                    torch.matmul(full, b, out=out)

                timed(boot, rows, key, "nccl+cublas", nccl)
                if group is not None:
                    fused = torch.ops.symm_mem.fused_all_gather_matmul
                    timed(boot, rows, key, "torch-symm-mem", lambda: fused(shard, [b], gather_dim=0, group_name=group))
            else:
                ss, sf = st.empty(m // n, k, dtype=torch.bfloat16), st.empty(m, k, dtype=torch.bfloat16)
                timed(boot, rows, key, "comm", lambda: symheap.all_gather(sf, ss))


def bench_rs(boot: pc.DistBoot, rows, peers: bool, group: Optional[str], ms: Sequence[int]) -> None:
    n = symheap.n_pes()
    dev, dist = st.device(), boot.dist
    k, nn = 3584 * 8 // n, 8192
    b = torch.randn(k, nn, dtype=torch.bfloat16, device=dev) / 64
    for m in ms:
        key = {"op": "matmul_reduce_scatter", "M": m, "N": nn, "K": k}
        a = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        part = torch.empty(m, nn, dtype=torch.bfloat16, device=dev)
        out = torch.empty(m // n, nn, dtype=torch.bfloat16, device=dev)
        timed(boot, rows, key, "symheap", lambda: gm.matmul_reduce_scatter(a, b, out=out))
        timed(boot, rows, key, "cublas", lambda: torch.matmul(a, b, out=part))
        if peers:
            timed(boot, rows, key, "comm", lambda: dist.reduce_scatter_tensor(out, part))

            def nccl() -> None:
                torch.matmul(a, b, out=part)
                dist.reduce_scatter_tensor(out, part)

            timed(boot, rows, key, "nccl+cublas", nccl)
            if group is not None:
                fused = torch.ops.symm_mem.fused_matmul_reduce_scatter
                timed(boot, rows, key, "torch-symm-mem", lambda: fused(a, b, "sum", scatter_dim=0, group_name=group))
        else:
            sp, so = st.empty(m, nn, dtype=torch.bfloat16), st.empty(m // n, nn, dtype=torch.bfloat16)
            timed(boot, rows, key, "comm", lambda: symheap.reduce_scatter(so, sp))


def report(rows: List[Dict[str, Any]]) -> List[str]:
    """One markdown row per (op, M, N, K)."""
    out = [
        "| op | M | N | K | symheap TFLOP/s | cuBLAS floor TFLOP/s | vs NCCL+cuBLAS | vs torch symm_mem | "
        "vs cuBLAS alone | comm hidden | ideal speedup | achieved speedup | Triton engine | cuBLAS engine |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["op"], r["M"], r["N"], r["K"]) for r in rows})
    for key in keys:
        t = {r["name"]: r["us"] for r in rows if (r["op"], r["M"], r["N"], r["K"]) == key}
        op, m, nn, k = key
        flops = 2.0 * m * nn * k

        def tf(name: str) -> str:
            return f"{flops / t[name] / 1e6:.0f}" if name in t else "-"

        def ratio(name: str) -> str:
            return f"{t[name] / t['symheap']:.2f}x" if name in t and "symheap" in t else "-"

        hidden = ideal = achieved = "-"
        if {"symheap", "cublas", "comm"} <= t.keys() and t["comm"] > 0:
            c, g, s = t["comm"], t["cublas"], t["symheap"]
            hidden = f"{max(0.0, (c + g - s) / c) * 100:.0f}%"
            ideal = f"{(c + g) / max(c, g):.2f}x"
            achieved = f"{(c + g) / s:.2f}x"
        out.append(
            f"| {op} | {m} | {nn} | {k} | {tf('symheap')} | {tf('cublas')} | {ratio('nccl+cublas')} | "
            f"{ratio('torch-symm-mem')} | {ratio('cublas')} | {hidden} | {ideal} | {achieved} | "
            f"{ratio('symheap-triton')} | {ratio('symheap-cublas')} |"
        )
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description="symheap all_gather_matmul / matmul_reduce_scatter vs peers")
    p.add_argument("out", help="JSON rows written here (rank 0)")
    p.add_argument("--symheap-only", action="store_true", help="no peers (automatic when ranks share a GPU)")
    p.add_argument("--quick", action="store_true", help="M in {2048, 8192} only")
    args = p.parse_args(argv)
    dist, own_gpu = pc.start_symheap_job()
    boot = pc.DistBoot(dist, symheap.my_pe())
    n = symheap.n_pes()
    if st.device().type != "cuda":
        boot.say("gemm_overlap_bench: needs the CUDA backend (SYMHEAP_BACKEND=cuda on a GPU machine)")
        return 77
    peers = own_gpu and not args.symheap_only
    label = "" if peers else " (symheap only)"
    ms: Sequence[int] = (2048, 8192) if args.quick else MS
    if not own_gpu:
        label += f"; {n} PEs sharing {torch.cuda.device_count()} GPU(s): NOT a speed comparison"
        LIGHT["on"] = True
        ms = (2048,)
    elif n == 1:
        label += "; 1 rank: a code-path check (no communication), not a comparison"
    group = _symm_group(dist) if peers else None
    rows: List[Dict[str, Any]] = []
    failed = 0
    with torch.no_grad():
        for what, fn in (("all_gather_matmul", bench_ag), ("matmul_reduce_scatter", bench_rs)):
            try:
                fn(boot, rows, peers, group, ms)
            except Exception as e:  # noqa: BLE001 - report it, go on
                failed += 1
                boot.say(f"gemm_overlap_bench: {what} failed: {type(e).__name__}: {e}"[:800])
                torch.cuda.synchronize()
    if symheap.my_pe() == 0:
        Path(args.out).write_text(json.dumps(rows))
        for r in rows:
            print(f"{r['op']:22s} M={r['M']:<6d} N={r['N']:<6d} K={r['K']:<6d} {r['name']:15s} "
                  f"graph {r['us']:10.1f} us  eager {r['eager_us']:10.1f} us")  # fmt: skip
        print(f"\n## gemm_overlap_bench: {n} rank(s), {torch.cuda.get_device_name(st.device())}, bf16{label}\n")
        print("\n".join(report(rows)))
        for note in NOTES:
            print("note:", note)
    boot.barrier()
    symheap.finalize()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
