"""PE side of test_tdist.py, under the launcher: torch.distributed with the ``symheap`` backend
(``dist.init_process_group("cpu:symheap")``), every collective through ``dist.*`` on random data
of every dtype, exact against values each rank computes from every rank's seeded data.
``argv[1]``: ``all`` (the checks, prints ``PASS tdist``), ``diverge`` (ranks make different
calls), ``dead`` (the last rank dies), ``dead-group`` (the last rank dies before a ``new_group``
of it and others), ``late-group`` (it lives but never calls ``new_group``), ``gloo``
(``cpu:gloo,cuda:symheap``: CPU tensors go to gloo), ``records`` (CUDA: which collectives note
their stream use, see :func:`run_records`). ``argv[2]``: ``cpu`` (default) or ``cuda``:
the same checks on CUDA tensors over ``cuda:symheap`` (rank r on GPU ``LOCAL_RANK`` mod the GPU
count, made torch's default device; seeded data is drawn on the CPU and moved). Not collected by
pytest."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, List

import symheap
import symheap.distributed as sd
import torch
import torch.distributed as dist
from symheap import SymheapError, SymheapMismatchError, SymheapPeerError, SymheapUnsupportedError

R = dist.ReduceOp
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def data(rank: int, salt: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s tensor for check ``salt``: small integers (exact in every dtype's sums
    of a few ranks), wide for the integer types' wrapping checks."""
    return cpu_data(rank, salt, shape, dtype).to(torch.get_default_device())


def cpu_data(rank: int, salt: int, shape, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 7919 + salt * 104729)
    c = {"generator": g, "device": "cpu"}
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, **c).bool()
    if dtype in INTS:
        info = torch.iinfo(dtype)
        return torch.randint(max(info.min, -(1 << 40)), min(info.max, 1 << 40), shape, dtype=torch.int64, **c).to(dtype)
    if dtype in FLOAT8:
        return torch.randint(-8, 8, shape, **c).to(torch.float32).to(dtype)
    if dtype.is_complex:
        re, im = torch.randint(-50, 50, shape, **c).double(), torch.randint(-50, 50, shape, **c).double()
        return torch.complex(re, im).to(dtype)
    return torch.randint(-50, 50, shape, **c).to(dtype)


def fold(xs: List[torch.Tensor], fn: Callable) -> torch.Tensor:
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = fn(acc, x)
    return acc


def expect(op, xs: List[torch.Tensor]) -> torch.Tensor:
    """The reduction torch means, computed here in the tensors' own dtype (integers wrap)."""
    if xs[0].dtype == torch.bool:
        u = [x.to(torch.uint8) for x in xs]
        f = {R.SUM: torch.maximum, R.MAX: torch.maximum, R.PRODUCT: torch.minimum, R.MIN: torch.minimum}[op]
        return fold(u, f).bool()
    if op == R.SUM:
        return fold(xs, lambda a, b: a + b)
    if op == R.PRODUCT:
        return fold(xs, lambda a, b: a * b)
    if op == R.MIN:
        return fold(xs, torch.minimum)
    if op == R.MAX:
        return fold(xs, torch.maximum)
    if op == R.AVG:
        return fold(xs, lambda a, b: a + b) / len(xs)
    raise AssertionError(op)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.dtype in FLOAT8:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    assert torch.equal(got, want), f"{what}: got {got.flatten()[:8]} want {want.flatten()[:8]}"


def poisoned(like: torch.Tensor, shape=None) -> torch.Tensor:
    t = torch.empty(like.shape if shape is None else shape, dtype=like.dtype)
    t.view(-1).view(torch.uint8)[:] = 0xAB if t.numel() else 0
    return t


