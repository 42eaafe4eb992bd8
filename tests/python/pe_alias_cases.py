"""PE-side cases of the collectives' aliasing rules and of read-only destinations (see
pe_cases.py for how they run): every in-place form exact and no false mismatch, every other
overlap refused on every PE naming both address ranges, PEs that disagree on in place named as
a mismatch, every call that writes into an array refusing a read-only one. Random integer data
seeded by the case name (the same on every PE), so every expected value is exact."""

from __future__ import annotations

import numpy as np
import symheap
import symheap.numpy as sn
from pe_common import POISONED, case, ptr, raises, rng_for
from symheap import SymheapError, SymheapMismatchError, SymheapValueError

POISONED.add("alias_mismatch")

# Element counts per block: one element, inline, eager broadcast, one-pass, one-shot and
# two-shot sizes on the host backend.
COUNTS = (1, 5, 24, 600, 5000, 40000)


def _rng_data(name: str, n: int, size: int, dtype) -> np.ndarray:
    """Every PE's input: ``(n, size)`` integers, exact in every dtype used here."""
    return rng_for(name).integers(-100, 100, size=(n, size)).astype(dtype)


def _rng(a: np.ndarray) -> str:
    """The byte range of array ``a`` as symheap's messages write it."""
    return f"[{ptr(a):#x}, {ptr(a) + a.nbytes:#x})"


def _sub_team():
    """(team, member index or None, members): the world without PE 0 from 3 PEs up, whose
    member indices differ from the world's; else the world."""
    me, n = symheap.my_pe(), symheap.n_pes()
    if n < 3:
        return None, me, list(range(n))
    t = symheap.team_split_strided(None, 1, 1, n - 1)
    return t, (me - 1 if me > 0 else None), list(range(1, n))


def _in_place_round(team, tme, members, dtype, count: int, tag: str) -> None:
    """all_gather from this PE's block, reduce_scatter into it, all_reduce and broadcast on
    one array, on ``team``; a barrier after each compares the ledgers (no false mismatch)."""
    me, world = symheap.my_pe(), symheap.n_pes()
    n = len(members)
    data = _rng_data(tag, world, n * count, dtype)
    buf = sn.empty(n * count, dtype=dtype)
    k = tme if tme is not None else 0
    own = buf[k * count : (k + 1) * count]
    buf.view(np.uint8)[...] = 0xAB
    own[...] = data[me, :count]
    symheap.barrier_all()
    symheap.all_gather(buf, own, team)
    if tme is not None:
        assert np.array_equal(buf.reshape(n, count), data[members, :count]), ("all_gather", count)
    symheap.barrier_all()
    buf[...] = data[me]
    symheap.barrier_all()
    symheap.reduce_scatter(own, buf, "sum", team)
    if tme is not None:
        want = data[members].sum(0, dtype=np.int64).reshape(n, count)[tme].astype(dtype)
        assert np.array_equal(own, want), ("reduce_scatter", count)
    symheap.barrier_all()
    for algo in ("auto", "one_shot", "two_shot"):
        for src in (None, buf):
            buf[...] = data[me]
            symheap.barrier_all()
            symheap.all_reduce(buf, src, "sum", team, algo=algo)
            if tme is not None:
                assert np.array_equal(buf, data[members].sum(0, dtype=np.int64).astype(dtype)), (algo, count)
            symheap.barrier_all()
    one = buf[:count]
    for root in range(n):
        for src in (None, one):
            one[...] = data[me, :count]
            symheap.barrier_all()
            symheap.broadcast(one, src, root, team)
            if tme is not None:
                assert np.array_equal(one, data[members[root], :count]), ("broadcast", root, count)
            symheap.barrier_all()


@case
def case_alias_in_place() -> None:
    """Every in-place form, on the world and on a team whose indices are not the world's,
    at sizes that take every path: exact, and the ledgers agree afterwards."""
    sub, stme, smembers = _sub_team()
    me, n = symheap.my_pe(), symheap.n_pes()
    for dtype in (np.int32, np.float32, np.int64):
        for count in COUNTS:
            _in_place_round(None, me, list(range(n)), dtype, count, f"in_place {np.dtype(dtype).name} {count}")
    for count in (1, 24, 5000):
        _in_place_round(sub, stme, smembers, np.int32, count, f"in_place team {count}")
    symheap.barrier_all()


def _refused(fn, *args, names) -> None:
    e = raises(SymheapValueError, fn, *args)
    for r in names:
        assert r in str(e), (str(e), r)


