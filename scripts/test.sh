#!/usr/bin/env bash
# The whole CPU test suite: what CI runs (through .ci/run) and what README tells users to run.
#
# Needs Rust and a python3 (a bare interpreter is enough: nothing is installed into it). Every
# Python package the tests use (maturin, zig, NVRTC, NumPy, pytest, ruff, torch, Triton) goes into
# the project-local venv target/venv, and the lowest and newest torch and Triton into
# target/venv-torch-min and target/venv-torch-new (scripts/torch_range.sh), one after the other
# at the end (installed by uv, whose cache is removed after each install). SYMHEAP_LOW_DISK=1
# (CI) removes what the later steps no longer need: target/debug and target/venv once pytest
# passed, each range venv after its tests. Outside target/ it
# installs one thing, said before it does: Open MPI (apt-get install openmpi-bin, through sudo when not root) when mpirun is
# missing; SYMHEAP_NO_APT=1 installs nothing and skips the tests that need mpirun, naming them
# at the end. Each step says what it runs; a failing step is named with its exit status, so
# this never ends silently.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/steps.sh
source scripts/lib/steps.sh
T0=$SECONDS

VENV="$PWD/target/venv"
step "project venv ($VENV, from scripts/requirements-test.txt)" scripts/venv.sh "$VENV"
ORIG_PATH="$PATH"
export PATH="$VENV/bin:$PATH"
step "NVRTC setup on a fresh machine (bare python3, set -euo pipefail)" scripts/check_nvrtc_env.sh
# NVRTC from the venv, so every CUDA kernel and the device header compile in the tests (no GPU).
# shellcheck source=nvrtc_env.sh
source scripts/nvrtc_env.sh

# Open MPI, so the tests can check that programs run unchanged under mpirun: installed with
# apt-get when missing (said before; SYMHEAP_NO_APT=1 installs nothing and skips those tests).
# shellcheck source=lib/open_mpi.sh
source scripts/lib/open_mpi.sh
step "Open MPI (mpirun) for the tests that run programs under it" open_mpi_for_tests

step "cargo fmt --check" cargo fmt --all --check
step "Rust import circles: the checker's self-test" python3 scripts/check_rs_cycles.py --self-test
step "Rust import circles (scripts/check_rs_cycles.py)" python3 scripts/check_rs_cycles.py
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets --locked -- -D warnings
step "ruff check" ruff check python tests scripts bench examples
step "ruff format --check" ruff format --check python tests scripts bench examples
step "no import circle in the Python package (scripts/check_py_cycles.py)" python3 scripts/check_py_cycles.py
step "cargo test" cargo test --workspace --locked -- ${OPEN_MPI_SKIP_ARGS[@]+"${OPEN_MPI_SKIP_ARGS[@]}"}
step "device code with the CUDA 12 NVRTCs that build the wheel's kernels (12.0, 12.1, 12.8)" \
  scripts/check_kernel_builds.sh
step "docs (rustdoc -D warnings, Python API page up to date)" scripts/docs.sh
step "divergence property test at scale (40 random programs at 2, 3, 4 and 8 PEs)" \
  scripts/diverge_stats.sh 40 target/debug/symheap

# The wheel as it ships (manylinux_2_28, kernels prebuilt), installed from the built file: into a
# fresh venv to check what a pip user gets, and into the test venv (which has torch and Triton)
# for the multi-PE Python tests.
rm -rf target/py-wheels
step "wheel (scripts/build_wheel.sh)" env SYMHEAP_WHEEL_AFTER_TESTS=1 scripts/build_wheel.sh --out target/py-wheels
WHEEL="$(ls target/py-wheels/symheap-*-manylinux_2_28_x86_64.whl)"
step "the wheel in a fresh venv: symheap command, launch, numpy front" scripts/check_wheel.sh "$WHEEL"
step "install the wheel into the test venv" \
  python -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
# From tests/python, so `import symheap` is the installed wheel, not python/ in this checkout.
pytest_all() { (cd tests/python && python -m pytest -q -p no:cacheprovider -rs --durations=30 .); }
step "pytest (multi-PE, host backend; torch on CPU)" pytest_all
# Nothing after this point uses the debug build or the test venv (the range step has its own
# venvs and takes the wheel file); on a small CI disk they make room for the range venvs.
if [ "${SYMHEAP_LOW_DISK:-0}" = 1 ]; then
  echo "test.sh: SYMHEAP_LOW_DISK=1: removing target/debug ($(du -sh target/debug | cut -f1)) and $VENV" \
    "($(du -sh "$VENV" | cut -f1))" >&2
  rm -rf target/debug "$VENV"
  export PATH="$ORIG_PATH"
  unset SYMHEAP_NVRTC_LIB
fi
step "the lowest supported torch/Triton and the newest on the index (scripts/torch_range.sh)" \
  scripts/torch_range.sh "$WHEEL"
echo "test.sh: every step passed in $((SECONDS - T0)) s" >&2
open_mpi_skipped_note
