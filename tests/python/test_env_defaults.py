"""`import symheap` puts NVSHMEM's defaults into the environment (the Rust side never changes a
running process's environment): NVLink multicast off always, no network transport on a job of
one node, and never over what the user set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SHOW = (
    "import json, os, symheap; "
    "print(json.dumps({k: os.environ.get(k) for k in "
    "('NVSHMEM_DISABLE_NVLS', 'NVSHMEM_REMOTE_TRANSPORT')}))"
)
CLEARED = (
    "NVSHMEM_DISABLE_NVLS",
    "NVSHMEM_REMOTE_TRANSPORT",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NNODES",
)


def env_after_import(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "extra, transport",
    [
        ({}, "none"),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, "none"),
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "none"),
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, None),
        ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, None),
        ({"SLURM_NNODES": "2"}, None),
    ],
)
def test_defaults_follow_the_job_shape(extra: dict, transport: str) -> None:
    got = env_after_import(**extra)
    assert got == {"NVSHMEM_DISABLE_NVLS": "1", "NVSHMEM_REMOTE_TRANSPORT": transport}


def test_what_the_user_set_is_kept() -> None:
    got = env_after_import(NVSHMEM_DISABLE_NVLS="0", NVSHMEM_REMOTE_TRANSPORT="ibrc")
    assert got == {"NVSHMEM_DISABLE_NVLS": "0", "NVSHMEM_REMOTE_TRANSPORT": "ibrc"}
