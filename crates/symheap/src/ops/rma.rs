//! Remote memory access: put, get, their non-blocking forms, fence and quiet, put-with-signal and
//! signal waits.
//!
//! Addresses name symmetric memory as NVSHMEM does: an address in this PE's own heap (or a
//! buffer and an element index), plus the PE whose copy is meant.

use std::sync::atomic::{fence, Ordering};

use crate::backend::AtomicOp;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::{invalid, Result};
use crate::SymmetricBuffer;

/// How `put_signal` updates the signal word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignalOp {
    /// Overwrite with the value.
    Set,
    /// Add the value.
    Add,
}

/// Comparison for waits: `signal CMP value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// ==
    Eq,
    /// !=
    Ne,
    /// >
    Gt,
    /// >=
    Ge,
    /// <
    Lt,
    /// <=
    Le,
}

impl Cmp {
    /// Whether `x CMP value` holds.
    pub fn holds(self, x: u64, value: u64) -> bool {
        match self {
            Cmp::Eq => x == value,
            Cmp::Ne => x != value,
            Cmp::Gt => x > value,
            Cmp::Ge => x >= value,
            Cmp::Lt => x < value,
            Cmp::Le => x <= value,
        }
    }

    /// Parses `eq ne gt ge lt le` (and `== != > >= < <=`).
    pub fn parse(s: &str) -> Option<Cmp> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "eq" | "==" => Cmp::Eq,
            "ne" | "!=" => Cmp::Ne,
            "gt" | ">" => Cmp::Gt,
            "ge" | ">=" => Cmp::Ge,
            "lt" | "<" => Cmp::Lt,
            "le" | "<=" => Cmp::Le,
            _ => return None,
        })
    }
}

/// Byte range of `count` elements of `T` at element `index` of `buf`, checked.
pub(crate) fn elem_range<T: Element>(
    buf: &SymmetricBuffer,
    index: usize,
    count: usize,
    call: &'static str,
) -> Result<u64> {
    let sz = std::mem::size_of::<T>() as u64;
    let start = (index as u64).checked_mul(sz);
    let end = start.and_then(|s| s.checked_add(count as u64 * sz));
    match (start, end) {
        (Some(s), Some(e)) if e <= buf.len_bytes() => Ok(buf.addr() + s),
        _ => Err(invalid(
            call,
            format!(
                "{count} elements of {} at index {index} exceed the buffer's {} bytes",
                T::DTYPE,
                buf.len_bytes()
            ),
        )
        .with_pe(buf.inner().rank)),
    }
}

impl Context {
    /// Copies `src` into PE `pe`'s copy of the symmetric range at `dest` (an address in this
    /// PE's heap). Returns when `src` may be reused; the data is delivered by the next
    /// `quiet`, `fence`, barrier or signal. A PE blocked in `signal_wait_until` on these bytes
    /// wakes at the next of those (or, with none, within the wait's nap of 10 ms).
    pub fn put_bytes(&self, dest: u64, src: &[u8], pe: usize) -> Result<()> {
        const CALL: &str = "put";
        self.inner.check(CALL)?;
        let remote = self.inner.remote(dest, src.len() as u64, pe, CALL)?;
        self.inner.backend.write_bytes(remote, src)
    }

    /// Copies PE `pe`'s copy of the symmetric range at `src` into `dest`. Returns when the data
    /// is in `dest`.
    pub fn get_bytes(&self, dest: &mut [u8], src: u64, pe: usize) -> Result<()> {
        const CALL: &str = "get";
        self.inner.check(CALL)?;
        let remote = self.inner.remote(src, dest.len() as u64, pe, CALL)?;
        self.inner.backend.read_bytes(remote, dest)
    }

    /// Typed put: `src` into element `index` onwards of PE `pe`'s copy of `dest`.
    pub fn put<T: Element>(
        &self,
        dest: &SymmetricBuffer,
        index: usize,
        src: &[T],
        pe: usize,
    ) -> Result<()> {
        let at = elem_range::<T>(dest, index, src.len(), "put")?;
        self.put_bytes(at, bytemuck::cast_slice(src), pe)
    }

    /// Typed get: element `index` onwards of PE `pe`'s copy of `src` into `dest`.
    pub fn get<T: Element>(
        &self,
        dest: &mut [T],
        src: &SymmetricBuffer,
        index: usize,
        pe: usize,
    ) -> Result<()> {
        let at = elem_range::<T>(src, index, dest.len(), "get")?;
        self.get_bytes(bytemuck::cast_slice_mut(dest), at, pe)
    }

    /// Non-blocking put: may return before the data is delivered; `quiet` completes it. On the
    /// host backend the copy is done by the time it returns (a valid completion order).
    pub fn put_nbi<T: Element>(
        &self,
        dest: &SymmetricBuffer,
        index: usize,
        src: &[T],
        pe: usize,
    ) -> Result<()> {
        self.put(dest, index, src, pe)
    }

    /// Non-blocking get: `dest` is valid after `quiet`. The borrow of `dest` ends at return, so
    /// this backend completes the copy before returning.
    pub fn get_nbi<T: Element>(
        &self,
        dest: &mut [T],
        src: &SymmetricBuffer,
        index: usize,
        pe: usize,
    ) -> Result<()> {
        self.get(dest, src, index, pe)
    }

