"""PE-side cases of symheap.providers, run under the launcher by test_providers.py (host backend,
CPU tensors) and test_providers_gpu.py (CUDA backend):

    python -m symheap.launch -n N -- python tests/python/provider_cases.py CASE:PROVIDER [...]

PROVIDER is ``native``, ``nvshmem`` or ``torch_symm_mem`` (``mixed`` takes ``A+B``). Cases:

- ``errors`` (no provider): what each provider needs, as typed errors (runs without torch);
- ``contract:P``: the contract on host and device: ``peer_bases[me] == data_ptr``, the table
  reads and writes every peer's copy (at the addresses themselves: ctypes on the host backend,
  CuPy memory on GPUs), the address map, views, per-peer offsets identical across
  allocations where ``peer_offsets()`` promises it, cross-allocation translation, free;
- ``triton:P``: one Triton kernel from symheap.triton (put of a random block into the next PE's
  tensor + signal_add, a relaxed sys atomic_add counter on PE 0, then a get back), with and
  without ``hint``;
- ``cuda:P``: the same with a CUDA C++ kernel using symheap.cuh (CuPy RawModule, NVRTC);
- ``cross:P``: a kernel translating one allocation's pointers with another's table;
- ``mixed:A+B``: one Triton kernel and one CUDA kernel reading A's tensor and writing B's tensor
  with the two tables;
- ``rma:nvshmem``: symheap's put/get/put_signal/signal_wait_until/atomics/quiet on NVSHMEM
  tensors (routed through NVSHMEM to every PE, direct or across simulated nodes), the
  provider's host calls, and their errors;
- ``device_lib:nvshmem``: examples/cuda/nvshmem_ring.cu built with NVSHMEM's device library,
  loaded with CuPy and set up with ``init_module``: the ring forced through NVSHMEM's device
  API, then through the peer table;
- ``device_lib_errors:nvshmem``: ``init_module``'s errors (a 0 handle, a module without the
  device library, a finalized provider).

Random data, seeded by the case name (the same on every PE); exact expected values; outputs
poisoned first. On the CUDA backend torch.distributed is initialised (NCCL, device = local
rank) before symheap.init(), which then rendezvouses over torch's store. A failure raises, so
the PE exits non-zero and the launcher stops the job. Not collected by pytest.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import zlib
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import symheap
from symheap import SymheapError, SymheapUnsupportedError, SymheapValueError, providers

CASES: Dict[str, Callable[[str], None]] = {}
POISON = -12345.0
N = 3000  # elements: not a multiple of the block size (masks are exercised)
BLOCK = 256
WAIT_NS = 20_000_000_000


def case(fn: Callable[[str], None]) -> Callable[[str], None]:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def on_gpu() -> bool:
    return os.environ.get("SYMHEAP_BACKEND", "host") == "cuda"


def make(name: str) -> providers.Provider:
    if name == "native":
        return providers.native()
    if name == "nvshmem":
        return providers.nvshmem()
    if name == "torch_symm_mem":
        return providers.torch_symm_mem()
    raise ValueError(f"unknown provider {name!r}")


def raises(exc: type, fn: Callable[..., Any], *args: Any, **kw: Any) -> BaseException:
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")


# ---- reading and writing any address of this process ------------------------------------------
#
# The contract's addresses are checked as addresses: a peer's copy is read and written at
# peer_bases[r] itself, not through symheap's own calls. Host backend: ctypes. CUDA: CuPy memory
# at that address with the device given explicitly (a mapped peer allocation reports its owner
# GPU as its device, while this process may only reach it through its own device).


def _peer_array(addr: int, numel: int, dtype: Any) -> Any:
    dt = np.dtype(dtype)
    nbytes = numel * dt.itemsize
    if not on_gpu():
        buf = (ctypes.c_uint8 * nbytes).from_address(addr)
        return np.frombuffer(buf, dtype=dt)
    import cupy
    import torch

    mem = cupy.cuda.UnownedMemory(addr, nbytes, None, torch.cuda.current_device())
    return cupy.ndarray((numel,), dtype=dt, memptr=cupy.cuda.MemoryPointer(mem, 0))


def read_at(addr: int, numel: int, dtype: Any) -> np.ndarray:
    """``numel`` elements at address ``addr`` of this process (a copy, as NumPy)."""
    a = _peer_array(addr, numel, dtype)
    return a.copy() if isinstance(a, np.ndarray) else a.get()


def write_at(addr: int, values: np.ndarray) -> None:
    """Writes ``values`` at address ``addr`` of this process."""
    a = _peer_array(addr, values.size, values.dtype)
    if isinstance(a, np.ndarray):
        a[...] = values.ravel()
    else:
        a.set(np.ascontiguousarray(values.ravel()))


# ---- cases -------------------------------------------------------------------------------------


@case
def case_errors(_: str) -> None:
    """What each provider needs, as typed errors (CI: host backend, maybe without torch)."""
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    assert symheap.backend() == "host"
    if have_torch:
        assert providers.native().name == "native"
    else:
        e = raises(SymheapUnsupportedError, providers.native)
        assert "torch" in str(e).lower(), e
    # NVSHMEM: never on the host backend (or without torch).
    e = raises(SymheapUnsupportedError, providers.nvshmem)
    assert ("cuda" in str(e).lower() and "backend" in str(e).lower()) or "torch" in str(e).lower(), e
    # torch SymmetricMemory: needs torch.distributed initialised.
    e = raises(SymheapUnsupportedError, providers.torch_symm_mem)
    assert "torch" in str(e).lower(), e
    assert issubclass(providers.SymheapProviderError, SymheapError)


def _check_map(p: providers.Provider, t: Any, table: Any, amap: Any) -> None:
    me = p.my_pe()
    assert amap.local_rank == me
    assert amap.allocation_base == t.data_ptr(), (hex(amap.allocation_base), hex(t.data_ptr()))
    assert amap.allocation_bytes >= t.numel() * t.element_size()
    assert [int(v) for v in amap.peer_bases.cpu()] == [int(v) for v in table.cpu()]
    assert list(amap.direct) == [int(v) != 0 for v in table.cpu()]


@case
def case_contract(name: str) -> None:
    import torch

    p = make(name)
    me, n = p.my_pe(), p.n_pes()
    assert (me, n) == (symheap.my_pe(), symheap.n_pes()), (me, n)
    assert p.name == name and name in repr(p)
    dev = p.device()
    rng = rng_for("contract:" + name)
    data = torch.from_numpy(rng.integers(-1000, 1000, size=(n, 4, 8)).astype(np.float32))
    idata = torch.from_numpy(rng.integers(-(2**40), 2**40, size=(n, 16)).astype(np.int64))

    x, px = p.allocate_symmetric(4, 8, dtype=torch.float32)
    y, py = p.allocate_symmetric((16,), dtype=torch.int64)
    z, zmap = p.allocate_symmetric_map(3, 5, dtype=torch.int32)
    s, ps = p.allocate_symmetric(dtype=torch.int64)  # a 0-d tensor
    for t, table, shape, dtype in (
        (x, px, (4, 8), torch.float32),
        (y, py, (16,), torch.int64),
        (s, ps, (), torch.int64),
    ):
        assert tuple(t.shape) == shape and t.dtype == dtype and t.device == dev and t.is_contiguous()
        assert table.dtype == torch.int64 and tuple(table.shape) == (n,) and table.device == t.device
        bases = [int(v) for v in table.cpu()]
        assert bases[me] == t.data_ptr(), (me, [hex(b) for b in bases], hex(t.data_ptr()))
        # One node (host backend, or GPUs with P2P): every peer is direct.
        assert all(b != 0 for b in bases), bases
        assert len(set(bases)) == n, bases
        _check_map(p, t, table, p.symmetric_address_map(t))
    assert tuple(z.shape) == (3, 5) and z.dtype == torch.int32
    _check_map(p, z, zmap.peer_bases, zmap)
    assert int(zmap.peer_bases[me]) == z.data_ptr()

    # A view inside an allocation: the map of the allocation holding it.
    vmap = p.symmetric_address_map(x[1:])
    assert vmap.allocation_base == x.data_ptr()
    assert [int(b) for b in vmap.peer_bases.cpu()] == [int(b) for b in px.cpu()]
    assert vmap.translate(x[1:].data_ptr(), me, me) == x.data_ptr() + 32
    raises(SymheapValueError, p.symmetric_address_map, torch.zeros(4, device=dev))

    # Per-peer offsets identical across allocations, where promised.
    offs = p.peer_offsets()
    if name in ("native", "nvshmem"):
        assert offs is not None and len(offs) == n and offs[me] == 0, offs
        for t, table in ((x, px), (y, py), (z, zmap.peer_bases), (s, ps)):
            assert [int(b) - t.data_ptr() for b in table.cpu()] == offs, (name, offs)
    else:
        assert offs is None

    # Every PE writes its data, then reads every peer's copy at the table's addresses.
    x.copy_(data[me].to(dev))
    y.copy_(idata[me].to(dev))
    s.fill_(1000 + me)
    p.barrier()
    for r in range(n):
        assert np.array_equal(read_at(int(px[r]), 32, np.float32), data[r].numpy().ravel()), r
        assert np.array_equal(read_at(int(py[r]), 16, np.int64), idata[r].numpy())
        assert read_at(int(ps[r]), 1, np.int64)[0] == 1000 + r
        if offs is not None:
            # Cross-allocation: y's peer copy through x's table.
            addr = int(px[r]) + (y.data_ptr() - int(px[me]))
            assert addr == int(py[r])
            assert np.array_equal(read_at(addr, 16, np.int64), idata[r].numpy())
    # Write into the next PE's copy at its table address; read back after a barrier.
    nxt, prv = (me + 1) % n, (me - 1) % n
    p.barrier()  # everyone has read x
    write_at(int(px[nxt]), data[me].numpy() * 3)
    if on_gpu():
        torch.cuda.synchronize()
    p.barrier()
    assert torch.equal(x.cpu(), data[prv] * 3)
    p.barrier()  # nobody reads x any more

    # free: every PE, same order; a second free (or a foreign tensor) is an error.
    for t in (x, y, z, s):
        p.free(t)
    raises(SymheapValueError, p.free, x)
    raises(SymheapValueError, p.free, torch.zeros(2, device=dev))
    # A fresh allocation after the frees still satisfies the contract.
    w, pw = p.allocate_symmetric(7, dtype=torch.float64)
    assert int(pw[me]) == w.data_ptr()
    if offs is not None:
        assert [int(b) - w.data_ptr() for b in pw.cpu()] == offs
    p.barrier()
    p.free(w)
    p.barrier()


# ---- kernels -----------------------------------------------------------------------------------

_triton_cache: Dict[str, Any] = {}


def triton_kernels() -> Dict[str, Any]:
    if _triton_cache:
        return _triton_cache
    import symheap.triton as sh
    import triton
    import triton.language as tl

    @triton.jit
    def ring_kernel(
        src, dst, dst_bases, sig, sig_bases, ctr, ctr_bases, me, nxt, n, BLOCK: tl.constexpr, HINT: tl.constexpr
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        sh.put(src + offs, dst + offs, me, nxt, dst_bases, mask=m, hint=HINT)
        sh.signal_add(sig, 1, me, nxt, sig_bases)
        sh.atomic_add(ctr, 1, me, 0, ctr_bases, sem="relaxed")

    @triton.jit
    def wait_kernel(sig, expect, ok, timeout_ns):
        done = sh.signal_wait_until(sig, sh.GE, expect, timeout_ns)
        tl.store(ok, done.to(tl.int32))

    @triton.jit
    def get_kernel(sym, out, bases, me, pe, n, BLOCK: tl.constexpr, HINT: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        sh.get(sym + offs, out + offs, me, pe, bases, mask=m, hint=HINT)

    @triton.jit
    def mixed_kernel(a, a_bases, b, b_bases, me, nxt, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = sh.load(a + offs, me, nxt, a_bases, mask=m)  # PE nxt's a (Iris order: to_rank = me)
        sh.store(b + offs, v * 2.0 + me, me, nxt, b_bases, mask=m)  # into PE nxt's b

    _triton_cache.update(ring=ring_kernel, wait=wait_kernel, get=get_kernel, mixed=mixed_kernel)
    return _triton_cache


CUDA_SOURCE = r"""
#include <symheap.cuh>

