"""symheap.fused: all_reduce + residual + RMSNorm in one call (cases in pe_fused_cases.py).

CI (host backend, CPU tensors) at 1, 2 and 4 PEs: float64 references (exact where the data is
integer-valued), ragged token counts, hidden 1024 to 16384, FP8 output, the custom op with
opcheck and torch.compile(fullgraph=True), argument errors. Without a GPU the Triton kernel is
compiled for sm_90 and its PTX checked. On a GPU (CUDA backend, 2 PEs sharing GPU 0 when there
is one) the same cases run the kernel, plus CUDA graph capture with 20 replays. Skips say why:
torch or Triton missing, or no CUDA device.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest

from conftest import run_cases

CPU_CASES = ("fused_exact", "fused_random", "fused_fp8", "fused_errors", "fused_op")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_fused_host_backend(torch_module, n: int) -> None:
    """Every CPU case at n PEs (the host backend: host all_reduce, then torch on the CPU);
    torch.compile with aot_eager at every n, with inductor too at 1 PE."""
    run_cases(n, *CPU_CASES, env={"FUSED_INDUCTOR": "1" if n == 1 else "0"}, timeout=600)


def _gpu_env() -> dict:
    return {"SYMHEAP_BACKEND": "cuda", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def test_fused_cuda(cuda_gpus: int) -> None:
    """The Triton kernel at 2 PEs (one GPU each when there are two, else sharing GPU 0):
    exactness, tolerance, FP8, errors, the custom op under torch.compile (inductor)."""
    run_cases(2, *CPU_CASES, env=_gpu_env(), timeout=600)


def test_fused_cuda_one_pe(cuda_gpus: int) -> None:
    """At one PE the op is one add + RMSNorm kernel with no workspace: the same cases (exact,
    random, 0 tokens, FP8, errors, compiled) and CUDA graph replays."""
    run_cases(1, *CPU_CASES, "fused_cuda_graph", env=_gpu_env(), timeout=600)


def test_fused_cuda_graph(cuda_gpus: int) -> None:
    """Captured in a CUDA graph, 20 replays with new inputs, each checked; eager again after."""
    run_cases(2, "fused_cuda_graph", env=_gpu_env(), timeout=600)


@pytest.fixture(scope="module")
def kernel_ptx() -> Any:
    """A function compiling the fused kernel for sm_90 to PTX (no GPU needed), or a skip
    without Triton."""
    try:
        importlib.import_module("triton")
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        pytest.skip("triton is not installed (pip install triton)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = importlib.import_module("symheap.fused._kernels")
    sig = {
        "x_ptr": "*bf16",
        "res_ptr": "*bf16",
        "w_ptr": "*bf16",
        "out_ptr": "*bf16",
        "res_out_ptr": "*bf16",
        "scale_ptr": "*fp32",
        "ws_ptr": "*bf16",
        "flags_ptr": "*i64",
        "ctr_ptr": "*i64",
        "bases_ptr": "*i64",
        "me": "i32",
        "npes": "i32",
        "n_rows": "i32",
        "H": "i32",
        "slot_elems": "i64",
        "stride_x": "i32",
        "stride_r": "i32",
        "stride_o": "i32",
        "stride_ro": "i32",
        "eps": "fp32",
        "timeout_ns": "i64",
        "BLOCK": "constexpr",
        "FP8": "constexpr",
        "HINT": "constexpr",
    }

    def build(block: int, fp8: int, dtype: str = "bf16", hint: Any = 16) -> str:
        s = dict(sig)
        for a in ("x_ptr", "res_ptr", "w_ptr", "res_out_ptr", "ws_ptr"):
            s[a] = "*" + dtype
        s["out_ptr"] = "*fp8e4nv" if fp8 else "*" + dtype
        # What Triton's launcher specialises on at run time: 16-divisible pointers, and the
        # hidden size, slot size and strides of 16-divisible hidden sizes.
        div = ("H", "slot_elems", "stride_x", "stride_r", "stride_o", "stride_ro") if hint else ()
        attrs = {(i,): [["tt.divisibility", 16]] for i, (a, t) in enumerate(s.items()) if t[0] == "*" or a in div}
        src = ASTSource(
            fn=k.fused_ar_rmsnorm_kernel,
            signature=s,
            constexprs={"BLOCK": block, "FP8": fp8, "HINT": hint},
            attrs=attrs,
        )
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": k.num_warps_for(block)})
        assert c.asm["cubin"], "no cubin"
        return c.asm["ptx"]

    return build


def _instructions(ptx: str) -> list:
    # Without the predicate guard (@%p1 / @!%p1) in front of an instruction.
    lines = [re.sub(r"^@!?%\w+\s+", "", line.strip()) for line in ptx.splitlines()]
    return [line for line in lines if line and not line.startswith((".", "//", "$", "}", "{"))]


@pytest.mark.parametrize("block", [1024, 8192, 16384])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_kernel_compiles_with_its_protocol(kernel_ptx: Any, block: int, dtype: str) -> None:
    """The kernel compiles for sm_90; the PTX has the protocol the design promises: release
    flag stores at system scope after a CTA barrier, acquire polling at system scope with the
    bounded wait (globaltimer) and trap, 16-byte vector peer stores, and the epoch update."""
    lines = _instructions(kernel_ptx(block, 0, dtype))
    rel = [i for i, x in enumerate(lines) if re.search(r"\b(atom|red)\.global\.sys\.release\.exch\.b64", x)]
    assert rel, "no release store of the flag at system scope"
    assert any(x.startswith("bar.sync") for x in lines[: rel[0]])
    assert any(x.startswith("ld.acquire.sys.global.b64") for x in lines)
    assert any("%globaltimer" in x for x in lines) and any(x.startswith("trap") for x in lines)
    assert any(re.match(r"st\.global(\.\w+)*\.v4\.b32", x) for x in lines), "no 16-byte vector stores"
    assert any(re.search(r"atom\.global\.gpu\.acq_rel\.add", x) for x in lines), "no arrival counter"
    assert any(x.startswith("ld.volatile.global") for x in lines), "staged rows not read volatile"


@pytest.mark.parametrize("fp8", [1, 2])
def test_kernel_fp8_compiles(kernel_ptx: Any, fp8: int) -> None:
    """The FP8 variants convert to e4m3 (cvt ... e4m3x2) and saturate."""
    lines = _instructions(kernel_ptx(8192, fp8))
    assert any("e4m3x2" in x and x.startswith("cvt") for x in lines)
    assert any(x.startswith(("min.f32", "max.f32", "min.NaN.f32", "max.NaN.f32")) for x in lines)


def test_kernel_without_hint_compiles(kernel_ptx: Any) -> None:
    """A hidden size whose rows are not 16-byte aligned compiles without the hint."""
    assert "st.global" in kernel_ptx(1024, 0, "fp16", None)


@pytest.mark.parametrize("fp8", [0, 2])
def test_one_pe_kernel_has_no_protocol(fp8: int) -> None:
    """The one-PE kernel (the all_reduce is the identity there) compiles for sm_90 with
    16-byte vector loads and stores and none of the collective protocol: no atomics, no
    system-scope fences or acquire loads, no timed wait."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("triton is not installed (pip install triton)")
    k = importlib.import_module("symheap.fused._kernels")
    sig = {
        "x_ptr": "*bf16",
        "res_ptr": "*bf16",
        "w_ptr": "*bf16",
        "out_ptr": "*fp8e4nv" if fp8 else "*bf16",
        "res_out_ptr": "*bf16",
        "scale_ptr": "*fp32",
        "H": "i32",
        "stride_x": "i32",
        "stride_r": "i32",
        "stride_o": "i32",
        "stride_ro": "i32",
        "eps": "fp32",
        "BLOCK": "constexpr",
        "FP8": "constexpr",
    }
    div = ("H", "stride_x", "stride_r", "stride_o", "stride_ro")
    attrs = {(i,): [["tt.divisibility", 16]] for i, (a, t) in enumerate(sig.items()) if t[0] == "*" or a in div}
    src = ASTSource(fn=k.add_rmsnorm_kernel, signature=sig, constexprs={"BLOCK": 8192, "FP8": fp8}, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": k.num_warps_one_pe(8192)})
    lines = _instructions(c.asm["ptx"])
    assert any(re.match(r"ld\.global(\.\w+)*\.v4\.b32", x) for x in lines), "no 16-byte vector loads"
    if not fp8:
        assert any(re.match(r"st\.global(\.\w+)*\.v4\.b32", x) for x in lines), "no 16-byte vector stores"
    assert not [x for x in lines if x.startswith(("atom", "red.", "fence", "membar", "trap"))]
    assert not [x for x in lines if ".acquire" in x or "%globaltimer" in x]
