"""symheap's ops registered with :mod:`torch.library` at one Python kernel per call.

``torch.library.custom_op`` registers three Python kernels per op (an autograd one, one that
bumps the version counters of mutated tensors, and the backend one), so a call through the
dispatcher crosses from C++ into Python three times: 20-30 us per call of an empty op on the
development VM against 2.4-3.6 us for one kernel (``bench/op_overhead.py`` measures it). Like
vLLM's ``direct_register_custom_op``, :func:`op` defines the schema (inferred from the type
hints, as ``custom_op`` does) and registers one ``CompositeExplicitAutograd`` kernel, which
itself bumps the version counters of the tensors it mutates and refuses inputs that require
grad while grad mode is on (symheap's ops have no autograd formula: without the refusal the
dispatcher's autograd fallback would only warn at backward and leave gradients wrong).

Eager calls skip the dispatcher altogether when nothing needs it (see :meth:`Op.__call__`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch as _torch

from ._native import SymheapUnsupportedError

_NS = "symheap"
# One fragment for every module's ops; kept alive here (a Library deregisters its ops when it
# is collected).
_LIB = _torch.library.Library(_NS, "FRAGMENT")
_any_requires_grad = _torch._C._any_requires_grad
_increment_version = _torch._C._increment_version
_is_grad_enabled = _torch.is_grad_enabled
_is_compiling = _torch.compiler.is_compiling
_dispatch_stack = getattr(_torch._C, "_len_torch_dispatch_stack", None)
_Tensor = _torch.Tensor


def dispatch_needed(args: Sequence[Any]) -> bool:
    """Whether a call must go through the dispatcher: a compiler traces it, a torch dispatch
    mode is active (fake tensors, tracing, counters), or a tensor argument is a subclass; all
    of them need the op's fake kernel and mutation annotations."""
    if _is_compiling():
        return True
    if _dispatch_stack is None or _dispatch_stack() > 0:
        return True
    for a in args:
        if isinstance(a, _Tensor) and type(a) is not _Tensor:
            return True
    return False


class Op:
    """An op ``symheap::<name>``: calling it runs the kernel directly in eager code and through
    ``torch.ops.symheap.<name>`` when :func:`dispatch_needed`; :meth:`register_fake` gives it
    the fake (meta) kernel that tracing uses."""

    def __init__(self, name: str, fn: Callable[..., Any], mutates_args: Sequence[str]) -> None:
        self.name = name
        self.qualname = f"{_NS}::{name}"
        schema = _torch.library.infer_schema(fn, mutates_args=tuple(mutates_args))
        _LIB.define(name + schema, tags=(_torch.Tag.pt2_compliant_tag,))
        self.guard, self.kernel = _kernel(self.qualname, fn, mutates_args)
        _LIB.impl(name, self.kernel, "CompositeExplicitAutograd")
        self._packet: Optional[Any] = None
        self.__doc__ = fn.__doc__

    @property
    def overload(self) -> Any:
        """``torch.ops.symheap.<name>.default``."""
        if self._packet is None:
            self._packet = getattr(getattr(_torch.ops, _NS), self.name).default
        return self._packet

    def register_fake(self, fake: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``fake`` is the op's fake (meta) kernel."""
        _torch.library.register_fake(self.qualname, fake, lib=_LIB)
        return fake

    def __call__(self, *args: Any) -> Any:
        if dispatch_needed(args):
            return self.overload(*args)
        return self.kernel(*args)

    def run(self, runner: Callable[..., Any], *args: Any, **options: Any) -> Any:
        """This op on ``args``, with ``runner(*args, **options)`` doing its work in eager code
        behind the kernel's own refusal and version bump: for a caller that passes the work an
        option the op's schema has no place for (:mod:`symheap.distributed` says whether a
        call records stream use). Through the dispatcher, as :meth:`__call__`, when a
        compiler or a mode needs it (``options`` then take their defaults)."""
        if dispatch_needed(args):
            return self.overload(*args)
        self.guard(args)
        return runner(*args, **options)


def _kernel(
    qualname: str, fn: Callable[..., Any], mutates_args: Sequence[str]
) -> Tuple[Callable[..., None], Callable[..., Any]]:
    """``(guard, kernel)``: ``kernel`` is ``fn`` wrapped as the op's one kernel behind
    ``guard``, which refuses inputs that require grad while grad mode is on and bumps the
    version counter of each mutated tensor argument (what torch's own in-place ops do, so
    autograd notices a saved tensor changed)."""
    code = fn.__code__
    names = code.co_varnames[: code.co_argcount]
    mutated = tuple(names.index(a) for a in mutates_args)
    message = (
        f"{qualname} has no autograd formula: call it on tensors that do not require grad, "
        "under torch.no_grad() or torch.inference_mode(), or detach() them"
    )

    def guard(args: Sequence[Any], kwargs: Optional[Dict[str, Any]] = None) -> None:
        if _is_grad_enabled() and (_any_requires_grad(*args) or (kwargs and _any_requires_grad(*kwargs.values()))):
            raise SymheapUnsupportedError(message)
        if mutated:
            _increment_version([args[i] if i < len(args) else kwargs[names[i]] for i in mutated])

    def kernel(*args: Any, **kwargs: Any) -> Any:
        guard(args, kwargs)
        return fn(*args, **kwargs)

    kernel.__name__ = fn.__name__
    kernel.__doc__ = fn.__doc__
    return guard, kernel


def op(qualname: str, mutates_args: Sequence[str]) -> Callable[[Callable[..., Any]], Op]:
    """Decorator registering ``fn`` as op ``qualname`` (``symheap::<name>``)."""
    ns, name = qualname.split("::", 1)
    if ns != _NS:
        raise ValueError(f"symheap ops live in the {_NS} namespace, not {ns}")

    def register(fn: Callable[..., Any]) -> Op:
        return Op(name, fn, mutates_args)

    return register
