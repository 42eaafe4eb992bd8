"""Host RMA, atomics, signals, synchronisation, teams and collectives on arrays and tensors.

Every function takes numpy arrays (host backend), torch tensors (CPU tensors on the host
backend, CUDA tensors on the CUDA backend) or SymmetricBuffers. Symmetric arguments must lie in
this PE's symmetric heap (allocated by symheap); local ones can be any contiguous memory of the
backend's kind. On the CUDA backend, operations on CUDA tensors are enqueued on ``stream``
(default: torch's current stream); on the host backend ``stream`` is ignored and every call
completes before it returns. On CUDA, the calls that touch device memory from the host (atomics,
``signal_fetch``, puts from / gets into host memory, reductions of dtypes the GPU kernels do not
cover, ``barrier(team)``) first wait for the current stream, so they see the work enqueued before
them; ``barrier_all``, RMA between CUDA tensors, signals and collectives stay on the stream and
never block the host.

Local (non-symmetric) sources and destinations may be host memory (NumPy arrays, CPU tensors)
on either backend.

Collective calls (marked **Collective**) must be made by every PE of the team, in the same
order, with the same arguments; symheap detects a mismatch and raises
:class:`SymheapMismatchError` on every PE instead of hanging.

A collective's source and destination may overlap only in its in-place form: ``all_reduce`` and
``broadcast`` on one array (``src`` None or ``dest`` itself), ``all_gather`` whose source is
exactly this PE's block of the destination, ``reduce_scatter`` whose destination is exactly this
PE's block of the source; ``alltoall`` never. Any other overlap raises
:class:`SymheapValueError` naming both address ranges, before anything moves. In place is part
of the call: every PE of the team uses it, or none (as MPI_IN_PLACE), else
:class:`SymheapMismatchError`. A read-only array (NumPy's ``writeable`` flag off) is never
written: every call that writes through an argument (the collectives' destinations, ``get``,
``put``, ``put_signal`` and its signal, the atomics that modify) refuses it with
:class:`SymheapValueError`.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from . import _nvshmem_ops as _nv
from ._core import (
    U64_MAX,
    Arr,
    api,
    check_pe,
    check_team,
    default_stream,
    index_arg,
    local,
    native,
    symmetric,
    symmetric_arr,
    world_stream,
)
from ._native import SymheapValueError, Team

StreamLike = Any


def _same(a: Arr, b: Arr, what: str) -> None:
    if a.dtype != b.dtype:
        raise SymheapValueError(f"{what}: dtypes differ ({a.dtype} and {b.dtype})")


def _same_size(d: Arr, s: Arr, what: str) -> None:
    """:func:`_same`, and as many elements in destination ``d`` as in source ``s``."""
    _same(d, s, what)
    if d.numel != s.numel:
        raise SymheapValueError(f"{what}: destination has {d.numel} elements, source {s.numel}")


def _writable(a: Arr, what: str) -> Arr:
    """``a``, refused when it is read-only (a NumPy array whose ``writeable`` flag is off): no
    call writes through such an array, into this PE's memory or a peer's copy of it."""
    if not a.writable:
        raise SymheapValueError(f"{what} is read-only")
    return a


def _on_device(a: Arr) -> bool:
    return a.device == "cuda"


def _host_sync() -> None:
    """On CUDA, a host-side access to device memory (atomics, host-memory puts/gets) is not
    ordered with the user's stream: finish the current stream first."""
    s = world_stream(None)
    if s is not None:
        native().sync_stream(s)


# ---- RMA -----------------------------------------------------------------------------------


@api
def put(dest: Any, src: Any, pe: int, *, stream: StreamLike = None) -> None:
    """Copies local ``src`` into PE ``pe``'s copy of symmetric ``dest`` (same dtype and number
    of elements). Returns when ``src`` may be reused; the data is delivered by the next
    :func:`quiet`, barrier or signal. Not collective. With a tensor of the NVSHMEM provider
    (both sides), the put reaches any PE, also one on another node (through NVSHMEM)."""
    nv = _nv.provider_of(dest)
    if nv is not None:
        return _nv.put(nv, dest, src, pe, stream)
    d = _writable(symmetric(dest, "put destination"), "put destination")
    s = local(src, "put source")
    _same_size(d, s, "put")
    pe = check_pe(pe)
    if _on_device(s):
        native().put_on_stream(d.ptr, s.ptr, s.nbytes, pe, default_stream(s, stream), dtype=d.dtype)
    else:
        _host_sync()
        native().put_from_host(d.ptr, s.ptr, s.nbytes, pe, d.dtype)


