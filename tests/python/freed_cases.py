"""PE-side cases of issue 40 (test_freed_values.py runs them under the launcher):

    python -m symheap.launch -n N -- python tests/python/freed_cases.py CASE [CASE...]

Freed means freed for every alias (a NumPy array over a memoryview, an array-interface
wrapper, a ctypes pointer, a torch tensor through DLPack), and arguments in range: atomic and
signal values their dtype holds, no bool as a count/PE/size/index/root, bytes that are bytes,
dtype names as NumPy means them, the same alignment rule for every operation.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import zlib
from typing import Any, Callable, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import symheap  # noqa: E402
import symheap.numpy as sn  # noqa: E402
from symheap import SymheapError, SymheapValueError  # noqa: E402

CASES: Dict[str, Callable[[], None]] = {}


def case(fn: Callable[[], None]) -> Callable[[], None]:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


def raises(fn: Callable[..., Any], *args: Any, **kw: Any) -> str:
    """The message of the SymheapValueError ``fn(*args, **kw)`` raises."""
    try:
        fn(*args, **kw)
    except SymheapValueError as e:
        assert isinstance(e, SymheapError)
        return str(e)
    raise AssertionError(f"{getattr(fn, '__name__', fn)}{args} did not raise SymheapValueError")


def refused(words: List[str], fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
    msg = raises(fn, *args, **kw)
    for w in words:
        assert w in msg, f"{w!r} not in: {msg}"


def ptr(x: Any) -> int:
    return int(x.__array_interface__["data"][0])


def rng_for(name: str, pe: int) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{name}:{pe}".encode()))


class Wrapper:
    """An object that only passes an array-interface dict on (as other libraries do)."""

    def __init__(self, interface: Dict[str, Any]) -> None:
        self.__array_interface__ = interface


# ---- freed means freed for every alias ------------------------------------------------------

N = 256


def _aliases(a: np.ndarray) -> Dict[str, np.ndarray]:
    """Every way of reaching ``a``'s memory without going through ``a`` itself."""
    return {
        "frombuffer(memoryview)": np.frombuffer(memoryview(a), dtype=np.int32),
        "wrapper of the array's interface": np.asarray(Wrapper(a.__array_interface__)),
        "wrapper of the buffer's interface": np.asarray(Wrapper(a.base.__array_interface__)),
        "ctypes pointer": np.ctypeslib.as_array(ctypes.cast(ptr(a), ctypes.POINTER(ctypes.c_int32)), shape=(N,)),
    }


def _all_refused(aliases: Dict[str, np.ndarray], nxt: int, sig: np.ndarray) -> None:
    """Every use of every alias (as symmetric memory and as a local source or destination)
    is refused as freed memory; collectives are refused on every PE alike."""
    local = np.zeros(N, dtype=np.int32)
    for name, x in aliases.items():
        for f, args in [
            (symheap.put, (x, local, nxt)),
            (symheap.get, (local, x, nxt)),
            (symheap.put_signal, (x, local, sig, 1, nxt)),
            (symheap.atomic_fetch_add, (x, 1, nxt)),
            (symheap.all_reduce, (x,)),
            (symheap.broadcast, (x,)),
            (sn.get_peer_array, (x, nxt)),
        ]:
            msg = raises(f, *args)
            assert "freed" in msg, (name, f.__name__, msg)
        # As the local side of a put or get, where the native layer takes a plain pointer.
        dest = sn.zeros(N, dtype=np.int32)
        assert "freed" in raises(symheap.put, dest, x, nxt), name
        assert "freed" in raises(symheap.get, x, dest, nxt), name
        del dest


