//! Driver objects the `symheap` command measures and checks the runtime with (see
//! [`crate::tools`]): timing events, CUDA graphs captured from a stream, the plain peer-to-peer
//! copy symheap's transfers are compared with, ordinary `cuMemAlloc` buffers (what an NCCL user
//! passes to NCCL) and a stream of another device. The runtime itself never makes them; they sit
//! here so that the command reaches the driver through this one layer, not a second binding.
//! Every safe function checks its buffers' sizes and takes symheap's [`Stream`], so safe callers
//! cannot reach memory outside the buffers they pass.

use cudarc::driver::sys;

use super::{check, Device};
use crate::error::{backend, Result};
use crate::stream::Stream;

/// A measuring tool's refusal, as a backend error of the call "tools".
fn refused(why: String) -> crate::Error {
    backend("tools", why)
}

/// Device memory a tool may hand to the driver or to NCCL: an address and how many bytes are
/// there.
///
/// # Safety
/// An implementation promises that `len_bytes()` bytes at `addr()` are device memory of the
/// current device that stay allocated while the value is borrowed.
pub unsafe trait DeviceMem {
    /// Device address of the first byte.
    fn addr(&self) -> u64;
    /// Bytes at `addr`.
    fn len_bytes(&self) -> u64;

    /// `addr`, once `bytes` fit.
    fn span(&self, bytes: u64, what: &str) -> Result<u64> {
        if bytes > self.len_bytes() {
            return Err(refused(format!(
                "{what}: {bytes} bytes asked of a {}-byte buffer",
                self.len_bytes()
            )));
        }
        Ok(self.addr())
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
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: a live event; `Stream` holds a live stream handle.
        check(
            unsafe { sys::cuEventRecord(self.0, stream.raw() as sys::CUstream) },
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
    pub fn capture(stream: &Stream, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
        if stream.is_default() {
            return Err(refused(
                "a CUDA graph cannot be captured from a default stream".into(),
            ));
        }
        let stream = stream.raw() as sys::CUstream;
        check(
            // SAFETY: begins capture on a caller-provided stream; ended below on every path.
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                )
            },
            "cuStreamBeginCapture",
        )?;
        let r = body();
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above; writes one graph handle (null if it failed).
        let end = check(
            unsafe { sys::cuStreamEndCapture(stream, &mut graph) },
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
    pub fn launch(&self, stream: &Stream) -> Result<()> {
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

/// `bytes` (at least 1) of this context's device memory from `cuMemAlloc`; the caller frees it.
fn mem_alloc(bytes: u64) -> Result<u64> {
    let mut p = 0;
    check(
        // SAFETY: writes one device pointer to `bytes` bytes.
        unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1) as usize) },
        "cuMemAlloc",
    )?;
    Ok(p)
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
            let p = mem_alloc(bytes)?;
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
    pub fn enqueue(&self, bytes: u64, stream: &Stream) -> Result<()> {
        if bytes > self.bytes {
            return Err(refused(format!(
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
                    self.dst_dev.ctx.0,
                    self.src,
                    self.src_dev.ctx.0,
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
pub struct DeviceBuffer {
    ptr: u64,
    bytes: u64,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) of zeroed memory in the current context.
    pub fn zeroed(bytes: u64) -> Result<DeviceBuffer> {
        let b = DeviceBuffer {
            ptr: mem_alloc(bytes)?,
            bytes: bytes.max(1),
        };
        check(
            // SAFETY: `ptr` points at `b.bytes` bytes of this context's device memory.
            unsafe { sys::cuMemsetD8_v2(b.ptr, 0, b.bytes as usize) },
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

    /// Allocates a buffer the size of `copy_from` in the current context (the one the caller
    /// bound, which `copy_from` belongs to) and copies its bytes into it.
    pub fn copy_of(copy_from: &impl DeviceMem) -> Result<DeviceBuffer> {
        let bytes = copy_from.len_bytes();
        let b = DeviceBuffer {
            ptr: mem_alloc(bytes)?,
            bytes: bytes.max(1),
        };
        check(
            // SAFETY: both ranges hold `bytes` bytes of device memory: the new buffer, and
            // `copy_from` (live while borrowed, by `DeviceMem`'s contract); the copy is
            // synchronous with respect to the host.
            unsafe { sys::cuMemcpyDtoD_v2(b.ptr, copy_from.addr(), bytes as usize) },
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
        // SAFETY: allocated by `mem_alloc`, freed once; callers synchronise their streams first.
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// A stream of device `ordinal`'s primary context, for checking that symheap refuses streams
/// of a device other than its own.
pub struct ForeignStream {
    stream: Stream,
    raw: u64,
    _dev: Device,
}

impl ForeignStream {
    /// Creates a stream on device `ordinal` (leaves that device's context current).
    pub fn new(ordinal: usize) -> Result<ForeignStream> {
        let dev = Device::open(ordinal)?;
        let mut s = std::ptr::null_mut();
        check(
            // SAFETY: writes one stream handle of the current (just bound) context, destroyed in
            // Drop while `_dev` still retains that context.
            unsafe {
                sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            "cuStreamCreate",
        )?;
        let raw = s as u64;
        Ok(ForeignStream {
            // SAFETY: a live stream, destroyed only in Drop, after the `Stream` view is gone (it
            // is only lent out by reference).
            stream: unsafe { Stream::from_raw(raw) },
            raw,
            _dev: dev,
        })
    }

    /// The stream, as symheap takes it.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

impl Drop for ForeignStream {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; its context is still retained.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw as sys::CUstream) };
    }
}
