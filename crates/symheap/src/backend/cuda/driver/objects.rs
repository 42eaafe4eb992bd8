//! Driver objects with a lifetime: events (stream-ordered release, timing), CUDA graphs,
//! mapped host words (device error flags), and the measuring tools of the benchmarks.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::check;
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
    super::released(unsafe { sys::cuEventDestroy_v2(e) }, "cuEventDestroy");
    recorded
}

/// Waits for all work of the current context (only where nothing narrower is possible).
pub(crate) fn ctx_synchronize() -> Result<()> {
    // SAFETY: no arguments; the caller bound the context.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// An event recorded on a stream, for a stream to wait on (multi-node all_reduce's pieces).
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
}

impl Drop for DoneEvent {
    fn drop(&mut self) {
        // SAFETY: created in `record`, destroyed once.
        super::released(unsafe { sys::cuEventDestroy_v2(self.0) }, "cuEventDestroy");
    }
}

/// Events made once and recorded again: a release fence per `free` of a buffer a stream used
/// (creating and destroying an event each time costs host time every allocation pays, as
/// PyTorch's caching allocator also found; it keeps a pool for `record_stream` too). One pool
/// per backend, so every event in it belongs to that backend's context.
pub(crate) struct EventPool {
    spare: std::sync::Mutex<Vec<PoolEvent>>,
    /// The context the events belong to, kept until the spare events above are destroyed
    /// (fields drop in order); every pooled event holds the pool, so the context outlives
    /// each event, also one a heap's release fence drops after the backend is gone.
    _ctx: std::sync::Arc<super::ContextHold>,
}

/// An event handle owned by a pool.
struct PoolEvent(sys::CUevent);
// SAFETY: event handles may be recorded, queried and destroyed from any thread of the process.
unsafe impl Send for PoolEvent {}

impl Drop for PoolEvent {
    fn drop(&mut self) {
        // SAFETY: created by the pool, destroyed once (whoever holds it last drops it).
        super::released(unsafe { sys::cuEventDestroy_v2(self.0) }, "cuEventDestroy");
    }
}

/// Spare events a pool keeps; more are destroyed when they come back (a burst of frees).
const POOL_KEEP: usize = 256;

impl EventPool {
    /// An empty pool for the context `ctx` holds (the one current where events are recorded).
    pub(crate) fn new(ctx: std::sync::Arc<super::ContextHold>) -> std::sync::Arc<EventPool> {
        std::sync::Arc::new(EventPool {
            spare: std::sync::Mutex::new(Vec::new()),
            _ctx: ctx,
        })
    }

    /// Records an event of the pool (a spare one, else a new one) on `stream`, in the bound
    /// context: it completes when everything enqueued there so far has.
    pub(crate) fn record(self: &std::sync::Arc<Self>, stream: u64) -> Result<PooledEvent> {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let ev = match spare {
            Some(e) => e,
            None => {
                let mut e = std::ptr::null_mut();
                check(
                    // SAFETY: writes one event handle, owned by the `PoolEvent` made of it.
                    unsafe {
                        sys::cuEventCreate(
                            &mut e,
                            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                        )
                    },
                    "cuEventCreate",
                )?;
                PoolEvent(e)
            }
        };
        check(
            // SAFETY: a live event of this context (a spare one is no longer waited for: its
            // holder dropped it) and the caller's stream of this context.
            unsafe { sys::cuEventRecord(ev.0, stream as sys::CUstream) },
            "cuEventRecord",
        )?;
        Ok(PooledEvent {
            ev: Some(ev),
            pool: std::sync::Arc::clone(self),
        })
    }
}

/// An event recorded on a stream, queried without waiting; back to its pool when dropped.
pub(crate) struct PooledEvent {
    ev: Option<PoolEvent>,
    pool: std::sync::Arc<EventPool>,
}

impl PooledEvent {
    /// True once the work before the record finished (an error also counts as finished: the
    /// stream is broken and its work will not touch memory any more).
    pub(crate) fn is_done(&self) -> bool {
        self.ev.as_ref().is_none_or(|e| {
            // SAFETY: a live event.
            let r = unsafe { sys::cuEventQuery(e.0) };
            r != sys::CUresult::CUDA_ERROR_NOT_READY
        })
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        let Some(ev) = self.ev.take() else { return };
        let mut spare = self.pool.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < POOL_KEEP {
            // Recording it again later overwrites what it waits for, pending or not.
            spare.push(ev);
        }
    }
}

/// Makes work enqueued on `waiter` from now on start only after the work `ev` was recorded
/// after (inside a capture: a graph edge, which also brings `waiter` into the capture).
pub(crate) fn stream_wait(waiter: u64, ev: &DoneEvent) -> Result<()> {
    check(
        // SAFETY: a live event and the caller's stream of this context; the wait takes the
        // event's state at this call, so the event may be destroyed afterwards.
        unsafe { sys::cuStreamWaitEvent(waiter as sys::CUstream, ev.0, 0) },
        "cuStreamWaitEvent",
    )
}

/// Page-locked host memory mapped into the device's address space: a word the GPU can write
/// and the host can read without a copy (used for device-side error flags).
pub(crate) struct MappedHost {
    host: *mut c_void,
    pub dev: u64,
    pub len: usize,
    /// The context the block was allocated in: the block lives until Drop frees it, which runs
    /// before this field releases the context (a holder such as the health callback may keep
    /// the block after the backend is gone, and a destroyed context frees its pinned memory).
    _ctx: std::sync::Arc<super::ContextHold>,
}
// SAFETY: the memory is plain pinned host memory; accesses go through volatile/atomic reads.
unsafe impl Send for MappedHost {}
// SAFETY: as above.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// Allocates `len` zeroed bytes in the current context, which `ctx` holds.
    pub(crate) fn new(len: usize, ctx: std::sync::Arc<super::ContextHold>) -> Result<MappedHost> {
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
            _ctx: ctx,
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
        super::released(unsafe { sys::cuMemFreeHost(self.host) }, "cuMemFreeHost");
    }
}