@api
def get(dest: Any, src: Any, pe: int, *, stream: StreamLike = None) -> None:
    """Copies PE ``pe``'s copy of symmetric ``src`` into local ``dest`` (same dtype and number
    of elements). On the host backend, or into host memory, it returns when the data is in
    ``dest``; into a CUDA tensor it is enqueued on ``stream``. Not collective. With a tensor of
    the NVSHMEM provider (both sides), the get reaches any PE (another node through NVSHMEM)."""
    nv = _nv.provider_of(src)
    if nv is not None:
        return _nv.get(nv, dest, src, pe, stream)
    s = symmetric(src, "get source")
    d = _writable(local(dest, "get destination"), "get destination")
    _same_size(d, s, "get")
    pe = check_pe(pe)
    if _on_device(d):
        native().get_on_stream(d.ptr, s.ptr, d.nbytes, pe, default_stream(d, stream), dtype=d.dtype)
    else:
        _host_sync()
        native().get_to_host(d.ptr, s.ptr, d.nbytes, pe, d.dtype)


@api
def put_nbi(dest: Any, src: Any, pe: int, *, stream: StreamLike = None) -> None:
    """Non-blocking :func:`put`: complete it with :func:`quiet`."""
    put(dest, src, pe, stream=stream)


@api
def get_nbi(dest: Any, src: Any, pe: int, *, stream: StreamLike = None) -> None:
    """Non-blocking :func:`get`: ``dest`` is valid after :func:`quiet`."""
    get(dest, src, pe, stream=stream)


@api
def quiet(*, stream: StreamLike = None) -> None:
    """Completes every put, get and atomic this PE issued (on CUDA, also the stream operations
    enqueued on ``stream``), NVSHMEM's included. Not collective."""
    _nv.quiet(stream)
    native().quiet()
    s = world_stream(stream)
    if s is not None:
        native().quiet_on_stream(s)


@api
def fence() -> None:
    """Orders this PE's puts to each PE: earlier ones arrive before later ones. Not collective."""
    native().fence()


@api
def sync_stream(stream: StreamLike = None) -> None:
    """Waits for ``stream`` (default: the current stream) and reports device-side wait timeouts
    (CUDA; does nothing on the host backend). Not collective."""
    s = world_stream(stream)
    if s is not None:
        native().sync_stream(s)


# ---- signals -------------------------------------------------------------------------------


def _word(sig: Any, index: int, what: str, writer: Optional[str] = None) -> int:
    """The address of word ``index`` of signal array ``sig``; ``writer``: the call that
    writes it (a read-only array is refused)."""
    a = symmetric(sig, what)
    if writer is not None:
        _writable(a, f"{writer} {what}")
    if a.dtype not in ("uint64", "int64"):
        raise SymheapValueError(f"{what} must be a uint64 or int64 array, not {a.dtype}")
    index = index_arg(index, f"{what} index")
    if not index < a.numel:
        raise SymheapValueError(f"{what} index {index} is out of range ({a.numel} words)")
    return a.ptr + 8 * index


def _signal_value(value: Any) -> int:
    return index_arg(value, "signal value (an unsigned 64-bit integer, [0, 2^64-1])", 0, U64_MAX)


