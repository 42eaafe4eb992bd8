"""all_gather + GEMM and GEMM + reduce_scatter with the communication overlapped with the GEMM
(the tensor-parallel pair of a sequence-parallel MLP or attention block)::

    all_gather_matmul(a_shard, b)     -> C = all_gather(A) @ B       (+ the gathered A on request)
    matmul_reduce_scatter(a, b)       -> my row block of  sum over PEs of (A @ B)

Both are **collective** over the team (the world; every PE calls them in the same order with the
same shapes, dtypes and flags; values differ per PE) and also the ``torch.library`` custom ops
``symheap::all_gather_matmul`` and ``symheap::matmul_reduce_scatter`` with fake kernels, so
``torch.compile`` (``fullgraph=True``) traces them without a graph break and CUDA graphs
capture them.

Inputs: bfloat16 or float16 (fp32 accumulation), ordinary or symmetric tensors, any M, N, K.
``a`` is row-major (a strided ``a`` is made contiguous); ``b`` is ``(K, N)`` either row-major or
the transpose of a row-major ``(N, K)`` tensor (``w.t()``, read in place: a Linear weight needs
no copy). Outputs are allocated, or passed in (``out=``, ``gathered_out=``: contiguous).

CUDA backend (:mod:`symheap.gemm._kernels` gives the protocol):
    * all_gather_matmul: a push kernel of a few CTAs on a side stream copies this PE's shard
      into every peer's symmetric gathered-A buffer with SM stores over NVLink, one release
      flag per chunk of ``BM`` rows; a persistent Triton GEMM on the caller's stream does the
      tiles of its own shard first (read in place), then those of PE ``me+1``, ``me+2``...,
      each tile waiting (acquire, system scope, bounded by ``SYMHEAP_TIMEOUT``) for its chunk.
    * matmul_reduce_scatter: one persistent Triton kernel computes the peers' row blocks first
      (``me+1`` first), storing each tile's partial (rounded to the output dtype) straight into
      its owner's symmetric receive slot with a release flag; its own block last, adding the
      peers' partials of each tile in fp32 as they are flagged (the reduction fused into the
      last producer).
    * all_gather_matmul's other engine, taken per shape where the tuner measured it faster
      (``SYMHEAP_GEMM_ENGINE=auto``, the default; ``triton`` or ``cublas`` force one): the copy
      engine pushes the shard into every peer's slot (a high-priority side stream, a release
      flag after each copy) and cuBLAS multiplies the own shard, then each peer's as its flag
      arrives, on the whole GPU; the consumer acknowledges each shard it multiplied, and a PE
      pushes its next call's shard only after every peer's acknowledgement (the slots are
      single, so a captured copy's fixed destination is safe to replay).
    * at one PE (nothing to gather or reduce) both are one cuBLAS GEMM with fp32 reductions
      into ``out``: no workspace, no flags, no tuning.
    No host synchronisation inside; flags carry an epoch the kernels advance on the device
    (graph replays work); slots are double-buffered by epoch parity against reuse. The
    workspace is made on the first call (collective: an allocation on every PE) and grown by a
    larger one; under CUDA graph capture it must already be large enough (warm up once, or
    :func:`reserve`). Consecutive calls on a PE must be stream-ordered.

Host backend (CPU tensors; CI): correct but **unfused**: symheap's host ``all_gather`` then
torch's matmul in fp32; torch's matmul in fp32 (partials rounded to the dtype) then symheap's
host ``reduce_scatter`` in fp32. Same semantics as the kernels:
``all_gather_matmul``: each output element is the fp32 sum over K, rounded once;
``matmul_reduce_scatter``: each PE's partial rounded once to the dtype, the partials summed in
fp32, rounded once.

Block sizes: tuned (:mod:`symheap.gemm._tune`): the first call of a large shape times the
candidate configurations (tiles, warps, stages, TMA or pointer loads) of the kernel **without
communication** on every PE's own GPU and every PE launches PE 0's fastest; the choice is kept
in memory and on disk (``$SYMHEAP_CACHE_DIR/gemm-tune``), so later runs skip the timing. Under
CUDA graph capture, for small GEMMs and with ``SYMHEAP_GEMM_TUNE=0`` the heuristic
:func:`symheap.gemm._kernels.config` runs (a function of the shape and device: the same on
every PE). ``SYMHEAP_GEMM_TUNE=1`` tunes every shape. The setting must be the same on every PE.

Errors: :class:`symheap.SymheapValueError` for shapes, dtypes, devices and a workspace too small
under capture; :class:`symheap.SymheapUnsupportedError` for a team other than the world, a
``gather_dim``/``scatter_dim`` other than 0 and an ``op`` other than ``"sum"``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

try:
    import torch as _torch
except ImportError as _e:  # say which extra installs it
    from .._requires import reraise

    reraise(_e, "torch", "symheap.gemm")

from .. import _core, _library, _shmem, _workspace
from .. import torch as st
from .._native import SymheapUnsupportedError, SymheapValueError, Team
from .._workspace import Workspace
from . import _tune

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "reserve"]

_DTYPES = (_torch.bfloat16, _torch.float16)
_MIN_SLOT_BYTES = 4 << 20
# The smallest BM of the kernels' configs: flags per PE are sized for it.
_MIN_BM = 64
_MIN_BN = 64

# Per context (dropped with its workspaces): how many PEs share this PE's GPU, its SMs.
_share: Dict[int, int] = {}
_sms_of: Dict[Tuple[int, str], int] = {}


def _members(team: Optional[Team], group: Any, what: str) -> Tuple[int, ...]:
    n = _core.native().n_pes
    if team is not None and (not team.is_valid or team.n_pes() != n):
        raise SymheapUnsupportedError(f"{what}: only the world team is supported (team=None or the world)")
    if group is not None:
        size = group.size() if hasattr(group, "size") else None
        if size != n:
            raise SymheapUnsupportedError(f"{what}: group must span the world ({n} PEs), it has {size}")
    return tuple(range(n))


def _timeout_ns() -> int:
    # The context's own bound (SYMHEAP_TIMEOUT or init(timeout=), validated at init).
    return int(_core.native().timeout_ns)


def _gpu_share(dev: _torch.device) -> int:
    """How many PEs of the world share this PE's GPU (**collective**: a host all_gather)."""
    ctx = id(_core.context())
    if ctx not in _share:
        uid = str(_torch.cuda.get_device_properties(dev).uuid).encode()
        _share[ctx] = max(1, sum(1 for u in _shmem.all_gather_object_bytes(uid) if u == uid))
    return _share[ctx]


