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
# uv installs (scripts/requirements-uv.txt, bootstrapped into target/uv by pip): torch's ~3 GB
# in seconds, not minutes. Its cache is made beside the venvs (so files are hard-linked into
# them, not copied) and removed after each install: a cached copy of every torch the range
# step installs would outgrow a small CI disk. pip (no cache) when uv cannot be had.
uv_install() {
  local uv="$PWD/target/uv/bin/uv" cache="$PWD/target/uv-cache"
  if [ ! -x "$uv" ] || ! cmp -s scripts/requirements-uv.txt "$PWD/target/uv/.symheap-requirements"; then
    { "$PY" -m venv "$PWD/target/uv" >&2 &&
      "$PWD/target/uv/bin/python" -m pip install -q --disable-pip-version-check -r scripts/requirements-uv.txt >&2 &&
      cp scripts/requirements-uv.txt "$PWD/target/uv/.symheap-requirements"; } ||
      { echo "venv.sh: could not install uv into target/uv; installing with pip instead" >&2; return 90; }
  fi
  rm -rf "$cache"
  # uv reads neither pip's index settings nor its certificate: pass them on. Bytecode at
  # install, as pip does: uv leaves it to the first import, and with PYTHONDONTWRITEBYTECODE
  # (set on CI's machines) every test process then compiled torch again (import torch 4.4 s
  # instead of 1.8; pytest took 21 min instead of 12).
  local rc=0
  env ${PIP_INDEX_URL:+UV_DEFAULT_INDEX="$PIP_INDEX_URL"} ${PIP_EXTRA_INDEX_URL:+UV_INDEX="$PIP_EXTRA_INDEX_URL"} \
    ${PIP_CERT:+SSL_CERT_FILE="$PIP_CERT"} UV_CACHE_DIR="$cache" \
    "$uv" pip install -q --compile-bytecode --python "$VENV/bin/python" -r "$REQ" >&2 || rc=$?
  rm -rf "$cache"
  return "$rc"
}
rc=0
uv_install || rc=$?
if [ "$rc" = 90 ]; then
  rc=0
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -r "$REQ" >&2 || rc=$?
fi
if [ "$rc" != 0 ]; then
  echo "venv.sh: installing $REQ into $VENV failed (see the installer's message above)" >&2
  exit 1
fi
cp "$REQ" "$stamp"