// Block b of the grid handles elements [lo, hi) of n.
__device__ void block_range(long long n, long long* lo, long long* hi) {
  long long per = (n + gridDim.x - 1) / gridDim.x;
  *lo = per * blockIdx.x;
  *hi = *lo + per < n ? *lo + per : n;
  if (*lo > *hi) *lo = *hi;
}

extern "C" __global__ void ring(const float* src, float* dst, const int64_t* dst_bases,
                                uint64_t* sig, const int64_t* sig_bases, int64_t* ctr,
                                const int64_t* ctr_bases, int me, int nxt, long long n) {
  long long lo, hi;
  block_range(n, &lo, &hi);
  symheap::put_block(dst + lo, src + lo, (size_t)(hi - lo), me, nxt, dst_bases);
  if (threadIdx.x == 0) {
    symheap::signal_add(sig, 1, me, nxt, sig_bases);
    symheap::atomic_add(ctr, 1, me, 0, ctr_bases);
  }
}

extern "C" __global__ void wait_sig(const uint64_t* sig, uint64_t expect, int* ok,
                                    uint64_t timeout_ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    *ok = symheap::signal_wait_until(sig, SYMHEAP_CMP_GE, expect, timeout_ns) ? 1 : 0;
}

extern "C" __global__ void get_back(const float* sym, float* out, const int64_t* bases, int me,
                                    int pe, long long n) {
  long long lo, hi;
  block_range(n, &lo, &hi);
  symheap::get_block(out + lo, sym + lo, (size_t)(hi - lo), me, pe, bases);
}

