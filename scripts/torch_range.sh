#!/usr/bin/env bash
# `scripts/torch_range.sh prepare` then `scripts/torch_range.sh run WHEEL`: symheap on the lowest
# torch and Triton it supports and on the newest on the index. `prepare` makes two project-local
# venvs (scripts/venv.sh: target/venv-torch-min from scripts/requirements-torch-min.txt,
# target/venv-torch-new from scripts/requirements-torch-new.txt, unpinned); scripts/test.sh starts
# it in the background right after the main venv, so its ~6 GB of downloads overlap the Rust
# build and tests instead of adding to CI's time. `run` installs WHEEL into each and runs a
# focused subset of the host-backend tests there: every private torch function symheap uses
# (test_torch_private.py), symmetric CPU tensors across 2 PEs, the torch.library ops and their
# fake kernels, the MoE Triton kernels under Triton's interpreter (TRITON_INTERPRET=1)
# across 2 processes, and every torch.distributed collective on the symheap backend at 3
# ranks. The main suite runs everything on the pinned stack (target/venv).
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
)
case "${1:-}" in
  prepare)
    for which in min new; do
      t0=$SECONDS
      scripts/venv.sh "$PWD/target/venv-torch-$which" "scripts/requirements-torch-$which.txt"
      echo "torch_range.sh: venv-torch-$which ready in $((SECONDS - t0)) s" >&2
    done
    exit 0
    ;;
  run) WHEEL="${2:?torch_range.sh run WHEEL}" ;;
  *) echo "torch_range.sh: usage: torch_range.sh prepare | run WHEEL" >&2; exit 2 ;;
esac
for which in min new; do
  venv="$PWD/target/venv-torch-$which"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
  versions="$("$venv/bin/python" -c 'import torch, triton; print(f"torch {torch.__version__}, Triton {triton.__version__}")')"
  echo "torch_range.sh: $which: $versions" >&2
  # From tests/python, so `import symheap` is the installed wheel.
  (cd tests/python && PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "${TESTS[@]}")
done
