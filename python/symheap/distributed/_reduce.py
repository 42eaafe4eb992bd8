"""torch.distributed's reductions and dtypes in symheap's terms, for the backend.

symheap's collectives move and reduce its own dtypes (``symheap._native.DTYPES``: the integers
of 8 to 64 bits, float16, bfloat16, float32, float64). Every other dtype torch's backends take is
mapped here to one of them by a scheme that is exact:

* **Moving bytes** (all_gather, broadcast, all_to_all, scatter, gather, send/recv): any dtype
  is moved as its bytes: ``bool`` and the float8 types as ``uint8``, complex as its real pairs.
* **Integer SUM and PRODUCT** wrap modulo 2^k in the integer's own width (symheap's host
  reduction uses wrapping arithmetic), which is what torch's integer arithmetic and NCCL give.
* **bool** follows ProcessGroupNCCL: reduced as ``uint8`` 0/1 with SUM as MAX (logical or) and
  PRODUCT as MIN (logical and); MIN and MAX are themselves.
* **float64** is reduced in float64 by symheap (never through float32); float16 and bfloat16
  accumulate in float32 and round once.
* **complex** is reduced as its real pairs for SUM, AVG and PREMUL_SUM (what NCCL does); MIN,
  MAX and PRODUCT of complex numbers are refused.
* **PREMUL_SUM** (``dist._make_nccl_premul_sum(factor)``, used by FSDP) multiplies the input by
  the factor, then sums. **AVG** sums, then divides by the group's size (floating dtypes).

Refused, with :class:`symheap.SymheapUnsupportedError` naming the call and the dtype: reductions
of float8 (as ProcessGroupNCCL refuses them), the bitwise reductions BAND/BOR/BXOR (symheap's
reductions are sum/min/max/prod), AVG of integers.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch as _torch
import torch.distributed as dist

from .._core import torch_dtype_name
from .._native import SymheapUnsupportedError, SymheapValueError

_R = dist.ReduceOp.RedOpType
_REDUCE_OP = dist.ReduceOp
# Keyed by the enum's int: hashing torch's pybind enum for a dict lookup cost ~1.7 us per call
# on the development VM (more than the rest of the lookup), its int ~0.7 us.
_KIND = {
    int(k): v
    for k, v in {
        _R.SUM: "sum",
        _R.AVG: "avg",
        _R.MIN: "min",
        _R.MAX: "max",
        _R.PRODUCT: "prod",
        _R.PREMUL_SUM: "premul_sum",
        _R.BAND: "band",
        _R.BOR: "bor",
        _R.BXOR: "bxor",
    }.items()
}

_FLOAT8 = tuple(
    getattr(_torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(_torch, n)
)

# dtype -> the dtype its bytes move as (None: symheap moves it as it is).
_BYTES_AS: dict = {}


def kind_of(op: Any) -> Optional[str]:
    """The name of torch's ``ReduceOp`` (or ``RedOpType``) ``op`` (sum, avg, min, max, prod,
    premul_sum, band, bor, bxor), None for anything else."""
    # A ReduceOp holds its RedOpType. ``.value``, not ``int()``: int() of torch's pybind enum
    # cost 1.4 us on the development VM, ``.value`` 0.7 (every reduction through the backend).
    redop = op.op if type(op) is _REDUCE_OP else op
    return _KIND.get(redop.value) if type(redop) is _R else None


def reduce_op(op: Any, what: str) -> Tuple[str, Any]:
    """``(kind, factor)`` of torch's ``ReduceOp`` (or a ``RedOpType``): kind one of sum, avg,
    min, max, prod, premul_sum; factor the PREMUL_SUM scalar (a number or a tensor), else
    None. A bitwise reduction raises :class:`SymheapUnsupportedError`."""
    factor = None
    kind = kind_of(op)
    if kind is None:
        raise SymheapValueError(f"{what}: unknown reduction {op!r}")
    if kind == "premul_sum":
        factor = op.__getstate__()[1]
    if kind in ("band", "bor", "bxor"):
        raise SymheapUnsupportedError(
            f"{what}: ReduceOp.{kind.upper()} is not supported by the symheap backend (its reductions are SUM, "
            "AVG, MIN, MAX, PRODUCT and PREMUL_SUM)"
        )
    return kind, factor


def bytes_view(t: _torch.Tensor) -> _torch.Tensor:
    """``t`` as a dtype symheap moves, same bytes (a view: writes through it land in ``t``)."""
    dt = t.dtype
    try:
        as_ = _BYTES_AS[dt]
    except KeyError:
        as_ = _bytes_as(dt)
        _BYTES_AS[dt] = as_
    if as_ is None:
        return t
    if dt.is_complex:
        return _torch.view_as_real(t)
    return t.view(as_)


def _bytes_as(dt: _torch.dtype) -> Optional[_torch.dtype]:
    if dt.is_complex:
        return {_torch.complex64: _torch.float32, _torch.complex128: _torch.float64}.get(dt, _torch.float16)
    try:
        torch_dtype_name(dt)
        return None
    except SymheapValueError:
        pass
    size = _torch.empty(0, dtype=dt).element_size()
    by_size = {1: _torch.uint8, 2: _torch.int16, 4: _torch.int32, 8: _torch.int64}
    if size not in by_size:
        raise SymheapUnsupportedError(f"dtype {dt} ({size}-byte elements) cannot be moved by the symheap backend")
    return by_size[size]


def for_reduction(t: _torch.Tensor, kind: str, what: str) -> Tuple[_torch.Tensor, str]:
    """``(view of t, symheap reduction)`` that reduces ``t``'s values exactly as torch means
    ``kind`` on ``t.dtype`` (see the module's doc); refuses what has no exact scheme. ``kind``
    premul_sum is returned as sum (the caller scaled the input)."""
    dt = t.dtype
    op = "sum" if kind == "premul_sum" else kind
    if dt == _torch.bool:
        if kind in ("avg", "premul_sum"):
            raise SymheapUnsupportedError(f"{what}: ReduceOp.{kind.upper()} of a bool tensor is not defined")
        return t.view(_torch.uint8), {"sum": "max", "prod": "min"}.get(op, op)
    if dt in _FLOAT8:
        raise SymheapUnsupportedError(
            f"{what}: reductions of {dt} are not supported by the symheap backend (as ProcessGroupNCCL, it "
            "moves float8 tensors but does not reduce them)"
        )
    if dt.is_complex:
        if op not in ("sum", "avg"):
            raise SymheapUnsupportedError(f"{what}: ReduceOp.{kind.upper()} of complex tensors is not defined")
        return bytes_view(t), op
    if op == "avg" and not dt.is_floating_point:
        raise SymheapUnsupportedError(f"{what}: ReduceOp.AVG of an integer tensor ({dt}) is not supported")
    view = bytes_view(t)
    if view is not t:
        raise SymheapUnsupportedError(f"{what}: reductions of {dt} are not supported by the symheap backend")
    return t, op
