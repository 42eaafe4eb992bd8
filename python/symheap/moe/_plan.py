"""The routing plans of :mod:`symheap.moe`: which rows go where, computed with torch ops on the
tokens' device, with static shapes (no host synchronisation unless the caller asks for exact
output sizes), so that a decode step captures in a CUDA graph.

A plan is a list of row moves ``(src_row, dst_pe, dst_row)``, ``-1`` in ``src_row`` or
``dst_row`` meaning "no move"; :mod:`symheap.moe` carries it out with a Triton kernel on CUDA
(stores to the translated peer address) and with indexed copies into the peers' mapped copies
on the host backend. Both backends run these same functions, so CI checks the plans the GPU
kernels follow.

Layouts (``P`` PEs, ``L`` local experts per PE, ``T`` tokens here, ``Tmax`` the buffer's bound,
``K`` top-k; the symmetric buffers are double-buffered by the parity of a device-side call
counter, so back-to-back calls, graph replays included, never overwrite a slot a peer still
reads):

* stage ``[2][P][Tmax]`` rows on every receiver: row ``(parity, s, i)`` holds the ``i``-th token
  PE ``s`` sent here (tokens in ascending token order), once per receiving PE however many of
  its experts live there; ``meta`` rows alongside: ``K`` localized expert ids (``-1`` for
  experts elsewhere), ``K`` weights (float32 bits), the sender's token index.
* counts ``[2][P]`` (int32) on every receiver: how many tokens PE ``s`` sent.
* receive layout, expert-major: local expert ``e``'s rows first come from PE 0 (token order),
  then PE 1, ...; the low-latency layout gives each expert a fixed ``cap = align(P * Tmax)``
  rows, the normal layout packs the experts at offsets aligned to ``align`` rows.
* combine ``[2][Tmax * K]`` rows on every token's home PE: row ``t * K + k`` receives the output
  of the expert in slot ``k`` of token ``t``, written by the PE that owns that expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch as _torch


def align_up(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass
class SendPlan:
    """What a dispatch sends from this PE (rows of ``T * P`` moves, token-major)."""

    src_tok: _torch.Tensor  # [T*P] int64: token row of x
    src_meta: _torch.Tensor  # [T*P] int64: row of `meta`
    dst_pe: _torch.Tensor  # [T*P] int64
    dst_row: _torch.Tensor  # [T*P] int64: stage row on dst_pe, -1 when not sent
    meta: _torch.Tensor  # [T*P, 2K+1] int32
    counts: _torch.Tensor  # [P, 1] int32: tokens for each PE
    count_row: _torch.Tensor  # [P] int64: this PE's counts row on every PE
    routed: _torch.Tensor  # [T, K] bool: slot k of token t names a real expert


def routed_mask(topk_idx: _torch.Tensor, num_experts: int) -> _torch.Tensor:
    """Slots naming an expert in ``[0, num_experts)`` for the first time in their token's row;
    ``-1``, a repeat of an earlier slot's expert (and, unchecked, anything out of range) is not
    routed."""
    k = topk_idx.shape[1]
    ok = (topk_idx >= 0) & (topk_idx < num_experts)
    same = topk_idx[:, :, None] == topk_idx[:, None, :]  # [T, K, K]
    earlier = _torch.ones((k, k), dtype=_torch.bool, device=topk_idx.device).tril(-1)
    return ok & ~(same & earlier & ok[:, None, :]).any(2)


def send_plan(
    topk_idx: _torch.Tensor,
    topk_weights: _torch.Tensor,
    n_pes: int,
    local_experts: int,
    me: int,
    tmax: int,
    parity: _torch.Tensor,
) -> SendPlan:
    """The dispatch moves of this PE's ``T`` tokens. ``parity``: a 1-element int64 tensor."""
    dev = topk_idx.device
    t, k = topk_idx.shape
    p, lx = n_pes, local_experts
    routed = routed_mask(topk_idx, p * lx)
    owner = _torch.where(routed, _torch.div(topk_idx, lx, rounding_mode="floor"), -1)  # [T, K]
    pes = _torch.arange(p, device=dev, dtype=_torch.int64)
    at = owner[:, None, :] == pes[None, :, None]  # [T, P, K]
    mask = at.any(2)  # [T, P]
    slot = mask.to(_torch.int64).cumsum(0) - 1
    base = (parity * p + me) * tmax  # [1]; this PE's rows in every receiver's stage
    dst_row = _torch.where(mask, base + slot, -1).reshape(-1)
    loc = _torch.where(at, topk_idx[:, None, :] - pes[None, :, None] * lx, -1).to(_torch.int32)
    wbits = topk_weights.to(_torch.float32).contiguous().view(_torch.int32)
    toks = _torch.arange(t, device=dev, dtype=_torch.int32)
    meta = _torch.cat([loc, wbits[:, None, :].expand(t, p, k), toks[:, None, None].expand(t, p, 1)], dim=2).reshape(
        t * p, 2 * k + 1
    )
    return SendPlan(
        src_tok=_torch.arange(t, device=dev, dtype=_torch.int64).repeat_interleave(p),
        src_meta=_torch.arange(t * p, device=dev, dtype=_torch.int64),
        dst_pe=pes.repeat(t),
        dst_row=dst_row,
        meta=meta,
        counts=mask.sum(0).to(_torch.int32).reshape(p, 1),
        count_row=(parity * p + me).expand(p).contiguous(),
        routed=routed,
    )


