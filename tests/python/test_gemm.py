"""symheap.gemm: all_gather_matmul and matmul_reduce_scatter (cases in pe_gemm_cases.py).

CI (host backend, CPU tensors: the unfused path) at 1, 2 and 4 PEs: exact against float64
references on integer-valued inputs, bf16/fp16 tolerance on random normal data, ragged M, N, K,
B transposed, the gathered A, symmetric inputs, argument errors, the custom ops with opcheck and
torch.compile(fullgraph=True). Without a GPU the Triton kernels are compiled for sm_90 and their
PTX checked for the protocol (release flags at system scope, bounded acquire waits with trap,
16-byte vector peer stores, wgmma). On a GPU (CUDA backend, 2 PEs sharing GPU 0 when there is
one GPU) the same cases run the kernels, plus both ops in one CUDA graph with 10 replays. Skips
say why: torch or Triton missing, or no CUDA device.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest

from conftest import run_cases

CPU_CASES = ("gemm_exact", "gemm_random", "gemm_errors", "gemm_op")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_gemm_host_backend(torch_module, n: int) -> None:
    """Every CPU case at n PEs (host backend: host all_gather / reduce_scatter and torch)."""
    run_cases(n, *CPU_CASES, timeout=600)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_gemm_tuner_agreement(torch_module, tmp_path, n: int) -> None:
    """The tuner's collective step at n PEs: PE 0's choice everywhere, its disk cache reused
    without timing, all inf -> the heuristic, a bad SYMHEAP_GEMM_TUNE refused."""
    pytest.importorskip("triton")
    run_cases(n, "gemm_tune_agree", env={"SYMHEAP_TEST_TMP": str(tmp_path)}, timeout=300)


def _gpu_env() -> dict:
    return {"SYMHEAP_BACKEND": "cuda", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def test_gemm_cuda(cuda_gpus: int) -> None:
    """The Triton kernels at 2 PEs (one GPU each when there are two, else sharing GPU 0)."""
    run_cases(2, *CPU_CASES, env=_gpu_env(), timeout=600)


def test_gemm_cuda_one_pe(cuda_gpus: int) -> None:
    """At one PE both ops are one cuBLAS GEMM with fp32 reductions (nothing to gather or
    reduce): exact and random cases, errors, the custom ops compiled."""
    run_cases(1, *CPU_CASES, env=_gpu_env(), timeout=600)


def test_gemm_cuda_4pe(cuda_gpus: int) -> None:
    """The Triton kernels at 4 PEs (sharing the GPUs there are): exact and random cases."""
    run_cases(4, "gemm_exact", "gemm_random", env=_gpu_env(), timeout=600)


def test_gemm_cuda_tuned(cuda_gpus: int, tmp_path) -> None:
    """SYMHEAP_GEMM_TUNE=1 at 2 PEs: tuned on every PE's GPU, PE 0's choice launched by both
    (exact), then taken from PE 0's disk cache without timing."""
    run_cases(2, "gemm_tuned", env=dict(_gpu_env(), SYMHEAP_TEST_TMP=str(tmp_path)), timeout=900)


def test_gemm_cuda_graph(cuda_gpus: int) -> None:
    """Both ops in one CUDA graph, 10 replays with new inputs, each exact; eager after."""
    run_cases(2, "gemm_cuda_graph", env=_gpu_env(), timeout=600)


@pytest.mark.parametrize("n", [2, 4])
def test_gemm_cuda_cublas_engine(cuda_gpus: int, n: int) -> None:
    """all_gather_matmul's copy-engine + cuBLAS engine (SYMHEAP_GEMM_ENGINE=cublas) at 2 and 4
    PEs: the exact, random and argument cases, and (at 2) the CUDA graph with 10 replays (its
    single slots and acknowledgements under replay)."""
    cases = (*CPU_CASES, "gemm_cuda_graph") if n == 2 else ("gemm_exact", "gemm_random")
    run_cases(n, *cases, env=dict(_gpu_env(), SYMHEAP_GEMM_ENGINE="cublas"), timeout=600)


