//! CI check of symheap's device code, no GPU needed: NVRTC compiles the backend's kernels, the
//! collective kernels (`coll.cu`), the CUDA examples and a translation unit instantiating every
//! template of `symheap.cuh` for sm_80 and sm_90, and the PTX shows the properties the design
//! relies on (16-byte vector copies, release/acquire at system scope, no atomics on the
//! collectives' data path, no register spills).
//!
//! These tests FAIL when libnvrtc cannot be loaded: run them after `source scripts/nvrtc_env.sh`
//! (installs `nvidia-cuda-nvrtc` 13.0 into the project venv and sets `SYMHEAP_NVRTC_LIB`), or with
//! a `python3` on PATH whose site-packages hold that wheel.
//!
//! CI runs them once per NVRTC the wheel's kernels are built with (scripts/test.sh):
//! `SYMHEAP_TEST_ARCHS` (default `80,90`) names the architectures the cubins are compiled and
//! checked for, and `SYMHEAP_TEST_NVRTC` (e.g. `12.1`) the NVRTC version the run must get.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use symheap::cuda::{coll_source, compile_shipped, kernel_entries, kernels_source, nvrtc};

/// The architectures every cubin is compiled for (`SYMHEAP_TEST_ARCHS`, default sm_80, sm_90).
fn archs() -> &'static [u32] {
    static ARCHS: OnceLock<Vec<u32>> = OnceLock::new();
    ARCHS.get_or_init(|| match std::env::var("SYMHEAP_TEST_ARCHS") {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|a| {
                a.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("SYMHEAP_TEST_ARCHS={v:?}: not a list like 80,90"))
            })
            .collect(),
        _ => vec![80, 90],
    })
}

/// The architecture the PTX checks read (every NVRTC of CUDA 12 and 13 knows compute_90).
const PTX_ARCH: u32 = 90;
const RING_PUT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/cuda/ring_put.cu"
));
const PROVIDER_MIX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/cuda/provider_mix.cu"
));
const INSTANTIATE_ALL: &str = include_str!("cuda/instantiate_all.cu");

