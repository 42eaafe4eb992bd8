"""symheap.moe: MoE dispatch and combine (cases in pe_moe_cases.py).

CI (host backend, CPU tensors) at 1, 2, 4 and 8 PEs: random routings in both modes and two
alignments, the edge routings (all experts on one PE, empty experts, one expert for every
token, repeats, no tokens), FP8 dispatch, back-to-back calls on the double-buffered staging,
overflow and bad ids, argument errors, and the custom ops (opcheck, torch.compile fullgraph).
Every dispatch is checked byte for byte against a reference built from an all_gather of every
PE's tokens and routing; combines against float64. Without a GPU the Triton row-move kernel is
compiled for sm_90 and its PTX checked (16-byte peer stores). On a GPU (CUDA backend, PEs
sharing GPU 0 when there is one) the same cases run the kernel, plus a CUDA-graph decode step.
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


@pytest.mark.parametrize("n", [2, 4])
def test_moe_cuda(cuda_gpus: int, n: int) -> None:
    """The Triton kernel at n PEs (one GPU each when there are enough, else sharing GPU 0)."""
    run_cases(n, *CPU_CASES, "moe_cuda_graph", env=_gpu_env(), timeout=900)


def test_moe_kernel_compiles_with_16_byte_peer_stores(torch_module) -> None:
    """The row-move kernel compiles for sm_90; with aligned rows its stores are 16-byte vectors
    (``st.global.v4``) behind the skip of empty entries; unaligned rows still compile."""
    try:
        from triton.backends.compiler import GPUTarget
    except ImportError:
        pytest.skip("triton is not installed (pip install triton)")
    import triton
    from triton.compiler import ASTSource

    k = importlib.import_module("symheap._moe_kernels")
    sig = {
        "src": "*bf16", "dst": "*bf16", "src_rows": "*i64", "dst_pes": "*i64", "dst_rows": "*i64",
        "row_elems": "i32", "src_stride": "i32", "dst_stride": "i32", "bases": "*i64", "me": "i32",
        "BLOCK": "constexpr", "VEC": "constexpr", "HINT": "constexpr",
    }  # fmt: skip
    # What Triton's launcher specialises at run time: 16-byte aligned pointers, 16-divisible ints.
    div = ("row_elems", "src_stride", "dst_stride")
    attrs = {(i,): [["tt.divisibility", 16]] for i, (a, t) in enumerate(sig.items()) if t[0] == "*" or a in div}
    for vec, hint, want in ((8, 16, "st.global.v4"), (1, 0, "st.global")):
        consts = {"BLOCK": 1024, "VEC": vec, "HINT": hint}
        src = ASTSource(fn=k.move_rows_kernel, signature=sig, constexprs=consts, attrs=attrs)
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        assert c.asm["cubin"], "no cubin"
        assert want in c.asm["ptx"], f"VEC={vec} HINT={hint}: no {want}"


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
