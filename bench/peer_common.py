"""What the peer programs of `symheap bench` share (bench/*_peer.py): the sweep, the timing method
and the rows they write, so that every peer is measured the way symheap measures itself
(crates/symheap-cli/src/bench/gpu.rs): per size, K back-to-back ops timed with CUDA events, the
median over trials of time / K, launched eagerly and replayed from a CUDA graph of K captured ops.

Rows: a JSON list of {op, bytes, name, us, eager_us}: `us` is the CUDA-graph number (RMA rows:
eager, as symheap's), `bytes` follows symheap's (NCCL-tests') convention: the larger of the send
and receive buffers of one rank. `symheap bench --peer-json FILE` (repeatable) merges them.

Ranks come from torchrun's environment; the peers are bootstrapped over gloo (no NCCL inside
torch), so each program loads only the library it measures."""

import datetime
import json
import os
import socket
import statistics
import sys

import torch

SIZES = [8 << 10, 64 << 10, 512 << 10, 4 << 20, 32 << 20, 256 << 20, 1 << 30]
OPS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"]


def k_trials(nbytes):
    """Ops per timed loop and trials, as symheap's sweep (gpu.rs `k_for`)."""
    if nbytes <= 1 << 20:
        return 50, 11
    if nbytes <= 64 << 20:
        return 20, 7
    return 3, 5


def shape(op, nbytes, n):
    """(send, receive) elements of 2 bytes per rank for `op` at sweep point `nbytes`."""
    e = nbytes // 2
    return {
        "all_reduce": (e, e),
        "all_gather": (e // n, e),
        "reduce_scatter": (e, e // n),
        "alltoall": (e, e),
        "broadcast": (e, e),
    }[op]


class DistBoot:
    """What the timers below need from a job that already has torch.distributed (and symheap)
    up: a barrier (draining this GPU's work first when ``cuda``) and a voice (rank 0)."""

    def __init__(self, dist, rank, cuda=True):
        self.dist, self.rank, self.cuda = dist, rank, cuda

    def barrier(self):
        if self.cuda:
            torch.cuda.synchronize()
        if self.dist is not None:
            self.dist.barrier()

    def say(self, msg):
        if self.rank == 0:
            print(msg, file=sys.stderr, flush=True)


class Boot(DistBoot):
    """Rank, world and local rank from torchrun; a gloo group (or `backend`'s) for barriers and the
    unique id, made at one rank too when `always`."""

    def __init__(self, backend="gloo", always=False):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local = int(os.environ.get("LOCAL_RANK", str(self.rank)))
        torch.cuda.set_device(self.local)
        self.dist, self.cuda = None, True
        if self.world > 1 or always:
            import torch.distributed as dist

            kw = {"device_id": torch.device("cuda", self.local)} if backend == "nccl" else {}
            dist.init_process_group(backend, **kw)
            self.dist = dist

    def bcast_bytes(self, data):
        """Rank 0's `data` (bytes) on every rank."""
        if self.dist is None:
            return data
        box = [data if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self):
        if self.dist is not None:
            self.dist.barrier()
            self.dist.destroy_process_group()


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def eager_us(boot, fn, k, trials):
    """Median over trials of (event time of k eager calls of fn) / k, in microseconds."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(trials):
        boot.barrier()
        a, b = _events()
        a.record()
        for _ in range(k):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / k)
    return statistics.median(ts)


def graph_us(boot, fn, k, trials):
    """The same for one replay of a CUDA graph of k captured calls (torch_symm_mem.py's method)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(k):
            fn()
    g.replay()
    ts = []
    for _ in range(trials):
        boot.barrier()
        a, b = _events()
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / k)
    del g
    return statistics.median(ts)


def measure(boot, rows, op, nbytes, name, fn, graph=True):
    """Times fn eagerly and (when `graph`) from a CUDA graph and appends the row; a failure is
    printed with its reason and the sweep goes on."""
    k, trials = k_trials(nbytes)
    try:
        e = eager_us(boot, fn, k, trials)
        g = graph_us(boot, fn, k, trials) if graph else e
        rows.append({"op": op, "bytes": nbytes, "name": name, "us": g, "eager_us": e})
    except Exception as ex:  # noqa: BLE001 - one variant's failure is a finding, not the end
        boot.say(f"{name}: {op} {nbytes} B not measured: {type(ex).__name__}: {ex}"[:400])
        torch.cuda.synchronize()


def bf16(n, device, seed):
    """n random bf16 values (the data does not change the time; it keeps it realistic)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(n, device=device, dtype=torch.bfloat16, generator=g)


def write_rows(boot, out, rows, who):
    """Rank 0 writes the rows and prints them; says so when there are none."""
    if boot.rank != 0:
        return
    with open(out, "w") as f:
        json.dump(rows, f)
    for r in rows:
        print(f"{r['name']:48s} {r['op']:15s} {r['bytes']:>11d} B graph {r['us']:9.2f} eager {r['eager_us']:9.2f} us")
    print(f"{who}: {len(rows)} rows in {out}", file=sys.stderr)


def parse(argv, doc):
    """OUT.json [--ops a,b] [--sizes 8192,...] [extra --key value pairs] -> (out, ops, sizes, extra)."""
    if not argv or argv[0].startswith("-"):
        sys.exit(doc)
    out, ops, sizes, extra = argv[0], list(OPS), list(SIZES), {}
    it = iter(argv[1:])
    for a in it:
        v = next(it, None)
        if v is None or not a.startswith("--"):
            sys.exit(f"bad argument {a!r}\n{doc}")
        if a == "--ops":
            ops = v.split(",")
        elif a == "--sizes":
            sizes = [int(x) for x in v.split(",")]
        else:
            extra[a[2:]] = v
    return out, ops, sizes, extra


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_symheap_job(cpu=False):
    """**Collective**: torch's process group (NCCL when every rank has its own GPU, gloo when
    ranks share one or there is none: ``cpu``), then ``symheap.init()``; a lone process gets a
    one-rank environment. Returns (torch.distributed, own_gpu)."""
    import symheap
    import symheap.torch as st
    import torch.distributed as dist

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    own_gpu = not cpu and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if not cpu:
        torch.cuda.set_device(local % max(1, torch.cuda.device_count()))
    timeout = datetime.timedelta(seconds=300)
    if own_gpu:
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()), timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    symheap.init()
    if not cpu:
        torch.cuda.set_device(st.device())
    return dist, own_gpu
