"""The Triton kernels of :mod:`symheap.gemm`: all_gather + GEMM and GEMM + reduce_scatter with
the communication overlapped with the GEMM, tile by tile.

Imported only on the CUDA backend (it needs Triton); :mod:`symheap.gemm` holds the public
functions, the workspaces, the custom ops and the host-backend path.

Tiles are defined **per PE block**: PE ``p``'s rows (its shard of A for all_gather_matmul, the
row block it owns for matmul_reduce_scatter) are cut into ``tpp = cdiv(m_blk, BM)`` M-tiles, so
a ragged block (``m_blk`` not a multiple of ``BM``) only masks the last tile and no tile ever
spans two PEs' rows. ``N`` and ``K`` are masked too (any M, N, K).

all_gather_matmul: two kernels per PE per call
    * **push** (``ag_push_kernel``, a few CTAs on a side stream forked from the caller's
      stream): PE ``me`` copies its shard, chunk by chunk (one chunk = one M-tile of ``BM``
      rows), into slot ``[parity][me]`` of every peer's symmetric gathered-A buffer with SM
      stores over NVLink (16-byte vector stores, ``hint=16``), then one release store at
      system scope of ``epoch`` into that peer's flag word ``flags[me][chunk]``. The peers
      are served in the order ``me-1, me-2, ...``, so at step ``k`` every PE sends to
      ``me-k`` and receives from ``me+k`` (a balanced schedule) and PE ``q`` receives from
      ``q+1`` first.
    * **GEMM** (``ag_gemm_kernel``, persistent, on the caller's stream): tiles in the order
      ``(k, i, j)``: the source PE ``(me + k) % n`` (own shard first, read in place from the
      caller's tensor with no wait; then ``me+1``, ``me+2``... in arrival order), its M-tile
      ``i``, the N-tile ``j``. Before loading A from a peer's slot the CTA polls
      ``flags[src][i] >= epoch`` with acquire loads at system scope, bounded by
      ``SYMHEAP_TIMEOUT`` (then ``trap``: a CUDA error at the next synchronisation, not a hang).
    Why SM stores here: a copy-engine put is a host-enqueued operation whose destination and
    signal value are fixed when a CUDA graph captures it, while the slot parity and the epoch
    below must change at every replay. The push kernel takes a few CTAs (``PUSH_CTAS``); the
    persistent GEMM gets the others. The copy-engine engine (:data:`CUBLAS`, below) avoids the
    parity with single slots and acknowledgements instead, and leaves every SM to cuBLAS.

matmul_reduce_scatter: one kernel per PE per call (``rs_gemm_kernel``, persistent)
    Tiles in the order ``(k, i, j)`` with the destination block ``d = (me + 1 + k) % n``: the
    row blocks of the peers first (``me+1`` first), this PE's own block last. A peer's tile is
    stored (rounded to the output dtype, 16-byte vector stores) straight into slot
    ``[parity][me]`` of PE ``d``'s symmetric receive buffer, then a release flag
    ``flags[me][tile] = epoch`` on PE ``d``. An own tile keeps its partial in registers, waits
    (acquire, bounded) for the ``n-1`` peers' flags of the same tile, adds their partials in
    fp32 in PE order and stores the output: the reduction is fused into the last producer.

Epochs (CUDA graphs)
    Each kernel keeps its own device-side counter (``ctr``: number of its completed launches on
    this PE); a launch reads it and uses ``epoch = ctr + 1``; its last CTA (an arrival counter)
    stores ``epoch`` back. Flags hold the epoch of their last write, which only grows, so they
    are never reset and a stale flag never satisfies a wait; nothing the host passes changes
    between calls, so a captured graph replays correctly.

Reuse hazard (why double buffering by epoch parity is enough, as in :mod:`symheap.fused`)
    Launch ``e`` writes parity ``e & 1``. PE ``A`` writes parity ``p`` of PE ``B`` again only
    at its launch ``e + 2``, which starts (stream order: the push stream forks from the
    caller's stream after A's GEMM ``e + 1``) after A's GEMM ``e + 1`` completed. That GEMM
    waited for flags of epoch ``e + 1`` from every peer, ``B`` included (every PE's block has
    at least one tile); ``B`` writes those only in its own launch ``e + 1``, which starts after
    its GEMM ``e`` finished reading parity ``p``. Needed: consecutive calls on one PE are
    stream-ordered (one stream, or ordered by events), as a graph replay is.

No deadlock: the persistent grids are at most the SMs of this PE's share of the GPU minus
the push CTAs, so every CTA of every kernel involved is resident together; a CTA only waits for
work that never waits itself (the push kernel; a peer's non-own tiles, which come first).

Block sizes: a :class:`Config` per call, the same on every PE (it fixes the chunks and tiles the
flags stand for): tuned by :mod:`symheap.gemm._tune` among :func:`candidates`, else the
heuristic :func:`config`. Loads: TMA descriptors (``TMA``) where A's and B's strides allow them,
else pointer loads with masks; either way the GEMM visits tiles in groups of ``GM`` M-tiles
(the CTAs running together share A and B tiles in L2).
"""