/// Fails the test (never skips it) when NVRTC cannot be loaded.
fn require_nvrtc() {
    if let Err(e) = nvrtc::version() {
        panic!(
            "NVRTC is required for this test and could not be loaded: {e}\n\
             Fix: `source scripts/nvrtc_env.sh` (installs nvidia-cuda-nvrtc 13.0 into the project \
             venv and sets SYMHEAP_NVRTC_LIB), then rerun."
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

/// What `SYMHEAP_TEST_NVRTC` asks of the run: `M.m` (every arch compiles with NVRTC M.m) or
/// `ARCH:M.m,...` (each arch with its own, NVRTC 12 and 13 loaded side by side).
fn wanted_nvrtc(v: &str) -> Vec<(Option<u32>, String)> {
    v.split(',')
        .map(|item| match item.split_once(':') {
            Some((arch, ver)) => (
                Some(arch.trim().parse().unwrap_or_else(|_| {
                    panic!("SYMHEAP_TEST_NVRTC={v:?}: {arch:?} is not an arch")
                })),
                ver.trim().to_string(),
            ),
            None => (None, item.trim().to_string()),
        })
        .collect()
}

#[test]
fn nvrtc_is_loadable() {
    require_nvrtc();
    let (major, minor) = nvrtc::version().unwrap_or((0, 0));
    assert!(major >= 12, "NVRTC {major}.{minor} is too old");
    // A run meant for one NVRTC must get that one, not another found on the way.
    let Ok(want) = std::env::var("SYMHEAP_TEST_NVRTC") else {
        return;
    };
    let found = nvrtc::found();
    for (only, version) in wanted_nvrtc(&want) {
        for &arch in archs().iter().filter(|&&a| only.is_none_or(|o| o == a)) {
            let (v, path) = nvrtc::for_arch(arch).unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
            assert_eq!(
                format!("{}.{}", v.0, v.1),
                version,
                "sm_{arch} compiles with NVRTC {}.{} at {} (found: {found:?})",
                v.0,
                v.1,
                path.display()
            );
        }
    }
}

#[test]
fn shipped_images_are_named_by_the_nvrtc_that_built_them() {
    require_nvrtc();
    let arch = archs()[0];
    let (file, image) = compile_shipped(&kernels_program(), "kernels.cu", arch)
        .unwrap_or_else(|log| panic!("kernels.cu does not compile for sm_{arch}:\n{log}"));
    let (v, _) = nvrtc::for_arch(arch).expect("it just compiled");
    assert!(image.starts_with(b"\x7fELF"), "not a CUBIN");
    assert!(
        file.starts_with("kernels-")
            && file.ends_with(&format!("-sm{arch}-nvrtc{}.{}.cubin", v.0, v.1)),
        "{file}"
    );
}

/// kernels.cu as the backend compiles it (with the argument layout checks).
fn kernels_program() -> String {
    kernels_source()
}

/// coll.cu as the backend compiles it with no tuning (with the argument layout checks).
fn coll_program() -> String {
    coll_source(&[])
}

#[test]
fn backend_kernels_compile_to_cubin() {
    for &arch in archs() {
        cubin(&kernels_program(), "kernels.cu", arch);
    }
}

#[test]
fn ring_put_example_compiles() {
    for &arch in archs() {
        cubin(RING_PUT, "ring_put.cu", arch);
    }
    let p = ptx(RING_PUT, "ring_put.cu", PTX_ARCH);
    let body = entry(&p, "ring_put");
    assert_has(
        body,
        "ring_put's signal",
        &["red.release.sys.global.add.u64"],
    );
    assert_has(body, "ring_put's wait", &["ld.acquire.sys.global.u64"]);
}

#[test]
fn provider_mix_example_compiles() {
    // The kernel the `providers` GPU scenario runs over native-heap and NVSHMEM buffers.
    for &arch in archs() {
        cubin(PROVIDER_MIX, "provider_mix.cu", arch);
    }
    entry(
        &ptx(PROVIDER_MIX, "provider_mix.cu", PTX_ARCH),
        "provider_mix",
    );
}

#[test]
fn every_header_template_compiles() {
    for &arch in archs() {
        cubin(INSTANTIATE_ALL, "instantiate_all.cu", arch);
    }
}

#[test]
fn copy_kernel_moves_16_byte_vectors() {
    let p = ptx(&kernels_program(), "kernels.cu", PTX_ARCH);
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
    let p = ptx(&kernels_program(), "kernels.cu", PTX_ARCH);
    let signal = entry(&p, "symheap_signal");
    assert_has(signal, "signal fence", &["fence.sc.sys"]);
    assert_has(signal, "signal set", &["st.release.sys.global.u64"]);
    assert_has(signal, "signal add", &["red.release.sys.global.add.u64"]);
    let fused = entry(&p, "symheap_put_signal");
    assert_has(
        fused,
        "fused put's 16-byte stores",
        &["st.global.v4.u32", "st.global.v4.b32"],
    );
    assert_has(fused, "fused put's block barrier", &["bar.sync"]);
    assert_has(fused, "fused signal set", &["st.release.sys.global.u64"]);
    assert_has(
        fused,
        "fused signal add",
        &["red.release.sys.global.add.u64"],
    );
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
}

#[test]
fn alignment_hint_keeps_vector_stores() {
    let p = ptx(INSTANTIATE_ALL, "instantiate_all.cu", PTX_ARCH);
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

// ---------------------------------------------------------------------------------------------
// Collective kernels (coll.cu)
// ---------------------------------------------------------------------------------------------

/// Element-type suffixes of the reduction kernels.
const COLL_DTYPES: [&str; 4] = ["f32", "f16", "bf16", "i32"];

/// Every extern "C" kernel of coll.cu, as the Rust launcher names them.
fn coll_kernels() -> Vec<String> {
    let names: Vec<String> = kernel_entries()
        .into_iter()
        .filter(|e| e.program == "symheap_coll.cu")
        .map(|e| e.symbol)
        .collect();
    // Five reducing kinds for each element type, seven byte kinds.
    assert_eq!(names.len(), 5 * COLL_DTYPES.len() + 7, "{names:?}");
    for dt in COLL_DTYPES {
        assert!(
            names.contains(&format!("symheap_ar_twoshot_{dt}")),
            "{names:?}"
        );
    }
    names
}

/// The parameter list of entry `name` in the PTX (between `.entry name(` and `)`).
fn entry_params<'a>(ptx: &'a str, name: &str) -> &'a str {
    let body = entry(ptx, name);
    let end = body
        .find(')')
        .unwrap_or_else(|| panic!("{name}: no parameter list"));
    &body[..end]
}

/// One value per arch, each computed once (see [`once_per_arch`]).
type ArchMemo = OnceLock<Mutex<HashMap<u32, &'static OnceLock<String>>>>;

/// `make(arch)`, computed once per test binary and arch: the tests that read the same compile
/// of coll.cu (NVRTC takes ~12 s per arch on two cores) run in parallel threads, and the
/// ones that come while it compiles wait for it instead of compiling it again.
fn once_per_arch(
    memo: &'static ArchMemo,
    arch: u32,
    make: impl FnOnce(u32) -> String,
) -> &'static str {
    let cell: &'static OnceLock<String> = memo
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(arch)
        .or_insert_with(|| Box::leak(Box::default()));
    cell.get_or_init(|| make(arch))
}

/// coll.cu's PTX for compute_`arch`.
fn coll_ptx(arch: u32) -> &'static str {
    static PTX: ArchMemo = OnceLock::new();
    once_per_arch(&PTX, arch, |a| ptx(&coll_program(), "coll.cu", a))
}

