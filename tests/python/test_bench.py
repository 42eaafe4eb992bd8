"""`symheap bench --png` on the host backend draws the chart of what it measured (the command run
from the package, whose interpreter has matplotlib in the test venv)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import clean_env


def test_host_bench_draws_the_png_it_was_asked_for(tmp_path) -> None:
    png, rows = tmp_path / "chart.png", tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "symheap", "bench", "coll", "--host", "-n", "2", "--op", "all_gather"]
    cmd += ["--sizes", "4K,256K", "--png", str(png), "--json", str(rows)]
    p = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"bench: drew {png}" in p.stderr, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    got = [(r["op"], r["bytes"]) for r in json.loads(rows.read_text())["rows"]]
    assert got == [("all_gather f32", 4096), ("all_gather f32", 262144)], got
