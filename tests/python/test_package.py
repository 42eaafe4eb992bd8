"""The package's shape: every public submodule is reachable after a plain ``import symheap``,
which itself imports neither torch, Triton nor NumPy; the package has no import circle (the
check CI runs, scripts/check_py_cycles.py, is shown to catch one); the workspaces of one context
are gone in the next."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import symheap

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHECK = ROOT / "scripts" / "check_py_cycles.py"


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (nothing imported yet), from this directory so that
    ``symheap`` is the package the tests run against, outside any launcher (one PE)."""
    launcher = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_ID")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    return subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True, text=True, timeout=600)


def _public_submodules() -> list:
    """Every public module and subpackage of the installed package, from its files."""
    pkg = Path(symheap.__file__).parent
    names = {p.stem for p in pkg.glob("*.py")} | {p.parent.name for p in pkg.glob("*/__init__.py")}
    return sorted(n for n in names if not n.startswith("_"))


def test_public_submodules_reachable_after_plain_import() -> None:
    names = _public_submodules()
    documented = {"distributed", "fused", "gemm", "launch", "moe", "numpy", "ops", "providers", "torch", "triton"}
    assert documented <= set(names), names
    code = f"""
import sys
import symheap
heavy = [m for m in ("torch", "triton", "numpy") if m in sys.modules]
assert not heavy, f"import symheap imported {{heavy}}"
for name in {names!r}:
    assert name in dir(symheap), name
    mod = getattr(symheap, name)
    assert mod is sys.modules["symheap." + name], name
try:
    symheap.no_such_module
except AttributeError as e:
    assert "no_such_module" in str(e), e
else:
    raise AssertionError("symheap.no_such_module did not raise AttributeError")
print("reached", len({names!r}))
"""
    r = _python(code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"reached {len(names)}" in r.stdout


def test_no_import_circle_in_the_package() -> None:
    r = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no circle" in r.stderr


def _check(pkg: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), "--package-dir", str(pkg)], capture_output=True, text=True, timeout=120
    )


def test_circle_checker_catches_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("import os\n\n\ndef f():\n    # deferred on purpose\n    from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..b import g\n")
    (pkg / "b.py").write_text("from . import a as _a\n\n\ndef g():\n    pass\n")
    r = _check(pkg)
    assert r.returncode == 1, r.stderr
    assert "import circle pkg.a -> pkg.sub.c -> pkg.b -> pkg.a" in r.stderr, r.stderr
    assert "(inside a function)" in r.stderr, r.stderr
    # Broken at one edge, the same package passes.
    (pkg / "b.py").write_text("def g():\n    pass\n")
    r = _check(pkg)
    assert r.returncode == 0, r.stderr


def test_circle_checker_wants_a_reason_for_an_import_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    import json\n\n    return json\n")
    r = _check(pkg)
    assert r.returncode == 1 and "pkg/a.py:2: import json" in r.stderr, r.stderr
    (pkg / "a.py").write_text("def f():\n    # only this rare path needs it\n    import json\n\n    return json\n")
    assert _check(pkg).returncode == 0


def test_workspaces_do_not_outlive_their_context() -> None:
    """The staging made in one context is not in the next one, after a finalize or after a
    context that ended by an exception (an abort), and the next context grows its own."""
    code = """
import torch
import symheap
import symheap.ops as so

def stage_once():
    t = torch.arange(1000, dtype=torch.float32)
    so.all_reduce_(t)  # an ordinary tensor: staged through the workspace
    assert torch.equal(t, torch.arange(1000, dtype=torch.float32)), t[:4]
    return so.workspace_usage()

with symheap.init(backend="host", capacity=1 << 28):
    assert so.workspace_usage()["workspaces"] == 0
    assert stage_once()["workspaces"] == 1
with symheap.init(backend="host", capacity=1 << 28):
    assert so.workspace_usage()["workspaces"] == 0, so.workspace_usage()
    assert stage_once()["workspaces"] == 1
try:
    with symheap.init(backend="host", capacity=1 << 28):
        stage_once()
        raise KeyError("leaving by an exception")
except KeyError:
    pass
assert so.workspace_usage()["workspaces"] == 0
with symheap.init(backend="host", capacity=1 << 28):
    assert so.workspace_usage()["workspaces"] == 0, so.workspace_usage()
    assert stage_once()["workspaces"] == 1
print("contexts ok")
"""
    r = _python(code)
    assert r.returncode == 0 and "contexts ok" in r.stdout, r.stdout + r.stderr


def test_team_ids_do_not_outlive_their_context() -> None:
    """The ops' team ids belong to the context that gave them: in the next context an old id
    is unknown (not the old context's team) and the old Team handles are dropped."""
    code = """
import torch
import symheap
import symheap.ops as so

with symheap.init(backend="host", capacity=1 << 28):
    team = symheap.team_split_strided(None, 0, 1, 1)
    tid = so.team_id(team)
    assert tid != 0 and so.team_id(team) == tid
    t = torch.ones(4)
    so.all_reduce_(t, "sum", team)
    del team
with symheap.init(backend="host", capacity=1 << 28):
    try:
        so.all_reduce_(torch.ones(4), "sum", tid)
    except symheap.SymheapValueError as e:
        assert "unknown symheap team id" in str(e), e
    else:
        raise AssertionError("an id of the previous context was taken")
    assert not so._teams and not so._team_ids, "the previous context's teams are still held"
    team = symheap.team_split_strided(None, 0, 1, 1)
    t = torch.full((4,), 2.0)
    so.all_reduce_(t, "sum", team)
    assert torch.equal(t, torch.full((4,), 2.0))
print("team ids ok")
"""
    r = _python(code)
    assert r.returncode == 0 and "team ids ok" in r.stdout, r.stdout + r.stderr
