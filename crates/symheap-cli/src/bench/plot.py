"""Draws `symheap bench` JSON rows as a PNG: time per op against size, symheap and its peers,
one panel per operation. GPU rows: one panel per collective (CUDA-graph numbers): symheap against
the best peer per size (named at each point, with best peer time / symheap time), every peer faint
behind, plus the RMA bandwidth panel when present. Host rows: one panel per operation with a size (put/get and each
collective), the peer drawn where it was measured.
Usage: python3 plot.py rows.json out.png"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def peers(r):
    """(name, graph us) of every peer of a collective row: the in-process one and the merged ones."""
    own = [(r["peer"], r["peer_graph_us"])] if r.get("peer_graph_us") else []
    return [(n, v) for n, v in own + [tuple(o) for o in r.get("others", [])] if v and v > 0]


def gpu(rows):
    coll = [r for r in rows if r["group"] == "coll"]
    rma = [r for r in rows if r["group"] == "rma" and r["bus_factor"] > 0]
    ops = sorted({r["op"] for r in coll})
    panels = len(ops) + (1 if rma else 0)
    fig, axes = plt.subplots(1, max(panels, 1), figsize=(5 * max(panels, 1), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rs = sorted([r for r in coll if r["op"] == op], key=lambda r: r["bytes"])
        x = [r["bytes"] for r in rs]
        ax.plot(x, [r["graph_us"] for r in rs], "o-", color="C0", lw=2, label="symheap")
        # Every peer faint, the best of them per size bold, named at each point.
        names = list(dict.fromkeys(n for r in rs for n, _ in peers(r)))
        for i, name in enumerate(names):
            pts = [(r["bytes"], v) for r in rs for n, v in peers(r) if n == name]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ":", color=f"C{i + 2}", alpha=0.5, lw=1, label=name)
        best = [(r["bytes"], min(peers(r), key=lambda p: p[1]), r["graph_us"]) for r in rs if peers(r)]
        ax.plot([b[0] for b in best], [b[1][1] for b in best], "s--", color="C1", lw=2, label="best peer")
        for b, (name, t), mine in best:
            ax.annotate(f"{name}\n{t / mine:.2f}x", (b, t), fontsize=5, textcoords="offset points", xytext=(2, 4))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op} ({rs[0]['dtype']}), CUDA graph")
        ax.set_xlabel("bytes")
        ax.set_ylabel("us per op")
        ax.legend(fontsize=6)
    if rma:
        ax = axes[0][-1]
        for op in sorted({r["op"] for r in rma}):
            rs = sorted([r for r in rma if r["op"] == op], key=lambda r: r["bytes"])
            ax.plot([r["bytes"] for r in rs], [r["bytes"] / r["eager_us"] / 1e3 for r in rs], "o-", label=op)
        rs = sorted([r for r in rma if r["op"] == "put SM"], key=lambda r: r["bytes"])
        ax.plot(
            [r["bytes"] for r in rs], [r["bytes"] / r["peer_eager_us"] / 1e3 for r in rs], "k--", label="plain P2P copy"
        )
        ax.set_xscale("log", base=2)
        ax.set_title("put/get bandwidth")
        ax.set_xlabel("bytes")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=7)
    return fig


def host(rows):
    sized = [r for r in rows if r["bytes"] > 0]
    ops = list(dict.fromkeys(r["op"] for r in sized))
    fig, axes = plt.subplots(1, max(len(ops), 1), figsize=(5 * max(len(ops), 1), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rs = sorted([r for r in sized if r["op"] == op], key=lambda r: r["bytes"])
        # An op may have several peers (put: memcpy and MPI_Put), one row each with the same
        # symheap time: symheap once per size, each peer its own line.
        mine = {r["bytes"]: r["symheap_s"] for r in rs}
        ax.plot(list(mine), [t * 1e6 for t in mine.values()], "o-", label="symheap")
        for name in dict.fromkeys(r["peer"] for r in rs):
            peer = [(r["bytes"], r["peer_s"] * 1e6) for r in rs if r["peer"] == name and r["peer_s"] is not None]
            if peer:
                ax.plot([p[0] for p in peer], [p[1] for p in peer], "s--", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op}, host backend")
        ax.set_xlabel("bytes")
        ax.set_ylabel("us per op")
        ax.legend(fontsize=7)
    barrier = [r for r in rows if r["op"] == "barrier"]
    if barrier:
        fig.suptitle(f"barrier: {barrier[0]['symheap_s'] * 1e6:.2f} us per op")
    return fig


rows = json.load(open(sys.argv[1]))
fig = host(rows) if rows and "symheap_s" in rows[0] else gpu(rows)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
