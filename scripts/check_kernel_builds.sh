#!/usr/bin/env bash
# `scripts/check_kernel_builds.sh`: the device-code tests (tests/nvrtc_compile.rs: every kernel
# compiles, the PTX properties, the argument blocks, no register spills) with each CUDA 12
# NVRTC that builds the wheel's kernels, for the architectures it builds
# (scripts/lib/kernel_builds.sh); `cargo test` runs them with NVRTC 13. No GPU needed.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/kernel_builds.sh
source scripts/lib/kernel_builds.sh
# `--workspace --test nvrtc_compile`, not `-p symheap`: with the whole workspace selected, cargo
# unifies the dependencies' features as `cargo test --workspace` did, so its build is reused
# (`-p symheap` alone compiled syn, tracing, half, thiserror and symheap again: ~65 s of CI).
for build in "${KERNEL_BUILDS[@]}"; do
  archs="${build%%:*}" version="${build#*:}"
  lib="$(scripts/nvrtc_lib.sh "$version")"
  skip=()
  # Every NVRTC so far spills in the two-shot all_reduce kernels on Blackwell (see
  # kernel_builds.sh): the spill check holds for sm_80 and sm_90 only.
  case ",$archs," in *,100,* | *,120,*) skip=(--skip coll_kernels_do_not_spill) ;; esac
  echo "check_kernel_builds.sh: NVRTC $version for sm_${archs//,/, sm_} ($lib)" >&2
  env -u SYMHEAP_NVRTC SYMHEAP_NVRTC_LIB="$lib" SYMHEAP_TEST_ARCHS="$archs" SYMHEAP_TEST_NVRTC="${version%.*}" \
    cargo test --workspace --locked -q --test nvrtc_compile -- "${skip[@]}"
done

# NVRTC 12 and 13 side by side, found as a pip user has them (both wheels' folders on the Python
# path, no SYMHEAP_NVRTC_LIB), in one process: each architecture compiles with one that knows it
# (sm_70 with 12: NVRTC 13 dropped Volta; sm_90 with 13, the newest), and SYMHEAP_NVRTC=12
# takes NVRTC 12 for both.
site="$PWD/target/nvrtc/both-site"
rm -rf "$site" && mkdir -p "$site/nvidia/cu13" "$site/nvidia/cuda_nvrtc"
ln -s "$(dirname "$(scripts/nvrtc_lib.sh 13.0.88)")" "$site/nvidia/cu13/lib"
ln -s "$(dirname "$(scripts/nvrtc_lib.sh 12.1.105)")" "$site/nvidia/cuda_nvrtc/lib"
side_by_side() { # SYMHEAP_TEST_NVRTC, extra variables...
  local want="$1"; shift
  echo "check_kernel_builds.sh: NVRTC 12 and 13 found side by side ($want${1:+, $*})" >&2
  env -u SYMHEAP_NVRTC_LIB -u SYMHEAP_NVRTC PYTHONPATH="$site" SYMHEAP_TEST_ARCHS=70,90 \
    SYMHEAP_TEST_NVRTC="$want" "$@" cargo test --workspace --locked -q --test nvrtc_compile -- \
    nvrtc_is_loadable backend_kernels_compile_to_cubin ring_put_example_compiles
}
side_by_side 70:12.1,90:13.0
side_by_side 12.1 SYMHEAP_NVRTC=12