@api
def put_signal(
    dest: Any,
    src: Any,
    signal: Any,
    value: int,
    pe: int,
    *,
    op: str = "set",
    sig_index: int = 0,
    stream: StreamLike = None,
) -> None:
    """Puts ``src`` into PE ``pe``'s ``dest``, then updates PE ``pe``'s signal word
    ``signal[sig_index]`` (a symmetric uint64/int64 array) with ``op`` (``"set"`` or ``"add"``)
    and ``value``: a PE that sees the signal change also sees the data. Not collective. With
    tensors of the NVSHMEM provider (data and signal), it reaches any PE (another node through
    NVSHMEM)."""
    nv = _nv.provider_of(dest)
    if nv is not None:
        return _nv.put_signal(nv, dest, src, signal, _signal_value(value), pe, op, sig_index, stream)
    d = _writable(symmetric(dest, "put_signal destination"), "put_signal destination")
    s = local(src, "put_signal source")
    _same_size(d, s, "put_signal")
    sig = _word(signal, sig_index, "signal", writer="put_signal")
    pe = check_pe(pe)
    value = _signal_value(value)
    if _on_device(s):
        native().put_signal_on_stream(
            d.ptr, s.ptr, s.nbytes, sig, value, op, pe, default_stream(s, stream), dtype=d.dtype
        )
    else:
        _host_sync()
        native().put_signal_from_host(d.ptr, s.ptr, s.nbytes, sig, value, op, pe, d.dtype)


@api
def signal_wait_until(signal: Any, cmp: str, value: int, *, index: int = 0, stream: StreamLike = None) -> Optional[int]:
    """Waits until this PE's ``signal[index]`` satisfies ``word CMP value`` (``cmp`` one of
    eq ne gt ge lt le, or == != > >= < <=). Host backend: blocks (GIL released) and returns the
    word; fails after SYMHEAP_TIMEOUT or when the job fails. CUDA tensor: the wait is enqueued on
    ``stream`` and None is returned (later work on the stream sees the data). Not collective.
    An NVSHMEM provider's signal tensor waits the same way (symheap's bounded wait kernel)."""
    nv = _nv.provider_of(signal)
    if nv is not None:
        return _nv.signal_wait_until(nv, signal, cmp, _signal_value(value), index, stream)
    a = symmetric(signal, "signal")
    addr = _word(signal, index, "signal")
    value = _signal_value(value)
    if _on_device(a):
        native().signal_wait_until_on_stream(addr, cmp, value, default_stream(a, stream))
        return None
    return native().signal_wait_until(addr, cmp, value)


@api
def signal_fetch(signal: Any, index: int = 0) -> int:
    """Reads this PE's ``signal[index]`` atomically. Not collective."""
    nv = _nv.provider_of(signal)
    if nv is not None:
        return _nv.signal_fetch(nv, signal, index)
    addr = _word(signal, index, "signal")
    me = native().my_pe
    _host_sync()
    return int(native().atomic(addr, me, "fetch", "uint64"))


# ---- atomics -------------------------------------------------------------------------------


def _atomic(op: str, dest: Any, pe: int, index: int, value: Any = None, compare: Any = None) -> Any:
    nv = _nv.provider_of(dest)
    if nv is not None:
        return _nv.atomic(nv, op, dest, pe, index, value, compare)
    a = symmetric(dest, f"atomic_{op} destination")
    if op != "fetch":
        _writable(a, f"atomic_{op} destination")
    index = index_arg(index, "atomic index")
    if not index < a.numel:
        raise SymheapValueError(f"atomic index {index} is out of range ({a.numel} elements)")
    pe = check_pe(pe)
    _host_sync()
    return native().atomic(a.ptr + index * a.itemsize, pe, op, a.dtype, value, compare)


@api
def atomic_fetch(dest: Any, pe: int, *, index: int = 0) -> Any:
    """Reads PE ``pe``'s ``dest[index]`` atomically (int32/uint32/int64/uint64/float32/float64).
    Not collective (as every atomic)."""
    return _atomic("fetch", dest, pe, index)


@api
def atomic_set(dest: Any, value: Any, pe: int, *, index: int = 0) -> None:
    """Writes ``value`` to PE ``pe``'s ``dest[index]`` atomically."""
    _atomic("set", dest, pe, index, value)


@api
def atomic_swap(dest: Any, value: Any, pe: int, *, index: int = 0) -> Any:
    """Writes ``value``, returns the old value."""
    return _atomic("swap", dest, pe, index, value)