/// ptxas' verbose report (registers, spills) of coll.cu compiled to CUBIN for sm_`arch`, the
/// image checked to be an ELF CUBIN: the compile test and the spill check share it.
fn coll_cubin_report(arch: u32) -> &'static str {
    static REPORT: ArchMemo = OnceLock::new();
    once_per_arch(&REPORT, arch, |a| {
        ptxas_report(&coll_program(), "coll.cu", a)
    })
}

#[test]
fn coll_kernels_compile_with_tuning_defines() {
    // What SYMHEAP_COLL_DEFINES puts ahead of the source (backend/cuda/mod.rs, coll_source):
    // every #ifndef constant of coll.cu may be overridden, including template arguments.
    let defines: Vec<(String, u64)> = [
        ("SYMHEAP_COLL_BCAST_PUSH", 0),
        ("SYMHEAP_COLL_UNROLL", 2),
        ("SYMHEAP_COLL_UNROLL_ONESHOT", 1),
        ("SYMHEAP_COLL_PUSH2_MIN", 0),
        ("SYMHEAP_COLL_LL128_UNROLL", 2),
        ("SYMHEAP_COLL_A2A_OWN", 0),
    ]
    .map(|(n, v)| (n.to_string(), v))
    .into();
    cubin(&coll_source(&defines), "coll_tuned.cu", archs()[0]);
}

#[test]
fn coll_kernels_compile_to_cubin() {
    for &arch in archs() {
        coll_cubin_report(arch);
    }
}

#[test]
fn every_kernel_takes_its_argument_block() {
    // Each kernel the backend launches has one parameter, its argument block by value, of the
    // size of the Rust struct the launcher passes (the layout inside is checked by the
    // program's static_asserts).
    let kernels = kernels_program();
    for &arch in archs() {
        let own = ptx(&kernels, "kernels.cu", arch);
        for e in kernel_entries() {
            let p = if e.program == "symheap_coll.cu" {
                coll_ptx(arch)
            } else {
                own.as_str()
            };
            let params = entry_params(p, &e.symbol);
            let want = format!(".param .align 8 .b8 {}_param_0[{}]", e.symbol, e.arg_bytes);
            assert_eq!(
                params.matches(".param").count(),
                1,
                "{} sm_{arch}: one parameter expected in\n{params}",
                e.symbol
            );
            assert!(
                params.contains(&want),
                "{} sm_{arch}: expected `{want}` in\n{params}",
                e.symbol
            );
        }
    }
}

/// NVRTC's log for `source`, which must not compile.
fn compile_error(source: &str, name: &str) -> String {
    require_nvrtc();
    match nvrtc::compile_ptx(source, name, 90, &headers()) {
        Ok(_) => panic!("{name} compiled although its argument layout is wrong"),
        Err(log) => log,
    }
}