def check_all_reduce(r: int, n: int) -> None:
    salt = 0
    for dt in [*INTS, *FLOATS, torch.bool, torch.complex64]:
        ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
        if dt.is_floating_point:
            ops.append(R.AVG)
        if dt.is_complex:
            ops = [R.SUM, R.AVG]
        for op in ops:
            salt += 1
            shape = (3, 5) if salt % 2 else (17,)
            xs = [data(q, salt, shape, dt) for q in range(n)]
            if op == R.PRODUCT and dt.is_floating_point:
                xs = [x.clamp(-3, 3) for x in xs]
            t = xs[r].clone()
            dist.all_reduce(t, op=op)
            want = expect(op, xs)
            if op == R.AVG:
                # Sum (exact: small integers), then one division in the dtype (complex: of
                # each part, as the backend reduces the real pairs).
                total = fold(xs, lambda a, b: a + b)
                want = torch.view_as_complex(torch.view_as_real(total) / n) if dt.is_complex else (total / n).to(dt)
            same(t, want.to(dt), f"all_reduce {op} {dt}")
    # float64 is reduced in float64: sums that float32 would round are exact.
    xs = [torch.full((9,), 1.0 + (q + 1) * 2.0**-40, dtype=torch.float64) for q in range(n)]
    t = xs[r].clone()
    dist.all_reduce(t)
    same(t, fold(xs, lambda a, b: a + b), "all_reduce float64 exact")
    # PREMUL_SUM (FSDP's gradient scaling): factor * sum.
    xs = [data(q, 901, (8,), torch.float32) for q in range(n)]
    t = xs[r].clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    same(t, fold([x * 0.5 for x in xs], lambda a, b: a + b), "all_reduce premul_sum")
    # A non-contiguous tensor is reduced in place.
    xs = [data(q, 902, (6, 4), torch.int32) for q in range(n)]
    t = xs[r].clone().t()
    dist.all_reduce(t)
    same(t, fold(xs, lambda a, b: a + b).t(), "all_reduce non-contiguous")


def check_gathers(r: int, n: int) -> None:
    for k, dt in enumerate([torch.float32, torch.bfloat16, torch.int64, torch.bool, *FLOAT8, torch.complex128]):
        xs = [data(q, 100 + k, (2, 3), dt) for q in range(n)]
        out = poisoned(xs[0], (2 * n, 3))
        dist.all_gather_into_tensor(out, xs[r])
        same(out, torch.cat(xs), f"all_gather_into_tensor {dt}")
        # In place, as FSDP2 gathers: the input is this rank's block of the output.
        out = poisoned(xs[0], (2 * n, 3))
        out[2 * r : 2 * r + 2].copy_(xs[r])
        dist.all_gather_into_tensor(out, out[2 * r : 2 * r + 2])
        same(out, torch.cat(xs), f"all_gather_into_tensor in place {dt}")
        outs = [poisoned(xs[0]) for _ in range(n)]
        dist.all_gather(outs, xs[r])
        for q in range(n):
            same(outs[q], xs[q], f"all_gather list {dt}")
        b = data(r, 200 + k, (5,), dt)
        for root in range(n):
            t = b.clone() if r == root else poisoned(b)
            dist.broadcast(t, src=root)
            same(t, data(root, 200 + k, (5,), dt), f"broadcast {dt} root {root}")
    # Coalesced (as FSDP2 issues them): torch's coalescing manager reaches
    # allgather_into_tensor_coalesced.
    xs = [[data(q, 300 + j, (4,), torch.float32) for j in range(3)] for q in range(n)]
    outs = [torch.empty(4 * n) for _ in range(3)]
    with dist._coalescing_manager():
        for j in range(3):
            dist.all_gather_into_tensor(outs[j], xs[r][j])
    for j in range(3):
        same(outs[j], torch.cat([xs[q][j] for q in range(n)]), "all_gather coalesced")


