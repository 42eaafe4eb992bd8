//! libnvrtc, loaded at run time from where the user has it: `SYMHEAP_NVRTC_LIB` alone when set;
//! otherwise every NVRTC of CUDA 13 (`libnvrtc.so.13`, the `nvidia-cuda-nvrtc` wheel's
//! `nvidia/cu13/lib`) and CUDA 12 (`libnvrtc.so.12`, the `nvidia-cuda-nvrtc-cu12` wheel's
//! `nvidia/cuda_nvrtc/lib`) found on Python's search path, in a CUDA toolkit (`$CUDA_HOME`,
//! `$CUDA_PATH`, `/usr/local/cuda`: `lib64/`) and on the loader's path. Which of them compiles
//! is chosen per driver and architecture ([`super::compat::choose`]): a CUDA 12 driver cannot
//! load NVRTC 13's cubins. Every `unsafe` block that touches NVRTC's symbols is in this file or
//! in `nvrtc.rs`, and says why it holds.
//!
//! Why not cudarc's loader: it only asks the dynamic loader for a list of names, so a pip user's
//! NVRTC (in site-packages, never on the loader's path) is not found, and a missing symbol
//! panics. The dozen entry points symheap calls are resolved here, so every failure is an
//! error that names the file.
//!
//! Why the builtins are loaded first: libnvrtc opens `libnvrtc-builtins.so.<major>.<minor>` by
//! name at its first compile, and the wheel's folder is not on the loader's path, so the compile
//! would fail with NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. Loading the builtins from the same
//! folder first (globally) makes that lookup find the loaded copy; the builtins of different
//! versions have different names, so NVRTC 12 and 13 can be loaded side by side.

use std::ffi::{c_char, c_int, c_void, OsStr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::compat::{self, Need, Offer};
use crate::util::libsearch::{self, Candidate};

/// `nvrtcResult`.
pub(crate) type NvrtcResult = c_int;
/// `NVRTC_SUCCESS`.
pub(crate) const SUCCESS: NvrtcResult = 0;
/// `nvrtcProgram`.
pub(crate) type Program = *mut c_void;

/// The variable naming the library (or a folder holding it); alone when set.
pub(crate) const ENV_LIB: &str = "SYMHEAP_NVRTC_LIB";
/// The variable restricting the choice to one major version (`12` or `13`).
pub(crate) const ENV_MAJOR: &str = "SYMHEAP_NVRTC";

/// One major version of NVRTC as installed: its loader name, its wheel's library folder under a
/// Python search directory, and the wheel.
struct Flavour {
    file: &'static str,
    wheel_dir: &'static str,
    wheel: &'static str,
}

/// Newest first: the order candidates are listed in (and ties are broken by).
const FLAVOURS: [Flavour; 2] = [
    Flavour {
        file: "libnvrtc.so.13",
        wheel_dir: "nvidia/cu13/lib",
        wheel: "nvidia-cuda-nvrtc",
    },
    Flavour {
        file: "libnvrtc.so.12",
        wheel_dir: "nvidia/cuda_nvrtc/lib",
        wheel: "nvidia-cuda-nvrtc-cu12",
    },
];

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
type NumArchsFn = unsafe extern "C" fn(*mut c_int) -> NvrtcResult;
type ArchsFn = unsafe extern "C" fn(*mut c_int) -> NvrtcResult;

/// The resolved entry points of one loaded libnvrtc (never unloaded: the pointers stay valid
/// for the life of the process).
pub(crate) struct Api {
    pub(crate) path: PathBuf,
    /// Where it was found, for messages (e.g. "the nvidia-cuda-nvrtc-cu12 Python package").
    pub(crate) origin: String,
    pub(crate) version: (i32, i32),
    /// The architectures it compiles for (`nvrtcGetSupportedArchs`; empty if it cannot say).
    pub(crate) archs: Vec<u32>,
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

/// The architectures `lib` compiles for, or empty when it lacks the query (before CUDA 11.2)
/// or the query fails: the choice then tries it for any.
fn supported_archs(lib: &libloading::Library) -> Vec<u32> {
    // SAFETY: both are NVRTC's documented entry points of these names with these C signatures
    // (nvrtc.h since CUDA 11.2); the copies of the pointers are used only while `lib` is alive.
    let (num, get) = unsafe {
        match (
            lib.get::<NumArchsFn>(b"nvrtcGetNumSupportedArchs\0"),
            lib.get::<ArchsFn>(b"nvrtcGetSupportedArchs\0"),
        ) {
            (Ok(n), Ok(g)) => (*n, *g),
            _ => return Vec::new(),
        }
    };
    let mut n: c_int = 0;
    // SAFETY: writes one c_int.
    if unsafe { num(&mut n) } != SUCCESS || !(0..=4096).contains(&n) {
        return Vec::new();
    }
    let mut archs = vec![0 as c_int; n as usize];
    // SAFETY: `archs` holds the `n` ints NVRTC said it would write.
    if unsafe { get(archs.as_mut_ptr()) } != SUCCESS {
        return Vec::new();
    }
    archs
        .into_iter()
        .filter_map(|a| u32::try_from(a).ok())
        .collect()
}

/// Opens one candidate and resolves every entry point.
fn open(c: &Candidate) -> Result<Api, String> {
    let builtins = if c.is_file {
        load_builtins(&c.path)?
    } else {
        None
    };
    // SAFETY: loading libnvrtc runs only its C runtime initialisers; no NVRTC call is made here
    // except nvrtcVersion and the architecture query below, which have no preconditions.
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
        origin: c.origin.clone(),
        version: (major, minor),
        archs: supported_archs(&lib),
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

/// The CUDA toolkits whose `lib64/` is searched: `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`.
fn toolkits() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|v| !v.is_empty()))
        .map(PathBuf::from)
        .collect();
    out.push(PathBuf::from("/usr/local/cuda"));
    out
}

