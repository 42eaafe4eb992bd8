#!/usr/bin/env bash
# Alternated A/B of two `symheap` executables on the host backend: which is faster, per op and
# size, measured in one run so that the machine's drift hits both alike.
#
#   scripts/ab_host_bench.sh [-r ROUNDS] [-n PES] [-o DIR] [--mpi] A B [-- BENCH ARGS...]
#
# Each round runs `A bench ... --host` and `B bench ... --host` back to back, A first in odd
# rounds and B first in even ones (A B, B A, A B, ...: the second of a pair ran slower on the
# 2-core VM, see bench_host_repeat.sh). BENCH ARGS default to `all` (put/get, barrier,
# all_reduce and broadcast from 8 B to 16 MiB); `coll --op broadcast --sizes 8,64` narrows it.
# Printed per op x size: each binary's median time, and over the rounds the ratio B/A of the
# two runs of a round (above 1: A is faster), its median and spread [min-max], and whether the
# median clears 10 % either way (`-t` changes the bar). Defaults: 8 rounds, 2 PEs, JSON of
# every run in a new /tmp/symheap-ab.* (or DIR). The Open MPI peer is skipped (mpicc is kept
# off PATH: it measures no symheap code) unless --mpi.
#
# --gpu: the GPU sweep instead (no --host; e.g. `-n 1 --gpu A B -- coll --op all_reduce`), each
# row's CUDA-graph and eager times compared apart. Both binaries then compile their kernels with
# the machine's NVRTC (SYMHEAP_KERNEL_IMAGE=nvrtc, each in its own kernel cache), so what differs
# is the code, not which compiler built the shipped images.
#
# Needs only the two executables and python3 (standard library): no Rust, no Python packages.
# Build them from two commits, e.g.
#   git worktree add --detach /tmp/ab-b COMMIT_B
#   (cd /tmp/ab-b && cargo build --release --locked -p symheap-cli) && cp /tmp/ab-b/target/release/symheap B
set -euo pipefail
exec python3 - "$@" <<'PY'
import argparse, hashlib, json, os, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser(prog="ab_host_bench.sh", description="alternated A/B of two symheap executables")
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("-r", "--rounds", type=int, default=8)
ap.add_argument("-n", "--pes", type=int, default=2)
ap.add_argument("-o", "--out")
ap.add_argument("-t", "--threshold", type=float, default=0.10, help="the bar, as a fraction (0.10: 10 %%)")
ap.add_argument("--mpi", action="store_true", help="let the bench run its Open MPI peer")
ap.add_argument("--gpu", action="store_true", help="the GPU sweep (kernels compiled by NVRTC for both)")
argv = sys.argv[1:]
extra = []
if "--" in argv:
    k = argv.index("--")
    argv, extra = argv[:k], argv[k + 1 :]
args = ap.parse_args(argv)
extra = extra or ["all"]
bins = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
for k, b in bins.items():
    if not (os.path.isfile(b) and os.access(b, os.X_OK)):
        sys.exit(f"ab_host_bench: {k} = {b} is not an executable")
out = args.out or tempfile.mkdtemp(prefix="symheap-ab.")
os.makedirs(out, exist_ok=True)

