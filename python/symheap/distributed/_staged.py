"""Collectives of a subgroup on ordinary tensors, with no allocation by the members.

symheap's collectives read and write symmetric memory, so an ordinary tensor is copied through
symmetric staging. The world's staging (:mod:`symheap._workspace`) grows on demand, which is
collective over the world; torch runs a subgroup's creator and collectives on its members only,
so a subgroup cannot allocate. Instead the default group's creator (which every rank runs, in
the same order) reserves one symmetric region of ``SLOTS`` slots of ``SLOT`` bytes
(:func:`reserve`; ``SYMHEAP_TDIST_GROUP_SLOTS`` and ``SYMHEAP_TDIST_GROUP_STAGING`` change
them), and each subgroup gets a slot its members agree on at its creation (:func:`take`): the
smallest slot no live subgroup of any member uses, so two groups sharing a rank never share a
slot on it. A subgroup's collectives then run through its slot, in rounds when the tensors are
larger than it. A subgroup made when no slot is free, or without a symheap default group, still
works on symmetric tensors; on ordinary ones its collectives raise
:class:`symheap.SymheapUnsupportedError` naming the call (never a hang).

Every function here is **collective over the subgroup**: every member calls it with the same
sizes (the uneven all_to_all agrees on its rounds first), so every member makes the same rounds.
"""

from __future__ import annotations

import json
import os
import weakref
from typing import Any, Callable, List, Optional, Sequence

import torch as _torch

from .. import _core, ops
from .. import torch as st
from .._core import torch_dtype_name
from .._native import SymheapUnsupportedError, SymheapValueError
from .._workspace import ALIGN, aligned

# Defaults of the reserved region: 8 slots of 1 MiB (a 3-D DeviceMesh takes 3 per rank).
SLOT = 1 << 20
SLOTS = 8
# The smallest slot accepted (bytes): a round of an 8-member group still moves 256 bytes.
MIN_SLOT = 4096

_region: Optional[_torch.Tensor] = None
_slot_bytes = 0
_slots = 0
_ctx: Optional["weakref.ref[Any]"] = None
_used: set = set()
# slot -> (the CUDA stream of its last use, whether that stream was capturing a graph then)
_last_use: dict = {}


