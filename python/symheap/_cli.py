"""The ``symheap`` command inside the Python package: ``symheap ...`` (the console script pip
installs) and ``python -m symheap ...`` run the same Rust command as a cargo-built binary
(``launch``, ``info``, ``selftest``, ``bench``, ``kernels``), with no Rust toolchain."""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``symheap ARGS...`` (default ``sys.argv[1:]``) and returns its exit status."""
    from . import _native

    args = sys.argv[1:] if argv is None else list(argv)
    # NVRTC and NVSHMEM come from pip wheels in this interpreter's site-packages.
    _native.set_python_search_path([p for p in sys.path if p])
    # The PEs that selftest and bench start run this same command again, through this Python.
    try:
        return _native.cli_main(["symheap", *args], [sys.executable, "-m", "symheap"])
    except KeyboardInterrupt:
        # The launcher forwarded the signal to the PEs and reported; Python saw it too.
        return 130


def console() -> None:
    """Entry point of the ``symheap`` console script."""
    sys.exit(main())
