//! CI check of symheap's device code, no GPU needed: NVRTC compiles the backend's kernels, the
//! CUDA example and a translation unit instantiating every template of `symheap.cuh` for sm_80
//! and sm_90, and the PTX shows the properties the design relies on (16-byte vector copies,
//! release/acquire at system scope).
//!
//! These tests FAIL when libnvrtc cannot be loaded: run them after `source scripts/nvrtc_env.sh`
//! (installs `nvidia-cuda-nvrtc==13.0.*` and sets LD_LIBRARY_PATH).

use symheap::backend::cuda::nvrtc;

const ARCHS: [u32; 2] = [80, 90];
const RING_PUT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/cuda/ring_put.cu"
));
const INSTANTIATE_ALL: &str = include_str!("cuda/instantiate_all.cu");

/// Fails the test (never skips it) when NVRTC cannot be loaded.
fn require_nvrtc() {
    if let Err(e) = nvrtc::version() {
        panic!(
            "NVRTC is required for this test and could not be loaded: {e}\n\
             Fix: `source scripts/nvrtc_env.sh` (pip-installs nvidia-cuda-nvrtc==13.0.* and adds \
             its lib directory to LD_LIBRARY_PATH), then rerun."
        );
    }
}

fn headers() -> [(&'static str, &'static str); 1] {
    [("symheap.cuh", nvrtc::HEADER)]
}

fn cubin(source: &str, name: &str, arch: u32) -> Vec<u8> {
    require_nvrtc();
    match nvrtc::compile_cubin(source, name, arch, &headers()) {
        Ok(image) => {
            // An ELF image.
            assert!(
                image.starts_with(b"\x7fELF"),
                "{name} sm_{arch}: not a CUBIN"
            );
            image
        }
        Err(log) => panic!("{name} does not compile for sm_{arch}:\n{log}"),
    }
}

fn ptx(source: &str, name: &str, arch: u32) -> String {
    require_nvrtc();
    nvrtc::compile_ptx(source, name, arch, &headers())
        .unwrap_or_else(|log| panic!("{name} does not compile to PTX for compute_{arch}:\n{log}"))
}

/// The PTX body of entry `name` (from `.entry name(` to the next entry or function).
fn entry<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no entry {name} in the PTX"));
    let rest = &ptx[start..];
    let end = rest[1..]
        .find(".entry ")
        .or_else(|| rest[1..].find(".func "))
        .map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

fn assert_has(body: &str, what: &str, needles: &[&str]) {
    assert!(
        needles.iter().any(|n| body.contains(n)),
        "{what}: expected one of {needles:?} in the PTX:\n{body}"
    );
}

#[test]
fn nvrtc_is_loadable() {
    require_nvrtc();
    let (major, minor) = nvrtc::version().unwrap_or((0, 0));
    assert!(major >= 12, "NVRTC {major}.{minor} is too old");
}

#[test]
fn backend_kernels_compile_to_cubin() {
    for arch in ARCHS {
        cubin(nvrtc::KERNELS, "kernels.cu", arch);
    }
}

#[test]
fn ring_put_example_compiles() {
    for arch in ARCHS {
        cubin(RING_PUT, "ring_put.cu", arch);
    }
    let p = ptx(RING_PUT, "ring_put.cu", 90);
    let body = entry(&p, "ring_put");
    assert_has(
        body,
        "ring_put's signal",
        &["red.release.sys.global.add.u64"],
    );
    assert_has(body, "ring_put's wait", &["ld.acquire.sys.global.u64"]);
}

#[test]
fn every_header_template_compiles() {
    for arch in ARCHS {
        cubin(INSTANTIATE_ALL, "instantiate_all.cu", arch);
    }
}

#[test]
fn copy_kernel_moves_16_byte_vectors() {
    let p = ptx(nvrtc::KERNELS, "kernels.cu", 90);
    let body = entry(&p, "symheap_copy");
    assert_has(
        body,
        "16-byte vector loads",
        &["ld.global.v4.u32", "ld.global.v4.b32"],
    );
    assert_has(
        body,
        "16-byte vector stores",
        &["st.global.v4.u32", "st.global.v4.b32"],
    );
    // Several loads in flight per thread: at least four vector loads in the unrolled body.
    let loads = body.matches("ld.global.v4").count();
    assert!(
        loads >= 4,
        "expected an unrolled body with >= 4 vector loads, found {loads}"
    );
}

