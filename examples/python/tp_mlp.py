"""A tensor-parallel transformer MLP block (Megatron style) on symheap, checked against the same
model on torch.distributed.

Each layer, on every PE (the input ``x`` and ``residual`` are the same on all of them)::

    gate, up = split(x @ W_gate_up[pe].T)      column-parallel: this PE's intermediate columns
    p        = (silu(gate) * up) @ W_down[pe].T   row-parallel: a partial sum over the PEs
    x, residual = rmsnorm(all_reduce(p) + residual) * w_norm, all_reduce(p) + residual

symheap runs the last line as one call, ``symheap.fused.all_reduce_residual_rmsnorm`` (one
kernel per PE on CUDA). The reference is the same model, the same weights, with the last line
as ``torch.distributed.all_reduce`` + add + ``torch.nn.functional.rms_norm``: over NCCL when
every rank has its own GPU, otherwise (several PEs on one GPU, or CPU) over gloo on CPU copies
of ``p``. PE 0 prints which one it used. bf16 throughout.

Sizes: Llama-70B-like by default (hidden 8192, intermediate 28672 split over the PEs, 2 layers,
tokens 1, 16, 64); ``--small`` (automatic without CUDA) is hidden 512, intermediate 1536,
tokens 1 and 12. The model runs eagerly, under ``torch.compile(fullgraph=True)`` (inductor; on
the CPU too), and, on CUDA, captured in a CUDA graph replayed on new inputs; every output is
checked against the reference within bf16 tolerance::

    symheap launch -n 2 -- python examples/python/tp_mlp.py            # 2 PEs (may share a GPU)
    torchrun --nproc-per-node 2 examples/python/tp_mlp.py              # one GPU per rank
    SYMHEAP_BACKEND=host symheap launch -n 2 -- python examples/python/tp_mlp.py --small

Under either launcher the program makes the torch process group first and then
``symheap.init()`` joins through it (its store), so symheap's PEs are torch's ranks.
Exit status 0 when every PE's checks held, 1 otherwise, 77 (skipped) without PyTorch.
``bench/tp_fused_bench.py`` times the same block.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import symheap

try:
    import symheap.fused as fused
    import symheap.torch as st
    import torch
    import torch.nn.functional as F
except ImportError as e:  # exit 77 ("skipped") without PyTorch, as without the other requirements
    print(f"tp_mlp: skipped, {e}")
    sys.exit(77)

EPS = 1e-5
# bf16 has an 8-bit significand: 2^-8 relative per rounding. The reference rounds in other
# places (the all_reduce, then the add, in bf16) and compiled code fuses silu * up in fp32, so a
# few roundings apart, through two layers: |got - ref| <= ATOL + RTOL * |ref| for every element.
RTOL = 2.0**-5
ATOL = 2.0**-5


class TPMismatchError(symheap.SymheapError):
    """An output of the symheap model is outside bf16 tolerance of the reference."""


class TPSetupError(symheap.SymheapError):
    """Sizes or the launch environment do not fit the example (e.g. an intermediate size the
    PE count does not divide)."""


@dataclass
class Sizes:
    """The model's sizes: ``inter`` is the full intermediate size (each PE holds
    ``inter / n_pes`` of it)."""

    hidden: int
    inter: int
    layers: int
    tokens: Tuple[int, ...]


FULL = Sizes(hidden=8192, inter=28672, layers=2, tokens=(1, 16, 64))
SMALL = Sizes(hidden=512, inter=1536, layers=2, tokens=(1, 12))


# ---- the model ------------------------------------------------------------------------------


class Weights:
    """One PE's shards of every layer: ``gate_up[l]`` is ``(2 * inter / n, hidden)`` (this
    PE's gate rows, then its up rows), ``down[l]`` is ``(hidden, inter / n)``, ``norm[l]`` the
    RMSNorm weight ``(hidden,)`` (the same on every PE). Random, from ``seed`` and the PE, with
    scales that keep activations near 1."""

    def __init__(self, sizes: Sizes, pe: int, n: int, device: torch.device, seed: int = 0) -> None:
        if sizes.inter % n:
            raise TPSetupError(f"intermediate size {sizes.inter} is not divisible by {n} PEs")
        shard = sizes.inter // n
        h = sizes.hidden
        self.gate_up: List[torch.Tensor] = []
        self.down: List[torch.Tensor] = []
        self.norm: List[torch.Tensor] = []
        for layer in range(sizes.layers):
            g = torch.Generator(device=device).manual_seed(seed * 7919 + layer * 131 + pe + 1)
            gu = torch.randn(2 * shard, h, device=device, dtype=torch.bfloat16, generator=g)
            self.gate_up.append(gu.mul_(h**-0.5))
            dn = torch.randn(h, shard, device=device, dtype=torch.bfloat16, generator=g)
            self.down.append(dn.mul_(sizes.inter**-0.5))
            gn = torch.Generator(device=device).manual_seed(seed * 7919 + layer * 131)
            self.norm.append(1 + 0.1 * torch.randn(h, device=device, dtype=torch.bfloat16, generator=gn))


# The per-layer tail: (partial, residual, norm weight) -> (normed, new residual).
Tail = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def symheap_tail(p: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """symheap's fused all_reduce + residual add + RMSNorm (one kernel per PE on CUDA)."""
    out, res = fused.all_reduce_residual_rmsnorm(p, residual, w, EPS)
    return out, res


