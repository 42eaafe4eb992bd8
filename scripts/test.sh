#!/usr/bin/env bash
# The whole CPU test suite: what CI runs (through .ci/run) and what README tells users to run.
set -euo pipefail
cd "$(dirname "$0")/.."
# NVRTC from PyPI, so every CUDA kernel and the device header compile in the tests (no GPU needed).
# shellcheck source=nvrtc_env.sh
source scripts/nvrtc_env.sh
# Open MPI, so the tests can check that programs run unchanged under mpirun.
if ! command -v mpirun >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y -q openmpi-bin >/dev/null || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q openmpi-bin >/dev/null
  }
fi
cargo test --workspace --locked

# The Python package (crates/symheap-py + python/symheap): build the abi3 wheel, install it in a
# fresh venv with NumPy, pytest and Triton, and run the multi-PE tests on the host backend
# (torch/GPU tests skip when torch is absent). Triton (a ~190 MB wheel, ~10 s to install) lets
# test_triton_compile.py compile every symheap.triton function for sm_90 without a GPU (~15 s).
# The dev profile reuses the build `cargo test` just made.
PYVENV=target/py-venv
rm -rf "$PYVENV" target/py-wheels
python3 -m venv "$PYVENV"
"$PYVENV/bin/pip" install -q --disable-pip-version-check maturin numpy pytest "triton==3.6.0"
"$PYVENV/bin/maturin" build --profile dev --locked -o target/py-wheels
"$PYVENV/bin/pip" install -q --disable-pip-version-check --no-deps target/py-wheels/symheap-*.whl
(cd tests/python && "../../$PYVENV/bin/python" -m pytest -q -p no:cacheprovider .)
