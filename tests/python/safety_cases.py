"""PE-side cases of "no silent data loss" (test_safety.py runs them under the launcher):

    python -m symheap.launch -n N -- python tests/python/safety_cases.py CASE [CASE...]

Use after free, a different buffer on one PE, objects of different sizes, and every kind of
divergence between PEs' collective calls, which must fail fast with a named mismatch on every
PE. A divergence case prints ``MISMATCH <seconds> <crc of the message>`` so the test can check
that every PE reported the same text within its time bound.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
import zlib
from typing import Callable, Dict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import symheap  # noqa: E402
import symheap.numpy as sn  # noqa: E402
from symheap import SymheapError, SymheapMismatchError, SymheapValueError  # noqa: E402

CASES: Dict[str, Callable[[], None]] = {}
# Cases that leave the job failed on purpose.
POISONED = set()


def case(poisons: bool = False):
    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        name = fn.__name__.removeprefix("case_")
        CASES[name] = fn
        if poisons:
            POISONED.add(name)
        return fn

    return wrap


def raises(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        assert isinstance(e, SymheapError), f"{type(e)} is not a SymheapError"
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")


def freed_refused(fn, *args, **kw) -> None:
    e = raises(SymheapValueError, fn, *args, **kw)
    assert "freed" in str(e), str(e)


@case()
def case_use_after_free() -> None:
    """Every operation on a freed buffer, a view of it or an array aliasing it is refused,
    before and after another allocation took its memory; nothing reaches the peer."""
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt = (me + 1) % n
    rng = np.random.default_rng(7 + me)
    a = sn.zeros(64, dtype=np.int64)
    view = a[8:40]
    src = rng.integers(1, 1 << 40, 64).astype(np.int64)
    sig = sn.zeros(1, dtype=np.uint64)
    symheap.barrier_all()
    symheap.free(a)
    freed_refused(symheap.put, a, src, nxt)
    freed_refused(symheap.put, view, src[:32], nxt)
    freed_refused(symheap.put_nbi, a, src, nxt)
    freed_refused(symheap.get, src, a, nxt)
    freed_refused(symheap.atomic_add, a[:1], 1, nxt)
    freed_refused(symheap.put_signal, a, src, sig, 1, nxt)
    freed_refused(symheap.all_reduce, view)
    freed_refused(symheap.broadcast, a, root=0)
    freed_refused(symheap.get_peer_array, a, nxt)
    assert not symheap.is_symmetric(a) and not symheap.is_symmetric(view)
    # Every PE freed it, but `a` and `view` still show its memory: it is not reclaimed while
    # they exist, so the next allocation of its size goes elsewhere.
    symheap.barrier_all()
    base = int(a.__array_interface__["data"][0])
    c = sn.zeros(64, dtype=np.int64)
    held = int(c.__array_interface__["data"][0]) != base
    symheap.barrier_all()
    freed_refused(symheap.put, a, src, nxt)
    freed_refused(symheap.put, view, src[:32], nxt)
    symheap.barrier_all()
    assert (c == 0).all(), "a stale put landed in another buffer"
    symheap.barrier_all()
    symheap.put(c, src, nxt)  # the new buffer itself works
    symheap.barrier_all()
    want = np.random.default_rng(7 + (me - 1) % n).integers(1, 1 << 40, 64).astype(np.int64)
    assert (c == want).all()
    # Once nothing shows it, the memory goes back to the heap and is reused.
    del a, view
    gc.collect()  # the refusals' tracebacks hold `a` in reference cycles
    symheap.barrier_all()
    d = sn.zeros(64, dtype=np.int64)
    reused = int(d.__array_interface__["data"][0]) == base
    print(f"HELD {held} REUSED {int(reused)}", flush=True)


@case()
def case_use_after_free_torch() -> None:
    """The same for CPU tensors (torch's own views of a symmetric tensor)."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    nxt = (me + 1) % n
    a = st.zeros(32, dtype=torch.int32)
    view = a[4:20]
    src = torch.arange(32, dtype=torch.int32) + 100 * me
    symheap.barrier_all()
    st.free(a)
    freed_refused(symheap.put, a, src, nxt)
    freed_refused(symheap.put, view, src[:16], nxt)
    freed_refused(symheap.all_reduce, a)
    freed_refused(st.get_peer_tensor, a, nxt)
    symheap.barrier_all()
    c = st.zeros(32, dtype=torch.int32)
    symheap.barrier_all()
    freed_refused(symheap.put, a, src, nxt)
    symheap.barrier_all()
    assert int(c.abs().sum()) == 0
    symheap.barrier_all()
    symheap.put(c, src, nxt)
    symheap.barrier_all()
    assert c.tolist() == (torch.arange(32, dtype=torch.int32) + 100 * ((me - 1) % n)).tolist()


@case()
def case_object_bytes() -> None:
    """all_gather_object_bytes takes contributions of different lengths (what it is for)."""
    me, n = symheap.my_pe(), symheap.n_pes()
    got = symheap.all_gather_object_bytes(bytes([me]) * (3 * me + 1))
    assert [len(g) for g in got] == [3 * r + 1 for r in range(n)], [len(g) for g in got]
    assert all(g == bytes([r]) * (3 * r + 1) for r, g in enumerate(got))
    # Empty contributions: on PE 0 only (the others once waited for it until the timeout, as
    # the empty payload skipped its exchange), on every PE (n empty parts, not an empty list),
    # and random lengths with zeros among them.
    got = symheap.all_gather_object_bytes(bytes([me]) * (3 * me))
    assert got == [bytes([r]) * (3 * r) for r in range(n)], got
    assert symheap.all_gather_object_bytes(b"") == [b""] * n
    for k in range(4):
        parts = [_random_part(k, r) for r in range(n)]
        assert symheap.all_gather_object_bytes(parts[me]) == parts, k


def _random_part(k: int, r: int) -> bytes:
    rng = random.Random(1000 * k + r)
    return rng.randbytes(rng.choice([0, 0, 1, 5, 300]))


# ---- divergence: one PE (the last) makes a different call; every PE must name it at once ----


def diverge(others: Callable[[], None], last: Callable[[], None], must_name=()) -> None:
    me, n = symheap.my_pe(), symheap.n_pes()
    symheap.barrier_all()
    t0 = time.monotonic()
    try:
        (last if me == n - 1 else others)()
        # The diverging call may complete on some PEs (a collective of a sub-team); the next
        # world barrier must then fail.
        symheap.barrier_all()
    except SymheapMismatchError as e:
        dt = time.monotonic() - t0
        msg = str(e).split(": ", 1)[1]  # the text after "symheap PE r" is the same everywhere
        msg = msg[msg.index("collective calls diverged") :]
        for word in must_name:
            assert word in msg, f"{word!r} not named in: {msg}"
        assert f"PE {me} did not arrive" not in msg, msg
        print(f"MISMATCH {dt:.3f} {zlib.crc32(msg.encode()):08x} {msg}", flush=True)
        return
    raise AssertionError("the divergence was not reported")


def _x() -> np.ndarray:
    return sn.full(256, symheap.my_pe() + 1, dtype=np.float32)


@case(poisons=True)
def case_barrier_vs_all_reduce() -> None:
    x = _x()
    diverge(lambda: symheap.all_reduce(x), symheap.barrier_all, ("all_reduce", "barrier_all"))


@case(poisons=True)
def case_barrier_vs_broadcast() -> None:
    x = _x()
    diverge(lambda: symheap.broadcast(x, root=0), symheap.barrier_all, ("broadcast", "barrier_all"))


@case(poisons=True)
def case_skipped_all_reduce() -> None:
    x = _x()

    def others() -> None:
        symheap.all_reduce(x)
        symheap.barrier_all()

    diverge(others, symheap.barrier_all, ("all_reduce",))


@case(poisons=True)
def case_different_buffer() -> None:
    """Same call, count and dtype, but the last PE passes another buffer: a silent wrong
    result before; a named mismatch now (the ledger records the buffers' heap offsets)."""
    x, y = _x(), _x()
    diverge(lambda: symheap.all_reduce(x), lambda: symheap.all_reduce(y), ("all_reduce", "heap+"))


@case(poisons=True)
def case_skipped_split() -> None:
    n = symheap.n_pes()

    def others() -> None:
        t = symheap.team_split_strided(symheap.team_world(), 0, 1, n)
        symheap.barrier(t)

    diverge(others, symheap.barrier_all, ("team_split_strided", "barrier_all"))


@case(poisons=True)
def case_skipped_destroy() -> None:
    n = symheap.n_pes()
    t = symheap.team_split_strided(symheap.team_world(), 0, 1, n)
    diverge(lambda: symheap.team_destroy(t), symheap.barrier_all, ("team_destroy",))


@case(poisons=True)
def case_growth_on_one_pe() -> None:
    """The last PE's allocation needs the heap to grow, the others' fits: the grower meets the
    others' next call and both are named."""

    def others() -> None:
        sn.zeros(1 << 10, dtype=np.uint8)
        symheap.barrier_all()

    def last() -> None:
        sn.zeros(96 << 20, dtype=np.uint8)

    diverge(others, last, ("allocate",))


@case(poisons=True)
def case_world_vs_sub_team() -> None:
    """The same all_reduce on the world team and on a team of the same PEs: different teams,
    so no barrier meets; the watch names both."""
    n = symheap.n_pes()
    t = symheap.team_split_strided(symheap.team_world(), 0, 1, n)
    x = _x()
    diverge(lambda: symheap.all_reduce(x), lambda: symheap.all_reduce(x, team=t), ("all_reduce", "team slot"))


@case(poisons=True)
def case_concurrent_sub_teams() -> None:
    """Two teams work at once (even and odd PEs); one member of the odd team diverges. Every PE
    of both teams gets the same named mismatch."""
    me, n = symheap.my_pe(), symheap.n_pes()
    assert n >= 4
    world = symheap.team_world()
    even = symheap.team_split_strided(world, 0, 2, (n + 1) // 2)
    odd = symheap.team_split_strided(world, 1, 2, n // 2)
    x = _x()
    mine = even if me % 2 == 0 else odd
    symheap.barrier_all()
    t0 = time.monotonic()
    try:
        for _ in range(3):
            if me == n - 1 and me % 2 == 1:
                symheap.broadcast(x, root=0, team=mine)
            else:
                symheap.all_reduce(x, team=mine)
        symheap.barrier_all()
    except SymheapMismatchError as e:
        dt = time.monotonic() - t0
        msg = str(e)[str(e).index("collective calls diverged") :]
        print(f"MISMATCH {dt:.3f} {zlib.crc32(msg.encode()):08x} {msg}", flush=True)
        return
    raise AssertionError("the divergence was not reported")


def main(argv) -> int:
    names = argv[1:]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"unknown cases: {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    symheap.init()
    for name in names:
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
