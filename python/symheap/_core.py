"""The global context, and how arrays and tensors are turned into addresses.

One symheap context exists per process at a time (like NVSHMEM): :func:`init` makes it,
:func:`finalize` ends it, and every other function uses it.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from . import _native
from ._native import (
    HeapView,
    SymheapError,
    SymheapValueError,
    SymmetricBuffer,
    Team,
)

_ctx: Optional["Context"] = None
# The ``symheap`` package, where :class:`Context`'s attribute access falls through to. The
# package registers itself here when it is imported: it sits above this module, which must not
# import it (that would be an import circle).
_package: Any = None
_atexit_registered = False
# Live allocations by address (weak references), to find the allocation of any pointer.
_allocations: Dict[int, "weakref.ref[SymmetricBuffer]"] = {}

_LAUNCHER_VARS = (
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_STEP_ID"),
)


def cache_dir() -> str:
    """symheap's cache directory, the Rust runtime's rule for its kernel cache
    (``backend/cuda/cache.rs``): ``SYMHEAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/symheap``, else
    ``~/.cache/symheap``, else ``symheap-cache`` in the temp dir. ``symheap.gemm``'s tuned
    choices and the backend's C++ Work live under it."""
    d = os.environ.get("SYMHEAP_CACHE_DIR", "")
    if d:
        return d
    x = os.environ.get("XDG_CACHE_HOME", "")
    if x:
        return os.path.join(x, "symheap")
    h = os.environ.get("HOME", "")
    if h:
        return os.path.join(h, ".cache", "symheap")
    return os.path.join(tempfile.gettempdir(), "symheap-cache")


F = TypeVar("F", bound=Callable[..., Any])

# The largest value of a 64-bit unsigned word (signal values).
U64_MAX = (1 << 64) - 1


def _launcher_rank() -> Optional[int]:
    """The rank the launcher gave this process (before a context exists), if it says."""
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        v = os.environ.get(var, "").strip()
        if v.isdigit():
            return int(v)
    return None


def _this_pe() -> Optional[int]:
    """This process's PE: the context's, else the launcher's, else 0 (no launcher: a single PE)."""
    if _ctx is not None:
        return _ctx.native.my_pe
    return _launcher_rank() if _launcher_env() else 0


def _fill(e: BaseException, call: str) -> None:
    """Gives a symheap error raised by the Python layer (or before the PE was known) the
    ``pe`` and ``call`` that Rust-side errors carry."""
    if getattr(e, "call", None) is None:
        e.call = call  # type: ignore[attr-defined]
    if getattr(e, "pe", None) is None:
        e.pe = _this_pe()  # type: ignore[attr-defined]


def _relabel(e: BaseException, call: str) -> None:
    """Names ``call`` as the call that failed, in ``e.call`` and in its message. A PE that
    notices a death or a timeout inside symheap's own bookkeeping (an argument check such as
    ``check_symmetric``, a stream form such as ``all_reduce_on_stream``) would otherwise report it
    under that internal name instead of the call the user made."""
    old = getattr(e, "call", None)
    _fill(e, call)
    if old is None or old == call:
        return
    e.call = call  # type: ignore[attr-defined]
    if e.args and isinstance(e.args[0], str):
        msg = e.args[0]
        head, sep, rest = msg.partition(f": {old}: ")
        if sep and head.startswith("symheap"):
            e.args = (f"{head}: {call}: {rest}", *e.args[1:])


def api(fn: F) -> F:
    """Marks a public function: an argument Python or the binding cannot convert (a list for a
    PE, an int for a team, a value past 64 bits) raises :class:`SymheapValueError` (also a
    ``TypeError`` and a ``ValueError``) instead of a bare ``TypeError``/``OverflowError``, and
    every :class:`SymheapError` leaving it names the PE and the call. Public functions call each
    other: each relabels on the way out, so the outermost, the call the user made, is named."""
    call = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SymheapError as e:
            _relabel(e, call)
            raise
        except (TypeError, OverflowError) as e:
            err = SymheapValueError(f"{call}: {e}")
            _fill(err, call)
            raise err from e

    return wrapper  # type: ignore[return-value]


