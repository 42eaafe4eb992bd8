#!/usr/bin/env bash
# `scripts/venv.sh [DIR] [REQUIREMENTS]`: makes a project-local Python environment (default
# target/venv, the one the tests use) from REQUIREMENTS (default scripts/requirements-test.txt;
# scripts/build_wheel.sh makes target/build-venv from scripts/requirements-build.txt), with
# whatever `python3` is on PATH (a bare interpreter is enough: nothing is installed into it).
# Reuses DIR when it was made from the same requirements, installs over it otherwise. Never
# touches the user's own Python.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-target/venv}"
REQ="${2:-scripts/requirements-test.txt}"
PY="${PYTHON:-python3}"
stamp="$VENV/.symheap-requirements"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && cmp -s "$REQ" "$stamp"; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null || { echo "venv.sh: no $PY on PATH (Python 3.9+ is needed)" >&2; exit 1; }
  mkdir -p "$(dirname "$VENV")"
  if ! "$PY" -m venv "$VENV" >&2; then
    echo "venv.sh: '$PY -m venv $VENV' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
case "$REQ" in
  *requirements-test.txt) size="torch is ~3 GB with its CUDA libraries" ;;
  *) size="$(grep -cvE '^\s*(#|$)' "$REQ") packages" ;;
esac
echo "venv.sh: installing $REQ into $VENV ($size)" >&2
# No pip cache: torch's wheels with their CUDA libraries are ~3 GB, and a cached copy beside the
# installed one doubled what a small CI disk had to hold.
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -r "$REQ" >&2; then
  echo "venv.sh: pip install -r $REQ into $VENV failed (see pip's message above)" >&2
  exit 1
fi
cp "$REQ" "$stamp"