def _sms(dev: _torch.device) -> int:
    """The SMs this PE may fill: its share of the GPU (**collective** the first time; kept,
    since every all_gather_matmul call asks before its tuning table is consulted)."""
    _workspace.bind()  # the caches by context are dropped with the workspaces
    key = (id(_core.context()), str(dev))
    if key not in _sms_of:
        _sms_of[key] = max(1, _torch.cuda.get_device_properties(dev).multi_processor_count // _gpu_share(dev))
    return _sms_of[key]


def _make(key: Tuple[str, Tuple[int, ...]], size: Tuple[int, ...]) -> Workspace:
    """**Collective** over the world (symmetric allocations, a barrier): for ``key = (kind,
    members)`` and ``size = (slot bytes, flag stride)``, the slots ``ws`` (uint8 ``[copies][npes]
    [slot bytes]``: 2 copies double-buffered by epoch parity; 1 for the cuBLAS engine's single
    slots, kind ``"agce"``), the release ``flags`` (int64 ``[npes][flag stride]``, zeroed on every
    PE before any peer's first signal), the device counters ``[push epoch, arrivals, gemm epoch,
    arrivals]`` and the members' heap bases. Also learns this PE's SM share (collective the
    first time), so that no captured call has to."""
    kind, members = key
    npes = len(members)
    regions = {
        "ws": ((1 if kind == "agce" else 2) * npes * size[0], _torch.uint8),
        "flags": (npes * size[1], _torch.int64),
    }
    _sms(st.device())
    return Workspace(members, size, regions, zeroed=("flags",), counters=8, bases=True, barrier=True)


def _size(size: Tuple[int, ...]) -> Tuple[int, ...]:
    return (max(_MIN_SLOT_BYTES, -(-size[0] // 256) * 256), size[1])


def _forget() -> None:
    _tune.forget()
    _share.clear()
    _sms_of.clear()


# One workspace per (kind, team): "ag" and "rs" (the Triton kernels), "agce" (the cuBLAS engine).
_pool = _workspace.Pool(
    "symheap.gemm",
    _make,
    size_for=_size,
    under_capture="raise",
    hint="run the same call once before capture, or call symheap.gemm.reserve(...) on every PE first",
    on_forget=_forget,
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _ag_needs(m_loc: int, k: int, esize: int) -> Tuple[int, int]:
    return m_loc * k * esize, max(1, _cdiv(m_loc, _MIN_BM))


def _rs_needs(m_blk: int, n: int, esize: int) -> Tuple[int, int]:
    return m_blk * n * esize, max(1, _cdiv(m_blk, _MIN_BM) * _cdiv(n, _MIN_BN))


def reserve(
    op: str, m: int, n: int, k: int, dtype: Any = _torch.bfloat16, *, team: Optional[Team] = None, group: Any = None
) -> None:
    """**Collective** over the world (every PE, in the same order): sizes the workspace of
    ``op`` (``"all_gather_matmul"`` or ``"matmul_reduce_scatter"``) for calls up to the shape
    ``(m, n, k)`` (``m``: rows of this PE's ``a``, shard or full), so that a CUDA graph can
    capture them without a warm-up call. Not during capture. CUDA backend only (a no-op on
    the host backend)."""
    if _workspace.capturing():
        raise SymheapValueError("symheap.gemm.reserve cannot run during CUDA graph capture; call it before")
    m, n, k = (_core.index_arg(v, f"reserve {name}") for v, name in ((m, "m"), (n, "n"), (k, "k")))
    if _core.native().backend != "cuda":
        return
    esize = _torch.empty(0, dtype=dtype).element_size()
    members = _members(team, group, "symheap.gemm.reserve")
    if op == "all_gather_matmul":
        # Triton only on the CUDA backend (here): the host backend runs without it.
        from . import _kernels as gk

        # The engine is chosen per shape by the tuner (unknown here, without B): under "auto"
        # both engines' workspaces are sized.
        eng = gk.engine()
        if eng != "cublas":
            _pool.get(("ag", members), _ag_needs(m, k, esize), op)
        if eng != "triton":
            _pool.get(("agce", members), (_ag_needs(m, k, esize)[0], 2), op)
    elif op == "matmul_reduce_scatter":
        _pool.get(("rs", members), _rs_needs(m // len(members), n, esize), op)
    else:
        raise SymheapValueError(
            f"symheap.gemm.reserve: op must be 'all_gather_matmul' or 'matmul_reduce_scatter', not {op!r}"
        )


# ---- host backend (unfused, correct) ----------------------------------------------------------


def _host_ag(a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor, gathered: Optional[_torch.Tensor]) -> None:
    n = _core.native().n_pes
    src_b = _workspace.aligned(a.numel() * a.element_size())
    buf = _workspace.staging(None, src_b + n * a.numel() * a.element_size())
    src = _workspace.region(buf, 0, a)
    dst = _workspace.region(buf, src_b, a, (n * a.shape[0], a.shape[1]))
    src.copy_(a)
    _shmem.all_gather(dst, src)
    if gathered is not None:
        gathered.copy_(dst)
    out.copy_(dst.float() @ b.float())


def _host_rs(a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor) -> None:
    part = (a.float() @ b.float()).to(out.dtype).float()
    like = part.reshape(-1)
    blk = out.numel()
    buf = _workspace.staging(None, _workspace.aligned(part.numel() * 4) + blk * 4)
    src = _workspace.region(buf, 0, like)
    dst = _workspace.region(buf, _workspace.aligned(part.numel() * 4), like, (blk,))
    src.copy_(like)
    _shmem.reduce_scatter(dst, src, "sum")
    out.copy_(dst.view(out.shape))


# ---- CUDA backend -----------------------------------------------------------------------------
# The kernels module is imported where it is used: it needs Triton, which the host backend runs
# without.


def _check_cuda(x: _torch.Tensor, what: str) -> None:
    if _core.native().backend != "cuda" or x.device != st.device():
        raise SymheapValueError(f"{what}: symheap's memory of this PE is on {st.device()}, the tensors on {x.device}")


def _one_pe(a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor, gathered: Optional[_torch.Tensor]) -> None:
    """Either op at one PE, where the gather and the reduction are the identity: cuBLAS with
    fp32 reductions (the kernels' numerics: each element the fp32 sum over K, rounded once)
    straight into ``out``; no workspace, no flags, no tuning."""
    from . import _kernels as k  # Triton (see above)

    with _torch.cuda.device(a.device), k._ExactMath():
        _torch.mm(a, b, out=out)
        if gathered is not None:
            gathered.copy_(a)


def _cuda_ag(a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor, gathered: Optional[_torch.Tensor]) -> None:
    from . import _kernels as k  # Triton (see above)

    members = _members(None, None, "all_gather_matmul")
    npes = len(members)
    if npes == 1:
        return _one_pe(a, b, out, gathered)
    with _torch.cuda.device(a.device):
        sms = _sms(a.device)
        cfg = _tune.choose("ag", a.shape[0], npes, b, a.dtype, k.ag_gemm_sms(sms, npes), a.device)
        if cfg == k.CUBLAS:
            return _cuda_ag_ce(a, b, out, gathered, members)
        w = _pool.get(("ag", members), _ag_needs(a.shape[0], a.shape[1], a.element_size()), "all_gather_matmul")
        slot_bytes, flag_stride = w.size
        slot_elems = slot_bytes // a.element_size()
        k.launch_ag(
            a, b, out, gathered, w.regions["ws"].view(a.dtype), w.regions["flags"], w.ctr, w.bases, w.me, w.npes,
            slot_elems, flag_stride, sms, _timeout_ns(), cfg,
        )  # fmt: skip


def _cuda_ag_ce(
    a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor, gathered: Optional[_torch.Tensor], members: Tuple[int, ...]
) -> None:
    """The copy-engine + cuBLAS engine (:func:`symheap.gemm._kernels.launch_ag_ce`)."""
    from . import _kernels as k  # Triton (see above)

    m_loc, kdim = a.shape
    bytes_, _ = _ag_needs(m_loc, kdim, a.element_size())
    w = _pool.get(("agce", members), (bytes_, 2), "all_gather_matmul")
    slot_bytes, flag_stride = w.size
    vkey = (a.dtype, m_loc, kdim, slot_bytes)
    # The slot views by shape, peer copies included (dropped with the slots when the workspace grows).
    views = w.cache.get(vkey)
    if views is None:
        slot_elems = slot_bytes // a.element_size()
        flat = w.regions["ws"].view(a.dtype)
        slots = [flat[s * slot_elems : s * slot_elems + m_loc * kdim].view(m_loc, kdim) for s in range(w.npes)]
        peers = [st.get_peer_tensor(slots[w.me], members[q]) if q != w.me else None for q in range(w.npes)]
        views = w.cache[vkey] = (slots, peers)
    k.launch_ag_ce(
        a, b, out, gathered, *views, w.regions["flags"], w.ctr, w.bases, w.me, w.npes, flag_stride, _timeout_ns()
    )


def _cuda_rs(a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor) -> None:
    from . import _kernels as k  # Triton (see above)

    members = _members(None, None, "matmul_reduce_scatter")
    if len(members) == 1:
        return _one_pe(a, b, out, None)
    need = _rs_needs(out.shape[0], out.shape[1], out.element_size())
    w = _pool.get(("rs", members), need, "matmul_reduce_scatter")
    slot_bytes, flag_stride = w.size
    slot_elems = slot_bytes // out.element_size()
    with _torch.cuda.device(a.device):
        sms = _sms(a.device)
        cfg = _tune.choose("rs", out.shape[0], w.npes, b, a.dtype, sms, a.device)
        k.launch_rs(
            a, b, out, w.regions["ws"].view(out.dtype), w.regions["flags"], w.ctr, w.bases, w.me, w.npes, slot_elems,
            flag_stride, sms, _timeout_ns(), cfg,
        )  # fmt: skip


# ---- the custom ops ---------------------------------------------------------------------------


@_library.op("symheap::all_gather_matmul", mutates_args=("out", "gathered"))
def _ag_op(
    a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor, gathered: _torch.Tensor, want_gathered: bool, team_id: int
) -> None:
    """**Collective** over the team: the op behind :func:`all_gather_matmul` (``team_id`` -1:
    the world, the only team so far; ``gathered`` is written when ``want_gathered``)."""
    if out.numel() == 0 and (not want_gathered or gathered.numel() == 0):
        return
    g = gathered if want_gathered else None
    if a.device.type == "cuda":
        _check_cuda(a, "all_gather_matmul")
        _cuda_ag(a, b, out, g)
    else:
        if _core.native().backend == "cuda":
            raise SymheapValueError(f"all_gather_matmul: symheap runs on CUDA, the tensors are on {a.device}")
        _host_ag(a, b, out, g)


@_ag_op.register_fake
def _ag_op_fake(a, b, out, gathered, want_gathered, team_id) -> None:
    return None


@_library.op("symheap::matmul_reduce_scatter", mutates_args=("out",))
def _rs_op(a: _torch.Tensor, b: _torch.Tensor, out: _torch.Tensor, team_id: int) -> None:
    """**Collective** over the team: the op behind :func:`matmul_reduce_scatter` (``team_id``
    -1: the world)."""
    if out.numel() == 0:
        return
    if a.device.type == "cuda":
        _check_cuda(a, "matmul_reduce_scatter")
        _cuda_rs(a, b, out)
    else:
        if _core.native().backend == "cuda":
            raise SymheapValueError(f"matmul_reduce_scatter: symheap runs on CUDA, the tensors are on {a.device}")
        _host_rs(a, b, out)


@_rs_op.register_fake
def _rs_op_fake(a, b, out, team_id) -> None:
    return None


# ---- the public functions ---------------------------------------------------------------------


def _check_ab(a: Any, b: Any, what: str) -> Tuple[_torch.Tensor, _torch.Tensor]:
    if not isinstance(a, _torch.Tensor) or not isinstance(b, _torch.Tensor):
        raise SymheapValueError(f"{what}: a and b must be tensors")
    if a.dtype not in _DTYPES:
        raise SymheapValueError(f"{what}: a must be bfloat16 or float16, not {a.dtype}")
    if b.dtype != a.dtype:
        raise SymheapValueError(f"{what}: a and b must have one dtype ({a.dtype}, {b.dtype})")
    if a.dim() != 2 or b.dim() != 2:
        raise SymheapValueError(f"{what}: a and b must be 2-D, not {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise SymheapValueError(f"{what}: a is {tuple(a.shape)}, b {tuple(b.shape)}: inner dimensions differ")
    if b.device != a.device:
        raise SymheapValueError(f"{what}: a and b must be on one device ({a.device}, {b.device})")
    if a.stride(-1) != 1 or (a.shape[0] > 1 and a.stride(0) != a.shape[1]):
        a = a.contiguous()
    # b row-major (K, N) or the transpose of a row-major (N, K): the kernels take both strides.
    if not (b.stride(1) == 1 or b.stride(0) == 1):
        b = b.contiguous()
    return a, b


def _check_out(o: Optional[_torch.Tensor], shape: Any, like: _torch.Tensor, what: str, name: str) -> None:
    if o is None:
        return
    if tuple(o.shape) != tuple(shape) or o.dtype != like.dtype or o.device != like.device:
        raise SymheapValueError(
            f"{what}: {name} must be {tuple(shape)} {like.dtype} on {like.device}, "
            f"not {tuple(o.shape)} {o.dtype} on {o.device}"
        )
    if not o.is_contiguous():
        raise SymheapValueError(f"{what}: {name} must be contiguous")


def _dim0(dim: int, what: str, name: str) -> None:
    if dim not in (0, -2):
        raise SymheapUnsupportedError(f"{what}: only {name}=0 (rows of a) is supported, not {dim}")


def all_gather_matmul(
    a_shard: _torch.Tensor,
    b: _torch.Tensor,
    gather_dim: int = 0,
    *,
    team: Optional[Team] = None,
    group: Any = None,
    return_gathered: bool = False,
    out: Optional[_torch.Tensor] = None,
    gathered_out: Optional[_torch.Tensor] = None,
) -> Union[_torch.Tensor, Tuple[_torch.Tensor, _torch.Tensor]]:
    """**Collective** over ``team`` (the world when None; ``group``: a torch.distributed group
    spanning the world, accepted for torch's signature): ``C = all_gather(a_shard) @ b`` with
    the gather overlapped with the GEMM. Every PE of the team calls it in the same order, with
    the same shapes, dtype and ``return_gathered``.

    ``a_shard``: ``(m, K)``, this PE's rows of A (PE p's rows are rows ``p*m .. (p+1)*m`` of the
    gathered A); ``b``: ``(K, N)``, row-major or a transposed view (``w.t()``). bfloat16 or
    float16; fp32 accumulation, rounded once. ``gather_dim``: 0 only. Returns ``C`` of shape
    ``(n*m, N)``, or ``(C, gathered A)`` with ``return_gathered``. ``out`` / ``gathered_out``:
    optional contiguous destinations. CUDA: capturable in CUDA graphs (warm up once first, or
    :func:`reserve`); host backend: all_gather then matmul (unfused).
    """
    what = "all_gather_matmul"
    a_shard, b = _check_ab(a_shard, b, what)
    _dim0(gather_dim, what, "gather_dim")
    _members(team, group, what)
    n = _core.native().n_pes
    m, k = a_shard.shape
    _check_out(out, (n * m, b.shape[1]), a_shard, what, "out")
    if gathered_out is not None and not return_gathered:
        raise SymheapValueError(f"{what}: gathered_out is given without return_gathered=True")
    _check_out(gathered_out, (n * m, k), a_shard, what, "gathered_out")
    if out is None:
        out = _torch.empty((n * m, b.shape[1]), dtype=a_shard.dtype, device=a_shard.device)
    g = gathered_out
    if g is None:
        g = _torch.empty((n * m if return_gathered else 0, k), dtype=a_shard.dtype, device=a_shard.device)
    _ag_op(a_shard, b, out, g, bool(return_gathered), -1)
    return (out, g) if return_gathered else out


def matmul_reduce_scatter(
    a: _torch.Tensor,
    b: _torch.Tensor,
    scatter_dim: int = 0,
    op: str = "sum",
    *,
    team: Optional[Team] = None,
    group: Any = None,
    out: Optional[_torch.Tensor] = None,
) -> _torch.Tensor:
    """**Collective** over ``team`` (the world when None; ``group`` as in
    :func:`all_gather_matmul`): every PE computes its partial ``a @ b`` (``(M, K) @ (K, N)``);
    PE p gets rows ``p*M/n .. (p+1)*M/n`` of the sum over PEs, with the reduction overlapped
    with the GEMM. Every PE calls it in the same order with the same shapes and dtype.

    ``M`` must be a multiple of the number of PEs (any M/n: ragged tiles are masked); ``b``
    row-major or a transposed view. Partials are rounded once to the dtype, summed in fp32,
    rounded once. ``scatter_dim``: 0 only; ``op``: ``"sum"`` only. Returns ``(M/n, N)``;
    ``out``: an optional contiguous destination. CUDA: capturable (warm up once, or
    :func:`reserve`); host backend: matmul then reduce_scatter (unfused).
    """
    what = "matmul_reduce_scatter"
    a, b = _check_ab(a, b, what)
    _dim0(scatter_dim, what, "scatter_dim")
    if op != "sum":
        raise SymheapUnsupportedError(f"{what}: only op='sum' is supported, not {op!r}")
    _members(team, group, what)
    n = _core.native().n_pes
    m = a.shape[0]
    if m % n:
        raise SymheapValueError(f"{what}: a has {m} rows, not a multiple of the {n} PEs")
    _check_out(out, (m // n, b.shape[1]), a, what, "out")
    if out is None:
        out = _torch.empty((m // n, b.shape[1]), dtype=a.dtype, device=a.device)
    _rs_op(a, b, out, -1)
    return out
