"""Process groups as symheap teams, and the context under them.

The default group's creator makes symheap's context over the group's store (its PEs are the
global ranks), unless a context of the same ranks exists already (``symheap.init()`` called
first), which is then used as it is. A group of every rank is the world team (id 0). A group
of a subset, in any order (``new_group``, ``new_subgroups``, a DeviceMesh dimension), becomes the
team ``Context.team_from_ranks(ranks, exchange)`` makes: torch runs the creator on the members
only, so the members agree among themselves, ``exchange`` being an all-gather of bytes over the
group's store in group order. Its collectives on ordinary tensors stage through a slot of a
region the default group reserved (:mod:`._staged`): a subgroup allocates nothing.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

import torch

from .. import _core, ops
from .._native import SymheapMismatchError, SymheapTimeoutError, SymheapUnsupportedError
from . import _staged

# Whether this module made the context (then it finalizes it when the default group goes).
_owns_context = False


def _context(store: Any, rank: int, size: int, timeout: timedelta) -> None:
    """symheap's context for the default group (global ``rank`` of ``size``)."""
    global _owns_context
    if _core.is_initialized():
        n = _core.native()
        if (n.my_pe, n.n_pes) != (rank, size):
            raise SymheapMismatchError(
                f"init_process_group: symheap is already initialised as PE {n.my_pe} of {n.n_pes}, but this "
                f"process is rank {rank} of {size}; finalize symheap first or initialise it after the group"
            )
        return
    import torch.distributed as dist  # deferred: torch.distributed is heavy (this module needs it anyway)

    secs = timeout.total_seconds()
    env = os.environ.get("SYMHEAP_TIMEOUT", "").strip()
    _core.init(
        store=dist.PrefixStore("symheap/", store),
        rank=rank,
        world_size=size,
        device=_torch_device(),
        timeout=float(env) if env else secs,
    )
    _owns_context = True


def _torch_device() -> Optional[int]:
    """The GPU the program chose with ``torch.cuda.set_device`` before ``init_process_group``
    (what NCCL's users do), so symheap's CUDA context is on the same one; None when torch's CUDA
    is not initialised (then init's default: ``SYMHEAP_DEVICE``, else ``LOCAL_RANK`` mod the
    GPU count)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return None


def exchange_over(
    store: Any,
    rank: int,
    size: int,
    timeout: timedelta,
    prefix: str = "symheap-x",
    ranks: Optional[Sequence[int]] = None,
) -> Callable[[bytes], List[bytes]]:
    """An all-gather of bytes among a group's members over its store, in group order: call
    ``k`` sets ``{prefix}/{k}/{rank}`` and reads every member's key. ``ranks``: the members'
    world ranks, for the timeout's message."""
    count = [0]

    def exchange(data: bytes) -> List[bytes]:
        k = count[0]
        count[0] += 1
        store.set(f"{prefix}/{k}/{rank}", bytes(data))
        keys = [f"{prefix}/{k}/{r}" for r in range(size)]
        _wait_alive(store, keys, timeout, list(ranks) if ranks is not None else list(range(size)))
        return [bytes(store.get(key)) for key in keys]

    return exchange


def _wait_alive(store: Any, keys: List[str], timeout: timedelta, ranks: List[int]) -> None:
    """``store.wait(keys, timeout)`` that also ends when symheap's watch saw a PE exit (or the
    job fail otherwise) meanwhile: a member that died while the group is being made is named
    at once instead of at the timeout (``SYMHEAP_TIMEOUT`` when set, as for every symheap wait).
    Polls the store, 0.2 ms apart at first, 20 ms at most."""
    native = _core.native() if _core.is_initialized() else None
    env = os.environ.get("SYMHEAP_TIMEOUT", "").strip()
    secs = float(env) if env else timeout.total_seconds()
    deadline = time.monotonic() + secs
    pause = 0.0002
    while not _check(store, keys, native):
        if native is not None:
            native.check_alive_new_group()
        if time.monotonic() >= deadline:
            missing = [ranks[i] for i, key in enumerate(keys) if not store.check([key])]
            err = SymheapTimeoutError(
                f"new_group: ranks {missing} of the group {ranks} did not join it within {secs:g} s"
            )
            err.call, err.missing = "new_group", missing  # type: ignore[attr-defined]
            err.pe = native.my_pe if native is not None else None  # type: ignore[attr-defined]
            raise err
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def _check(store: Any, keys: List[str], native: Any) -> bool:
    """``store.check(keys)``; when the store fails (its host, rank 0's process, died: torch
    raises ``DistNetworkError``), the job's failure that symheap's watch records meanwhile (the
    first PE that exited) is raised instead, if it comes within a second."""
    try:
        return bool(store.check(keys))
    except Exception:
        if native is not None:
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                native.check_alive_new_group()
                time.sleep(0.005)
        raise


def team_for(store: Any, rank: int, size: int, ranks: Sequence[int], timeout: timedelta) -> int:
    """The symheap team id of the group of world ``ranks`` (this member is ``rank`` of
    ``size``); makes the context for the default group."""
    if not _core.is_initialized():
        if list(ranks) != list(range(size)):
            raise SymheapUnsupportedError(
                "new_group: symheap has no context; the default group must use the symheap backend "
                "(init_process_group('symheap')) or symheap.init() must run first"
            )
        _context(store, rank, size, timeout)
    n = _core.native()
    if list(ranks) == list(range(n.n_pes)):
        return 0
    team = n.team_from_ranks(list(ranks), exchange_over(store, rank, size, timeout, ranks=ranks))
    return ops.team_id(team)


def slot_for(store: Any, rank: int, size: int, timeout: timedelta, ranks: Sequence[int]) -> Optional[int]:
    """The staging slot of a new subgroup of world ``ranks``, agreed among its members (see
    :mod:`._staged`)."""
    return _staged.take(exchange_over(store, rank, size, timeout, "symheap-slot", ranks))


def release(pg: Any) -> None:
    """At a group's shutdown: a subgroup gives its staging slot back; the default group's end
    ends its subgroups' slots and finalizes a context it made."""
    global _owns_context
    if not getattr(pg, "_default", False):
        _staged.give(getattr(pg, "_slot", None))
        return
    _staged.forget_groups()
    if _owns_context and _core.is_initialized():
        _owns_context = False
        _core.finalize()
