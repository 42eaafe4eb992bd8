"""The ``Work`` objects the symheap backend returns, with torch's meaning.

symheap enqueues a collective on torch's current stream when it is called (on the host backend
it is done when the call returns), so there is nothing left to run when torch waits: a Work is a
completed ``torch.futures.Future`` wrapped by torch's own ``_create_work_from_future``, and:

* ``wait()``: on CUDA the *current* stream (at the time of the wait) waits for the stream the
  collective ran on (a CUDA future records an event there when it completes): no host sync, the
  same as ProcessGroupNCCL's work; on the host backend it returns at once;
* ``is_completed()``: True (the host enqueued the work);
* ``get_future()``: the completed future, its value the output tensors (a list), as NCCL's;
* a call with ``async_op=False`` returns one completed Work shared by all such calls (torch
  only waits on it, and there is nothing to wait for: see :func:`done`).

Work objects made by C++ are used, not a Python subclass, because C++ callers (functional
collectives' ``wait_tensor``, DDP) keep them after Python dropped its reference: symheap's own
C++ Work when it is built for this torch (:mod:`.cpp_work`: the same behaviour for a few µs less
host time per call), else torch's ``_create_work_from_future`` over a CUDA future.
"""

from __future__ import annotations

from typing import Any, List, Sequence

import torch as _torch
from torch._C._distributed_c10d import _create_work_from_future

# torch's C++ future itself: ``torch.futures.Future`` only adds Python wrappers around it (its
# ``__init__`` builds a torch.device per entry of ``devices`` on every call).
_Future = _torch._C.Future
_NO_DEVICES: List[_torch.device] = []


_sync_work: Any = None
# symheap's C++ Work maker (cpp_work's ``done``) or None; decided at the first group's creation
# (or the first asynchronous call), as SYMHEAP_TORCH_WORK says.
_cpp_done: Any = None
_decided = False


def decide() -> None:
    """Chooses, once per process, where asynchronous Works come from (:func:`cpp_work.load`).
    A ``SYMHEAP_TORCH_WORK=build`` that fails raises here."""
    global _cpp_done, _decided
    if _decided:
        return
    # Imported here, not at the top: ``python -m symheap.distributed.cpp_work`` imports this
    # package first, and runpy warns about a module already imported.
    from . import cpp_work

    module = cpp_work.load()
    _cpp_done = module.done if module is not None else None
    _decided = True


def done(outputs: Sequence[_torch.Tensor], opts: Any = None) -> Any:
    """A completed Work whose future holds ``outputs`` (a list of tensors, possibly empty).

    A call torch made with ``async_op=False`` (``opts.asyncOp`` False: torch's Python wrappers
    set it, then only ``wait()`` on the Work at once, on the stream the collective was just
    enqueued on) gets one completed Work made once: a CUDA future records an event per call and
    has torch extract the tensors of its value by pickling it (~10 µs of host time on an H100
    host, more than the collective's own call). C++ callers leave ``asyncOp`` at its default,
    True, and get a Work of their own."""
    if opts is not None and getattr(opts, "asyncOp", True) is False:
        global _sync_work
        if _sync_work is None:
            _sync_work = done([])
        return _sync_work
    if not _decided:
        decide()
    if _cpp_done is not None:
        return _cpp_done(outputs)
    devs = _NO_DEVICES
    for t in outputs:
        if t.is_cuda:
            d = t.device
            if devs is _NO_DEVICES:
                devs = [d]
            elif d not in devs:
                devs.append(d)
    fut = _Future(devs)
    fut.set_result(outputs if type(outputs) is list else list(outputs))
    return _create_work_from_future(fut)
