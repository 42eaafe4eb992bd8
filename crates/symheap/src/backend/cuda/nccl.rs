//! NCCL, loaded at run time, as the transport between PEs whose GPUs cannot address each
//! other's memory (other nodes): the C types and entry points symheap uses (from NCCL 2.x's
//! `nccl.h`, stable since 2.9), where the library is looked for, and [`Comm`], a communicator
//! whose calls take device addresses the caller has already checked.
//!
//! Why by hand and not through cudarc's `nccl::sys`: cudarc looks for `libnccl.so` and
//! `libnccl.so.<CUDA major>` only (NCCL's loader name is `libnccl.so.2`, which is all the
//! `nvidia-nccl-cu13` wheel ships), and it panics on a missing symbol. Here the search is the
//! one every library symheap loads goes through (`SYMHEAP_NCCL_LIB`, the wheel, the loader),
//! and a missing library or symbol is an error naming what was tried.
//!
//! Why the library is never unloaded: NCCL starts proxy threads per communicator and keeps
//! process-wide state; unloading its code under them would crash. A process loads it once.
//!
//! Every `unsafe` block of symheap's NCCL use is in this file and says why it holds.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::backend::ReduceOp;
use crate::element::DType;
use crate::util::libsearch::{self, Library};

/// `ncclUniqueId`: 128 opaque bytes (NCCL_UNIQUE_ID_BYTES).
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

/// Size of a unique id on the wire between PEs.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

type RawComm = *mut c_void;
type Res = c_int;
const SUCCESS: Res = 0;
/// `ncclInProgress`: a non-blocking call has not finished (not used by blocking communicators,
/// but `ncclCommGetAsyncError` reports it while an abort completes).
const IN_PROGRESS: Res = 7;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> Res;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> Res;
type CommInitRank = unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> Res;
type CommFn = unsafe extern "C" fn(RawComm) -> Res;
type AsyncError = unsafe extern "C" fn(RawComm, *mut Res) -> Res;
type ErrorString = unsafe extern "C" fn(Res) -> *const c_char;
type AllReduce =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, u64) -> Res;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, u64) -> Res;
type ReduceScatter =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, u64) -> Res;
type Broadcast =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, u64) -> Res;
type Send = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, u64) -> Res;
type Recv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, u64) -> Res;
type Group = unsafe extern "C" fn() -> Res;

/// The loaded library and the entry points symheap uses.
pub(crate) struct Api {
    /// Where it was loaded from (as given to the loader).
    pub(crate) path: PathBuf,
    /// NCCL's version code, e.g. 22803.
    pub(crate) version: i32,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_destroy: CommFn,
    comm_abort: CommFn,
    async_error: AsyncError,
    error_string: ErrorString,
    all_reduce: AllReduce,
    all_gather: AllGather,
    reduce_scatter: ReduceScatter,
    broadcast: Broadcast,
    send: Send,
    recv: Recv,
    group_start: Group,
    group_end: Group,
    _lib: ManuallyDrop<libloading::Library>,
}

/// What is searched for (see [`Library::candidates`] for the order).
pub(crate) const NCCL: Library = Library {
    file: "libnccl.so.2",
    env: "SYMHEAP_NCCL_LIB",
    wheel_dir: "nvidia/nccl/lib",
    wheel: "nvidia-nccl-cu13",
};

/// NCCL's version code as `major.minor.patch`.
pub(crate) fn version_string(code: i32) -> String {
    if code >= 20900 {
        format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100)
    }
}

fn resolve(lib: libloading::Library, path: PathBuf) -> Result<Api, String> {
    // Never closed (see the module documentation).
    let lib = ManuallyDrop::new(lib);
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            // SAFETY: the symbol is declared in NCCL 2.x's nccl.h with exactly the signature
            // `$ty` (enums as int, cudaStream_t as a pointer-sized handle, ncclUniqueId by
            // value as a 128-byte struct). The pointer is copied out of the `Symbol`; it stays
            // valid because the library is never unloaded (`Api` is leaked).
            let s = unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
            *s.map_err(|e| format!("lacks {} ({})", $name, libsearch::with_source(&e)))?
        }};
    }
    let get_version = sym!("ncclGetVersion", GetVersion);
    let mut version = 0;
    // SAFETY: writes one int; callable before any communicator exists.
    let rc = unsafe { get_version(&mut version) };
    if rc != SUCCESS || version < 20900 {
        return Err(format!(
            "reports version {version} (status {rc}); symheap needs NCCL 2.9 or newer"
        ));
    }
    Ok(Api {
        path,
        version,
        get_unique_id: sym!("ncclGetUniqueId", GetUniqueId),
        comm_init_rank: sym!("ncclCommInitRank", CommInitRank),
        comm_destroy: sym!("ncclCommDestroy", CommFn),
        comm_abort: sym!("ncclCommAbort", CommFn),
        async_error: sym!("ncclCommGetAsyncError", AsyncError),
        error_string: sym!("ncclGetErrorString", ErrorString),
        all_reduce: sym!("ncclAllReduce", AllReduce),
        all_gather: sym!("ncclAllGather", AllGather),
        reduce_scatter: sym!("ncclReduceScatter", ReduceScatter),
        broadcast: sym!("ncclBroadcast", Broadcast),
        send: sym!("ncclSend", Send),
        recv: sym!("ncclRecv", Recv),
        group_start: sym!("ncclGroupStart", Group),
        group_end: sym!("ncclGroupEnd", Group),
        _lib: lib,
    })
}