def check_scatters(r: int, n: int) -> None:
    for k, dt in enumerate([torch.float32, torch.bfloat16, torch.int16, torch.float64, torch.bool]):
        ops = [R.SUM, R.MAX] + ([R.AVG] if dt.is_floating_point else [])
        for op in ops:
            xs = [data(q, 400 + k, (3 * n, 2), dt) for q in range(n)]
            full = expect(op, xs) if op != R.AVG else (fold(xs, lambda a, b: a + b) / n).to(dt)
            want = full[3 * r : 3 * r + 3].to(dt)
            out = poisoned(xs[0], (3, 2))
            dist.reduce_scatter_tensor(out, xs[r], op=op)
            same(out, want, f"reduce_scatter_tensor {op} {dt}")
            # In place: the output is this rank's block of the input.
            inp = xs[r].clone()
            dist.reduce_scatter_tensor(inp[3 * r : 3 * r + 3], inp, op=op)
            same(inp[3 * r : 3 * r + 3], want, f"reduce_scatter_tensor in place {op} {dt}")
            out = poisoned(xs[0], (3, 2))
            dist.reduce_scatter(out, list(xs[r].chunk(n)), op=op)
            same(out, want, f"reduce_scatter list {op} {dt}")
    xs = [[data(q, 500 + j, (2 * n,), torch.float32) for j in range(2)] for q in range(n)]
    outs = [torch.empty(2) for _ in range(2)]
    with dist._coalescing_manager():
        for j in range(2):
            dist.reduce_scatter_tensor(outs[j], xs[r][j])
    for j in range(2):
        same(outs[j], fold([xs[q][j] for q in range(n)], lambda a, b: a + b)[2 * r : 2 * r + 2], "rs coalesced")
    ys = [[data(q, 510 + j, (3,), torch.int32) for j in range(2)] for q in range(n)]
    ts = [ys[r][j].clone() for j in range(2)]
    with dist._coalescing_manager():
        for t in ts:
            dist.all_reduce(t)
    for j in range(2):
        same(ts[j], fold([ys[q][j] for q in range(n)], lambda a, b: a + b), "all_reduce coalesced")


def check_rooted(r: int, n: int) -> None:
    for root in range(n):
        xs = [data(q, 600 + root, (7,), torch.int64) for q in range(n)]
        t = xs[r].clone()
        dist.reduce(t, dst=root)
        same(t, fold(xs, lambda a, b: a + b) if r == root else xs[r], f"reduce root {root}")
        outs = [poisoned(xs[0]) for _ in range(n)] if r == root else None
        dist.gather(xs[r], gather_list=outs, dst=root)
        if r == root:
            for q in range(n):
                same(outs[q], xs[q], f"gather root {root}")
        parts = [data(q, 700 + root, (2, 2), torch.float16) for q in range(n)]
        out = poisoned(parts[0])
        dist.scatter(out, scatter_list=[p.clone() for p in parts] if r == root else None, src=root)
        same(out, parts[r], f"scatter root {root}")


