# shellcheck shell=bash
# Open MPI for scripts/test.sh: a few tests check that programs run unchanged under Open MPI's
# mpirun. When mpirun is missing, `open_mpi_for_tests` says what it installs, why and how to
# skip it before it runs apt-get (through sudo when not root): the one thing test.sh installs
# outside target/. With SYMHEAP_NO_APT=1 it installs nothing; the tests that need mpirun are
# then left out of `cargo test` (OPEN_MPI_SKIP_ARGS) and named as skipped, never counted as
# passed (`open_mpi_skipped_note`).

# The tests that start mpirun (crates/symheap-cli/tests/test_script.rs checks this list
# against the sources).
OPEN_MPI_TESTS=(
  launched_by_mpirun_unchanged
  host_collectives_across_simulated_nodes_run_through_open_mpi
)
# `cargo test` arguments after `--` that leave those tests out (empty when mpirun is here).
OPEN_MPI_SKIP_ARGS=()

open_mpi_for_tests() {
  if command -v mpirun >/dev/null; then
    echo "    mpirun: $(command -v mpirun)" >&2
    return 0
  fi
  if [ "${SYMHEAP_NO_APT:-0}" = 1 ]; then
    echo "    SYMHEAP_NO_APT=1 and no mpirun: Open MPI is not installed; the ${#OPEN_MPI_TESTS[@]} tests that need mpirun will be SKIPPED (named at the end)" >&2
    local t
    for t in "${OPEN_MPI_TESTS[@]}"; do
      OPEN_MPI_SKIP_ARGS+=(--skip "$t")
    done
    return 0
  fi
  if ! command -v apt-get >/dev/null; then
    echo "    no mpirun and no apt-get: install Open MPI (its mpirun) yourself, or run with SYMHEAP_NO_APT=1 to skip the ${#OPEN_MPI_TESTS[@]} tests that need it" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "    installing Open MPI (apt-get install openmpi-bin${sudo:+, through sudo}) into the system, outside target/:" >&2
  echo "    ${#OPEN_MPI_TESTS[@]} tests check that programs run unchanged under its mpirun. To skip it: SYMHEAP_NO_APT=1 scripts/test.sh (those tests are then skipped and named)" >&2
  $sudo apt-get install -y -q openmpi-bin >/dev/null ||
    { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q openmpi-bin >/dev/null; }
}

# The line test.sh ends with when tests were left out (nothing when none were).
open_mpi_skipped_note() {
  [ "${#OPEN_MPI_SKIP_ARGS[@]}" -eq 0 ] && return 0
  echo "test.sh: SKIPPED, not passed: ${OPEN_MPI_TESTS[*]} (they need mpirun: SYMHEAP_NO_APT=1 and no Open MPI)" >&2
}
