"""The Triton kernel of :mod:`symheap.fused`: one-shot push all_reduce + residual + RMSNorm.

Imported only on the CUDA backend (it needs Triton); :mod:`symheap.fused` holds the public
function, the workspace and the host-backend path.

Design (one kernel per PE per call, on the caller's stream)
    Grid: ``G = min(tokens, n_sms)`` CTAs (every CTA is resident at once, so the cross-PE waits
    below cannot starve a CTA that has not been scheduled); CTA ``i`` owns rows ``i, i+G, ...``
    on every PE (all PEs launch the same grid because they make the same call).

    1. **push**: CTA ``i`` loads each of its rows of ``x`` (ordinary memory) and stores it into
       slot ``[parity][me]`` of the symmetric staging buffer of **every** PE (its own included,
       so later it reads all PEs' rows the same way, in PE order; every PE then sums in the same
       order and gets bit-identical ``residual_out``). 16-byte vector stores (``hint=16``).
    2. **flag**: a CTA barrier, then one release store at system scope of ``epoch`` into each
       PE's flag word ``flags[i][me]`` (:func:`symheap.triton.signal_set`).
    3. **wait**: every thread polls ``flags[i][pe] >= epoch`` for every PE with acquire loads at
       system scope (bounded by ``SYMHEAP_TIMEOUT``; a peer that never arrives traps the kernel,
       which surfaces as a CUDA error at the next synchronisation instead of a hang).
    4. **reduce + norm**: per row, the fp32 sum over PEs of the staged rows (volatile loads: they
       must not be hoisted above the acquire), ``+ residual`` in fp32, rounded once to the
       output dtype → ``residual_out``; RMS of the rounded row (a block reduction over the whole
       row held in registers, ``BLOCK = next_pow2(hidden)``), ``* rsqrt(ms + eps) * weight``,
       written as the input dtype or as FP8 e4m3 (``/ scale``, saturated to ±448).
    5. **epoch**: the last CTA to finish (an arrival counter) stores ``epoch`` into the PE's own
       device-side counter and resets the arrival counter. The next launch reads it and uses
       ``epoch + 1``. The epoch therefore lives on the device and advances on every launch,
       eager or replayed from a CUDA graph (no host argument is baked into a graph).

    Flags hold the epoch of their last write, which only grows, so they are never reset and a
    stale flag (an older epoch) never satisfies the wait.

Reuse hazard (why double buffering by epoch parity is enough)
    Launch ``e`` stages into parity ``e & 1``. A PE ``A`` writes parity ``p`` again only at
    launch ``e + 2``. It starts ``e + 2`` after its launch ``e + 1`` completed, and every CTA of
    ``e + 1`` passed its wait on PE ``B``'s flag of epoch ``e + 1``; ``B`` writes that flag only
    inside its own launch ``e + 1``, which (stream order on ``B``) starts after ``B``'s launch
    ``e`` finished reading parity ``p``. So no PE overwrites a slot a peer may still read, with
    one flag round per launch instead of two. The rule this needs: consecutive calls on one PE
    (one team) are stream-ordered — one stream, or ordered by events — which a CUDA graph replay
    on the capturing stream's successor satisfies.

Not autotuned on purpose: an autotuner times configurations a number of times that differs per
PE, and every launch here is a collective step that every PE must make. The block size is the
row; ``num_warps`` is chosen from the hidden size (4 up to 2048, 8 up to 4096, 16 beyond).
"""

from __future__ import annotations

import torch as _torch

try:
    import triton
    import triton.language as tl
except ImportError as _e:  # say which extra installs it
    from .._requires import reraise

    reraise(_e, "triton", "symheap.fused")

from .. import triton as sh

FP8_NONE = 0
FP8_PER_TENSOR = 1
FP8_PER_TOKEN = 2
E4M3_MAX = 448.0


@triton.jit
def _wait_all(flag_row, npes, epoch, timeout_ns):
    for pe in range(npes):
        ok = sh.signal_wait_until(flag_row + pe, sh.GE, epoch, timeout_ns)
        if ok == 0:
            sh.trap()


@triton.jit
def _norm_store(r, w, eps, H, out_row, scale_ptr, row, cols, cmask, FP8: tl.constexpr):
    rf = tl.where(cmask, r.to(tl.float32), 0.0)
    ms = tl.sum(rf * rf, axis=0) / H
    y = rf * tl.rsqrt(ms + eps) * w
    if FP8 == 0:
        tl.store(out_row + cols, y.to(out_row.dtype.element_ty), mask=cmask)
    else:
        if FP8 == 1:
            s = tl.load(scale_ptr).to(tl.float32)
        else:
            amax = tl.max(tl.abs(y), axis=0)
            s = tl.maximum(amax, 1e-12) / 448.0
            tl.store(scale_ptr + row, s)
        q = tl.minimum(tl.maximum(y / s, -448.0), 448.0)
        tl.store(out_row + cols, q.to(tl.float8e4nv), mask=cmask)


