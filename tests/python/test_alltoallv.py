"""``symheap.alltoall`` with uneven blocks across real processes (host backend, NumPy): split
sizes on the host and counts in symmetric memory, random uneven splits with zeros, exact at 1
to 4 PEs; wrong sums, negative counts and disagreeing pairs refused on every PE
(pe_alltoallv.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_alltoall_uneven(n: int) -> None:
    p = launch(n, [sys.executable, str(Path(__file__).with_name("pe_alltoallv.py"))], timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"[PE {r}] PASS alltoallv" in p.stdout, out
