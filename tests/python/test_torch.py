"""The PyTorch front. Skipped (in fixtures, with the reason) when torch or CUDA is missing."""

from __future__ import annotations

import pytest

from conftest import run_cases


@pytest.mark.parametrize("n", [1, 2])
def test_torch_cpu_tensors(torch_module, n: int) -> None:
    """CPU tensors on the host backend: contract, factories, RMA, collectives, atomics, release."""
    run_cases(n, "torch", "torch_coll")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_torch_empty_tensors(torch_module, n: int) -> None:
    """Empty tensors (address 0 in torch) in every call that takes symmetric memory, an uneven
    alltoall with PEs that send or receive nothing among them."""
    run_cases(n, "torch_empty")


def test_init_from_torch_distributed(torch_module) -> None:
    """init() with torch.distributed initialised (gloo) runs the rendezvous over its store."""
    run_cases(2, "torch_dist")


def test_cuda_tensors(cuda_gpus: int) -> None:
    """CUDA tensors on the CUDA backend, one PE per GPU (up to 2)."""
    n = min(cuda_gpus, 2)
    run_cases(n, "torch", "torch_coll", "torch_empty", env={"SYMHEAP_BACKEND": "cuda"})


def test_cuda_release_is_stream_ordered(cuda_gpus: int) -> None:
    """Deleting a CUDA tensor right after an asynchronous put into it: no PE reuses the memory
    until the put finished (several PEs may share one GPU)."""
    run_cases(2, "torch_release_order", env={"SYMHEAP_BACKEND": "cuda"})


def test_cuda_grow_failure(cuda_gpus: int) -> None:
    """A GPU too full for a heap chunk on one PE fails the allocation on every PE alike (no PE
    left waiting for the others' handles); after PyTorch frees that memory it succeeds."""
    run_cases(min(cuda_gpus, 2), "torch_grow_failure", env={"SYMHEAP_BACKEND": "cuda"})
