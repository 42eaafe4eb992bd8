"""A Triton kernel over allocate_symmetric's (tensor, peer_bases): a ring put with a signal.

Each PE's kernel stores a block of random values straight into the NEXT PE's copy of a symmetric
tensor (symheap.triton.put translates the pointer with the peer table) and then adds 1 to the next
PE's signal word with a release at system scope, once per program. A second kernel waits on this
PE's own signal (acquire) until every program of the previous PE has arrived; a third reads the
next PE's copy back with symheap.triton.get. Both directions are checked exactly on the host.

GPU only (the CUDA backend; several PEs may share one GPU):

    symheap launch -n 2 -- python examples/python/triton_kernel.py [N]

Exit status 0 when every value arrived, 1 otherwise, 77 (skipped) without a GPU, PyTorch or Triton.
"""

from __future__ import annotations

import os
import secrets
import sys

import symheap

try:
    import symheap.torch as st
    import torch
except ImportError as e:  # exit 77 ("skipped") without PyTorch, as without the other requirements
    print(f"triton_kernel: skipped, {e}")
    sys.exit(77)

BLOCK = 1024
SKIP = 77


def kernels():
    # Imported here so that a machine without a GPU reaches the skip message rather than
    # Triton's own failure.
    import symheap.triton as sh
    import triton
    import triton.language as tl

    @triton.jit
    def ring_put(src, recv, recv_bases, sig, sig_bases, me, npes, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        nxt = (me + 1) % npes
        # hint=16: the translated pointer is as aligned as recv itself, so the stores stay 16-byte
        # vector stores (without it the compiler must assume nothing about a computed pointer).
        sh.put(src + offs, recv + offs, me, nxt, recv_bases, mask=mask, hint=16)
        # After a CTA barrier, one release add: whoever acquires the signal sees this block.
        sh.signal_add(sig, 1, me, nxt, sig_bases)

    @triton.jit
    def wait_signal(sig, expect, ok, timeout_ns):
        # A bounded wait: a peer that never signals makes the check fail instead of hanging.
        done = sh.signal_wait_until(sig, sh.GE, expect, timeout_ns)
        tl.store(ok, done.to(tl.int32))

    @triton.jit
    def get_back(recv, out, recv_bases, me, pe, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        sh.get(recv + offs, out + offs, me, pe, recv_bases, mask=mask, hint=16)

    return ring_put, wait_signal, get_back


def block_of(seed: int, pe: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + pe)
    return torch.randn(n, generator=g)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    if not torch.cuda.is_available():
        print("triton_kernel: skipped, needs a CUDA GPU (Triton kernels run on the CUDA backend only)")
        return SKIP
    with symheap.init():
        if symheap.backend() != "cuda":
            print(f"triton_kernel: skipped, symheap runs on the {symheap.backend()} backend (SYMHEAP_BACKEND?)")
            return SKIP
        try:
            ring_put, wait_signal, get_back = kernels()
        except ImportError as e:  # no Triton: skipped, like no GPU
            print(f"triton_kernel: skipped, {e}")
            return SKIP
        me, npes = symheap.my_pe(), symheap.n_pes()
        nxt, prv = (me + 1) % npes, (me - 1) % npes
        dev = st.device()
        timeout_ns = int(float(os.environ.get("SYMHEAP_TIMEOUT", "120")) * 1e9)

        seed = st.zeros(1, dtype=torch.int64)
        if me == 0:
            seed.fill_(secrets.randbits(40))
        symheap.broadcast(seed, root=0)
        s = int(seed.item())

        recv, recv_bases = st.allocate_symmetric(n, dtype=torch.float32)
        sig, sig_bases = st.allocate_symmetric(1, dtype=torch.int64)
        src = block_of(s, me, n).to(dev)  # ordinary CUDA memory: only the destination is symmetric
        sig.zero_()
        # Stream-ordered like the kernels below: every PE's zeroed signal precedes any peer's add.
        symheap.barrier_all()

        grid = ((n + BLOCK - 1) // BLOCK,)
        ring_put[grid](src, recv, recv_bases, sig, sig_bases, me, npes, n, BLOCK=BLOCK)
        ok = torch.zeros(1, dtype=torch.int32, device=dev)
        wait_signal[(1,)](sig, grid[0], ok, timeout_ns)
        torch.cuda.synchronize(dev)
        failures = []
        if int(ok.item()) != 1:
            failures.append(f"only {int(sig.item())} of {grid[0]} programs of PE {prv} signalled")
        elif not torch.equal(recv.cpu(), block_of(s, prv, n)):
            wrong = int((recv.cpu() != block_of(s, prv, n)).sum())
            failures.append(f"{wrong} of {n} values from PE {prv} are wrong")

        # After this barrier every PE's puts have landed: PE nxt's recv holds this PE's block.
        symheap.barrier_all()
        out = torch.empty(n, dtype=torch.float32, device=dev)
        get_back[grid](recv, out, recv_bases, me, nxt, n, BLOCK=BLOCK)
        if not torch.equal(out.cpu(), block_of(s, me, n)):
            failures.append(f"get from PE {nxt} did not return this PE's block")
        # No PE may release recv while a peer's get_back still reads it.
        symheap.barrier_all()

        for f in failures:
            print(f"PE {me}: {f}")
        bad = st.full(1, len(failures), dtype=torch.int32)
        symheap.all_reduce(bad)
        ok_all = int(bad.item()) == 0
        if me == 0:
            verdict = "OK" if ok_all else f"FAILED ({int(bad.item())} checks)"
            print(f"triton_kernel {verdict}: {npes} PEs on {dev}, {n} float32 put and read back through peer_bases")
        return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