def split_matrix(n: int, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(salt)
    m = torch.randint(0, 6, (n, n), generator=g, device="cpu")
    m[torch.rand((n, n), generator=g, device="cpu") < 0.3] = 0
    return m


def rows(i: int, j: int, k: int, salt: int) -> torch.Tensor:
    base = (salt * 1000 + i * 31 + j) * 100
    return torch.arange(base, base + k * 3, dtype=torch.int64).view(k, 3)


def check_alltoall(r: int, n: int) -> None:
    xs = [data(q, 800, (2 * n, 3), torch.bfloat16) for q in range(n)]
    out = poisoned(xs[0])
    dist.all_to_all_single(out, xs[r])
    same(out, torch.cat([xs[q][2 * r : 2 * r + 2] for q in range(n)]), "all_to_all_single even")
    for salt in range(3):
        m = split_matrix(n, 810 + salt)
        send, recv = m[r].tolist(), m[:, r].tolist()
        inp = torch.cat([rows(r, j, send[j], salt) for j in range(n)])
        out = torch.full((sum(recv), 3), -1, dtype=torch.int64)
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
        same(out, torch.cat([rows(i, r, recv[i], salt) for i in range(n)]), f"all_to_all_single uneven {m.tolist()}")
    m = split_matrix(n, 820)
    ins = [rows(r, j, int(m[r, j]), 9) for j in range(n)]
    outs = [torch.full((int(m[i, r]), 3), -1, dtype=torch.int64) for i in range(n)]
    dist.all_to_all(outs, ins)
    for i in range(n):
        same(outs[i], rows(i, r, int(m[i, r]), 9), "all_to_all list")


def check_async(r: int, n: int) -> None:
    xs = [data(q, 900, (5,), torch.float32) for q in range(n)]
    t = xs[r].clone()
    w = dist.all_reduce(t, async_op=True)
    assert w.is_completed() is True
    w.wait()
    same(t, fold(xs, lambda a, b: a + b), "async all_reduce")
    fut = w.get_future()
    assert fut.done()
    same(fut.value()[0], t, "async future value")
    out = torch.empty(5 * n)
    w = dist.all_gather_into_tensor(out, xs[r], async_op=True)
    w.wait()
    same(w.get_future().value()[0], torch.cat(xs), "async all_gather future")
    dist.barrier()
    assert dist.barrier(async_op=True).wait()
    # Called as torch's wrappers call a synchronous collective (asyncOp False): the Work is
    # completed and shared (nothing to wait for); the default options (asyncOp True, as C++
    # callers pass them) get a Work of their own whose future holds the outputs.
    pg = dist.distributed_c10d._get_default_group()
    opts = dist.AllreduceOptions()
    if hasattr(opts, "asyncOp"):
        t = xs[r].clone()
        opts.asyncOp = False
        w1, w2 = pg.allreduce([t], opts), pg.allreduce([t.clone()], opts)
        assert w1 is w2 and w1.is_completed() and w1.wait()
        opts = dist.AllreduceOptions()
        t = xs[r].clone()
        w3 = pg.allreduce([t], opts)
        assert w3 is not w1 and w3.wait()
        same(w3.get_future().value()[0], fold(xs, lambda a, b: a + b), "allreduce with default options")


def check_p2p(r: int, n: int) -> None:
    if n == 1:
        return
    nxt, prv = (r + 1) % n, (r - 1) % n
    # Larger than a mailbox slot (the test sets SYMHEAP_P2P_SLOT to 4 KiB): chunked.
    for k, numel in enumerate((1, 3000, 0)):
        send = data(r, 1000 + k, (numel,), torch.float32)
        recv = poisoned(send)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)])
        for q in reqs:
            q.wait()
        same(recv, data(prv, 1000 + k, (numel,), torch.float32), f"batch_isend_irecv {numel}")
    # Blocking send/recv in order: even ranks send first.
    t = data(r, 1100, (4, 4), torch.int32)
    got = poisoned(t)
    if r % 2 == 0:
        dist.send(t, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(t, nxt)
    same(got, data(prv, 1100, (4, 4), torch.int32), "send/recv")


def check_refused(r: int, n: int) -> None:
    t = torch.ones(4, dtype=torch.int32)
    for op, what in ((R.BAND, "BAND"), (R.BXOR, "BXOR")):
        try:
            dist.all_reduce(t, op=op)
        except SymheapUnsupportedError as e:
            assert isinstance(e, dist.DistBackendError) and isinstance(e, RuntimeError), type(e).__mro__
            assert what in str(e) and "all_reduce" in str(e), str(e)
        else:
            raise AssertionError(f"{what} accepted")
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.float8_e4m3fn))
    except SymheapUnsupportedError as e:
        assert isinstance(e, dist.DistBackendError) and "float8" in str(e), str(e)
    else:
        raise AssertionError("float8 reduction accepted")
    dist.barrier()


def check_funcol(r: int, n: int) -> None:
    """Functional collectives (what DTensor calls) eagerly and under torch.compile(fullgraph)."""
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    xs = [data(q, 1200, (4, n), torch.float32) for q in range(n)]

    def f(x: torch.Tensor) -> torch.Tensor:
        a = fc.all_reduce(x, "sum", group)
        g = fc.all_gather_tensor(x, 0, group)
        s = fc.reduce_scatter_tensor(x.repeat(n, 1), "sum", 0, group)
        return a + s * 0 + g[: x.shape[0]] * 0 + 1

    want = fold(xs, lambda a, b: a + b) + 1
    same(f(xs[r]), want, "funcol eager")
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    same(compiled(xs[r]), want, "funcol compiled")
    g = fc.all_gather_tensor(xs[r], 0, group)
    same(fc.wait_tensor(g), torch.cat(xs), "funcol all_gather")