def index_arg(v: Any, what: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    """``v`` as an int from ``lo`` to ``hi``, or :class:`SymheapValueError`: the one check of
    every count, size, PE, index, root and rank the Python API takes. Anything with
    ``__index__`` (int, NumPy integers, 0-d integer tensors) is taken; a bool never is (it is
    an int to Python, but ``True`` as a size or PE is a mistake, not a 1)."""
    if isinstance(v, bool):
        raise SymheapValueError(f"{what} must be an integer, not bool ({v})")
    try:
        i = int(v.__index__())
    except (AttributeError, TypeError):
        raise SymheapValueError(f"{what} must be an integer, not {type(v).__name__}") from None
    if not lo <= i <= hi:
        raise SymheapValueError(f"{what} {i} is out of range ({lo} to {hi})")
    return i


class Context:
    """This PE's symheap context (returned by :func:`init`); a context manager.

    ``with symheap.init() as ctx:`` finalizes on leaving the block (collective), or, when the
    block raises, aborts the job so the other PEs fail at once instead of waiting. Attribute
    access falls through to the ``symheap`` module functions (``ctx.put(...)``,
    ``ctx.barrier_all()``), which all use this context.
    """

    def __init__(self, native: _native.Context) -> None:
        self.native = native

    def my_pe(self) -> int:
        """This PE's rank."""
        return self.native.my_pe

    def n_pes(self) -> int:
        """Number of PEs."""
        return self.native.n_pes

    def local_rank(self) -> int:
        """This PE's index among the PEs of its node."""
        return self.native.local_rank

    def backend(self) -> str:
        """``"host"`` or ``"cuda"``."""
        return self.native.backend

    def finalize(self) -> None:
        """Collective: leaves the job (see :func:`symheap.finalize`)."""
        finalize()

    def abort(self, reason: str) -> None:
        """Not collective: makes every PE fail with ``reason``."""
        self.native.abort(reason)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        global _ctx
        if exc_type is None:
            finalize()
            return
        _before_finalize.clear()
        if not self.native.finalized:
            self.native.abort(f"PE {self.native.my_pe} raised {exc_type.__name__}: {exc}")
        if _ctx is self:
            _ctx = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or _package is None:
            raise AttributeError(name)
        try:
            return getattr(_package, name)
        except AttributeError:
            raise AttributeError(f"symheap.Context has no attribute {name!r}") from None

    def __repr__(self) -> str:
        return f"<symheap.Context pe={self.native.my_pe} n_pes={self.native.n_pes} backend={self.native.backend}>"


def _launcher_env() -> bool:
    return any(a in os.environ and b in os.environ for a, b in _LAUNCHER_VARS)


@api
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
) -> Context:
    """**Collective**: joins the job and makes the global context; returns it.

    Where the PEs come from, first match wins:

    1. ``store=`` (an object with ``set/get/wait``, e.g. torch.distributed's store) with
       ``rank=`` and ``world_size=``, or ``comm=`` (an mpi4py communicator);
    2. an initialised ``torch.distributed``: its default store drives the rendezvous;
    3. the launcher environment (``symheap launch`` / ``python -m symheap.launch``, torchrun,
       Open MPI, MPICH, Slurm);
    4. ``mpi4py.MPI`` already imported with more than one process: ``MPI.COMM_WORLD``;
    5. nothing: a single PE.

    ``backend`` is ``"host"``, ``"cuda"`` or ``"auto"`` (default ``SYMHEAP_BACKEND``);
    ``device`` the CUDA ordinal (default ``SYMHEAP_DEVICE``, else ``LOCAL_RANK`` mod the GPU
    count; passed to the runtime: the environment is left as it is); ``capacity``/
    ``chunk_size`` bytes (capacity at most 64 TiB); ``timeout`` seconds for every wait (0.001
    to 1e9). An argument of the wrong type or range raises :class:`SymheapValueError`. Runs
    with the GIL released. Raises :class:`SymheapError` if a context already exists.

    A context left open at interpreter exit is finalized then (collectively), or, when the
    process dies of an unhandled exception, the job is aborted so the other PEs fail at once.
    ``sys.exit()`` with a failure status goes through the same collective finalize: prefer
    ``with symheap.init():`` or an explicit :func:`finalize` / :func:`abort`.
    Over a store, a PE that dies without a word is noticed only by the others' timeouts.
    """
    global _ctx, _atexit_registered
    if _ctx is not None:
        raise SymheapError("symheap is already initialised in this process; call symheap.finalize() first")
    if store is None and comm is None:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            store = _store_from_process_group(dist)
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        elif not _launcher_env() and "mpi4py.MPI" in sys.modules:
            mpi = sys.modules["mpi4py.MPI"]
            if mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1:
                comm = mpi.COMM_WORLD
    if capacity is not None:
        capacity = index_arg(capacity, "capacity (bytes)", 1, U64_MAX)
    if chunk_size is not None:
        chunk_size = index_arg(chunk_size, "chunk_size (bytes)", 1, U64_MAX)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise SymheapValueError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    rank = None if rank is None else index_arg(rank, "rank")
    world_size = None if world_size is None else index_arg(world_size, "world_size", 1)
    # An argument, never os.environ: the process's environment is the user's (and other
    # libraries'), and a later init must not inherit this one's device.
    device = None if device is None else index_arg(device, "device")
    # NVRTC and NVSHMEM come from pip wheels in this interpreter's site-packages.
    _native.set_python_search_path([p for p in sys.path if p])
    try:
        native = _native.Context.init(
            store=store,
            comm=comm,
            rank=rank,
            world_size=world_size,
            backend=backend,
            device=device,
            capacity=capacity,
            chunk_size=chunk_size,
            timeout=timeout,
        )
    except (SymheapError, TypeError, OverflowError) as e:
        # Before the rendezvous the PE is the one this process was told it is.
        single = store is None and comm is None and not _launcher_env()
        pe = rank if isinstance(rank, int) and not isinstance(rank, bool) else _launcher_rank()
        if isinstance(e, SymheapError):
            if getattr(e, "pe", None) is None:
                e.pe = 0 if single else pe  # type: ignore[attr-defined]
            raise
        err = SymheapValueError(f"init: {e}")
        err.pe, err.call = (0 if single else pe), "init"  # type: ignore[attr-defined]
        raise err from e
    _ctx = Context(native)
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    return _ctx


