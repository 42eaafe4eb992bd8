"""NCCL at its best, as a peer of `symheap bench`: a libnccl.so.2 loaded by path (ctypes, so two
versions can be compared in one suite: the newest from PyPI when it is there, the one torch ships,
the system's), measured three ways on the sweep of symheap's GPU bench (bf16; all_reduce,
all_gather, reduce_scatter, alltoall, broadcast; eager and CUDA graph):

- `default`: a default communicator on ordinary buffers (torch's caching allocator, cudaMalloc),
  what most users run;
- `symmetric`: buffers from ncclMemAlloc registered as symmetric windows
  (ncclCommWindowRegister(comm, buf, size, &win, NCCL_WIN_COLL_SYMMETRIC), NCCL 2.27+), so that
  NCCL takes its symmetric-memory kernels;
- `zero-cta`: the same windows on a communicator made with ncclConfig_t.CTAPolicy =
  NCCL_CTA_POLICY_ZERO, which makes NCCL 2.28+ run the collectives it can on the copy engines
  (alltoall, gather, scatter in 2.28; the others take its fewest-CTA path).

Rows are named `NCCL <version> <variant>` (+ ` [tag]`). Environment kept by the suite:
NCCL_NVLS_ENABLE=0 (no multicast objects on shared machines).

Launch: torchrun --standalone --nproc-per-node N bench/nccl_peer.py OUT.json --lib PATH
        [--tag venv] [--variants default,symmetric,zero-cta] [--ops ...] [--sizes ...]"""

import ctypes
import os
import sys

import peer_common as pc
import torch

SUCCESS, BF16, SUM = 0, 9, 0
WIN_COLL_SYMMETRIC, CTA_POLICY_ZERO = 0x01, 0x02
UNDEF_INT = -(2**31)
# ncclConfig_t as nccl.h 2.32.3 lays it out (append-only across versions): size, magic, version,
# then these ints and pointers in order.
CONFIG_FIELDS = [
    ("blocking", ctypes.c_int),
    ("cgaClusterSize", ctypes.c_int),
    ("minCTAs", ctypes.c_int),
    ("maxCTAs", ctypes.c_int),
    ("netName", ctypes.c_char_p),
    ("splitShare", ctypes.c_int),
    ("trafficClass", ctypes.c_int),
    ("commName", ctypes.c_char_p),
    ("collnetEnable", ctypes.c_int),
    ("CTAPolicy", ctypes.c_int),
    ("shrinkShare", ctypes.c_int),
    ("nvlsCTAs", ctypes.c_int),
    ("nChannelsPerNetPeer", ctypes.c_int),
    ("nvlinkCentricSched", ctypes.c_int),
    ("graphUsageMode", ctypes.c_int),
    ("numRmaCtx", ctypes.c_int),
    ("maxP2pPeers", ctypes.c_int),
    ("graphStreamOrdering", ctypes.c_int),
    ("launchOrderImplicit", ctypes.c_int),
    ("numRmaSig", ctypes.c_int),
    ("rmaEagerInit", ctypes.c_int),
    ("hostCftMode", ctypes.c_int),
    ("nvlsHostMode", ctypes.c_int),
]
HEADER_VERSION = 23203


class Config(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint)] + CONFIG_FIELDS


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def config(lib_version, cta_policy=None):
    """NCCL_CONFIG_INITIALIZER for the 2.32 layout (a library older than that reads the prefix it
    knows: the version field says which), with CTAPolicy set when asked."""
    c = Config()
    c.size, c.magic, c.version = ctypes.sizeof(Config), 0xCAFEBEEF, min(lib_version, HEADER_VERSION)
    for name, t in CONFIG_FIELDS:
        setattr(c, name, None if t is ctypes.c_char_p else UNDEF_INT)
    if cta_policy is not None:
        c.CTAPolicy = cta_policy
    return c


def version_string(code):
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}" if code >= 20900 else str(code)


