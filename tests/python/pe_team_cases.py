"""PE cases for teams of any world ranks in any order: ``team_split_ranks`` (collective over
the parent) and ``team_from_ranks`` (made by the members alone over an exchange among them:
here a ``torch.distributed.TCPStore`` served by a member of each group). Exact collectives on
seeded random data, membership and translation, and the errors."""

from __future__ import annotations

import datetime
from typing import List

import numpy as np
import symheap
import symheap.numpy as sn
from pe_common import POISONED, case, poison, raises, rng_for
from symheap import SymheapError, SymheapMismatchError, SymheapValueError

POISONED.add("team_ranks_mismatch")

K = 6  # elements per block


def _check_team(team, members: List[int]) -> None:
    """``team`` holds world PEs ``members`` in that order (invalid on the other PEs)."""
    me, n = symheap.my_pe(), symheap.n_pes()
    world = symheap.team_world()
    assert team.is_valid == (me in members), (me, members)
    if me not in members:
        assert team.n_pes() == 0 and team.my_pe() is None
        assert symheap.team_translate_pe(world, me, team) is None
        return
    assert team.members == members and team.my_pe() == members.index(me), (team.members, members)
    for i, w in enumerate(members):
        assert symheap.team_translate_pe(team, i, world) == w
        assert symheap.team_translate_pe(world, w, team) == i
    for w in set(range(n)) - set(members):
        assert symheap.team_translate_pe(world, w, team) is None


def _collectives(team, members: List[int], data: np.ndarray, bufs) -> None:
    """all_reduce, all_gather (blocks in team order), broadcast from the last member,
    alltoall and a barrier on ``team``, exact against ``data[world rank]``."""
    me = symheap.my_pe()
    k, i = len(members), members.index(me)
    x, out, big, big2 = bufs
    x[...] = data[me, :K]
    poison(out)
    symheap.all_reduce(out, x, "sum", team=team)
    assert np.array_equal(out, data[members, :K].sum(0)), "all_reduce"
    g = big[: k * K].reshape(k, K)
    poison(g)
    symheap.all_gather(g, x, team=team)
    assert np.array_equal(g, data[members, :K]), "all_gather in team order"
    poison(out)
    symheap.broadcast(out, x, root=k - 1, team=team)
    assert np.array_equal(out, data[members[-1], :K]), "broadcast from the last member"
    src = big[: k * K].reshape(k, K)
    dst = big2[: k * K].reshape(k, K)
    src[...] = data[me, : k * K].reshape(k, K) * 10 + np.arange(k)[:, None]
    poison(dst)
    symheap.alltoall(dst, src, team=team)
    want = np.stack([data[m, : k * K].reshape(k, K)[i] * 10 + i for m in members])
    assert np.array_equal(dst, want), "alltoall"
    # The host-side max the torch backend's staged uneven all_to_all agrees its rounds with.
    got = symheap._core.native().team_max(team, int(data[me, 1]) + 1000)
    assert got == int(data[members, 1].max()) + 1000, ("team_max", got, data[members, 1])
    symheap.barrier(team)


def _bufs(n: int):
    """The buffers every PE allocates first (allocation is collective over the world)."""
    return (
        sn.empty(K, dtype=np.int64),
        sn.empty(K, dtype=np.int64),
        sn.empty(n * K, dtype=np.int64),
        sn.empty(n * K, dtype=np.int64),
    )


@case
def case_teams_any() -> None:
    """Splits of the world by lists of ranks: the world reversed, random lists in random order,
    a nested split of each by another random list; every collective exact; bad lists."""
    me, n = symheap.my_pe(), symheap.n_pes()
    rng = rng_for("teams_any")
    data = rng.integers(-1000, 1000, size=(n, n * K)).astype(np.int64)
    bufs = _bufs(n)
    for round in range(4):
        if round == 0:
            members = list(range(n))[::-1]
        else:
            members = [int(r) for r in rng.permutation(n)[: rng.integers(1, n + 1)]]
        team = symheap.team_split_ranks(None, members)
        _check_team(team, members)
        if team.is_valid:
            _collectives(team, members, data, bufs)
        sub = [int(r) for r in rng.permutation(len(members))[: rng.integers(1, len(members) + 1)]]
        nested = symheap.team_split_ranks(team, sub)
        _check_team(nested, [members[j] for j in sub])
        if nested.is_valid:
            _collectives(nested, [members[j] for j in sub], data, bufs)
        symheap.team_destroy(nested)
        symheap.team_destroy(team)
        symheap.barrier_all()
    # team_max over the world (the bootstrap's exchange) and on a team this PE is not in.
    v = rng.integers(0, 1 << 62, size=n)
    assert symheap._core.native().team_max(None, int(v[me])) == int(v.max())
    if n > 1:
        alone = symheap.team_split_ranks(None, [0])
        assert symheap._core.native().team_max(alone, 7 + me) == 7 + me
        symheap.team_destroy(alone)
    raises(SymheapValueError, symheap.team_split_ranks, None, [])
    raises(SymheapValueError, symheap.team_split_ranks, None, [n])
    raises(SymheapValueError, symheap.team_split_ranks, None, [0, 0])
    raises(SymheapValueError, symheap.team_split_ranks, None, [-1])
    raises(SymheapValueError, symheap.team_split_ranks, None, 3)
    assert me in range(n)
    symheap.barrier_all()