extern "C" __global__ void mixed(const float* a, const int64_t* a_bases, float* b,
                                 const int64_t* b_bases, int me, int nxt, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float v = symheap::load(a + i, me, nxt, a_bases);
    symheap::store(b + i, v * 2.0f + (float)me, me, nxt, b_bases);
  }
}
"""

_cuda_cache: Dict[str, Any] = {}


def cuda_kernels() -> Dict[str, Any]:
    if _cuda_cache:
        return _cuda_cache
    import cupy

    mod = cupy.RawModule(code=CUDA_SOURCE, options=("--std=c++17", "--include-path=" + symheap.get_include()))
    for k in ("ring", "wait_sig", "get_back", "mixed"):
        _cuda_cache[k] = mod.get_function(k)
    return _cuda_cache


def cuda_launch(kernel: Any, grid: int, block: int, *args: Any) -> None:
    """Launches a CuPy kernel on torch's current stream; tensors pass as pointers."""
    import cupy
    import torch

    conv = []
    for a in args:
        if isinstance(a, torch.Tensor):
            conv.append(np.uint64(a.data_ptr()))
        else:
            conv.append(a)
    dev = torch.cuda.current_device()
    with cupy.cuda.Device(dev), cupy.cuda.ExternalStream(torch.cuda.current_stream(dev).cuda_stream, dev):
        kernel((grid,), (block,), tuple(conv))


