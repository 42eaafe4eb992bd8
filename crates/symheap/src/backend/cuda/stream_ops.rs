//! Work the CUDA backend enqueues on streams (copies, signals, waits, barriers, collective
//! launches), how it learns that device-side waits gave up, and the fences of stream-ordered
//! release.

use super::coll_args::{CollArgs, CollKernel};
use super::driver::{self, Device};
use super::kernel_args::{BarrierArgs, CopyArgs, PutSignalArgs, SignalArgs, WaitArgs};
use super::{CudaBackend, Engine, ABORT, ERR_BARRIER, ERR_COLL, ERR_WAIT};
use crate::error::{backend, err, invalid, ErrorKind, Result};
use crate::stream::Stream;
use std::sync::Arc;

/// Largest put with signal done by one single-block launch (data, then the signal). One block
/// moves 64 KiB in about 1.2 us more than 8 bytes (the ping-pong in BENCHMARKS.md), less than
/// the second launch (copy, then a signal kernel) that larger puts take.
pub const FUSED_PUT_SIGNAL_MAX: u64 = 64 << 10;

/// Threads of the single-block put with signal: one 16-byte vector per thread and step, at least
/// one warp, at most 512.
fn fused_put_signal_threads(bytes: u64) -> u32 {
    bytes.div_ceil(16).next_multiple_of(32).clamp(32, 512) as u32
}

impl CudaBackend {
    /// The handle to enqueue on, once `stream` is known to belong to this device's context.
    pub(crate) fn stream_handle(&self, stream: &Stream, call: &'static str) -> Result<u64> {
        stream.checked(self.dev.context_handle(), call)
    }

    /// A new non-blocking stream of this device, owned by the returned value.
    pub(crate) fn new_stream(&self) -> Result<Stream> {
        Stream::create(Device::open(self.dev.ordinal)?)
    }

    /// Checks `[addr, addr + bytes)` is local memory a stream copy may use: inside one live
    /// device allocation of this GPU that is neither managed memory (the host may be using it)
    /// nor symheap's own. Host memory, pinned or not, is refused: safe code must not be able to
    /// make the copy engines write wherever an integer points. (Heap addresses are checked
    /// against the allocator before this.)
    pub(crate) fn check_local_range(
        &self,
        addr: u64,
        bytes: u64,
        call: &'static str,
    ) -> Result<()> {
        let end = addr.checked_add(bytes.max(1)).ok_or_else(|| {
            invalid(
                call,
                format!("{bytes} bytes at {addr:#x} wrap around the address space"),
            )
        })?;
        let why = match driver::pointer_info(addr) {
            None => "is not in any CUDA allocation".to_string(),
            Some(p) if !p.device_memory => "is host memory, not device memory".to_string(),
            Some(p) if p.managed => "is managed memory (the host may access it)".to_string(),
            Some(p) if p.ordinal != self.dev.ordinal as i32 => {
                format!(
                    "is memory of CUDA device {}, not of this PE's device {}",
                    p.ordinal, self.dev.ordinal
                )
            }
            Some(p) if end > p.start + p.size => format!(
                "runs past the end of its {}-byte device allocation (which starts at {:#x})",
                p.size, p.start
            ),
            Some(_)
                if self
                    .internal_ranges
                    .iter()
                    .any(|&(s, n)| addr < s + n && s < end) =>
            {
                "is symheap's own device memory".to_string()
            }
            Some(_) => return Ok(()),
        };
        Err(invalid(
            call,
            format!("{bytes} bytes at {addr:#x}: the address {why}"),
        ))
    }

    fn launch_copy(&self, dst: u64, src: u64, bytes: u64, stream: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let block = 512u32;
        // Each thread moves four 16-byte vectors per step; enough blocks to keep every SM busy,
        // no more than the data needs.
        let per_block = block as u64 * 16 * 4;
        let grid = bytes
            .div_ceil(per_block)
            .clamp(1, (self.dev.sm_count.max(1) as u64) * 8) as u32;
        let args = CopyArgs { dst, src, bytes };
        // SAFETY: the ops layer passes ranges it checked: symmetric memory of direct PEs or
        // this GPU's own allocations (`check_local_range`); `stream` is of this context.
        unsafe { self.kernels.copy.launch(grid, block, 0, stream, &args) }
    }

