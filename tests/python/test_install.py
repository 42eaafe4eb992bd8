"""What a pip user gets: the ``symheap`` command inside the package (``python -m symheap`` is the
console script's code path), and NVRTC found in this interpreter's site-packages with no
``LD_LIBRARY_PATH`` and no ``SYMHEAP_NVRTC_LIB``, or a message naming every place looked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env


def _symheap(*args: str, env=None) -> subprocess.CompletedProcess:
    e = clean_env(env)
    e.pop("SYMHEAP_NVRTC_LIB", None)
    e.pop("LD_LIBRARY_PATH", None)
    # Only this interpreter knows where its site-packages are: no python3 on PATH to ask.
    e["PATH"] = "/usr/bin:/bin"
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "symheap", *args], env=e, capture_output=True, text=True, timeout=120, cwd="/"
    )


def _site_nvrtc() -> Path:
    try:
        import nvidia
    except ImportError:
        pytest.fail("the test venv must hold nvidia-cuda-nvrtc (torch depends on it)")
    for root in nvidia.__path__:
        p = Path(root) / "cu13" / "lib" / "libnvrtc.so.13"
        if p.is_file():
            return p
    pytest.fail("nvidia-cuda-nvrtc 13 is not in this interpreter's site-packages")


def test_the_command_runs_from_the_package() -> None:
    r = _symheap("--version")
    assert r.returncode == 0 and r.stdout.startswith("symheap "), r.stdout + r.stderr
    r = _symheap("info")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PE 0 of 1" in r.stdout, r.stdout


def test_nvrtc_is_found_in_site_packages() -> None:
    want = _site_nvrtc()
    r = _symheap("info")
    assert r.returncode == 0, r.stdout + r.stderr
    line = next((ln for ln in r.stdout.splitlines() if "kernels" in ln and "NVRTC" in ln), "")
    assert f"NVRTC 13.0 at {want}" in line, r.stdout


def test_a_wrong_nvrtc_setting_is_named() -> None:
    r = _symheap("info", env={"SYMHEAP_NVRTC_LIB": "/nonexistent/libnvrtc.so.13"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "/nonexistent/libnvrtc.so.13 (SYMHEAP_NVRTC_LIB): no such file" in r.stdout, r.stdout
    assert "pip install nvidia-cuda-nvrtc" in r.stdout, r.stdout


def test_usage_errors_exit_2_and_help_exits_0() -> None:
    r = _symheap("no-such-subcommand")
    assert r.returncode == 2 and "no-such-subcommand" in r.stderr, r.stdout + r.stderr
    r = _symheap("--help")
    assert r.returncode == 0 and "launch" in r.stdout, r.stdout + r.stderr


def test_console_script_is_installed_next_to_the_interpreter() -> None:
    script = Path(sys.executable).parent / "symheap"
    assert script.is_file() and os.access(script, os.X_OK), f"no symheap console script at {script}"
    e = clean_env()
    r = subprocess.run(
        [str(script), "launch", "-n", "2", "--", str(script), "info"],
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[PE 1] symheap" in r.stdout and "PE 1 of 2" in r.stdout, r.stdout


def test_the_extension_module_does_not_carry_the_command() -> None:
    # The self-test scenarios and the benchmark PEs (NCCL and MPI peers) live in the `symheap`
    # executable the package carries, not in the module every `import symheap` loads.
    import symheap
    from symheap import _cli, _native

    assert not hasattr(_native, "cli_main")
    exe = _cli.command_path()
    assert exe is not None and Path(exe).parent == Path(symheap.__file__).parent / "_bin", exe
    native, command = Path(_native.__file__).read_bytes(), Path(exe).read_bytes()
    for marker in (b"selftest-pe", b"bench-pe-gpu", b"coll-nodes-nccl"):
        assert marker in command, marker
        assert marker not in native, f"{_native.__file__} carries the command's {marker.decode()}"


def test_selftest_runs_from_the_console_script() -> None:
    script = Path(sys.executable).parent / "symheap"
    r = subprocess.run(
        [str(script), "selftest", "--pes", "1,2", "--only", "contract"],
        env=clean_env({"SYMHEAP_BACKEND": "host"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "2 of 2 runs passed" in r.stdout, r.stdout + r.stderr


def test_a_package_without_the_executable_still_launches() -> None:
    # What `pip install .` gives (no executable in the package): `symheap launch` through the
    # extension's launcher, and a message naming where the other subcommands come from.
    code = "import sys, symheap._cli as c; c.command_path = lambda: None; sys.exit(c.main(sys.argv[1:]))"
    run = [sys.executable, "-c", code]
    r = subprocess.run([*run, "info"], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "cargo install --path crates/symheap-cli" in r.stderr, r.stdout + r.stderr
    pe = [sys.executable, "-c", "import os; print('rank', os.environ['RANK'])"]
    argv = [*run, "launch", "-n", "2", "--", *pe]
    r = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[PE 0] rank 0" in r.stdout and "[PE 1] rank 1" in r.stdout, r.stdout


def test_extras_give_each_cuda_major_its_nvrtc_and_nvshmem() -> None:
    # `symheap[cu12]` for a CUDA 12 driver, `symheap[cu13]` for CUDA 13; `cuda` stays an alias
    # of CUDA 13's NVRTC for those who installed it by that name.
    import importlib.metadata as md

    meta = md.metadata("symheap")
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"cu12", "cu13", "cuda", "nvshmem"} <= extras, extras

    def wants(extra: str) -> set:
        reqs = [r for r in meta.get_all("Requires-Dist") or [] if f"extra == '{extra}'" in r.replace('"', "'")]
        return {re.match(r"[A-Za-z0-9._-]+", r).group(0) for r in reqs}

    assert wants("cu12") == {"nvidia-cuda-nvrtc-cu12", "nvidia-nvshmem-cu12"}, wants("cu12")
    assert wants("cu13") == {"nvidia-cuda-nvrtc", "nvidia-nvshmem-cu13"}, wants("cu13")
    assert wants("cuda") == {"nvidia-cuda-nvrtc"}, wants("cuda")
