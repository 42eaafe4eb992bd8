//! A thin safe layer over the CUDA driver API (cudarc's raw `sys` bindings, loaded at run time):
//! devices and the primary context, virtual memory management with POSIX file-descriptor
//! handles, copies, modules, launches, streams and events. Every call returns `Result`, and
//! every `unsafe` block says what makes it sound.

use std::ffi::{c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};

use crate::error::{backend, err, ErrorKind, Result};

pub(crate) mod measure;
mod objects;
pub(crate) use objects::{
    ctx_synchronize, stream_after, stream_wait, DoneEvent, EventPool, MappedHost, PooledEvent,
};

/// What a release call (destroy, free, unload, at Drop or teardown) returned: nothing can be
/// done about a failure there, but it is logged (`SYMHEAP_LOG=symheap=debug`), since it
/// usually means the object's context went first, which the drop order here is meant to rule
/// out (the self-test's GPU runs fail on such a line).
pub(crate) fn released(r: CUresult, what: &str) {
    if r != CUresult::CUDA_SUCCESS {
        tracing::debug!("{what} at release: {r:?}");
    }
}

/// A driver call failed: the call and the driver's own error name and text.
pub(crate) fn check(r: CUresult, what: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls only write a pointer to a static string owned by the driver (or leave
    // it null on failure), which outlives this function.
    unsafe {
        let _ = sys::cuGetErrorName(r, &mut name);
        let _ = sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null pointers from cuGetError* are NUL-terminated static strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    Err(backend(
        "cuda",
        format!("{what} failed: {} ({:?}) {}", s(name), r, s(text)),
    ))
}

/// The outcome of the one driver initialisation: the driver's CUDA version or why it failed.
static INIT: OnceLock<std::result::Result<i32, String>> = OnceLock::new();

/// The driver's CUDA version (e.g. 12040) when this process has initialised the driver, without
/// initialising it: NVRTC's choice asks it, and must not load libcuda in `symheap kernels`.
pub(crate) fn initialized_version() -> Option<i32> {
    INIT.get().and_then(|r| r.as_ref().ok().copied())
}

/// Loads libcuda and initialises the driver once. Returns the driver's CUDA version
/// (e.g. 13000).
pub(crate) fn init() -> Result<i32> {
    INIT.get_or_init(|| {
        // SAFETY: probing the library has no side effect beyond loading it.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcuda.so (the NVIDIA driver) was not found".into());
        }
        // cudarc resolves each symbol on first use and panics if one is missing (an older
        // driver); turn that into an error instead of letting a panic cross our API.
        std::panic::catch_unwind(|| -> std::result::Result<i32, String> {
            // SAFETY: cuInit(0) is the documented first call and may be repeated.
            check(unsafe { sys::cuInit(0) }, "cuInit").map_err(|e| e.to_string())?;
            let mut v = 0;
            check(
                // SAFETY: writes one int.
                unsafe { sys::cuDriverGetVersion(&mut v) },
                "cuDriverGetVersion",
            )
            .map_err(|e| e.to_string())?;
            Ok(v)
        })
        .unwrap_or_else(|_| {
            Err("the CUDA driver lacks a required function (driver too old?)".into())
        })
    })
    .clone()
    .map_err(|m| err("init", ErrorKind::Unsupported(format!("CUDA: {m}"))))
}

/// Number of visible devices.
pub(crate) fn device_count() -> Result<usize> {
    init()?;
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// A device with its retained primary context (shared with the CUDA runtime and PyTorch).
pub(crate) struct Device {
    pub ordinal: usize,
    ctx: Ctx,
    pub name: String,
    pub cc: (i32, i32),
    pub uuid: [u8; 16],
    pub sm_count: i32,
    /// The retain of `ctx`, shared with the objects of this context that can outlive the
    /// device value (pooled events, mapped host memory): the context is released only when
    /// the last of them is gone, so none is destroyed, freed or written after it.
    hold: Arc<ContextHold>,
}

/// One retain of a device's primary context, released when dropped. In a process where
/// nothing else (the CUDA runtime, PyTorch) retains it, the release destroys the context and
/// with it every event, module and pinned block made in it: whatever still holds one of those
/// holds this too.
pub(crate) struct ContextHold {
    dev: sys::CUdevice,
}

impl Drop for ContextHold {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Device::open`, once (the hold is made there only).
        released(
            unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) },
            "cuDevicePrimaryCtxRelease",
        );
    }
}

#[derive(Clone, Copy)]
struct Ctx(sys::CUcontext);
// SAFETY: a CUcontext handle may be made current on any thread; the driver synchronises access.
unsafe impl Send for Ctx {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Ctx {}

impl Device {
    /// Opens device `ordinal` and retains its primary context.
    pub(crate) fn open(ordinal: usize) -> Result<Device> {
        init()?;
        let mut dev = 0;
        check(
            // SAFETY: writes one device handle; the ordinal is checked by the driver.
            unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) },
            "cuDeviceGet",
        )?;
        let mut ctx = std::ptr::null_mut();
        check(
            // SAFETY: writes one context handle for a valid device; released by `hold`.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let hold = Arc::new(ContextHold { dev });
        // SAFETY: the context was just retained; making it current lets the queries below run.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            check(
                // SAFETY: writes one int for a valid device and attribute.
                unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) },
                "cuDeviceGetAttribute",
            )?;
            Ok(v)
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut name = [0 as std::ffi::c_char; 256];
        check(
            // SAFETY: the driver writes at most `len` bytes, NUL-terminated.
            unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev) },
            "cuDeviceGetName",
        )?;
        // SAFETY: `name` is NUL-terminated (the driver terminates it; the buffer started zeroed).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut uuid: sys::CUuuid = sys::CUuuid { bytes: [0; 16] };
        check(
            // SAFETY: writes one 16-byte uuid.
            unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, dev) },
            "cuDeviceGetUuid",
        )?;
        Ok(Device {
            ordinal,
            ctx: Ctx(ctx),
            name,
            cc: (major, minor),
            uuid: uuid.bytes.map(|b| b as u8),
            sm_count,
            hold,
        })
    }

    /// A share of the context's retain, for an object of this context that may outlive the
    /// device value (see [`ContextHold`]).
    pub(crate) fn hold(&self) -> Arc<ContextHold> {
        Arc::clone(&self.hold)
    }

    /// The primary context's handle (what `stream_context` returns for this device's streams).
    pub(crate) fn context_handle(&self) -> u64 {
        self.ctx.0 as u64
    }

    /// Makes the primary context current on the calling thread (cheap when it already is).
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: the context was retained in `open` and stays valid until Drop.
        check(
            unsafe { sys::cuCtxSetCurrent(self.ctx.0) },
            "cuCtxSetCurrent",
        )
    }

    fn prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero is a valid value;
        // the fields that matter are set below.
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = self.ordinal as i32;
        p
    }

    /// The VMM allocation granularity for exportable memory on this device.
    pub(crate) fn granularity(&self) -> Result<u64> {
        let p = self.prop();
        let mut g = 0usize;
        check(
            // SAFETY: `p` is a fully initialised property struct; writes one size.
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut g,
                    &p,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            },
            "cuMemGetAllocationGranularity",
        )?;
        Ok(g as u64)
    }

    /// Creates `size` bytes of exportable physical memory on this device.
    pub(crate) fn create(&self, size: u64) -> Result<u64> {
        let p = self.prop();
        let mut h = 0;
        check(
            // SAFETY: `p` is valid; writes one handle, which the caller releases.
            unsafe { sys::cuMemCreate(&mut h, size as usize, &p, 0) },
            "cuMemCreate",
        )?;
        Ok(h)
    }

    /// Grants this device read-write access to a mapped range.
    pub(crate) fn set_access(&self, addr: u64, size: u64) -> Result<()> {
        // SAFETY: as in `prop`, a zeroed descriptor is valid before its fields are set.
        let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = self.ordinal as i32;
        d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the range is mapped by the caller; one descriptor is passed.
        check(
            unsafe { sys::cuMemSetAccess(addr, size as usize, &d, 1) },
            "cuMemSetAccess",
        )
    }
}

/// Reserves `size` bytes of device virtual address space.
pub(crate) fn reserve(size: u64, align: u64) -> Result<u64> {
    let mut p = 0;
    check(
        // SAFETY: writes one address; freed by `release_reservation`.
        unsafe { sys::cuMemAddressReserve(&mut p, size as usize, align as usize, 0, 0) },
        "cuMemAddressReserve",
    )?;
    Ok(p)
}

/// Frees a reservation made by `reserve` (everything in it must be unmapped).
pub(crate) fn release_reservation(addr: u64, size: u64) {
    // SAFETY: the caller passes a range returned by `reserve`, after unmapping its contents.
    released(
        unsafe { sys::cuMemAddressFree(addr, size as usize) },
        "cuMemAddressFree",
    );
}

/// Exports a physical allocation as a POSIX file descriptor.
pub(crate) fn export_fd(handle: u64) -> Result<OwnedFd> {
    let mut fd: std::ffi::c_int = -1;
    check(
        // SAFETY: for POSIX handles the driver writes an int file descriptor through the pointer.
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast::<c_void>(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemExportToShareableHandle",
    )?;
    if fd < 0 {
        return Err(backend(
            "cuda",
            "cuMemExportToShareableHandle returned no descriptor",
        ));
    }
    // SAFETY: the driver created this descriptor for us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Imports a physical allocation from a descriptor exported by another process.
pub(crate) fn import_fd(fd: &OwnedFd) -> Result<u64> {
    let mut h = 0;
    check(
        // SAFETY: for POSIX handles the descriptor is passed by value in the pointer argument; the
        // driver does not take ownership of it. Writes one handle, released by the caller.
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        },
        "cuMemImportFromShareableHandle",
    )?;
    Ok(h)
}

/// Maps physical allocation `handle` at `addr` (inside a reservation).
pub(crate) fn map(addr: u64, size: u64, handle: u64) -> Result<()> {
    // SAFETY: `addr..addr+size` lies in a reservation of ours and is not mapped yet.
    check(
        unsafe { sys::cuMemMap(addr, size as usize, 0, handle, 0) },
        "cuMemMap",
    )
}

/// Unmaps a range mapped by `map`.
pub(crate) fn unmap(addr: u64, size: u64) {
    // SAFETY: the caller passes a range it mapped and no longer uses.
    released(
        unsafe { sys::cuMemUnmap(addr, size as usize) },
        "cuMemUnmap",
    );
}

/// Releases a physical allocation handle (memory goes once every mapping is gone).
pub(crate) fn release(handle: u64) {
    // SAFETY: the caller owns the handle and releases it once.
    released(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease");
}

/// Host-to-device copy on `stream`, complete when this returns. On a non-blocking stream it
/// waits for nothing but itself (the synchronous `cuMemcpyHtoD` would also wait for all work
/// on the legacy default stream, which is PyTorch's usual stream).
pub(crate) fn htod(dst: u64, src: &[u8], stream: u64) -> Result<()> {
    check(
        // SAFETY: `src` is a live host slice of exactly the copied length and stays borrowed until
        // the stream synchronisation below completes the copy; `dst` was range-checked by the
        // caller against mapped device memory.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream as sys::CUstream)
        },
        "cuMemcpyHtoDAsync",
    )?;
    stream_sync(stream)
}

/// Device-to-host copy on `stream`, complete when this returns.
pub(crate) fn dtoh(dst: &mut [u8], src: u64, stream: u64) -> Result<()> {
    check(
        // SAFETY: as in `htod`, in the other direction; `dst` stays borrowed until the copy is done.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.as_mut_ptr().cast(),
                src,
                dst.len(),
                stream as sys::CUstream,
            )
        },
        "cuMemcpyDtoHAsync",
    )?;
    stream_sync(stream)
}

/// Asynchronous copy between device addresses (any peers' mappings) on `stream`: the copy
/// engines do it.
pub(crate) fn copy_async(dst: u64, src: u64, bytes: u64, stream: u64) -> Result<()> {
    // SAFETY: both ranges were checked by the caller to lie in mapped device memory (or are
    // device pointers the caller vouches for); the stream handle comes from the caller.
    check(
        unsafe { sys::cuMemcpyAsync(dst, src, bytes as usize, stream as sys::CUstream) },
        "cuMemcpyAsync",
    )
}

/// Asynchronous strided copy on `stream`: `rows` rows of `width` bytes, row r from
/// `src + r × spitch` to `dst + r × dpitch` (one `cuMemcpy2DAsync` where the pitches are within
/// the driver's limit, else one copy per row).
pub(crate) fn copy_2d_async(
    dst: u64,
    dpitch: u64,
    src: u64,
    spitch: u64,
    width: u64,
    rows: u64,
    stream: u64,
) -> Result<()> {
    // The driver refuses pitches above CU_DEVICE_ATTRIBUTE_MAX_PITCH (2^31 - 1 on every GPU
    // symheap runs on); beyond it, row copies.
    const MAX_PITCH: u64 = (1 << 31) - 1;
    if width == 0 || rows == 0 {
        return Ok(());
    }
    if dpitch > MAX_PITCH || spitch > MAX_PITCH {
        for r in 0..rows {
            copy_async(dst + r * dpitch, src + r * spitch, width, stream)?;
        }
        return Ok(());
    }
    let p = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: spitch as usize,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dpitch as usize,
        WidthInBytes: width as usize,
        Height: rows as usize,
    };
    // SAFETY: the caller checked that both strided ranges lie in mapped device memory; `p`
    // lives across the call (the driver reads the descriptor before returning).
    check(
        unsafe { sys::cuMemcpy2DAsync_v2(&p, stream as sys::CUstream) },
        "cuMemcpy2DAsync",
    )
}

/// A stream handle usable from any thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stream(pub u64);

/// Creates a non-blocking stream (no implicit synchronisation with the legacy default stream).
pub(crate) fn stream_create() -> Result<Stream> {
    let mut s = std::ptr::null_mut();
    check(
        // SAFETY: writes one stream handle, destroyed by `stream_destroy`.
        unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
        "cuStreamCreate",
    )?;
    Ok(Stream(s as u64))
}

/// Destroys a stream made by `stream_create`.
pub(crate) fn stream_destroy(s: Stream) {
    // SAFETY: the caller owns the stream and destroys it once.
    released(
        unsafe { sys::cuStreamDestroy_v2(s.0 as sys::CUstream) },
        "cuStreamDestroy",
    );
}

/// What the driver knows of a device address (`cuPointerGetAttributes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PointerInfo {
    /// Device memory (not host, pinned or unknown memory).
    pub device_memory: bool,
    /// Managed (unified) memory, which the host may also access directly.
    pub managed: bool,
    /// The device the memory lives on.
    pub ordinal: i32,
    /// The allocation (or mapping) holding the address: start and size.
    pub start: u64,
    pub size: u64,
}

/// What the driver knows of `addr`; `None` for an address no CUDA allocation covers.
pub(crate) fn pointer_info(addr: u64) -> Option<PointerInfo> {
    use sys::CUpointer_attribute as A;
    let mut attrs = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let (mut mem_type, mut managed, mut ordinal) = (0u32, 0u32, -1i32);
    let (mut start, mut size) = (0u64, 0usize);
    let mut data: [*mut std::ffi::c_void; 5] = [
        (&mut mem_type as *mut u32).cast(),
        (&mut managed as *mut u32).cast(),
        (&mut ordinal as *mut i32).cast(),
        (&mut start as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: five attributes, each with a destination of the size the driver writes for it
    // (CUmemorytype and bool as 32-bit values, an int, a CUdeviceptr and a size_t). The driver
    // only inspects its own tables for `addr`: any value is a valid argument, and for an
    // address it does not know it returns success with the outputs left untouched or an error.
    let r = unsafe { sys::cuPointerGetAttributes(5, attrs.as_mut_ptr(), data.as_mut_ptr(), addr) };
    if r != CUresult::CUDA_SUCCESS || mem_type == 0 {
        return None;
    }
    Some(PointerInfo {
        device_memory: mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32,
        managed: managed != 0,
        ordinal,
        start,
        size: size as u64,
    })
}

/// The context stream `s` belongs to.
pub(crate) fn stream_context(s: u64) -> Result<u64> {
    let mut ctx = std::ptr::null_mut();
    check(
        // SAFETY: writes one context handle; `s` is a live stream handle (the contract of
        // `Stream::from_raw`, or a stream symheap created).
        unsafe { sys::cuStreamGetCtx(s as sys::CUstream, &mut ctx) },
        "cuStreamGetCtx",
    )?;
    Ok(ctx as u64)
}

/// Free and total bytes of the current context's device memory.
pub(crate) fn mem_info() -> Result<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    check(
        // SAFETY: writes two sizes; the caller has bound the context.
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )?;
    Ok((free as u64, total as u64))
}

/// Waits for all work on `s`.
pub(crate) fn stream_sync(s: u64) -> Result<()> {
    // SAFETY: `s` is a stream handle (or 0, the legacy default stream).
    check(
        unsafe { sys::cuStreamSynchronize(s as sys::CUstream) },
        "cuStreamSynchronize",
    )
}

/// Whether `s` is being captured into a CUDA graph.
pub(crate) fn is_capturing(s: u64) -> Result<bool> {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    check(
        // SAFETY: writes one status for a stream handle.
        unsafe { sys::cuStreamIsCapturing(s as sys::CUstream, &mut st) },
        "cuStreamIsCapturing",
    )?;
    Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A loaded module of kernels.
pub(crate) struct Module(sys::CUmodule);
// SAFETY: module and function handles are usable from any thread with the context current.
unsafe impl Send for Module {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Module {}

/// A kernel handle.
#[derive(Clone, Copy)]
pub(crate) struct Function(sys::CUfunction);
// SAFETY: as for Module.
unsafe impl Send for Function {}
// SAFETY: as for Module.
unsafe impl Sync for Function {}

impl Module {
    /// Loads a CUBIN image into the current context.
    pub(crate) fn load(image: &[u8]) -> Result<Module> {
        let mut m = std::ptr::null_mut();
        check(
            // SAFETY: `image` is a complete CUBIN produced by NVRTC for this device's arch; the driver
            // copies it during the call.
            unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        Ok(Module(m))
    }

    /// The device memory holding the module's `__device__` variable `name`: the whole range
    /// the driver allocated for it (the module's globals), so callers can keep out of it.
    pub(crate) fn global_range(&self, name: &str) -> Result<(u64, u64)> {
        let c = std::ffi::CString::new(name).map_err(|e| backend("cuda", e.to_string()))?;
        let (mut ptr, mut size) = (0, 0usize);
        check(
            // SAFETY: the module is loaded; writes the variable's device address and size.
            unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, self.0, c.as_ptr()) },
            "cuModuleGetGlobal",
        )?;
        Ok(match pointer_info(ptr) {
            Some(p) if p.start <= ptr && ptr < p.start + p.size => (p.start, p.size),
            _ => (ptr, size as u64),
        })
    }

    /// Writes `value` into the module's 8-byte `__device__` variable `name` (a pointer the
    /// kernels read, set once after loading).
    pub(crate) fn set_global_u64(&self, name: &str, value: u64) -> Result<()> {
        let c = std::ffi::CString::new(name).map_err(|e| backend("cuda", e.to_string()))?;
        let (mut ptr, mut size) = (0, 0usize);
        check(
            // SAFETY: the module is loaded; writes the variable's device address and size.
            unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, self.0, c.as_ptr()) },
            "cuModuleGetGlobal",
        )?;
        if size != 8 {
            return Err(backend(
                "cuda",
                format!("module variable {name} is {size} bytes, not 8"),
            ));
        }
        // SAFETY: `ptr` is the device address of an 8-byte module variable (checked above); the
        // source is one u64 on this stack frame. No kernel of the module runs yet.
        check(
            unsafe { sys::cuMemcpyHtoD_v2(ptr, (&value as *const u64).cast(), 8) },
            "cuMemcpyHtoD",
        )
    }

    /// Looks up an `extern "C"` kernel.
    pub(crate) fn function(&self, name: &str) -> Result<Function> {
        let c = std::ffi::CString::new(name).map_err(|e| backend("cuda", e.to_string()))?;
        let mut f = std::ptr::null_mut();
        check(
            // SAFETY: the module is loaded; writes one function handle valid while it stays loaded.
            unsafe { sys::cuModuleGetFunction(&mut f, self.0, c.as_ptr()) },
            "cuModuleGetFunction",
        )?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`, unloaded once.
        released(unsafe { sys::cuModuleUnload(self.0) }, "cuModuleUnload");
    }
}

/// One kernel argument, passed by value. The kernel's parameter must have the same size:
/// 8 bytes for `U64`/`I64`/`F64` (and pointers), 4 bytes for `U32`/`I32`/`F32`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// uint64_t or any pointer.
    U64(u64),
    /// int64_t.
    I64(i64),
    /// uint32_t.
    U32(u32),
    /// int.
    I32(i32),
    /// float.
    F32(f32),
    /// double.
    F64(f64),
}

/// Launches `f` on `stream` with the given arguments (users' kernels, see `CudaModule::launch`;
/// symheap's own kernels take one argument block, see [`launch_block`]).
///
/// # Safety
/// `f`'s parameters match `args` in number, order and size, and every address among them is
/// valid for every access the kernel makes with it.
pub(crate) unsafe fn launch(
    f: Function,
    grid: u32,
    block: u32,
    shared: u32,
    stream: u64,
    args: &[Arg],
) -> Result<()> {
    let mut vals: Vec<u64> = args
        .iter()
        .map(|a| match *a {
            Arg::U64(v) => v,
            Arg::I64(v) => v as u64,
            Arg::U32(v) => v as u64,
            Arg::I32(v) => v as u32 as u64,
            Arg::F32(v) => v.to_bits() as u64,
            Arg::F64(v) => v.to_bits(),
        })
        .collect();
    let mut ptrs: Vec<*mut c_void> = vals
        .iter_mut()
        .map(|v| (v as *mut u64).cast::<c_void>())
        .collect();
    // SAFETY: the caller promises `f`'s parameters match `args` in number and size. Each
    // parameter pointer points at a little-endian u64 whose low bytes hold the value, which is
    // what a 4- or 8-byte parameter reads; `vals` outlives the call.
    unsafe { launch_params(f, grid, block, shared, stream, &mut ptrs) }
}

/// Launches `f`, whose one parameter is a struct of `bytes` bytes, with the `bytes` bytes at
/// `param` as that struct.
///
/// # Safety
/// `f` takes exactly one parameter, a struct whose layout is that of the `bytes` bytes at `param`
/// (symheap's argument blocks: `arg_block.rs`), `param` is readable for `bytes` bytes, and every
/// address in the block is valid for every access the kernel makes with it.
pub(crate) unsafe fn launch_block(
    f: Function,
    grid: u32,
    block: u32,
    shared: u32,
    stream: u64,
    param: *const c_void,
) -> Result<()> {
    let mut ptrs = [param.cast_mut()];
    // SAFETY: one parameter, pointing at the struct the kernel takes (the caller's promise).
    unsafe { launch_params(f, grid, block, shared, stream, &mut ptrs) }
}

/// `cuLaunchKernel` with `params[i]` pointing at parameter i.
///
/// # Safety
/// `params` matches `f`'s parameters in number, and each points at a value of its parameter's
/// size and layout; every address among the values is valid for the kernel's accesses.
unsafe fn launch_params(
    f: Function,
    grid: u32,
    block: u32,
    shared: u32,
    stream: u64,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the parameters are the caller's promise; the driver copies them before returning
    // (also when the stream is being captured: the graph node keeps its own copy).
    check(
        unsafe {
            sys::cuLaunchKernel(
                f.0,
                grid,
                1,
                1,
                block,
                1,
                1,
                shared,
                stream as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
    )
}
