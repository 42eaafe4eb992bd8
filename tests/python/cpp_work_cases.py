"""symheap's C++ Work (symheap/distributed/cpp_work.py) as torch sees it, the loader's error
paths, and its background build. ``python cpp_work_cases.py object [cuda]|errors`` (one process,
no group) or ``auto`` (under symheap.launch); prints ``PASS <case>``.

object: the module the environment names (SYMHEAP_TORCH_WORK=build, SYMHEAP_CACHE_DIR) loads and
its Works are torch Works (is_completed, wait, get_future with the outputs themselves, a
``then`` callback); with ``cuda``, a Work made on a side stream behind a long kernel orders the
default stream after it through ``wait()`` and through its future (a stale copy otherwise), a
wait on the same stream adds nothing, and the pool reuses its events.
errors: an unknown SYMHEAP_TORCH_WORK, no compiler, no Python headers, a compiler that fails,
each raising its symheap error before any Work is made; under ``auto`` no compiler starts no
build, nor does the status command, and a failing background build is recorded (the status
command names it) and not started again.
auto: a group made with SYMHEAP_TORCH_WORK=auto and nothing built uses the Python Work (an
asynchronous all_reduce through it) and names the background build in ``status()``; prints
``[PE r] REASON ...`` and ``[PE r] PATH <module>`` for the test, which waits for the build.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time

import symheap
import torch
import torch.distributed as dist
from symheap.distributed import _work, cpp_work


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
    check_auto_errors()
    os.environ["SYMHEAP_TORCH_WORK"] = "off"
    assert cpp_work.load() is None and cpp_work.status()["reason"].endswith("=off")


def check_auto_errors() -> None:
    """auto with nothing built: no compiler starts nothing; a compiler that fails runs once in
    the background, its failure is kept and auto does not start it again."""
    os.environ["SYMHEAP_TORCH_WORK"] = "auto"
    out = cpp_work.path()
    # The status command asks; it starts no build (with the default compiler, which exists).
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    cmd = [sys.executable, "-m", "symheap.distributed.cpp_work", "status"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "built: False" in p.stdout and "not built" in p.stdout, p.stdout + p.stderr
    assert not os.path.exists(out + ".log"), "the status command started a build"
    os.environ["CXX"] = "/nonexistent/c++"
    assert cpp_work.load() is None and "cannot be built here" in cpp_work.status()["reason"], cpp_work.status()
    assert not os.path.exists(out + ".log"), "a build started without a compiler"
    os.environ["CXX"] = "false"
    assert cpp_work.load() is None and "background" in cpp_work.status()["reason"], cpp_work.status()
    deadline = time.monotonic() + 180
    while not os.path.exists(out + ".failed"):
        assert time.monotonic() < deadline, f"the background build left no failure: {read(out + '.log')}"
        time.sleep(0.2)
    wait_unlocked(out + ".spawn")
    assert "failed" in read(out + ".failed"), read(out + ".failed")
    assert cpp_work.load() is None and "background build failed" in cpp_work.status()["reason"], cpp_work.status()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "background build failed" in p.stdout, p.stdout + p.stderr
    wait_unlocked(out + ".spawn")
    assert read(out + ".log").count("background build of") == 1, read(out + ".log")
    assert not os.path.exists(out)


def read(file: str) -> str:
    with open(file) as f:
        return f.read()


def wait_unlocked(file: str) -> None:
    """Returns once no build process holds ``file`` (cpp_work's one-build-at-a-time lock)."""
    deadline = time.monotonic() + 180
    with open(file) as f:
        while True:
            try:
                return fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{file}: a build still holds it after 180 s"
                time.sleep(0.2)


def run_auto() -> None:
    os.environ["SYMHEAP_TORCH_WORK"] = "auto"
    dist.init_process_group("cpu:symheap")
    r = dist.get_rank()
    st = cpp_work.status()
    assert st["cpp"] is False and "background" in st["reason"], st
    t = torch.full((4,), float(r + 1))
    w = dist.all_reduce(t, async_op=True)
    assert _work._cpp_done is None and w.wait()
    n = dist.get_world_size()
    assert torch.equal(t, torch.full((4,), float(n * (n + 1) // 2))), t
    dist.destroy_process_group()
    print(f"[PE {r}] REASON {st['reason']}", flush=True)
    print(f"[PE {r}] PATH {st['path']}", flush=True)
    print(f"[PE {r}] PASS auto", flush=True)


if __name__ == "__main__":
    {"object": run_object, "errors": run_errors, "auto": run_auto}[sys.argv[1]]()