def dist_tail(group_on_cpu: bool) -> Tail:
    """The torch.distributed tail: all_reduce (in place on the device over NCCL, or over gloo on
    a CPU fp32 copy), then the residual add and ``F.rms_norm`` in bf16, as a model writes it."""
    import torch.distributed as dist

    def tail(p: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if group_on_cpu:
            c = p.float().cpu()
            dist.all_reduce(c)
            p = c.to(device=p.device, dtype=p.dtype)
        else:
            dist.all_reduce(p)
        r = p + residual
        return F.rms_norm(r, (r.shape[-1],), w, EPS), r

    return tail


class TPMLP(torch.nn.Module):
    """``layers`` Megatron MLP blocks over one PE's weight shards; ``tail`` is the all_reduce +
    residual + RMSNorm at the end of each (:func:`symheap_tail` or :func:`dist_tail`).
    ``forward(x, residual) -> (x, residual)`` after the last layer; ``x`` is ``(tokens,
    hidden)`` bf16, replicated on every PE."""

    def __init__(self, weights: Weights, tail: Tail) -> None:
        super().__init__()
        self.w = weights
        self.tail = tail

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One decode (or prefill) step through every layer."""
        for gu_w, down_w, norm_w in zip(self.w.gate_up, self.w.down, self.w.norm):
            gate, up = F.linear(x, gu_w).chunk(2, dim=-1)
            p = F.linear(F.silu(gate) * up, down_w)
            x, residual = self.tail(p, residual, norm_w)
        return x, residual


def inputs(tokens: int, hidden: int, device: torch.device, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(x, residual)`` for ``tokens`` rows: the same on every PE (a shared seed)."""
    g = torch.Generator(device=device).manual_seed(10_000 + seed)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, generator=g)
    return x, torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, generator=g)


# ---- launch: the process group, then symheap through it -------------------------------------


@dataclass
class Job:
    """This process's place in the job, once torch.distributed and symheap are initialised."""

    pe: int
    n: int
    device: torch.device
    reference: str  # "nccl" or "gloo": what the torch.distributed reference runs over

    @property
    def ref_on_cpu(self) -> bool:
        """Whether the reference's all_reduce goes over gloo on CPU copies."""
        return self.reference == "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_job() -> Job:
    """**Collective**: makes torch's default process group (NCCL when this is a CUDA job and every
    rank of this node has its own GPU, else gloo), then ``symheap.init()`` from it. Works under
    ``symheap launch`` and ``torchrun`` (both set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT); without a launcher, a job of one."""
    import torch.distributed as dist

    if "RANK" not in os.environ:  # no launcher: one process
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda = torch.cuda.is_available() and os.environ.get("SYMHEAP_BACKEND", "auto") != "host"
    own_gpu = cuda and torch.cuda.device_count() >= local_world
    timeout = datetime.timedelta(seconds=float(os.environ.get("SYMHEAP_TIMEOUT", "300") or 300))
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    if own_gpu:
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()), timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    symheap.init()
    dev = st.device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return Job(symheap.my_pe(), symheap.n_pes(), dev, "nccl" if own_gpu else "gloo")


def all_ranks_sum(job: Job, value: int) -> int:
    """**Collective**: the sum of ``value`` over every rank (torch.distributed)."""
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=job.device if job.reference == "nccl" else "cpu")
    dist.all_reduce(t)
    return int(t.item())


# ---- checks ---------------------------------------------------------------------------------


def mismatch(got: torch.Tensor, ref: torch.Tensor) -> Tuple[int, float, float]:
    """(elements outside ``ATOL + RTOL * |ref|`` or not finite, the largest absolute difference,
    the largest difference as a fraction of its element's tolerance)."""
    d = (got.float() - ref.float()).abs()
    tol = ATOL + RTOL * ref.float().abs()
    bad = int((d > tol).sum()) + int((~torch.isfinite(got)).sum())
    if not d.numel():
        return bad, 0.0, 0.0
    return bad, float(d.max()), float((d / tol).max())