@dataclass
class RecvPlan:
    """Where the received rows go in the expert-major layout (one entry per output row)."""

    src_row: _torch.Tensor  # [rows] int64: stage row (flat over parities), -1 for padding
    recv_idx: _torch.Tensor  # [rows, K] int64: localized expert ids, -1 elsewhere / padding
    recv_w: _torch.Tensor  # [rows, K] float32
    num_recv: _torch.Tensor  # [L] int32: rows of each local expert
    comb_pe: _torch.Tensor  # [rows] int64: home PE of the row's token, -1 for padding
    comb_row: _torch.Tensor  # [rows] int64: t * K + k on that PE, -1 for padding
    rows_per_expert: Optional[int]  # cap of the low-latency layout; None when packed


def recv_plan(
    stage_meta: _torch.Tensor,
    counts: _torch.Tensor,
    parity: _torch.Tensor,
    n_pes: int,
    local_experts: int,
    tmax: int,
    topk: int,
    align: int,
    low_latency: bool,
) -> RecvPlan:
    """The layout of what arrived. ``stage_meta``: ``[2*P*Tmax, 2K+1]`` int32 (this PE's copy);
    ``counts``: ``[P]``, what each PE sent in this call (negative: nothing). The normal layout
    reads the per-expert totals on the host once (its output size depends on them)."""
    dev = stage_meta.device
    p, lx, k = n_pes, local_experts, topk
    meta = stage_meta.view(2, p * tmax, 2 * k + 1).index_select(0, parity)[0]  # [P*Tmax, 2K+1]
    cnt = counts.to(_torch.int64).clamp(min=0)
    i = _torch.arange(tmax, device=dev, dtype=_torch.int64)
    arrived = (i[None, :] < cnt[:, None]).reshape(p * tmax)  # [P*Tmax]
    loc = meta[:, :k].to(_torch.int64)
    es = _torch.arange(lx, device=dev, dtype=_torch.int64)
    hit = ((loc[None, :, :] == es[:, None, None]).any(2)) & arrived[None, :]  # [L, P*Tmax]
    pos = hit.to(_torch.int64).cumsum(1) - 1
    num = hit.sum(1)
    if low_latency:
        cap = align_up(p * tmax, align)
        start = es * cap
        rows = lx * cap
    else:
        padded = _torch.div(num + align - 1, align, rounding_mode="floor") * align
        start = padded.cumsum(0) - padded
        rows = int(padded.sum().item())  # the one host synchronisation of the normal mode
        cap = None
    dst = _torch.where(hit, start[:, None] + pos, rows)  # [L, P*Tmax]; `rows` = discarded
    j = _torch.arange(p * tmax, device=dev, dtype=_torch.int64)
    stage_row = (parity * p * tmax + j).expand(lx, p * tmax)
    src_row = _torch.full((rows + 1,), -1, dtype=_torch.int64, device=dev)
    src_row.scatter_(0, dst.reshape(-1), stage_row.reshape(-1))
    src_row = src_row[:rows]
    local_j = _torch.full((rows + 1,), -1, dtype=_torch.int64, device=dev)
    local_j.scatter_(0, dst.reshape(-1), j.expand(lx, p * tmax).reshape(-1))
    local_j = local_j[:rows]
    have = local_j >= 0
    rmeta = meta.index_select(0, local_j.clamp(min=0))  # [rows, 2K+1]
    ridx = _torch.where(have[:, None], rmeta[:, :k].to(_torch.int64), -1)
    rw = _torch.where(have[:, None], rmeta[:, k : 2 * k].contiguous().view(_torch.float32), 0.0)
    expert_of_row = _torch.full((rows + 1,), -1, dtype=_torch.int64, device=dev)
    expert_of_row.scatter_(0, dst.reshape(-1), es[:, None].expand(lx, p * tmax).reshape(-1))
    expert_of_row = expert_of_row[:rows]
    kpos = (ridx == expert_of_row[:, None]).to(_torch.int32).argmax(1)
    tok = rmeta[:, 2 * k].to(_torch.int64)
    return RecvPlan(
        src_row=src_row,
        recv_idx=ridx,
        recv_w=rw,
        num_recv=num.to(_torch.int32),
        comb_pe=_torch.where(have, _torch.div(local_j, tmax, rounding_mode="floor"), -1),
        comb_row=_torch.where(have, tok * k + kpos, -1),
        rows_per_expert=cap,
    )