def test_gemm_engine_setting(monkeypatch) -> None:
    """SYMHEAP_GEMM_ENGINE: auto (unset or empty), triton, cublas (any case); anything else is
    refused with SymheapValueError naming the setting."""
    pytest.importorskip("triton")
    k = importlib.import_module("symheap.gemm._kernels")
    from symheap import SymheapValueError

    for v, want in (("", "auto"), ("AUTO", "auto"), ("triton", "triton"), (" cuBLAS ", "cublas")):
        monkeypatch.setenv("SYMHEAP_GEMM_ENGINE", v)
        assert k.engine() == want
    monkeypatch.delenv("SYMHEAP_GEMM_ENGINE")
    assert k.engine() == "auto"
    monkeypatch.setenv("SYMHEAP_GEMM_ENGINE", "fastest")
    with pytest.raises(SymheapValueError, match="SYMHEAP_GEMM_ENGINE"):
        k.engine()
    assert k.CUBLAS not in k.candidates("ag", 2048, 5120, 8192, 90), "the engine is added by the tuner only"


P = "*bf16"
SIGS = {
    "ag_push_kernel": dict(
        a_ptr=P, ws_ptr=P, flags_ptr="*i64", ctr_ptr="*i64", bases_ptr="*i64", me="i32", npes="i32",
        m_loc="i32", K="i32", stride_am="i32", slot_elems="i64", flag_stride="i32",
    ),
    "ag_gemm_kernel": dict(
        a_ptr=P, b_ptr=P, c_ptr=P, ws_ptr=P, a_desc="A", ws_desc="A", b_desc="B", flags_ptr="*i64",
        ctr_ptr="*i64", me="i32", npes="i32", m_loc="i32", N="i32", K="i32", stride_am="i32", stride_bk="i32",
        stride_bn="i32", stride_cm="i32", slot_elems="i64", slot_rows="i32", flag_stride="i32", timeout_ns="i64",
    ),
    "rs_gemm_kernel": dict(
        a_ptr=P, b_ptr=P, c_ptr=P, ws_ptr=P, a_desc="A", b_desc="B", flags_ptr="*i64", ctr_ptr="*i64",
        bases_ptr="*i64", me="i32", npes="i32", m_blk="i32", N="i32", K="i32", stride_am="i32", stride_bk="i32",
        stride_bn="i32", stride_cm="i32", slot_elems="i64", flag_stride="i32", timeout_ns="i64",
    ),
    "ce_acks_kernel": dict(flags_ptr="*i64", ctr_ptr="*i64", me="i32", npes="i32", flag_stride="i32", timeout_ns="i64"),
    "ce_signal_kernel": dict(flag_ptr="*i64", ctr_ptr="*i64", me="i32", pe="i32", bases_ptr="*i64"),
    "ce_step_kernel": dict(
        flags_ptr="*i64", ctr_ptr="*i64", me="i32", bases_ptr="*i64", flag_stride="i32", ack_pe="i32",
        wait_src="i32", timeout_ns="i64",
    ),
    "ag_gathered_kernel": dict(
        a_ptr=P, ws_ptr=P, g_ptr=P, ctr_ptr="*i64", me="i32", npes="i32", m_loc="i32", K="i32",
        stride_am="i32", slot_elems="i64",
    ),
}  # fmt: skip
# What Triton's launcher specialises at run time for 16-divisible sizes and strides.
DIV = ("N", "K", "stride_am", "stride_bk", "stride_cm", "slot_elems")


@pytest.fixture(scope="module")
def kernel_ptx() -> Any:
    """A function compiling one of the gemm kernels for sm_90 to PTX (no GPU needed), or a skip
    without Triton."""
    try:
        importlib.import_module("triton")
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        pytest.skip("triton is not installed (pip install triton)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = importlib.import_module("symheap.gemm._kernels")

    def build(name: str, consts: dict, dtype: str = "bf16", warps: int = 8, stages: int = 4, arch: int = 90) -> Any:
        """``consts``: the constexprs; with ``TMA`` the descriptors get TMA block types from
        BM, BN, BK and B_T, else they are None."""
        s = {a: ("*" + dtype if t == P else t) for a, t in SIGS[name].items()}
        tma = consts.get("TMA", False)
        descs = [a for a, t in s.items() if t in ("A", "B")]
        if tma:
            bm, bn, bk = consts["BM"], consts["BN"], consts["BK"]
            b_block = f"{bn},{bk}" if consts.get("B_T") else f"{bk},{bn}"
            blocks = {"A": f"{bm},{bk}", "B": b_block}
            s.update({a: f"tensordesc<{dtype}[{blocks[s[a]]}]>" for a in descs})
        else:
            consts = dict(consts, **{a: None for a in descs})
        s.update({c: "constexpr" for c in consts})
        attrs = {(i,): [["tt.divisibility", 16]] for i, (a, t) in enumerate(s.items()) if t[0] == "*" or a in DIV}
        src = ASTSource(fn=getattr(k, name), signature=s, constexprs=consts, attrs=attrs)
        c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, "num_stages": stages})
        assert c.asm["cubin"], "no cubin"
        return c.asm["ptx"] if arch == 90 else c.metadata.shared

    return build