/// Loads NCCL (once per process; later calls return the same library or the same error).
pub(crate) fn load() -> Result<&'static Api, String> {
    static LOADED: Mutex<Option<Result<&'static Api, String>>> = Mutex::new(None);
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = loaded.as_ref() {
        return r.clone();
    }
    let (cands, note) = NCCL.search();
    let r = NCCL
        .load_first(&cands, note.as_deref(), |c| {
            // SAFETY: loading runs NCCL's static initialisers, which set up its own globals
            // only; the file is what the user, the NCCL wheel or the loader names as NCCL.
            let lib = unsafe { libloading::Library::new(&c.path) }
                .map_err(|e| libsearch::with_source(&e))?;
            resolve(lib, c.path.clone())
        })
        .map(|api| &*Box::leak(Box::new(api)));
    *loaded = Some(r.clone());
    r
}

impl Api {
    fn text(&self, rc: Res) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let p = unsafe { (self.error_string)(rc) };
        if p.is_null() {
            return format!("status {rc}");
        }
        // SAFETY: non-null, NUL-terminated and static (above).
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        format!("{s} (status {rc})")
    }

    fn check(&self, rc: Res, what: &str) -> Result<(), String> {
        if rc == SUCCESS {
            Ok(())
        } else {
            Err(format!("{what} failed: {}", self.text(rc)))
        }
    }

    /// A fresh unique id (the communicator's first rank makes it and sends it to the others).
    pub(crate) fn unique_id(&self) -> Result<[u8; UNIQUE_ID_BYTES], String> {
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: writes the 128 bytes of `id`.
        self.check(unsafe { (self.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        Ok(id.internal.map(|c| c as u8))
    }
}

/// NCCL's code for `d`, or None for a type NCCL lacks.
pub(crate) fn dtype(d: DType) -> Option<c_int> {
    Some(match d {
        DType::I8 => 0,
        DType::U8 => 1,
        DType::I32 => 2,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::U64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
        _ => return None,
    })
}

fn redop(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
    }
}

/// A communicator handle that [`Comm`] and its [`Aborter`] share: null once destroyed or
/// aborted, so neither can reach a freed communicator.
type Cell = std::sync::Arc<Mutex<usize>>;

/// A blocking NCCL communicator on this PE's device.
///
/// Its calls take device addresses and a stream handle that the caller has checked (a range of
/// symmetric memory or of this device's memory that holds what the call reads and writes, and a
/// live stream of this device's primary context), with that context current on the thread; that
/// is the contract of every data method below, which symheap's ops layer meets.
pub(crate) struct Comm {
    api: &'static Api,
    cell: Cell,
    /// Ranks in the communicator.
    pub(crate) n: usize,
}

/// Aborts a [`Comm`] from any thread (the job's failure callback): NCCL kernels waiting for a
/// dead peer then return instead of holding the stream forever.
#[derive(Clone)]
pub(crate) struct Aborter {
    api: &'static Api,
    cell: Cell,
}

impl Aborter {
    /// `ncclCommAbort`, once; later calls and the communicator's own calls find it gone.
    pub(crate) fn abort(&self) {
        let raw = std::mem::take(&mut *self.cell.lock().unwrap_or_else(|p| p.into_inner()));
        if raw != 0 {
            // SAFETY: the handle was live (non-null in the cell) and is taken out of it, so it
            // is aborted once and never used again; NCCL allows an abort while another thread
            // is inside a call on the communicator.
            let _ = unsafe { (self.api.comm_abort)(raw as RawComm) };
        }
    }
}

impl Comm {
    /// Collective over the `n` ranks given the same `id`: `ncclCommInitRank`. The device's
    /// context must be current on the calling thread.
    pub(crate) fn init(
        api: &'static Api,
        n: usize,
        me: usize,
        id: &[u8; UNIQUE_ID_BYTES],
    ) -> Result<Comm, String> {
        let uid = UniqueId {
            internal: id.map(|b| b as c_char),
        };
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: writes one communicator handle; `n` and `me` are in range (the caller's
        // rank lists), and every rank passes the same id. NCCL copies the id.
        let rc = unsafe { (api.comm_init_rank)(&mut raw, n as c_int, uid, me as c_int) };
        api.check(rc, "ncclCommInitRank")?;
        Ok(Comm {
            api,
            cell: std::sync::Arc::new(Mutex::new(raw as usize)),
            n,
        })
    }

    /// What aborts this communicator from another thread.
    pub(crate) fn aborter(&self) -> Aborter {
        Aborter {
            api: self.api,
            cell: self.cell.clone(),
        }
    }

    /// The live handle, or why there is none.
    fn raw(&self, what: &str) -> Result<RawComm, String> {
        match *self.cell.lock().unwrap_or_else(|p| p.into_inner()) {
            0 => Err(format!(
                "{what}: the NCCL communicator was aborted (the job failed)"
            )),
            raw => Ok(raw as RawComm),
        }
    }

    /// `ncclAllReduce` of `count` elements from `src` into `dst` (may be equal).
    pub(crate) fn all_reduce(
        &self,
        dst: u64,
        src: u64,
        count: usize,
        d: c_int,
        op: ReduceOp,
        stream: u64,
    ) -> Result<(), String> {
        let raw = self.raw("ncclAllReduce")?;
        // SAFETY: the contract of `Comm`: both ranges hold `count` elements of `d` on this
        // device and stay valid until the stream has run the call.
        let rc = unsafe {
            (self.api.all_reduce)(
                src as *const c_void,
                dst as *mut c_void,
                count,
                d,
                redop(op),
                raw,
                stream,
            )
        };
        self.api.check(rc, "ncclAllReduce")
    }

    /// `ncclAllGather`: `count` elements from `src` on every rank into `dst` (n × count).
    pub(crate) fn all_gather(
        &self,
        dst: u64,
        src: u64,
        count: usize,
        d: c_int,
        stream: u64,
    ) -> Result<(), String> {
        let raw = self.raw("ncclAllGather")?;
        // SAFETY: the contract of `Comm`: `src` holds `count` and `dst` n × `count` elements.
        let rc = unsafe {
            (self.api.all_gather)(
                src as *const c_void,
                dst as *mut c_void,
                count,
                d,
                raw,
                stream,
            )
        };
        self.api.check(rc, "ncclAllGather")
    }

    /// `ncclReduceScatter`: `src` holds n × `count` elements, `dst` gets `count`.
    pub(crate) fn reduce_scatter(
        &self,
        dst: u64,
        src: u64,
        count: usize,
        d: c_int,
        op: ReduceOp,
        stream: u64,
    ) -> Result<(), String> {
        let raw = self.raw("ncclReduceScatter")?;
        // SAFETY: the contract of `Comm`: `src` holds n × `count` and `dst` `count` elements.
        let rc = unsafe {
            (self.api.reduce_scatter)(
                src as *const c_void,
                dst as *mut c_void,
                count,
                d,
                redop(op),
                raw,
                stream,
            )
        };
        self.api.check(rc, "ncclReduceScatter")
    }

    /// `ncclBroadcast` of `count` elements from rank `root`'s `src` into every rank's `dst`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn broadcast(
        &self,
        dst: u64,
        src: u64,
        count: usize,
        d: c_int,
        root: usize,
        stream: u64,
    ) -> Result<(), String> {
        let raw = self.raw("ncclBroadcast")?;
        // SAFETY: the contract of `Comm`: both ranges hold `count` elements (`src` is read on
        // the root only).
        let rc = unsafe {
            (self.api.broadcast)(
                src as *const c_void,
                dst as *mut c_void,
                count,
                d,
                root as c_int,
                raw,
                stream,
            )
        };
        self.api.check(rc, "ncclBroadcast")
    }

    /// Block `j` (`bytes` at `src + j × bytes`) to rank j's `dst + me × bytes`, for every j:
    /// grouped `ncclSend`/`ncclRecv` of bytes (the copy to itself included).
    pub(crate) fn alltoall(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: u64,
    ) -> Result<(), String> {
        let at = |base: u64| move |j: usize| (base + j as u64 * bytes, bytes);
        self.exchange(at(src), at(dst), stream)
    }

    /// One group of `ncclSend`/`ncclRecv` of bytes with every rank j (itself included): the
    /// `(address, bytes)` of `send(j)` to rank j, and from rank j into `recv(j)`. Every pair's
    /// sizes must agree (what rank i sends rank j is what rank j receives from rank i); a
    /// pair of zero bytes moves nothing.
    pub(crate) fn exchange(
        &self,
        send: impl Fn(usize) -> (u64, u64),
        recv: impl Fn(usize) -> (u64, u64),
        stream: u64,
    ) -> Result<(), String> {
        const U8: c_int = 1;
        let raw = self.raw("ncclGroupStart")?;
        // SAFETY: takes no arguments; opens a group this function always closes below.
        let rc = unsafe { (self.api.group_start)() };
        self.api.check(rc, "ncclGroupStart")?;
        let mut first_err = Ok(());
        for j in 0..self.n {
            let ((s, sn), (r, rn)) = (send(j), recv(j));
            // SAFETY: the contract of `Comm`: the caller's ranges hold what they move.
            let rc = unsafe {
                (self.api.send)(s as *const c_void, sn as usize, U8, j as c_int, raw, stream)
            };
            first_err = first_err.and(self.api.check(rc, "ncclSend"));
            // SAFETY: as above.
            let rc = unsafe {
                (self.api.recv)(r as *mut c_void, rn as usize, U8, j as c_int, raw, stream)
            };
            first_err = first_err.and(self.api.check(rc, "ncclRecv"));
        }
        // SAFETY: closes the group opened above.
        let rc = unsafe { (self.api.group_end)() };
        first_err.and(self.api.check(rc, "ncclGroupEnd"))
    }

    /// `ncclSend` of `bytes` bytes at `src` to rank `peer`.
    pub(crate) fn send(
        &self,
        src: u64,
        bytes: u64,
        peer: usize,
        stream: u64,
    ) -> Result<(), String> {
        const U8: c_int = 1;
        let raw = self.raw("ncclSend")?;
        let n = bytes as usize;
        // SAFETY: the contract of `Comm`: `src` holds `bytes` bytes; NCCL checks `peer`.
        let rc =
            unsafe { (self.api.send)(src as *const c_void, n, U8, peer as c_int, raw, stream) };
        self.api.check(rc, "ncclSend")
    }

    /// `ncclRecv` of `bytes` bytes from rank `peer` into `dst`.
    pub(crate) fn recv(
        &self,
        dst: u64,
        bytes: u64,
        peer: usize,
        stream: u64,
    ) -> Result<(), String> {
        const U8: c_int = 1;
        let raw = self.raw("ncclRecv")?;
        let n = bytes as usize;
        // SAFETY: the contract of `Comm`: `dst` holds `bytes` bytes; NCCL checks `peer`.
        let rc = unsafe { (self.api.recv)(dst as *mut c_void, n, U8, peer as c_int, raw, stream) };
        self.api.check(rc, "ncclRecv")
    }

    /// Whether NCCL has recorded an asynchronous error on this communicator (a peer's failure,
    /// a network error): its text.
    pub(crate) fn async_error(&self) -> Option<String> {
        let raw = match self.raw("ncclCommGetAsyncError") {
            Ok(r) => r,
            Err(e) => return Some(e),
        };
        let mut rc: Res = SUCCESS;
        // SAFETY: writes one status; the handle is live (non-null in the cell).
        let q = unsafe { (self.api.async_error)(raw, &mut rc) };
        match (q, rc) {
            (SUCCESS, SUCCESS) | (SUCCESS, IN_PROGRESS) => None,
            (SUCCESS, e) => Some(self.api.text(e)),
            (e, _) => Some(self.api.text(e)),
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let raw = std::mem::take(&mut *self.cell.lock().unwrap_or_else(|p| p.into_inner()));
        if raw != 0 {
            // SAFETY: the handle is live and taken out of the cell, so it is destroyed once
            // and no aborter can reach it; ncclCommDestroy waits for the communicator's work
            // already enqueued, which the context's finalize has completed.
            let _ = unsafe { (self.api.comm_destroy)(raw as RawComm) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_as_nccl_prints_them() {
        assert_eq!(version_string(22803), "2.28.3");
        assert_eq!(version_string(23203), "2.32.3");
        assert_eq!(version_string(2708), "2.7.8");
    }

    #[test]
    fn every_collective_dtype_has_an_nccl_code() {
        for d in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::U32,
            DType::U64,
            DType::F64,
            DType::I8,
            DType::U8,
        ] {
            assert!(dtype(d).is_some(), "{d}");
        }
    }
}
