"""The torch integration when the world spans nodes, on the CUDA backend (GPU suite): 4 PEs in 2
simulated nodes (``SYMHEAP_SIMULATE_NODES=2``, which may share one GPU), every op on ordinary and
symmetric CUDA tensors with exact values, and CUDA-graph replays after an eager warm-up: the
collectives run hierarchically (symheap's kernels inside a node, NCCL between nodes). Skipped
when CUDA is absent (CI); the host backend's half is the Rust `coll-nodes` self-test."""

from __future__ import annotations

from conftest import run_cases

NODES = {"SYMHEAP_BACKEND": "cuda", "SYMHEAP_SIMULATE_NODES": "2", "SYMHEAP_TIMEOUT": "60"}


def test_torch_ops_across_simulated_nodes(cuda_gpus: int) -> None:
    """Every collective op across 2 simulated nodes of 2 PEs, exact values."""
    run_cases(4, "ops_cuda_ordinary", env=NODES, timeout=400)


def test_cuda_graph_replays_across_simulated_nodes(cuda_gpus: int) -> None:
    """torch.cuda.graph capture (after a warm-up on the capture stream) and 20 replays across
    2 simulated nodes: exact sums."""
    run_cases(4, "ops_cuda_graph", env=NODES, timeout=400)
