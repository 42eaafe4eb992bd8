"""PE-side cases of symheap.fused (fused all_reduce + residual + RMSNorm), run by test_fused.py
through pe_cases.py. On the host backend the tensors are CPU tensors; with SYMHEAP_BACKEND=cuda
the same cases run the Triton kernel on CUDA tensors. Every PE builds every PE's inputs from one
seed (the case name), so each can compute the float64 reference of the whole job."""

from __future__ import annotations

import functools
import os
import zlib

import symheap
from pe_common import case, raises
from symheap import SymheapUnsupportedError, SymheapValueError

EPS = 1e-6
TOKENS = (1, 3, 17, 128)
HIDDEN = (1024, 4096, 8192)


def _torch():
    import symheap.fused as fu
    import symheap.torch as st
    import torch

    return torch, st, fu


def _gen(name: str):
    import torch

    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def _inputs(name: str, t: int, h: int, dtype, integer: bool):
    """(x of every PE, residual, weight) on the CPU, in ``dtype``."""
    import torch

    n = symheap.n_pes()
    g = _gen(f"{name}/{t}/{h}/{dtype}")
    if integer:
        xs = torch.randint(-4, 5, (n, t, h), generator=g).to(dtype)
        res = torch.randint(-8, 9, (t, h), generator=g).to(dtype)
        w = torch.ones(h, dtype=dtype)
    else:
        xs = torch.randn(n, t, h, generator=g).to(dtype)
        res = torch.randn(t, h, generator=g).to(dtype)
        w = (1 + 0.25 * torch.randn(h, generator=g)).to(dtype)
    return xs, res, w


def reference(xs, res, w, dtype):
    """float64 reference: (y in float64 before the output rounding, residual_out in dtype)."""
    import torch

    r = (xs.double().sum(0) + res.double()).to(dtype)
    rf = r.double()
    y = rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
    return y, r


def _tol(dtype):
    import torch

    # One rounding to the output dtype plus fp32 vs float64 arithmetic.
    return {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]


def _check_close(got, want, rtol, what: str) -> None:
    err = (got.double().cpu() - want).abs()
    bound = rtol * want.abs() + rtol
    bad = int((err > bound).sum())
    assert bad == 0, f"{what}: {bad} of {want.numel()} values off (max error {float(err.max()):.3g})"


def _run_one(name: str, t: int, h: int, dtype, integer: bool) -> None:
    torch, st, fu = _torch()
    me = symheap.my_pe()
    dev = st.device()
    xs, res, w = _inputs(name, t, h, dtype, integer)
    y, r = reference(xs, res, w, dtype)
    out = torch.full((t, h), float("nan"), dtype=dtype, device=dev)  # poisoned
    ro = torch.full((t, h), float("nan"), dtype=dtype, device=dev)
    o2, r2 = fu.all_reduce_residual_rmsnorm(xs[me].to(dev), res.to(dev), w.to(dev), EPS, out=out, residual_out=ro)
    assert o2 is out and r2 is ro
    what = f"{name} t={t} h={h} {dtype}"
    if integer:
        assert torch.equal(ro.cpu(), r), f"{what}: residual_out is not exact"
    else:
        _check_close(ro, r.double(), _tol(dtype), what + " residual_out")
    _check_close(out, y, _tol(dtype), what + " out")


@case
def case_fused_exact() -> None:
    """Integer-valued x and residual, weight 1: residual_out exact, out within one rounding."""
    torch = _torch()[0]
    for dtype in (torch.bfloat16, torch.float16):
        for h in HIDDEN:
            for t in TOKENS:
                _run_one("fused_exact", t, h, dtype, True)


@case
def case_fused_random() -> None:
    """Random normal inputs and weight, within bf16/fp16 tolerance of the float64 reference;
    hidden 16384 once, a hidden size that is no power of two, 0 tokens, 300 tokens, after
    reserve() grew the workspace."""
    torch, st, fu = _torch()
    fu.reserve(256, 8192, torch.bfloat16)  # collective; grows the workspace past its default
    for dtype in (torch.bfloat16, torch.float16):
        for h, t in ((1024, 17), (4096, 3), (8192, 128), (8192, 1)):
            _run_one("fused_random", t, h, dtype, False)
    _run_one("fused_random", 3, 16384, torch.bfloat16, False)
    _run_one("fused_random", 5, 1000, torch.float16, False)
    _run_one("fused_random", 300, 2048, torch.bfloat16, False)  # more rows than CTAs on a GPU
    dev = st.device()
    z = torch.empty(0, 1024, dtype=torch.bfloat16, device=dev)
    o, r = fu.all_reduce_residual_rmsnorm(z, z, torch.ones(1024, dtype=torch.bfloat16, device=dev))
    assert o.shape == (0, 1024) and r.shape == (0, 1024)


