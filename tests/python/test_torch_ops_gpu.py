"""The torch integration on the CUDA backend (GPU suite; 2 PEs, which may share one GPU): CUDA
graph capture with 20 replays, torch.compile(mode="reduce-overhead"), ordinary CUDA tensors,
freeing right after an asynchronous op. Skipped when CUDA is absent (CI)."""

from __future__ import annotations

import pytest

from conftest import run_cases


@pytest.fixture
def cuda(cuda_gpus: int) -> None:
    """A skip, saying why, when torch sees no CUDA device (GPU-suite tests)."""


GPU = {"SYMHEAP_BACKEND": "cuda"}


def test_cuda_graph_replays(cuda) -> None:
    """torch.cuda.graph capture of the ops, 20 replays, exact integer sums."""
    run_cases(2, "ops_cuda_graph", env=GPU, timeout=300)


def test_compile_reduce_overhead(cuda) -> None:
    """torch.compile(mode="reduce-overhead", fullgraph=True) of a model calling the ops."""
    run_cases(2, "ops_reduce_overhead", env=GPU, timeout=400)


def test_ordinary_cuda_tensors(cuda) -> None:
    """Every op on ordinary CUDA tensors (staged) and symmetric ones, exact values."""
    run_cases(2, "ops_cuda_ordinary", env=GPU, timeout=300)


def test_ordinary_tensors_in_place(cuda) -> None:
    """Ordinary CUDA tensors read and written in place by one-shot and exchange kernels (no
    workspace), mixed kinds across PEs, two-shot staged, plain collectives' refusal; the
    one-call fast path's answers."""
    run_cases(2, "ops_cuda_in_place", "ops_direct", env=GPU, timeout=300)


def test_free_right_after_async_op(cuda) -> None:
    """Deleting/freeing an input right after an asynchronous op on a side stream is safe."""
    run_cases(2, "ops_cuda_free_after_async", env=GPU, timeout=300)


def test_in_place_collectives_and_overlaps(cuda) -> None:
    """The aliasing rules on CUDA tensors: all_gather from this PE's own block and
    reduce_scatter into it through the SHMEM-style calls, the ops and symheap.distributed,
    symmetric and ordinary (exchange / one-shot kernels, or staged), exact; other overlaps
    refused naming both ranges."""
    run_cases(2, "alias_torch", env=GPU, timeout=300)


def test_ops_under_the_cuda_malloc_async_allocator(cuda) -> None:
    """The same ops on ordinary and symmetric CUDA tensors, staged and in place, with torch's
    cudaMallocAsync allocator backend, whose record_stream fails on memory it did not give
    (symheap must never hand it a symmetric tensor), exact values."""
    env = {**GPU, "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    cases = ("cuda_malloc_async_allocator", "ops_cuda_ordinary", "ops_cuda_in_place", "alias_torch")
    run_cases(2, *cases, env=env, timeout=400)