# No "from __future__ import annotations": Triton reads the tl.constexpr annotations.
import functools
import os
from typing import Any, List, NamedTuple, Optional, Tuple

import torch as _torch

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError as _e:  # say which extra installs it
    from .._requires import reraise

    reraise(_e, "triton", "symheap.gemm")

from .. import triton as sh
from .._native import SymheapValueError

PUSH_CTAS = 16
PUSH_BLOCK = 2048


@triton.jit
def _wait(flag_ptr, epoch, timeout_ns):
    ok = sh.signal_wait_until(flag_ptr, sh.GE, epoch, timeout_ns)
    if ok == 0:
        sh.trap()


@triton.jit
def _advance(ctr_ptr, epoch):
    # The last CTA to finish stores epoch into this PE's device-side counter.
    tl.debug_barrier()
    arrived = tl.atomic_add(ctr_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) - 1:
        tl.atomic_xchg(ctr_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(ctr_ptr, epoch, sem="release", scope="gpu")


@triton.jit
def _tile_dot(a_base, stride_am, m_rows, b_ptr, stride_bk, stride_bn, N, K, i, j, BM, BN, BK):
    """fp32 ``A[i*BM.., :] @ B[:, j*BN..]`` of one tile, A rows masked at ``m_rows``."""
    rm = i * BM + tl.arange(0, BM)
    rn = j * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mmask = rm < m_rows
    nmask = rn < N
    a_ptrs = a_base + rm[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BK)):
        kmask = rk < K - kk * BK
        a = tl.load(a_ptrs, mask=mmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK * stride_bk
    return acc, rm, rn, mmask, nmask


@triton.jit
def _tile_dot_tma(a_desc, row0, b_desc, K, j, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, B_T: tl.constexpr):
    """fp32 ``A[row0.., :] @ B[:, j*BN..]`` of one tile through TMA: ``a_desc`` ``(rows, K)``
    with ``(BM, BK)`` blocks, ``b_desc`` ``(K, N)`` with ``(BK, BN)`` blocks or, with ``B_T``,
    ``(N, K)`` with ``(BN, BK)`` blocks. Out-of-range K and N read as zero; rows past the
    block's own read whatever lies there (only output rows past it depend on them, and those
    are never stored)."""
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([row0, kk * BK])
        if B_T:
            b = b_desc.load([j * BN, kk * BK]).T
        else:
            b = b_desc.load([kk * BK, j * BN])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _store_c(c_ptr, acc, row_base, m_rows, i, j, N, stride_cm, BM: tl.constexpr, BN: tl.constexpr):
    """Tile ``(i, j)`` of a block of ``m_rows`` rows starting at row ``row_base`` of C, masked."""
    rm = i * BM + tl.arange(0, BM)
    rn = j * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + (row_base + rm)[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < m_rows)[:, None] & (rn < N)[None, :])