def _ring(name: str, impl: str) -> None:
    """put of a random block into the next PE's tensor + signal, an atomic counter on PE 0,
    then a get of the next PE's copy back (which is this PE's data)."""
    import torch

    p = make(name)
    me, n = p.my_pe(), p.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    dev = p.device()
    rng = rng_for(f"{impl}:{name}")
    data = torch.from_numpy(rng.integers(-(2**20), 2**20, size=(n, N)).astype(np.float32))
    nblocks = math.ceil(N / BLOCK)
    dst, dst_b = p.allocate_symmetric(N, dtype=torch.float32)
    sig, sig_b = p.allocate_symmetric(1, dtype=torch.int64)
    ctr, ctr_b = p.allocate_symmetric(1, dtype=torch.int64)
    src = data[me].to(dev)  # ordinary (not symmetric) memory
    for hint in (None, 16):
        dst.fill_(POISON)
        sig.zero_()
        ctr.zero_()
        ok = torch.full((1,), -1, dtype=torch.int32, device=dev)
        out = torch.full((N,), POISON, dtype=torch.float32, device=dev)
        p.barrier()  # everyone's poison and zeros before anyone writes
        if impl == "triton":
            k = triton_kernels()
            k["ring"][(nblocks,)](src, dst, dst_b, sig, sig_b, ctr, ctr_b, me, nxt, N, BLOCK=BLOCK, HINT=hint)
            k["wait"][(1,)](sig, nblocks, ok, WAIT_NS)
        else:
            k = cuda_kernels()
            cuda_launch(
                k["ring"],
                nblocks,
                128,
                src,
                dst,
                dst_b,
                sig,
                sig_b,
                ctr,
                ctr_b,
                np.int32(me),
                np.int32(nxt),
                np.int64(N),
            )
            cuda_launch(k["wait_sig"], 1, 32, sig, np.uint64(nblocks), ok, np.uint64(WAIT_NS))
        torch.cuda.synchronize(dev)
        assert int(ok.cpu()[0]) == 1, f"PE {me}: signal from PE {prv} did not arrive ({int(sig.cpu()[0])} of {nblocks})"
        p.barrier()  # every PE's puts and atomics are complete
        assert torch.equal(dst.cpu(), data[prv]), (me, hint, dst.cpu()[:8], data[prv][:8])
        assert int(sig.cpu()[0]) == nblocks
        assert int(ctr.cpu()[0]) == (n * nblocks if me == 0 else 0), (me, int(ctr.cpu()[0]))
        # get: PE nxt's dst holds this PE's data.
        if impl == "triton":
            triton_kernels()["get"][(nblocks,)](dst, out, dst_b, me, nxt, N, BLOCK=BLOCK, HINT=hint)
        else:
            cuda_launch(
                cuda_kernels()["get_back"], nblocks, 128, dst, out, dst_b, np.int32(me), np.int32(nxt), np.int64(N)
            )
        torch.cuda.synchronize(dev)
        assert torch.equal(out.cpu(), data[me]), (me, hint)
        p.barrier()  # nobody reads dst any more
    for t in (dst, sig, ctr):
        p.free(t)


