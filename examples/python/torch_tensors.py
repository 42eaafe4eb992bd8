"""Symmetric torch tensors: a put around the ring, a peer tensor, all_reduce and all_gather.

The same program runs on the host backend (CPU tensors, one process per PE) and on the CUDA
backend (CUDA tensors, chosen automatically when a GPU is visible; several PEs may share one):

    symheap launch -n 2 -- python examples/python/torch_tensors.py [N]
    SYMHEAP_BACKEND=host symheap launch -n 2 -- python examples/python/torch_tensors.py

Every value is an integer below 2^20 held in float32, so sums over up to 16 PEs stay exact and
every check is an exact comparison. Exit status 0 when all of them hold, 1 otherwise, 77 (skipped)
without PyTorch.
"""

from __future__ import annotations

import secrets
import sys

import symheap

try:
    import symheap.torch as st
    import torch
except ImportError as e:  # exit 77 ("skipped") without PyTorch, as without the other requirements
    print(f"torch_tensors: skipped, {e}")
    sys.exit(77)


def block_of(seed: int, pe: int, n: int) -> torch.Tensor:
    # Any PE can regenerate any PE's block from the shared seed, so every result is checked
    # against a value computed locally.
    g = torch.Generator().manual_seed(seed * 1000 + pe)
    return torch.randint(-(2**20), 2**20, (n,), generator=g).to(torch.float32)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 16
    failures = []
    with symheap.init():
        me, npes = symheap.my_pe(), symheap.n_pes()
        nxt, prv = (me + 1) % npes, (me - 1) % npes
        dev = st.device()  # cpu on the host backend, this PE's cuda:N on the CUDA backend

        seed = st.zeros(1, dtype=torch.int64)
        if me == 0:
            seed.fill_(secrets.randbits(40))
        symheap.broadcast(seed, root=0)
        s = int(seed.item())
        mine = block_of(s, me, n)

        # 1. put into the next PE's copy. On CUDA, put and barrier_all are enqueued on torch's
        #    current stream, so they are ordered with the torch work around them.
        x, peer_bases = st.allocate_symmetric(n, dtype=torch.float32)
        if int(peer_bases[me]) != x.data_ptr():
            failures.append("peer_bases[my_pe] is not x.data_ptr()")
        symheap.barrier_all()  # peers write into x only once every PE has allocated it
        symheap.put(x, mine.to(dev), nxt)
        symheap.barrier_all()
        if not torch.equal(x.cpu(), block_of(s, prv, n)):
            failures.append(f"put: x does not hold PE {prv}'s block")

        # 2. The next PE's copy as a tensor of this process: torch reads it in place.
        peer = st.get_peer_tensor(x, nxt)
        if not torch.equal(peer.cpu(), mine):
            failures.append(f"get_peer_tensor: PE {nxt}'s copy does not hold this PE's block")

        # 3. Collectives on symmetric tensors (every PE calls them, in the same order).
        total = st.empty(n, dtype=torch.float32)
        total.copy_(mine)
        symheap.all_reduce(total)  # in place, sum
        want = sum(block_of(s, r, n) for r in range(npes))
        if not torch.equal(total.cpu(), want):
            failures.append("all_reduce: not the sum of every PE's block")
        gathered = st.empty(npes, n, dtype=torch.float32)
        symheap.all_gather(gathered, x)
        # Row r is PE r's x, which holds PE r-1's block.
        want = torch.stack([block_of(s, (r - 1) % npes, n) for r in range(npes)])
        if not torch.equal(gathered.cpu(), want):
            failures.append("all_gather: row r is not PE r's x")

        for f in failures:
            print(f"PE {me}: {f}")
        # Every PE learns every PE's verdict, so they all exit with the same status.
        bad = st.full(1, len(failures), dtype=torch.int32)
        symheap.all_reduce(bad)
        ok = int(bad.item()) == 0
        if me == 0:
            verdict = "OK" if ok else f"FAILED ({int(bad.item())} checks)"
            print(f"torch_tensors {verdict}: {npes} PEs on {symheap.backend()} ({dev}), {n} float32 per PE")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
