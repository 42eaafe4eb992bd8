//! The NVSHMEM 3.x host library, loaded at run time: the C types symheap passes to it (mirrored
//! from the NVSHMEM 3.4.5 headers), the entry points it calls, where the library is looked for,
//! and [`Session`], the safe handle on an initialised NVSHMEM.
//!
//! Every `unsafe` block of the NVSHMEM provider is in this file and says why it holds.
//!
//! Why no link-time dependency: NVSHMEM is optional (a pip wheel, `nvidia-nvshmem-cu13`, or a
//! system package). Loading it with `dlopen` keeps symheap buildable and usable without it, and
//! a missing library becomes an error naming every place searched.
//!
//! Why the library is never unloaded: NVSHMEM starts threads and registers exit handlers while
//! initialising; unloading its code under them would crash. A process loads it at most once.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::util::libsearch::{self, Candidate, Library};

#[path = "nvshmem_plan.rs"]
mod plan;
#[path = "nvshmem_sys_rma.rs"]
mod rma;

pub(crate) use plan::{plan, Found, Plan};

/// The host library's file name (the loader name of the 3.x ABI).
pub(crate) const LIB_NAME: &str = "libnvshmem_host.so.3";

/// The environment variable naming the library (a file, or the directory holding it).
pub(crate) const ENV_LIB: &str = "SYMHEAP_NVSHMEM_LIB";

/// `NVSHMEMX_INIT_WITH_UNIQUEID` (host/nvshmemx_api.h, `enum flags`).
pub(crate) const INIT_WITH_UNIQUEID: c_uint = 1 << 3;

/// `UNIQUEID_PADDING` (bootstrap_device_host/nvshmem_uniqueid.h).
const UNIQUEID_PADDING: usize = 124;

/// `NVSHMEM_STATUS_IS_INITIALIZED` (device_host_transport/nvshmem_constants.h): bootstrapped
/// *and* set up on a GPU. `NVSHMEM_STATUS_LIMITED_MPG` and `_FULL_MPG` (3, 4) are above it.
pub(crate) const STATUS_IS_INITIALIZED: c_int = 2;

/// `NVSHMEM_STATUS_LIMITED_MPG`: several PEs share a GPU without MPS. NVSHMEM then refuses
/// (ends the process in) `nvshmem_quiet` and `nvshmem_fence`, and its host atomics to PEs it
/// maps are not implemented (measured with NVSHMEM 3.4.5 on an H200, 2 PEs sharing it).
pub(crate) const STATUS_LIMITED_MPG: c_int = 3;

/// `INIT_ARGS_PADDING` (device_host/nvshmem_types.h).
const INIT_ARGS_PADDING: usize = 96;

/// The struct version word NVSHMEM's initializer macros write: `(1 << 16) + sizeof(T)`.
const fn version_of<T>() -> c_int {
    (1 << 16) + std::mem::size_of::<T>() as c_int
}

/// `nvshmemx_uniqueid_v1` (bootstrap_device_host/nvshmem_uniqueid.h): 128 bytes, align 4.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub(crate) version: c_int,
    pub(crate) internal: [u8; UNIQUEID_PADDING],
}

/// `nvshmemx_uniqueid_args_v1`: 24 bytes, align 8.
#[repr(C)]
pub(crate) struct UniqueIdArgs {
    pub(crate) version: c_int,
    pub(crate) id: *mut UniqueId,
    pub(crate) myrank: c_int,
    pub(crate) nranks: c_int,
}

/// `nvshmemx_init_args_v1` (device_host/nvshmem_types.h): 128 bytes, align 8.
#[repr(C)]
pub(crate) struct InitArgs {
    pub(crate) version: c_int,
    pub(crate) uid_args: UniqueIdArgs,
    pub(crate) content: [u8; INIT_ARGS_PADDING],
}

/// `nvshmemx_init_attr_v1`: 144 bytes, align 8.
#[repr(C)]
pub(crate) struct InitAttr {
    pub(crate) version: c_int,
    pub(crate) mpi_comm: *mut c_void,
    pub(crate) args: InitArgs,
}

/// Size of a unique id on the wire between PEs.
pub(crate) const UNIQUEID_BYTES: usize = std::mem::size_of::<UniqueId>();

impl UniqueId {
    /// `NVSHMEMX_UNIQUEID_INITIALIZER`.
    pub(crate) fn new() -> UniqueId {
        UniqueId {
            version: version_of::<UniqueId>(),
            internal: [0; UNIQUEID_PADDING],
        }
    }

