"""Providers: allocators whose allocations satisfy symheap's contract, behind one interface.

The same kernel (Triton with :mod:`symheap.triton`, CUDA C++ with ``symheap.cuh``) runs over the
tensors of any provider, since each one hands out the contract's ``(tensor, peer_bases)``::

    import symheap, symheap.providers as providers
    symheap.init()
    for p in (providers.native(), providers.nvshmem(), providers.torch_symm_mem()):
        x, peer_bases = p.allocate_symmetric(1024, dtype=torch.float32)   # collective
        assert int(peer_bases[p.my_pe()]) == x.data_ptr()
        p.barrier()                                                     # collective
        my_kernel[grid](x, peer_bases, p.my_pe(), ...)
        p.free(x)                                                       # collective

- :func:`native`: symheap's own heap (:mod:`symheap.torch`), CPU tensors on the host backend,
  CUDA tensors on the CUDA backend. One table translates pointers of every allocation.
- :func:`nvshmem`: NVSHMEM 3.x (``libnvshmem_host.so.3``, e.g. the ``nvidia-nvshmem-cu13`` pip
  package), initialised over symheap's bootstrap; needs ``symheap.init()`` on the CUDA backend.
  One table translates pointers of every allocation.
- :func:`torch_symm_mem`: PyTorch SymmetricMemory (``torch.distributed._symmetric_memory``:
  ``empty`` + ``rendezvous``); needs ``torch.distributed`` initialised. Each allocation has its
  own table (no constant per-peer offsets are promised).

Every provider object has ``name``, ``my_pe()``, ``n_pes()``, ``device()``,
``allocate_symmetric(*size, dtype=None) -> (tensor, peer_bases)``,
``allocate_symmetric_map(*size, dtype=None) -> (tensor, SymmetricAddressMap)``,
``symmetric_address_map(tensor)``, ``free(tensor)``, ``barrier()``, ``peer_offsets()`` and
``finalize()``. ``peer_bases`` is an ``int64`` tensor of ``n_pes()`` entries on the tensor's
device, ``peer_bases[my_pe()] == tensor.data_ptr()``, ``peer_bases[r]`` PE r's copy as this
process addresses it (0 when not directly addressable); translation is
``peer_bases[to] + (ptr - peer_bases[from])``. Do not write into ``peer_bases``.

Calls documented **Collective** must be made by every PE (of the provider's group) in the same
order. Allocation contents are unspecified and allocation is not a synchronisation point: a peer
may write into a new tensor only after a :meth:`Provider.barrier`.

``import symheap.providers`` imports neither torch nor triton; a provider imports torch when it
is made.
"""

from __future__ import annotations

import contextlib
import math
import os
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import _core, _native, _peers
from . import _nvshmem_ops as _nv
from ._core import SymmetricAddressMap
from ._native import SymheapError, SymheapUnsupportedError, SymheapValueError
from ._shmem import barrier_all

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "Provider",
    "NativeProvider",
    "NvshmemProvider",
    "TorchSymmMemProvider",
    "SymheapProviderError",
    "native",
    "nvshmem",
    "torch_symm_mem",
]


class SymheapProviderError(SymheapError):
    """A provider broke symheap's contract (e.g. torch SymmetricMemory's ``buffer_ptrs[rank]``
    is not the tensor's ``data_ptr()``), so its tensors cannot be used with a peer table."""


def _torch() -> Any:
    try:
        # torch on first use of a provider: `import symheap` does not need it.
        import torch
    except ImportError:
        raise SymheapUnsupportedError(
            "this provider needs PyTorch, which is not installed (pip install torch)"
        ) from None
    return torch


def _nvshmem_defaults(environ: Mapping[str, str], single_node: bool) -> Dict[str, str]:
    """The NVSHMEM settings symheap's NVSHMEM provider wants that ``environ`` leaves unset:
    ``NVSHMEM_DISABLE_NVLS=1`` (symheap never uses NVLink multicast) and, on a job of one node,
    ``NVSHMEM_REMOTE_TRANSPORT=none`` (no network transport to probe). What the user set wins."""
    want = {"NVSHMEM_DISABLE_NVLS": "1"}
    if single_node:
        want["NVSHMEM_REMOTE_TRANSPORT"] = "none"
    return {k: v for k, v in want.items() if k not in environ}


