"""PE-side cases of the PyTorch front (see pe_cases.py for how they run): tensors on this
backend's device, the collectives on tensors, stream-ordered release, init from an initialised
torch.distributed, and heap growth that fails on one PE's GPU. torch is imported inside each
case, so that the other cases run where it is not installed."""

from __future__ import annotations

import gc
import zlib

import numpy as np
import symheap
import symheap.numpy as sn
from pe_common import case, raises, ring_check_tail
from symheap import SymheapMemoryError, SymheapValueError


@case
def case_torch_grow_failure() -> None:
    """On the CUDA backend: the last PE's GPU is filled (by PyTorch) so that cuMemCreate of a
    heap chunk fails there; every PE gets the same SymheapMemoryError naming that PE and the
    CUDA error, no heap grows, and once that memory is freed the allocation succeeds."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    short = n - 1
    symheap.barrier_all()
    u0 = symheap.heap_usage()
    size = u0["mapped"] + (1 << 20)
    filler = None
    if me == short:
        free, _ = torch.cuda.mem_get_info()
        # Leave less than one chunk (SYMHEAP_CHUNK_SIZE, 64 MiB by default) free.
        filler = torch.empty(max(free - (16 << 20), 0), dtype=torch.uint8, device=st.device())
    symheap.barrier_all()
    e = raises(SymheapMemoryError, st.empty, size, dtype=torch.uint8)
    msg = str(e)
    assert e.kind == "out_of_memory" and e.pe == me, msg
    assert f"failed on PE {short}: " in msg and "OUT_OF_MEMORY" in msg and "no PE grew" in msg, msg
    assert symheap.heap_usage()["mapped"] == u0["mapped"]
    symheap.barrier_all()
    del filler
    torch.cuda.empty_cache()
    a = st.empty(size, dtype=torch.uint8)
    assert symheap.heap_usage()["mapped"] > u0["mapped"]
    tail = a[-4096:]

    def put_tail(d, pe):
        symheap.put(tail, torch.from_numpy(d).to(tail.device), pe)
        torch.cuda.synchronize()

    ring_check_tail(put_tail, lambda: tail.cpu().numpy(), n, me, "torch_grow_failure")


@case
def case_torch() -> None:
    """The PyTorch front on this backend's device (CPU tensors on the host backend, CUDA
    tensors on the CUDA backend). Stream semantics: reads after symheap.barrier_all()."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    dev = st.device()
    gen = torch.Generator().manual_seed(zlib.crc32(b"torch"))
    symheap.barrier_all()
    u0 = symheap.heap_usage()
    t, pb = st.allocate_symmetric(4, 8, dtype=torch.float32)
    assert t.device == dev and t.shape == (4, 8) and t.dtype == torch.float32
    assert pb.dtype == torch.int64 and pb.device == dev and tuple(pb.shape) == (n,)
    pbl = pb.tolist()
    assert pbl[me] == t.data_ptr()
    v = t[1:]
    tv = st.get_peer_bases(v).tolist()
    assert tv[me] == v.data_ptr() and all(tv[r] == pbl[r] + 32 for r in range(n))
    u, pu = st.allocate_symmetric(16, dtype=torch.int64)
    pul = pu.tolist()
    assert all(pul[r] - pul[me] == pbl[r] - pbl[me] for r in range(n))
    m = st.symmetric_address_map(v)
    assert m.allocation_base == t.data_ptr() and m.peer_bases.tolist() == pbl and m.direct == [True] * n
    assert st.is_symmetric(v) and not st.is_symmetric(torch.zeros(3, device=dev))
    assert symheap.is_symmetric(t) and symheap.get_peer_bases(t).tolist() == pbl
    # Stores through a peer tensor.
    u.fill_(-1)
    symheap.barrier_all()
    peer = st.get_peer_tensor(u, nxt)
    assert peer.data_ptr() == pul[nxt] and peer.device == dev
    peer[me] = 100 + me
    symheap.barrier_all()
    expect = [-1] * 16
    expect[prv] = 100 + prv
    assert u.tolist() == expect, u
    # Factories.
    assert st.zeros(3, dtype=torch.int32).tolist() == [0, 0, 0]
    assert st.ones(2, 2).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert st.full((2,), 7, dtype=torch.int16).tolist() == [7, 7]
    assert st.arange(5, dtype=torch.int64).tolist() == list(range(5))
    r1 = st.rand(64, generator=gen if dev.type == "cpu" else None)
    assert float(r1.min()) >= 0.0 and float(r1.max()) < 1.0
    r2 = st.randn(64, dtype=torch.float64)
    assert r2.dtype == torch.float64 and st.is_symmetric(r2)
    c = st.as_symmetric(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert st.is_symmetric(c) and c.tolist() == [[0, 1, 2], [3, 4, 5]] and st.as_symmetric(c) is c
    # RMA, atomics and signals on tensors (collectives: case_torch_coll).
    data = torch.randint(-20, 20, (n, n * 8), generator=gen)
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.float16):
        src = st.empty(n * 8, dtype=dtype)
        src.copy_(data[me].to(dtype))
        dst = st.zeros(n * 8, dtype=dtype)
        symheap.barrier_all()
        symheap.put(dst, src, nxt)
        symheap.barrier_all()
        assert torch.equal(dst.cpu(), data[prv].to(dtype)), dtype
        loc = torch.zeros(n * 8, dtype=dtype, device=dev)
        symheap.get(loc, src, prv)
        symheap.quiet()
        assert torch.equal(loc.cpu(), data[prv].to(dtype))
        symheap.barrier_all()
    ctr = st.zeros(2, dtype=torch.int64)
    symheap.barrier_all()
    for _ in range(10):
        symheap.atomic_fetch_add(ctr, 1, 0)
    symheap.barrier_all()
    assert symheap.atomic_fetch(ctr, 0) == 10 * n
    sig = st.zeros(1, dtype=torch.int64)
    buf = st.zeros(8, dtype=torch.float32)
    symheap.barrier_all()
    symheap.put_signal(buf, data[me, :8].to(torch.float32).to(dev), sig, 1, nxt, op="add")
    symheap.signal_wait_until(sig, "ge", 1)
    assert torch.equal(buf.cpu(), data[prv, :8].to(torch.float32))
    # Errors.
    other = "cuda" if dev.type == "cpu" else "cpu"
    raises(SymheapValueError, st.empty, 2, device=other)
    raises(SymheapValueError, symheap.put, t, torch.zeros(4, 8, dtype=torch.float64, device=dev), nxt)
    raises(SymheapValueError, st.empty, 2, dtype=torch.bool)
    raises(SymheapValueError, st.get_peer_tensor, t, n)
    # Release: every tensor and table gone, the heap is back where it was.
    symheap.barrier_all()
    del t, pb, v, u, pu, m, peer, r1, r2, c, src, dst, loc, ctr, sig, buf
    gc.collect()
    symheap.host_barrier()
    u1 = symheap.heap_usage()
    assert u1["in_use"] == u0["in_use"] and u1["live_blocks"] == u0["live_blocks"], (u0, u1)
    symheap.barrier_all()


