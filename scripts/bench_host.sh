#!/usr/bin/env bash
# Host-backend benchmark: symheap against memcpy and Open MPI in one run.
# Builds symheap in release mode, runs `symheap bench` (which compiles the MPI peer with mpicc
# against Open MPI's mpi.h) and writes bench-host.json. Needs Open MPI's mpirun, mpicc and
# headers: when one is missing it says so, then installs them from the distribution's packages
# (apt-get install openmpi-bin libopenmpi-dev, through sudo when not root), the one thing it
# installs outside target/. SYMHEAP_NO_APT=1 installs nothing: the MPI column is then left out
# and the benchmark says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

# Whether mpicc finds mpi.h (Debian's mpicc comes with openmpi-bin, the header with
# libopenmpi-dev, so a present mpicc alone proves nothing).
mpi_h_found() {
  command -v mpicc >/dev/null || return 1
  printf '#include <mpi.h>\nint main(void) { return 0; }\n' | mpicc -x c -fsyntax-only - 2>/dev/null
}

if ! command -v mpirun >/dev/null || ! mpi_h_found; then
  missing="$(command -v mpirun >/dev/null || printf 'mpirun ')$(command -v mpicc >/dev/null || printf 'mpicc ')$(mpi_h_found || printf 'mpi.h')"
  if [ "${SYMHEAP_NO_APT:-0}" = 1 ]; then
    echo "bench_host.sh: Open MPI is incomplete here (missing: $missing) and SYMHEAP_NO_APT=1: nothing is installed, the MPI column is left out (install: apt-get install openmpi-bin libopenmpi-dev)" >&2
  elif ! command -v apt-get >/dev/null; then
    echo "bench_host.sh: Open MPI is incomplete here (missing: $missing) and there is no apt-get: install Open MPI with its headers (mpirun, mpicc, mpi.h) for the MPI column; running without it" >&2
  else
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "bench_host.sh: Open MPI is incomplete here (missing: $missing): installing openmpi-bin and libopenmpi-dev with apt-get${SUDO:+ through sudo}, into the system, outside target/, for the MPI column. To skip it: SYMHEAP_NO_APT=1 scripts/bench_host.sh" >&2
    $SUDO apt-get install -y -q openmpi-bin libopenmpi-dev >/dev/null ||
      { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q openmpi-bin libopenmpi-dev >/dev/null; }
    mpi_h_found || echo "bench_host.sh: mpicc still finds no mpi.h after the install (install libopenmpi-dev, or point mpicc at Open MPI's headers); the MPI column is left out" >&2
  fi
fi
cargo build --release --locked -p symheap-cli
./target/release/symheap bench "$@" --json bench-host.json
