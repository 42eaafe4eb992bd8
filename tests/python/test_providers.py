"""symheap.providers on the host backend (CI): the package surface, the shipped CUDA header, typed
errors for what a provider lacks, and the native provider's contract at 1, 2 and 4 PEs with CPU
tensors (skipped, in the torch_module fixture, when torch is not installed). The NVSHMEM and
torch SymmetricMemory providers run on GPUs: test_providers_gpu.py.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

from conftest import PROVIDER_CASES, ROOT, run_cases


def test_import_symheap_imports_neither_torch_nor_triton() -> None:
    code = (
        "import sys, symheap, symheap.providers\n"
        "assert symheap.providers is sys.modules['symheap.providers']\n"
        "bad = [m for m in ('torch', 'triton', 'cupy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_symheap_triton_without_triton_says_so() -> None:
    """``import symheap.triton`` without Triton: an ImportError that says what to install."""
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def fake(name, *a, **k):\n"
        "    if name == 'triton' or name.startswith('triton.'):\n"
        "        raise ImportError('No module named ' + repr(name))\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = fake\n"
        "try:\n"
        "    import symheap.triton\n"
        "except ImportError as e:\n"
        "    assert 'pip install \"symheap[triton]\"' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_get_include_ships_the_header() -> None:
    import symheap

    inc = symheap.get_include()
    shipped = os.path.join(inc, "symheap.cuh")
    assert os.path.isfile(shipped), f"{shipped} is missing from the package"
    with open(shipped, "rb") as f, open(ROOT / "include" / "symheap.cuh", "rb") as g:
        assert f.read() == g.read(), "the packaged symheap.cuh differs from include/symheap.cuh"


def test_provider_api_is_documented() -> None:
    """Every public method of every provider has a docstring; collective ones say so."""
    from symheap import providers

    assert providers.__doc__ and "Collective" in providers.__doc__
    for fn in (providers.native, providers.nvshmem, providers.torch_symm_mem):
        assert fn.__doc__, fn
    for cls in (
        providers.Provider,
        providers.NativeProvider,
        providers.NvshmemProvider,
        providers.TorchSymmMemProvider,
    ):
        assert cls.__doc__, cls
        for name in (
            "my_pe",
            "n_pes",
            "device",
            "allocate_symmetric",
            "allocate_symmetric_map",
            "symmetric_address_map",
            "free",
            "barrier",
            "peer_offsets",
            "finalize",
        ):
            fn = getattr(cls, name)
            assert inspect.getdoc(fn), (cls.__name__, name)
        for name in ("allocate_symmetric", "allocate_symmetric_map", "barrier"):
            assert "Collective" in inspect.getdoc(getattr(cls, name)), (cls.__name__, name)
    assert "Collective" in inspect.getdoc(providers.NvshmemProvider.free)
    assert "collective" in (providers.NvshmemProvider.__doc__ or "").lower()


def test_providers_say_what_they_need() -> None:
    """Typed errors at 1 PE on the host backend: NVSHMEM needs the CUDA backend, torch
    SymmetricMemory needs torch.distributed, the native provider needs torch (when absent)."""
    run_cases(1, "errors", script=PROVIDER_CASES)


def test_native_provider_before_init() -> None:
    code = (
        "import symheap\n"
        "from symheap import providers\n"
        "for f in (providers.native, providers.nvshmem):\n"
        "    try:\n"
        "        f()\n"
        "    except symheap.SymheapError as e:\n"
        "        assert 'init' in str(e) or 'torch' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit(f'{f.__name__} did not raise')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("n", [1, 2, 4])
def test_native_provider_contract_cpu(torch_module, n: int) -> None:
    """The contract of the native provider with CPU tensors on the host backend: tables read and
    write every peer's copy at their addresses, maps, views, constant per-peer offsets across
    allocations, free."""
    run_cases(n, "contract:native", script=PROVIDER_CASES)
