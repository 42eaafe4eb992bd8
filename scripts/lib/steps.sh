# shellcheck shell=bash
# `step NAME CMD...`: runs one step of a script, says what it is, how long it took, and, when it
# fails, names it and exits with its status (so a script never ends silently half way).
# Source it from a script running under `set -euo pipefail`.

step() {
  local name="$1"; shift
  local t0=$SECONDS rc=0
  echo "==> $name" >&2
  "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAILED: $name (exit status $rc after $((SECONDS - t0)) s): $*" >&2
    exit "$rc"
  fi
  echo "    $name: ok ($((SECONDS - t0)) s)" >&2
}
