#!/usr/bin/env python3
"""Import circles between the files of each Rust crate: reports every one, exit status 1.

    scripts/check_rs_cycles.py [--edges] [CRATE_DIR ...]     (default: every crates/*)

The graph has one node per source file of a crate (`src/lib.rs` or `src/main.rs` and the
modules they declare; `#[cfg(test)]` modules and items are left out: tests may reach anywhere).
A file depends on another when it names an item defined there:

- through a `use` of `crate::`, `super::`, `self::` or a child module's path (a `use` of a
  module only makes a name: what the file then names through it counts);
- through a path in its code that starts so (`crate::a::B`, `super::b::f()`, `child::C`), or
  through a module or item name a `use` brought in.

A path names the file of the deepest module it reaches, or, when the item there is imported
into that module (`pub use`, as a `mod.rs` facade re-exports its children's items, or a plain
`use`, which children see through `super::`), the file that defines it. A `pub use` is not a
dependency of the file that makes it unless that file names the item itself. Method calls and
trait impls are invisible to this (no type checking): a circle through them is not found.

Python 3 standard library only. `--edges` prints every dependency with where it was seen.
"""

import argparse
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Circles allowed for now, each as the set of files it may span (a circle inside one of these
# sets passes; one that grows out of it fails). Empty: the collective pipeline's circle (issue
# 41) was broken by moving `Params` into ops/coll/params.rs and the engines' transports into
# ops/coll/transport/. Do not add to it: break a new circle instead.
ALLOWED = []

KEYWORDS_ITEM = {"fn", "struct", "enum", "trait", "type", "const", "static", "union"}


# ---------------------------------------------------------------------------------------------
# Tokens: identifiers, `::`, single punctuation and string placeholders, with line numbers.
# Comments (doc comments too: an intra-doc link is not a dependency), string and char
# literals and lifetimes are dropped; a string is kept as one STR token holding its text.

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<lc>//[^\n]*)
  | (?P<bc>/\*)
  | (?P<raw>(?:br|r|cr)(?P<hashes>\#*)")
  | (?P<str>(?:b|c)?"(?:\\.|[^"\\])*")
  | (?P<chr>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])')
  | (?P<life>'[A-Za-z_]\w*)
  | (?P<rawid>r\#[A-Za-z_]\w*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<num>\d[\w.]*)
  | (?P<path>::)
  | (?P<p>.)
    """,
    re.X | re.S,
)


def tokenize(text):
    """[(kind, value, line)], kind in id, ::, p (punctuation), str."""
    out = []
    i, line, n = 0, 1, len(text)
    while i < n:
        m = TOKEN.match(text, i)
        kind = m.lastgroup if m.lastgroup != "hashes" else "raw"
        s = m.group(0)
        if kind == "bc":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            s = text[i:j]
        elif kind == "raw":
            end = '"' + m.group("hashes")
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            s = text[i:j]
            out.append(("str", s[s.index('"') + 1 : -len(end)], line))
        elif kind == "str":
            out.append(("str", s[s.index('"') + 1 : -1], line))
        elif kind in ("id", "rawid"):
            out.append(("id", s[2:] if kind == "rawid" else s, line))
        elif kind == "path":
            out.append(("::", s, line))
        elif kind == "p":
            out.append(("p", s, line))
        line += s.count("\n")
        i += len(s)
    return out


# ---------------------------------------------------------------------------------------------
# Parsing one file: its modules (inline ones too), what each defines, imports and names.


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of names below the crate root
        self.file = file  # the file it lives in (inline modules: their parent's)
        self.children = {}  # name -> module path
        self.defs = set()  # names of items defined here
        self.imports = {}  # local name -> (absolute-ish path, line, public)
        self.globs = []  # (path, line, public)
        self.refs = []  # (path tuple, line, text) named in code
        self.dir = None  # where `mod x;` of this module looks for x


def match_brace(toks, i):
    """Index after the bracket group opening at toks[i]."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = [pairs[toks[i][1]]]
    i += 1
    while i < len(toks) and stack:
        k, v, _ = toks[i]
        if k == "p" and v in pairs:
            stack.append(pairs[v])
        elif k == "p" and v == stack[-1]:
            stack.pop()
        i += 1
    return i


def skip_item(toks, i):
    """Index after the item starting at toks[i] (ends at `;` or a top-level `{...}`)."""
    while i < len(toks):
        k, v, _ = toks[i]
        if k == "p" and v in "([":
            i = match_brace(toks, i)
            continue
        if k == "p" and v == "{":
            return match_brace(toks, i)
        if k == "p" and v == ";":
            return i + 1
        i += 1
    return i


def is_test_cfg(attr):
    """Whether an attribute's tokens are `cfg(...)` true only under test."""
    vals = [v for _, v, _ in attr]
    return bool(vals) and vals[0] == "cfg" and "test" in vals and "not" not in vals


def parse_use_tree(toks, i, prefix, out):
    """Parses a use tree at toks[i]; appends (path, alias or None or '*', line); returns the
    index after it."""
    path = list(prefix)
    line = toks[i][2] if i < len(toks) else 0
    if i < len(toks) and toks[i][0] == "::":
        path.append("::")  # a global path: another crate
        i += 1
    while i < len(toks):
        k, v, ln = toks[i]
        if k == "id":
            path.append(v)
            line = ln
            i += 1
            if i < len(toks) and toks[i][0] == "::":
                i += 1
                continue
            if i + 1 < len(toks) and toks[i] == ("id", "as", toks[i][2]):
                out.append((tuple(path), toks[i + 1][1], line))
                return i + 2
            out.append((tuple(path), None, line))
            return i
        if k == "p" and v == "*":
            out.append((tuple(path), "*", ln))
            return i + 1
        if k == "p" and v == "{":
            i += 1
            while i < len(toks) and toks[i][1] != "}":
                if toks[i][1] == ",":
                    i += 1
                    continue
                i = parse_use_tree(toks, i, path, out)
            return i + 1
        return i + 1
    return i


def parse_file(crate, file, modpath, mods, moddir, toks=None):
    """Adds the modules of `file` (module `modpath`) to `mods`; returns the declared file
    modules as (modpath, file) to parse next."""
    if toks is None:
        with open(file, encoding="utf-8") as f:
            toks = tokenize(f.read())
    pending = []
    root = Module(modpath, file)
    root.dir = moddir
    mods[modpath] = root
    # Stack of (module, brace depth at which its items sit).
    stack = [(root, 0)]
    depth = 0
    attrs = []
    i = 0
    while i < len(toks):
        k, v, ln = toks[i]
        mod, base = stack[-1]
        if k == "p" and v == "#":
            j = i + 1
            if j < len(toks) and toks[j][1] == "!":
                j += 1
            if j < len(toks) and toks[j][1] == "[":
                end = match_brace(toks, j)
                attrs.append(toks[j + 1 : end - 1])
                i = end
                continue
        at_item = depth == base
        if k == "p" and v == "{":
            depth += 1
            i += 1
            continue
        if k == "p" and v == "}":
            depth -= 1
            if len(stack) > 1 and depth < stack[-1][1]:
                stack.pop()
            i += 1
            attrs = []
            continue
        if any(is_test_cfg(a) for a in attrs) and at_item and k == "id":
            attrs = []
            i = skip_item(toks, i)
            continue
        # Visibility.
        public = False
        j = i
        if k == "id" and v == "pub":
            public = True
            j += 1
            if j < len(toks) and toks[j][1] == "(":
                j = match_brace(toks, j)
        kj, vj, _ = toks[j] if j < len(toks) else (None, None, None)
        if kj == "id" and vj == "use":
            items = []
            end = parse_use_tree(toks, j + 1, (), items)
            while end < len(toks) and toks[end][1] != ";":
                end += 1
            for path, alias, line in items:
                if alias == "*":
                    mod.globs.append((path, line, public))
                    continue
                if path and path[-1] == "self":
                    path = path[:-1]
                name = alias or (path[-1] if path else None)
                if name and name != "_":
                    mod.imports[name] = (path, line, public)
                elif path:
                    # `use x as _`: a trait brought in for its methods.
                    mod.refs.append((path, line, "use " + "::".join(path) + " as _"))
            i = end + 1
            attrs = []
            continue
        if kj == "id" and vj == "mod" and j + 2 < len(toks) and at_item:
            name = toks[j + 1][1]
            nxt = toks[j + 2][1]
            child = mod.path + (name,)
            mod.children[name] = child
            if nxt == ";":
                given = None
                for a in attrs:
                    vals = [t for t in a]
                    if vals and vals[0][1] == "path":
                        given = next((t[1] for t in vals if t[0] == "str"), None)
                if given:
                    target = os.path.join(os.path.dirname(file), given)
                    cdir = os.path.dirname(target)
                else:
                    a = os.path.join(mod.dir, name + ".rs")
                    b = os.path.join(mod.dir, name, "mod.rs")
                    target = a if os.path.exists(a) else b
                    cdir = os.path.join(mod.dir, name)
                pending.append((child, target, cdir))
                i = j + 3
            else:
                m = Module(child, file)
                m.dir = os.path.join(mod.dir, name)
                mods[child] = m
                depth += 1
                stack.append((m, depth))
                i = j + 3
            attrs = []
            continue
        if at_item and kj == "id" and vj in KEYWORDS_ITEM and j + 1 < len(toks):
            nk, nv, _ = toks[j + 1]
            if nk == "id" and not (vj == "const" and nv == "fn"):
                mod.defs.add(nv)
            elif vj == "const" and nv == "fn" and j + 2 < len(toks):
                mod.defs.add(toks[j + 2][1])
        if k == "id" and v == "macro_rules" and i + 2 < len(toks):
            mod.defs.add(toks[i + 2][1])
        # A path in code: an identifier not preceded by `::`, followed by `::`.
        if k == "id" and (i == 0 or toks[i - 1][0] != "::"):
            path = [v]
            j = i + 1
            while j + 1 < len(toks) and toks[j][0] == "::" and toks[j + 1][0] == "id":
                path.append(toks[j + 1][1])
                j += 2
            mod.refs.append((tuple(path), ln, "::".join(path)))
            i = j
            attrs = []
            continue
        if k == "p" and v == ";":
            attrs = []
        i += 1
    return pending


# ---------------------------------------------------------------------------------------------
# Resolution of a path named in module `mod` to the file defining what it names.


class Crate:
    def __init__(self, name, roots, strict=False):
        self.name = name
        self.strict = strict
        self.mods = {}
        for root in roots:
            todo = [((), root, os.path.dirname(root))]
            while todo:
                path, file, d = todo.pop()
                if not os.path.exists(file):
                    continue
                todo.extend(parse_file(self, file, path, self.mods, d))

    def start(self, mod, path):
        """(module path, rest of the segments) a path in `mod` starts from, or None when it
        names another crate or a local name of no module."""
        if not path:
            return None
        head = path[0]
        if head == "::":
            return None
        if head == "crate":
            return (), path[1:]
        if head == "self":
            return mod.path, path[1:]
        if head == "super":
            cur = mod.path
            while path and path[0] == "super":
                cur = cur[:-1]
                path = path[1:]
            return cur, path
        if head in mod.children:
            return mod.children[head], path[1:]
        return None

    def resolve(self, mod, path, seen=None):
        """The module path and item name (None: the module itself) that `path`, as written
        in `mod`, names; None for other crates and unknown names."""
        seen = seen or set()
        key = (mod.path, path)
        if key in seen or len(seen) > 50:
            return None
        seen.add(key)
        if path and path[0] in mod.imports and path[0] not in ("crate", "self", "super"):
            target, _, _ = mod.imports[path[0]]
            return self.resolve(mod, tuple(target) + tuple(path[1:]), seen)
        s = self.start(mod, path)
        if s is None:
            return None
        cur, rest = s
        while rest:
            m = self.mods.get(cur)
            if m is None:
                return None
            name = rest[0]
            if name in m.children:
                cur, rest = m.children[name], rest[1:]
                continue
            if name in m.defs:
                return cur, name
            if name in m.imports:
                target, _, _ = m.imports[name]
                return self.resolve(m, tuple(target) + tuple(rest[1:]), seen)
            for g, _, _ in m.globs:
                r = self.resolve(m, tuple(g) + (name,) + tuple(rest[1:]), seen)
                if r is not None and (r[1] is None or r[1] in self.mods[r[0]].defs):
                    return r
            return cur, name
        return cur, None

    def edges(self):
        """{file: {file: [(line, text)]}}"""
        out = defaultdict(lambda: defaultdict(list))
        for mod in self.mods.values():
            f = mod.file
            names = [(p, ln, t) for p, ln, t in mod.refs]
            used_names = {p[0] for p, _, _ in mod.refs}
            for name, (target, line, public) in mod.imports.items():
                if public and name not in used_names:
                    continue
                names.append((tuple(target), line, "use " + "::".join(target)))
            for g, line, public in mod.globs:
                if not public and g:
                    names.append((tuple(g), line, "use " + "::".join(g) + "::*"))
            for path, line, text in names:
                if len(path) == 1 and path[0] not in mod.imports:
                    # A lone name (a local, a field, `pub(crate)`'s keyword) names no
                    # module unless a `use` brought it in.
                    continue
                r = self.resolve(mod, path)
                if r is None:
                    continue
                mp, item = r
                m = self.mods.get(mp)
                if m is None or (item is None and text.startswith("use ") and "*" not in text):
                    # A `use` of a module: what the file names through it counts.
                    continue
                if m.file == f:
                    continue
                if not self.strict and mp == mod.path[: len(mp)]:
                    # An item of an enclosing module (`super::Inner`, `crate::X` of lib.rs):
                    # see the module documentation.
                    continue
                out[f][m.file].append((line, text))
        return out


def sccs(graph):
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]
    nodes = set(graph) | {w for v in graph for w in graph[v]}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def a_cycle(graph, comp):
    """One shortest circle through the first file of `comp`, inside it."""
    start = comp[0]
    inside = set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w not in inside:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


SELF_TEST = {
    "lib.rs": "mod a; mod b; mod c; pub mod d; mod f; mod g; mod h;\nmod e { pub use crate::a::X; }\n",
    # a -> b -> c -> a: the one circle.
    "a.rs": "use crate::b::Y;\npub struct X(Y);\n",
    "b.rs": '/* crate::a::X */ const S: &str = "crate::a::X"; // crate::a::X\n'
    "pub struct Y;\nfn f() -> super::c::Z { todo!() }\n",
    "c.rs": "pub struct Z;\nfn g(_: crate::e::X) {}\n",
    # A child naming its parent's item, and the parent's facade re-exporting the child's:
    # no circle; f names W through the facade, hence d/inner.rs.
    "d/mod.rs": "mod inner;\npub use inner::W;\npub struct D;\n",
    "d/inner.rs": "use super::D;\npub struct W(D);\n",
    "f.rs": "fn f(_: crate::d::W) {}\n",
    # Tests reach anywhere: g's test module naming h is no dependency.
    "g.rs": "pub struct G;\n#[cfg(test)]\nmod tests {\n    use crate::h::*;\n}\n",
    "h.rs": "use crate::g::G;\nfn h(_: G) {}\n",
}


def self_test():
    """Checks the checker on a small crate with one known circle."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for rel, text in SELF_TEST.items():
            p = os.path.join(d, "src", rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        crate = Crate("selftest", crate_roots(d))
        graph = crate.edges()
        src = os.path.join(d, "src")
        found = [sorted(os.path.relpath(f, src) for f in c) for c in sccs(graph)]
        edges = {(os.path.relpath(a, src), os.path.relpath(b, src)) for a in graph for b in graph[a]}
        want_edges = {("a.rs", "b.rs"), ("b.rs", "c.rs"), ("c.rs", "a.rs"), ("f.rs", "d/inner.rs"), ("h.rs", "g.rs")}
        ok = found == [["a.rs", "b.rs", "c.rs"]] and edges == want_edges
        print(f"check_rs_cycles self-test: {'ok' if ok else 'FAILED'}: circles {found}, edges {sorted(edges)}")
        return 0 if ok else 1


def crate_roots(d):
    src = os.path.join(d, "src")
    return [os.path.join(src, r) for r in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, r))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("crates", nargs="*")
    ap.add_argument("--edges", action="store_true", help="print every dependency found")
    ap.add_argument(
        "--strict",
        action="store_true",
        help="also count a file naming an item of an enclosing module (super::Inner)",
    )
    ap.add_argument("--self-test", action="store_true", help="check the checker on a known crate")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    dirs = args.crates or sorted(os.path.join(ROOT, "crates", c) for c in os.listdir(os.path.join(ROOT, "crates")))
    allowed = [{os.path.normpath(os.path.join(ROOT, f)) for f in s} for s in ALLOWED]
    bad = 0
    for d in dirs:
        roots = crate_roots(d)
        if not roots:
            continue
        crate = Crate(os.path.basename(d), roots, args.strict)
        graph = crate.edges()
        rel = lambda f: os.path.relpath(f, ROOT)  # noqa: E731
        if args.edges:
            for a in sorted(graph):
                for b in sorted(graph[a]):
                    seen = ", ".join(f"{ln}: {t}" for ln, t in graph[a][b][:3])
                    print(f"{rel(a)} -> {rel(b)}   ({seen})")
        for comp in sccs(graph):
            ok = any(set(comp) <= s for s in allowed)
            cyc = a_cycle(graph, comp)
            tag = "allowed (ops/, see ALLOWED)" if ok else "IMPORT CIRCLE"
            print(f"{tag} in {crate.name}: {len(comp)} files: " + " -> ".join(rel(f) for f in cyc))
            for a, b in zip(cyc, cyc[1:]):
                ln, t = graph[a][b][0]
                print(f"    {rel(a)}:{ln} names {t} ({rel(b)})")
            if len(comp) > len(cyc) - 1:
                print("    also in the circle: " + ", ".join(rel(f) for f in comp if f not in cyc))
            bad += not ok
    if bad:
        print(f"check_rs_cycles: {bad} import circle(s); break them by moving what both sides need down a layer")
        return 1
    print("check_rs_cycles: no import circle outside the allowed list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
