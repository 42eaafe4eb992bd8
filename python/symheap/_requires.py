"""The ImportError of a missing optional dependency (PyTorch, Triton): it names the module that
needs it and the command that installs it, ``pip install "symheap[torch]"`` or
``pip install "symheap[triton]"``. ``import symheap`` itself needs neither."""

from __future__ import annotations

from typing import NoReturn

_WHAT = {
    "torch": ("PyTorch", 'pip install "symheap[torch]"'),
    "triton": ("Triton", 'pip install "symheap[triton]" (or pip install "symheap[torch]", whose torch brings it)'),
}


def reraise(e: ImportError, package: str, module: str) -> NoReturn:
    """Raises the ImportError for ``module`` (a symheap module) when importing ``package``
    failed with ``e``: one naming the install command when ``package`` is not installed, ``e``
    itself when it is installed but failed to import (a broken install says so in its own
    words)."""
    if e.name is not None and e.name != package and not e.name.startswith(package + "."):
        raise e
    name, cmd = _WHAT[package]
    raise ImportError(
        f"{module} needs {name}, which is not installed: {cmd} (the rest of symheap works without it)",
        name=package,
    ) from e
