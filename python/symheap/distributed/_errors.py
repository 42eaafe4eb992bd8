"""symheap's errors as torch.distributed errors.

An error raised through torch's API by the symheap backend is both what torch code catches
(``torch.distributed.DistBackendError``, a ``RuntimeError``) and what symheap code catches (the
same :class:`symheap.SymheapError` subclass the call raises when made directly, with its
``pe``, ``call`` and ``kind``): each symheap error class gets one twin deriving from both.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, TypeVar

import torch.distributed as dist

from .._native import SymheapError

F = TypeVar("F", bound=Callable[..., Any])

_BASE: Any = getattr(dist, "DistBackendError", RuntimeError)
_TWINS: Dict[type, type] = {}


def twin(cls: type) -> type:
    """The class deriving from symheap error class ``cls`` and torch's DistBackendError."""
    t = _TWINS.get(cls)
    if t is None:
        t = type(cls.__name__, (cls, _BASE), {"__module__": cls.__module__, "__doc__": cls.__doc__})
        _TWINS[cls] = t
    return t


def as_dist_error(e: SymheapError, call: str) -> BaseException:
    """``e`` as an instance of its twin class, naming torch's ``call`` (``dist.all_reduce``)
    before symheap's message, with the same attributes."""
    if isinstance(e, _BASE):
        return e
    msg = str(e.args[0]) if e.args else str(e)
    err = twin(type(e))(f"{call}: {msg}" if not msg.startswith(call) else msg, *e.args[1:])
    err.__dict__.update(getattr(e, "__dict__", {}))
    return err


def dist_errors(call: str) -> Callable[[F], F]:
    """A backend method raising its symheap errors as :func:`as_dist_error` of them."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def method(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except SymheapError as e:
                raise as_dist_error(e, call).with_traceback(e.__traceback__) from None

        return method  # type: ignore[return-value]

    return wrap