@triton.jit
def _tile_ij(rem, tpp, tn, GM: tl.constexpr):
    """Tile ``rem`` of a PE block of ``tpp`` M-tiles by ``tn`` N-tiles, in groups of ``GM``
    M-tiles (all N-tiles of a group before the next group: the CTAs running together share
    A and B tiles in L2). Every PE maps ``rem`` alike: a tile's flag index is ``rem``."""
    in_group = GM * tn
    first = (rem // in_group) * GM
    rows = tl.minimum(tpp - first, GM)
    i = first + (rem % in_group) % rows
    j = (rem % in_group) // rows
    return i, j


@triton.jit
def _async_proxy_fence():
    # A peer's SM stores (generic proxy) acquired through a flag are read next by TMA (the
    # async proxy): PTX orders the two proxies only through a proxy fence.
    tl.inline_asm_elementwise(
        "fence.proxy.async.global;\nmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


# ---- all_gather + GEMM ------------------------------------------------------------------------


@triton.jit
def ag_push_kernel(
    a_ptr,
    ws_ptr,
    flags_ptr,
    ctr_ptr,
    bases_ptr,
    me,
    npes,
    m_loc,
    K,
    stride_am,
    slot_elems,
    flag_stride,
    BM: tl.constexpr,
    BLOCK: tl.constexpr,
    HINT: tl.constexpr,
):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    epoch = tl.load(ctr_ptr, volatile=True) + 1
    parity = epoch & 1
    dst_slot = ws_ptr + (parity * npes + me).to(tl.int64) * slot_elems
    tpp = tl.cdiv(m_loc, BM)
    cols = tl.arange(0, BLOCK)
    for item in range(pid, (npes - 1) * tpp, P):
        k = item // tpp + 1
        i = item % tpp
        q = (me - k + npes) % npes
        r1 = tl.minimum(m_loc, (i + 1) * BM)
        for r in range(i * BM, r1):
            for c0 in range(0, K, BLOCK):
                cm = cols < K - c0
                v = tl.load(a_ptr + r * stride_am + c0 + cols, mask=cm)
                sh.store(dst_slot + r * K + c0 + cols, v, me, q, bases_ptr, mask=cm, hint=HINT)
        sh.signal_set(flags_ptr + me * flag_stride + i, epoch, me, q, bases_ptr)
    _advance(ctr_ptr, epoch)


@triton.jit
def ag_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    ws_ptr,
    a_desc,
    ws_desc,
    b_desc,
    flags_ptr,
    ctr_ptr,
    me,
    npes,
    m_loc,
    N,
    K,
    stride_am,
    stride_bk,
    stride_bn,
    stride_cm,
    slot_elems,
    slot_rows,
    flag_stride,
    timeout_ns,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GM: tl.constexpr,
    TMA: tl.constexpr,
    B_T: tl.constexpr,
    FLAT: tl.constexpr,
):
    """With ``TMA``, A and B come through the descriptors (``a_desc``: this PE's shard;
    ``ws_desc``: the gathered-A workspace as ``(2 * npes * slot_rows, K)`` rows, slot ``s``
    at row ``s * slot_rows``); else through the pointers with masks. ``FLAT``: the own-shard
    loop is flattened with its K loop (the next tile's loads overlap this tile's epilogue; the
    peers' loop cannot be, it waits per tile)."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    epoch = tl.load(ctr_ptr, volatile=True) + 1
    parity = epoch & 1
    tpp = tl.cdiv(m_loc, BM)
    tn = tl.cdiv(N, BN)
    per_pe = tpp * tn
    if TMA:
        # Two loops, not one with a branch per tile: each descriptor load site gets its own
        # pipeline buffers, and sequential loops share them (a branch inside one loop doubled
        # the shared memory past the SM's). Same tiles per CTA as the pointer loop below.
        for t in tl.range(pid, per_pe, G, flatten=FLAT):
            i, j = _tile_ij(t, tpp, tn, GM)
            acc = _tile_dot_tma(a_desc, i * BM, b_desc, K, j, BM, BN, BK, B_T)
            _store_c(c_ptr, acc, me * m_loc, m_loc, i, j, N, stride_cm, BM, BN)
        first_peer = pid + tl.cdiv(tl.maximum(per_pe - pid, 0), G) * G
        for t in range(first_peer, npes * per_pe, G):
            k = t // per_pe
            i, j = _tile_ij(t % per_pe, tpp, tn, GM)
            src = (me + k) % npes
            _wait(flags_ptr + src * flag_stride + i, epoch, timeout_ns)
            _async_proxy_fence()
            row0 = ((parity * npes + src) * slot_rows + i * BM).to(tl.int32)
            acc = _tile_dot_tma(ws_desc, row0, b_desc, K, j, BM, BN, BK, B_T)
            _store_c(c_ptr, acc, src * m_loc, m_loc, i, j, N, stride_cm, BM, BN)
    else:
        for t in range(pid, npes * per_pe, G):
            k = t // per_pe
            i, j = _tile_ij(t % per_pe, tpp, tn, GM)
            src = (me + k) % npes
            a_base = a_ptr
            sam = stride_am
            if k != 0:
                _wait(flags_ptr + src * flag_stride + i, epoch, timeout_ns)
                a_base = ws_ptr + (parity * npes + src).to(tl.int64) * slot_elems
                sam = K
            acc = _tile_dot(a_base, sam, m_loc, b_ptr, stride_bk, stride_bn, N, K, i, j, BM, BN, BK)[0]
            _store_c(c_ptr, acc, src * m_loc, m_loc, i, j, N, stride_cm, BM, BN)
    _advance(ctr_ptr, epoch)


@triton.jit
def ag_gathered_kernel(a_ptr, ws_ptr, g_ptr, ctr_ptr, me, npes, m_loc, K, stride_am, slot_elems, BLOCK: tl.constexpr):
    """Copies the gathered A of the launch that just completed (its parity read from the GEMM's
    counter) into ``g`` (``npes * m_loc`` rows of ``K``): row ``r`` of PE ``p`` per program."""
    row = tl.program_id(0)
    p = row // m_loc
    r = row % m_loc
    parity = tl.load(ctr_ptr, volatile=True) & 1
    cols = tl.arange(0, BLOCK)
    for c0 in range(0, K, BLOCK):
        cm = cols < K - c0
        if p == me:
            v = tl.load(a_ptr + r * stride_am + c0 + cols, mask=cm)
        else:
            src = ws_ptr + (parity * npes + p).to(tl.int64) * slot_elems
            v = tl.load(src + r * K + c0 + cols, mask=cm)
        tl.store(g_ptr + row.to(tl.int64) * K + c0 + cols, v, mask=cm)


# ---- GEMM + reduce_scatter --------------------------------------------------------------------


@triton.jit
def rs_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    ws_ptr,
    a_desc,
    b_desc,
    flags_ptr,
    ctr_ptr,
    bases_ptr,
    me,
    npes,
    m_blk,
    N,
    K,
    stride_am,
    stride_bk,
    stride_bn,
    stride_cm,
    slot_elems,
    flag_stride,
    timeout_ns,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GM: tl.constexpr,
    TMA: tl.constexpr,
    B_T: tl.constexpr,
    HINT: tl.constexpr,
):
    """With ``TMA``, A (``(M, K)``, block ``d`` at row ``d * m_blk``) and B come through the
    descriptors; else through the pointers with masks."""
    ESIZE: tl.constexpr = c_ptr.dtype.element_ty.primitive_bitwidth // 8
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    epoch = tl.load(ctr_ptr, volatile=True) + 1
    parity = epoch & 1
    ws_par = ws_ptr + (parity * npes).to(tl.int64) * slot_elems
    tpp = tl.cdiv(m_blk, BM)
    tn = tl.cdiv(N, BN)
    per_pe = tpp * tn
    for t in range(pid, npes * per_pe, G):
        k = t // per_pe
        rem = t % per_pe
        i, j = _tile_ij(rem, tpp, tn, GM)
        d = (me + 1 + k) % npes
        if TMA:
            acc = _tile_dot_tma(a_desc, d * m_blk + i * BM, b_desc, K, j, BM, BN, BK, B_T)
            rm = i * BM + tl.arange(0, BM)
            rn = j * BN + tl.arange(0, BN)
            mmask = rm < m_blk
            nmask = rn < N
        else:
            a_base = a_ptr + (d * m_blk).to(tl.int64) * stride_am
            acc, rm, rn, mmask, nmask = _tile_dot(
                a_base, stride_am, m_blk, b_ptr, stride_bk, stride_bn, N, K, i, j, BM, BN, BK
            )
        mask = mmask[:, None] & nmask[None, :]
        part = acc.to(c_ptr.dtype.element_ty)
        offs = rm[:, None] * N + rn[None, :]
        if d != me:
            # PE d's slot [parity][me]: the local address plus the per-peer delta in elements
            # (sh.translate's arithmetic, done on the scalar delta so that the tile keeps the
            # contiguity and alignment the compiler knows: 16-byte vector stores with HINT).
            delta = (tl.load(bases_ptr + d) - tl.load(bases_ptr + me)) // ESIZE
            if HINT:
                delta = tl.multiple_of(delta, 16 // ESIZE)
            dst = ws_par + (parity * 0 + me).to(tl.int64) * slot_elems + delta + offs
            tl.store(dst, part, mask=mask)
            sh.signal_set(flags_ptr + me * flag_stride + rem, epoch, me, d, bases_ptr)
        else:
            total = tl.zeros([BM, BN], dtype=tl.float32)
            for s in range(0, npes):
                if s == me:
                    total += part.to(tl.float32)
                else:
                    _wait(flags_ptr + s * flag_stride + rem, epoch, timeout_ns)
                    src = ws_par + s.to(tl.int64) * slot_elems + offs
                    total += tl.load(src, mask=mask, other=0.0, volatile=True).to(tl.float32)
            c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
    _advance(ctr_ptr, epoch)


# ---- all_gather + cuBLAS: the copy-engine engine ----------------------------------------------
# The other engine of all_gather_matmul (:data:`CUBLAS`), chosen by the tuner where it is faster:
# shards travel by the copy engine (no SM is taken from the GEMM) and cuBLAS multiplies each shard
# as it arrives. A copy-engine put is enqueued by the host, so its destination is fixed when a
# graph captures it: the slots are single (``slot[src]``, no parity), and reuse is guarded by an
# acknowledgement instead: PE ``c`` stores ``ack[c] = epoch`` on PE ``p`` once its GEMM of
# ``p``'s shard of launch ``epoch`` is done, and ``p`` pushes launch ``epoch + 1`` only after
# every peer's ack reached ``epoch``. Flags: ``flags[src * stride]`` = the epoch of ``src``'s
# data in my slot, ``flags[c * stride + 1]`` = ``c``'s ack of my data. The epoch comes from
# this engine's device counter (``ctr[0]``: completed launches), read by these small kernels,
# so replays advance it as the Triton kernels' epochs do.


@triton.jit
def ce_acks_kernel(flags_ptr, ctr_ptr, me, npes, flag_stride, timeout_ns):
    # Before pushing launch `epoch`: every peer is done reading my data of launch epoch - 1.
    epoch = tl.load(ctr_ptr, volatile=True) + 1
    for p in range(0, npes):
        if p != me:
            _wait(flags_ptr + p * flag_stride + 1, epoch - 1, timeout_ns)


@triton.jit
def ce_signal_kernel(flag_ptr, ctr_ptr, me, pe, bases_ptr):
    # After the copy before it on this stream completed: PE `pe`'s flag word = epoch (release).
    epoch = tl.load(ctr_ptr, volatile=True) + 1
    sh.signal_set(flag_ptr, epoch, me, pe, bases_ptr)


@triton.jit
def ce_step_kernel(flags_ptr, ctr_ptr, me, bases_ptr, flag_stride, ack_pe, wait_src, timeout_ns, FINISH: tl.constexpr):
    # Between two shard GEMMs on the caller's stream: acknowledge the shard of `ack_pe` just
    # multiplied (its ack word on PE `ack_pe`), then wait for the data of `wait_src`; the
    # last step instead stores the epoch into the counter (the launch is complete).
    epoch = tl.load(ctr_ptr, volatile=True) + 1
    if ack_pe >= 0:
        sh.signal_set(flags_ptr + me * flag_stride + 1, epoch, me, ack_pe, bases_ptr)
    if wait_src >= 0:
        _wait(flags_ptr + wait_src * flag_stride, epoch, timeout_ns)
    if FINISH:
        tl.atomic_xchg(ctr_ptr, epoch, sem="release", scope="gpu")


# ---- block sizes and launches -----------------------------------------------------------------


class Config(NamedTuple):
    """One kernel configuration: tile ``(bm, bn, bk)``, ``warps``, pipeline ``stages``, the
    M-tile group ``gm`` of the tile order, and ``tma`` (A and B through TMA descriptors, sm_90
    and later, when the strides allow it; else pointer loads with masks), ``flat``
    (all_gather_matmul only: its own-shard tile loop flattened, TMA only)."""

    bm: int
    bn: int
    bk: int
    warps: int
    stages: int
    gm: int = 8
    tma: bool = False
    flat: bool = False


CUBLAS = Config(0, 0, 0, 0, 0)
"""all_gather_matmul's other engine (a :class:`Config` so the tuner times and caches it like
a tile choice): the copy engine moves the shards, cuBLAS multiplies each as it arrives
(:func:`launch_ag_ce`)."""


@functools.lru_cache(maxsize=None)
def config(m_blk: int, n: int, k: int, arch: int) -> Config:
    """The heuristic configuration for per-PE blocks of ``m_blk`` rows (a function of the shape
    and the device only, so the same on every PE): what runs when nothing was tuned."""
    bm = 128 if m_blk > 64 else 64
    bn = 128 if n > 64 else 64
    if arch >= 90:
        bk = 64 if k >= 64 else 32
        # sm_120/121 (GeForce and workstation Blackwell) have ~100 KiB of shared memory per
        # block, not ~227: two stages of 128x128x64 fit there.
        stages = 2 if arch in (120, 121) else 4 if bm == 128 else 3
        return Config(bm, bn, bk, 8, stages, 8, bk == 64)
    return Config(bm, bn, 32, 8 if bm == 128 else 4, 3, 8, False)


def candidates(op: str, m_blk: int, n: int, k: int, arch: int) -> List[Config]:
    """The configurations the tuner times for operation ``op`` (``"ag"``/``"rs"``) and this
    shape (the heuristic's first)."""
    base = config(m_blk, n, k, arch)
    out = [base]
    if arch in (90, 100, 103) and m_blk > 64 and n > 128 and k >= 64:
        # What won on an H200 (bench/gemm_tune_bench.py --extra, the issue 22 shapes): 128x256
        # tiles in groups of 16, 8 or 4 M-tiles first; BK = 128 and pointer loads never won.
        if op == "ag":
            out += [Config(128, 256, 64, 8, 4, 8, True, True), Config(128, 256, 64, 8, 3, 16, True, True)]
        for c in (
            Config(128, 256, 64, 8, 3, 16, True),
            Config(128, 256, 64, 8, 3, 8, True),
            Config(128, 256, 64, 8, 3, 4, True),
            Config(128, 256, 64, 8, 4, 8, True),
            Config(128, 256, 64, 8, 4, 16, True),
            Config(256, 128, 64, 8, 4, 8, True),
            Config(128, 128, 64, 8, 5, 8, True),
        ):
            if c not in out:
                out.append(c)
    return out


def engine() -> str:
    """``SYMHEAP_GEMM_ENGINE`` (the same on every PE): ``triton`` (the fused Triton kernels
    only), ``cublas`` (all_gather_matmul by the copy engine and cuBLAS, always), unset or
    ``auto`` (the tuner times both and takes the faster)."""
    v = os.environ.get("SYMHEAP_GEMM_ENGINE", "auto").strip().lower() or "auto"
    if v not in ("auto", "triton", "cublas"):
        raise SymheapValueError(f"SYMHEAP_GEMM_ENGINE must be auto, triton or cublas, not {v!r}")
    return v


def ag_gemm_sms(sms: int, npes: int) -> int:
    """The SMs all_gather_matmul's GEMM gets of this PE's ``sms``: the push kernel takes
    ``PUSH_CTAS`` when there are peers to push to."""
    return max(1, sms - PUSH_CTAS) if npes > 1 else sms


def _arch(dev: _torch.device) -> int:
    major, minor = _torch.cuda.get_device_capability(dev)
    return major * 10 + minor


def _hint(*elems: int, esize: int) -> Any:
    return 16 if all((e * esize) % 16 == 0 for e in elems) else None


def _aligned(t: _torch.Tensor, *strides: int) -> bool:
    return t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0 for s in strides)