@case
def case_alias_after_free() -> None:
    """Aliases of a freed array are refused by every call, also after another allocation of
    the same size; the memory they show is not reused while they exist (that new buffer
    gets other memory and no stale write reaches it), and is reused once they are gone."""
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    a = sn.zeros(N, dtype=np.int32)
    sig = sn.zeros(1, dtype=np.uint64)
    base = ptr(a)
    aliases = _aliases(a)
    # Before the free every alias is the array: a put through each lands at the peer.
    for i, (name, x) in enumerate(aliases.items()):
        data = rng_for(f"before{i}", me).integers(-(2**31), 2**31, N, dtype=np.int32)
        symheap.barrier_all()
        symheap.put(x, data, nxt)
        symheap.barrier_all()
        want = rng_for(f"before{i}", prv).integers(-(2**31), 2**31, N, dtype=np.int32)
        assert (a == want).all(), name
    symheap.barrier_all()
    symheap.free(a)
    _all_refused(aliases, nxt, sig)
    symheap.barrier_all()  # every PE released it: a reclaim point
    b = sn.empty(N, dtype=np.int32)
    fill = rng_for("b", me).integers(-(2**31), 2**31, N, dtype=np.int32)
    b[...] = fill
    held = ptr(b) != base
    symheap.barrier_all()
    _all_refused(aliases, nxt, sig)
    symheap.barrier_all()
    assert (b == fill).all(), "a stale alias reached another allocation"
    del a, aliases
    gc.collect()  # the refusals' tracebacks hold the aliases in reference cycles
    symheap.barrier_all()
    c = sn.empty(N, dtype=np.int32)
    reused = ptr(c) == base
    print(f"ALIASES HELD {held} REUSED {reused}", flush=True)


@case
def case_stale_handle() -> None:
    """A freed SymmetricBuffer whose memory was never handed to an array is reclaimed at the
    next collective point and reused while the stale handle exists: the handle stays refused,
    a second free of it raises (it never frees the new buffer), and the new buffer works."""
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    h = symheap.allocate((N,), "int64")
    addr = h.addr
    h.free()
    refused(["already freed"], h.free)
    symheap.barrier_all()
    h2 = symheap.allocate((N,), "int64")
    assert h2.addr == addr, "the freed handle's memory was not reused"
    refused(["already freed"], h.free)
    refused(["already freed"], symheap.free, h)
    refused(["freed"], symheap.put, h, np.zeros(N, dtype=np.int64), nxt)
    assert not h2.freed
    data = rng_for("h2", me).integers(-(2**63), 2**63, N, dtype=np.int64)
    symheap.barrier_all()
    symheap.put(h2, data, nxt)
    symheap.barrier_all()
    want = rng_for("h2", prv).integers(-(2**63), 2**63, N, dtype=np.int64)
    assert (np.asarray(h2) == want).all()
    # Freeing through an alias: the allocation it was made from, so a second free raises.
    x = sn.zeros(N, dtype=np.float64)
    v = np.frombuffer(memoryview(x), dtype=np.float64)
    sn.free(v)
    refused(["freed"], sn.free, x)
    refused(["freed"], sn.free, v)
    raw = np.ctypeslib.as_array(ctypes.cast(ptr(h2), ctypes.POINTER(ctypes.c_int64)), shape=(N,))
    refused(["not made from a symheap allocation"], sn.free, raw)
    assert not h2.freed
    symheap.barrier_all()


