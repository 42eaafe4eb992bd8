#!/usr/bin/env bash
# `scripts/torch_range.sh WHEEL`: symheap on the lowest torch and Triton it supports and on the
# newest on the index. For each, one after the other, it makes a project-local venv
# (scripts/venv.sh: target/venv-torch-min from scripts/requirements-torch-min.txt, then
# target/venv-torch-new from scripts/requirements-torch-new.txt, unpinned; reused when already
# made from the same file), installs WHEEL into it and runs a focused subset of the host-backend
# tests there: every private torch function symheap uses (test_torch_private.py), symmetric CPU
# tensors across 2 PEs, the torch.library ops and their fake kernels, the MoE Triton kernels
# under Triton's interpreter (TRITON_INTERPRET=1) across 2 processes, every
# torch.distributed collective on the symheap backend at 3 ranks, and the backend's C++ Work
# compiled against that torch. The main suite runs
# everything on the pinned stack (target/venv). Each venv is ~5 GB (torch from PyPI brings its
# CUDA libraries), so they are made in turn, not together; SYMHEAP_LOW_DISK=1 (CI) removes each
# after its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=(
  test_torch_private.py
  "test_torch.py::test_torch_cpu_tensors[2]"
  test_torch_ops.py::test_ops_fake_kernels
  "test_torch_ops.py::test_ops_collectives[2]"
  "test_moe.py::test_moe_triton_kernels_interpreted[2-cases0]"
  # The torch.distributed backend (its ProcessGroup subclass meets torch's private protocol:
  # torch 2.15 renamed the single-tensor forms and asks for _get_backend), subgroups included.
  "test_tdist.py::test_every_collective[3]"
  # symheap's C++ Work compiled against this torch's headers (c10d::Work, pybind11), then every
  # collective through it and the Work as torch's Python sees it.
  test_cpp_work.py::test_cpp_work_object
  "test_cpp_work.py::test_every_collective_with_cpp_work[2]"
)
WHEEL="${1:?usage: torch_range.sh WHEEL}"
[ -f "$WHEEL" ] || { echo "torch_range.sh: no wheel at $WHEEL" >&2; exit 2; }
for which in min new; do
  venv="$PWD/target/venv-torch-$which"
  t0=$SECONDS
  scripts/venv.sh "$venv" "scripts/requirements-torch-$which.txt"
  echo "torch_range.sh: venv-torch-$which ready in $((SECONDS - t0)) s" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
  versions="$("$venv/bin/python" -c 'import torch, triton; print(f"torch {torch.__version__}, Triton {triton.__version__}")')"
  echo "torch_range.sh: $which: $versions" >&2
  # From tests/python, so `import symheap` is the installed wheel.
  (cd tests/python && PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs --durations=10 "${TESTS[@]}")
  if [ "${SYMHEAP_LOW_DISK:-0}" = 1 ]; then
    echo "torch_range.sh: SYMHEAP_LOW_DISK=1: removing $venv" >&2
    rm -rf "$venv"
  fi
done