class Nccl:
    """The few entry points of one libnccl.so.2, loaded by path (RTLD_LOCAL: its own copy)."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        self.code = v.value
        self.version = version_string(v.value)

    def check(self, r, what):
        if r != SUCCESS:
            raise RuntimeError(f"{what} failed: {r} ({self.lib.ncclGetErrorString(r).decode()})")

    def comm(self, boot, cta_policy=None):
        uid = UniqueId()
        if boot.rank == 0:
            self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        uid.internal = boot.bcast_bytes(bytes(uid.internal))
        comm = ctypes.c_void_p()
        cfg = config(self.code, cta_policy)
        self.check(
            self.lib.ncclCommInitRankConfig(ctypes.byref(comm), boot.world, uid, boot.rank, ctypes.byref(cfg)),
            "ncclCommInitRankConfig",
        )
        return comm

    def mem_alloc(self, nbytes):
        p = ctypes.c_void_p()
        self.check(self.lib.ncclMemAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes)), "ncclMemAlloc")
        return p.value

    def window(self, comm, ptr, nbytes):
        win = ctypes.c_void_p()
        self.check(
            self.lib.ncclCommWindowRegister(
                comm, ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), ctypes.byref(win), WIN_COLL_SYMMETRIC
            ),
            "ncclCommWindowRegister",
        )
        return win

    def call(self, op, comm, dst, src, send, recv, n):
        """Enqueues `op` once on torch's current stream (the capture stream while capturing)."""
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        L, d, v = self.lib, ctypes.c_void_p(dst), ctypes.c_void_p(src)
        sz = ctypes.c_size_t
        if op == "all_reduce":
            r = L.ncclAllReduce(v, d, sz(send), BF16, SUM, comm, s)
        elif op == "all_gather":
            r = L.ncclAllGather(v, d, sz(send), BF16, comm, s)
        elif op == "reduce_scatter":
            r = L.ncclReduceScatter(v, d, sz(recv), BF16, SUM, comm, s)
        elif op == "broadcast":
            r = L.ncclBroadcast(v, d, sz(send), BF16, 0, comm, s)
        else:
            r = L.ncclAlltoAll(v, d, sz(send // n), BF16, comm, s)
        self.check(r, op)


class Cai:
    """A raw device pointer as torch sees one (__cuda_array_interface__), to fill NCCL's memory."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<i2", "data": (ptr, False), "version": 3}


def buffers(nc, comm, variant, send, recv, dev):
    """(dst ptr, src ptr, cleanup) for one size: torch memory or windowed ncclMemAlloc memory."""
    if variant == "default":
        src = pc.bf16(send, dev, 1)
        dst = torch.empty(recv, dtype=torch.bfloat16, device=dev)
        # The cleanup holds the tensors: their memory stays NCCL's until the size is done.
        return dst.data_ptr(), src.data_ptr(), lambda keep=(src, dst): None
    nb = [max(send * 2, 4096), max(recv * 2, 4096)]
    ptrs = [nc.mem_alloc(b) for b in nb]
    wins = [nc.window(comm, p, b) for p, b in zip(ptrs, nb)]
    torch.as_tensor(Cai(ptrs[0], send), device=dev).view(torch.bfloat16).copy_(pc.bf16(send, dev, 1))
    torch.cuda.synchronize()

    def cleanup():
        torch.cuda.synchronize()
        for w in wins:
            nc.check(nc.lib.ncclCommWindowDeregister(comm, w), "ncclCommWindowDeregister")
        for p in ptrs:
            nc.check(nc.lib.ncclMemFree(ctypes.c_void_p(p)), "ncclMemFree")

    return ptrs[1], ptrs[0], cleanup


def sweep(boot, nc, variant, ops, sizes, tag):
    name = f"NCCL {nc.version} {variant}" + (f" [{tag}]" if tag else "")
    comm = nc.comm(boot, CTA_POLICY_ZERO if variant == "zero-cta" else None)
    dev = torch.device("cuda", boot.local)
    rows = []
    for op in ops:
        for nbytes in sizes:
            send, recv = pc.shape(op, nbytes, boot.world)
            try:
                dst, src, cleanup = buffers(nc, comm, variant, send, recv, dev)
            except Exception as e:  # noqa: BLE001 - e.g. no windows in this version
                boot.say(f"{name}: {op} {nbytes} B: no buffers: {type(e).__name__}: {e}"[:400])
                continue
            pc.measure(
                boot,
                rows,
                op,
                nbytes,
                name,
                lambda op=op, d=dst, s=src, a=send, b=recv: nc.call(op, comm, d, s, a, b, boot.world),
            )
            cleanup()
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    nc.check(nc.lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return rows


def main():
    out, ops, sizes, extra = pc.parse(sys.argv[1:], __doc__)
    path = extra.get("lib") or os.environ.get("SYMHEAP_NCCL_LIB")
    if not path:
        sys.exit("nccl_peer: --lib PATH (or SYMHEAP_NCCL_LIB) names the libnccl.so.2 to measure")
    boot = pc.Boot()
    nc = Nccl(path)
    boot.say(f"nccl_peer: NCCL {nc.version} from {os.path.realpath(path)}, {boot.world} rank(s)")
    rows = []
    for variant in extra.get("variants", "default,symmetric,zero-cta").split(","):
        if variant != "default" and nc.code < 22700:
            boot.say(f"nccl_peer: NCCL {nc.version} has no symmetric windows (2.27+): {variant} skipped")
            continue
        try:
            rows += sweep(boot, nc, variant, ops, sizes, extra.get("tag", ""))
        except Exception as e:  # noqa: BLE001 - report the variant, keep the others
            boot.say(f"nccl_peer: NCCL {nc.version} {variant} failed: {type(e).__name__}: {e}"[:400])
    pc.write_rows(boot, out, rows, "nccl_peer")
    boot.close()


if __name__ == "__main__":
    main()