    /// The id as bytes (native layout), for sending to the other PEs.
    pub(crate) fn to_bytes(self) -> [u8; UNIQUEID_BYTES] {
        let mut out = [0u8; UNIQUEID_BYTES];
        out[..4].copy_from_slice(&self.version.to_ne_bytes());
        out[4..].copy_from_slice(&self.internal);
        out
    }

    /// The id PE 0 sent.
    pub(crate) fn from_bytes(b: &[u8; UNIQUEID_BYTES]) -> UniqueId {
        let mut internal = [0u8; UNIQUEID_PADDING];
        internal.copy_from_slice(&b[4..]);
        UniqueId {
            version: c_int::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            internal,
        }
    }
}

impl InitAttr {
    /// `NVSHMEMX_INIT_ATTR_INITIALIZER`.
    pub(crate) fn new() -> InitAttr {
        InitAttr {
            version: version_of::<InitAttr>(),
            mpi_comm: std::ptr::null_mut(),
            args: InitArgs {
                version: version_of::<InitArgs>(),
                uid_args: UniqueIdArgs {
                    version: version_of::<UniqueIdArgs>(),
                    id: std::ptr::null_mut(),
                    myrank: -1,
                    nranks: -1,
                },
                content: [0; INIT_ARGS_PADDING],
            },
        }
    }
}

type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type SetAttrUniqueIdArgs =
    unsafe extern "C" fn(c_int, c_int, *const UniqueId, *mut InitAttr) -> c_int;
type HostlibInitAttr = unsafe extern "C" fn(c_uint, *mut InitAttr) -> c_int;
type VoidFn = unsafe extern "C" fn();
type IntFn = unsafe extern "C" fn() -> c_int;
type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);
type Ptr = unsafe extern "C" fn(*const c_void, c_int) -> *mut c_void;
type VersionInfo = unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int);
/// `nvshmemx_cumodule_init` / `nvshmemx_cumodule_finalize`: (CUmodule) -> status.
type CuModuleFn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `nvshmem_putmem` / `nvshmem_getmem`: (dest, source, bytes, pe).
type Rma = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int);
/// `nvshmemx_putmem_on_stream` / `nvshmemx_getmem_on_stream`: (dest, source, bytes, pe, stream).
type RmaOnStream = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void);
/// `nvshmemx_putmem_signal_on_stream`: (dest, source, bytes, sig_addr, signal, sig_op, pe,
/// stream).
type PutSignalOnStream = unsafe extern "C" fn(
    *mut c_void,
    *const c_void,
    usize,
    *mut u64,
    u64,
    c_int,
    c_int,
    *mut c_void,
);
/// `nvshmemx_signal_op_on_stream`: (sig_addr, signal, sig_op, pe, stream).
type SignalOpOnStream = unsafe extern "C" fn(*mut u64, u64, c_int, c_int, *mut c_void);
/// `nvshmemx_quiet_on_stream`.
type StreamFn = unsafe extern "C" fn(*mut c_void);
/// `nvshmem_int64_atomic_{fetch_add,swap,fetch_and,fetch_or,fetch_xor}`: (dest, value, pe).
type Amo = unsafe extern "C" fn(*mut i64, i64, c_int) -> i64;
/// `nvshmem_int64_atomic_set`: (dest, value, pe).
type AmoSet = unsafe extern "C" fn(*mut i64, i64, c_int);
/// `nvshmem_int64_atomic_fetch`: (source, pe).
type AmoFetch = unsafe extern "C" fn(*const i64, c_int) -> i64;
/// `nvshmem_int64_atomic_compare_swap`: (dest, cond, value, pe).
type AmoCas = unsafe extern "C" fn(*mut i64, i64, i64, c_int) -> i64;

/// `NVSHMEM_SIGNAL_SET` and `NVSHMEM_SIGNAL_ADD` (device_host_transport/
/// nvshmem_common_transport.h).
pub(crate) const SIGNAL_SET: c_int = 9;
pub(crate) const SIGNAL_ADD: c_int = 10;

/// The int64 atomic operations of NVSHMEM's host API that symheap calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Amo64 {
    Fetch,
    Set,
    Swap,
    CompareSwap,
    FetchAdd,
    FetchAnd,
    FetchOr,
    FetchXor,
}

