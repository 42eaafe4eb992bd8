"""The Triton kernel of :mod:`symheap.moe` on the CUDA backend: row moves into peers' symmetric
buffers with SM stores (NVLink for a peer GPU, the local memory for this PE).

One kernel does every move of a dispatch or a combine: entry ``n`` of the plan copies row
``src_rows[n]`` of ``src`` (this PE's memory, symmetric or not) to row ``dst_rows[n]`` of PE
``dst_pes[n]``'s copy of the symmetric ``dst``, and does nothing when either row is ``-1``. The
plan is computed on the device (:mod:`symheap._moe_plan`), so the grid is static: a decode step
captures in a CUDA graph and replays with new routings.

Why SM stores and not the copy engine: the rows and their destinations are known only on the
device, and a copy-engine copy is fixed by the host when it is enqueued (or captured).
Completion: the kernel ends before the stream-ordered barrier that follows it in
:mod:`symheap.moe`, which makes its stores visible to every PE.
"""

# No "from __future__ import annotations": Triton reads the tl.constexpr annotations.
import torch as _torch
import triton
import triton.language as tl

from . import triton as sh

BLOCK = 1024


@triton.jit
def move_rows_kernel(
    src,
    dst,
    src_rows,
    dst_pes,
    dst_rows,
    row_elems,
    src_stride,
    dst_stride,
    bases,
    me,
    BLOCK: tl.constexpr,
    VEC: tl.constexpr,
    HINT: tl.constexpr,
):
    """Entry ``program_id(0)`` of the plan. ``VEC``: elements per 16 bytes when every row start
    is 16-byte aligned, else 1; ``HINT``: 16 then (the translated block is 16-byte aligned and
    contiguous, so the peer stores are 16-byte vectors: see :mod:`symheap.triton`), else 0."""
    n = tl.program_id(0)
    sr = tl.load(src_rows + n)
    dr = tl.load(dst_rows + n)
    pe = tl.load(dst_pes + n)
    if (sr >= 0) & (dr >= 0):
        s = src + tl.multiple_of(sr * src_stride, VEC)
        d = dst + tl.multiple_of(dr * dst_stride, VEC)
        for c in range(0, row_elems, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            m = offs < row_elems
            v = tl.load(s + offs, mask=m)
            if HINT > 0:
                sh.store(d + offs, v, me, pe, bases, mask=m, hint=HINT)
            else:
                sh.store(d + offs, v, me, pe, bases, mask=m)


def move_rows(
    src: _torch.Tensor,
    dst: _torch.Tensor,
    src_rows: _torch.Tensor,
    dst_pes: _torch.Tensor,
    dst_rows: _torch.Tensor,
    bases: _torch.Tensor,
    me: int,
) -> None:
    """Launches the plan on the current stream. ``src``: ``[*, W]`` rows; ``dst``: this PE's
    copy of a symmetric ``[*, W]`` tensor of the same dtype (both with unit inner stride)."""
    n = int(src_rows.numel())
    if n == 0:
        return
    w = int(src.shape[1])
    esize = src.element_size()
    vec = 16 // esize
    block = min(BLOCK, triton.next_power_of_2(w))
    aligned = all(t.data_ptr() % 16 == 0 and (t.stride(0) * esize) % 16 == 0 for t in (src, dst))
    move_rows_kernel[(n,)](
        src, dst, src_rows, dst_pes, dst_rows, w, src.stride(0), dst.stride(0), bases, me,
        BLOCK=block, VEC=vec if aligned else 1, HINT=16 if aligned and block >= 16 else 0, num_warps=4,
    )  # fmt: skip