def _env(name: str, default: int, least: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise SymheapValueError(f"{name}={raw!r} is not an integer") from None
    if v < least:
        raise SymheapValueError(f"{name}={v} is below the least accepted, {least}")
    return v


def _live() -> bool:
    return _region is not None and _ctx is not None and _core.is_initialized() and _ctx() is _core.context()


def reserve() -> None:
    """**Collective over the world** (the default group's creator): the subgroups' staging region
    of the current context, allocated once."""
    global _region, _slot_bytes, _slots, _ctx, _used
    if _ctx is not None and _core.is_initialized() and _ctx() is _core.context():
        return
    _slot_bytes = _env("SYMHEAP_TDIST_GROUP_STAGING", SLOT, MIN_SLOT)
    _slots = _env("SYMHEAP_TDIST_GROUP_SLOTS", SLOTS, 0)
    _region = st.empty(_slots * _slot_bytes, dtype=_torch.uint8) if _slots else None
    _ctx = weakref.ref(_core.context())
    _used = set()
    _last_use.clear()


def take(exchange: Callable[[bytes], List[bytes]]) -> Optional[int]:
    """**Collective over a new subgroup's members**: the slot they agree on (free on each of
    them), or None when none is free or no region was reserved."""
    mine = sorted(_used) if _live() else None
    seen = [json.loads(b.decode()) for b in exchange(json.dumps(mine).encode())]
    if any(s is None for s in seen):
        return None
    busy = set().union(*map(set, seen))
    for k in range(_slots):
        if k not in busy:
            _used.add(k)
            return k
    return None


def give(slot: Optional[int]) -> None:
    """The group of ``slot`` ended on this member."""
    if slot is not None and _live():
        _used.discard(slot)


def forget_groups() -> None:
    """The default group ended: its subgroups' slots are free (the region stays with the context)."""
    _used.clear()
    _last_use.clear()


def buffer(slot: Optional[int], what: str) -> _torch.Tensor:
    """The symmetric bytes of ``slot``; raises naming ``what`` when the group has none."""
    if slot is None or not _live():
        raise SymheapUnsupportedError(
            f"{what}: this symheap subgroup has no staging slot (the default group is not a symheap group, or all "
            f"{_slots} slots (SYMHEAP_TDIST_GROUP_SLOTS) were taken by live subgroups of its members when it was "
            "made), so it runs collectives on symmetric tensors only"
        )
    assert _region is not None
    if _region.is_cuda:
        _order_streams(slot, _region.device)
    return _region[slot * _slot_bytes : (slot + 1) * _slot_bytes]


def _order_streams(slot: int, device: _torch.device) -> None:
    """Orders the use of ``slot`` that starts now on the current stream after its last use on
    any other stream (FSDP issues a group's all-gathers and reduce-scatters from separate
    streams; both would otherwise write the one slot at once). The host makes calls one after
    another, so the last use is wholly enqueued on its stream by now, and an event recorded
    there now covers it. A capture and eager work are not ordered here: torch synchronises the
    device before a capture starts, and a captured use runs only at replay."""
    cur = _torch.cuda.current_stream(device)
    capturing = _torch.cuda.is_current_stream_capturing()
    prev = _last_use.get(slot)
    if prev is not None and prev[0] != cur and prev[1] == capturing:
        cur.wait_stream(prev[0])
    _last_use[slot] = (cur, capturing)


def flat(t: _torch.Tensor) -> _torch.Tensor:
    """Contiguous ``t`` as a flat view (complex as its real pairs)."""
    if t.dtype.is_complex:
        t = _torch.view_as_real(t)
    return t.reshape(-1)


def as_bytes(t: _torch.Tensor) -> _torch.Tensor:
    """Contiguous ``t``'s bytes as a flat uint8 view."""
    f = flat(t)
    return f.view(_torch.uint8) if f.numel() else f.new_empty((0,), dtype=_torch.uint8)


def _cut(buf: _torch.Tensor, off: int, n: int, dtype: _torch.dtype) -> _torch.Tensor:
    es = _torch.empty(0, dtype=dtype).element_size()
    return buf[off : off + n * es].view(dtype)


def _per(buf: _torch.Tensor, parts: int, es: int) -> int:
    """Elements of ``es`` bytes per part when ``buf`` is cut in ``parts`` aligned parts."""
    b = buf.numel() // parts
    b = b // ALIGN * ALIGN if b >= ALIGN else b
    return max(b // es, 1)


def all_reduce(t: _torch.Tensor, op: str, tid: int, buf: _torch.Tensor) -> None:
    """``t`` (flat, contiguous) reduced in place over the group, ``op`` of symheap."""
    c = _per(buf, 1, t.element_size())
    for off in range(0, t.numel(), c):
        m = min(c, t.numel() - off)
        r = _cut(buf, 0, m, t.dtype)
        r.copy_(t[off : off + m])
        ops.all_reduce_(r, op, tid)
        t[off : off + m].copy_(r)


def all_gather(out: _torch.Tensor, inp: _torch.Tensor, n: int, tid: int, buf: _torch.Tensor) -> None:
    """Bytes ``inp`` (k) of every member into bytes ``out`` (n * k) in member order."""
    k = inp.numel()
    c = _per(buf, n + 1, 1)
    at = aligned(c) if aligned(c) + n * c <= buf.numel() else c
    grid = out.view(n, k)
    for off in range(0, k, c):
        m = min(c, k - off)
        s, d = buf[:m], buf[at : at + n * m]
        s.copy_(inp[off : off + m])
        ops.all_gather(s, tid, out=d)
        grid[:, off : off + m].copy_(d.view(n, m))


def reduce_scatter(out: _torch.Tensor, inp: _torch.Tensor, op: str, n: int, tid: int, buf: _torch.Tensor) -> None:
    """Flat ``inp`` (n * k elements) reduced over the group; this member's k into flat ``out``."""
    k, es = out.numel(), out.element_size()
    c = _per(buf, n + 1, es)
    at = aligned(n * c * es) if aligned(n * c * es) + c * es <= buf.numel() else n * c * es
    grid = inp.view(n, k)
    for off in range(0, k, c):
        m = min(c, k - off)
        s, d = _cut(buf, 0, n * m, out.dtype), _cut(buf, at, m, out.dtype)
        s.view(n, m).copy_(grid[:, off : off + m])
        ops.reduce_scatter(s, op, tid, out=d)
        out[off : off + m].copy_(d)


def broadcast(t: _torch.Tensor, root: int, tid: int, buf: _torch.Tensor) -> None:
    """Bytes ``t`` of group rank ``root`` on every member."""
    c = buf.numel()
    for off in range(0, t.numel(), c):
        m = min(c, t.numel() - off)
        r = buf[:m]
        r.copy_(t[off : off + m])
        ops.broadcast_(r, root, tid)
        t[off : off + m].copy_(r)


def _offsets(sizes: Sequence[int]) -> List[int]:
    at, out = 0, []
    for s in sizes:
        out.append(at)
        at += s
    return out


def _longest(nat: Any, team: Any, mine: int, tid: int, buf: _torch.Tensor) -> int:
    """The largest of the members' ``mine``: met on the host; a team spanning nodes (its
    members share no memory to meet in) reduces it on the device and reads it back."""
    try:
        return int(nat.team_max(team, mine))
    except SymheapUnsupportedError:
        top = _torch.tensor([mine], dtype=_torch.int64, device=buf.device)
        all_reduce(top, "max", tid, buf)
        return int(top.item())


def alltoallv(
    out: _torch.Tensor, inp: _torch.Tensor, osplit: Sequence[int], isplit: Sequence[int], tid: int, buf: _torch.Tensor
) -> None:
    """Uneven all_to_all of bytes: ``isplit[j]`` bytes of ``inp`` to member j, ``osplit[j]``
    bytes from member j into ``out``, in rounds of at most a slot part per peer: the members
    agree on the number of rounds (the largest split of any member) first, on the host (no
    device work, so no stream sync, and a CUDA graph capture can take the call)."""
    n = len(isplit)
    nat = _core.native()
    team = ops._team(tid)
    longest = _longest(nat, team, max([*isplit, *osplit, 0]), tid, buf)
    c = _per(buf, 2 * n, 1)
    at = n * c
    ioff, ooff = _offsets(isplit), _offsets(osplit)
    stream = _core.device_stream(buf.get_device() if buf.is_cuda else None, None)
    dtype = torch_dtype_name(_torch.uint8)
    for base in range(0, longest, c):
        send = [max(0, min(c, s - base)) for s in isplit]
        recv = [max(0, min(c, s - base)) for s in osplit]
        p = at
        for j in range(n):
            buf[p : p + send[j]].copy_(inp[ioff[j] + base : ioff[j] + base + send[j]])
            p += send[j]
        ptr = buf.data_ptr()
        nat.collective("alltoall", team, ptr, ptr + at, 1, dtype, stream, send_counts=send, recv_counts=recv)
        p = 0
        for j in range(n):
            out[ooff[j] + base : ooff[j] + base + recv[j]].copy_(buf[p : p + recv[j]])
            p += recv[j]
