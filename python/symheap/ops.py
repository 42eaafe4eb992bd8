"""symheap's collectives and RMA as PyTorch custom ops (``torch.ops.symheap.*``).

Every op is registered with :mod:`torch.library` in the ``symheap`` namespace, with its
mutation annotations and a fake (meta) kernel, so ``torch.compile(model, fullgraph=True)``
traces through it without a graph break, and CUDA graphs (``torch.cuda.graph``,
``torch.compile(mode="reduce-overhead")``) capture it. Every op runs on the **current torch
stream** (an op under ``torch.compile`` cannot take a stream object); on the host backend it
completes before it returns.

The collectives take symmetric tensors (zero-copy) or ordinary tensors from PyTorch's
allocator: on CUDA those are read and written in place where the kernel touches its buffers
on this PE only (one-shot all_reduce and reduce_scatter, the exchange kernels of all_gather,
alltoall and broadcast, up to a few MiB on the world team), and otherwise staged through a
symmetric workspace per team and stream (see :mod:`symheap._workspace` and
``docs/torch-integration.md``: which calls copy and when).
Teams are passed to the ops as an ``int`` id (:func:`team_id`); 0 is the world. The Python
functions of this module (``all_reduce_``, ``all_gather``...) take a :class:`symheap.Team`,
an id or None and call the registered ops.

Collective-order rule: every op marked **Collective** must be called by every PE of the team
in the same order with the same arguments (sizes, dtypes, op, team), and every PE passes the
same kind of tensors (symmetric or ordinary, as staging allocates collectively); a mismatch
raises :class:`symheap.SymheapMismatchError` on every PE.

Schemas (``torch.ops.symheap.NAME``)::

    all_reduce_(Tensor(a!) tensor, str op="sum", int team=0) -> ()
    all_reduce(Tensor input, str op="sum", int team=0) -> Tensor
    all_gather_into(Tensor(a!) out, Tensor input, int team=0) -> ()
    all_gather(Tensor input, int team=0) -> Tensor
    reduce_scatter_into(Tensor(a!) out, Tensor input, str op="sum", int team=0) -> ()
    reduce_scatter(Tensor input, str op="sum", int team=0) -> Tensor
    alltoall_into(Tensor(a!) out, Tensor input, int team=0) -> ()
    alltoall(Tensor input, int team=0) -> Tensor
    broadcast_(Tensor(a!) tensor, int root=0, int team=0) -> ()
    barrier(int team=0) -> ()
    put(Tensor dest, Tensor src, int pe) -> ()
    get(Tensor(a!) dest, Tensor src, int pe) -> ()
    put_signal(Tensor dest, Tensor src, Tensor signal, int value, int pe, str sig_op="set",
               int sig_index=0) -> ()
    signal_wait_until(Tensor signal, str cmp, int value, int index=0) -> ()

``op`` is ``sum``, ``avg`` (floating dtypes), ``min``, ``max`` or ``prod``. ``put``,
``put_signal``, ``signal_wait_until`` and ``barrier`` change no local tensor (the writes land in
peers' memory): they are registered as side-effecting, so compilers keep them in program order.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

try:
    import torch as _torch
    from torch.fx.node import has_side_effect
except ImportError as _e:  # say which extra installs it
    from ._requires import reraise

    reraise(_e, "torch", "symheap.ops")

from . import _core, _library, _shmem, _workspace
from ._core import api, torch_dtype_name
from ._native import SymheapUnsupportedError, SymheapValueError, Team

TeamLike = Union[None, int, Team]

REDUCE_OPS = ("sum", "avg", "min", "max", "prod")

# ---- registration and the eager fast path -------------------------------------------------

# Each op by its name in the namespace.
_IMPL: Dict[str, _library.Op] = {}


def _custom_op(name: str, mutates_args: Sequence[str]) -> Callable[[Callable[..., Any]], _library.Op]:
    """:func:`symheap._library.op` that also files the op under its name for :func:`_call`."""

    def register(fn: Callable[..., Any]) -> _library.Op:
        o = _library.op(name, mutates_args)(fn)
        _IMPL[o.name] = o
        return o

    return register


def _call(name: str, *args: Any) -> Any:
    """Runs op ``name`` on ``args``: its kernel directly in eager code, through
    ``torch.ops.symheap.<name>`` when a compiler or a dispatch mode needs it (see
    :meth:`symheap._library.Op.__call__`)."""
    return _IMPL[name](*args)


def _run_as(name: str, runner: Callable[..., Any], *args: Any, record: bool) -> Any:
    """Op ``name`` on ``args`` with its work done by ``runner`` (one of the ``_run_*`` below)
    taking ``record`` (see :func:`_record`): :mod:`symheap.distributed` passes False for a
    synchronous call, as its torch backend does (see :meth:`symheap._library.Op.run`)."""
    return _IMPL[name].run(runner, *args, record=record)


# ---- teams as ints -------------------------------------------------------------------------

_teams: Dict[int, Team] = {}
_team_ids: Dict[Tuple[int, Team], int] = {}
# The context the ids above are for: a new context starts them afresh (the old one's Team
# handles would otherwise stay alive, and its ids reachable, for the rest of the process).
_teams_of: Any = None


def _teams_for(ctx: Any) -> None:
    global _teams_of
    if _teams_of is None or _teams_of() is not ctx:
        _forget_teams()
        _teams_of = weakref.ref(ctx)


def team_id(team: TeamLike) -> int:
    """The int the ops take for ``team`` (None or the world: 0). Ids are per process and stay
    valid until :func:`symheap.finalize`; not collective."""
    if team is None:
        return 0
    if isinstance(team, bool) or not isinstance(team, (int, Team)):
        raise SymheapValueError(f"team must be a symheap.Team, a team id or None, not {type(team).__name__}")
    if isinstance(team, int):
        _team(team)
        return team
    ctx = _core.context()
    _teams_for(ctx)
    key = (id(ctx), team)
    if key not in _team_ids:
        if team == _core.native().world_team():
            return 0
        tid = max([0, *_teams]) + 1
        _teams[tid] = team
        _team_ids[key] = tid
    return _team_ids[key]


def _team(tid: int) -> Optional[Team]:
    """The Team of id ``tid`` (None: the world); raises for an unknown id or a team this PE
    is not a member of."""
    if tid == 0:
        return None
    _teams_for(_core.context())
    team = _teams.get(tid)
    if team is None:
        raise SymheapValueError(f"unknown symheap team id {tid}; get ids from symheap.ops.team_id(team)")
    if not team.is_valid:
        raise SymheapValueError(f"this PE is not a member of team {tid} ({team!r})")
    return team


def _n(tid: int) -> int:
    t = _team(tid)
    return _core.native().n_pes if t is None else t.n_pes()


# ---- checks shared by the real and the fake kernels ----------------------------------------


def _dtype(t: _torch.Tensor, what: str) -> str:
    try:
        return torch_dtype_name(t.dtype)
    except SymheapValueError as e:
        raise SymheapValueError(f"{what}: {e}") from None


def _check_op(op: str, t: _torch.Tensor, what: str) -> None:
    if op not in REDUCE_OPS:
        raise SymheapValueError(f"{what}: unknown reduction {op!r} (one of {', '.join(REDUCE_OPS)})")
    if op == "avg" and not t.dtype.is_floating_point:
        raise SymheapValueError(f"{what}: 'avg' needs a floating-point tensor, not {t.dtype}")


def _check_dtypes(out: _torch.Tensor, inp: _torch.Tensor, what: str) -> None:
    _dtype(inp, what)
    if out.dtype != inp.dtype:
        raise SymheapValueError(f"{what}: dtypes differ (out {out.dtype}, input {inp.dtype})")


def _check_pair(out: _torch.Tensor, inp: _torch.Tensor, what: str) -> None:
    _check_dtypes(out, inp, what)
    if out.device != inp.device:
        raise SymheapValueError(f"{what}: devices differ (out {out.device}, input {inp.device})")


def _gather_shape(inp: _torch.Tensor, n: int) -> List[int]:
    return [n] if inp.dim() == 0 else [n * inp.shape[0], *inp.shape[1:]]


def _scatter_shape(inp: _torch.Tensor, n: int, what: str) -> List[int]:
    if inp.dim() == 0 or inp.shape[0] % n:
        raise SymheapValueError(
            f"{what}: the input's first dimension must be a multiple of {n}, shape {list(inp.shape)}"
        )
    return [inp.shape[0] // n, *inp.shape[1:]]


def _check_gather(out: _torch.Tensor, inp: _torch.Tensor, n: int) -> None:
    _check_pair(out, inp, "all_gather")
    if out.numel() != n * inp.numel():
        raise SymheapValueError(f"all_gather: out must hold {n} x {inp.numel()} elements, it holds {out.numel()}")


def _check_scatter(out: _torch.Tensor, inp: _torch.Tensor, op: str, n: int) -> None:
    _check_pair(out, inp, "reduce_scatter")
    _check_op(op, inp, "reduce_scatter")
    if inp.numel() != n * out.numel():
        raise SymheapValueError(f"reduce_scatter: input must hold {n} x {out.numel()} elements, it holds {inp.numel()}")


def _check_alltoall(out: _torch.Tensor, inp: _torch.Tensor, n: int) -> None:
    _check_pair(out, inp, "alltoall")
    if out.numel() != inp.numel() or inp.numel() % n:
        raise SymheapValueError(
            f"alltoall: input and out must hold {n} equal blocks ({inp.numel()} and {out.numel()} elements)"
        )


def _span(t: _torch.Tensor) -> Tuple[int, int]:
    """(first byte, length) of the memory ``t``'s elements cover (strided: the whole extent)."""
    if t.numel() == 0:
        return t.data_ptr(), 0
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride()):
        ext = (size - 1) * stride
        if ext < 0:
            lo += ext
        else:
            hi += ext
    es = t.element_size()
    return t.data_ptr() + lo * es, (hi - lo + 1) * es


