"""NVSHMEM as a peer of `symheap bench`, through nvshmem4py (`nvshmem.core`): its host-initiated
on-stream collectives on NVSHMEM's symmetric heap, bf16, eager and CUDA graph, on the sizes of
symheap's GPU sweep: reduce (sum; symheap's all_reduce), fcollect (all_gather), reducescatter,
alltoall, broadcast; and on-stream put/get of the sizes of symheap's RMA rows to the next PE
(itself at one PE: a code-path check only), eager like symheap's RMA rows.

Init: unique-id bootstrap (`nvshmem.core.get_unique_id`, the bytes sent over gloo, then
`nvshmem.core.init(device=, uid=, rank=, nranks=, initializer_method="uid")`); tensors from
`nvshmem.core.tensor`. Rows are named `NVSHMEM <libnvshmem version> <call> (nvshmem4py <version>)`.
Environment kept by the suite: NVSHMEM_DISABLE_NVLS=1 (no multicast objects on shared machines).

Launch: torchrun --standalone --nproc-per-node N bench/nvshmem_peer.py OUT.json [--ops ...] [--sizes ...]"""

import ctypes
import os
import sys

import peer_common as pc
import torch

# The largest point (1 GiB) needs source and destination on NVSHMEM's heap.
os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "4G")
UID_BYTES = 128  # sizeof(nvshmemx_uniqueid_t)
RMA_SIZES = [4096 << (2 * i) for i in range(10)]
CALLS = {
    "all_reduce": "reduce",
    "all_gather": "fcollect",
    "reduce_scatter": "reducescatter",
    "alltoall": "alltoall",
    "broadcast": "broadcast",
}


class TorchStream:
    """torch's current stream (the capture stream while capturing) as nvshmem4py takes one."""

    def __cuda_stream__(self):
        return (0, torch.cuda.current_stream().cuda_stream)


def init(boot):
    import nvshmem.core as nv

    try:
        from cuda.core import Device
    except ImportError:  # cuda.core before 0.5
        from cuda.core.experimental import Device
    dev = Device(boot.local)
    dev.set_current()
    uid = nv.get_unique_id(empty=boot.rank != 0)
    data = boot.bcast_bytes(ctypes.string_at(uid.ptr, UID_BYTES) if boot.rank == 0 else None)
    if boot.rank != 0:
        ctypes.memmove(uid.ptr, data, UID_BYTES)
    nv.init(device=dev, uid=uid, rank=boot.rank, nranks=boot.world, initializer_method="uid")
    v = nv.get_version()
    return nv, f"NVSHMEM {v.libnvshmem_version}", f"(nvshmem4py {v.nvshmem4py_version})"


def coll(boot, nv, lib, pyver, ops, sizes):
    rows, s, team = [], TorchStream(), nv.Teams.TEAM_WORLD
    dev = torch.device("cuda", boot.local)
    for op in ops:
        call = CALLS[op]
        fn = getattr(nv, call)
        for nbytes in sizes:
            send, recv = pc.shape(op, nbytes, boot.world)
            try:
                src = nv.tensor((send,), dtype=torch.bfloat16)
                dst = nv.tensor((recv,), dtype=torch.bfloat16)
            except Exception as e:  # noqa: BLE001 - heap too small for this size
                boot.say(f"nvshmem_peer: {call} {nbytes} B: no symmetric memory: {type(e).__name__}: {e}"[:400])
                continue
            src.copy_(pc.bf16(send, dev, 2))
            if call in ("reduce", "reducescatter"):
                f = lambda fn=fn, d=dst, x=src: fn(team, d, x, "sum", stream=s)  # noqa: E731
            elif call == "broadcast":
                f = lambda fn=fn, d=dst, x=src: fn(team, d, x, root=0, stream=s)  # noqa: E731
            else:
                f = lambda fn=fn, d=dst, x=src: fn(team, d, x, stream=s)  # noqa: E731
            pc.measure(boot, rows, op, nbytes, f"{lib} {call}_on_stream {pyver}", f)
            torch.cuda.synchronize()
            nv.free_tensor(dst)
            nv.free_tensor(src)
    return rows


def rma(boot, nv, lib, pyver, sizes):
    """put and get of each size, PE 0 to the next PE as symheap's PE 0 -> PE 1 rows; the other
    PEs take part in the barriers only. Buffers of exactly the size: nvshmem4py moves a whole
    tracked buffer, so a slice would move the full allocation."""
    rows, s = [], TorchStream()
    peer = (boot.rank + 1) % boot.world
    where = f"to PE {peer}" if boot.world > 1 else "to itself (1 PE)"
    for nbytes in sizes:
        src = nv.tensor((nbytes,), dtype=torch.uint8)
        dst = nv.tensor((nbytes,), dtype=torch.uint8)
        for op in ("put", "get"):
            call = nv.put if op == "put" else nv.get
            fn = lambda c=call, a=src, b=dst: c(b, a, remote_pe=peer, stream=s)  # noqa: E731
            if boot.rank != 0:
                fn = lambda: None  # noqa: E731
            out = rows if boot.rank == 0 else []
            pc.measure(boot, out, op, nbytes, f"{lib} {op}mem_on_stream {where} {pyver}", fn, graph=False)
        torch.cuda.synchronize()
        nv.free_tensor(dst)
        nv.free_tensor(src)
    return rows


def main():
    out, ops, sizes, extra = pc.parse(sys.argv[1:], __doc__)
    boot = pc.Boot()
    try:
        nv, lib, pyver = init(boot)
    except Exception as e:  # noqa: BLE001 - say why there is no NVSHMEM column
        boot.say(f"nvshmem_peer: NVSHMEM not available: {type(e).__name__}: {e}"[:600])
        sys.exit(1)
    boot.say(f"nvshmem_peer: {lib} {pyver}, {boot.world} PE(s)")
    rows = coll(boot, nv, lib, pyver, ops, sizes)
    if extra.get("rma", "1") != "0":
        rma_sizes = [int(x) for x in extra["rma-sizes"].split(",")] if "rma-sizes" in extra else RMA_SIZES
        rows += rma(boot, nv, lib, pyver, rma_sizes)
    pc.write_rows(boot, out, rows, "nvshmem_peer")
    nv.finalize()
    boot.close()


if __name__ == "__main__":
    main()
