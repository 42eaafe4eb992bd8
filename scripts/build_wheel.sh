#!/usr/bin/env bash
# `scripts/build_wheel.sh [--out DIR] [--profile release|dev] [--target x86_64|aarch64|all]`
#
# Builds the symheap wheel as it ships: the abi3 extension (CPython 3.9+) with the `symheap`
# command inside, tagged manylinux_2_28 (zig links against glibc 2.28, the floor torch's wheels
# use), with symheap's kernels compiled ahead of time for sm_80, sm_90, sm_100 and sm_120 and
# embedded, so a first init on those GPUs runs no NVRTC. Needs only Rust and the project venv
# (made here from scripts/requirements-test.txt: maturin, ziglang, NVRTC); no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/steps.sh
source scripts/lib/steps.sh

OUTDIR=target/wheels
PROFILE=release
TARGETS=x86_64
ARCHS=80,90,100,120
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUTDIR="$2"; shift 2 ;;
    --profile) PROFILE="$2"; shift 2 ;;
    --target) TARGETS="$2"; shift 2 ;;
    *) echo "build_wheel.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$TARGETS" = all ] && TARGETS="x86_64 aarch64"

VENV="${SYMHEAP_VENV:-$PWD/target/venv}"
step "project venv ($VENV)" scripts/venv.sh "$VENV"
export PATH="$VENV/bin:$PATH"
# shellcheck source=nvrtc_env.sh
source scripts/nvrtc_env.sh

# The kernels, compiled by this checkout's own `symheap kernels` (the hashes must match the
# sources the library embeds, so they come from the same tree).
PREBUILT="$PWD/target/prebuilt-kernels"
rm -rf "$PREBUILT"
step "build the kernel compiler" cargo build --locked -p symheap-cli --bin symheap
step "compile the kernels for sm_${ARCHS//,/, sm_}" target/debug/symheap kernels --out "$PREBUILT" --arch "$ARCHS"

mkdir -p "$OUTDIR"
for t in $TARGETS; do
  case "$t" in
    x86_64) triple=x86_64-unknown-linux-gnu ;;
    aarch64) triple=aarch64-unknown-linux-gnu ;;
    *) echo "build_wheel.sh: unknown target $t (x86_64, aarch64 or all)" >&2; exit 2 ;;
  esac
  if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
    step "add the Rust target $triple" rustup target add "$triple"
  fi
  step "wheel for $t (manylinux_2_28, $PROFILE)" env SYMHEAP_PREBUILT_KERNELS="$PREBUILT" \
    maturin build --locked --profile "$PROFILE" --target "$triple" --zig \
    --compatibility manylinux_2_28 -o "$OUTDIR"
done
ls -l "$OUTDIR"/symheap-*.whl >&2