/// Where to look, in order: `env` (`SYMHEAP_NVRTC_LIB`) alone when set (a file, or a folder
/// searched for both majors; a wrong setting is an error, not a fallback); otherwise each
/// major's wheel folder under every Python search directory in `site_dirs`, then
/// `lib64/` of every toolkit, then the loader's own search path, CUDA 13 before 12 in each.
pub(crate) fn candidates(
    env: Option<&OsStr>,
    site_dirs: &[PathBuf],
    toolkits: &[PathBuf],
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut add = |path: PathBuf, origin: String, is_file: bool| {
        if !out.iter().any(|c| c.path == path) {
            out.push(Candidate {
                path,
                origin,
                is_file,
            });
        }
    };
    if let Some(v) = env.filter(|v| !v.is_empty()) {
        let p = Path::new(v);
        if p.is_dir() {
            for f in &FLAVOURS {
                add(p.join(f.file), ENV_LIB.into(), true);
            }
        } else {
            add(p.to_path_buf(), ENV_LIB.into(), true);
        }
        return out;
    }
    for d in site_dirs {
        for f in &FLAVOURS {
            let origin = format!("the {} Python package", f.wheel);
            add(d.join(f.wheel_dir).join(f.file), origin, true);
        }
    }
    for t in toolkits {
        for f in &FLAVOURS {
            let origin = format!("the CUDA toolkit at {}", t.display());
            add(t.join("lib64").join(f.file), origin, true);
        }
    }
    for f in &FLAVOURS {
        add(
            PathBuf::from(f.file),
            "the dynamic loader's search path".into(),
            false,
        );
    }
    out
}

/// Every NVRTC that loaded, and every place that gave none (with why), from one search.
pub(crate) struct Found {
    pub(crate) apis: Vec<Api>,
    pub(crate) tried: Vec<String>,
}

/// Opens every candidate (with `open`; injectable for tests).
pub(crate) fn load_all(
    cands: &[Candidate],
    mut open: impl FnMut(&Candidate) -> Result<Api, String>,
) -> Found {
    let mut found = Found {
        apis: Vec::new(),
        tried: Vec::new(),
    };
    for c in cands {
        if c.is_file && !c.path.is_file() {
            let why = format!("{} ({}): no such file", c.path.display(), c.origin);
            found.tried.push(why);
            continue;
        }
        match open(c) {
            // The loader hands back a library already loaded by path when asked for its name:
            // the same NVRTC, listed once.
            Ok(api)
                if found
                    .apis
                    .iter()
                    .any(|a| a.create_program as usize == api.create_program as usize) => {}
            Ok(api) => found.apis.push(api),
            Err(why) => found
                .tried
                .push(format!("{} ({}): {why}", c.path.display(), c.origin)),
        }
    }
    found
}

/// The message when no NVRTC loaded at all: every place looked, `note` (why Python's path is
/// unknown, if it is), and what to install.
pub(crate) fn none_found(found: &Found, note: Option<&str>) -> String {
    let mut msg = format!(
        "cannot load libnvrtc.so.13 or libnvrtc.so.12; looked in: {}",
        found.tried.join("; ")
    );
    if let Some(n) = note {
        msg.push_str(&format!(" ({n})"));
    }
    msg.push_str(&format!(
        ". Set {ENV_LIB} to the library (or its directory), or `pip install nvidia-cuda-nvrtc` \
         (CUDA 13 drivers) or `pip install nvidia-cuda-nvrtc-cu12` (CUDA 12 drivers), found \
         through the Python search path"
    ));
    msg
}

/// `SYMHEAP_NVRTC`'s major version, `None` when unset, or why its value is not accepted.
pub(crate) fn forced_major(value: Option<&str>) -> Result<Option<i32>, String> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match v {
        "12" => Ok(Some(12)),
        "13" => Ok(Some(13)),
        _ => Err(format!(
            "{ENV_MAJOR}={v:?} is not accepted: expected 12 or 13 (the NVRTC major version to use)"
        )),
    }
}

/// Every NVRTC this process loaded. A search that found none is not remembered: the Python
/// package may give its search path later, and a user may install the wheel and retry.
static LOADED: Mutex<Option<&'static [Api]>> = Mutex::new(None);