@api
def atomic_compare_swap(dest: Any, cond: Any, value: Any, pe: int, *, index: int = 0) -> Any:
    """Writes ``value`` if the element equals ``cond``; returns the old value (integers)."""
    return _atomic("compare_swap", dest, pe, index, value, cond)


@api
def atomic_fetch_add(dest: Any, value: Any, pe: int, *, index: int = 0) -> Any:
    """Adds ``value`` (wrapping), returns the old value (integers)."""
    return _atomic("add", dest, pe, index, value)


@api
def atomic_add(dest: Any, value: Any, pe: int, *, index: int = 0) -> None:
    """Adds ``value`` (wrapping) (integers)."""
    _atomic("add", dest, pe, index, value)


@api
def atomic_fetch_inc(dest: Any, pe: int, *, index: int = 0) -> Any:
    """Adds one, returns the old value (integers)."""
    return _atomic("add", dest, pe, index, 1)


@api
def atomic_inc(dest: Any, pe: int, *, index: int = 0) -> None:
    """Adds one (integers)."""
    _atomic("add", dest, pe, index, 1)


@api
def atomic_fetch_and(dest: Any, value: int, pe: int, *, index: int = 0) -> int:
    """Bitwise and, returns the old value (uint32/uint64)."""
    return _atomic("and", dest, pe, index, value)


@api
def atomic_and(dest: Any, value: int, pe: int, *, index: int = 0) -> None:
    """Bitwise and (uint32/uint64)."""
    _atomic("and", dest, pe, index, value)


@api
def atomic_fetch_or(dest: Any, value: int, pe: int, *, index: int = 0) -> int:
    """Bitwise or, returns the old value (uint32/uint64)."""
    return _atomic("or", dest, pe, index, value)


@api
def atomic_or(dest: Any, value: int, pe: int, *, index: int = 0) -> None:
    """Bitwise or (uint32/uint64)."""
    _atomic("or", dest, pe, index, value)


@api
def atomic_fetch_xor(dest: Any, value: int, pe: int, *, index: int = 0) -> int:
    """Bitwise xor, returns the old value (uint32/uint64)."""
    return _atomic("xor", dest, pe, index, value)


@api
def atomic_xor(dest: Any, value: int, pe: int, *, index: int = 0) -> None:
    """Bitwise xor (uint32/uint64)."""
    _atomic("xor", dest, pe, index, value)


# ---- synchronisation and teams -------------------------------------------------------------


@api
def barrier_all(*, stream: StreamLike = None) -> None:
    """**Collective** over the world: returns once every PE called it; memory operations issued
    before it on any PE are visible after it on every PE. Host backend: also the point where the
    collective ledger is checked and buffers released on every PE are reclaimed. CUDA backend:
    enqueued on ``stream`` (default: the current stream), capturable in a CUDA graph; use
    :func:`host_barrier` for the host-side point."""
    s = world_stream(stream)
    if s is None:
        native().barrier_all()
    else:
        native().barrier_all_on_stream(s)


@api
def host_barrier() -> None:
    """**Collective** over the world: the host barrier (ledger check, reclaim of released
    buffers) on any backend. On CUDA it does not wait for stream work: synchronise first."""
    native().barrier_all()


@api
def sync_all() -> None:
    """**Collective** over the world: like :func:`host_barrier` (OpenSHMEM's ``sync_all``)."""
    native().sync_all()


@api
def team_world() -> Team:
    """The team of all PEs."""
    return native().world_team()


@api
def barrier(team: Optional[Team] = None, *, stream: StreamLike = None) -> None:
    """**Collective** over ``team`` (the world when None): a barrier among its members; a no-op
    on an invalid team. On CUDA the current stream is synchronised first, then the members
    meet on the host."""
    team = check_team(team)
    s = world_stream(stream)
    if s is not None:
        native().sync_stream(s)
    native().barrier(team)


@api
def team_sync(team: Optional[Team] = None) -> None:
    """**Collective** over ``team``: synchronises its members."""
    native().team_sync(check_team(team))


