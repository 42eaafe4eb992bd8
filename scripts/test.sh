#!/usr/bin/env bash
# The whole CPU test suite: what CI runs (through .ci/run) and what README tells users to run.
set -euo pipefail
cd "$(dirname "$0")/.."
# NVRTC from PyPI, so every CUDA kernel and the device header compile in the tests (no GPU needed).
# shellcheck source=nvrtc_env.sh
source scripts/nvrtc_env.sh
cargo test --workspace --locked
