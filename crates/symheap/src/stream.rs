//! The stream handle every `*_on_stream` call takes.
//!
//! A raw `CUstream` is an integer to Rust: any value type-checks, and the driver dereferences
//! it. So safe code gets a [`Stream`] only from symheap ([`Context::create_stream`], or the
//! default streams, which always exist) and an integer becomes one only through the `unsafe`
//! [`Stream::from_raw`], whose caller promises the handle is live. Each call then checks that
//! the stream belongs to this context's device before enqueuing anything.
//!
//! On the host backend a stream is the calling thread: every call completes before it returns,
//! and the handle is not looked at.
//!
//! [`Context::create_stream`]: crate::Context::create_stream

use std::sync::{Arc, OnceLock};

use crate::backend::cuda::driver::{self, Device};
use crate::error::{invalid, Result};

/// The legacy default stream's handle (`0`, what `torch.cuda.default_stream()` reports).
const LEGACY: u64 = 0;
/// `CU_STREAM_LEGACY`: the legacy default stream, named explicitly.
const LEGACY_NAMED: u64 = 1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
const PER_THREAD: u64 = 2;

/// A CUDA stream that symheap may enqueue work on.
///
/// Borrowed by every `*_on_stream` call for its duration. Work already enqueued keeps running
/// after a `Stream` is dropped (CUDA completes it before it releases an owned stream).
///
/// ```
/// // The default streams exist in every context; other streams come from
/// // `Context::create_stream`.
/// let s = symheap::Stream::legacy_default();
/// assert_eq!(s.raw(), 0);
/// ```
///
/// Safe code cannot forge a handle from an integer:
///
/// ```compile_fail
/// let forged = symheap::Stream::from_raw(0xdead_beef); // error: call to unsafe function
/// ```
///
/// Nor pass an integer where a stream is expected:
///
/// ```compile_fail
/// fn f(ctx: &symheap::Context) -> symheap::Result<()> {
///     ctx.sync_stream(0xdead_beef) // error: expected `&Stream`, found integer
/// }
/// ```
///
/// The backend's raw-address stream copies are not public either:
///
/// ```compile_fail
/// fn f(ctx: &symheap::Context) -> symheap::Result<()> {
///     let cu = ctx.cuda().unwrap();
///     cu.copy_on_stream(0x1000, 0x2000, 8, 0, symheap::Engine::Auto) // error: private
/// }
/// ```
#[derive(Debug)]
pub struct Stream {
    raw: u64,
    /// Set when symheap created the stream: it is destroyed when the last holder lets go (the
    /// value, or a buffer whose stream-ordered release still has to record an event on it),
    /// and the device's primary context is retained until then.
    owner: Option<Arc<Owner>>,
    /// The context the handle belongs to, learned on first use (a stream never changes context).
    ctx: OnceLock<u64>,
}

struct Owner {
    raw: u64,
    /// Dropped after the stream is destroyed (fields drop after `Drop::drop`).
    device: Device,
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.device.bind();
        driver::stream_destroy(driver::Stream(self.raw));
    }
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("owned")
    }
}

impl Stream {
    /// The legacy default stream (handle 0), which exists in every context.
    pub const fn legacy_default() -> Stream {
        Stream {
            raw: LEGACY,
            owner: None,
            ctx: OnceLock::new(),
        }
    }

    /// The calling thread's default stream (`CU_STREAM_PER_THREAD`).
    pub const fn per_thread_default() -> Stream {
        Stream {
            raw: PER_THREAD,
            owner: None,
            ctx: OnceLock::new(),
        }
    }

    /// Wraps a raw `CUstream` handle made elsewhere, for example
    /// `torch.cuda.current_stream().cuda_stream` or a cudarc stream's `cu_stream()`. The
    /// handle is not destroyed on drop.
    ///
    /// # Safety
    /// `raw` must be 0, 1 (`CU_STREAM_LEGACY`), 2 (`CU_STREAM_PER_THREAD`), or a stream created
    /// by the CUDA driver or runtime that stays live while the returned value exists and until
    /// every symmetric buffer used by a call on it has been released (a release records an
    /// event on each stream that used the buffer, as PyTorch's caching allocator does) and,
    /// once a team's collective ran on it, until that team's next collective on another stream
    /// (which first makes its stream wait for this one) or the context's end. On the
    /// host backend the handle is never used, so any value is fine there. That the stream
    /// belongs to the context's device is checked by every call that uses it.
    pub const unsafe fn from_raw(raw: u64) -> Stream {
        Stream {
            raw,
            owner: None,
            ctx: OnceLock::new(),
        }
    }

    /// The raw `CUstream` handle (for passing to other CUDA libraries).
    pub fn raw(&self) -> u64 {
        self.raw
    }

    /// Whether this is one of the default streams, which belong to whichever context is
    /// current.
    pub fn is_default(&self) -> bool {
        matches!(self.raw, LEGACY | LEGACY_NAMED | PER_THREAD)
    }

    /// A new non-blocking stream on `device` (whose context is current), owned by the value.
    pub(crate) fn create(device: Device) -> Result<Stream> {
        device.bind()?;
        let raw = driver::stream_create()?.0;
        Ok(Stream {
            raw,
            owner: Some(Arc::new(Owner { raw, device })),
            ctx: OnceLock::new(),
        })
    }

    /// What keeps an owned stream alive while symheap still has to enqueue on it later (the
    /// event of a buffer's stream-ordered release); `None` for a borrowed handle, which its
    /// owner keeps alive (the contract of [`Stream::from_raw`]).
    pub(crate) fn keep_alive(&self) -> Option<crate::heap::KeepAlive> {
        self.owner.clone().map(|o| o as crate::heap::KeepAlive)
    }

    /// Checks the stream belongs to context `ctx` (the caller's bound context) and returns the
    /// handle to enqueue on.
    pub(crate) fn checked(&self, ctx: u64, call: &'static str) -> Result<u64> {
        if self.is_default() {
            return Ok(self.raw);
        }
        let own = match self.ctx.get() {
            Some(&c) => c,
            None => {
                let c = driver::stream_context(self.raw).map_err(|e| {
                    invalid(
                        call,
                        format!("stream {:#x} is not a live CUDA stream: {e}", self.raw),
                    )
                })?;
                *self.ctx.get_or_init(|| c)
            }
        };
        if own != ctx {
            return Err(invalid(
                call,
                format!(
                    "stream {:#x} belongs to another CUDA context (another device, or a context \
                     other than the device's primary one); symheap enqueues only on streams of \
                     its own device's primary context",
                    self.raw
                ),
            ));
        }
        Ok(self.raw)
    }
}

impl Default for Stream {
    /// The legacy default stream.
    fn default() -> Stream {
        Stream::legacy_default()
    }
}
