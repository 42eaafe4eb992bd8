"""symheap.moe: MoE dispatch and combine (cases in pe_moe_cases.py).

CI (host backend, CPU tensors) at 1, 2, 4 and 8 PEs: random routings in both modes and two
alignments, the edge routings (all experts on one PE, empty experts, one expert for every
token, repeats, no tokens), FP8 dispatch, back-to-back calls on the double-buffered staging,
overflow and bad ids, argument errors, and the custom ops (opcheck, torch.compile fullgraph).
Every dispatch is checked byte for byte against a reference built from an all_gather of every
PE's tokens and routing; combines against float64. Without a GPU the Triton kernels are
compiled for sm_90 in every mode (16-byte peer stores checked in the PTX), and the same kernels
run under Triton's interpreter on the host backend at 2 and 4 PEs (SYMHEAP_MOE_TRITON=1): the
CUDA path's plans, peer writes through the table and weighted sum, checked as exactly. On a GPU
(CUDA backend, PEs sharing GPU 0 when there is one) the same cases run the kernels, plus a
CUDA-graph decode step.
"""

from __future__ import annotations

import importlib

import pytest

from conftest import run_cases

CPU_CASES = ("moe_random", "moe_edges", "moe_fp8", "moe_repeat", "moe_errors", "moe_op")


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_moe_host_backend(torch_module, n: int) -> None:
    """Every CPU case at n PEs (host backend: indexed copies into the peers' mapped copies)."""
    run_cases(n, *CPU_CASES, timeout=900)


