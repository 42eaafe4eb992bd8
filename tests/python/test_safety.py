"""No silent data loss (issue 17), on the host backend at 2 to 8 PEs: operations on freed
buffers are refused, one PE passing another buffer is a named mismatch, and every kind of
divergence between the PEs' collective calls fails every PE within 1 s with the same message
naming both calls (SYMHEAP_TIMEOUT stays at 30 s: a case that waits for it fails)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import launch, run_cases

SAFETY = Path(__file__).resolve().parent / "safety_cases.py"


@pytest.mark.parametrize("n", [1, 2, 4])
def test_use_after_free_is_refused(n: int) -> None:
    p = run_cases(n, "use_after_free", script=SAFETY)
    # While the freed array and its view exist, its memory is not reused (so they stay
    # refused by address, whatever else aliases them); once they are gone it is.
    assert p.stdout.count("HELD True REUSED 1") == n, p.stdout


@pytest.mark.parametrize("n", [2])
def test_use_after_free_torch_cpu(torch_module, n: int) -> None:
    run_cases(n, "use_after_free_torch", script=SAFETY)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_all_gather_object_bytes_takes_different_lengths(n: int) -> None:
    run_cases(n, "object_bytes", script=SAFETY)


def _mismatch(n: int, case: str) -> None:
    p = launch(n, [sys.executable, str(SAFETY), case], env={"SYMHEAP_TIMEOUT": "30"}, timeout=120)
    out = p.stdout + p.stderr
    rows = re.findall(r"\[PE (\d+)\] MISMATCH ([0-9.]+) ([0-9a-f]{8}) (.*)", p.stdout)
    assert sorted(int(r[0]) for r in rows) == list(range(n)), f"not every PE named the mismatch:\n{out}"
    slow = [(r[0], r[1]) for r in rows if float(r[1]) >= 1.0]
    assert not slow, f"named after 1 s or more on PEs {slow}:\n{out}"
    texts = {r[2] for r in rows}
    assert len(texts) == 1, "PEs reported different messages:\n" + "\n".join(r[3] for r in rows)
    for r in range(n):
        assert f"[PE {r}] PASS {case}" in p.stdout, out
    assert p.returncode == 0, out


DIVERGENCES = [
    "barrier_vs_all_reduce",
    "barrier_vs_broadcast",
    "skipped_all_reduce",
    "different_buffer",
    "skipped_split",
    "skipped_destroy",
    "growth_on_one_pe",
    "world_vs_sub_team",
]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("case", DIVERGENCES)
def test_divergence_is_named_fast_on_every_pe(case: str, n: int) -> None:
    _mismatch(n, case)


@pytest.mark.parametrize("case", ["barrier_vs_all_reduce", "world_vs_sub_team", "skipped_split"])
def test_divergence_at_8_pes(case: str) -> None:
    _mismatch(8, case)


@pytest.mark.parametrize("n", [4, 6])
def test_concurrent_sub_teams_fail_alike(n: int) -> None:
    _mismatch(n, "concurrent_sub_teams")
