"""symheap's fused all_reduce + residual + RMSNorm and the tensor-parallel MLP block of
examples/python/tp_mlp.py against the peers, in one job (issue 21, item 7). bf16, hidden 8192.

Measured (the peer method of bench/peer_common.py: median over trials of K back-to-back calls / K,
eagerly and replayed from a CUDA graph of K captured calls; the graph number is the one compared):

1. ``fused_ar_rmsnorm`` at tokens 1, 2, 4, 8, 16, 32, 64, 128, 512: symheap's
   ``all_reduce_residual_rmsnorm``; NCCL through ``torch.distributed.all_reduce`` + torch's add +
   ``F.rms_norm`` (eager ops, and the add + RMSNorm as one ``torch.compile``d kernel); torch
   SymmetricMemory's ``one_shot_all_reduce_out`` / ``two_shot_all_reduce_`` (input already in its
   symmetric buffer) + the same add + RMSNorm; FlashInfer's fused ``trtllm_allreduce_fusion``
   (pattern ``kARResidualRMSNorm``, one-shot and two-shot), when ``flashinfer`` imports, else a
   line saying why not.
2. ``tp_mlp_step``: one Llama-70B-like MLP block (hidden 8192, intermediate 28672 / ranks), a
   decode step of 1 to 64 tokens under CUDA graphs, with symheap's fused tail and with the
   torch.distributed NCCL tail.
3. ``call_overhead``: eager host time per call of ``torch.ops.symheap.all_reduce_`` against
   ``symheap.all_reduce(t, stream=...)``, the same symmetric 8 KiB tensor, many calls.
4. ``all_reduce`` through ``torch.ops.symheap.all_reduce_`` of an ordinary tensor against a
   symmetric one, 8 KiB to 512 KiB, eager and CUDA graph.

Prints markdown tables with the ratios the targets are decided by (``peer time / symheap
time``: above 1 is symheap faster) and writes every row as JSON in the peer format
``{op, bytes, name, us, eager_us}`` (``us``: CUDA graph; host times for ``call_overhead``).

Launch (one rank per GPU; NCCL, SymmetricMemory and FlashInfer refuse two ranks on one GPU):

    torchrun --standalone --nproc-per-node 2 bench/tp_fused_bench.py OUT.json
    python3 -m symheap launch -n 2 -- python3 bench/tp_fused_bench.py OUT.json --symheap-only

``--symheap-only`` (automatic when ranks share a GPU) measures symheap alone: with PEs sharing
one GPU that is a code-path check, not a speed comparison. ``--quick`` fewer token counts."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples" / "python"))

import peer_common as pc  # noqa: E402
import symheap  # noqa: E402
import symheap.fused as fused  # noqa: E402
import symheap.ops  # noqa: E402, F401 - registers torch.ops.symheap.*
import symheap.torch as st  # noqa: E402
import tp_mlp  # noqa: E402

HIDDEN = 8192
FUSED_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
BLOCK_TOKENS = (1, 2, 4, 8, 16, 32, 64)
TARGET_MAX_TOKENS = 128  # the fused op's targets hold at 1..128 tokens
EPS = tp_mlp.EPS
SYM = "symheap fused"
NCCL = "NCCL all_reduce + torch add + rms_norm"
NCCL_C = "NCCL all_reduce + compiled add+rms_norm"


# PEs sharing a GPU time-slice it, so a collective waits for the other process's slice: fewer
# calls and trials then (a code-path check; its times mean nothing).
LIGHT = {"on": False}
# Peers that could not run, and why: printed under the tables.
NOTES: List[str] = []


class Boot:
    """What peer_common's timers need from a job: a barrier and a voice (rank 0)."""

    def __init__(self, job: tp_mlp.Job) -> None:
        import torch.distributed as dist

        self.job, self.dist, self.rank = job, dist, job.pe

    def barrier(self) -> None:
        """Drains this GPU's work, then meets the other ranks."""
        torch.cuda.synchronize()
        self.dist.barrier()

    def say(self, msg: str) -> None:
        """Prints on rank 0 (stderr)."""
        if self.rank == 0:
            print(msg, file=sys.stderr, flush=True)