@case
def case_alias_after_free_torch() -> None:
    """The same for torch CPU tensors: ``torch.from_dlpack`` of a symmetric NumPy array and
    of a SymmetricBuffer, a view of a symmetric tensor, and NumPy over a tensor."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    nxt = (me + 1) % n
    a = sn.zeros(N, dtype=np.int32)
    buf = symheap.allocate((N,), "int32", zero=True)
    t = st.zeros(N, dtype=torch.int32)
    bases = (ptr(a), buf.addr, t.data_ptr())
    aliases = {
        "from_dlpack(numpy array)": torch.from_dlpack(a),
        "from_dlpack(buffer)": torch.from_dlpack(buf),
        "view of a symmetric tensor": t[8:40],
        "numpy over a tensor": t.numpy(),
    }
    symheap.barrier_all()
    symheap.free(a)
    buf.free()
    st.free(t)
    refused(["freed"], st.free, t)
    local = torch.zeros(N, dtype=torch.int32)
    for name, x in aliases.items():
        src = local[: x.numel()] if isinstance(x, torch.Tensor) else local.numpy()[: x.size]
        for f, args in [(symheap.put, (x, src, nxt)), (symheap.all_reduce, (x,)), (symheap.atomic_fetch, (x, nxt))]:
            msg = raises(f, *args)
            assert "freed" in msg, (name, f.__name__, msg)
    symheap.barrier_all()
    fresh = [st.zeros(N, dtype=torch.int32) for _ in range(3)]
    assert not {f.data_ptr() for f in fresh} & set(bases), "memory a tensor still shows was reused"
    symheap.barrier_all()
    del a, buf, t, aliases, x, src, args
    gc.collect()
    symheap.barrier_all()
    again = [st.zeros(N, dtype=torch.int32) for _ in range(3)]
    print(f"TORCH REUSED {sorted(g.data_ptr() for g in again) == sorted(bases)}", flush=True)


# ---- values in range ------------------------------------------------------------------------

INT_RANGES = {
    np.int32: (-(2**31), 2**31 - 1, "[-2^31, 2^31-1]"),
    np.uint32: (0, 2**32 - 1, "[0, 2^32-1]"),
    np.int64: (-(2**63), 2**63 - 1, "[-2^63, 2^63-1]"),
    np.uint64: (0, 2**64 - 1, "[0, 2^64-1]"),
}


@case
def case_atomic_values() -> None:
    """Atomics take exactly the values their dtype holds: both ends of each integer range
    are stored exactly, one past either end is refused naming the range and leaves the word
    as it was; a finite float past float32's range is refused, inf and nan are taken."""
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt = (me + 1) % n
    for dt, (lo, hi, text) in INT_RANGES.items():
        w = sn.zeros(2, dtype=dt)
        symheap.barrier_all()
        poison = int(rng_for(f"poison{dt.__name__}", me).integers(0, 2**31))
        for v in (lo, hi, poison):
            symheap.atomic_set(w, v, nxt)
            assert symheap.atomic_fetch(w, nxt) == v, (dt, v)
        name = np.dtype(dt).name
        for bad in (lo - 1, hi + 1, 2**200, -(2**200)):
            refused([name, text], symheap.atomic_set, w, bad, nxt)
            refused([name, text], symheap.atomic_fetch_add, w, bad, nxt)
            refused([name, text], symheap.atomic_compare_swap, w, bad, 1, nxt)
            refused([name, text], symheap.atomic_compare_swap, w, poison, bad, nxt)
            refused([name, text], symheap.atomic_swap, w, bad, nxt)
        if name.startswith("u"):
            refused([name, text], symheap.atomic_xor, w, -1, nxt)
        assert symheap.atomic_fetch(w, nxt) == poison, dt
        symheap.barrier_all()
    f = sn.zeros(2, dtype=np.float32)
    symheap.barrier_all()
    big = float(np.finfo(np.float32).max)
    for v in (big, -big, float("inf"), float("-inf"), 1.5e-45, 0.1):
        symheap.atomic_set(f, v, nxt)
        got = symheap.atomic_fetch(f, nxt)
        assert got == float(np.float32(v)), (v, got)
    symheap.atomic_set(f, float("nan"), nxt)
    assert np.isnan(symheap.atomic_fetch(f, nxt))
    symheap.atomic_set(f, 2.5, nxt)
    for bad in (1e300, -1e300, 3.5e38, 10**400):
        refused(["float32", "3.4028234663852886e38"], symheap.atomic_set, f, bad, nxt)
        refused(["float32"], symheap.atomic_swap, f, bad, nxt)
    assert symheap.atomic_fetch(f, nxt) == 2.5
    d = sn.zeros(2, dtype=np.float64)
    # Every PE has zeroed its copy before the next PE writes into it (an allocation that fits
    # does not synchronise; without this the zeroing could land after the write).
    symheap.barrier_all()
    symheap.atomic_set(d, 1e300, nxt)
    assert symheap.atomic_fetch(d, nxt) == 1e300
    refused(["float64"], symheap.atomic_set, d, 10**400, nxt)
    symheap.barrier_all()