def check_streams(r: int, n: int) -> None:
    """CUDA: an async collective enqueued on a side stream behind a long kernel, waited for on
    the default stream (``wait()``, then the future, then a ``then`` callback): what the default
    stream reads afterwards is the result, not the input (it would race without the Work's
    stream order). The same for the Work torch's C++ keeps (functional collectives)."""
    if torch.get_default_device().type != "cuda":
        return
    import torch.distributed._functional_collectives as fc

    side = torch.cuda.Stream()
    want = float(n * (n + 1) // 2)

    def behind_spin(fn):
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)
            return fn()

    x = torch.full((1 << 16,), float(r + 1))
    w = behind_spin(lambda: dist.all_reduce(x, async_op=True))
    w.wait()
    same(x.clone(), torch.full_like(x, want), "all_reduce waited for on another stream")
    x = torch.full((1 << 16,), float(r + 1))
    w = behind_spin(lambda: dist.all_reduce(x, async_op=True))
    same(w.get_future().wait()[0].clone(), torch.full_like(x, want), "the future of a side-stream all_reduce")
    x = torch.full((1 << 16,), float(r + 1))
    w = behind_spin(lambda: dist.all_reduce(x, async_op=True))
    got = w.get_future().then(lambda f: f.value()[0] * 2).wait()
    same(got, torch.full_like(x, 2 * want), "a then() callback of a side-stream all_reduce")
    x = torch.full((1 << 16,), float(r + 1))
    y = behind_spin(lambda: fc.all_reduce(x, "sum", dist.group.WORLD))
    same(fc.wait_tensor(y).clone(), torch.full_like(x, want), "a functional all_reduce waited for on another stream")
    torch.cuda.synchronize()


