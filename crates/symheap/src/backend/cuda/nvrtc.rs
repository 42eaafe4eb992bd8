//! Run-time compilation of symheap's device code with NVRTC.
//!
//! Why NVRTC: symheap ships as a plain Rust crate / Python wheel, with no nvcc step at build time.
//! Kernels are compiled on the user's machine for the device's own architecture, straight to
//! CUBIN, so no driver PTX JIT is involved and the code matches the GPU it runs on.
//!
//! Why no toolkit headers: NVRTC ships without the CUDA toolkit's headers (`cuda_runtime.h`,
//! `cuda_fp16.h`, `<cstdint>`...). The device header `include/symheap.cuh` and the backend's
//! kernels therefore use only what NVRTC knows by itself (`threadIdx`, `__syncthreads`,
//! `__nanosleep`, ...) and inline PTX, so `libnvrtc` alone (e.g. `pip install
//! "nvidia-cuda-nvrtc==13.0.*"` or `"nvidia-cuda-nvrtc-cu12==12.4.*"`) compiles them, in CI and
//! at the user's site.
//!
//! The library is loaded at run time from wherever the user has it (`nvrtc_sys`): the CUDA 13
//! and CUDA 12 wheels are found on Python's path with no `LD_LIBRARY_PATH`. When several are
//! installed, each compile uses one whose cubins the initialised driver can load and that knows
//! the target architecture (`backend/cuda/compat.rs`). NVRTC is only needed for kernels that are not
//! shipped prebuilt (other architectures, tuning overrides, users' own modules); nothing here
//! panics on any input.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::PathBuf;
use std::ptr;

use super::nvrtc_sys::{self as sys, Api, SUCCESS};

/// The device header (`include/symheap.cuh`) as compiled into the library.
pub const HEADER: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../include/symheap.cuh"
));

/// The backend's kernels (`kernels.cu`, includes `"symheap.cuh"`) as compiled into the library.
pub const KERNELS: &str = include_str!("kernels.cu");

/// The collective kernels (all_reduce, all_gather, reduce_scatter, broadcast, alltoall): one
/// program ("coll.cu") kept in three files by role: the common part, the all_reduce family and
/// the exchange family.
pub const COLL: &str = concat!(
    include_str!("coll/common.cu"),
    include_str!("coll/all_reduce.cu"),
    include_str!("coll/exchange.cu")
);

/// The include name under which [`HEADER`] is passed to NVRTC.
pub const HEADER_NAME: &str = "symheap.cuh";

/// NVRTC's error string for `r`.
fn error_string(api: &Api, r: sys::NvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString accepts any nvrtcResult and returns either null or a pointer to
    // a static NUL-terminated string owned by libnvrtc, which lives as long as the process.
    let p = unsafe { (api.get_error_string)(r) };
    if p.is_null() {
        format!("status {r}")
    } else {
        // SAFETY: `p` is non-null and points to a NUL-terminated static string (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn check(api: &Api, r: sys::NvrtcResult, call: &str) -> Result<(), String> {
    if r == SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {}", error_string(api, r)))
    }
}

/// The NVRTC a compile for `arch` uses in this process: the driver's CUDA version (once the
/// driver is initialised) and `arch` (when given) narrow the NVRTCs found.
fn api_for(arch: Option<u32>) -> Result<&'static Api, String> {
    let driver = super::driver::initialized_version().map(super::compat::driver_cuda);
    sys::api(driver, arch)
}

/// The version of the NVRTC compiles use here (with no architecture given: the newest found
/// whose cubins the initialised driver loads), or why there is none (naming every place looked).
pub fn version() -> Result<(i32, i32), String> {
    api_for(None).map(|a| a.version)
}

/// The file that NVRTC was loaded from (a bare name when the dynamic loader found it), or why
/// there is none.
pub fn library_path() -> Result<PathBuf, String> {
    api_for(None).map(|a| a.path.clone())
}

/// The NVRTC that compiles for `arch` (e.g. 90) here: its version and file, or why there is
/// none (every NVRTC found and why it does not fit, or every place looked).
pub fn for_arch(arch: u32) -> Result<((i32, i32), PathBuf), String> {
    api_for(Some(arch)).map(|a| (a.version, a.path.clone()))
}

/// `Ok` when `value` is accepted for `SYMHEAP_NVRTC` (`12` or `13`), else what is.
pub fn check_forced_major(value: &str) -> Result<(), String> {
    sys::forced_major(Some(value)).map(|_| ())
}

