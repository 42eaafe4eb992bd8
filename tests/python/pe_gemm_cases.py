"""PE-side cases of symheap.gemm (all_gather_matmul, matmul_reduce_scatter), run by test_gemm.py
through pe_cases.py. On the host backend the tensors are CPU tensors; with SYMHEAP_BACKEND=cuda
the same cases run the Triton kernels on CUDA tensors. Every PE builds every PE's inputs from
one seed (the case name and shape), so each computes the float64 reference of the whole job."""

from __future__ import annotations

import zlib

import symheap
from pe_common import case, raises
from symheap import SymheapUnsupportedError, SymheapValueError

# (rows per PE, N, K): ragged everywhere (not multiples of any tile), tiny and a few tiles.
AG_SHAPES = ((1, 1, 1), (37, 64, 48), (130, 200, 100), (64, 72, 300), (200, 136, 520))
RS_SHAPES = ((1, 1, 1), (37, 64, 48), (130, 200, 100), (64, 72, 190), (150, 136, 200))


def _mods():
    import symheap.gemm as gm
    import symheap.torch as st
    import torch

    return torch, st, gm


def _gen(key: str):
    import torch

    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def _data(key: str, shape, dtype, integer: bool, lo: int = -2, hi: int = 3):
    import torch

    g = _gen(key)
    if integer:
        return torch.randint(lo, hi, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def _b(key: str, k: int, n: int, dtype, integer: bool, transposed: bool, dev, lo: int = -2, hi: int = 3):
    """B (K, N) on ``dev``: row-major, or the transposed view of a row-major (N, K)."""
    if transposed:
        bt = _data(key + "/bt", (n, k), dtype, integer, lo, hi)
        return bt.t(), bt.to(dev).t()
    b = _data(key + "/b", (k, n), dtype, integer, lo, hi)
    return b, b.to(dev)


def _tol(dtype):
    import torch

    return {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-9}[dtype]


def _close(got, want, scale, tol: float, what: str) -> None:
    err = (got.double().cpu() - want).abs()
    bound = tol * (want.abs() + scale) + 1e-6
    bad = int((err > bound).sum())
    assert bad == 0, f"{what}: {bad} of {want.numel()} values off (max error {float(err.max()):.3g})"


def ag_one(name: str, m: int, n: int, k: int, dtype, integer: bool, transposed: bool = False, gathered: bool = False):
    torch, st, gm = _mods()
    me, npes = symheap.my_pe(), symheap.n_pes()
    dev = st.device()
    key = f"{name}/{m}/{n}/{k}/{dtype}"
    a_all = _data(key + "/a", (npes * m, k), dtype, integer)
    b, bd = _b(key, k, n, dtype, integer, transposed, dev)
    shard = a_all[me * m : (me + 1) * m].to(dev)
    out = torch.full((npes * m, n), float("nan"), dtype=dtype, device=dev)  # poisoned
    what = f"{name} all_gather_matmul m={m} n={n} k={k} {dtype} bt={transposed}"
    if gathered:
        g = torch.full((npes * m, k), float("nan"), dtype=dtype, device=dev)
        c, g2 = gm.all_gather_matmul(shard, bd, return_gathered=True, out=out, gathered_out=g)
        assert g2 is g and torch.equal(g.cpu(), a_all), what + ": gathered A differs"
    else:
        c = gm.all_gather_matmul(shard, bd, out=out)
    assert c is out
    ref = a_all.double() @ b.double()
    if integer:
        assert torch.equal(c.cpu(), ref.to(dtype)), what + ": not exact"
    else:
        _close(c, ref, a_all.double().abs() @ b.double().abs(), _tol(dtype), what)


def rs_one(name: str, mb: int, n: int, k: int, dtype, integer: bool, transposed: bool = False):
    torch, st, gm = _mods()
    me, npes = symheap.my_pe(), symheap.n_pes()
    dev = st.device()
    key = f"{name}/{mb}/{n}/{k}/{dtype}"
    # Integer data in {-1, 0, 1} with K <= 256: every partial is exact in bf16 too.
    a_all = _data(key + "/a", (npes, npes * mb, k), dtype, integer, -1, 2)
    bs = [_b(f"{key}/{p}", k, n, dtype, integer, transposed, dev, -1, 2) for p in range(npes)]
    out = torch.full((mb, n), float("nan"), dtype=dtype, device=dev)
    c = gm.matmul_reduce_scatter(a_all[me].to(dev), bs[me][1], out=out)
    assert c is out
    rows = slice(me * mb, (me + 1) * mb)
    ref = sum(a_all[p, rows].double() @ bs[p][0].double() for p in range(npes))
    what = f"{name} matmul_reduce_scatter mb={mb} n={n} k={k} {dtype} bt={transposed}"
    if integer:
        assert torch.equal(c.cpu(), ref.to(dtype)), what + ": not exact"
    else:
        scale = sum(a_all[p, rows].double().abs() @ bs[p][0].double().abs() for p in range(npes))
        _close(c, ref, scale, 2 * _tol(dtype), what)


@case
def case_gemm_exact() -> None:
    """Integer-valued inputs: exact against the float64 reference, ragged shapes, bf16 and
    fp16, B row-major and transposed, the gathered A returned once per dtype."""
    torch = _mods()[0]
    for dtype in (torch.bfloat16, torch.float16):
        for i, (m, n, k) in enumerate(AG_SHAPES):
            ag_one("gemm_exact", m, n, k, dtype, True, transposed=i % 2 == 1, gathered=i == 2)
        for i, (mb, n, k) in enumerate(RS_SHAPES):
            rs_one("gemm_exact", mb, n, k, dtype, True, transposed=i % 2 == 0)


@case
def case_gemm_random() -> None:
    """Random normal inputs within bf16/fp16 tolerance; symmetric inputs; allocated outputs;
    zero rows; a second call of each op after a larger one grew the workspace."""
    torch, st, gm = _mods()
    dev = st.device()
    npes = symheap.n_pes()
    for dtype in (torch.bfloat16, torch.float16):
        ag_one("gemm_random", 130, 200, 100, dtype, False)
        ag_one("gemm_random", 256, 384, 512, dtype, False, transposed=True, gathered=True)
        rs_one("gemm_random", 130, 200, 100, dtype, False)
        rs_one("gemm_random", 256, 384, 512, dtype, False, transposed=True)
    ag_one("gemm_random", 37, 64, 48, torch.bfloat16, False)
    rs_one("gemm_random", 37, 64, 48, torch.bfloat16, False)
    # Symmetric inputs, outputs allocated by the call.
    a = st.empty(8, 64, dtype=torch.bfloat16)
    a.fill_(1.0)
    b = st.empty(64, 16, dtype=torch.bfloat16)
    b.fill_(0.5)
    c = gm.all_gather_matmul(a, b)
    assert c.shape == (npes * 8, 16) and bool((c == 32).all())
    a2 = st.empty(npes * 4, 64, dtype=torch.bfloat16)
    a2.fill_(1.0)
    r = gm.matmul_reduce_scatter(a2, b)
    assert r.shape == (4, 16) and bool((r == 32 * npes).all())
    z = torch.empty(0, 64, dtype=torch.bfloat16, device=dev)
    assert gm.all_gather_matmul(z, b.clone()).shape == (0, 16)
    assert gm.matmul_reduce_scatter(z, b.clone()).shape == (0, 16)
    for t in (a, b, a2):
        st.free(t)


@case
def case_gemm_errors() -> None:
    """Argument errors raise SymheapValueError / SymheapUnsupportedError before any collective
    step, on every PE; a real call works afterwards."""
    torch, st, gm = _mods()
    dev = st.device()
    bf = torch.bfloat16
    a = torch.zeros(4, 32, dtype=bf, device=dev)
    b = torch.zeros(32, 8, dtype=bf, device=dev)
    for f in (gm.all_gather_matmul, gm.matmul_reduce_scatter):
        raises(SymheapValueError, f, a.float(), b.float())
        raises(SymheapValueError, f, a, b.half())
        raises(SymheapValueError, f, a, torch.zeros(31, 8, dtype=bf, device=dev))
        raises(SymheapValueError, f, a.reshape(2, 2, 32), b)
        raises(SymheapUnsupportedError, f, a, b, 1)
        raises(SymheapValueError, f, a, b.to("cpu" if dev.type == "cuda" else "meta"))
        raises(SymheapValueError, f, a, b, out=torch.empty(3, 8, dtype=bf, device=dev))
        if symheap.n_pes() > 1:
            sub = symheap.team_split_strided(None, 0, 1, 1)
            raises(SymheapUnsupportedError, f, a, b, team=sub)
    raises(SymheapValueError, gm.all_gather_matmul, a, b, gathered_out=torch.empty(4, 32, dtype=bf, device=dev))
    raises(SymheapUnsupportedError, gm.matmul_reduce_scatter, a, b, 0, "max")
    if symheap.n_pes() > 1:
        odd = torch.zeros(symheap.n_pes() + 1, 32, dtype=bf, device=dev)
        raises(SymheapValueError, gm.matmul_reduce_scatter, odd, b)
    ag_one("gemm_errors", 5, 16, 32, bf, True)
    rs_one("gemm_errors", 5, 16, 32, bf, True)


def _module(gm, torch):
    class TPBlock(torch.nn.Module):
        """A sequence-parallel MLP: all_gather + up projection, down projection +
        reduce_scatter."""

        def __init__(self, w1, w2):
            super().__init__()
            self.w1 = torch.nn.Parameter(w1, requires_grad=False)
            self.w2 = torch.nn.Parameter(w2, requires_grad=False)

        def forward(self, x):
            h = gm.all_gather_matmul(x * 1, self.w1.t())
            return gm.matmul_reduce_scatter(h * 2, self.w2) + 1

    return TPBlock


@case
def case_gemm_op() -> None:
    """The custom ops: registered under symheap::, opcheck (schema, fake kernel, AOT dispatch),
    and torch.compile(fullgraph=True) of a small tensor-parallel block with no graph break,
    equal to eager and to the float64 reference."""
    torch, st, gm = _mods()
    me, npes = symheap.my_pe(), symheap.n_pes()
    dev = st.device()
    bf = torch.bfloat16
    a = _data("gemm_op/a", (6, 32), bf, True).to(dev)
    b = _data("gemm_op/b", (32, 24), bf, True).to(dev)
    ag = torch.ops.symheap.all_gather_matmul.default
    out = torch.empty(npes * 6, 24, dtype=bf, device=dev)
    g = torch.empty(npes * 6, 32, dtype=bf, device=dev)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ag, (a, b, out, g, True, -1), test_utils=utils)
    rs = torch.ops.symheap.matmul_reduce_scatter.default
    a2 = _data("gemm_op/a2", (npes * 3, 32), bf, True).to(dev)
    torch.library.opcheck(rs, (a2, b, torch.empty(3, 24, dtype=bf, device=dev), -1), test_utils=utils)
    x_all = _data("gemm_op/x", (npes * 5, 16), bf, True, -1, 2)
    w1 = _data("gemm_op/w1", (24, 16), bf, True, -1, 2)  # (hidden, in): used as w1.t()
    w2 = _data("gemm_op/w2", (24, 8), bf, True, -1, 2)
    mod = _module(gm, torch)(w1.to(dev), w2.to(dev))
    x = x_all[me * 5 : (me + 1) * 5].to(dev)
    eager = mod(x)
    for backend in ("aot_eager",) + (("inductor",) if dev.type == "cuda" else ()):
        torch._dynamo.reset()
        ex = torch._dynamo.explain(mod)(x)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, (backend, ex.break_reasons)
        comp = torch.compile(mod, fullgraph=True, backend=backend)
        for _ in range(2):
            assert torch.equal(comp(x), eager), backend
    h = (x_all.double() @ w1.double().t()).to(bf).double() * 2
    # h and w2 are the same on every PE: each partial is h @ w2 rounded to bf16, the sum n times it.
    ref = (npes * (h @ w2.double()).to(bf).double()).to(bf).double()[me * 5 : (me + 1) * 5]
    assert torch.equal(eager.cpu().double(), (ref + 1).to(bf).double())


