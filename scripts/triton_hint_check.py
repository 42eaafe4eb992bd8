#!/usr/bin/env python3
"""Does ``hint`` give back 16-byte vector accesses through a translated pointer? (no GPU needed)

Compiles small Triton kernels that store (and load) a contiguous fp32 block for sm_90 with
``triton.compile`` (Triton compiles without a GPU), then reads the width of every global store
and load from the PTX and from the SASS (``nvdisasm``/``cuobjdump`` shipped inside the Triton
wheel). Variants: a plain local store (the baseline: a kernel pointer argument is known to be
16-byte aligned), ``symheap.triton.store`` / ``put`` / ``load`` through the peer table without a
hint, and with ``hint=4`` / ``hint=16``.

    python3 scripts/triton_hint_check.py [--arch 90] [--block 1024]

Prints a table ``variant | PTX | SASS`` where each cell lists the access widths found (e.g.
``st.v4.b32 x2`` = two 16-byte vector stores per thread; ``STG.E.128``). Used by
tests/python/test_triton_compile.py. Needs ``pip install triton``; uses the installed
``symheap.triton`` or, without the symheap package, python/symheap/triton.py of this checkout.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[1]


def _load_symheap_triton() -> Any:
    try:
        import symheap.triton as sh

        return sh
    except ImportError:
        pass
    path = ROOT / "python" / "symheap" / "triton.py"
    spec = importlib.util.spec_from_file_location("symheap_triton_checkout", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


sh = _load_symheap_triton()


@triton.jit
def local_store_kernel(x, y, bases, me, pe, BLOCK: tl.constexpr, HINT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs))


@triton.jit
def store_kernel(x, y, bases, me, pe, BLOCK: tl.constexpr, HINT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sh.store(y + offs, tl.load(x + offs), me, pe, bases, hint=HINT)


@triton.jit
def put_kernel(x, y, bases, me, pe, BLOCK: tl.constexpr, HINT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sh.put(x + offs, y + offs, me, pe, bases, hint=HINT)


@triton.jit
def load_kernel(x, y, bases, me, pe, BLOCK: tl.constexpr, HINT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, sh.load(x + offs, me, pe, bases, hint=HINT))


SIGNATURE = {
    "x": "*fp32",
    "y": "*fp32",
    "bases": "*i64",
    "me": "i32",
    "pe": "i32",
    "BLOCK": "constexpr",
    "HINT": "constexpr",
}
# What a launch would specialise: x, y and bases 16-byte aligned (torch allocations are).
ATTRS = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}

VARIANTS: List[Tuple[str, Any, Optional[int], str]] = [
    # name, kernel, hint, which accesses to report ("st" or "ld" of the translated pointer)
    ("local tl.store (baseline)", local_store_kernel, None, "st"),
    ("sh.store, no hint", store_kernel, None, "st"),
    ("sh.store, hint=4", store_kernel, 4, "st"),
    ("sh.store, hint=16", store_kernel, 16, "st"),
    ("sh.put, no hint", put_kernel, None, "st"),
    ("sh.put, hint=16", put_kernel, 16, "st"),
    ("sh.load, no hint", load_kernel, None, "ld"),
    ("sh.load, hint=16", load_kernel, 16, "ld"),
]


def compile_kernel(fn: Any, hint: Optional[int], block: int, arch: int = 90) -> Any:
    """The compiled kernel (``.asm['ptx']``, ``.asm['cubin']``) for ``cuda:arch``."""
    src = ASTSource(fn=fn, signature=SIGNATURE, constexprs={"BLOCK": block, "HINT": hint}, attrs=ATTRS)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})


_PTX_RE = re.compile(r"^\s*(?:@%p\d+\s+)?(st|ld)\.global((?:\.[a-z0-9_]+)*)\s")


def ptx_widths(ptx: str, op: str) -> Counter:
    """``Counter`` of the global ``op`` ("st"/"ld") instructions of the PTX by shape, e.g.
    ``st.v4.b32`` (16 bytes) or ``st.b32`` (4 bytes); the 8-byte table loads are left out."""
    out: Counter = Counter()
    for line in ptx.splitlines():
        m = _PTX_RE.match(line)
        if not m or m.group(1) != op:
            continue
        mods = [s for s in m.group(2).split(".") if s]
        vec = next((s for s in mods if s.startswith("v") and s[1:].isdigit()), "")
        ty = next((s for s in mods if re.fullmatch(r"[bsuf](8|16|32|64)", s)), "?")
        if op == "ld" and ty in ("b64", "u64", "s64") and not vec:
            continue  # a table entry
        out[".".join(p for p in (op, vec, ty) if p)] += 1
    return out


def _tool(name: str) -> Optional[str]:
    here = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if here.exists():
        return str(here)
    return shutil.which(name)


def sass_of(cubin: bytes) -> Optional[str]:
    """The SASS of ``cubin`` from nvdisasm (or cuobjdump -sass), None when neither runs."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        for tool, args in (("nvdisasm", []), ("cuobjdump", ["-sass"])):
            exe = _tool(tool)
            if exe is None:
                continue
            p = subprocess.run([exe, *args, path], capture_output=True, text=True)
            if p.returncode == 0 and p.stdout:
                return p.stdout
    return None


