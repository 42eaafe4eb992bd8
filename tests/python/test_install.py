"""What a pip user gets: the ``symheap`` command inside the package (``python -m symheap`` is the
console script's code path), and NVRTC found in this interpreter's site-packages with no
``LD_LIBRARY_PATH`` and no ``SYMHEAP_NVRTC_LIB``, or a message naming every place looked."""

from __future__ import annotations

import os
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
