"""The backend's asynchronous Work in C++ (optional, built once per torch version).

An asynchronous call of the ``symheap`` torch.distributed backend (``async_op=True``, and every
call torch's C++ makes: functional collectives, DTensor, FSDP2, DDP) returns a Work. Built from
Python, that Work is torch's CUDA future (an event created and destroyed per call, the value
pickled to find its tensors): about 7 µs of host time per call more than NCCL's C++ Work.
``symheap/distributed/_cpp_work.cpp`` is the same Work in C++: a pooled event recorded on the
collective's stream, ``wait()`` blocking only another stream, the future made only when asked.
It must be compiled against the torch it runs with, so the wheel cannot carry it:

* ``python -m symheap.distributed.cpp_work build`` compiles it (a C++20 compiler, ``c++`` or
  ``$CXX``, and Python's headers; 20-30 s) into symheap's cache directory
  (``SYMHEAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/symheap``, else ``~/.cache/symheap``), one
  file per torch build, source and Python; ``... status`` says what the backend uses and why.
* ``SYMHEAP_TORCH_WORK``: ``auto`` (default) uses the built module when there is one; when
  there is none, the first group of a process starts its build in the background (one compiler
  run for all the ranks of a machine, nothing waits for it, its output in ``<module>.log``
  beside it) and uses the Python Work until a later process finds the module built; a build
  that failed is not tried again by ``auto`` (``<module>.failed`` says why; the ``build``
  command tries again). ``build`` compiles it at first use when missing (every rank waits for
  one compiler run; a failure raises); ``off`` always uses the Python Work and never compiles.

Both Works behave the same (``wait`` orders the current stream after the collective's, no host
sync; ``is_completed`` True; ``get_future`` the outputs); only the host time differs.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from types import ModuleType
from typing import Any, Dict, List, Optional

import torch as _torch

from .. import _core
from .._native import SymheapError, SymheapUnsupportedError, SymheapValueError

MODULE = "symheap_torch_work"
ENV = "SYMHEAP_TORCH_WORK"
_MODULE_PATH = "symheap.distributed.cpp_work"  # not __name__, which is __main__ under -m
_BUILD = f"python -m {_MODULE_PATH} build"
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cpp_work.cpp")

# What load() decided, for status(): (module or None, reason).
_loaded: Optional[ModuleType] = None
_reason = "not loaded yet"


def _mode() -> str:
    mode = os.environ.get(ENV, "").strip().lower() or "auto"
    if mode not in ("auto", "build", "off"):
        raise SymheapValueError(f"{ENV}={mode!r}: expected auto, build or off")
    return mode


def _abi_flags() -> List[str]:
    """The flags that make the module's C++ and pybind11 ABI torch's own (what
    torch.utils.cpp_extension passes), so its Work is torch's registered Python type."""
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(bool(_torch._C._GLIBCXX_USE_CXX11_ABI))}"]
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(_torch._C, f"_PYBIND11_{name}", None)
        if value is not None:
            flags.append(f'-DPYBIND11_{name}="{value}"')
    return flags


def _command(out: str) -> List[str]:
    cxx = os.environ.get("CXX", "") or "c++"
    if shutil.which(cxx) is None:
        raise SymheapUnsupportedError(f"cpp_work: no C++ compiler ({cxx!r} is not on PATH; set CXX)")
    # torch's headers and libraries where its wheel puts them (what torch.utils.cpp_extension
    # names, without importing it: it needs setuptools, which a Python 3.12 venv lacks).
    root = os.path.dirname(os.path.abspath(_torch.__file__))
    include = os.path.join(root, "include")
    python_include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(python_include, "Python.h")):
        raise SymheapUnsupportedError(
            f"cpp_work: Python's headers are not installed (no Python.h in {python_include}; "
            "on Debian/Ubuntu the python3-dev package)"
        )
    includes = [include, os.path.join(include, "torch", "csrc", "api", "include"), python_include]
    libs = [os.path.join(root, "lib")]
    # C++20: torch 2.15's headers need it; the older ones (2.8 on) compile under it too.
    cmd = [cxx, "-O2", "-fPIC", "-shared", "-std=c++20", "-w", f"-DTORCH_EXTENSION_NAME={MODULE}"]
    cmd += ["-DTORCH_API_INCLUDE_EXTENSION_H", *_abi_flags()]
    cmd += [f"-I{d}" for d in includes] + [_SOURCE, "-o", out]
    cmd += [f"-L{d}" for d in libs] + [f"-Wl,-rpath,{d}" for d in libs]
    return cmd + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def path() -> str:
    """Where the module for this torch build, this source and this Python lives (it may not
    exist yet)."""
    h = hashlib.sha256()
    # The C++ source and this file (which holds the compiler's flags).
    for source in (_SOURCE, os.path.abspath(__file__)):
        with open(source, "rb") as f:
            h.update(f.read())
    for part in (_torch.__version__, str(_torch.version.git_version), sys.version, " ".join(_abi_flags())):
        h.update(b"\0" + part.encode())
    return os.path.join(_core.cache_dir(), "torch-work", h.hexdigest()[:20], MODULE + ".so")


