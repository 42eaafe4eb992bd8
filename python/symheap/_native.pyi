"""Type stubs of the extension module ``symheap._native`` (Rust, PyO3, abi3).

Calls marked *collective* must be made by every PE (of the team) in the same order with the same
arguments. Local pointers passed to ``*_from_host`` / ``*_to_host`` / ``*_on_stream`` are trusted:
the ``symheap`` package takes them from live arrays; symmetric addresses are checked.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

__version__: str
DTYPES: List[str]

class SymheapError(Exception):
    """Base of every symheap failure."""

    kind: Optional[str]
    pe: Optional[int]
    call: Optional[str]
    missing: Tuple[int, ...]

class SymheapValueError(SymheapError, ValueError): ...
class SymheapMemoryError(SymheapError, MemoryError): ...
class SymheapTimeoutError(SymheapError, TimeoutError): ...
class SymheapPeerError(SymheapError): ...
class SymheapMismatchError(SymheapError): ...
class SymheapUnsupportedError(SymheapError): ...

def dtype_size(name: str) -> int:
    """Bytes per element of a dtype name."""

def dtype_name(name: str) -> str:
    """The canonical name of a dtype (``f32`` -> ``float32``)."""

def launch(
    n: int,
    program: str,
    args: Sequence[str] = ...,
    env: Sequence[Tuple[str, str]] = ...,
    grace: float = 3.0,
    prefix_output: bool = True,
) -> int:
    """Starts ``n`` PEs of ``program args...`` like ``symheap launch``; returns its exit status."""

def set_python_search_path(dirs: Sequence[str]) -> None:
    """Directories in which to look for NVIDIA's pip wheels (NVRTC, NVSHMEM)."""

class Team:
    """A team handle; ``is_valid`` is False for non-members of a split."""

    @property
    def is_valid(self) -> bool: ...
    @property
    def members(self) -> List[int]: ...
    def my_pe(self) -> Optional[int]: ...
    def n_pes(self) -> int: ...
    def world_pe(self, pe: int) -> Optional[int]: ...
    def translate_pe(self, pe: int, dest: "Team") -> Optional[int]: ...