/// The loaded library and the entry points symheap uses.
pub(crate) struct Api {
    /// Where it was loaded from (as given to the loader).
    pub(crate) path: PathBuf,
    /// (major, minor, patch) from `nvshmemx_vendor_get_version_info`.
    pub(crate) version: (i32, i32, i32),
    get_uniqueid: GetUniqueId,
    set_attr_uniqueid_args: SetAttrUniqueIdArgs,
    hostlib_init_attr: HostlibInitAttr,
    hostlib_finalize: VoidFn,
    init_status: IntFn,
    my_pe: IntFn,
    n_pes: IntFn,
    malloc: Malloc,
    free: Free,
    ptr: Ptr,
    barrier_all: VoidFn,
    putmem: Rma,
    getmem: Rma,
    fence: VoidFn,
    quiet: VoidFn,
    putmem_on_stream: RmaOnStream,
    getmem_on_stream: RmaOnStream,
    putmem_signal_on_stream: PutSignalOnStream,
    signal_op_on_stream: SignalOpOnStream,
    quiet_on_stream: StreamFn,
    amo_fetch: AmoFetch,
    amo_set: AmoSet,
    amo_swap: Amo,
    amo_compare_swap: AmoCas,
    amo_fetch_add: Amo,
    amo_fetch_and: Amo,
    amo_fetch_or: Amo,
    amo_fetch_xor: Amo,
    cumodule_init: CuModuleFn,
    cumodule_finalize: CuModuleFn,
    _lib: ManuallyDrop<libloading::Library>,
}

/// A loader error with its cause (libloading's own text is only "dlopen failed").
/// The entry points resolved from `lib`, or which one is missing.
fn resolve(lib: libloading::Library, path: &Path) -> Result<Api, String> {
    // Never closed, even when it turns out unusable: its initialisers have run (NVSHMEM
    // registers exit handlers), so unloading its code could crash at exit.
    let lib = ManuallyDrop::new(lib);
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            // SAFETY: the symbol is declared in NVSHMEM 3.x's host headers with exactly the
            // signature `$ty` (host/nvshmem_api.h, host/nvshmemx_api.h,
            // host/nvshmem_coll_api.h). The function pointer is copied out of the `Symbol`;
            // it stays valid because the library is never unloaded (`Api` is leaked).
            let s = unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
            *s.map_err(|e| {
                format!(
                    "lacks {} ({}); is it NVSHMEM 3.x?",
                    $name,
                    libsearch::with_source(&e)
                )
            })?
        }};
    }
    let version_info = sym!("nvshmemx_vendor_get_version_info", VersionInfo);
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: writes three ints; callable before initialisation (it reports compile-time
    // constants of the library).
    unsafe { version_info(&mut major, &mut minor, &mut patch) };
    if major != 3 {
        return Err(format!(
            "is NVSHMEM {major}.{minor}.{patch}; symheap needs NVSHMEM 3.x (its init structures are versioned)"
        ));
    }
    Ok(Api {
        path: path.to_path_buf(),
        version: (major, minor, patch),
        get_uniqueid: sym!("nvshmemx_get_uniqueid", GetUniqueId),
        set_attr_uniqueid_args: sym!("nvshmemx_set_attr_uniqueid_args", SetAttrUniqueIdArgs),
        hostlib_init_attr: sym!("nvshmemx_hostlib_init_attr", HostlibInitAttr),
        hostlib_finalize: sym!("nvshmemx_hostlib_finalize", VoidFn),
        init_status: sym!("nvshmemx_init_status", IntFn),
        my_pe: sym!("nvshmem_my_pe", IntFn),
        n_pes: sym!("nvshmem_n_pes", IntFn),
        malloc: sym!("nvshmem_malloc", Malloc),
        free: sym!("nvshmem_free", Free),
        ptr: sym!("nvshmem_ptr", Ptr),
        barrier_all: sym!("nvshmem_barrier_all", VoidFn),
        putmem: sym!("nvshmem_putmem", Rma),
        getmem: sym!("nvshmem_getmem", Rma),
        fence: sym!("nvshmem_fence", VoidFn),
        quiet: sym!("nvshmem_quiet", VoidFn),
        putmem_on_stream: sym!("nvshmemx_putmem_on_stream", RmaOnStream),
        getmem_on_stream: sym!("nvshmemx_getmem_on_stream", RmaOnStream),
        putmem_signal_on_stream: sym!("nvshmemx_putmem_signal_on_stream", PutSignalOnStream),
        signal_op_on_stream: sym!("nvshmemx_signal_op_on_stream", SignalOpOnStream),
        quiet_on_stream: sym!("nvshmemx_quiet_on_stream", StreamFn),
        amo_fetch: sym!("nvshmem_int64_atomic_fetch", AmoFetch),
        amo_set: sym!("nvshmem_int64_atomic_set", AmoSet),
        amo_swap: sym!("nvshmem_int64_atomic_swap", Amo),
        amo_compare_swap: sym!("nvshmem_int64_atomic_compare_swap", AmoCas),
        amo_fetch_add: sym!("nvshmem_int64_atomic_fetch_add", Amo),
        amo_fetch_and: sym!("nvshmem_int64_atomic_fetch_and", Amo),
        amo_fetch_or: sym!("nvshmem_int64_atomic_fetch_or", Amo),
        amo_fetch_xor: sym!("nvshmem_int64_atomic_fetch_xor", Amo),
        cumodule_init: sym!("nvshmemx_cumodule_init", CuModuleFn),
        cumodule_finalize: sym!("nvshmemx_cumodule_finalize", CuModuleFn),
        _lib: lib,
    })
}

