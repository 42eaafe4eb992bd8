"""The torch integration on the host backend (CPU tensors): the ``torch.ops.symheap`` custom ops
and their fake kernels, torch.compile with zero graph breaks, ordinary-tensor staging, the
torch.distributed-style module over gloo, and the promised errors, at 1, 2 and 4 PEs."""

from __future__ import annotations

import pytest

from conftest import run_cases


@pytest.mark.parametrize("n", [1, 2, 4])
def test_ops_collectives(torch_module, n: int) -> None:
    """Every op on symmetric (zero-copy) and ordinary (staged) tensors, exact values; RMA; the
    ops' one-call fast path (``collective_direct``)."""
    run_cases(n, "ops_coll", "ops_errors", "ops_direct", timeout=300)


def test_ops_fake_kernels(torch_module) -> None:
    """Fake kernels: result shapes/dtypes, their errors, opcheck of schema and fake kernels."""
    run_cases(2, "ops_fake", timeout=300)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_ops_compile(torch_module, n: int) -> None:
    """torch.compile(fullgraph=True): one graph, no graph break, eager's exact values."""
    run_cases(n, "ops_compile", timeout=600)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_distributed_style(torch_module, n: int) -> None:
    """torch.distributed signatures over a gloo group, subgroups, errors; init without
    private torch APIs."""
    run_cases(n, "ops_dist", timeout=300)


def test_distributed_style_compile(torch_module) -> None:
    """symheap.distributed calls under torch.compile(fullgraph=True)."""
    run_cases(2, "ops_dist_compile", timeout=300)