@case
def case_signal_values() -> None:
    """Signal words are uint64: [0, 2^64-1] is taken exactly, anything else is refused
    naming that range (put_signal, signal_wait_until) and no data moves."""
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    sig = sn.zeros(2, dtype=np.uint64)
    dest = sn.zeros(16, dtype=np.int64)
    data = rng_for("sig", me).integers(-(2**63), 2**63, 16, dtype=np.int64)
    symheap.barrier_all()
    for bad in (-1, 2**64, True):
        refused(["signal value"] if bad is True else ["[0, 2^64-1]"], symheap.put_signal, dest, data, sig, bad, nxt)
        refused(["signal value"], symheap.signal_wait_until, sig, "ge", bad)
    symheap.barrier_all()
    assert (dest == 0).all() and int(sig[0]) == 0
    symheap.barrier_all()
    symheap.put_signal(dest, data, sig, 2**64 - 1, nxt)
    assert symheap.signal_wait_until(sig, "eq", 2**64 - 1) == 2**64 - 1
    want = rng_for("sig", prv).integers(-(2**63), 2**63, 16, dtype=np.int64)
    assert (dest == want).all()
    symheap.barrier_all()


@case
def case_bool_is_not_a_number() -> None:
    """A bool is never a count, PE, size, index or root, anywhere in the Python API."""
    import symheap.torch as st

    me, n = symheap.my_pe(), symheap.n_pes()
    x = sn.zeros(4, dtype=np.int64)
    sig = sn.zeros(2, dtype=np.uint64)
    src = np.zeros(4, dtype=np.int64)
    calls: List[Callable[[], Any]] = [
        lambda: sn.zeros(True),
        lambda: sn.zeros((2, True)),
        lambda: sn.empty(False),
        lambda: sn.full(True, 1.0),
        lambda: st.zeros(True),
        lambda: symheap.allocate((True,), "int32"),
        lambda: symheap.allocate((4,), "int32", align=True),
        lambda: symheap.allocate((4,), "int32", stream=True),
        lambda: symheap.put(x, src, True),
        lambda: symheap.get(src, x, False),
        lambda: symheap.atomic_fetch(x, True),
        lambda: symheap.atomic_fetch(x, me, index=True),
        lambda: symheap.put_signal(x, src, sig, 1, me, sig_index=True),
        lambda: symheap.signal_fetch(sig, True),
        lambda: symheap.signal_wait_until(sig, "ge", 0, index=False),
        lambda: symheap.broadcast(x, root=False),
        lambda: symheap.team_split_strided(None, 0, 1, True),
        lambda: symheap.team_split_strided(None, False, 1, n),
        lambda: sn.get_peer_array(x, True),
        lambda: symheap.team_translate_pe(symheap.team_world(), True, symheap.team_world()),
        lambda: symheap.team_world().translate_pe(True, symheap.team_world()),
        lambda: symheap.team_world().world_pe(False),
        lambda: x.base.write_bytes(b"\x01", True),
    ]
    for i, f in enumerate(calls):
        msg = raises(f)
        assert "bool" in msg, (i, msg)
    symheap.barrier_all()


@case
def case_object_bytes_types() -> None:
    """all_gather_object_bytes takes bytes and bytes-like objects (exactly those bytes) and
    refuses the rest: an int is not n zero bytes."""
    me, n = symheap.my_pe(), symheap.n_pes()
    for bad in (5, 0, "abc", [1, 2], None, 3.0):
        refused(["bytes"], symheap.all_gather_object_bytes, bad)
    payload = rng_for("obj", me).integers(0, 256, 5 + me, dtype=np.uint8)
    for wrap in (bytes, bytearray, memoryview, lambda p: np.frombuffer(p, dtype=np.uint8)):
        got = symheap.all_gather_object_bytes(wrap(payload.tobytes()))
        assert got == [rng_for("obj", r).integers(0, 256, 5 + r, dtype=np.uint8).tobytes() for r in range(n)]