def _instructions(ptx: str) -> list:
    lines = [re.sub(r"^@!?%\w+\s+", "", line.strip()) for line in ptx.splitlines()]
    return [line for line in lines if line and not line.startswith((".", "//", "$", "}", "{"))]


def _has(lines: list, pattern: str) -> bool:
    return any(re.search(pattern, x) for x in lines)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_ag_kernels_compile_with_their_protocol(kernel_ptx: Any, dtype: str) -> None:
    """The push kernel stores 16-byte vectors into peers and publishes each chunk with a
    release store at system scope after a CTA barrier; the persistent GEMM waits with bounded
    acquire polling at system scope (globaltimer, trap), runs on wgmma with cp.async loads, and
    both advance their device-side epoch."""
    push = _instructions(kernel_ptx("ag_push_kernel", {"BM": 128, "BLOCK": 2048, "HINT": 16}, dtype))
    rel = [i for i, x in enumerate(push) if re.search(r"atom\.global\.sys\.release\.exch\.b64", x)]
    assert rel and any(x.startswith("bar.sync") for x in push[: rel[0]])
    assert _has(push, r"^st\.global(\.\w+)*\.v4\.b32"), "no 16-byte vector peer stores"
    ptr = dict(BM=128, BN=128, BK=64, GM=8, TMA=False, B_T=False, FLAT=False)
    gemm = _instructions(kernel_ptx("ag_gemm_kernel", ptr, dtype))
    assert _has(gemm, r"^ld\.acquire\.sys\.global\.b64") and _has(gemm, "%globaltimer") and _has(gemm, r"^trap")
    assert _has(gemm, r"^wgmma\.mma_async") and _has(gemm, r"^cp\.async")
    # The TMA variant: bulk tensor loads, and a proxy fence between a peer's flag and TMA reads.
    for b_t in (False, True):
        cfg = dict(ptr, BN=256, TMA=True, B_T=b_t, FLAT=b_t)
        tma = _instructions(kernel_ptx("ag_gemm_kernel", cfg, dtype, stages=3))
        assert _has(tma, r"^cp\.async\.bulk\.tensor\.2d") and _has(tma, r"^wgmma\.mma_async")
        assert _has(tma, r"^ld\.acquire\.sys\.global\.b64") and _has(tma, r"^trap")
        acq = [i for i, x in enumerate(tma) if x.startswith("ld.acquire.sys")]
        fence = [i for i, x in enumerate(tma) if x.startswith("fence.proxy.async.global")]
        bulk = [i for i, x in enumerate(tma) if x.startswith("cp.async.bulk.tensor")]
        assert any(a < f < b for a in acq for f in fence for b in bulk), "no proxy fence after the peer's flag"
    for lines in (push, gemm):
        assert _has(lines, r"atom\.global\.gpu\.acq_rel\.add"), "no arrival counter"
        assert _has(lines, r"atom\.global\.gpu\.release\.exch\.b64"), "no epoch update"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_rs_kernel_compiles_with_its_protocol(kernel_ptx: Any, dtype: str) -> None:
    """Partials go to the owner as 16-byte vector stores, each tile published by a release
    flag at system scope; own tiles wait (bounded acquire, trap) and read the peers' partials
    with volatile vector loads; wgmma for the GEMM."""
    cfg = dict(BM=128, BN=128, BK=64, GM=8, TMA=False, B_T=False, HINT=True)
    tma = _instructions(kernel_ptx("rs_gemm_kernel", dict(cfg, TMA=True, BN=256), dtype, stages=3))
    assert _has(tma, r"^cp\.async\.bulk\.tensor\.2d") and _has(tma, r"atom\.global\.sys\.release\.exch\.b64")
    lines = _instructions(kernel_ptx("rs_gemm_kernel", cfg, dtype))
    assert _has(lines, r"atom\.global\.sys\.release\.exch\.b64")
    assert _has(lines, r"^ld\.acquire\.sys\.global\.b64") and _has(lines, r"^trap")
    assert _has(lines, r"^ld\.volatile\.global\.v4"), "peer partials not read volatile"
    stores = [x for x in lines if x.startswith("st.global")]
    assert stores and all(".v4." in x for x in stores), "not every tile store is a 16-byte vector store"
    assert _has(lines, r"^wgmma\.mma_async")