_SASS_RE = re.compile(r"\b(STG|LDG)(\.E)?((?:\.[A-Z0-9_]+)*)")


def sass_widths(sass: str, op: str) -> Counter:
    """``Counter`` of STG ("st") or LDG ("ld") instructions by width suffix (``STG.E.128``,
    ``STG.E`` = 32-bit); 64-bit LDGs (table entries) are left out of "ld"."""
    want = "STG" if op == "st" else "LDG"
    out: Counter = Counter()
    for m in _SASS_RE.finditer(sass):
        if m.group(1) != want:
            continue
        mods = [
            s
            for s in m.group(3).split(".")
            if s and s not in ("CONSTANT", "STRONG", "SYS", "GPU", "EF", "EL", "LU", "NA")
        ]
        width = next((s for s in mods if s.isdigit()), "")
        if op == "ld" and width == "64":
            continue
        out[m.group(1) + (m.group(2) or "") + ("." + width if width else "")] += 1
    return out


def max_bytes(c: Counter) -> int:
    """The widest access in a ``ptx_widths``/``sass_widths`` counter, in bytes (0: none)."""
    best = 0
    for key in c:
        m = re.search(r"\.v(\d)\.[bsuf](\d+)$", key)
        if m:
            best = max(best, int(m.group(1)) * int(m.group(2)) // 8)
            continue
        m = re.search(r"\.[bsuf](\d+)$", key)
        if m:
            best = max(best, int(m.group(1)) // 8)
            continue
        m = re.search(r"\.(\d+)$", key)
        best = max(best, int(m.group(1)) // 8 if m else 4)
    return best


def fmt(c: Counter) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items())) or "-"


def check(block: int = 1024, arch: int = 90) -> List[Dict[str, Any]]:
    """One row per variant: name, hint, PTX/SASS counters and widest access in bytes."""
    rows = []
    for name, fn, hint, op in VARIANTS:
        k = compile_kernel(fn, hint, block, arch)
        ptx = ptx_widths(k.asm["ptx"], op)
        sass_text = sass_of(k.asm["cubin"])
        sass = sass_widths(sass_text, op) if sass_text is not None else None
        rows.append(
            {
                "variant": name,
                "hint": hint,
                "op": op,
                "ptx": ptx,
                "ptx_bytes": max_bytes(ptx),
                "sass": sass,
                "sass_bytes": max_bytes(sass) if sass is not None else None,
            }
        )
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--block", type=int, default=1024)
    a = ap.parse_args(argv)
    rows = check(a.block, a.arch)
    print(f"triton {triton.__version__}, sm_{a.arch}, fp32 block of {a.block}, 4 warps")
    print("| variant | PTX (per thread) | widest | SASS | widest |")
    print("|---|---|---|---|---|")
    for r in rows:
        sass = fmt(r["sass"]) if r["sass"] is not None else "(no nvdisasm)"
        sb = f"{r['sass_bytes']} B" if r["sass_bytes"] is not None else "-"
        print(f"| {r['variant']} | {fmt(r['ptx'])} | {r['ptx_bytes']} B | {sass} | {sb} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