def _fp8_check(name: str, mode: str, t: int, h: int, dtype) -> None:
    torch, st, fu = _torch()
    me = symheap.my_pe()
    dev = st.device()
    xs, res, w = _inputs(name, t, h, dtype, False)
    y, r = reference(xs, res, w, dtype)
    if mode == "per_tensor":
        s_ref = torch.full((1,), float(y.abs().max()) / 448.0 * 1.25, dtype=torch.float32)
        out, ro = fu.all_reduce_residual_rmsnorm(
            xs[me].to(dev), res.to(dev), w.to(dev), EPS, fp8="per_tensor", scale=s_ref.to(dev)
        )
        s = s_ref.double().reshape(1, 1)
    else:
        out, ro, s = fu.all_reduce_residual_rmsnorm(xs[me].to(dev), res.to(dev), w.to(dev), EPS, fp8="per_token")
        assert s.shape == (t, 1) and s.dtype == torch.float32
        s_want = y.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
        _check_close(s, s_want, 2.0**-6, f"{name} per-token scale")
        s = s.double().cpu()
    assert out.dtype == torch.float8_e4m3fn and out.shape == (t, h)
    _check_close(ro, r.double(), _tol(dtype), f"{name} residual_out")
    deq = out.cpu().double() * s
    # e4m3: 3 mantissa bits (relative step 2^-3, rounding half of it), subnormals below 2^-6.
    err = (deq - y).abs()
    bound = 2.0**-3 * y.abs() + 2.0**-9 * s + 2.0**-7 * y.abs()
    bad = int((err > bound).sum())
    assert bad == 0, f"{name} {mode} t={t} h={h}: {bad} values off (max {float(err.max()):.3g})"


@case
def case_fused_fp8() -> None:
    """FP8 e4m3 output, per-tensor (given scale) and per-token (computed scale), dequantised
    against the float64 reference within e4m3's rounding."""
    torch = _torch()[0]
    for mode in ("per_tensor", "per_token"):
        for dtype in (torch.bfloat16, torch.float16):
            for t, h in ((1, 8192), (17, 4096)):
                _fp8_check("fused_fp8", mode, t, h, dtype)


@case
def case_fused_errors() -> None:
    """Argument errors raise SymheapValueError (before any collective step, on every PE)."""
    torch, st, fu = _torch()
    f = fu.all_reduce_residual_rmsnorm
    dev = st.device()
    bf = torch.bfloat16
    x = torch.zeros(4, 1024, dtype=bf, device=dev)
    w = torch.ones(1024, dtype=bf, device=dev)
    raises(SymheapValueError, f, x, torch.zeros(3, 1024, dtype=bf, device=dev), w)  # residual shape
    raises(SymheapValueError, f, x, x, torch.ones(512, dtype=bf, device=dev))  # hidden != weight
    raises(SymheapValueError, f, x.float(), x.float(), w.float())  # wrong dtype
    raises(SymheapValueError, f, x, x.half(), w)  # mixed dtypes
    raises(SymheapValueError, f, x, x, w.half())
    raises(SymheapValueError, f, x.reshape(4, 1, 1024), x.reshape(4, 1, 1024), w)  # not 2-D
    raises(SymheapValueError, f, x, x, w, fp8="e5m2")
    raises(SymheapValueError, f, x, x, w, fp8="per_tensor")  # no scale
    raises(SymheapValueError, f, x, x, w, fp8="per_tensor", scale=torch.ones(2, device=dev))
    raises(SymheapValueError, f, x, x, w, scale=torch.ones(1, device=dev))  # scale without fp8
    raises(SymheapValueError, f, x, x, w, out=torch.empty(4, 1024, dtype=torch.float16, device=dev))
    raises(SymheapValueError, f, x, x, w, residual_out=torch.empty(4, 1000, dtype=bf, device=dev))
    raises(SymheapValueError, f, x, x, w, fp8="per_token", out=torch.empty_like(x))  # out not fp8
    other = "cpu" if dev.type == "cuda" else "meta"
    raises(SymheapValueError, f, x, x, w.to(other))  # devices differ
    if symheap.n_pes() > 1:
        sub = symheap.team_split_strided(None, 0, 1, 1)
        raises(SymheapUnsupportedError, f, x, x, w, team=sub)
    if dev.type == "cuda":
        big = torch.zeros(1, 32768, dtype=bf, device=dev)
        raises(SymheapUnsupportedError, f, big, big, torch.ones(32768, dtype=bf, device=dev))
    # Still in step after the errors: a real call works on every PE.
    _run_one("fused_errors", 2, 1024, bf, True)


