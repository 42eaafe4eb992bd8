//! Driver objects with a lifetime: events (stream-ordered release, timing), CUDA graphs,
//! mapped host words (device error flags), and the measuring tools of the benchmarks.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::{check, Device};
use crate::error::Result;

/// Makes work enqueued on `waiter` from now on start only after everything enqueued on `on` so
/// far: an event recorded on `on` and waited for on `waiter` (no host synchronisation; inside a
/// capture both streams must belong to it, and the wait becomes a graph edge).
pub(crate) fn stream_after(waiter: u64, on: u64) -> Result<()> {
    let mut e = std::ptr::null_mut();
    check(
        // SAFETY: writes one event handle, destroyed below.
        unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
        "cuEventCreate",
    )?;
    // SAFETY: `e` is a live event; the stream handles are the caller's streams of this context.
    let recorded = check(
        unsafe { sys::cuEventRecord(e, on as sys::CUstream) },
        "cuEventRecord",
    )
    .and_then(|()| {
        // SAFETY: as above; the wait takes the event's state at this call.
        check(
            unsafe { sys::cuStreamWaitEvent(waiter as sys::CUstream, e, 0) },
            "cuStreamWaitEvent",
        )
    });
    // SAFETY: created above and destroyed once; the driver keeps what a pending wait needs.
    let _ = unsafe { sys::cuEventDestroy_v2(e) };
    recorded
}

/// Waits for all work of the current context (only where nothing narrower is possible).
pub(crate) fn ctx_synchronize() -> Result<()> {
    // SAFETY: no arguments; the caller bound the context.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// An event recorded on a stream, queried without waiting (for stream-ordered release).
pub(crate) struct DoneEvent(sys::CUevent);
// SAFETY: event handles may be queried and destroyed from any thread of the process.
unsafe impl Send for DoneEvent {}

impl DoneEvent {
    /// Records a new event on `stream`: it completes when everything enqueued there so far has.
    pub(crate) fn record(stream: u64) -> Result<DoneEvent> {
        let mut e = std::ptr::null_mut();
        check(
            // SAFETY: writes one event handle, owned by the returned value.
            unsafe {
                sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            },
            "cuEventCreate",
        )?;
        let ev = DoneEvent(e);
        check(
            // SAFETY: a live event and the caller's stream of this context.
            unsafe { sys::cuEventRecord(ev.0, stream as sys::CUstream) },
            "cuEventRecord",
        )?;
        Ok(ev)
    }

    /// True once the work before the record finished (an error also counts as finished: the
    /// stream is broken and its work will not touch memory any more).
    pub(crate) fn is_done(&self) -> bool {
        // SAFETY: a live event.
        let r = unsafe { sys::cuEventQuery(self.0) };
        r != sys::CUresult::CUDA_ERROR_NOT_READY
    }
}

impl Drop for DoneEvent {
    fn drop(&mut self) {
        // SAFETY: created in `record`, destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// Page-locked host memory mapped into the device's address space: a word the GPU can write
/// and the host can read without a copy (used for device-side error flags).
pub(crate) struct MappedHost {
    host: *mut c_void,
    pub dev: u64,
    pub len: usize,
}
// SAFETY: the memory is plain pinned host memory; accesses go through volatile/atomic reads.
unsafe impl Send for MappedHost {}
// SAFETY: as above.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// Allocates `len` zeroed bytes.
    pub(crate) fn new(len: usize) -> Result<MappedHost> {
        let mut p = std::ptr::null_mut();
        check(
            // SAFETY: writes one host pointer to `len` pinned bytes, freed in Drop.
            unsafe {
                sys::cuMemHostAlloc(
                    &mut p,
                    len,
                    sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
                )
            },
            "cuMemHostAlloc",
        )?;
        // SAFETY: `p` points at `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        let mut d = 0;
        check(
            // SAFETY: `p` is a DEVICEMAP allocation; writes its device address.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) },
            "cuMemHostGetDevicePointer",
        )?;
        Ok(MappedHost {
            host: p,
            dev: d,
            len,
        })
    }

    /// Reads the 32-bit word at byte offset `off` as the device last wrote it.
    pub(crate) fn read_u32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: in bounds and aligned (checked); the device writes this word atomically, so a
        // relaxed atomic load sees either the old or the new value.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host.cast::<u8>().add(off).cast()) }
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Writes the 32-bit word at byte offset `off`.
    pub(crate) fn write_u32(&self, off: usize, v: u32) {
        assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: as in `read_u32`.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host.cast::<u8>().add(off).cast()) }
            .store(v, std::sync::atomic::Ordering::SeqCst)
    }

    /// Reads the 64-bit word at byte offset `off`.
    pub(crate) fn read_u64(&self, off: usize) -> u64 {
        assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: as in `read_u32`, for an aligned 8-byte word.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.host.cast::<u8>().add(off).cast()) }
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once; no kernel uses it after the backend is gone.
        let _ = unsafe { sys::cuMemFreeHost(self.host) };
    }
}

