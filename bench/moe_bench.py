"""symheap's MoE dispatch + combine against the peers (issue 23, item 3).

Cases (bf16 tokens, random top-k routing over distinct experts, weights in (0.1, 1.1)):

* ``decode``: 128 tokens per rank, hidden 7168, 256 experts, top-8, low-latency mode, CUDA graph;
* ``decode-fp8``: the same with FP8 (e4m3, per-128 scales) dispatch;
* ``prefill``: 4096 tokens per rank, normal mode (one host synchronisation), eager.

Variants per case, each timed for dispatch, combine and the pair (dispatch + an expert that
scales its rows + combine):

* ``symheap``: :class:`symheap.moe.Buffer`;
* ``nccl-a2a``: the path a user writes over NCCL (Megatron's all-to-all dispatcher): permute the
  (token, expert) rows by expert, ``all_to_all_single`` of the per-expert counts, a host
  synchronisation for the splits, ``all_to_all_single`` of the rows, a sort into expert-major
  order; combine in reverse and sum with the weights (eager: the splits live on the host);
* ``deepep``: DeepEP's ``low_latency_dispatch`` / ``low_latency_combine`` (decode) when
  ``import deep_ep`` works (``sgl-deep-ep`` from .whl/), else the reason it did not;
* ``torch-a2av-2d``: ``torch.ops.symm_mem.all_to_all_vdev_2d`` (torch SymmetricMemory over
  NVSHMEM) for the dispatch, when it runs, else the reason;
* ``sm-store``: the floor: one copy of the same bytes into the next rank's memory with SM stores
  (a torch copy into the peer's mapped tensor), whose rate the prefill bandwidth is set against.

Every variant's combine is checked against symheap's (the same expert, the same weights, fp32
sums) before it is timed. Method: bench/peer_common.py's (median over trials of K back-to-back
calls / K, eager and, where the variant allows, from a CUDA graph of K captured calls). Rank 0
prints a markdown table: microseconds per call, each peer's time over symheap's (above 1:
symheap faster), and the prefill bandwidth (bytes this rank sends to other ranks / time) over the
SM-store rate. JSON rows ``{case, op, name, us, eager_us, bytes}`` go to OUT.

Launch (one rank per GPU for the peers)::

    torchrun --standalone --nproc-per-node 8 bench/moe_bench.py OUT.json
    python3 -m symheap launch -n 2 -- python3 bench/moe_bench.py OUT.json --symheap-only
    python3 -m symheap launch -n 4 -- python3 bench/moe_bench.py OUT.json --small   # CPU, host backend

With ranks sharing a GPU (``--symheap-only``, automatic then) only symheap and the NCCL path's
logic run: a code-path check, **not a speed comparison**. ``--small`` (16 tokens, hidden 256,
4 experts per rank, top-4) is the CI check of this script on the host backend (gloo for the
NCCL path's all_to_all).
"""

# Closures over loop variables are timed within their iteration only.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import peer_common as pc  # noqa: E402
import symheap  # noqa: E402
import symheap.moe as moe  # noqa: E402
import symheap.torch as st  # noqa: E402

CASES = {
    "decode": dict(t=128, h=7168, e=256, k=8, ll=True, fp8=False),
    "decode-fp8": dict(t=128, h=7168, e=256, k=8, ll=True, fp8=True),
    "prefill": dict(t=4096, h=7168, e=256, k=8, ll=False, fp8=False),
}
NOTES: List[str] = []


