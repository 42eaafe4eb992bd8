"""Checks that the Python package has no import circle, and that every import made inside a
function says why it is there.

    python3 scripts/check_py_cycles.py            # exit 1 on a circle or an unexplained import
    python3 scripts/check_py_cycles.py --list     # also print the graph and the deferred imports

The package (python/symheap) is read with ``ast``, never imported. Every import counts, wherever
it stands: at the top, inside a function, under ``if TYPE_CHECKING:`` (a dependency hidden in a
function is still a dependency; hiding a circle there is how circles survive). ``from . import
x`` is an edge to the submodule ``x`` when there is one, else to the package it names; the
implicit import of a parent package by its submodules is not an edge (Python runs the parent
first, so it never closes a circle). A compiled module is known by its stub (``_native.pyi``).

An import inside a function is allowed only to defer a heavy or optional dependency (torch,
Triton, NumPy, torch.distributed, a module that needs one of them), and must say so in a
comment on its line or on the line above; an import inside a function without one is reported.
Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PKG_DIR = ROOT / "python" / "symheap"
PKG = "symheap"


@dataclass(frozen=True)
class Edge:
    """One import: ``src`` imports ``dst`` at ``line`` of ``src``'s file."""

    src: str
    dst: str
    line: int
    deferred: bool  # inside a function


def module_name(path: Path, pkg_dir: Path, pkg: str) -> str:
    rel = path.relative_to(pkg_dir).with_suffix("")
    parts = [pkg, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def shown(path: Path, pkg_dir: Path) -> str:
    """``path`` as messages show it: from the checkout's root, else from the package's parent."""
    for base in (ROOT, pkg_dir.parent):
        try:
            return str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


def package_of(name: str, path: Path) -> str:
    """The package relative imports of module ``name`` start from."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def resolve(node: ast.AST, name: str, path: Path, modules: Set[str]) -> List[str]:
    """The modules of the package that import ``node`` (in module ``name``) loads."""
    out: List[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = alias.name
            # `import symheap.a.b` runs symheap.a.b: the longest prefix that is a module.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                out.append(target)
        return out
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = package_of(name, path)
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    if target not in modules:
        return out
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in modules else target)
    return out


def has_comment(lines: List[str], line: int) -> bool:
    """Whether the import at ``line`` (1-based) carries a comment: on its line, or on the line
    above it or above the run of imports it ends (one comment may explain a few imports)."""
    if "#" in lines[line - 1]:
        return True
    i = line - 2
    while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].strip().startswith("#")


class Walker(ast.NodeVisitor):
    """Collects the imports of one module with whether each stands inside a function."""

    def __init__(self) -> None:
        self.depth = 0
        self.found: List[Tuple[ast.AST, bool]] = []

    def _func(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _func
    visit_AsyncFunctionDef = _func
    visit_Lambda = _func

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self.depth > 0))


def graph(pkg_dir: Path, pkg: str) -> Tuple[Dict[str, Path], List[Edge], List[str]]:
    """(modules with their files, import edges, function-level imports without a comment)."""
    files = {module_name(p, pkg_dir, pkg): p for p in sorted(pkg_dir.rglob("*.py"))}
    # A compiled module (the extension) is known by its stub: a module, and a leaf of the graph.
    for stub in sorted(pkg_dir.rglob("*.pyi")):
        files.setdefault(module_name(stub, pkg_dir, pkg), stub)
    modules = set(files)
    edges: List[Edge] = []
    unexplained: List[str] = []
    for name, path in files.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        w = Walker()
        w.visit(ast.parse(text, filename=str(path)))
        for node, deferred in w.found:
            line = getattr(node, "lineno", 0)
            if deferred and not has_comment(lines, line):
                unexplained.append(f"{shown(path, pkg_dir)}:{line}: {lines[line - 1].strip()}")
            for dst in resolve(node, name, path, modules):
                if dst != name:
                    edges.append(Edge(name, dst, line, deferred))
    return files, edges, unexplained


def strongly_connected(nodes: List[str], succ: Dict[str, List[str]]) -> List[List[str]]:
    """Tarjan's components (iterative: no recursion limit to meet)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            nxt = succ.get(v, [])
            if i < len(nxt):
                work.append((v, i + 1))
                w = nxt[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def cycle_through(start: str, members: Set[str], by_src: Dict[str, List[Edge]]) -> List[Edge]:
    """The shortest circle through ``start`` inside one component, as its edges (breadth first)."""
    prev: Dict[str, Optional[Edge]] = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for e in by_src.get(v, []):
            if e.dst not in members:
                continue
            if e.dst == start:
                path = [e]
                while prev[path[0].src] is not None:
                    path.insert(0, prev[path[0].src])  # type: ignore[arg-type]
                return path
            if e.dst not in prev:
                prev[e.dst] = e
                queue.append(e.dst)
    return []


def circles(comp: List[str], by_src: Dict[str, List[Edge]]) -> List[List[Edge]]:
    """Circles covering every module of a component: breaking one may leave the others."""
    members, covered, out = set(comp), set(), []
    for start in sorted(comp):
        if start in covered:
            continue
        path = cycle_through(start, members, by_src)
        covered.update(e.src for e in path)
        out.append(path)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="print every edge and the function-level imports")
    p.add_argument("--package-dir", type=Path, default=PKG_DIR, help=f"the package (default {PKG_DIR})")
    args = p.parse_args(argv)
    pkg_dir = args.package_dir.resolve()
    files, edges, unexplained = graph(pkg_dir, pkg_dir.name)
    by_src: Dict[str, List[Edge]] = {}
    for e in edges:
        by_src.setdefault(e.src, []).append(e)
    succ = {m: sorted({e.dst for e in es}) for m, es in by_src.items()}
    if args.list:
        for e in edges:
            print(f"{e.src} -> {e.dst} (line {e.line}{', in a function' if e.deferred else ''})")
    failed = False
    for comp in strongly_connected(sorted(files), succ):
        if len(comp) < 2:
            continue
        failed = True
        for path in circles(comp, by_src):
            chain = " -> ".join([path[0].src, *(e.dst for e in path)])
            print(f"check_py_cycles: import circle {chain}", file=sys.stderr)
            for e in path:
                kind = " (inside a function)" if e.deferred else ""
                print(f"    {e.src} -> {e.dst}: {shown(files[e.src], pkg_dir)}:{e.line}{kind}", file=sys.stderr)
    for u in unexplained:
        failed = True
        print(f"check_py_cycles: an import inside a function without a comment saying why: {u}", file=sys.stderr)
    deferred = sum(1 for e in edges if e.deferred)
    if failed:
        return 1
    print(
        f"check_py_cycles: {len(files)} modules, {len(edges)} imports within the package "
        f"({deferred} inside functions), no circle",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