@case
def case_torch_coll() -> None:
    """Collectives on tensors (on the CUDA backend: the stream kernels), vs torch references."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    gen = torch.Generator().manual_seed(zlib.crc32(b"torch_coll"))
    data = torch.randint(-20, 20, (n, n * 8), generator=gen)
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.float16, torch.int64):
        src = st.empty(n * 8, dtype=dtype)
        src.copy_(data[me].to(dtype))
        dst = st.zeros(n * 8, dtype=dtype)
        symheap.barrier_all()
        out = st.zeros(n * 8, dtype=dtype)
        symheap.all_reduce(out, src, "sum")
        symheap.barrier_all()
        assert torch.equal(out.cpu(), data.sum(0).to(dtype)), (dtype, out, data.sum(0))
        g = st.zeros(n, n * 8, dtype=dtype)
        symheap.all_gather(g, src)
        symheap.broadcast(dst, src, root=n - 1)
        a2a = st.zeros(n, 8, dtype=dtype)
        symheap.alltoall(a2a, src)
        rs = st.zeros(8, dtype=dtype)
        symheap.reduce_scatter(rs, src, "max")
        symheap.barrier_all()
        assert torch.equal(g.cpu(), data.to(dtype))
        assert torch.equal(dst.cpu(), data[n - 1].to(dtype))
        for j in range(n):
            assert torch.equal(a2a[j].cpu(), data[j].reshape(n, 8)[me].to(dtype))
        assert torch.equal(rs.cpu(), data.max(0).values.reshape(n, 8)[me].to(dtype))
        symheap.barrier_all()


@case
def case_torch_empty() -> None:
    """Empty tensors (torch gives every one address 0: an empty slice of a symmetric tensor,
    symheap's own empty tensors) where symmetric memory is taken: an uneven alltoall in which PE
    0 receives nothing and the last PE sends nothing, each PE passing the rows it sends and
    receives as slices of symmetric arrays (empty there), exact against every PE's rows;
    collectives, put and get of 0 elements on every PE."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    gen = torch.Generator().manual_seed(zlib.crc32(b"torch_empty"))

    def rows(i: int, j: int, k: int) -> torch.Tensor:
        base = (i * 31 + j) * 1000
        return torch.arange(base, base + 2 * k, dtype=torch.int64).view(k, 2)

    for _ in range(3):
        m = torch.randint(0, 5, (n, n), generator=gen)
        m[:, 0] = 0  # nobody sends to PE 0
        m[n - 1, :] = 0  # the last PE sends nothing
        send, recv = m[me].tolist(), m[:, me].tolist()
        cap = int(max(m.sum(0).max(), m.sum(1).max()))
        src = st.empty((cap, 2), dtype=torch.int64)[: sum(send)]
        src.copy_(torch.cat([rows(me, j, send[j]) for j in range(n)]))
        buf = st.full((cap + 1, 2), -1, dtype=torch.int64)
        dst = buf[: sum(recv)]
        assert (src.numel() == 0) == (src.data_ptr() == 0) and (dst.numel() == 0) == (dst.data_ptr() == 0)
        symheap.barrier_all()
        symheap.alltoall(dst, src, output_split_sizes=recv, input_split_sizes=send)
        symheap.barrier_all()
        assert torch.equal(dst.cpu(), torch.cat([rows(i, me, recv[i]) for i in range(n)])), (m, dst)
        assert (buf[sum(recv) :].cpu() == -1).all(), "written past the received rows"
    a, b = st.empty(0, dtype=torch.float32), st.empty(0, dtype=torch.float32)
    assert a.data_ptr() == 0
    symheap.all_reduce(a, b, "sum")
    symheap.all_reduce(a)
    symheap.broadcast(a, b, root=n - 1)
    symheap.all_gather(st.empty(0, dtype=torch.float32), b)
    symheap.reduce_scatter(a, st.empty(0, dtype=torch.float32), "max")
    symheap.alltoall(a, b)
    symheap.put(a, b, pe=(me + 1) % n)
    symheap.get(a, b, pe=(me + 1) % n)
    symheap.barrier_all()


@case
def case_torch_release_order() -> None:
    """A CUDA tensor deleted right after an asynchronous put into it (still pending behind a
    closed gate on a stream) is not reused by any PE until the put finished; then it is. The
    reclaim points are host barriers (on CUDA, barrier_all is a stream barrier)."""
    import symheap.torch as st
    import torch

    me, n = symheap.my_pe(), symheap.n_pes()
    nxt = (me + 1) % n
    s = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    gate = st.zeros(1, dtype=torch.int64)
    src = torch.full((1 << 18,), me + 1, dtype=torch.int32, device=st.device())
    x = st.zeros(1 << 18, dtype=torch.int32)
    old = x.data_ptr()
    torch.cuda.synchronize()
    symheap.host_barrier()
    symheap.signal_wait_until(gate, "ge", 1, stream=s)
    symheap.put(x, src, nxt, stream=s)
    del x
    gc.collect()
    symheap.host_barrier()  # every PE released x; its put is still pending everywhere
    assert symheap.heap_usage()["waiting_releases"] == 1, symheap.heap_usage()
    y = st.zeros(1 << 18, dtype=torch.int32)
    cur.synchronize()  # not torch.cuda.synchronize(): that would wait for the gated stream
    assert y.data_ptr() != old, "memory reused while a put into it was pending"
    symheap.host_barrier()
    gate.fill_(1)
    cur.synchronize()
    s.synchronize()
    symheap.host_barrier()  # the put finished everywhere: x is reclaimed here
    assert int(y.abs().sum()) == 0, "the pending put landed in the new tensor"
    assert symheap.heap_usage()["waiting_releases"] == 0, symheap.heap_usage()
    z = st.zeros(1 << 18, dtype=torch.int32)
    assert z.data_ptr() == old, (
        f"the released memory was not reclaimed after the stream finished: x {old:#x}, "
        f"y {y.data_ptr():#x}, z {z.data_ptr():#x}, {symheap.heap_usage()}"
    )
    torch.cuda.synchronize()
    symheap.host_barrier()


@case
def case_torch_dist() -> None:
    """init() from an initialised torch.distributed (gloo): its store drives the rendezvous."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    with symheap.init():
        assert symheap.my_pe() == r and symheap.n_pes() == n
        x = sn.full(4, r, dtype=np.int64) if symheap.backend() == "host" else None
        if x is not None:
            y = sn.zeros(4, dtype=np.int64)
            symheap.all_reduce(y, x)
            assert y.tolist() == [n * (n - 1) // 2] * 4
        symheap.barrier_all()
    dist.destroy_process_group()
