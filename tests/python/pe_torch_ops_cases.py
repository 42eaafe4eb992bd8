"""PE-side cases of the torch integration (see pe_cases.py for how they run): the
``torch.ops.symheap`` custom ops on symmetric and ordinary tensors, their fake kernels,
torch.compile with no graph break, the torch.distributed-style module over a gloo group, and
every promised error. Integer-valued random data (the same on every PE, seeded by the case
name), so every expected value is exact. torch is imported inside each case."""

from __future__ import annotations

import zlib

import symheap
from pe_common import OWN_INIT, case, raises
from symheap import SymheapError, SymheapUnsupportedError, SymheapValueError

OWN_INIT.update({"ops_dist", "ops_dist_compile"})


def _data(name: str, n: int, shape, dtype, lo: int = -8, hi: int = 9):
    """Every PE's input for case ``name``: ``[n, *shape]`` integers in ``[lo, hi)``."""
    import symheap.torch as st
    import torch

    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randint(lo, hi, (n, *shape), generator=g).to(dtype).to(st.device())


def _reduce(x, op: str):
    import torch

    if op == "sum":
        return x.sum(0, dtype=x.dtype)
    if op == "avg":
        return x.sum(0, dtype=x.dtype) / x.shape[0]
    if op == "prod":
        return x.prod(0, dtype=x.dtype)
    return getattr(torch, f"a{op}")(x, 0)


def _eq(got, want, what: str) -> None:
    import torch

    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (what, got.shape, want.shape)
    assert torch.equal(got, want), f"{what}: {got} != {want}"


def _kinds(t):
    """The same values as a symmetric tensor and as an ordinary one."""
    import symheap.torch as st

    s = st.empty(*t.shape, dtype=t.dtype)
    s.copy_(t)
    return [("symmetric", s), ("ordinary", t.clone())]


def _check_collectives(me: int, n: int, tag: str) -> None:
    import symheap.ops as so
    import symheap.torch as st
    import torch

    for dtype in (torch.float32, torch.int32, torch.int64):
        x = _data(f"ar-{tag}-{dtype}", n, (5, 3), dtype, lo=1, hi=4)
        for op in ("sum", "min", "max", "prod") + (("avg",) if dtype.is_floating_point else ()):
            for kind, t in _kinds(x[me]):
                so.all_reduce_(t, op)
                _eq(t, _reduce(x, op), f"all_reduce_ {op} {dtype} {kind}")
                _eq(
                    so.all_reduce(_kinds(x[me])[0][1] if kind == "symmetric" else x[me], op),
                    _reduce(x, op),
                    f"all_reduce {op}",
                )
        x = _data(f"ag-{tag}-{dtype}", n, (4, 2), dtype)
        want = x.reshape(n * 4, 2)
        for kind, t in _kinds(x[me]):
            _eq(so.all_gather(t), want, f"all_gather {kind}")
            for okind, out in (
                ("symmetric", st.zeros(n * 4, 2, dtype=dtype)),
                ("ordinary", torch.zeros(n, 4, 2, dtype=dtype, device=st.device())),
            ):
                so.all_gather(t, out=out)
                _eq(out.reshape(n * 4, 2), want, f"all_gather into {okind} from {kind}")
        x = _data(f"rs-{tag}-{dtype}", n, (n * 3,), dtype)
        for kind, t in _kinds(x[me]):
            _eq(so.reduce_scatter(t), x.sum(0, dtype=dtype)[me * 3 : me * 3 + 3], f"reduce_scatter {kind}")
            out = st.zeros(3, dtype=dtype) if kind == "symmetric" else torch.zeros(3, dtype=dtype, device=st.device())
            so.reduce_scatter(t, "max", out=out)
            _eq(out, x.amax(0)[me * 3 : me * 3 + 3], f"reduce_scatter into {kind}")
        x = _data(f"a2a-{tag}-{dtype}", n, (n, 2), dtype)
        for kind, t in _kinds(x[me]):
            _eq(so.alltoall(t), x[:, me], f"alltoall {kind}")
            out = (
                st.zeros(n, 2, dtype=dtype)
                if kind == "symmetric"
                else torch.zeros(n, 2, dtype=dtype, device=st.device())
            )
            so.alltoall(t, out=out)
            _eq(out, x[:, me], f"alltoall into {kind}")
        x = _data(f"bc-{tag}-{dtype}", n, (7,), dtype)
        for root in {0, n - 1}:
            for kind, t in _kinds(x[me]):
                so.broadcast_(t, root)
                _eq(t, x[root], f"broadcast root {root} {kind}")
    # A non-contiguous ordinary tensor is staged and written back through its strides.
    x = _data(f"nc-{tag}", n, (4, 6), torch.float32)
    t = x[me].clone().t()
    so.all_reduce_(t)
    _eq(t, x.sum(0).t(), "all_reduce_ of a transposed tensor")
    so.barrier()


