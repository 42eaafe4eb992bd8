"""In-process tests with one PE (no launcher): the module surface, exceptions, buffers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import symheap
import symheap.numpy as sn
from symheap import _native


@pytest.fixture(scope="module")
def ctx():
    for v in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_ID"):
        if v in __import__("os").environ:
            pytest.skip("running under a launcher")
    c = symheap.init(backend="host", capacity=1 << 30)
    yield c
    symheap.finalize()


def test_exception_hierarchy() -> None:
    E = symheap
    assert issubclass(E.SymheapValueError, E.SymheapError) and issubclass(E.SymheapValueError, ValueError)
    assert issubclass(E.SymheapMemoryError, MemoryError)
    assert issubclass(E.SymheapTimeoutError, TimeoutError)
    for c in (E.SymheapPeerError, E.SymheapMismatchError, E.SymheapUnsupportedError):
        assert issubclass(c, E.SymheapError)
    assert E.SymheapError.__module__ == "symheap"
    e = E.SymheapTimeoutError("x")
    assert str(e) == "x" and e.kind is None and e.missing == ()


def test_not_initialised_raises() -> None:
    if symheap.is_initialized():
        pytest.skip("a context exists")
    with pytest.raises(symheap.SymheapError):
        symheap.my_pe()


def test_single_pe_basics(ctx) -> None:
    assert symheap.my_pe() == 0 and symheap.n_pes() == 1 and symheap.backend() == "host"
    a, pb = sn.allocate_symmetric(10, dtype=np.int32)
    assert pb.tolist() == [a.__array_interface__["data"][0]]
    a[...] = np.arange(10)
    b = sn.zeros(10, dtype=np.int32)
    symheap.put(b, a, 0)
    assert b.tolist() == list(range(10))
    assert symheap.heap_bases()[0] <= pb[0]


def test_error_carries_rust_details(ctx) -> None:
    x = sn.zeros(4, dtype=np.float64)
    with pytest.raises(symheap.SymheapValueError) as ei:
        symheap.atomic_fetch_add(x, 1.0, 0)
    e = ei.value
    # The call the user made, not the Rust helper ("atomic") that refused it.
    assert e.kind == "invalid_argument" and e.pe == 0 and e.call == "atomic_fetch_add"
    assert str(e).startswith("symheap PE 0: atomic_fetch_add: invalid argument:")


def test_buffer_exports(ctx) -> None:
    buf = symheap.allocate((2, 3), "int16", zero=True)
    assert buf.shape == (2, 3) and buf.dtype == "int16" and buf.itemsize == 2 and buf.nbytes == 12
    assert buf.device == "cpu" and len(buf) == 2
    ai = buf.__array_interface__
    assert ai["shape"] == (2, 3) and ai["typestr"] == "<i2" and ai["data"] == (buf.addr, False)
    assert not hasattr(buf, "__cuda_array_interface__")  # host memory
    buf.write_bytes(b"\x01\x00\x02\x00", offset=2)
    assert np.asarray(buf).tolist() == [[0, 1, 2], [0, 0, 0]]
    assert buf.tobytes()[:6] == b"\x00\x00\x01\x00\x02\x00"
    with pytest.raises(symheap.SymheapValueError):
        buf.write_bytes(b"\x00" * 13)
    with pytest.raises(BufferError):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        buf.__dlpack__(dl_device=(2, 0))
    m = buf.address_map()
    assert m["allocation_base"] == buf.addr and m["peer_bases"] == buf.peer_bases() and m["direct"] == [True]
    assert "SymmetricBuffer(shape=[2, 3]" in repr(buf)
    # The buffer protocol: not available under abi3 for Python < 3.11; the array interface is.
    with pytest.raises(TypeError):
        memoryview(buf)


def test_buffer_record_stream_takes_a_handle_or_a_stream(ctx) -> None:
    """``record_stream`` takes an int handle or an object with ``.cuda_stream`` (torch's Stream);
    anything else, a negative handle included, raises (a no-op on the host backend otherwise)."""

    class Stream:
        cuda_stream = 7

    buf = symheap.allocate((4,), "float32")
    buf.record_stream(0)
    buf.record_stream(1 << 40)
    buf.record_stream(Stream())
    with pytest.raises(OverflowError):
        buf.record_stream(-1)
    with pytest.raises(AttributeError):
        buf.record_stream("stream")
    with pytest.raises(AttributeError):
        buf.record_stream(None)
    buf.free()
    with pytest.raises(symheap.SymheapValueError):
        buf.record_stream(0)


def test_allocate_records_a_stream_given_as_a_handle_or_a_stream(ctx) -> None:
    """``allocate(stream=...)`` takes what ``record_stream`` takes (a no-op on the host backend);
    a negative handle or a string is a SymheapValueError naming the stream, before anything is
    allocated."""

    class Stream:
        cuda_stream = 7

    for s in (None, 0, 1 << 40, Stream()):
        buf = symheap.allocate((4,), "float32", stream=s)
        assert list(buf.shape) == [4]
        buf.free()
    live = symheap.heap_usage()["live_blocks"]
    for bad in (-1, "stream"):
        with pytest.raises(symheap.SymheapValueError, match="stream"):
            symheap.allocate((4,), "float32", stream=bad)
    assert symheap.heap_usage()["live_blocks"] == live


def test_an_empty_slice_at_the_end_of_an_allocation_is_symmetric(ctx) -> None:
    """``a[n:]`` of an ``n``-element symmetric array (what a PE that sends nothing from the end
    of its buffer passes) is accepted by every call, as an empty slice anywhere else is."""
    a = sn.zeros(8, dtype=np.float32)
    e = a[8:]
    assert e.size == 0
    symheap.put(e, e, 0)
    symheap.get(e, e, 0)
    symheap.all_reduce(e)
    symheap.broadcast(e, e, 0)
    symheap.alltoall(e, e)
    assert sn.get_peer_array(e, 0).size == 0
    symheap.barrier_all()
    with pytest.raises(symheap.SymheapValueError):
        symheap.put(a[4:], np.zeros(5, dtype=np.float32), 0)  # one element past the end


def test_arrays_keep_allocations_alive(ctx) -> None:
    import gc

    gc.collect()
    symheap.barrier_all()
    live = symheap.heap_usage()["live_blocks"]
    a = sn.zeros(100)
    view = a[10:20]
    del a
    gc.collect()
    symheap.barrier_all()
    assert symheap.heap_usage()["live_blocks"] == live + 1  # the view holds it
    view[...] = 3.0
    del view
    gc.collect()
    symheap.barrier_all()
    assert symheap.heap_usage()["live_blocks"] == live


def test_public_names_are_documented(ctx) -> None:
    """Every public function of the package has a docstring; every collective one says so."""
    import inspect

    import symheap._shmem as shmem

    for name in symheap.__all__:
        obj = getattr(symheap, name)
        if inspect.isfunction(obj):
            assert obj.__doc__, name
    for name in (
        "barrier_all",
        "broadcast",
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "alltoall",
        "team_split_strided",
        "team_split_ranks",
        "team_from_ranks",
        "team_destroy",
        "barrier",
        "sync_all",
        "host_barrier",
    ):
        assert "Collective" in getattr(shmem, name).__doc__, name
    for name in sn.__all__:
        assert getattr(sn, name).__doc__, name
    for name in ("empty", "zeros", "ones", "full", "rand", "randn", "arange", "as_symmetric", "allocate_symmetric"):
        assert "Collective" in getattr(sn, name).__doc__, name


def test_stubs_cover_the_native_module() -> None:
    stub = (Path(symheap.__file__).parent / "_native.pyi").read_text()
    assert (Path(symheap.__file__).parent / "py.typed").exists()
    for name in dir(_native):
        if name.startswith("__") and name != "__version__":
            continue
        assert re.search(rf"\b{name}\b", stub), f"_native.{name} missing from _native.pyi"
    for cls in (_native.Context, _native.SymmetricBuffer, _native.HeapView, _native.Team):
        for name in dir(cls):
            if not name.startswith("_") or name in ("__dlpack__", "__dlpack_device__", "__array_interface__"):
                assert re.search(rf"\b{name}\b", stub), f"{cls.__name__}.{name} missing from _native.pyi"


def test_finalize_runs_provider_shutdowns_first() -> None:
    """Shutdown hooks (an NVSHMEM provider left open registers one) run newest first, before the
    context goes, once; a failing hook still lets the context finalize; at exit likewise."""
    import os
    import subprocess
    import sys

    code = r"""
import symheap
from symheap import _core
seen = []
symheap.init(backend="host", capacity=1 << 28)
_core._before_finalize.append(lambda: seen.append(("first", symheap.is_initialized())))
_core._before_finalize.append(lambda: seen.append(("second", symheap.is_initialized())))
symheap.finalize()
assert seen == [("second", True), ("first", True)], seen
assert not symheap.is_initialized() and _core._before_finalize == []
symheap.finalize()
assert len(seen) == 2
symheap.init(backend="host", capacity=1 << 28)
def boom():
    raise RuntimeError("hook failed")
_core._before_finalize.append(boom)
try:
    symheap.finalize()
except RuntimeError as e:
    assert "hook failed" in str(e)
else:
    raise AssertionError("the hook's error was swallowed")
assert not symheap.is_initialized()
symheap.init(backend="host", capacity=1 << 28)
_core._before_finalize.append(lambda: print("HOOK-AT-EXIT", symheap.is_initialized()))
print("OK")
"""
    launcher = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_ID")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["OK", "HOOK-AT-EXIT", "True"], r.stdout + r.stderr


def test_kernels_wait_as_long_as_the_context() -> None:
    """The fused ops' device-side wait bound is the context's timeout (init(timeout=) here),
    not a second reading of SYMHEAP_TIMEOUT with its own default."""
    import os
    import subprocess
    import sys

    code = """
import symheap
from symheap import _core
symheap.init(backend="host", capacity=1 << 28, timeout=7.5)
assert _core.native().timeout_ns == 7_500_000_000, _core.native().timeout_ns
from symheap import fused, gemm
assert fused._timeout_ns() == gemm._timeout_ns() == 7_500_000_000
symheap.finalize()
print("OK")
"""
    launcher = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_ID")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env["SYMHEAP_TIMEOUT"] = "99"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["OK"], r.stdout + r.stderr


def test_an_error_names_the_call_the_user_made(ctx) -> None:
    """A failure inside a helper symheap runs for a public call is reported under the public
    call: `symheap.numpy.zeros` allocates through `allocate`, and the user called `zeros`."""
    with pytest.raises(symheap.SymheapMemoryError) as e:
        sn.zeros(1 << 40, dtype=np.float32)
    assert e.value.call == "zeros"
    assert str(e.value).startswith("symheap PE 0: zeros: out of symmetric memory"), str(e.value)
