//! The NVSHMEM provider's data path: put/get, put with signal, signal waits and int64 atomics on
//! its allocations, from the host and in stream order, to any PE.
//!
//! Routing per peer, from the table NVSHMEM gave at initialisation:
//! - a **direct** PE (NVSHMEM maps its heap here: NVLink, PCIe P2P, or the same GPU) is reached
//!   by symheap's own copies, kernels and atomics on that mapping, as symheap's heap is;
//! - any **other** PE (another node) through NVSHMEM's host and on-stream calls, over its
//!   network transport (IB, UCX, libfabric).
//!
//! So one program runs unchanged on one node and across nodes, and the table's 0 entries say
//! which peers a user's kernel must leave to NVSHMEM's device library (`nvshmem_putmem` and
//! friends in kernels linked with it) instead of storing through `peer_bases`. The direct
//! route is not only faster: NVSHMEM 3.4.5's host atomics to PEs it maps are "not implemented"
//! (they print so and return garbage), and with several PEs on one GPU (its limited MPG mode)
//! its `nvshmem_quiet` ends the process.
//!
//! Both sides of a transfer are places in this provider's allocations ([`At`]): NVSHMEM's
//! remote transports move only memory they registered, and requiring it on the direct route
//! too keeps a program that works on one node working across nodes.
//!
//! Waits are symheap's own (a host poll, or symheap's wait kernel on the stream), not
//! NVSHMEM's: they give up after `SYMHEAP_TIMEOUT` with an error naming the signal, where
//! NVSHMEM's wait would hang. The signal word is local, so no transport is involved.
//!
//! Known limits: a call to a PE on another node that died blocks inside NVSHMEM, which has no
//! timeout. Host atomics and host put-with-signal to other nodes use NVSHMEM's host atomics,
//! which its UCX and IBRC transports run only with GDRCopy; without it NVSHMEM ends the
//! process at its first proxy atomic (measured: at the first barrier, over UCX on loopback).

use super::nvshmem::Nvshmem;
use super::nvshmem_sys::{Amo64, CheckedStream, Session, SIGNAL_ADD, SIGNAL_SET};
use super::At;
use crate::error::{err, invalid, ErrorKind, Result};
use crate::{AtomicOp, Cmp, Engine, SignalOp, Stream};

fn signal_code(op: SignalOp) -> i32 {
    match op {
        SignalOp::Set => SIGNAL_SET,
        SignalOp::Add => SIGNAL_ADD,
    }
}