@case
def case_ops_coll() -> None:
    """Every collective op, on symmetric tensors (zero-copy: no workspace is made) and on
    ordinary ones (staged), for float32/int32/int64 and every reduction; RMA and signals."""
    import symheap.ops as so
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    # Symmetric tensors only: no staging workspace appears.
    x = _data("zero-copy", n, (64,), torch.float32)
    s = st.empty(64, dtype=torch.float32)
    s.copy_(x[me])
    so.all_reduce_(s)
    out = st.empty(n * 64, dtype=torch.float32)
    so.all_gather(s, out=out)
    assert so.workspace_usage()["workspaces"] == 0, so.workspace_usage()
    _eq(s, x.sum(0), "zero-copy all_reduce_")
    _check_collectives(me, n, "eager")
    assert so.workspace_usage()["workspaces"] == 1, so.workspace_usage()
    # A large ordinary tensor grows the workspace (collectively) and still sums exactly.
    big = _data("big", n, (70_000,), torch.int32)
    t = big[me].clone()
    so.all_reduce_(t)
    _eq(t, big.sum(0, dtype=torch.int32), "grown workspace")
    assert so.workspace_usage()["bytes"] >= 70_000 * 4
    # The same small calls again: their staging views are cut from the new buffer, not reused
    # from the one the growth freed.
    _check_collectives(me, n, "after growth")
    # Shapes that vary call to call (sequence lengths): exact, and the views kept stay bounded.
    from symheap import _workspace

    for rows in range(1, _workspace.MAX_LAYOUTS + 40):
        v = torch.full((rows, 3), me + 1, dtype=torch.int64)
        so.all_reduce_(v)
        assert bool((v == n * (n + 1) // 2).all()), f"all_reduce_ of {rows} rows"
    assert all(len(w.cache) <= _workspace.MAX_LAYOUTS for w in _workspace._staging.workspaces())
    # RMA and signals through the ops: put to the right neighbour, signal, wait, get back.
    nxt, prv = (me + 1) % n, (me - 1) % n
    d = _data("rma", n, (16,), torch.int64)
    dest = st.zeros(16, dtype=torch.int64)
    sig = st.zeros(2, dtype=torch.int64)
    symheap.barrier_all()
    so.put(dest, d[me], nxt)
    so.barrier()
    _eq(dest, d[prv], "put")
    back = torch.zeros(16, dtype=torch.int64)
    so.get(back, dest, nxt)
    _eq(back, d[me], "get")
    so.barrier()
    so.put_signal(dest, d[me] * 2, sig, 7, nxt, "set", 1)
    so.signal_wait_until(sig, "eq", 7, 1)
    _eq(dest, d[prv] * 2, "put_signal")
    so.barrier()


@case
def case_ops_fake() -> None:
    """The fake kernels: shapes, dtypes and devices of every op's result under FakeTensorMode,
    their errors, and torch.library.opcheck on the in-place and functional all_reduce."""
    import symheap.ops  # noqa: F401 (registers the ops)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    n = symheap.n_pes()
    S = torch.ops.symheap
    with FakeTensorMode():
        x = torch.empty(n * 2, 3, dtype=torch.float32)
        assert S.all_reduce(x, "sum", 0).shape == (n * 2, 3)
        assert S.all_gather(x, 0).shape == (n * n * 2, 3)
        assert S.all_gather(torch.empty((), dtype=torch.int32), 0).shape == (n,)
        assert S.reduce_scatter(x, "max", 0).shape == (2, 3)
        assert S.alltoall(x, 0).shape == (n * 2, 3) and S.alltoall(x, 0).dtype == torch.float32
        S.all_reduce_(x, "avg", 0)
        S.broadcast_(x, n - 1, 0)
        S.all_gather_into(torch.empty(n, n * 2, 3), x, 0)
        S.reduce_scatter_into(torch.empty(2, 3), x, "sum", 0)
        S.alltoall_into(torch.empty(n * 6), x, 0)
        S.barrier(0)
        raises(SymheapValueError, S.all_gather_into, torch.empty(n * 6 + 1), x, 0)
        raises(SymheapValueError, S.all_reduce, x, "mean", 0)
        raises(SymheapValueError, S.reduce_scatter, torch.empty(n * 2 + 1), "sum", 0)
        raises(SymheapValueError, S.broadcast_, x, n, 0)
    # Real and fake kernels, schema and mutation annotations agree (every PE runs the same
    # sequence of calls, so the collectives inside pair up).
    t = torch.arange(6, dtype=torch.float32)
    torch.library.opcheck(S.all_reduce_.default, (t.clone(), "sum", 0), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(S.all_reduce.default, (t, "max", 0), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(S.all_gather.default, (t, 0), test_utils=("test_schema", "test_faketensor"))


def _model(n: int):
    import symheap.ops as so
    import torch

    class Model(torch.nn.Module):
        def forward(self, x):
            y = so.all_reduce(x * 2)
            g = so.all_gather(y + 1)
            r = so.reduce_scatter(g, "sum")
            a = so.alltoall(r)
            so.broadcast_(a, n - 1)
            so.all_reduce_(a, "max")
            so.barrier()
            return a - 1

    return Model()


class _Counter:
    """A torch.compile backend counting the graphs it gets, then running aot_eager."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        self.graphs += 1
        return aot_autograd(fw_compiler=lambda g, _: g.forward)(gm, example_inputs)


@case
def case_ops_compile() -> None:
    """torch.compile(fullgraph=True) of a model calling every collective op: one graph, zero
    graph breaks (torch._dynamo.explain and a counting backend), the same exact values as eager,
    on symmetric and ordinary inputs; then inductor on the same model, at 2 PEs. Inductor sees
    the ops as opaque calls, so its lowering does not depend on the PE count, and each process
    that lowers for the CPU first spends ~15 s on CI's two cores proving the CPU's SIMD levels
    (at 4 PEs every PE compiled its C++ at once: 56 s of the suite's ~11 min)."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    m = _model(n)
    x = _data("compile", n, (n * 2, 3), torch.float32)
    want = m(x[me].clone())
    torch._dynamo.reset()
    ex = torch._dynamo.explain(m)(x[me].clone())
    assert ex.graph_break_count == 0 and ex.graph_count == 1, ex
    counter = _Counter()
    cm = torch.compile(m, fullgraph=True, backend=counter)
    for kind, t in _kinds(x[me]):
        _eq(cm(t), want, f"compiled ({kind})")
    assert counter.graphs == 1, counter.graphs
    if n != 2:
        return
    ci = torch.compile(m, fullgraph=True, backend="inductor")
    _eq(ci(x[me].clone()), want, "inductor")
    s = st.empty(n * 2, 3, dtype=torch.float32)
    s.copy_(x[me])
    _eq(ci(s), want, "inductor, symmetric input")


@case
def case_ops_errors() -> None:
    """Every promised error of the ops, raised on every PE before any communication: wrong
    dtype, wrong shapes, unknown reduction, avg of integers, bad root, unknown and foreign team
    ids, growth of a sub-team's workspace without a reservation."""
    import symheap.ops as so
    import symheap.torch as st
    import torch

    n = symheap.n_pes()
    x = torch.zeros(n * 2, dtype=torch.float32)
    e = raises(SymheapValueError, so.all_reduce_, torch.zeros(4, dtype=torch.complex64))
    assert "complex64" in str(e), e
    raises(SymheapValueError, so.all_reduce, torch.zeros(4, dtype=torch.bool))
    e = raises(SymheapValueError, so.all_reduce_, x, "mean")
    assert "unknown reduction 'mean'" in str(e), e
    raises(SymheapValueError, so.all_reduce_, torch.zeros(4, dtype=torch.int32), "avg")
    e = raises(SymheapValueError, so.all_gather, x, out=torch.zeros(n * 2 * n + 1))
    assert "out must hold" in str(e), e
    raises(SymheapValueError, so.all_gather, x, out=torch.zeros(n * 2 * n, dtype=torch.float64))
    if n > 1:
        raises(SymheapValueError, so.reduce_scatter, torch.zeros(n * 2 + 1))
    raises(SymheapValueError, so.reduce_scatter, x, "sum", out=torch.zeros(3))
    raises(SymheapValueError, so.alltoall, x, out=torch.zeros(n * 2 + 1))
    if n > 1:
        raises(SymheapValueError, so.alltoall, torch.zeros(n * 2 + 1))
    raises(SymheapValueError, so.broadcast_, x, n)
    raises(SymheapValueError, so.all_reduce_, x, "sum", 12345)
    raises(SymheapValueError, so.all_reduce_, x, "sum", "world")
    if n >= 2:
        # Team of PE 0 alone: the others are not members; PE 0's staging cannot grow on demand.
        team = symheap.team_split_strided(None, 0, 1, 1)
        st_x = st.zeros(4, dtype=torch.float32)  # allocation is collective over the world
        if symheap.my_pe() == 0:
            e = raises(SymheapValueError, so.all_reduce_, x, "sum", team)
            assert "reserve_workspace" in str(e), e
            so.all_reduce_(st_x, "sum", team)  # symmetric: no workspace needed
        else:
            e = raises(SymheapValueError, so.all_reduce_, x, "sum", team)
            assert "not a member" in str(e), e
        so.reserve_workspace(1 << 16, team)  # every PE
        if symheap.my_pe() == 0:
            t = torch.full((4,), 3.0)
            so.all_reduce_(t, "sum", team)
            _eq(t, torch.full((4,), 3.0), "reserved sub-team workspace")
        symheap.barrier_all()
        symheap.team_destroy(team)
    assert issubclass(SymheapUnsupportedError, SymheapError)
    _autograd_rules(so, torch, n)
    so.barrier()


def _autograd_rules(so, torch, n: int) -> None:
    """The ops have no autograd formula: an input that requires grad is refused while grad mode
    is on (eagerly and through the dispatcher), accepted under no_grad; a mutated tensor's
    version counter moves as torch's own in-place ops move it."""
    w = torch.ones(4, requires_grad=True)
    y = w * 2
    for call in (lambda: so.all_reduce_(y), lambda: torch.ops.symheap.all_reduce(y, "sum", 0)):
        e = raises(SymheapUnsupportedError, call)
        assert "no autograd formula" in str(e) and "symheap::all_reduce" in str(e), e
    with torch.no_grad():
        t = so.all_reduce(y)
    _eq(t, torch.full((4,), 2.0 * n), "all_reduce of a grad tensor under no_grad")
    t = torch.ones(4)
    v = t._version
    so.all_reduce_(t)
    torch.ops.symheap.all_reduce_(t, "sum", 0)
    assert t._version >= v + 2, (v, t._version)
    _eq(t, torch.full((4,), float(n * n)), "two in-place all_reduces")


def _init_gloo():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    # symheap.init() from the process group uses public APIs only.
    private = dist.distributed_c10d._get_default_store

    def refuse(*a, **k):
        raise AssertionError("symheap.init used torch's private _get_default_store")

    dist.distributed_c10d._get_default_store = refuse
    try:
        symheap.init()
    finally:
        dist.distributed_c10d._get_default_store = private
    assert symheap.my_pe() == dist.get_rank() and symheap.n_pes() == dist.get_world_size()
    return dist


def _dist_values(dist, me: int, n: int) -> None:
    import symheap.distributed as sd
    import torch

    world_pg = dist.new_group(list(range(n)))
    for group in (None, dist.group.WORLD, world_pg, symheap.team_world()):
        for op in ("sum", "avg", "max", "min", "prod", dist.ReduceOp.SUM, dist.ReduceOp.MAX, sd.ReduceOp.PRODUCT):
            x = _data(f"dist-ar-{op}", n, (6,), torch.float32, lo=1, hi=4)
            t = x[me].clone()
            assert sd.all_reduce(t, op=op, group=group) is None
            name = sd._op(op)
            _eq(t, _reduce(x, name), f"all_reduce {op} group {group}")
        x = _data("dist-ag", n, (3, 2), torch.int64)
        out = torch.zeros(n * 3, 2, dtype=torch.int64)
        sd.all_gather_into_tensor(out, x[me], group=group)
        _eq(out, x.reshape(n * 3, 2), "all_gather_into_tensor")
        x = _data("dist-rs", n, (n * 2,), torch.int32)
        out = torch.zeros(2, dtype=torch.int32)
        w = sd.reduce_scatter_tensor(out, x[me], "sum", group=group, async_op=True)
        assert w.wait()
        _eq(out, x.sum(0, dtype=torch.int32)[me * 2 : me * 2 + 2], "reduce_scatter_tensor")
        x = _data("dist-a2a", n, (n, 3), torch.float32)
        out = torch.zeros(n, 3)
        sd.all_to_all_single(out, x[me], [1] * n, [1] * n, group=group)
        _eq(out, x[:, me], "all_to_all_single")
        t = x[me].clone()
        sd.broadcast(t, src=n - 1, group=group)
        _eq(t, x[n - 1], "broadcast")
        sd.barrier(group)


def _dist_subgroups(dist, me: int, n: int) -> None:
    """Subgroups (registered on every PE), and their errors."""
    import symheap.distributed as sd
    import symheap.ops as so
    import torch

    evens = list(range(0, n, 2))
    pg = dist.new_group(evens)
    x = torch.full((4,), float(me + 1))
    if me in evens:
        e = raises(SymheapValueError, sd.all_reduce, x.clone(), group=pg)
        assert "register_group" in str(e), e
    team = sd.register_group(pg)
    assert sd.register_group(pg) is team  # cached
    so.reserve_workspace(1 << 16, team)  # collective over the world
    if me in evens:
        t = x.clone()
        sd.all_reduce(t, group=pg)
        _eq(t, torch.full((4,), float(sum(r + 1 for r in evens))), "all_reduce on the even ranks")
        t = torch.full((3,), float(me))
        sd.broadcast(t, src=evens[-1], group=pg)
        _eq(t, torch.full((3,), float(evens[-1])), "broadcast src is a global rank")
        raises(SymheapValueError, sd.broadcast, t, src=1, group=pg)
    else:
        e = raises(SymheapValueError, sd.all_reduce, x.clone(), group=pg)
        assert "not a member" in str(e), e
    symheap.barrier_all()
    if n >= 4:
        _dist_any_group(dist, me, n)


def _dist_any_group(dist, me: int, n: int) -> None:
    """A group of ranks that are not evenly strided ([2, 0, 3]: torch ranks it 0, 2, 3):
    registered on every PE, exact all_reduce and all_gather_into_tensor (blocks in group-rank
    order) on its members."""
    import symheap.distributed as sd
    import symheap.ops as so
    import torch

    pg = dist.new_group([2, 0, 3])
    ranks = dist.get_process_group_ranks(pg) if me in (0, 2, 3) else [0, 2, 3]
    team = sd.register_group(pg)
    assert team.is_valid == (me in ranks), (me, team)
    # Collective over the world. Larger than the even group's: the staging of a PE outside
    # both groups is filed under one key for every team it is not in, and a size it already
    # holds would allocate on the members only (a known limit of _workspace's keys).
    so.reserve_workspace(1 << 17, team)
    if me in ranks:
        assert team.members == list(ranks) and team.my_pe() == ranks.index(me), (team.members, ranks)
        x = _data("dist-any", n, (5,), torch.float32)
        t = x[me].clone()
        sd.all_reduce(t, group=pg)
        _eq(t, x[list(ranks)].sum(0), "all_reduce on ranks [2, 0, 3]")
        out = torch.full((len(ranks), 5), -1.0)
        sd.all_gather_into_tensor(out, x[me], group=pg)
        _eq(out, x[list(ranks)], "all_gather on ranks [2, 0, 3] in group-rank order")
    symheap.barrier_all()


@case
def case_ops_dist() -> None:
    """The torch.distributed-style functions over a gloo process group: symheap.init() from it
    (public APIs only), every function with group None / WORLD / a ProcessGroup / a Team, every
    ReduceOp spelling, subgroups and the errors (unknown op string, unsupported ReduceOp,
    uneven splits, unregistered or foreign group) and a group of ranks in no stride."""
    import symheap.distributed as sd
    import torch

    dist = _init_gloo()
    me, n = symheap.my_pe(), symheap.n_pes()
    _dist_values(dist, me, n)
    if n >= 2:
        _dist_subgroups(dist, me, n)
    x = torch.zeros(n * 2)
    e = raises(SymheapValueError, sd.all_reduce, x, op="mean")
    assert "unknown reduction 'mean'" in str(e), e
    raises(SymheapUnsupportedError, sd.all_reduce, x, op=dist.ReduceOp.BAND)
    raises(SymheapValueError, sd.all_reduce, torch.zeros(2, dtype=torch.complex64))
    raises(SymheapValueError, sd.all_gather_into_tensor, torch.zeros(n * 2 + 1), x)
    raises(SymheapValueError, sd.reduce_scatter_tensor, torch.zeros(3), x)
    if n > 1:
        raises(SymheapUnsupportedError, sd.all_to_all_single, torch.zeros(n * 2), x, None, [2] + [1] * (n - 2) + [3])
    raises(SymheapValueError, sd.broadcast, x)
    _dist_autograd_rules(sd, torch, n)
    sd.barrier()
    symheap.finalize()
    dist.destroy_process_group()


def _dist_autograd_rules(sd, torch, n: int) -> None:
    """symheap.distributed's functions keep the ops' rules (they run the ops' work without the
    ops' Python entries): an input that requires grad is refused in grad mode, each written
    tensor's version counter moves, synchronous or not."""
    y = torch.ones(2 * n, requires_grad=True) * 2
    out = torch.zeros(2 * n * n)
    for call in (
        lambda: sd.all_reduce(y),
        lambda: sd.all_gather_into_tensor(out, y),
        lambda: sd.reduce_scatter_tensor(torch.zeros(2), y),
        lambda: sd.all_to_all_single(torch.zeros(2 * n), y),
        lambda: sd.broadcast(y, src=0),
    ):
        e = raises(SymheapUnsupportedError, call)
        assert "no autograd formula" in str(e), e
    t, small, a2a = torch.ones(2 * n), torch.zeros(2), torch.zeros(2 * n)
    for async_op in (False, True):
        before = [u._version for u in (t, out, small, a2a)]
        sd.all_reduce(t, async_op=async_op)
        sd.all_gather_into_tensor(out, t, async_op=async_op)
        sd.reduce_scatter_tensor(small, t, async_op=async_op)
        sd.all_to_all_single(a2a, t, async_op=async_op)
        sd.broadcast(t, src=0, async_op=async_op)
        after = [u._version for u in (t, out, small, a2a)]
        assert all(b > a for a, b in zip(before, after)), (async_op, before, after)


@case
def case_ops_dist_compile() -> None:
    """torch.compile(fullgraph=True) of a function of symheap.distributed calls (group None and
    the default group): one graph, exact values."""
    import symheap.distributed as sd
    import torch

    dist = _init_gloo()
    me, n = symheap.my_pe(), symheap.n_pes()

    def f(x, out):
        sd.all_reduce(x, op="sum")
        sd.all_gather_into_tensor(out, x * 2, group=dist.group.WORLD)
        sd.broadcast(x, src=0)
        return out + x.sum()

    x = _data("dist-compile", n, (4,), torch.float32)
    want = f(x[me].clone(), torch.zeros(n * 4))
    torch._dynamo.reset()
    counter = _Counter()
    cf = torch.compile(f, fullgraph=True, backend=counter)
    _eq(cf(x[me].clone(), torch.zeros(n * 4)), want, "compiled symheap.distributed")
    assert counter.graphs == 1
    symheap.finalize()
    dist.destroy_process_group()


@case
def case_ops_direct() -> None:
    """The ops' fast path, ``Context.collective_direct``: symmetric buffers run in that one
    call, which says which were symmetric; an ordinary one runs there too where the kernel
    reads it in place (CUDA: a team of one, one-shot kernels of a team of two), else the call
    gives None and runs nothing (the ops then stage); unknown names and algorithms raise."""
    import symheap.torch as st
    import torch
    from symheap import _core

    me, n = symheap.my_pe(), symheap.n_pes()
    ctx, cuda = _core.native(), st.device().type == "cuda"
    stream = torch.cuda.current_stream().cuda_stream if cuda else None
    x = _data("direct", n, (n * 8,), torch.float32)
    src = st.empty(n * 8, dtype=torch.float32)
    src.copy_(x[me])
    dst = st.zeros(8, dtype=torch.float32)
    want = x.sum(0)[me * 8 : me * 8 + 8]
    got = ctx.collective_direct("reduce_scatter", None, dst.data_ptr(), src.data_ptr(), 8, "float32", stream, op="sum")
    assert got == (True, True), got
    _eq(dst, want, "reduce_scatter, both symmetric")
    # An ordinary destination: in place only where the kernel touches it on this PE alone.
    plain = torch.full((8,), -1.0, device=st.device())
    got = ctx.collective_direct(
        "reduce_scatter", None, plain.data_ptr(), src.data_ptr(), 8, "float32", stream, op="sum"
    )
    local = cuda and n <= 2
    assert got == ((False, True) if local else None), got
    _eq(plain, want if local else torch.full((8,), -1.0, device=st.device()), "ordinary destination")
    # all_gather from an ordinary source of 8 MiB per member: staged on every backend (n > 1).
    big = torch.ones(BIG, device=st.device())
    out = st.empty(n * BIG, dtype=torch.float32) if n > 1 else None
    if out is not None:
        got = ctx.collective_direct("all_gather", None, out.data_ptr(), big.data_ptr(), BIG, "float32", stream)
        assert got is None, got
    ar = st.empty(4, dtype=torch.float32)
    ar.fill_(float(me + 1))
    got = ctx.collective_direct("all_reduce", None, ar.data_ptr(), ar.data_ptr(), 4, "float32", stream, op="max")
    assert got == (True, True), got
    _eq(ar, torch.full((4,), float(n), device=st.device()), "all_reduce max in place")
    for bad, kw in (("gather", {}), ("all_reduce", {"algo": "three_shot"}), ("all_reduce", {"algo": 2})):
        e = raises(
            SymheapValueError,
            ctx.collective_direct,
            bad,
            None,
            ar.data_ptr(),
            ar.data_ptr(),
            4,
            "float32",
            stream,
            **kw,
        )
        assert "unknown collective" in str(e) or "algo" in str(e) or "algorithm" in str(e), e
    if cuda:
        torch.cuda.synchronize()
    symheap.barrier_all()


# ---- GPU suite (CUDA backend; 2 PEs may share one GPU) -------------------------------------


@case
def case_cuda_malloc_async_allocator() -> None:
    """torch's CUDA allocator backend is cudaMallocAsync (PYTORCH_CUDA_ALLOC_CONF took
    effect), so the cases run after this one test symheap's ops with it."""
    import torch

    torch.empty(1, device="cuda")
    got = torch.cuda.memory.get_allocator_backend()
    assert got == "cudaMallocAsync", got


@case
def case_ops_cuda_ordinary() -> None:
    """Every op on CUDA tensors from PyTorch's allocator (staged) and on symmetric ones, on the
    current stream, exact values; the same checks as on the host backend."""
    me, n = symheap.my_pe(), symheap.n_pes()
    _check_collectives(me, n, "cuda")


@case
def case_ops_cuda_graph() -> None:
    """torch.cuda.graph capture of in-place and out-of-place all_reduce (ordinary and
    symmetric tensors) and all_gather, then 20 replays on new integer data, exact sums."""
    import symheap.ops as so
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    dev = st.device()
    x = torch.zeros(1000, device=dev)
    x2 = torch.zeros(1000, device=dev)
    s = st.zeros(1000, dtype=torch.float32)
    # 8 MiB runs two-shot, which reads peers' copies: the ordinary tensor is staged.
    big = torch.zeros(BIG, device=dev)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):  # warm-up on the capture stream: workspaces exist
        so.all_reduce_(x)
        so.all_reduce(x2)
        so.all_gather(x2)
        so.all_reduce_(big)
    torch.cuda.current_stream().wait_stream(capture)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        so.all_reduce_(x)
        so.all_reduce_(s, "max")
        y = so.all_reduce(x2)
        ag = so.all_gather(x2)
        so.all_reduce_(big)
    assert so.workspace_usage()["captured"] >= 1
    for i in range(20):
        d = _data(f"graph-{i}", n, (1000,), torch.float32)
        x.copy_(d[me])
        x2.copy_(d[me] + 1)
        s.copy_(d[me] * 2)
        big.fill_(float(i + me))
        g.replay()
        torch.cuda.synchronize()
        _eq(x, d.sum(0), f"replay {i}: all_reduce_ ordinary")
        _eq(s, (d * 2).amax(0), f"replay {i}: all_reduce_ symmetric max")
        _eq(y, (d + 1).sum(0), f"replay {i}: all_reduce out of place")
        _eq(ag, (d + 1).reshape(-1), f"replay {i}: all_gather")
        _eq(big, torch.full_like(big, float(n * i + n * (n - 1) // 2)), f"replay {i}: staged 8 MiB")
    symheap.barrier_all()
    torch.cuda.synchronize()


BIG = 2 << 20  # float32 elements: 8 MiB, two-shot on CUDA


@case
def case_ops_cuda_in_place() -> None:
    """Ordinary contiguous CUDA tensors are read and written in place, no workspace, where the
    kernel touches buffers on this PE only (one-shot all_reduce and reduce_scatter, the
    exchange kernels); PEs may pass different kinds of tensors there. Two-shot sizes stage
    through the workspace in the ops, and the plain collectives refuse ordinary memory."""
    import symheap.ops as so
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    dev = st.device()
    before = so.workspace_usage()["workspaces"]
    x = _data("ip-ar", n, (2048,), torch.float32)  # 8 KiB
    t = x[me].clone()
    so.all_reduce_(t)
    _eq(t, x.sum(0), "all_reduce_ in place")
    _eq(so.all_reduce(x[me], "max"), x.amax(0), "all_reduce functional")
    _eq(so.all_gather(x[me]), x.reshape(-1), "all_gather")
    rs = _data("ip-rs", n, (n * 512,), torch.int32)
    _eq(so.reduce_scatter(rs[me]), rs.sum(0, dtype=torch.int32)[me * 512 : (me + 1) * 512], "reduce_scatter")
    a2a = _data("ip-a2a", n, (n, 300), torch.float32)
    _eq(so.alltoall(a2a[me]), a2a[:, me], "alltoall")
    b = _data("ip-bc", n, (999,), torch.float32)
    t = b[me].clone()
    so.broadcast_(t, n - 1)
    _eq(t, b[n - 1], "broadcast")
    # One PE symmetric, the others ordinary: the same call where places do not matter.
    sym = st.empty(2048, dtype=torch.float32)  # collective: every PE allocates
    t = sym if me == 0 else torch.empty(2048, device=dev)
    t.copy_(x[me])
    so.all_reduce_(t)
    _eq(t, x.sum(0), "mixed kinds")
    assert so.workspace_usage()["workspaces"] == before, so.workspace_usage()
    # A strided view of symmetric memory is staged and never handed to torch's allocator
    # (under cudaMallocAsync, record_stream fails on memory it did not give).
    v = st.zeros(8, 6, dtype=torch.float32)[:, ::2]
    v.copy_(x[me, :24].reshape(8, 3))
    so.all_reduce_(v)
    _eq(v, x[:, :24].sum(0).reshape(8, 3), "all_reduce_ of a strided symmetric view")
    # The plain collectives take ordinary memory only where the kernel allows it.
    t = x[me].clone()
    symheap.all_reduce(t)
    torch.cuda.synchronize()
    _eq(t, x.sum(0), "symheap.all_reduce of an ordinary tensor")
    big = torch.ones(BIG, device=dev)
    e = raises(SymheapValueError, symheap.all_reduce, big)
    assert "not in this PE's symmetric heap" in str(e), e
    so.all_reduce_(big)
    _eq(big, torch.full_like(big, float(n)), "8 MiB staged")
    symheap.barrier_all()
    torch.cuda.synchronize()


@case
def case_ops_reduce_overhead() -> None:
    """torch.compile(mode="reduce-overhead", fullgraph=True) of a model calling the ops: CUDA
    graph trees capture and replay them; exact values on every call."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    m = _model(n)
    cm = torch.compile(m, mode="reduce-overhead", fullgraph=True)
    for i in range(8):
        x = _data(f"ro-{i}", n, (n * 2, 3), torch.float32)
        want = m(x[me].clone())
        got = cm(x[me].clone()).clone()
        torch.cuda.synchronize()
        _eq(got, want, f"reduce-overhead call {i}")
    del st
    symheap.barrier_all()
    torch.cuda.synchronize()


@case
def case_ops_cuda_free_after_async() -> None:
    """Freeing right after an asynchronous op is safe: an ordinary input deleted while the op
    still waits on a side stream (the op recorded the stream: the allocator does not reuse it),
    and a symmetric input freed and reclaimed while the op is pending (symheap's release waits
    for the stream)."""
    import symheap.ops as so
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    side = torch.cuda.Stream()
    d = _data("free-async", n, (1 << 18,), torch.float32)
    x = d[me].clone()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        y = so.all_reduce(x)
    del x
    junk = [torch.full((1 << 18,), -7.0, device=d.device) for _ in range(4)]
    torch.cuda.synchronize()
    _eq(y, d.sum(0), "ordinary input deleted after the async op")
    s = st.empty(1 << 18, dtype=torch.float32)
    s.copy_(d[me])
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        y2 = so.all_reduce(s)
    st.free(s)
    del s
    symheap.host_barrier()  # the reclaim point
    again = st.full((1 << 18,), -7.0, dtype=torch.float32)
    torch.cuda.synchronize()
    _eq(y2, d.sum(0), "symmetric input freed after the async op")
    del junk, again
    symheap.barrier_all()
    torch.cuda.synchronize()