    /// Completes every put, get and atomic this PE issued: they are visible at their targets
    /// when it returns.
    pub fn quiet(&self) -> Result<()> {
        self.inner.check("quiet")?;
        self.inner.backend.fence();
        self.inner.ring_data_all();
        Ok(())
    }

    /// Orders this PE's puts to each PE: those issued before the fence arrive before those
    /// issued after it.
    pub fn fence(&self) -> Result<()> {
        self.inner.check("fence")?;
        self.inner.backend.fence();
        self.inner.ring_data_all();
        Ok(())
    }

    /// Puts `src` into PE `pe`'s copy of `dest` at `index`, then updates PE `pe`'s signal word
    /// at element `sig_index` of `signal` (u64 words) with `op`/`value`. A PE that sees the
    /// signal change also sees the data.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal<T: Element>(
        &self,
        dest: &SymmetricBuffer,
        index: usize,
        src: &[T],
        signal: &SymmetricBuffer,
        sig_index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        const CALL: &str = "put_signal";
        let at = elem_range::<T>(dest, index, src.len(), CALL)?;
        let sig = elem_range::<u64>(signal, sig_index, 1, CALL)?;
        self.put_signal_bytes(at, bytemuck::cast_slice(src), sig, value, op, pe)
    }

    /// `put_signal` on addresses: `src` into PE `pe`'s copy of the symmetric range at `dest`,
    /// then PE `pe`'s u64 signal word at symmetric address `sig` updated with `op`/`value`.
    /// Both addresses are checked before any data moves.
    pub fn put_signal_bytes(
        &self,
        dest: u64,
        src: &[u8],
        sig: u64,
        value: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        const CALL: &str = "put_signal";
        self.inner.check(CALL)?;
        if sig % 8 != 0 {
            return Err(invalid(
                CALL,
                format!("signal address {sig:#x} is not 8-byte aligned"),
            )
            .with_pe(self.my_pe()));
        }
        let remote = self.inner.remote(dest, src.len() as u64, pe, CALL)?;
        let remote_sig = self.inner.remote(sig, 8, pe, CALL)?;
        self.inner.backend.write_bytes(remote, src)?;
        // Release: the data is globally visible before the signal can be observed.
        self.inner.backend.fence();
        let aop = match op {
            SignalOp::Set => AtomicOp::Store,
            SignalOp::Add => AtomicOp::Add,
        };
        self.inner.backend.atomic(remote_sig, 8, aop, value, 0)?;
        self.inner.ring_data(pe);
        self.inner.tally_signal(pe, sig - self.inner.mem.own_base);
        Ok(())
    }

    /// Non-blocking form of `put_signal` (completes before returning on this backend).
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_nbi<T: Element>(
        &self,
        dest: &SymmetricBuffer,
        index: usize,
        src: &[T],
        signal: &SymmetricBuffer,
        sig_index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        self.put_signal(dest, index, src, signal, sig_index, value, op, pe)
    }

    /// Waits until this PE's signal word at `index` of `signal` satisfies `word CMP value`;
    /// returns the word. Data put before the signal is visible when it returns. Fails after
    /// `SYMHEAP_TIMEOUT` or when the job fails.
    pub fn signal_wait_until(
        &self,
        signal: &SymmetricBuffer,
        index: usize,
        cmp: Cmp,
        value: u64,
    ) -> Result<u64> {
        let at = elem_range::<u64>(signal, index, 1, "signal_wait_until")?;
        self.signal_wait_until_addr(at, cmp, value)
    }

    /// `signal_wait_until` on a u64 word at `addr` in this PE's heap.
    pub fn signal_wait_until_addr(&self, addr: u64, cmp: Cmp, value: u64) -> Result<u64> {
        const CALL: &str = "signal_wait_until";
        self.inner.check(CALL)?;
        self.inner.aligned(CALL, "signal word", addr, DType::U64)?;
        self.inner.own_offset(addr, 8, CALL)?;
        let be = &self.inner.backend;
        let seen = std::cell::Cell::new(be.atomic(addr, 8, AtomicOp::Load, 0, 0)?);
        if !cmp.holds(seen.get(), value) {
            // Who had signalled this PE when the wait began, so a timeout can name who did not.
            let before = self.inner.tallies_to_me();
            let off = addr - self.inner.mem.own_base;
            self.inner.wait_until(
                CALL,
                &|| {
                    let (_, sent) = self.inner.silent_signallers(off, &before);
                    let is = seen.get();
                    format!("signal at {addr:#x} to become {cmp:?} {value} (it is {is}; {sent})")
                },
                &mut || {
                    seen.set(be.atomic(addr, 8, AtomicOp::Load, 0, 0).unwrap_or(0));
                    cmp.holds(seen.get(), value)
                },
                &|| self.inner.silent_signallers(off, &before).0,
                None,
            )?;
        }
        // Acquire: reads after the wait see the data published before the signal.
        fence(Ordering::SeqCst);
        Ok(seen.get())
    }

    /// Reads this PE's signal word at `index` of `signal`.
    pub fn signal_fetch(&self, signal: &SymmetricBuffer, index: usize) -> Result<u64> {
        const CALL: &str = "signal_fetch";
        let at = elem_range::<u64>(signal, index, 1, CALL)?;
        self.inner.check(CALL)?;
        // A revoked buffer is refused here as at any other call.
        self.inner.own_offset(at, 8, CALL)?;
        self.inner.backend.atomic(at, 8, AtomicOp::Load, 0, 0)
    }
}