class SymmetricBuffer:
    """One symmetric allocation of this PE, exported by DLPack and the array interfaces."""

    @property
    def addr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def freed(self) -> bool: ...
    @property
    def peer_bases_addr(self) -> int: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...
    def peer_bases(self) -> List[int]: ...
    def peer_bases_view(self) -> "HeapView": ...
    def address_map(self) -> Dict[str, Any]: ...
    def tobytes(self) -> bytes: ...
    def write_bytes(self, data: bytes, offset: int = 0) -> None: ...
    def record_stream(self, stream: Any) -> None: ...
    def free(self) -> None:
        """Releases the allocation now (local, non-blocking). Every later use of this buffer,
        and of any array, tensor or address inside its memory, raises SymheapValueError; the
        memory is reused only once nothing made from it is left. Freeing it again raises."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...

class HeapView:
    """A view of symmetric memory (this PE's or a direct peer's) that keeps its owner alive."""

    @property
    def addr(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def strides(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def owner(self) -> Any: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class Context:
    """This PE's handle on the job."""

    @staticmethod
    def init(
        *,
        store: Any = None,
        comm: Any = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        backend: Optional[str] = None,
        device: Optional[int] = None,
        capacity: Optional[int] = None,
        chunk_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> "Context":
        """Collective: joins the job."""
    @property
    def my_pe(self) -> int: ...
    @property
    def n_pes(self) -> int: ...
    @property
    def timeout_ns(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def device_ordinal(self) -> Optional[int]: ...
    @property
    def finalized(self) -> bool: ...
    def check_alive_new_group(self) -> None:
        """Raises the job's failure as an error of ``new_group``; local, never waits."""
    def finalize(self) -> None:
        """Collective: leaves the job."""
    def abort(self, reason: str) -> None: ...
    def banner(self) -> str: ...
    def heap_usage(self) -> Dict[str, int]: ...
    def heap_bases(self) -> List[int]: ...
    def direct_peers(self) -> List[int]: ...
    def is_symmetric(self, addr: int, nbytes: int = 1) -> bool: ...
    def coll_takes_local_buffers(self, coll: str, team: Optional[Team], nbytes: int, algo: str = "auto") -> bool: ...
    def check_coll_buffers(
        self,
        coll: str,
        team: Optional[Team],
        dest: int,
        dest_len: int,
        src: int,
        src_len: int,
        count: int,
        dtype: str,
    ) -> bool:
        """The collectives' aliasing rules: True in place, False apart; raises
        SymheapValueError naming both ranges for any other overlap."""
    def check_symmetric(self, addr: int, nbytes: int, what: str) -> None: ...
    def translate(self, addr: int, src_pe: int, dst_pe: int) -> Optional[int]: ...
    def peer_bases_for(self, addr: int) -> List[int]: ...
    def allocate(
        self, shape: Sequence[int], dtype: str, align: int = 256, zero: bool = False, stream: Optional[int] = None
    ) -> SymmetricBuffer:
        """Collective: a symmetric allocation; ``stream`` (a raw CUDA stream handle) is recorded
        as using it."""
    def view(
        self,
        addr: int,
        shape: Sequence[int],
        dtype: str,
        strides: Optional[Sequence[int]] = None,
        owner: Any = None,
    ) -> HeapView: ...
    def put_from_host(self, dest: int, src_ptr: int, nbytes: int, pe: int, dtype: Optional[str] = None) -> None: ...
    def get_to_host(self, dest_ptr: int, src: int, nbytes: int, pe: int, dtype: Optional[str] = None) -> None: ...
    def put_signal_from_host(
        self,
        dest: int,
        src_ptr: int,
        nbytes: int,
        sig: int,
        value: int,
        op: str,
        pe: int,
        dtype: Optional[str] = None,
    ) -> None: ...
    def put_on_stream(
        self, dest: int, src: int, nbytes: int, pe: int, stream: Optional[int] = None, dtype: Optional[str] = None
    ) -> None: ...
    def get_on_stream(
        self, dest: int, src: int, nbytes: int, pe: int, stream: Optional[int] = None, dtype: Optional[str] = None
    ) -> None: ...
    def put_signal_on_stream(
        self,
        dest: int,
        src: int,
        nbytes: int,
        sig: int,
        value: int,
        op: str,
        pe: int,
        stream: Optional[int] = None,
        dtype: Optional[str] = None,
    ) -> None: ...
    def signal_wait_until(self, sig: int, cmp: str, value: int) -> int: ...
    def signal_wait_until_on_stream(self, sig: int, cmp: str, value: int, stream: Optional[int] = None) -> None: ...
    def atomic(self, addr: int, pe: int, op: str, dtype: str, value: Any = None, compare: Any = None) -> Any: ...
    def quiet(self) -> None: ...
    def fence(self) -> None: ...
    def quiet_on_stream(self, stream: Optional[int] = None) -> None: ...
    def sync_stream(self, stream: Optional[int] = None) -> None: ...
    def barrier_all(self) -> None:
        """Collective over the world."""
    def barrier_all_on_stream(self, stream: Optional[int] = None) -> None:
        """Collective over the world, enqueued on a stream."""
    def sync_all(self) -> None:
        """Collective over the world."""
    def barrier(self, team: Optional[Team] = None) -> None:
        """Collective over the team."""
    def team_sync(self, team: Optional[Team] = None) -> None:
        """Collective over the team."""
    def team_max(self, team: Optional[Team], value: int) -> int:
        """Collective over the team: the largest member's ``value`` (on the host)."""
    def world_team(self) -> Team: ...
    def team_split_strided(self, parent: Team, start: int, stride: int, size: int) -> Team:
        """Collective over the parent team."""
    def team_split_ranks(self, parent: Team, ranks: Sequence[int]) -> Team:
        """Collective over the parent team: team PE i is member ``ranks[i]`` of the parent."""
    def team_from_ranks(self, ranks: Sequence[int], exchange: Callable[[bytes], List[bytes]]) -> Team:
        """Collective over the world PEs ``ranks`` only (team PE i is ``ranks[i]``); ``exchange``
        is their all-gather of bytes, in the order of ``ranks``."""
    def team_destroy(self, team: Team) -> None:
        """Collective over the team."""
    def collective(
        self,
        kind: str,
        team: Optional[Team],
        dest: int,
        src: int,
        count: int,
        dtype: str,
        stream: Optional[int] = None,
        **params: Union[int, str, Sequence[int]],
    ) -> None:
        """Collective over the team: ``kind`` (broadcast, all_gather, reduce_scatter, all_reduce,
        alltoall) with its parameters by keyword (``root``, ``op``, ``algo``)."""
    def collective_direct(
        self,
        kind: str,
        team: Optional[Team],
        dest: int,
        src: int,
        count: int,
        dtype: str,
        stream: Optional[int] = None,
        **params: Union[int, str, Sequence[int]],
    ) -> Optional[Tuple[bool, bool]]:
        """``collective`` when both buffers can go to its kernel as they are: then
        ``(dest_symmetric, src_symmetric)``; None, with nothing run, when one must be staged."""
    def all_gather_bytes(self, data: bytes) -> List[bytes]:
        """Collective over the world."""

class NvshmemProvider:
    """NVSHMEM 3.x as an allocator satisfying symheap's contract (CUDA backend only).

    Loads ``libnvshmem_host.so.3`` from ``lib``, else ``$SYMHEAP_NVSHMEM_LIB``, else the
    ``nvidia-nvshmem-cu13`` package on ``sys.path``, else the loader's search path, and
    initialises NVSHMEM over the context's bootstrap. The constructor, ``allocate``, ``free``,
    ``barrier`` and ``finalize`` are collective: every PE calls them in the same order. ``free``
    is explicit (``nvshmem_free`` is a collective barrier, unsafe to run from a garbage
    collector). After ``finalize`` every other call raises ``SymheapError``.
    """

    def __init__(self, ctx: Context, lib: Optional[str] = None) -> None:
        """Collective over the world. Raises SymheapUnsupportedError when NVSHMEM cannot be
        loaded (naming every place searched) or the context is not on the CUDA backend."""
    def allocate(self, nbytes: int) -> Tuple[int, int, int, List[int], List[bool]]:
        """Collective: ``(addr, nbytes, table_addr, peer_bases, direct)``; ``peer_bases[my_pe]
        == addr``, 0/False for PEs not directly addressable; ``table_addr`` is a device int64
        array holding ``peer_bases``."""
    def free(self, addr: int) -> None:
        """Collective: frees the allocation starting at ``addr``."""
    def barrier(self) -> None:
        """Collective: symheap barrier (ledger-checked), then nvshmem_barrier_all."""
    def my_pe(self) -> int: ...
    def n_pes(self) -> int: ...
    def device(self) -> int:
        """CUDA device ordinal."""
    def attached(self) -> bool:
        """Whether NVSHMEM was initialised by another library of this process (left up at
        finalize)."""
    def lib_path(self) -> str: ...
    def peer_offsets(self) -> List[int]:
        """``peer_bases[r] - addr`` for every PE, the same for every allocation (0 where not
        direct)."""
    def finalize(self) -> None:
        """Collective: frees every allocation and finalises NVSHMEM; a second call does
        nothing, any other later call raises."""
    # The data path (not collective), to any PE; every address lies in a live allocation of
    # this provider (NVSHMEM moves data only between its own allocations).
    def put(self, dest: int, src: int, nbytes: int, pe: int) -> None:
        """``nvshmem_putmem`` (GIL released); complete at ``pe`` after ``quiet``."""
    def get(self, dest: int, src: int, nbytes: int, pe: int) -> None:
        """``nvshmem_getmem`` (GIL released)."""
    def put_on_stream(self, dest: int, src: int, nbytes: int, pe: int, stream: Optional[int] = None) -> None: ...
    def get_on_stream(self, dest: int, src: int, nbytes: int, pe: int, stream: Optional[int] = None) -> None: ...
    def put_signal(
        self, dest: int, src: int, nbytes: int, sig: int, value: int, op: str, pe: int, stream: Optional[int] = None
    ) -> None:
        """On ``stream``: ``nvshmemx_putmem_signal_on_stream``; without: put, fence, atomic."""
    def signal_on_stream(self, sig: int, value: int, op: str, pe: int, stream: Optional[int] = None) -> None: ...
    def signal_wait_until(self, sig: int, cmp: str, value: int, stream: Optional[int] = None) -> Optional[int]:
        """symheap's bounded wait: on ``stream`` (None returned), else on the host (the word)."""
    def atomic(self, addr: int, pe: int, op: str, dtype: str, value: Any = None, compare: Any = None) -> int:
        """An int64/uint64 atomic through NVSHMEM; the old value."""
    def quiet(self) -> None: ...
    def fence(self) -> None: ...
    def quiet_on_stream(self, stream: Optional[int] = None) -> None: ...
    def init_module(self, module: int) -> None:
        """Sets up NVSHMEM's device state in a CUmodule device-linked with libnvshmem_device."""
    def finalize_module(self, module: int) -> None: ...