@case
def case_dtype_names() -> None:
    """A dtype means what NumPy (or torch) means by it; what symheap does not move is refused."""
    import torch

    names = {
        "float": "float64",
        float: "float64",
        "double": "float64",
        "int": "int64",
        int: "int64",
        "i8": "int64",
        "u8": "uint64",
        "f4": "float32",
        "<f4": "float32",
        "single": "float32",
        "half": "float16",
        "short": "int16",
        "ubyte": "uint8",
        "uint32": "uint32",
        np.float32: "float32",
        np.dtype("int16"): "int16",
        torch.float: "float32",
        torch.int: "int32",
        torch.bfloat16: "bfloat16",
        "bfloat16": "bfloat16",
    }
    for given, want in names.items():
        b = symheap.allocate((3,), given)
        assert b.dtype == want, (given, b.dtype, want)
        b.free()
    import symheap.torch as st

    assert st.zeros(2, dtype="float").dtype == torch.float64
    assert sn.zeros(2, dtype="float").dtype == np.float64
    for bad in ("f32", "bf16", "bool", bool, "complex64", ">f4", "float128", "nonsense", None):
        refused(["dtype"], symheap.allocate, (3,), bad)
    symheap.barrier_all()


@case
def case_alignment() -> None:
    """Every operation refuses an address not aligned to its element size, naming the
    alignment: put, get and put_signal (both sides), collectives, atomics, signals. Nothing
    is written by a refused call; aligned views of the same memory work."""
    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    raw = sn.zeros(4 * 16 + 16, dtype=np.uint8)
    poison = rng_for("poison", me).integers(0, 256, raw.size, dtype=np.uint8)
    raw[...] = poison
    mis = raw[1 : 1 + 64].view(np.float32)  # 1 byte past an aligned start
    mis64 = raw[4 : 4 + 64].view(np.int64)  # 4-byte aligned int64 words
    sig_mis = raw[4:20].view(np.uint64)
    ok = raw[8 : 8 + 64].view(np.float32)
    local = rng_for("local", me).random(16).astype(np.float32)
    local_mis = np.frombuffer(bytearray(65), dtype=np.uint8)[1:].view(np.float32)
    dest = sn.zeros(16, dtype=np.float32)
    four = ["aligned to 4 bytes", "float32"]
    eight = ["aligned to 8 bytes"]
    symheap.barrier_all()
    refused(four, symheap.put, mis, local, nxt)
    refused(four, symheap.put, dest, local_mis, nxt)
    refused(four, symheap.get, local.copy(), mis, nxt)
    refused(four, symheap.put_signal, mis, local, sn.zeros(1, dtype=np.uint64), 1, nxt)
    refused(four, symheap.all_reduce, mis)
    refused(four, symheap.all_reduce, dest, mis)
    refused(four, symheap.broadcast, mis)
    refused(four, symheap.all_gather, sn.zeros(16 * n, dtype=np.float32), mis)
    refused(four, symheap.atomic_set, mis, 1.0, nxt)
    refused(eight, symheap.atomic_fetch, mis64, nxt)
    refused(eight, symheap.put_signal, dest, local, sig_mis, 1, nxt)
    refused(eight, symheap.signal_fetch, sig_mis)
    symheap.barrier_all()
    assert (raw == poison).all() and (dest == 0).all(), "a refused call wrote"
    symheap.barrier_all()
    symheap.put(ok, local, nxt)
    symheap.barrier_all()
    want = rng_for("local", prv).random(16).astype(np.float32)
    assert (ok == want).all()
    symheap.all_reduce(dest, ok)
    symheap.barrier_all()


def main(argv: List[str]) -> int:
    names = argv[1:]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"unknown cases: {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    symheap.init()
    for name in names:
        CASES[name]()
        print(f"PASS {name}", flush=True)
    symheap.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
