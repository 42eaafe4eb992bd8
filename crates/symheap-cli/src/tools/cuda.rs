//! Driver objects the benchmarks and self-tests use: timing events, CUDA graphs captured from
//! a stream, the plain peer-to-peer copy symheap's transfers are measured against, and ordinary
//! `cuMemAlloc` buffers (what an NCCL user passes to NCCL).

use cudarc::driver::sys;
use symheap::{Result, Stream, SymmetricBuffer};

use super::{backend, check, DeviceMem};

/// A device with its primary context retained (released on drop) and made current.
struct Device {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl Device {
    fn open(ordinal: usize) -> Result<Device> {
        let mut dev = 0;
        check(
            // SAFETY: writes one device handle; the ordinal is checked by the driver (symheap's
            // context initialised the driver before any tool is made).
            unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) },
            "cuDeviceGet",
        )?;
        let mut ctx = std::ptr::null_mut();
        check(
            // SAFETY: writes one context handle for a valid device; released in Drop.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let d = Device { dev, ctx };
        d.bind()?;
        Ok(d)
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained until Drop.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Device timing events (for benchmarks).
pub(crate) struct Event(sys::CUevent);
// SAFETY: event handles may be recorded and queried from any thread.
unsafe impl Send for Event {}

impl Event {
    /// A timing event in the current context.
    pub(crate) fn new() -> Result<Event> {
        let mut e = std::ptr::null_mut();
        check(
            // SAFETY: writes one event handle, destroyed in Drop.
            unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) },
            "cuEventCreate",
        )?;
        Ok(Event(e))
    }

    /// Records the event on `stream`.
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: a live event; `Stream` holds a live stream handle.
        check(
            unsafe { sys::cuEventRecord(self.0, stream.raw() as sys::CUstream) },
            "cuEventRecord",
        )
    }

    /// Milliseconds from `self` to `end` (both recorded; waits for `end`).
    pub(crate) fn elapsed_ms(&self, end: &Event) -> Result<f32> {
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
pub(crate) struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}
// SAFETY: graph handles may be launched from any thread; launches are ordered by their stream.
unsafe impl Send for Graph {}

impl Graph {
    /// Captures everything `body` enqueues on `stream` (which must not be the legacy default
    /// stream) into a graph, without running it. The capture is relaxed, so other threads'
    /// unrelated CUDA calls are not disturbed.
    pub(crate) fn capture(stream: &Stream, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
        if stream.is_default() {
            return Err(backend(
                "a CUDA graph cannot be captured from a default stream".into(),
            ));
        }
        let stream = stream.raw();
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
    pub(crate) fn launch(&self, stream: &Stream) -> Result<()> {
        // SAFETY: the executable graph is valid until Drop; `Stream` holds a live handle.
        check(
            unsafe { sys::cuGraphLaunch(self.exec, stream.raw() as sys::CUstream) },
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
pub(crate) struct PeerCopy {
    src_dev: Device,
    dst_dev: Device,
    src: u64,
    dst: u64,
    bytes: u64,
}

impl PeerCopy {
    /// Allocates `bytes` on device `src` and on device `dst` (filled with a pattern, never
    /// zeros, so the copy moves real data).
    pub(crate) fn new(src: usize, dst: usize, bytes: u64) -> Result<PeerCopy> {
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
        let _ = unsafe { sys::cuCtxEnablePeerAccess(dst_dev.ctx, 0) };
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
    pub(crate) fn enqueue(&self, bytes: u64, stream: &Stream) -> Result<()> {
        if bytes > self.bytes {
            return Err(backend(format!(
                "a peer copy of {bytes} bytes between {}-byte buffers",
                self.bytes
            )));
        }
        self.src_dev.bind()?;
        // SAFETY: both buffers hold at least `bytes` bytes and belong to the contexts passed.
        check(
            unsafe {
                sys::cuMemcpyPeerAsync(
                    self.dst,
                    self.dst_dev.ctx,
                    self.src,
                    self.src_dev.ctx,
                    bytes as usize,
                    stream.raw() as sys::CUstream,
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
pub(crate) struct DeviceBuffer {
    ptr: u64,
    bytes: u64,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) of zeroed memory in the current context.
    pub(crate) fn zeroed(bytes: u64) -> Result<DeviceBuffer> {
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
            // SAFETY: `p` points at `b.bytes` bytes of this context's device memory.
            unsafe { sys::cuMemsetD8_v2(p, 0, b.bytes as usize) },
            "cuMemsetD8",
        )?;
        // The memset is queued on the legacy stream, which work on a non-blocking stream does
        // not wait for: finish it here, so the buffer is zero before any stream writes it.
        check(
            // SAFETY: the null stream is always valid in the current context.
            unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) },
            "cuStreamSynchronize",
        )?;
        Ok(b)
    }

    /// Allocates a buffer the size of `copy_from` in the current context (symheap's, which
    /// the caller bound) and copies its bytes into it.
    pub(crate) fn copy_of(copy_from: &SymmetricBuffer) -> Result<DeviceBuffer> {
        let bytes = copy_from.len_bytes();
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
            // SAFETY: both ranges hold `bytes` bytes of device memory: the new buffer, and the
            // live symmetric allocation `copy_from` (which outlives this call); the copy is
            // synchronous with respect to the host.
            unsafe { sys::cuMemcpyDtoD_v2(p, copy_from.addr(), bytes as usize) },
            "cuMemcpyDtoD",
        )?;
        Ok(b)
    }
}

// SAFETY: `bytes` bytes from `cuMemAlloc`, freed only in Drop.
unsafe impl DeviceMem for DeviceBuffer {
    fn addr(&self) -> u64 {
        self.ptr
    }
    fn len_bytes(&self) -> u64 {
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

/// A stream of device `ordinal`'s primary context, for checking that symheap refuses streams
/// of a device other than its own.
pub(crate) struct ForeignStream {
    stream: Stream,
    raw: u64,
    _dev: Device,
}

/// Creates a [`ForeignStream`] on device `ordinal` (leaves that device's context current).
pub(crate) fn foreign_stream(ordinal: usize) -> Result<ForeignStream> {
    let dev = Device::open(ordinal)?;
    let mut s = std::ptr::null_mut();
    check(
        // SAFETY: writes one stream handle of the current (just bound) context, destroyed in
        // Drop while `_dev` still retains that context.
        unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
        "cuStreamCreate",
    )?;
    let raw = s as u64;
    Ok(ForeignStream {
        // SAFETY: a live stream, destroyed only in Drop, after the `Stream` view is gone (it is
        // only lent out by reference).
        stream: unsafe { Stream::from_raw(raw) },
        raw,
        _dev: dev,
    })
}

impl ForeignStream {
    /// The stream, as symheap takes it.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }
}

impl Drop for ForeignStream {
    fn drop(&mut self) {
        // SAFETY: created in `foreign_stream`, destroyed once; its context is still retained.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw as sys::CUstream) };
    }
}
