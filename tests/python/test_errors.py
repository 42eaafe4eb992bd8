"""Typed errors, never a panic: out-of-range settings (arguments and environment), arguments of
the wrong type or range, and a heap the address space cannot hold. Every error is a
SymheapError subclass naming the PE and the call."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import symheap
import symheap.numpy as sn

from conftest import LAUNCHER_VARS, clean_env, launch

TIMEOUT_RANGE = "expected 0.001 to 1e9 seconds"


@pytest.fixture
def no_launcher(monkeypatch):
    """A process that is PE 0 of one, with no context open."""
    for v in LAUNCHER_VARS:
        monkeypatch.delenv(v, raising=False)
    if symheap.is_initialized():
        pytest.skip("a context exists")


@pytest.mark.parametrize("t", [1e300, 1e19, float("inf"), float("nan"), 0.0, -1.0])
def test_out_of_range_timeouts_are_refused(no_launcher, t: float) -> None:
    with pytest.raises(symheap.SymheapValueError) as ei:
        symheap.init(backend="host", timeout=t)
    e = ei.value
    assert e.pe == 0 and e.call == "init", (e.pe, e.call)
    assert str(e).startswith("timeout=") and str(e).endswith(f" is not accepted: {TIMEOUT_RANGE}"), str(e)
    assert not symheap.is_initialized()


@pytest.mark.parametrize(
    "var, value, message",
    [
        ("SYMHEAP_TIMEOUT", "1e300", f'SYMHEAP_TIMEOUT="1e300" is not accepted: {TIMEOUT_RANGE}'),
        ("SYMHEAP_TIMEOUT", "1e19", f'SYMHEAP_TIMEOUT="1e19" is not accepted: {TIMEOUT_RANGE}'),
        (
            "SYMHEAP_CHUNK_SIZE",
            "0",
            'SYMHEAP_CHUNK_SIZE="0" is not accepted: expected a size from 1 byte to 16 EiB, such as 4096, 64M or 16G',
        ),
        ("SYMHEAP_BACKEND", "gpu", 'SYMHEAP_BACKEND="gpu" is not accepted: expected host, cuda or auto'),
        (
            "SYMHEAP_HEAP_CAPACITY",
            str(1 << 62),
            f'SYMHEAP_HEAP_CAPACITY="{1 << 62}" is not accepted: expected 1 byte to 64 TiB of address space '
            "per PE, such as 16G",
        ),
        ("SYMHEAP_DEVICE", "-1", 'SYMHEAP_DEVICE="-1" is not accepted: expected a CUDA device ordinal (0, 1, ...)'),
    ],
)
def test_environment_errors_name_variable_value_and_range(no_launcher, monkeypatch, var, value, message) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(symheap.SymheapValueError) as ei:
        symheap.init()
    e = ei.value
    assert str(e) == f"symheap: init: invalid argument: {message}"
    assert e.kind == "invalid_argument" and e.pe == 0 and e.call == "init"


def test_init_arguments_are_checked(no_launcher) -> None:
    cases = [
        (dict(capacity=1 << 62), f"capacity={1 << 62} bytes is not accepted: expected 1 byte to 64 TiB"),
        (dict(backend="gpu"), 'backend="gpu" is not accepted: expected "host", "cuda" or "auto"'),
        (dict(timeout="soon"), "timeout must be a number of seconds, not str"),
        (dict(capacity=-1), "capacity (bytes) -1 is out of range (1 to 18446744073709551615)"),
        (dict(capacity=[1]), "capacity (bytes) must be an integer, not list"),
        (dict(chunk_size=1 << 64), "chunk_size (bytes) 18446744073709551616 is out of range"),
    ]
    for kwargs, start in cases:
        with pytest.raises(symheap.SymheapValueError) as ei:
            symheap.init(**kwargs)
        assert str(ei.value).startswith(start), (kwargs, str(ei.value))
        assert ei.value.pe == 0 and ei.value.call == "init"


def test_the_command_refuses_a_huge_timeout_without_a_panic() -> None:
    for value in ("1e300", "1e19"):
        env = clean_env({"SYMHEAP_TIMEOUT": value})
        p = subprocess.run([sys.executable, "-m", "symheap", "info"], env=env, capture_output=True, text=True)
        assert p.returncode == 1, (p.returncode, p.stderr)
        assert "panicked" not in p.stderr and "PanicException" not in p.stderr, p.stderr
        assert f'SYMHEAP_TIMEOUT="{value}" is not accepted: {TIMEOUT_RANGE}' in p.stderr, p.stderr


def test_wrong_argument_types_become_value_errors(no_launcher) -> None:
    with symheap.init(backend="host", capacity=1 << 28):
        x = sn.zeros(4, dtype=np.uint64)
        src = np.zeros(4, dtype=np.uint64)
        cases = [
            ("put", lambda: symheap.put(x, [1, 2, 3, 4], 0), "put source: expected a numpy.ndarray"),
            ("put", lambda: symheap.put(x, src, [0]), "PE must be an integer, not list"),
            ("put", lambda: symheap.put(x, src, True), "PE must be an integer, not bool (True)"),
            ("get", lambda: symheap.get(src, x, False), "PE must be an integer, not bool (False)"),
            ("barrier", lambda: symheap.barrier(3), "team must be a symheap.Team or None, not int"),
            ("all_reduce", lambda: symheap.all_reduce(x, team="world"), "team must be a symheap.Team or None"),
            ("team_split_strided", lambda: symheap.team_split_strided(None, -1, 1, 1), "team start -1 is out of"),
            ("team_split_ranks", lambda: symheap.team_split_ranks(None, [0, -1]), "a rank of ranks -1 is out of"),
            ("team_from_ranks", lambda: symheap.team_from_ranks([True], list), "a rank of ranks must be an integer"),
            ("team_destroy", lambda: symheap.team_destroy(None), "team must be a symheap.Team, not NoneType"),
            ("put_signal", lambda: symheap.put_signal(x, src, x, 2**64, 0), "signal value (an unsigned 64-bit"),
            ("signal_wait_until", lambda: symheap.signal_wait_until(x, "ge", -1), "signal value (an unsigned"),
            ("atomic_fetch", lambda: symheap.atomic_fetch(x, 0, index=[1]), "atomic index must be an integer"),
            (
                "atomic_set",
                lambda: symheap.atomic_set(x, 2**64, 0),
                "atomic operand 18446744073709551616 is out of range",
            ),
            ("broadcast", lambda: symheap.broadcast(x, root="0"), "broadcast root must be an integer, not str"),
        ]
        for call, f, text in cases:
            with pytest.raises(symheap.SymheapValueError) as ei:
                f()
            e = ei.value
            assert isinstance(e, TypeError) and isinstance(e, ValueError)
            assert text in str(e), (call, str(e))
            assert (e.pe, e.call) == (0, call), (call, e.pe, e.call, str(e))
        # A bool is refused everywhere a PE goes, also by the fronts.
        with pytest.raises(symheap.SymheapValueError):
            sn.get_peer_array(x, True)


def test_a_heap_the_address_space_cannot_hold_is_one_clean_error() -> None:
    """4 PEs x 40 TiB: each PE would reserve 160 TiB, more than a process has. Each PE fails
    on its own, so a PE may see a peer leave first (how that is named is not this test's
    matter); the PEs that reach the reservation get one clean message, none a doubled one."""
    script = (
        "import symheap\n"
        "try:\n"
        "    symheap.init()\n"
        "except symheap.SymheapError as e:\n"
        "    print(f'CAUGHT {type(e).__name__} {e.pe} {e.call} {e}')\n"
    )
    p = launch(4, [sys.executable, "-c", script], env={"SYMHEAP_HEAP_CAPACITY": "40T"}, timeout=120)
    clean = 0
    for pe in range(4):
        line = next((x for x in p.stdout.splitlines() if x.startswith(f"[PE {pe}] CAUGHT")), "")
        want = (
            f"[PE {pe}] CAUGHT SymheapValueError {pe} init symheap PE {pe}: init: invalid argument: a heap "
            "capacity of 40 TiB per PE needs 4 x 40 TiB of address space on every PE, which the kernel does not "
            "grant (ENOMEM: Out of memory); lower SYMHEAP_HEAP_CAPACITY (or capacity=)"
        )
        clean += line == want
        assert line, p.stdout + p.stderr
    assert clean >= 1, p.stdout
    assert "backend: backend" not in p.stdout + p.stderr
