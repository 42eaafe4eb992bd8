"""PE-side test cases, run under the launcher by the test_*.py modules:

    python -m symheap.launch -n N -- python tests/python/pe_cases.py CASE [CASE...]

Each case checks exact expected values on random data (seeded by the case name, the same on
every PE) and prints ``PASS CASE`` when it succeeds; a failure raises, so the PE exits non-zero
and the launcher stops the job. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import gc
import os
import sys
import time
import zlib
from typing import Callable, Dict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import symheap  # noqa: E402
import symheap.numpy as sn  # noqa: E402
from symheap import (  # noqa: E402
    SymheapError,
    SymheapMemoryError,
    SymheapMismatchError,
    SymheapPeerError,
    SymheapTimeoutError,
    SymheapUnsupportedError,
    SymheapValueError,
)

CASES: Dict[str, Callable[[], None]] = {}
# Cases that call init themselves.
OWN_INIT = {"init_finalize", "store_init", "store_abort", "comm_init", "torch_dist"}
# Cases that leave the job failed on purpose: finalize then fails too.
POISONED = {"mismatch", "timeout", "peer_abort", "peer_exit", "store_abort"}


def case(fn: Callable[[], None]) -> Callable[[], None]:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def ptr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def raises(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        assert isinstance(e, SymheapError) or exc in (TypeError,), f"{type(e)} is not a SymheapError"
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")


def poison(a: np.ndarray) -> None:
    a.view(np.uint8)[...] = 0xAB


def env_rank():
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


@case
def case_init_finalize() -> None:
    r, n = env_rank()
    assert not symheap.is_initialized()
    with symheap.init() as ctx:
        assert symheap.is_initialized()
        assert ctx.my_pe() == symheap.my_pe() == r
        assert ctx.n_pes() == symheap.n_pes() == n
        assert 0 <= symheap.local_rank() < n and symheap.local_size() == n
        assert symheap.backend() == "host"
        assert "symheap" in symheap.banner()
        symheap.barrier_all()
        raises(SymheapError, symheap.init)
        ctx.barrier_all()  # module functions through the context object
    assert not symheap.is_initialized()
    raises(SymheapError, symheap.my_pe)
    symheap.finalize()  # a no-op when not initialised


@case
def case_contract() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    a, pa = sn.allocate_symmetric(16, dtype=np.float64)
    b, pb = sn.allocate_symmetric(3, 5, dtype=np.int32)
    assert pa.dtype == np.int64 and pa.shape == (n,) and not pa.flags.writeable
    assert pa[me] == ptr(a) and pb[me] == ptr(b)
    assert a.shape == (16,) and b.shape == (3, 5) and b.dtype == np.int32
    hb = sn.heap_bases()
    assert hb.shape == (n,)
    for r in range(n):
        assert pa[r] != 0 and pb[r] != 0, "every PE of one node is direct"
        # The per-peer delta is the same for every allocation, and the offset in every heap.
        assert pa[r] - pa[me] == pb[r] - pb[me]
        assert pa[r] - hb[r] == pa[me] - hb[me]
    assert np.array_equal(sn.get_peer_bases(a), pa)
    assert symheap.is_symmetric(a) and sn.is_symmetric(b[1:]) and not sn.is_symmetric(np.zeros(3))
    # Views and slices: the table of a view at p is translate(p, me, r).
    v = b[1:]
    tv = sn.get_peer_bases(v)
    assert tv[me] == ptr(v)
    for r in range(n):
        assert tv[r] == pb[r] + 5 * 4
    m = sn.symmetric_address_map(v)
    assert m.local_rank == me and m.allocation_base == pb[me] and m.allocation_bytes >= b.nbytes
    assert np.array_equal(m.peer_bases, pb) and m.direct == [True] * n
    for r in range(n):
        assert m.translate(ptr(v), me, r) == tv[r]
    c, mc = sn.allocate_symmetric_map(8, dtype=np.uint64)
    assert mc.peer_bases[me] == ptr(c) and mc.allocation_base == ptr(c)
    # Cross-allocation translation: a pointer into b translated with a's table reaches the
    # peer's copy of b; store through the peer mapping there.
    b[...] = -1
    symheap.barrier_all()
    to, prev = (me + 1) % n, (me - 1) % n
    p = ptr(b) + 4 * me
    remote = int(pa[to]) + (p - int(pa[me]))
    peer_b = sn.get_peer_array(b, to)
    assert peer_b.shape == b.shape and peer_b.dtype == b.dtype
    assert remote == ptr(peer_b) + 4 * me
    assert remote == int(sn.get_peer_bases(b.reshape(-1)[me : me + 1])[to])
    peer_b.reshape(-1)[me] = 1000 * me + to
    symheap.barrier_all()
    expected = np.full(15, -1, dtype=np.int32)
    expected[prev] = 1000 * prev + me
    assert np.array_equal(b.reshape(-1), expected), (b, expected)
    # The same through put into a slice, using the translated view's peer pointer.
    symheap.barrier_all()
    symheap.put(b.reshape(-1)[me : me + 1], np.array([7 * me + 1], dtype=np.int32), to)
    symheap.barrier_all()
    expected[prev] = 7 * prev + 1
    assert np.array_equal(b.reshape(-1), expected)
    symheap.barrier_all()


@case
def case_rma_ring() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    rng = rng_for("rma_ring")
    nxt, prv = (me + 1) % n, (me - 1) % n
    m = 257
    for dtype in (np.float32, np.int64, np.uint8, np.float16, np.float64, np.int16):
        data = rng.integers(0, 100, size=(n, m)).astype(dtype)
        src = sn.empty(m, dtype=dtype)
        src[...] = data[me]
        dst = sn.empty(m, dtype=dtype)
        poison(dst)
        symheap.barrier_all()
        symheap.put(dst, src, nxt)
        symheap.quiet()
        symheap.barrier_all()
        assert np.array_equal(dst, data[prv]), dtype
        local = np.empty(m, dtype=dtype)
        symheap.get(local, src, prv)
        assert np.array_equal(local, data[prv])
        local2 = np.zeros(20, dtype=dtype)
        symheap.get_nbi(local2, src[100:120], nxt)
        symheap.quiet()
        assert np.array_equal(local2, data[nxt][100:120])
        symheap.barrier_all()
        plain = data[me][:10].copy()  # not symmetric
        symheap.put_nbi(dst[5:15], plain, nxt)
        symheap.quiet()
        symheap.barrier_all()
        assert np.array_equal(dst[5:15], data[prv][:10])
        assert np.array_equal(dst[15:], data[prv][15:])
        symheap.barrier_all()


@case
def case_atomics() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    K = 40
    ctr = sn.zeros(4, dtype=np.int64)
    u = sn.zeros(2, dtype=np.uint64)
    u32 = sn.zeros(1, dtype=np.uint32)
    i32 = sn.zeros(1, dtype=np.int32)
    f = sn.zeros(1, dtype=np.float64)
    olds = sn.empty(K, dtype=np.int64)
    symheap.barrier_all()
    for k in range(K):
        olds[k] = symheap.atomic_fetch_add(ctr, 1, 0)
        symheap.atomic_inc(ctr, 0, index=1)
    symheap.barrier_all()
    if me == 0:
        assert ctr[0] == n * K and ctr[1] == n * K, ctr
    assert symheap.atomic_fetch(ctr, 0) == n * K
    everyone = sn.empty(n * K, dtype=np.int64)
    symheap.all_gather(everyone, olds)
    assert sorted(everyone.tolist()) == list(range(n * K)), "every fetched value is unique"
    # compare_swap: exactly one PE wins.
    old = symheap.atomic_compare_swap(ctr, 0, me + 1, 0, index=2)
    won = sn.zeros(1, dtype=np.int64)
    won[0] = 1 if old == 0 else 0
    total = sn.zeros(1, dtype=np.int64)
    symheap.all_reduce(total, won)
    assert total[0] == 1
    winner = int(symheap.atomic_fetch(ctr, 0, index=2)) - 1
    assert 0 <= winner < n and (winner == me) == (old == 0)
    # Bitwise on uint64 / uint32.
    symheap.atomic_or(u, 1 << me, 0)
    symheap.atomic_fetch_or(u32, 1 << me, 0)
    symheap.barrier_all()
    assert symheap.atomic_fetch(u, 0) == (1 << n) - 1
    assert symheap.atomic_fetch(u32, 0) == (1 << n) - 1
    symheap.barrier_all()
    if me == 0:
        assert symheap.atomic_fetch_and(u, 0b1, 0) == (1 << n) - 1
        assert symheap.atomic_fetch_xor(u, 0b11, 0) == 1
        symheap.atomic_xor(u32, 0xFFFFFFFF, 0)
        assert symheap.atomic_fetch(u32, 0) == 0xFFFFFFFF ^ ((1 << n) - 1)
        symheap.atomic_and(u32, 0xF0, 0)
        assert u32[0] == (0xFFFFFFFF ^ ((1 << n) - 1)) & 0xF0
        assert u[0] == 0b10
    symheap.barrier_all()
    # Signed wrap-around and 32-bit.
    symheap.atomic_add(i32, -3, nxt)
    symheap.barrier_all()
    assert i32[0] == -3
    assert symheap.atomic_swap(i32, 2**31 - 1, me) == -3
    assert symheap.atomic_fetch_inc(i32, me) == 2**31 - 1
    assert i32[0] == -(2**31)
    # Float set / fetch / swap.
    symheap.atomic_set(f, me + 0.5, nxt)
    symheap.barrier_all()
    assert symheap.atomic_fetch(f, me) == prv + 0.5
    assert symheap.atomic_swap(f, -1.25, me) == prv + 0.5 and f[0] == -1.25
    assert symheap.atomic_fetch(u, me, index=1) == 0
    symheap.barrier_all()


@case
def case_signals() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    rng = rng_for("signals")
    R, m = 6, 64
    data = rng.standard_normal((n, R, m))
    buf = sn.zeros(R, m, dtype=np.float64)
    sig = sn.zeros(1, dtype=np.uint64)
    symheap.barrier_all()
    for k in range(R):
        symheap.put_signal(buf[k], data[me, k].copy(), sig, 1, nxt, op="add")
        got = symheap.signal_wait_until(sig, "ge", k + 1)
        assert got >= k + 1
        assert np.array_equal(buf[k], data[prv, k]), k
    symheap.barrier_all()
    assert symheap.signal_fetch(sig) == R
    flags = sn.zeros(2, dtype=np.uint64)
    symheap.barrier_all()
    symheap.put_signal(buf[0], data[me, 1].copy(), flags, 42, nxt, op="set", sig_index=1)
    assert symheap.signal_wait_until(flags, "==", 42, index=1) == 42
    assert np.array_equal(buf[0], data[prv, 1])
    assert symheap.signal_fetch(flags, 0) == 0
    symheap.barrier_all()


@case
def case_barrier() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    slots = sn.zeros(n, dtype=np.int64)
    symheap.barrier_all()
    for it in range(12):
        mine = np.array([it * 100 + me], dtype=np.int64)
        for r in range(n):
            symheap.put(slots[me : me + 1], mine, r)
        [symheap.barrier_all, symheap.sync_all, symheap.barrier, symheap.host_barrier][it % 4]()
        assert slots.tolist() == [it * 100 + r for r in range(n)], (it, slots)
        symheap.barrier(symheap.team_world())


@case
def case_teams() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    rng = rng_for("teams")
    data = rng.integers(-1000, 1000, size=(n, 8)).astype(np.int64)
    world = symheap.team_world()
    assert world.n_pes() == n and world.my_pe() == me and world.members == list(range(n))
    even = symheap.team_split_strided(world, 0, 2, (n + 1) // 2)
    members = list(range(0, n, 2))
    x = sn.empty(8, dtype=np.int64)
    x[...] = data[me]
    out = sn.empty(8, dtype=np.int64)
    poison(out)
    symheap.barrier_all()
    symheap.all_reduce(out, x, "sum", team=even)
    if me % 2 == 0:
        assert even.is_valid and even.my_pe() == me // 2 and even.n_pes() == len(members)
        assert even.members == members
        assert symheap.team_translate_pe(even, 1 % len(members), world) == members[1 % len(members)]
        assert symheap.team_translate_pe(world, me, even) == me // 2
        assert np.array_equal(out, data[members].sum(0))
    else:
        assert not even.is_valid and even.n_pes() == 0 and even.my_pe() is None
        assert symheap.team_translate_pe(world, me, even) is None
    symheap.barrier(even)
    # Broadcast from the team's last member (team index), gather inside the team.
    symheap.broadcast(out, x, root=len(members) - 1, team=even)
    if me % 2 == 0:
        assert np.array_equal(out, data[members[-1]])
    g = sn.empty(len(members), 8, dtype=np.int64)
    symheap.all_gather(g, x, team=even)
    if me % 2 == 0:
        assert np.array_equal(g, data[members])
    symheap.team_sync(even)
    symheap.team_destroy(even)
    if n >= 2:
        lo = n // 2
        upper = symheap.team_split_strided(None, lo, 1, n - lo)
        assert upper.is_valid == (me >= lo)
        symheap.all_reduce(out, x, "max", team=upper)
        if me >= lo:
            assert np.array_equal(out, data[lo:].max(0))
        symheap.team_destroy(upper)
    raises(SymheapValueError, symheap.team_split_strided, world, n, 1, 1)
    symheap.barrier_all()


def _ref(op: str, data: np.ndarray, dtype) -> np.ndarray:
    wide = data.astype(np.float64 if np.dtype(dtype).kind == "f" else np.int64)
    r = {"sum": wide.sum(0), "min": wide.min(0), "max": wide.max(0), "prod": wide.prod(0)}[op]
    return r.astype(dtype)


@case
def case_collectives() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    rng = rng_for("collectives")
    m = 33
    for dtype in (np.int32, np.int64, np.float32, np.float64):
        data = rng.integers(-20, 20, size=(n, n * m)).astype(dtype)
        src = sn.empty(n * m, dtype=dtype)
        src[...] = data[me]
        out = sn.empty(n * m, dtype=dtype)
        for op in ("sum", "min", "max", "prod"):
            for algo in ("auto", "two_shot"):
                poison(out)
                symheap.all_reduce(out, src, op, algo=algo)
                assert np.array_equal(out, _ref(op, data, dtype)), (dtype, op, algo)
        ip = sn.empty(n * m, dtype=dtype)
        ip[...] = data[me]
        symheap.all_reduce(ip, op="sum")
        assert np.array_equal(ip, _ref("sum", data, dtype))
        blk = sn.empty(m, dtype=dtype)
        blk[...] = data[me][:m]
        g = sn.empty(n, m, dtype=dtype)
        poison(g)
        symheap.all_gather(g, blk)
        assert np.array_equal(g, data[:, :m])
        poison(out)
        symheap.broadcast(out, src, root=n - 1)
        assert np.array_equal(out, data[n - 1])
        symheap.broadcast(ip, root=0)
        assert np.array_equal(ip, _ref("sum", data, dtype))
        a2a = sn.empty(n, m, dtype=dtype)
        poison(a2a)
        symheap.alltoall(a2a, src)
        for j in range(n):
            assert np.array_equal(a2a[j], data[j].reshape(n, m)[me])
        rs = sn.empty(m, dtype=dtype)
        poison(rs)
        symheap.reduce_scatter(rs, src, "sum")
        assert np.array_equal(rs, _ref("sum", data, dtype).reshape(n, m)[me])
    # Large enough for the two-shot path under "auto" (> 64 KiB).
    big = rng.integers(-1000, 1000, size=(n, 20000)).astype(np.float64)
    bs = sn.empty(20000)
    bs[...] = big[me]
    bo = sn.empty(20000)
    symheap.all_reduce(bo, bs)
    assert np.array_equal(bo, big.sum(0))
    symheap.barrier_all()


@case
def case_errors() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    x = sn.zeros(8, dtype=np.float32)
    y = sn.zeros(8, dtype=np.int64)
    symheap.barrier_all()
    raises(SymheapValueError, symheap.put, x, np.zeros(8, np.float32), n)  # PE out of range
    raises(SymheapValueError, symheap.put, x, np.zeros(8, np.float32), -1)
    raises(SymheapValueError, symheap.put, x, np.zeros(8, np.float64), 0)  # dtype
    raises(SymheapValueError, symheap.put, x, np.zeros(7, np.float32), 0)  # shape
    raises(SymheapValueError, symheap.put, np.zeros(8, np.float32), x, 0)  # not symmetric
    raises(SymheapValueError, symheap.get, np.zeros(8, np.float32), np.zeros(8, np.float32), 0)
    raises(SymheapValueError, symheap.put, sn.zeros(16, dtype=np.float32)[::2], x, 0)  # strided
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    raises(SymheapValueError, symheap.get, ro, x, 0)
    e = raises(SymheapValueError, symheap.atomic_fetch_add, x, 1, 0)  # from Rust
    assert isinstance(e, ValueError) and e.kind == "invalid_argument" and e.pe == me and e.call == "atomic"
    assert "not defined on float32" in str(e), str(e)
    raises(SymheapValueError, symheap.atomic_fetch, y, 0, index=8)
    raises(SymheapValueError, symheap.atomic_set, y, 2**70, 0)
    raises(SymheapValueError, symheap.atomic_xor, y, 1, 0)  # xor is unsigned-only
    raises(SymheapValueError, symheap.signal_wait_until, x, "ge", 1)  # not a u64 word
    raises(SymheapValueError, symheap.signal_wait_until, sn.zeros(1, dtype=np.uint64), "almost", 1)
    raises(
        SymheapValueError, symheap.all_gather, sn.zeros(8, dtype=np.float32), sn.zeros(8, dtype=np.float32)
    ) if n > 1 else None
    raises(SymheapValueError, symheap.all_reduce, x, y)  # dtypes differ
    raises(SymheapValueError, symheap.all_reduce, x, op="median")
    raises(SymheapValueError, symheap.broadcast, x, root=n)
    raises(SymheapValueError, symheap.alltoall, x, x)  # in place: rejected by Rust
    raises(SymheapValueError, sn.get_peer_array, x, n)
    raises(SymheapValueError, sn.get_peer_bases, np.zeros(3))
    raises(SymheapValueError, sn.empty, 2, dtype=np.complex64)
    raises(SymheapValueError, sn.empty, 2, dtype=bool)
    raises(SymheapValueError, sn.empty, -1)
    raises(TypeError, symheap.put, [1.0] * 8, x, 0)
    # Out of symmetric memory (the same on every PE, so the heap stays consistent).
    e = raises(SymheapMemoryError, sn.empty, 1 << 40, dtype=np.uint8)
    assert isinstance(e, MemoryError) and e.kind == "out_of_memory" and "out of symmetric memory" in str(e)
    # Unsupported: bfloat16 has no NumPy array interface.
    bf = symheap.allocate((4,), "bfloat16")
    e = raises(SymheapUnsupportedError, lambda: bf.__array_interface__)
    # The context still works after rejected calls.
    y[...] = me + 1
    z = sn.zeros(8, dtype=np.int64)
    symheap.all_reduce(z, y)
    assert z.tolist() == [n * (n + 1) // 2] * 8
    symheap.barrier_all()


def _ring_check_tail(put_tail, read_tail, n: int, me: int, name: str) -> None:
    """Every PE puts 4 KiB of random bytes into the last 4 KiB of its right neighbour's buffer
    (memory only just added to every heap) and checks what its left neighbour put."""
    data = rng_for(name).integers(0, 256, size=(n, 4096), dtype=np.uint8)
    put_tail(data[me], (me + 1) % n)
    symheap.barrier_all()
    assert np.array_equal(read_tail(), data[(me - 1) % n])
    symheap.barrier_all()


@case
def case_grow_failure() -> None:
    """Heap growth that fails on one PE (its file-size limit is below a chunk, so sizing the
    chunk's memfd fails with EFBIG) fails the allocation on every PE with the same
    SymheapMemoryError naming that PE; no heap grows, nobody hangs, and the context keeps
    working. With the limit lifted the same allocation grows every heap."""
    import resource
    import signal

    me, n = symheap.my_pe(), symheap.n_pes()
    short = n - 1
    symheap.barrier_all()
    u0 = symheap.heap_usage()
    size = u0["mapped"] + (1 << 20)  # more than the whole heap: it must grow
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    if me == short:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the failure is reported as EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, old[1]))
    e = raises(SymheapMemoryError, sn.empty, size, dtype=np.uint8)
    msg = str(e)
    assert e.kind == "out_of_memory" and e.pe == me, msg
    assert f"failed on PE {short}: " in msg and "no PE grew" in msg and "File too large" in msg, msg
    assert symheap.heap_usage()["mapped"] == u0["mapped"]
    y = sn.zeros(4, dtype=np.int64)
    # Every PE on its own node (PE_CASES_NODE_PER_PE): peers' heaps are not mapped here, and
    # the host backend's data paths reach only PEs of this node; only host collectives run.
    local = all(b != 0 for b in sn.get_peer_bases(y).tolist())
    if local:
        # The heap is still symmetric and usable: a collective on existing memory.
        y[...] = me + 1
        z = sn.zeros(4, dtype=np.int64)
        symheap.all_reduce(z, y)
        assert z.tolist() == [n * (n + 1) // 2] * 4
    symheap.barrier_all()
    if me == short:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    a = sn.empty(size, dtype=np.uint8)
    assert symheap.heap_usage()["mapped"] > u0["mapped"]
    if local:
        tail = a[-4096:]
        _ring_check_tail(lambda d, pe: symheap.put(tail, d, pe), lambda: tail, n, me, "grow_failure")
    symheap.barrier_all()


@case
def case_torch_grow_failure() -> None:
    """On the CUDA backend: the last PE's GPU is filled (by PyTorch) so that cuMemCreate of a
    heap chunk fails there; every PE gets the same SymheapMemoryError naming that PE and the
    CUDA error, no heap grows, and once that memory is freed the allocation succeeds."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    short = n - 1
    symheap.barrier_all()
    u0 = symheap.heap_usage()
    size = u0["mapped"] + (1 << 20)
    filler = None
    if me == short:
        free, _ = torch.cuda.mem_get_info()
        # Leave less than one chunk (SYMHEAP_CHUNK_SIZE, 64 MiB by default) free.
        filler = torch.empty(max(free - (16 << 20), 0), dtype=torch.uint8, device=st.device())
    symheap.barrier_all()
    e = raises(SymheapMemoryError, st.empty, size, dtype=torch.uint8)
    msg = str(e)
    assert e.kind == "out_of_memory" and e.pe == me, msg
    assert f"failed on PE {short}: " in msg and "OUT_OF_MEMORY" in msg and "no PE grew" in msg, msg
    assert symheap.heap_usage()["mapped"] == u0["mapped"]
    symheap.barrier_all()
    del filler
    torch.cuda.empty_cache()
    a = st.empty(size, dtype=torch.uint8)
    assert symheap.heap_usage()["mapped"] > u0["mapped"]
    tail = a[-4096:]

    def put_tail(d, pe):
        symheap.put(tail, torch.from_numpy(d).to(tail.device), pe)
        torch.cuda.synchronize()

    _ring_check_tail(put_tail, lambda: tail.cpu().numpy(), n, me, "torch_grow_failure")


@case
def case_mismatch() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    if n < 2:
        return
    x = sn.zeros(4, dtype=np.int32)
    symheap.barrier_all()
    e = raises(SymheapMismatchError, symheap.broadcast, x, root=me)  # roots differ
    assert e.kind == "collective_mismatch" and "broadcast" in str(e), str(e)
    raises(SymheapError, symheap.barrier_all)  # the context is poisoned


@case
def case_timeout() -> None:
    me = symheap.my_pe()
    sig = sn.zeros(1, dtype=np.uint64)
    symheap.barrier_all()
    t0 = time.monotonic()
    if me == 0:
        e = raises(SymheapTimeoutError, symheap.signal_wait_until, sig, "ge", 1)
        assert isinstance(e, TimeoutError) and e.kind == "timeout"
    else:
        e = raises(SymheapError, symheap.barrier_all)
        assert isinstance(e, (SymheapTimeoutError, SymheapPeerError)), type(e)
    assert time.monotonic() - t0 < 20
    raises(SymheapError, symheap.barrier_all)


@case
def case_peer_abort() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    symheap.barrier_all()
    t0 = time.monotonic()
    if me == n - 1:
        symheap.abort("test abort from the last PE")
    e = raises(SymheapPeerError, symheap.barrier_all)
    assert "test abort from the last PE" in str(e) or me == n - 1, str(e)
    assert time.monotonic() - t0 < 15


@case
def case_peer_exit() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    if n < 2:
        return
    symheap.barrier_all()
    if me == n - 1:
        print("PASS peer_exit", flush=True)
        os._exit(0)
    t0 = time.monotonic()
    e = raises(SymheapPeerError, symheap.barrier_all)
    assert f"PE {n - 1}" in str(e), str(e)
    assert time.monotonic() - t0 < 15


@case
def case_gc() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    symheap.barrier_all()
    u0 = symheap.heap_usage()
    arrs = [sn.zeros(1000, dtype=np.float32) for _ in range(5)]
    a, pb = sn.allocate_symmetric(100)
    peer = sn.get_peer_array(arrs[0], (me + 1) % n)
    view = arrs[1][10:20]
    cap = np.from_dlpack(arrs[2].base)
    buf = symheap.allocate((10,), "int32")
    table = np.asarray(buf.peer_bases_view())
    del arrs[3]
    symheap.barrier_all()
    u1 = symheap.heap_usage()
    assert u1["live_blocks"] == u0["live_blocks"] + 6 and u1["in_use"] > u0["in_use"], (u0, u1)
    del arrs, a, pb, peer, view, cap, buf, table
    gc.collect()
    symheap.barrier_all()
    u2 = symheap.heap_usage()
    assert u2["in_use"] == u0["in_use"] and u2["live_blocks"] == u0["live_blocks"], (u0, u2)
    # Explicit free: later use raises.
    b = symheap.allocate((16,), "float64")
    arr = np.asarray(b)
    b.free()
    b.free()
    assert b.freed
    raises(SymheapValueError, b.tobytes)
    raises(SymheapValueError, b.peer_bases)
    raises(SymheapValueError, lambda: b.__array_interface__)
    raises(SymheapValueError, b.__dlpack__)
    symheap.barrier_all()  # every PE released it: reclaimed here
    raises(SymheapValueError, symheap.put, arr, np.zeros(16), 0)  # no longer a live allocation
    del arr
    c = sn.zeros(8)
    sn.free(c)
    symheap.free(symheap.allocate((3,), "uint8"))
    symheap.barrier_all()
    u3 = symheap.heap_usage()
    assert u3["in_use"] == u0["in_use"] and u3["live_blocks"] == u0["live_blocks"], (u0, u3)


@case
def case_dlpack() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    buf = symheap.allocate((3, 4), "float32")
    arr = np.asarray(buf)
    assert arr.base is buf and arr.shape == (3, 4) and arr.dtype == np.float32
    arr[...] = np.arange(12).reshape(3, 4)
    d = np.from_dlpack(buf)
    assert d.shape == (3, 4) and d.dtype == np.float32 and np.shares_memory(d, arr)
    d[0, 0] = 42
    assert arr[0, 0] == 42 and buf.__dlpack_device__() == (1, 0)
    cap = buf.__dlpack__()  # an unconsumed capsule frees its tensor
    del cap
    cap = buf.__dlpack__(max_version=(1, 0))
    del cap

    class Legacy:
        """A producer of the unversioned capsule only (NumPy falls back to it)."""

        def __dlpack__(self, stream=None):
            return buf.__dlpack__()

        def __dlpack_device__(self):
            return buf.__dlpack_device__()

    old = np.from_dlpack(Legacy())
    assert np.array_equal(old, arr) and ptr(old) == buf.addr
    for dt in (
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    ):
        b = symheap.allocate((5, 2), dt)
        x = np.from_dlpack(b)
        assert x.dtype == np.dtype(dt) and x.shape == (5, 2) and ptr(x) == b.addr
        y = np.asarray(b)
        assert y.dtype == np.dtype(dt) and ptr(y) == b.addr
    # A peer view through DLPack, strided.
    symheap.barrier_all()
    nxt = (me + 1) % n
    pv = sn.get_peer_array(arr[:, ::2], nxt)
    assert pv.shape == (3, 2) and pv.strides == arr[:, ::2].strides
    view = symheap.context().native.view(symheap.context().native.translate(ptr(arr), me, nxt), [3, 4], "float32")
    pd = np.from_dlpack(view)
    assert np.array_equal(pd[:, ::2], pv)
    symheap.barrier_all()
    assert pd[0, 0] == 42 and pd[2, 3] == 11
    raises(SymheapValueError, symheap.context().native.view, 1234, [4], "float32")
    z = sn.empty(0)
    assert z.shape == (0,) and z.size == 0
    bf = symheap.allocate((2,), "bfloat16")
    try:
        np.from_dlpack(bf)  # NumPy has no bfloat16: must raise, not crash
    except Exception:
        pass
    symheap.barrier_all()


def _store_dir() -> str:
    return os.environ["SYMHEAP_TEST_STORE"]


@case
def case_store_init() -> None:
    from filestore import FileStore

    r, n = env_rank()
    st = FileStore(_store_dir(), timeout=20)
    with symheap.init(store=st, rank=r, world_size=n):
        assert symheap.my_pe() == r and symheap.n_pes() == n
        x = sn.zeros(4, dtype=np.int64)
        x[...] = r
        y = sn.zeros(4, dtype=np.int64)
        symheap.barrier_all()
        symheap.all_reduce(y, x)
        assert y.tolist() == [n * (n - 1) // 2] * 4
        del x, y
        gc.collect()
        symheap.barrier_all()  # exchanges the releases through the store
        assert symheap.heap_usage()["live_blocks"] == 0


@case
def case_store_abort() -> None:
    from filestore import FileStore

    r, n = env_rank()
    st = FileStore(_store_dir(), timeout=20)
    symheap.init(store=st, rank=r, world_size=n)
    symheap.barrier_all()
    t0 = time.monotonic()
    if r == n - 1:
        symheap.abort("store abort from the last PE")
    e = raises(SymheapPeerError, symheap.barrier_all)
    assert "store abort from the last PE" in str(e) or r == n - 1, str(e)
    assert time.monotonic() - t0 < 10


@case
def case_comm_init() -> None:
    from filestore import FileComm, FileStore

    r, n = env_rank()
    comm = FileComm(FileStore(_store_dir(), timeout=20), r, n)
    with symheap.init(comm=comm):
        assert symheap.my_pe() == r and symheap.n_pes() == n
        x = sn.full(3, r + 1, dtype=np.int32)
        out = sn.zeros(3, dtype=np.int32)
        symheap.all_reduce(out, x, "prod")
        import math

        assert out.tolist() == [math.factorial(n)] * 3


@case
def case_torch() -> None:
    """The PyTorch front on this backend's device (CPU tensors on the host backend, CUDA
    tensors on the CUDA backend). Stream semantics: reads after symheap.barrier_all()."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    dev = st.device()
    gen = torch.Generator().manual_seed(zlib.crc32(b"torch"))
    symheap.barrier_all()
    u0 = symheap.heap_usage()
    t, pb = st.allocate_symmetric(4, 8, dtype=torch.float32)
    assert t.device == dev and t.shape == (4, 8) and t.dtype == torch.float32
    assert pb.dtype == torch.int64 and pb.device == dev and tuple(pb.shape) == (n,)
    pbl = pb.tolist()
    assert pbl[me] == t.data_ptr()
    v = t[1:]
    tv = st.get_peer_bases(v).tolist()
    assert tv[me] == v.data_ptr() and all(tv[r] == pbl[r] + 32 for r in range(n))
    u, pu = st.allocate_symmetric(16, dtype=torch.int64)
    pul = pu.tolist()
    assert all(pul[r] - pul[me] == pbl[r] - pbl[me] for r in range(n))
    m = st.symmetric_address_map(v)
    assert m.allocation_base == t.data_ptr() and m.peer_bases.tolist() == pbl and m.direct == [True] * n
    assert st.is_symmetric(v) and not st.is_symmetric(torch.zeros(3, device=dev))
    assert symheap.is_symmetric(t) and symheap.get_peer_bases(t).tolist() == pbl
    # Stores through a peer tensor.
    u.fill_(-1)
    symheap.barrier_all()
    peer = st.get_peer_tensor(u, nxt)
    assert peer.data_ptr() == pul[nxt] and peer.device == dev
    peer[me] = 100 + me
    symheap.barrier_all()
    expect = [-1] * 16
    expect[prv] = 100 + prv
    assert u.tolist() == expect, u
    # Factories.
    assert st.zeros(3, dtype=torch.int32).tolist() == [0, 0, 0]
    assert st.ones(2, 2).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert st.full((2,), 7, dtype=torch.int16).tolist() == [7, 7]
    assert st.arange(5, dtype=torch.int64).tolist() == list(range(5))
    r1 = st.rand(64, generator=gen if dev.type == "cpu" else None)
    assert float(r1.min()) >= 0.0 and float(r1.max()) < 1.0
    r2 = st.randn(64, dtype=torch.float64)
    assert r2.dtype == torch.float64 and st.is_symmetric(r2)
    c = st.as_symmetric(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert st.is_symmetric(c) and c.tolist() == [[0, 1, 2], [3, 4, 5]] and st.as_symmetric(c) is c
    # RMA, atomics and signals on tensors (collectives: case_torch_coll).
    data = torch.randint(-20, 20, (n, n * 8), generator=gen)
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.float16):
        src = st.empty(n * 8, dtype=dtype)
        src.copy_(data[me].to(dtype))
        dst = st.zeros(n * 8, dtype=dtype)
        symheap.barrier_all()
        symheap.put(dst, src, nxt)
        symheap.barrier_all()
        assert torch.equal(dst.cpu(), data[prv].to(dtype)), dtype
        loc = torch.zeros(n * 8, dtype=dtype, device=dev)
        symheap.get(loc, src, prv)
        symheap.quiet()
        assert torch.equal(loc.cpu(), data[prv].to(dtype))
        symheap.barrier_all()
    ctr = st.zeros(2, dtype=torch.int64)
    symheap.barrier_all()
    for _ in range(10):
        symheap.atomic_fetch_add(ctr, 1, 0)
    symheap.barrier_all()
    assert symheap.atomic_fetch(ctr, 0) == 10 * n
    sig = st.zeros(1, dtype=torch.int64)
    buf = st.zeros(8, dtype=torch.float32)
    symheap.barrier_all()
    symheap.put_signal(buf, data[me, :8].to(torch.float32).to(dev), sig, 1, nxt, op="add")
    symheap.signal_wait_until(sig, "ge", 1)
    assert torch.equal(buf.cpu(), data[prv, :8].to(torch.float32))
    # Errors.
    other = "cuda" if dev.type == "cpu" else "cpu"
    raises(SymheapValueError, st.empty, 2, device=other)
    raises(SymheapValueError, symheap.put, t, torch.zeros(4, 8, dtype=torch.float64, device=dev), nxt)
    raises(SymheapValueError, st.empty, 2, dtype=torch.bool)
    raises(SymheapValueError, st.get_peer_tensor, t, n)
    # Release: every tensor and table gone, the heap is back where it was.
    symheap.barrier_all()
    del t, pb, v, u, pu, m, peer, r1, r2, c, src, dst, loc, ctr, sig, buf
    gc.collect()
    symheap.host_barrier()
    u1 = symheap.heap_usage()
    assert u1["in_use"] == u0["in_use"] and u1["live_blocks"] == u0["live_blocks"], (u0, u1)
    symheap.barrier_all()


@case
def case_torch_coll() -> None:
    """Collectives on tensors (on the CUDA backend: the stream kernels), vs torch references."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    gen = torch.Generator().manual_seed(zlib.crc32(b"torch_coll"))
    data = torch.randint(-20, 20, (n, n * 8), generator=gen)
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.float16, torch.int64):
        src = st.empty(n * 8, dtype=dtype)
        src.copy_(data[me].to(dtype))
        dst = st.zeros(n * 8, dtype=dtype)
        symheap.barrier_all()
        out = st.zeros(n * 8, dtype=dtype)
        symheap.all_reduce(out, src, "sum")
        symheap.barrier_all()
        assert torch.equal(out.cpu(), data.sum(0).to(dtype)), (dtype, out, data.sum(0))
        g = st.zeros(n, n * 8, dtype=dtype)
        symheap.all_gather(g, src)
        symheap.broadcast(dst, src, root=n - 1)
        a2a = st.zeros(n, 8, dtype=dtype)
        symheap.alltoall(a2a, src)
        rs = st.zeros(8, dtype=dtype)
        symheap.reduce_scatter(rs, src, "max")
        symheap.barrier_all()
        assert torch.equal(g.cpu(), data.to(dtype))
        assert torch.equal(dst.cpu(), data[n - 1].to(dtype))
        for j in range(n):
            assert torch.equal(a2a[j].cpu(), data[j].reshape(n, 8)[me].to(dtype))
        assert torch.equal(rs.cpu(), data.max(0).values.reshape(n, 8)[me].to(dtype))
        symheap.barrier_all()


@case
def case_torch_release_order() -> None:
    """A CUDA tensor deleted right after an asynchronous put into it (still pending behind a
    closed gate on a stream) is not reused by any PE until the put finished; then it is. The
    reclaim points are host barriers (on CUDA, barrier_all is a stream barrier)."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    nxt = (me + 1) % n
    s = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    gate = st.zeros(1, dtype=torch.int64)
    src = torch.full((1 << 18,), me + 1, dtype=torch.int32, device=st.device())
    x = st.zeros(1 << 18, dtype=torch.int32)
    old = x.data_ptr()
    torch.cuda.synchronize()
    symheap.host_barrier()
    symheap.signal_wait_until(gate, "ge", 1, stream=s)
    symheap.put(x, src, nxt, stream=s)
    del x
    gc.collect()
    symheap.host_barrier()  # every PE released x; its put is still pending everywhere
    assert symheap.heap_usage()["waiting_releases"] == 1, symheap.heap_usage()
    y = st.zeros(1 << 18, dtype=torch.int32)
    cur.synchronize()  # not torch.cuda.synchronize(): that would wait for the gated stream
    assert y.data_ptr() != old, "memory reused while a put into it was pending"
    symheap.host_barrier()
    gate.fill_(1)
    cur.synchronize()
    s.synchronize()
    symheap.host_barrier()  # the put finished everywhere: x is reclaimed here
    assert int(y.abs().sum()) == 0, "the pending put landed in the new tensor"
    assert symheap.heap_usage()["waiting_releases"] == 0, symheap.heap_usage()
    z = st.zeros(1 << 18, dtype=torch.int32)
    assert z.data_ptr() == old, (
        f"the released memory was not reclaimed after the stream finished: x {old:#x}, "
        f"y {y.data_ptr():#x}, z {z.data_ptr():#x}, {symheap.heap_usage()}"
    )
    torch.cuda.synchronize()
    symheap.host_barrier()


@case
def case_torch_dist() -> None:
    """init() from an initialised torch.distributed (gloo): its store drives the rendezvous."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    with symheap.init():
        assert symheap.my_pe() == r and symheap.n_pes() == n
        x = sn.full(4, r, dtype=np.int64) if symheap.backend() == "host" else None
        if x is not None:
            y = sn.zeros(4, dtype=np.int64)
            symheap.all_reduce(y, x)
            assert y.tolist() == [n * (n - 1) // 2] * 4
        symheap.barrier_all()
    dist.destroy_process_group()


def main(argv) -> int:
    names = argv[1:]
    if os.environ.get("PE_CASES_NODE_PER_PE"):
        # Every PE its own node: no shared memory between PEs, only the network paths.
        os.environ["SYMHEAP_NODE_ID"] = f"pe-cases-node-{env_rank()[0]}"
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"unknown cases: {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    for name in names:
        if name not in OWN_INIT and not symheap.is_initialized():
            symheap.init()
        CASES[name]()
        print(f"PASS {name}", flush=True)
    try:
        symheap.finalize()
    except SymheapError:
        if not POISONED.intersection(names):
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