def _small_module(fu, torch):
    class Tail(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.w = torch.nn.Parameter(w, requires_grad=False)

        def forward(self, x, res):
            y = x * 2
            out, ro = fu.all_reduce_residual_rmsnorm(y, res, self.w, EPS)
            return out + 1, ro

    return Tail


@case
def case_fused_op() -> None:
    """The custom op: registered under symheap::, opcheck (schema, fake kernel, AOT dispatch),
    and torch.compile(fullgraph=True) of a small module with no graph break, matching eager."""
    torch, st, fu = _torch()
    me = symheap.my_pe()
    dev = st.device()
    bf = torch.bfloat16
    op = torch.ops.symheap.fused_all_reduce_rmsnorm.default
    xs, res, w = _inputs("fused_op", 5, 1024, bf, True)
    x, r, wd = xs[me].to(dev), res.to(dev), w.to(dev)
    args = (x, r, wd, EPS, torch.empty_like(x), torch.empty_like(x), None, torch.empty(0, 1, device=dev), 0, -1)
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    mod = _small_module(fu, torch)(wd)
    eager = mod(x, r)
    # Inductor on CUDA always; on the host backend where the test asks (its C++ build is slow
    # with a cold cache, several PEs at once).
    inductor = dev.type == "cuda" or os.environ.get("FUSED_INDUCTOR") == "1"
    backends = ["aot_eager"] + (["inductor"] if inductor else [])
    for backend in backends:
        torch._dynamo.reset()
        ex = torch._dynamo.explain(mod)(x, r)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, (backend, ex.break_reasons)
        comp = torch.compile(mod, fullgraph=True, backend=backend)
        for _ in range(2):
            got = comp(x, r)
            assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1]), backend
    y, rr = reference(2 * xs, res, w, bf)
    assert torch.equal(eager[1].cpu(), rr)
    _check_close(eager[0].float() - 1, y, 2.0**-6, "compiled module out")


@case
def case_fused_cuda_graph() -> None:
    """CUDA only: the call captured in a CUDA graph, replayed 20 times with new inputs copied in
    between (exact residual_out, out within tolerance each time), then eager calls again (the
    device-side epoch went on advancing through the replays)."""
    torch, st, fu = _torch()
    me = symheap.my_pe()
    dev = st.device()
    for dtype, t, h, mode in ((torch.bfloat16, 8, 8192, None), (torch.float16, 3, 4096, "per_token")):
        x = torch.zeros(t, h, dtype=dtype, device=dev)
        res = torch.zeros(t, h, dtype=dtype, device=dev)
        w = torch.ones(h, dtype=dtype, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # warm-up: compile, workspace
                fu.all_reduce_residual_rmsnorm(x, res, w, EPS, fp8=mode)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = fu.all_reduce_residual_rmsnorm(x, res, w, EPS, fp8=mode)
        for rep in range(20):
            xs, rs, ws = _inputs(f"fused_graph/{rep}", t, h, dtype, True)
            x.copy_(xs[me])
            res.copy_(rs)
            w.copy_(ws)
            g.replay()
            torch.cuda.synchronize()
            y, r = reference(xs, rs, ws, dtype)
            assert torch.equal(outs[1].cpu(), r), f"replay {rep}: residual_out differs"
            if mode is None:
                _check_close(outs[0], y, _tol(dtype), f"replay {rep} out")
            else:
                deq = outs[0].cpu().double() * outs[2].cpu().double()
                assert float(((deq - y).abs() - 0.2 * y.abs() - 1e-3).max()) <= 0, f"replay {rep} fp8"
        del g
        _run_one("fused_graph_after", t, h, dtype, True)
    torch.cuda.synchronize()
    symheap.barrier_all()


def _time_graph(torch, fn, iters: int = 50, trials: int = 5) -> float:
    """Median over trials of (a CUDA graph of ``iters`` calls) / iters, in microseconds."""
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
    times = []
    for _ in range(trials):
        symheap.barrier_all()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    times.sort()
    return times[len(times) // 2]


def _unfused(torch, xs, res, w):
    symheap.all_reduce(xs)
    ro = xs + res
    return torch.nn.functional.rms_norm(ro, (xs.shape[-1],), w, EPS), ro


@case
def case_fused_bench() -> None:
    """CUDA only: the fused kernel vs symheap all_reduce + torch RMSNorm, CUDA-graph median of
    50 launches / 50, tokens 1, 8, 32, 128 x hidden 8192 bf16."""
    torch, st, fu = _torch()
    me, n = symheap.my_pe(), symheap.n_pes()
    dev = st.device()
    h = 8192
    rows = []
    for t in (1, 8, 32, 128):
        x = torch.randn(t, h, dtype=torch.bfloat16, device=dev)
        res = torch.randn(t, h, dtype=torch.bfloat16, device=dev)
        w = torch.ones(h, dtype=torch.bfloat16, device=dev)
        xs = st.empty(t, h, dtype=torch.bfloat16)
        xs.copy_(x)
        fused = _time_graph(torch, functools.partial(fu.all_reduce_residual_rmsnorm, x, res, w, EPS))
        base = _time_graph(torch, functools.partial(_unfused, torch, xs, res, w))
        rows.append((t, fused, base))
    if me == 0:
        print(f"fused bench, {n} PEs sharing one GPU: not a speed comparison with peers", flush=True)
        print("| tokens x 8192 bf16 | fused (us) | symheap all_reduce + torch add + rms_norm (us) | ratio |")
        for t, a, b in rows:
            print(f"| {t} | {a:.2f} | {b:.2f} | {b / a:.2f}x |", flush=True)
    symheap.barrier_all()
