//! NVSHMEM's data-path calls on a [`Session`]: host and on-stream put/get, signals, int64
//! atomics, fence and quiet. Every call checks its PE and that its ranges lie in live
//! symmetric allocations before NVSHMEM sees them (NVSHMEM checks nothing).

use std::ffi::{c_int, c_void};

use super::{Amo64, CheckedStream, Rma, RmaOnStream, Session};

impl Session {
    /// The checks every data-path call makes: `pe` in range, both ranges symmetric. Returns
    /// the size and PE as NVSHMEM takes them.
    fn rma_args(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        pe: usize,
    ) -> Result<(usize, c_int), String> {
        let size =
            usize::try_from(bytes).map_err(|_| format!("{bytes} bytes do not fit size_t"))?;
        let pe_c = self.pe_arg(pe)?;
        for (what, p) in [("destination", dst), ("source", src)] {
            if !self.covers(p, bytes) {
                return Err(format!(
                    "the {what} range [{p:#x}, +{bytes}) is not inside one live NVSHMEM allocation (NVSHMEM moves data only between symmetric allocations)"
                ));
            }
        }
        Ok((size, pe_c))
    }

    fn pe_arg(&self, pe: usize) -> Result<c_int, String> {
        if pe >= self.n {
            return Err(format!("PE {pe} is out of range (0..{})", self.n));
        }
        Ok(pe as c_int)
    }

    /// An 8-byte aligned word of a live allocation (signals, int64 atomics).
    fn word_arg(&self, p: u64, pe: usize) -> Result<c_int, String> {
        if p % 8 != 0 || !self.covers(p, 8) {
            return Err(format!(
                "{p:#x} is not an 8-byte aligned word inside a live NVSHMEM allocation"
            ));
        }
        self.pe_arg(pe)
    }

    /// `nvshmem_putmem`: returns once `src` may be reused; complete at PE `pe` after
    /// [`quiet`](Self::quiet).
    pub(crate) fn putmem(&self, dst: u64, src: u64, bytes: u64, pe: usize) -> Result<(), String> {
        self.rma(self.api.putmem, dst, src, bytes, pe)
    }

    /// `nvshmem_getmem`: returns once PE `pe`'s `src` arrived in the local `dst`.
    pub(crate) fn getmem(&self, dst: u64, src: u64, bytes: u64, pe: usize) -> Result<(), String> {
        self.rma(self.api.getmem, dst, src, bytes, pe)
    }

    /// `putmem` or `getmem` (`f`), once the ranges and PE are checked.
    fn rma(&self, f: Rma, dst: u64, src: u64, bytes: u64, pe: usize) -> Result<(), String> {
        let (size, pe) = self.rma_args(dst, src, bytes, pe)?;
        if size > 0 {
            // SAFETY: `f` is `nvshmem_putmem` or `nvshmem_getmem` of a live session; both
            // ranges lie inside live symmetric allocations (checked above) and `pe` is a valid
            // PE, so NVSHMEM reads and writes only memory it allocated. The caller made the
            // device current.
            unsafe { f(dst as *mut c_void, src as *const c_void, size, pe) };
        }
        Ok(())
    }

    /// `nvshmem_fence`: this PE's puts to one PE arrive in order across it.
    pub(crate) fn fence(&self) {
        // SAFETY: NVSHMEM is initialised; the call takes no arguments.
        unsafe { (self.api.fence)() }
    }

    /// `nvshmem_quiet`: every put and AMO this PE issued from the host is complete.
    pub(crate) fn quiet(&self) {
        // SAFETY: NVSHMEM is initialised; the call takes no arguments.
        unsafe { (self.api.quiet)() }
    }