def _gpu_env() -> dict:
    return {"SYMHEAP_BACKEND": "cuda", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@pytest.mark.parametrize("n", [2, 4, 8])
def test_moe_cuda(cuda_gpus: int, n: int) -> None:
    """The Triton kernel at n PEs (one GPU each when there are enough, else sharing GPU 0)."""
    run_cases(n, *CPU_CASES, "moe_cuda_graph", env=_gpu_env(), timeout=900)


def test_quantize_fp8_same_on_cpu_and_cuda(cuda_gpus: int) -> None:
    """quantize_fp8 of the same rows gives the same bytes and scales on the CPU and on the GPU,
    so the host backend and the CUDA path dispatch identical FP8 payloads."""
    import torch
    from symheap.moe._plan import quantize_fp8

    g = torch.Generator().manual_seed(7)
    x = (torch.randn(64, 7168, generator=g) * torch.rand(64, 1, generator=g) * 30).to(torch.bfloat16)
    x[3, :128] = 0
    qc, sc = quantize_fp8(x)
    qg, sg = (t.cpu() for t in quantize_fp8(x.cuda()))
    assert torch.equal(sc, sg), int((sc != sg).sum())
    qc, qg = qc.view(torch.uint8), qg.view(torch.uint8)
    assert torch.equal(qc, qg), int((qc != qg).sum())


@pytest.mark.parametrize("n,cases", [(2, CPU_CASES[:5]), (4, ("moe_random", "moe_edges", "moe_repeat"))])
def test_moe_triton_kernels_interpreted(torch_module, n: int, cases) -> None:
    """The CUDA path's Triton kernels (plans, row moves through translated peer addresses,
    the weighted sum) run by Triton's interpreter on the host backend's CPU tensors, across real
    processes writing into each other's mapped memory: the same exact checks as the torch
    plans."""
    pytest.importorskip("triton")
    env = {"SYMHEAP_MOE_TRITON": "1", "TRITON_INTERPRET": "1"}
    run_cases(n, *cases, env=env, timeout=900)


def _compile(name: str, sig: dict, consts: dict, div=()) -> str:
    """PTX of kernel ``name`` of symheap.moe._kernels for sm_90 (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = importlib.import_module("symheap.moe._kernels")
    s = dict(sig, **{c: "constexpr" for c in consts})
    # What Triton's launcher specialises at run time: 16-byte aligned pointers, 16-divisible ints.
    attrs = {(i,): [["tt.divisibility", 16]] for i, (a, t) in enumerate(s.items()) if t[0] == "*" or a in div}
    src = ASTSource(fn=getattr(k, name), signature=s, constexprs=consts, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert c.asm["cubin"], f"{name}: no cubin"
    return c.asm["ptx"]


MOVE_SIG = {
    "src": "*bf16", "dst": "*bf16", "src_rows": "*i64", "dst_pes": "*i64", "dst_rows": "*i64",
    "src_stride": "i32", "dst_stride": "i32", "bases": "*i64", "me": "i32", "ctr": "*i64",
}  # fmt: skip


def test_moe_kernels_compile_for_sm90(torch_module) -> None:
    """Every kernel compiles for sm_90 in each mode it is launched in; with aligned rows the
    row moves store 16-byte vectors (``st.global.v4``) to the translated peer address, and the
    plan kernel's counts reach the peers through the table."""
    pytest.importorskip("triton")
    for gather, src_div, pe_mod, par in ((False, 8, 8, 0), (False, 1, 0, 57344), (True, 0, 0, 0)):
        consts = dict(
            ROW=7168, BLOCK=1024, VEC=8, HINT=16, GATHER=gather, SRC_DIV=src_div, PE_MOD=pe_mod, PAR_STRIDE=par
        )
        ptx = _compile("move_rows_kernel", MOVE_SIG, consts, ("src_stride", "dst_stride"))
        assert "st.global.v4" in ptx, f"{consts}: no 16-byte stores"
    meta = dict(MOVE_SIG, src="*i32", dst="*i32")
    consts = dict(ROW=17, BLOCK=32, VEC=1, HINT=0, GATHER=False, SRC_DIV=1, PE_MOD=8, PAR_STRIDE=0)
    assert "st.global" in _compile("move_rows_kernel", meta, consts)
    send = {
        "idx": "*i64", "w": "*fp32", "ctr": "*i64", "par_out": "*i64", "dst_row": "*i64", "meta": "*i32",
        "routed": "*i8", "bad_routing": "*i32", "stage_counts": "*i32", "bases": "*i64", "n_tok": "i32",
        "me": "i32", "n_experts": "i32", "lx": "i32",
    }  # fmt: skip
    for check in (False, True):
        ptx = _compile("send_plan_kernel", send, dict(P=8, K=8, TMAX=128, BT=64, KP=8, PP=8, CHECK=check))
        assert "st.global" in ptx
        # The call counter advances only after a CTA barrier: warps run independently, and one
        # storing early would hand a late one the other staging parity.
        tail = ptx[ptx.rfind("bar.sync") :]
        stores = [ln.strip() for ln in tail.splitlines() if "st.global" in ln]
        assert len(stores) == 1 and "st.global.b64" in stores[0], f"not only the counter after the barrier: {stores}"
    recv = {
        "meta": "*i32", "counts": "*i32", "par_ptr": "*i64", "start": "*i64", "length": "*i64",
        "src_row": "*i64", "recv_idx": "*i64", "recv_w": "*fp32", "comb_pe": "*i64", "comb_row": "*i64",
        "num": "*i32",
    }  # fmt: skip
    for count_only in (False, True):
        _compile(
            "recv_plan_kernel", recv, dict(P=8, K=8, TMAX=128, CAP=1024, BJ=256, KP=8, PP=8, COUNT_ONLY=count_only)
        )
    comb = {
        "comb": "*bf16",
        "ctr": "*i64",
        "routed": "*i8",
        "w": "*fp32",
        "out": "*bf16",
        "n_tok": "i32",
        "hidden": "i32",
    }
    for bf in (True, False):
        out = dict(comb, out="*bf16" if bf else "*fp32")
        _compile("combine_sum_kernel", out, dict(SLOTS=1024, K=8, BH=1024, OUT_BF16=bf))


def test_moe_bench_runs_on_the_host_backend(torch_module, tmp_path) -> None:
    """bench/moe_bench.py --small at 2 PEs on the host backend: symheap and the NCCL path's logic
    (over gloo) agree on every combine (the script checks before timing), the table and the JSON
    rows are written, and nothing is reported as not measured."""
    import json
    import sys

    from conftest import ROOT, launch

    out = tmp_path / "moe.json"
    p = launch(2, [sys.executable, str(ROOT / "bench" / "moe_bench.py"), str(out), "--small"], timeout=600)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert "## moe_bench (2 ranks" in p.stdout and "| prefill | pair |" in p.stdout, text
    data = json.loads(out.read_text())
    assert data["notes"] == [], data["notes"]
    names = {(r["case"], r["op"], r["name"]) for r in data["rows"]}
    for case in ("decode", "prefill"):
        for op in ("dispatch", "combine", "pair"):
            assert {(case, op, "symheap"), (case, op, "nccl-a2a")} <= names, (case, op)
    assert ("decode-fp8", "pair", "symheap") in names