def check_direct_share(r: int, n: int) -> None:
    """symheap.* calls share the backend's context: PE == global rank."""
    assert symheap.is_initialized() and symheap.my_pe() == r and symheap.n_pes() == n
    import symheap.torch as st

    x = st.full((3,), float(r), dtype=torch.float32)
    sd.all_reduce(x)
    same(x, torch.full((3,), float(n * (n - 1) // 2)), "symheap.distributed.all_reduce beside the backend")


def run_all(r: int, n: int) -> None:
    kind = torch.get_default_device().type
    assert dist.get_backend() == f"{kind}:symheap", dist.get_backend()
    from symheap.distributed import _work

    print(f"[PE {r}] WORK {'cpp' if _work._cpp_done is not None else 'python'}", flush=True)
    for check in (
        check_all_reduce,
        check_gathers,
        check_scatters,
        check_rooted,
        check_alltoall,
        check_async,
        check_p2p,
        check_refused,
        check_funcol,
        check_streams,
        check_direct_share,
    ):
        check(r, n)
        print(f"[PE {r}] ok {check.__name__}", flush=True)
    if n >= 3:
        from tdist_groups import check_groups

        check_groups(r, n)
        print(f"[PE {r}] ok check_groups", flush=True)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(kind, (n,))
    t = torch.ones(2)
    dist.all_reduce(t, group=mesh.get_group())
    same(t, torch.full((2,), float(n)), "device mesh group")


def run_records(r: int, n: int) -> None:
    """Run under torch's cudaMallocAsync allocator, whose ``record_stream`` warns when it names
    the stream that made the tensor: a synchronous collective on ordinary tensors made on the
    current stream notes no stream use (as ProcessGroupNCCL keeps no lifetime for one), so no
    warning; the asynchronous forms keep their lifetime; both exact."""
    import warnings

    assert torch.cuda.memory.get_allocator_backend() == "cudaMallocAsync"
    xs = [data(q, 1700, (4 * n,), torch.float32) for q in range(n)]
    total = fold(xs, lambda a, b: a + b)
    rows = [xs[q].view(n, 4) for q in range(n)]

    def every(async_op: bool, api=dist) -> None:
        def done(w) -> None:
            if async_op:
                w.wait()

        t = xs[r].clone()
        done(api.all_reduce(t, async_op=async_op))
        same(t, total, f"all_reduce async={async_op}")
        out = torch.empty(4 * n * n)
        done(api.all_gather_into_tensor(out, xs[r], async_op=async_op))
        same(out, torch.cat(xs), f"all_gather_into_tensor async={async_op}")
        out = torch.empty(4)
        done(api.reduce_scatter_tensor(out, xs[r], async_op=async_op))
        same(out, total.view(n, 4)[r], f"reduce_scatter_tensor async={async_op}")
        out = torch.empty(n, 4)
        done(api.all_to_all_single(out, rows[r], async_op=async_op))
        same(out, torch.stack([rows[q][r] for q in range(n)]), f"all_to_all_single async={async_op}")
        t = xs[r].clone()
        done(api.broadcast(t, src=n - 1, async_op=async_op))
        same(t, xs[n - 1], f"broadcast async={async_op}")

    # The same through symheap.distributed's own functions, which follow the backend.
    for api in (dist, sd):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            every(False, api)
        stream_warnings = [str(w.message) for w in seen if "stream" in str(w.message).lower()]
        assert not stream_warnings, (api.__name__, stream_warnings)
        every(True, api)


def run_diverge(r: int, n: int) -> None:
    t = torch.ones(8)
    # The same calls first (staging workspaces grown alike), then rank 0 differs.
    dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(8 * n), t)
    try:
        if r == 0:
            dist.all_reduce(t)
        else:
            dist.all_gather_into_tensor(torch.empty(8 * n), t)
        dist.barrier()
    except SymheapMismatchError as e:
        assert isinstance(e, dist.DistBackendError), type(e).__mro__
        print(f"[PE {r}] DIVERGE {e}", flush=True)
        os._exit(0)
    raise AssertionError("no divergence reported")


def run_dead(r: int, n: int) -> None:
    dist.barrier()
    if r == n - 1:
        os._exit(3)
    t0 = time.monotonic()
    try:
        for _ in range(100000):
            dist.all_reduce(torch.ones(4))
    except SymheapError as e:
        assert isinstance(e, dist.DistBackendError), type(e).__mro__
        assert isinstance(e, SymheapPeerError) or "exited" in str(e) or "PE" in str(e), str(e)
        print(f"[PE {r}] DEAD after {time.monotonic() - t0:.2f}s: {e}", flush=True)
        os._exit(0)
    raise AssertionError("the dead rank went unnoticed")


def group_without_dead(r: int, n: int, die: Callable[[], None]) -> None:
    """Ranks 0..n-3 and n-1 make a group (a subgroup to symheap: its members agree on a team over
    torch's store); rank n-1 runs ``die`` instead, rank n-2 is not a member. The members print
    how long their ``new_group`` took to fail and its error."""
    dist.barrier()
    if r == n - 1:
        die()
    t0 = time.monotonic()
    try:
        g = dist.new_group([*range(n - 2), n - 1])
    except SymheapError as e:
        assert isinstance(e, dist.DistBackendError), type(e).__mro__
        print(f"[PE {r}] FAILED after {time.monotonic() - t0:.2f}s: {type(e).__name__}: {e}", flush=True)
        # Rank 0 serves torch's store: the others see their own failure before it goes.
        time.sleep(1)
        os._exit(0)
    if r == n - 2:
        assert g == dist.GroupMember.NON_GROUP_MEMBER, g
        # Alive until the members have failed (a PE that exits is a failure too, which would
        # hide theirs): past the 2 s a death may take to be named, or the late test's timeout.
        time.sleep(min(float(os.environ["SYMHEAP_TIMEOUT"]), 2.5) + 1.5)
        os._exit(0)
    raise AssertionError("new_group returned without its last member")


def run_dead_group(r: int, n: int) -> None:
    group_without_dead(r, n, lambda: os._exit(3))


def run_late_group(r: int, n: int) -> None:
    """The last member lives but never makes the group."""

    def late() -> None:
        time.sleep(float(os.environ["SYMHEAP_TIMEOUT"]) + 2)
        os._exit(0)

    group_without_dead(r, n, late)


def main() -> None:
    mode = sys.argv[1]
    kind = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    if kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        dev = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.set_default_device(dev)
    dist.init_process_group("cpu:gloo,cuda:symheap" if mode == "gloo" else f"{kind}:symheap")
    r, n = dist.get_rank(), dist.get_world_size()
    if mode == "all":
        run_all(r, n)
    elif mode == "records":
        run_records(r, n)
    elif mode == "diverge":
        run_diverge(r, n)
    elif mode == "dead":
        run_dead(r, n)
    elif mode == "dead-group":
        run_dead_group(r, n)
    elif mode == "late-group":
        run_late_group(r, n)
    elif mode == "gloo":
        t = torch.full((3,), float(r))
        dist.all_reduce(t)
        same(t, torch.full((3,), float(n * (n - 1) // 2)), "cpu:gloo beside symheap")
        assert symheap.is_initialized()
    dist.destroy_process_group()
    assert not symheap.is_initialized(), "destroy_process_group leaves the context it made open"
    print(f"[PE {r}] PASS tdist", flush=True)


if __name__ == "__main__":
    main()
