"""The newcomer examples of examples/python, run as a user runs them: through the launcher, on
the host backend. Their GPU-only siblings must skip here with status 77; the GPU suite
(scripts/gpu_suite.sh run) runs them all on the CUDA backend. tp_mlp.py runs here at its small
sizes (under a minute on two cores) and in the GPU suite at Llama-70B-like ones."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT, launch

EXAMPLES = ROOT / "examples" / "python"


def run_example(n: int, name: str, *args: str) -> str:
    p = launch(n, [sys.executable, str(EXAMPLES / name), *args])
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{name} at {n} PEs: exit status {p.returncode}\n{out}"
    return p.stdout


@pytest.mark.parametrize("n", [1, 2, 4])
def test_numpy_ring(n: int) -> None:
    out = run_example(n, "numpy_ring.py")
    assert f"[PE 0] numpy_ring OK: {n} PEs x 4096 float64, 0 wrong after put, 0 wrong in peer views" in out, out


def test_torch_tensors_on_cpu(torch_module) -> None:
    out = run_example(2, "torch_tensors.py")
    assert "[PE 0] torch_tensors OK: 2 PEs on host (cpu), 65536 float32 per PE" in out, out


@pytest.mark.parametrize("name", ["triton_kernel.py", "cuda_kernel.py", "nvshmem_ring.py"])
def test_gpu_examples_skip_on_the_host_backend(name: str, torch_module) -> None:
    # Without the CUDA backend there is nothing for these kernels to run on: status 77 ("skipped",
    # as automake's test harness reads it) with the reason, never 0, a pass that tested nothing.
    p = launch(1, [sys.executable, str(EXAMPLES / name)])
    assert p.returncode == 77, f"exit status {p.returncode}\n{p.stdout}{p.stderr}"
    assert f"[PE 0] {name[:-3]}: skipped, " in p.stdout, p.stdout


def test_tp_mlp_on_cpu(torch_module) -> None:
    # The tensor-parallel MLP example at its small sizes on the host backend: eager and
    # torch.compile (inductor, CPU) against the same model on torch.distributed over gloo.
    out = run_example(2, "tp_mlp.py", "--small")
    assert "[PE 0] tp_mlp: 2 PEs on cpu, hidden 512, intermediate 1536 (768 per PE)" in out, out
    assert "reference: torch.distributed over gloo on CPU copies" in out, out
    assert "eager, torch.compile (inductor) match torch.distributed (gloo)" in out, out
