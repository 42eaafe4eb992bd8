#!/usr/bin/env bash
# The whole GPU suite and the GPU benchmarks in one go.
#
#   scripts/gpu_suite.sh build   on the development machine: builds the release binary and the
#                                wheel as they ship (kernels prebuilt for sm_80/90/100/120) into
#                                .carry/ (git-ignored), which the device call carries along;
#                                with UCX_WHEEL=libucx_cu13-*.whl also UCX's libraries, for
#                                NVSHMEM's RMA test across simulated nodes
#   scripts/gpu_suite.sh run     on the GPU machine (no Rust there): first, before anything else
#                                touches the GPU, the cold first init + first all_reduce (empty
#                                kernel cache; target <= 1.5 s); then checks the machine, runs the
#                                self-test scenarios on the CUDA backend at 1, 2 and 4 PEs and at 8
#                                PEs on the GPUs there are, the Python tests, the benchmarks
#                                against the peers, the NVLink probe, and prints a summary table
#                                last
#
# Peers (bench/*.py, each its own step: a failure prints its reason and the suite goes on; at
# one GPU they run at one rank, a code-path check): torch SymmetricMemory; NCCL by path with
# ordinary buffers, symmetric windows and the zero-CTA (copy-engine) policy, for every libnccl
# found (SYMHEAP_NCCL_LIB or .nccl/libnccl.so.2[.xz], the one in the venv, the system's); NVSHMEM
# through nvshmem4py; FlashInfer's trtllm all_reduce; bench/tp_fused_bench.py (the fused
# all_reduce + RMSNorm and the TP MLP block against NCCL, SymmetricMemory and FlashInfer; at one
# GPU also symheap alone at 2 PEs sharing it); bench/gemm_overlap_bench.py; bench/moe_bench.py
# (MoE dispatch/combine against the NCCL path, DeepEP and torch's all_to_all_vdev_2d). Packages the GPU machine lacks travel as wheels in
# .whl/ (git-ignored) and are installed into /tmp/site first.
#   ONLY_PEERS=1 scripts/gpu_suite.sh run   just the peers and `symheap bench coll` merging them
# TREE_PY=1 lays the tree's Python files over the carried wheel's.
# AB_BEFORE=PATH (another build of the command) adds an alternated before/after of the
# collectives at one PE (AB_ROUNDS, AB_OPS, AB_SIZES).
# Shorter calls (the device budget is 30 minutes a session): SKIP_NODES (the simulated-node
# scenarios and benchmarks), SKIP_COLD (one cold run only),
# SKIP_SELFTEST, PES (default 1,2,4), SKIP_PES8, PES8_ONLY (scenarios at 8 PEs), SKIP_DIVERGE,
# SKIP_FAULTS, KILL_TRIALS, SKIP_CPP_WORK_BUILD (when no test of the C++ Work runs),
# SKIP_LOCAL_WORK, SKIP_HOST_COST (the tdist and async Work host-cost benches), SKIP_TORCH,
# TORCH_TESTS (the pytest files of python-torch; PYTEST_ADDOPTS reaches that pytest), GPU_ONLY
# (default 1: of those files only the tests that need a GPU), SKIP_PROVIDERS,
# SKIP_EXAMPLES, SKIP_BENCH, OPS_BENCH_ONLY (of the benchmarks only the fused, GEMM-overlap and
# MoE ones: no peer programs, no `symheap bench`; OPS_BENCHES picks among "tp gemm moe"); each
# step's limit is a *_LIMIT variable.
#
# Outputs land in $OUT (the device tool fetches them) or ./gpu-results.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
case "$mode" in
build)
  set -e
  # The abi3 wheel as it ships (manylinux_2_28, prebuilt kernels), for the GPU machine's Python
  # 3.12; it also leaves the prebuilt kernels in target/prebuilt-kernels for the binary.
  rm -rf .carry/wheels && mkdir -p .carry/wheels
  scripts/build_wheel.sh --out .carry/wheels
  SYMHEAP_PREBUILT_KERNELS="$PWD/target/prebuilt-kernels" cargo build --release --locked -p symheap-cli
  SYMHEAP_PREBUILT_KERNELS="$PWD/target/prebuilt-kernels" cargo build --release --locked -p symheap --examples
  mkdir -p .carry/bin
  cp target/release/symheap target/release/examples/peer_write target/release/examples/stream_ring .carry/bin/
  # The device call carries at most 64 MiB: line tables stay in target/, not in the carried copies.
  strip --strip-debug .carry/bin/*
  # UCX for NVSHMEM's UCX transport (the RMA test across simulated nodes): from the
  # libucx-cu13 wheel named by UCX_WHEEL, only the libraries its tcp and cuda_copy transports
  # load (17 of the wheel's 53 MB; the whole wheel would not fit the carry beside the rest).
  if [ -n "${UCX_WHEEL:-}" ]; then
    rm -rf .carry/ucx && mkdir -p .carry/ucx/lib/ucx
    tmp=$(mktemp -d)
    python3 -m zipfile -e "$UCX_WHEEL" "$tmp"
    for l in ucp ucs uct ucm; do cp "$tmp/libucx/lib/lib$l.so.0" .carry/ucx/lib/; done
    for m in uct_cuda ucm_cuda uct_cma; do
      cp "$tmp/libucx/lib/ucx/lib$m.so.0" .carry/ucx/lib/ucx/
      cp "$tmp/libucx/lib/ucx/lib$m.so.0" ".carry/ucx/lib/ucx/lib$m.so"
    done
    rm -rf "$tmp"
  fi
  ls -la .carry/bin .carry/wheels
  ;;
run)
  # Never NVLink multicast on shared machines.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export SYMHEAP_CACHE_DIR="${TMPDIR:-/tmp}/symheap-cache"
  OUTDIR="${OUT:-$PWD/gpu-results}"
  mkdir -p "$OUTDIR"
  B="$PWD/.carry/bin/symheap"
  PES="${PES:-1,2,4}"
  declare -a rows
  PEER_PATH=""
  step() { # name, seconds, command...
    local name="$1" limit="$2"; shift 2
    local t0=$SECONDS
    echo "=== $name: $*"
    local ok=1
    timeout -k 10 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1 || ok=0
    # What ran, in the table: a step that passes having run nothing must show it.
    local ran
    ran=$(grep -hE "[0-9]+ (passed|failed|errors?)|[0-9]+ of [0-9]+ runs passed" "$OUTDIR/$name.log" | tail -n 1 |
      sed -E 's/=+//g; s/ in [0-9.]+s.*//; s/^ +//; s/ +$//; s/^\[PE [0-9]+\] //')
    if [ "$ok" = 1 ]; then
      rows+=("| $name | pass${ran:+: $ran} | $((SECONDS - t0)) s |")
    else
      rows+=("| $name | FAIL${ran:+: $ran} (see $name.log) | $((SECONDS - t0)) s |")
      tail -n 40 "$OUTDIR/$name.log"
    fi
    case "$name" in
      selftest*) grep -E "runs passed|FAILED" "$OUTDIR/$name.log" | tail -n 30 ;;
    esac
  }
  # Each peer program at one rank per GPU; what it could not measure, and why, is in its log.
  peer() { # name, seconds, script, args...
    local name="$1" limit="$2" script="$3"; shift 3
    step "peer-$name" "$limit" env PYTHONPATH="${PEER_PATH:-}${PYTHONPATH:+:$PYTHONPATH}" torchrun --standalone --nproc-per-node "$NGPU" "bench/$script" "$OUTDIR/peer-$name.json" "$@"
    grep -E "_peer:|not measured|torch_symm_mem:" "$OUTDIR/peer-$name.log" | head -n 30 || true
  }
  run_peers() {
    if [ "${OPS_BENCH_ONLY:-0}" = 1 ]; then
      for b in ${OPS_BENCHES:-tp gemm moe}; do "${b}_bench"; done
      return 0
    fi
    [ "$NGPU" -lt 2 ] && echo "=== peers: one GPU here, so every peer runs at 1 rank (a code-path check, not a comparison)"
    peer torch-symm-mem "${TORCH_LIMIT:-100}" torch_symm_mem.py
    # NCCL by path: the newest that travelled (SYMHEAP_NCCL_LIB, or .nccl/libnccl.so.2[.xz]),
    # torch's in the venv, and the system's (whose default path is already the in-process column).
    local newest="${SYMHEAP_NCCL_LIB:-}"
    if [ -z "$newest" ] && [ -s .nccl/libnccl.so.2.xz ]; then
      mkdir -p /tmp/nccl-new && xz -dc .nccl/libnccl.so.2.xz >/tmp/nccl-new/libnccl.so.2 && newest=/tmp/nccl-new/libnccl.so.2
    fi
    [ -z "$newest" ] && [ -s .nccl/libnccl.so.2 ] && newest="$PWD/.nccl/libnccl.so.2"
    if [ -n "$newest" ]; then
      peer nccl-newest "${NCCL_LIMIT:-240}" nccl_peer.py --lib "$newest" --tag newest
    else
      echo "=== peer-nccl-newest: no NCCL from PyPI here (nvidia-nccl-cu13 2.32's wheel is 305 MB, over the carry): the NCCLs of the machine stand in"
    fi
    local venv
    venv=$(python3 -c "import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
    if [ -n "$venv" ] && [ -s "$venv" ]; then
      peer nccl-venv "${NCCL_LIMIT:-240}" nccl_peer.py --lib "$venv" --tag venv
    else
      echo "=== peer-nccl-venv: no nvidia-nccl in $(python3 -c 'import sys; print(sys.prefix)')"
    fi
    local sys_lib
    sys_lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
    if [ -n "$sys_lib" ]; then
      peer nccl-system "${NCCL_LIMIT:-240}" nccl_peer.py --lib "$sys_lib" --tag system --variants symmetric,zero-cta
    else
      echo "=== peer-nccl-system: no libnccl.so.2 in the loader's cache"
    fi
    peer nvshmem "${NVSHMEM_LIMIT:-180}" nvshmem_peer.py
    peer flashinfer "${FLASHINFER_LIMIT:-300}" flashinfer_peer.py
    tp_bench
    gemm_bench
    moe_bench
  }
  # MoE dispatch + combine against the NCCL path, DeepEP (sgl-deep-ep from .whl/) and torch's
  # all_to_all_vdev_2d, with the SM-store floor (bench/moe_bench.py); at one GPU symheap and the
  # NCCL path's logic at 2 PEs sharing it (not a speed comparison).
  moe_bench() {
    local pp="${PEER_PATH:-}${PYTHONPATH:+:$PYTHONPATH}"
    if [ "$NGPU" -ge 2 ]; then
      step moe-bench "${MOE_BENCH_LIMIT:-400}" env PYTHONPATH="$pp" SYMHEAP_BACKEND=cuda SYMHEAP_TIMEOUT=60 \
        torchrun --standalone --nproc-per-node "$NGPU" bench/moe_bench.py "$OUTDIR/moe.json"
      sed -n '/^## moe_bench/,$p' "$OUTDIR/moe-bench.log"
    else
      echo "=== moe-bench-2pe: 2 PEs sharing one GPU: not a speed comparison (symheap and the NCCL path's logic)"
      step moe-bench-2pe "${MOE_BENCH_LIMIT:-400}" env PYTHONPATH="$pp" SYMHEAP_BACKEND=cuda SYMHEAP_TIMEOUT=60 \
        python3 -m symheap launch -n 2 -- python3 bench/moe_bench.py "$OUTDIR/moe-2pe.json" --symheap-only
      sed -n '/^\[PE 0\] ## moe_bench/,$p' "$OUTDIR/moe-bench-2pe.log"
    fi
    return 0
  }
  # all_gather_matmul / matmul_reduce_scatter against NCCL + cuBLAS, torch SymmetricMemory's
  # fused ops and cuBLAS alone (bench/gemm_overlap_bench.py; at one GPU also symheap alone at 2 PEs
  # sharing it: not a speed comparison). A failure is printed; the suite goes on.
  gemm_bench() {
    local pp="${PEER_PATH:-}${PYTHONPATH:+:$PYTHONPATH}"
    # The kernels' GEMM alone (every tuning candidate) against cuBLAS on one GPU: the floor the
    # overlapped ops stand on (bench/gemm_tune_bench.py).
    step gemm-tune-bench "${GEMM_TUNE_LIMIT:-400}" python3 bench/gemm_tune_bench.py "$OUTDIR/gemm-tune.json" \
      --pes "${GEMM_TUNE_PES:-2}"
    step gemm-overlap-bench "${GEMM_BENCH_LIMIT:-400}" env PYTHONPATH="$pp" SYMHEAP_BACKEND=cuda SYMHEAP_TIMEOUT=60 \
      torchrun --standalone --nproc-per-node "$NGPU" bench/gemm_overlap_bench.py "$OUTDIR/gemm-overlap.json"
    sed -n '/^## gemm_overlap_bench/,$p' "$OUTDIR/gemm-overlap-bench.log"
    [ "$NGPU" -lt 2 ] && step gemm-overlap-bench-2pe "${GEMM_BENCH_LIMIT:-400}" env PYTHONPATH="$pp" SYMHEAP_BACKEND=cuda \
      SYMHEAP_TIMEOUT=60 python3 -m symheap launch -n 2 -- python3 bench/gemm_overlap_bench.py "$OUTDIR/gemm-overlap-2pe.json" --symheap-only &&
      sed -n '/^\[PE 0\] ## gemm_overlap_bench/,$p' "$OUTDIR/gemm-overlap-bench-2pe.log"
    return 0
  }
  # The fused all_reduce + RMSNorm and the TP block against NCCL, torch SymmetricMemory and
  # FlashInfer (bench/tp_fused_bench.py): its own JSON (tp-fused*.json, not merged into the
  # collective table) and markdown tables with the target ratios.
  tp_bench() {
    local pp="${PEER_PATH:-}${PYTHONPATH:+:$PYTHONPATH}"
    step tp-fused-bench "${TP_BENCH_LIMIT:-400}" env PYTHONPATH="$pp" SYMHEAP_BACKEND=cuda SYMHEAP_TIMEOUT=60 \
      torchrun --standalone --nproc-per-node "$NGPU" bench/tp_fused_bench.py "$OUTDIR/tp-fused.json"
    grep -E "^tp_fused_bench:" "$OUTDIR/tp-fused-bench.log" | head -n 20 || true
    sed -n '/^## tp_fused_bench/,$p' "$OUTDIR/tp-fused-bench.log"
    if [ "$NGPU" -lt 2 ]; then
      echo "=== tp-fused-bench-2pe: 2 PEs sharing one GPU: not a speed comparison (symheap only)"
      step tp-fused-bench-2pe "${TP_BENCH_LIMIT:-400}" env PYTHONPATH="$pp" SYMHEAP_BACKEND=cuda SYMHEAP_TIMEOUT=60 \
        python3 -m symheap launch -n 2 -- python3 bench/tp_fused_bench.py "$OUTDIR/tp-fused-2pe.json" --symheap-only
      sed -n '/^\[PE 0\] ## tp_fused_bench/,$p' "$OUTDIR/tp-fused-bench-2pe.log"
    fi
  }
  # UCX that travelled (build with UCX_WHEEL): the NVSHMEM RMA test across simulated nodes.
  [ -s .carry/ucx/lib/libucp.so.0 ] && export SYMHEAP_UCX_LIB_DIR="$PWD/.carry/ucx/lib"
  if ls .carry/wheels/symheap-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/symheap-py .carry/wheels/symheap-*.whl
    # TREE_PY=1: the tree's Python files over the wheel's (a change to Python alone needs no new
    # wheel); the native module and the device header stay the wheel's.
    if [ "${TREE_PY:-0}" = 1 ]; then
      (cd python/symheap && find . \( -name '*.py' -o -name '*.pyi' -o -name '*.cpp' \) -exec cp --parents {} /tmp/symheap-py/symheap/ \;)
      # pip's bytecode records a source's mtime in seconds and its size: a copied file of the
      # same size in the install's second would be run from the wheel's stale .pyc.
      find /tmp/symheap-py/symheap -name __pycache__ -prune -exec rm -rf {} +
    fi
    export PYTHONPATH="/tmp/symheap-py${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # The peers' packages the GPU machine has not (nvshmem4py, cuda-core, FlashInfer...).
  if ls .whl/*.whl >/dev/null 2>&1; then
    # Only the peer steps see them (PEER_PATH), so the rest of the suite runs as the machine is.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
      PEER_PATH="/tmp/site"
    ls -la .whl
  fi
  ONLY="${ONLY_PEERS:-0}"
  [ "$ONLY" = 1 ] && NGPU=$(nvidia-smi -L | wc -l)
  if [ "$ONLY" != 1 ]; then
  # The cold first run, before any other process touches the GPU: init + first all_reduce with
  # an empty kernel cache, 2 PEs, then 1 PE, then 2 PEs again (warm), each from a new empty cache.
  rm -f "$OUTDIR/cold.json"
  COLD_RUNS=("2 cold" "1 cold-1pe" "2 warm")
  [ "${SKIP_COLD:-0}" = 1 ] && COLD_RUNS=("2 cold")
  for run in "${COLD_RUNS[@]}"; do
    set -- $run
    step "cold-start-$2" 120 env SYMHEAP_CACHE_DIR="$(mktemp -d)" SYMHEAP_BACKEND=cuda \
      python3 -m symheap.launch -n "$1" -- python3 scripts/cold_start.py "$OUTDIR/cold.json" "$2"
    grep -E "PE [0-9]|init |backend" "$OUTDIR/cold-start-$2.log" || true
  done
  nvidia-smi -L
  nvidia-smi topo -m 2>/dev/null | head -n 6
  step info 60 env SYMHEAP_BACKEND=cuda "$B" launch -n 2 -- "$B" info
  # The command as pip installs it (python -m symheap = the console script), on the GPU.
  step pip-command 60 env SYMHEAP_BACKEND=cuda python3 -m symheap launch -n 2 -- python3 -m symheap info
  NGPU=$(nvidia-smi -L | wc -l)
  # Before/after on the GPU (AB_BEFORE: another build of the command, e.g. the commit before a
  # change to how kernels launch): symheap's collective times at one PE, alternated rounds, both
  # builds compiling their kernels with this machine's NVRTC (scripts/ab_host_bench.sh --gpu).
  if [ -n "${AB_BEFORE:-}" ]; then
    step ab-gpu "${AB_LIMIT:-200}" scripts/ab_host_bench.sh --gpu -r "${AB_ROUNDS:-4}" -n 1 -o "$OUTDIR/ab" \
      "$AB_BEFORE" "$B" -- coll --op "${AB_OPS:-all_reduce,all_gather,reduce_scatter,broadcast,alltoall}" \
      --sizes "${AB_SIZES:-8,64K,4M}"
    grep -E "^\||^A =|^B =" "$OUTDIR/ab-gpu.log" || true
  fi
  # NCCL takes one rank per GPU: with one GPU its scenario runs at 1 PE only.
  SKIP=()
  [ "$NGPU" -lt 2 ] && SKIP=(--skip coll-nccl)
  [ "${SKIP_SELFTEST:-0}" = 1 ] || step selftest-gpu "${SELFTEST_LIMIT:-240}" env SYMHEAP_TIMEOUT=30 "$B" selftest --gpu --pes "$PES" "${SKIP[@]}"
  [ "$NGPU" -lt 2 ] && step selftest-gpu-nccl-1pe 60 env SYMHEAP_TIMEOUT=30 "$B" selftest --gpu --pes 1 --only coll-nccl
  # 8 PEs on however many GPUs there are (4 per GPU on two): the n = 8 paths of every kernel on
  # real devices while the 8-GPU machine is not lent. NCCL and NVSHMEM allow one rank per GPU,
  # so their scenarios stay out.
  if [ "${SKIP_PES8:-0}" != 1 ] && [ "$NGPU" -lt 8 ]; then
    step selftest-gpu-8pe "${SELFTEST8_LIMIT:-200}" env SYMHEAP_TIMEOUT=60 "$B" selftest --gpu --pes 8 --only ${PES8_ONLY:-contract,release,alloc-churn,ring,alltoall,broadcast,all-reduce,coll-alias,atomics,signal,teams,coll-errors,team-mismatch,mismatch,diverge,stream-ring,stream-signal,stream-barrier,release-order,multi-stream,device-divergence,kill-device,internal-state,local-ranges,coll-local,protocols-pcie,kernel-translate,kernel-atomics,example-kernel,coll-stream,coll-graph,coll-nodes}
  fi
  # A world across 2 simulated nodes (--simulate-nodes: no shared memory between them, NCCL
  # over its socket transport on loopback, a host id per PE so PEs may share a GPU): 3 PEs (2 + 1,
  # NCCL over the world) here; 2 and 4 PEs (hierarchical) run in selftest-gpu, 8 in -8pe.
  [ "${SKIP_NODES:-0}" = 1 ] || step selftest-gpu-nodes "${NODES_LIMIT:-300}" env SYMHEAP_TIMEOUT=60 "$B" selftest --gpu --pes 3 --only coll-nodes,coll-nodes-nccl
  # The divergence property test on the CUDA backend: random programs, one PE diverging.
  if [ "${SKIP_DIVERGE:-0}" != 1 ]; then
    step diverge-stats 120 env SYMHEAP_BACKEND=cuda scripts/diverge_stats.sh "${DIVERGE_N:-8}" "$B"
    tail -n 3 "$OUTDIR/diverge-stats.log"
  fi
  # Faults: one PE killed with SIGKILL at a random point of each phase, PEs started by hand,
  # SYMHEAP_TIMEOUT at its default; every survivor must name it within 2 s.
  if [ "${SKIP_FAULTS:-0}" != 1 ]; then
    step fault-kill "${KILL_LIMIT:-240}" python3 scripts/fault_harness.py kill --backend cuda --pes 2,4,8 --trials "${KILL_TRIALS:-2}"
    grep -E "^\|" "$OUTDIR/fault-kill.log" || true
  fi
  # The Python package's torch and CUDA tests (CI runs only their CPU part).
  if ls .carry/wheels/symheap-*.whl >/dev/null 2>&1; then
    # Only the tests that need a GPU (--gpu-only): CI runs the rest with the same torch and
    # Triton. GPU_ONLY=0 runs every test of those files here.
    GO="--gpu-only"
    [ "${GPU_ONLY:-1}" = 0 ] && GO=""
    # symheap's C++ Work for the backend (symheap/distributed/cpp_work.py), compiled once for this
    # torch into the default cache: the tests (test_cpp_work.py) and the benches below use it.
    # SKIP_CPP_WORK_BUILD: the tests are not told of a cache, so a test of the C++ Work that
    # runs anyway builds it the way a first run does (in the background, then waits for it).
    if [ "${SKIP_CPP_WORK_BUILD:-0}" != 1 ]; then
      step cpp-work-build "${CPP_WORK_LIMIT:-240}" python3 -m symheap.distributed.cpp_work build -v
      SYMHEAP_TEST_CPP_WORK_CACHE=$(python3 -c 'from symheap import _core; print(_core.cache_dir())')
      export SYMHEAP_TEST_CPP_WORK_CACHE
    fi
    [ "${SKIP_TORCH:-0}" = 1 ] || step python-torch "${PYTEST_LIMIT:-600}" bash -c "cd tests/python && python3 -m pytest -q -p no:cacheprovider -rs $GO ${TORCH_TESTS:-test_torch.py test_fused.py test_torch_ops_gpu.py test_nodes_gpu.py test_gemm.py test_moe.py test_torch_programs.py test_tdist.py test_cpp_work.py}"
    # The torch.distributed backend's host time per small eager call against NCCL's, one rank,
    # CUDA tensors, and inside CUDA graphs (bench/tdist_host_cost.py --cuda --graph).
    [ "${SKIP_TORCH:-0}${SKIP_HOST_COST:-0}" = 00 ] && step tdist-host-cost "${TDIST_COST_LIMIT:-120}" python3 bench/tdist_host_cost.py --cuda --graph
    [ "${SKIP_TORCH:-0}${SKIP_HOST_COST:-0}" = 00 ] && sed -n '/^# /,$p' "$OUTDIR/tdist-host-cost.log"
    # The pieces of an asynchronous Work's host time (torch's CUDA future, its Work, wait) beside
    # the whole async_op=True call on symheap and NCCL (bench/async_work_cost.py).
    [ "${SKIP_TORCH:-0}${SKIP_HOST_COST:-0}" = 00 ] && step async-work-cost "${ASYNC_COST_LIMIT:-90}" python3 bench/async_work_cost.py
    # Each operation's own work at one PE against the best local reference in the same process
    # (the fused op vs compiled add + RMSNorm, the GEMM ops vs cuBLAS, host time per eager call
    # vs NCCL, allocation): bench/local_work.py, its tables printed last in its log.
    [ "${SKIP_LOCAL_WORK:-0}" = 1 ] || step local-work "${LOCAL_WORK_LIMIT:-240}" python3 bench/local_work.py --json "$OUTDIR/local-work.json"
    [ "${SKIP_LOCAL_WORK:-0}" = 1 ] || sed -n '/^# .*, one PE$/,$p' "$OUTDIR/local-work.log"
    # Providers (native heap, NVSHMEM, torch SymmetricMemory) under one Triton and one CUDA C++
    # kernel, and the Triton device library's compile and hint checks.
    [ "${SKIP_PROVIDERS:-0}" = 1 ] || step python-providers "${PROVIDERS_LIMIT:-300}" bash -c "cd tests/python && python3 -m pytest -q -p no:cacheprovider -rs $GO test_providers_gpu.py test_nvshmem_coexist_gpu.py test_providers.py test_triton_compile.py"
    step triton-hint 60 python3 scripts/triton_hint_check.py
    cat "$OUTDIR/triton-hint.log"
    # The newcomer examples as their README launches them, 2 PEs (sharing a GPU when there is
    # one); numpy_ring picks the host backend itself. A GPU example's skip (77) counts as FAIL.
    [ "${SKIP_EXAMPLES:-0}" = 1 ] && EXAMPLES_RUST="" EXAMPLES_PY="" || EXAMPLES_RUST="peer_write stream_ring" EXAMPLES_PY="numpy_ring torch_tensors triton_kernel cuda_kernel tp_mlp nvshmem_ring"
    for ex in $EXAMPLES_RUST; do
      step "example-rust-$ex" 60 env SYMHEAP_TIMEOUT=30 "$B" launch -n 2 -- ".carry/bin/$ex"
    done
    for ex in $EXAMPLES_PY; do
      case "$ex" in
        # The tensor-parallel MLP block (Llama-70B-like sizes, 2 PEs): eager, torch.compile, CUDA
        # graphs, against torch.distributed (NCCL with a GPU per PE, else gloo on CPU copies).
        tp_mlp) step example-tp_mlp "${TP_MLP_LIMIT:-300}" env SYMHEAP_TIMEOUT=60 SYMHEAP_BACKEND=cuda "$B" launch -n 2 -- python3 examples/python/tp_mlp.py ;;
        # NVSHMEM's device library: forced through it to every peer, since on one node every
        # peer is direct and the table path would run symheap's stores only (nvcc builds it).
        nvshmem_ring) step example-nvshmem_ring 180 env SYMHEAP_TIMEOUT=30 "$B" launch -n 2 -- python3 examples/python/nvshmem_ring.py --force-nvshmem ;;
        *) step "example-$ex" 120 env SYMHEAP_TIMEOUT=30 "$B" launch -n 2 -- python3 "examples/python/$ex.py" ;;
      esac
      grep -E "^\[PE 0\] $ex" "$OUTDIR/example-$ex.log" || true
    done
  fi
  fi # ONLY_PEERS
  # The peers, measured in this same run, each merged into symheap's table as its own column.
  PEER=()
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    run_peers
    for f in "$OUTDIR"/peer-*.json; do [ -s "$f" ] && PEER+=(--peer-json "$f"); done
    WHAT="${BENCH_WHAT:-all}"
    [ "$ONLY" = 1 ] && WHAT="${BENCH_WHAT:-coll}"
    [ "${OPS_BENCH_ONLY:-0}" = 1 ] ||
    step bench-gpu "${BENCH_LIMIT:-160}" env SYMHEAP_TIMEOUT=30 "$B" bench "$WHAT" -n "$NGPU" --json "$OUTDIR/bench-gpu.json" --png "$OUTDIR/bench-gpu.png" "${PEER[@]}" ${BENCH_ARGS:-}
    grep -E "^\|" "$OUTDIR/bench-gpu.log" || true
  fi
  # Collectives across 2 simulated nodes, 4 PEs (2 x 2, NODES_PES) on this machine's GPUs:
  # symheap (hierarchical) against NCCL over the world on the same buffers,
  # plus the hierarchical all_reduce's stages alone; then symheap's own NCCL-over-the-world path
  # (SYMHEAP_NODES_ALGO=nccl) against the same NCCL, which must come out even.
  if [ "${SKIP_NODES:-0}" != 1 ] && [ "${SKIP_BENCH:-0}" != 1 ] && [ "$ONLY" != 1 ]; then
    # One GPU time-slices the 4 PEs (about 9 ms an operation): a code-path check, kept short.
    NODES_OPS="all_reduce,all_gather,reduce_scatter,broadcast,alltoall" NODES_DEF="8K,64K,512K,4M,32M"
    [ "$NGPU" -lt 2 ] && NODES_OPS="all_reduce,all_gather" NODES_DEF="64K,4M"
    NODES_SIZES="${NODES_SIZES:-$NODES_DEF}"
    # The runtime takes the NCCL the command's own NCCL column uses (the loader's), so both
    # sides of a row run the same library.
    NODES_NCCL=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
    NODES_ENV=(SYMHEAP_TIMEOUT=60 SYMHEAP_SIMULATE_NODES=2 SYMHEAP_NCCL_LIB="${NODES_NCCL:-${SYMHEAP_NCCL_LIB:-}}")
    step bench-nodes "${NODES_BENCH_LIMIT:-300}" env "${NODES_ENV[@]}" "$B" bench coll -n "${NODES_PES:-4}" \
      --op "$NODES_OPS" --sizes "$NODES_SIZES" --json "$OUTDIR/bench-nodes.json"
    grep -E "^\|" "$OUTDIR/bench-nodes.log" || true
    step bench-nodes-nccl "${NODES_BENCH_LIMIT:-300}" env "${NODES_ENV[@]}" SYMHEAP_NODES_ALGO=nccl \
      "$B" bench coll -n "${NODES_PES:-4}" --op all_reduce,all_gather --sizes "$NODES_SIZES" --json "$OUTDIR/bench-nodes-nccl.json"
    grep -E "^\|" "$OUTDIR/bench-nodes-nccl.log" || true
  fi
  # What the links carry under SM stores, the copy engines and both (the ceiling behind the SM
  # put and 4 MiB all_reduce numbers). Needs CuPy, which the GPU machine has.
  if [ "$ONLY" != 1 ] && [ "$NGPU" -ge 2 ] && python3 -c "import cupy" 2>/dev/null; then
    step nvlink-probe "${PROBE_LIMIT:-120}" python3 scripts/nvlink_probe.py
    cat "$OUTDIR/nvlink-probe.log"
  fi
  echo
  echo "| step | result | time |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
  # Every log in one file: the device tool brings back only a few files.
  (cd "$OUTDIR" && tar czf logs.tgz --exclude=logs.tgz ./*.log ./*.json 2>/dev/null && rm -f ./*.log)
  ;;
*)
  echo "usage: $0 build|run" >&2
  exit 2
  ;;
esac