def _b_desc(b: _torch.Tensor, cfg: Config) -> Optional[Tuple[Any, bool]]:
    """B's descriptor and whether it reads the transpose of a row-major ``(N, K)`` (``w.t()``),
    or None when B's strides do not allow TMA."""
    kdim, n = b.shape
    if b.stride(1) == 1 and _aligned(b, b.stride(0)):
        return TensorDescriptor(b, [kdim, n], [b.stride(0), 1], [cfg.bk, cfg.bn]), False
    if b.stride(0) == 1 and _aligned(b, b.stride(1)):
        return TensorDescriptor(b, [n, kdim], [b.stride(1), 1], [cfg.bn, cfg.bk]), True
    return None


def tma_descs(a: _torch.Tensor, b: _torch.Tensor, cfg: Config) -> Optional[Tuple[Any, Any, bool]]:
    """``(a_desc, b_desc, b_t)`` when ``cfg`` asks for TMA and A (``(rows, K)``, row-major) and
    B allow it (16-byte aligned bases and row strides, K > 0), else None."""
    if not cfg.tma or a.shape[1] == 0 or not _aligned(a, a.stride(0)):
        return None
    bd = _b_desc(b, cfg)
    if bd is None:
        return None
    return TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [cfg.bm, cfg.bk]), bd[0], bd[1]


