#!/usr/bin/env bash
# `scripts/diverge_stats.sh [PROGRAMS] [SYMHEAP]`: the divergence property test at scale, with
# numbers: PROGRAMS random programs (default 100) at each of 2, 3, 4 and 8 PEs, each a job of
# `symheap selftest-pe diverge` under `symheap launch` (GPU: set SYMHEAP_BACKEND=cuda). Prints
# the programs run, how many diverged and were named on every PE, the slowest naming, and the
# failures (a timeout, a wrong result or a job that did not end as expected), which must be 0.
set -euo pipefail
N="${1:-100}"
B="${2:-target/debug/symheap}"
export SYMHEAP_TIMEOUT="${SYMHEAP_TIMEOUT:-30}" SYMHEAP_CHUNK_SIZE="${SYMHEAP_CHUNK_SIZE:-4M}"
runs=0; diverged=0; identical=0; bad=0; slowest=0
for pes in 2 3 4 8; do
  for k in $(seq 1 "$N"); do
    seed=$((k * 7919 + pes))
    out="$("$B" launch -n "$pes" --grace 2 -- "$B" selftest-pe diverge --seed "$seed" 2>&1)" && rc=0 || rc=$?
    runs=$((runs + 1))
    passed=$(grep -c "SELFTEST-PASS\|PASS diverge" <<<"$out" || true)
    named=$(grep -c "named in" <<<"$out" || true)
    if [ "$rc" -ne 0 ]; then
      bad=$((bad + 1))
      echo "FAILED: $pes PEs, seed $seed" >&2
      { grep -E "SELFTEST-FAIL|error" <<<"$out" || tail -n 5 <<<"$out"; } | head -5 >&2
      continue
    fi
    if [ "$named" -eq "$pes" ]; then
      diverged=$((diverged + 1))
      t=$(grep -oE "named in [0-9.]+" <<<"$out" | awk '{print $3}' | sort -g | tail -1)
      slowest=$(awk -v a="$slowest" -v b="$t" 'BEGIN { print (b > a) ? b : a }')
    elif [ "$named" -eq 0 ]; then
      identical=$((identical + 1))
    else
      bad=$((bad + 1))
      echo "FAILED: $pes PEs, seed $seed: only $named of $pes PEs named the mismatch" >&2
    fi
    : "$passed"
  done
done
echo "| programs | diverged, named on every PE | identical, exact | slowest naming (s) | timeouts, wrong results or bad ends |"
echo "|---|---|---|---|---|"
echo "| $runs | $diverged | $identical | $slowest | $bad |"
[ "$bad" -eq 0 ]
