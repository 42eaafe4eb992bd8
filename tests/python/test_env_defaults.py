"""symheap leaves the process's environment alone: `import symheap`, init/finalize and
`init(device=...)` change no variable, symheap's own or any other library's, whatever the job's
shape. NVSHMEM's defaults reach only the NVSHMEM that symheap's NVSHMEM provider initialises:
set while it does (where the user left them unset), removed after."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import clean_env

# Prints what `import symheap` (and then, with INIT=1, init/finalize and init(device=0))
# changed in os.environ: {"import": {...}, "init": {...}, "device": {...}}, each the variables
# added, removed or changed.
SHOW = r"""
import json, os, sys

def diff(a, b):
    keys = set(a) | set(b)
    return {k: [a.get(k), b.get(k)] for k in sorted(keys) if a.get(k) != b.get(k)}

start = dict(os.environ)
import symheap
out = {"import": diff(start, dict(os.environ))}
if os.environ.get("INIT") == "1":
    before = dict(os.environ)
    symheap.init(backend="host")
    symheap.finalize()
    out["init"] = diff(before, dict(os.environ))
    before = dict(os.environ)
    with symheap.init(backend="host", device=0):
        inside = dict(os.environ)
    out["device"] = diff(before, inside)
    out["device after"] = diff(before, dict(os.environ))
print(json.dumps(out))
"""

# The variables the former import-time defaults looked at (the job's shape).
SHAPES = [
    {},
    {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},
    {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
    {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
    {"SLURM_NNODES": "2"},
]
CLEARED = ("NVSHMEM_DISABLE_NVLS", "NVSHMEM_REMOTE_TRANSPORT", "SYMHEAP_DEVICE", "SLURM_NNODES")


def changes(extra: dict, init: bool) -> dict:
    env = {k: v for k, v in clean_env().items() if k not in CLEARED}
    env.update(extra)
    if init:
        env["INIT"] = "1"
    p = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("extra", SHAPES)
def test_import_changes_no_environment_variable(extra: dict) -> None:
    assert changes(extra, init=False) == {"import": {}}


def test_init_finalize_and_device_change_no_environment_variable() -> None:
    assert changes({}, init=True) == {"import": {}, "init": {}, "device": {}, "device after": {}}


@pytest.mark.parametrize(
    "environ, single_node, want",
    [
        ({}, True, {"NVSHMEM_DISABLE_NVLS": "1", "NVSHMEM_REMOTE_TRANSPORT": "none"}),
        ({}, False, {"NVSHMEM_DISABLE_NVLS": "1"}),
        ({"NVSHMEM_DISABLE_NVLS": "0"}, True, {"NVSHMEM_REMOTE_TRANSPORT": "none"}),
        ({"NVSHMEM_REMOTE_TRANSPORT": "ibrc"}, True, {"NVSHMEM_DISABLE_NVLS": "1"}),
        ({"NVSHMEM_DISABLE_NVLS": "0", "NVSHMEM_REMOTE_TRANSPORT": "ucx"}, True, {}),
    ],
)
def test_nvshmem_defaults_only_where_the_user_set_none(environ: dict, single_node: bool, want: dict) -> None:
    from symheap.providers import _nvshmem_defaults

    assert _nvshmem_defaults(environ, single_node) == want


def test_nvshmem_defaults_are_set_only_while_nvshmem_initialises(monkeypatch) -> None:
    """The provider wraps NVSHMEM's initialisation in ``_environ_while``: the variables are
    there inside, gone after, also when initialisation raises."""
    from symheap.providers import _environ_while

    for k in ("NVSHMEM_DISABLE_NVLS", "NVSHMEM_REMOTE_TRANSPORT"):
        monkeypatch.delenv(k, raising=False)
    before = dict(os.environ)
    values = {"NVSHMEM_DISABLE_NVLS": "1", "NVSHMEM_REMOTE_TRANSPORT": "none"}
    with _environ_while(values):
        assert {k: os.environ.get(k) for k in values} == values
    assert dict(os.environ) == before
    with pytest.raises(RuntimeError, match="init failed"):
        with _environ_while(values):
            raise RuntimeError("init failed")
    assert dict(os.environ) == before
