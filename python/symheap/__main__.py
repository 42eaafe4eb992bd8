"""``python -m symheap ...``: the ``symheap`` command (see :mod:`symheap._cli`)."""

from ._cli import console

console()