def _check_overlap(coll: str, out: _torch.Tensor, inp: _torch.Tensor, count: int, tid: int) -> None:
    """The collectives' aliasing rules (``symheap.alias``, the native check every collective
    makes) for ``out`` and ``inp`` as the caller passed them, before any staging: the in-place
    forms pass (all_gather from this PE's own block of ``out``, reduce_scatter into its own
    block of ``inp``), any other overlap raises :class:`SymheapValueError` naming both
    ranges, whether or not the tensors are then staged."""
    d, s = _span(out), _span(inp)
    _core.native().check_coll_buffers(coll, _team(tid), d[0], d[1], s[0], s[1], count, torch_dtype_name(inp.dtype))


def _check_staged_overlap(
    coll: str, out: _torch.Tensor, inp: _torch.Tensor, count: int, tid: int, direct: Sequence[bool]
) -> None:
    """:func:`_check_overlap` when a part will be staged (the native call then sees the
    staging, not the caller's tensors). When every part goes to the kernel as it is, the
    native call checks the very same ranges itself (both contiguous), so asking here as well
    only cost host time."""
    if not all(direct):
        _check_overlap(coll, out, inp, count, tid)


# ---- staging -------------------------------------------------------------------------------


def _zero_copy(t: _torch.Tensor) -> bool:
    """Whether ``t`` can be handed to the collective as it is: contiguous symmetric memory of
    this PE's device."""
    n = _core.native()
    on_device = t.is_cuda if n.backend == "cuda" else t.is_cpu
    if not on_device or not t.is_contiguous():
        return False
    return bool(n.is_symmetric(t.data_ptr(), max(t.numel() * t.element_size(), 1)))