@case
def case_triton(name: str) -> None:
    _ring(name, "triton")


@case
def case_cuda(name: str) -> None:
    _ring(name, "cuda")


@case
def case_cross(name: str) -> None:
    """A kernel writes allocation y of the next PE through allocation x's table (valid when the
    provider promises constant per-peer offsets)."""
    import torch

    p = make(name)
    offs = p.peer_offsets()
    assert offs is not None, f"{name} does not promise constant per-peer offsets"
    me, n = p.my_pe(), p.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    dev = p.device()
    data = torch.from_numpy(rng_for("cross:" + name).integers(-999, 999, size=(n, N)).astype(np.float32))
    x, px = p.allocate_symmetric(N, dtype=torch.float32)
    pad, _ = p.allocate_symmetric(77, dtype=torch.int8)  # so y does not simply follow x
    y, py = p.allocate_symmetric(N, dtype=torch.float32)
    assert [int(b) - y.data_ptr() for b in py.cpu()] == offs == [int(b) - x.data_ptr() for b in px.cpu()]
    x.fill_(POISON)
    y.fill_(POISON)
    out = torch.full((N,), POISON, dtype=torch.float32, device=dev)
    p.barrier()
    k = triton_kernels()
    nblocks = math.ceil(N / BLOCK)
    sig, sig_b = p.allocate_symmetric(1, dtype=torch.int64)
    ctr, _ = p.allocate_symmetric(1, dtype=torch.int64)
    sig.zero_()
    ctr.zero_()
    ok = torch.zeros(1, dtype=torch.int32, device=dev)
    p.barrier()
    # put into y, signal on sig and count on ctr: every pointer translated with x's table.
    k["ring"][(nblocks,)](data[me].to(dev), y, px, sig, px, ctr, px, me, nxt, N, BLOCK=BLOCK, HINT=16)
    k["wait"][(1,)](sig, nblocks, ok, WAIT_NS)
    torch.cuda.synchronize(dev)
    assert int(ok.cpu()[0]) == 1
    p.barrier()
    assert torch.equal(y.cpu(), data[prv]) and torch.equal(x.cpu(), torch.full((N,), POISON))
    assert int(ctr.cpu()[0]) == (n * nblocks if me == 0 else 0)
    # get of the next PE's y through x's table
    k["get"][(nblocks,)](y, out, px, me, nxt, N, BLOCK=BLOCK, HINT=None)
    torch.cuda.synchronize(dev)
    assert torch.equal(out.cpu(), data[me])
    p.barrier()
    for t in (x, pad, y, sig, ctr):
        p.free(t)


@case
def case_mixed(names: str) -> None:
    """One kernel reads provider A's tensor on the next PE and writes provider B's tensor there,
    with the two tables (Triton, then CUDA C++)."""
    import torch

    a_name, b_name = names.split("+")
    pa, pb = make(a_name), make(b_name)
    me, n = pa.my_pe(), pa.n_pes()
    assert (pb.my_pe(), pb.n_pes()) == (me, n)
    nxt, prv = (me + 1) % n, (me - 1) % n
    dev = pa.device()
    assert pb.device() == dev
    data = torch.from_numpy(rng_for("mixed:" + names).integers(-(2**16), 2**16, size=(n, N)).astype(np.float32))
    a, a_b = pa.allocate_symmetric(N, dtype=torch.float32)
    b, b_b = pb.allocate_symmetric(N, dtype=torch.float32)
    a.copy_(data[me].to(dev))
    impls = ["triton", "cuda"] if _have("cupy") else ["triton"]
    for impl in impls:
        b.fill_(POISON)
        pa.barrier()
        pb.barrier()
        if impl == "triton":
            triton_kernels()["mixed"][(math.ceil(N / BLOCK),)](a, a_b, b, b_b, me, nxt, N, BLOCK=BLOCK)
        else:
            cuda_launch(cuda_kernels()["mixed"], 8, 128, a, a_b, b, b_b, np.int32(me), np.int32(nxt), np.int64(N))
        torch.cuda.synchronize(dev)
        pa.barrier()
        pb.barrier()
        assert torch.equal(b.cpu(), data[me] * 2 + prv), (impl, me, b.cpu()[:4], (data[me] * 2 + prv)[:4])
    pa.barrier()
    pb.barrier()
    pa.free(a)
    pb.free(b)


