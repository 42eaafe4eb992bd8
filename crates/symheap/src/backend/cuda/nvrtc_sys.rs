//! libnvrtc, loaded at run time from where the user has it: `SYMHEAP_NVRTC_LIB`, the
//! `nvidia-cuda-nvrtc` wheel on Python's search path, or the loader's path (in that order; see
//! [`crate::util::libsearch`]). Every `unsafe` block that touches NVRTC's symbols is in this
//! file or in `nvrtc.rs`, and says why it holds.
//!
//! Why not cudarc's loader: it only asks the dynamic loader for a list of names, so a pip user's
//! NVRTC (in site-packages, never on the loader's path) is not found, and a missing symbol
//! panics. Eleven entry points are all symheap calls; resolving them here keeps every failure an
//! error that names the file.
//!
//! Why the builtins are loaded first: libnvrtc opens `libnvrtc-builtins.so.<major>.<minor>` by
//! name at its first compile, and the wheel's folder is not on the loader's path, so the compile
//! would fail with NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. Loading the builtins from the same
//! folder first (globally) makes that lookup find the loaded copy.

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::util::libsearch::{self, Candidate, Library};

/// `nvrtcResult`.
pub(crate) type NvrtcResult = c_int;
/// `NVRTC_SUCCESS`.
pub(crate) const SUCCESS: NvrtcResult = 0;
/// `nvrtcProgram`.
pub(crate) type Program = *mut c_void;

/// What is searched for.
pub(crate) const NVRTC: Library = Library {
    file: "libnvrtc.so.13",
    env: "SYMHEAP_NVRTC_LIB",
    wheel_dir: "nvidia/cu13/lib",
    wheel: "nvidia-cuda-nvrtc",
};

type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> NvrtcResult;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> NvrtcResult;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult;
type GetFn = unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult;
type ErrorStringFn = unsafe extern "C" fn(NvrtcResult) -> *const c_char;

/// The resolved entry points of one loaded libnvrtc (never unloaded: the pointers stay valid
/// for the life of the process).
pub(crate) struct Api {
    pub(crate) path: PathBuf,
    pub(crate) version: (i32, i32),
    pub(crate) create_program: CreateFn,
    pub(crate) compile_program: CompileFn,
    pub(crate) destroy_program: DestroyFn,
    pub(crate) get_program_log_size: SizeFn,
    pub(crate) get_program_log: GetFn,
    pub(crate) get_cubin_size: SizeFn,
    pub(crate) get_cubin: GetFn,
    pub(crate) get_ptx_size: SizeFn,
    pub(crate) get_ptx: GetFn,
    pub(crate) get_error_string: ErrorStringFn,
    _builtins: Option<libloading::Library>,
    _lib: libloading::Library,
}

/// Loads the builtins library next to `nvrtc`, if there is one, with global symbol binding.
fn load_builtins(nvrtc: &Path) -> Result<Option<libloading::Library>, String> {
    let Some(dir) = nvrtc.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(None);
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
        })
        .collect();
    found.sort();
    let Some(path) = found.first() else {
        return Ok(None);
    };
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
    // SAFETY: libnvrtc-builtins holds NVRTC's precompiled builtin headers and has no
    // initialisers beyond the C runtime's; it is loaded from the same wheel folder as libnvrtc.
    let lib = unsafe { libloading::os::unix::Library::open(Some(path), flags) }
        .map_err(|e| format!("{}: {}", path.display(), libsearch::with_source(&e)))?;
    Ok(Some(lib.into()))
}

