"""The Triton kernels of :mod:`symheap.moe` (the CUDA backend's path): the routing plans of
:mod:`symheap.moe._plan` computed in one program each, the row moves into peers' symmetric
buffers with SM stores (NVLink for a peer GPU), and the weighted sum of the combine.

A low-latency dispatch is five launches and a barrier, a combine two and a barrier (the torch
ops of :mod:`symheap.moe._plan` would be some seventy small launches: in a CUDA graph each still
costs its launch, which is what a decode step cannot afford):

* ``send_plan_kernel`` (one program): reads the call counter (its parity picks the staging half,
  and it advances it), and for this PE's tokens in chunks of ``BT``: which PEs each token goes
  to (the first slot naming an expert counts; ids outside ``[0, E)`` do not route), the token's
  row in each receiver's staging (a prefix sum over tokens: ascending token order), the meta
  rows (localized ids, weight bits, token index), the counts, the routed mask, the bad-id flag.
* ``move_rows_kernel`` (a program per plan entry): row ``src_rows[n]`` to row ``dst_rows[n]``
  of PE ``dst_pes[n]``'s copy of the symmetric ``dst`` (16-byte stores to the translated
  address), nothing when either is ``-1``; the tokens, the meta rows and the counts of a
  dispatch, the expert outputs of a combine (``PAR_STRIDE``: the parity offset added there),
  and with ``GATHER`` the local gather into the expert-major output.
* ``recv_plan_kernel`` (a program per local expert): which staged rows name the expert, in
  (source PE, token) order, and where they go: the source row, the row's ids and weights, the
  combine destination; padding rows get ``-1`` / ``0``. ``COUNT_ONLY`` counts (the normal
  mode's exact sizing reads the counts on the host, then places).
* ``combine_sum_kernel`` (a program per token and column block): ``sum over routed k of
  w[t, k] * y(t, k)`` in fp32, ``k`` ascending, rounded once.

The kernels take no size that changes between calls as a loop bound (token counts are masked
against the buffer's ``TMAX``), so a captured graph replays with new counts, and Triton's
interpreter runs them on CPU tensors (``TRITON_INTERPRET=1``; CI runs the host backend through
them that way: ``SYMHEAP_MOE_TRITON=1``).

Why SM stores and not the copy engine: the rows and their destinations are known only on the
device, and a copy-engine copy is fixed by the host when it is enqueued (or captured).
Completion: each kernel ends before the stream-ordered barrier that follows it in
:mod:`symheap.moe`, which makes its stores visible to every PE.
"""

# No "from __future__ import annotations": Triton reads the tl.constexpr annotations.
import torch as _torch

try:
    import triton
    import triton.language as tl
except ImportError as _e:  # say which extra installs it
    from .._requires import reraise

    reraise(_e, "triton", "symheap.moe")

from .. import triton as sh

BLOCK = 1024


