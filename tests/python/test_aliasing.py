"""The collectives' aliasing rules and read-only destinations on the host backend, at 1, 2, 4
and 8 PEs (cases in pe_alias_cases.py): in-place forms exact and no false mismatch, every other
overlap refused naming both ranges, disagreement on in place named as a mismatch, read-only
arrays refused by every call that writes into them."""

from __future__ import annotations

import pytest

from conftest import run_cases, run_cases_mpirun

PES = [1, 2, 4, 8]


@pytest.mark.parametrize("n", PES)
def test_in_place_forms_are_exact(n: int) -> None:
    """all_gather from this PE's own block, reduce_scatter into it, all_reduce and broadcast
    on one array: exact at every size, on the world and a sub-team; the ledgers agree."""
    run_cases(n, "alias_in_place", timeout=600)


@pytest.mark.parametrize("n", PES)
def test_other_overlaps_are_refused(n: int) -> None:
    """Partial overlaps, another PE's block, alltoall on one array: SymheapValueError on
    every PE naming both ranges, nothing moved, the context usable."""
    run_cases(n, "alias_refused")


@pytest.mark.parametrize("n", [2, 4])
def test_disagreeing_on_in_place_is_a_mismatch(n: int) -> None:
    """One PE in place, the others not: SymheapMismatchError on every PE."""
    run_cases(n, "alias_mismatch")


@pytest.mark.parametrize("n", PES)
def test_read_only_destinations_are_refused(n: int) -> None:
    """Every writing call refuses a read-only NumPy array, naming the call and argument."""
    run_cases(n, "readonly_refused")


@pytest.mark.parametrize("n", PES)
def test_torch_entries_follow_the_rules(torch_module, n: int) -> None:
    """The in-place forms and refusals through the SHMEM-style calls on tensors, the torch
    ops and symheap.distributed, on symmetric and ordinary tensors."""
    run_cases(n, "alias_torch", timeout=300)


@pytest.mark.parametrize("n", [2, 3])
def test_in_place_forms_across_nodes_under_mpirun(n: int) -> None:
    """The in-place and refusal cases with every PE on its own node under Open MPI's mpirun:
    the host backend runs each collective through Open MPI (MPI_IN_PLACE), on the world and,
    at 3 PEs, on a split that spans nodes."""
    run_cases_mpirun(n, "alias_in_place", "alias_refused", timeout=600)