env = dict(os.environ)
envs = {"A": dict(env), "B": dict(env)}
if args.gpu:
    for k in envs:
        envs[k]["SYMHEAP_KERNEL_IMAGE"] = "nvrtc"
        envs[k]["SYMHEAP_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"symheap-ab-cache-{k}.")
if not args.mpi:
    # The bench compiles its MPI peer with the mpicc on PATH: without one it skips the peer.
    keep = [d for d in env.get("PATH", "").split(":") if d and not os.path.exists(os.path.join(d, "mpicc"))]
    for e in envs.values():
        e["PATH"] = ":".join(keep)


def digest(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


print(f"A = {bins['A']} (sha256 {digest(bins['A'])})")
print(f"B = {bins['B']} (sha256 {digest(bins['B'])})")
where = "" if args.gpu else " --host"
print(f"bench {' '.join(extra)}{where} -n {args.pes}; {args.rounds} rounds, alternated; {os.cpu_count()} CPUs; "
      f"load average {loadavg()} at the start; JSON in {out}")
times = {}  # (op, bytes) -> {"A": [..], "B": [..]}, one per round


def measured(doc):
    """(op, bytes) -> microseconds of one run's JSON rows: the host's (``symheap_s``) or the
    GPU's, whose graph and eager times count as two ops."""
    seen = set()
    rows = doc["rows"] if isinstance(doc, dict) else doc
    for row in rows:
        if "symheap_s" in row:
            key = (row["op"], row["bytes"])
            if key not in seen:  # put/get rows repeat once per peer, same symheap time
                seen.add(key)
                yield key, row["symheap_s"] * 1e6
            continue
        for mode in ("graph", "eager"):
            t = row.get(f"{mode}_us")
            key = (f"{row['op']} {row['dtype']} {mode}", row["bytes"])
            if t and key not in seen:
                seen.add(key)
                yield key, t
order = []
t0 = time.time()
for r in range(1, args.rounds + 1):
    pair = ["A", "B"] if r % 2 else ["B", "A"]
    for k in pair:
        f = os.path.join(out, f"round{r}-{k}.json")
        cmd = [bins[k], "bench", *extra, *([] if args.gpu else ["--host"]), "-n", str(args.pes), "--json", f]
        with open(os.path.join(out, f"round{r}-{k}.log"), "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=envs[k])
        if rc != 0:
            sys.exit(f"ab_host_bench: round {r}, {k} exited {rc}: {' '.join(cmd)} (log in {out})")
        with open(f) as fh:
            for key, t in measured(json.load(fh)):
                if key not in times:
                    times[key] = {"A": [], "B": []}
                    order.append(key)
                times[key][k].append(t)
    print(f"round {r}/{args.rounds} done ({' '.join(pair)}), {time.time() - t0:.0f} s, load {loadavg()}", file=sys.stderr)


def human(b):
    if not b:
        return "-"
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if b < 1024 or unit == "GiB":
            return f"{b:g} {unit}"
        b /= 1024


def us(v):
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 1000 else f"{v:.0f}"


bar = args.threshold
print(f"\nB/A: B's time over A's in the same round (above 1: A faster). Bar: {bar:.0%}.\n")
print("| op | size | A us (median) | B us (median) | B/A median | B/A spread [min-max] | verdict |")
print("|---|---|---|---|---|---|---|")
summary = []
for key in order:
    a, b = times[key]["A"], times[key]["B"]
    ratios = [y / x for x, y in zip(a, b) if x > 0]
    if not ratios:
        continue
    med = statistics.median(ratios)
    if med >= 1 + bar:
        verdict = f"A faster by {med - 1:.0%}"
    elif med <= 1 / (1 + bar):
        verdict = f"B faster by {1 / med - 1:.0%}"
    else:
        verdict = "within the bar"
    # A ratio whose spread crosses 1 changed sides between rounds: the machine was noisier
    # than the difference.
    if min(ratios) < 1 < max(ratios) and verdict != "within the bar":
        verdict += " (spread crosses 1)"
    print(f"| {key[0]} | {human(key[1])} | {us(statistics.median(a))} | {us(statistics.median(b))} "
          f"| {med:.3f} | {min(ratios):.3f}-{max(ratios):.3f} | {verdict} |")
    summary.append({"op": key[0], "bytes": key[1], "a_us": a, "b_us": b, "ratio_median": med,
                    "ratio_min": min(ratios), "ratio_max": max(ratios)})
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump({"a": bins["A"], "b": bins["B"], "bench": extra, "pes": args.pes, "rounds": args.rounds,
               "rows": summary}, f, indent=1)
print(f"\n{args.rounds} rounds in {time.time() - t0:.0f} s; load average {loadavg()} at the end; "
      f"summary in {out}/summary.json")
PY