# The TCPStore made for a rendezvous over torch.distributed (rank 0 serves it): kept for the
# context's lifetime.
_dist_store: Any = None


def _store_from_process_group(dist: Any) -> Any:
    """A store for the rendezvous, made with public torch.distributed APIs only: rank 0 serves
    a fresh ``TCPStore`` on a free port and the default process group broadcasts where it is
    (``MASTER_ADDR`` when set, else rank 0's host name). Collective over the default group."""
    # Only this rendezvous needs them, and they would add some 6 ms to every `import symheap`.
    import datetime
    import socket

    global _dist_store
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        secs = float(os.environ.get("SYMHEAP_TIMEOUT", "") or 300)
    except ValueError:
        secs = 300.0
    timeout = datetime.timedelta(seconds=max(secs, 30.0))
    where: List[Any] = [None, None]
    server = None
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        server = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, timeout=timeout)
        where = [host, int(server.port)]
    dist.broadcast_object_list(where, src=0)
    _dist_store = server or dist.TCPStore(where[0], where[1], size, is_master=False, timeout=timeout)
    return _dist_store


# Collective shutdowns that must run before the context's own (e.g. an NVSHMEM provider still
# open), newest first. Every PE registers the same hooks in the same order, because the calls
# that register them are collective.
_before_finalize: List[Callable[[], None]] = []