/// Every loadable NVRTC, loading them on first use (see the module doc for where they are
/// looked for), or why none loaded.
pub(crate) fn loaded() -> Result<&'static [Api], String> {
    let mut memo = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(apis) = *memo {
        return Ok(apis);
    }
    let env = std::env::var_os(ENV_LIB).filter(|v| !v.is_empty());
    let (dirs, note) = if env.is_some() {
        (Vec::new(), None)
    } else {
        libsearch::python_sys_path()
    };
    let found = load_all(&candidates(env.as_deref(), &dirs, &toolkits()), open);
    if found.apis.is_empty() {
        return Err(none_found(&found, note.as_deref()));
    }
    let apis: &'static [Api] = Box::leak(found.apis.into_boxed_slice());
    *memo = Some(apis);
    Ok(apis)
}

/// The NVRTC to use for `driver` (the CUDA version of the initialised driver, if any) and
/// `arch`, honouring `SYMHEAP_NVRTC` ([`compat::choose`]), or why there is none.
pub(crate) fn api(driver: Option<(i32, i32)>, arch: Option<u32>) -> Result<&'static Api, String> {
    let major = forced_major(std::env::var(ENV_MAJOR).ok().as_deref())?;
    let apis = loaded()?;
    let offers: Vec<Offer<'_>> = apis
        .iter()
        .map(|a| Offer {
            version: a.version,
            archs: &a.archs,
            label: a.path.to_str().unwrap_or("(a path that is not UTF-8)"),
        })
        .collect();
    let need = Need {
        driver,
        arch,
        major,
    };
    compat::choose(&offers, need).map(|i| &apis[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_majors_are_looked_for_in_their_wheels_toolkits_and_the_loader() {
        let site = [PathBuf::from("/site"), PathBuf::from("/user")];
        let c = candidates(None, &site, &[PathBuf::from("/usr/local/cuda")]);
        let paths: Vec<String> = c.iter().map(|c| c.path.display().to_string()).collect();
        assert_eq!(
            paths,
            [
                "/site/nvidia/cu13/lib/libnvrtc.so.13",
                "/site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                "/user/nvidia/cu13/lib/libnvrtc.so.13",
                "/user/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                "/usr/local/cuda/lib64/libnvrtc.so.13",
                "/usr/local/cuda/lib64/libnvrtc.so.12",
                "libnvrtc.so.13",
                "libnvrtc.so.12",
            ]
        );
        assert_eq!(c[1].origin, "the nvidia-cuda-nvrtc-cu12 Python package");
        assert_eq!(c[4].origin, "the CUDA toolkit at /usr/local/cuda");
        assert!(c[..6].iter().all(|c| c.is_file) && !c[6].is_file && !c[7].is_file);
    }

    #[test]
    fn the_variable_alone_is_searched_a_folder_for_both_majors() {
        let site = [PathBuf::from("/site")];
        let c = candidates(Some(OsStr::new("/opt/libnvrtc.so.12")), &site, &[]);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].path.to_str(), c[0].origin.as_str()),
            (Some("/opt/libnvrtc.so.12"), ENV_LIB)
        );
        let dir = std::env::temp_dir();
        let c = candidates(Some(dir.as_os_str()), &site, &[]);
        let names: Vec<PathBuf> = c.iter().map(|c| c.path.clone()).collect();
        assert_eq!(
            names,
            [dir.join("libnvrtc.so.13"), dir.join("libnvrtc.so.12")]
        );
    }

    #[test]
    fn a_missing_nvrtc_names_the_variable_both_wheels_and_the_loader() {
        let c = candidates(Some(OsStr::new("/no/such/dir/libnvrtc.so.13")), &[], &[]);
        let found = load_all(&c, open);
        assert!(found.apis.is_empty());
        let e = none_found(&found, Some("no python3"));
        assert!(
            e.contains("/no/such/dir/libnvrtc.so.13 (SYMHEAP_NVRTC_LIB): no such file"),
            "{e}"
        );
        assert!(e.contains("(no python3)"), "{e}");
        assert!(e.contains("pip install nvidia-cuda-nvrtc`"), "{e}");
        assert!(e.contains("pip install nvidia-cuda-nvrtc-cu12"), "{e}");
        let c = candidates(None, &[PathBuf::from("/nowhere")], &[]);
        let found = load_all(&c, |_| Err("refused".to_string()));
        let e = none_found(&found, None);
        assert!(
            e.contains("/nowhere/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 (the nvidia-cuda-nvrtc-cu12 Python package): no such file"),
            "{e}"
        );
        assert!(
            e.contains("libnvrtc.so.12 (the dynamic loader's search path): refused"),
            "{e}"
        );
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

    #[test]
    fn symheap_nvrtc_takes_a_major_version_or_is_refused() {
        assert_eq!(forced_major(None), Ok(None));
        assert_eq!(forced_major(Some(" ")), Ok(None));
        assert_eq!(forced_major(Some("12")), Ok(Some(12)));
        assert_eq!(forced_major(Some(" 13 ")), Ok(Some(13)));
        let e = forced_major(Some("12.4")).unwrap_err();
        assert!(
            e.contains("SYMHEAP_NVRTC=\"12.4\"") && e.contains("12 or 13"),
            "{e}"
        );
    }
}