impl Nvshmem {
    /// Runs `f` on the live session with this PE's device current; its message becomes an
    /// `Invalid` error naming `call` and this PE.
    pub(super) fn on_session<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&Session) -> std::result::Result<T, String>,
    ) -> Result<T> {
        self.inner.check(call)?;
        let st = self.lock();
        let Some(session) = st.session.as_ref() else {
            return Err(self.finalized_error(call));
        };
        self.bind()?;
        f(session).map_err(|m| invalid(call, m).with_pe(self.rank))
    }

    /// The route to PE `pe` (see the module doc): `direct` gets the offset of PE `pe`'s copy
    /// from this PE's (`peer = local + offset`), `remote` the NVSHMEM session. Either runs with
    /// the session live (held: no finalize meanwhile) and the device current.
    fn route<T>(
        &self,
        call: &'static str,
        pe: usize,
        direct: impl FnOnce(u64) -> Result<T>,
        remote: impl FnOnce(&Session) -> std::result::Result<T, String>,
    ) -> Result<T> {
        if pe >= self.world {
            return Err(
                invalid(call, format!("PE {pe} is out of range (0..{})", self.world))
                    .with_pe(self.rank),
            );
        }
        match self.offsets[pe] {
            Some(off) => {
                self.inner.check(call)?;
                let st = self.lock();
                if st.session.is_none() {
                    return Err(self.finalized_error(call));
                }
                self.bind()?;
                direct(off as u64).map_err(|e| e.during(call).with_pe(self.rank))
            }
            None => self.on_session(call, remote),
        }
    }

    /// The addresses of a transfer's two places, both checked to hold `bytes`.
    fn pair(&self, call: &'static str, a: At<'_>, b: At<'_>, bytes: u64) -> Result<(u64, u64)> {
        let a = a
            .addr(self.id, call, bytes)
            .map_err(|e| e.with_pe(self.rank))?;
        let b = b
            .addr(self.id, call, bytes)
            .map_err(|e| e.with_pe(self.rank))?;
        Ok((a, b))
    }

    /// The CUDA backend (the provider exists only there).
    fn cuda(&self, call: &'static str) -> Result<&crate::backend::cuda::CudaBackend> {
        self.inner.backend.as_cuda().ok_or_else(|| {
            err(
                call,
                ErrorKind::Unsupported("the NVSHMEM provider runs on the CUDA backend".into()),
            )
        })
    }

    /// Whether any PE is reached through NVSHMEM rather than directly.
    fn has_remote_peers(&self) -> bool {
        self.offsets.iter().any(Option::is_none)
    }

    /// Not collective: copies `bytes` from this PE's `src` to PE `pe`'s `dst`. Direct PE: a
    /// copy into its mapped heap, complete when it returns. Other PE: `nvshmem_putmem`, which
    /// returns once `src` may be reused; the data is at PE `pe` after [`quiet`](Self::quiet)
    /// (or a [`barrier`](crate::Provider::barrier)). Work enqueued on streams is not waited
    /// for: synchronise the stream that wrote `src` first.
    pub fn put(&self, dst: At<'_>, src: At<'_>, bytes: u64, pe: usize) -> Result<()> {
        const CALL: &str = "Nvshmem::put";
        let (d, s) = self.pair(CALL, dst, src, bytes)?;
        self.route(
            CALL,
            pe,
            |off| {
                self.inner
                    .backend
                    .copy(d.wrapping_add(off), s, bytes as usize)
            },
            |x| x.putmem(d, s, bytes, pe),
        )
    }

    /// Not collective: copies `bytes` from PE `pe`'s `src` into this PE's `dst` (a copy from
    /// the mapped heap, or `nvshmem_getmem`); the data is there when it returns.
    pub fn get(&self, dst: At<'_>, src: At<'_>, bytes: u64, pe: usize) -> Result<()> {
        const CALL: &str = "Nvshmem::get";
        let (d, s) = self.pair(CALL, dst, src, bytes)?;
        self.route(
            CALL,
            pe,
            |off| {
                self.inner
                    .backend
                    .copy(d, s.wrapping_add(off), bytes as usize)
            },
            |x| x.getmem(d, s, bytes, pe),
        )
    }

    /// Not collective: this PE's host-issued puts to any one PE arrive in the order of the
    /// calls either side of it (`nvshmem_fence`; puts to direct PEs are complete on return).
    pub fn fence(&self) -> Result<()> {
        self.completion("Nvshmem::fence", Session::fence)
    }

    /// Not collective: every put and atomic this PE issued from the host is complete at its
    /// target (`nvshmem_quiet`; those to direct PEs already are).
    pub fn quiet(&self) -> Result<()> {
        self.completion("Nvshmem::quiet", Session::quiet)
    }

    /// `fence` and `quiet`: NVSHMEM's call when some PE is reached through it. In NVSHMEM's
    /// limited MPG mode that call would end the process, so it is an error instead.
    fn completion(&self, call: &'static str, f: fn(&Session)) -> Result<()> {
        let remote = self.has_remote_peers();
        self.on_session(call, |x| {
            if !remote {
                return Ok(());
            }
            if x.limited_mpg() {
                return Err(limited_mpg(call));
            }
            f(x);
            Ok(())
        })
    }

    /// Not collective: puts `bytes` from `src` to PE `pe`'s `dst`, then updates PE `pe`'s
    /// 64-bit signal word `sig` with `op` and `value`. A PE that sees the signal change also
    /// sees the data. Direct PE: a copy, then an atomic on the mapped word. Other PE:
    /// `nvshmem_putmem`, `nvshmem_fence`, an int64 atomic on the word (NVSHMEM's host API has
    /// no put-with-signal; its host atomics to other nodes need GDRCopy, see the module doc).
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal(
        &self,
        dst: At<'_>,
        src: At<'_>,
        bytes: u64,
        sig: At<'_>,
        value: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        const CALL: &str = "Nvshmem::put_signal";
        let (d, s) = self.pair(CALL, dst, src, bytes)?;
        let g = self.word(CALL, sig)?;
        let (aop, amo) = match op {
            SignalOp::Set => (AtomicOp::Store, Amo64::Set),
            SignalOp::Add => (AtomicOp::Add, Amo64::FetchAdd),
        };
        let be = &self.inner.backend;
        self.route(
            CALL,
            pe,
            |off| {
                be.copy(d.wrapping_add(off), s, bytes as usize)?;
                be.atomic(g.wrapping_add(off), 8, aop, value, 0).map(drop)
            },
            |x| {
                x.putmem(d, s, bytes, pe)?;
                x.fence();
                x.amo(amo, g, value as i64, 0, pe).map(drop)
            },
        )
    }

    /// An 8-byte aligned word of this provider's allocation, on this PE.
    fn word(&self, call: &'static str, at: At<'_>) -> Result<u64> {
        let g = at
            .addr(self.id, call, 8)
            .map_err(|e| e.with_pe(self.rank))?;
        if g % 8 != 0 {
            return Err(
                invalid(call, format!("word address {g:#x} is not 8-byte aligned"))
                    .with_pe(self.rank),
            );
        }
        Ok(g)
    }

    /// Not collective: waits until this PE's 64-bit word `sig` satisfies `word CMP value` and
    /// returns it. Data put before the signal is visible when it returns. Fails after
    /// `SYMHEAP_TIMEOUT`, or when the job fails, naming the signal.
    pub fn signal_wait_until(&self, sig: At<'_>, cmp: Cmp, value: u64) -> Result<u64> {
        const CALL: &str = "Nvshmem::signal_wait_until";
        let g = self.waited_word(CALL, sig)?;
        let be = &self.inner.backend;
        let mut seen = 0u64;
        let mut failed = None;
        self.inner.wait_until(
            CALL,
            &|| format!("NVSHMEM signal at {g:#x} to become {cmp:?} {value}"),
            &mut || match be.atomic(g, 8, AtomicOp::Load, 0, 0) {
                Ok(v) => {
                    seen = v;
                    cmp.holds(v, value)
                }
                Err(e) => {
                    failed = Some(e);
                    true
                }
            },
            &Vec::new,
            None,
        )?;
        match failed {
            Some(e) => Err(e.during(CALL).with_pe(self.rank)),
            None => Ok(seen),
        }
    }

    /// A word of this PE's to wait on, while the provider is not finalized (the wait itself
    /// holds no lock: the put it waits for may come from another thread of this process).
    fn waited_word(&self, call: &'static str, sig: At<'_>) -> Result<u64> {
        self.inner.check(call)?;
        if self.lock().session.is_none() {
            return Err(self.finalized_error(call));
        }
        self.word(call, sig)
    }

    /// Not collective: an atomic `op` on PE `pe`'s int64 word `dst`; returns the word's old
    /// value (the value read for `Load`). `compare` is used by `CompareSwap` only. Direct PE:
    /// symheap's atomic on the mapped word. Other PE: NVSHMEM's host atomic (needs GDRCopy on
    /// its UCX and IBRC transports, see the module doc).
    pub fn atomic_i64(
        &self,
        dst: At<'_>,
        op: AtomicOp,
        operand: i64,
        compare: i64,
        pe: usize,
    ) -> Result<i64> {
        const CALL: &str = "Nvshmem::atomic_i64";
        let d = self.word(CALL, dst)?;
        let amo = match op {
            AtomicOp::Load => Amo64::Fetch,
            AtomicOp::Store => Amo64::Set,
            AtomicOp::Swap => Amo64::Swap,
            AtomicOp::CompareSwap => Amo64::CompareSwap,
            AtomicOp::Add => Amo64::FetchAdd,
            AtomicOp::And => Amo64::FetchAnd,
            AtomicOp::Or => Amo64::FetchOr,
            AtomicOp::Xor => Amo64::FetchXor,
        };
        self.route(
            CALL,
            pe,
            |off| {
                self.inner
                    .backend
                    .atomic(d.wrapping_add(off), 8, op, operand as u64, compare as u64)
                    .map(|v| v as i64)
            },
            |x| x.amo(amo, d, operand, compare, pe),
        )
    }

    /// The stream's handle, checked for this context's device.
    fn checked(&self, stream: &Stream, call: &'static str) -> Result<CheckedStream> {
        CheckedStream::new(&self.inner, stream, call)
    }

    /// Not collective: enqueues a put of `bytes` from `src` to PE `pe`'s `dst` on `stream`: it
    /// runs after the stream's earlier work, and later work may reuse `src`. Direct PE: the
    /// copy engines into the mapped heap. Other PE: `nvshmemx_putmem_on_stream`.
    pub fn put_on_stream(
        &self,
        dst: At<'_>,
        src: At<'_>,
        bytes: u64,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "Nvshmem::put_on_stream";
        let (d, s) = self.pair(CALL, dst, src, bytes)?;
        let cs = self.checked(stream, CALL)?;
        let cu = self.cuda(CALL)?;
        self.route(
            CALL,
            pe,
            |off| cu.copy_on_stream(d.wrapping_add(off), s, bytes, cs.raw(), Engine::Auto),
            |x| x.putmem_on_stream(d, s, bytes, pe, cs),
        )
    }

    /// Not collective: enqueues a get of `bytes` from PE `pe`'s `src` into this PE's `dst` on
    /// `stream`; later work on the stream sees the data. (Copy engines from the mapped heap,
    /// or `nvshmemx_getmem_on_stream`.)
    pub fn get_on_stream(
        &self,
        dst: At<'_>,
        src: At<'_>,
        bytes: u64,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "Nvshmem::get_on_stream";
        let (d, s) = self.pair(CALL, dst, src, bytes)?;
        let cs = self.checked(stream, CALL)?;
        let cu = self.cuda(CALL)?;
        self.route(
            CALL,
            pe,
            |off| cu.copy_on_stream(d, s.wrapping_add(off), bytes, cs.raw(), Engine::Auto),
            |x| x.getmem_on_stream(d, s, bytes, pe, cs),
        )
    }

    /// Not collective: enqueues a put of `bytes` from `src` to PE `pe`'s `dst`, then the
    /// update of PE `pe`'s 64-bit signal word `sig` with `op` and `value`, on `stream`. A PE
    /// whose wait sees the signal sees the data. (symheap's put-with-signal kernel into the
    /// mapped heap, or `nvshmemx_putmem_signal_on_stream`.)
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_on_stream(
        &self,
        dst: At<'_>,
        src: At<'_>,
        bytes: u64,
        sig: At<'_>,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "Nvshmem::put_signal_on_stream";
        let (d, s) = self.pair(CALL, dst, src, bytes)?;
        let g = self.word(CALL, sig)?;
        let cs = self.checked(stream, CALL)?;
        let cu = self.cuda(CALL)?;
        let add = op == SignalOp::Add;
        self.route(
            CALL,
            pe,
            |off| {
                let (pd, pg) = (d.wrapping_add(off), g.wrapping_add(off));
                cu.put_signal_on_stream(pd, s, bytes, pg, value, add, cs.raw())
            },
            |x| x.putmem_signal_on_stream(d, s, bytes, g, value, signal_code(op), pe, cs),
        )
    }

    /// Not collective: enqueues the update of PE `pe`'s 64-bit signal word `sig` with `op` and
    /// `value` on `stream` (symheap's signal kernel on the mapped word, or
    /// `nvshmemx_signal_op_on_stream`).
    pub fn signal_on_stream(
        &self,
        sig: At<'_>,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "Nvshmem::signal_on_stream";
        let g = self.word(CALL, sig)?;
        let cs = self.checked(stream, CALL)?;
        let cu = self.cuda(CALL)?;
        let add = op == SignalOp::Add;
        self.route(
            CALL,
            pe,
            |off| cu.signal_on_stream(g.wrapping_add(off), value, add, cs.raw()),
            |x| x.signal_op_on_stream(g, value, signal_code(op), pe, cs),
        )
    }

    /// Not collective: enqueues a wait on `stream` until this PE's 64-bit word `sig` satisfies
    /// `word CMP value`; work after it on the stream sees the data put before the signal.
    /// symheap's wait kernel, not NVSHMEM's: it gives up after `SYMHEAP_TIMEOUT`, and
    /// [`Context::sync_stream`](crate::Context::sync_stream) reports that as an error.
    pub fn signal_wait_until_on_stream(
        &self,
        sig: At<'_>,
        cmp: Cmp,
        value: u64,
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "Nvshmem::signal_wait_until_on_stream";
        let g = self.waited_word(CALL, sig)?;
        let cs = self.checked(stream, CALL)?;
        let cu = self.cuda(CALL)?;
        cu.wait_on_stream(g, crate::ops::stream::cmp_code(cmp), value, cs.raw())
            .map_err(|e| e.with_pe(self.rank))
    }

    /// Not collective: enqueues on `stream` the completion of this PE's stream-ordered puts
    /// and signals: work after it sees them done at their targets. Those to direct PEs are
    /// stream-ordered copies and kernels, done when the stream reaches this point; those
    /// through NVSHMEM need `nvshmemx_quiet_on_stream` (refused, not run, in NVSHMEM's limited
    /// MPG mode, where NVSHMEM's completion calls end the process).
    pub fn quiet_on_stream(&self, stream: &Stream) -> Result<()> {
        const CALL: &str = "Nvshmem::quiet_on_stream";
        let cs = self.checked(stream, CALL)?;
        let remote = self.has_remote_peers();
        self.on_session(CALL, |x| {
            if !remote {
                return Ok(());
            }
            if x.limited_mpg() {
                return Err(limited_mpg(CALL));
            }
            x.quiet_on_stream(cs);
            Ok(())
        })
    }
}

/// Why a completion call is refused in NVSHMEM's limited MPG mode.
fn limited_mpg(call: &str) -> String {
    format!(
        "{call}: NVSHMEM runs several PEs per GPU without MPS here (its limited MPG mode), where it refuses its completion calls by ending the process, and some PE is reached only through NVSHMEM; run one PE per GPU, or under the CUDA MPS daemon"
    )
}