def _run_before_finalize() -> None:
    hooks = list(reversed(_before_finalize))
    _before_finalize.clear()
    for hook in hooks:
        hook()


@api
def finalize() -> None:
    """**Collective**: leaves the job. Arrays and tensors stay readable in this process, but
    every later symheap call raises. Providers still open (NVSHMEM) are finalized first. Does
    nothing when not initialised."""
    global _ctx
    ctx = _ctx
    if ctx is None:
        return
    try:
        _run_before_finalize()
    finally:
        _ctx = None
        ctx.native.finalize()


def is_initialized() -> bool:
    """Whether a context exists (between :func:`init` and :func:`finalize`)."""
    return _ctx is not None


def context() -> Context:
    """The global context; raises :class:`SymheapError` before :func:`init`."""
    if _ctx is None:
        raise SymheapError("symheap is not initialised: call symheap.init() first")
    return _ctx


def native() -> _native.Context:
    """The native context object of the global context."""
    return context().native


def _at_exit() -> None:
    """At interpreter exit: finalize a context left open, or abort the job when the process is
    dying of an unhandled exception (so the other PEs fail at once instead of waiting)."""
    global _ctx
    ctx = _ctx
    if ctx is None or ctx.native.finalized:
        return
    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        _ctx = None
        _before_finalize.clear()
        ctx.native.abort(f"PE {ctx.native.my_pe} exited with an unhandled exception")
        return
    try:
        _run_before_finalize()
    except Exception as e:  # still leave the job: the other PEs are finalizing too
        print(f"symheap: PE {ctx.native.my_pe}: finalizing a provider at exit failed: {e}", file=sys.stderr)
    _ctx = None
    try:
        ctx.native.finalize()
    except SymheapError as e:
        # The job did not end cleanly: say so, and do not let the process exit 0 (an exit
        # handler cannot change the status otherwise).
        print(f"symheap: PE {ctx.native.my_pe}: finalize at exit failed: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)


# ---- allocations ---------------------------------------------------------------------------


def _forget(addr: int, ref: "weakref.ref[SymmetricBuffer]") -> None:
    if _allocations.get(addr) is ref:
        del _allocations[addr]


@api
def allocate(
    shape: Tuple[int, ...], dtype: Any, *, zero: bool = False, align: int = 256, stream: Optional[int] = None
) -> SymmetricBuffer:
    """**Collective**: a :class:`SymmetricBuffer` of ``shape``/``dtype``. ``dtype`` means what
    NumPy means by it (anything ``numpy.dtype()`` takes: ``"float32"``, ``"f4"``,
    ``numpy.int64``; ``"float"`` is float64, ``"int"`` int64), or a ``torch.dtype``, or
    ``"bfloat16"``; dtypes symheap does not move are refused (see :func:`dtype_name`).
    Contents are unspecified unless ``zero``; a peer may write into it only after a barrier.
    ``stream`` (a raw CUDA stream handle) is recorded as using the buffer, as
    :meth:`SymmetricBuffer.record_stream` would."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise SymheapValueError(f"shape must be a sequence of sizes, not {type(shape).__name__}")
    dims = [index_arg(n, "size") for n in shape]
    align = index_arg(align, "alignment (bytes)", 1)
    if stream is not None:
        stream = index_arg(getattr(stream, "cuda_stream", stream), "stream handle")
    return allocate_checked(dims, dtype_name(dtype), align, bool(zero), stream)


def allocate_checked(dims: Sequence[int], dtype: str, align: int, zero: bool, stream: Optional[int]) -> SymmetricBuffer:
    """:func:`allocate` of arguments already checked (sizes and alignment ints, ``dtype`` one
    of symheap's names, ``stream`` an int or None), for symheap's own callers that checked
    them already (``symheap.torch``'s tensors): each check costs a little of every
    allocation's host time."""
    buf = native().allocate(dims, dtype, align, zero, stream)
    addr = buf.addr

    def forget(r: "weakref.ref[SymmetricBuffer]") -> None:
        _forget(addr, r)

    _allocations[addr] = weakref.ref(buf, forget)
    return buf


# The SymmetricBuffer (or HeapView) behind each tensor made from one, by the tensor's storage:
# every view of the tensor shares it, and a stale tensor keeps its storage alive, so the key
# cannot be reused by a new allocation at the same address while the stale tensor exists.
_tensor_owner: Dict[int, "weakref.ref[Any]"] = {}


def register_tensor(t: Any, owner: Any) -> Any:
    """Remembers that tensor ``t`` (from ``torch.from_dlpack(owner)``) shows ``owner``'s memory,
    so an operation on ``t`` (or any view of it) after ``owner`` was freed is refused even once
    the memory has been reused. Returns ``t``."""
    key = int(t.untyped_storage()._cdata)

    def forget(r: "weakref.ref[Any]", key: int = key) -> None:
        if _tensor_owner.get(key) is r:
            del _tensor_owner[key]

    _tensor_owner[key] = weakref.ref(owner, forget)
    return t


def _interface_owner(o: Any) -> Any:
    """The SymmetricBuffer an object passing on a SymmetricBuffer's ``__array_interface__``
    dict carries (the dict names it), else None."""
    try:
        d = getattr(o, "__array_interface__", None)
    except Exception:  # a property that fails (say, of a freed buffer) carries nothing usable
        return None
    return d.get("symheap_buffer") if isinstance(d, dict) else None


def origin(x: Any) -> Any:
    """The SymmetricBuffer whose memory ``x`` shows, found through what ``x`` keeps alive:
    NumPy's ``base`` chain, a ``memoryview``'s ``obj``, a HeapView's owner, a dict from a
    SymmetricBuffer's ``__array_interface__``; a torch tensor made by :mod:`symheap.torch` (or
    any view of it) through its storage. None when ``x`` carries no such link (a pointer
    wrapped by ctypes, a DLPack import, an array-interface dict of an ndarray): such an alias
    is only checked by its address."""
    t = _torch()
    if t is not None and isinstance(x, t.Tensor):
        ref = _tensor_owner.get(int(x.untyped_storage()._cdata))
        x = ref() if ref is not None else None
    np = sys.modules.get("numpy")
    for _ in range(64):  # a chain of views of views ends at the exporter
        if np is not None and type(x) is np.ndarray:
            # The common case first: an array's own interface dict never names a buffer.
            x = x.base
        elif x is None or isinstance(x, SymmetricBuffer):
            return x
        elif isinstance(x, HeapView):
            x = x.owner
        elif isinstance(x, memoryview):
            x = x.obj
        else:
            b = getattr(x, "base", None)
            x = _interface_owner(x) if b is None else b
    return None


def check_not_freed(a: "Arr", what: str) -> None:
    """Raises :class:`SymheapValueError` when ``a`` shows the memory of a freed buffer.

    The buffer object is the allocation's generation: once it is freed, nothing made from it
    is accepted, even where its memory now belongs to a newer allocation (an address alone
    cannot tell those apart). The native layer refuses addresses in freed memory itself, and
    memory that an array or tensor still shows is not reused; this check also names the
    freed buffer."""
    o = a.obj if a.kind == "buffer" else origin(a.obj)
    if o is not None and o.freed:
        raise SymheapValueError(
            f"{what} shows the memory of a symheap buffer (at {o.addr:#x}) that was freed; "
            "nothing made from a freed buffer may be used"
        )


def allocation_of(addr: int, *, freed: bool = False, empty: bool = False) -> Optional[SymmetricBuffer]:
    """The live allocation (of the Python layer) that holds address ``addr``, if any; with
    ``freed``, also a freed one whose memory was not reused yet; with ``empty`` (the address
    of an empty range), also the allocation ``addr`` is one past the end of."""
    found = None
    for base, ref in list(_allocations.items()):
        buf = ref()
        if buf is None or (buf.freed and not freed):
            continue
        if base <= addr < base + max(buf.nbytes, 1):
            return buf
        if empty and addr == base + buf.nbytes:
            found = buf
    return found


# ---- arrays and tensors --------------------------------------------------------------------

_NUMPY_NAMES = {
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
    "float16",
    "float32",
    "float64",
}


@dataclass
class Arr:
    """What symheap needs to know about an array or tensor."""

    obj: Any
    kind: str  # "numpy", "torch", "buffer"
    ptr: int
    nbytes: int
    numel: int
    dtype: str  # symheap dtype name
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # in elements
    device: str  # "cpu" or "cuda"
    device_index: Optional[int]
    contiguous: bool
    writable: bool

    @property
    def itemsize(self) -> int:
        return _native.dtype_size(self.dtype)


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    """True for a torch.Tensor (without importing torch)."""
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def is_ndarray(x: Any) -> bool:
    """True for a numpy.ndarray (without importing numpy)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


# torch.dtype -> symheap's name for it (a dict lookup instead of formatting and a native call
# on every collective).
_torch_name_of: Dict[Any, str] = {}


def torch_dtype_name(dt: Any) -> str:
    """``torch.float32`` -> ``float32``; raises for dtypes symheap does not move."""
    try:
        return _torch_name_of[dt]
    except (KeyError, TypeError):
        pass
    name = str(dt).replace("torch.", "")
    try:
        name = _native.dtype_name(name)
    except SymheapValueError:
        raise SymheapValueError(
            f"dtype {dt} is not supported by symheap (supported: {', '.join(_native.DTYPES)})"
        ) from None
    _torch_name_of[dt] = name
    return name


# numpy.dtype -> its name, for the dtypes symheap moves: numpy computes ``dtype.name`` in Python
# each time (about 12 us in numpy 2.4, most of a small host collective's cost from Python).
_numpy_name_of: Dict[Any, str] = {}


def numpy_dtype_name(dt: Any) -> str:
    """``numpy.dtype('float32')`` -> ``float32``; raises for dtypes symheap does not move."""
    try:
        return _numpy_name_of[dt]
    except (KeyError, TypeError):
        pass
    name = getattr(dt, "name", str(dt))
    if name not in _NUMPY_NAMES or not getattr(dt, "isnative", True):
        raise SymheapValueError(
            f"dtype {dt} is not supported by symheap (supported: native-endian {', '.join(sorted(_NUMPY_NAMES))})"
        )
    _numpy_name_of[dt] = name
    return name


_OWN_NAMES = frozenset(_native.DTYPES)


def dtype_name(dtype: Any) -> str:
    """symheap's name of ``dtype``, which means what NumPy or torch mean by it: a
    ``torch.dtype``; anything ``numpy.dtype()`` takes (a NumPy dtype or scalar type, a Python
    type, a name or type code: ``"float"`` and ``float`` are float64, ``"int"`` int64, ``"f4"``
    float32, ``"i8"`` int64); or ``"bfloat16"`` (torch's name, which NumPy lacks). Dtypes
    symheap does not move (bool, complex, float128, byte-swapped...) and names neither library
    knows (``"f32"``) raise :class:`SymheapValueError`."""
    if dtype is None:
        raise SymheapValueError("dtype must be given (a NumPy or torch dtype)")
    if type(dtype) is str and dtype in _OWN_NAMES:
        return dtype  # symheap's own names mean what NumPy means by them
    t = _torch()
    if t is not None and isinstance(dtype, t.dtype):
        return torch_dtype_name(dtype)
    if isinstance(dtype, str) and dtype.strip().lower() == "bfloat16":
        return "bfloat16"
    # NumPy only where the dtype is not torch's: torch's path stays NumPy-free.
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise SymheapValueError(
            f"dtype {dtype!r} is not a NumPy or torch dtype (symheap takes what numpy.dtype() "
            f"takes, a torch.dtype or 'bfloat16'; supported: {', '.join(_native.DTYPES)})"
        ) from None
    return numpy_dtype_name(dt)


def describe(x: Any, what: str = "argument") -> Arr:
    """An :class:`Arr` for a numpy array, a torch tensor or a SymmetricBuffer; refuses one that
    shows a freed buffer's memory."""
    a = _describe(x, what)
    check_not_freed(a, what)
    return a


def _describe(x: Any, what: str) -> Arr:
    if is_tensor(x):
        # The cheapest accessors (this runs on every collective): is_cuda and get_device()
        # instead of building a torch.device, the Size and stride tuples as they come.
        dtype = torch_dtype_name(x.dtype)
        numel = x.numel()
        cuda = x.is_cuda
        return Arr(
            obj=x,
            kind="torch",
            # torch reports 0 as the address of every empty tensor; symheap needs where it is
            # (an empty slice of a symmetric tensor is at a symmetric offset the other PEs use).
            ptr=x.data_ptr() if numel else x.untyped_storage().data_ptr() + x.storage_offset() * x.element_size(),
            nbytes=numel * x.element_size(),
            numel=numel,
            dtype=dtype,
            shape=x.shape,
            strides=x.stride(),
            device="cuda" if cuda else ("cpu" if x.is_cpu else x.device.type),
            device_index=x.get_device() if cuda else None,
            contiguous=x.is_contiguous(),
            writable=True,
        )
    if is_ndarray(x):
        dtype = numpy_dtype_name(x.dtype)
        item = x.dtype.itemsize
        if any(s % item for s in x.strides):
            raise SymheapValueError(f"{what}: strides {x.strides} are not multiples of the item size")
        return Arr(
            obj=x,
            kind="numpy",
            ptr=int(x.__array_interface__["data"][0]),
            nbytes=int(x.nbytes),
            numel=int(x.size),
            dtype=dtype,
            shape=tuple(x.shape),
            strides=tuple(s // item for s in x.strides),
            device="cpu",
            device_index=None,
            contiguous=bool(x.flags.c_contiguous),
            writable=bool(x.flags.writeable),
        )
    if isinstance(x, SymmetricBuffer):
        shape = tuple(x.shape)
        strides = []
        acc = 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= max(n, 1)
        numel = 1
        for n in shape:
            numel *= n
        dev = x.device
        return Arr(
            obj=x,
            kind="buffer",
            ptr=x.addr,
            nbytes=x.nbytes,
            numel=numel,
            dtype=x.dtype,
            shape=shape,
            strides=tuple(reversed(strides)),
            device="cuda" if dev.startswith("cuda") else "cpu",
            device_index=int(dev.split(":")[1]) if dev.startswith("cuda") else None,
            contiguous=True,
            writable=True,
        )
    raise SymheapValueError(
        f"{what}: expected a numpy.ndarray, a torch.Tensor or a symheap.SymmetricBuffer, not {type(x).__name__}"
    )


def symmetric(x: Any, what: str) -> Arr:
    """:func:`local`, also checking that ``x`` lies in this PE's symmetric heap."""
    return symmetric_arr(local(x, what), what)


def symmetric_arr(a: Arr, what: str) -> Arr:
    """:func:`symmetric` of an array :func:`local` already described."""
    ctx = native()
    if a.device == "cpu" and ctx.backend == "cuda" and a.kind != "buffer":
        raise SymheapValueError(f"{what} is host memory, but symmetric memory is on cuda:{ctx.device_ordinal}")
    try:
        # An empty array may start just past its allocation's end (``buf[n:]``): 0 bytes there.
        ctx.check_symmetric(a.ptr, a.nbytes, what)
    except SymheapError:
        # The common mistake gets the message that says what to do.
        if not ctx.is_symmetric(a.ptr, max(a.nbytes, 1)):
            raise SymheapValueError(
                f"{what} (at {a.ptr:#x}, {a.nbytes} bytes) is not in this PE's symmetric heap; "
                "allocate it with symheap (empty/zeros/... or as_symmetric)"
            ) from None
        raise
    return a


def local(x: Any, what: str) -> Arr:
    """:func:`describe` for a local source/destination (any memory), checking contiguity."""
    a = describe(x, what)
    if not a.contiguous:
        raise SymheapValueError(f"{what} must be contiguous")
    ctx = native()
    if a.device == "cuda" and ctx.backend != "cuda":
        raise SymheapValueError(f"{what} is a CUDA tensor, but symheap runs on the host backend")
    return a


def check_pe(pe: int) -> int:
    """``pe`` as an int in range (raises :class:`SymheapValueError`)."""
    n = native().n_pes
    if type(pe) is not int:  # the common case stays two compares
        pe = index_arg(pe, "PE")
    if not 0 <= pe < n:
        raise SymheapValueError(f"PE {pe} is out of range (n_pes = {n})")
    return pe


def check_team(team: Any, what: str = "team", allow_none: bool = True) -> Any:
    """``team`` if it is a :class:`symheap.Team` (or None when allowed), else
    :class:`SymheapValueError`."""
    if team is None and allow_none:
        return None
    if not isinstance(team, Team):
        expected = "a symheap.Team or None" if allow_none else "a symheap.Team"
        raise SymheapValueError(f"{what} must be {expected}, not {type(team).__name__}")
    return team


def current_stream_handle(device_index: int) -> int:
    """The handle of torch's current stream on CUDA device ``device_index`` (what
    ``torch.cuda.current_stream(i).cuda_stream`` says, without making a Stream object: that
    costs more than the rest of a small eager collective's host work)."""
    t = _torch()
    if not t.cuda.is_initialized():
        t.cuda.init()  # what current_stream() does first (the raw call would skip torch's setup)
    return int(t._C._cuda_getCurrentRawStream(device_index))


def device_stream(device_index: Optional[int], stream: Optional[int]) -> Optional[int]:
    """The stream a CUDA operation on device ``device_index`` (None: this PE's) goes on:
    ``stream`` if given, else torch's current stream of that device; None (run on the host) on
    the host backend."""
    if native().backend != "cuda":
        return None
    if stream is not None:
        return int(getattr(stream, "cuda_stream", stream))
    t = _torch()
    if t is not None and t.cuda.is_available():
        return current_stream_handle(device_index if device_index is not None else native().device_ordinal)
    return 0


def default_stream(a: Arr, stream: Optional[int]) -> Optional[int]:
    """:func:`device_stream` of the device ``a`` lives on."""
    return device_stream(a.device_index, stream)


def world_stream(stream: Optional[int]) -> Optional[int]:
    """Like :func:`default_stream` for calls with no tensor (barriers)."""
    return device_stream(None, stream)


@dataclass
class SymmetricAddressMap:
    """The richer descriptor of an allocation: its peer table plus the direct mask.

    ``peer_bases[r]`` is PE r's copy of the allocation in this process (0 when not directly
    addressable), ``peer_bases[local_rank] == allocation_base``; ``direct[r]`` says whether PE r
    is load/store-addressable from here.
    """

    local_rank: int
    allocation_base: int
    allocation_bytes: int
    peer_bases: Any
    direct: List[bool]

    def translate(self, ptr: int, src_pe: int, dst_pe: int) -> Optional[int]:
        """``peer_bases[dst_pe] + (ptr - peer_bases[src_pe])``; None when either is not direct."""
        f = int(self.peer_bases[src_pe])
        t = int(self.peer_bases[dst_pe])
        if f == 0 or t == 0:
            return None
        return t + (int(ptr) - f)
