"""symheap: symmetric memory across GPUs and CPU processes.

Every PE (one process per GPU, or per CPU slot on the host backend) allocates the same buffers
in the same order; any PE can then read, write and atomically update any other PE's copy
directly. The contract is a pointer plus a peer table::

    import symheap, symheap.torch as st
    with symheap.init():                          # launcher env, torch.distributed, or 1 PE
        x, peer_bases = st.allocate_symmetric(1024, dtype=torch.float32)
        assert peer_bases[symheap.my_pe()] == x.data_ptr()
        symheap.barrier_all()                     # peers write only after a barrier
        symheap.put(x, local, (symheap.my_pe() + 1) % symheap.n_pes())

Allocation fronts: :mod:`symheap.torch` (tensors) and :mod:`symheap.numpy` (arrays, host
backend); :mod:`symheap.providers` puts symheap's heap, NVSHMEM and torch SymmetricMemory
behind one interface. Device side: :mod:`symheap.triton` (Triton) and ``symheap.cuh`` (CUDA
C++, in :func:`get_include`). Data operations (put/get, atomics, signals, barriers, teams,
collectives) are the functions of this module and take arrays, tensors or
:class:`SymmetricBuffer`. Functions documented as **Collective** must be called by every PE (of
the team) in the same order with the same arguments; a mismatch raises
:class:`SymheapMismatchError` on every PE. Errors are typed: :class:`SymheapError` and its
subclasses. Launch PEs with ``python -m symheap.launch -n N script.py``, torchrun, mpirun or srun.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Dict, List

from . import _core, _peers, providers
from ._core import (
    Context,
    SymmetricAddressMap,
    allocate,
    api,
    context,
    finalize,
    init,
    is_initialized,
    is_tensor,
)
from ._native import (
    DTYPES,
    HeapView,
    SymheapError,
    SymheapMemoryError,
    SymheapMismatchError,
    SymheapPeerError,
    SymheapTimeoutError,
    SymheapUnsupportedError,
    SymheapValueError,
    SymmetricBuffer,
    Team,
    __version__,
)
from ._shmem import (
    all_gather,
    all_gather_object_bytes,
    all_reduce,
    alltoall,
    atomic_add,
    atomic_and,
    atomic_compare_swap,
    atomic_fetch,
    atomic_fetch_add,
    atomic_fetch_and,
    atomic_fetch_inc,
    atomic_fetch_or,
    atomic_fetch_xor,
    atomic_inc,
    atomic_or,
    atomic_set,
    atomic_swap,
    atomic_xor,
    barrier,
    barrier_all,
    broadcast,
    fence,
    get,
    get_nbi,
    host_barrier,
    put,
    put_nbi,
    put_signal,
    quiet,
    reduce_scatter,
    signal_fetch,
    signal_wait_until,
    sync_all,
    sync_stream,
    team_destroy,
    team_from_ranks,
    team_my_pe,
    team_n_pes,
    team_split_ranks,
    team_split_strided,
    team_sync,
    team_translate_pe,
    team_world,
)
from .providers import SymheapProviderError


def get_include() -> str:
    """The directory holding ``symheap.cuh``, symheap's device-side CUDA C++ header, shipped in
    the package: compile kernels with ``-I`` that directory (nvcc, NVRTC, CuPy's
    ``RawKernel(..., options=("--include-path=" + symheap.get_include(),))``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


@api
def my_pe() -> int:
    """This PE's rank (0 .. n_pes()-1)."""
    return _core.native().my_pe


@api
def n_pes() -> int:
    """Number of PEs in the job."""
    return _core.native().n_pes


@api
def local_rank() -> int:
    """This PE's index among the PEs of its node."""
    return _core.native().local_rank


@api
def local_size() -> int:
    """Number of PEs on this node."""
    return _core.native().local_size


@api
def backend() -> str:
    """``"host"`` or ``"cuda"``."""
    return _core.native().backend


@api
def abort(reason: str) -> None:
    """Not collective: makes every PE fail with ``reason`` (they notice within milliseconds)."""
    _core.native().abort(reason)


@api
def banner() -> str:
    """The diagnostic banner: version, backend, PEs, node, heap layout, environment read."""
    return _core.native().banner()


@api
def heap_usage() -> Dict[str, int]:
    """Heap occupancy on this PE: ``{in_use, mapped, capacity, live_blocks, allocation_syncs}``.
    The same on every PE after a barrier, which is where released buffers are reclaimed.
    ``allocation_syncs`` counts allocations that had to meet the other PEs (to reclaim released
    buffers or grow the heap); the others need no communication."""
    return dict(_core.native().heap_usage())


@api
def heap_bases() -> List[int]:
    """Start of every PE's heap in this process (0 where not directly addressable). The
    NumPy/PyTorch fronts return it as an int64 array/tensor."""
    return list(_core.native().heap_bases())


@api
def is_symmetric(x: Any) -> bool:
    """Whether all of array/tensor ``x`` lies in this PE's symmetric heap. Not collective."""
    try:
        _peers.in_heap(x, "argument")
    except (SymheapValueError, TypeError):
        return False
    return True


def _front(x: Any) -> Any:
    """The front of ``x``'s kind, imported when first needed: `import symheap` loads neither
    torch nor NumPy."""
    if is_tensor(x):
        # (torch: see above.)
        from . import torch as front
    else:
        # (NumPy: see above.)
        from . import numpy as front  # type: ignore[no-redef]
    return front


@api
def get_peer_bases(x: Any) -> Any:
    """The peer table of ``x`` (an int64 numpy array, or a tensor on ``x``'s device):
    ``table[r] = translate(p, my_pe, r)`` for ``x``'s pointer ``p``. Not collective."""
    return _front(x).get_peer_bases(x)


@api
def get_peer_tensor(x: Any, pe: int) -> Any:
    """An array/tensor aliasing PE ``pe``'s copy of ``x``. Not collective."""
    return _front(x).get_peer_tensor(x, pe)


get_peer_array = get_peer_tensor


@api
def symmetric_address_map(x: Any) -> SymmetricAddressMap:
    """The :class:`SymmetricAddressMap` of the allocation holding ``x``. Not collective."""
    return _front(x).symmetric_address_map(x)


@api
def free(x: Any) -> None:
    """Releases the allocation that array/tensor/buffer ``x`` starts, now (local, never
    blocks). Nothing made from it may be used afterwards."""
    if isinstance(x, SymmetricBuffer):
        x.free()
    else:
        _front(x).free(x)


# The public submodules, reachable as attributes after a plain `import symheap` (PEP 562) and
# imported on first use, so that `import symheap` stays free of torch, Triton and NumPy.
_SUBMODULES = ("distributed", "fused", "gemm", "launch", "moe", "numpy", "ops", "providers", "torch", "triton")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'symheap' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_SUBMODULES))


