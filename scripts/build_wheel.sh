#!/usr/bin/env bash
# `scripts/build_wheel.sh [--out DIR] [--profile release|dev] [--target x86_64|aarch64|all]`
#
# Builds the symheap wheel as it ships: the abi3 extension (CPython 3.9+) and, beside it in the
# package, the `symheap` executable (crates/symheap-cli: launch, info, selftest, bench, kernels;
# the console script and `python -m symheap` run it, and the extension does not link its
# self-test scenarios and benchmarks), both tagged manylinux_2_28 (zig links against glibc 2.28,
# the floor torch's wheels use), with symheap's kernels compiled ahead of time for sm_80, sm_90,
# sm_100 and sm_120 by CUDA 12 NVRTCs (scripts/lib/kernel_builds.sh: they load on every driver
# from CUDA 12.1 on, 12.8 for Blackwell) and embedded, so a first init on those GPUs runs no
# NVRTC. Needs only Rust and what the wheel needs: a small venv of its own (target/build-venv,
# from scripts/requirements-build.txt: maturin and zig, ~70 MB) and the NVRTCs (target/nvrtc/,
# ~330 MB, by scripts/nvrtc_lib.sh); no test stack, no GPU. SYMHEAP_BUILD_VENV names another
# venv.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/steps.sh
source scripts/lib/steps.sh

OUTDIR=target/wheels
PROFILE=release
TARGETS=x86_64
# shellcheck source=lib/kernel_builds.sh
source scripts/lib/kernel_builds.sh
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUTDIR="$2"; shift 2 ;;
    --profile) PROFILE="$2"; shift 2 ;;
    --target) TARGETS="$2"; shift 2 ;;
    *) echo "build_wheel.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$TARGETS" = all ] && TARGETS="x86_64 aarch64"

VENV="${SYMHEAP_BUILD_VENV:-$PWD/target/build-venv}"
step "build venv ($VENV, from scripts/requirements-build.txt)" \
  scripts/venv.sh "$VENV" scripts/requirements-build.txt
export PATH="$VENV/bin:$PATH"

# The kernels, compiled by this checkout's own `symheap kernels` (the hashes must match the
# sources the library embeds, so they come from the same tree), each group of architectures by
# its NVRTC; every file name records the NVRTC version that built it.
PREBUILT="$PWD/target/prebuilt-kernels"
rm -rf "$PREBUILT"
# After `cargo test --workspace` (scripts/test.sh sets SYMHEAP_WHEEL_AFTER_TESTS=1) the tests'
# build has made target/debug/symheap already, with the dev-dependencies' features unified in;
# building the binary alone differs in those features and compiled five crates again (~85 s on
# CI's two cores). Asking cargo for the tests' build is then a no-op when it is current (and a
# rebuild when it is not), and leaves that binary in place.
if [ "${SYMHEAP_WHEEL_AFTER_TESTS:-0}" = 1 ]; then
  step "the kernel compiler (the tests' build)" cargo test --workspace --locked --no-run
else
  step "build the kernel compiler" cargo build --locked -p symheap-cli --bin symheap
fi
# Checks that every image of ARCHS was built by NVRTC MAJOR.MINOR (and not by another NVRTC
# found on the way): two programs per architecture.
built_by() { # archs, major.minor
  local a n
  for a in ${1//,/ }; do
    n=$(find "$PREBUILT" -name "kernels-*-sm$a-nvrtc$2.cubin" | wc -l)
    [ "$n" = 2 ] || { echo "build_wheel.sh: $n images of sm_$a by NVRTC $2 in $PREBUILT, not 2" >&2; return 1; }
  done
}
for build in "${KERNEL_BUILDS[@]}"; do
  archs="${build%%:*}" version="${build#*:}"
  step "NVRTC $version" scripts/nvrtc_lib.sh "$version"
  lib="$(scripts/nvrtc_lib.sh "$version")"
  step "compile the kernels for sm_${archs//,/, sm_} with NVRTC $version" \
    env -u SYMHEAP_NVRTC SYMHEAP_NVRTC_LIB="$lib" target/debug/symheap kernels --out "$PREBUILT" --arch "$archs"
  step "the sm_${archs//,/, sm_} images are NVRTC ${version%.*}'s" built_by "$archs" "${version%.*}"
done

# The executable goes into the package as python/symheap/_bin/symheap (git-ignored, included by
# pyproject.toml) only for the wheel being built: never left behind for a later `pip install .`.
BIN=python/symheap/_bin
rm -rf "$BIN"
trap 'rm -rf "$BIN"' EXIT
# Takes the executable out of the binary wheel maturin built into $1.
stage_command() {
  python - "$1" "$BIN" <<'PY'
import glob, os, sys, zipfile
(whl,) = glob.glob(os.path.join(sys.argv[1], "symheap_command-*.whl"))
with zipfile.ZipFile(whl) as z:
    (name,) = [n for n in z.namelist() if n.endswith(".data/scripts/symheap")]
    os.makedirs(sys.argv[2], exist_ok=True)
    exe = os.path.join(sys.argv[2], "symheap")
    with open(exe, "wb") as f:
        f.write(z.read(name))
os.chmod(exe, 0o755)
PY
}

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
  cmd_out="target/command-wheels/$t"
  rm -rf "$cmd_out" "$BIN"
  step "the symheap executable for $t (manylinux_2_28, $PROFILE)" env SYMHEAP_PREBUILT_KERNELS="$PREBUILT" \
    maturin build --locked --profile "$PROFILE" --target "$triple" --zig \
    --compatibility manylinux_2_28 -m crates/symheap-cli/Cargo.toml -o "$cmd_out"
  step "put the executable into the package" stage_command "$cmd_out"
  step "wheel for $t (manylinux_2_28, $PROFILE)" env SYMHEAP_PREBUILT_KERNELS="$PREBUILT" \
    maturin build --locked --profile "$PROFILE" --target "$triple" --zig \
    --compatibility manylinux_2_28 -o "$OUTDIR"
  rm -rf "$BIN"
done
ls -l "$OUTDIR"/symheap-*.whl >&2
