"""The ``symheap`` backend of torch.distributed across real processes (host backend, CPU tensors,
``init_process_group("cpu:symheap")``; on a GPU also CUDA tensors over ``cuda:symheap``): every
collective torch offers through ``dist.*`` on random data of every dtype, exact (pe_tdist.py),
and at 3 and 4 ranks on subgroups (``new_group`` in any order, disjoint groups,
``new_subgroups``, a 2-D DeviceMesh with DTensor: tdist_groups.py); a divergence and a dead rank
reported on the other ranks through ``dist.*`` as both a ``DistBackendError`` and a
``SymheapError``; ``cpu:gloo,cuda:symheap`` giving CPU tensors to gloo."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

from conftest import launch

PE = str(Path(__file__).with_name("pe_tdist.py"))
# A small mailbox slot, so send/recv of a few KiB moves in several chunks; a small subgroup
# staging slot, so subgroup collectives of a few KiB run in several rounds (tdist_groups.py).
ENV = {"SYMHEAP_P2P_SLOT": "4096", "SYMHEAP_TDIST_GROUP_STAGING": "4096"}


def run(n: int, mode: str, timeout: float = 300, device: str = "cpu", env: Optional[Dict[str, str]] = None):
    env = {**ENV, **(env or {}), **({"SYMHEAP_BACKEND": "cuda"} if device == "cuda" else {})}
    return launch(n, [sys.executable, PE, mode, device], env=env, timeout=timeout)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective(torch_module, n: int) -> None:
    p = run(n, "all")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"[PE {r}] PASS tdist" in p.stdout, out


@pytest.mark.parametrize("n", [1, 2])
def test_sync_collectives_note_no_stream_use_cuda(cuda_gpus: int, n: int) -> None:
    """Under torch's cudaMallocAsync allocator: synchronous collectives on ordinary CUDA tensors
    leave the tensors' lifetime to torch's stream order, as ProcessGroupNCCL does (no
    record_stream, so none of its warnings), the asynchronous ones record; all exact."""
    p = run(n, "records", device="cuda", env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"[PE {r}] PASS tdist" in p.stdout, out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_collective_cuda(cuda_gpus: int, n: int) -> None:
    """The same checks on CUDA tensors over ``cuda:symheap`` (the ranks share the GPUs when there
    are fewer than ``n``): every op and dtype, async works, send/recv, functional collectives
    compiled, and at 4 ranks the subgroups with their staging on CUDA."""
    p = run(n, "all", device="cuda")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"[PE {r}] PASS tdist" in p.stdout, out


def test_gloo_beside_symheap(torch_module) -> None:
    p = run(2, "gloo")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(2):
        assert f"[PE {r}] PASS tdist" in p.stdout, out


def test_divergence_named_on_every_rank(torch_module) -> None:
    p = run(2, "diverge")
    out = p.stdout + p.stderr
    for r in range(2):
        line = re.search(rf"\[PE {r}\] DIVERGE (.*)", p.stdout)
        assert line, out
        assert "all_reduce" in line.group(1) and "all_gather" in line.group(1), line.group(1)


def reports(n: int, mode: str, timeout_s: int, tag: str) -> list:
    """(seconds, line, message) of ranks 0 and 1 printing ``[PE r] TAG after Ss: message`` in
    ``mode`` at ``n`` ranks, under SYMHEAP_TIMEOUT."""
    p = launch(
        n,
        [sys.executable, PE, mode],
        env={**ENV, "SYMHEAP_TIMEOUT": str(timeout_s)},
        timeout=120,
        launcher_args=("--grace", "60"),
    )
    out = p.stdout + p.stderr
    found = []
    for r in range(2):
        m = re.search(rf"\[PE {r}\] {tag} after ([0-9.]+)s: (.*)", p.stdout)
        assert m, out
        found.append((float(m.group(1)), m.group(0), m.group(2)))
    return found


def dead_rank_reports(timeout_s: int) -> list:
    """(seconds, line) of ranks 0 and 1 after rank 2 died, under SYMHEAP_TIMEOUT."""
    found = reports(3, "dead", timeout_s, "DEAD")
    for _, line, msg in found:
        assert "PE 2" in msg, line
    return [(secs, line) for secs, line, _ in found]


def test_dead_rank_named_within_2s(torch_module) -> None:
    """A rank that dies is named on the others through dist.* as exited, within 2 s, under a
    30 s timeout: over torch's store symheap watches the processes of the PEs of its node."""
    for secs, line in dead_rank_reports(30):
        assert "PE 2 exited" in line, line
        assert secs < 2.0, line


def group_failures(mode: str, timeout_s: int) -> list:
    """(seconds, message) of members 0 and 1 of a new_group whose member 3 died (``dead-group``)
    or never came (``late-group``), 4 ranks, under SYMHEAP_TIMEOUT."""
    return [(secs, msg) for secs, _, msg in reports(4, mode, timeout_s, "FAILED")]


def test_dead_rank_named_during_new_group(torch_module) -> None:
    """A rank that dies while the others make a group with it is named by their new_group
    within 2 s (they wait on torch's store, which sees no death; symheap's watch does)."""
    for secs, line in group_failures("dead-group", 30):
        assert line.startswith("SymheapPeerError: new_group:") and "PE 3 exited" in line, line
        assert secs < 2.0, line


def test_late_rank_named_by_new_group_timeout(torch_module) -> None:
    """A rank that lives but never makes the group: the others' new_group times out after
    SYMHEAP_TIMEOUT, naming the rank that did not join."""
    for secs, line in group_failures("late-group", 3):
        assert line.startswith("SymheapTimeoutError: new_group: ranks [3] of the group [0, 1, 3]"), line
        assert "did not join it within 3 s" in line, line
        assert 2.9 < secs < 10, line
