"""init() over a Python store (set/get/wait, like torch.distributed's) and over a communicator
(allgather, like mpi4py), driven by a file-backed store, at 1, 2 and 4 PEs."""

from __future__ import annotations

import os
import re
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


# ---- issue 42: a dead PE is named within 2 s over a store -------------------------------------

_DEAD = """
import datetime, os, sys, time
import symheap
import torch.distributed as dist

r, n, port, dead = map(int, sys.argv[1:5])
st = dist.TCPStore("127.0.0.1", port, n, r == 0, timeout=datetime.timedelta(seconds=60))
symheap.init(store=st, rank=r, world_size=n, timeout=30)
symheap.barrier_all()
if r == dead:
    print(f"EXIT {time.time():.6f}", flush=True)
    os._exit(7)
try:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        symheap.barrier_all()
except symheap.SymheapError as e:
    print(f"CAUGHT {time.time():.6f} {type(e).__name__}: {' '.join(str(e).split())}", flush=True)
    os._exit(0)
print("UNNOTICED", flush=True)
os._exit(1)
"""


@pytest.mark.parametrize(("n", "dead"), [(2, 1), (4, 3), (4, 0)])
def test_a_pe_that_exits_is_named_within_2s_over_a_tcp_store(torch_module, n: int, dead: int) -> None:
    """init(store=TCPStore) with a 30 s timeout: PE ``dead`` leaves with os._exit (no
    finalize), and every other PE's next barrier raises a SymheapPeerError naming it as
    exited, within 2 s of the exit (rank 0 hosts the store: its death leaves no store)."""
    port = fh.free_port()
    env = {k: v for k, v in os.environ.items() if k not in fh.LAUNCHER_VARS}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _DEAD, str(r), str(n), str(port), str(dead)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        outs.append((p.returncode, out, err))
    exited = re.search(r"EXIT ([0-9.]+)", outs[dead][1])
    assert exited, outs[dead]
    for r, (rc, out, err) in enumerate(outs):
        if r == dead:
            continue
        m = re.search(r"CAUGHT ([0-9.]+) (\w+): (.*)", out)
        assert rc == 0 and m, f"PE {r}: rc {rc}\n{out}\n{err}"
        secs = float(m.group(1)) - float(exited.group(1))
        assert m.group(2) == "SymheapPeerError", m.group(0)
        assert f"PE {dead} exited" in m.group(3), m.group(0)
        assert secs < 2.0, f"PE {r} named the exit after {secs:.2f} s: {m.group(0)}"
        print(f"PE {r} of {n}: PE {dead}'s exit named after {secs:.3f} s")


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
