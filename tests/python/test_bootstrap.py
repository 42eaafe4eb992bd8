"""init() over a Python store (set/get/wait, like torch.distributed's) and over a communicator
(allgather, like mpi4py), driven by a file-backed store, at 1, 2 and 4 PEs."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cases

sys.path.insert(0, str(ROOT / "scripts"))
import fault_harness as fh  # noqa: E402


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


# ---- issue 40: one job, one rendezvous --------------------------------------------------------

_LATE = """
import os, sys, time, symheap
symheap.init()
symheap.barrier_all()
print("UP", flush=True)
try:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        symheap.barrier_all()
        time.sleep(0.01)
except symheap.SymheapError as e:
    print("ERROR", " ".join(str(e).split()), flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("one_node", [True, False], ids=["unix", "tcp"])
def test_a_second_job_with_the_same_identity_ends_the_running_one(one_node: bool, tmp_path) -> None:
    """A 2-PE job started by hand (no SYMHEAP_TOKEN) is running when a second job with the same
    environment starts its PE 0: every PE of the running job and the newcomer fail at once,
    naming the two jobs, instead of the newcomer's PEs joining (or waiting on) the running job."""
    env = {"SYMHEAP_SECRET_FILE": str(tmp_path / "secret")}
    spec = fh.JobSpec(n=2, port=fh.free_port(), timeout=30, one_node=one_node, extra_env=env)

    def start(rank: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", _LATE],
            env=fh.pe_env(spec, rank),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    job = [start(0), start(1)]
    for p in job:
        assert p.stdout.readline().strip() == "UP", p.stderr.read()
    t0 = time.monotonic()
    late = start(0)
    _, late_err = late.communicate(timeout=30)
    assert late.returncode != 0 and "two jobs share the rendezvous" in late_err, late_err
    for p in job:
        out, err = p.communicate(timeout=30)
        assert p.returncode != 0 and "two jobs share the rendezvous" in out, out + err
    assert time.monotonic() - t0 < 10
