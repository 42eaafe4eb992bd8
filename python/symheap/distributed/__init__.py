"""symheap and torch.distributed.

Two ways in:

* **The backend** (one line): ``import symheap.distributed`` registers the ``symheap``
  backend of torch.distributed, so ``dist.init_process_group("symheap")`` (or
  ``"cuda:symheap,cpu:gloo"``, ``init_device_mesh``, ``new_group``) runs the collectives torch
  code makes (``dist.*``, DTensor, FSDP2, DDP, functional collectives) on symheap. See
  :class:`SymheapProcessGroup` and the README's "Use symheap from torch.distributed".
* **Functions** with the signatures of ``torch.distributed`` (``all_reduce``,
  ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``,
  ``broadcast``, ``barrier``) that call the ``torch.ops.symheap.*`` ops directly, whatever
  backend torch's groups use. As with the backend (and ProcessGroupNCCL), a synchronous call
  (``async_op=False``) leaves its ordinary CUDA tensors' lifetime to the current stream's
  order; an asynchronous one records the stream on them (``Tensor.record_stream``).

Collective-order rule: every PE of the group makes the same calls in the same order with the
same arguments; a mismatch raises :class:`symheap.SymheapMismatchError` on every PE (through
torch's API, also a ``torch.distributed.DistBackendError``).
"""

from __future__ import annotations

from ._api import (
    ReduceOp,
    Work,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    reduce_scatter_tensor,
    register_group,
)
from ._api import (
    _op as _op,  # the reduction names, used by tests and older callers
)
from ._backend import NAME, SymheapProcessGroup, register
from ._errors import twin as dist_error_class

register()

__all__ = [
    "NAME",
    "ReduceOp",
    "SymheapProcessGroup",
    "Work",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "dist_error_class",
    "reduce_scatter_tensor",
    "register",
    "register_group",
]