@contextlib.contextmanager
def _environ_while(values: Dict[str, str]) -> Iterator[None]:
    """``values`` (variables absent from ``os.environ``) set for the ``with`` block only, then
    removed again: NVSHMEM reads its settings from the environment while it initialises, and
    nothing else in the process should see symheap's choices."""
    for k, v in values.items():
        os.environ[k] = v
    try:
        yield
    finally:
        for k in values:
            os.environ.pop(k, None)


def _shape(size: Sequence[Any]) -> Tuple[int, ...]:
    return _peers.shape_of(tuple(size))


class _CudaMemory:
    """``__cuda_array_interface__`` of device memory owned by someone else; ``torch.as_tensor``
    of it aliases the memory without a copy and keeps this object (and ``owner``) alive."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], typestr: str, owner: Any) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (int(ptr), False),
            "strides": None,
            "version": 3,
            # No stream: the memory is not being written by any stream at this point.
            "stream": None,
        }


class Provider:
    """What every provider offers (see the module docstring). Subclasses: :class:`NativeProvider`,
    :class:`NvshmemProvider`, :class:`TorchSymmMemProvider`."""

    #: ``"native"``, ``"nvshmem"`` or ``"torch_symm_mem"``.
    name: str = ""

    def my_pe(self) -> int:
        """This PE's rank in the provider's group."""
        raise NotImplementedError

    def n_pes(self) -> int:
        """Number of PEs in the provider's group."""
        raise NotImplementedError

    def device(self) -> "torch.device":
        """The device this provider's tensors live on."""
        raise NotImplementedError

    def allocate_symmetric(self, *size: Any, dtype: Any = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """**Collective**: ``(tensor, peer_bases)``: an uninitialised contiguous tensor of
        ``size`` and ``dtype`` (default: torch's default dtype) and its peer table (``int64``,
        ``n_pes()`` entries, on the tensor's device, ``peer_bases[my_pe()] ==
        tensor.data_ptr()``)."""
        raise NotImplementedError

    def allocate_symmetric_map(self, *size: Any, dtype: Any = None) -> Tuple["torch.Tensor", SymmetricAddressMap]:
        """**Collective**: like :meth:`allocate_symmetric`, with a :class:`SymmetricAddressMap`
        (``peer_bases`` the table tensor, plus the allocation's base, size and direct mask)."""
        t, _ = self.allocate_symmetric(*size, dtype=dtype)
        return t, self.symmetric_address_map(t)

    def symmetric_address_map(self, tensor: "torch.Tensor") -> SymmetricAddressMap:
        """The :class:`SymmetricAddressMap` of the allocation holding ``tensor`` (also for a view
        inside it): ``allocation_base`` and ``peer_bases`` are the allocation's, so
        ``peer_bases[my_pe()] == allocation_base``. Not collective."""
        raise NotImplementedError

    def free(self, tensor: "torch.Tensor") -> None:
        """**Collective** (call it on every PE in the same order, whatever the provider; see
        each provider for what it does): releases the allocation ``tensor`` starts. Neither
        ``tensor``, its views nor its ``peer_bases`` may be used afterwards."""
        raise NotImplementedError

    def barrier(self) -> None:
        """**Collective**: returns once every PE called it; the memory operations every PE
        issued before it (host writes, and kernels on the current stream) are visible to what
        any PE issues after it."""
        raise NotImplementedError

    def peer_offsets(self) -> Optional[List[int]]:
        """``peer_bases[r] - peer_bases[my_pe()]`` for every PE when it is the same for every
        allocation of this provider (so one table translates pointers of any allocation); None
        when the provider does not promise that. Entries of PEs that are not direct are 0.
        Not collective."""
        raise NotImplementedError

    def finalize(self) -> None:
        """**Collective**: ends the provider (a no-op unless documented otherwise)."""

    def __repr__(self) -> str:
        try:
            return f"<symheap provider {self.name} pe={self.my_pe()} n_pes={self.n_pes()}>"
        except SymheapError:
            return f"<symheap provider {self.name} (unusable)>"


# ---- native ------------------------------------------------------------------------------------


class NativeProvider(Provider):
    """symheap's own heap, through :mod:`symheap.torch` (needs ``symheap.init()``).

    Works on the host backend with CPU tensors and on the CUDA backend with CUDA tensors. The
    per-peer offsets are the same for every heap address, so :meth:`peer_offsets` is not None
    and one table translates pointers of every allocation. :meth:`free` is local and never
    blocks (symheap reclaims a block at a later collective point once every PE released it), so
    calling it on every PE in the same order is good practice here, not a requirement; dropping
    the last reference to a tensor frees it too.
    """

    name = "native"

    def __init__(self) -> None:
        _core.context()  # raises SymheapError before symheap.init()
        _torch()
        # The torch front needs torch, imported only now (see _torch).
        from . import torch as st

        self._st = st

    def my_pe(self) -> int:
        """This PE's rank (``symheap.my_pe()``)."""
        return _core.native().my_pe

    def n_pes(self) -> int:
        """Number of PEs (``symheap.n_pes()``)."""
        return _core.native().n_pes

    def device(self) -> "torch.device":
        """``cpu`` on the host backend, ``cuda:N`` on the CUDA backend."""
        return self._st.device()

    def allocate_symmetric(self, *size: Any, dtype: Any = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """**Collective**: :func:`symheap.torch.allocate_symmetric` (the table is the
        allocation's in-heap table: no copy, no device synchronisation)."""
        return self._st.allocate_symmetric(*size, dtype=dtype)

    def allocate_symmetric_map(self, *size: Any, dtype: Any = None) -> Tuple["torch.Tensor", SymmetricAddressMap]:
        """**Collective**: :func:`symheap.torch.allocate_symmetric_map`."""
        return self._st.allocate_symmetric_map(*size, dtype=dtype)

    def symmetric_address_map(self, tensor: "torch.Tensor") -> SymmetricAddressMap:
        """:func:`symheap.torch.symmetric_address_map`. Not collective."""
        return self._st.symmetric_address_map(tensor)

    def free(self, tensor: "torch.Tensor") -> None:
        """Releases the allocation ``tensor`` starts: local and non-blocking here
        (:func:`symheap.torch.free`)."""
        self._st.free(tensor)

    def barrier(self) -> None:
        """**Collective**: :func:`symheap.barrier_all` (on the CUDA backend enqueued on the
        current stream: kernels enqueued after it see every PE's writes made before it)."""
        barrier_all()

    def peer_offsets(self) -> Optional[List[int]]:
        """``heap_bases[r] - heap_bases[my_pe]``: the same for every allocation (0 for PEs that
        are not direct)."""
        bases = [int(b) for b in _core.native().heap_bases()]
        mine = bases[self.my_pe()]
        return [b - mine if b else 0 for b in bases]


def native() -> NativeProvider:
    """The provider of symheap's own heap (needs ``symheap.init()`` first). Not collective."""
    return NativeProvider()


# ---- NVSHMEM -----------------------------------------------------------------------------------


class _NvAllocation:
    """One live NVSHMEM allocation: what ``NvshmemProvider.allocate`` returned."""

    __slots__ = ("addr", "nbytes", "table_addr", "peer_bases", "direct", "table", "__weakref__")

    def __init__(self, addr: int, nbytes: int, table_addr: int, peer_bases: List[int], direct: List[bool]) -> None:
        self.addr = addr
        self.nbytes = nbytes
        self.table_addr = table_addr
        self.peer_bases = peer_bases
        self.direct = direct
        self.table: Any = None


class NvshmemProvider(Provider):
    """NVSHMEM 3.x as a provider: ``nvshmem_malloc`` + ``nvshmem_ptr`` per peer, the peer table
    allocated with it on the device (no copy, no synchronisation). Needs ``symheap.init()`` on
    the CUDA backend (NVSHMEM is initialised over symheap's bootstrap, on symheap's device) and
    NumPy (torch reads ``__cuda_array_interface__`` through it).

    :meth:`free` is **explicit and collective**: ``nvshmem_free`` is itself a collective
    (a barrier), so a free run by the garbage collector, at different moments on different
    PEs, would deadlock. A tensor dropped without :meth:`free` stays allocated (its memory is
    released by :meth:`finalize`); every PE must call :meth:`free` for the same tensors in the
    same order, interleaved the same way with symheap's other collective calls (a mismatch is
    an error on every PE, not a hang).

    One NVSHMEM runtime exists per process: :func:`nvshmem` returns the same object until it is
    finalized.

    Data path: :func:`symheap.put`, :func:`symheap.get`, :func:`symheap.put_signal`,
    :func:`symheap.signal_wait_until`, :func:`symheap.signal_fetch`, the ``symheap.atomic_*``
    calls (int64/uint64 words) and :func:`symheap.quiet` take this provider's tensors and reach
    **any** PE: a direct one by symheap's own copies, kernels and atomics on the memory NVSHMEM
    maps, any other (another node) through NVSHMEM's host and on-stream calls over its network
    transport; both sides of a transfer must be this provider's tensors. The peer table's 0 entries (``direct``
    False) mark the PEs a kernel cannot store to through ``peer_bases``: a kernel reaches them
    with NVSHMEM's device library (``nvshmem_putmem_signal`` and friends, in a kernel
    device-linked with ``libnvshmem_device``: :meth:`device_library` says where it is, and
    :meth:`init_module` must set up each such module before its kernels run;
    ``examples/cuda/nvshmem_ring.cu``), or the host/stream calls above. Waits are symheap's bounded
    waits (``SYMHEAP_TIMEOUT``), never NVSHMEM's unbounded ones.
    """

    name = "nvshmem"

    def __init__(self, lib: Optional[str] = None) -> None:
        torch = _torch()
        ctx = _core.native()  # raises SymheapError before symheap.init()
        cls = getattr(_native, "NvshmemProvider", None)
        if cls is None:
            raise SymheapUnsupportedError("this build of symheap has no NVSHMEM provider")
        if ctx.backend != "cuda":
            raise SymheapUnsupportedError(
                "the NVSHMEM provider needs the CUDA backend (symheap runs on the host backend: "
                "init with backend='cuda' or SYMHEAP_BACKEND=cuda)"
            )
        self._torch = torch
        # NVSHMEM's defaults reach only the NVSHMEM this provider initialises (an NVSHMEM already
        # initialised in the process, which it attaches to, has read its settings already).
        with _environ_while(_nvshmem_defaults(os.environ, ctx.local_size == ctx.n_pes)):
            self._p = cls(ctx, lib)
        self._dev = torch.device("cuda", int(self._p.device()))
        self._me = int(self._p.my_pe())
        self._n = int(self._p.n_pes())
        self._live: Dict[int, _NvAllocation] = {}
        self._offsets = [int(o) for o in self._p.peer_offsets()]
        self._finalized = False

    @property
    def native(self) -> Any:
        """The underlying ``symheap._native.NvshmemProvider``."""
        return self._p

    def lib_path(self) -> str:
        """Path ``libnvshmem_host.so.3`` was loaded from."""
        return str(self._p.lib_path())

    def attached(self) -> bool:
        """Whether this provider uses an NVSHMEM another library of the process initialised
        (torch's NVSHMEM backend, DeepEP, nvshmem4py: every PE's NVSHMEM PE number must be its
        symheap PE, else :func:`nvshmem` raises :class:`SymheapUnsupportedError` saying which PE
        differs). :meth:`finalize` then frees this provider's allocations and leaves NVSHMEM
        initialised for that library."""
        return bool(self._p.attached())

    def device_library(self) -> Dict[str, str]:
        """Where NVSHMEM's device library is, beside the host library in use: ``include`` (the
        headers' directory), ``static`` (``libnvshmem_device.a``, for ``nvcc -dlink``) and
        ``bitcode`` (``libnvshmem_device.bc``, for LLVM/LTO linkers). Raises
        :class:`SymheapUnsupportedError` when that installation has none (the
        ``nvidia-nvshmem-cu13`` wheel has both)."""
        lib_dir = os.path.dirname(os.path.realpath(self.lib_path()))
        found = {
            "include": os.path.join(os.path.dirname(lib_dir), "include"),
            "static": os.path.join(lib_dir, "libnvshmem_device.a"),
            "bitcode": os.path.join(lib_dir, "libnvshmem_device.bc"),
        }
        missing = [p for p in found.values() if not os.path.exists(p)]
        if missing:
            raise SymheapUnsupportedError(
                f"NVSHMEM's device library is not beside {self.lib_path()}: missing {', '.join(missing)}"
            )
        return found

    def init_module(self, module: int) -> None:
        """Sets up NVSHMEM's device state in ``module``, a ``CUmodule`` handle (an int: CuPy's
        ``cupy.cuda.function.Module().ptr``, ``cuda.bindings``' ``int(CUmodule)``) whose code was
        compiled with ``nvcc -rdc=true`` and device-linked with ``libnvshmem_device.a`` (see
        :meth:`device_library` and README, "NVSHMEM's device library in your kernel").
        NVSHMEM's device functions read state kept in each module: call this once per module,
        before launching any of its kernels. Not collective. The module must be loaded in this device's primary
        context and still loaded (a dangling handle is undefined behaviour in the driver). A
        module not linked with the device library raises :class:`SymheapValueError`."""
        if self._finalized:
            raise SymheapError("the NVSHMEM provider was finalized")
        self._p.init_module(int(module))

    def finalize_module(self, module: int) -> None:
        """Releases what :meth:`init_module` set up in ``module``; call it before unloading the
        module. Not collective."""
        if self._finalized:
            raise SymheapError("the NVSHMEM provider was finalized")
        self._p.finalize_module(int(module))

    def my_pe(self) -> int:
        """This PE's NVSHMEM rank (= symheap's)."""
        return self._me

    def n_pes(self) -> int:
        """Number of PEs (= symheap's)."""
        return self._n

    def device(self) -> "torch.device":
        """``cuda:N``, the device NVSHMEM runs on (symheap's)."""
        return self._dev

    def _alias(self, ptr: int, shape: Tuple[int, ...], typestr: str, owner: Any) -> "torch.Tensor":
        t = self._torch.as_tensor(_CudaMemory(ptr, shape, typestr, owner), device=self._dev)
        if t.data_ptr() != ptr:  # torch copied instead of aliasing: the contract would break
            raise SymheapProviderError(
                f"torch did not alias NVSHMEM memory at {ptr:#x} on {self._dev} (got {t.data_ptr():#x} on {t.device})"
            )
        return t

    def _table(self, rec: _NvAllocation) -> "torch.Tensor":
        if rec.table is None:
            rec.table = self._alias(rec.table_addr, (self._n,), "<i8", rec)
        return rec.table

    def allocate_symmetric(self, *size: Any, dtype: Any = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """**Collective**: ``nvshmem_malloc`` of the tensor's bytes; the tensor and its table
        alias NVSHMEM memory (no copy). Free it with :meth:`free` (collective)."""
        torch = self._torch
        if self._finalized:
            raise SymheapError("the NVSHMEM provider was finalized")
        shape = _shape(size)
        dt = torch.get_default_dtype() if dtype is None else dtype
        itemsize = torch.empty((), dtype=dt).element_size()
        numel = math.prod(shape)
        nbytes = numel * itemsize
        # nvshmem_malloc(0) may return NULL: a zero-size tensor still gets a small allocation.
        addr, got, table_addr, peer_bases, direct = self._p.allocate(max(nbytes, 16))
        rec = _NvAllocation(int(addr), int(got), int(table_addr), [int(b) for b in peer_bases], list(direct))
        self._live[rec.addr] = rec
        raw = self._alias(rec.addr, (rec.nbytes,), "|u1", rec)
        t = raw[:nbytes].view(dt).view(shape)
        return t, self._table(rec)

    def _holds(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies in one live allocation of this provider."""
        return any(r.addr <= ptr and ptr + nbytes <= r.addr + r.nbytes for r in self._live.values())

    def _record_of(self, ptr: int) -> _NvAllocation:
        for rec in self._live.values():
            if rec.addr <= ptr < rec.addr + max(rec.nbytes, 1):
                return rec
        raise SymheapValueError(f"{ptr:#x} is not in a live NVSHMEM allocation of this provider")

    def symmetric_address_map(self, tensor: "torch.Tensor") -> SymmetricAddressMap:
        """The map of the NVSHMEM allocation holding ``tensor`` (its table tensor, no copy).
        Not collective."""
        rec = self._record_of(int(tensor.data_ptr()))
        return SymmetricAddressMap(self._me, rec.addr, rec.nbytes, self._table(rec), list(rec.direct))

    def free(self, tensor: "torch.Tensor") -> None:
        """**Collective**: ``nvshmem_free`` of the allocation ``tensor`` starts (after
        synchronising the current stream, so no queued kernel still uses it)."""
        ptr = int(tensor.data_ptr())
        rec = self._live.get(ptr)
        if rec is None:
            raise SymheapValueError("free: the tensor does not start a live NVSHMEM allocation of this provider")
        self._torch.cuda.current_stream(self._dev).synchronize()
        del self._live[ptr]
        self._p.free(ptr)

    def barrier(self) -> None:
        """**Collective**: synchronises the current stream, then a symheap host barrier and
        ``nvshmem_barrier_all``. Blocks the host until every PE arrived."""
        self._torch.cuda.current_stream(self._dev).synchronize()
        self._p.barrier()

    def peer_offsets(self) -> Optional[List[int]]:
        """NVSHMEM's per-peer offsets (``nvshmem_ptr`` of the heap), the same for every
        allocation; 0 for PEs that are not direct."""
        return list(self._offsets)

    def finalize(self) -> None:
        """**Collective**: frees every allocation and finalises NVSHMEM; tensors of this provider
        must not be used afterwards. A later :func:`nvshmem` makes a new runtime."""
        if self._finalized:
            return
        self._torch.cuda.current_stream(self._dev).synchronize()
        self._finalized = True
        self._live.clear()
        self._p.finalize()
        if _nv.live is self:
            _nv.live = None

    def __repr__(self) -> str:
        return f"<symheap provider nvshmem pe={self._me} n_pes={self._n} {self._p!r}>"


def nvshmem(lib: Optional[str] = None) -> NvshmemProvider:
    """**Collective** (the first call of a process; later calls return the same provider until
    it is finalized): the NVSHMEM provider. Loads ``libnvshmem_host.so.3`` from ``lib``, else
    ``$SYMHEAP_NVSHMEM_LIB``, else the ``nvidia-nvshmem-cu13`` package on ``sys.path``, else the
    loader's path. Needs ``symheap.init()`` on the CUDA backend; raises
    :class:`SymheapUnsupportedError` when the library is missing or on the host backend."""
    nv = _nv.live
    if nv is None or nv._finalized:
        nv = _nv.live = NvshmemProvider(lib)
        # Left open, it is finalized (collectively) by symheap.finalize() or at exit, before the
        # context: NVSHMEM's exit handlers must not run with its runtime still up.
        _core._before_finalize.append(nv.finalize)
    return nv


# ---- torch SymmetricMemory ---------------------------------------------------------------------


class _SymmAllocation:
    __slots__ = ("tensor_ref", "handle", "base", "nbytes", "peer_bases", "table", "__weakref__")

    def __init__(self, tensor: Any, handle: Any, base: int, nbytes: int, peer_bases: List[int], table: Any) -> None:
        self.tensor_ref = weakref.ref(tensor)
        self.handle = handle
        self.base = base
        self.nbytes = nbytes
        self.peer_bases = peer_bases
        self.table = table


class TorchSymmMemProvider(Provider):
    """PyTorch SymmetricMemory (``torch.distributed._symmetric_memory``) as a provider.

    Needs ``torch.distributed`` initialised (e.g. ``dist.init_process_group("nccl")`` with
    ``torch.cuda.set_device(local_rank)`` first) and CUDA tensors; symheap itself need not be
    initialised. ``group``: a ``ProcessGroup``, a group name, or None for the default (world)
    group. Allocation is ``symm_mem.empty`` + ``symm_mem.rendezvous`` (both collective over the
    group); the peer table comes from the handle's ``buffer_ptrs`` (checked against the
    tensor's ``data_ptr()``: :class:`SymheapProviderError` otherwise) and is copied to the
    device once. The handle stays alive with the allocation. Per-peer offsets differ between
    allocations (:meth:`peer_offsets` is None): pass each tensor's own table to kernels.
    """

    name = "torch_symm_mem"

    def __init__(self, group: Any = None) -> None:
        torch = _torch()
        # torch.distributed and its SymmetricMemory only for this provider.
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise SymheapUnsupportedError(
                "the torch SymmetricMemory provider needs torch.distributed initialised first "
                "(torch.cuda.set_device(local_rank); torch.distributed.init_process_group('nccl'))"
            )
        try:
            # Optional: older torch builds have none.
            import torch.distributed._symmetric_memory as symm_mem
        except ImportError as e:
            raise SymheapUnsupportedError(f"this torch has no SymmetricMemory: {e}") from None
        if not (hasattr(symm_mem, "empty") and hasattr(symm_mem, "rendezvous")):
            # (torch 2.5 has the module without its allocation API.)
            raise SymheapUnsupportedError(
                f"torch {torch.__version__} has no SymmetricMemory allocation API (symm_mem.empty, "
                "symm_mem.rendezvous): the torch SymmetricMemory provider needs torch 2.6 or newer"
            )
        if not torch.cuda.is_available():
            raise SymheapUnsupportedError("the torch SymmetricMemory provider needs a CUDA device")
        # (torch.distributed, as above.)
        from torch.distributed import distributed_c10d as c10d

        if group is None:
            pg = dist.group.WORLD
        elif isinstance(group, str):
            pg = c10d._resolve_process_group(group)
        else:
            pg = group
        self._torch = torch
        self._dist = dist
        self._symm = symm_mem
        self._pg = pg
        self._group_name = pg.group_name
        self._me = int(dist.get_rank(pg))
        self._n = int(dist.get_world_size(pg))
        self._dev = torch.device("cuda", torch.cuda.current_device())
        self._live: Dict[int, _SymmAllocation] = {}

    @property
    def group_name(self) -> str:
        """The name of the process group the allocations are made over."""
        return str(self._group_name)

    def my_pe(self) -> int:
        """This process's rank in the group."""
        return self._me

    def n_pes(self) -> int:
        """Size of the group."""
        return self._n

    def device(self) -> "torch.device":
        """The current CUDA device when the provider was made."""
        return self._dev

    def _forget(self, base: int, rec_ref: "weakref.ref[_SymmAllocation]") -> None:
        if self._live.get(base) is rec_ref():
            self._live.pop(base, None)

    def allocate_symmetric(self, *size: Any, dtype: Any = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """**Collective** over the group: ``symm_mem.empty(size, dtype, device)`` then
        ``symm_mem.rendezvous(tensor, group)``; the table is the handle's ``buffer_ptrs``
        (shifted by the handle's ``offset`` when the tensor does not start the buffer)."""
        torch = self._torch
        shape = _shape(size)
        t = self._symm.empty(*shape, dtype=dtype, device=self._dev)
        hdl = self._symm.rendezvous(t, self._group_name)
        ptrs = [int(p) for p in hdl.buffer_ptrs]
        rank = int(getattr(hdl, "rank", self._me))
        if len(ptrs) != self._n or rank != self._me:
            raise SymheapProviderError(
                f"torch SymmetricMemory handle has {len(ptrs)} buffers and rank {rank}; "
                f"expected {self._n} and {self._me}"
            )
        ptr = int(t.data_ptr())
        delta = 0
        if ptrs[rank] != ptr:
            off = getattr(hdl, "offset", None)
            if isinstance(off, int) and ptrs[rank] + off == ptr:
                delta = off
            else:
                raise SymheapProviderError(
                    f"torch SymmetricMemory's buffer_ptrs[{rank}] = {ptrs[rank]:#x} is not the tensor's "
                    f"data_ptr() {ptr:#x}: its peer table would not satisfy the contract"
                )
        bases = [p + delta if p else 0 for p in ptrs]
        table = torch.tensor(bases, dtype=torch.int64, device=self._dev)
        nbytes = t.numel() * t.element_size()
        rec = _SymmAllocation(t, hdl, ptr, nbytes, bases, table)
        self._live[ptr] = rec
        ref = weakref.ref(rec)
        weakref.finalize(t, self._forget, ptr, ref)
        return t, table

    def _record_of(self, ptr: int) -> _SymmAllocation:
        for rec in list(self._live.values()):
            if rec.tensor_ref() is None:
                continue
            if rec.base <= ptr < rec.base + max(rec.nbytes, 1):
                return rec
        raise SymheapValueError(f"{ptr:#x} is not in a live torch SymmetricMemory allocation of this provider")

    def symmetric_address_map(self, tensor: "torch.Tensor") -> SymmetricAddressMap:
        """The map of the allocation holding ``tensor`` (its table tensor; ``direct[r]``:
        ``buffer_ptrs[r] != 0``). Not collective."""
        rec = self._record_of(int(tensor.data_ptr()))
        return SymmetricAddressMap(self._me, rec.base, rec.nbytes, rec.table, [b != 0 for b in rec.peer_bases])

    def free(self, tensor: "torch.Tensor") -> None:
        """Drops the provider's reference to the allocation ``tensor`` starts (local): its memory
        goes back to torch's symmetric pool once the last tensor using it is gone. Call it on
        every PE in the same order anyway (portable code)."""
        ptr = int(tensor.data_ptr())
        if self._live.pop(ptr, None) is None:
            raise SymheapValueError(
                "free: the tensor does not start a live torch SymmetricMemory allocation of this provider"
            )

    def barrier(self) -> None:
        """**Collective** over the group: synchronises the current stream, then
        ``torch.distributed.barrier`` and a device synchronisation, so the host returns only
        when every PE's earlier work is complete."""
        torch = self._torch
        torch.cuda.current_stream(self._dev).synchronize()
        if self._dist.get_backend(self._pg) == "nccl":
            self._dist.barrier(group=self._pg, device_ids=[self._dev.index])
        else:
            self._dist.barrier(group=self._pg)
        torch.cuda.synchronize(self._dev)

    def peer_offsets(self) -> Optional[List[int]]:
        """None: torch SymmetricMemory does not promise the same per-peer offsets for every
        allocation."""
        return None


def torch_symm_mem(group: Any = None) -> TorchSymmMemProvider:
    """The torch SymmetricMemory provider over ``group`` (a ``ProcessGroup``, a group name, or
    None for the world). Needs ``torch.distributed`` initialised; raises
    :class:`SymheapUnsupportedError` without it (or without torch, CUDA, or SymmetricMemory).
    Not collective itself (its allocations are)."""
    return TorchSymmMemProvider(group)