/// Device timing events (for benchmarks).
pub struct Event(sys::CUevent);
// SAFETY: event handles may be recorded and queried from any thread.
unsafe impl Send for Event {}

impl Event {
    /// A timing event in the current context.
    pub fn new() -> Result<Event> {
        let mut e = std::ptr::null_mut();
        check(
            // SAFETY: writes one event handle, destroyed in Drop.
            unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) },
            "cuEventCreate",
        )?;
        Ok(Event(e))
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: u64) -> Result<()> {
        // SAFETY: valid event and stream handles.
        check(
            unsafe { sys::cuEventRecord(self.0, stream as sys::CUstream) },
            "cuEventRecord",
        )
    }

    /// Milliseconds from `self` to `end` (both recorded; waits for `end`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        check(
            // SAFETY: valid event handle.
            unsafe { sys::cuEventSynchronize(end.0) },
            "cuEventSynchronize",
        )?;
        let mut ms = 0f32;
        check(
            // SAFETY: both events were recorded; writes one float.
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, self.0, end.0) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// An instantiated CUDA graph captured from a stream.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}
// SAFETY: graph handles may be launched from any thread; launches are ordered by their stream.
unsafe impl Send for Graph {}

impl Graph {
    /// Captures everything `body` enqueues on `stream` (which must not be the legacy default
    /// stream) into a graph, without running it. The capture is relaxed, so other threads'
    /// unrelated CUDA calls are not disturbed.
    pub fn capture(stream: u64, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
        check(
            // SAFETY: begins capture on a caller-provided stream; ended below on every path.
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    stream as sys::CUstream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                )
            },
            "cuStreamBeginCapture",
        )?;
        let r = body();
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above; writes one graph handle (null if it failed).
        let end = check(
            unsafe { sys::cuStreamEndCapture(stream as sys::CUstream, &mut graph) },
            "cuStreamEndCapture",
        );
        r?;
        end?;
        let mut exec = std::ptr::null_mut();
        if let Err(e) = check(
            // SAFETY: `graph` is a valid captured graph; writes one executable graph handle.
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) },
            "cuGraphInstantiate",
        ) {
            // SAFETY: the graph was created by the capture and is not used afterwards.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Graph { graph, exec })
    }

    /// Enqueues one replay on `stream`.
    pub fn launch(&self, stream: u64) -> Result<()> {
        // SAFETY: the executable graph is valid until Drop; the stream is the caller's.
        check(
            unsafe { sys::cuGraphLaunch(self.exec, stream as sys::CUstream) },
            "cuGraphLaunch",
        )
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles were created in `capture` and are destroyed once.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// The baseline symheap's transfers are measured against: a plain peer-to-peer copy-engine copy
/// (`cuMemcpyPeerAsync`) between two ordinary `cuMemAlloc` buffers on two GPUs of this process,
/// the same thing `cudaMemcpyPeer` or a torch cross-device `copy_` does.
pub struct PeerCopy {
    src_dev: Device,
    dst_dev: Device,
    src: u64,
    dst: u64,
    bytes: u64,
}

impl PeerCopy {
    /// Allocates `bytes` on device `src` and on device `dst` (filled with a pattern, never
    /// zeros, so the copy moves real data).
    pub fn new(src: usize, dst: usize, bytes: u64) -> Result<PeerCopy> {
        let src_dev = Device::open(src)?;
        let dst_dev = Device::open(dst)?;
        let alloc = |d: &Device| -> Result<u64> {
            d.bind()?;
            let mut p = 0;
            check(
                // SAFETY: writes one device pointer to `bytes` bytes, freed in Drop.
                unsafe { sys::cuMemAlloc_v2(&mut p, bytes as usize) },
                "cuMemAlloc",
            )?;
            check(
                // SAFETY: `p` points at `bytes` bytes of this device's memory.
                unsafe { sys::cuMemsetD8_v2(p, 0x5b, bytes as usize) },
                "cuMemsetD8",
            )?;
            Ok(p)
        };
        let d = alloc(&dst_dev)?;
        let s = alloc(&src_dev)?;
        // Direct GPU-to-GPU DMA, as symheap's own mappings get; "already enabled" is fine.
        // SAFETY: both contexts are retained by the Device values held in `self`.
        let _ = unsafe { sys::cuCtxEnablePeerAccess(dst_dev.ctx.0, 0) };
        Ok(PeerCopy {
            src_dev,
            dst_dev,
            src: s,
            dst: d,
            bytes,
        })
    }

    /// Enqueues a copy of `bytes` (at most the allocation) on `stream` (a stream of the source
    /// device's context).
    pub fn enqueue(&self, bytes: u64, stream: u64) -> Result<()> {
        assert!(bytes <= self.bytes);
        self.src_dev.bind()?;
        // SAFETY: both buffers hold at least `bytes` bytes and belong to the contexts passed.
        check(
            unsafe {
                sys::cuMemcpyPeerAsync(
                    self.dst,
                    self.dst_dev.ctx.0,
                    self.src,
                    self.src_dev.ctx.0,
                    bytes as usize,
                    stream as sys::CUstream,
                )
            },
            "cuMemcpyPeerAsync",
        )
    }
}

impl Drop for PeerCopy {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once, after the caller synchronised its streams.
        unsafe {
            let _ = self.src_dev.bind();
            let _ = sys::cuMemFree_v2(self.src);
            let _ = self.dst_dev.bind();
            let _ = sys::cuMemFree_v2(self.dst);
            let _ = self.src_dev.bind();
        }
    }
}

/// An ordinary `cuMemAlloc` buffer on the device whose context is current: what an NCCL user
/// passes to NCCL. The benchmarks give the NCCL peer these, not symheap's heap, so NCCL runs on
/// the memory it is normally run on.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: u64,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) in the current context and copies `copy_from` (a device
    /// address of at least `bytes` readable bytes in the same context) into it.
    pub fn copy_of(copy_from: u64, bytes: u64) -> Result<DeviceBuffer> {
        let mut p = 0;
        check(
            // SAFETY: writes one device pointer to `bytes` bytes, freed in Drop.
            unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1) as usize) },
            "cuMemAlloc",
        )?;
        let b = DeviceBuffer {
            ptr: p,
            bytes: bytes.max(1),
        };
        check(
            // SAFETY: both ranges hold `bytes` bytes of this context's device memory (the caller's
            // promise for `copy_from`); the copy is synchronous with respect to the host.
            unsafe { sys::cuMemcpyDtoD_v2(p, copy_from, bytes as usize) },
            "cuMemcpyDtoD",
        )?;
        Ok(b)
    }

    /// Device address.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `copy_of`, freed once; callers synchronise their streams first.
        unsafe {
            let _ = sys::cuMemFree_v2(self.ptr);
        }
    }
}