/// Every NVRTC found here: (version, file, where it was found), in search order; empty when
/// none loads.
pub fn found() -> Vec<((i32, i32), PathBuf, String)> {
    sys::loaded()
        .map(|apis| {
            apis.iter()
                .map(|a| (a.version, a.path.clone(), a.origin.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// An NVRTC program, destroyed on drop.
struct Program {
    api: &'static Api,
    raw: sys::Program,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `raw` was returned by a successful nvrtcCreateProgram and is destroyed only
        // here, once. The result is ignored: nothing useful can be done about a failed destroy.
        let _ = unsafe { (self.api.destroy_program)(&mut self.raw) };
    }
}

impl Program {
    fn log(&self) -> String {
        let mut size: usize = 0;
        // SAFETY: `raw` is a live program; `size` is a valid, writable usize.
        let r = unsafe { (self.api.get_program_log_size)(self.raw, &mut size) };
        if r != SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds `size` bytes, the size NVRTC reported for the log including its NUL.
        let r = unsafe { (self.api.get_program_log)(self.raw, buf.as_mut_ptr().cast::<c_char>()) };
        if r != SUCCESS {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
    }
}

/// What to extract from a compiled program.
#[derive(Clone, Copy)]
enum Output {
    Cubin,
    Ptx,
}

/// Converts `s` to a C string, naming `what` when it holds a NUL byte.
fn cstring(s: &str, what: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} contains a NUL byte"))
}

/// What one compile gave.
struct Compiled {
    output: Vec<u8>,
    /// Warnings, or ptxas' report with `--ptxas-options=-v`.
    log: String,
    /// The version of the NVRTC that compiled it.
    nvrtc: (i32, i32),
}

/// Compiles `source` for `arch` with `headers` and `extra` options, with the NVRTC chosen for
/// `arch` here.
fn compile(
    source: &str,
    name: &str,
    arch: u32,
    headers: &[(&str, &str)],
    extra: &[&str],
    output: Output,
) -> Result<Compiled, String> {
    let c_source = cstring(source, "the source")?;
    let c_name = cstring(name, "the program name")?;
    let mut header_texts = Vec::with_capacity(headers.len());
    let mut header_names = Vec::with_capacity(headers.len());
    for (include, text) in headers {
        header_names.push(cstring(include, "a header name")?);
        header_texts.push(cstring(text, &format!("header {include:?}"))?);
    }
    let num_headers = c_int::try_from(headers.len()).map_err(|_| "too many headers".to_string())?;
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let arch_opt = match output {
        Output::Cubin => format!("--gpu-architecture=sm_{arch}"),
        Output::Ptx => format!("--gpu-architecture=compute_{arch}"),
    };
    let options = [arch_opt.as_str(), "-std=c++17", "-default-device"]
        .iter()
        .chain(extra)
        .map(|o| cstring(o, "an option"))
        .collect::<Result<Vec<_>, _>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    let (text_arg, name_arg) = if headers.is_empty() {
        (ptr::null(), ptr::null())
    } else {
        (text_ptrs.as_ptr(), name_ptrs.as_ptr())
    };
    let api = api_for(Some(arch))?;

    let mut raw: sys::Program = ptr::null_mut();
    // SAFETY: every string is a live NUL-terminated CString owned by this frame; the two header
    // arrays hold `num_headers` valid pointers each (or are null when there are none); `raw` is
    // a valid out-pointer. NVRTC copies what it needs before returning.
    let r = unsafe {
        (api.create_program)(
            &mut raw,
            c_source.as_ptr(),
            c_name.as_ptr(),
            num_headers,
            text_arg,
            name_arg,
        )
    };
    check(api, r, "nvrtcCreateProgram")?;
    let program = Program { api, raw };

    let num_options = c_int::try_from(option_ptrs.len()).map_err(|_| "too many options")?;
    // SAFETY: `program.raw` is live; `option_ptrs` holds `num_options` pointers to live
    // NUL-terminated CStrings owned by this frame.
    let r = unsafe { (api.compile_program)(program.raw, num_options, option_ptrs.as_ptr()) };
    if r != SUCCESS {
        return Err(format!(
            "NVRTC {}.{} could not compile {name} for sm_{arch} ({}):\n{}",
            api.version.0,
            api.version.1,
            error_string(api, r),
            program.log()
        ));
    }

    let mut size: usize = 0;
    let (size_fn, get_fn) = match output {
        Output::Cubin => (api.get_cubin_size, api.get_cubin),
        Output::Ptx => (api.get_ptx_size, api.get_ptx),
    };
    // SAFETY: `program.raw` is live and compiled; `size` is a valid, writable usize.
    let r = unsafe { size_fn(program.raw, &mut size) };
    check(api, r, "reading the compiled size")?;
    let mut buf = vec![0u8; size];
    if size > 0 {
        // SAFETY: `buf` holds exactly the `size` bytes NVRTC reported for this output.
        let r = unsafe { get_fn(program.raw, buf.as_mut_ptr().cast::<c_char>()) };
        check(api, r, "reading the compiled code")?;
    }
    Ok(Compiled {
        output: buf,
        log: program.log(),
        nvrtc: api.version,
    })
}

/// Compiles `source` (named `name` in messages) for `arch` (e.g. 90 for sm_90) with in-memory
/// `headers` (include name, content); returns the CUBIN. `Err` carries the NVRTC log.
pub fn compile_cubin(
    source: &str,
    name: &str,
    arch: u32,
    headers: &[(&str, &str)],
) -> Result<Vec<u8>, String> {
    compile(source, name, arch, headers, &[], Output::Cubin).map(|c| c.output)
}

/// Like [`compile_cubin`], also returning the version of the NVRTC that compiled it (the
/// oldest driver that loads the image directly supports that CUDA version).
pub fn compile_cubin_with_version(
    source: &str,
    name: &str,
    arch: u32,
    headers: &[(&str, &str)],
) -> Result<(Vec<u8>, (i32, i32)), String> {
    compile(source, name, arch, headers, &[], Output::Cubin).map(|c| (c.output, c.nvrtc))
}

/// Like [`compile_cubin`] with `extra` NVRTC options, also returning the compile log (for
/// example ptxas' register and spill report with `--ptxas-options=-v`).
pub fn compile_cubin_with_log(
    source: &str,
    name: &str,
    arch: u32,
    headers: &[(&str, &str)],
    extra: &[&str],
) -> Result<(Vec<u8>, String), String> {
    compile(source, name, arch, headers, extra, Output::Cubin).map(|c| (c.output, c.log))
}

/// Same, returning PTX text (for inspection and for archs newer than the driver).
pub fn compile_ptx(
    source: &str,
    name: &str,
    arch: u32,
    headers: &[(&str, &str)],
) -> Result<String, String> {
    let mut bytes = compile(source, name, arch, headers, &[], Output::Ptx)?.output;
    if let Some(end) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(end);
    }
    String::from_utf8(bytes).map_err(|_| "NVRTC returned PTX that is not UTF-8".to_string())
}
