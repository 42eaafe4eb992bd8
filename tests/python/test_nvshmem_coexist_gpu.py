"""symheap's NVSHMEM provider in a process where torch's NVSHMEM backend initialised NVSHMEM first
(torch SymmetricMemory with ``set_backend("NVSHMEM")``), 1 PE: the provider attaches to that
NVSHMEM (its PE layout is symheap's), allocates, moves data and finalizes without finalizing
NVSHMEM, which torch then still uses; the process's environment is unchanged throughout. GPU
only (``scripts/gpu_suite.sh``'s python-providers step)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, clean_env

SCRIPT = r"""
import os, socket
import torch, torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

torch.cuda.set_device(0)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
symm_mem.set_backend("NVSHMEM")
# torch's NVSHMEM backend initialises NVSHMEM at its first allocation (torch refuses a
# rendezvous of a group of one, so this one-rank test makes none).
t = symm_mem.empty(4096, dtype=torch.float32, device="cuda")
t.fill_(1.0)

before = dict(os.environ)
import symheap
import symheap.providers as providers

symheap.init(backend="cuda")
nv = providers.nvshmem()
assert nv.attached(), "the provider initialised a second NVSHMEM instead of attaching"
g = torch.Generator(device="cuda").manual_seed(5)
x, bases = nv.allocate_symmetric(1 << 16, dtype=torch.float32)
assert int(bases[0]) == x.data_ptr()
y, _ = nv.allocate_symmetric(1 << 16, dtype=torch.float32)
y.copy_(torch.rand(1 << 16, device="cuda", generator=g))
nv.barrier()
symheap.put(x, y, 0)  # both sides the provider's tensors, as NVSHMEM needs
symheap.quiet()
torch.cuda.synchronize()
assert torch.equal(x, y)
nv.free(y)
nv.free(x)
nv.finalize()
symheap.finalize()
assert dict(os.environ) == before, "symheap changed the environment"

# NVSHMEM is still torch's: a new allocation works, the old tensor is intact.
u = symm_mem.empty(4096, dtype=torch.float32, device="cuda")
u.fill_(2.0)
torch.cuda.synchronize()
assert float(t.sum()) == 4096.0 and float(u.sum()) == 8192.0
dist.destroy_process_group()
print("COEXIST OK")
"""


def test_nvshmem_provider_attaches_to_torchs_nvshmem(cuda_gpus: int, torch_module) -> None:
    from symheap import _native

    if not hasattr(_native, "NvshmemProvider"):
        pytest.skip("this build of symheap has no NVSHMEM provider")
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        pytest.skip("this torch has no SymmetricMemory")
    if not hasattr(symm_mem, "set_backend") or not getattr(symm_mem, "is_nvshmem_available", lambda: False)():
        pytest.skip("this torch has no NVSHMEM backend for SymmetricMemory (or no NVSHMEM library)")
    env = clean_env({"SYMHEAP_BACKEND": "cuda", "NVSHMEM_DISABLE_NVLS": "1"})
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "COEXIST OK" in p.stdout, f"exit status {p.returncode}\n{out}"
