"""The host program of the CUDA C++ example kernels (examples/cuda/*.cu, written against
symheap.cuh): compiles them with NVRTC through CuPy, launches them over symmetric torch tensors
on torch's current stream, and checks every value.

- ``ring_put.cu``: each PE's one-block kernel puts a tile into the next PE's copy, signals it,
  waits for the previous PE's tile and counts the wrong elements itself; here that count must be
  0 in every round, and the host recomputes the tile from the kernel's formula as a second check.
- ``provider_mix.cu``: every PE writes its slot of two symmetric buffers (each with its own peer
  table) into every PE's copy; the host checks all slots of its own copies.

GPU only (the CUDA backend; several PEs may share one GPU), and CuPy (``pip install cupy-cuda13x``):

    symheap launch -n 2 -- python examples/python/cuda_kernel.py

Exit status 0 when every check holds, 1 otherwise, 77 (skipped) without a GPU, PyTorch or CuPy.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import numpy as np
import symheap

try:
    import symheap.torch as st
    import torch
except ImportError as e:  # exit 77 ("skipped") without PyTorch, as without the other requirements
    print(f"cuda_kernel: skipped, {e}")
    sys.exit(77)

KERNELS = Path(__file__).resolve().parents[1] / "cuda"
SKIP = 77
ROUNDS = 3
POISON = -0x21524111  # 0xdeadbeef as an int32: no kernel writes it


def compile_kernels(cupy):
    opts = ("--std=c++17", "--include-path=" + symheap.get_include())
    ring = cupy.RawModule(code=(KERNELS / "ring_put.cu").read_text(), options=opts)
    mix = cupy.RawModule(code=(KERNELS / "provider_mix.cu").read_text(), options=opts)
    return ring.get_function("ring_put"), mix.get_function("provider_mix")


def launch(cupy, kernel, grid: int, block: int, *args) -> None:
    """Runs a CuPy kernel on torch's current stream, so it is ordered with symheap's stream
    operations (barrier_all) and torch's own work on the same tensors."""
    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream(dev)
    if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy 14; ExternalStream is deprecated there
        cs = cupy.cuda.Stream.from_external(stream)
    else:
        cs = cupy.cuda.ExternalStream(stream.cuda_stream, dev)
    conv = [np.uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]
    with cupy.cuda.Device(dev), cs:
        kernel((grid,), (block,), tuple(conv))


def ring_pattern(pe: int, n: int, rnd: int) -> np.ndarray:
    """ring_put.cu's ring_pattern: the value PE ``pe`` sends at index i in round ``rnd``."""
    i = np.arange(n, dtype=np.uint64)
    v = np.uint64(pe * 7919) + i * np.uint64(31) + np.uint64(rnd * 1000003)
    return (v & np.uint64(0xFFFFFF)).astype(np.float32)


def mix_value(seed: int, tag: int, frm: int, to: int, words: int) -> np.ndarray:
    """provider_mix.cu's mix_value for words 0..words-1, in wrapping uint64 arithmetic."""
    u = np.uint64
    x = u(seed) ^ u(tag << 56) ^ u(frm << 40) ^ u(to << 24) ^ np.arange(words, dtype=u)
    x = (x ^ (x >> u(31))) * u(0x7FB5D329728EA185)
    x = (x ^ (x >> u(27))) * u(0x81DADEF4BC2DD44D)
    return (x ^ (x >> u(33))).astype(np.uint32)