/// Opens one candidate and resolves every entry point.
fn open(c: &Candidate) -> Result<Api, String> {
    let builtins = if c.is_file {
        load_builtins(&c.path)?
    } else {
        None
    };
    // SAFETY: loading libnvrtc runs only its C runtime initialisers; no NVRTC call is made here
    // except nvrtcVersion below, which has no preconditions.
    let lib =
        unsafe { libloading::Library::new(&c.path) }.map_err(|e| libsearch::with_source(&e))?;
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            // SAFETY: the symbol is NVRTC's documented C entry point of this name, whose C
            // signature `$ty` mirrors (nvrtc.h, CUDA 11 to 13); the library outlives the copy
            // of the pointer because `Api` owns it and is never dropped.
            let s: Result<libloading::Symbol<'_, $ty>, _> = unsafe { lib.get($name) };
            *s.map_err(|e| {
                format!(
                    "lacks {} ({}); is it NVRTC?",
                    String::from_utf8_lossy(&$name[..$name.len() - 1]),
                    libsearch::with_source(&e)
                )
            })?
        }};
    }
    let version: VersionFn = sym!(b"nvrtcVersion\0", VersionFn);
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are valid, writable c_ints on this stack frame.
    let r = unsafe { version(&mut major, &mut minor) };
    if r != SUCCESS {
        return Err(format!("nvrtcVersion failed with status {r}"));
    }
    Ok(Api {
        path: c.path.clone(),
        version: (major, minor),
        create_program: sym!(b"nvrtcCreateProgram\0", CreateFn),
        compile_program: sym!(b"nvrtcCompileProgram\0", CompileFn),
        destroy_program: sym!(b"nvrtcDestroyProgram\0", DestroyFn),
        get_program_log_size: sym!(b"nvrtcGetProgramLogSize\0", SizeFn),
        get_program_log: sym!(b"nvrtcGetProgramLog\0", GetFn),
        get_cubin_size: sym!(b"nvrtcGetCUBINSize\0", SizeFn),
        get_cubin: sym!(b"nvrtcGetCUBIN\0", GetFn),
        get_ptx_size: sym!(b"nvrtcGetPTXSize\0", SizeFn),
        get_ptx: sym!(b"nvrtcGetPTX\0", GetFn),
        get_error_string: sym!(b"nvrtcGetErrorString\0", ErrorStringFn),
        _builtins: builtins,
        _lib: lib,
    })
}

/// The library this process loaded. A failed search is not remembered: the Python package may
/// give its search path later, and a user may install the wheel and retry.
static LOADED: Mutex<Option<&'static Api>> = Mutex::new(None);

/// The loaded libnvrtc, loading it on first use (see the module doc for where it is looked for).
pub(crate) fn api() -> Result<&'static Api, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(api) = *loaded {
        return Ok(api);
    }
    let (cands, note) = NVRTC.search();
    let api = NVRTC.load_first(&cands, note.as_deref(), open)?;
    let api: &'static Api = Box::leak(Box::new(api));
    *loaded = Some(api);
    Ok(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nvrtc_names_the_variable_the_wheel_and_the_loader() {
        let c = NVRTC.candidates(None, Some(std::ffi::OsStr::new("/no/such/dir")), &[]);
        let e = NVRTC
            .load_first(&c, None, open)
            .err()
            .expect("no such file");
        assert!(
            e.contains("/no/such/dir (SYMHEAP_NVRTC_LIB): no such file"),
            "{e}"
        );
        assert!(e.contains("pip install nvidia-cuda-nvrtc"), "{e}");
        let c = NVRTC.candidates(None, None, &[PathBuf::from("/site")]);
        assert_eq!(
            c[0].path,
            PathBuf::from("/site/nvidia/cu13/lib/libnvrtc.so.13")
        );
        assert_eq!(c[1].path, PathBuf::from("libnvrtc.so.13"));
    }

    #[test]
    fn a_library_that_is_not_nvrtc_is_refused_by_name() {
        // libc is always loadable and has none of NVRTC's symbols.
        let c = Candidate {
            path: PathBuf::from("libc.so.6"),
            origin: "test".into(),
            is_file: false,
        };
        let e = open(&c).err().expect("libc is not NVRTC");
        assert!(e.contains("lacks nvrtcVersion"), "{e}");
    }
}
