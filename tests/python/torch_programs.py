"""torch's own distributed code on a chosen torch.distributed backend (issue 42 item 8): DTensor
(``distribute_tensor``, ``redistribute``, ``parallelize_module``), FSDP2 ``fully_shard``, DDP and
the functional collectives under ``torch.compile``. test_torch_programs.py runs this file once
over gloo and once over symheap at each rank count and compares what the ranks saved.

``python torch_programs.py DEVICE:BACKEND OUTDIR CHECK...`` under ``symheap launch`` (or
torchrun): ``cpu:gloo``, ``cpu:symheap``, ``cuda:nccl`` or ``cuda:symheap`` (CUDA: rank r uses
GPU r mod the GPU count; torch.compile uses inductor with mode "reduce-overhead", CUDA graphs,
where CPU uses "aot_eager"); every rank runs the CHECKs in order and saves
``OUTDIR/rank{r}.pt``: ``{check: {"error": None or the traceback, "values": {name: tensor},
"secs": float}}``. Each check also asserts its values against a single-process reference
computed from the same seeds (exactly where the data are integers), so a check fails on either
backend alone; a failed check is recorded and the next one runs.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import traceback
from datetime import timedelta
from typing import Callable, Dict, List

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

Values = Dict[str, torch.Tensor]
DEV = torch.device("cpu")  # set by main()
CHECKS: Dict[str, Callable[[int, int], Dict]] = {}


def check(fn: Callable[[int, int], Dict]) -> Callable[[int, int], Dict]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def init(spec: str) -> None:
    """The default process group: ``spec`` is DEVICE:BACKEND; sets :data:`DEV`."""
    global DEV
    device, backend = spec.split(":")
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        DEV = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(DEV)
    if backend == "symheap":
        import symheap.distributed  # noqa: F401  (registers the "symheap" backend)
    dist.init_process_group(spec, timeout=timedelta(seconds=60))


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ints(seed: int, *shape: int, lo: int = -3, hi: int = 4) -> torch.Tensor:
    """Integer values in float32 on :data:`DEV`: every sum and product the checks make is exact."""
    return torch.randint(lo, hi, shape, generator=gen(seed)).float().to(DEV)


def randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen(seed)).to(DEV)


def equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(got, want), f"{what}: differs\ngot  {got}\nwant {want}"


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def shard(t: torch.Tensor, dim: int, r: int, n: int) -> torch.Tensor:
    """Rank r's piece of ``t`` under ``Shard(dim)``: torch.chunk's pieces, empty past them."""
    pieces = list(torch.chunk(t, n, dim))
    if r < len(pieces):
        return pieces[r]
    shape = list(t.shape)
    shape[dim] = 0
    return t.new_empty(shape)


def mesh1d(n: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(DEV.type, (n,))


# ---------------------------------------------------------------- DTensor


@check
def check_dtensor(r: int, n: int) -> Values:
    """distribute_tensor from rank 0 (Shard and Replicate, uneven rows, an empty shard at 4
    ranks), then redistribute between Shard(0), Shard(1), Replicate and Partial (sum, max),
    and a DTensor reduction whose result is Partial."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = mesh1d(n)
    rows, cols = 2 * n + 1, 6
    x = ints(1, rows, cols, lo=-50, hi=50)
    mine = x + 1000 * r  # only rank 0's data may arrive: distribute_tensor sends from rank 0
    v: Values = {}

    s0 = distribute_tensor(mine, mesh, [Shard(0)])
    equal(s0.to_local(), shard(x, 0, r, n), "distribute_tensor Shard(0)")
    equal(s0.full_tensor(), x, "Shard(0).full_tensor()")
    rep = distribute_tensor(mine, mesh, [Replicate()])
    equal(rep.to_local(), x, "distribute_tensor Replicate")
    s1 = s0.redistribute(mesh, [Shard(1)])
    equal(s1.to_local(), shard(x, 1, r, n), "Shard(0) -> Shard(1)")
    back = s1.redistribute(mesh, [Shard(0)])
    equal(back.to_local(), shard(x, 0, r, n), "Shard(1) -> Shard(0)")
    equal(s1.redistribute(mesh, [Replicate()]).to_local(), x, "Shard(1) -> Replicate")
    equal(rep.redistribute(mesh, [Shard(1)]).to_local(), shard(x, 1, r, n), "Replicate -> Shard(1)")

    ys = [ints(10 + k, rows, cols, lo=-50, hi=50) for k in range(n)]
    total = torch.stack(ys).sum(0)
    p = DTensor.from_local(ys[r], mesh, [Partial()])
    equal(p.redistribute(mesh, [Replicate()]).to_local(), total, "Partial(sum) -> Replicate")
    equal(p.redistribute(mesh, [Shard(0)]).to_local(), shard(total, 0, r, n), "Partial(sum) -> Shard(0)")
    equal(p.redistribute(mesh, [Shard(1)]).to_local(), shard(total, 1, r, n), "Partial(sum) -> Shard(1)")
    pmax = DTensor.from_local(ys[r], mesh, [Partial("max")])
    equal(pmax.full_tensor(), torch.stack(ys).max(0).values, "Partial(max) -> Replicate")
    red = (s0 * 2).sum(0)  # a reduction over the sharded dim: a Partial result
    equal(red.full_tensor(), (x * 2).sum(0), "sum over Shard(0)")
    v["s0"], v["s1"], v["partial_s0"], v["red"] = s0.to_local(), s1.to_local(), total, red.full_tensor()
    return v