#[test]
fn an_argument_layout_that_differs_does_not_compile() {
    let coll = coll_program();
    let kernels = kernels_program();
    // The .cu side drifts: a field added, a field widened, two fields swapped.
    let added = coll.replacen(
        "  uint64_t stride;",
        "  uint64_t extra;\n  uint64_t stride;",
        1,
    );
    assert_ne!(added, coll);
    let log = compile_error(&added, "coll_added.cu");
    assert!(
        log.contains("coll::Args::stride: Rust puts 8 bytes at offset 24"),
        "{log}"
    );
    let widened = kernels.replacen("  int32_t cmp;", "  int64_t cmp;", 1);
    assert_ne!(widened, kernels);
    let log = compile_error(&widened, "kernels_widened.cu");
    assert!(
        log.contains("kern::WaitArgs::cmp: Rust puts 4 bytes at offset 32"),
        "{log}"
    );
    let swapped = coll.replacen(
        "  int32_t me;\n  int32_t n;",
        "  int32_t n;\n  int32_t me;",
        1,
    );
    assert_ne!(swapped, coll);
    let log = compile_error(&swapped, "coll_swapped.cu");
    assert!(
        log.contains("coll::Team::me: Rust puts 4 bytes at offset 32"),
        "{log}"
    );
    // The Rust side drifts: the header says another offset.
    let moved = coll.replacen(
        "SYMHEAP_ARG_OFFSET(coll::Args, root) == 112",
        "SYMHEAP_ARG_OFFSET(coll::Args, root) == 116",
        1,
    );
    assert_ne!(moved, coll);
    compile_error(&moved, "coll_moved.cu");
    // Without the checks the programs refuse to compile at all.
    for (raw, name) in [
        (nvrtc::COLL, "coll_raw.cu"),
        (nvrtc::KERNELS, "kernels_raw.cu"),
    ] {
        let log = compile_error(raw, name);
        assert!(log.contains("prepends the Rust layout checks"), "{log}");
    }
}

#[test]
fn coll_hot_kernels_move_16_byte_vectors() {
    let p = coll_ptx(PTX_ARCH);
    let mut hot: Vec<String> = Vec::new();
    for dt in COLL_DTYPES {
        hot.push(format!("symheap_ar_oneshot_{dt}"));
        hot.push(format!("symheap_ar_ll128_{dt}"));
        hot.push(format!("symheap_ar_flag_{dt}"));
        hot.push(format!("symheap_ar_twoshot_{dt}"));
        hot.push(format!("symheap_reduce_scatter_{dt}"));
    }
    hot.push("symheap_allgather".to_string());
    for name in &hot {
        let body = entry(p, name);
        // Loads bypass the SM's non-coherent L1 (.cg): peers store into the memory read.
        assert_has(
            body,
            &format!("{name} vector loads"),
            &["ld.global.cg.v4.u32"],
        );
        assert_has(
            body,
            &format!("{name} vector stores"),
            &["st.global.v4.u32"],
        );
    }
    // Several loads in flight per thread: the unrolled bodies hold >= 8 vector loads (4 per
    // source for two members).
    for name in [
        "symheap_ar_twoshot_bf16",
        "symheap_ar_twoshot_f32",
        "symheap_ar_flag_bf16",
    ] {
        let loads = entry(p, name).matches("ld.global.cg.v4.u32").count();
        assert!(loads >= 8, "{name}: only {loads} vector loads");
    }
    let loads = entry(p, "symheap_allgather")
        .matches("ld.global.cg.v4.u32")
        .count();
    assert!(loads >= 4, "allgather: only {loads} vector loads");
    // f16 / bf16 are accumulated in f32 and rounded two at a time.
    for (dt, cvt) in [("bf16", "cvt.rn.bf16x2.f32"), ("f16", "cvt.rn.f16x2.f32")] {
        for kind in ["ar_oneshot", "ar_flag", "ar_twoshot", "reduce_scatter"] {
            let name = format!("symheap_{kind}_{dt}");
            assert_has(entry(p, &name), &name, &[cvt]);
        }
    }
    // The LL kernels (one-shot all_reduce / reduce_scatter, small all_gather / alltoall /
    // broadcast): {flag, data} words as 64-bit elements of 16-byte volatile vectors.
    let lls = COLL_DTYPES
        .iter()
        .flat_map(|dt| {
            [
                format!("symheap_ar_oneshot_{dt}"),
                format!("symheap_ar_ll128_{dt}"),
            ]
        })
        .chain(["symheap_exchange_ll", "symheap_exchange_ll128"].map(String::from));
    for name in lls {
        let body = entry(p, &name);
        assert_has(body, &name, &["st.volatile.global.v2.u64"]);
        assert_has(body, &name, &["ld.volatile.global.v2.u64"]);
    }
}