/// What is searched for (see [`Library::candidates`] for the order).
pub(crate) const NVSHMEM: Library = Library {
    file: LIB_NAME,
    env: ENV_LIB,
    wheel_dir: "nvidia/nvshmem/lib",
    wheel: "nvidia-nvshmem-cu13",
};

/// The library this process loaded (never unloaded).
static LOADED: Mutex<Option<&'static Api>> = Mutex::new(None);

/// Loads the first loadable candidate. On failure the message names every candidate and why
/// it was not used; `note` (e.g. why there were no Python directories) is appended.
pub(crate) fn load(cands: &[Candidate], note: Option<&str>) -> Result<&'static Api, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(api) = *loaded {
        // One NVSHMEM per process: a request for another file is an error, not a second copy.
        let wants_other = cands.len() == 1
            && cands[0].is_file
            && std::fs::canonicalize(&cands[0].path).ok() != std::fs::canonicalize(&api.path).ok();
        if wants_other {
            return Err(format!(
                "this process already loaded NVSHMEM from {}; it cannot load a second copy from {}",
                api.path.display(),
                cands[0].path.display()
            ));
        }
        return Ok(api);
    }
    if let Some(api) = already_loaded() {
        // Another library of this process (torch's NVSHMEM backend, DeepEP, nvshmem4py) loaded
        // NVSHMEM: its copy is the one whose state (initialised or not) matters, and a second
        // copy would be a second, separate NVSHMEM.
        let api: &'static Api = Box::leak(Box::new(api));
        *loaded = Some(api);
        return Ok(api);
    }
    let api = NVSHMEM.load_first(cands, note, |c| {
        // SAFETY: loading runs the library's static initialisers, which only set up NVSHMEM's
        // own globals (no NVSHMEM call is made until `Session::init`). The file is what the
        // user or the NVSHMEM wheel names as NVSHMEM's host library.
        let lib =
            unsafe { libloading::Library::new(&c.path) }.map_err(|e| libsearch::with_source(&e))?;
        resolve(lib, &c.path)
    })?;
    let api: &'static Api = Box::leak(Box::new(api));
    *loaded = Some(api);
    Ok(api)
}

/// The NVSHMEM host library another part of this process already loaded, if any (found by its
/// loader name, without loading anything).
fn already_loaded() -> Option<Api> {
    let flags = libc::RTLD_NOW | libc::RTLD_NOLOAD;
    // SAFETY: RTLD_NOLOAD only looks the name up among the libraries already loaded; no code
    // of a new library runs. A copy found this way has run its initialisers already.
    let lib = unsafe { libloading::os::unix::Library::open(Some(LIB_NAME), flags) }.ok()?;
    // The file the loader resolved the name to: what lies beside it (the device library, the
    // headers) is found from it; a name alone would be looked for in the working directory.
    let path = file_of(&lib, b"nvshmem_my_pe\0")
        .unwrap_or_else(|| PathBuf::from(format!("{LIB_NAME} (already loaded in this process)")));
    match resolve(lib.into(), &path) {
        Ok(api) => Some(api),
        Err(why) => {
            tracing::debug!("the {LIB_NAME} already loaded is not usable: {why}");
            None
        }
    }
}

/// The file `lib` was loaded from, found through the address of its `symbol` (`dladdr`), or
/// None when the loader cannot say.
fn file_of(lib: &libloading::os::unix::Library, symbol: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: the symbol is taken as an address only, never read or called through.
    let sym = unsafe { lib.get::<*const c_void>(symbol) }.ok()?;
    let addr = sym.into_raw() as *const c_void;
    // SAFETY: `Dl_info` is plain data (pointers and an address); all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and writes `info`, a valid out-pointer.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a NUL-terminated string the loader owns for as long as the
    // library stays loaded (it is never unloaded: `resolve` keeps it); it is copied at once.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.is_absolute().then_some(path)
}

