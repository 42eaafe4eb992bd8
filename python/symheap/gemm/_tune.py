"""Block-size tuning of :mod:`symheap.gemm`'s kernels: which :class:`~symheap.gemm._kernels.Config`
a call launches.

Why not ``triton.autotune``: it times the kernel it is given, in each process on its own. Here
every launch is a step of a collective (flags and epochs shared with the peers), so timing it
would run a different number of collective steps on each PE, and PEs could settle on different
tiles (different flag layouts): a hang. Instead the tuner times the **same kernel with no
communication** (``npes = 1``: the local GEMM of the PE's whole output, on scratch tensors of
the call's shapes and layout, on the SMs the call's GEMM gets) and every PE launches PE 0's
choice.

Protocol (**collective**, inside the first call of a shape; every PE makes the same calls, so
every PE's in-memory table holds the same keys):

1. key in this process's table: use it (no communication);
2. under CUDA graph capture, or when tuning is off or the GEMM is small: the heuristic
   :func:`~symheap.gemm._kernels.config` (a function of the shape and device: the same on every
   PE, so no communication either);
3. else every PE looks the key up in its disk cache and the PEs exchange what they found (a
   host all_gather); when PE 0 found it, that is the choice; otherwise every PE times the
   candidates on its own GPU, and a second exchange hands every PE PE 0's winner, which every
   PE writes to its disk cache.

The disk cache: one JSON file per key in ``$SYMHEAP_CACHE_DIR/gemm-tune`` (the directory of
symheap's kernel cache: ``SYMHEAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/symheap``, else
``~/.cache/symheap``), written atomically; the key holds the operation, the per-PE shape, the
dtype, B's layout, the PE count, the GPU's name, arch and SM share, Triton's version and a
hash of the kernels' source, so a new kernel or Triton never reuses an old choice.

Engines (all_gather_matmul): the tuner also times :data:`~symheap.gemm._kernels.CUBLAS`, cuBLAS
on each PE's row block in turn on the whole GPU (the copy engine moves the shards, so no SM is
taken from it), and keeps it when it beats every Triton tile choice (which runs on the SMs the
push kernel leaves): "Triton or CUDA, whichever is faster", decided per shape by measurement.
``SYMHEAP_GEMM_ENGINE`` (:func:`~symheap.gemm._kernels.engine`) forces one.

``SYMHEAP_GEMM_TUNE`` (the same on every PE): ``0`` never tune (the heuristic), ``1`` tune every
shape, unset or ``auto`` tune GEMMs of at least ``2**33`` flops (smaller ones are launch- and
latency-bound: the heuristic's tiles do).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch as _torch

from .. import _core, _shmem
from .._native import SymheapValueError

# The kernels module (and Triton) is imported inside the functions that use it: symheap.gemm
# imports this module on the host backend too, which runs without Triton.

AUTO_FLOPS = 1 << 33
_table: Dict[Tuple[Any, ...], Any] = {}
_log: List[Dict[str, Any]] = []


def mode() -> str:
    """``"0"``, ``"1"`` or ``"auto"`` from ``SYMHEAP_GEMM_TUNE``; anything else is refused."""
    v = os.environ.get("SYMHEAP_GEMM_TUNE", "auto").strip().lower() or "auto"
    if v not in ("0", "1", "auto"):
        raise SymheapValueError(f"SYMHEAP_GEMM_TUNE must be 0, 1 or auto, not {v!r}")
    return v


def cache_dir() -> Path:
    """Where choices are kept (``gemm-tune`` in symheap's cache directory, :func:`symheap._core.cache_dir`)."""
    return Path(_core.cache_dir()) / "gemm-tune"


@functools.lru_cache(maxsize=1)
def _kernels_hash() -> str:
    from . import _kernels as k  # Triton (see the top)

    return hashlib.sha256(Path(k.__file__).read_bytes()).hexdigest()[:16]


def _disk_key(key: Tuple[Any, ...], dev: _torch.device) -> str:
    import triton  # (see the top)

    name = _torch.cuda.get_device_name(dev)
    text = json.dumps([list(map(str, key)), name, triton.__version__, _kernels_hash()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _disk_load(dkey: str) -> Optional[List[Any]]:
    try:
        v = json.loads((cache_dir() / f"{dkey}.json").read_text())
        return list(v["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _disk_store(dkey: str, cfg: List[Any], what: Dict[str, Any]) -> None:
    """Atomic (a temp file renamed over the key's file); a failure only costs a retune."""
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"config": cfg, **what}, f)
        os.replace(tmp, d / f"{dkey}.json")
    except OSError:
        pass


def _time_us(fn: Callable[[], None], reps: int = 3, trials: int = 3) -> float:
    """Median over ``trials`` of the mean of ``reps`` back-to-back calls, CUDA events."""
    fn()
    _torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start = _torch.cuda.Event(enable_timing=True)
        end = _torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return sorted(times)[len(times) // 2]


def local_runner(
    kind: str, cfg: Any, a: _torch.Tensor, b: _torch.Tensor, sms: int, c: _torch.Tensor, chunks: int = 1
) -> Callable[[], None]:
    """The op's kernel at ``npes = 1`` (no peer, no wait) writing ``c = a @ b`` (``a``: all this
    PE's rows). For :data:`~symheap.gemm._kernels.CUBLAS`: cuBLAS on each of ``chunks`` row
    blocks in turn (one per PE's shard, as the engine multiplies them), on the whole GPU."""
    from . import _kernels as k  # Triton (see the top)

    if cfg == k.CUBLAS:
        rows = a.shape[0] // max(1, chunks)
        blocks = [(a[i * rows : (i + 1) * rows], c[i * rows : (i + 1) * rows]) for i in range(chunks)]

        def run() -> None:
            with k._ExactMath():
                for x, y in blocks:
                    _torch.mm(x, b, out=y)

        return run
    dev = a.device
    flags = _torch.zeros(8, dtype=_torch.int64, device=dev)
    ctr = _torch.zeros(8, dtype=_torch.int64, device=dev)
    bases = _torch.zeros(1, dtype=_torch.int64, device=dev)
    if kind == "ag":
        ws = _torch.empty(2 * a.numel() + 8, dtype=a.dtype, device=dev)
        return lambda: k.launch_ag(a, b, c, None, ws, flags, ctr, bases, 0, 1, a.numel(), 1, sms, 1 << 40, cfg)
    ws = _torch.empty(2 * c.numel() + 8, dtype=a.dtype, device=dev)
    return lambda: k.launch_rs(a, b, c, ws, flags, ctr, bases, 0, 1, c.numel(), 1, sms, 1 << 40, cfg)


def _scratch(m: int, n: int, kdim: int, dtype: Any, b_t: bool, dev: _torch.device) -> Tuple[Any, Any]:
    g = _torch.Generator(device=dev).manual_seed(0)
    a = _torch.randn((m, kdim), dtype=dtype, device=dev, generator=g)
    if b_t:
        b = _torch.randn((n, kdim), dtype=dtype, device=dev, generator=g).t()
    else:
        b = _torch.randn((kdim, n), dtype=dtype, device=dev, generator=g)
    return a, b


def time_candidates(
    kind: str,
    cands: List[Any],
    m: int,
    n: int,
    kdim: int,
    dtype: Any,
    b_t: bool,
    sms: int,
    dev: _torch.device,
    chunks: int = 1,
) -> List[Tuple[Any, float]]:
    """Each of ``cands``' time (µs; ``inf`` when it cannot run here: out of shared memory, a
    compile error) for the local GEMM ``(m, kdim) @ (kdim, n)`` of operation ``kind``
    (``"ag"``/``"rs"``) on ``sms`` SMs (``chunks``: the PEs' row blocks, for the cuBLAS
    engine). Not collective; not during capture."""
    a, b = _scratch(m, n, kdim, dtype, b_t, dev)
    c = _torch.empty((m, n), dtype=dtype, device=dev)
    out = []
    for cfg in cands:
        try:
            out.append((cfg, _time_us(local_runner(kind, cfg, a, b, sms, c, chunks))))
        except Exception:  # noqa: BLE001 - a config this GPU cannot run is not a choice
            _torch.cuda.synchronize()
            out.append((cfg, float("inf")))
    return out


def choose(kind: str, m_blk: int, npes: int, b: _torch.Tensor, dtype: Any, sms: int, dev: _torch.device) -> Any:
    """**Collective** (see the module's protocol): the configuration for operation ``kind``
    with per-PE blocks of ``m_blk`` rows, ``b`` (its shape and layout) and ``sms`` SMs."""
    from . import _kernels as k  # Triton (see the top)

    kdim, n = b.shape
    b_t = b.stride(0) == 1 and b.stride(1) != 1
    arch = k._arch(dev)
    eng = k.engine() if kind == "ag" else "triton"
    if eng == "cublas":
        return k.CUBLAS
    key = (kind, m_blk, n, kdim, str(dtype), b_t, npes, arch, sms, eng)
    cfg = _table.get(key)
    if cfg is not None:
        return cfg
    heuristic = k.config(m_blk, n, kdim, arch)
    capturing = _torch.cuda.is_current_stream_capturing()
    m = mode()
    if capturing or m == "0" or (m == "auto" and 2 * npes * m_blk * n * kdim < AUTO_FLOPS):
        if not capturing:
            _table[key] = heuristic
        return heuristic
    cands = k.candidates(kind, m_blk, n, kdim, arch) + ([k.CUBLAS] if eng == "auto" else [])
    timer = lambda: time_candidates(kind, cands, npes * m_blk, n, kdim, dtype, b_t, sms, dev, npes)  # noqa: E731
    cfg = _agree(key, _disk_key(key, dev), timer, heuristic)
    _table[key] = cfg
    return cfg


def _agree(key: Tuple[Any, ...], dkey: str, timer: Callable[[], List[Tuple[Any, float]]], heuristic: Any) -> Any:
    """**Collective**: PE 0's disk entry ``dkey``, else PE 0's fastest of ``timer()``'s (every
    PE times its own candidates)."""
    from . import _kernels as k  # Triton (see the top)

    found = _disk_load(dkey)
    first = json.loads(_shmem.all_gather_object_bytes(json.dumps(found).encode())[0])
    if first is not None:
        cfg = k.Config(*first)
        _log.append({"key": key, "source": "cache", "config": cfg})
        if found != first:
            _disk_store(dkey, list(cfg), {"key": list(map(str, key))})
        return cfg
    timed = timer()
    best = min(timed, key=lambda x: x[1])
    mine = list(best[0] if best[1] != float("inf") else heuristic)
    first = json.loads(_shmem.all_gather_object_bytes(json.dumps(mine).encode())[0])
    cfg = k.Config(*first)
    times = {str(tuple(c)): round(t, 2) for c, t in timed}
    _log.append({"key": key, "source": "tuned", "config": cfg, "times_us": times})
    _disk_store(dkey, list(cfg), {"key": list(map(str, key)), "times_us": times})
    return cfg


def history() -> List[Dict[str, Any]]:
    """What this process chose by tuning or from the disk cache, in call order (for tests and
    benchmarks: the key, ``"tuned"`` or ``"cache"``, the config, and the timings when tuned)."""
    return list(_log)


def forget() -> None:
    """Drops the in-memory table (at finalize: a new context starts from the disk cache)."""
    _table.clear()
    _log.clear()
