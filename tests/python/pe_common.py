"""What the PE-side cases of pe_cases.py share: the case registry, and helpers for seeded random
data, expected errors and buffers."""

from __future__ import annotations

import os
import zlib
from typing import Callable, Dict

import numpy as np
import symheap
from symheap import SymheapError

CASES: Dict[str, Callable[[], None]] = {}
# Cases that call init themselves.
OWN_INIT = {"init_finalize", "store_init", "store_abort", "comm_init", "torch_dist"}
# Cases that leave the job failed on purpose: finalize then fails too.
POISONED = {
    "mismatch",
    "mismatch_eager",
    "timeout",
    "signal_timeout_names_the_silent_pe",
    "peer_abort",
    "peer_exit",
    "store_abort",
}


def case(fn: Callable[[], None]) -> Callable[[], None]:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def ptr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def raises(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        assert isinstance(e, SymheapError) or exc in (TypeError,), f"{type(e)} is not a SymheapError"
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")


def poison(a: np.ndarray) -> None:
    a.view(np.uint8)[...] = 0xAB


def env_rank():
    """(rank, world) from the launcher: symheap launch / torchrun, or Open MPI's mpirun."""
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    return int(rank), int(world)


def ring_check_tail(put_tail, read_tail, n: int, me: int, name: str) -> None:
    """Every PE puts 4 KiB of random bytes into the last 4 KiB of its right neighbour's buffer
    (memory only just added to every heap) and checks what its left neighbour put."""
    data = rng_for(name).integers(0, 256, size=(n, 4096), dtype=np.uint8)
    put_tail(data[me], (me + 1) % n)
    symheap.barrier_all()
    assert np.array_equal(read_tail(), data[(me - 1) % n])
    symheap.barrier_all()