# Set by case_left_open: the teardown then leaves the provider to symheap.finalize().
LEAVE_OPEN = False


@case
def case_left_open(name: str) -> None:
    """A provider the program never finalizes: symheap.finalize() (in the teardown) must finalize
    it first, collectively, and the process must exit cleanly."""
    global LEAVE_OPEN
    import torch

    p = make(name)
    me, n = p.my_pe(), p.n_pes()
    x, table = p.allocate_symmetric((N,), dtype=torch.float32)
    x.fill_(float(me))
    if on_gpu():
        torch.cuda.synchronize()
    p.barrier()
    nxt = (me + 1) % n
    got = read_at(int(table.cpu()[nxt]), N, np.float32)
    assert (got == float(nxt)).all(), got[:4]
    p.barrier()
    LEAVE_OPEN = True


def _rma_stream_ring(p: Any, blocks: Any, t: Dict[str, Any]) -> None:
    """symheap.put_signal / signal_wait_until / get / put + quiet on the NVSHMEM tensors, in
    stream order."""
    import torch

    me, n = p.my_pe(), p.n_pes()
    to, frm = (me + 1) % n, (me - 1) % n
    symheap.put_signal(t["dst"], t["src"], t["sig"], 7, to, op="set", sig_index=0)
    assert symheap.signal_wait_until(t["sig"], "eq", 7, index=0) is None  # enqueued
    symheap.sync_stream()
    assert torch.equal(t["dst"].cpu(), blocks[frm]), "put_signal ring: wrong data"
    assert symheap.signal_fetch(t["sig"], 0) == 7
    symheap.get(t["back"], t["src"], to)
    symheap.sync_stream()
    assert torch.equal(t["back"].cpu(), blocks[to]), "get from the next PE: wrong data"
    p.barrier()  # every PE read its dst before it is overwritten
    # back (= blocks[to]) into the previous PE's dst: this PE's dst gets blocks[me + 2].
    symheap.put(t["dst"], t["back"], frm)
    symheap.quiet()
    p.barrier()
    assert torch.equal(t["dst"].cpu(), blocks[(me + 2) % n]), "put + quiet + barrier: wrong data"


def _rma_atomics(p: Any) -> None:
    """Every PE updates its own word of every PE's counters: fetch_add, compare_swap, fetch."""
    import torch

    me, n = p.my_pe(), p.n_pes()
    cnt, _ = p.allocate_symmetric(n, dtype=torch.int64)
    cnt.zero_()
    p.barrier()
    for r in range(n):
        v = (me + 1) * (r + 1) * 1_000_003
        assert symheap.atomic_fetch_add(cnt, v, r, index=me) == 0
        assert symheap.atomic_compare_swap(cnt, v, -v, r, index=me) == v
        assert symheap.atomic_fetch(cnt, r, index=me) == -v
    symheap.quiet()
    p.barrier()
    want = torch.tensor([-(j + 1) * (me + 1) * 1_000_003 for j in range(n)], dtype=torch.int64)
    assert torch.equal(cnt.cpu(), want), f"atomics: {cnt.cpu().tolist()} != {want.tolist()}"
    p.free(cnt)


def _rma_host_calls(p: Any, blocks: Any, t: Dict[str, Any]) -> None:
    """The provider's host calls (nvshmem_putmem/getmem from the host, put + fence + atomic as a
    host put_signal, symheap's host wait)."""
    import torch

    me, n = p.my_pe(), p.n_pes()
    to, frm = (me + 1) % n, (me - 1) % n
    nb = t["src"].numel() * 8
    nv = p.native
    t["back"].fill_(-1)
    p.barrier()
    nv.put(t["back"].data_ptr(), t["src"].data_ptr(), nb, to)
    nv.quiet()
    p.barrier()
    assert torch.equal(t["back"].cpu(), blocks[frm]), "host put: wrong data"
    nv.get(t["back"].data_ptr(), t["src"].data_ptr(), nb, to)
    assert torch.equal(t["back"].cpu(), blocks[to]), "host get: wrong data"
    p.barrier()
    word = t["sig"].data_ptr() + 8
    nv.put_signal(t["dst"].data_ptr(), t["src"].data_ptr(), nb, word, 5, "add", to)
    assert nv.signal_wait_until(word, "ge", 5) == 5
    assert torch.equal(t["dst"].cpu(), blocks[frm]), "host put_signal: wrong data"
    nv.fence()
    stream = torch.cuda.current_stream().cuda_stream
    nv.signal_on_stream(word, 3, "add", to, stream)
    assert nv.signal_wait_until(word, "eq", 8, stream) is None  # enqueued
    nv.quiet_on_stream(stream)
    symheap.sync_stream()
    assert symheap.signal_fetch(t["sig"], 1) == 8