def timed(
    boot: Boot,
    rows: List[Dict[str, Any]],
    op: str,
    nbytes: int,
    name: str,
    fn: Callable[[], Any],
    k: int = 0,
    trials: int = 0,
) -> None:
    """Appends ``{op, bytes, name, us, eager_us}`` for ``fn`` (K and trials as the peer sweep
    unless given); a failure is printed with its reason and the bench goes on."""
    dk, dt = pc.k_trials(nbytes)
    k, trials = k or dk, trials or dt
    if LIGHT["on"]:
        k, trials = min(k, 5), 3
    try:
        e = pc.eager_us(boot, fn, k, trials)
        g = pc.graph_us(boot, fn, k, trials)
        rows.append({"op": op, "bytes": nbytes, "name": name, "us": g, "eager_us": e})
    except Exception as ex:  # noqa: BLE001 - one variant's failure is a finding, not the end
        boot.say(f"tp_fused_bench: {name} {op} {nbytes} B not measured: {type(ex).__name__}: {ex}"[:500])
        torch.cuda.synchronize()


# ---- 1. the fused op and its peers ----------------------------------------------------------


def _add_rmsnorm(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, ro: torch.Tensor) -> torch.Tensor:
    torch.add(x, res, out=ro)
    return F.rms_norm(ro, (ro.shape[-1],), w, EPS)


def _compiled_add_rmsnorm() -> Callable[..., Any]:
    def f(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor):
        r = x + res
        return F.rms_norm(r, (r.shape[-1],), w, EPS), r

    return torch.compile(f, dynamic=True, fullgraph=True)


def _flashinfer(boot: Boot, max_tokens: int) -> Optional[Dict[str, Any]]:
    """FlashInfer's fused all_reduce + residual + RMSNorm set up for ``max_tokens`` x HIDDEN,
    or None with a line saying exactly why it cannot run here."""
    try:
        import flashinfer
        import flashinfer.comm as fc
    except Exception as e:  # noqa: BLE001 - say why there is no FlashInfer column
        NOTES.append(
            f"FlashInfer allreduce_fusion: not measured: `import flashinfer` failed here ({type(e).__name__}: {e}); "
            "on symheap's GPU machine it is not installed, and flashinfer-python 0.7.2.post1 (62 MB, needing "
            "tvm-ffi, nvidia-cutlass-dsl, cudnn-frontend, nccl4py...) does not fit the 64 MiB the device call "
            "carries next to symheap's binaries"
        )
        boot.say("tp_fused_bench: " + NOTES[-1])
        return None
    try:
        dist = boot.dist
        handles, ws, meta = fc.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            boot.rank, boot.job.n, max_tokens, HIDDEN, group=dist.group.WORLD, create_metadata=True
        )
    except Exception as e:  # noqa: BLE001 - e.g. a world size the kernels do not take
        boot.say(
            f"tp_fused_bench: FlashInfer {flashinfer.__version__}: no IPC workspace: {type(e).__name__}: {e}"[:600]
        )
        return None
    return {"fc": fc, "handles": handles, "ws": ws, "meta": meta, "version": flashinfer.__version__}