    /// Enqueues a copy of `bytes` from `src` to `dst` (device addresses, any direct PE) on
    /// `stream`, by the copy engines (`Auto`, `CopyEngine`) or an SM kernel (`Sm`).
    pub(crate) fn copy_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: u64,
        engine: Engine,
    ) -> Result<()> {
        self.bind()?;
        match engine {
            _ if bytes == 0 => Ok(()),
            Engine::Sm => self.launch_copy(dst, src, bytes, stream),
            Engine::Auto | Engine::CopyEngine => driver::copy_async(dst, src, bytes, stream),
        }
    }

    /// Enqueues a signal update on `stream`: set (op 0) or add (op 1), ordered after everything
    /// earlier on the stream and released at system scope.
    pub(crate) fn signal_on_stream(
        &self,
        sig: u64,
        value: u64,
        add: bool,
        stream: u64,
    ) -> Result<()> {
        self.bind()?;
        let args = SignalArgs {
            sig,
            value,
            op: i32::from(add),
            reserved: 0,
        };
        // SAFETY: `sig` is a signal word in the heap of a direct PE, checked by the ops layer;
        // `stream` is of this context.
        unsafe { self.kernels.signal.launch(1, 1, 0, stream, &args) }
    }

    /// Enqueues a copy of `bytes` from `src` to `dst` followed by a signal update as
    /// `signal_on_stream` does: whoever observes the signal observes the data. Up to
    /// `FUSED_PUT_SIGNAL_MAX` bytes this is one single-block launch; above, a copy-engine copy,
    /// then the signal.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_signal_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        sig: u64,
        value: u64,
        add: bool,
        stream: u64,
    ) -> Result<()> {
        if bytes > FUSED_PUT_SIGNAL_MAX {
            self.copy_on_stream(dst, src, bytes, stream, Engine::Auto)?;
            return self.signal_on_stream(sig, value, add, stream);
        }
        self.bind()?;
        let args = PutSignalArgs {
            dst,
            src,
            bytes,
            sig,
            value,
            op: i32::from(add),
            reserved: 0,
        };
        let threads = fused_put_signal_threads(bytes);
        // SAFETY: the data ranges and the signal word were checked by the ops layer (as for
        // `copy_on_stream` and `signal_on_stream`); `stream` is of this context.
        unsafe { self.kernels.put_signal.launch(1, threads, 0, stream, &args) }
    }

    /// Enqueues a wait until `*sig CMP value` (cmp per symheap.cuh's constants) on `stream`. A
    /// wait longer than the timeout stops and raises the device error flag.
    pub(crate) fn wait_on_stream(&self, sig: u64, cmp: i32, value: u64, stream: u64) -> Result<()> {
        self.bind()?;
        let args = WaitArgs {
            sig,
            value,
            timeout_ns: self.timeout_ns(),
            error: self.flags.dev + ERR_WAIT as u64,
            cmp,
            reserved: 0,
        };
        // SAFETY: `sig` is this PE's signal word, checked by the ops layer; `error` is this
        // backend's mapped block; `stream` is of this context.
        unsafe { self.kernels.wait.launch(1, 1, 0, stream, &args) }
    }

    /// Enqueues a barrier among `n` members on `stream`. `flags` is this PE's flag array,
    /// `peer_flags` a device array of every member's flag array address, `epoch_ptr` this PE's
    /// barrier counter (advanced by the kernel, so a captured graph stays correct on replay).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn barrier_on_stream(
        &self,
        flags: u64,
        peer_flags: u64,
        epoch_ptr: u64,
        me: usize,
        n: usize,
        stream: u64,
    ) -> Result<()> {
        self.bind()?;
        let threads = (n as u32).next_multiple_of(32).max(32);
        let args = BarrierArgs {
            flags,
            peer_flags,
            epoch_ptr,
            timeout_ns: self.timeout_ns(),
            error: self.flags.dev + ERR_BARRIER as u64,
            me: me as i32,
            n: n as i32,
        };
        // SAFETY: the flag arrays, their device table and the counter are the team's device
        // state in symmetric memory, set up by the context for `n` members; `error` is this
        // backend's mapped block; `stream` is of this context.
        unsafe { self.kernels.barrier.launch(1, threads, 0, stream, &args) }
    }

    /// Launches collective `kernel` (coll.cu) with `grid` blocks of 512 threads and `args`.
    /// The caller (the ops layer) builds `args` from buffers it checked and the team's device
    /// state; `kernel` reads the fields its family uses (see [`CollKernel`]).
    pub(crate) fn launch_coll_kernel(
        &self,
        kernel: CollKernel,
        grid: u32,
        stream: u64,
        args: &CollArgs,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the buffers were checked by the ops layer (symmetric ranges, or this GPU's own
        // memory for the kernels that stay local); the team part is the team's device state and
        // this backend's error word; `stream` is of this context.
        unsafe { self.coll.get(kernel).launch(grid, 512, 0, stream, args) }
    }

    /// The backend's own non-blocking stream (host-level calls run their kernels on it).
    pub(crate) fn internal_stream(&self) -> &Stream {
        &self.internal
    }

    /// The mapped word collective kernels raise on a timeout.
    pub(crate) fn coll_error_word(&self) -> u64 {
        self.flags.dev + ERR_COLL as u64
    }

    /// The device-side wait bound, in nanoseconds.
    pub(crate) fn wait_bound_ns(&self) -> u64 {
        self.timeout_ns()
    }

    /// At finalize: waits for every stream's work of this device (the only point where that is
    /// the right thing: nothing may still run on the heap when it is unmapped) and reports a
    /// device-side wait that gave up since the last check.
    pub(crate) fn finish_device_work(&self) -> Result<()> {
        self.bind()?;
        driver::ctx_synchronize()?;
        self.check_device_errors()
    }

    /// Waits for `stream` and reports a device-side wait that timed out since the last check.
    pub(crate) fn sync_stream(&self, stream: u64) -> Result<()> {
        self.bind()?;
        driver::stream_sync(stream)?;
        self.check_device_errors()
    }

    /// A device-side wait or barrier that gave up raises a flag; this turns it into an error
    /// (once).
    pub fn check_device_errors(&self) -> Result<()> {
        if self.flags.read_u32(ABORT) != 0 {
            if let Some(kind) = self.boot.health().failure() {
                for off in [ERR_WAIT, ERR_BARRIER, ERR_COLL] {
                    self.flags.write_u32(off, 0);
                }
                return Err(err("sync_stream", kind));
            }
        }
        for (off, what) in [
            (ERR_WAIT, "a signal_wait_until on a stream"),
            (ERR_BARRIER, "a barrier on a stream"),
            (ERR_COLL, "a collective on a stream"),
        ] {
            let code = self.flags.read_u32(off);
            if code != 0 {
                self.flags.write_u32(off, 0);
                // coll.cu's SYMHEAP_ERR_COLL_LAUNCH: a kernel launched outside its preconditions
                // (a launcher bug, not a peer's absence).
                if off == ERR_COLL && code == 4 {
                    return Err(backend(
                        "sync_stream",
                        "a collective kernel was launched outside its preconditions".to_string(),
                    ));
                }
                let kind = ErrorKind::Timeout {
                    what: format!("{what} (device side, SYMHEAP_TIMEOUT)"),
                    waited: self.timeout,
                    missing: vec![],
                };
                // A signal wait is this PE's own; a barrier or collective that timed out has left
                // the other members stuck or out of step, so the whole job fails alike.
                if off != ERR_WAIT {
                    self.boot.fail_all(kind.clone());
                }
                return Err(err("sync_stream", kind));
            }
        }
        Ok(())
    }

    /// Whether `stream` is being captured into a CUDA graph.
    pub fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        self.bind()?;
        driver::is_capturing(self.stream_handle(stream, "is_capturing")?)
    }
}