def launch_ag(a, b, c, g, ws, flags, ctrs, bases, me, npes, slot_elems, flag_stride, sms, timeout_ns, cfg) -> None:
    """The push kernel on a side stream (forked from, and joined back into, the current stream)
    and the persistent GEMM on the current stream; then the gathered copy when ``g`` is given.
    ``ctrs``: int64 ``[push epoch, push arrivals, gemm epoch, gemm arrivals, ...]``; ``cfg``:
    the same :class:`Config` on every PE (it fixes the chunks the flags stand for)."""
    m_loc, kdim = a.shape
    n = b.shape[1]
    bm, bn, bk = cfg.bm, cfg.bn, cfg.bk
    # Slots start at whole rows of K (the TMA descriptor sees the workspace as rows of K, slot s
    # from row s * slot_rows): every kernel of the call uses this stride, the same on every PE.
    slot_rows = slot_elems // kdim if kdim else 0
    slot_elems = slot_rows * kdim if kdim else slot_elems
    main = _torch.cuda.current_stream(a.device)
    gemm_sms = ag_gemm_sms(sms, npes)
    if npes > 1:
        side = _side_stream(a.device)
        side.wait_stream(main)
        with _torch.cuda.stream(side):
            tpp = triton.cdiv(m_loc, bm)
            ag_push_kernel[(max(1, min(PUSH_CTAS, (npes - 1) * tpp)),)](
                a, ws, flags, ctrs[0:], bases, me, npes, m_loc, kdim, a.stride(0), slot_elems, flag_stride,
                BM=bm, BLOCK=min(PUSH_BLOCK, triton.next_power_of_2(kdim)),
                HINT=_hint(kdim, slot_elems, a.stride(0), esize=a.element_size()), num_warps=8,
            )  # fmt: skip
    descs = tma_descs(a, b, cfg) if (kdim * a.element_size()) % 16 == 0 else None
    a_desc = ws_desc = b_desc = None
    b_t = b.stride(0) == 1 and b.stride(1) != 1
    if descs is not None:
        a_desc, b_desc, b_t = descs
        ws_desc = TensorDescriptor(ws, [2 * npes * slot_rows, kdim], [kdim, 1], [bm, bk])
    tiles = npes * triton.cdiv(m_loc, bm) * triton.cdiv(n, bn)
    ag_gemm_kernel[(max(1, min(tiles, gemm_sms)),)](
        a, b, c, ws, a_desc, ws_desc, b_desc, flags, ctrs[2:], me, npes, m_loc, n, kdim, a.stride(0), b.stride(0),
        b.stride(1), c.stride(0), slot_elems, slot_rows, flag_stride, timeout_ns, BM=bm, BN=bn, BK=bk, GM=cfg.gm,
        TMA=descs is not None, B_T=b_t, FLAT=cfg.flat and descs is not None, num_warps=cfg.warps,
        num_stages=cfg.stages,
    )  # fmt: skip
    if npes > 1:
        main.wait_stream(side)
    if g is not None:
        ag_gathered_kernel[(npes * m_loc,)](
            a, ws, g, ctrs[2:], me, npes, m_loc, kdim, a.stride(0), slot_elems,
            BLOCK=min(PUSH_BLOCK, triton.next_power_of_2(kdim)), num_warps=4,
        )  # fmt: skip


