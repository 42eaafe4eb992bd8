"""Teams of any world ranks in any order, at 1, 2, 4 and 8 PEs on the host backend: splits by a
list of ranks, teams made by their members alone over a TCPStore among them, their errors."""

from __future__ import annotations

import pytest

from conftest import run_cases, run_cases_mpirun


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_split_by_any_list_of_ranks(n: int) -> None:
    """The world reversed, random lists, nested splits: every collective exact; bad lists."""
    run_cases(n, "teams_any")


def test_team_max_across_nodes_under_mpirun() -> None:
    """Every PE its own node (Open MPI's mpirun): team_max over the world, on a team of one,
    and refused (as unsupported, on every member) for a team spanning nodes."""
    run_cases_mpirun(3, "team_max_across_nodes")


@pytest.mark.parametrize("n", [2, 4])
def test_split_by_different_lists_is_named_on_every_pe(n: int) -> None:
    """One PE passes the list reversed: SymheapMismatchError on every PE naming both lists."""
    run_cases(n, "team_ranks_mismatch")


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_team_made_by_its_members_alone(torch_module, n: int) -> None:
    """Two groups at once, each over a TCPStore among its members; every collective exact, a
    nested split; different lists, a raising exchange and bad lists raise."""
    run_cases(n, "team_from_ranks", timeout=300)