impl CudaBackend {
    /// A fence over everything enqueued so far on `streams` (see `Backend::fence_streams`).
    pub(super) fn stream_fence(&self, streams: &[u64]) -> Option<Box<dyn crate::backend::Fence>> {
        if streams.is_empty() {
            return None;
        }
        let mut f = StreamFence {
            events: Vec::new(),
            capturing: Vec::new(),
            pool: Arc::clone(&self.events),
        };
        if self.bind().is_err() {
            return None;
        }
        for &s in streams {
            match driver::is_capturing(s) {
                Ok(true) => f.capturing.push(s),
                Ok(false) => match f.pool.record(s) {
                    Ok(e) => f.events.push(e),
                    Err(e) => f.lost_stream(s, &e),
                },
                Err(e) => f.lost_stream(s, &e),
            }
        }
        tracing::debug!(
            ?streams,
            events = f.events.len(),
            capturing = f.capturing.len(),
            "release fenced"
        );
        Some(Box::new(f))
    }
}

/// Everything enqueued on the streams a released block was used on, at its release.
struct StreamFence {
    events: Vec<driver::PooledEvent>,
    /// Streams that were being captured at the release: their events are recorded once the
    /// capture ends (an event recorded inside a capture would be a node of the graph).
    capturing: Vec<u64>,
    pool: Arc<driver::EventPool>,
}

impl StreamFence {
    /// A stream the driver no longer knows (destroyed since it was used): its work may still
    /// run, and only the whole device can be waited for.
    fn lost_stream(&mut self, stream: u64, why: &crate::Error) {
        tracing::warn!(
            "stream {stream:#x} of a released buffer is unusable ({why}); waiting for the whole device"
        );
        let _ = driver::ctx_synchronize();
    }
}

impl crate::backend::Fence for StreamFence {
    fn done(&mut self) -> bool {
        let mut still = Vec::new();
        for s in std::mem::take(&mut self.capturing) {
            match driver::is_capturing(s) {
                Ok(true) => still.push(s),
                Ok(false) => match self.pool.record(s) {
                    Ok(e) => self.events.push(e),
                    Err(e) => self.lost_stream(s, &e),
                },
                Err(e) => self.lost_stream(s, &e),
            }
        }
        self.capturing = still;
        self.capturing.is_empty() && self.events.iter().all(driver::PooledEvent::is_done)
    }
}

#[cfg(test)]
mod put_signal_tests {
    use super::*;

    #[test]
    fn fused_put_signal_block_fits_the_data() {
        // A signal alone or a word: one warp; one vector per thread up to 512 threads.
        assert_eq!(fused_put_signal_threads(0), 32);
        assert_eq!(fused_put_signal_threads(8), 32);
        assert_eq!(fused_put_signal_threads(32 * 16), 32);
        assert_eq!(fused_put_signal_threads(32 * 16 + 1), 64);
        assert_eq!(fused_put_signal_threads(4096), 256);
        assert_eq!(fused_put_signal_threads(8192), 512);
        assert_eq!(fused_put_signal_threads(FUSED_PUT_SIGNAL_MAX), 512);
    }
}