#[test]
fn signals_and_waits_order_at_system_scope() {
    let p = ptx(nvrtc::KERNELS, "kernels.cu", 90);
    let signal = entry(&p, "symheap_signal");
    assert_has(signal, "signal fence", &["fence.sc.sys"]);
    assert_has(signal, "signal set", &["st.release.sys.global.u64"]);
    assert_has(signal, "signal add", &["red.release.sys.global.add.u64"]);
    let wait = entry(&p, "symheap_wait");
    assert_has(wait, "wait acquire", &["ld.acquire.sys.global.u64"]);
    assert_has(wait, "wait timer", &["%globaltimer"]);
    let barrier = entry(&p, "symheap_barrier");
    assert_has(barrier, "barrier arrival", &["st.release.sys.global.u64"]);
    assert_has(barrier, "barrier wait", &["ld.acquire.sys.global.u64"]);
    let atomic = entry(&p, "symheap_atomic");
    for op in [
        "exch.b32", "exch.b64", "cas.b32", "cas.b64", "add.u32", "add.u64", "and.b64",
    ] {
        assert_has(
            atomic,
            "system-scope atomic",
            &[&format!("atom.sys.global.{op}")],
        );
    }
    entry(&p, "symheap_fill_u64");
}

#[test]
fn alignment_hint_keeps_vector_stores() {
    let p = ptx(INSTANTIATE_ALL, "instantiate_all.cu", 90);
    let body = entry(&p, "hint_vector_store");
    assert_has(body, "hinted store", &["st.global.v4.f32", "st.v4.f32"]);
}

#[test]
fn header_constants_match_the_rust_side() {
    for (name, value) in [
        ("SYMHEAP_CMP_EQ", 0),
        ("SYMHEAP_CMP_NE", 1),
        ("SYMHEAP_CMP_GT", 2),
        ("SYMHEAP_CMP_GE", 3),
        ("SYMHEAP_CMP_LT", 4),
        ("SYMHEAP_CMP_LE", 5),
    ] {
        let line = format!("#define {name} {value}\n");
        assert!(
            nvrtc::HEADER.contains(&line),
            "symheap.cuh lacks `{}`",
            line.trim()
        );
    }
    for include in ["cuda_runtime", "cuda_fp16", "cuda_bf16", "cuda/std"] {
        assert!(
            !nvrtc::HEADER.contains(&format!("#include <{include}")),
            "symheap.cuh must not include toolkit header {include}"
        );
    }
}

#[test]
fn unsupported_atomic_type_is_a_readable_error() {
    require_nvrtc();
    let source = r#"#include "symheap.cuh"
extern "C" __global__ void k(float* p, const int64_t* bases) {
  symheap::atomic_and(p, 1.0f, 0, 1, bases);
}
"#;
    let log = nvrtc::compile_cubin(source, "bad_atomic.cu", 90, &headers())
        .expect_err("atomic_and on float must not compile");
    assert!(log.contains("symheap atomics"), "unexpected log:\n{log}");
}

#[test]
fn compile_errors_carry_the_nvrtc_log() {
    require_nvrtc();
    let err = nvrtc::compile_cubin("this is not CUDA", "broken.cu", 90, &[])
        .expect_err("garbage must not compile");
    assert!(err.contains("broken.cu"), "no program name in:\n{err}");
    assert!(err.contains("error"), "no NVRTC log in:\n{err}");
    let err = nvrtc::compile_ptx("int x;\0", "nul.cu", 90, &[]).expect_err("NUL byte");
    assert!(err.contains("NUL"), "{err}");
    let err = nvrtc::compile_cubin("__global__ void k() {}", "arch.cu", 1, &[])
        .expect_err("sm_1 does not exist");
    assert!(!err.is_empty());
}
