# shellcheck shell=bash
# Source this (`source scripts/nvrtc_env.sh`) to make NVRTC loadable without a CUDA toolkit, for
# `cargo test` by hand (scripts/test.sh sources it too). NVRTC comes from PyPI
# (nvidia-cuda-nvrtc 13.0) in the project-local venv ${SYMHEAP_VENV:-target/venv}; when that venv
# or its NVRTC is missing, it is made with the `python3` on PATH (a bare interpreter is enough;
# nothing is installed into it). Exports SYMHEAP_NVRTC_LIB, which symheap looks at first.
# Works under `set -euo pipefail`, changes no shell option, and on failure says what failed and
# returns 1 (so a `set -e` caller stops with the message, never silently). For a CUDA 12 NVRTC
# (the wheel's kernels are built by 12.0, 12.1 and 12.8): `export SYMHEAP_NVRTC_LIB="$(
# scripts/nvrtc_lib.sh 12.1.105)"`; scripts/check_kernel_builds.sh runs the tests with each.

_symheap_nvrtc_setup() {
  local root venv py lib
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  venv="${SYMHEAP_VENV:-$root/target/venv}"
  py="$venv/bin/python"
  _symheap_nvrtc_find() {
    "$py" - <<'PY'
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(1)
for root in list(nvidia.__path__):
    for lib in sorted(glob.glob(os.path.join(root, "cu13", "lib", "libnvrtc.so.13"))):
        print(lib)
        sys.exit(0)
sys.exit(1)
PY
  }
  if [ -x "$py" ] && lib="$(_symheap_nvrtc_find 2>/dev/null)"; then
    export SYMHEAP_NVRTC_LIB="$lib"
    return 0
  fi
  if [ ! -x "$py" ]; then
    if ! command -v "${PYTHON:-python3}" >/dev/null; then
      echo "nvrtc_env.sh: no ${PYTHON:-python3} on PATH to make $venv with" >&2
      return 1
    fi
    mkdir -p "$(dirname "$venv")"
    if ! "${PYTHON:-python3}" -m venv "$venv" >&2; then
      echo "nvrtc_env.sh: '${PYTHON:-python3} -m venv $venv' failed (Debian/Ubuntu: apt-get install python3-venv)" >&2
      return 1
    fi
  fi
  echo "nvrtc_env.sh: installing nvidia-cuda-nvrtc==13.0.88 into $venv" >&2
  if ! "$py" -m pip install -q --disable-pip-version-check "nvidia-cuda-nvrtc==13.0.88" >&2; then
    echo "nvrtc_env.sh: pip could not install nvidia-cuda-nvrtc==13.0.88 into $venv" >&2
    return 1
  fi
  if ! lib="$(_symheap_nvrtc_find)"; then
    echo "nvrtc_env.sh: nvidia-cuda-nvrtc is installed in $venv but has no nvidia/cu13/lib/libnvrtc.so.13" >&2
    return 1
  fi
  export SYMHEAP_NVRTC_LIB="$lib"
}

_symheap_nvrtc_rc=0
_symheap_nvrtc_setup || _symheap_nvrtc_rc=$?
unset -f _symheap_nvrtc_setup _symheap_nvrtc_find
if [ "$_symheap_nvrtc_rc" -ne 0 ]; then
  unset _symheap_nvrtc_rc
  # shellcheck disable=SC2317  # reached when sourced
  return 1 2>/dev/null || exit 1
fi
unset _symheap_nvrtc_rc
