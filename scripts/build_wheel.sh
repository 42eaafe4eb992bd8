#!/usr/bin/env bash
# `scripts/build_wheel.sh [--out DIR] [--profile release|dev] [--target x86_64|aarch64|all]`
#
# Builds the symheap wheel as it ships: the abi3 extension (CPython 3.9+) and, beside it in the
# package, the `symheap` executable (crates/symheap-cli: launch, info, selftest, bench, kernels;
# the console script and `python -m symheap` run it, and the extension does not link its
# self-test scenarios and benchmarks), both tagged manylinux_2_28 (zig links against glibc 2.28,
# the floor torch's wheels use), with symheap's kernels compiled ahead of time for sm_80, sm_90,
# sm_100 and sm_120 and embedded, so a first init on those GPUs runs no NVRTC. Needs only Rust
# and the project venv (made here from scripts/requirements-test.txt: maturin, ziglang, NVRTC);
# no GPU.
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