    /// `nvshmemx_putmem_on_stream`.
    pub(crate) fn putmem_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        pe: usize,
        s: CheckedStream,
    ) -> Result<(), String> {
        self.rma_on_stream(self.api.putmem_on_stream, dst, src, bytes, pe, s)
    }

    /// `nvshmemx_getmem_on_stream`.
    pub(crate) fn getmem_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        pe: usize,
        s: CheckedStream,
    ) -> Result<(), String> {
        self.rma_on_stream(self.api.getmem_on_stream, dst, src, bytes, pe, s)
    }

    /// `putmem_on_stream` or `getmem_on_stream` (`f`), once the ranges and PE are checked.
    fn rma_on_stream(
        &self,
        f: RmaOnStream,
        dst: u64,
        src: u64,
        bytes: u64,
        pe: usize,
        s: CheckedStream,
    ) -> Result<(), String> {
        let (size, pe) = self.rma_args(dst, src, bytes, pe)?;
        if size > 0 {
            // SAFETY: as in `rma`; the stream is live (a `Stream`'s contract) and on this
            // context's device (`CheckedStream`).
            unsafe {
                f(
                    dst as *mut c_void,
                    src as *const c_void,
                    size,
                    pe,
                    s.0 as *mut c_void,
                )
            };
        }
        Ok(())
    }

    /// `nvshmemx_putmem_signal_on_stream`: the data, then PE `pe`'s signal word `sig` updated
    /// with `op` (`SIGNAL_SET` / `SIGNAL_ADD`) and `value`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn putmem_signal_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        sig: u64,
        value: u64,
        op: c_int,
        pe: usize,
        s: CheckedStream,
    ) -> Result<(), String> {
        let (size, pe) = self.rma_args(dst, src, bytes, pe)?;
        self.word_arg(sig, pe as usize)?;
        // SAFETY: as in `rma_on_stream`; `sig` is an aligned word of a live allocation and
        // `op` one of NVSHMEM's two signal operations (the callers pass the constants).
        unsafe {
            (self.api.putmem_signal_on_stream)(
                dst as *mut c_void,
                src as *const c_void,
                size,
                sig as *mut u64,
                value,
                op,
                pe,
                s.0 as *mut c_void,
            )
        };
        Ok(())
    }

    /// `nvshmemx_signal_op_on_stream`.
    pub(crate) fn signal_op_on_stream(
        &self,
        sig: u64,
        value: u64,
        op: c_int,
        pe: usize,
        s: CheckedStream,
    ) -> Result<(), String> {
        let pe = self.word_arg(sig, pe)?;
        // SAFETY: as in `putmem_signal_on_stream`.
        unsafe {
            (self.api.signal_op_on_stream)(sig as *mut u64, value, op, pe, s.0 as *mut c_void)
        };
        Ok(())
    }

    /// `nvshmemx_quiet_on_stream`: work after it on the stream sees this PE's stream-ordered
    /// puts complete at their targets.
    pub(crate) fn quiet_on_stream(&self, s: CheckedStream) {
        // SAFETY: NVSHMEM is initialised; the stream is live and on this device.
        unsafe { (self.api.quiet_on_stream)(s.0 as *mut c_void) }
    }

    /// An int64 atomic on PE `pe`'s word `dst` (host-initiated); returns the old value (or the
    /// value read; 0 for `Set`). `cond` is used by `CompareSwap` only.
    pub(crate) fn amo(
        &self,
        op: Amo64,
        dst: u64,
        value: i64,
        cond: i64,
        pe: usize,
    ) -> Result<i64, String> {
        let pe = self.word_arg(dst, pe)?;
        let p = dst as *mut i64;
        // SAFETY: NVSHMEM is initialised; `dst` is an aligned int64 word of a live symmetric
        // allocation and `pe` a valid PE (checked above); the caller made the device current.
        let old = unsafe {
            match op {
                Amo64::Fetch => (self.api.amo_fetch)(p, pe),
                Amo64::Set => {
                    (self.api.amo_set)(p, value, pe);
                    0
                }
                Amo64::Swap => (self.api.amo_swap)(p, value, pe),
                Amo64::CompareSwap => (self.api.amo_compare_swap)(p, cond, value, pe),
                Amo64::FetchAdd => (self.api.amo_fetch_add)(p, value, pe),
                Amo64::FetchAnd => (self.api.amo_fetch_and)(p, value, pe),
                Amo64::FetchOr => (self.api.amo_fetch_or)(p, value, pe),
                Amo64::FetchXor => (self.api.amo_fetch_xor)(p, value, pe),
            }
        };
        Ok(old)
    }
}
