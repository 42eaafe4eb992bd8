"""PE side of test_alltoallv.py, under the launcher: ``symheap.alltoall`` with uneven blocks,
split sizes on the host (``output_split_sizes``/``input_split_sizes``, as torch.distributed's
``all_to_all_single``) and counts in symmetric memory (``in_splits``/``out_splits_offsets``, as
torch's ``all_to_all_vdev``), on random uneven splits with zeros, exact against the split
matrix every PE draws from the shared seed; disagreeing split sizes, wrong sums and negative
counts refused on every PE. Prints ``PASS alltoallv`` per PE. Not collected by pytest."""

from __future__ import annotations

import numpy as np
import symheap
import symheap.numpy as sn


def matrix(rng: np.random.Generator, n: int) -> np.ndarray:
    m = rng.integers(1, 40, size=(n, n))
    m[rng.random((n, n)) < 0.25] = 0
    return m


def values(rnd: int, i: int, j: int, k: int, row: int) -> np.ndarray:
    base = (rnd * 1_000_003 + i * 10_007 + j * 101) * 1000
    return np.arange(base, base + k * row, dtype=np.int64)


def raises(fn, *args, want: str, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except symheap.SymheapValueError as e:
        assert want in str(e), f"{want!r} not in {e}"
        assert e.call == "alltoall", e.call
        return
    raise AssertionError(f"accepted: expected {want!r}")


def exact_rounds(me: int, n: int, rng: np.random.Generator) -> None:
    for rnd in range(4):
        m = matrix(rng, n)
        row = (1, 3)[rnd % 2]
        send, recv = m[me], m[:, me]
        cap_s, cap_r = int(m.sum(axis=1).max()), int(m.sum(axis=0).max())
        src = sn.zeros((cap_s + 1, row), dtype=np.int64)
        dst = sn.full((cap_r + 1, row), -1, dtype=np.int64)
        src[: send.sum()] = np.concatenate([values(rnd, me, j, send[j], row) for j in range(n)]).reshape(-1, row)
        want = np.concatenate([values(rnd, j, me, recv[j], row) for j in range(n)]).reshape(-1, row)
        symheap.barrier_all()
        # Split sizes in rows of the first dimension, summing to the arrays' rows.
        symheap.alltoall(
            dst[: recv.sum()], src[: send.sum()], output_split_sizes=list(recv), input_split_sizes=list(send)
        )
        assert np.array_equal(dst[: recv.sum()], want), f"round {rnd}: {dst} != {want}"
        assert (dst[recv.sum() :] == -1).all(), "written past the received rows"
        # Counts in symmetric memory, in rows; the whole arrays (the same rows on every PE).
        counts = sn.zeros(n, dtype=np.int64)
        out = sn.full((2, n), -1, dtype=np.int64)
        counts[:] = send
        dst2 = sn.full((cap_r + 1, row), -1, dtype=np.int64)
        symheap.barrier_all()
        symheap.alltoall(dst2, src, in_splits=counts, out_splits_offsets=out)
        assert np.array_equal(dst2[: recv.sum()], want), f"device counts round {rnd}"
        assert (dst2[recv.sum() :] == -1).all(), "written past the received rows"
        assert np.array_equal(out[0], recv), (out, recv)
        assert np.array_equal(out[1], np.concatenate([[0], np.cumsum(recv)[:-1]])), out
        symheap.barrier_all()


def refusals(me: int, n: int, rng: np.random.Generator) -> None:
    m = matrix(rng, n)
    send, recv = list(m[me]), list(m[:, me])
    src = sn.zeros((int(m.sum(axis=1).max()) + 1, 1), dtype=np.int64)
    dst = sn.zeros((int(m.sum(axis=0).max()) + 2, 1), dtype=np.int64)
    s, d = src[: sum(send)], dst[: sum(recv)]
    # Wrong sums and negative sizes, refused before anything meets (every PE makes them).
    raises(symheap.alltoall, dst, s, output_split_sizes=recv, input_split_sizes=send, want="summing to")
    bad = [-1] + send[1:]
    raises(symheap.alltoall, d, s, output_split_sizes=recv, input_split_sizes=bad, want="out of range")
    raises(symheap.alltoall, d, s, output_split_sizes=recv, want="go together")
    # A pair that disagrees: member 1 expects one row more from member 0; every PE names it.
    if n > 1:
        mine = list(recv)
        if me == 1:
            mine[0] += 1
        dd = dst[: sum(mine)]
        want = f"member 0 sends member 1 {m[0][1]} elements, member 1 expects {m[0][1] + 1} from member 0"
        raises(symheap.alltoall, dd, s, output_split_sizes=mine, input_split_sizes=send, want=want)
    # Counts in symmetric memory: a negative one, and more rows than the source holds.
    counts, out = sn.zeros(n, dtype=np.int64), sn.zeros((2, n), dtype=np.int64)
    counts[:] = m[me]
    if me == 0:
        counts[n - 1] = -3
    symheap.barrier_all()
    raises(symheap.alltoall, dst, src, in_splits=counts, out_splits_offsets=out, want="negative count, -3 rows")
    counts[:] = m[me]
    if me == n - 1:
        counts[0] = src.shape[0] + 1
    symheap.barrier_all()
    raises(symheap.alltoall, dst, src, in_splits=counts, out_splits_offsets=out, want=f"member {n - 1} sends")
    # Still usable: an exact call after the refusals.
    counts[:] = m[me]
    src[: sum(send), 0] = np.concatenate([values(9, me, j, send[j], 1) for j in range(n)])
    symheap.barrier_all()
    symheap.alltoall(dst, src, in_splits=counts, out_splits_offsets=out)
    want_rows = np.concatenate([values(9, j, me, recv[j], 1) for j in range(n)])
    assert np.array_equal(dst[: sum(recv), 0], want_rows), "after the refusals"
    symheap.barrier_all()


def main() -> None:
    symheap.init()
    me, n = symheap.my_pe(), symheap.n_pes()
    rng = np.random.default_rng(7)
    exact_rounds(me, n, rng)
    refusals(me, n, rng)
    print(f"[PE {me}] PASS alltoallv", flush=True)
    symheap.finalize()


if __name__ == "__main__":
    main()