def combine_rows(comb_pe: _torch.Tensor, comb_row: _torch.Tensor, parity: _torch.Tensor, slots: int) -> _torch.Tensor:
    """The combine buffer row each expert-output row goes to (``-1``: none), with the parity
    offset of this call (``slots = Tmax * K`` rows per parity)."""
    return _torch.where(comb_pe >= 0, parity * slots + comb_row, -1)


def weighted_sum(
    comb: _torch.Tensor,
    parity: _torch.Tensor,
    routed: _torch.Tensor,
    weights: _torch.Tensor,
    slots: int,
    out_dtype: _torch.dtype,
) -> _torch.Tensor:
    """``x_out[t] = sum over k of weights[t, k] * y(t, k)``, in fp32, ``k`` ascending (a fixed
    order: deterministic). ``comb``: ``[2*slots, H]`` this PE's combine rows; slots that route
    to no expert contribute nothing (their rows were never written: ``where``, not a product
    with 0, so a stale NaN there cannot leak)."""
    t, k = routed.shape
    h = comb.shape[1]
    cb = comb.view(2, slots, h).index_select(0, parity)[0][: t * k].view(t, k, h)
    w = weights.to(_torch.float32)
    acc = _torch.zeros((t, h), dtype=_torch.float32, device=comb.device)
    for j in range(k):
        term = w[:, j, None] * cb[:, j].to(_torch.float32)
        acc = acc + _torch.where(routed[:, j, None], term, 0.0)
    return acc.to(out_dtype)


def quantize_fp8(x: _torch.Tensor, block: int = 128) -> Tuple[_torch.Tensor, _torch.Tensor]:
    """Per-``block``-element e4m3 quantization (DeepEP's layout): ``(q [T, H] float8_e4m3fn,
    scales [T, H/block] float32)`` with ``x ≈ q * scale``; a block of zeros gets scale 1.

    The same bytes and scales on every device: the scale is ``amax`` times the float32 of
    ``1/448``, because torch's CUDA division by a scalar multiplies by its reciprocal while the
    CPU divides (the two differ in about 60% of the scales of random rows)."""
    t, h = x.shape
    xb = x.to(_torch.float32).view(t, h // block, block)
    amax = xb.abs().amax(2)
    scale = _torch.where(amax > 0, amax * (1.0 / 448.0), 1.0)
    q = (xb / scale[:, :, None]).clamp(-448.0, 448.0).to(_torch.float8_e4m3fn).view(t, h)
    return q, scale


def dequantize_fp8(q: _torch.Tensor, scales: _torch.Tensor, block: int = 128) -> _torch.Tensor:
    """``q * scale`` per block, float32."""
    shape = q.shape
    h = shape[-1]
    qf = q.to(_torch.float32).reshape(-1, h // block, block)
    return (qf * scales.reshape(-1, h // block, 1)).reshape(shape)
