"""Every private torch function symheap calls, named and called here, so that a torch release
that drops or changes one fails CI (which runs this on the lowest supported torch and on the
newest, scripts/torch_range.sh) rather than a user. A new private use in python/symheap must be
added to PRIVATE: the last test greps the package for them."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest

from conftest import ROOT

# (module, attribute, the first torch it is needed from, who uses it).
PRIVATE = [
    ("torch._C", "_any_requires_grad", (2, 8), "_library.py: ops refuse inputs that require grad"),
    ("torch._C", "_increment_version", (2, 5), "_library.py: ops bump mutated tensors' versions"),
    ("torch._C", "_len_torch_dispatch_stack", (2, 5), "_library.py: eager calls skip the dispatcher"),
    ("torch.distributed.distributed_c10d", "_resolve_process_group", (2, 5), "providers.torch_symm_mem(group=name)"),
    ("torch.distributed._symmetric_memory", "empty", (2, 6), "providers.torch_symm_mem"),
    ("torch.distributed._symmetric_memory", "rendezvous", (2, 6), "providers.torch_symm_mem"),
    ("torch._C._distributed_c10d", "_create_work_from_future", (2, 8), "distributed/_work.py: the backend's works"),
    ("torch._C", "_cuda_getCurrentRawStream", (2, 5), "_core.current_stream_handle: the stream of an eager call"),
    ("torch._C", "Future", (2, 8), "distributed/_work.py: the works' futures, without torch.futures' wrapper"),
    ("torch._C", "_from_dlpack", (2, 8), "torch.py: symmetric tensors from symheap's own DLPack capsules"),
]


def _version(torch: Any) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])


@pytest.mark.parametrize("module, name, since, user", PRIVATE, ids=[f"{m}.{n}" for m, n, _, _ in PRIVATE])
def test_private_torch_function_exists(torch_module, module: str, name: str, since: tuple, user: str) -> None:
    if _version(torch_module) < since:
        pytest.skip(f"{module}.{name} is used from torch {since[0]}.{since[1]} on ({user})")
    mod = importlib.import_module(module)
    assert callable(getattr(mod, name, None)), f"torch {torch_module.__version__} has no {module}.{name} ({user})"


def test_private_torch_functions_behave_as_used(torch_module) -> None:
    """The calls as _library.py makes them, with the results it relies on."""
    torch = torch_module
    C = torch._C
    a, b = torch.zeros(3), torch.zeros(3, requires_grad=True)
    assert C._any_requires_grad(a) is False and C._any_requires_grad(a, b) is True
    v = a._version
    C._increment_version((a,))
    assert a._version == v + 1
    assert C._len_torch_dispatch_stack() == 0
    from torch.utils._python_dispatch import TorchDispatchMode

    with TorchDispatchMode():
        assert C._len_torch_dispatch_stack() == 1


def test_work_from_a_c_future_as_the_backend_makes_it(torch_module) -> None:
    """``_create_work_from_future`` over a ``torch._C.Future`` (distributed/_work.py): the Work
    is completed and its future holds the very list of outputs."""
    torch = torch_module
    from torch._C._distributed_c10d import _create_work_from_future

    outs = [torch.arange(4.0)]
    fut = torch._C.Future([])
    fut.set_result(outs)
    work = _create_work_from_future(fut)
    assert work.wait() and work.is_completed()
    got = work.get_future().value()
    assert got is outs or (len(got) == 1 and got[0] is outs[0])


def test_every_private_torch_use_is_listed() -> None:
    """python/symheap uses no private torch name that PRIVATE does not list."""
    listed = {n for _, n, _, _ in PRIVATE} | {m.rsplit(".", 1)[1] for m, _, _, _ in PRIVATE}
    pattern = re.compile(r"\b(?:_?torch|_C|c10d|symm_mem|_symm)\.(_[A-Za-z]\w*)")
    # `from torch... import _name` too (names imported from a private module are its private API).
    imported = re.compile(r"^\s*from torch[\w.]* import \(?([\w, ]+)")
    found = {}
    for path in sorted((ROOT / "python" / "symheap").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            m = imported.match(line)
            names = [n.strip().split(" as ")[0] for n in m.group(1).split(",")] if m else []
            for name in pattern.findall(line) + [n for n in names if n.startswith("_")]:
                if name not in ("_C", "_torch") and not name.startswith("__"):
                    found.setdefault(name, f"{path.relative_to(ROOT)}:{i}")
    unlisted = {n: where for n, where in found.items() if n not in listed}
    assert not unlisted, f"private torch names used but not in PRIVATE: {unlisted}"