def _fi_call(fi: Dict[str, Any], boot: Boot, x, res, w, ro, out, oneshot: bool) -> Callable[[], None]:
    fc = fi["fc"]

    def f() -> None:
        fc.trtllm_allreduce_fusion(
            allreduce_in=x,
            world_size=boot.job.n,
            world_rank=boot.rank,
            token_num=x.shape[0],
            hidden_dim=HIDDEN,
            workspace_ptrs=fi["ws"],
            launch_with_pdl=False,
            trigger_completion_at_end=True,
            fp32_acc=True,
            pattern_code=fc.AllReduceFusionPattern.kARResidualRMSNorm,
            use_oneshot=oneshot,
            allreduce_out=None,
            residual_in=res,
            residual_out=ro,
            norm_out=out,
            quant_out=None,
            scale_out=None,
            rms_gamma=w,
            rms_eps=EPS,
            scale_factor=None,
            layout_code=None,
            metadata=fi["meta"],
        )

    return f


def bench_fused(boot: Boot, rows: List[Dict[str, Any]], tokens: Sequence[int], peers: bool, compile_peer: bool) -> None:
    """Row set 1: the fused op and, with ``peers``, every peer's way of doing the same."""
    dev = boot.job.device
    dist = boot.dist
    fused.reserve(max(tokens), HIDDEN, torch.bfloat16)
    fi = _flashinfer(boot, max(tokens)) if peers else None
    comp = _compiled_add_rmsnorm() if peers and compile_peer else None
    group = dist.group.WORLD.group_name if peers else None
    w = 1 + 0.1 * pc.bf16(HIDDEN, dev, 5)
    for t in tokens:
        nbytes = t * HIDDEN * 2
        x = pc.bf16(t * HIDDEN, dev, 1 + boot.rank).view(t, HIDDEN)
        res = pc.bf16(t * HIDDEN, dev, 2).view(t, HIDDEN)
        out, ro = torch.empty_like(x), torch.empty_like(x)
        timed(
            boot,
            rows,
            "fused_ar_rmsnorm",
            nbytes,
            SYM,
            lambda x=x, res=res, out=out, ro=ro: fused.all_reduce_residual_rmsnorm(
                x, res, w, EPS, out=out, residual_out=ro
            ),
        )
        if not peers:
            continue
        y = x.clone()

        def nccl(y=y, res=res, ro=ro) -> None:
            dist.all_reduce(y)
            _add_rmsnorm(y, res, w, ro)

        timed(boot, rows, "fused_ar_rmsnorm", nbytes, NCCL, nccl)
        if comp is not None:

            def nccl_c(y=y, res=res) -> None:
                dist.all_reduce(y)
                comp(y, res, w)

            timed(boot, rows, "fused_ar_rmsnorm", nbytes, NCCL_C, nccl_c)
        _symm_mem(boot, rows, t, x, res, w, ro, group)
        if fi is not None:
            for variant, oneshot in (("one-shot", True), ("two-shot", False)):
                name = f"FlashInfer {fi['version']} allreduce_fusion {variant}"
                timed(boot, rows, "fused_ar_rmsnorm", nbytes, name, _fi_call(fi, boot, x, res, w, ro, out, oneshot))
    if fi is not None:
        torch.cuda.synchronize()
        fi["fc"].trtllm_destroy_ipc_workspace_for_all_reduce_fusion(fi["handles"], dist.group.WORLD)


