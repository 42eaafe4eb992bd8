"""The host program of examples/cuda/nvshmem_ring.cu: a kernel that calls NVSHMEM's device
library on tensors of symheap's NVSHMEM provider, built the way that library needs and loaded
through the CUDA driver API (cuda.bindings; no CuPy):

1. ``nvcc -rdc=true`` compiles the kernel against NVSHMEM's headers and symheap.cuh, then
   ``nvcc -dlink -cubin`` links it with ``libnvshmem_device.a`` into one cubin
   (``NvshmemProvider.device_library()`` says where both are);
2. ``cuModuleLoadData`` loads the cubin in the device's primary context and
   ``NvshmemProvider.init_module(module)`` sets up NVSHMEM's device state in it: until then the
   kernel's NVSHMEM calls read uninitialised state;
3. every PE puts a block of random int64 into the next PE's copy and signals it, three rounds;
   the kernel waits for its own signal with symheap's bounded wait, the host checks every value.

Where the peer table has an address for the next PE the kernel stores through it; where it has
0 (another node) it calls ``nvshmemx_putmem_signal_block``. ``--force-nvshmem`` takes NVSHMEM's
path to every peer, so NVSHMEM's device code runs on one node too.

Needs a CUDA GPU, NVSHMEM (``pip install nvidia-nvshmem-cu13``), nvcc from the CUDA toolkit
(``$NVCC``, the PATH, ``$CUDA_HOME/bin`` or ``/usr/local/cuda/bin``) and cuda-bindings
(``pip install cuda-bindings``):

    symheap launch -n 2 -- python examples/python/nvshmem_ring.py [--force-nvshmem]

Exit status 0 when every check holds, 1 otherwise, 77 (skipped) when one of those is missing.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import symheap

try:
    import symheap.torch as st
    import torch
except ImportError as e:  # exit 77 ("skipped") without PyTorch, as without the other requirements
    print(f"nvshmem_ring: skipped, {e}")
    sys.exit(77)

KERNEL = Path(__file__).resolve().parents[1] / "cuda" / "nvshmem_ring.cu"
SKIP = 77
ROUNDS = 3
BLOCK = 256
# Below every value the rounds send (they are drawn from [-2^62, 2^62)): a slot the put missed
# keeps it.
POISON = -(2**63)


def find_nvcc() -> Optional[str]:
    """nvcc: ``$NVCC``, else the PATH, else ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``,
    ``/usr/local/cuda/bin`` (where the toolkit installs it without putting it on the PATH)."""
    found = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found.append(os.path.join(home, "bin", "nvcc"))
    return next((f for f in found if f and os.access(f, os.X_OK)), None)


def run_nvcc(nvcc: str, args: List[str]) -> None:
    r = subprocess.run([nvcc, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{nvcc} {' '.join(args)} failed with status {r.returncode}:\n{r.stdout}{r.stderr}")


def build_cubin(nvcc: str, source: str, lib: Dict[str, str], arch: str, link_nvshmem: bool = True) -> bytes:
    """``source`` built for ``arch`` (``sm_90``...) the way NVSHMEM's device library needs:
    relocatable device code against its headers (``lib`` is ``device_library()``) and
    symheap.cuh, then a device link with ``libnvshmem_device.a`` into one cubin. Without
    ``link_nvshmem`` the library stays out: a module with no NVSHMEM device state."""
    with tempfile.TemporaryDirectory() as d:
        obj, cubin = os.path.join(d, "k.o"), os.path.join(d, "k.cubin")
        inc = ["-I" + lib["include"], "-I" + symheap.get_include()]
        run_nvcc(nvcc, [f"-arch={arch}", "-rdc=true", *inc, "-c", source, "-o", obj])
        run_nvcc(
            nvcc, [f"-arch={arch}", "-dlink", "-cubin", obj, *([lib["static"]] if link_nvshmem else []), "-o", cubin]
        )
        return Path(cubin).read_bytes()


def drv(cu: Any, call: str, ret: Any) -> Any:
    """The outputs of a cuda.bindings driver call (which returns ``(CUresult, outputs...)``),
    or a RuntimeError naming the call when the result is not CUDA_SUCCESS."""
    err, *out = ret
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {err!r}")
    return out[0] if len(out) == 1 else out


class Module:
    """A cubin loaded by the driver API in the primary context of device ``ordinal``: the
    context torch, CuPy and symheap use, and the one ``init_module`` requires."""

    def __init__(self, cu: Any, ordinal: int, image: bytes, kernel: bytes) -> None:
        self.cu = cu
        drv(cu, "cuInit", cu.cuInit(0))
        self.dev = drv(cu, "cuDeviceGet", cu.cuDeviceGet(ordinal))
        ctx = drv(cu, "cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(self.dev))
        drv(cu, "cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
        self.mod = drv(cu, "cuModuleLoadData", cu.cuModuleLoadData(image))
        self.fn = drv(cu, "cuModuleGetFunction", cu.cuModuleGetFunction(self.mod, kernel))

    @property
    def handle(self) -> int:
        """The CUmodule as the integer ``init_module`` takes."""
        return int(self.mod)

    def launch(self, stream: int, args: List[Any]) -> None:
        """One block of BLOCK threads on ``stream``; ``args`` are ctypes values in the kernel's
        parameter order (kernelParams is an array of pointers to each one's bytes)."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        cu = self.cu
        drv(
            cu,
            "cuLaunchKernel",
            cu.cuLaunchKernel(self.fn, 1, 1, 1, BLOCK, 1, 1, 0, stream, ctypes.addressof(params), 0),
        )

    def unload(self) -> None:
        drv(self.cu, "cuModuleUnload", self.cu.cuModuleUnload(self.mod))
        drv(self.cu, "cuDevicePrimaryCtxRelease", self.cu.cuDevicePrimaryCtxRelease(self.dev))


def values(seed: int, rnd: int, pe: int, n: int) -> np.ndarray:
    """What PE ``pe`` sends in round ``rnd``: the same on every PE, from the broadcast seed."""
    return np.random.default_rng([seed, rnd, pe]).integers(-(2**62), 2**62, size=n, dtype=np.int64)


def run_rounds(p: Any, module: Module, n: int, seed: int, force: bool, timeout_ns: int) -> List[str]:
    """ROUNDS launches of nvshmem_ring on every PE; the failures this PE saw."""
    me, npes = p.my_pe(), p.n_pes()
    prv, nxt = (me - 1) % npes, (me + 1) % npes
    dev = p.device()
    dst, table = p.allocate_symmetric(n, dtype=torch.int64)
    src, _ = p.allocate_symmetric(n, dtype=torch.int64)
    # The kernel's signal is a uint64_t; an int64 tensor has the same bytes.
    sig, _ = p.allocate_symmetric(1, dtype=torch.int64)
    status = torch.zeros(3, dtype=torch.int32, device=dev)
    sig.zero_()
    direct = p.symmetric_address_map(dst).direct[nxt]
    want_path = 1 if force or not direct else 0
    stream = torch.cuda.current_stream(dev)
    failures = []
    for rnd in range(1, ROUNDS + 1):
        src.copy_(torch.from_numpy(values(seed, rnd, me, n)))
        dst.fill_(POISON)
        status.zero_()
        p.barrier()  # every PE poisoned its dst (and zeroed sig) before any kernel writes it
        ptr = [ctypes.c_void_p(t.data_ptr()) for t in (dst, src, sig, table, status)]
        u64 = ctypes.c_uint64
        # dst, src, n, sig, bases, round, force_nvshmem, timeout_ns, status: the kernel's order.
        args = [ptr[0], ptr[1], u64(n), ptr[2], ptr[3], u64(rnd), ctypes.c_int(force), u64(timeout_ns), ptr[4]]
        module.launch(stream.cuda_stream, args)
        stream.synchronize()
        pe_seen, signalled, path = status.tolist()
        if pe_seen != me:
            failures.append(f"round {rnd}: nvshmem_my_pe() in the kernel is {pe_seen} (was init_module called?)")
        if not signalled:
            failures.append(f"round {rnd}: PE {prv}'s signal did not come within {timeout_ns / 1e9:.0f} s")
        if path != want_path:
            failures.append(f"round {rnd}: the kernel took path {path}, expected {want_path}")
        wrong = int(np.count_nonzero(dst.cpu().numpy() != values(seed, rnd, prv, n)))
        if wrong:
            failures.append(f"round {rnd}: {wrong} of {n} values differ from what PE {prv} sent")
    p.barrier()  # no PE frees while a peer's kernel may still reach its memory
    for t in (dst, src, sig):
        p.free(t)
    return failures


def prerequisites() -> Optional[str]:
    """Why this example cannot run here (before symheap starts), or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (NVSHMEM's device library runs in a kernel)"
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return "needs cuda-bindings to load the cubin (pip install cuda-bindings)"
    if find_nvcc() is None:
        return "needs nvcc (the CUDA toolkit) to build the kernel: set NVCC or put nvcc on the PATH"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description="A ring of puts through NVSHMEM's device library.")
    ap.add_argument("--force-nvshmem", action="store_true", help="NVSHMEM's device API to every peer, also direct ones")
    ap.add_argument("--elements", type=int, default=100_003, help="int64 values each PE sends a round")
    args = ap.parse_args()
    why = prerequisites()
    if why:
        print(f"nvshmem_ring: skipped, {why}")
        return SKIP
    from cuda.bindings import driver as cu

    with symheap.init():
        if symheap.backend() != "cuda":
            print(f"nvshmem_ring: skipped, symheap runs on the {symheap.backend()} backend (SYMHEAP_BACKEND?)")
            return SKIP
        try:
            p = symheap.providers.nvshmem()
            lib = p.device_library()
        except symheap.SymheapUnsupportedError as e:
            print(f"nvshmem_ring: skipped, {e}")
            return SKIP
        me, npes = p.my_pe(), p.n_pes()
        torch.cuda.set_device(p.device())
        major, minor = torch.cuda.get_device_capability(p.device())
        image = build_cubin(find_nvcc() or "nvcc", str(KERNEL), lib, f"sm_{major}{minor}")
        module = Module(cu, p.device().index, image, b"nvshmem_ring")
        p.init_module(module.handle)
        seed = st.zeros(1, dtype=torch.int64)
        if me == 0:
            seed.fill_(secrets.randbits(63))
        symheap.broadcast(seed, root=0)
        timeout_ns = int(float(os.environ.get("SYMHEAP_TIMEOUT", "120")) * 1e9)
        failures = run_rounds(p, module, args.elements, int(seed.item()), args.force_nvshmem, timeout_ns)
        p.finalize_module(module.handle)
        module.unload()

        for f in failures:
            print(f"PE {me}: {f}")
        bad = st.full(1, len(failures), dtype=torch.int32)
        symheap.all_reduce(bad)
        ok = int(bad.item()) == 0
        if me == 0:
            verdict = "OK" if ok else f"FAILED ({int(bad.item())} checks)"
            how = "NVSHMEM's device API to every peer (forced)" if args.force_nvshmem else "the peer table"
            print(
                f"nvshmem_ring {verdict}: {npes} PEs on {p.device()}, "
                f"{ROUNDS} rounds of {args.elements} int64 through {how}"
            )
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
