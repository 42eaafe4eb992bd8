"""Shared helpers: run PE scripts under ``python -m symheap.launch`` and check their output."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PE_CASES = HERE / "pe_cases.py"
PROVIDER_CASES = HERE / "provider_cases.py"

# Variables a launcher sets: the tests start their own jobs, so none may leak in from outside.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SYMHEAP_TOKEN",
    "SYMHEAP_LAUNCHER",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
)


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.setdefault("SYMHEAP_TIMEOUT", "30")
    env.setdefault("SYMHEAP_HEAP_CAPACITY", "1G")
    env.setdefault("SYMHEAP_BACKEND", "host")
    # Inductor on CPU proves each SIMD level it may use by building a test library and loading
    # it in a child interpreter that imports torch: ten on the development VM's CPU, ~25 s per
    # process on two cores, in every PE of every test that compiles. With its own setting it
    # trusts the CPU's flags for the base levels and checks only the extensions (6, ~15 s).
    env.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
    # The backend's asynchronous Works: torch's future-backed one unless a test asks for
    # symheap's C++ Work (the cpp_work_env fixture), whatever a cache outside the tests holds.
    env.setdefault("SYMHEAP_TORCH_WORK", "off")
    env.update(extra or {})
    return env


def launch(
    n: int,
    argv: Sequence[str],
    env: Optional[Dict[str, str]] = None,
    timeout: float = 180,
    launcher_args: Sequence[str] = ("--grace", "2"),
) -> subprocess.CompletedProcess:
    """Runs ``python -m symheap.launch -n N ... -- argv`` and returns the finished process."""
    cmd = [sys.executable, "-m", "symheap.launch", "-n", str(n), *launcher_args, "--", *argv]
    return subprocess.run(cmd, cwd=ROOT, env=clean_env(env), capture_output=True, text=True, timeout=timeout)


def run_cases(
    n: int, *cases: str, env: Optional[Dict[str, str]] = None, script: Path = PE_CASES, timeout: float = 180
) -> subprocess.CompletedProcess:
    """Runs PE cases of ``script`` (pe_cases.py, or provider_cases.py) at ``n`` PEs and asserts
    every PE passed every case."""
    p = launch(n, [sys.executable, str(script), *cases], env=env, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"exit status {p.returncode}\n{out}"
    for case in cases:
        for r in range(n):
            assert f"[PE {r}] PASS {case}" in p.stdout, f"PE {r} did not pass {case}\n{out}"
    return p


def run_cases_mpirun(n: int, *cases: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs PE cases of pe_cases.py at ``n`` PEs under Open MPI's mpirun with every PE on its
    own node (they share no memory: the host backend's collectives go through Open MPI), and
    asserts every PE passed every case."""
    import shutil

    if shutil.which("mpirun") is None:
        pytest.fail("mpirun not found: install Open MPI (scripts/test.sh does: apt-get install openmpi-bin)")
    cmd = ["mpirun", "--oversubscribe", "-n", str(n)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(PE_CASES), *cases]
    env = clean_env({"PE_CASES_NODE_PER_PE": "1", "SYMHEAP_TIMEOUT": "60"})
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for c in cases:
        assert p.stdout.count(f"PASS {c}") == n, out
    return p


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--gpu-only",
        action="store_true",
        help="run only the tests that need a CUDA device (those using the cuda_gpus fixture): "
        "the GPU suite's choice, since CI runs the rest with the same torch and Triton",
    )


def pytest_collection_modifyitems(config, items) -> None:
    """With ``--gpu-only``, deselects every test that does not need a GPU."""
    if not config.getoption("--gpu-only"):
        return
    keep = [i for i in items if "cuda_gpus" in getattr(i, "fixturenames", ())]
    gone = [i for i in items if "cuda_gpus" not in getattr(i, "fixturenames", ())]
    if gone:
        config.hook.pytest_deselected(items=gone)
    items[:] = keep


@pytest.fixture
def torch_module():
    """torch, or a skip when it is not installed."""
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    return torch


@pytest.fixture
def cuda_gpus(torch_module) -> int:
    """The number of visible CUDA GPUs, or a skip when there is none."""
    if not torch_module.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch_module.cuda.device_count()


@dataclass
class CppWorkBuild:
    """How the session's C++ Work was built: ``env`` makes a PE use it; ``auto`` is the output of
    the 2-rank job whose group started the build in the background (None where the module was
    built before the session); ``module`` its path."""

    env: Dict[str, str]
    auto: Optional[subprocess.CompletedProcess]
    module: str


@pytest.fixture(scope="session")
def cpp_work_build(tmp_path_factory) -> CppWorkBuild:
    """symheap's C++ Work (symheap/distributed/cpp_work.py) compiled once per test session for
    the torch the tests run with, into a cache of its own, the way a user's first run builds
    it: a 2-rank group under ``SYMHEAP_TORCH_WORK=auto`` starts the build in the background
    (cpp_work_cases.py auto), and this waits for it. ``SYMHEAP_TEST_CPP_WORK_CACHE``: a cache
    directory to build in with the build command instead (the GPU suite's, where it built the
    module already)."""
    pytest.importorskip("torch")
    cache = os.environ.get("SYMHEAP_TEST_CPP_WORK_CACHE")
    # SYMHEAP_TORCH_WORK=build for the tests that use it: a module that does not load raises.
    env = {"SYMHEAP_CACHE_DIR": cache or str(tmp_path_factory.mktemp("cpp-work")), "SYMHEAP_TORCH_WORK": "build"}
    if cache:
        cmd = [sys.executable, "-m", "symheap.distributed.cpp_work", "build"]
        p = subprocess.run(cmd, cwd=ROOT, env=clean_env(env), capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stdout + p.stderr
        return CppWorkBuild(env, None, p.stdout.strip())
    cases = str(HERE / "cpp_work_cases.py")
    auto = launch(2, [sys.executable, cases, "auto"], env={**env, "SYMHEAP_TORCH_WORK": "auto"})
    out = auto.stdout + auto.stderr
    assert auto.returncode == 0, out
    module = re.search(r"\[PE 0\] PATH (\S+)", auto.stdout)
    assert module, out
    log = Path(module[1] + ".log")
    # The build process holds this lock until it ends (it outlives the job).
    with open(module[1] + ".spawn") as lock:
        deadline = time.monotonic() + 900
        while not try_lock(lock):
            assert time.monotonic() < deadline, f"the background build still runs after 900 s:\n{log.read_text()}"
            time.sleep(0.5)
    assert os.path.isfile(module[1]), f"the background build left no module:\n{log.read_text()}"
    return CppWorkBuild(env, auto, module[1])


def try_lock(f) -> bool:
    """Whether an exclusive flock on ``f`` was taken (without waiting)."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@pytest.fixture(scope="session")
def cpp_work_env(cpp_work_build: CppWorkBuild) -> Dict[str, str]:
    """The environment that makes a PE use the session's C++ Work (:func:`cpp_work_build`)."""
    return cpp_work_build.env
