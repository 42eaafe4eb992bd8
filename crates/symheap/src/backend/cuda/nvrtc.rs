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
//! "nvidia-cuda-nvrtc==13.0.*"`) compiles them, in CI and at the user's site.
//!
//! The library is loaded at run time through cudarc's dynamic loading. cudarc panics when it cannot
//! find the library, so every entry point checks [`cudarc::nvrtc::sys::is_culib_present`] first
//! and returns an error instead; nothing here panics on any input.

use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::OnceLock;

use cudarc::nvrtc::sys;

/// The device header (`include/symheap.cuh`) as compiled into the library.
pub const HEADER: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../include/symheap.cuh"
));

/// The backend's kernels (`kernels.cu`, includes `"symheap.cuh"`) as compiled into the library.
pub const KERNELS: &str = include_str!("kernels.cu");

/// The collective kernels (all_reduce, all_gather, reduce_scatter, broadcast, alltoall).
pub const COLL: &str = include_str!("coll.cu");

/// The include name under which [`HEADER`] is passed to NVRTC.
pub const HEADER_NAME: &str = "symheap.cuh";

const NOT_FOUND: &str = "libnvrtc not found: install the CUDA toolkit or `pip install \
     nvidia-cuda-nvrtc==13.0.*` and add its lib directory (site-packages/nvidia/cu13/lib) to \
     LD_LIBRARY_PATH";

/// Whether libnvrtc can be loaded; checked once per process.
fn ensure_loaded() -> Result<(), String> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on cudarc's candidate library names and drops
    // the handles; loading libnvrtc runs no initialisation code that could break Rust invariants.
    let present = *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(NOT_FOUND.to_string())
    }
}

/// Runs `f`, which calls into cudarc's lazily resolved NVRTC bindings; a missing symbol makes
/// cudarc panic, which becomes an `Err` here.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    ensure_loaded()?;
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        Err(format!(
            "{what}: the loaded libnvrtc lacks an entry point ({msg})"
        ))
    })
}

/// NVRTC's error string for `r`.
fn error_string(r: sys::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString accepts any nvrtcResult and returns either null or a pointer to
    // a static NUL-terminated string owned by libnvrtc, which lives as long as the process.
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: `p` is non-null and points to a NUL-terminated static string (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn check(r: sys::nvrtcResult, call: &str) -> Result<(), String> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {}", error_string(r)))
    }
}

/// NVRTC's version, or why NVRTC cannot be loaded.
pub fn version() -> Result<(i32, i32), String> {
    guarded("nvrtcVersion", || {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: both pointers are valid, writable, properly aligned c_ints on this stack frame.
        let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        check(r, "nvrtcVersion")?;
        Ok((major, minor))
    })
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 was returned by a successful nvrtcCreateProgram and is destroyed only
        // here, once. The result is ignored: nothing useful can be done about a failed destroy.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn log(&self) -> String {
        let mut size: usize = 0;
        // SAFETY: self.0 is a live program; `size` is a valid, writable usize.
        let r = unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds `size` bytes, the size NVRTC reported for the log including its NUL.
        let r = unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr().cast::<c_char>()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
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

fn compile(
    source: &str,
    name: &str,
    arch: u32,
    headers: &[(&str, &str)],
    output: Output,
) -> Result<Vec<u8>, String> {
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
        .map(|o| cstring(o, "an option"))
        .collect::<Result<Vec<_>, _>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    let (text_arg, name_arg) = if headers.is_empty() {
        (ptr::null(), ptr::null())
    } else {
        (text_ptrs.as_ptr(), name_ptrs.as_ptr())
    };

    guarded("NVRTC", || {
        let mut raw: sys::nvrtcProgram = ptr::null_mut();
        // SAFETY: every string is a live NUL-terminated CString owned by this frame; the two
        // header arrays hold `num_headers` valid pointers each (or are null when there are none);
        // `raw` is a valid out-pointer. NVRTC copies what it needs before returning.
        let r = unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                c_source.as_ptr(),
                c_name.as_ptr(),
                num_headers,
                text_arg,
                name_arg,
            )
        };
        check(r, "nvrtcCreateProgram")?;
        let program = Program(raw);

        let num_options = c_int::try_from(option_ptrs.len()).map_err(|_| "too many options")?;
        // SAFETY: `program.0` is live; `option_ptrs` holds `num_options` pointers to live
        // NUL-terminated CStrings owned by this frame.
        let r = unsafe { sys::nvrtcCompileProgram(program.0, num_options, option_ptrs.as_ptr()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!(
                "NVRTC could not compile {name} for sm_{arch} ({}):\n{}",
                error_string(r),
                program.log()
            ));
        }

        let mut size: usize = 0;
        // SAFETY: `program.0` is live and compiled; `size` is a valid, writable usize.
        let r = unsafe {
            match output {
                Output::Cubin => sys::nvrtcGetCUBINSize(program.0, &mut size),
                Output::Ptx => sys::nvrtcGetPTXSize(program.0, &mut size),
            }
        };
        check(r, "reading the compiled size")?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` holds exactly the `size` bytes NVRTC reported for this output.
            let r = unsafe {
                let out = buf.as_mut_ptr().cast::<c_char>();
                match output {
                    Output::Cubin => sys::nvrtcGetCUBIN(program.0, out),
                    Output::Ptx => sys::nvrtcGetPTX(program.0, out),
                }
            };
            check(r, "reading the compiled code")?;
        }
        Ok(buf)
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
    compile(source, name, arch, headers, Output::Cubin)
}

/// Same, returning PTX text (for inspection and for archs newer than the driver).
pub fn compile_ptx(
    source: &str,
    name: &str,
    arch: u32,
    headers: &[(&str, &str)],
) -> Result<String, String> {
    let mut bytes = compile(source, name, arch, headers, Output::Ptx)?;
    if let Some(end) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(end);
    }
    String::from_utf8(bytes).map_err(|_| "NVRTC returned PTX that is not UTF-8".to_string())
}
