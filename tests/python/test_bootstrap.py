"""init() over a Python store (set/get/wait, like torch.distributed's) and over a communicator
(allgather, like mpi4py), driven by a file-backed store, at 1, 2 and 4 PEs."""

from __future__ import annotations

import pytest

from conftest import run_cases


@pytest.mark.parametrize("n", [1, 2, 4])
def test_store_rendezvous(n: int, tmp_path) -> None:
    run_cases(n, "store_init", env={"SYMHEAP_TEST_STORE": str(tmp_path)})


@pytest.mark.parametrize("n", [2, 4])
def test_store_abort(n: int, tmp_path) -> None:
    """An abort is published on the store and reaches PEs waiting in shared memory."""
    run_cases(n, "store_abort", env={"SYMHEAP_TEST_STORE": str(tmp_path)})


@pytest.mark.parametrize("n", [1, 2, 4])
def test_comm_rendezvous(n: int, tmp_path) -> None:
    run_cases(n, "comm_init", env={"SYMHEAP_TEST_STORE": str(tmp_path)})
