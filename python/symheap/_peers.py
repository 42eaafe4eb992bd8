"""Peer tables and peer views shared by the NumPy and PyTorch fronts."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ._core import Arr, allocation_of, check_pe, describe, index_arg, native
from ._native import HeapView, SymheapUnsupportedError, SymheapValueError, SymmetricBuffer


def shape_of(size: Tuple[Any, ...]) -> Tuple[int, ...]:
    """``(2, 3)``, ``((2, 3),)`` and ``([2, 3],)`` all mean the shape ``(2, 3)``."""
    if len(size) == 1 and not isinstance(size[0], int) and hasattr(size[0], "__iter__"):
        size = tuple(size[0])
    return tuple(index_arg(n, "size") for n in size)


def in_heap(x: Any, what: str) -> Arr:
    """``describe(x)``, checking that all of ``x`` lies in this PE's symmetric heap (any
    strides)."""
    a = describe(x, what)
    extent = 0
    if a.numel > 0:
        extent = (sum((n - 1) * s for n, s in zip(a.shape, a.strides)) + 1) * a.itemsize
    ctx = native()
    if a.device == "cuda" and ctx.backend != "cuda":
        raise SymheapValueError(f"{what} is a CUDA tensor, but symheap runs on the host backend")
    if not ctx.is_symmetric(a.ptr, max(extent, 1)):
        raise SymheapValueError(f"{what} (at {a.ptr:#x}) is not in this PE's symmetric heap; allocate it with symheap")
    ctx.check_symmetric(a.ptr, extent, what)
    return a


def peer_table(x: Any) -> List[int]:
    """``table[r] = translate(p, my_pe, r)`` for ``x`` at pointer ``p`` (0 where PE r is not
    directly addressable)."""
    a = in_heap(x, "tensor")
    return native().peer_bases_for(a.ptr)


def peer_view(x: Any, pe: int) -> HeapView:
    """A HeapView of PE ``pe``'s copy of ``x`` (same shape, strides and dtype). It keeps the
    allocation holding ``x`` alive (the SymmetricBuffer itself, not ``x``: a tensor released
    from inside another tensor's DLPack deleter crashes PyTorch)."""
    a = in_heap(x, "tensor")
    pe = check_pe(pe)
    ctx = native()
    owner: Any = allocation_of(a.ptr, empty=a.nbytes == 0)
    if owner is None:
        if a.kind == "torch":
            raise SymheapValueError("the tensor is not in a live allocation made by symheap's Python package")
        owner = x
    addr = ctx.translate(a.ptr, ctx.my_pe, pe)
    if addr is None:
        raise SymheapUnsupportedError(f"PE {pe}'s memory is not directly addressable from PE {ctx.my_pe}")
    return ctx.view(addr, list(a.shape), a.dtype, strides=list(a.strides), owner=owner)


def table_view(x: Any) -> Optional[HeapView]:
    """The in-heap peer table of the allocation ``x`` starts, when ``x`` is at its base."""
    a = describe(x, "tensor")
    buf = allocation_of(a.ptr)
    if buf is None or buf.addr != a.ptr:
        return None
    return buf.peer_bases_view()


def address_map_parts(x: Any) -> Tuple[int, int, int, List[int], List[bool]]:
    """``(local_rank, allocation_base, allocation_bytes, peer_bases, direct)`` of the
    allocation holding ``x`` (or of ``x`` itself when its allocation is not known here)."""
    a = in_heap(x, "tensor")
    buf: Optional[SymmetricBuffer] = allocation_of(a.ptr)
    if buf is not None:
        m = buf.address_map()
        return (m["local_rank"], m["allocation_base"], m["allocation_bytes"], list(m["peer_bases"]), list(m["direct"]))
    table = native().peer_bases_for(a.ptr)
    return (native().my_pe, a.ptr, a.nbytes, table, [b != 0 for b in table])
