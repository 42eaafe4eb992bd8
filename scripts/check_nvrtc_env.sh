#!/usr/bin/env bash
# CI check that the NVRTC setup works on a fresh machine: `source scripts/nvrtc_env.sh` under
# `set -euo pipefail`, with a bare interpreter (a venv with no packages) first on PATH and no
# project venv yet, must install NVRTC into its own venv, export SYMHEAP_NVRTC_LIB, and leave
# the bare interpreter as bare as it was. (It once died silently there, before its fallback.)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$PWD/target/bare-check"
rm -rf "$tmp"
python3 -m venv "$tmp/bare"
got="$(env PATH="$tmp/bare/bin:$PATH" SYMHEAP_VENV="$tmp/venv" bash -c \
  'set -euo pipefail; unset SYMHEAP_NVRTC_LIB; source scripts/nvrtc_env.sh; echo "$SYMHEAP_NVRTC_LIB"')" || {
  echo "check_nvrtc_env.sh: sourcing nvrtc_env.sh failed with a bare python3 first on PATH" >&2
  exit 1
}
case "$got" in
  "$tmp/venv/"*/libnvrtc.so.13) ;;
  *) echo "check_nvrtc_env.sh: SYMHEAP_NVRTC_LIB is '$got', not the new venv's libnvrtc.so.13" >&2; exit 1 ;;
esac
[ -f "$got" ] || { echo "check_nvrtc_env.sh: $got does not exist" >&2; exit 1; }
if "$tmp/bare/bin/python" -c "import nvidia" 2>/dev/null; then
  echo "check_nvrtc_env.sh: nvrtc_env.sh installed into the user's interpreter" >&2
  exit 1
fi
# A failure must be loud: a venv that cannot be made (no such interpreter) returns 1 with a message.
if msg="$(env PATH="$tmp/bare/bin:$PATH" PYTHON=/nonexistent/python3 SYMHEAP_VENV="$tmp/none" bash -c \
  'set -euo pipefail; source scripts/nvrtc_env.sh; echo survived' 2>&1)"; then
  echo "check_nvrtc_env.sh: a setup that cannot work did not fail: $msg" >&2
  exit 1
fi
case "$msg" in
  *"nvrtc_env.sh: no /nonexistent/python3 on PATH"*) ;;
  *) echo "check_nvrtc_env.sh: the failure said nothing useful: '$msg'" >&2; exit 1 ;;
esac
rm -rf "$tmp"
echo "check_nvrtc_env.sh: ok ($got)"
