"""Multi-PE tests on the host backend with NumPy, at 1, 2 and 4 PEs: each test launches the PEs
(python -m symheap.launch) on a case of pe_cases.py and checks every PE's PASS line."""

from __future__ import annotations

import pytest

from conftest import run_cases, run_cases_mpirun

PES = [1, 2, 4]

CASES = [
    "init_finalize",  # init/finalize, rank info, the context manager
    "contract",  # allocate_symmetric contract, views, cross-allocation translation
    "rma_ring",  # put/get (and _nbi) around a ring, several dtypes
    "atomics",  # counter, compare_swap, bitwise, float set/fetch/swap, wrap-around
    "signals",  # put_signal producer/consumer, signal_wait_until, set and add
    "barrier",  # barrier_all / sync_all / barrier(team) ordering
    "teams",  # split_strided, translate_pe, team collectives, destroy
    "collectives",  # all_reduce / all_gather / broadcast / alltoall / reduce_scatter vs NumPy
    "errors",  # each typed exception for bad arguments; the context still works after
    "gc",  # release on garbage collection and free(); heap usage returns to start
    "dlpack",  # DLPack round trip (numpy.from_dlpack), array interface, peer views
    "grow_failure",  # heap growth failing on one PE fails it everywhere, then works
]


@pytest.mark.parametrize("n", PES)
@pytest.mark.parametrize("case", CASES)
def test_case(case: str, n: int) -> None:
    run_cases(n, case)


def test_grow_failure_at_8_pes() -> None:
    """Heap growth failing on one of 8 PEs fails the allocation on all 8 alike."""
    run_cases(8, "grow_failure")


def test_grow_failure_across_nodes() -> None:
    """The same with every PE on its own node: the failure reaches PEs that share no memory."""
    run_cases(3, "grow_failure", env={"PE_CASES_NODE_PER_PE": "1"})


@pytest.mark.parametrize("n", [2, 4])
def test_collective_mismatch_is_detected(n: int) -> None:
    """PEs calling broadcast with different roots all get SymheapMismatchError."""
    run_cases(n, "mismatch")


@pytest.mark.parametrize("n", [2, 4])
def test_eager_broadcast_mismatch_is_named_at_the_next_call(n: int) -> None:
    """Every PE the root of one small (eager) broadcast: each returns, and every PE gets
    SymheapMismatchError naming the roots at its next barrier."""
    run_cases(n, "mismatch_eager")


@pytest.mark.parametrize("n", [1, 2])
def test_timeout(n: int) -> None:
    """A wait nobody satisfies raises SymheapTimeoutError after SYMHEAP_TIMEOUT; the others
    fail too instead of hanging."""
    run_cases(n, "timeout", env={"SYMHEAP_TIMEOUT": "1"})


@pytest.mark.parametrize("n", [3, 4])
def test_a_signal_timeout_names_the_pe_that_did_not_signal(n: int) -> None:
    """signal_wait_until's timeout names the PE whose signal did not come (the one that fed the
    word before and sent nothing during the wait), and what the others sent."""
    run_cases(n, "signal_timeout_names_the_silent_pe", env={"SYMHEAP_TIMEOUT": "2"})


@pytest.mark.parametrize("n", [2, 4])
def test_abort_reaches_every_pe(n: int) -> None:
    """abort() on one PE makes the others' waits raise SymheapPeerError at once."""
    run_cases(n, "peer_abort")


def test_peer_exit_is_noticed() -> None:
    """A PE that exits without finalize makes the others raise SymheapPeerError naming it."""
    run_cases(2, "peer_exit")


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_across_nodes_under_mpirun(n: int) -> None:
    """The collectives case (every collective, four dtypes, every op, in and out of place,
    against NumPy) with every PE on its own node under Open MPI's mpirun: the PEs share no
    memory, so the host backend runs each collective through Open MPI."""
    run_cases_mpirun(n, "collectives")
