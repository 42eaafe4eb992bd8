"""The ``symheap`` command inside the Python package: ``symheap ...`` (the console script pip
installs) and ``python -m symheap ...`` run the ``symheap`` executable that the wheel carries in
``symheap/_bin`` (``launch``, ``info``, ``selftest``, ``bench``, ``kernels``; the same program as
a cargo build of ``crates/symheap-cli``), with no Rust toolchain. The executable is separate
from the extension module, so ``import symheap`` loads none of the command's self-test scenarios
and benchmarks.

A package built from source (``pip install .``, ``maturin develop``) carries no executable:
there ``symheap launch`` runs :mod:`symheap.launch` (the same Rust launcher) and the other
subcommands say where to get the command."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Optional

# What the executable learns from this interpreter (read by crates/symheap-cli/src/selfcmd.rs):
# the interpreter itself (it draws `bench --png` charts) and its sys.path (where NVIDIA's pip
# wheels, NVRTC, NCCL and NVSHMEM, are found). The PEs that selftest and bench start inherit both.
_PYTHON_VAR = "SYMHEAP_PYTHON"
_PYTHON_PATH_VAR = "SYMHEAP_PYTHON_PATH"


def command_path() -> Optional[str]:
    """The ``symheap`` executable this package carries, or None when it was built without one."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "symheap")
    return exe if os.path.isfile(exe) and os.access(exe, os.X_OK) else None


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env[_PYTHON_VAR] = sys.executable
    env[_PYTHON_PATH_VAR] = os.pathsep.join(p for p in sys.path if p)
    return env


def _without_executable(args: List[str]) -> int:
    """What a package built from source does: ``launch`` through the extension's launcher, the
    rest a message naming where the command comes from."""
    if args[:1] == ["launch"]:
        # The launcher needs the extension module, which the `symheap` command loads only here.
        from .launch import main as launch_main

        return launch_main(args[1:])
    print(
        "symheap: this installation of the symheap package has no `symheap` executable (a package "
        "built from source by `pip install .` or `maturin develop` carries only the Python module; "
        "`symheap launch` and `python -m symheap.launch` still work). For info, selftest, bench and "
        "kernels install the release wheel (scripts/build_wheel.sh builds it) or run a cargo build "
        "of the command: `cargo install --path crates/symheap-cli`.",
        file=sys.stderr,
    )
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``symheap ARGS...`` (default ``sys.argv[1:]``) in a child process and returns its
    exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    exe = command_path()
    if exe is None:
        return _without_executable(args)
    try:
        return subprocess.call([exe, *args], env=_env())
    except KeyboardInterrupt:
        # The launcher forwarded the signal to the PEs and reported; Python saw it too.
        return 130


def console() -> None:
    """Entry point of the ``symheap`` console script and of ``python -m symheap``: replaces this
    interpreter by the executable, so signals and the exit status are the command's own."""
    args = sys.argv[1:]
    exe = command_path()
    if exe is None:
        sys.exit(_without_executable(args))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(exe, [exe, *args], _env())
