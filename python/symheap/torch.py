"""The PyTorch front: symmetric tensors (CPU tensors on the host backend, CUDA tensors on the
CUDA backend) and their peer tables.

Tensors made here alias a :class:`symheap.SymmetricBuffer` through DLPack; the tensor keeps the
allocation alive and releasing the last tensor releases it. Allocation calls are
**collective**: every PE makes the same calls in the same order. Data operations are the
top-level ``symheap`` functions, which take these tensors (and ``stream=``).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

try:
    import torch as _torch
except ImportError as _e:  # say which extra installs it
    from ._requires import reraise

    reraise(_e, "torch", "symheap.torch")

from . import _core, _peers
from ._core import SymmetricAddressMap, api, torch_dtype_name
from ._native import SymheapValueError

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
    "get_peer_tensor",
    "heap_bases",
    "free",
    "record_stream",
    "device",
]


def device() -> _torch.device:
    """The device symmetric tensors live on: ``cpu`` (host backend) or ``cuda:N``."""
    n = _core.native()
    if n.backend == "cuda":
        return _torch.device("cuda", n.device_ordinal)
    return _torch.device("cpu")


def _check_device(dev: Any) -> None:
    if dev is None:
        return
    want = _torch.device(dev)
    have = device()
    if want.type != have.type or (want.index is not None and have.index is not None and want.index != have.index):
        raise SymheapValueError(f"symmetric memory of this PE is on {have}, not {want}")


def _dtype(dtype: Any) -> str:
    if dtype is None:
        return torch_dtype_name(_torch.get_default_dtype())
    # A torch.dtype, or a name/NumPy dtype meaning what NumPy means by it ("float": float64).
    return _core.dtype_name(dtype)


def _import(obj: Any) -> _torch.Tensor:
    """``torch.from_dlpack(obj)`` for symheap's own exporters (buffers and heap views): the
    capsule straight to torch's importer. ``torch.from_dlpack`` first makes a Stream object of
    the current CUDA stream to hand to ``__dlpack__``, which symheap's exporters ignore
    (nothing of theirs is pending on a stream); that object cost more than the import."""
    return _torch._C._from_dlpack(obj.__dlpack__())


def _new(shape: Tuple[int, ...], dtype: str, dev: Any, zero: bool = False) -> _torch.Tensor:
    return _new_pair(shape, dtype, dev, zero)[0]


def _new_pair(shape: Tuple[int, ...], dtype: str, dev: Any, zero: bool = False) -> Tuple[_torch.Tensor, Any]:
    """A new symmetric tensor and the SymmetricBuffer it shows."""
    _check_device(dev)
    # Like PyTorch's allocator: the allocating stream's later work on the tensor (torch's own
    # kernels, which symheap does not see) finishes before the memory can be reused. The raw
    # handle: a torch Stream object costs more than the rest of the allocation's host work.
    ordinal = _core.native().device_ordinal
    stream = None if ordinal is None else _core.current_stream_handle(ordinal)
    buf = _core.allocate_checked(shape, dtype, 256, zero, stream)
    return _core.register_tensor(_import(buf), buf), buf


@api
def empty(*size: Any, dtype: Any = None, device: Any = None) -> _torch.Tensor:
    """**Collective**: an uninitialised symmetric tensor (dtype defaults to torch's default).
    A peer may write into it only after a barrier."""
    return _new(_peers.shape_of(size), _dtype(dtype), device)


@api
def zeros(*size: Any, dtype: Any = None, device: Any = None) -> _torch.Tensor:
    """**Collective**: a symmetric tensor of zeros."""
    t = empty(*size, dtype=dtype, device=device)
    t.zero_()
    return t


@api
def ones(*size: Any, dtype: Any = None, device: Any = None) -> _torch.Tensor:
    """**Collective**: a symmetric tensor of ones."""
    t = empty(*size, dtype=dtype, device=device)
    t.fill_(1)
    return t


@api
def full(size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None) -> _torch.Tensor:
    """**Collective**: a symmetric tensor filled with ``fill_value``."""
    if dtype is None:
        dtype = _torch.tensor(fill_value).dtype
        if dtype.is_floating_point:
            dtype = _torch.get_default_dtype()
    t = empty(*_peers.shape_of((size,) if isinstance(size, int) else tuple(size)), dtype=dtype, device=device)
    t.fill_(fill_value)
    return t


@api
def rand(
    *size: Any, dtype: Any = None, device: Any = None, generator: Optional[_torch.Generator] = None
) -> _torch.Tensor:
    """**Collective**: a symmetric tensor of uniform [0, 1) samples."""
    t = empty(*size, dtype=dtype, device=device)
    t.uniform_(0, 1, generator=generator)
    return t


@api
def randn(
    *size: Any, dtype: Any = None, device: Any = None, generator: Optional[_torch.Generator] = None
) -> _torch.Tensor:
    """**Collective**: a symmetric tensor of standard normal samples."""
    t = empty(*size, dtype=dtype, device=device)
    t.normal_(0, 1, generator=generator)
    return t


@api
def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None, device: Any = None) -> _torch.Tensor:
    """**Collective**: ``torch.arange(start, end, step)`` in symmetric memory."""
    _check_device(device)
    ref = _torch.arange(start, end, step, dtype=dtype) if end is not None else _torch.arange(start, dtype=dtype)
    t = empty(*ref.shape, dtype=ref.dtype, device=device)
    t.copy_(ref)
    return t


@api
def as_symmetric(x: _torch.Tensor) -> _torch.Tensor:
    """**Collective**: a symmetric copy of ``x`` on this PE's device (same shape and dtype);
    ``x`` itself when it already lies in the symmetric heap."""
    if is_symmetric(x):
        return x
    t = empty(*x.shape, dtype=x.dtype)
    t.copy_(x)
    return t


@api
def is_symmetric(x: Any) -> bool:
    """Whether all of ``x`` lies in this PE's symmetric heap. Not collective."""
    try:
        _peers.in_heap(x, "tensor")
    except (SymheapValueError, TypeError):
        return False
    return True


def _table_tensor(x: _torch.Tensor) -> _torch.Tensor:
    view = _peers.table_view(x)
    if view is not None:
        return _import(view)
    # A view inside an allocation: build the table from the translated pointers (a host-to-
    # device copy from pageable memory on CUDA, which does not synchronise the device).
    return _torch.tensor(_peers.peer_table(x), dtype=_torch.int64, device=x.device)


@api
def allocate_symmetric(*size: Any, dtype: Any = None, device: Any = None) -> Tuple[_torch.Tensor, _torch.Tensor]:
    """**Collective**: the contract. ``(tensor, peer_bases)`` with ``peer_bases`` an int64
    tensor of length ``n_pes`` on the tensor's device: ``peer_bases[my_pe()] ==
    tensor.data_ptr()``, ``peer_bases[r]`` PE r's copy in this process (0 when not directly
    addressable). It is the allocation's in-heap table, made without a copy or a device
    synchronisation. Translation: ``peer_bases[to] + (ptr - peer_bases[from])``, valid for
    pointers of any allocation. Do not write into ``peer_bases``."""
    t, buf = _new_pair(_peers.shape_of(size), _dtype(dtype), device)
    return t, _import(buf.peer_bases_view())


@api
def allocate_symmetric_map(
    *size: Any, dtype: Any = None, device: Any = None
) -> Tuple[_torch.Tensor, SymmetricAddressMap]:
    """**Collective**: like :func:`allocate_symmetric`, returning a :class:`SymmetricAddressMap`
    whose ``peer_bases`` is the int64 table tensor on the tensor's device."""
    t = empty(*size, dtype=dtype, device=device)
    return t, symmetric_address_map(t)


@api
def symmetric_address_map(x: _torch.Tensor) -> SymmetricAddressMap:
    """The address map of the allocation holding ``x`` (``peer_bases`` an int64 tensor on
    ``x``'s device). Not collective."""
    rank, base, nbytes, table, direct = _peers.address_map_parts(x)
    view = _peers.table_view(x)
    if view is not None and base == x.data_ptr():
        bases = _import(view)
    else:
        bases = _torch.tensor(table, dtype=_torch.int64, device=x.device)
    return SymmetricAddressMap(rank, base, nbytes, bases, direct)


@api
def get_peer_bases(x: _torch.Tensor) -> _torch.Tensor:
    """The peer table of ``x`` (views and slices inside an allocation included) as an int64
    tensor on ``x``'s device: ``table[r] = translate(x.data_ptr(), my_pe, r)``, 0 where PE r
    is not direct, so ``table[my_pe] == x.data_ptr()``. Not collective."""
    _peers.in_heap(x, "tensor")
    return _table_tensor(x)


@api
def get_peer_tensor(x: _torch.Tensor, pe: int) -> _torch.Tensor:
    """A tensor aliasing PE ``pe``'s copy of ``x`` (same shape, strides and dtype; a host
    pointer of the mapped peer copy on the host backend, a device pointer on CUDA). Reads and
    writes go straight to the peer's memory: synchronise with barriers or signals. It keeps
    ``x`` alive. Not collective."""
    view = _peers.peer_view(x, pe)
    return _core.register_tensor(_import(view), view)


@api
def heap_bases() -> _torch.Tensor:
    """Start of every PE's heap in this process (int64 on the symmetric device)."""
    return _torch.tensor(_core.native().heap_bases(), dtype=_torch.int64, device=device())


@api
def record_stream(x: _torch.Tensor, stream: Any) -> None:
    """Like ``torch.Tensor.record_stream``: work enqueued on ``stream`` (a ``torch.cuda.Stream``
    or a raw handle) uses the symmetric tensor ``x``, so releasing it waits for everything
    enqueued there until the release before any PE may reuse the memory. symheap's own
    operations and the stream current at allocation are recorded already. Not collective."""
    buf = _core.allocation_of(int(x.data_ptr()))
    if buf is None:
        raise SymheapValueError("record_stream: the tensor is not in a live symheap allocation")
    buf.record_stream(stream)


@api
def free(x: _torch.Tensor) -> None:
    """Releases the allocation ``x`` starts now (local, non-blocking); ``x`` and every view of
    it must not be used afterwards (symheap refuses them). Dropping the last tensor does the
    same. A tensor made here (or a view of one) frees the allocation it was made from, so
    freeing it twice raises; a tensor made elsewhere (``torch.from_dlpack``) frees the live
    allocation it starts."""
    ptr = int(x.data_ptr()) if isinstance(x, _torch.Tensor) else None
    buf = _core.origin(x) if ptr is not None else None
    if buf is not None and not buf.freed and buf.addr == ptr:
        # A tensor made here that starts its live allocation (the usual call): its owner, found
        # through its storage, is all there is to check.
        buf.free()
        return
    _core.describe(x, "tensor")
    ptr = int(x.data_ptr())
    if buf is None:
        buf = _core.allocation_of(ptr, freed=True)
    if buf is not None and buf.freed:
        raise SymheapValueError(f"free: the symheap allocation at {buf.addr:#x} was already freed")
    if buf is None or buf.addr != ptr:
        raise SymheapValueError("free: the tensor does not start a live symheap allocation")
    buf.free()
