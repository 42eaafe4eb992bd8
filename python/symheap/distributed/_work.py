"""The ``Work`` objects the symheap backend returns, with torch's meaning.

symheap enqueues a collective on torch's current stream when it is called (on the host backend
it is done when the call returns), so there is nothing left to run when torch waits: a Work is a
completed ``torch.futures.Future`` wrapped by torch's own ``_create_work_from_future``, and:

* ``wait()``: on CUDA the *current* stream (at the time of the wait) waits for the stream the
  collective ran on (a CUDA future records an event there when it completes): no host sync, the
  same as ProcessGroupNCCL's work; on the host backend it returns at once;
* ``is_completed()``: True (the host enqueued the work);
* ``get_future()``: the completed future, its value the output tensors (a list), as NCCL's.

Work objects made by torch's C++ code are used, not a Python subclass, because C++ callers
(functional collectives' ``wait_tensor``, DDP) keep them after Python dropped its reference.
"""

from __future__ import annotations

from typing import Any, List, Sequence

import torch as _torch
from torch._C._distributed_c10d import _create_work_from_future


def done(outputs: Sequence[_torch.Tensor]) -> Any:
    """A completed Work whose future holds ``outputs`` (a list of tensors, possibly empty)."""
    devs: List[_torch.device] = []
    for t in outputs:
        if t.is_cuda and t.device not in devs:
            devs.append(t.device)
    fut: Any = _torch.futures.Future(devices=devs) if devs else _torch.futures.Future()
    fut.set_result(list(outputs))
    return _create_work_from_future(fut)
