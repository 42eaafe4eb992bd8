"""``python -m symheap.launch -n N [--grace S] [--no-prefix] [--simulate-nodes K] [--] PROGRAM [ARGS...]``

Starts N PEs of PROGRAM on this machine, exactly like ``symheap launch`` (the same Rust
launcher): each PE gets a torchrun-style environment and a fresh job token, output lines are
prefixed with ``[PE r]``, Ctrl-C is forwarded, and when one PE fails the others are stopped
after a grace period and a summary names the PE that failed first. The exit status is the first
failure's (128+signal if killed), else 0. A PROGRAM ending in ``.py`` runs with this Python.
``--simulate-nodes K`` splits the PEs into K simulated nodes that share no memory (what crosses
nodes, tested on one machine), as ``symheap launch --simulate-nodes`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from ._native import SymheapError
from ._native import launch as _launch


def main(argv: Optional[List[str]] = None) -> int:
    """Parses ``argv`` (default ``sys.argv[1:]``), launches, returns the exit status."""
    p = argparse.ArgumentParser(
        prog="python -m symheap.launch",
        description="Start N PEs of PROGRAM on this machine with a torchrun-style environment.",
    )
    p.add_argument("-n", "--nproc", type=int, default=1, help="number of PEs (default 1)")
    p.add_argument(
        "--grace",
        type=float,
        default=3.0,
        help="seconds the other PEs get to exit after one fails (then SIGTERM, then SIGKILL)",
    )
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with [PE r]")
    p.add_argument(
        "--simulate-nodes",
        type=int,
        default=None,
        metavar="K",
        help="split the PEs into K simulated nodes sharing no memory (default SYMHEAP_SIMULATE_NODES)",
    )
    p.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    prog = list(args.program)
    if prog and prog[0] == "--":
        prog = prog[1:]
    if not prog:
        p.error("a program to run is required")
    if args.nproc < 1:
        p.error("-n must be at least 1")
    if prog[0].endswith(".py"):
        prog = [sys.executable] + prog
    elif prog[0] in ("python", "python3"):
        prog[0] = sys.executable
    if args.simulate_nodes is not None:
        # The launcher reads it; the PEs get their node identities from the launcher.
        os.environ["SYMHEAP_SIMULATE_NODES"] = str(args.simulate_nodes)
    try:
        return _launch(args.nproc, prog[0], prog[1:], grace=args.grace, prefix_output=not args.no_prefix)
    except SymheapError as e:
        print(f"symheap launch: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