def build(verbose: bool = False) -> str:
    """Compiles the module for this torch unless it is built already; returns its path. Several
    processes at once run the compiler once (a file lock). Raises
    :class:`symheap.SymheapUnsupportedError` without a compiler or without Python's headers,
    :class:`symheap.SymheapError` with the compiler's output when it fails."""
    out = path()
    if os.path.isfile(out):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(out):
            return out
        # A host name too: processes of several machines may share the cache (a network home).
        tmp = f"{out}.{socket.gethostname()}.{os.getpid()}.tmp"
        cmd = _command(tmp)
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            if os.path.exists(tmp):
                os.unlink(tmp)
            tail = (proc.stderr or proc.stdout)[-4000:]
            raise SymheapError(f"cpp_work: compiling {_SOURCE} failed ({cmd[0]} exit {proc.returncode}):\n{tail}")
        os.replace(tmp, out)
    # A failure an earlier background build left (the compiler since installed, say) is over.
    if os.path.exists(out + ".failed"):
        os.unlink(out + ".failed")
    return out


def _background_env() -> Dict[str, str]:
    """The build process's environment: the caller's, less what would make it one of the job's
    processes (symheap's launch and bootstrap variables; the build needs none of them)."""
    keep = ("SYMHEAP_CACHE_DIR", "SYMHEAP_LOG")
    return {k: v for k, v in os.environ.items() if not k.startswith("SYMHEAP_") or k in keep}


def start_background_build() -> str:
    """Starts ``build`` in a process of its own that outlives this one, unless the module is
    built, a build is running (any process using this cache), an earlier background build
    failed or it cannot compile here; returns what it did, in words (``status()``'s reason).
    Nothing waits for the build: this process keeps the Python Work, a later one loads it."""
    return _background(start=True)


def _background(start: bool) -> str:
    """:func:`start_background_build`; ``start`` False: only says what it would find."""
    out = path()
    if os.path.isfile(out + ".failed"):
        return f"its background build failed ({out}.failed; `{_BUILD}` tries again and says why)"
    try:
        _command(out)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        fd = os.open(out + ".spawn", os.O_CREAT | os.O_WRONLY, 0o644)
    except (SymheapError, OSError) as e:
        return f"not built, and it cannot be built here ({e})"
    try:
        # One build at a time: the lock passes to the build process and is held until it ends.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return f"being built in the background by another process ({out}.log)"
    if not start:
        os.close(fd)
        return f"not built (`{_BUILD}`; under auto a process's first group starts it)"
    try:
        with open(out + ".log", "a") as log:
            log.write(f"# {socket.gethostname()} pid {os.getpid()}: background build of {out}\n")
            log.flush()
            # Through sh, which leaves the build running and exits at once: the build is
            # nobody's child here (no zombie when it ends, no wait at this process's exit).
            argv = ["sh", "-c", '"$@" &', "sh", sys.executable, "-m", _MODULE_PATH, "build", "--background"]
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(fd,),
                start_new_session=True,
                env=_background_env(),
                check=True,
                timeout=30,
            )
    except (OSError, subprocess.SubprocessError) as e:
        return f"not built, and its background build did not start ({e})"
    finally:
        os.close(fd)
    return f"not built yet: building in the background ({out}.log), used from the next process on"


def _import(file: str) -> ModuleType:
    import torch.distributed  # noqa: F401  (registers the Work type the module returns)

    loader = importlib.machinery.ExtensionFileLoader(MODULE, file)
    spec = importlib.util.spec_from_file_location(MODULE, file, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load(background: bool = True) -> Optional[ModuleType]:
    """The module the backend's asynchronous Works come from, or None (then they are torch's
    future-backed Work), as ``SYMHEAP_TORCH_WORK`` says (see the module doc); ``background``
    False: ``auto`` starts no build (a query). The backend decides once per process."""
    global _loaded, _reason
    mode = _mode()
    if mode == "off":
        _loaded, _reason = None, f"{ENV}=off"
        return None
    file = path()
    if not os.path.isfile(file):
        if mode != "build":
            _loaded, _reason = None, f"torch {_torch.__version__}: {_background(start=background)}"
            return None
        file = build()
    try:
        _loaded, _reason = _import(file), f"built module {file}"
    except ImportError as e:
        if mode == "build":
            raise SymheapError(f"cpp_work: loading {file} failed: {e}") from e
        _loaded, _reason = None, f"the built module did not load ({e}); rebuild it"
    return _loaded


def status() -> Dict[str, Any]:
    """What the backend's asynchronous Works are: ``{"cpp": bool, "reason": str, "path": str,
    "built": bool, "mode": str}``."""
    file = path()
    return {"cpp": _loaded is not None, "reason": _reason, "path": file, "built": os.path.isfile(file), "mode": _mode()}


def _main(argv: List[str]) -> int:
    what = argv[0] if argv else "status"
    if what == "build":
        try:
            print(build(verbose="-v" in argv))
        except SymheapError as e:
            print(e, file=sys.stderr)
            if "--background" in argv:
                # auto does not try again after this (the build command does).
                with open(path() + ".failed", "w") as f:
                    f.write(f"{e}\n")
            return 1
        return 0
    if what == "status":
        load(background=False)
        for k, v in status().items():
            print(f"{k}: {v}")
        return 0
    print("usage: python -m symheap.distributed.cpp_work [build [-v] | status]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