# Context's attribute access falls through to this module (see symheap._core._package).
_core._package = sys.modules[__name__]


__all__ = [
    "DTYPES",
    "Context",
    "HeapView",
    "SymheapError",
    "SymheapMemoryError",
    "SymheapMismatchError",
    "SymheapPeerError",
    "SymheapProviderError",
    "SymheapTimeoutError",
    "SymheapUnsupportedError",
    "SymheapValueError",
    "SymmetricAddressMap",
    "SymmetricBuffer",
    "Team",
    "__version__",
    "abort",
    "all_gather",
    "all_gather_object_bytes",
    "all_reduce",
    "allocate",
    "alltoall",
    "atomic_add",
    "atomic_and",
    "atomic_compare_swap",
    "atomic_fetch",
    "atomic_fetch_add",
    "atomic_fetch_and",
    "atomic_fetch_inc",
    "atomic_fetch_or",
    "atomic_fetch_xor",
    "atomic_inc",
    "atomic_or",
    "atomic_set",
    "atomic_swap",
    "atomic_xor",
    "backend",
    "banner",
    "barrier",
    "barrier_all",
    "broadcast",
    "context",
    "fence",
    "finalize",
    "free",
    "get",
    "get_include",
    "get_nbi",
    "get_peer_array",
    "get_peer_bases",
    "get_peer_tensor",
    "heap_bases",
    "heap_usage",
    "host_barrier",
    "init",
    "is_initialized",
    "is_symmetric",
    "local_rank",
    "local_size",
    "my_pe",
    "n_pes",
    "put",
    "put_nbi",
    "providers",
    "put_signal",
    "quiet",
    "reduce_scatter",
    "signal_fetch",
    "signal_wait_until",
    "symmetric_address_map",
    "sync_all",
    "sync_stream",
    "team_destroy",
    "team_my_pe",
    "team_n_pes",
    "team_from_ranks",
    "team_split_ranks",
    "team_split_strided",
    "team_sync",
    "team_translate_pe",
    "team_world",
]
