"""Expert parallelism: MoE dispatch and combine over symmetric memory, in the shape of DeepEP::

    buf = symheap.moe.Buffer(hidden=7168, num_experts=256, num_topk=8, max_tokens_per_pe=128)
    recv_x, recv_idx, recv_w, num_per_expert, handle = buf.dispatch(x, topk_idx, topk_weights)
    y = experts(recv_x, num_per_expert)            # grouped GEMM over the expert-major rows
    out = buf.combine(y, handle)                   # sum over k of w[t, k] * y(t, k), fp32

Experts are spread evenly: PE ``p`` owns experts ``p*L .. (p+1)*L - 1`` (``L = num_experts /
n_pes``, local expert ``e`` of PE ``p`` is global expert ``p*L + e``). Each token goes **once**
to each PE that owns one of its experts; there it is copied into the block of every local
expert that it names.

Output layout (``recv_*``), expert-major: local expert ``e``'s rows hold its tokens ordered by
source PE, then by the token's index on its PE (a fixed order, the same at every call with the
same routing).
    * ``low_latency=True`` (decode): static shapes bounded by the buffer, no host
      synchronisation, capturable in a CUDA graph. ``recv_x`` is ``[L, cap, H]`` with ``cap =
      align_up(n_pes * max_tokens_per_pe, align)``; expert ``e``'s first
      ``num_recv_tokens_per_expert[e]`` rows are its tokens, the rest are unspecified.
    * ``low_latency=False`` (prefill): one host synchronisation sizes exact outputs: ``recv_x``
      is ``[R, H]`` with expert ``e``'s block at the sum of the earlier experts' counts, each
      rounded up to ``align`` rows; padding rows are zero.
``recv_topk_idx`` / ``recv_topk_weights``: per row, the token's ``K`` slots with experts of this
PE as local ids (others ``-1``, weights kept) and its weights; padding rows ``-1`` / ``0``.
``num_recv_tokens_per_expert``: ``[L]`` int32 on the device (unpadded counts).
FP8 (``use_fp8=True``, a buffer made with ``fp8=True``): the tokens travel as e4m3 with one
float32 scale per 128 elements (``x ≈ q * scale``), and ``recv_x`` is ``(q, scales)``.

Combine: ``combine(y, handle)`` takes the expert outputs in the layout ``dispatch`` returned
(the same shape, the buffer's dtype); each row goes back to its token's PE, which sums
``topk_weights[t, k] * y(t, k)`` over its routed slots in ascending ``k`` in fp32 (deterministic)
and rounds once to ``out_dtype`` (default: the buffer's dtype). ``topk_weights`` defaults to the
weights given to ``dispatch``.

Routing: ``topk_idx`` ``[T, K]`` (int64 or int32) names global experts, ``-1`` an empty slot; an
expert repeated in a token's row counts once (the first slot). ``T <= max_tokens_per_pe``, else
:class:`symheap.SymheapValueError` before anything is sent (on the PE with too many tokens;
every PE must obey the bound). Ids outside ``[-1, num_experts)`` are never sent; with ``check``
(the default in the normal mode) every PE raises :class:`symheap.SymheapValueError` naming the
PEs that passed them (the flag travels with the counts, so all PEs agree); unchecked (the
default in the low-latency mode: checking needs a host synchronisation) such slots are dropped
and ``Buffer.bad_routing`` (a device int32, 1 once any PE passed one here) records it.

**Collective**: the constructor, ``dispatch``, ``combine`` and ``destroy`` are called by every PE
of the world in the same order, with the same mode flags (``low_latency``, ``use_fp8``,
``check``) and the same buffer; token counts and routings differ per PE. Consecutive calls on a
PE must be stream-ordered (one stream, as a graph replay is).

How: the sender computes on the device where each token goes and writes the rows straight into
the receivers' symmetric staging buffers with the counts; one stream-ordered barrier; each PE
then gathers its rows into the expert-major layout; combine is the same in reverse. CUDA: the
Triton kernels of :mod:`symheap.moe._kernels` (a plan kernel, SM-store row moves to translated
peer addresses, a receive-plan kernel, the weighted sum: five launches and a barrier for a
low-latency dispatch); host backend: the torch plans of :mod:`symheap.moe._plan` and indexed
copies into the peers' mapped copies (the same layouts; ``SYMHEAP_MOE_TRITON=1`` runs the Triton
kernels there instead, under ``TRITON_INTERPRET=1``, which is how CI checks them). Staging and
combine buffers are double-buffered by the parity of a device-side call counter, so
back-to-back calls and graph replays never overwrite a slot a peer still reads. Also the
``torch.library`` ops ``symheap::moe_dispatch`` and ``symheap::moe_combine`` with fake kernels
(``torch.compile(fullgraph=True)`` traces them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

try:
    import torch as _torch
except ImportError as _e:  # say which extra installs it
    from .._requires import reraise

    reraise(_e, "torch", "symheap.moe")

from .. import _core, _library, _shmem, _workspace
from .. import torch as st
from .._native import SymheapUnsupportedError, SymheapValueError, Team
from .._workspace import Workspace
from . import _plan as plan

__all__ = ["Buffer", "Handle", "dequantize"]

_DTYPES = (_torch.bfloat16, _torch.float16)
FP8_BLOCK = 128

# The live buffers of the current context by id (the custom ops name their buffer by it): each
# buffer's symmetric memory is a workspace of this pool, which forgets them at finalize.
_pool = _workspace.Pool("symheap.moe.Buffer")
_next_id = [1]


@dataclass
class Handle:
    """What :meth:`Buffer.combine` needs from the :meth:`Buffer.dispatch` it answers."""

    comb_pe: _torch.Tensor  # [rows] home PE of each received row's token (-1: padding)
    comb_row: _torch.Tensor  # [rows] t * K + k there
    routed: _torch.Tensor  # [T, K] bool on this PE: slots that went to an expert
    weights: _torch.Tensor  # [T, K] float32: the weights given to dispatch
    recv_shape: Tuple[int, ...]  # shape of recv_x (without the FP8 scales)


def _world_only(team: Optional[Team], group: Any) -> None:
    n = _core.native().n_pes
    if team is not None and (not team.is_valid or team.n_pes() != n):
        raise SymheapUnsupportedError("symheap.moe.Buffer: only the world team is supported (team=None or the world)")
    if group is not None and (group.size() if hasattr(group, "size") else None) != n:
        raise SymheapUnsupportedError(f"symheap.moe.Buffer: group must span the world ({n} PEs)")


def _positive(name: str, v: Any) -> int:
    return _core.index_arg(v, f"symheap.moe.Buffer: {name}", 1)


class Buffer:
    """Symmetric staging for MoE dispatch/combine over the world team. **Collective** (every PE,
    same arguments): allocates :meth:`num_bytes` of symmetric memory on every PE.

    ``hidden``: the token width H; ``num_experts``: a multiple of the number of PEs;
    ``num_topk``: K; ``max_tokens_per_pe``: the most tokens any PE passes to one dispatch;
    ``dtype``: bfloat16 (or float16) payloads; ``align``: each expert's block in the normal
    layout (and ``cap`` in the low-latency one) is a multiple of it, for grouped GEMM tiles;
    ``fp8``: also make the FP8 staging (needs ``hidden % 128 == 0``).
    """

    def __init__(
        self,
        hidden: int,
        *,
        num_experts: int,
        num_topk: int,
        max_tokens_per_pe: int,
        dtype: Any = _torch.bfloat16,
        align: int = 1,
        fp8: bool = False,
        team: Optional[Team] = None,
        group: Any = None,
    ) -> None:
        _world_only(team, group)
        self.hidden = _positive("hidden", hidden)
        self.num_experts = _positive("num_experts", num_experts)
        self.num_topk = _positive("num_topk", num_topk)
        self.max_tokens = _positive("max_tokens_per_pe", max_tokens_per_pe)
        self.align = _positive("align", align)
        if dtype not in _DTYPES:
            raise SymheapValueError(f"symheap.moe.Buffer: dtype must be bfloat16 or float16, not {dtype}")
        self.dtype = dtype
        nat = _core.native()
        self.n_pes, self.me = int(nat.n_pes), int(nat.my_pe)
        if num_experts % self.n_pes:
            raise SymheapValueError(
                f"symheap.moe.Buffer: num_experts {num_experts} is not a multiple of the {self.n_pes} PEs"
            )
        if fp8 and hidden % FP8_BLOCK:
            raise SymheapValueError(
                f"symheap.moe.Buffer: fp8 needs hidden to be a multiple of {FP8_BLOCK}, not {hidden}"
            )
        far = [q for q, b in enumerate(nat.heap_bases()) if b == 0]
        if far:
            raise SymheapUnsupportedError(
                f"symheap.moe.Buffer: PEs {far} are not load/store-reachable from PE {self.me} (another node); "
                "dispatch/combine writes into every PE's memory directly and needs one node"
            )
        self.local_experts = num_experts // self.n_pes
        self.fp8 = bool(fp8)
        self.cuda = nat.backend == "cuda"
        self.device = st.device()
        self.rows_per_expert = plan.align_up(self.n_pes * self.max_tokens, self.align)
        layout = {
            name: (rows * width * _torch.empty(0, dtype=dt).element_size(), _torch.uint8)
            for name, (rows, width, dt) in self._layout().items()
        }
        # Zeroed staging on every PE (a barrier) before any peer writes; the counters are the
        # dispatches and combines made, on the device.
        ws = Workspace(tuple(range(self.n_pes)), (), layout, zeroed=tuple(layout), counters=2, barrier=True)
        self._regions: Dict[str, _torch.Tensor] = ws.regions
        self._local = {n: self._view(r, n) for n, r in self._regions.items()}
        self._peers: Dict[str, List[_torch.Tensor]] = {}
        if not self.cuda:
            self._peers = {
                n: [self._view(st.get_peer_tensor(r, q), n) for q in range(self.n_pes)]
                for n, r in self._regions.items()
            }
        self._bases = st.heap_bases()
        # The Triton kernels on CUDA; on the host backend the torch plans, or the same kernels
        # under Triton's interpreter when SYMHEAP_MOE_TRITON=1 (how CI checks the CUDA path).
        self._kernels = self.cuda or os.environ.get("SYMHEAP_MOE_TRITON") == "1"
        # The dispatch behind dispatch() and the custom op (the same layouts either way).
        self._dispatch_impl = self._dispatch_kernels if self._kernels else self._dispatch_torch
        cap = self.rows_per_expert
        self._ll_start = _torch.arange(self.local_experts, dtype=_torch.int64, device=self.device) * cap
        self._ll_len = _torch.full((self.local_experts,), cap, dtype=_torch.int64, device=self.device)
        self._ctr: _torch.Tensor = ws.ctr  # type: ignore[assignment]
        self.bad_routing = _torch.zeros(1, dtype=_torch.int32, device=self.device)
        self.id = _next_id[0]
        _next_id[0] += 1
        ws.owner = self
        _pool.add(self.id, ws)

    def _layout(self) -> Dict[str, Tuple[int, int, _torch.dtype]]:
        p, t, k, h = self.n_pes, self.max_tokens, self.num_topk, self.hidden
        out = {
            "x": (2 * p * t, h, self.dtype),
            "meta": (2 * p * t, 2 * k + 1, _torch.int32),
            "counts": (2 * p, 1, _torch.int32),
            "comb": (2 * t * k, h, self.dtype),
        }
        if self.fp8:
            out["q"] = (2 * p * t, h, _torch.uint8)
            out["s"] = (2 * p * t, h // FP8_BLOCK, _torch.float32)
        return out

    def _view(self, raw: _torch.Tensor, name: str) -> _torch.Tensor:
        rows, width, dt = self._layout()[name]
        return raw.view(dt).view(rows, width)

    @staticmethod
    def num_bytes(
        hidden: int,
        num_experts: int,
        num_topk: int,
        max_tokens_per_pe: int,
        n_pes: Optional[int] = None,
        dtype: Any = _torch.bfloat16,
        fp8: bool = False,
    ) -> int:
        """Symmetric bytes a :class:`Buffer` of these sizes takes on each PE (``n_pes``: the
        world's size when None). Not collective."""
        p = _core.index_arg(n_pes, "n_pes", 1) if n_pes is not None else _core.native().n_pes
        sizes = (("max_tokens_per_pe", max_tokens_per_pe), ("num_topk", num_topk), ("hidden", hidden))
        t, k, h = (_positive(name, v) for name, v in sizes)
        e = _torch.empty(0, dtype=dtype).element_size()
        n = 2 * p * t * h * e + 2 * p * t * (2 * k + 1) * 4 + 2 * p * 4 + 2 * t * k * h * e
        if fp8:
            n += 2 * p * t * h + 2 * p * t * (h // FP8_BLOCK) * 4
        return n

    # ---- row moves --------------------------------------------------------------------------

    def _move(
        self, src: _torch.Tensor, region: str, src_rows: _torch.Tensor, dst_pes: _torch.Tensor, dst_rows: _torch.Tensor
    ) -> None:
        """The torch plans' row moves (host backend): indexed copies into the peers' mapped
        copies of ``region``."""
        go = (src_rows >= 0) & (dst_rows >= 0)
        for q in range(self.n_pes):
            m = go & (dst_pes == q)
            if bool(m.any()):
                self._peers[region][q].index_copy_(0, dst_rows[m], src.index_select(0, src_rows[m]))

    def _gather_local(self, src: _torch.Tensor, src_rows: _torch.Tensor, out: _torch.Tensor) -> None:
        """``out[r] = src[src_rows[r]]`` where ``src_rows[r] >= 0``; other rows untouched."""
        have = (src_rows >= 0).nonzero().reshape(-1)
        out.index_copy_(0, have, src.index_select(0, src_rows.index_select(0, have)))

    def _sync(self) -> None:
        _shmem.barrier_all()  # CUDA: on the current stream (capturable); host: the host barrier

    # ---- dispatch ---------------------------------------------------------------------------

    def _check_dispatch(self, x: Any, topk_idx: Any, topk_weights: Any, use_fp8: bool) -> _torch.Tensor:
        what = "symheap.moe dispatch"
        for name, v in (("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if not isinstance(v, _torch.Tensor):
                raise SymheapValueError(f"{what}: {name} must be a tensor")
            if v.device != self.device:
                raise SymheapValueError(f"{what}: {name} is on {v.device}, the buffer on {self.device}")
        if x.dim() != 2 or x.shape[1] != self.hidden or x.dtype != self.dtype:
            raise SymheapValueError(
                f"{what}: x must be [T, {self.hidden}] {self.dtype}, not {tuple(x.shape)} {x.dtype}"
            )
        t = x.shape[0]
        if t > self.max_tokens:
            raise SymheapValueError(
                f"{what}: {t} tokens on PE {self.me} overflow the buffer's max_tokens_per_pe={self.max_tokens}; "
                "nothing was sent"
            )
        if tuple(topk_idx.shape) != (t, self.num_topk) or topk_idx.dtype not in (_torch.int64, _torch.int32):
            raise SymheapValueError(
                f"{what}: topk_idx must be [{t}, {self.num_topk}] int64 or int32, "
                f"not {tuple(topk_idx.shape)} {topk_idx.dtype}"
            )
        if tuple(topk_weights.shape) != (t, self.num_topk) or not topk_weights.is_floating_point():
            raise SymheapValueError(f"{what}: topk_weights must be [{t}, {self.num_topk}] floating point")
        if use_fp8 and not self.fp8:
            raise SymheapValueError(f"{what}: use_fp8 needs a buffer made with fp8=True")
        return x.contiguous()

    def _raise_bad(self, cnt: _torch.Tensor) -> None:
        wrong = [q for q, c in enumerate(cnt.tolist()) if c < 0]
        if wrong:
            raise SymheapValueError(
                f"symheap.moe dispatch: PE(s) {wrong} passed expert ids outside [-1, {self.num_experts}); "
                "no tokens of theirs were sent"
            )

    def _dispatch_kernels(
        self,
        x: _torch.Tensor,
        topk_idx: _torch.Tensor,
        topk_weights: _torch.Tensor,
        low_latency: bool,
        use_fp8: bool,
        check: bool,
    ) -> List[_torch.Tensor]:
        # Triton only here (the host backend's torch plans run without it).
        from . import _kernels as kern

        p, lx, tmax, k, h, me = self.n_pes, self.local_experts, self.max_tokens, self.num_topk, self.hidden, self.me
        dev, bases, cap = self.device, self._bases, self.rows_per_expert
        t = x.shape[0]
        idx = topk_idx.to(_torch.int64).contiguous()
        w32 = topk_weights.to(_torch.float32).contiguous()
        par = _torch.empty(1, dtype=_torch.int64, device=dev)
        dst_row = _torch.empty(t * p, dtype=_torch.int64, device=dev)
        meta = _torch.empty((t * p, 2 * k + 1), dtype=_torch.int32, device=dev)
        routed = _torch.empty((t, k), dtype=_torch.int8, device=dev)
        stage_counts = self._local["counts"]
        kern.send_plan(
            idx, w32, self._ctr[0:1], par, dst_row, meta, routed, self.bad_routing, stage_counts, bases, me,
            self.num_experts, lx, p, k, tmax, check,
        )  # fmt: skip
        rows_of = dict(dst_rows=dst_row, src_div=p, pe_mod=p)
        if use_fp8:
            q, sc = plan.quantize_fp8(x, FP8_BLOCK)
            kern.move_rows(q.view(_torch.uint8), self._local["q"], bases, me, **rows_of)
            kern.move_rows(sc, self._local["s"], bases, me, **rows_of)
        else:
            kern.move_rows(x, self._local["x"], bases, me, **rows_of)
        kern.move_rows(meta, self._local["meta"], bases, me, dst_rows=dst_row, src_div=1, pe_mod=p)
        self._sync()
        if check:
            self._raise_bad(stage_counts.view(2, p).index_select(0, par)[0])
        num = _torch.empty(lx, dtype=_torch.int32, device=dev)
        if low_latency:
            rows, start, length = lx * cap, self._ll_start, self._ll_len
        else:
            kern.recv_plan(self._local["meta"], stage_counts, par, num, num, (num,) * 5, num, p, k, tmax, cap, lx, True)
            length = _torch.div(num.to(_torch.int64) + self.align - 1, self.align, rounding_mode="floor") * self.align
            start = length.cumsum(0) - length
            rows = int(length.sum().item())  # the one host synchronisation of the normal mode
        outs = kern.empty_plan_outputs(rows, k, dev)
        kern.recv_plan(self._local["meta"], stage_counts, par, start, length, outs, num, p, k, tmax, cap, lx, False)
        src_row, ridx, rw, cpe, crow = outs
        make = _torch.empty if low_latency else _torch.zeros
        if use_fp8:
            rq = make((rows, h), dtype=_torch.uint8, device=dev)
            rs = make((rows, h // FP8_BLOCK), dtype=_torch.float32, device=dev)
            kern.move_rows(self._local["q"], rq, bases, me, src_rows=src_row, gather=True)
            kern.move_rows(self._local["s"], rs, bases, me, src_rows=src_row, gather=True)
            first, scales = rq.view(_torch.float8_e4m3fn), rs
        else:
            first = make((rows, h), dtype=self.dtype, device=dev)
            kern.move_rows(self._local["x"], first, bases, me, src_rows=src_row, gather=True)
            scales = _torch.empty((0,), dtype=_torch.float32, device=dev)
        return self._outputs(first, scales, ridx, rw, num, cpe, crow, routed.view(_torch.bool), w32, low_latency)

    def _outputs(self, first, scales, ridx, rw, num, cpe, crow, routed, w32, low_latency: bool) -> List[_torch.Tensor]:
        """The op's output list, the low-latency ones shaped ``[L, cap, ...]``."""
        lx, cap, k = self.local_experts, self.rows_per_expert, self.num_topk
        lead = (lx, cap) if low_latency else (first.shape[0],)
        if low_latency:
            first = first.view(lx, cap, -1)
            if scales.numel():
                scales = scales.view(lx, cap, -1)
        return [first, scales, ridx.view(*lead, k), rw.view(*lead, k), num, cpe, crow, routed, w32.clone()]

    def _dispatch_torch(
        self,
        x: _torch.Tensor,
        topk_idx: _torch.Tensor,
        topk_weights: _torch.Tensor,
        low_latency: bool,
        use_fp8: bool,
        check: bool,
    ) -> List[_torch.Tensor]:
        p, lx, t, k = self.n_pes, self.local_experts, self.max_tokens, self.num_topk
        idx = topk_idx.to(_torch.int64)
        par = self._ctr[0:1] % 2
        bad = ((idx < -1) | (idx >= self.num_experts)).any().reshape(1)
        sp = plan.send_plan(idx, topk_weights, p, lx, self.me, t, par)
        counts, dst_row = sp.counts, sp.dst_row
        if check:
            # A PE with bad ids sends nothing and a count of -1 to everyone: all PEs raise alike.
            counts = _torch.where(bad, -1, counts)
            dst_row = _torch.where(bad, -1, dst_row)
        self.bad_routing.copy_(_torch.maximum(self.bad_routing, bad.to(_torch.int32)))
        if use_fp8:
            q, s = plan.quantize_fp8(x, FP8_BLOCK)
            self._move(q.view(_torch.uint8), "q", sp.src_tok, sp.dst_pe, dst_row)
            self._move(s, "s", sp.src_tok, sp.dst_pe, dst_row)
        else:
            self._move(x, "x", sp.src_tok, sp.dst_pe, dst_row)
        self._move(sp.meta, "meta", sp.src_meta, sp.dst_pe, dst_row)
        pes = _torch.arange(p, device=self.device, dtype=_torch.int64)
        self._move(counts, "counts", pes, pes, sp.count_row)
        self._ctr[0:1].add_(1)
        self._sync()
        cnt = self._local["counts"].view(2, p).index_select(0, par)[0]
        if check:
            self._raise_bad(cnt)
        rp = plan.recv_plan(self._local["meta"], cnt, par, p, lx, t, k, self.align, low_latency)
        rows = int(rp.src_row.shape[0])
        make = _torch.empty if low_latency else _torch.zeros
        if use_fp8:
            rq = make((rows, self.hidden), dtype=_torch.uint8, device=self.device)
            rs = make((rows, self.hidden // FP8_BLOCK), dtype=_torch.float32, device=self.device)
            self._gather_local(self._local["q"], rp.src_row, rq)
            self._gather_local(self._local["s"], rp.src_row, rs)
            first, scales = rq.view(_torch.float8_e4m3fn), rs
        else:
            first = make((rows, self.hidden), dtype=self.dtype, device=self.device)
            self._gather_local(self._local["x"], rp.src_row, first)
            scales = _torch.empty((0,), dtype=_torch.float32, device=self.device)
        w32 = topk_weights.to(_torch.float32)
        return self._outputs(
            first, scales, rp.recv_idx, rp.recv_w, rp.num_recv, rp.comb_pe, rp.comb_row, sp.routed, w32, low_latency
        )

    def dispatch(
        self,
        x: _torch.Tensor,
        topk_idx: _torch.Tensor,
        topk_weights: _torch.Tensor,
        *,
        low_latency: bool = True,
        use_fp8: bool = False,
        check: Optional[bool] = None,
    ) -> Tuple[
        Union[_torch.Tensor, Tuple[_torch.Tensor, _torch.Tensor]], _torch.Tensor, _torch.Tensor, _torch.Tensor, Handle
    ]:
        """**Collective** over the world: sends each token once to every PE owning one of its
        experts. Returns ``(recv_x, recv_topk_idx, recv_topk_weights,
        num_recv_tokens_per_expert, handle)`` (layouts in the module docstring; ``recv_x`` is
        ``(q, scales)`` with ``use_fp8``). ``check``: validate expert ids on every PE (default:
        in the normal mode only)."""
        if check is None:
            check = not low_latency
        x = self._check_dispatch(x, topk_idx, topk_weights, use_fp8)
        out = _dispatch_op(x, topk_idx, topk_weights, self.id, bool(low_latency), bool(use_fp8), bool(check))
        first, scales, ridx, rw, num, cpe, crow, routed, w = out
        handle = Handle(cpe, crow, routed, w, tuple(first.shape))
        recv_x = (first, scales) if use_fp8 else first
        return recv_x, ridx, rw, num, handle

    # ---- combine ----------------------------------------------------------------------------

    def _combine_impl(
        self,
        y: _torch.Tensor,
        comb_pe: _torch.Tensor,
        comb_row: _torch.Tensor,
        routed: _torch.Tensor,
        weights: _torch.Tensor,
        out_dtype: _torch.dtype,
    ) -> _torch.Tensor:
        """The combine behind :meth:`combine` and the custom op."""
        slots = self.max_tokens * self.num_topk
        rows = y.reshape(-1, self.hidden)
        if self._kernels:
            # (Triton, as in _dispatch_kernels.)
            from . import _kernels as kern

            ctr = self._ctr[1:2]
            kern.move_rows(
                rows, self._local["comb"], self._bases, self.me, dst_pes=comb_pe, dst_rows=comb_row, src_div=1,
                ctr=ctr, par_stride=slots,
            )  # fmt: skip
            ctr.add_(1)
            self._sync()
            out = _torch.empty((routed.shape[0], self.hidden), dtype=out_dtype, device=self.device)
            w = weights.to(_torch.float32).contiguous()
            kern.combine_sum(
                self._local["comb"], ctr, routed.contiguous().view(_torch.int8), w, out, slots, self.num_topk
            )
            return out
        par = self._ctr[1:2] % 2
        dst = plan.combine_rows(comb_pe, comb_row, par, slots)
        src = _torch.arange(rows.shape[0], device=self.device, dtype=_torch.int64)
        self._move(rows, "comb", src, comb_pe, dst)
        self._ctr[1:2].add_(1)
        self._sync()
        return plan.weighted_sum(self._local["comb"], par, routed, weights, slots, out_dtype)

    def combine(
        self, y: _torch.Tensor, handle: Handle, topk_weights: Optional[_torch.Tensor] = None, *, out_dtype: Any = None
    ) -> _torch.Tensor:
        """**Collective** over the world: returns ``x_out`` ``[T, H]`` on each PE, ``x_out[t] =
        sum over routed k of topk_weights[t, k] * y(t, k)`` in fp32, ascending ``k``, rounded
        once to ``out_dtype`` (default: the buffer's dtype). ``y``: the expert outputs in the
        shape of the dispatch's ``recv_x``, the buffer's dtype."""
        what = "symheap.moe combine"
        if not isinstance(handle, Handle):
            raise SymheapValueError(f"{what}: handle must be the Handle that dispatch returned")
        if not isinstance(y, _torch.Tensor) or tuple(y.shape) != handle.recv_shape or y.dtype != self.dtype:
            got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, _torch.Tensor) else type(y).__name__
            raise SymheapValueError(
                f"{what}: y must be {handle.recv_shape} {self.dtype} (dispatch's recv_x), not {got}"
            )
        if y.device != self.device:
            raise SymheapValueError(f"{what}: y is on {y.device}, the buffer on {self.device}")
        w = handle.weights
        if topk_weights is not None:
            if not isinstance(topk_weights, _torch.Tensor) or tuple(topk_weights.shape) != tuple(handle.routed.shape):
                raise SymheapValueError(f"{what}: topk_weights must be {tuple(handle.routed.shape)}")
            w = topk_weights.to(device=self.device, dtype=_torch.float32)
        od = self.dtype if out_dtype is None else out_dtype
        if od not in (_torch.bfloat16, _torch.float16, _torch.float32):
            raise SymheapValueError(f"{what}: out_dtype must be bfloat16, float16 or float32, not {od}")
        y = y.contiguous()
        return _combine_op(y, handle.comb_pe, handle.comb_row, handle.routed, w, self.id, od)

    def destroy(self) -> None:
        """**Collective**: releases the symmetric staging (after a barrier, so no peer still
        writes into it). The buffer must not be used afterwards."""
        _shmem.barrier_all()
        self._peers.clear()
        self._local.clear()
        _pool.release(self.id)  # frees the regions (self._regions is the workspace's, emptied)


def dequantize(recv_x: Tuple[_torch.Tensor, _torch.Tensor]) -> _torch.Tensor:
    """The float32 values ``q * scale`` of an FP8 ``(q, scales)`` pair as :meth:`Buffer.dispatch`
    returns it (any leading shape, one scale per 128 elements). Not collective."""
    q, scales = recv_x
    return plan.dequantize_fp8(q, scales, FP8_BLOCK)


def _buffer(bid: int) -> Buffer:
    ws = _pool.find(int(bid))
    if ws is None:
        raise SymheapValueError(f"symheap.moe: no live buffer with id {bid} (destroyed, or made before finalize)")
    return ws.owner


# ---- the custom ops ---------------------------------------------------------------------------


@_library.op("symheap::moe_dispatch", mutates_args=())
def _dispatch_op(
    x: _torch.Tensor,
    topk_idx: _torch.Tensor,
    topk_weights: _torch.Tensor,
    buffer: int,
    low_latency: bool,
    use_fp8: bool,
    check: bool,
) -> List[_torch.Tensor]:
    """**Collective** over the world: :meth:`Buffer.dispatch` of buffer id ``buffer``; returns
    ``[recv_x, recv_scales, recv_topk_idx, recv_topk_weights, num_recv, comb_pe, comb_row,
    routed, weights]`` (``recv_scales`` empty without FP8)."""
    return _buffer(buffer)._dispatch_impl(x, topk_idx, topk_weights, low_latency, use_fp8, check)


@_dispatch_op.register_fake
def _dispatch_fake(x, topk_idx, topk_weights, buffer, low_latency, use_fp8, check):
    b = _buffer(buffer)
    lx, k, h, dev = b.local_experts, b.num_topk, b.hidden, x.device
    if low_latency:
        rows: Any = lx * b.rows_per_expert
        lead: Tuple[Any, ...] = (lx, b.rows_per_expert)
    else:
        rows = _torch.library.get_ctx().new_dynamic_size()
        lead = (rows,)
    if use_fp8:
        first = x.new_empty((*lead, h), dtype=_torch.float8_e4m3fn)
        scales = x.new_empty((*lead, h // FP8_BLOCK), dtype=_torch.float32)
    else:
        first = x.new_empty((*lead, h))
        scales = x.new_empty((0,), dtype=_torch.float32)
    t = x.shape[0]
    return [
        first,
        scales,
        x.new_empty((*lead, k), dtype=_torch.int64),
        x.new_empty((*lead, k), dtype=_torch.float32),
        _torch.empty((lx,), dtype=_torch.int32, device=dev),
        x.new_empty((rows,), dtype=_torch.int64),
        x.new_empty((rows,), dtype=_torch.int64),
        x.new_empty((t, k), dtype=_torch.bool),
        x.new_empty((t, k), dtype=_torch.float32),
    ]


@_library.op("symheap::moe_combine", mutates_args=())
def _combine_op(
    y: _torch.Tensor,
    comb_pe: _torch.Tensor,
    comb_row: _torch.Tensor,
    routed: _torch.Tensor,
    weights: _torch.Tensor,
    buffer: int,
    out_dtype: _torch.dtype,
) -> _torch.Tensor:
    """**Collective** over the world: :meth:`Buffer.combine` of buffer id ``buffer``."""
    return _buffer(buffer)._combine_impl(y, comb_pe, comb_row, routed, weights, out_dtype)


@_combine_op.register_fake
def _combine_fake(y, comb_pe, comb_row, routed, weights, buffer, out_dtype):
    b = _buffer(buffer)
    return y.new_empty((routed.shape[0], b.hidden), dtype=out_dtype)
