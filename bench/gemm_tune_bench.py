"""The GEMM inside symheap.gemm's kernels against cuBLAS, with no communication (one GPU).

For each tensor-parallel shape of issue 22 (bf16; ``n`` PEs: all_gather_matmul's per-PE GEMM is
``M x N x 8192`` with ``N`` in ``{1280*8/n, 3584*8/n}``, matmul_reduce_scatter's ``M x 8192 x
3584*8/n``; ``M`` in ``{2048, 4096, 8192, 16384}``), with ``b`` row-major and as a transposed
Linear weight (``w.t()``), this times every candidate configuration the tuner would time
(:func:`symheap.gemm._tune.time_candidates`: the op's own kernel at ``npes = 1``, on all SMs less
the push kernel's for all_gather_matmul) and ``torch.matmul`` (cuBLAS) on the same operands
(for all_gather_matmul also the tuner's cuBLAS engine, ``config`` ``[0, 0, 0, 0, 0, ...]``:
cuBLAS on each PE's row block in turn),
and prints TFLOP/s and the ratio ``t_cublas / t_best`` (above 1: the kernel is faster). This is
the floor the overlapped operations stand on: their GEMM can hide the communication only if it
is not slower than cuBLAS to begin with.

    python3 bench/gemm_tune_bench.py OUT.json [--pes 2,8] [--layouts kn,nk] [--ms 2048,4096]

Needs no symheap context (the kernels run at ``npes = 1``). JSON rows ``{op, pes, M, N, K,
layout, config, us}`` (``config`` ``"cublas"`` for torch.matmul) go to OUT.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import symheap.gemm._kernels as gk
import symheap.gemm._tune as tune
import torch


def shapes(pes: int, ms: List[int]) -> List[Dict[str, Any]]:
    out = []
    for m in ms:
        for n in (1280 * 8 // pes, 3584 * 8 // pes):
            out.append(dict(op="ag", pes=pes, M=m, N=n, K=8192))
        out.append(dict(op="rs", pes=pes, M=m, N=8192, K=3584 * 8 // pes))
    return out


def cublas_us(m: int, n: int, k: int, b_t: bool) -> float:
    a, b = tune._scratch(m, n, k, torch.bfloat16, b_t, torch.device("cuda"))
    c = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    return tune._time_us(lambda: torch.matmul(a, b, out=c), reps=5, trials=5)


def check(op: str, cfg: Any, m: int, n: int, k: int, b_t: bool, sms: int) -> float:
    """The kernel's result against torch.matmul on the tuner's scratch operands: the largest
    difference relative to the largest output (bf16 rounding of fp32 sums: ~1e-2 at most)."""
    a, b = tune._scratch(m, n, k, torch.bfloat16, b_t, torch.device("cuda"))
    c = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    tune.local_runner(op, cfg, a, b, sms, c)()
    ref = torch.matmul(a, b).float()
    return float((c.float() - ref).abs().max() / ref.abs().max())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pes", default="2")
    ap.add_argument("--layouts", default="kn,nk")
    ap.add_argument("--ms", default="2048,4096,8192,16384")
    ap.add_argument(
        "--extra",
        default="",
        help="more configurations to time beside the candidates, 'bm,bn,bk,warps,stages,gm,tma,flat;...' "
        "(to try a configuration before adding it to symheap.gemm._kernels.candidates)",
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    arch = gk._arch(dev)
    all_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows: List[Dict[str, Any]] = []
    extra = [gk.Config(*(int(v) for v in c.split(","))) for c in args.extra.split(";") if c.strip()]
    extra = [c._replace(tma=bool(c.tma), flat=bool(c.flat)) for c in extra]
    print(f"{torch.cuda.get_device_name(dev)}, sm_{arch}, {all_sms} SMs; torch {torch.__version__}")
    print(f"{'op':3} {'pes':>3} {'M':>6} {'N':>6} {'K':>6} {'B':3} {'cuBLAS TF/s':>11} {'best TF/s':>9} "
          f"{'ratio':>6} {'heur ratio':>10}  best config")  # fmt: skip
    for pes in map(int, args.pes.split(",")):
        for s in shapes(pes, [int(x) for x in args.ms.split(",")]):
            for layout in args.layouts.split(","):
                b_t = layout == "nk"
                m, n, k = s["M"], s["N"], s["K"]
                sms = gk.ag_gemm_sms(all_sms, pes) if s["op"] == "ag" else all_sms
                m_blk = m // pes
                cands = gk.candidates(s["op"], m_blk, n, k, arch) + extra
                # all_gather_matmul's other engine: cuBLAS per PE's row block on the whole GPU.
                cands += [gk.CUBLAS] if s["op"] == "ag" else []
                timed = tune.time_candidates(s["op"], cands, m, n, k, torch.bfloat16, b_t, sms, dev, pes)
                cb = cublas_us(m, n, k, b_t)
                flops = 2.0 * m * n * k
                for cfg, us in timed:
                    rows.append(dict(s, layout=layout, config=list(cfg), us=us))
                rows.append(dict(s, layout=layout, config="cublas", us=cb))
                best_cfg, best = min(timed, key=lambda x: x[1])
                heur = timed[0][1]
                err = check(s["op"], best_cfg, m, n, k, b_t, sms)
                if not err < 2e-2:
                    print(f"WRONG RESULT: {s} {layout} {tuple(best_cfg)}: relative error {err}")
                    return 1
                print(
                    f"{s['op']:3} {pes:>3} {m:>6} {n:>6} {k:>6} {layout:3} {flops / cb / 1e6:>11.0f} "
                    f"{flops / best / 1e6:>9.0f} {cb / best:>6.2f} {cb / heur:>10.2f}  {tuple(best_cfg)}"
                )
                sys.stdout.flush()
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