def _symm_mem(boot: Boot, rows, t: int, x, res, w, ro, group: str) -> None:
    """torch SymmetricMemory one_shot / two_shot all_reduce (its input already in its symmetric
    buffer, as a producer would leave it) + add + rms_norm."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        buf = symm_mem.empty(t, HIDDEN, dtype=torch.bfloat16, device=boot.job.device)
        buf.copy_(x)
        symm_mem.rendezvous(buf, group)
    except Exception as e:  # noqa: BLE001
        boot.say(f"tp_fused_bench: torch SymmetricMemory not measured at {t} tokens: {type(e).__name__}: {e}"[:500])
        return
    ar = torch.empty_like(x)
    nbytes = t * HIDDEN * 2
    v = torch.__version__

    def one() -> None:
        torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group, ar)
        _add_rmsnorm(ar, res, w, ro)

    def two() -> None:
        torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group)
        _add_rmsnorm(buf, res, w, ro)

    timed(boot, rows, "fused_ar_rmsnorm", nbytes, f"torch {v} symm_mem one_shot + add + rms_norm", one)
    timed(boot, rows, "fused_ar_rmsnorm", nbytes, f"torch {v} symm_mem two_shot + add + rms_norm", two)


# ---- 2. the TP block ------------------------------------------------------------------------


def bench_block(boot: Boot, rows: List[Dict[str, Any]], tokens: Sequence[int], peers: bool) -> None:
    """Row set 2: one MLP block's decode step, symheap's tail against NCCL's (CUDA graphs)."""
    job = boot.job
    sizes = tp_mlp.Sizes(hidden=HIDDEN, inter=28672, layers=1, tokens=tuple(tokens))
    weights = tp_mlp.Weights(sizes, job.pe, job.n, job.device)
    variants = [("tp_mlp symheap", tp_mlp.TPMLP(weights, tp_mlp.symheap_tail))]
    if peers:
        variants.append(("tp_mlp NCCL", tp_mlp.TPMLP(weights, tp_mlp.dist_tail(False))))
    fused.reserve(max(tokens), HIDDEN, torch.bfloat16)
    for t in tokens:
        x, r = tp_mlp.inputs(t, HIDDEN, job.device, t)
        for name, model in variants:
            timed(
                boot,
                rows,
                "tp_mlp_step",
                t * HIDDEN * 2,
                name,
                lambda model=model, x=x, r=r: model(x, r),
                k=10,
                trials=9,
            )
    del weights


# ---- 3. the cost of the torch.library registration ------------------------------------------