class MLP(nn.Module):
    def __init__(self, d: int = 8, h: int = 12, norm: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(d) if norm else nn.Identity()
        self.w1 = nn.Linear(d, h)
        self.w2 = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.relu(self.w1(self.norm(x))))


def int_weights(m: nn.Module, seed: int) -> nn.Module:
    with torch.no_grad():
        for k, p in enumerate(m.parameters()):
            p.copy_(ints(seed + k, *p.shape, lo=-2, hi=3))
    return m


def grads(m: nn.Module) -> Values:
    """Every parameter's gradient as a full tensor (DTensor gradients gathered)."""
    out = {}
    for name, p in m.named_parameters():
        g = p.grad
        out[name] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out


@check
def check_tp_mlp(r: int, n: int) -> Values:
    """parallelize_module with ColwiseParallel and RowwiseParallel on a 2-layer MLP, integer
    weights and inputs: forward output and every gradient equal the single-process model's."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = mesh1d(n)
    ref = int_weights(MLP().to(DEV), 20)
    with torch.no_grad():
        # RowwiseParallel adds the bias to a Partial sum as bias / n on each rank: a multiple
        # of 12 divides exactly at 2, 3 and 4 ranks.
        ref.w2.bias.mul_(12)
    model = parallelize_module(copy.deepcopy(ref), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    x = ints(21, 4, 8)
    t = ints(22, 4, 8)
    y = model(x)
    (y * t).sum().backward()
    yr = ref(x)
    (yr * t).sum().backward()
    equal(y, yr, "TP forward")
    v: Values = {"y": y.detach()}
    want = grads(ref)
    for name, g in grads(model).items():
        equal(g, want[name], f"TP grad {name}")
        v[f"grad.{name}"] = g
    equal(model.w1.weight.to_local(), shard(ref.w1.weight.detach(), 0, r, n), "ColwiseParallel weight shard")
    return v


@check
def check_sp_mlp(r: int, n: int) -> Values:
    """SequenceParallel LayerNorm, then ColwiseParallel(input Shard(1)) and RowwiseParallel
    (output Shard(1)): each rank feeds its slice of the sequence; its output slice and the
    gradients match the single-process model (float data, tolerance)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = mesh1d(n)
    torch.manual_seed(30)
    ref = MLP(norm=True).to(DEV)
    plan = {
        "norm": SequenceParallel(),
        "w1": ColwiseParallel(input_layouts=Shard(1)),
        "w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    model = parallelize_module(copy.deepcopy(ref), mesh, plan)
    seq = 3 * n
    x = randn(31, 2, seq, 8)
    t = randn(32, 2, seq, 8)
    mine = slice(3 * r, 3 * r + 3)
    y = model(x[:, mine])
    (y * t[:, mine]).sum().backward()
    yr = ref(x)
    (yr * t).sum().backward()
    close(y, yr[:, mine].detach(), "SP forward slice")
    v: Values = {"y": y.detach()}
    want = grads(ref)
    for name, g in grads(model).items():
        close(g, want[name], f"SP grad {name}")
        v[f"grad.{name}"] = g
    return v


# ---------------------------------------------------------------- FSDP2 and DDP


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Tiny(nn.Module):
    """A 2-layer decoder: vocabulary 32, width 16, 2 heads."""

    def __init__(self, vocab: int = 32, d: int = 16, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, 2) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def full_params(m: nn.Module) -> Values:
    out = {}
    for name, p in m.named_parameters():
        t = p.detach()
        out[name] = t.full_tensor() if hasattr(t, "full_tensor") else t
    return out


@check
def check_fsdp_transformer(r: int, n: int) -> Values:
    """fully_shard on each block and the root of a tiny transformer, 3 SGD steps, each rank its
    own batch: losses and parameters match a single-process model trained on the mean of the
    ranks' losses (float, tolerance)."""
    from torch.distributed.fsdp import fully_shard

    mesh = mesh1d(n)
    torch.manual_seed(40)
    ref = Tiny().to(DEV)
    model = copy.deepcopy(ref)
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    v: Values = {}
    for step in range(3):
        toks = [torch.randint(0, 32, (2, 9), generator=gen(100 * step + k)).to(DEV) for k in range(n)]
        loss = F.cross_entropy(model(toks[r][:, :-1]).flatten(0, 1), toks[r][:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses = [F.cross_entropy(ref(t[:, :-1]).flatten(0, 1), t[:, 1:].flatten()) for t in toks]
        (torch.stack(ref_losses).mean()).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        close(loss.detach(), ref_losses[r].detach(), f"loss at step {step}")
        v[f"loss{step}"] = loss.detach()
    want = full_params(ref)
    for name, p in full_params(model).items():
        close(p, want[name], f"FSDP parameter {name} after 3 steps")
        v[name] = p
    return v


def int_mlp(seed: int) -> nn.Module:
    """Linear(4, 8) ReLU Linear(8, 4) without biases, integer weights."""
    return int_weights(nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU(), nn.Linear(8, 4, bias=False)).to(DEV), seed)


def int_steps(model: nn.Module, ref: nn.Module, r: int, n: int, seed: int, params: nn.Module) -> Values:
    """3 SGD steps (lr 1/2) of ``model`` (data parallel, rank r's batch) and ``ref`` (every
    batch), integer data, then ``params``'s parameters are compared. Each rank's loss is scaled
    by n so that the data-parallel mean of the gradients is a sum of integers. The reference
    runs in float64: equality with it shows that no fp32 sum rounded."""
    ref = ref.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for step in range(3):
        xs = [ints(seed + 10 * step + k, 3, 4) for k in range(n)]
        ts = [ints(seed + 10 * step + k + 5, 3, 4, lo=-1, hi=2) for k in range(n)]
        (n * (model(xs[r]) * ts[r]).sum()).backward()
        opt.step()
        opt.zero_grad()
        sum((ref(x.double()) * t.double()).sum() for x, t in zip(xs, ts)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    want = full_params(ref)
    v: Values = {}
    for name, p in full_params(params).items():
        assert want[name].abs().max() < 2**20, f"{name} grew past exact fp32 integers"
        equal(p.double(), want[name], f"parameter {name} after 3 steps")
        v[name] = p
    return v


@check
def check_fsdp_int(r: int, n: int) -> Values:
    """fully_shard on an integer-weight MLP (each Linear and the root), integer data: after 3
    SGD steps the parameters equal the float64 single-process run exactly."""
    from torch.distributed.fsdp import fully_shard

    mesh = mesh1d(n)
    ref = int_mlp(50)
    model = copy.deepcopy(ref)
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return int_steps(model, ref, r, n, 51, model)


@check
def check_ddp(r: int, n: int) -> Values:
    """DistributedDataParallel (small buckets: several all-reduces a step) on an integer-weight
    MLP, integer data, 3 SGD steps: parameters equal the float64 single-process run exactly,
    and the initial broadcast made every rank start from rank 0's weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ref = int_mlp(60)
    model = copy.deepcopy(ref)
    if r != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(100)  # DDP's constructor broadcasts rank 0's parameters
    ddp = DDP(model, bucket_cap_mb=1e-4)
    return int_steps(ddp, ref, r, n, 61, model)


# ---------------------------------------------------------------- torch.compile


@check
def check_compile_funcol(r: int, n: int) -> Values:
    """The functional collectives (all_reduce, all_gather_tensor, reduce_scatter_tensor,
    all_to_all_single even and uneven) inside torch.compile(fullgraph=True), backend
    "aot_eager" on CPU, inductor with CUDA graphs (mode "reduce-overhead") on CUDA: one graph,
    no graph break, no recompilation over 3 calls on new data (on CUDA: warm-up, recording,
    replay), results equal to eager and to the values expected from the seeds."""
    import torch._dynamo
    import torch.distributed._functional_collectives as funcol
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    group = dist.group.WORLD

    def split(src: int, dst: int) -> int:
        return (2 * src + dst) % 3 + 1

    send = [split(r, j) for j in range(n)]
    recv = [split(j, r) for j in range(n)]

    def f(x, y, z):
        a = funcol.all_reduce(x, "sum", group)
        m = funcol.all_reduce(x, "max", group)
        b = funcol.all_gather_tensor(x, 0, group)
        c = funcol.reduce_scatter_tensor(y, "sum", 0, group)
        d = funcol.all_to_all_single(y, None, None, group)
        e = funcol.all_to_all_single(z, recv, send, group)
        return a * 2 + m, b + 1, c, d, e

    torch._dynamo.reset()
    counters.clear()
    if DEV.type == "cpu":
        cnt = CompileCounterWithBackend("aot_eager")
        cf = torch.compile(f, backend=cnt, fullgraph=True)
    else:
        cnt = None
        cf = torch.compile(f, backend="inductor", mode="reduce-overhead", fullgraph=True)
    v: Values = {}
    for it in range(3):
        xs = [ints(70 + 10 * it + k, 3, 5, lo=-9, hi=10) for k in range(n)]
        ys = [ints(80 + 10 * it + k, 2 * n, 5, lo=-9, hi=10) for k in range(n)]

        def rows(src: int, dst: int, it: int = it) -> torch.Tensor:
            k = split(src, dst)
            base = torch.full((k, 2), 1000.0 * it + 100 * src + 10 * dst, device=DEV)
            return base + torch.arange(k, device=DEV).unsqueeze(1)

        z = torch.cat([rows(r, j) for j in range(n)])
        got = [t.clone() for t in cf(xs[r], ys[r], z)]  # CUDA graph outputs are reused
        eager = f(xs[r], ys[r], z)
        stack_y = torch.stack(ys)
        want = (
            torch.stack(xs).sum(0) * 2 + torch.stack(xs).max(0).values,
            torch.cat(xs) + 1,
            stack_y.sum(0)[2 * r : 2 * r + 2],
            torch.cat([y[2 * r : 2 * r + 2] for y in ys]),
            torch.cat([rows(j, r) for j in range(n)]),
        )
        for k, (g, e, w) in enumerate(zip(got, eager, want)):
            equal(g, w, f"compiled output {k} (call {it})")
            equal(e, w, f"eager output {k} (call {it})")
            v[f"out{k}.{it}"] = g
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1, f"{graphs} graphs compiled (a graph break or a recompile)"
    assert cnt is None or cnt.frame_count == 1, f"{cnt.frame_count} frames compiled"
    assert not counters["graph_break"], f"graph breaks: {dict(counters['graph_break'])}"
    return v


# ---------------------------------------------------------------- faults (symheap only)
# Each leaves the group failed: run one of them alone, last, in its own job.


def caught(fn: Callable[[], None]) -> Dict[str, object]:
    """What ``fn`` raised (it must raise), with how long it took."""
    import symheap

    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:
        return {
            "raised": type(e).__module__ + "." + type(e).__qualname__,
            "message": str(e),
            "runtime_error": isinstance(e, RuntimeError),
            "symheap_error": isinstance(e, symheap.SymheapError),
            "secs_to_error": time.monotonic() - t0,
        }
    raise AssertionError("no error was raised")


@check
def check_diverge(r: int, n: int) -> Dict[str, object]:
    """Two matching calls, then the last rank skips an all_reduce and calls broadcast, which
    the others call next: every rank's dist call raises."""
    x = torch.full((4,), float(r), device=DEV)
    dist.all_reduce(x)
    out = torch.empty(4 * n, device=DEV)
    dist.all_gather_into_tensor(out, x)

    def diverge() -> None:
        if r != n - 1:
            dist.all_reduce(x)
        dist.broadcast(x, 0)
        dist.barrier()

    return caught(diverge)


@check
def check_kill(r: int, n: int) -> Dict[str, object]:
    """After a matching all_reduce and barrier, rank 1 leaves with os._exit (no finalize, no
    goodbye); the others' next all_reduce raises."""
    x = torch.full((4,), float(r), device=DEV)
    dist.all_reduce(x)
    dist.barrier()
    if r == 1:
        os._exit(9)

    def reduce_more() -> None:
        for _ in range(1000):
            dist.all_reduce(x)

    return caught(reduce_more)


FAULTS = {"diverge", "kill"}


def plain(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor to save (a functional collective's result may still be an
    AsyncCollectiveTensor, which torch.load refuses)."""
    if hasattr(t, "trigger_wait"):
        t = t.trigger_wait()
    t = t.detach().cpu().clone()
    assert type(t) is torch.Tensor, type(t)
    return t


def main(argv: List[str]) -> int:
    spec, out, names = argv[0], argv[1], argv[2:]
    init(spec)
    r, n = dist.get_rank(), dist.get_world_size()
    results = {}
    for name in names:
        t0 = time.monotonic()
        try:
            got = CHECKS[name](r, n)
            values, error = {k: plain(t) if isinstance(t, torch.Tensor) else t for k, t in got.items()}, None
        except Exception:
            values, error = {}, traceback.format_exc()
            print(f"[rank {r}] {name} FAILED\n{error}", file=sys.stderr, flush=True)
        results[name] = {"error": error, "values": values, "secs": time.monotonic() - t0}
    torch.save(results, os.path.join(out, f"rank{r}.pt"))
    if FAULTS.isdisjoint(names):
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
