# shellcheck shell=bash
# Which NVRTC builds the wheel's prebuilt kernels for which architectures: "ARCHS:VERSION", the
# version of nvidia-cuda-nvrtc-cu12 on PyPI. A cubin loads on every driver of its NVRTC's CUDA
# version or newer (and on older 12.x drivers through minor version compatibility), so each is
# the oldest CUDA 12 NVRTC that compiles those architectures' kernels without register spills
# (tests/nvrtc_compile.rs, coll_kernels_do_not_spill):
#   sm_80:          12.0 (12.1 to 12.4 spill 20 B in the flag all_reduce kernels on sm_80)
#   sm_90:          12.1 (12.0 spills 20 B in the same kernels on sm_90)
#   sm_100, sm_120: 12.8, the first NVRTC that knows Blackwell (every NVRTC up to 13.0 spills
#                   in the two-shot all_reduce kernels there; 12.8 the least)
# so the kernels load on every driver from CUDA 12.1 (sm_80/sm_90) and 12.8 (Blackwell, whose
# GPUs need R570 anyway) on. scripts/build_wheel.sh builds with them, scripts/check_kernel_builds.sh
# tests them.
KERNEL_BUILDS=("80:12.0.140" "90:12.1.105" "100,120:12.8.93")
