"""The ``symheap`` backend of torch.distributed: torch's collectives on symheap.

``import symheap.distributed`` registers it (``dist.Backend.register_backend("symheap", ...,
devices=["cpu", "cuda"])``); then ``dist.init_process_group("symheap")`` (or
``"cuda:symheap,cpu:gloo"``, ``init_device_mesh``, ``new_group``) runs every collective torch
code makes (``dist.*``, DTensor, FSDP2, DDP, functional collectives) through symheap.

Class design: torch 2.11 has no Backend base class a Python class can construct, so the backend
is a ``torch.distributed.ProcessGroup`` subclass (torch's trampoline sends every virtual call,
from Python or C++, to its methods), as torch's own Python process groups are. torch then uses
it as the group itself; devices given another backend in the backend string (``cpu:gloo``) get
that backend, made here with the group's store, and their tensors go to it.

The context: the default group's creator makes symheap's context over the group's store
(``symheap.init(store=...)``, symheap PE == global rank; an existing context of the same ranks
is used as it is), so ``symheap.*`` calls in the same program share it. A group of a subset of
ranks becomes a symheap team through ``Context.team_from_ranks``, its members exchanging over
the group's store (see :mod:`._groups`).

Every method returns a completed Work (see :mod:`._work`); an operation the backend cannot do
raises :class:`symheap.SymheapUnsupportedError` naming it (never another library silently);
errors are torch's ``DistBackendError`` and symheap's error class at once (:mod:`._errors`).
"""

from __future__ import annotations

import struct
import sys
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence

import torch as _torch
import torch.distributed as dist

from .. import _core, _shmem, _workspace, ops
from .._core import torch_dtype_name
from .._native import SymheapError, SymheapUnsupportedError, SymheapValueError
from . import _groups, _p2p, _reduce, _staged, _work
from ._errors import as_dist_error, dist_errors

NAME = "symheap"


def _flat(t: _torch.Tensor) -> _torch.Tensor:
    """``t`` as a flat view when contiguous, else a contiguous flat copy (``t`` itself when it
    is one already: a view costs more host time than a small collective's native call)."""
    if t.dim() == 1 and t.is_contiguous():
        return t
    return t.reshape(-1)


class SymheapProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on symheap (see the module).

    ``ranks``: the world ranks of the group in group order; ``team``: its symheap team id (0:
    the world); ``others``: device type -> torch backend for devices the user gave another
    backend; ``slot``: a subgroup's staging slot (:mod:`._staged`), None for the world."""

    def __init__(
        self,
        rank: int,
        size: int,
        ranks: Sequence[int],
        team: int,
        others: Dict[str, Any],
        timeout: timedelta,
        default: bool = False,
        slot: Optional[int] = None,
    ) -> None:
        super().__init__(rank, size)
        # torch's rank() and size() are calls into C++ that cost more than a dict lookup; the
        # collectives ask for them on every call.
        self._rank, self._size = rank, size
        self._default = default
        self._name = ""
        self._desc = "undefined"
        self._ranks = tuple(ranks)
        self._tid = team
        self._others = others
        self._timeout = timeout
        self._slot = slot

    # ---- identity ------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return NAME

    # torch's C++ ProcessGroup reads its name from its first registered backend, and this group
    # registers none: it keeps the name torch gives it (functional collectives find groups by it).
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    def __repr__(self) -> str:
        return f"SymheapProcessGroup(rank={self.rank()}, size={self.size()}, ranks={list(self._ranks)})"

    def _other(self, tensors: Sequence[_torch.Tensor]) -> Any:
        """The other backend the tensors' device was given, or None (symheap)."""
        if not self._others or not tensors:
            return None
        return self._others.get(tensors[0].device.type)

    def _get_backend(self, device: Any) -> Any:
        """The backend of ``device``, as torch asks for it (torch 2.15 does before
        ``batch_isend_irecv``, to see whether it coalesces): the gloo backend of a device the
        user gave gloo, else this group, which is its own backend."""
        kind = device.type if isinstance(device, _torch.device) else _torch.device(device).type
        return (self._others or {}).get(kind, self)

    def _n(self) -> int:
        return self._size

    def _staging(self, what: str, *tensors: _torch.Tensor) -> Optional[_torch.Tensor]:
        """A subgroup's slot bytes when it must stage ``tensors`` itself (not all symmetric),
        else None (the world's collectives stage through :mod:`symheap.ops`, which grows its
        staging on every rank at once)."""
        if self._tid == 0 or all(ops._zero_copy(t) for t in tensors):
            return None
        return _staged.buffer(self._slot, what)

    # ---- reductions ----------------------------------------------------------------------

    def _all_reduce(self, t: _torch.Tensor, op: Any, what: str, record: bool = True) -> None:
        kind, factor = _reduce.reduce_op(op, what)
        view, sop = _reduce.for_reduction(t, kind, what)
        if factor is not None:
            t.mul_(factor)
        buf = self._staging(what, view)
        if buf is None:
            ops._run_all_reduce_(view, sop, self._tid, record)
            return
        work = view.contiguous()
        _staged.all_reduce(_staged.flat(work), sop, self._tid, buf)
        if work is not view:
            view.copy_(work)

    @dist_errors("all_reduce")
    def allreduce(self, tensors: List[_torch.Tensor], opts: Any = None) -> Any:
        other = self._other(tensors)
        if other is not None:
            return other.allreduce(tensors, opts)
        for t in tensors:
            self._all_reduce(t, _opt(opts, "reduceOp"), "all_reduce", _is_async(opts))
        return _work.done(tensors, opts)

    @dist_errors("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors: List[_torch.Tensor], opts: Any = None) -> Any:
        other = self._other(tensors)
        if other is not None:
            return other.allreduce_coalesced(tensors, opts)
        for t in tensors:
            self._all_reduce(t, _opt(opts, "reduceOp"), "all_reduce_coalesced")
        return _work.done(tensors, opts)

    def _reduce_scatter(self, out: _torch.Tensor, inp: _torch.Tensor, op: Any, what: str, record: bool = True) -> None:
        kind, factor = _reduce.reduce_op(op, what)
        if out.dtype != inp.dtype:
            raise SymheapValueError(f"{what}: dtypes differ (output {out.dtype}, input {inp.dtype})")
        if factor is not None:
            inp = inp * factor
        sv, sop = _reduce.for_reduction(inp, kind, what)
        # Same dtype: the output needs a view only where the input took one (bool, complex).
        dv = out if sv is inp else _reduce.for_reduction(out, kind, what)[0]
        buf = self._staging(what, sv, dv)
        if buf is None:
            ops._run_scatter_into(_flat_out(dv), _flat(sv), sop, self._tid, record)
            return
        if sv.numel() != self._n() * dv.numel():
            raise SymheapValueError(
                f"{what}: the input has {inp.numel()} elements, not {self._n()} times the output's {out.numel()}"
            )
        work = dv.contiguous()
        _staged.reduce_scatter(_staged.flat(work), _staged.flat(sv.contiguous()), sop, self._n(), self._tid, buf)
        if work is not dv:
            dv.copy_(work)

    @dist_errors("reduce_scatter_tensor")
    def _reduce_scatter_base(self, output: _torch.Tensor, input: _torch.Tensor, opts: Any = None) -> Any:
        other = self._other([input])
        if other is not None:
            return other._reduce_scatter_base(output, input, opts)
        self._reduce_scatter(output, input, _opt(opts, "reduceOp"), "reduce_scatter_tensor", _is_async(opts))
        return _work.done([output], opts)

    @dist_errors("reduce_scatter_tensor_coalesced")
    def reduce_scatter_tensor_coalesced(
        self, outputs: List[_torch.Tensor], inputs: List[_torch.Tensor], opts: Any = None
    ) -> Any:
        other = self._other(inputs)
        if other is not None:
            return other.reduce_scatter_tensor_coalesced(outputs, inputs, opts)
        for o, i in zip(outputs, inputs):
            self._reduce_scatter(o, i, _opt(opts, "reduceOp"), "reduce_scatter_tensor_coalesced")
        return _work.done(outputs, opts)

    @dist_errors("reduce_scatter")
    def reduce_scatter(
        self, outputs: List[_torch.Tensor], input_lists: List[List[_torch.Tensor]], opts: Any = None
    ) -> Any:
        other = self._other(outputs)
        if other is not None:
            return other.reduce_scatter(outputs, input_lists, opts)
        for out, ins in zip(outputs, input_lists):
            _check_list(ins, self._n(), out, "reduce_scatter input_list")
            cat = _torch.cat([_flat(i) for i in ins])
            self._reduce_scatter(out, cat, _opt(opts, "reduceOp"), "reduce_scatter")
        return _work.done(outputs, opts)

    @dist_errors("reduce")
    def reduce(self, tensors: List[_torch.Tensor], opts: Any = None) -> Any:
        other = self._other(tensors)
        if other is not None:
            return other.reduce(tensors, opts)
        root = _root(opts, self._n(), "reduce")
        for t in tensors:
            # Every member reduces (symheap has no rooted reduction); only the root keeps it.
            target = t if self._rank == root else t.clone()
            self._all_reduce(target, _opt(opts, "reduceOp"), "reduce")
        return _work.done(tensors, opts)

    # ---- byte movers ---------------------------------------------------------------------

    def _gather(self, out: _torch.Tensor, inp: _torch.Tensor, record: bool = True) -> None:
        if out.dtype != inp.dtype:
            raise SymheapValueError(f"all_gather: dtypes differ (output {out.dtype}, input {inp.dtype})")
        buf = self._staging("all_gather", inp, out)
        if buf is None:
            ops._run_gather_into(_reduce.bytes_view(out), _reduce.bytes_view(inp), self._tid, record)
            return
        if out.numel() != self._n() * inp.numel():
            raise SymheapValueError(
                f"all_gather: the output has {out.numel()} elements, not {self._n()} times the input's {inp.numel()}"
            )
        work = out.contiguous()
        _staged.all_gather(_staged.as_bytes(work), _staged.as_bytes(inp.contiguous()), self._n(), self._tid, buf)
        if work is not out:
            out.copy_(work)

    @dist_errors("all_gather_into_tensor")
    def _allgather_base(self, output: _torch.Tensor, input: _torch.Tensor, opts: Any = None) -> Any:
        other = self._other([input])
        if other is not None:
            return other._allgather_base(output, input, opts)
        self._gather(output, input, _is_async(opts))
        return _work.done([output], opts)

    @dist_errors("all_gather_into_tensor_coalesced")
    def allgather_into_tensor_coalesced(
        self, outputs: List[_torch.Tensor], inputs: List[_torch.Tensor], opts: Any = None
    ) -> Any:
        other = self._other(inputs)
        if other is not None:
            return other.allgather_into_tensor_coalesced(outputs, inputs, opts)
        for o, i in zip(outputs, inputs):
            self._gather(o, i)
        return _work.done(outputs, opts)

    def _gather_list(self, outs: List[_torch.Tensor], inp: _torch.Tensor, what: str) -> None:
        _check_list(outs, self._n(), inp, what)
        flat = inp.new_empty((self._n() * inp.numel(),))
        self._gather(flat, _flat(inp))
        for j, o in enumerate(outs):
            o.copy_(flat[j * inp.numel() : (j + 1) * inp.numel()].view(o.shape))

    @dist_errors("all_gather")
    def allgather(self, output_lists: List[List[_torch.Tensor]], inputs: List[_torch.Tensor], opts: Any = None) -> Any:
        other = self._other(inputs)
        if other is not None:
            return other.allgather(output_lists, inputs, opts)
        for outs, inp in zip(output_lists, inputs):
            self._gather_list(outs, inp, "all_gather tensor_list")
        return _work.done([o for outs in output_lists for o in outs], opts)

    @dist_errors("all_gather_coalesced")
    def allgather_coalesced(
        self, output_lists: List[List[_torch.Tensor]], inputs: List[_torch.Tensor], opts: Any = None
    ) -> Any:
        return self.allgather(output_lists, inputs, opts)

    @dist_errors("broadcast")
    def broadcast(self, tensors: List[_torch.Tensor], opts: Any = None) -> Any:
        other = self._other(tensors)
        if other is not None:
            return other.broadcast(tensors, opts)
        root = _root(opts, self._n(), "broadcast")
        for t in tensors:
            buf = self._staging("broadcast", t)
            if buf is None:
                ops._run_broadcast_(_reduce.bytes_view(t), root, self._tid, _is_async(opts))
                continue
            work = t.contiguous()
            _staged.broadcast(_staged.as_bytes(work), root, self._tid, buf)
            if work is not t:
                t.copy_(work)
        return _work.done(tensors, opts)

    def _alltoallv(self, out: _torch.Tensor, inp: _torch.Tensor, osplit: List[int], isplit: List[int]) -> None:
        """Uneven all_to_all of rows of the first dimension, through the staging workspace: the
        destination region at the same offset on every member (the largest output), then the
        source (symheap's uneven alltoall wants both symmetric). The native call gets the
        addresses itself: a region of no rows (a gather's non-root) is still a place in the
        heap, where torch reports an empty tensor's address as 0. A subgroup moves the bytes
        through its slot in rounds (:func:`._staged.alltoallv`)."""
        o, i = _reduce.bytes_view(out), _reduce.bytes_view(inp)
        if o.dim() == 0 or i.dim() == 0:
            raise SymheapValueError("all_to_all_single: split sizes need tensors of at least one dimension")
        row = o[0].numel() if o.shape[0] else int(_prod(o.shape[1:]))
        if i.shape[1:] != o.shape[1:]:
            raise SymheapValueError(f"all_to_all_single: rows differ (input {list(i.shape)}, output {list(o.shape)})")
        n = self._n()
        for name, sizes, rows in (("input", isplit, i.shape[0]), ("output", osplit, o.shape[0])):
            if len(sizes) != n or sum(sizes) != rows or min(sizes, default=0) < 0:
                raise SymheapValueError(
                    f"all_to_all_single: {name}_split_sizes {list(sizes)} must give one size per member ({n}) "
                    f"summing to the {name}'s {rows} rows"
                )
        es = o.element_size()
        if self._tid != 0:
            buf = _staged.buffer(self._slot, "all_to_all")
            work, rb = o.contiguous(), row * es
            ob, ib = [s * rb for s in osplit], [s * rb for s in isplit]
            _staged.alltoallv(_staged.as_bytes(work), _staged.as_bytes(i.contiguous()), ob, ib, self._tid, buf)
            if work is not o:
                o.copy_(work)
            return
        # The largest output and input of any member size the regions, the same on every PE.
        # A host exchange, not a device all_reduce read back: that synchronised the stream on
        # every call and cannot run in a CUDA graph capture (torch.compile's reduce-overhead
        # captures all_to_all_single with its split sizes as constants).
        parts = _core.native().all_gather_bytes(struct.pack("<QQ", o.numel() * es, i.numel() * es))
        sizes = [struct.unpack("<QQ", p) for p in parts]
        top_out, top_in = max(s[0] for s in sizes), max(s[1] for s in sizes)
        team = ops._team(self._tid)
        off = _workspace.aligned(max(top_out, 1))
        buf = _workspace.staging(team, off + _workspace.aligned(max(top_in, 1)))
        if i.numel():
            _workspace.region(buf, off, i).copy_(i)
        nat = _core.native()
        stream = _core.device_stream(buf.get_device() if buf.is_cuda else None, None)
        dtype = torch_dtype_name(o.dtype)
        base = buf.data_ptr()
        nat.collective(
            "alltoall", team, base, base + off, row, dtype, stream, send_counts=list(isplit), recv_counts=list(osplit)
        )
        if o.numel():
            o.copy_(_workspace.region(buf, 0, o))

    @dist_errors("all_to_all_single")
    def alltoall_base(
        self,
        output: _torch.Tensor,
        input: _torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any = None,
    ) -> Any:
        other = self._other([input])
        if other is not None:
            return other.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        if output.dtype != input.dtype:
            raise SymheapValueError(f"all_to_all_single: dtypes differ (output {output.dtype}, input {input.dtype})")
        if (
            not output_split_sizes
            and not input_split_sizes
            and self._staging("all_to_all_single", input, output) is None
        ):
            ops._run_alltoall_into(_reduce.bytes_view(output), _reduce.bytes_view(input), self._tid, _is_async(opts))
        else:
            n = self._n()
            osplit = list(output_split_sizes) or _even(output, n, "output")
            isplit = list(input_split_sizes) or _even(input, n, "input")
            self._alltoallv(output, input, osplit, isplit)
        return _work.done([output], opts)

    @dist_errors("all_to_all")
    def alltoall(self, outputs: List[_torch.Tensor], inputs: List[_torch.Tensor], opts: Any = None) -> Any:
        other = self._other(inputs)
        if other is not None:
            return other.alltoall(outputs, inputs, opts)
        n = self._n()
        if len(outputs) != n or len(inputs) != n:
            raise SymheapValueError(f"all_to_all: give {n} output and {n} input tensors")
        dt = inputs[0].dtype
        if any(t.dtype != dt for t in (*inputs, *outputs)):
            raise SymheapValueError("all_to_all: every tensor must have the same dtype")
        inp = _torch.cat([_flat(t) for t in inputs])
        out = inp.new_empty((sum(t.numel() for t in outputs),))
        self._alltoallv(out, inp, [t.numel() for t in outputs], [t.numel() for t in inputs])
        at = 0
        for t in outputs:
            t.copy_(out[at : at + t.numel()].view(t.shape))
            at += t.numel()
        return _work.done(outputs, opts)

    @dist_errors("gather")
    def gather(self, output_lists: List[List[_torch.Tensor]], inputs: List[_torch.Tensor], opts: Any = None) -> Any:
        other = self._other(inputs)
        if other is not None:
            return other.gather(output_lists, inputs, opts)
        root, n = _root(opts, self._n(), "gather"), self._n()
        inp = _flat(inputs[0])
        k = inp.numel()
        out = inp.new_empty((n * k if self._rank == root else 0,))
        # Only the root receives: member j sends its k elements to the root, nothing elsewhere.
        self._alltoallv(out, inp, [k] * n if self._rank == root else [0] * n, [k if r == root else 0 for r in range(n)])
        if self._rank == root:
            outs = output_lists[0]
            _check_list(outs, n, inputs[0], "gather gather_list")
            for j, o in enumerate(outs):
                o.copy_(out[j * k : (j + 1) * k].view(o.shape))
        return _work.done(output_lists[0] if output_lists else [], opts)

    @dist_errors("gather_single")
    def gather_single(self, output: _torch.Tensor, input: _torch.Tensor, opts: Any = None) -> Any:
        """torch 2.15's gather into one tensor: the root's ``output`` gets every member's
        ``input`` in member order (other members pass an empty ``output``)."""
        other = self._other([input])
        if other is not None:
            return other.gather_single(output, input, opts)
        root, n = _root(opts, self._n(), "gather"), self._n()
        inp = _flat(input.contiguous())
        k = inp.numel()
        at_root = self._rank == root
        if at_root and (output.numel() != n * k or output.dtype != input.dtype):
            raise SymheapValueError(
                f"gather: the output has {output.numel()} {output.dtype} elements, not {n} times the input's "
                f"{k} {input.dtype}"
            )
        work = output.contiguous() if at_root else inp.new_empty((0,))
        self._alltoallv(work.view(-1), inp, [k] * n if at_root else [0] * n, [k if r == root else 0 for r in range(n)])
        if at_root and work is not output:
            output.copy_(work)
        return _work.done([output], opts)

    # torch 2.15 calls the single-tensor forms by these names (it keeps the older ones too).
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @dist_errors("scatter")
    def scatter(self, outputs: List[_torch.Tensor], input_lists: List[List[_torch.Tensor]], opts: Any = None) -> Any:
        other = self._other(outputs)
        if other is not None:
            return other.scatter(outputs, input_lists, opts)
        root, n = _root(opts, self._n(), "scatter"), self._n()
        out = outputs[0]
        k = out.numel()
        if self._rank == root:
            _check_list(input_lists[0], n, out, "scatter scatter_list")
            inp = _torch.cat([_flat(t) for t in input_lists[0]])
        else:
            inp = out.new_empty((0,))
        flat = out.new_empty((k,))
        self._alltoallv(
            flat, inp, [k if r == root else 0 for r in range(n)], [k] * n if self._rank == root else [0] * n
        )
        out.copy_(flat.view(out.shape))
        return _work.done(outputs, opts)

    # ---- synchronisation and point to point ----------------------------------------------

    @dist_errors("barrier")
    def barrier(self, opts: Any = None) -> Any:
        # torch's barrier blocks the host (ProcessGroupNCCL's work synchronises its stream).
        if _core.native().backend == "cuda" and _torch.cuda.is_available():
            _torch.cuda.current_stream().synchronize()
        team = ops._team(self._tid)
        if team is None:
            _shmem.host_barrier()
        else:
            _shmem.barrier(team)
        return _work.done([], opts)

    @dist_errors("monitored_barrier")
    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        # symheap's barrier already names the members that did not arrive within the timeout.
        self.barrier(opts).wait()

    @dist_errors("send")
    def send(self, tensors: List[_torch.Tensor], dst: int, tag: int = 0) -> Any:
        other = self._other(tensors)
        if other is not None:
            return other.send(tensors, dst, tag)
        return _p2p.engine().send(tensors[0], self._world(dst, "send"))

    @dist_errors("recv")
    def recv(self, tensors: List[_torch.Tensor], src: int, tag: int = 0) -> Any:
        other = self._other(tensors)
        if other is not None:
            return other.recv(tensors, src, tag)
        return _p2p.engine().recv(tensors[0], self._world(src, "recv"))

    @dist_errors("recv")
    def recv_anysource(self, tensors: List[_torch.Tensor], tag: int = 0) -> Any:
        raise SymheapUnsupportedError(
            "recv without a source (recv_anysource) is not supported by the symheap backend; give src"
        )

    def _world(self, peer: int, what: str) -> int:
        if not 0 <= peer < self._n():
            raise SymheapValueError(f"{what}: peer {peer} is not a member of a group of {self._n()}")
        if peer == self._rank:
            raise SymheapValueError(f"{what}: a rank cannot send to or receive from itself")
        return self._ranks[peer]

    # ---- lifetime ------------------------------------------------------------------------

    def shutdown(self) -> None:
        _groups.release(self)

    def abort(self) -> None:
        if _core.is_initialized():
            _core.native().abort(f"torch.distributed group aborted on rank {dist.get_rank()}")


# ---- helpers -------------------------------------------------------------------------------


def _opt(opts: Any, name: str) -> Any:
    if opts is None:
        return dist.ReduceOp.SUM if name == "reduceOp" else 0
    return getattr(opts, name)


def _is_async(opts: Any) -> bool:
    """Whether torch asked for an asynchronous collective: torch's Python wrappers set
    ``asyncOp`` False for ``async_op=False``; C++ callers (DDP, functional collectives) leave
    it True. Only an asynchronous call notes its stream use on ordinary tensors: a synchronous
    one runs on the current stream, in its order, and ProcessGroupNCCL (torch 2.8 and later)
    keeps no lifetime for it either. The backend calls the ops' ``_run_*`` work directly: torch
    reaches a backend only from c10d's own ops at run time, with real tensors (tracing, fake
    tensors and dispatch modes see c10d's op), and leaves autograd and version counters to
    torch, so the custom-op wrapper has nothing to do here."""
    return opts is None or getattr(opts, "asyncOp", True) is not False


def _root(opts: Any, n: int, what: str) -> int:
    root = int(_opt(opts, "rootRank"))
    if not 0 <= root < n:
        raise SymheapValueError(f"{what}: root {root} is not a member of a group of {n}")
    return root


def _check_list(ts: Sequence[_torch.Tensor], n: int, like: _torch.Tensor, what: str) -> None:
    if len(ts) != n:
        raise SymheapValueError(f"{what} must hold {n} tensors (one per member), it holds {len(ts)}")
    for t in ts:
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise SymheapValueError(
                f"{what}: every tensor must have {like.numel()} elements of {like.dtype}, one has "
                f"{t.numel()} of {t.dtype}"
            )


def _flat_out(t: _torch.Tensor) -> _torch.Tensor:
    if t.dim() == 1 or not t.is_contiguous():
        return t
    return t.view(-1)


def _even(t: _torch.Tensor, n: int, what: str) -> List[int]:
    rows = t.shape[0] if t.dim() else 1
    if rows % n:
        raise SymheapValueError(f"all_to_all_single: the {what} has {rows} rows, not a multiple of {n}")
    return [rows // n] * n


def _prod(xs: Sequence[int]) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


# ---- the creator ---------------------------------------------------------------------------


def _device_backends() -> Dict[str, str]:
    """device type -> backend name of the group torch is making, from the caller's frame
    (``_new_process_group_helper``'s ``backend_config``; torch passes the creator only its own
    device's options). Empty when torch's layout differs: then every device is symheap's."""
    f = sys._getframe(1)
    for _ in range(8):
        if f is None:
            break
        cfg = f.f_locals.get("backend_config")
        if cfg is not None and hasattr(cfg, "get_device_backend_map"):
            return {str(d): str(b) for d, b in cfg.get_device_backend_map().items()}
        f = f.f_back
    return {}


def _others(store: Any, rank: int, size: int, timeout: timedelta) -> Dict[str, Any]:
    """The backends of the devices the user gave another backend (``cpu:gloo``)."""
    out: Dict[str, Any] = {}
    for device, name in _device_backends().items():
        if name == NAME:
            continue
        if name != "gloo":
            raise SymheapUnsupportedError(
                f"init_process_group: the symheap backend can share a group with gloo only, not {name!r} "
                f"(for device {device!r})"
            )
        sub = dist.PrefixStore(f"symheap-{device}/", store)
        out[device] = dist.ProcessGroupGloo(sub, rank, size, timeout=timeout)
    return out


def create(opts: Any, backend_options: Any = None) -> SymheapProcessGroup:
    """torch's creator of a ``symheap`` group (``extended_api``): runs on the group's members
    only, in the same order on each. Its errors name torch's call: ``init_process_group`` for
    the default group, ``new_group`` for the others."""
    call = "new_group" if opts.global_ranks_in_group else "init_process_group"
    try:
        return _create(opts)
    except SymheapError as e:
        raise as_dist_error(e, call).with_traceback(e.__traceback__) from None


def _create(opts: Any) -> SymheapProcessGroup:
    store, rank, size = opts.store, int(opts.group_rank), int(opts.group_size)
    timeout: timedelta = opts.timeout
    ranks = [int(r) for r in opts.global_ranks_in_group] or list(range(size))
    tid = _groups.team_for(store, rank, size, ranks, timeout)
    default = not opts.global_ranks_in_group
    if default:
        _p2p.setup()
        _staged.reserve()
        _work.decide()
    slot = _groups.slot_for(store, rank, size, timeout, ranks) if tid != 0 else None
    others = _others(store, rank, size, timeout)
    return SymheapProcessGroup(rank, size, ranks, tid, others, timeout, default=default, slot=slot)


def register() -> None:
    """Registers the backend with torch (once per process)."""
    if NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])
