"""The symmetric staging workspace of :mod:`symheap.ops`: one per (team, stream), grown on
demand, reused, and fixed in place once a CUDA graph captured it.

symheap's collectives read and write symmetric memory (peers address it directly), so an
ordinary tensor from PyTorch's allocator is copied into this PE's workspace before the call
and, where it is written, copied back after it. Every copy is enqueued on the same stream as
the collective (the current torch stream), so the sequence is stream-ordered and capturable.

Growing a workspace allocates symmetric memory, which is **collective over the world**: every
PE grows at the same call because every PE makes the same calls in the same order with the same
sizes. A team that is not the whole world cannot grow on demand (its non-members would not
allocate); reserve its workspace on every PE with :func:`reserve_workspace` first.

Under CUDA graph capture nothing is allocated: a workspace too small for the captured call
raises :class:`symheap.SymheapValueError` telling the caller to warm up (run the same call once
before capture). A workspace a graph captured is never freed or moved; when a later eager call
needs more, a new one is made and the captured one is kept alive for the graph's replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch as _torch

from . import _core
from ._native import SymheapValueError, Team

# Smallest workspace (bytes); growth goes to the next power of two of what the call needs.
MIN_BYTES = 64 << 10
# Alignment of the regions inside a workspace (the LL128 kernels want 16 bytes; 256 is safe).
ALIGN = 256


@dataclass
class Workspace:
    """One symmetric byte buffer and whether a CUDA graph has captured it."""

    buf: _torch.Tensor
    captured: bool = False
    retired: List[_torch.Tensor] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return int(self.buf.numel())


# (context id, team members, stream handle) -> Workspace
_spaces: Dict[Tuple[int, Tuple[int, ...], int], Workspace] = {}


def _capturing() -> bool:
    return _torch.cuda.is_available() and _torch.cuda.is_current_stream_capturing()


def stream_key() -> int:
    """The current torch stream's handle on the CUDA backend, 0 on the host backend."""
    n = _core.native()
    if n.backend != "cuda":
        return 0
    return int(_torch.cuda.current_stream(n.device_ordinal).cuda_stream)


def _key(team: Optional[Team]) -> Tuple[int, Tuple[int, ...], int]:
    ctx = _core.context()
    if not any(getattr(h, "__self__", None) is ctx for h in _core._before_finalize if h is not None):
        # Forget this context's workspaces when it is finalized (the memory goes with it).
        _core._before_finalize.append(_Forget(ctx))
    members = tuple(range(_core.native().n_pes)) if team is None else tuple(team.members)
    return (id(ctx), members, stream_key())


class _Forget:
    """A finalize hook dropping the workspaces of one context."""

    def __init__(self, ctx: Any) -> None:
        self.__self__ = ctx

    def __call__(self) -> None:
        for k in [k for k in _spaces if k[0] == id(self.__self__)]:
            del _spaces[k]


def _round(nbytes: int) -> int:
    size = MIN_BYTES
    while size < nbytes:
        size *= 2
    return size


def _grow(key: Tuple[int, Tuple[int, ...], int], old: Optional[Workspace], nbytes: int) -> Workspace:
    from . import torch as st

    buf = st.empty(_round(nbytes), dtype=_torch.uint8)
    ws = Workspace(buf)
    if old is not None:
        # A captured buffer stays alive (graphs replay on its addresses); others are released
        # (stream-ordered: the release waits for the streams that used it).
        ws.retired = old.retired + ([old.buf] if old.captured else [])
        if not old.captured:
            st.free(old.buf)
    _spaces[key] = ws
    return ws


def get(team: Optional[Team], nbytes: int) -> _torch.Tensor:
    """A symmetric uint8 tensor of at least ``nbytes`` for ``team`` on the current stream;
    grows the workspace when needed (collective over the world, see the module docstring)."""
    key = _key(team)
    ws = _spaces.get(key)
    if ws is not None and ws.nbytes >= nbytes:
        if _capturing():
            ws.captured = True
        return ws.buf
    if _capturing():
        return _grow_captured(key, ws, nbytes, team)
    n = _core.native().n_pes
    if team is not None and team.n_pes() != n:
        raise SymheapValueError(
            f"the symheap staging workspace of a team of {team.n_pes()} of {n} PEs needs "
            f"{nbytes} bytes and cannot grow on demand (growing allocates on every PE); call "
            "symheap.ops.reserve_workspace(nbytes, team) on every PE first, or pass symmetric "
            "tensors"
        )
    return _grow(key, ws, nbytes).buf


def _grow_captured(key: Tuple[int, Tuple[int, ...], int], ws: Optional[Workspace], nbytes: int, team: Any) -> Any:
    """During capture: a new workspace from heap memory already mapped (no CUDA allocation; a
    capture that would need the heap to grow fails), kept forever; the old one stays too."""
    have = 0 if ws is None else ws.nbytes
    n = _core.native().n_pes
    if team is not None and team.n_pes() != n:
        raise SymheapValueError(
            f"the symheap staging workspace of a team of {team.n_pes()} of {n} PEs on the capturing "
            f"stream holds {have} bytes, the call needs {nbytes}: call symheap.ops.reserve_workspace "
            "on every PE on that stream before capture"
        )
    from . import torch as st

    before = _core.native().heap_usage()["mapped"]
    if before - _core.native().heap_usage()["in_use"] < _round(nbytes) + ALIGN:
        raise SymheapValueError(
            f"the symheap staging workspace of this team and capturing stream holds {have} bytes, the "
            f"call needs {nbytes}, and the heap would have to grow during CUDA graph capture: warm up "
            "by running the same call once on the capture stream before capture, or call "
            "symheap.ops.reserve_workspace there"
        )
    new = Workspace(st.empty(_round(nbytes), dtype=_torch.uint8), captured=True)
    new.retired = [] if ws is None else ws.retired + [ws.buf]
    _spaces[key] = new
    return new.buf


def reserve(nbytes: int, team: Optional[Team] = None) -> None:
    """**Collective** over the world: makes the workspace of ``team`` on the current stream
    hold at least ``nbytes`` (every PE calls it, members of ``team`` or not)."""
    nbytes = _core.index_arg(nbytes, "workspace bytes")
    if _capturing():
        raise SymheapValueError("reserve_workspace cannot run during CUDA graph capture; call it before")
    key = _key(team)
    ws = _spaces.get(key)
    if ws is None or ws.nbytes < nbytes:
        _grow(key, ws, nbytes)


def region(buf: _torch.Tensor, offset: int, like: Any, shape: Any = None) -> _torch.Tensor:
    """A view of ``buf`` at byte ``offset`` with ``like``'s dtype and ``shape`` (default
    ``like``'s)."""
    shape = tuple(like.shape) if shape is None else tuple(shape)
    numel = 1
    for s in shape:
        numel *= int(s)
    nb = numel * like.element_size()
    return buf[offset : offset + nb].view(like.dtype).view(shape)


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN`."""
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def clear() -> None:
    """Forgets every workspace (at finalize; the memory goes with the context)."""
    _spaces.clear()


def usage() -> Dict[str, int]:
    """``{workspaces, bytes, captured}`` of this PE (for tests and diagnostics)."""
    live = [w for k, w in _spaces.items() if k[0] == id(_core.context())] if _core.is_initialized() else []
    return {
        "workspaces": len(live),
        "bytes": sum(w.nbytes for w in live),
        "captured": sum(1 for w in live if w.captured),
    }
