"""Subgroups on the ``symheap`` backend, for pe_tdist.py's ``all`` at 3 and 4 ranks: ``new_group``
of ranks in any order, two disjoint groups used alternately, a group sharing ranks with others,
``new_subgroups``, a 2-D DeviceMesh with DTensor redistributes over each dimension, torch's non-
member behaviour, and a group with no staging slot left. The tensors are ordinary tensors of
torch's default device (CPU, or CUDA in pe_tdist's cuda mode), small and larger than the staging
slot (test_tdist.py sets it to 4096 bytes), so the subgroup collectives run in rounds. Exact
expected values from every rank's seeded data. Not collected by pytest."""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist
from symheap import SymheapUnsupportedError

# Larger than the 4096-byte slot, several rounds at every member count, and small.
SIZES = (5, 3001)


def data(rank: int, salt: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 7919 + salt * 104729)
    # Drawn on the CPU (the generator's device), then on the default device (CUDA in pe_tdist's
    # cuda mode).
    return torch.randint(-50, 50, shape, generator=g, device="cpu").to(dtype).to(torch.get_default_device())


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.flatten()[:8]}... want {want.flatten()[:8]}...")


def on_group(r: int, ranks: List[int], g, salt: int) -> None:
    """The collectives of ``g`` (world ``ranks`` in group order) on member ``r``."""
    m, me = len(ranks), ranks.index(r)
    assert dist.get_group_rank(g, r) == me and dist.get_world_size(g) == m
    for k in SIZES:
        xs = [data(q, salt, (k,)) for q in ranks]
        t = xs[me].clone()
        dist.all_reduce(t, group=g)
        same(t, sum(xs[1:], xs[0].clone()), f"all_reduce {k} over {ranks}")
        ys = [data(q, salt + 1, (k,), torch.int64) for q in ranks]
        t = ys[me].clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        same(t, torch.stack(ys).amax(0), f"all_reduce max {k} over {ranks}")
        out = torch.full((m * k,), -1.0)
        dist.all_gather_into_tensor(out, xs[me], group=g)
        same(out, torch.cat(xs), f"all_gather_into_tensor {k} over {ranks}")
        zs = [data(q, salt + 2, (m * k,), torch.bfloat16) for q in ranks]
        out = torch.full((k,), -1.0, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, zs[me], group=g)
        want = sum((z.float() for z in zs), torch.zeros(m * k))[me * k : (me + 1) * k].to(torch.bfloat16)
        same(out, want, f"reduce_scatter_tensor {k} over {ranks}")
        t = xs[me].clone()
        dist.broadcast(t, group=g, group_src=m - 1)
        same(t, xs[m - 1], f"broadcast {k} from group rank {m - 1} over {ranks}")
        outs = [torch.full((k,), -1.0) for _ in ranks]
        dist.gather(xs[me], outs if me == 0 else None, group=g, group_dst=0)
        if me == 0:
            same(torch.cat(outs), torch.cat(xs), f"gather {k} over {ranks}")
        t = torch.full((k,), -1.0)
        dist.scatter(t, [data(j, salt + 3, (k,)) for j in range(m)] if me == m - 1 else None, group=g, group_src=m - 1)
        same(t, data(me, salt + 3, (k,)), f"scatter {k} over {ranks}")
    # Uneven all_to_all_single: member i sends split[i][j] rows of 700 int64 (5600 bytes) to j.
    gen = torch.Generator().manual_seed(salt)
    split = torch.randint(0, 3, (m, m), generator=gen, device="cpu").tolist()

    def rows(i: int, j: int) -> torch.Tensor:
        base = (salt * 100 + i * 10 + j) * 10000
        return torch.arange(base, base + split[i][j] * 700, dtype=torch.int64).view(-1, 700)

    inp = torch.cat([rows(me, j) for j in range(m)])
    out = torch.full((sum(split[i][me] for i in range(m)), 700), -1, dtype=torch.int64)
    dist.all_to_all_single(
        out, inp, output_split_sizes=[split[i][me] for i in range(m)], input_split_sizes=split[me], group=g
    )
    same(out, torch.cat([rows(i, me) for i in range(m)]), f"all_to_all_single uneven {split} over {ranks}")
    t = data(r, salt + 4, (m * 1500,))
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t, group=g)
    want = torch.cat([data(q, salt + 4, (m * 1500,))[me * 1500 : (me + 1) * 1500] for q in ranks])
    same(out, want, f"all_to_all_single even over {ranks}")
    dist.barrier(group=g)