@case
def case_alias_refused() -> None:
    """Every overlap that is not an in-place form is refused on every PE, naming both
    ranges, before anything moves; the context works afterwards."""
    me, n = symheap.my_pe(), symheap.n_pes()
    k = 16
    d = sn.zeros(2 * n * k, dtype=np.float32)
    d[...] = np.arange(2 * n * k)
    before = d.copy()
    g = d[: n * k]
    skew = d[2 : 2 + k]  # straddles blocks 0 and 1: never this PE's block
    _refused(symheap.all_gather, g, skew, names=[_rng(g), _rng(skew)])
    _refused(symheap.reduce_scatter, skew, g, names=[_rng(skew), _rng(g)])
    _refused(symheap.all_reduce, skew, d[:k], names=[_rng(skew), _rng(d[:k])])
    _refused(symheap.broadcast, skew, d[:k], 0, names=[_rng(skew), _rng(d[:k])])
    _refused(symheap.alltoall, g, g, names=[_rng(g)])
    _refused(symheap.alltoall, d[2 : 2 + n * k], g, names=[_rng(d[2 : 2 + n * k]), _rng(g)])
    if n > 1:
        # The all_gather(d, d[:16]) on PE 1: the source at another PE's block.
        other = (me + 1) % n
        theirs = g[other * k : (other + 1) * k]
        _refused(symheap.all_gather, g, theirs, names=[_rng(g), _rng(theirs)])
        _refused(symheap.reduce_scatter, theirs, g, names=[_rng(theirs), _rng(g)])
    assert np.array_equal(d, before), "a refused call moved data"
    # Adjacent is apart: the destination right before the source works.
    src = d[n * k : n * k + k]
    src[...] = me
    symheap.barrier_all()
    symheap.all_gather(g, src)
    assert np.array_equal(g.reshape(n, k), np.repeat(np.arange(n, dtype=np.float32), k).reshape(n, k))
    symheap.barrier_all()


@case
def case_alias_mismatch() -> None:
    """PEs that disagree on in place: PE 0 gathers from its own block, the others from a
    separate array. The host path reads each member's contribution where that member's
    placement says, so the call means different things: every PE gets SymheapMismatchError."""
    me, n = symheap.my_pe(), symheap.n_pes()
    if n < 2:
        return
    k = 4
    g = sn.zeros(n * k, dtype=np.int32)
    s = sn.zeros(k, dtype=np.int32)
    symheap.barrier_all()
    src = g[:k] if me == 0 else s
    e = raises(SymheapMismatchError, symheap.all_gather, g, src)
    assert "in place" in str(e) and "all_gather" in str(e), str(e)
    raises(SymheapError, symheap.barrier_all)  # the context is poisoned