#[test]
fn coll_barriers_order_at_system_scope() {
    let p = coll_ptx(PTX_ARCH);
    for name in coll_kernels() {
        let body = entry(p, &name);
        // The one-shot's LL and LL128 kernels have no flag round: their data lines carry the
        // flags (checked in coll_hot_kernels_move_16_byte_vectors).
        if !name.starts_with("symheap_ar_oneshot_") && !name.starts_with("symheap_ar_ll128_") {
            assert_has(
                body,
                &format!("{name} arrival"),
                &["st.release.sys.global.u64"],
            );
            assert_has(
                body,
                &format!("{name} wait"),
                &["ld.acquire.sys.global.u64"],
            );
        }
        assert_has(body, &format!("{name} timeout"), &["%globaltimer"]);
        assert_has(
            body,
            &format!("{name} error report"),
            &["st.relaxed.sys.global.u32"],
        );
        // The only atomic is the blocks-done counter at exit: none on the data path.
        let instructions = body.lines().map(|line| {
            let line = line.trim_start();
            // Drop a guard predicate (`@%p1 atom...`).
            match line.strip_prefix('@') {
                Some(rest) => rest.split_once(' ').map_or("", |(_, i)| i.trim_start()),
                None => line,
            }
        });
        let atomics: Vec<&str> = instructions
            .filter(|i| i.starts_with("atom.") || i.starts_with("red."))
            .collect();
        let counter = atomics
            .iter()
            .filter(|i| i.starts_with("atom.global.add.u64"))
            .count();
        let atomics = atomics.len();
        assert!(
            counter >= 1 && atomics == counter,
            "{name}: {atomics} atomics, {counter} of them the exit counter"
        );
    }
}

/// Compiles `source` to CUBIN for `arch` with `--ptxas-options=-v` and returns NVRTC's log
/// (ptxas' register / spill report); the image must be an ELF CUBIN.
fn ptxas_report(source: &str, name: &str, arch: u32) -> String {
    require_nvrtc();
    match nvrtc::compile_cubin_with_log(source, name, arch, &headers(), &["--ptxas-options=-v"]) {
        Ok((image, log)) => {
            assert!(
                image.starts_with(b"\x7fELF"),
                "{name} sm_{arch}: not a CUBIN"
            );
            log
        }
        Err(log) => panic!("{name} does not compile for sm_{arch}:\n{log}"),
    }
}

/// (registers, spill store bytes, spill load bytes, stack frame bytes) per kernel, from ptxas'
/// verbose report.
fn ptxas_usage(log: &str) -> Vec<(String, u32, u32, u32, u32)> {
    let number_before = |line: &str, what: &str| -> u32 {
        let at = line
            .find(what)
            .unwrap_or_else(|| panic!("no `{what}` in `{line}`"));
        line[..at]
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number before `{what}` in `{line}`"))
    };
    let mut out = Vec::new();
    let mut name = String::new();
    let (mut stack, mut spill_st, mut spill_ld) = (0, 0, 0);
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            name = rest.split('\'').next().unwrap_or("").to_string();
        } else if line.contains("bytes stack frame") {
            stack = number_before(line, "bytes stack frame");
            spill_st = number_before(line, "bytes spill stores");
            spill_ld = number_before(line, "bytes spill loads");
        } else if line.contains("Used") && line.contains("registers") {
            let regs = number_before(line, "registers");
            out.push((name.clone(), regs, spill_st, spill_ld, stack));
        }
    }
    out
}

#[test]
fn coll_kernels_do_not_spill() {
    // Every kernel is reported before the verdict, so one run shows all that went over.
    let mut over = Vec::new();
    for &arch in archs() {
        let log = coll_cubin_report(arch);
        let usage = ptxas_usage(log);
        for name in coll_kernels() {
            let (_, regs, spill_st, spill_ld, stack) = usage
                .iter()
                .find(|u| u.0 == name)
                .unwrap_or_else(|| panic!("no ptxas report for {name} sm_{arch}:\n{log}"))
                .clone();
            println!("sm_{arch} {name}: {regs} registers, stack {stack} B, spills {spill_st}/{spill_ld} B");
            // __launch_bounds__(1024): at most 64 registers, so 2 blocks of 512 threads per SM.
            if regs > 64 || (spill_st, spill_ld, stack) != (0, 0, 0) {
                over.push(format!(
                    "{name} sm_{arch}: {regs} registers, spills {spill_st}/{spill_ld} B, \
                     stack {stack} B"
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over 64 registers, spilling or with a stack frame:\n{}",
        over.join("\n")
    );
}

#[test]
fn coll_has_no_toolkit_includes() {
    for include in [
        "cuda_runtime",
        "cuda_fp16",
        "cuda_bf16",
        "cuda/std",
        "stdint",
    ] {
        assert!(
            !nvrtc::COLL.contains(&format!("#include <{include}")),
            "coll.cu must not include {include}"
        );
    }
    assert!(nvrtc::COLL.contains("#include \"symheap.cuh\""));
}