def non_member(r: int, g) -> None:
    """torch's behaviour on a rank outside ``g``: the call returns None and runs nothing."""
    assert g == dist.GroupMember.NON_GROUP_MEMBER, g
    t = torch.full((4,), float(r))
    assert dist.all_reduce(t, group=g) is None
    same(t, torch.full((4,), float(r)), "non-member all_reduce left the tensor")


def check_new_group(r: int, n: int) -> None:
    asked = [2, 0, 3] if n == 4 else [2, 0]
    g = dist.new_group(asked)
    ranks = sorted(asked)  # torch keeps new_group's ranks sorted
    if r in ranks:
        assert dist.get_process_group_ranks(g) == ranks, dist.get_process_group_ranks(g)
        on_group(r, ranks, g, 10)
    else:
        non_member(r, g)
    # Two disjoint groups, used alternately (and the first group still live beside them).
    halves = [list(range(n // 2)), list(range(n // 2, n))]
    hs = [dist.new_group(h) for h in halves]
    mine = 0 if r < n // 2 else 1
    for rep in range(3):
        for i in (0, 1):
            if i == mine and len(halves[i]) > 1:
                k = SIZES[rep % 2]
                xs = [data(q, 20 + rep, (k,)) for q in halves[i]]
                t = xs[halves[i].index(r)].clone()
                dist.all_reduce(t, group=hs[i])
                same(t, sum(xs[1:], xs[0].clone()), f"alternate all_reduce over {halves[i]}")
            elif i != mine:
                non_member(r, hs[i])
        if r in ranks and rep == 0:
            on_group(r, ranks, g, 30)
    dist.barrier()


def check_subgroups(r: int, n: int) -> None:
    cur, subs = dist.new_subgroups(2)
    assert len(subs) == n // 2
    pair = [r - r % 2, r - r % 2 + 1]
    assert dist.get_process_group_ranks(cur) == pair
    on_group(r, pair, cur, 40)


def check_mesh(r: int, n: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(torch.get_default_device().type, (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_group(), mesh["tp"].get_group()
    assert dist.get_process_group_ranks(dp) == [r % 2, r % 2 + 2]
    assert dist.get_process_group_ranks(tp) == [r - r % 2, r - r % 2 + 1]
    on_group(r, dist.get_process_group_ranks(dp), dp, 50)
    on_group(r, dist.get_process_group_ranks(tp), tp, 60)
    full = data(0, 70, (64, 48))  # the same on every rank
    d = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    for places in ([Replicate(), Shard(1)], [Shard(0), Replicate()], [Shard(1), Shard(0)], [Replicate(), Replicate()]):
        e = d.redistribute(mesh, places)
        same(e.full_tensor(), full, f"DTensor redistribute [Shard(0), Shard(1)] -> {places}")
    local = data(r, 71, (16, 48))
    p = DTensor.from_local(local, mesh, [Shard(0), Partial()])
    want_rows = [data(q, 71, (16, 48)) for q in range(4)]
    want = torch.cat([want_rows[0] + want_rows[1], want_rows[2] + want_rows[3]])
    same(p.redistribute(mesh, [Shard(0), Replicate()]).full_tensor(), want, "DTensor Partial over tp")
    q = DTensor.from_local(local, mesh, [Partial(), Shard(0)])
    want = torch.cat([want_rows[0] + want_rows[2], want_rows[1] + want_rows[3]])
    same(q.redistribute(mesh, [Replicate(), Replicate()]).full_tensor(), want, "DTensor Partial over dp")


def check_no_slot(r: int, n: int) -> None:
    """More live subgroups on ranks 0 and 1 than slots: the ones made with none refuse
    ordinary tensors on every member alike, naming the call, and still take symmetric ones."""
    import symheap.torch as st

    made = [dist.new_group([0, 1]) for _ in range(9)]
    sym = st.full((3,), float(r), dtype=torch.float32)
    if r > 1:
        for g in made:
            non_member(r, g)
        dist.barrier()
        return
    refused = 0
    for g in made:
        t = torch.full((3,), float(r))
        try:
            dist.all_reduce(t, group=g)
            same(t, torch.full((3,), 1.0), "all_reduce on a group with a slot")
        except SymheapUnsupportedError as e:
            assert "all_reduce" in str(e) and "slot" in str(e), str(e)
            refused += 1
            dist.all_reduce(sym, group=g)
            same(sym, torch.full((3,), 1.0), "symmetric all_reduce on a group without a slot")
            sym.fill_(float(r))
    assert refused >= 1, "every subgroup got a slot"
    dist.barrier()


def check_groups(r: int, n: int) -> None:
    check_new_group(r, n)
    if n == 4:
        check_subgroups(r, n)
        check_mesh(r, n)
        check_no_slot(r, n)