def _ro(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@case
def case_readonly_refused() -> None:
    """A read-only array is refused as the destination of every call that writes through it
    (collectives, get, put, put_signal and its signal word, the writing atomics), naming the
    call and the argument; its contents stay; a read-only source is fine."""
    me, n = symheap.my_pe(), symheap.n_pes()
    peer = (me + 1) % n
    k = 8
    w = sn.zeros(n * k, dtype=np.int64)
    w[...] = np.arange(n * k) + 100 * me
    ro = _ro(sn.zeros(n * k, dtype=np.int64))
    ro_blk = ro[:k]
    sig = _ro(sn.zeros(1, dtype=np.uint64))
    local = np.arange(k, dtype=np.int64)
    symheap.barrier_all()
    calls = [
        ("broadcast destination", symheap.broadcast, (ro_blk,)),
        ("broadcast destination", symheap.broadcast, (ro_blk, w[:k])),
        ("all_gather destination", symheap.all_gather, (ro, w[:k])),
        ("reduce_scatter destination", symheap.reduce_scatter, (ro_blk, w)),
        ("all_reduce destination", symheap.all_reduce, (ro,)),
        ("all_reduce destination", symheap.all_reduce, (ro, w)),
        ("alltoall destination", symheap.alltoall, (ro, w)),
        ("get destination", symheap.get, (_ro(np.zeros(k, dtype=np.int64)), w[:k], peer)),
        ("get destination", symheap.get_nbi, (_ro(np.zeros(k, dtype=np.int64)), w[:k], peer)),
        ("put destination", symheap.put, (ro_blk, local, peer)),
        ("put destination", symheap.put_nbi, (ro_blk, local, me)),
        ("put_signal destination", symheap.put_signal, (ro_blk, local, w, 1, peer)),
        ("put_signal signal", symheap.put_signal, (w[:k], local, sig, 1, peer)),
        ("atomic_set destination", symheap.atomic_set, (ro, 5, peer)),
        ("atomic_swap destination", symheap.atomic_swap, (ro, 5, me)),
        ("atomic_compare_swap destination", symheap.atomic_compare_swap, (ro, 0, 5, peer)),
        ("atomic_add destination", symheap.atomic_fetch_add, (ro, 5, peer)),
        ("atomic_add destination", symheap.atomic_add, (ro, 5, me)),
        ("atomic_add destination", symheap.atomic_inc, (ro, peer)),
        ("atomic_add destination", symheap.atomic_fetch_inc, (ro, peer)),
    ]
    for what, fn, args in calls:
        e = raises(SymheapValueError, fn, *args)
        assert f"{what} is read-only" in str(e), (fn.__name__, str(e))
    bits = _ro(sn.zeros(1, dtype=np.uint64))
    for fn in (symheap.atomic_and, symheap.atomic_fetch_or, symheap.atomic_xor):
        raises(SymheapValueError, fn, bits, 1, peer)
    # Reads are fine: a read-only source, a fetch, a signal read.
    assert symheap.atomic_fetch(ro, peer) == 0 and symheap.signal_fetch(sig) == 0
    out = sn.zeros(n * k, dtype=np.int64)
    src = sn.zeros(n * k, dtype=np.int64)
    src[...] = w
    _ro(src)
    symheap.barrier_all()
    symheap.all_reduce(out[:k], src[:k])
    want = sum(np.arange(k) + 100 * p for p in range(n))
    assert np.array_equal(out[:k], want)
    symheap.barrier_all()
    assert not ro.any() and int(sig[0]) == 0, "a refused call wrote into a read-only array"
    symheap.barrier_all()


def _torch_round(me: int, n: int, kind: str, make) -> None:
    """The in-place forms through the torch entries (SHMEM-style calls on tensors, the
    torch.library ops, symheap.distributed's FSDP2-style all_gather_into_tensor), and their
    refusals, on tensors made by ``make`` (symmetric or ordinary)."""
    import symheap.distributed as sd
    import symheap.ops as so
    import torch

    k = 24
    data = torch.from_numpy(_rng_data(f"torch {kind}", n, n * k, np.int32))
    dev = make(torch.zeros(1)).device
    for entry in ("ops", "distributed", "shmem"):
        out = make(torch.full((n * k,), -1, dtype=torch.int32))
        mine = out.narrow(0, me * k, k)
        mine.copy_(data[me, :k].to(dev))
        if entry == "ops":
            so.all_gather(mine, out=out)
        elif entry == "distributed":
            sd.all_gather_into_tensor(out, mine)
        elif kind == "symmetric":
            symheap.all_gather(out, mine)
        else:
            continue
        assert torch.equal(out.cpu(), data[:, :k].reshape(-1)), (entry, kind)
        src = make(data[me].clone())
        part = src.narrow(0, me * k, k)
        if entry == "ops":
            so.reduce_scatter(src, out=part)
        elif entry == "distributed":
            sd.reduce_scatter_tensor(part, src)
        else:
            symheap.reduce_scatter(part, src)
        assert torch.equal(part.cpu(), data.sum(0, dtype=torch.int32).reshape(n, k)[me]), (entry, kind)
        symheap.barrier_all()
    # Refused through the ops whether or not they stage, naming both ranges.
    out = make(torch.zeros(2 * n * k, dtype=torch.int32))
    skew = out.narrow(0, 2, k)
    whole = out.narrow(0, 0, n * k)
    for fn, args, kw, named in (
        (so.all_gather, (skew,), {"out": whole}, skew),
        (so.reduce_scatter, (whole,), {"out": skew}, skew),
        (so.alltoall, (whole,), {"out": whole}, whole),
    ):
        e = raises(SymheapValueError, fn, *args, **kw)
        assert "overlap" in str(e) and f"[{named.data_ptr():#x}, " in str(e), (kind, str(e))
    symheap.barrier_all()


@case
def case_alias_torch() -> None:
    """The in-place forms and refusals through the torch entries, on symmetric (zero-copy)
    and ordinary (staged, or on CUDA read in place by the local kernels) tensors."""
    import symheap.torch as st

    me, n = symheap.my_pe(), symheap.n_pes()

    def symmetric(t):
        s = st.empty(*t.shape, dtype=t.dtype)
        s.copy_(t)
        return s

    _torch_round(me, n, "symmetric", symmetric)
    _torch_round(me, n, "ordinary", lambda t: t.to(st.device()).clone())