@triton.jit
def fused_ar_rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    scale_ptr,
    ws_ptr,
    flags_ptr,
    ctr_ptr,
    bases_ptr,
    me,
    npes,
    n_rows,
    H,
    slot_elems,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    eps,
    timeout_ns,
    BLOCK: tl.constexpr,
    FP8: tl.constexpr,
    HINT: tl.constexpr,
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < H
    epoch = tl.load(ctr_ptr, volatile=True) + 1
    parity = epoch & 1
    ws_par = ws_ptr + parity * npes * slot_elems
    # 1. push this PE's rows into slot [parity][me] of every PE's staging buffer.
    for row in range(pid, n_rows, G):
        v = tl.load(x_ptr + row * stride_x + cols, mask=cmask)
        dst = ws_par + me * slot_elems + row * H + cols
        for pe in range(npes):
            sh.store(dst, v, me, pe, bases_ptr, mask=cmask, hint=HINT)
    # 2. one release flag per PE: flags[pid][me] = epoch on every PE.
    flag_row = flags_ptr + pid * npes
    for pe in range(npes):
        sh.signal_set(flag_row + me, epoch, me, pe, bases_ptr)
    # 3. wait for every PE's CTA pid (acquire, bounded).
    _wait_all(flag_row, npes, epoch, timeout_ns)
    # 4. reduce over PEs in PE order (fp32), add residual, RMSNorm, store.
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    for row in range(pid, n_rows, G):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        src = ws_par + row * H + cols
        for pe in range(npes):
            acc += tl.load(src + pe * slot_elems, mask=cmask, other=0.0, volatile=True).to(tl.float32)
        acc += tl.load(res_ptr + row * stride_r + cols, mask=cmask, other=0.0).to(tl.float32)
        r = acc.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, r, mask=cmask)
        _norm_store(r, w, eps, H, out_ptr + row * stride_o, scale_ptr, row, cols, cmask, FP8)
    # 5. the last CTA to finish advances this PE's device-side epoch.
    tl.debug_barrier()
    arrived = tl.atomic_add(ctr_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if arrived == G - 1:
        tl.atomic_xchg(ctr_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(ctr_ptr, epoch, sem="release", scope="gpu")


@triton.jit
def add_rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    scale_ptr,
    H,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    eps,
    BLOCK: tl.constexpr,
    FP8: tl.constexpr,
):
    """The op at one PE, where the all_reduce is the identity: nothing to stage, no flags, no
    epoch. One row per CTA and as many CTAs as rows (no CTA waits for another, so they need
    not be resident at once), the same arithmetic as the kernel above (fp32 add, one
    rounding, RMS of the rounded row)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    cmask = cols < H
    v = tl.load(x_ptr + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
    v += tl.load(res_ptr + row * stride_r + cols, mask=cmask, other=0.0).to(tl.float32)
    r = v.to(res_out_ptr.dtype.element_ty)
    tl.store(res_out_ptr + row * stride_ro + cols, r, mask=cmask)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    _norm_store(r, w, eps, H, out_ptr + row * stride_o, scale_ptr, row, cols, cmask, FP8)


def num_warps_for(hidden: int) -> int:
    """``num_warps`` for a row of ``hidden`` elements held in registers."""
    if hidden <= 2048:
        return 4
    if hidden <= 4096:
        return 8
    return 16


def launch(
    x: _torch.Tensor,
    residual: _torch.Tensor,
    weight: _torch.Tensor,
    out: _torch.Tensor,
    residual_out: _torch.Tensor,
    scale: _torch.Tensor,
    ws: _torch.Tensor,
    flags: _torch.Tensor,
    ctr: _torch.Tensor,
    bases: _torch.Tensor,
    me: int,
    npes: int,
    slot_elems: int,
    max_ctas: int,
    eps: float,
    timeout_ns: int,
    fp8: int,
) -> None:
    """Launches the kernel on torch's current stream for ``x.shape[0]`` rows (at most the
    workspace's rows per slot). Every argument is checked by the caller."""
    rows, hidden = x.shape
    grid = (min(rows, max_ctas),)
    hint = 16 if (hidden * x.element_size()) % 16 == 0 and (slot_elems * x.element_size()) % 16 == 0 else None
    fused_ar_rmsnorm_kernel[grid](
        x,
        residual,
        weight,
        out,
        residual_out,
        scale,
        ws,
        flags,
        ctr,
        bases,
        me,
        npes,
        rows,
        hidden,
        slot_elems,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        residual_out.stride(0),
        eps,
        timeout_ns,
        BLOCK=triton.next_power_of_2(hidden),
        FP8=fp8,
        HINT=hint,
        num_warps=num_warps_for(hidden),
    )


def num_warps_one_pe(hidden: int) -> int:
    """``num_warps`` of the one-PE kernel: what torch's inductor gives its persistent row
    reductions (a warp per 128 elements of the padded row, 2 to 8), the kernel this one is
    measured against."""
    return min(8, max(2, triton.next_power_of_2(hidden) // 128))


def launch_one_pe(
    x: _torch.Tensor,
    residual: _torch.Tensor,
    weight: _torch.Tensor,
    out: _torch.Tensor,
    residual_out: _torch.Tensor,
    scale: _torch.Tensor,
    eps: float,
    fp8: int,
) -> None:
    """Launches the one-PE kernel on torch's current stream, one CTA per row of ``x``. Every
    argument is checked by the caller."""
    rows, hidden = x.shape
    add_rmsnorm_kernel[(rows,)](
        x,
        residual,
        weight,
        out,
        residual_out,
        scale,
        hidden,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        residual_out.stride(0),
        eps,
        BLOCK=triton.next_power_of_2(hidden),
        FP8=fp8,
        num_warps=num_warps_one_pe(hidden),
    )