def test_cublas_engine_kernels_compile_with_their_protocol(kernel_ptx: Any) -> None:
    """The copy-engine engine's small kernels: the signal after a copy is a release store at
    system scope; waits (data flags, acknowledgements) are bounded acquire polls at system
    scope ending in trap; the last step stores the epoch into the counter with release."""
    sig = _instructions(kernel_ptx("ce_signal_kernel", {}, warps=1))
    assert _has(sig, r"atom\.global\.sys\.release\.exch\.b64")
    for name, consts in (("ce_acks_kernel", {}), ("ce_step_kernel", {"FINISH": False})):
        lines = _instructions(kernel_ptx(name, consts, warps=1))
        assert _has(lines, r"^ld\.acquire\.sys\.global\.b64") and _has(lines, "%globaltimer") and _has(lines, r"^trap")
    step = _instructions(kernel_ptx("ce_step_kernel", {"FINISH": True}, warps=1))
    assert _has(step, r"atom\.global\.sys\.release\.exch\.b64"), "no acknowledgement"
    assert _has(step, r"atom\.global\.gpu\.release\.exch\.b64"), "no epoch update"


def test_kernels_compile_small_and_unaligned(kernel_ptx: Any) -> None:
    """Small tiles (the configs of small blocks) and no hint (rows not 16-byte aligned)."""
    small = dict(BM=64, BN=64, BK=32, GM=8, TMA=False, B_T=True, HINT=False)
    assert "st.global" in kernel_ptx("rs_gemm_kernel", small, "fp16")
    assert "st.global" in kernel_ptx("ag_push_kernel", {"BM": 64, "BLOCK": 64, "HINT": None}, "fp16")
    assert "st.global" in kernel_ptx("ag_gathered_kernel", {"BLOCK": 2048}, warps=4)


@pytest.mark.parametrize("arch", [100, 120])
def test_heuristic_fits_shared_memory(kernel_ptx: Any, arch: int) -> None:
    """The heuristic (what runs untuned, and under capture) fits the arch's shared memory per
    block: ~227 KiB on sm_100, ~99 KiB on sm_120 (a config that does not fit fails at launch)."""
    limit = {100: 232448, 120: 101376}[arch]
    c = importlib.import_module("symheap.gemm._kernels").config(4096, 5120, 8192, arch)
    cfg = dict(BM=c.bm, BN=c.bn, BK=c.bk, GM=c.gm, TMA=c.tma, B_T=False)
    for name, extra in (("ag_gemm_kernel", {"FLAT": False}), ("rs_gemm_kernel", {"HINT": True})):
        shared = kernel_ptx(name, dict(cfg, **extra), warps=c.warps, stages=c.stages, arch=arch)
        assert shared <= limit, f"{name} needs {shared} bytes of shared memory on sm_{arch}"


def test_config_heuristic() -> None:
    """Block sizes are a pure function of the shape and arch (the same on every PE), cached."""
    pytest.importorskip("triton")
    k = importlib.import_module("symheap.gemm._kernels")
    assert k.config(4096, 1280, 8192, 90) == k.config(4096, 1280, 8192, 90)
    c = k.config(16, 8, 8, 90)
    assert (c.bm, c.bn, c.bk, c.tma) == (64, 64, 32, False)
    assert k.config(8192, 8192, 3584, 90)[:3] == (128, 128, 64)
    assert k.config(8192, 8192, 3584, 90).tma and not k.config(8192, 8192, 3584, 80).tma
    # The tuner's candidates: the heuristic's first, all distinct, flags sized for them.
    for op in ("ag", "rs"):
        cands = k.candidates(op, 2048, 5120, 8192, 90)
        assert cands[0] == k.config(2048, 5120, 8192, 90) and len(set(cands)) == len(cands) >= 6
        assert all(c.bm >= 64 and c.bn >= 64 for c in cands)
        assert any(c.flat for c in cands) == (op == "ag")
        assert k.candidates(op, 16, 8, 8, 90) == [k.config(16, 8, 8, 90)]