def check(mode: str, tokens: int, got: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> List[str]:
    """Failures of ``got`` = (x, residual) against ``ref``; one line for PE 0's log either way."""
    fails = []
    worst, frac = 0.0, 0.0
    for name, a, b in zip(("out", "residual"), got, ref):
        bad, big, f = mismatch(a, b)
        worst, frac = max(worst, big), max(frac, f)
        if bad:
            fails.append(
                f"{mode}, tokens {tokens}: {bad} of {b.numel()} {name} values outside tolerance (max |d| {big:.4g})"
            )
    if symheap.my_pe() == 0:
        print(
            f"tp_mlp {mode:>16s} tokens {tokens:>4d}: max |got - ref| {worst:.4g} ({frac:.2f} of the tolerance)",
            flush=True,
        )
    return fails


# ---- the three ways of running it ---------------------------------------------------------


def run_eager(model: TPMLP, ref: TPMLP, sizes: Sizes, dev: torch.device) -> List[str]:
    """The symheap model eagerly at every token count, against the reference."""
    fails = []
    for t in sizes.tokens:
        x, r = inputs(t, sizes.hidden, dev, t)
        fails += check("eager", t, model(x, r), ref(x, r))
    return fails


def run_compiled(model: TPMLP, ref: TPMLP, sizes: Sizes, dev: torch.device, backend: str) -> List[str]:
    """``torch.compile(fullgraph=True)``: no graph break around symheap's op; same outputs."""
    comp = torch.compile(model, fullgraph=True, backend=backend)
    fails = []
    for t in sizes.tokens:
        x, r = inputs(t, sizes.hidden, dev, 100 + t)
        fails += check(f"compile/{backend}", t, comp(x, r), ref(x, r))
    return fails


def run_graphs(model: TPMLP, ref: TPMLP, sizes: Sizes, dev: torch.device, replays: int = 3) -> List[str]:
    """One CUDA graph per token count, captured once and replayed on ``replays`` new inputs
    copied into its static input tensors, each replay checked."""
    fails = []
    for t in sizes.tokens:
        sx, sr = inputs(t, sizes.hidden, dev, 200 + t)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up off the capture: cuBLAS handles, the workspace
            for _ in range(2):
                model(sx, sr)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = model(sx, sr)
        for rep in range(replays):
            x, r = inputs(t, sizes.hidden, dev, 300 + 17 * rep + t)
            sx.copy_(x)
            sr.copy_(r)
            g.replay()
            fails += check(f"cuda-graph/{rep}", t, outs, ref(x, r))
        torch.cuda.synchronize()
        del g
    return fails


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="small sizes (automatic without CUDA)")
    p.add_argument("--hidden", type=int, help="hidden size (default 8192, small 512)")
    p.add_argument("--intermediate", type=int, help="full intermediate size (default 28672, small 1536)")
    p.add_argument("--layers", type=int, help="MLP blocks in a row (default 2)")
    p.add_argument("--tokens", help="comma-separated token counts (default 1,16,64; small 1,12)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile run")
    p.add_argument("--no-graphs", action="store_true", help="skip the CUDA graph run")
    return p.parse_args(argv)


def sizes_from(args: argparse.Namespace, dev: torch.device) -> Sizes:
    """The sizes the arguments and the device ask for."""
    base = SMALL if (args.small or dev.type != "cuda") else FULL
    tokens = tuple(int(v) for v in args.tokens.split(",")) if args.tokens else base.tokens
    return Sizes(
        hidden=args.hidden or base.hidden,
        inter=args.intermediate or base.inter,
        layers=args.layers or base.layers,
        tokens=tokens,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the example; the exit status."""
    import torch.distributed as dist

    args = parse(argv)
    job = start_job()
    try:
        with torch.no_grad():
            sizes = sizes_from(args, job.device)
            weights = Weights(sizes, job.pe, job.n, job.device)
            model = TPMLP(weights, symheap_tail)
            ref = TPMLP(weights, dist_tail(job.ref_on_cpu))
            # The staging workspace for the largest call, before any capture.
            fused.reserve(max(sizes.tokens), sizes.hidden, torch.bfloat16)
            if job.pe == 0:
                how = "NCCL" if job.reference == "nccl" else "gloo on CPU copies"
                print(
                    f"tp_mlp: {job.n} PEs on {job.device.type}, hidden {sizes.hidden}, intermediate "
                    f"{sizes.inter} ({sizes.inter // job.n} per PE), {sizes.layers} layers, bf16; "
                    f"reference: torch.distributed over {how}",
                    flush=True,
                )
            fails = run_eager(model, ref, sizes, job.device)
            modes = ["eager"]
            if not args.no_compile:
                fails += run_compiled(model, ref, sizes, job.device, args.compile_backend)
                modes.append(f"torch.compile ({args.compile_backend})")
            if job.device.type == "cuda" and not args.no_graphs:
                fails += run_graphs(model, ref, sizes, job.device)
                modes.append("CUDA graphs")
            if job.device.type == "cuda":
                torch.cuda.synchronize()
        for f in fails:
            print(f"PE {job.pe}: tp_mlp FAILED: {f}", file=sys.stderr, flush=True)
        total = all_ranks_sum(job, len(fails))
        if job.pe == 0 and total == 0:
            print(
                f"tp_mlp OK: {job.n} PEs on {job.device.type}, hidden {sizes.hidden}, intermediate "
                f"{sizes.inter}, {sizes.layers} layers, tokens {','.join(map(str, sizes.tokens))}: "
                f"{', '.join(modes)} match torch.distributed ({job.reference})",
                flush=True,
            )
        symheap.finalize()
        return 0 if total == 0 else 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