@triton.jit
def send_plan_kernel(
    idx,
    w,
    ctr,
    par_out,
    dst_row,
    meta,
    routed,
    bad_routing,
    stage_counts,
    bases,
    n_tok,
    me,
    n_experts,
    lx,
    P: tl.constexpr,
    K: tl.constexpr,
    TMAX: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    PP: tl.constexpr,
    CHECK: tl.constexpr,
):
    """One program. ``dst_row``: ``[T, P]``; ``meta``: ``[T, P, 2K+1]`` int32; ``routed``:
    ``[T, K]`` int8; ``bad_routing``: 1 int32 (sticky: 1 once an id outside ``[-1, E)`` was
    passed); ``ctr``: the dispatch counter (read first, advanced last); ``par_out``: its parity
    before the advance, for the receive side. The counts go straight to every PE's
    ``stage_counts[par * P + me]`` (the symmetric ``[2*P]`` int32). ``CHECK``: a PE with a bad
    id sends nothing and a count of -1, so that every PE can raise alike."""
    c = tl.load(ctr)
    par = c % 2
    tl.store(par_out, par)
    base = (par * P + me) * TMAX
    pes = tl.arange(0, PP)
    ks = tl.arange(0, KP)
    km = ks < K
    carry = tl.zeros([PP], dtype=tl.int64)
    seen_bad = tl.zeros([BT, KP], dtype=tl.int32)
    for t0 in range(0, TMAX, BT):
        t = t0 + tl.arange(0, BT)
        m2 = (t < n_tok)[:, None] & km[None, :]
        ids = tl.load(idx + t[:, None] * K + ks[None, :], mask=m2, other=-1)
        seen_bad = tl.maximum(seen_bad, (m2 & ((ids < -1) | (ids >= n_experts))).to(tl.int32))
    b = tl.max(tl.max(seen_bad, axis=1), axis=0)
    tl.store(bad_routing, tl.maximum(tl.load(bad_routing), b))
    if CHECK:
        live = b == 0
    else:
        live = b >= 0  # always
    for t0 in range(0, TMAX, BT):
        t = t0 + tl.arange(0, BT)
        tm = t < n_tok
        m2 = tm[:, None] & km[None, :]
        ids = tl.load(idx + t[:, None] * K + ks[None, :], mask=m2, other=-1)
        ok = m2 & (ids >= 0) & (ids < n_experts)
        earlier = ks[None, None, :] < ks[None, :, None]
        same = (ids[:, :, None] == ids[:, None, :]) & earlier & ok[:, None, :]
        rt = ok & (tl.max(same.to(tl.int32), axis=2) == 0)
        tl.store(routed + t[:, None] * K + ks[None, :], rt.to(tl.int8), mask=m2)
        owner = tl.where(rt, ids // lx, -1)
        at = owner[:, None, :] == pes[None, :, None]  # [BT, PP, KP]
        mask = (tl.max(at.to(tl.int32), axis=2) > 0) & (pes[None, :] < P) & live  # [BT, PP]
        inc = tl.cumsum(mask.to(tl.int64), axis=0)
        drow = tl.where(mask, base + carry[None, :] + inc - 1, -1)
        pm = tm[:, None] & (pes[None, :] < P)
        tl.store(dst_row + t[:, None] * P + pes[None, :], drow, mask=pm)
        carry += tl.sum(mask.to(tl.int64), axis=0)
        row = (t[:, None] * P + pes[None, :]) * (2 * K + 1)  # [BT, PP]
        loc = tl.where(at, ids[:, None, :] - pes[None, :, None] * lx, -1).to(tl.int32)
        m3 = pm[:, :, None] & km[None, None, :]
        tl.store(meta + row[:, :, None] + ks[None, None, :], loc, mask=m3)
        wv = tl.load(w + t[:, None] * K + ks[None, :], mask=m2, other=0.0).to(tl.int32, bitcast=True)
        wb = tl.broadcast_to(wv[:, None, :], (BT, PP, KP))
        tl.store(meta + row[:, :, None] + K + ks[None, None, :], wb, mask=m3)
        tok = tl.broadcast_to(t[:, None], (BT, PP)).to(tl.int32)
        tl.store(meta + row + 2 * K, tok, mask=pm)
    cnt = tl.where(live, carry, -1).to(tl.int32)
    dst = tl.broadcast_to(stage_counts + par * P + me, (PP,))
    # Lanes past P (P not a power of two) are masked, and their table index clamped so the
    # translation does not read past the table either.
    to = tl.where(pes < P, pes, 0)
    sh.store(dst, cnt, me, to, bases, mask=pes < P)
    # Every warp read the counter before any advances it (warps run independently: one that
    # stored early would hand a late one the other parity).
    tl.debug_barrier()
    tl.store(ctr, c + 1)


@triton.jit
def move_rows_kernel(
    src,
    dst,
    src_rows,
    dst_pes,
    dst_rows,
    src_stride,
    dst_stride,
    bases,
    me,
    ctr,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
    VEC: tl.constexpr,
    HINT: tl.constexpr,
    GATHER: tl.constexpr,
    SRC_DIV: tl.constexpr,
    PE_MOD: tl.constexpr,
    PAR_STRIDE: tl.constexpr,
):
    """Entry ``program_id(0)`` of the plan; ``ROW``: elements per row (a constant: one
    compilation per row width, the loop unrolled). ``VEC``: elements per 16 bytes when every
    row start is 16-byte aligned, else 1; ``HINT``: 16 then (the translated block is 16-byte
    aligned and contiguous, so the peer stores are 16-byte vectors: see :mod:`symheap.triton`),
    else 0. ``GATHER``: destination row ``n`` on this PE (``dst_pes``/``dst_rows`` unused).
    ``SRC_DIV`` > 0: source row ``n // SRC_DIV`` (``src_rows`` unused); ``PE_MOD`` > 0:
    destination PE ``n % PE_MOD`` (``dst_pes`` unused); ``PAR_STRIDE`` > 0: ``(ctr % 2) *
    PAR_STRIDE`` is added to every destination row."""
    n = tl.program_id(0).to(tl.int64)
    if SRC_DIV > 0:
        sr = n // SRC_DIV
    else:
        sr = tl.load(src_rows + n)
    if GATHER:
        dr = n
        pe = me
    else:
        dr = tl.load(dst_rows + n)
        if PE_MOD > 0:
            pe = (n % PE_MOD).to(tl.int32)
        else:
            pe = tl.load(dst_pes + n).to(tl.int32)
    if (sr >= 0) & (dr >= 0):
        if PAR_STRIDE > 0:
            dr = dr + (tl.load(ctr) % 2) * PAR_STRIDE
        s = src + tl.multiple_of(sr * src_stride, VEC)
        d = dst + tl.multiple_of(dr * dst_stride, VEC)
        for c in tl.static_range(0, ROW, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            m = offs < ROW
            v = tl.load(s + offs, mask=m)
            if HINT > 0:
                sh.store(d + offs, v, me, pe, bases, mask=m, hint=HINT)
            else:
                sh.store(d + offs, v, me, pe, bases, mask=m)


@triton.jit
def recv_plan_kernel(
    meta,
    counts,
    par_ptr,
    start,
    length,
    src_row,
    recv_idx,
    recv_w,
    comb_pe,
    comb_row,
    num,
    P: tl.constexpr,
    K: tl.constexpr,
    TMAX: tl.constexpr,
    CAP: tl.constexpr,
    BJ: tl.constexpr,
    KP: tl.constexpr,
    PP: tl.constexpr,
    COUNT_ONLY: tl.constexpr,
):
    """Program ``e``: local expert ``e``'s rows. ``meta``: the staging meta ``[2*P*TMAX,
    2K+1]``; ``counts``: ``[2*P]``; ``start``/``length``: its rows in the output (unused with
    ``COUNT_ONLY``); ``num``: ``[L]`` int32 out."""
    e = tl.program_id(0)
    par = tl.load(par_ptr)
    ks = tl.arange(0, KP)
    km = ks < K
    carry = tl.zeros([], dtype=tl.int64)
    if COUNT_ONLY:
        r0 = 0
    else:
        r0 = tl.load(start + e)
    for j0 in range(0, P * TMAX, BJ):
        j = j0 + tl.arange(0, BJ)
        jm = j < P * TMAX
        s = j // TMAX
        cnt = tl.load(counts + par * P + s, mask=jm, other=0)
        arrived = jm & ((j % TMAX) < cnt)
        mrow = (par * P * TMAX + j) * (2 * K + 1)
        m2 = arrived[:, None] & km[None, :]
        loc = tl.load(meta + mrow[:, None] + ks[None, :], mask=m2, other=-1)
        hitk = loc == e
        hit = arrived & (tl.max(hitk.to(tl.int32), axis=1) > 0)
        pos = carry + tl.cumsum(hit.to(tl.int64), axis=0) - 1
        if not COUNT_ONLY:
            r = r0 + pos
            tl.store(src_row + r, par * P * TMAX + j, mask=hit)
            hm = hit[:, None] & km[None, :]
            tl.store(recv_idx + r[:, None] * K + ks[None, :], loc.to(tl.int64), mask=hm)
            wb = tl.load(meta + mrow[:, None] + K + ks[None, :], mask=m2, other=0)
            tl.store(recv_w + r[:, None] * K + ks[None, :], wb.to(tl.float32, bitcast=True), mask=hm)
            kpos = tl.min(tl.where(hitk, ks[None, :], KP), axis=1)
            tok = tl.load(meta + mrow + 2 * K, mask=arrived, other=0).to(tl.int64)
            tl.store(comb_pe + r, s.to(tl.int64), mask=hit)
            tl.store(comb_row + r, tok * K + kpos, mask=hit)
        carry += tl.sum(hit.to(tl.int64), axis=0)
    tl.store(num + e, carry.to(tl.int32))
    if not COUNT_ONLY:
        ln = tl.load(length + e)
        for q0 in range(0, CAP, BJ):
            q = q0 + tl.arange(0, BJ)
            pad = (q >= carry) & (q < ln)
            r = r0 + q
            tl.store(src_row + r, -1, mask=pad)
            tl.store(comb_pe + r, -1, mask=pad)
            tl.store(comb_row + r, -1, mask=pad)
            pm = pad[:, None] & km[None, :]
            tl.store(recv_idx + r[:, None] * K + ks[None, :], tl.full([BJ, KP], -1, tl.int64), mask=pm)
            tl.store(recv_w + r[:, None] * K + ks[None, :], tl.zeros([BJ, KP], tl.float32), mask=pm)


@triton.jit
def combine_sum_kernel(
    comb,
    ctr,
    routed,
    w,
    out,
    n_tok,
    hidden,
    SLOTS: tl.constexpr,
    K: tl.constexpr,
    BH: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    """Program ``(t, c)``: columns ``c*BH ..`` of token ``t``; ``ctr``: the combine counter
    already advanced (the rows are in parity ``(ctr - 1) % 2``)."""
    t = tl.program_id(0)
    col = tl.program_id(1) * BH + tl.arange(0, BH)
    cm = col < hidden
    par = (tl.load(ctr) - 1) % 2
    acc = tl.zeros([BH], dtype=tl.float32)
    for k in tl.static_range(K):
        r = tl.load(routed + t * K + k)
        if r != 0:
            wk = tl.load(w + t * K + k)
            row = par * SLOTS + t * K + k
            y = tl.load(comb + row * hidden + col, mask=cm, other=0.0).to(tl.float32)
            acc += wk * y
    if OUT_BF16:
        res = _bf16_rtne(acc)
    else:
        res = acc.to(out.dtype.element_ty)
    # The token test as a block, not a scalar: Triton 3.9's interpreter refuses a block mask
    # and-ed with a scalar ("mask has unsupported dtype"); compiled code is the same either way.
    tl.store(out + t * hidden + col, res, mask=cm & (tl.full([BH], t, tl.int32) < n_tok))


@triton.jit
def _bf16_rtne(x):
    """float32 to bfloat16, rounded to nearest even by hand: the same bits as torch's
    conversion everywhere (Triton's interpreter truncates), NaN kept NaN."""
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.int16).to(tl.bfloat16, bitcast=True)


# ---- launchers ---------------------------------------------------------------------------------


def _p2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def send_plan(
    idx, w, ctr, par, dst_row, meta, routed, bad_routing, stage_counts, bases, me, n_experts, lx, p, k, tmax, check
) -> None:
    """Launches :func:`send_plan_kernel` (one program) on the current stream."""
    kp, pp = _p2(k), _p2(p)
    bt = max(1, min(_p2(tmax), 4096 // (kp * max(kp, pp))))
    send_plan_kernel[(1,)](
        idx, w, ctr, par, dst_row, meta, routed, bad_routing, stage_counts, bases, idx.shape[0], me, n_experts, lx,
        P=p, K=k, TMAX=tmax, BT=bt, KP=kp, PP=pp, CHECK=check, num_warps=4,
    )  # fmt: skip


def move_rows(
    src, dst, bases, me, *, src_rows=None, dst_pes=None, dst_rows=None, n=None, gather=False, src_div=0, pe_mod=0,
    ctr=None, par_stride=0,
) -> None:  # fmt: skip
    """Launches ``n`` entries of a plan on the current stream (``n``: the length of the first
    index tensor given, or explicit). ``src``: ``[*, W]`` rows; ``dst``: this PE's copy of a
    symmetric ``[*, W]`` tensor of the same dtype (any tensor with ``gather``), both with unit
    inner stride. Index tensors left out are not read (see :func:`move_rows_kernel`'s modes)."""
    if n is None:
        n = next(int(t.numel()) for t in (src_rows, dst_rows, dst_pes) if t is not None)
    if n == 0:
        return
    w = int(src.shape[1])
    esize = src.element_size()
    block = min(BLOCK, _p2(w))
    aligned = all(t.data_ptr() % 16 == 0 and (t.stride(0) * esize) % 16 == 0 for t in (src, dst))
    aligned = aligned and (w * esize) % 16 == 0
    dummy = bases
    move_rows_kernel[(n,)](
        src, dst, dummy if src_rows is None else src_rows, dummy if dst_pes is None else dst_pes,
        dummy if dst_rows is None else dst_rows, src.stride(0), dst.stride(0), bases, me,
        dummy if ctr is None else ctr, ROW=w, BLOCK=block, VEC=16 // esize if aligned else 1,
        HINT=16 if aligned and block >= 16 else 0, GATHER=gather, SRC_DIV=src_div, PE_MOD=pe_mod,
        PAR_STRIDE=par_stride, num_warps=4,
    )  # fmt: skip


def recv_plan(meta, counts, par, start, length, outs, num, p, k, tmax, cap, lx, count_only) -> None:
    """Launches :func:`recv_plan_kernel` (a program per local expert). ``outs``: ``(src_row,
    recv_idx, recv_w, comb_pe, comb_row)`` (ignored with ``count_only``)."""
    kp, pp = _p2(k), _p2(p)
    bj = max(16, min(_p2(p * tmax), 2048 // kp))
    recv_plan_kernel[(lx,)](
        meta, counts, par, start, length, *outs, num, P=p, K=k, TMAX=tmax, CAP=cap, BJ=bj, KP=kp, PP=pp,
        COUNT_ONLY=count_only, num_warps=4,
    )  # fmt: skip


def combine_sum(comb, ctr, routed, w, out, slots, k) -> None:
    """Launches :func:`combine_sum_kernel` over ``out``'s tokens and columns."""
    t, h = out.shape
    if t == 0:
        return
    bh = min(1024, _p2(h))
    combine_sum_kernel[(t, triton.cdiv(h, bh))](
        comb, ctr, routed, w, out, t, h, SLOTS=slots, K=k, BH=bh, OUT_BF16=out.dtype == _torch.bfloat16, num_warps=4
    )


def empty_plan_outputs(rows: int, k: int, dev: _torch.device):
    """The receive plan's output tensors (every row written by the kernel)."""
    i64 = _torch.int64
    return (
        _torch.empty(rows, dtype=i64, device=dev),
        _torch.empty(rows, k, dtype=i64, device=dev),
        _torch.empty(rows, k, dtype=_torch.float32, device=dev),
        _torch.empty(rows, dtype=i64, device=dev),
        _torch.empty(rows, dtype=i64, device=dev),
    )
