#!/usr/bin/env bash
# `scripts/check_wheel.sh WHEEL`: what a pip user gets. Installs WHEEL into a fresh venv (pulling
# its dependencies, NumPy, from PyPI) and checks, with that venv's bin first on PATH and no Rust:
# the `symheap` command (info, launch -n 4 -- symheap info, selftest, bench), `python -m symheap`,
# the NumPy front, and the wheel's tag and contents (manylinux_2_28, licenses, prebuilt kernels,
# the command's executable beside an extension module that links none of its self-test
# scenarios and benchmarks); and, this venv having no torch nor Triton, that the modules needing
# them raise an ImportError naming `pip install "symheap[torch]"` (or `[triton]`) and that the
# examples needing them exit 77 ("skipped") saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
WHEEL="$1"
case "$(basename "$WHEEL")" in
  *-cp39-abi3-manylinux_2_28_x86_64.whl | *-cp39-abi3-manylinux_2_28_aarch64.whl) ;;
  *) echo "check_wheel.sh: $WHEEL is not an abi3 manylinux_2_28 wheel" >&2; exit 1 ;;
esac
V="$PWD/target/wheel-check"
rm -rf "$V"
python3 -m venv "$V"
"$V/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL"
fail() { echo "check_wheel.sh: $*" >&2; exit 1; }
# Outside the checkout, so nothing can come from the source tree.
cd "$V"
export PATH="$V/bin:/usr/bin:/bin"
unset SYMHEAP_NVRTC_LIB
command -v symheap >/dev/null || fail "no symheap command on PATH after pip install"
[ "$(command -v symheap)" = "$V/bin/symheap" ] || fail "symheap is not the venv's: $(command -v symheap)"
symheap --version | grep -q "^symheap " || fail "symheap --version"
info="$(SYMHEAP_BACKEND=host symheap info)" || fail "symheap info"
grep -q "PE 0 of 1" <<<"$info" || fail "symheap info: $info"
grep -q "kernels   : prebuilt for sm_80, sm_90, sm_100, sm_120" <<<"$info" || fail "no prebuilt kernels: $info"
out="$(SYMHEAP_BACKEND=host symheap launch -n 4 -- symheap info)" || fail "symheap launch -n 4 -- symheap info"
for r in 0 1 2 3; do
  grep -q "\[PE $r\] symheap .* | PE $r of 4" <<<"$out" || fail "PE $r missing from launch output: $out"
done
SYMHEAP_BACKEND=host python -m symheap selftest --pes 1,2 --only contract | grep -q "2 of 2 runs passed" ||
  fail "python -m symheap selftest"
SYMHEAP_BACKEND=host symheap selftest --pes 1,2 --only contract,release | grep -q "4 of 4 runs passed" ||
  fail "symheap selftest"
bench="$(symheap bench coll --host -n 2 --op all_gather --sizes 4K,64K 2>&1)" || fail "symheap bench: $bench"
grep -q "all_gather f32" <<<"$bench" || fail "symheap bench printed no all_gather row: $bench"
python -c "import symheap.numpy, numpy; print(symheap.__version__)" >/dev/null || fail "import symheap.numpy"
python - <<'PY' || fail "wheel contents"
import importlib.metadata as md
import os
dist = md.distribution("symheap")
files = {str(f) for f in dist.files}
for want in ("symheap/include/symheap.cuh", "symheap/py.typed"):
    assert want in files, want
lic = [f for f in files if f.endswith(("LICENSE-MIT", "LICENSE-APACHE"))]
assert len(lic) == 2, lic
assert dist.metadata["License-Expression"] == "MIT OR Apache-2.0", dist.metadata["License-Expression"]
assert any(e.name == "symheap" for e in dist.entry_points), "no symheap console script"
exe = dist.locate_file("symheap/_bin/symheap")
assert "symheap/_bin/symheap" in files and os.access(exe, os.X_OK), "no symheap executable in the package"
# The command's self-test scenarios and benchmark PEs are in the executable, not in the module
# every `import symheap` loads.
so = [f for f in files if f.startswith("symheap/_native") and f.endswith(".so")]
assert len(so) == 1, so
native, command = dist.locate_file(so[0]).read_bytes(), exe.read_bytes()
for marker in (b"selftest-pe", b"bench-pe-gpu", b"coll-nodes-nccl"):
    assert marker in command, marker
    assert marker not in native, f"{so[0]} carries the command's {marker.decode()}"
PY
python - <<'PY' || fail "a module needing torch or Triton, imported without them"
import importlib
import importlib.util

assert importlib.util.find_spec("torch") is None and importlib.util.find_spec("triton") is None, "torch or Triton here"
for mod, extra in [
    ("symheap.torch", "torch"),
    ("symheap.ops", "torch"),
    ("symheap.distributed", "torch"),
    ("symheap.fused", "torch"),
    ("symheap.gemm", "torch"),
    ("symheap.moe", "torch"),
    ("symheap.triton", "triton"),
]:
    try:
        importlib.import_module(mod)
    except ImportError as e:
        want = f'pip install "symheap[{extra}]"'
        assert mod in str(e) and want in str(e), f"import {mod}: {e!r} does not name {want}"
    else:
        raise AssertionError(f"import {mod} worked without {extra}")
PY
for ex in torch_tensors triton_kernel tp_mlp cuda_kernel nvshmem_ring; do
  rc=0
  out="$(SYMHEAP_BACKEND=host python "$ROOT/examples/python/$ex.py" 2>&1)" || rc=$?
  [ "$rc" = 77 ] || fail "examples/python/$ex.py without torch: exit status $rc, not 77 (skipped): $out"
  grep -qF 'skipped' <<<"$out" && grep -qF 'pip install "symheap[torch]"' <<<"$out" ||
    fail "examples/python/$ex.py without torch does not say why it skipped: $out"
done
echo "check_wheel.sh: ok ($(basename "$WHEEL"))"
