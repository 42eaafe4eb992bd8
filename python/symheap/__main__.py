"""``python -m symheap ...``: the ``symheap`` command (see :mod:`symheap._cli`)."""

import sys

from ._cli import main

sys.exit(main())
