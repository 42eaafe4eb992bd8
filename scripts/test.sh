#!/usr/bin/env bash
# The whole CPU test suite: what CI runs (through .ci/run) and what README tells users to run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
