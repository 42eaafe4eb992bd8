#!/usr/bin/env bash
# Repeats the host-backend sweep (`symheap bench all --host`: put/get, barrier, all_reduce and
# broadcast from 8 B to 16 MiB, each with its memcpy / Open MPI peer measured in the same run)
# and prints one table per binary: symheap median [min-max], peer median [min-max] and the
# ratio peer time / symheap time (above 1: symheap faster), median [min-max] over the runs of
# the per-run ratios.
#
#   scripts/bench_host_repeat.sh [-r RUNS] [-n PES] [-o DIR] [BIN [BIN2]] [-- BENCH ARGS...]
#
# With two binaries (e.g. before and after a change) the runs alternate A B B A A B ..., so
# drift of a shared machine and the position in a pair hit both alike. Defaults: 5 runs, 2 PEs,
# ./target/release/symheap, JSON of every run kept in a temporary directory (or DIR). Needs
# python3 for the table.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5 pes=2 out=""
bins=() extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -r) runs="$2"; shift 2 ;;
    -n) pes="$2"; shift 2 ;;
    -o) out="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ ${#bins[@]} -eq 0 ] && bins=(./target/release/symheap)
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "bench_host_repeat: $b is not an executable (cargo build --release -p symheap-cli)" >&2; exit 2; }
done
[ -n "$out" ] || out="$(mktemp -d /tmp/symheap-repeat.XXXXXX)"
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  # A B, then B A: a binary that always runs second after the other's Open MPI peer measured
  # its collectives up to 1.7x slower on the 2-core VM (either binary, 2026-12-02).
  order=("${!bins[@]}")
  [ $((i % 2)) = 0 ] && order=($(printf '%s\n' "${order[@]}" | tac))
  for k in "${order[@]}"; do
    f="$out/bin$k-run$i.json"
    echo "run $i/$runs: ${bins[$k]}" >&2
    "${bins[$k]}" bench all --host -n "$pes" "${extra[@]}" --json "$f" >/dev/null
  done
done
echo "runs: $runs per binary, $pes PEs, JSON in $out; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$runs" "${bins[@]}" <<'EOF'
import json, statistics, sys
out, runs, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def human(b):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if b < 1024 or unit == "GiB":
            return f"{b:g} {unit}"
        b /= 1024

def span(v, f=None):
    # Three decimals below 1 us: the small-message rows differ by nanoseconds.
    f = f or ("{:.3f}" if statistics.median(v) < 1 else "{:.2f}")
    return f"{f.format(statistics.median(v))} [{f.format(min(v))}-{f.format(max(v))}]"

for k, b in enumerate(bins):
    table = {}
    for i in range(1, runs + 1):
        for r in json.load(open(f"{out}/bin{k}-run{i}.json"))["rows"]:
            if r.get("peer_s") is None:
                continue
            key = (r["op"], r["bytes"], r["peer"])
            table.setdefault(key, []).append((r["symheap_s"] * 1e6, r["peer_s"] * 1e6))
    print(f"\n{b}\n")
    print("| op | size | peer | symheap, us | peer, us | peer/symheap |")
    print("|---|---|---|---|---|---|")
    for (op, size, peer), v in table.items():
        s = [x for x, _ in v]
        p = [y for _, y in v]
        ratio = [y / x for x, y in v]
        print(f"| {op} | {human(size) if size else '-'} | {peer} | {span(s)} | {span(p)} | {span(ratio, '{:.2f}x')} |")
EOF