def routing(seed: int, t: int, e: int, k: int, dev: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's top-k over distinct experts (the top of random scores) and weights."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(t, e, generator=g).topk(k, dim=1).indices.to(torch.int64)
    w = torch.rand(t, k, generator=g) + 0.1
    return idx.to(dev), w.to(dev)


def tokens(seed: int, t: int, h: int, dev: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 7919)
    return torch.randn(t, h, generator=g).to(torch.bfloat16).to(dev)


def expert(rows: torch.Tensor) -> torch.Tensor:
    """The stand-in expert: doubles its rows (exact in bf16)."""
    return rows * 2


# ---- the NCCL path, as a user writes it --------------------------------------------------------


class NcclA2A:
    """Megatron-style all-to-all dispatcher over ``torch.distributed``: one row per (token,
    expert), permuted by expert; a host synchronisation for the splits."""

    def __init__(self, dist: Any, n: int, e: int, k: int) -> None:
        self.dist, self.n, self.e, self.k = dist, n, e, k
        self.lx = e // n

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, Any]]:
        t, k = idx.shape
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) rows by global expert
        send = x.index_select(0, order // k)
        per_expert = torch.bincount(flat, minlength=self.e)
        recv_per_expert = torch.empty_like(per_expert)
        self.dist.all_to_all_single(recv_per_expert, per_expert)  # [n * lx]: src-major
        send_splits = per_expert.view(self.n, self.lx).sum(1).tolist()  # host synchronisation
        rpe = recv_per_expert.view(self.n, self.lx)
        recv_splits = rpe.sum(1).tolist()
        recv = x.new_empty((sum(recv_splits), x.shape[1]))
        self.dist.all_to_all_single(recv, send, recv_splits, send_splits)
        # src-major (src, local expert) blocks -> expert-major
        local_e = torch.repeat_interleave(torch.arange(self.lx, device=x.device).repeat(self.n), rpe.reshape(-1))
        regroup = torch.argsort(local_e, stable=True)
        out = recv.index_select(0, regroup)
        state = dict(order=order, send_splits=send_splits, recv_splits=recv_splits, regroup=regroup, t=t)
        return out, state

    def combine(self, y: torch.Tensor, w: torch.Tensor, state: Dict[str, Any]) -> torch.Tensor:
        back = torch.empty_like(y)
        back.index_copy_(0, state["regroup"], y)  # expert-major -> src-major
        ret = y.new_empty((len(state["order"]), y.shape[1]))
        self.dist.all_to_all_single(ret, back, state["send_splits"], state["recv_splits"])
        rows = torch.empty_like(ret)
        rows.index_copy_(0, state["order"], ret)  # back to (token, slot) order
        t, k = state["t"], self.k
        acc = torch.zeros((t, y.shape[1]), dtype=torch.float32, device=y.device)
        r = rows.view(t, k, -1)
        for j in range(k):
            acc = acc + w[:, j, None] * r[:, j].float()
        return acc


# ---- timing ------------------------------------------------------------------------------------


def cpu_us(boot: pc.DistBoot, fn: Callable[[], Any], k: int, trials: int) -> float:
    for _ in range(2):
        fn()
    ts = []
    for _ in range(trials):
        boot.barrier()
        a = time.perf_counter()
        for _ in range(k):
            fn()
        ts.append((time.perf_counter() - a) * 1e6 / k)
    return statistics.median(ts)


def timed(
    boot: pc.DistBoot, rows: List[Dict[str, Any]], key: Dict[str, Any], name: str, fn: Callable[[], Any], graph: bool
) -> None:
    """Appends ``key + {name, us, eager_us}``; a failure is printed with its reason."""
    k, trials = (5, 5) if boot.cuda else (2, 3)
    try:
        if boot.cuda:
            e = pc.eager_us(boot, fn, k, trials)
            g = pc.graph_us(boot, fn, k, trials) if graph else e
        else:
            e = g = cpu_us(boot, fn, k, trials)
        rows.append(dict(key, name=name, us=g, eager_us=e))
    except Exception as ex:  # noqa: BLE001 - one variant's failure is a finding, not the end
        NOTES.append(f"{name} {key}: not measured: {type(ex).__name__}: {ex}"[:400])
        boot.say("moe_bench: " + NOTES[-1])
        if boot.cuda:
            torch.cuda.synchronize()


def _check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
        err = float((got.float() - want.float()).abs().max())
        raise AssertionError(f"{name}: combine differs from symheap's (max error {err:.3g})")


def sent_bytes(idx: torch.Tensor, n: int, lx: int, me: int, row_bytes: int) -> int:
    """Bytes this rank's dispatch sends to other ranks (a token once per rank)."""
    owner = idx // lx
    to = (owner[:, :, None] == torch.arange(n, device=idx.device)).any(1)
    to[:, me] = False
    return int(to.sum()) * row_bytes


# ---- one case ----------------------------------------------------------------------------------


def run_case(
    boot: pc.DistBoot, dist: Any, name: str, c: Dict[str, Any], peers: bool, rows: List[Dict[str, Any]]
) -> None:
    n, me = symheap.n_pes(), symheap.my_pe()
    dev = st.device()
    t, h, e, k, ll, fp8 = c["t"], c["h"], c["e"], c["k"], c["ll"], c["fp8"]
    idx, w = routing(1000 + me, t, e, k, dev)
    x = tokens(1000 + me, t, h, dev)
    buf = moe.Buffer(h, num_experts=e, num_topk=k, max_tokens_per_pe=t, fp8=fp8)
    graph = boot.cuda and ll
    key = dict(case=name, bytes=sent_bytes(idx, n, e // n, me, h * (1 if fp8 else 2)))

    def sh_pair() -> torch.Tensor:
        recv, _, _, _, hd = buf.dispatch(x, idx, w, low_latency=ll, use_fp8=fp8)
        r = moe.dequantize(recv) if fp8 else recv
        return buf.combine(expert(r).to(torch.bfloat16), hd, out_dtype=torch.float32)

    want = sh_pair()
    timed(
        boot,
        rows,
        dict(key, op="dispatch"),
        "symheap",
        lambda: buf.dispatch(x, idx, w, low_latency=ll, use_fp8=fp8),
        graph,
    )
    recv, _, _, _, hd = buf.dispatch(x, idx, w, low_latency=ll, use_fp8=fp8)
    y = expert(moe.dequantize(recv) if fp8 else recv).to(torch.bfloat16)
    timed(boot, rows, dict(key, op="combine"), "symheap", lambda: buf.combine(y, hd), graph)
    timed(boot, rows, dict(key, op="pair"), "symheap", sh_pair, graph)
    if not fp8:
        a2a = NcclA2A(dist, n, e, k)

        def nccl_pair() -> torch.Tensor:
            r, s = a2a.dispatch(x, idx)
            return a2a.combine(expert(r), w, s)

        try:
            _check("nccl-a2a", nccl_pair(), want)
            timed(boot, rows, dict(key, op="dispatch"), "nccl-a2a", lambda: a2a.dispatch(x, idx), False)
            r, s = a2a.dispatch(x, idx)
            yr = expert(r)
            timed(boot, rows, dict(key, op="combine"), "nccl-a2a", lambda: a2a.combine(yr, w, s), False)
            timed(boot, rows, dict(key, op="pair"), "nccl-a2a", nccl_pair, False)
        except Exception as ex:  # noqa: BLE001
            NOTES.append(f"nccl-a2a {name}: {type(ex).__name__}: {ex}"[:400])
            boot.say("moe_bench: " + NOTES[-1])
    if peers and ll:
        deepep(boot, dist, name, c, x, idx, w, want, key, rows)
    if peers and not ll:
        a2av_2d(boot, dist, name, c, x, idx, key, rows)
    if boot.cuda and n > 1 and not ll:
        sm_store_floor(boot, key["bytes"], dict(key, op="floor"), rows)
    buf.destroy()


def deepep(boot: pc.DistBoot, dist: Any, name: str, c: Dict[str, Any], x, idx, w, want, key, rows) -> None:
    """DeepEP's low-latency kernels, when the package loads and runs here; else the reason."""
    try:
        flags = sys.getdlopenflags()
        # sgl-deep-ep is built against a newer torch; its one symbol missing from torch 2.11
        # (a c10::TypeError constructor) is on an error path, so bind lazily.
        sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
        try:
            import deep_ep
        finally:
            sys.setdlopenflags(flags)
        n = symheap.n_pes()
        t, h, e = c["t"], c["h"], c["e"]
        nbytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(t, h, n, e)
        dbuf = deep_ep.Buffer(
            dist.group.WORLD, num_rdma_bytes=nbytes, low_latency_mode=True, num_qps_per_rank=max(1, e // n)
        )
        fp8 = c["fp8"]

        def d():
            return dbuf.low_latency_dispatch(x, idx, t, e, use_fp8=fp8)

        def pair():
            recv, _, hd, _, _ = d()
            r = recv[0].float() * _deepep_scales(recv[1]) if fp8 else recv
            return dbuf.low_latency_combine(expert(r).to(torch.bfloat16), idx, w, hd)[0]

        if not fp8:
            _check("deepep", pair(), want)
        timed(boot, rows, dict(key, op="dispatch"), "deepep", d, True)
        recv, _, hd, _, _ = d()
        r = expert(recv[0].float() if fp8 else recv).to(torch.bfloat16)
        timed(boot, rows, dict(key, op="combine"), "deepep", lambda: dbuf.low_latency_combine(r, idx, w, hd), True)
        timed(boot, rows, dict(key, op="pair"), "deepep", pair, True)
    except Exception as ex:  # noqa: BLE001 - why it did not run is the finding
        NOTES.append(f"deepep {name}: not measured: {type(ex).__name__}: {ex}"[:500])
        boot.say("moe_bench: " + NOTES[-1])
        torch.cuda.synchronize()


def _deepep_scales(s: torch.Tensor) -> torch.Tensor:
    """DeepEP's per-128 scales ``[L, rows, H/128]`` broadcast to ``[L, rows, H]``."""
    return s.repeat_interleave(128, dim=-1)


def a2av_2d(boot: pc.DistBoot, dist: Any, name: str, c: Dict[str, Any], x, idx, key, rows) -> None:
    """torch's all_to_all_vdev_2d (NVSHMEM-backed SymmetricMemory) for the dispatch rows."""
    try:
        import torch.distributed._symmetric_memory as symm

        symm.set_backend("NVSHMEM")
        n = symheap.n_pes()
        e, k = c["e"], c["k"]
        lx = e // n
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        send_rows = x.index_select(0, order // k)
        cap = send_rows.shape[0] * 2
        inp = symm.empty(cap, x.shape[1], dtype=x.dtype, device=x.device)
        out = symm.empty(cap * n, x.shape[1], dtype=x.dtype, device=x.device)
        splits = symm.empty(e, dtype=torch.int64, device=x.device)
        oso = symm.empty(2, e, dtype=torch.int64, device=x.device)
        group = dist.group.WORLD.group_name
        symm.rendezvous(inp, group)
        symm.rendezvous(out, group)
        inp[: send_rows.shape[0]].copy_(send_rows)
        splits.copy_(torch.bincount(flat, minlength=e))

        def d():
            torch.ops.symm_mem.all_to_all_vdev_2d(inp, out, splits, oso, group, 1)

        timed(boot, rows, dict(key, op="dispatch"), "torch-a2av-2d", d, True)
        del lx
    except Exception as ex:  # noqa: BLE001
        NOTES.append(f"torch-a2av-2d {name}: not measured: {type(ex).__name__}: {ex}"[:500])
        boot.say("moe_bench: " + NOTES[-1])
        torch.cuda.synchronize()


def sm_store_floor(boot: pc.DistBoot, nbytes: int, key: Dict[str, Any], rows: List[Dict[str, Any]]) -> None:
    """One copy of ``nbytes`` (the most any rank sends: the allocation is collective, so its
    size is the same on every rank) into the next rank's memory with SM stores (the floor)."""
    n, me = symheap.n_pes(), symheap.my_pe()
    most = st.empty(1, dtype=torch.int64)
    most.fill_(nbytes)
    symheap.all_reduce(most, op="max")
    nb = max(1 << 20, int(most.item()))
    st.free(most)
    dst = st.empty(nb // 2, dtype=torch.bfloat16)
    src = torch.randn(nb // 2, device=dst.device).to(torch.bfloat16)
    symheap.barrier_all()
    peer = symheap.get_peer_tensor(dst, (me + 1) % n)
    timed(boot, rows, dict(key, bytes=nb), "sm-store", lambda: peer.copy_(src), True)
    symheap.barrier_all()
    st.free(dst)


# ---- the report --------------------------------------------------------------------------------


def table(rows: List[Dict[str, Any]], n: int) -> str:
    names = [m for m in ("symheap", "nccl-a2a", "deepep", "torch-a2av-2d") if any(r["name"] == m for r in rows)]
    out = [f"## moe_bench ({n} ranks; microseconds per call, CUDA graph where the variant allows)", ""]
    out.append("| case | op | " + " | ".join(names) + " | " + " | ".join(f"{m}/symheap" for m in names[1:]) + " |")
    out.append("|---" * (2 + 2 * len(names) - 1) + "|")
    for case in CASES:
        for op in ("dispatch", "combine", "pair"):
            got = {r["name"]: r["us"] for r in rows if r["case"] == case and r["op"] == op}
            if "symheap" not in got:
                continue
            cells = [f"{got[m]:.1f}" if m in got else "-" for m in names]
            ratios = [f"{got[m] / got['symheap']:.2f}x" if m in got else "-" for m in names[1:]]
            out.append(f"| {case} | {op} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    for case in CASES:
        fl = [r for r in rows if r["case"] == case and r["op"] == "floor"]
        for op in ("dispatch", "combine"):
            s = [r for r in rows if r["case"] == case and r["op"] == op and r["name"] == "symheap"]
            if fl and s and s[0]["bytes"]:
                rate = s[0]["bytes"] / s[0]["us"] / 1e3
                floor = fl[0]["bytes"] / fl[0]["us"] / 1e3
                out.append(
                    f"\n{case} {op}: {rate:.1f} GB/s sent by rank 0 = {rate / floor:.0%} "
                    f"of the SM-store rate {floor:.1f} GB/s"
                )
    if NOTES:
        out += ["", "Not measured / notes:"] + [f"- {m}" for m in NOTES]
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--symheap-only", action="store_true", help="no DeepEP / torch peers")
    ap.add_argument("--small", action="store_true", help="CI sizes (host backend when there is no GPU)")
    a = ap.parse_args(argv)
    # The host backend (CI, or SYMHEAP_BACKEND=host on a GPU machine) runs on CPU tensors.
    cpu = os.environ.get("SYMHEAP_BACKEND") == "host" or not torch.cuda.is_available()
    if cpu:
        # One process per PE, like MPI ranks: torch's intra-op pool would oversubscribe the cores
        # the PEs already fill (and make every wait a scheduling lottery).
        torch.set_num_threads(1)
    dist, own_gpu = pc.start_symheap_job(cpu)
    boot = pc.DistBoot(dist, symheap.my_pe(), not cpu)
    peers = own_gpu and not a.symheap_only and not cpu
    if not own_gpu and not cpu:
        boot.say("moe_bench: ranks share a GPU: symheap and the NCCL path's logic only, not a speed comparison")
    rows: List[Dict[str, Any]] = []
    n = symheap.n_pes()
    for name in a.cases.split(","):
        c = dict(CASES[name])
        if a.small:
            c.update(t=16, h=256, e=4 * n, k=min(4, 4 * n))
        run_case(boot, dist, name, c, peers, rows)
    report = table(rows, n)
    if boot.rank == 0:
        print(report, flush=True)
        Path(a.out).write_text(json.dumps({"rows": rows, "notes": NOTES}, indent=1))
    symheap.barrier_all()
    dist.barrier()
    dist.destroy_process_group()
    symheap.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
