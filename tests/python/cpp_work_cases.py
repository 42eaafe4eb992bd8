"""One process, no group: symheap's C++ Work (symheap/distributed/cpp_work.py) as torch sees it,
and the loader's error paths. ``python cpp_work_cases.py object [cuda]|errors``; prints ``PASS <case>``.

object: the module the environment names (SYMHEAP_TORCH_WORK=build, SYMHEAP_CACHE_DIR) loads and
its Works are torch Works (is_completed, wait, get_future with the outputs themselves, a
``then`` callback); with ``cuda``, a Work made on a side stream behind a long kernel orders the
default stream after it through ``wait()`` and through its future (a stale copy otherwise), a
wait on the same stream adds nothing, and the pool reuses its events.
errors: an unknown SYMHEAP_TORCH_WORK, no compiler, no Python headers, a compiler that fails,
each raising its symheap error before any Work is made.
"""

from __future__ import annotations

import os
import sys
import tempfile

import symheap
import torch
import torch.distributed as dist
from symheap.distributed import cpp_work


def check_cpu(mod) -> None:
    t = torch.arange(6, dtype=torch.float32)
    u = torch.ones(2, dtype=torch.int64)
    w = mod.done([t, u])
    assert isinstance(w, dist.Work), type(w)
    assert w.is_completed() is True
    assert w.wait() is True
    fut = w.get_future()
    assert fut.done()
    value = fut.value()
    assert value[0].data_ptr() == t.data_ptr() and torch.equal(value[1], u), value
    assert w.get_future().value()[0].data_ptr() == t.data_ptr()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    assert torch.equal(doubled, t * 2), doubled
    empty = mod.done([])
    assert empty.wait() and empty.get_future().value() == []
    assert mod.events_created() == 0, "a CPU Work made an event"


def spin_then(mod, stream: torch.cuda.Stream, x: torch.Tensor, value: float):
    """On ``stream``: a ~50 ms kernel, then ``x.fill_(value)``, then a Work over ``x``."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        x.fill_(value)
        return mod.done([x])


def check_cuda(mod) -> None:
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    x = torch.zeros(1 << 20, device=dev)
    main.synchronize()
    w = spin_then(mod, side, x, 7.0)
    w.wait()
    y = x.clone()
    torch.cuda.synchronize()
    assert bool((y == 7).all()), "wait() did not order the current stream after the Work's stream"

    x.zero_()
    main.synchronize()
    w = spin_then(mod, side, x, 5.0)
    got = w.get_future().wait()[0]
    y = got.clone()
    torch.cuda.synchronize()
    assert got.data_ptr() == x.data_ptr() and bool((y == 5).all()), "the future did not order the current stream"

    x.zero_()
    main.synchronize()
    w = spin_then(mod, side, x, 3.0)
    z = w.get_future().then(lambda f: f.value()[0] + 1).wait()
    torch.cuda.synchronize()
    assert bool((z == 4).all()), "a then() callback ran before the Work's stream"

    # The same stream: wait() adds nothing the stream does not already order.
    w = mod.done([x])
    w.wait()
    # Events come back to the pool with their Works.
    del w
    before = mod.events_created()
    for _ in range(200):
        mod.done([x]).wait()
    assert mod.events_created() - before <= 1, (before, mod.events_created())


def run_object() -> None:
    mod = cpp_work.load()
    assert mod is not None, cpp_work.status()
    assert cpp_work.status()["cpp"] is True
    check_cpu(mod)
    if sys.argv[2:] == ["cuda"]:
        check_cuda(mod)
        print("cuda checked", flush=True)
    print("PASS object", flush=True)


def expect(exc_type, fn, words: str) -> None:
    try:
        fn()
    except exc_type as e:
        assert words in str(e), f"{exc_type.__name__} without {words!r}: {e}"
        assert isinstance(e, symheap.SymheapError)
        return
    raise AssertionError(f"no {exc_type.__name__} ({words})")


def run_errors() -> None:
    with tempfile.TemporaryDirectory(prefix="cpp-work-errors-") as cache:
        os.environ["SYMHEAP_CACHE_DIR"] = cache
        check_errors()
    print("PASS errors", flush=True)


def check_errors() -> None:
    os.environ["SYMHEAP_TORCH_WORK"] = "sometimes"
    expect(symheap.SymheapValueError, cpp_work.load, "SYMHEAP_TORCH_WORK")
    os.environ["SYMHEAP_TORCH_WORK"] = "build"
    os.environ["CXX"] = "/nonexistent/c++"
    expect(symheap.SymheapUnsupportedError, cpp_work.load, "no C++ compiler")
    os.environ["CXX"] = "false"
    real_paths = cpp_work.sysconfig.get_paths
    cpp_work.sysconfig.get_paths = lambda: {**real_paths(), "include": "/nonexistent/include"}
    try:
        expect(symheap.SymheapUnsupportedError, cpp_work.load, "Python's headers")
    finally:
        cpp_work.sysconfig.get_paths = real_paths
    expect(symheap.SymheapError, cpp_work.load, "failed")
    assert not os.path.exists(cpp_work.path()), "a failed build left a module"
    # auto never compiles: nothing built means the Python Work, and status says why.
    os.environ["SYMHEAP_TORCH_WORK"] = "auto"
    assert cpp_work.load() is None and "not built" in cpp_work.status()["reason"]
    os.environ["SYMHEAP_TORCH_WORK"] = "off"
    assert cpp_work.load() is None and cpp_work.status()["reason"].endswith("=off")


if __name__ == "__main__":
    {"object": run_object, "errors": run_errors}[sys.argv[1]]()
