#!/usr/bin/env bash
# Host-backend benchmark: symheap against memcpy and Open MPI in one run.
# Installs Open MPI from the distribution's packages when missing, builds symheap in release mode,
# runs `symheap bench` (which compiles the MPI peer with mpicc) and writes bench-host.json.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y -q openmpi-bin libopenmpi-dev >/dev/null
fi
cargo build --release --locked -p symheap-cli
./target/release/symheap bench "$@" --json bench-host.json