def _host_us(boot: Boot, fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """Median over rounds of host wall time per call (``calls`` calls, fewer than the launch
    queue holds, so the host never waits for the GPU), in microseconds."""
    ts = []
    for _ in range(rounds):
        boot.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ts.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(ts)


def bench_overhead(boot: Boot, rows: List[Dict[str, Any]], calls: int = 200, rounds: int = 31) -> None:
    """Row set 3: ``torch.ops.symheap.all_reduce_`` against the direct call, same tensor."""
    if LIGHT["on"]:
        calls, rounds = 50, 3
    t = st.empty(4096, dtype=torch.bfloat16)
    t.fill_(0)
    s = torch.cuda.current_stream()
    op = torch.ops.symheap.all_reduce_

    def via_op() -> None:
        op(t, "sum", 0)

    def direct() -> None:
        symheap.all_reduce(t, stream=s)

    def public() -> None:
        symheap.ops.all_reduce_(t)

    noop_op, plain = _noop_floor()

    def via_noop() -> None:
        noop_op(t, "sum", 0)

    def via_plain() -> None:
        plain(t, "sum", 0)

    fns = (via_op, direct, public, via_noop, via_plain)
    for fn in fns:  # warm-up
        for _ in range(20):
            fn()
    got: List[List[float]] = [[] for _ in fns]
    for _ in range(3):  # interleaved, against drift
        for g, fn in zip(got, fns):
            g.append(_host_us(boot, fn, calls, rounds))
    for name, v in zip(
        (
            "symheap torch.ops.symheap.all_reduce_ (host)",
            "symheap.all_reduce(stream=) direct (host)",
            "symheap symheap.ops.all_reduce_ eager (host)",
            "floor: torch.library op with an empty Python kernel (host)",
            "floor: the empty Python function called directly (host)",
        ),
        (min(g) for g in got),
    ):
        rows.append({"op": "call_overhead", "bytes": 8192, "name": name, "us": v, "eager_us": v})
    torch.cuda.synchronize()
    st.free(t)


_NOOP: List[Any] = []


def _noop_floor() -> Any:
    """An op with the all_reduce_ schema and an empty Python kernel, registered the way
    symheap's are (one ``CompositeExplicitAutograd`` kernel), and that kernel as a plain
    function: the dispatcher's own cost of a Python-kernel op is their difference."""
    if not _NOOP:

        def noop(x: torch.Tensor, op: str = "sum", team: int = 0) -> None:
            return None

        lib = torch.library.Library("symheap_bench", "FRAGMENT")
        lib.define("noop_" + torch.library.infer_schema(noop, mutates_args=("x",)))
        lib.impl("noop_", noop, "CompositeExplicitAutograd")
        _NOOP.extend([lib, torch.ops.symheap_bench.noop_.default, noop])
    return _NOOP[1], _NOOP[2]


# ---- 4. ordinary against symmetric tensors --------------------------------------------------


def bench_ordinary(
    boot: Boot, rows: List[Dict[str, Any]], sizes: Sequence[int] = (8 << 10, 64 << 10, 512 << 10)
) -> None:
    """Row set 4: ``torch.ops.symheap.all_reduce_`` on an ordinary CUDA tensor and on a
    symmetric one of the same size."""
    op = torch.ops.symheap.all_reduce_
    for nbytes in sizes:
        sym = st.empty(nbytes // 2, dtype=torch.bfloat16)
        sym.copy_(pc.bf16(nbytes // 2, boot.job.device, 7))
        ordinary = sym.clone()
        timed(
            boot,
            rows,
            "all_reduce",
            nbytes,
            "symheap torch.ops all_reduce_ symmetric",
            lambda sym=sym: op(sym, "sum", 0),
        )
        timed(
            boot,
            rows,
            "all_reduce",
            nbytes,
            "symheap torch.ops all_reduce_ ordinary",
            lambda o=ordinary: op(o, "sum", 0),
        )
        torch.cuda.synchronize()
        st.free(sym)


# ---- the report -----------------------------------------------------------------------------


def _us(rows, op: str, name_start: str, nbytes: int, key: str = "us") -> Optional[float]:
    """The best (smallest) time of the rows of ``op`` at ``nbytes`` whose name starts so."""
    v = [r[key] for r in rows if r["op"] == op and r["bytes"] == nbytes and r["name"].startswith(name_start)]
    return min(v) if v else None


def _f(v: Optional[float], fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _ratio(peer: Optional[float], mine: Optional[float]) -> Optional[float]:
    return None if peer is None or mine is None or mine <= 0 else peer / mine


def _verdict(vals: Sequence[Optional[float]], ok: Callable[[float], bool]) -> str:
    if not vals or any(v is None for v in vals):
        return "not measured"
    return "PASS" if all(ok(v) for v in vals) else "FAIL"


def report_fused(rows, tokens: Sequence[int]) -> List[str]:
    """The fused op's table and its two targets."""
    out = [
        "| tokens x 8192 | symheap fused us | NCCL+RMSNorm best us | symm_mem+RMSNorm best us "
        "| FlashInfer fused best us | NCCL / symheap | FlashInfer / symheap |",
        "|---|---|---|---|---|---|---|",
    ]
    vs_nccl, vs_fi = [], []
    for t in tokens:
        b = t * HIDDEN * 2
        me = _us(rows, "fused_ar_rmsnorm", SYM, b)
        nccl = _us(rows, "fused_ar_rmsnorm", "NCCL", b)
        sm = _us(rows, "fused_ar_rmsnorm", "torch", b)
        fi = _us(rows, "fused_ar_rmsnorm", "FlashInfer", b)
        rn, rf = _ratio(nccl, me), _ratio(fi, me)
        if t <= TARGET_MAX_TOKENS:
            vs_nccl.append(rn)
            vs_fi.append(rf)
        out.append(f"| {t} | {_f(me)} | {_f(nccl)} | {_f(sm)} | {_f(fi)} | {_x(rn)} | {_x(rf)} |")
    out.append("")
    lo_n = min([v for v in vs_nccl if v is not None], default=None)
    lo_f = min([v for v in vs_fi if v is not None], default=None)
    out.append(
        f"target fused >= 1.5x NCCL all_reduce + torch RMSNorm, tokens 1..128: min {_x(lo_n)}: "
        + _verdict(vs_nccl, lambda v: v >= 1.5)
    )
    out.append(
        f"target fused >= 1.0x FlashInfer fused, tokens 1..128: min {_x(lo_f)}: " + _verdict(vs_fi, lambda v: v >= 1.0)
    )
    out += NOTES
    return out


def report_block(rows, tokens: Sequence[int]) -> List[str]:
    """The TP block's table: its saving against the fused op's saving timed alone."""
    out = [
        "| tokens | block symheap us | block NCCL us | block saving us "
        "| fused-op saving us (NCCL eager ops - symheap) | block saving / fused saving |",
        "|---|---|---|---|---|---|",
    ]
    ratios = []
    for t in tokens:
        b = t * HIDDEN * 2
        me, nccl = _us(rows, "tp_mlp_step", "tp_mlp symheap", b), _us(rows, "tp_mlp_step", "tp_mlp NCCL", b)
        f_me, f_nccl = _us(rows, "fused_ar_rmsnorm", SYM, b), _us(rows, "fused_ar_rmsnorm", NCCL, b)
        bs = None if me is None or nccl is None else nccl - me
        fs = None if f_me is None or f_nccl is None else f_nccl - f_me
        r = None if bs is None or fs is None or fs <= 0 else bs / fs
        ratios.append(r)
        out.append(f"| {t} | {_f(me)} | {_f(nccl)} | {_f(bs)} | {_f(fs)} | {_f(r)} |")
    out.append("")
    out.append(f"target block saving >= 0.9 x fused-op saving, tokens 1..64: {_verdict(ratios, lambda v: v >= 0.9)}")
    return out


def report_overhead(rows) -> List[str]:
    """The torch.library registration's cost per call."""
    via = _us(rows, "call_overhead", "symheap torch.ops", 8192)
    direct = _us(rows, "call_overhead", "symheap.all_reduce", 8192)
    public = _us(rows, "call_overhead", "symheap symheap.ops.all_reduce_", 8192)
    noop = _us(rows, "call_overhead", "floor: torch.library op", 8192)
    plain = _us(rows, "call_overhead", "floor: the empty Python", 8192)
    d = None if via is None or direct is None else via - direct
    floor = None if noop is None or plain is None else noop - plain
    return [
        "| eager host time per call, 8 KiB symmetric | us |",
        "|---|---|",
        f"| torch.ops.symheap.all_reduce_ | {_f(via, '{:.3f}')} |",
        f"| symheap.all_reduce(t, stream=) | {_f(direct, '{:.3f}')} |",
        f"| symheap.ops.all_reduce_(t) (eager: the kernel without the dispatcher) | {_f(public, '{:.3f}')} |",
        f"| difference (torch.ops - direct) | {_f(d, '{:.3f}')} |",
        f"| floor: an op with an empty Python kernel - that function called directly | {_f(floor, '{:.3f}')} |",
        "",
        f"target torch.library op <= direct + 0.5 us: {_verdict([d], lambda v: v <= 0.5)}"
        + (
            " (no op with a Python kernel can: the dispatcher alone costs the floor above)"
            if floor and floor > 0.5
            else ""
        ),
    ]


def report_ordinary(rows, sizes: Sequence[int] = (8 << 10, 64 << 10, 512 << 10)) -> List[str]:
    """Ordinary against symmetric tensors through the op, graph and eager. The issue's target is
    under CUDA graphs (what a decode step replays); the eager column is the host time the
    ordinary tensor's staging decision adds per call, shown beside it."""
    out = [
        "| bytes | symmetric graph us | ordinary graph us | diff | symmetric eager us | ordinary eager us | diff |",
        "|---|---|---|---|---|---|---|",
    ]
    graph_diffs = []
    for b in sizes:
        cells = []
        for key in ("us", "eager_us"):
            s = _us(rows, "all_reduce", "symheap torch.ops all_reduce_ symmetric", b, key)
            o = _us(rows, "all_reduce", "symheap torch.ops all_reduce_ ordinary", b, key)
            d = None if s is None or o is None else o - s
            if key == "us":
                graph_diffs.append(d)
            cells += [_f(s), _f(o), _f(d)]
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "target ordinary within 0.3 us of symmetric, 8 KiB..512 KiB, CUDA graph: "
        + _verdict(graph_diffs, lambda v: v <= 0.3)
    )
    return out


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description="symheap fused all_reduce + RMSNorm and TP block against the peers")
    p.add_argument("out", help="JSON rows written here (rank 0)")
    p.add_argument("--symheap-only", action="store_true", help="no peers (automatic when ranks share a GPU)")
    p.add_argument("--quick", action="store_true", help="fewer token counts")
    p.add_argument("--no-compile-peer", action="store_true", help="skip NCCL + torch.compile'd add + RMSNorm")
    p.add_argument("--skip", default="", help="comma-separated row sets to skip: fused,block,overhead,ordinary")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the benchmark; the exit status (1 when a row set raised)."""
    args = parse(argv)
    job = tp_mlp.start_job()
    boot = Boot(job)
    if job.device.type != "cuda":
        boot.say("tp_fused_bench: needs the CUDA backend (SYMHEAP_BACKEND=cuda on a GPU machine)")
        symheap.finalize()
        return 77
    peers = not args.symheap_only
    if peers and job.reference != "nccl":
        boot.say("tp_fused_bench: ranks share a GPU, so NCCL, SymmetricMemory and FlashInfer cannot run: symheap only")
        peers = False
    label = "" if peers else " (symheap only)"
    if job.n > 1 and torch.cuda.device_count() < job.n:
        label += f"; {job.n} PEs sharing {torch.cuda.device_count()} GPU(s): not a speed comparison"
        LIGHT["on"] = True
    elif job.n == 1:
        label += "; 1 rank: a code-path check, not a comparison"
    fused_t = (1, 8, 32, 128, 512) if args.quick else FUSED_TOKENS
    block_t = (1, 8, 64) if args.quick else BLOCK_TOKENS
    skip = set(filter(None, args.skip.split(",")))
    rows: List[Dict[str, Any]] = []
    failed = 0
    with torch.no_grad():
        for what, fn in (
            (
                "fused",
                lambda: bench_fused(boot, rows, sorted(set(fused_t) | set(block_t)), peers, not args.no_compile_peer),
            ),
            ("block", lambda: bench_block(boot, rows, block_t, peers)),
            ("overhead", lambda: bench_overhead(boot, rows)),
            ("ordinary", lambda: bench_ordinary(boot, rows)),
        ):
            if what in skip:
                continue
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - report it, go on with the next set
                failed += 1
                boot.say(f"tp_fused_bench: {what} failed: {type(e).__name__}: {e}"[:800])
                torch.cuda.synchronize()
    if job.pe == 0:
        Path(args.out).write_text(json.dumps(rows))
        for r in rows:
            print(
                f"{r['name']:58s} {r['op']:17s} {r['bytes']:>9d} B graph {r['us']:9.2f} eager {r['eager_us']:9.2f} us"
            )
        print(f"\n## tp_fused_bench: {job.n} rank(s), {torch.cuda.get_device_name(job.device)}, bf16{label}\n")
        for part in (
            report_fused(rows, sorted(set(fused_t) | set(block_t))),
            report_block(rows, block_t),
            report_overhead(rows),
            report_ordinary(rows),
        ):
            print("\n".join(part) + "\n")
        print(f"tp_fused_bench: {len(rows)} rows in {args.out}", file=sys.stderr)
    boot.barrier()
    symheap.finalize()
    boot.dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