@case
def case_gemm_cuda_graph() -> None:
    """CUDA only: both ops captured in one CUDA graph, replayed 10 times with new integer inputs
    copied in between (exact each time); eager calls again afterwards (the device-side epochs
    went on advancing through the replays)."""
    torch, st, gm = _mods()
    me, npes = symheap.my_pe(), symheap.n_pes()
    dev = st.device()
    bf = torch.bfloat16
    # K = 104: 16-byte rows, so on sm_90 the kernels' TMA descriptors are what the graph captures.
    m, n, k = 130, 200, 104
    a = torch.zeros(m, k, dtype=bf, device=dev)
    b = torch.zeros(k, n, dtype=bf, device=dev)
    a2 = torch.zeros(npes * m, k, dtype=bf, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            gm.all_gather_matmul(a, b, return_gathered=True)
            gm.matmul_reduce_scatter(a2, b)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c, g = gm.all_gather_matmul(a, b, return_gathered=True)
        r = gm.matmul_reduce_scatter(a2, b)
    for rep in range(10):
        a_all = _data(f"gemm_graph/{rep}/a", (npes * m, k), bf, True, -1, 2)
        bb = _data(f"gemm_graph/{rep}/b", (k, n), bf, True, -1, 2)
        a2_all = _data(f"gemm_graph/{rep}/a2", (npes, npes * m, k), bf, True, -1, 2)
        a.copy_(a_all[me * m : (me + 1) * m])
        b.copy_(bb)
        a2.copy_(a2_all[me])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(g.cpu(), a_all), f"replay {rep}: gathered A differs"
        assert torch.equal(c.cpu(), (a_all.double() @ bb.double()).to(bf)), f"replay {rep}: all_gather_matmul"
        rows = slice(me * m, (me + 1) * m)
        ref = sum(a2_all[p, rows].double() for p in range(npes)) @ bb.double()
        assert torch.equal(r.cpu(), ref.to(bf)), f"replay {rep}: matmul_reduce_scatter"
    del graph
    ag_one("gemm_graph_after", m, n, k, bf, True)
    rs_one("gemm_graph_after", m, n, k, bf, True)
    torch.cuda.synchronize()
    symheap.barrier_all()


def _tune_dirs(tune, tag: str):
    """Per-PE disk caches under the test's directory (PEs of one machine would otherwise share
    one, and the case checks what each PE's own cache holds)."""
    import os

    me = symheap.my_pe()
    os.environ["SYMHEAP_CACHE_DIR"] = os.path.join(os.environ["SYMHEAP_TEST_TMP"], tag, f"pe{me}")
    tune.forget()
    return tune.cache_dir()


@case
def case_gemm_tune_agree() -> None:
    """The tuner's agreement step at n PEs (host collectives; no GPU needed): every PE times a
    different winner, every PE takes PE 0's and writes it to its own disk cache; then, with the
    in-memory table dropped, PE 0's cache entry is used without timing, also by a PE whose own
    cache lost it; a bad SYMHEAP_GEMM_TUNE is refused."""
    import os

    import symheap._shmem as shmem
    import symheap.gemm._kernels as k
    import symheap.gemm._tune as tune

    me, npes = symheap.my_pe(), symheap.n_pes()
    d = _tune_dirs(tune, "agree")
    cands = [k.Config(128, 128, 64, 8, 4, 8, True), k.Config(128, 256, 64, 8, 3, 8, True), k.Config(64, 64, 32, 4, 3)]
    # PE p finds candidate p % 3 fastest: only PE 0's pick may win.
    times = [(c, 1.0 if i == me % 3 else 2.0 + i) for i, c in enumerate(cands)]
    key = ("ag", 1000, 512, 512, "torch.bfloat16", False, npes, 90, 132)
    got = tune._agree(key, "k1", lambda: times, cands[2])
    assert got == cands[0], f"PE {me} launched {got}, PE 0 timed {cands[0]} fastest"
    assert (d / "k1.json").is_file(), "the choice was not written to this PE's cache"
    assert tune.history()[-1]["source"] == "tuned"
    picks = shmem.all_gather_object_bytes(repr(tuple(got)).encode())
    assert len(set(picks)) == 1, f"PEs disagree: {picks}"
    tune.forget()
    if me != 0:
        (d / "k1.json").unlink()

    def never():
        raise AssertionError("timed again although PE 0's cache holds the key")

    assert tune._agree(key, "k1", never, cands[2]) == cands[0]
    assert tune.history()[-1]["source"] == "cache" and (d / "k1.json").is_file()
    # All PEs time when PE 0's entry is missing or unreadable, even if another PE has one.
    if me == 0:
        (d / "k1.json").write_text("{not json")
    tune.forget()
    again = [(c, 1.0 if i == 1 else 3.0) for i, c in enumerate(cands)]
    assert tune._agree(key, "k1", lambda: again, cands[2]) == cands[1]
    # Every candidate failing on PE 0: the heuristic, on every PE.
    fails = [(c, float("inf")) for c in cands] if me == 0 else times
    assert tune._agree(key, "k2", lambda: fails, cands[2]) == cands[2]
    # The cuBLAS engine wins like a tile choice, and survives the JSON of the exchange and cache.
    ce = [(k.CUBLAS, 1.0), (cands[0], 2.0)]
    assert tune._agree(key, "k3", lambda: ce, cands[0]) == k.CUBLAS
    tune.forget()
    assert tune._agree(key, "k3", never, cands[0]) == k.CUBLAS
    os.environ["SYMHEAP_GEMM_TUNE"] = "sometimes"
    assert "SYMHEAP_GEMM_TUNE" in str(raises(SymheapValueError, tune.mode))
    os.environ["SYMHEAP_GEMM_TUNE"] = "0"
    assert tune.mode() == "0"
    del os.environ["SYMHEAP_GEMM_TUNE"]
    assert tune.mode() == "auto"
    tune.forget()


@case
def case_gemm_tuned() -> None:
    """CUDA only, SYMHEAP_GEMM_TUNE=1: the first call of each shape times the candidates on
    every PE and every PE launches PE 0's choice (exact results, random-data tolerance, B
    row-major and transposed); after the in-memory table is dropped the same calls take the
    choice from PE 0's disk cache without timing."""
    import os

    import symheap._shmem as shmem
    import symheap.gemm._kernels as gk
    import symheap.gemm._tune as tune

    torch = _mods()[0]
    _tune_dirs(tune, "tuned")
    os.environ["SYMHEAP_GEMM_TUNE"] = "1"
    shapes = ((256, 384, 512), (200, 264, 520))
    for rnd in range(2):
        for i, (m, n, k) in enumerate(shapes):
            ag_one("gemm_tuned", m, n, k, torch.bfloat16, True, transposed=i == 1)
            rs_one("gemm_tuned", m, n, k, torch.bfloat16, False, transposed=i == 0)
        hist = tune.history()
        want = "tuned" if rnd == 0 else "cache"
        assert len(hist) == 4 and all(h["source"] == want for h in hist), [(h["key"], h["source"]) for h in hist]
        mine = repr([(h["key"][:4], tuple(h["config"])) for h in hist]).encode()
        assert len(set(shmem.all_gather_object_bytes(mine))) == 1, "PEs launched different configs"
        if rnd == 0:
            assert all(len(h["times_us"]) >= 2 for h in hist), "fewer than two candidates timed"
            ce = str(tuple(gk.CUBLAS))
            assert all((ce in h["times_us"]) == (h["key"][0] == "ag") for h in hist), "cuBLAS engine not timed"
            tune.forget()
    del os.environ["SYMHEAP_GEMM_TUNE"]