class _ExactMath:
    """cuBLAS with fp32 reductions only (no reduced-precision split-K), as the Triton kernels:
    each output element the fp32 sum over K, rounded once. torch reads these flags at every
    GEMM, so they are set around this engine's GEMMs and restored after."""

    def __enter__(self) -> None:
        m = _torch.backends.cuda.matmul
        self.saved = (m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction)
        m.allow_bf16_reduced_precision_reduction = False
        m.allow_fp16_reduced_precision_reduction = False

    def __exit__(self, *exc: Any) -> None:
        m = _torch.backends.cuda.matmul
        m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction = self.saved


def launch_ag_ce(a, b, c, g, slots, peers, flags, ctr, bases, me, npes, flag_stride, timeout_ns) -> None:
    """all_gather_matmul by the copy engine and cuBLAS (:data:`CUBLAS`; protocol above):
    ``slots[s]``: this PE's slot for PE ``s``'s shard (``m_loc x K``); ``peers[q]``: PE ``q``'s
    slot for this PE's shard (a view of its memory). The pushes run on a high-priority side
    stream forked from the current one, the GEMMs on the current stream; ``g`` (optional)
    gets the gathered A."""
    m_loc = a.shape[0]
    main = _torch.cuda.current_stream(a.device)
    with _ExactMath():
        if npes > 1:
            side = _side_stream(a.device, priority=True)
            side.wait_stream(main)
            with _torch.cuda.stream(side):
                ce_acks_kernel[(1,)](flags, ctr, me, npes, flag_stride, timeout_ns)
                for k in range(1, npes):
                    q = (me - k) % npes
                    peers[q].copy_(a)
                    ce_signal_kernel[(1,)](flags[me * flag_stride :], ctr, me, q, bases)
        _torch.mm(a, b, out=c[me * m_loc : (me + 1) * m_loc])
        if g is not None:
            g[me * m_loc : (me + 1) * m_loc].copy_(a)
        prev = -1
        for k in range(1, npes):
            src = (me + k) % npes
            ce_step_kernel[(1,)](flags, ctr, me, bases, flag_stride, prev, src, timeout_ns, FINISH=False)
            _torch.mm(slots[src], b, out=c[src * m_loc : (src + 1) * m_loc])
            if g is not None:
                g[src * m_loc : (src + 1) * m_loc].copy_(slots[src])
            prev = src
        if npes > 1:
            main.wait_stream(side)
            ce_step_kernel[(1,)](flags, ctr, me, bases, flag_stride, prev, -1, timeout_ns, FINISH=True)


