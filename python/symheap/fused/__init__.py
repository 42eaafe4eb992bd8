"""Fused all_reduce + residual add + RMSNorm: the per-layer tail of a tensor-parallel decode step
(what TensorRT-LLM's and FlashInfer's ``allreduce_fusion`` do)::

    residual_out = all_reduce(x) + residual
    out          = rmsnorm(residual_out) * weight          (optionally FP8 e4m3 with a scale)

:func:`all_reduce_residual_rmsnorm` is the function to call; it is also the ``torch.library``
custom op ``symheap::fused_all_reduce_rmsnorm`` (with a fake kernel), so ``torch.compile``
(``fullgraph=True``) traces it without a graph break and CUDA graphs capture it.

CUDA backend: **one kernel per PE** on torch's current stream (the Triton kernel of
:mod:`symheap.fused._kernels`: a one-shot push into a symmetric staging workspace, one release
flag per CTA and PE carrying a device-side epoch, double buffering by epoch parity; its module
docstring gives the protocol). ``x`` and ``residual`` are ordinary tensors; no host
synchronisation, capturable. At one PE the all_reduce is the identity: one add + RMSNorm
kernel, one CTA per row, with no workspace (none to make before capture).

Host backend (CPU tensors): symheap's host ``all_reduce`` of ``x`` (in fp32, through a
symmetric staging buffer), then the residual add and RMSNorm in fp32 with torch on the CPU.
That is not one kernel; it has the same semantics and is what CI tests.

Semantics (both backends): the sum over PEs and ``+ residual`` in fp32, rounded once to the
input dtype (``residual_out``); the RMS is computed in fp32 from that rounded ``residual_out``
(so ``out`` equals an unfused RMSNorm of the returned ``residual_out``); ``out = r *
rsqrt(mean(r^2) + eps) * weight`` in fp32, rounded to the input dtype or quantised to FP8.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

try:
    import torch as _torch
except ImportError as _e:  # say which extra installs it
    from .._requires import reraise

    reraise(_e, "torch", "symheap.fused")

from .. import _core, _library, _shmem, _workspace
from .. import torch as st
from .._native import SymheapUnsupportedError, SymheapValueError, Team
from .._workspace import Workspace

__all__ = ["all_reduce_residual_rmsnorm", "reserve", "MAX_HIDDEN_CUDA"]

# The largest hidden size the CUDA kernel holds in registers (one row per CTA).
MAX_HIDDEN_CUDA = 16384
_DTYPES = (_torch.bfloat16, _torch.float16)
_FP8_MODES = {None: 0, "per_tensor": 1, "per_token": 2}
_E4M3_MAX = 448.0
# Staging bytes per (parity, PE) slot at least (grown to fit a call when not capturing).
_MIN_SLOT_BYTES = 4 << 20
# Flag slots per PE (CTAs of one launch at most).
_MAX_CTAS = 1024


def _members(team: Optional[Team]) -> Tuple[int, ...]:
    n = _core.native().n_pes
    if team is not None and (not team.is_valid or team.n_pes() != n):
        # A smaller team's workspace would be a world-collective allocation made by its members
        # only; not supported yet.
        raise SymheapUnsupportedError(
            "all_reduce_residual_rmsnorm: only the world team is supported (team=None or the world)"
        )
    return tuple(range(n))


def _make(members: Tuple[int, ...], size: Tuple[int, ...]) -> Workspace:
    """**Collective** over the world: the staging ``ws`` (uint8 ``[2 parities][npes][slot
    bytes]``, ``size = (slot bytes,)``); on CUDA also the release ``flags`` (int64
    ``[_MAX_CTAS][npes]``, zeroed on every PE before any peer's first signal: a stream-ordered
    barrier), the device-side epoch counter and the members' heap bases."""
    npes = len(members)
    regions = {"ws": (2 * npes * size[0], _torch.uint8)}
    if _core.native().backend != "cuda":
        return Workspace(members, size, regions)
    regions["flags"] = (_MAX_CTAS * npes, _torch.int64)
    return Workspace(members, size, regions, zeroed=("flags",), counters=4, bases=True, barrier=True)