def _symmetric_storage(t: _torch.Tensor) -> bool:
    """Whether ``t``'s memory (its storage, whatever its layout) is symmetric: torch's
    allocator must never be told of it (``record_stream`` fails on memory that
    ``cudaMallocAsync`` did not give)."""
    return bool(_core.native().is_symmetric(t.untyped_storage().data_ptr()))


def _record(ts: Sequence[_torch.Tensor], ordinary: bool = False, symmetric: Optional[Sequence[bool]] = None) -> None:
    """Stream-ordered lifetime of ordinary CUDA tensors: like torch's own collectives, note that
    the current stream used them, so the caching allocator does not hand their memory to
    another stream before this work ran (``ordinary``: the caller knows none is symmetric;
    ``symmetric``: which are, as :func:`_direct` found; otherwise each tensor's storage is
    asked, so that a strided view of symmetric memory is known as such too). The ``_run_*`` functions take
    ``record``: torch.distributed's backend calls them directly (below torch's dispatcher, so
    without the custom-op wrapper) and passes False for a synchronous collective, as
    ProcessGroupNCCL keeps no lifetime for one (see ``distributed/_backend.py``)."""
    if symmetric is not None:
        ts = [t for t, sym in zip(ts, symmetric) if not sym]
        ordinary = True
    cuda = [t for t in ts if t.is_cuda]
    if not cuda or _torch.cuda.is_current_stream_capturing():
        return
    dev, stream = -1, None  # the tensors of one call share a device: its stream, asked once
    for t in cuda:
        if ordinary or not _symmetric_storage(t):
            d = t.get_device()
            if d != dev:
                dev, stream = d, _current_stream(d)
            t.record_stream(stream)


# (device, stream handle) -> torch's Stream object of it: current_stream() makes a new Python
# object each call, which cost more than the collective's own host work; a handle names one
# stream while it lives, and torch's pooled streams live as long as the process.
_stream_objs: Dict[Tuple[int, int], Any] = {}


def _current_stream(device: int) -> Any:
    """torch's current stream of CUDA ``device`` (a cached Stream object)."""
    key = (device, _core.current_stream_handle(device))
    s = _stream_objs.get(key)
    if s is None:
        s = _stream_objs[key] = _torch.cuda.current_stream(device)
    return s


# (collective, team id, bytes per block, dtype) -> whether its CUDA kernel takes ordinary
# buffers, for the context in _local_of (the answer depends only on the context's settings and
# teams; asking the native layer each call was a third of a small collective's host time).
_local: Dict[Tuple[str, int, int, _torch.dtype], bool] = {}
_local_of: Any = None