@api
def team_split_strided(parent: Optional[Team], start: int, stride: int, size: int) -> Team:
    """**Collective** over ``parent`` (the world when None): a new team of the members
    ``start, start + stride, ...`` (``size`` of them). Other members of ``parent`` get an
    invalid team (``team.is_valid`` is False); operations on it do nothing. At most 32 teams
    exist at once."""
    parent = check_team(parent, "parent team")
    start = index_arg(start, "team start")
    stride = index_arg(stride, "team stride", 1)
    size = index_arg(size, "team size")
    return native().team_split_strided(parent if parent is not None else team_world(), start, stride, size)


def _rank_list(ranks: Any, what: str) -> List[int]:
    """``ranks`` (any iterable of integers) as a list of ints, or :class:`SymheapValueError`."""
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise SymheapValueError(f"{what} must be a list of ranks, not {type(ranks).__name__}")
    return [index_arg(r, f"a rank of {what}") for r in ranks]


@api
def team_split_ranks(parent: Optional[Team], ranks: Sequence[int]) -> Team:
    """**Collective** over ``parent`` (the world when None; every member passes the same
    list): a new team of the members ``ranks`` of ``parent`` (member indices of ``parent``,
    in any order, each at most once), whose member ``i`` is ``ranks[i]``. Other members of
    ``parent`` get an invalid team. A member passing another list raises
    :class:`SymheapMismatchError` on every member. At most 32 teams exist at once."""
    parent = check_team(parent, "parent team")
    ranks = _rank_list(ranks, "ranks")
    return native().team_split_ranks(parent if parent is not None else team_world(), ranks)


@api
def team_from_ranks(ranks: Sequence[int], exchange: Any) -> Team:
    """**Collective** over the world PEs ``ranks`` only (the other PEs never call it): a new
    team whose member ``i`` is world PE ``ranks[i]``, as ``torch.distributed`` makes a process
    group's backend. ``exchange(data: bytes) -> list[bytes]`` is the members' all-gather,
    supplied by the caller (e.g. over the group's store): it returns every member's ``data``
    in the order of ``ranks``. Every member passes the same list (else
    :class:`SymheapMismatchError` on every member, naming the lists); an exception
    ``exchange`` raises becomes a :class:`SymheapError` of this call with it as the cause.
    The team's creation is in no other team's ledger; its own calls are checked among its
    members like a split team's. At most 32 teams exist at once."""
    ranks = _rank_list(ranks, "ranks")
    if not callable(exchange):
        raise SymheapValueError(f"exchange must be callable (bytes -> list of bytes), not {type(exchange).__name__}")
    return native().team_from_ranks(ranks, exchange)


@api
def team_destroy(team: Team) -> None:
    """**Collective** over ``team``: destroys it (a no-op on an invalid team)."""
    native().team_destroy(check_team(team, allow_none=False))


@api
def team_my_pe(team: Team) -> Optional[int]:
    """This PE's index in ``team`` (None when not a member)."""
    return check_team(team, allow_none=False).my_pe()


@api
def team_n_pes(team: Team) -> int:
    """Number of members of ``team``."""
    return check_team(team, allow_none=False).n_pes()


@api
def team_translate_pe(src_team: Team, pe: int, dest_team: Team) -> Optional[int]:
    """Member ``pe`` of ``src_team`` as a member index of ``dest_team`` (None if not a member)."""
    src_team = check_team(src_team, "source team", allow_none=False)
    dest_team = check_team(dest_team, "destination team", allow_none=False)
    return src_team.translate_pe(index_arg(pe, "team member"), dest_team)


# ---- collectives ---------------------------------------------------------------------------


def _team_size(team: Optional[Team]) -> int:
    return native().n_pes if check_team(team) is None else team.n_pes()


# Reductions the CUDA kernels run; other dtypes take the host-driven path, which is not
# ordered with the user's stream.
_DEVICE_REDUCE_DTYPES = ("float32", "float16", "bfloat16", "int32")


