# shellcheck shell=bash
# Source this (`source scripts/nvrtc_env.sh`) to make NVRTC loadable without a CUDA toolkit:
# pip-installs nvidia-cuda-nvrtc 13.0 when it is missing and puts its lib directory (libnvrtc.so.13
# and libnvrtc-builtins) on LD_LIBRARY_PATH. Used before tests/nvrtc_compile.rs, which compiles
# symheap's kernels with NVRTC. Safe to source repeatedly; does not change shell options.

_symheap_nvrtc_libdir() {
  "${PYTHON:-python3}" - <<'PY' 2>/dev/null
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(1)
for root in list(nvidia.__path__):
    for lib in sorted(glob.glob(os.path.join(root, "cu13", "lib", "libnvrtc.so.13*"))):
        print(os.path.dirname(lib))
        sys.exit(0)
sys.exit(1)
PY
}

_symheap_nvrtc_dir="$(_symheap_nvrtc_libdir)"
if [ -z "$_symheap_nvrtc_dir" ]; then
  "${PYTHON:-python3}" -m pip install -q --disable-pip-version-check "nvidia-cuda-nvrtc==13.0.*" >/dev/null 2>&1 ||
    "${PYTHON:-python3}" -m pip install -q --disable-pip-version-check --user "nvidia-cuda-nvrtc==13.0.*" >/dev/null 2>&1 ||
    "${PYTHON:-python3}" -m pip install -q --disable-pip-version-check --break-system-packages "nvidia-cuda-nvrtc==13.0.*" >/dev/null 2>&1 ||
    echo "nvrtc_env.sh: could not pip-install nvidia-cuda-nvrtc==13.0.*" >&2
  _symheap_nvrtc_dir="$(_symheap_nvrtc_libdir)"
fi

if [ -n "$_symheap_nvrtc_dir" ]; then
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$_symheap_nvrtc_dir:"*) ;;
    *) export LD_LIBRARY_PATH="$_symheap_nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
  esac
else
  echo "nvrtc_env.sh: libnvrtc.so.13 not found; the NVRTC tests will fail" >&2
fi
unset _symheap_nvrtc_dir
unset -f _symheap_nvrtc_libdir
