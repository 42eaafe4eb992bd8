"""symheap's RMA, signal and atomic calls on tensors of the NVSHMEM provider.

When the symmetric argument of :func:`symheap.put`, :func:`symheap.get`,
:func:`symheap.put_signal`, :func:`symheap.signal_wait_until`, :func:`symheap.signal_fetch` or an
atomic is a tensor from :func:`symheap.providers.nvshmem`, the call reaches any PE: a direct one
(NVSHMEM maps its memory here) by symheap's own copies, kernels and atomics on that mapping, any
other (another node) through NVSHMEM's calls over its network transport (IB, UCX, libfabric).
The same program therefore runs on one node and across nodes.

Both sides of a transfer must be tensors of the NVSHMEM provider (NVSHMEM's remote transports
move only memory they registered); requiring it on one node too keeps a program that passes
there from failing on the first job that spans nodes. Waits are symheap's own bounded waits (a
timeout is an error naming the signal), not NVSHMEM's, which never give up.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from ._core import Arr, check_pe, default_stream, describe, index_arg, native, world_stream
from ._native import SymheapValueError

# The NVSHMEM provider of this process (a symheap.providers.NvshmemProvider), set by
# symheap.providers.nvshmem() and cleared when it is finalized; None when there is none. It
# lives here, below the providers module, so that the SHMEM calls can find it without importing
# the providers (which call them).
live: Any = None

# A live symheap.providers.NvshmemProvider (typed loosely: its module sits above this one).
NvshmemProvider = Any


def provider_of(x: Any) -> Optional[NvshmemProvider]:
    """The live NVSHMEM provider whose allocation holds tensor ``x``, else None."""
    nv = live
    if nv is None or nv._finalized or not nv._live:
        return None
    ptr = getattr(x, "data_ptr", None)
    if ptr is None:
        return None
    return nv if nv._holds(int(ptr()), 1) else None


def _own(nv: NvshmemProvider, x: Any, what: str) -> Arr:
    a = describe(x, what)
    if not a.contiguous:
        raise SymheapValueError(f"{what} must be contiguous")
    if not nv._holds(a.ptr, max(a.nbytes, 1)):
        raise SymheapValueError(
            f"{what} is not a tensor of the NVSHMEM provider: NVSHMEM moves data only between its "
            "own allocations (allocate it with symheap.providers.nvshmem().allocate_symmetric)"
        )
    return a


def _pair(nv: NvshmemProvider, dest: Any, src: Any, what: str) -> Tuple[Arr, Arr]:
    d = _own(nv, dest, f"{what} destination")
    s = _own(nv, src, f"{what} source")
    if d.dtype != s.dtype:
        raise SymheapValueError(f"{what}: dtypes differ ({d.dtype} and {s.dtype})")
    if d.numel != s.numel:
        raise SymheapValueError(f"{what}: destination has {d.numel} elements, source {s.numel}")
    return d, s


def _word(nv: NvshmemProvider, sig: Any, index: int, what: str) -> Tuple[Arr, int]:
    a = _own(nv, sig, what)
    if a.dtype not in ("uint64", "int64"):
        raise SymheapValueError(f"{what} must be a uint64 or int64 tensor, not {a.dtype}")
    index = index_arg(index, f"{what} index")
    if not index < a.numel:
        raise SymheapValueError(f"{what} index {index} is out of range ({a.numel} words)")
    return a, a.ptr + 8 * index


def put(nv: NvshmemProvider, dest: Any, src: Any, pe: int, stream: Any) -> None:
    """:func:`symheap.put` through NVSHMEM: enqueued on ``stream``."""
    d, s = _pair(nv, dest, src, "put")
    nv.native.put_on_stream(d.ptr, s.ptr, s.nbytes, check_pe(pe), default_stream(s, stream))


def get(nv: NvshmemProvider, dest: Any, src: Any, pe: int, stream: Any) -> None:
    """:func:`symheap.get` through NVSHMEM: enqueued on ``stream``."""
    d, s = _pair(nv, dest, src, "get")
    if not d.writable:
        raise SymheapValueError("get destination is read-only")
    nv.native.get_on_stream(d.ptr, s.ptr, d.nbytes, check_pe(pe), default_stream(d, stream))


def put_signal(
    nv: NvshmemProvider, dest: Any, src: Any, signal: Any, value: int, pe: int, op: str, sig_index: int, stream: Any
) -> None:
    """:func:`symheap.put_signal` through NVSHMEM (``nvshmemx_putmem_signal_on_stream``)."""
    d, s = _pair(nv, dest, src, "put_signal")
    _, sig = _word(nv, signal, sig_index, "signal")
    nv.native.put_signal(d.ptr, s.ptr, s.nbytes, sig, value, op, check_pe(pe), default_stream(s, stream))


def signal_wait_until(nv: NvshmemProvider, signal: Any, cmp: str, value: int, index: int, stream: Any) -> None:
    """:func:`symheap.signal_wait_until` on an NVSHMEM signal: symheap's bounded wait kernel,
    enqueued on ``stream``."""
    a, sig = _word(nv, signal, index, "signal")
    nv.native.signal_wait_until(sig, cmp, value, default_stream(a, stream))


def signal_fetch(nv: NvshmemProvider, signal: Any, index: int) -> int:
    """:func:`symheap.signal_fetch` of an NVSHMEM signal word (after the current stream)."""
    a, sig = _word(nv, signal, index, "signal")
    _sync(a)
    return int(nv.native.atomic(sig, nv.my_pe(), "fetch", "uint64"))


def atomic(nv: NvshmemProvider, op: str, dest: Any, pe: int, index: int, value: Any, compare: Any) -> Any:
    """A symheap atomic on PE ``pe``'s ``dest[index]`` through NVSHMEM's host atomics (int64 and
    uint64 words), after the current stream."""
    a = _own(nv, dest, f"atomic_{op} destination")
    index = index_arg(index, "atomic index")
    if not index < a.numel:
        raise SymheapValueError(f"atomic index {index} is out of range ({a.numel} elements)")
    pe = check_pe(pe)
    _sync(a)
    return nv.native.atomic(a.ptr + index * a.itemsize, pe, op, a.dtype, value, compare)


def quiet(stream: Any) -> None:
    """:func:`symheap.quiet`'s NVSHMEM part: this PE's host-issued NVSHMEM operations, and the
    stream-ordered ones before ``stream``'s next work."""
    nv = live
    if nv is None or nv._finalized:
        return
    nv.native.quiet()
    s = world_stream(stream)
    if s is not None:
        nv.native.quiet_on_stream(s)


def _sync(a: Arr) -> None:
    """Host-side accesses see the work enqueued before them on the current stream."""
    s = default_stream(a, None)
    if s is not None:
        native().sync_stream(s)