def launch_rs(a, b, c, ws, flags, ctr, bases, me, npes, slot_elems, flag_stride, sms, timeout_ns, cfg) -> None:
    """The persistent GEMM + reduce_scatter kernel on the current stream (``cfg``: the same
    :class:`Config` on every PE: it fixes the tiles the flags stand for)."""
    m, kdim = a.shape
    n = b.shape[1]
    m_blk = m // npes
    descs = tma_descs(a, b, cfg)
    a_desc = b_desc = None
    b_t = b.stride(0) == 1 and b.stride(1) != 1
    if descs is not None:
        a_desc, b_desc, b_t = descs
    tiles = npes * triton.cdiv(m_blk, cfg.bm) * triton.cdiv(n, cfg.bn)
    rs_gemm_kernel[(max(1, min(tiles, sms)),)](
        a, b, c, ws, a_desc, b_desc, flags, ctr, bases, me, npes, m_blk, n, kdim, a.stride(0), b.stride(0),
        b.stride(1), c.stride(0), slot_elems, flag_stride, timeout_ns, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GM=cfg.gm,
        TMA=descs is not None, B_T=b_t, HINT=_hint(n, slot_elems, esize=c.element_size()) is not None,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip


_sides: dict = {}


def _side_stream(dev: _torch.device, priority: bool = False) -> Any:
    """One side stream per device and kind for the pushes (fixed, so graphs capture one fork).
    The copy-engine engine's is high-priority: its small signal kernels then start as soon as
    an SM frees, ahead of the queued CTAs of the GEMM that runs meanwhile."""
    s = _sides.get((dev, priority))
    if s is None:
        s = _sides[(dev, priority)] = _torch.cuda.Stream(dev, priority=-1 if priority else 0)
    return s