/// Whether this process has an initialised NVSHMEM (NVSHMEM is a per-process singleton).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// PE 0's side of the unique-id exchange: a fresh id (needs no initialisation).
pub(crate) fn unique_id(api: &'static Api) -> Result<[u8; UNIQUEID_BYTES], String> {
    let mut id = UniqueId::new();
    // SAFETY: `id` is an initialised `nvshmemx_uniqueid_t` (version set as the header's
    // initializer does); NVSHMEM writes at most its 128 bytes.
    let rc = unsafe { (api.get_uniqueid)(&mut id) };
    if rc != 0 {
        return Err(format!(
            "nvshmemx_get_uniqueid failed with status {rc} (no usable network interface for NVSHMEM's bootstrap? set NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME)"
        ));
    }
    Ok(id.to_bytes())
}

/// An initialised NVSHMEM: the only way to call NVSHMEM's data-path entry points, so none of
/// them can run before initialisation or after finalisation. Every call is collective except
/// `ptr`, `my_pe` and `n_pes`; NVSHMEM itself never times out, so callers make every PE agree
/// (through symheap's ledger-checked collective points) before each collective call.
///
/// Dropping a `Session` without [`finalize`](Self::finalize) leaves NVSHMEM initialised (its
/// finalisation is a collective barrier, which a destructor must not start on its own).
pub(crate) struct Session {
    api: &'static Api,
    n: usize,
    /// Pointers returned by `malloc` and not yet freed, with their sizes: `free` accepts only
    /// these, and every data-path call checks its ranges against them.
    live: BTreeMap<u64, u64>,
    /// NVSHMEM runs in its limited multiple-PEs-per-GPU mode (see [`STATUS_LIMITED_MPG`]).
    limited_mpg: bool,
    /// Whether this Session initialised NVSHMEM (and so finalises it), or attached to one
    /// another library initialised (whose finalisation is that library's).
    owned: bool,
}

/// Whether `[p, p + len)` lies inside one of `live`'s `(base, size)` ranges.
fn covers(live: &BTreeMap<u64, u64>, p: u64, len: u64) -> bool {
    live.range(..=p).next_back().is_some_and(|(&base, &size)| {
        p.checked_add(len)
            .is_some_and(|end| base.checked_add(size).is_some_and(|lim| end <= lim))
    })
}

/// A stream handle checked for this context's device (`Inner::stream_handle`), the only way
/// a raw handle reaches NVSHMEM's `*_on_stream` calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckedStream(u64);

impl CheckedStream {
    /// `stream`, once the context has checked it belongs to its device.
    pub(crate) fn new(
        inner: &crate::context::Inner,
        stream: &crate::Stream,
        call: &'static str,
    ) -> crate::Result<CheckedStream> {
        inner.stream_handle(stream, call).map(CheckedStream)
    }

    /// The handle, for symheap's own stream operations.
    pub(crate) fn raw(self) -> u64 {
        self.0
    }
}

impl Session {
    /// Collective over every PE (the `nranks` PEs given the same `uid`): `nvshmemx_hostlib_init_attr`
    /// with the unique id. The CUDA device to use must be current on the calling thread.
    pub(crate) fn init(
        api: &'static Api,
        rank: usize,
        nranks: usize,
        uid: &[u8; UNIQUEID_BYTES],
    ) -> Result<Session, String> {
        if ACTIVE.swap(true, Ordering::AcqRel) {
            return Err(
                "NVSHMEM is already initialised in this process (one Nvshmem provider per process)"
                    .into(),
            );
        }
        let fail = |m: String| {
            ACTIVE.store(false, Ordering::Release);
            m
        };
        let (Ok(rank_c), Ok(n_c)) = (c_int::try_from(rank), c_int::try_from(nranks)) else {
            return Err(fail(format!("{nranks} PEs do not fit NVSHMEM's int ranks")));
        };
        let id = UniqueId::from_bytes(uid);
        let mut attr = InitAttr::new();
        // SAFETY: `id` and `attr` are initialised as the header's initializer macros do;
        // NVSHMEM stores a pointer to `id` in `attr`, and both outlive the init call below,
        // the only user of that pointer.
        let rc = unsafe { (api.set_attr_uniqueid_args)(rank_c, n_c, &id, &mut attr) };
        if rc != 0 {
            return Err(fail(format!(
                "nvshmemx_set_attr_uniqueid_args failed with status {rc}"
            )));
        }
        // SAFETY: `attr` was filled in by `nvshmemx_set_attr_uniqueid_args` and points at `id`,
        // both alive for the call; ACTIVE guarantees no other initialised NVSHMEM in this
        // process.
        let rc = unsafe { (api.hostlib_init_attr)(INIT_WITH_UNIQUEID, &mut attr) };
        if rc != 0 {
            return Err(fail(format!(
                "nvshmemx_hostlib_init_attr failed with status {rc} (NVSHMEM_DEBUG=WARN shows why)"
            )));
        }
        let mut s = Session {
            api,
            n: nranks,
            live: BTreeMap::new(),
            limited_mpg: false,
            owned: true,
        };
        // Without a usable current CUDA context, NVSHMEM only bootstraps and defers its GPU
        // setup to the first allocation, which then calls exit() if it fails. Checking here
        // turns that into an error. (NVSHMEM stays bootstrapped: see `Session`.)
        // SAFETY: reads NVSHMEM's state; valid at any time after loading.
        let status = unsafe { (api.init_status)() };
        if status < STATUS_IS_INITIALIZED {
            return Err(format!(
                "NVSHMEM bootstrapped but did not set up on the GPU (nvshmemx_init_status = {status}): no usable CUDA device or driver for NVSHMEM? (NVSHMEM_DEBUG=WARN shows why)"
            ));
        }
        s.limited_mpg = status == STATUS_LIMITED_MPG;
        let (me, n) = (s.my_pe(), s.n_pes());
        if me != rank as i64 || n != nranks as i64 {
            // Leave it initialised: finalising alone would wait for PEs that may not come.
            return Err(format!(
                "NVSHMEM started as PE {me} of {n}, but this is PE {rank} of {nranks}"
            ));
        }
        Ok(s)
    }

