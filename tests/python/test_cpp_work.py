"""symheap's C++ Work for its torch.distributed backend (symheap/distributed/cpp_work.py), compiled
for the torch the tests run with: the Work as torch sees it and its stream order on a GPU
(cpp_work_cases.py), every collective of the backend through it at 1 and 2 ranks (host and
CUDA) (pe_tdist.py, which checks it is the C++ Work that ran), torch's programs that hold
Works in C++ (DDP's futures, FSDP2, DTensor, compiled functional collectives) equal to gloo's,
the loader's error paths, and the build a first run starts in the background."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
from test_torch_programs import AT, Jobs, passed, same_values

from conftest import ROOT, CppWorkBuild, clean_env, launch

HERE = Path(__file__).resolve().parent
CASES = str(HERE / "cpp_work_cases.py")
PE = str(HERE / "pe_tdist.py")


def run_one(case: str, env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, CASES, case, *args], cwd=ROOT, env=clean_env(env), capture_output=True, text=True, timeout=300
    )


def test_cpp_work_object(cpp_work_env: Dict[str, str]) -> None:
    p = run_one("object", cpp_work_env)
    assert p.returncode == 0 and "PASS object" in p.stdout, p.stdout + p.stderr


def test_cpp_work_streams_cuda(cpp_work_env: Dict[str, str], cuda_gpus: int) -> None:
    """On a GPU: wait(), the future and a then() callback order the waiting stream after the
    Work's (a ~50 ms kernel before it would be raced otherwise); events are pooled."""
    p = run_one("object", cpp_work_env, "cuda")
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "cuda checked" in p.stdout and "PASS object" in p.stdout, out


def test_auto_builds_in_background(cpp_work_build: CppWorkBuild) -> None:
    """A user's first run (``SYMHEAP_TORCH_WORK=auto``, nothing built): the 2-rank group starts
    one build in the background and keeps torch's Work (cpp_work_cases.py auto); the module it
    leaves is what a later process under auto loads."""
    if cpp_work_build.auto is None:
        pytest.skip("the module was built before the session (SYMHEAP_TEST_CPP_WORK_CACHE)")
    out = cpp_work_build.auto.stdout
    for r in range(2):
        assert f"[PE {r}] PASS auto" in out, out
    assert re.search(r"\[PE \d\] REASON .*building in the background", out), out
    log = Path(cpp_work_build.module + ".log").read_text()
    assert log.count("background build of") == 1, log
    p = run_one("object", {**cpp_work_build.env, "SYMHEAP_TORCH_WORK": "auto"})
    assert p.returncode == 0 and "PASS object" in p.stdout, p.stdout + p.stderr


def test_cpp_work_errors(torch_module) -> None:
    p = run_one("errors", {})
    assert p.returncode == 0 and "PASS errors" in p.stdout, p.stdout + p.stderr


def tdist(n: int, device: str, env: Dict[str, str]) -> None:
    from test_tdist import ENV

    extra = {**ENV, **env, **({"SYMHEAP_BACKEND": "cuda"} if device == "cuda" else {})}
    p = launch(n, [sys.executable, PE, "all", device], env=extra, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"[PE {r}] WORK cpp" in p.stdout, out
        assert f"[PE {r}] PASS tdist" in p.stdout, out


@pytest.mark.parametrize("n", [1, 2])
def test_every_collective_with_cpp_work(cpp_work_env: Dict[str, str], n: int) -> None:
    """Every collective of pe_tdist.py through the C++ Work (its subgroups, at 3 and 4 ranks,
    make Works the same way and run with torch's Work in test_tdist.py)."""
    tdist(n, "cpu", cpp_work_env)


@pytest.mark.parametrize("n", [1, 2])
def test_every_collective_with_cpp_work_cuda(cpp_work_env: Dict[str, str], cuda_gpus: int, n: int) -> None:
    """Every collective on CUDA tensors, async Works waited for on another stream included."""
    tdist(n, "cuda", cpp_work_env)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Jobs:
    pytest.importorskip("torch")
    return Jobs(tmp_path_factory.mktemp("torch_programs_cpp_work"))


def test_programs_with_cpp_work_match_gloo(jobs: Jobs, cpp_work_env: Dict[str, str]) -> None:
    """DTensor, TP/SP, FSDP2, DDP (which waits on its buckets' futures) and compiled functional
    collectives over cpu:symheap with the C++ Work, 2 ranks, equal to gloo."""
    n = 2
    gloo, gtext = jobs.get(n, "cpu:gloo")
    ours, stext = jobs.get(n, "cpu:symheap", env=cpp_work_env)
    for check in AT[n]:
        passed(gloo, gtext, check, range(n))
        passed(ours, stext, check, range(n))
        same_values(ours, gloo, check, "gloo")


def test_cuda_programs_with_cpp_work(jobs: Jobs, cpp_work_env: Dict[str, str], cuda_gpus: int) -> None:
    """The same programs on CUDA tensors over cuda:symheap with the C++ Work, 2 ranks, held to
    their single-process references (and to NCCL's values with a GPU per rank)."""
    from test_torch_programs import CHECKS

    n = 2
    ours, stext = jobs.get(n, "cuda:symheap", CHECKS, env=cpp_work_env)
    for check in CHECKS:
        passed(ours, stext, check, range(n))
    if cuda_gpus >= n:
        nccl, ntext = jobs.get(n, "cuda:nccl", CHECKS)
        for check in CHECKS:
            same_values(ours, nccl, check, "nccl")
