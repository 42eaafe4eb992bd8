"""Issue 40 on the host backend, at 1, 2 and 4 PEs (real processes under the launcher): freed
means freed for every alias of a buffer, and every argument is a value its type holds (atomic
and signal values, counts, PEs, sizes, bytes, dtype names, alignment). The cases are in
freed_cases.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cases

FREED = Path(__file__).resolve().parent / "freed_cases.py"
PES = [1, 2, 4]


@pytest.mark.parametrize("n", PES)
def test_every_alias_of_a_freed_array_is_refused(n: int) -> None:
    """np.frombuffer(memoryview), array-interface wrappers and a ctypes pointer: refused by
    every call after the free and after another allocation; the memory they show is not
    reused while they exist, and is once they are gone."""
    p = run_cases(n, "alias_after_free", script=FREED)
    assert p.stdout.count("ALIASES HELD True REUSED True") == n, p.stdout


@pytest.mark.parametrize("n", PES)
def test_a_stale_handle_stays_freed(n: int) -> None:
    """A freed buffer's memory is reused while the stale handle exists; freeing it again (or
    freeing through an alias) raises instead of passing silently."""
    run_cases(n, "stale_handle", script=FREED)


@pytest.mark.parametrize("n", [1, 2])
def test_torch_aliases_of_a_freed_buffer_are_refused(torch_module, n: int) -> None:
    p = run_cases(n, "alias_after_free_torch", script=FREED)
    assert p.stdout.count("TORCH REUSED True") == n, p.stdout


@pytest.mark.parametrize("n", PES)
def test_atomic_and_signal_values_are_in_range(n: int) -> None:
    run_cases(n, "atomic_values", "signal_values", script=FREED)


@pytest.mark.parametrize("n", [1, 2])
def test_a_bool_is_never_a_count_pe_size_index_or_root(torch_module, n: int) -> None:
    run_cases(n, "bool_is_not_a_number", script=FREED)


@pytest.mark.parametrize("n", [1, 3])
def test_object_bytes_take_only_bytes(n: int) -> None:
    run_cases(n, "object_bytes_types", script=FREED)


def test_dtype_names_mean_what_numpy_means(torch_module) -> None:
    run_cases(1, "dtype_names", script=FREED)


@pytest.mark.parametrize("n", PES)
def test_every_operation_refuses_a_misaligned_address(n: int) -> None:
    run_cases(n, "alignment", script=FREED)
