"""A ring exchange of NumPy arrays in symmetric memory (host backend: one CPU process per PE).

Every PE puts a block of random float64 values into the NEXT PE's copy of a symmetric array,
then checks that the block it received is exactly the one the PREVIOUS PE sent, and reads the
next PE's copy in place through a peer view. An all_reduce sums the wrong values of every PE,
so every PE agrees on the verdict; PE 0 prints it.

    symheap launch -n 4 -- python examples/python/numpy_ring.py [N]

Exit status 0 when every value arrived exactly, 1 otherwise.
"""

from __future__ import annotations

import secrets
import sys

import numpy as np
import symheap
import symheap.numpy as snp


def block_of(seed: int, pe: int, n: int) -> np.ndarray:
    # Every PE can regenerate any PE's block from the shared seed: that is what lets the receiver
    # check its data exactly without another exchange.
    return np.random.default_rng([seed, pe]).standard_normal(n)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    # NumPy arrays are host memory: the host backend, also on a machine with GPUs.
    with symheap.init(backend="host"):
        me, npes = symheap.my_pe(), symheap.n_pes()
        nxt, prv = (me + 1) % npes, (me - 1) % npes

        # PE 0 draws the seed; a broadcast gives it to everyone (a collective on a symmetric
        # array, so every PE allocates it too).
        seed = snp.zeros(1, dtype=np.uint64)
        if me == 0:
            seed[0] = secrets.randbits(63)
        symheap.broadcast(seed, root=0)
        s = int(seed[0])

        recv, peer_bases = snp.allocate_symmetric(n, dtype=np.float64)
        assert peer_bases[me] == recv.ctypes.data, "the contract: peer_bases[my_pe] is my own copy"
        mine = block_of(s, me, n)

        # A peer may write into recv only once every PE has allocated it.
        symheap.barrier_all()
        symheap.put(recv, mine, nxt)
        # The barrier also delivers the puts: after it, PE prv's block is in recv.
        symheap.barrier_all()

        wrong = snp.zeros(2, dtype=np.int64)
        expect = block_of(s, prv, n)
        wrong[0] = np.count_nonzero(recv != expect)
        # The next PE's copy, mapped in this process: what this PE put there, read in place.
        wrong[1] = np.count_nonzero(snp.get_peer_array(recv, nxt) != mine)
        if wrong.any():
            bad = int(np.flatnonzero(recv != expect)[0]) if wrong[0] else -1
            print(f"PE {me}: {wrong[0]} wrong values from PE {prv} (first at {bad}), {wrong[1]} in PE {nxt}'s copy")
        symheap.all_reduce(wrong)
        if me == 0:
            verdict = "OK" if not wrong.any() else "FAILED"
            print(
                f"numpy_ring {verdict}: {npes} PEs x {n} float64, "
                f"{int(wrong[0])} wrong after put, {int(wrong[1])} wrong in peer views"
            )
        return 0 if not wrong.any() else 1


if __name__ == "__main__":
    sys.exit(main())
