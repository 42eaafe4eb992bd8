"""PE-side cases of the NumPy front on the host backend (see pe_cases.py for how they run):
init and finalize, the symmetric-memory contract, RMA, atomics, signals, teams, collectives,
errors, heap growth that fails on one PE, failed jobs (divergence, timeout, a PE aborting or
exiting), garbage collection, DLPack, and init over a user's store or communicator."""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import symheap
import symheap.numpy as sn
from pe_common import case, env_rank, poison, ptr, raises, ring_check_tail, rng_for
from symheap import (
    SymheapError,
    SymheapMemoryError,
    SymheapMismatchError,
    SymheapPeerError,
    SymheapTimeoutError,
    SymheapUnsupportedError,
    SymheapValueError,
)


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
    assert isinstance(e, ValueError) and e.kind == "invalid_argument" and e.pe == me and e.call == "atomic_fetch_add"
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
        ring_check_tail(lambda d, pe: symheap.put(tail, d, pe), lambda: tail, n, me, "grow_failure")
    symheap.barrier_all()


@case
def case_mismatch() -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    if n < 2:
        return
    x = sn.zeros(1024, dtype=np.int32)  # 4 KiB: a broadcast that meets at its entry barrier
    symheap.barrier_all()
    e = raises(SymheapMismatchError, symheap.broadcast, x, root=me)  # roots differ
    assert e.kind == "collective_mismatch" and "broadcast" in str(e), str(e)
    raises(SymheapError, symheap.barrier_all)  # the context is poisoned


@case
def case_mismatch_eager() -> None:
    """Every PE takes itself for the root of a 16-byte broadcast: eager on the host backend,
    so each root returns at once; the divergence is named at the next call that waits."""
    me, n = symheap.my_pe(), symheap.n_pes()
    if n < 2:
        return
    x = sn.zeros(4, dtype=np.int32)
    symheap.barrier_all()
    symheap.broadcast(x, root=me)
    e = raises(SymheapMismatchError, symheap.barrier_all)
    text = str(e)
    assert e.kind == "collective_mismatch", text
    assert "broadcast(root 0" in text and "broadcast(root 1" in text, text
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
def case_signal_timeout_names_the_silent_pe() -> None:
    """PE 1 feeds PE 0's signal word once, then stops; PE 2 signals another word of PE 0 while
    PE 0 waits. PE 0's timeout names PE 1, the feeder that went silent, and what PE 2 sent."""
    me = symheap.my_pe()
    sig = sn.zeros(2, dtype=np.uint64)
    data = sn.zeros(1, dtype=np.uint64)
    one = np.ones(1, dtype=np.uint64)
    symheap.barrier_all()
    if me == 1:
        symheap.put_signal(data, one, sig[0:1], 1, 0)
    symheap.barrier_all()
    if me == 0:
        e = raises(SymheapTimeoutError, symheap.signal_wait_until, sig[0:1], "ge", 2)
        text = str(e)
        assert e.missing == (1,), text
        assert "(it is 1; put_signal calls to this PE during the wait: PE 2 sent 1)" in text, text
        assert text.endswith("PE 1 did not arrive"), text
    else:
        if me == 2:
            time.sleep(0.3)
            symheap.put_signal(data, one, sig[1:2], 1, 0)
        # The others' barrier must time out after PE 0's wait does: a barrier verdict that
        # reaches PE 0 first is what PE 0 reports (both timers are SYMHEAP_TIMEOUT long).
        time.sleep(1.0)
        e = raises(SymheapError, symheap.barrier_all)
        assert isinstance(e, (SymheapTimeoutError, SymheapPeerError)), type(e)
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
    # Explicit free: later use raises, and so does a second free.
    b = symheap.allocate((16,), "float64")
    arr = np.asarray(b)
    b.free()
    raises(SymheapValueError, b.free)
    assert b.freed
    raises(SymheapValueError, b.tobytes)
    raises(SymheapValueError, b.peer_bases)
    raises(SymheapValueError, getattr, b, "__array_interface__")
    raises(SymheapValueError, b.__dlpack__)
    symheap.barrier_all()  # every PE released it, but arr still shows it: not reclaimed yet
    raises(SymheapValueError, symheap.put, arr, np.zeros(16), 0)  # a freed allocation
    del arr, b  # nothing shows its memory any more: reclaimed at the next collective point
    c = sn.zeros(8)
    sn.free(c)
    raises(SymheapValueError, sn.free, c)
    del c
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
