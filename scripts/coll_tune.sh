#!/usr/bin/env bash
# Tuning runs of the collective kernels on a GPU machine: one `symheap bench coll` per variant of
# the kernels' constants (SYMHEAP_COLL_DEFINES, see README), each against NCCL in the same run.
#
#   scripts/coll_tune.sh OPS SIZES VARIANT...
#     OPS      e.g. all_reduce,reduce_scatter
#     SIZES    e.g. 512K,1M,4M
#     VARIANT  a SYMHEAP_COLL_DEFINES value, e.g. "SYMHEAP_COLL_PIPE_STEP=4K"; "-" = the defaults
#   BIN (default .carry/bin/symheap) picks the binary, so two builds can be compared in one call.
#
# Prints each variant's table rows; the raw logs land in $OUT (or ./gpu-results).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,10p "$0" >&2; exit 2; }
ops="$1" sizes="$2"
shift 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMHEAP_CACHE_DIR="${TMPDIR:-/tmp}/symheap-cache" SYMHEAP_TIMEOUT="${SYMHEAP_TIMEOUT:-20}"
OUTDIR="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUTDIR"
B="${BIN:-$PWD/.carry/bin/symheap}"
NGPU=$(nvidia-smi -L | wc -l)
i=0
for v in "$@"; do
  i=$((i + 1))
  log="$OUTDIR/tune-$i.log"
  echo "=== variant $i: ${v} ($(basename "$B"))"
  if [ "$v" = "-" ]; then
    timeout -k 5 120 env -u SYMHEAP_COLL_DEFINES "$B" bench coll -n "$NGPU" --op "$ops" --sizes "$sizes" >"$log" 2>&1
  else
    timeout -k 5 120 env SYMHEAP_COLL_DEFINES="$v" "$B" bench coll -n "$NGPU" --op "$ops" --sizes "$sizes" >"$log" 2>&1
  fi
  rc=$?
  grep -E "^\| (all|reduce|broad|op )" "$log" || tail -n 20 "$log"
  [ $rc = 0 ] || echo "variant $i: exit $rc"
done