    /// Not collective: a Session on the NVSHMEM another library of this process initialised
    /// (see [`plan`]), which must be PE `rank` of `nranks` and set up on a GPU. Its
    /// [`finalize`](Self::finalize) frees this Session's allocations and leaves NVSHMEM up.
    pub(crate) fn attach(api: &'static Api, rank: usize, nranks: usize) -> Result<Session, String> {
        if ACTIVE.swap(true, Ordering::AcqRel) {
            return Err(
                "symheap's NVSHMEM provider is already open in this process (one per process)"
                    .into(),
            );
        }
        let found = Found::probe(api);
        if found.status < STATUS_IS_INITIALIZED
            || found.my_pe != rank as i64
            || found.n_pes != nranks as i64
        {
            ACTIVE.store(false, Ordering::Release);
            return Err(format!(
                "NVSHMEM changed while symheap attached to it: now status {}, PE {} of {} (symheap's PE {rank} of {nranks})",
                found.status, found.my_pe, found.n_pes
            ));
        }
        Ok(Session {
            api,
            n: nranks,
            live: BTreeMap::new(),
            limited_mpg: found.status == STATUS_LIMITED_MPG,
            owned: false,
        })
    }

    /// Whether NVSHMEM runs in its limited multiple-PEs-per-GPU mode.
    pub(crate) fn limited_mpg(&self) -> bool {
        self.limited_mpg
    }

    /// `nvshmem_my_pe()`.
    pub(crate) fn my_pe(&self) -> i64 {
        // SAFETY: NVSHMEM is initialised while a Session exists; the call only reads state.
        i64::from(unsafe { (self.api.my_pe)() })
    }

    /// `nvshmem_n_pes()`.
    pub(crate) fn n_pes(&self) -> i64 {
        // SAFETY: as in `my_pe`.
        i64::from(unsafe { (self.api.n_pes)() })
    }

    /// Collective: `nvshmem_malloc(bytes)`; None when NVSHMEM returns NULL.
    pub(crate) fn malloc(&mut self, bytes: u64) -> Option<u64> {
        let size = usize::try_from(bytes).ok()?;
        // SAFETY: NVSHMEM is initialised; the caller has made every PE reach this call with
        // the same size (it is collective).
        let p = unsafe { (self.api.malloc)(size) } as u64;
        (p != 0).then(|| {
            self.live.insert(p, bytes);
            p
        })
    }

    /// Collective: `nvshmem_free(p)`. False (and nothing called) when `p` is not a live
    /// pointer from `malloc`.
    pub(crate) fn free(&mut self, p: u64) -> bool {
        if self.live.remove(&p).is_none() {
            return false;
        }
        // SAFETY: `p` came from `nvshmem_malloc` and was not freed yet (the live set); every PE
        // frees the same allocation at the same point (the caller's collective check).
        unsafe { (self.api.free)(p as *mut c_void) };
        true
    }

    /// `nvshmem_ptr(p, pe)`: PE `pe`'s copy of live allocation `p` as this process addresses
    /// it, 0 when not load/store-reachable (or `p` is not live, or `pe` is out of range).
    pub(crate) fn ptr(&self, p: u64, pe: usize) -> u64 {
        if pe >= self.n || !self.live.contains_key(&p) {
            return 0;
        }
        // SAFETY: `p` is a live symmetric address and `pe` a valid PE; the call only reads
        // NVSHMEM's peer mapping table.
        unsafe { (self.api.ptr)(p as *const c_void, pe as c_int) as u64 }
    }