def _slot_size(size: Tuple[int, ...]) -> Tuple[int, ...]:
    return (max(_MIN_SLOT_BYTES, -(-size[0] // 256) * 256),)


# One workspace per team; during capture a call larger than it is split into launches that fit.
_pool = _workspace.Pool(
    "all_reduce_residual_rmsnorm",
    _make,
    size_for=_slot_size,
    under_capture="reuse",
    hint="run the same call once before capture, or call symheap.fused.reserve(max_tokens, hidden, dtype) on "
    "every PE first",
)


def _workspace_for(team: Optional[Team], need_slot_bytes: int) -> Workspace:
    return _pool.get(_members(team), (need_slot_bytes,))


@functools.lru_cache(maxsize=None)
def _max_ctas(device_index: int) -> int:
    """CTAs of one launch: one per SM, at most the flag slots."""
    return min(_torch.cuda.get_device_properties(device_index).multi_processor_count, _MAX_CTAS)


def reserve(max_tokens: int, hidden: int, dtype: Any = _torch.bfloat16, team: Optional[Team] = None) -> None:
    """**Collective** over the world (every PE, in the same order): makes the staging workspace
    hold ``max_tokens`` rows of ``hidden`` elements of ``dtype``, so that a CUDA graph can
    capture calls up to that size without a warm-up call (a call larger than the workspace during
    capture is split into several launches). Optional in eager mode: the first call allocates and
    a larger later call grows it. Not during CUDA graph capture."""
    if _workspace.capturing():
        raise SymheapValueError("symheap.fused.reserve cannot run during CUDA graph capture; call it before")
    esize = _torch.empty(0, dtype=dtype).element_size()
    rows = _core.index_arg(max_tokens, "max_tokens")
    need = rows * _core.index_arg(hidden, "hidden") * max(esize, 4)
    _pool.reserve(_members(team), (need,), "symheap.fused.reserve")


def _timeout_ns() -> int:
    # The context's own bound (SYMHEAP_TIMEOUT or init(timeout=), validated at init).
    return int(_core.native().timeout_ns)


def _host_path(
    x: _torch.Tensor,
    residual: _torch.Tensor,
    weight: _torch.Tensor,
    eps: float,
    out: _torch.Tensor,
    residual_out: _torch.Tensor,
    scale_in: Optional[_torch.Tensor],
    scale_out: _torch.Tensor,
    fp8: int,
    team: Optional[Team],
) -> None:
    t, h = x.shape
    w = _workspace_for(team, t * h * 4)
    n = t * h
    slot_bytes = w.size[0]
    # fp32 staging in parity slot 0 (source) and 1 (result) of this PE's own slot.
    stage = w.regions["ws"][: 2 * slot_bytes].view(_torch.float32)
    half = slot_bytes // 4
    src, dst = stage[:n], stage[half : half + n]
    src.copy_(x.reshape(-1))
    _shmem.all_reduce(dst, src, "sum", team)
    r = (dst.view(t, h) + residual.float()).to(residual_out.dtype)
    residual_out.copy_(r)
    rf = r.float()
    y = rf * _torch.rsqrt(rf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    _store_out(y, out, scale_in, scale_out, fp8)


def _store_out(
    y: _torch.Tensor, out: _torch.Tensor, scale_in: Optional[_torch.Tensor], scale_out: _torch.Tensor, fp8: int
) -> None:
    if fp8 == 0:
        out.copy_(y)
        return
    if fp8 == 1:
        s = scale_in.float().reshape(1, 1)
    else:
        s = y.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / _E4M3_MAX
        scale_out.copy_(s)
    out.copy_((y / s).clamp(-_E4M3_MAX, _E4M3_MAX))


def _cuda_path(
    x: _torch.Tensor,
    residual: _torch.Tensor,
    weight: _torch.Tensor,
    eps: float,
    out: _torch.Tensor,
    residual_out: _torch.Tensor,
    scale_in: Optional[_torch.Tensor],
    scale_out: _torch.Tensor,
    fp8: int,
    team: Optional[Team],
) -> None:
    # Triton only on the CUDA path: the host backend runs without it.
    from . import _kernels as k

    t, h = x.shape
    if h > MAX_HIDDEN_CUDA:
        raise SymheapUnsupportedError(
            f"all_reduce_residual_rmsnorm: hidden size {h} is larger than the CUDA kernel's {MAX_HIDDEN_CUDA}"
        )
    if _core.native().n_pes == 1:
        # The all_reduce of one PE is the identity: no workspace, no staging, no flags.
        scale = scale_in if fp8 == 1 else (scale_out if fp8 == 2 else weight)
        _launch_on(x.device, k.launch_one_pe, x, residual, weight, out, residual_out, scale, float(eps), fp8)
        return
    esize = x.element_size()
    w = _workspace_for(team, t * h * esize)
    slot_elems = w.size[0] // esize
    rows = max(1, slot_elems // h)
    ws = w.regions["ws"].view(x.dtype)
    flags = w.regions["flags"]
    max_ctas = _max_ctas(x.device.index)
    scale = scale_in if fp8 == 1 else scale_out
    if fp8 == 0:
        scale = w.ctr  # unused by the kernel; any pointer
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        # One launch (the usual case) takes the tensors as they are: no views to make.
        whole = r0 == 0 and r1 == t
        sc = scale[r0:r1] if fp8 == 2 and not whole else scale
        _launch_on(
            x.device,
            k.launch,
            x if whole else x[r0:r1],
            residual if whole else residual[r0:r1],
            weight,
            out if whole else out[r0:r1],
            residual_out if whole else residual_out[r0:r1],
            sc,
            ws,
            flags,
            w.ctr,
            w.bases,
            w.me,
            w.npes,
            slot_elems,
            max_ctas,
            float(eps),
            _timeout_ns(),
            fp8,
        )


def _launch_on(dev: _torch.device, fn: Any, *args: Any) -> None:
    # Triton launches on torch's current device: make it the tensors' one.
    if _torch.cuda.current_device() == dev.index:
        fn(*args)
        return
    with _torch.cuda.device(dev):
        fn(*args)


# ---- the custom op --------------------------------------------------------------------------


def _fused_impl(
    x: _torch.Tensor,
    residual: _torch.Tensor,
    weight: _torch.Tensor,
    eps: float,
    out: _torch.Tensor,
    residual_out: _torch.Tensor,
    scale_in: Optional[_torch.Tensor],
    scale_out: _torch.Tensor,
    fp8: int,
    team_id: int,
) -> None:
    """**Collective** over the team: the op behind :func:`all_reduce_residual_rmsnorm`."""
    team = None  # team_id: -1 (the world) is the only team so far
    if x.numel() == 0:
        return
    if x.device.type == "cuda":
        if _core.native().backend != "cuda" or x.device != st.device():
            raise SymheapValueError(
                f"all_reduce_residual_rmsnorm: symheap's memory of this PE is on {st.device()}, "
                f"the tensors on {x.device}"
            )
        _cuda_path(x, residual, weight, eps, out, residual_out, scale_in, scale_out, fp8, team)
    else:
        if _core.native().backend == "cuda":
            raise SymheapValueError(f"all_reduce_residual_rmsnorm: symheap runs on CUDA, the tensors are on {x.device}")
        _host_path(x, residual, weight, eps, out, residual_out, scale_in, scale_out, fp8, team)


_fused_op = _library.op("symheap::fused_all_reduce_rmsnorm", mutates_args=("out", "residual_out", "scale_out"))(
    _fused_impl
)


@_fused_op.register_fake
def _fused_op_fake(x, residual, weight, eps, out, residual_out, scale_in, scale_out, fp8, team_id) -> None:
    return None


# ---- the public function --------------------------------------------------------------------


def _check(x: _torch.Tensor, residual: _torch.Tensor, weight: _torch.Tensor) -> None:
    if not isinstance(x, _torch.Tensor) or not isinstance(residual, _torch.Tensor):
        raise SymheapValueError("all_reduce_residual_rmsnorm: x and residual must be tensors")
    if x.dtype not in _DTYPES:
        raise SymheapValueError(f"all_reduce_residual_rmsnorm: x must be bfloat16 or float16, not {x.dtype}")
    if residual.dtype != x.dtype or weight.dtype != x.dtype:
        raise SymheapValueError(
            f"all_reduce_residual_rmsnorm: x, residual and weight must have one dtype "
            f"({x.dtype}, {residual.dtype}, {weight.dtype})"
        )
    if x.dim() != 2:
        raise SymheapValueError(f"all_reduce_residual_rmsnorm: x must be 2-D (tokens, hidden), not {tuple(x.shape)}")
    if residual.shape != x.shape:
        raise SymheapValueError(
            f"all_reduce_residual_rmsnorm: residual has shape {tuple(residual.shape)}, x {tuple(x.shape)}"
        )
    if weight.dim() != 1 or weight.shape[0] != x.shape[1]:
        raise SymheapValueError(
            f"all_reduce_residual_rmsnorm: weight has shape {tuple(weight.shape)}, hidden size is {x.shape[1]}"
        )
    if residual.device != x.device or weight.device != x.device:
        raise SymheapValueError("all_reduce_residual_rmsnorm: x, residual and weight must be on one device")


def _check_out(o: Optional[_torch.Tensor], shape: Any, dtype: Any, device: Any, what: str) -> None:
    if o is None:
        return
    if o.shape != shape or o.dtype != dtype or o.device != device:
        raise SymheapValueError(
            f"all_reduce_residual_rmsnorm: {what} must be {tuple(shape)} {dtype} on {device}, "
            f"not {tuple(o.shape)} {o.dtype} on {o.device}"
        )
    if not o.is_contiguous():
        raise SymheapValueError(f"all_reduce_residual_rmsnorm: {what} must be contiguous")


def all_reduce_residual_rmsnorm(
    x: _torch.Tensor,
    residual: _torch.Tensor,
    weight: _torch.Tensor,
    eps: float = 1e-6,
    *,
    team: Optional[Team] = None,
    out: Optional[_torch.Tensor] = None,
    residual_out: Optional[_torch.Tensor] = None,
    fp8: Optional[str] = None,
    scale: Optional[_torch.Tensor] = None,
) -> Tuple[_torch.Tensor, ...]:
    """**Collective** over ``team`` (the world when None): ``residual_out = all_reduce(x) +
    residual`` and ``out = rmsnorm(residual_out) * weight``. Every PE of the team calls it in the
    same order, with the same shapes, dtypes and ``fp8`` mode (values differ per PE).

    ``x``, ``residual``: ``(tokens, hidden)``, bfloat16 or float16, ordinary tensors (CPU on the
    host backend, CUDA on the CUDA backend); ``weight``: ``(hidden,)``, same dtype. Any token
    count (0 too); hidden up to :data:`MAX_HIDDEN_CUDA` on CUDA. ``out`` / ``residual_out``:
    optional contiguous destinations (allocated when None). ``fp8``: None (``out`` in x's dtype),
    ``"per_tensor"`` (``out`` float8_e4m3fn of ``y / scale``, ``scale`` a float32 tensor of one
    element given by the caller) or ``"per_token"`` (the scale of each row computed as
    ``max(amax(|y_row|), 1e-12) / 448`` and returned as a ``(tokens, 1)`` float32 tensor).
    Values saturate at ±448.

    Returns ``(out, residual_out)``, or ``(out, residual_out, scale)`` for ``"per_token"``.

    CUDA: one kernel on the current stream, capturable in CUDA graphs (the workspace must exist
    before capture: run the call once, or :func:`reserve`); consecutive calls on a team must be
    stream-ordered. Host backend: symheap's host all_reduce, then torch on the CPU (not one
    kernel). Errors: :class:`symheap.SymheapValueError` for shapes, dtypes and devices,
    :class:`symheap.SymheapUnsupportedError` for a hidden size the CUDA kernel does not hold.
    """
    _check(x, residual, weight)
    if team is not None:
        _members(team)  # the world team only, for now
    if fp8 not in _FP8_MODES:
        raise SymheapValueError(
            f"all_reduce_residual_rmsnorm: fp8 must be None, 'per_tensor' or 'per_token', not {fp8!r}"
        )
    mode = _FP8_MODES[fp8]
    if mode == 1:
        if scale is None or scale.numel() != 1 or scale.dtype != _torch.float32 or scale.device != x.device:
            raise SymheapValueError(
                "all_reduce_residual_rmsnorm: fp8='per_tensor' needs scale, a float32 tensor of one "
                "element on x's device"
            )
    elif scale is not None:
        raise SymheapValueError("all_reduce_residual_rmsnorm: scale is an input only with fp8='per_tensor'")
    out_dtype = _torch.float8_e4m3fn if mode else x.dtype
    _check_out(out, x.shape, out_dtype, x.device, "out")
    _check_out(residual_out, x.shape, x.dtype, x.device, "residual_out")
    x = x.contiguous()
    residual = residual.contiguous()
    weight = weight.contiguous()
    if out is None:
        out = _torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if residual_out is None:
        residual_out = _torch.empty_like(x)
    rows = x.shape[0] if mode == 2 else 0
    scale_out = _torch.empty((rows, 1), dtype=_torch.float32, device=x.device)
    args = (x, residual, weight, float(eps), out, residual_out, scale if mode == 1 else None, scale_out, mode, -1)
    # Eager code skips the dispatcher's per-call cost (the same kernel runs); compilers, fake
    # tensors and dispatch modes go through the op and its fake kernel.
    _fused_op(*args)
    if mode == 2:
        return out, residual_out, scale_out
    return out, residual_out