def _rma_errors(p: Any, t: Dict[str, Any]) -> None:
    import torch

    plain = torch.zeros_like(t["src"])
    e = raises(SymheapValueError, symheap.put, t["dst"], plain, 0)
    assert "NVSHMEM provider" in str(e), e
    f, _ = p.allocate_symmetric(4, dtype=torch.float32)
    e = raises(SymheapValueError, symheap.atomic_fetch_add, f, 1.0, 0)
    assert "int64" in str(e), e
    raises(SymheapValueError, symheap.atomic_fetch, t["sig"], 0, index=2)
    e = raises(SymheapValueError, p.native.put, t["dst"].data_ptr(), plain.data_ptr(), 8, 0)
    assert "not inside one live NVSHMEM allocation" in str(e), e
    raises(SymheapValueError, p.native.put, t["dst"].data_ptr(), t["src"].data_ptr(), 8, p.n_pes())
    p.free(f)


@case
def case_rma(name: str) -> None:
    """symheap's RMA, signal and atomic calls on NVSHMEM tensors, to every PE whether NVSHMEM
    reaches it by load/store or over its network transport: a put_signal ring with random data,
    a get back, put + quiet, atomics on every PE, the provider's host calls, and the errors."""
    import torch

    p = make(name)
    me, n = p.my_pe(), p.n_pes()
    blocks = torch.from_numpy(rng_for("rma").integers(-(2**40), 2**40, size=(n, N), dtype=np.int64))
    t: Dict[str, Any] = {}
    for k in ("src", "dst", "back"):
        t[k], _ = p.allocate_symmetric(N, dtype=torch.int64)
    t["sig"], _ = p.allocate_symmetric(2, dtype=torch.int64)
    direct = list(p.symmetric_address_map(t["dst"]).direct)
    print(f"rma: PE {me} direct {direct}", flush=True)
    if os.environ.get("NVSHMEM_DISABLE_P2P") == "1":
        # The simulated-node run must take NVSHMEM's network transport to every peer.
        assert not any(d for r, d in enumerate(direct) if r != me), f"direct peers with P2P off: {direct}"

    t["src"].copy_(blocks[me].to(p.device()))
    t["dst"].fill_(int(POISON))
    t["back"].fill_(-1)
    t["sig"].zero_()
    p.barrier()
    _rma_stream_ring(p, blocks, t)
    _rma_atomics(p)
    _rma_host_calls(p, blocks, t)
    _rma_errors(p, t)
    p.barrier()
    for v in t.values():
        p.free(v)


EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
RING_CU = os.path.join(EXAMPLES, "cuda", "nvshmem_ring.cu")


def _build_cubin(source: str, p: Any, link_nvshmem: bool) -> bytes:
    """``source`` built for this GPU by examples/python/nvshmem_ring.py's ``build_cubin``, the
    documented build: relocatable device code, then a device link into a cubin (with NVSHMEM's
    device library when ``link_nvshmem``). One copy of the nvcc lines: the example's."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(
        "nvshmem_ring_example", os.path.join(EXAMPLES, "python", "nvshmem_ring.py")
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    major, minor = torch.cuda.get_device_capability()
    nvcc = example.find_nvcc() or "nvcc"
    return example.build_cubin(nvcc, source, p.device_library(), f"sm_{major}{minor}", link_nvshmem)


def _ring_round(p: Any, fn: Any, t: Dict[str, Any], blocks: Any, rnd: int, force: bool) -> List[int]:
    """One launch of nvshmem_ring on every PE; checks the data from the previous PE exactly and
    returns the kernel's status words."""
    import torch

    me, n = p.my_pe(), p.n_pes()
    t["dst"].fill_(int(POISON))
    status = torch.zeros(3, dtype=torch.int32, device=p.device())
    torch.cuda.synchronize()
    p.barrier()  # every PE reset its dst before any PE writes it
    cuda_launch(
        fn,
        1,
        BLOCK,
        t["dst"],
        t["src"],
        np.uint64(N),
        t["sig"],
        t["table"],
        np.uint64(rnd),
        np.int32(force),
        np.uint64(WAIT_NS),
        status,
    )
    torch.cuda.synchronize()
    st = [int(v) for v in status.cpu()]
    assert st[0] == me and st[1] == 1, f"round {rnd}: status {st} (PE {me}: nvshmem_my_pe, signal)"
    assert torch.equal(t["dst"].cpu(), blocks[(me - 1) % n]), f"round {rnd} (force {force}): wrong data"
    p.barrier()
    return st


