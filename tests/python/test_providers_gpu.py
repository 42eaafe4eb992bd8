"""The providers on GPUs (CUDA backend, one PE per GPU, up to 2): the same Triton kernel
(symheap.triton) and the same CUDA C++ kernel (symheap.cuh through CuPy/NVRTC) drive the tensors
of symheap's heap, NVSHMEM and torch SymmetricMemory; one kernel mixes two providers' tensors
with two tables; cross-allocation translation where a provider promises constant per-peer
offsets; the contract's invariants; a kernel using NVSHMEM's device library (built with nvcc,
set up with ``init_module``; examples/python/nvshmem_ring.py). Cases: provider_cases.py.

Every requirement is a fixture or check that skips with the reason: a CUDA GPU and torch,
Triton, CuPy, NVSHMEM (the ``nvidia-nvshmem-cu13`` package, ``$SYMHEAP_NVSHMEM_LIB`` or the
loader's path), nvcc and cuda-bindings (the device-library kernels) and torch SymmetricMemory
(torch.distributed with NCCL).
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from typing import List

import pytest

from conftest import PROVIDER_CASES, ROOT, launch, run_cases

# Never NVLink multicast on shared machines (gpu_suite.sh exports these too).
GPU_ENV = {
    "SYMHEAP_BACKEND": "cuda",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "SYMHEAP_TIMEOUT": "60",
}
LIMIT = 300  # seconds per launch: torch + NCCL + NVSHMEM init and Triton/NVRTC compiles


@pytest.fixture
def pes(cuda_gpus: int) -> int:
    """PEs to run: one per GPU, up to 2."""
    return min(cuda_gpus, 2)


@pytest.fixture
def triton_module():
    try:
        import triton
    except ImportError:
        pytest.skip("triton is not installed (pip install triton)")
    return triton


@pytest.fixture
def cupy_module():
    try:
        import cupy
    except ImportError:
        pytest.skip("cupy is not installed (the CUDA C++ kernels are compiled with cupy.RawModule)")
    return cupy


def _nvshmem_lib() -> str:
    env = os.environ.get("SYMHEAP_NVSHMEM_LIB")
    if env:
        return env if os.path.exists(env) else ""
    for d in sys.path:
        for path in glob.glob(os.path.join(d or ".", "nvidia", "*", "lib", "libnvshmem_host.so.3")):
            return path
    return ctypes.util.find_library("nvshmem_host") or ""


def _available(name: str, torch) -> None:
    """Skips when provider ``name`` cannot run here."""
    if name == "nvshmem":
        from symheap import _native

        if not hasattr(_native, "NvshmemProvider"):
            pytest.skip("this build of symheap has no NVSHMEM provider")
        if not _nvshmem_lib():
            pytest.skip("NVSHMEM is not installed (pip install nvidia-nvshmem-cu13, or set SYMHEAP_NVSHMEM_LIB)")
    elif name == "torch_symm_mem":
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_nccl_available():
            pytest.skip("torch.distributed with NCCL is not available")
        try:
            import torch.distributed._symmetric_memory  # noqa: F401
        except ImportError as e:
            pytest.skip(f"torch SymmetricMemory is not available: {e}")


PROVIDERS = ["native", "nvshmem", "torch_symm_mem"]


@pytest.mark.parametrize("name", PROVIDERS)
def test_provider_contract_gpu(torch_module, cupy_module, pes: int, name: str) -> None:
    """Invariants: peer_bases[me] == data_ptr, every peer's copy read and written at its table
    address, maps, views, per-peer offsets identical across allocations where promised, free."""
    _available(name, torch_module)
    run_cases(pes, f"contract:{name}", env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


@pytest.mark.parametrize("name", PROVIDERS)
def test_triton_kernel_over_provider(torch_module, triton_module, pes: int, name: str) -> None:
    """The same symheap.triton kernel (put + signal_add + atomic_add counter, get back; with and
    without hint) over this provider's tensors; plus cross-allocation translation when the
    provider promises constant per-peer offsets."""
    _available(name, torch_module)
    cases = [f"triton:{name}"] + ([f"cross:{name}"] if name != "torch_symm_mem" else [])
    run_cases(pes, *cases, env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


@pytest.mark.parametrize("name", PROVIDERS)
def test_cuda_kernel_over_provider(torch_module, cupy_module, pes: int, name: str) -> None:
    """The same CUDA C++ kernel (symheap.cuh: put_block + signal_add + atomic_add, get_block)
    over this provider's tensors."""
    _available(name, torch_module)
    run_cases(pes, f"cuda:{name}", env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


def test_kernel_mixing_providers(torch_module, triton_module, cupy_module, pes: int) -> None:
    """One kernel (Triton, then CUDA C++) reads one provider's tensor on the next PE and writes
    another provider's tensor there, with two tables: every pair of available providers."""
    avail: List[str] = []
    for name in PROVIDERS:
        try:
            _available(name, torch_module)
        except pytest.skip.Exception:
            continue
        avail.append(name)
    pairs = [f"mixed:{a}+{b}" for i, a in enumerate(avail) for b in avail[i + 1 :]]
    pairs += [f"mixed:{b}+{a}" for i, a in enumerate(avail) for b in avail[i + 1 :]]
    if not pairs:
        pytest.skip(f"fewer than two providers available here ({avail})")
    run_cases(pes, *pairs, env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


def test_nvshmem_left_open_is_finalized_by_symheap(torch_module, cupy_module, pes: int) -> None:
    """A program that never finalizes its NVSHMEM provider: symheap.finalize() finalizes it first
    (collectively, before the context goes) and the processes exit cleanly."""
    _available("nvshmem", torch_module)
    run_cases(pes, "left_open:nvshmem", env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


def _ucx_lib_dir() -> str:
    """UCX's libraries for NVSHMEM's UCX transport: ``$SYMHEAP_UCX_LIB_DIR``, else the
    ``libucx-cu13`` package (``libucx/lib``) on ``sys.path``; "" when neither is here."""
    env = os.environ.get("SYMHEAP_UCX_LIB_DIR", "")
    if env:
        return env if os.path.exists(os.path.join(env, "libucp.so.0")) else ""
    for d in sys.path:
        lib = os.path.join(d or ".", "libucx", "lib")
        if os.path.exists(os.path.join(lib, "libucp.so.0")):
            return lib
    return ""


def test_nvshmem_rma_gpu(torch_module, cupy_module, cuda_gpus: int) -> None:
    """symheap.put/get/put_signal/signal_wait_until/atomics/quiet on NVSHMEM tensors at 2 PEs
    (sharing the GPU when there is one: NVSHMEM's limited MPG mode, every peer direct), the
    provider's host calls, and their errors."""
    _available("nvshmem", torch_module)
    run_cases(2, "rma:nvshmem", env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


def _nvshmem_device_toolchain() -> None:
    """Skips without nvcc or NVSHMEM's device library (both needed to build a kernel with it)."""
    import shutil

    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")):
        pytest.skip("nvcc is not installed (the CUDA toolkit builds kernels with NVSHMEM's device library)")
    host = _nvshmem_lib()
    lib = os.path.dirname(os.path.realpath(host)) if "/" in host else ""
    if not lib or not os.path.exists(os.path.join(lib, "libnvshmem_device.a")):
        pytest.skip("NVSHMEM's device library (libnvshmem_device.a) is not beside its host library")


def test_nvshmem_device_library_kernel(torch_module, cupy_module, cuda_gpus: int) -> None:
    """examples/cuda/nvshmem_ring.cu built with nvcc against NVSHMEM's device library, set up
    with NvshmemProvider.init_module, at 2 PEs: the ring through NVSHMEM's device API for every
    peer, then through the peer table, exact data."""
    _available("nvshmem", torch_module)
    _nvshmem_device_toolchain()
    run_cases(2, "device_lib:nvshmem", env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


def test_nvshmem_init_module_errors(torch_module, cupy_module, cuda_gpus: int) -> None:
    """init_module refuses a handle of 0 and a module without NVSHMEM's device library, and any
    call after finalize."""
    _available("nvshmem", torch_module)
    _nvshmem_device_toolchain()
    run_cases(2, "device_lib_errors:nvshmem", env=GPU_ENV, script=PROVIDER_CASES, timeout=LIMIT)


@pytest.mark.parametrize("force", [True, False], ids=["forced-nvshmem", "table"])
def test_nvshmem_ring_example(torch_module, cuda_gpus: int, force: bool) -> None:
    """examples/python/nvshmem_ring.py as its docstring launches it, at 2 PEs: the kernel built
    with nvcc against NVSHMEM's device library and loaded through cuda.bindings (no CuPy), every
    value of 3 rounds checked; ``--force-nvshmem`` takes NVSHMEM's device API to every peer, so
    it runs NVSHMEM's device code on one node, where every peer is direct."""
    _available("nvshmem", torch_module)
    _nvshmem_device_toolchain()
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        pytest.skip("cuda-bindings is not installed (pip install cuda-bindings): the example loads its cubin with it")
    argv = [sys.executable, str(ROOT / "examples" / "python" / "nvshmem_ring.py")]
    p = launch(2, argv + (["--force-nvshmem"] if force else []), env=GPU_ENV, timeout=LIMIT)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"exit status {p.returncode}\n{out}"
    how = "NVSHMEM's device API to every peer (forced)" if force else "the peer table"
    assert "[PE 0] nvshmem_ring OK: 2 PEs on cuda:" in p.stdout, out
    assert f"3 rounds of 100003 int64 through {how}" in p.stdout, out


def test_nvshmem_rma_across_simulated_nodes(torch_module, cupy_module, cuda_gpus: int) -> None:
    """The same program with the 2 PEs on 2 simulated nodes: NVSHMEM's P2P off, so every peer is
    not direct (the case asserts it) and each call crosses NVSHMEM's UCX transport over TCP on
    loopback, the path a real second node takes."""
    _available("nvshmem", torch_module)
    if not os.path.exists("/dev/gdrdrv"):
        # Measured on the H200 machine (NVSHMEM 3.4.5, libucx-cu13 1.22, UCX over TCP on lo):
        # "nvshmemt_ucx_local_amo: AMO 8 not supported with the current configuration (GDRCopy
        # Disabled)", then NVSHMEM ends both processes at its first barrier.
        pytest.skip("NVSHMEM's UCX transport needs GDRCopy (/dev/gdrdrv) for its proxy's atomics")
    ucx = _ucx_lib_dir()
    if not ucx:
        pytest.skip("UCX is not installed (pip install libucx-cu13, or set SYMHEAP_UCX_LIB_DIR)")
    env = dict(GPU_ENV)
    env.update(
        SYMHEAP_SIMULATE_NODES="2",
        NVSHMEM_DISABLE_P2P="1",
        NVSHMEM_REMOTE_TRANSPORT="ucx",
        UCX_TLS=os.environ.get("SYMHEAP_TEST_UCX_TLS", "tcp,cuda_copy,self"),
        UCX_NET_DEVICES="lo",
        LD_LIBRARY_PATH=ucx + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else ""),
    )
    run_cases(2, "rma:nvshmem", env=env, script=PROVIDER_CASES, timeout=LIMIT)
