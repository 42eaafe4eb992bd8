"""The NumPy front (host backend): symmetric NumPy arrays and their peer tables.

Arrays made here are views of a :class:`symheap.SymmetricBuffer` (their ``base``), which keeps
the allocation alive; deleting the last array releases it. Allocation calls are **collective**:
every PE makes the same calls in the same order. Data operations (put, get, atomics,
collectives...) are the top-level ``symheap`` functions, which take these arrays.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as _np

from . import _core, _peers
from ._core import SymmetricAddressMap, api, numpy_dtype_name
from ._native import SymheapValueError, SymmetricBuffer

__all__ = [
    "empty",
    "zeros",
    "ones",
    "full",
    "rand",
    "randn",
    "arange",
    "as_symmetric",
    "is_symmetric",
    "allocate_symmetric",
    "allocate_symmetric_map",
    "symmetric_address_map",
    "get_peer_bases",
    "get_peer_array",
    "get_peer_tensor",
    "heap_bases",
    "free",
]


def _dtype(dtype: Any, default: Any = _np.float64) -> str:
    return numpy_dtype_name(_np.dtype(default if dtype is None else dtype))


def _host_only() -> None:
    if _core.native().backend != "host":
        raise SymheapValueError(
            "symheap.numpy works on the host backend; on CUDA use symheap.torch (symmetric memory is device memory)"
        )


def _new(shape: Tuple[int, ...], dtype: str, zero: bool = False) -> _np.ndarray:
    _host_only()
    buf = _core.allocate(shape, dtype, zero=zero)
    arr = _np.asarray(buf)
    return arr


@api
def empty(*size: Any, dtype: Any = None) -> _np.ndarray:
    """**Collective**: an uninitialised symmetric array of ``size`` (default dtype float64).
    A peer may write into it only after a barrier."""
    return _new(_peers.shape_of(size), _dtype(dtype))


@api
def zeros(*size: Any, dtype: Any = None) -> _np.ndarray:
    """**Collective**: a symmetric array of zeros."""
    return _new(_peers.shape_of(size), _dtype(dtype), zero=True)


@api
def ones(*size: Any, dtype: Any = None) -> _np.ndarray:
    """**Collective**: a symmetric array of ones."""
    a = empty(*size, dtype=dtype)
    a[...] = 1
    return a


@api
def full(size: Any, fill_value: Any, *, dtype: Any = None) -> _np.ndarray:
    """**Collective**: a symmetric array filled with ``fill_value`` (dtype defaults to the
    value's NumPy type)."""
    if dtype is None:
        dtype = _np.asarray(fill_value).dtype
    a = empty(*_peers.shape_of((size,) if isinstance(size, int) else tuple(size)), dtype=dtype)
    a[...] = fill_value
    return a


@api
def rand(*size: Any, dtype: Any = None, rng: Optional[_np.random.Generator] = None) -> _np.ndarray:
    """**Collective**: a symmetric array of uniform [0, 1) samples (from ``rng``, else NumPy's
    global generator)."""
    a = empty(*size, dtype=dtype)
    vals = rng.random(a.shape) if rng is not None else _np.random.random(a.shape)
    a[...] = vals.astype(a.dtype)
    return a


@api
def randn(*size: Any, dtype: Any = None, rng: Optional[_np.random.Generator] = None) -> _np.ndarray:
    """**Collective**: a symmetric array of standard normal samples."""
    a = empty(*size, dtype=dtype)
    vals = rng.standard_normal(a.shape) if rng is not None else _np.random.standard_normal(a.shape)
    a[...] = vals.astype(a.dtype)
    return a


@api
def arange(start: Any, stop: Any = None, step: Any = 1, *, dtype: Any = None) -> _np.ndarray:
    """**Collective**: ``numpy.arange(start, stop, step)`` in symmetric memory."""
    ref = _np.arange(start, stop, step, dtype=dtype) if stop is not None else _np.arange(start, dtype=dtype)
    a = empty(*ref.shape, dtype=ref.dtype)
    a[...] = ref
    return a


@api
def as_symmetric(x: Any) -> _np.ndarray:
    """**Collective**: a symmetric copy of ``x`` (same shape and dtype); ``x`` itself when it
    already lies in this PE's symmetric heap (every PE must agree: pass the same kind)."""
    x = _np.asarray(x)
    if is_symmetric(x):
        return x
    a = empty(*x.shape, dtype=x.dtype)
    a[...] = x
    return a


@api
def is_symmetric(x: Any) -> bool:
    """Whether all of ``x`` lies in this PE's symmetric heap. Not collective."""
    try:
        _peers.in_heap(x, "array")
    except (SymheapValueError, TypeError):
        return False
    return True


@api
def allocate_symmetric(*size: Any, dtype: Any = None) -> Tuple[_np.ndarray, _np.ndarray]:
    """**Collective**: the contract. ``(array, peer_bases)`` with ``peer_bases`` a read-only
    int64 array of length ``n_pes``: ``peer_bases[my_pe()] == array pointer``, ``peer_bases[r]``
    PE r's copy in this process (0 when not directly addressable). It is the allocation's
    in-heap table (no copy). Translation: ``peer_bases[to] + (ptr - peer_bases[from])``, valid
    for pointers of any allocation."""
    a = empty(*size, dtype=dtype)
    buf = a.base
    assert isinstance(buf, SymmetricBuffer)
    table = _np.asarray(buf.peer_bases_view())
    table.flags.writeable = False
    return a, table


@api
def allocate_symmetric_map(*size: Any, dtype: Any = None) -> Tuple[_np.ndarray, SymmetricAddressMap]:
    """**Collective**: like :func:`allocate_symmetric`, returning a :class:`SymmetricAddressMap`."""
    a = empty(*size, dtype=dtype)
    return a, symmetric_address_map(a)


@api
def symmetric_address_map(x: Any) -> SymmetricAddressMap:
    """The address map of the allocation holding ``x``. Not collective."""
    rank, base, nbytes, table, direct = _peers.address_map_parts(x)
    return SymmetricAddressMap(rank, base, nbytes, _np.asarray(table, dtype=_np.int64), direct)


@api
def get_peer_bases(x: Any) -> _np.ndarray:
    """The peer table of ``x`` (any array in the symmetric heap, views and slices included):
    ``table[r] = translate(p, my_pe, r)`` for ``x``'s pointer ``p``, 0 where PE r is not
    direct; so ``table[my_pe] == p``. Not collective."""
    return _np.asarray(_peers.peer_table(x), dtype=_np.int64)


@api
def get_peer_array(x: Any, pe: int) -> _np.ndarray:
    """An array aliasing PE ``pe``'s copy of ``x`` (same shape and strides), mapped in this
    process: reads and writes go straight to the peer's memory (synchronise with barriers or
    signals). It keeps ``x`` alive. Not collective."""
    return _np.asarray(_peers.peer_view(x, pe))


get_peer_tensor = get_peer_array


@api
def heap_bases() -> _np.ndarray:
    """Start of every PE's heap in this process (int64; 0 where not directly addressable)."""
    return _np.asarray(_core.native().heap_bases(), dtype=_np.uint64).astype(_np.int64)


@api
def free(x: Any) -> None:
    """Releases the allocation ``x`` starts now (local, non-blocking); ``x`` and every view of
    it must not be used afterwards (symheap refuses them). Dropping the last reference does
    the same. The allocation is the one ``x`` was made from (its ``base`` chain), never
    whichever allocation its address lies in now: freeing a freed array (also through a view
    or alias of it) raises, and so does an array that does not lead back to a symheap
    allocation (one wrapped around a raw pointer, which could be a later allocation's)."""
    a = _core.describe(x, "array")
    buf = _core.origin(x)
    if buf is None:
        raise SymheapValueError(
            "free: the array was not made from a symheap allocation (its base chain does not lead "
            "to a SymmetricBuffer); free the array symheap returned"
        )
    if buf.addr != a.ptr:
        raise SymheapValueError("free: the array does not start its symheap allocation")
    buf.free()
