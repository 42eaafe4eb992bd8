"""Cold first run on a GPU machine: the time from ``symheap.init()`` to the end of the first
all_reduce, per PE, with an empty kernel cache. Run it under the launcher as the first GPU
program on a fresh machine (the GPU suite does):

    python -m symheap.launch -n N -- python scripts/cold_start.py OUT.json [LABEL]

Prints one line per PE and, on PE 0, the init breakdown from the banner (rendezvous, node,
probe = the driver's cuInit, backend = device/context/kernels, first chunk...), and appends a
JSON row per PE to OUT.json. ``import torch`` is timed apart: it is not symheap's cost.
"""

import json
import os
import sys
import time

t_torch0 = time.perf_counter()
import torch  # noqa: E402

t_torch = time.perf_counter() - t_torch0


def main() -> None:
    out, label = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cold")
    t0 = time.perf_counter()
    import symheap
    import symheap.torch as st

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    symheap.init()
    t_init = time.perf_counter() - t1
    me, n = symheap.my_pe(), symheap.n_pes()
    t2 = time.perf_counter()
    x = st.full((4096,), float(me + 1), dtype=torch.bfloat16)
    symheap.all_reduce(x)
    torch.cuda.synchronize()
    t_first = time.perf_counter() - t2
    want = float(n * (n + 1) // 2)
    ok = bool((x.float() == want).all().item())
    banner = symheap.banner()
    breakdown = [ln.strip() for ln in banner.splitlines() if ln.strip().startswith(("init", "backend"))]
    row = {
        "label": label,
        "pe": me,
        "n_pes": n,
        "import_torch_s": round(t_torch, 3),
        "import_symheap_s": round(t_import, 3),
        "init_s": round(t_init, 3),
        "first_all_reduce_s": round(t_first, 3),
        "init_plus_first_s": round(t_init + t_first, 3),
        "correct": ok,
        "breakdown": breakdown,
        "cache_dir": os.environ.get("SYMHEAP_CACHE_DIR", ""),
    }
    print(
        f"{label} PE {me}/{n}: import torch {t_torch:.2f} s (not symheap's), import symheap {t_import:.3f} s, "
        f"init {t_init:.3f} s, first all_reduce {t_first:.3f} s, init + first = {t_init + t_first:.3f} s, "
        f"{'correct' if ok else 'WRONG SUM'}"
    )
    if me == 0:
        for ln in breakdown:
            print(f"  {ln}")
    symheap.barrier_all()
    for r in range(n):
        if r == me:
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
        symheap.barrier_all()
    symheap.finalize()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
