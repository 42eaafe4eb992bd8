#!/usr/bin/env bash
# `scripts/nvrtc_lib.sh VERSION`: prints the path of NVRTC VERSION's library (e.g. 12.1.105 ->
# .../libnvrtc.so.12), installing it first, when missing, into target/nvrtc/VERSION with
# `pip install --target` (nvidia-cuda-nvrtc-cu12 for 12.x, nvidia-cuda-nvrtc for 13.x and later;
# ~60 MB each, 210 MB for 12.8). Several versions side by side, none in any venv: the wheel's
# kernels are built by several (scripts/lib/kernel_builds.sh). Runs pip with the `python3` on
# PATH, which must have pip (scripts/build_wheel.sh and scripts/test.sh put their venv first).
set -euo pipefail
cd "$(dirname "$0")/.."
V="${1:?usage: scripts/nvrtc_lib.sh VERSION (e.g. 12.1.105)}"
case "$V" in
  12.*) pkg=nvidia-cuda-nvrtc-cu12 rel=nvidia/cuda_nvrtc/lib/libnvrtc.so.12 ;;
  [1-9][0-9].*) pkg=nvidia-cuda-nvrtc rel="nvidia/cu${V%%.*}/lib/libnvrtc.so.${V%%.*}" ;;
  *) echo "nvrtc_lib.sh: $V is not an NVRTC version such as 12.1.105 or 13.0.88" >&2; exit 2 ;;
esac
dir="$PWD/target/nvrtc/$V"
if [ ! -f "$dir/$rel" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "nvrtc_lib.sh: the python3 on PATH ($(command -v python3 || echo none)) has no pip to install $pkg==$V with" >&2
    exit 1
  fi
  echo "nvrtc_lib.sh: installing $pkg==$V into $dir" >&2
  rm -rf "$dir"
  if ! python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "$pkg==$V" >&2; then
    echo "nvrtc_lib.sh: pip could not install $pkg==$V into $dir" >&2
    exit 1
  fi
  [ -f "$dir/$rel" ] || { echo "nvrtc_lib.sh: $pkg==$V has no $rel" >&2; exit 1; }
fi
echo "$dir/$rel"