    /// Collective: `nvshmem_barrier_all()` (also completes this PE's NVSHMEM operations).
    pub(crate) fn barrier_all(&self) {
        // SAFETY: NVSHMEM is initialised; every PE reaches this call (the caller's collective
        // check), so it returns.
        unsafe { (self.api.barrier_all)() }
    }

    /// Whether `[p, p + len)` lies inside one live allocation: a symmetric address, which
    /// NVSHMEM translates for every PE (its data-path calls take no other remote address).
    pub(crate) fn covers(&self, p: u64, len: u64) -> bool {
        covers(&self.live, p, len)
    }

    /// `nvshmemx_cumodule_init` (`init`) or `nvshmemx_cumodule_finalize`: sets up, or releases,
    /// NVSHMEM's device state in `module`, a CUDA module whose code was linked with NVSHMEM's
    /// device library (`libnvshmem_device`). A kernel of such a module calling NVSHMEM's
    /// device API before `init` reads uninitialised state.
    ///
    /// # Safety
    /// `module` is a live `CUmodule` of the current CUDA context (loaded, not yet unloaded).
    pub(crate) unsafe fn cumodule(&self, module: u64, init: bool) -> Result<(), String> {
        if module == 0 {
            return Err("the module handle is 0 (no CUmodule)".into());
        }
        let (f, name) = if init {
            (self.api.cumodule_init, "nvshmemx_cumodule_init")
        } else {
            (self.api.cumodule_finalize, "nvshmemx_cumodule_finalize")
        };
        // SAFETY: NVSHMEM is initialised (this Session); `module` is a live CUmodule of the
        // current context (the caller's contract). NVSHMEM looks its device-state symbols up
        // in the module and copies its state there, or reports that they are missing.
        let rc = unsafe { f(module as *mut c_void) };
        if rc != 0 {
            return Err(format!(
                "{name} failed with status {rc} (a module whose code was not device-linked with \
                 libnvshmem_device: nvcc -rdc=true, then nvcc -dlink with the library)"
            ));
        }
        Ok(())
    }