def _takes_local(coll: str, team: Optional[Team], a: Arr, per: int = 1, algo: str = "auto") -> bool:
    """Whether the CUDA kernel of ``coll`` on ``team`` for ``a`` (``per`` blocks of it per
    member) reads and writes its buffers on this PE only, so that ordinary device memory of
    this PE's GPU may stand in for symmetric memory, with no copy (one-shot all_reduce and
    reduce_scatter, the exchange kernels of all_gather, alltoall and broadcast, any collective
    of a team of one)."""
    ctx = native()
    if ctx.backend != "cuda" or a.device != "cuda":
        return False
    if coll in ("all_reduce", "reduce_scatter") and a.dtype not in _DEVICE_REDUCE_DTYPES:
        return False
    return bool(ctx.coll_takes_local_buffers(coll, team, a.nbytes // max(per, 1), algo))


def _coll_buf(a: Arr, what: str, local_ok: bool) -> Arr:
    """``a`` (described by :func:`local`) as a collective's buffer: symmetric memory, or with
    ``local_ok`` any contiguous device memory of this PE's GPU (the native layer checks it)."""
    if local_ok and a.device == "cuda" and not native().is_symmetric(a.ptr):
        return a
    return symmetric_arr(a, what)


def _coll_stream(a: Arr, stream: StreamLike, reduces: bool = False) -> Optional[int]:
    if not _on_device(a):
        return None
    if reduces and a.dtype not in _DEVICE_REDUCE_DTYPES:
        _host_sync()
    return default_stream(a, stream)


@api
def broadcast(
    dest: Any, src: Any = None, root: int = 0, team: Optional[Team] = None, *, stream: StreamLike = None
) -> None:
    """**Collective** over ``team``: every member's ``dest`` gets member ``root``'s ``src``
    (``src`` None: ``dest`` itself, in place). Both symmetric, same dtype and size (on CUDA,
    where the exchange kernel runs, either may be ordinary device memory: see
    ``coll_takes_local_buffers``)."""
    da = _writable(local(dest, "broadcast destination"), "broadcast destination")
    lo = _takes_local("broadcast", check_team(team), da)
    d = _coll_buf(da, "broadcast destination", lo)
    s = d if src is None else _coll_buf(local(src, "broadcast source"), "broadcast source", lo)
    _same(d, s, "broadcast")
    if d.numel != s.numel:
        raise SymheapValueError(f"broadcast: destination has {d.numel} elements, source {s.numel}")
    n = _team_size(team)
    root = index_arg(root, "broadcast root")
    if team is None or team.is_valid:
        if not root < n:
            raise SymheapValueError(f"broadcast root {root} is not a member of a team of {n}")
    native().collective("broadcast", team, d.ptr, s.ptr, d.numel, d.dtype, _coll_stream(d, stream), root=root)


@api
def all_gather(dest: Any, src: Any, team: Optional[Team] = None, *, stream: StreamLike = None) -> None:
    """**Collective** over ``team``: member j's ``src`` lands in block j of every member's
    ``dest`` (``dest`` holds ``n * src.numel`` elements; first dimension of ``n`` blocks or
    flat). In place when ``src`` is exactly this PE's block of ``dest`` (``dest[me]``); any
    other overlap is refused. On CUDA, where the exchange kernel runs, either may be ordinary
    device memory."""
    sa = local(src, "all_gather source")
    lo = _takes_local("all_gather", check_team(team), sa)
    da = _writable(local(dest, "all_gather destination"), "all_gather destination")
    d = _coll_buf(da, "all_gather destination", lo)
    s = _coll_buf(sa, "all_gather source", lo)
    _same(d, s, "all_gather")
    n = _team_size(team)
    if team is not None and not team.is_valid:
        return
    if d.numel != n * s.numel:
        raise SymheapValueError(f"all_gather: destination must hold {n} x {s.numel} elements, it holds {d.numel}")
    native().collective("all_gather", team, d.ptr, s.ptr, s.numel, s.dtype, _coll_stream(d, stream))


@api
def reduce_scatter(
    dest: Any, src: Any, op: str = "sum", team: Optional[Team] = None, *, stream: StreamLike = None
) -> None:
    """**Collective** over ``team``: ``src`` holds ``n`` blocks of ``dest.numel`` elements;
    member j's ``dest`` gets the reduction (sum, min, max, prod) of every member's block j.
    In place when ``dest`` is exactly this PE's block of ``src``; any other overlap is
    refused. On CUDA, where it runs one-shot, either may be ordinary device memory."""
    da = _writable(local(dest, "reduce_scatter destination"), "reduce_scatter destination")
    lo = _takes_local("reduce_scatter", check_team(team), da)
    d = _coll_buf(da, "reduce_scatter destination", lo)
    s = _coll_buf(local(src, "reduce_scatter source"), "reduce_scatter source", lo)
    _same(d, s, "reduce_scatter")
    n = _team_size(team)
    if team is not None and not team.is_valid:
        return
    if s.numel != n * d.numel:
        raise SymheapValueError(f"reduce_scatter: source must hold {n} x {d.numel} elements, it holds {s.numel}")
    stream = _coll_stream(d, stream, True)
    native().collective("reduce_scatter", team, d.ptr, s.ptr, d.numel, d.dtype, stream, op=op)


@api
def all_reduce(
    dest: Any,
    src: Any = None,
    op: str = "sum",
    team: Optional[Team] = None,
    *,
    algo: str = "auto",
    stream: StreamLike = None,
) -> None:
    """**Collective** over ``team``: every member's ``dest`` gets the element-wise reduction
    (sum, min, max, prod) of all members' ``src`` (``src`` None: in place on ``dest``).
    ``algo``: auto, one_shot, two_shot. On CUDA, where it runs one-shot, either may be
    ordinary device memory (read and written in place, no copy)."""
    team = check_team(team)
    da = _writable(local(dest, "all_reduce destination"), "all_reduce destination")
    lo = _takes_local("all_reduce", team, da, algo=algo)
    d = _coll_buf(da, "all_reduce destination", lo)
    s = d if src is None else _coll_buf(local(src, "all_reduce source"), "all_reduce source", lo)
    _same(d, s, "all_reduce")
    if d.numel != s.numel:
        raise SymheapValueError(f"all_reduce: destination has {d.numel} elements, source {s.numel}")
    stream = _coll_stream(d, stream, True)
    native().collective("all_reduce", team, d.ptr, s.ptr, d.numel, d.dtype, stream, op=op, algo=algo)


@api
def alltoall(
    dest: Any,
    src: Any,
    team: Optional[Team] = None,
    *,
    stream: StreamLike = None,
    output_split_sizes: Optional[Sequence[int]] = None,
    input_split_sizes: Optional[Sequence[int]] = None,
    in_splits: Any = None,
    out_splits_offsets: Any = None,
) -> None:
    """**Collective** over ``team``: block j of member i's ``src`` lands in block i of member
    j's ``dest`` (never in place: overlapping arrays are refused).

    Equal blocks by default: both hold ``n`` of them; on CUDA, where the exchange kernel runs,
    either may be ordinary device memory. Uneven blocks, in rows of the first dimension (a 1-D
    array: elements), both arrays symmetric:

    - ``output_split_sizes`` and ``input_split_sizes`` (as torch.distributed's
      ``all_to_all_single``): the rows received from and sent to each member, summing to
      ``dest``'s and ``src``'s rows. What member i sends member j must be what member j expects
      from member i: every member raises :class:`SymheapValueError` naming the first pair that
      disagrees.
    - ``in_splits`` and ``out_splits_offsets`` (as torch's ``all_to_all_vdev``): symmetric int64
      arrays, ``n`` counts of rows to send each member, and ``2 x n`` the call fills with the
      rows received from each member and where they start in ``dest``; ``src`` and ``dest``
      (with the same number of rows on every member) hold up to their rows. On CUDA the
      counts are read on the GPU (capturable in a CUDA graph); counts that are negative or
      past either array move nothing and raise at the stream's next synchronisation."""
    host_splits = output_split_sizes is not None or input_split_sizes is not None
    device_splits = in_splits is not None or out_splits_offsets is not None
    if host_splits or device_splits:
        sa = local(src, "alltoall source")
        d = symmetric_arr(
            _writable(local(dest, "alltoall destination"), "alltoall destination"), "alltoall destination"
        )
        s = symmetric_arr(sa, "alltoall source")
        _same(d, s, "alltoall")
        (d_rows, row), (s_rows, s_row) = (_rows(d), _rows(s))
        if row != s_row:
            raise SymheapValueError(f"alltoall: rows of {s_row} source elements, {row} destination elements")
        n = _team_size(team)
        if host_splits == device_splits:
            raise SymheapValueError(
                "alltoall: pass output_split_sizes and input_split_sizes, or in_splits and out_splits_offsets"
            )
        if host_splits:
            if output_split_sizes is None or input_split_sizes is None:
                raise SymheapValueError("alltoall: output_split_sizes and input_split_sizes go together")
            send = [index_arg(c, "alltoall input split size") for c in input_split_sizes]
            recv = [index_arg(c, "alltoall output split size") for c in output_split_sizes]
            if team is not None and not team.is_valid:
                return
            for name, sizes, rows in (("input", send, s_rows), ("output", recv, d_rows)):
                if len(sizes) != n or sum(sizes) != rows:
                    raise SymheapValueError(
                        f"alltoall: {name}_split_sizes {sizes} must give one size per member ({n}) "
                        f"summing to the {'source' if name == 'input' else 'destination'}'s {rows} rows"
                    )
            params: dict = {"send_counts": send, "recv_counts": recv}
        else:
            if in_splits is None or out_splits_offsets is None:
                raise SymheapValueError("alltoall: in_splits and out_splits_offsets go together")
            ins = symmetric_arr(local(in_splits, "in_splits"), "in_splits")
            out = symmetric_arr(
                _writable(local(out_splits_offsets, "out_splits_offsets"), "out_splits_offsets"), "out_splits_offsets"
            )
            if team is not None and not team.is_valid:
                return
            for name, a, want in (("in_splits", ins, n), ("out_splits_offsets", out, 2 * n)):
                if a.dtype != "int64" or a.numel != want:
                    raise SymheapValueError(
                        f"alltoall: {name} must be {want} int64 counts, it is {a.numel} x {a.dtype}"
                    )
            params = {"in_splits": ins.ptr, "out_splits_offsets": out.ptr, "src_rows": s_rows, "dst_rows": d_rows}
        native().collective("alltoall", team, d.ptr, s.ptr, row, s.dtype, _coll_stream(d, stream), **params)
        return
    sa = local(src, "alltoall source")
    lo = _takes_local("alltoall", check_team(team), sa, per=_team_size(team))
    da = _writable(local(dest, "alltoall destination"), "alltoall destination")
    d = _coll_buf(da, "alltoall destination", lo)
    s = _coll_buf(sa, "alltoall source", lo)
    _same(d, s, "alltoall")
    n = _team_size(team)
    if team is not None and not team.is_valid:
        return
    if d.numel != s.numel or s.numel % n:
        raise SymheapValueError(
            f"alltoall: source and destination must hold {n} equal blocks ({s.numel} and {d.numel} elements)"
        )
    native().collective("alltoall", team, d.ptr, s.ptr, s.numel // n, s.dtype, _coll_stream(d, stream))


def _rows(a: Arr) -> Tuple[int, int]:
    """``a``'s rows (its first dimension; a 0-d array is one) and elements per row."""
    if not a.shape:
        return 1, 1
    row = 1
    for k in a.shape[1:]:
        row *= k
    return a.shape[0], row


@api
def all_gather_object_bytes(data: bytes) -> List[bytes]:
    """**Collective** over the world: every PE's ``data`` (bytes, or any object with the buffer
    protocol: bytearray, memoryview, a contiguous array), in rank order (small control data).
    Anything else (an int, whose ``bytes(n)`` would be n zero bytes, a str, a list) raises
    :class:`SymheapValueError`."""
    if not isinstance(data, bytes):
        try:
            data = memoryview(data).tobytes()
        except TypeError:
            raise SymheapValueError(
                f"all_gather_object_bytes takes bytes (or a bytes-like object), not {type(data).__name__}"
            ) from None
    return native().all_gather_bytes(data)
