"""PE-side test cases, run under the launcher by the test_*.py modules:

    python -m symheap.launch -n N -- python tests/python/pe_cases.py CASE [CASE...]

Each case checks exact expected values on random data (seeded by the case name, the same on
every PE) and prints ``PASS CASE`` when it succeeds; a failure raises, so the PE exits non-zero
and the launcher stops the job. Not collected by pytest (no test_ prefix).

The cases live in pe_host_cases.py (the NumPy front) and pe_torch_cases.py (the PyTorch front),
sharing the registry and helpers of pe_common.py; this script runs the named ones.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pe_alias_cases  # noqa: E402, F401 (registers its cases)
import pe_fused_cases  # noqa: E402, F401 (registers its cases)
import pe_gemm_cases  # noqa: E402, F401 (registers its cases)
import pe_host_cases  # noqa: E402, F401 (registers its cases)
import pe_moe_cases  # noqa: E402, F401 (registers its cases)
import pe_team_cases  # noqa: E402, F401 (registers its cases)
import pe_torch_cases  # noqa: E402, F401 (registers its cases)
import pe_torch_ops_cases  # noqa: E402, F401 (registers its cases)
import symheap  # noqa: E402
from pe_common import CASES, OWN_INIT, POISONED, env_rank  # noqa: E402
from symheap import SymheapError  # noqa: E402


def main(argv) -> int:
    names = argv[1:]
    if os.environ.get("PE_CASES_NODE_PER_PE"):
        # Every PE its own node: no shared memory between PEs, only the network paths.
        os.environ["SYMHEAP_NODE_ID"] = f"pe-cases-node-{env_rank()[0]}"
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"unknown cases: {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    for name in names:
        if name not in OWN_INIT and not symheap.is_initialized():
            symheap.init()
        CASES[name]()
        print(f"PASS {name}", flush=True)
    try:
        symheap.finalize()
    except SymheapError:
        if not POISONED.intersection(names):
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