@case
def case_team_max_across_nodes() -> None:
    """Run with every PE on its own node: the world's team_max meets through the bootstrap
    across the nodes; a team spanning nodes has no memory its members share, so its team_max
    is refused as unsupported on each member (the torch backend then reduces on the device
    instead); a team of one meets in its own memory."""
    import symheap._core as core
    from symheap import SymheapUnsupportedError

    me, n = symheap.my_pe(), symheap.n_pes()
    v = rng_for("team_max_nodes").integers(0, 1 << 62, size=n)
    assert core.native().team_max(None, int(v[me])) == int(v.max())
    spanning = symheap.team_split_ranks(None, [0, n - 1])
    if spanning.is_valid:
        raises(SymheapUnsupportedError, core.native().team_max, spanning, 5)
    symheap.team_destroy(spanning)
    alone = symheap.team_split_ranks(None, [1])
    if alone.is_valid:
        assert core.native().team_max(alone, int(v[me])) == int(v[1])
    symheap.team_destroy(alone)
    symheap.barrier_all()


@case
def case_team_ranks_mismatch() -> None:
    """The last PE passes the list reversed: SymheapMismatchError on every PE naming both."""
    me, n = symheap.my_pe(), symheap.n_pes()
    members = list(range(n))
    mine = members[::-1] if me == n - 1 else members
    e = raises(SymheapMismatchError, symheap.team_split_ranks, None, mine)
    text = str(e)
    for lst in (members, members[::-1]):
        assert f"team_split_ranks(ranks [{', '.join(map(str, lst))}])" in text, text


def _store_exchange(group: List[int], name: str, host_port):
    """An exchange among ``group`` only, over a TCPStore its first member serves: returns
    (the exchange, the store)."""
    from torch.distributed import TCPStore

    me = symheap.my_pe()
    host, port = host_port
    store = TCPStore(host, port, len(group), me == group[0], timeout=datetime.timedelta(seconds=60))
    calls = [0]

    def exchange(data: bytes) -> List[bytes]:
        assert isinstance(data, bytes)
        calls[0] += 1
        store.set(f"{name}/{calls[0]}/{me}", data)
        keys = [f"{name}/{calls[0]}/{r}" for r in group]
        store.wait(keys)
        return [store.get(k) for k in keys]

    return exchange, store


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@case
def case_team_from_ranks() -> None:
    """The world cut into two groups in random orders, each team made by its members alone
    over a TCPStore among them (the public function for one group, the native context method
    the torch backend calls for the other): membership, translation, every collective, a
    nested split; a list passed in another order, a raising exchange and bad lists raise."""
    import symheap._core as core

    me, n = symheap.my_pe(), symheap.n_pes()
    rng = rng_for("team_from_ranks")
    data = rng.integers(-1000, 1000, size=(n, n * K)).astype(np.int64)
    bufs = _bufs(n)
    order = [int(r) for r in rng.permutation(n)]
    cut = int(rng.integers(1, n + 1))
    groups = [order[:cut], order[cut:]]
    gi = 0 if me in groups[0] else 1
    group = groups[gi]
    # The servers' ports, learned through the world (the exchanges themselves are the groups').
    port = _free_port() if me == group[0] else 0
    ports = [int(b) for b in symheap.all_gather_object_bytes(str(port).encode())]
    exchange, _store = _store_exchange(group, f"g{gi}", ("127.0.0.1", ports[group[0]]))
    if gi == 0:
        team = symheap.team_from_ranks(group, exchange)
    else:
        team = core.native().team_from_ranks(group, exchange)
    _check_team(team, group)
    _collectives(team, group, data, bufs)
    sub = list(range(len(group)))[::-1]
    nested = symheap.team_split_ranks(team, sub)
    _check_team(nested, group[::-1])
    _collectives(nested, group[::-1], data, bufs)
    symheap.team_destroy(nested)
    # A member passing the list in another order: every member names both lists.
    if len(group) >= 2:
        mine = group[::-1] if me == group[-1] else group
        e = raises(SymheapMismatchError, symheap.team_from_ranks, mine, exchange)
        for lst in (group, group[::-1]):
            assert "[" + ", ".join(map(str, lst)) + "]" in str(e), str(e)

    def broken(data: bytes) -> List[bytes]:
        raise ConnectionError("store went away")

    e = raises(SymheapError, symheap.team_from_ranks, [me], broken)
    assert e.call == "team_from_ranks" and "ConnectionError: store went away" in str(e), (e.call, str(e))
    assert isinstance(e.__cause__, ConnectionError), repr(e.__cause__)
    e = raises(SymheapError, symheap.team_from_ranks, [me], lambda d: ["not bytes"])
    assert e.call == "team_from_ranks" and isinstance(e.__cause__, TypeError), (str(e), repr(e.__cause__))
    raises(SymheapValueError, symheap.team_from_ranks, [me, me], exchange)
    raises(SymheapValueError, symheap.team_from_ranks, [n], exchange)
    raises(SymheapValueError, symheap.team_from_ranks, [me], "not callable")
    if n > 1:
        others = [r for r in range(n) if r != me]
        raises(SymheapValueError, symheap.team_from_ranks, others, exchange)
    symheap.team_destroy(team)
    symheap.barrier_all()