@case
def case_device_lib(name: str) -> None:
    """examples/cuda/nvshmem_ring.cu, device-linked with NVSHMEM's device library and set up with
    init_module: a put-with-signal ring of random int64 through NVSHMEM's device API for every
    peer (forced), then through the peer table (symheap's stores where an entry is non-zero,
    NVSHMEM's device API where it is 0), exact data both times."""
    import cupy
    import torch

    p = make(name)
    me, n = p.my_pe(), p.n_pes()
    blocks = torch.from_numpy(rng_for("device_lib").integers(-(2**50), 2**50, size=(n, N), dtype=np.int64))
    t: Dict[str, Any] = {}
    t["dst"], t["table"] = p.allocate_symmetric(N, dtype=torch.int64)
    t["src"], _ = p.allocate_symmetric(N, dtype=torch.int64)
    t["sig"], _ = p.allocate_symmetric(1, dtype=torch.int64)
    t["src"].copy_(blocks[me].to(p.device()))
    t["sig"].zero_()
    cubin = _build_cubin(RING_CU, p, link_nvshmem=True)
    with cupy.cuda.Device(p.device().index):
        mod = cupy.cuda.function.Module()
        mod.load(cubin)
        p.init_module(mod.ptr)
        fn = mod.get_function("nvshmem_ring")
        forced = _ring_round(p, fn, t, blocks, 1, True)
        assert forced[2] == 1, f"forced round took symheap's stores: {forced}"
        table = _ring_round(p, fn, t, blocks, 2, False)
        direct = p.symmetric_address_map(t["dst"]).direct
        assert table[2] == (0 if direct[(me + 1) % n] else 1), f"table round: {table}, direct {direct}"
        print(f"device_lib: PE {me} forced {forced} table {table} direct {list(direct)}", flush=True)
        p.finalize_module(mod.ptr)
    for v in ("dst", "src", "sig"):
        p.free(t[v])


@case
def case_device_lib_errors(name: str) -> None:
    """init_module's errors: a handle of 0, a module not linked with NVSHMEM's device library,
    and any call after finalize."""
    import tempfile

    import cupy

    p = make(name)
    raises(SymheapValueError, p.init_module, 0)
    with tempfile.TemporaryDirectory() as d:
        plain = os.path.join(d, "plain.cu")
        with open(plain, "w") as f:
            f.write('extern "C" __global__ void k(int* x) { *x = 1; }\n')
        cubin = _build_cubin(plain, p, link_nvshmem=False)
    with cupy.cuda.Device(p.device().index):
        mod = cupy.cuda.function.Module()
        mod.load(cubin)
        e = raises(SymheapValueError, p.init_module, mod.ptr)
        assert "libnvshmem_device" in str(e), e
    p.barrier()
    p.finalize()
    raises(SymheapError, p.init_module, 1)


def _have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


# ---- driver ------------------------------------------------------------------------------------


def _setup(needs: List[str]) -> None:
    if on_gpu():
        import torch

        # Several PEs may share a GPU (the 1-GPU machine, simulated nodes).
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local % max(torch.cuda.device_count(), 1))
        if "torch_symm_mem" in needs:
            import torch.distributed as dist

            dist.init_process_group("nccl")
        symheap.init(backend="cuda")  # over torch's store when torch.distributed is initialised
    else:
        symheap.init()


def _teardown() -> None:
    nv = symheap._nvshmem_ops.live  # the NVSHMEM provider of this process, if one is open
    if nv is not None and not LEAVE_OPEN:
        nv.finalize()
    symheap.finalize()
    if LEAVE_OPEN and nv is not None:
        assert nv._finalized, "symheap.finalize() left NVSHMEM open"
        assert symheap._nvshmem_ops.live is None, "a finalized NVSHMEM provider is still the live one"
        print("PASS left open: finalized by symheap.finalize()", flush=True)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def parse(arg: str) -> Tuple[str, str]:
    name, _, prov = arg.partition(":")
    return name, prov


def main(argv: List[str]) -> int:
    args = argv[1:]
    bad = [a for a in args if parse(a)[0] not in CASES]
    if bad:
        print(f"unknown cases: {bad}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    needs: List[str] = []
    for a in args:
        needs += parse(a)[1].split("+")
    _setup(needs)
    for a in args:
        name, prov = parse(a)
        CASES[name](prov)
        print(f"PASS {a}", flush=True)
    _teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
