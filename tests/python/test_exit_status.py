"""Honest exit status (issue 18): a job that did not end cleanly never exits 0. A PE whose
collective finalize at exit fails (a peer that never reaches it) prints why and exits non-zero,
on its own (started by hand, no launcher to notice)."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import clean_env

SCRIPT = """
import os, sys, time
import symheap
symheap.init()
if symheap.my_pe() == 1:
    time.sleep(float(os.environ["LATE"]))   # never reaches finalize in time
print("PE", symheap.my_pe(), "returns", flush=True)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failed_finalize_at_exit_is_a_failure() -> None:
    port = str(_free_port())
    procs = []
    for r in range(2):
        env = clean_env(
            {
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "SYMHEAP_TOKEN": "exit-status-test",
                "SYMHEAP_TIMEOUT": "2",
                "LATE": "8",
            }
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    t0 = time.monotonic()
    out0, err0 = procs[0].communicate(timeout=60)
    dt = time.monotonic() - t0
    procs[1].kill()
    procs[1].communicate()
    assert "PE 0 returns" in out0, out0 + err0
    assert procs[0].returncode != 0, f"PE 0 exited 0 although its finalize failed:\n{out0}{err0}"
    assert "finalize at exit failed" in err0, err0
    assert dt < 30, f"took {dt:.1f} s"
