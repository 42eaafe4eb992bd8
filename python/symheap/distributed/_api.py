"""torch.distributed habits: symheap's collectives with the signatures of
``torch.distributed`` (``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_to_all_single``, ``broadcast``, ``barrier``).

They call the ``torch.ops.symheap.*`` custom ops of :mod:`symheap.ops`, so they compile
without graph breaks and capture in CUDA graphs, and they run on the current torch stream.
Tensors may be symmetric (zero-copy) or ordinary (staged, see ``docs/torch-integration.md``).

``group`` is None (the world), a ``torch.distributed`` ProcessGroup or a :class:`symheap.Team`.
A ProcessGroup is mapped to a symheap team once, by its ranks (``get_process_group_ranks``,
any ranks in any order: team PE ``i`` is the group's rank ``i``), and cached: a group of every
rank in rank order is the world team; any other group must be registered on every PE with
:func:`register_group` right after ``dist.new_group`` (like ``new_group``, the split is
collective over the world). symheap PEs are the ranks of torch's default group
(``symheap.init()`` after ``dist.init_process_group``).

Collective-order rule: every PE of the group makes the same calls in the same order with the
same arguments; a mismatch raises :class:`symheap.SymheapMismatchError` on every PE.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

try:
    import torch as _torch
    import torch.distributed as dist
except ImportError as _e:  # say which extra installs it
    from .._requires import reraise

    reraise(_e, "torch", "symheap.distributed")

from .. import _core, _shmem, ops
from .._core import api
from .._native import SymheapMismatchError, SymheapUnsupportedError, SymheapValueError, Team
from . import _reduce

__all__ = [
    "ReduceOp",
    "Work",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "reduce_scatter_tensor",
    "register_group",
]


class ReduceOp:
    """The reductions by name (torch's ``ReduceOp`` members are accepted as well)."""

    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    PRODUCT = "prod"


_STRINGS = {"sum": "sum", "avg": "avg", "min": "min", "max": "max", "prod": "prod", "product": "prod"}


def _op(op: Any) -> str:
    """``op`` (a string or a ``torch.distributed.ReduceOp``) as a symheap reduction name."""
    if isinstance(op, str):
        name = _STRINGS.get(op.lower())
        if name is None:
            raise SymheapValueError(f"unknown reduction {op!r} (one of sum, avg, max, min, prod)")
        return name
    name = _reduce.kind_of(op)
    if name in ("sum", "avg", "min", "max", "prod"):
        return name
    raise SymheapUnsupportedError(f"reduction {op!r} is not supported by symheap (SUM, AVG, MIN, MAX, PRODUCT are)")


class Work:
    """What ``async_op=True`` returns: the operation is already enqueued on the current stream
    (or done, on the host backend), so :meth:`wait` has nothing left to do."""

    def wait(self, timeout: Any = None) -> bool:
        """Returns True: later work on the current stream is ordered after the operation."""
        return True

    def is_completed(self) -> bool:
        """True once the host enqueued the operation (it is, when this object exists)."""
        return True


def _done(async_op: bool) -> Optional[Work]:
    return Work() if async_op else None


# ---- groups --------------------------------------------------------------------------------

# (context id, ranks) -> Team
_groups: Dict[Tuple[int, Tuple[int, ...]], Team] = {}


def _ranks(group: Any) -> Tuple[int, ...]:
    if not (dist.is_available() and dist.is_initialized()):
        raise SymheapValueError("group: torch.distributed is not initialised; pass None or a symheap.Team")
    if dist.get_world_size() != _core.native().n_pes or dist.get_rank() != _core.native().my_pe:
        raise SymheapMismatchError(
            f"group: torch.distributed rank {dist.get_rank()} of {dist.get_world_size()} is not symheap PE "
            f"{_core.native().my_pe} of {_core.native().n_pes}; call symheap.init() after dist.init_process_group"
        )
    return tuple(int(r) for r in dist.get_process_group_ranks(group))


def _non_member(group: Any) -> bool:
    """Whether ``group`` is what ``dist.new_group`` gives ranks outside the group."""
    sentinel = dist.GroupMember.NON_GROUP_MEMBER
    return group is sentinel or (isinstance(group, int) and not isinstance(group, bool) and group == sentinel)


@api
def register_group(group: Any) -> Team:
    """**Collective** over the world (every PE, in the same order, like ``dist.new_group``,
    including the PEs outside the group, which pass what ``new_group`` gave them): makes the
    symheap team of ProcessGroup ``group`` (any ranks in any order: team PE ``i`` is the
    group's rank ``i``) and caches it; returns it (an invalid team outside the group). Staging
    ordinary tensors on a group smaller than the world also needs
    :func:`symheap.ops.reserve_workspace` on every PE."""

    n = _core.native().n_pes
    mine: Tuple[int, ...] = ()
    if group is None or group is dist.group.WORLD:
        mine = tuple(range(n))
    elif not _non_member(group):
        mine = _ranks(group)
    # Ranks outside the group do not know its ranks: every PE learns them from the members.
    views = {tuple(json.loads(b)) for b in _shmem.all_gather_object_bytes(json.dumps(list(mine)).encode())}
    views.discard(())
    if len(views) != 1:
        raise SymheapMismatchError(f"register_group: the PEs passed different groups: {sorted(views)}")
    (ranks,) = views
    key = (id(_core.context()), ranks)
    if key in _groups:
        return _groups[key]
    if ranks == tuple(range(n)):
        team = _core.native().world_team()
    else:
        team = _shmem.team_split_ranks(None, list(ranks))
    _groups[key] = team
    return team


def _team(group: Any) -> Any:
    """The team (or its id) the ops take for ``group``."""
    if group is None or isinstance(group, Team) or (isinstance(group, int) and not isinstance(group, bool)):
        if group is None or not _non_member(group):
            return group
    return _group_team_id(group)


def _tid(group: Any) -> int:
    """The ops' team id for ``group``."""
    return ops.team_id(_team(group))


@_torch.compiler.assume_constant_result
def _group_team_id(group: Any) -> int:
    """The team id of ProcessGroup ``group`` (a constant to torch.compile: groups are fixed)."""
    if group is not None and _non_member(group):
        raise SymheapValueError(
            "group: this PE is not a member of the process group (dist.new_group gave it NON_GROUP_MEMBER)"
        )
    if group is None or isinstance(group, (Team, int)) and not isinstance(group, bool):
        return group
    ranks = _ranks(group)
    me = _core.native().my_pe
    if me not in ranks:
        raise SymheapValueError(
            f"group: this PE (rank {me}) is not a member of the process group of ranks {list(ranks)}"
        )
    if ranks == tuple(range(_core.native().n_pes)):
        return 0
    team = _groups.get((id(_core.context()), ranks))
    if team is None:
        raise SymheapValueError(
            f"group: the process group of ranks {list(ranks)} has no symheap team yet; call "
            "symheap.distributed.register_group(group) on every PE right after dist.new_group"
        )
    return ops.team_id(team)


def _group_rank(group: Any, src: int) -> int:
    """Global rank ``src`` as a member index of ``group``."""
    if group is None:
        return src
    if isinstance(group, int) and not isinstance(group, bool):
        t = ops._team(group)
        members: List[int] = list(range(_core.native().n_pes)) if t is None else list(t.members)
    elif isinstance(group, Team):
        members = list(group.members)
    else:
        members = list(_ranks(group))
    if src not in members:
        raise SymheapValueError(f"broadcast: src rank {src} is not a member of the group (ranks {members})")
    return members.index(src)


# ---- the functions -------------------------------------------------------------------------


@api
def all_reduce(tensor: _torch.Tensor, op: Any = "sum", group: Any = None, async_op: bool = False) -> Optional[Work]:
    """**Collective** over ``group``: ``tensor`` becomes the reduction (``ReduceOp.SUM`` /
    ``"sum"``, ``"avg"``, ``"max"``, ``"min"``, ``"prod"``) of every member's ``tensor``, in
    place. Every PE of the group makes the same calls in the same order."""
    ops._run_as("all_reduce_", ops._run_all_reduce_, tensor, _op(op), _tid(group), record=async_op)
    return _done(async_op)


@api
def all_gather_into_tensor(
    output_tensor: _torch.Tensor, input_tensor: _torch.Tensor, group: Any = None, async_op: bool = False
) -> Optional[Work]:
    """**Collective** over ``group``: member j's ``input_tensor`` lands in block j of
    ``output_tensor`` (``n`` times its elements: stacked or concatenated on dimension 0).
    ``input_tensor`` may be exactly this PE's block of ``output_tensor`` (in place, as FSDP2
    gathers); any other overlap raises :class:`symheap.SymheapValueError`. Every PE of the
    group makes the same calls in the same order."""
    ops._run_as("all_gather_into", ops._run_gather_into, output_tensor, input_tensor, _tid(group), record=async_op)
    return _done(async_op)


@api
def reduce_scatter_tensor(
    output: _torch.Tensor, input: _torch.Tensor, op: Any = "sum", group: Any = None, async_op: bool = False
) -> Optional[Work]:
    """**Collective** over ``group``: ``input`` holds ``n`` blocks of ``output.numel()``
    elements; member j's ``output`` gets the reduction of every member's block j (``output``
    may be exactly this PE's block of ``input``: in place; any other overlap raises
    :class:`symheap.SymheapValueError`). Every PE of the group makes the same calls in the
    same order."""
    ops._run_as("reduce_scatter_into", ops._run_scatter_into, output, input, _op(op), _tid(group), record=async_op)
    return _done(async_op)


@api
def all_to_all_single(
    output: _torch.Tensor,
    input: _torch.Tensor,
    output_split_sizes: Optional[List[int]] = None,
    input_split_sizes: Optional[List[int]] = None,
    group: Any = None,
    async_op: bool = False,
) -> Optional[Work]:
    """**Collective** over ``group``: block j of member i's ``input`` lands in block i of
    member j's ``output`` (``n`` equal blocks on dimension 0; uneven split sizes raise
    :class:`symheap.SymheapUnsupportedError`). Every PE of the group makes the same calls in
    the same order."""
    tid = _tid(group)
    for name, splits in (("output_split_sizes", output_split_sizes), ("input_split_sizes", input_split_sizes)):
        if splits is not None and len(set(splits)) > 1:
            raise SymheapUnsupportedError(f"all_to_all_single: uneven {name} {list(splits)} are not supported")
    ops._run_as("alltoall_into", ops._run_alltoall_into, output, input, tid, record=async_op)
    return _done(async_op)


@api
def broadcast(
    tensor: _torch.Tensor,
    src: Optional[int] = None,
    group: Any = None,
    async_op: bool = False,
    group_src: Optional[int] = None,
) -> Optional[Work]:
    """**Collective** over ``group``: every member's ``tensor`` gets the one of global rank
    ``src`` (or of group member ``group_src``). Every PE of the group makes the same calls in
    the same order."""
    if (src is None) == (group_src is None):
        raise SymheapValueError("broadcast: give exactly one of src and group_src")
    team = _team(group)
    root = group_src if group_src is not None else _group_rank(team, _core.index_arg(src, "broadcast src"))
    root = _core.index_arg(root, "broadcast root")
    ops._run_as("broadcast_", ops._run_broadcast_, tensor, root, ops.team_id(team), record=async_op)
    return _done(async_op)


@api
def barrier(group: Any = None, async_op: bool = False) -> Optional[Work]:
    """**Collective** over ``group``: a barrier (on the current stream for the world). Every
    PE of the group makes the same calls in the same order."""
    ops.barrier(_team(group))
    return _done(async_op)


def _forget() -> None:
    _groups.clear()