def run_ring(cupy, kernel, me: int, npes: int, n: int, timeout_ns: int) -> list:
    dev = st.device()
    prv = (me - 1) % npes
    recv, recv_bases = st.allocate_symmetric(n, dtype=torch.float32)
    # The kernel's signal is a uint64_t; an int64 tensor has the same bytes.
    sig, sig_bases = st.allocate_symmetric(1, dtype=torch.int64)
    send = torch.empty(n, dtype=torch.float32, device=dev)  # local scratch the kernel fills
    mismatches = torch.empty(1, dtype=torch.int32, device=dev)
    sig.zero_()
    symheap.barrier_all()  # every PE's zeroed signal before any peer's signal_add
    failures = []
    for rnd in range(1, ROUNDS + 1):
        mismatches.fill_(POISON)
        launch(
            cupy,
            kernel,
            1,
            256,
            recv,
            send,
            np.uint64(n),
            sig,
            recv_bases,
            sig_bases,
            np.int32(me),
            np.int32(npes),
            np.uint64(rnd),
            np.uint64(timeout_ns),
            mismatches,
        )
        got = int(mismatches.item()) & 0xFFFFFFFF  # synchronises the stream
        if got == POISON & 0xFFFFFFFF:
            failures.append(f"ring_put round {rnd}: the kernel did not write its result")
        elif got == 0xFFFFFFFF:
            failures.append(f"ring_put round {rnd}: PE {prv}'s signal never came")
        elif got != 0:
            failures.append(f"ring_put round {rnd}: the kernel counted {got} wrong elements")
        elif not np.array_equal(recv.cpu().numpy(), ring_pattern(prv, n, rnd)):
            failures.append(f"ring_put round {rnd}: recv is not PE {prv}'s tile")
        # The next round's puts overwrite recv: every PE must have finished reading it.
        symheap.barrier_all()
    return failures


def run_mix(cupy, kernel, me: int, npes: int, words: int, seed: int) -> list:
    x, tx = st.allocate_symmetric(npes * words, dtype=torch.int32)
    y, ty = st.allocate_symmetric(npes * words, dtype=torch.int32)
    x.fill_(POISON)
    y.fill_(POISON)
    if not bool((tx != 0).all()) or not bool((ty != 0).all()):
        return ["provider_mix: some PE is not directly addressable (this example needs one node)"]
    symheap.barrier_all()  # peers write into x and y only after every PE poisoned them
    # This PE's slot in its own copy; the kernel translates it into every peer's copy.
    slot = 4 * me * words
    launch(
        cupy,
        kernel,
        4,
        256,
        tx,
        np.uint64(x.data_ptr() + slot),
        ty,
        np.uint64(y.data_ptr() + slot),
        np.int32(me),
        np.int32(npes),
        np.int32(words),
        np.uint64(seed),
    )
    symheap.barrier_all()  # every PE's kernel has written every slot
    failures = []
    for tag, buf in ((0, x), (1, y)):
        got = buf.cpu().numpy().view(np.uint32).reshape(npes, words)
        for j in range(npes):
            if not np.array_equal(got[j], mix_value(seed, tag, j, me, words)):
                failures.append(f"provider_mix: slot {j} of {'xy'[tag]} is not what PE {j} wrote")
    return failures


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_kernel: skipped, needs a CUDA GPU (the kernels run on the CUDA backend only)")
        return SKIP
    try:
        import cupy
    except ImportError:
        print("cuda_kernel: skipped, needs CuPy to compile and launch the kernels (pip install cupy-cuda13x)")
        return SKIP
    with symheap.init():
        if symheap.backend() != "cuda":
            print(f"cuda_kernel: skipped, symheap runs on the {symheap.backend()} backend (SYMHEAP_BACKEND?)")
            return SKIP
        me, npes = symheap.my_pe(), symheap.n_pes()
        ring, mix = compile_kernels(cupy)
        timeout_ns = int(float(os.environ.get("SYMHEAP_TIMEOUT", "120")) * 1e9)
        seed = st.zeros(1, dtype=torch.int64)
        if me == 0:
            seed.fill_(secrets.randbits(63))
        symheap.broadcast(seed, root=0)

        failures = run_ring(cupy, ring, me, npes, 100_003, timeout_ns)
        failures += run_mix(cupy, mix, me, npes, 10_000, int(seed.item()))

        for f in failures:
            print(f"PE {me}: {f}")
        bad = st.full(1, len(failures), dtype=torch.int32)
        symheap.all_reduce(bad)
        ok = int(bad.item()) == 0
        if me == 0:
            verdict = "OK" if ok else f"FAILED ({int(bad.item())} checks)"
            print(
                f"cuda_kernel {verdict}: {npes} PEs on {st.device()}, "
                f"ring_put {ROUNDS} rounds checked by the kernel and the host, provider_mix every slot"
            )
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
