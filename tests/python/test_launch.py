"""python -m symheap.launch: exit codes, failure handling, argument forms."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import symheap
from symheap import _native

from conftest import ROOT, clean_env, launch


def script(tmp_path, body: str) -> str:
    p = tmp_path / "pe.py"
    p.write_text(textwrap.dedent(body))
    return str(p)


def test_all_pass_and_script_arguments(tmp_path) -> None:
    s = script(
        tmp_path,
        """
        import sys, symheap
        with symheap.init():
            print("ARGS", symheap.my_pe(), symheap.n_pes(), sys.argv[1:], flush=True)
    """,
    )
    p = launch(3, [s, "a", "--b"], launcher_args=())  # a .py program runs with this Python
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(3):
        assert f"[PE {r}] ARGS {r} 3 ['a', '--b']" in p.stdout


def test_failing_pe_sets_exit_code_and_stops_the_job(tmp_path) -> None:
    s = script(
        tmp_path,
        """
        import os, sys, symheap
        symheap.init()
        symheap.barrier_all()
        if symheap.my_pe() == 1:
            os._exit(3)  # dies without finalize
        try:
            symheap.barrier_all()
        except symheap.SymheapPeerError as e:
            print("PEER", e, flush=True)
            sys.exit(4)
    """,
    )
    t0 = time.monotonic()
    p = launch(3, [sys.executable, s])
    assert p.returncode == 3, p.stdout + p.stderr
    assert "PE 1 exited with status 3" in p.stderr, p.stderr
    assert p.stdout.count("PEER") == 2 and "PE 1 exited" in p.stdout, p.stdout
    assert time.monotonic() - t0 < 20


def test_unhandled_exception_aborts_the_others(tmp_path) -> None:
    s = script(
        tmp_path,
        """
        import symheap
        symheap.init()
        symheap.barrier_all()
        if symheap.my_pe() == 0:
            raise RuntimeError("boom")
        try:
            symheap.barrier_all()
        except symheap.SymheapPeerError as e:
            print("PEER", e, flush=True)
    """,
    )
    p = launch(2, [sys.executable, s], env={"SYMHEAP_TIMEOUT": "60"})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "RuntimeError: boom" in p.stderr
    # PE 1 learns of it from PE 0's exit, well before its 60 s timeout.
    assert "[PE 1] PEER" in p.stdout and "PE 0" in p.stdout, p.stdout + p.stderr


def test_launch_function_returns_exit_status() -> None:
    code = _native.launch(
        2, sys.executable, ["-c", "import os, sys; sys.exit(5 if os.environ['RANK'] == '1' else 0)"], grace=1.0
    )
    assert code == 5
    assert _native.launch(1, sys.executable, ["-c", "pass"], prefix_output=False) == 0


def test_launcher_usage_errors() -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "symheap.launch", "-n", "0", "--", "true"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "at least 1" in bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "symheap.launch", "-n", "1", "--", "/nonexistent/program"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "symheap launch" in missing.stderr
    try:
        _native.launch(0, "true")
    except symheap.SymheapValueError:
        pass
    else:
        raise AssertionError("launch(0) did not raise")