def _in_place(t: _torch.Tensor, coll: Optional[Tuple[str, _torch.Tensor, int]], tid: int) -> bool:
    """Whether ordinary ``t`` is read or written where it is: ``coll`` is ``(name, tensor
    sizing the call, blocks of it per member)`` and its CUDA kernel at that size touches the
    buffers on this PE only (one-shot all_reduce and reduce_scatter, the exchange kernels of
    all_gather, alltoall and broadcast: see ``coll_takes_local_buffers``)."""
    global _local_of
    if coll is None or not t.is_cuda or not t.is_contiguous():
        return False
    if t.get_device() != _core.native().device_ordinal:
        return False
    name, sizing, per = coll
    ctx = _core.context()
    if _local_of is None or _local_of() is not ctx:
        _local.clear()
        _local_of = weakref.ref(ctx)
    key = (name, tid, sizing.numel() * sizing.element_size() // max(per, 1), sizing.dtype)
    ok = _local.get(key)
    if ok is None:
        if len(_local) >= 4096:
            _local.clear()  # sizes that vary call to call stay bounded
        ok = _shmem._takes_local(name, _team(tid), _core.describe(sizing, name), per=per)
        _local[key] = ok
    return ok


def _direct_parts(
    tid: int, parts: Sequence[Tuple[_torch.Tensor, bool]], coll: Optional[Tuple[str, _torch.Tensor, int]]
) -> List[bool]:
    """Whether each part of a call goes to the kernel as it is (symmetric, or ordinary memory
    the kernel of ``coll`` reads in place): the general path's question, asked once for
    :func:`_check_staged_overlap` and :func:`_stage` both."""
    return [_zero_copy(t) or _in_place(t, coll, tid) for t, _ in parts]


def _stage(
    tid: int,
    parts: Sequence[Tuple[_torch.Tensor, bool]],
    coll: Optional[Tuple[str, _torch.Tensor, int]] = None,
    direct: Optional[List[bool]] = None,
) -> List[_torch.Tensor]:
    """For each ``(tensor, copy_in)``: the tensor itself when zero-copy (symmetric, or an
    ordinary CUDA tensor the kernel of ``coll`` reads in place), else a region of the
    workspace of (team, current stream) with its shape and dtype, filled from it when
    ``copy_in``. Sized by all parts, so every PE grows at the same call. ``direct``: which
    parts are zero-copy, when the caller already asked."""
    if direct is None:
        direct = [_zero_copy(t) or _in_place(t, coll, tid) for t, _ in parts]
    if all(direct):
        return [t for t, _ in parts]
    views = _workspace.staging_views(_team(tid), [(t, not d) for (t, _), d in zip(parts, direct)])
    out = []
    for (t, copy_in), r in zip(parts, views):
        if r is None:
            out.append(t)
        else:
            if copy_in:
                r.copy_(t)
            out.append(r)
    return out


def _address(t: _torch.Tensor) -> int:
    """Where ``t``'s elements start (torch says 0 for every empty tensor; see ``_describe``)."""
    return t.data_ptr() if t.numel() else t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()


def _launch(kind: str, tid: int, d: _torch.Tensor, s: _torch.Tensor, count: int, **params: Any) -> None:
    """Collective ``kind`` of ``count`` elements on buffers :func:`_stage` gave (contiguous:
    symmetric memory, or ordinary memory of this PE's GPU its kernel reads in place), on
    torch's current stream, straight to the native call: it checks every address range
    itself (a wrong buffer is an error, never a bad access), so describing and checking them
    here a second time, as the general ``symheap.*`` entry must, only cost host time."""
    ctx = _core.native()
    dtype = torch_dtype_name(s.dtype)
    stream = None
    if d.is_cuda:
        if kind in ("all_reduce", "reduce_scatter") and dtype not in _shmem._DEVICE_REDUCE_DTYPES:
            _shmem._host_sync()
        stream = _core.current_stream_handle(d.get_device())
    ctx.collective(kind, _team(tid), _address(d), _address(s), count, dtype, stream, **params)


_REDUCING = ("all_reduce", "reduce_scatter")


def _direct(
    kind: str, tid: int, d: _torch.Tensor, s: _torch.Tensor, count: int, **params: Any
) -> Optional[Sequence[bool]]:
    """Collective ``kind`` of ``count`` elements per block straight on ``d`` and ``s`` when
    both can go to its kernel as they are (contiguous memory of this PE's device, each
    symmetric or read in place by the kernel at this size: see :func:`_in_place`), on torch's
    current stream: which of the two are symmetric, for :func:`_record`. None, with nothing
    run, when a part needs staging: the caller then takes the general path
    (:func:`_direct_parts`, :func:`_stage`, :func:`_launch`). One native call asks and launches; asking per tensor
    first cost more host time than the rest of a small call. The native call checks every
    range as :func:`_launch` says."""
    if not (d.is_contiguous() and s.is_contiguous()):
        return None
    ctx = _core.native()
    dtype = torch_dtype_name(s.dtype)
    if d.is_cuda:
        dev = d.get_device()
        if s.get_device() != dev or dev != ctx.device_ordinal:
            return None
        if kind in _REDUCING and dtype not in _shmem._DEVICE_REDUCE_DTYPES:
            # Reduced on the host, from symmetric memory only: anything else is staged, and
            # _launch syncs then (syncing here as well would wait twice).
            if not (_zero_copy(d) and _zero_copy(s)):
                return None
            _shmem._host_sync()
        stream = _core.current_stream_handle(dev)
    elif s.is_cuda or ctx.backend == "cuda":
        return None
    else:
        stream = None
    return ctx.collective_direct(kind, _team(tid), _address(d), _address(s), count, dtype, stream, **params)


def _reduce(op: str) -> str:
    return "sum" if op == "avg" else op


def _finish_avg(t: _torch.Tensor, op: str, tid: int) -> None:
    if op == "avg":
        t.div_(_n(tid))


# ---- collectives ---------------------------------------------------------------------------


def _run_all_reduce_(tensor: _torch.Tensor, op: str, team: int, record: bool = True) -> None:
    _dtype(tensor, "all_reduce")
    _check_op(op, tensor, "all_reduce")
    placed = _direct("all_reduce", team, tensor, tensor, tensor.numel(), op=_reduce(op))
    if placed is not None:
        _finish_avg(tensor, op, team)
        if record and not placed[0]:
            _record([tensor], ordinary=True)
        return
    (s,) = _stage(team, [(tensor, True)], direct=[_in_place(tensor, ("all_reduce", tensor, 1), team)])
    _launch("all_reduce", team, s, s, s.numel(), op=_reduce(op))
    _finish_avg(s, op, team)
    if s is not tensor:
        tensor.copy_(s)
    if record:
        _record([tensor])


@_custom_op("symheap::all_reduce_", mutates_args=("tensor",))
def _all_reduce_(tensor: _torch.Tensor, op: str = "sum", team: int = 0) -> None:
    _run_all_reduce_(tensor, op, team)


@_all_reduce_.register_fake
def _(tensor: _torch.Tensor, op: str = "sum", team: int = 0) -> None:
    _dtype(tensor, "all_reduce")
    _check_op(op, tensor, "all_reduce")


@_custom_op("symheap::all_reduce", mutates_args=())
def _all_reduce(input: _torch.Tensor, op: str = "sum", team: int = 0) -> _torch.Tensor:
    _dtype(input, "all_reduce")
    _check_op(op, input, "all_reduce")
    out = _torch.empty_like(input, memory_format=_torch.contiguous_format)
    placed = _direct("all_reduce", team, out, input, input.numel(), op=_reduce(op))
    if placed is not None:
        _finish_avg(out, op, team)
        _record([input], symmetric=placed[1:])
        return out
    parts = [(input, True), (out, False)]
    s, d = _stage(team, parts, ("all_reduce", input, 1))
    _launch("all_reduce", team, d, s, s.numel(), op=_reduce(op))
    _finish_avg(d, op, team)
    if d is not out:
        out.copy_(d)
    _record([input])
    return out


@_all_reduce.register_fake
def _(input: _torch.Tensor, op: str = "sum", team: int = 0) -> _torch.Tensor:
    _dtype(input, "all_reduce")
    _check_op(op, input, "all_reduce")
    return _torch.empty_like(input, memory_format=_torch.contiguous_format)


def _run_exchange(
    coll: str, out: _torch.Tensor, input: _torch.Tensor, team: int, caller_out: bool = False, record: bool = True
) -> None:
    """all_gather or alltoall of ``input`` into ``out``, staged where needed (``caller_out``:
    ``out`` is the caller's, so it may overlap ``input``: see :func:`_check_staged_overlap`;
    ``record``: see :func:`_record`)."""
    per = _n(team) if coll == "alltoall" else 1
    sym = _direct(coll, team, out, input, input.numel() // per)
    if sym is None:
        parts = [(out, False), (input, True)]
        direct = _direct_parts(team, parts, (coll, input, per))
        if caller_out:
            _check_staged_overlap(coll, out, input, input.numel() // per, team, direct)
        d, s = _stage(team, parts, direct=direct)
        _launch(coll, team, d, s, s.numel() // per)
        if d is not out:
            out.copy_(d.view(out.shape))
    if record:
        _record([out, input], symmetric=sym)


def _run_gather_into(out: _torch.Tensor, input: _torch.Tensor, team: int, record: bool = True) -> None:
    _check_gather(out, input, _n(team))
    _run_exchange("all_gather", out, input, team, True, record)


@_custom_op("symheap::all_gather_into", mutates_args=("out",))
def _all_gather_into(out: _torch.Tensor, input: _torch.Tensor, team: int = 0) -> None:
    _run_gather_into(out, input, team)


@_all_gather_into.register_fake
def _(out: _torch.Tensor, input: _torch.Tensor, team: int = 0) -> None:
    _check_gather(out, input, _n(team))


@_custom_op("symheap::all_gather", mutates_args=())
def _all_gather(input: _torch.Tensor, team: int = 0) -> _torch.Tensor:
    _dtype(input, "all_gather")
    out = input.new_empty(_gather_shape(input, _n(team)))
    _run_exchange("all_gather", out, input, team)
    return out


@_all_gather.register_fake
def _(input: _torch.Tensor, team: int = 0) -> _torch.Tensor:
    _dtype(input, "all_gather")
    return input.new_empty(_gather_shape(input, _n(team)))


def _run_scatter(
    out: _torch.Tensor, input: _torch.Tensor, op: str, team: int, caller_out: bool = False, record: bool = True
) -> None:
    sym = _direct("reduce_scatter", team, out, input, out.numel(), op=_reduce(op))
    if sym is not None:
        _finish_avg(out, op, team)
    else:
        parts = [(out, False), (input, True)]
        direct = _direct_parts(team, parts, ("reduce_scatter", out, 1))
        if caller_out:
            _check_staged_overlap("reduce_scatter", out, input, out.numel(), team, direct)
        d, s = _stage(team, parts, direct=direct)
        _launch("reduce_scatter", team, d, s, d.numel(), op=_reduce(op))
        _finish_avg(d, op, team)
        if d is not out:
            out.copy_(d)
    if record:
        _record([out, input], symmetric=sym)


def _run_scatter_into(out: _torch.Tensor, input: _torch.Tensor, op: str, team: int, record: bool = True) -> None:
    _check_scatter(out, input, op, _n(team))
    _run_scatter(out, input, op, team, True, record)


@_custom_op("symheap::reduce_scatter_into", mutates_args=("out",))
def _reduce_scatter_into(out: _torch.Tensor, input: _torch.Tensor, op: str = "sum", team: int = 0) -> None:
    _run_scatter_into(out, input, op, team)


@_reduce_scatter_into.register_fake
def _(out: _torch.Tensor, input: _torch.Tensor, op: str = "sum", team: int = 0) -> None:
    _check_scatter(out, input, op, _n(team))


@_custom_op("symheap::reduce_scatter", mutates_args=())
def _reduce_scatter(input: _torch.Tensor, op: str = "sum", team: int = 0) -> _torch.Tensor:
    out = input.new_empty(_scatter_shape(input, _n(team), "reduce_scatter"))
    _check_scatter(out, input, op, _n(team))
    _run_scatter(out, input, op, team)
    return out


@_reduce_scatter.register_fake
def _(input: _torch.Tensor, op: str = "sum", team: int = 0) -> _torch.Tensor:
    out = input.new_empty(_scatter_shape(input, _n(team), "reduce_scatter"))
    _check_scatter(out, input, op, _n(team))
    return out


def _run_alltoall_into(out: _torch.Tensor, input: _torch.Tensor, team: int, record: bool = True) -> None:
    _check_alltoall(out, input, _n(team))
    _run_exchange("alltoall", out, input, team, True, record)


@_custom_op("symheap::alltoall_into", mutates_args=("out",))
def _alltoall_into(out: _torch.Tensor, input: _torch.Tensor, team: int = 0) -> None:
    _run_alltoall_into(out, input, team)


@_alltoall_into.register_fake
def _(out: _torch.Tensor, input: _torch.Tensor, team: int = 0) -> None:
    _check_alltoall(out, input, _n(team))


@_custom_op("symheap::alltoall", mutates_args=())
def _alltoall(input: _torch.Tensor, team: int = 0) -> _torch.Tensor:
    out = _torch.empty_like(input, memory_format=_torch.contiguous_format)
    _check_alltoall(out, input, _n(team))
    _run_exchange("alltoall", out, input, team)
    return out


@_alltoall.register_fake
def _(input: _torch.Tensor, team: int = 0) -> _torch.Tensor:
    out = _torch.empty_like(input, memory_format=_torch.contiguous_format)
    _check_alltoall(out, input, _n(team))
    return out


def _check_root(root: int, n: int) -> None:
    if not 0 <= root < n:
        raise SymheapValueError(f"broadcast: root {root} is not a member of a team of {n}")


def _run_broadcast_(tensor: _torch.Tensor, root: int, team: int, record: bool = True) -> None:
    _dtype(tensor, "broadcast")
    _check_root(root, _n(team))
    sym = _direct("broadcast", team, tensor, tensor, tensor.numel(), root=root)
    if sym is None:
        parts = [(tensor, True)]
        (s,) = _stage(team, parts, ("broadcast", tensor, 1))
        _launch("broadcast", team, s, s, s.numel(), root=root)
        if s is not tensor:
            tensor.copy_(s)
    if record:
        _record([tensor], symmetric=sym)


@_custom_op("symheap::broadcast_", mutates_args=("tensor",))
def _broadcast_(tensor: _torch.Tensor, root: int = 0, team: int = 0) -> None:
    _run_broadcast_(tensor, root, team)


@_broadcast_.register_fake
def _(tensor: _torch.Tensor, root: int = 0, team: int = 0) -> None:
    _dtype(tensor, "broadcast")
    _check_root(root, _n(team))


@_custom_op("symheap::barrier", mutates_args=())
def _barrier(team: int = 0) -> None:
    t = _team(team)
    if t is None:
        _shmem.barrier_all()
        return
    if _torch.cuda.is_available() and _torch.cuda.is_current_stream_capturing():
        raise SymheapUnsupportedError(
            "barrier: a barrier over a team other than the world meets on the host and cannot be "
            "captured in a CUDA graph; use the world team (team 0) there"
        )
    _shmem.barrier(t)


@_barrier.register_fake
def _(team: int = 0) -> None:
    _team(team)


# ---- RMA and signals -----------------------------------------------------------------------


@_custom_op("symheap::put", mutates_args=())
def _put(dest: _torch.Tensor, src: _torch.Tensor, pe: int) -> None:
    _shmem.put(dest, src, pe)
    _record([src])


@_put.register_fake
def _(dest: _torch.Tensor, src: _torch.Tensor, pe: int) -> None:
    _check_dtypes(dest, src, "put")


@_custom_op("symheap::get", mutates_args=("dest",))
def _get(dest: _torch.Tensor, src: _torch.Tensor, pe: int) -> None:
    if dest.is_contiguous():
        _shmem.get(dest, src, pe)
    else:
        tmp = _torch.empty_like(dest, memory_format=_torch.contiguous_format)
        _shmem.get(tmp, src, pe)
        dest.copy_(tmp)
    _record([dest])


@_get.register_fake
def _(dest: _torch.Tensor, src: _torch.Tensor, pe: int) -> None:
    _check_dtypes(dest, src, "get")


@_custom_op("symheap::put_signal", mutates_args=())
def _put_signal(
    dest: _torch.Tensor,
    src: _torch.Tensor,
    signal: _torch.Tensor,
    value: int,
    pe: int,
    sig_op: str = "set",
    sig_index: int = 0,
) -> None:
    _shmem.put_signal(dest, src, signal, value, pe, op=sig_op, sig_index=sig_index)
    _record([src])


@_put_signal.register_fake
def _(
    dest: _torch.Tensor,
    src: _torch.Tensor,
    signal: _torch.Tensor,
    value: int,
    pe: int,
    sig_op: str = "set",
    sig_index: int = 0,
) -> None:
    _check_dtypes(dest, src, "put_signal")


@_custom_op("symheap::signal_wait_until", mutates_args=())
def _signal_wait_until(signal: _torch.Tensor, cmp: str, value: int, index: int = 0) -> None:
    _shmem.signal_wait_until(signal, cmp, value, index=index)


@_signal_wait_until.register_fake
def _(signal: _torch.Tensor, cmp: str, value: int, index: int = 0) -> None:
    return None


def _side_effects() -> None:
    for name in ("barrier", "put", "put_signal", "signal_wait_until"):
        has_side_effect(getattr(_torch.ops.symheap, name).default)


_side_effects()


# ---- the Python functions ------------------------------------------------------------------


@api
def all_reduce_(tensor: _torch.Tensor, op: str = "sum", team: TeamLike = None) -> _torch.Tensor:
    """**Collective** over ``team``: every member's ``tensor`` becomes the element-wise
    reduction (``sum``, ``avg``, ``min``, ``max``, ``prod``) of all members' ``tensor``, on the
    current stream. Every PE makes the same calls in the same order. Returns ``tensor``."""
    _call("all_reduce_", tensor, op, team_id(team))
    return tensor


@api
def all_reduce(input: _torch.Tensor, op: str = "sum", team: TeamLike = None) -> _torch.Tensor:
    """**Collective** over ``team``: a new tensor holding the reduction of all members'
    ``input`` (out of place; ``input`` is read, not written). Every PE makes the same calls in
    the same order."""
    return _call("all_reduce", input, op, team_id(team))


@api
def all_gather(input: _torch.Tensor, team: TeamLike = None, *, out: Optional[_torch.Tensor] = None) -> _torch.Tensor:
    """**Collective** over ``team``: member j's ``input`` lands in block j of the result (first
    dimension ``n`` times the input's, or ``out`` of ``n * input.numel()`` elements). ``input``
    may be exactly this PE's block of ``out`` (in place, as FSDP2 gathers); any other overlap
    raises :class:`symheap.SymheapValueError`. Every PE makes the same calls in the same
    order."""
    if out is None:
        return _call("all_gather", input, team_id(team))
    _call("all_gather_into", out, input, team_id(team))
    return out


@api
def reduce_scatter(
    input: _torch.Tensor, op: str = "sum", team: TeamLike = None, *, out: Optional[_torch.Tensor] = None
) -> _torch.Tensor:
    """**Collective** over ``team``: ``input`` holds ``n`` blocks; member j gets the reduction
    of every member's block j (first dimension divided by ``n``, or into ``out``, which may be
    exactly this PE's block of ``input``: in place; any other overlap raises
    :class:`symheap.SymheapValueError`). Every PE makes the same calls in the same order."""
    if out is None:
        return _call("reduce_scatter", input, op, team_id(team))
    _call("reduce_scatter_into", out, input, op, team_id(team))
    return out


@api
def alltoall(input: _torch.Tensor, team: TeamLike = None, *, out: Optional[_torch.Tensor] = None) -> _torch.Tensor:
    """**Collective** over ``team``: block j of member i's ``input`` lands in block i of member
    j's result (``n`` equal blocks; never in place: an ``out`` overlapping ``input`` raises
    :class:`symheap.SymheapValueError`). Every PE makes the same calls in the same order."""
    if out is None:
        return _call("alltoall", input, team_id(team))
    _call("alltoall_into", out, input, team_id(team))
    return out


@api
def broadcast_(tensor: _torch.Tensor, root: int = 0, team: TeamLike = None) -> _torch.Tensor:
    """**Collective** over ``team``: every member's ``tensor`` gets member ``root``'s. Every
    PE makes the same calls in the same order. Returns ``tensor``."""
    _call("broadcast_", tensor, _core.index_arg(root, "broadcast root"), team_id(team))
    return tensor


@api
def barrier(team: TeamLike = None) -> None:
    """**Collective** over ``team``: a barrier on the current stream (the world: stream-ordered
    and capturable; another team meets on the host). Every PE makes the same calls in the same
    order."""
    _call("barrier", team_id(team))


@api
def put(dest: _torch.Tensor, src: _torch.Tensor, pe: int) -> None:
    """Copies local ``src`` into PE ``pe``'s copy of symmetric ``dest`` on the current stream
    (delivered by the next barrier, quiet or signal). Not collective."""
    _call("put", dest, src, pe)


@api
def get(dest: _torch.Tensor, src: _torch.Tensor, pe: int) -> _torch.Tensor:
    """Copies PE ``pe``'s copy of symmetric ``src`` into local ``dest`` on the current stream.
    Not collective. Returns ``dest``."""
    _call("get", dest, src, pe)
    return dest


@api
def put_signal(
    dest: _torch.Tensor,
    src: _torch.Tensor,
    signal: _torch.Tensor,
    value: int,
    pe: int,
    sig_op: str = "set",
    sig_index: int = 0,
) -> None:
    """Puts ``src`` into PE ``pe``'s ``dest``, then sets/adds ``value`` to PE ``pe``'s
    ``signal[sig_index]`` (a symmetric int64/uint64 tensor), on the current stream. ``value``
    is below 2**63 (a torch ``int``). Not collective."""
    _call("put_signal", dest, src, signal, value, pe, sig_op, sig_index)


@api
def signal_wait_until(signal: _torch.Tensor, cmp: str, value: int, index: int = 0) -> None:
    """Waits (on the current stream on CUDA, on the host otherwise) until this PE's
    ``signal[index]`` satisfies ``word CMP value``. Not collective."""
    _call("signal_wait_until", signal, cmp, value, index)


@api
def reserve_workspace(nbytes: int, team: TeamLike = None) -> None:
    """**Collective** over the world (every PE, members of ``team`` or not, in the same order):
    makes the staging workspace of ``team`` on the current stream hold ``nbytes``. Needed before
    ordinary tensors go through a team that is not the whole world, and before CUDA graph
    capture when no eager warm-up call ran."""
    tid = team_id(team)
    # Non-members allocate too (allocation is collective over the world), under their own key.
    _workspace.reserve_staging(nbytes, None if tid == 0 else _teams[tid])


def workspace_usage() -> Dict[str, int]:
    """This PE's staging workspaces: ``{workspaces, bytes, captured}``. Not collective."""
    return _workspace.staging_usage()


def _forget_teams() -> None:
    _teams.clear()
    _team_ids.clear()


__all__ = [
    "REDUCE_OPS",
    "all_gather",
    "all_reduce",
    "all_reduce_",
    "alltoall",
    "barrier",
    "broadcast_",
    "get",
    "put",
    "put_signal",
    "reduce_scatter",
    "reserve_workspace",
    "signal_wait_until",
    "team_id",
    "workspace_usage",
]