    /// Collective: `nvshmemx_hostlib_finalize()`, which frees every NVSHMEM allocation; on an
    /// attached Session (see [`attach`](Self::attach)) only `nvshmem_free` of this Session's
    /// allocations, NVSHMEM staying up for the library that initialised it.
    pub(crate) fn finalize(mut self) {
        if self.owned {
            // SAFETY: NVSHMEM is initialised (this Session) and is not used after this call
            // (the Session is consumed); every PE reaches it (the caller's collective check).
            unsafe { (self.api.hostlib_finalize)() };
        } else {
            // Every PE frees the same allocations in the same (address) order: NVSHMEM's
            // symmetric heap gives each allocation the same offset on every PE.
            let live: Vec<u64> = self.live.keys().copied().collect();
            for p in live {
                self.free(p);
            }
        }
        ACTIVE.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::mem::{align_of, offset_of, size_of};

    /// A library found already loaded is named by its file, not by its loader name: the device
    /// library beside NVSHMEM's host library is looked for from that file (it was looked for
    /// in the working directory before, which the GPU suite caught with torch's NVSHMEM loaded).
    #[test]
    fn an_already_loaded_library_is_named_by_its_file() {
        let flags = libc::RTLD_NOW | libc::RTLD_NOLOAD;
        // SAFETY: RTLD_NOLOAD of the C library this test runs on: nothing new is loaded.
        let lib = unsafe { libloading::os::unix::Library::open(Some("libc.so.6"), flags) }
            .expect("libc.so.6 is loaded in every test process");
        let path = file_of(&lib, b"malloc\0").expect("dladdr names malloc's file");
        assert!(path.is_absolute() && path.exists(), "{}", path.display());
        let name = path.file_name().and_then(OsStr::to_str).unwrap_or("");
        assert!(name.starts_with("libc"), "{}", path.display());
        assert!(file_of(&lib, b"no_such_symbol_here\0").is_none());
    }

    /// Sizes, alignments and offsets as a C++ compiler lays out the NVSHMEM 3.4.5 headers
    /// (a probe program compiled with g++ against `include/device_host/nvshmem_types.h`
    /// printed them; the headers' own static_asserts pin the sizes to 128, 24, 128 and 144).
    #[test]
    fn layouts_match_the_nvshmem_3_4_5_headers() {
        assert_eq!((size_of::<UniqueId>(), align_of::<UniqueId>()), (128, 4));
        assert_eq!(offset_of!(UniqueId, internal), 4);
        assert_eq!(
            (size_of::<UniqueIdArgs>(), align_of::<UniqueIdArgs>()),
            (24, 8)
        );
        assert_eq!(offset_of!(UniqueIdArgs, id), 8);
        assert_eq!(offset_of!(UniqueIdArgs, myrank), 16);
        assert_eq!(offset_of!(UniqueIdArgs, nranks), 20);
        assert_eq!((size_of::<InitArgs>(), align_of::<InitArgs>()), (128, 8));
        assert_eq!(offset_of!(InitArgs, uid_args), 8);
        assert_eq!(offset_of!(InitArgs, content), 32);
        assert_eq!((size_of::<InitAttr>(), align_of::<InitAttr>()), (144, 8));
        assert_eq!(offset_of!(InitAttr, mpi_comm), 8);
        assert_eq!(offset_of!(InitAttr, args), 16);
        // The initializers' version words.
        let a = InitAttr::new();
        assert_eq!(a.version, (1 << 16) + 144);
        assert_eq!(a.args.version, (1 << 16) + 128);
        assert_eq!(a.args.uid_args.version, (1 << 16) + 24);
        assert_eq!((a.args.uid_args.myrank, a.args.uid_args.nranks), (-1, -1));
        assert_eq!(UniqueId::new().version, (1 << 16) + 128);
        assert_eq!(INIT_WITH_UNIQUEID, 8);
    }

    #[test]
    fn covers_only_ranges_inside_one_live_allocation() {
        let live: BTreeMap<u64, u64> = [(0x1000, 0x100), (0x1100, 0x40), (u64::MAX - 8, 8)]
            .into_iter()
            .collect();
        assert!(covers(&live, 0x1000, 0x100));
        assert!(covers(&live, 0x10f8, 8));
        assert!(covers(&live, 0x1100, 0x40));
        assert!(covers(&live, 0x1050, 0));
        // Across the boundary of two adjacent allocations: not one allocation.
        assert!(!covers(&live, 0x10f8, 16));
        assert!(!covers(&live, 0x1000, 0x101));
        assert!(!covers(&live, 0xfff, 1));
        assert!(!covers(&live, 0x1140, 1));
        // Lengths that overflow the address space.
        assert!(!covers(&live, 0x1000, u64::MAX));
        assert!(covers(&live, u64::MAX - 8, 8));
        assert!(!covers(&live, u64::MAX - 8, 9));
        assert!(!covers(&BTreeMap::new(), 0x1000, 1));
    }

    #[test]
    fn unique_id_round_trips_through_bytes() {
        let mut id = UniqueId::new();
        for (i, b) in id.internal.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let back = UniqueId::from_bytes(&id.to_bytes());
        assert_eq!(back.version, id.version);
        assert_eq!(back.internal, id.internal);
    }

    #[test]
    fn search_order() {
        let site = [PathBuf::from("/a/site"), PathBuf::from("/b/dist")];
        // Explicit path: alone.
        let c = NVSHMEM.candidates(
            Some(Path::new("/x/lib.so")),
            Some(OsStr::new("/env")),
            &site,
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].path, PathBuf::from("/x/lib.so"));
        // The environment variable: alone.
        let c = NVSHMEM.candidates(None, Some(OsStr::new("/env/libn.so")), &site);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].origin, ENV_LIB);
        // Otherwise every Python directory, then the loader.
        let c = NVSHMEM.candidates(None, Some(OsStr::new("")), &site);
        let paths: Vec<_> = c.iter().map(|c| c.path.clone()).collect();
        assert_eq!(
            paths,
            vec![
                PathBuf::from("/a/site/nvidia/nvshmem/lib/libnvshmem_host.so.3"),
                PathBuf::from("/b/dist/nvidia/nvshmem/lib/libnvshmem_host.so.3"),
                PathBuf::from(LIB_NAME),
            ]
        );
        assert!(!c[2].is_file);
    }

    #[test]
    fn a_missing_library_names_every_place_searched() {
        let site = [PathBuf::from("/nonexistent/site-packages")];
        let mut c = NVSHMEM.candidates(None, None, &site);
        // Not the loader's search here: this machine may have NVSHMEM installed.
        c.pop();
        c.push(Candidate {
            path: PathBuf::from("/nonexistent/explicit/libnvshmem_host.so.3"),
            origin: "the path given".into(),
            is_file: true,
        });
        let e = match load(&c, Some("a note")) {
            Err(e) => e,
            Ok(_) => panic!("loaded a nonexistent library"),
        };
        assert!(
            e.contains("/nonexistent/site-packages/nvidia/nvshmem/lib/libnvshmem_host.so.3"),
            "{e}"
        );
        assert!(e.contains("/nonexistent/explicit"), "{e}");
        assert!(e.contains(ENV_LIB) && e.contains("a note"), "{e}");
    }
}
