//! The host engine's transport: a collective as a sequence of backend steps between team
//! barriers ([`Coll`]: the entry barrier, which records the call and may carry each member's
//! payload, member-to-member copies and reductions read straight from peers' copies, the exit
//! barrier), and the checks of its ranges. The kinds' host steps are written with it;
//! `engine/host.rs` says when it runs and what one pass is.

use std::sync::Arc;

use crate::backend::{AnyBackend, ReduceOp};
use crate::context::area::{INLINE, NARROW, PAYLOAD};
use crate::context::team::{Team, TeamGuard, TeamInner};
use crate::context::watch::CallKey;
use crate::context::{Context, Inner};
use crate::element::DType;
use crate::error::{invalid, Error, Result};

/// Most members whose inline payloads a one-pass all_reduce reduces on the stack.
pub(in crate::ops::coll) const INLINE_MEMBERS: usize = 16;

/// A collective in flight: the team, its lock, and the member addresses of symmetric ranges.
pub(in crate::ops::coll) struct Coll<'a> {
    inner: &'a Inner,
    team: &'a TeamInner,
    st: TeamGuard<'a>,
    call: &'static str,
    /// The entry barrier's payloads rode inline in the arrivals (see `Coll::payload`).
    inline: bool,
}

/// Calls `f` with the addresses `at(0..n)`: on the stack for small teams (the common case, which
/// then allocates nothing), else in a Vec.
pub(in crate::ops::coll) fn with_sources<R>(
    n: usize,
    at: impl Fn(usize) -> u64,
    f: impl FnOnce(&[u64]) -> R,
) -> R {
    let mut inline = [0u64; 16];
    if n <= inline.len() {
        for (j, s) in inline.iter_mut().enumerate().take(n) {
            *s = at(j);
        }
        f(&inline[..n])
    } else {
        f(&(0..n).map(at).collect::<Vec<u64>>())
    }
}

impl<'a> Coll<'a> {
    /// Validates, records in the team's ledger and runs the entry barrier. None on INVALID.
    /// `nums` determine the argument text `args` formats (see `Inner::record_keyed`: a call
    /// repeated with the same numbers is recorded without formatting it again).
    pub(in crate::ops::coll) fn begin(
        inner: &'a Inner,
        team: &'a Team,
        call: &'static str,
        nums: [u64; 8],
        args: impl FnOnce() -> String,
    ) -> Result<Option<Coll<'a>>> {
        Self::begin_staged(inner, team, call, nums, args, 0, &mut |_| Ok(0))
    }

    /// Validates, locks the team and records the call in its ledger. None on INVALID.
    /// `inline` says, alike on every member, that the entry barrier's payloads ride inline (see
    /// `begin_staged`).
    fn begin_recorded(
        inner: &'a Inner,
        team: &'a Team,
        call: &'static str,
        nums: [u64; 8],
        args: impl FnOnce() -> String,
        inline: bool,
    ) -> Result<Option<Coll<'a>>> {
        let Some(mut c) = Self::lock(inner, team, call, inline)? else {
            return Ok(None);
        };
        inner.record_keyed(c.team, &mut c.st, CallKey { call, nums }, args);
        Ok(Some(c))
    }

    /// Validates and locks the team, recording nothing. None on INVALID.
    fn lock(
        inner: &'a Inner,
        team: &'a Team,
        call: &'static str,
        inline: bool,
    ) -> Result<Option<Coll<'a>>> {
        let Some(t) = inner.team_inner(team, call)? else {
            return Ok(None);
        };
        let reachable = |m: usize| inner.mem.slot_base(m).is_some();
        if let Some(&m) = (!inner.area.all_direct())
            .then(|| t.members.iter().find(|&&m| !reachable(m)))
            .flatten()
        {
            return Err(Error::new(
                Some(inner.rank),
                call,
                crate::ErrorKind::Unsupported(format!(
                    "PE {m} is on another node; the {} backend's collectives reach only PEs of this node",
                    inner.backend.kind().name()
                )),
            ));
        }
        let t: &'a Arc<TeamInner> = t;
        Ok(Some(Coll {
            inner,
            team: t,
            st: t.lock(),
            call,
            inline,
        }))
    }

    /// `begin` whose entry barrier also publishes a payload that `stage` writes and sizes (see
    /// `Inner::barrier_staged`); the members' payloads are then at [`Coll::payload`], or read
    /// with [`Coll::read_inline`]. `inline` is, alike on every member, the payload size that
    /// rides inline in the arrivals (at most [`INLINE`]; 0: none; `stage` then returns the
    /// size of its own).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::ops::coll) fn begin_staged(
        inner: &'a Inner,
        team: &'a Team,
        call: &'static str,
        nums: [u64; 8],
        args: impl FnOnce() -> String,
        inline: usize,
        stage: &mut dyn FnMut(u64) -> Result<usize>,
    ) -> Result<Option<Coll<'a>>> {
        let Some(mut c) = Self::begin_recorded(inner, team, call, nums, args, inline > 0)? else {
            return Ok(None);
        };
        let wide = inline as u64 > NARROW;
        inner.team_sync_staged(c.team, &mut c.st, call, 0, wide, stage)?;
        Ok(Some(c))
    }

    pub(in crate::ops::coll) fn n(&self) -> usize {
        self.team.members.len()
    }

    pub(in crate::ops::coll) fn me(&self) -> usize {
        self.team.me
    }

    /// Member `j`'s copy of the byte at own-heap address `addr`.
    pub(in crate::ops::coll) fn at(&self, j: usize, addr: u64) -> u64 {
        let own = self.inner.mem.slot_base(self.inner.rank).expect("own heap");
        let theirs = self
            .inner
            .mem
            .slot_base(self.team.members[j])
            .expect("checked direct");
        theirs + (addr - own)
    }

    /// Member `j`'s payload of the entry barrier in its own area (see `begin_staged`; this
    /// PE's own, also when the payloads rode inline).
    pub(in crate::ops::coll) fn payload(&self, j: usize) -> u64 {
        let m = self.team.members[j];
        self.inner.area().payload(m, self.team.slot, self.st.epoch)
    }

    /// Member `j`'s inline payload of the entry barrier into `out` (from its arrival in this
    /// PE's area; this PE's own from its payload).
    pub(in crate::ops::coll) fn read_inline(&self, j: usize, out: &mut [u8]) {
        debug_assert!(self.inline);
        if j == self.me() {
            self.inner.control.read(self.payload(j), out);
        } else {
            let m = self.team.members[j];
            self.inner
                .read_inline(self.team.slot, m, self.st.epoch, out);
        }
    }

    pub(in crate::ops::coll) fn barrier(&mut self) -> Result<()> {
        self.inner
            .barrier_core(self.team, &mut self.st, self.call, 0, 0)
            .map(drop)
    }

    pub(in crate::ops::coll) fn end(mut self) -> Result<()> {
        self.barrier()
    }

    pub(in crate::ops::coll) fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if dst == src || bytes == 0 {
            return Ok(());
        }
        self.inner.backend.copy(dst, src, bytes)
    }

    /// The reduction of a one-pass all_reduce whose payloads rode inline (`mine` is this PE's,
    /// at most [`INLINE`] bytes; at most [`INLINE_MEMBERS`] members): every input copied onto
    /// the stack (8-byte aligned, so the reduction reads them in place), one store into
    /// `dest`. The general path's per-source reads and scratch buffers cost more than the data.
    pub(in crate::ops::coll) fn reduce_inline(
        &self,
        dest: u64,
        mine: &[u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const WORDS: usize = INLINE as usize / 8;
        let (n, bytes) = (self.n(), mine.len());
        let mut bufs = [[0u64; WORDS]; INLINE_MEMBERS];
        for (j, b) in bufs.iter_mut().enumerate().take(n) {
            let b = &mut bytemuck::cast_slice_mut(b)[..bytes];
            if j == self.me() {
                b.copy_from_slice(mine);
            } else {
                self.read_inline(j, b);
            }
        }
        let mut views = [&[][..]; INLINE_MEMBERS];
        for (v, b) in views.iter_mut().zip(bufs.iter()).take(n) {
            *v = &bytemuck::cast_slice(b)[..bytes];
        }
        let mut out = [0u64; WORDS];
        let out = &mut bytemuck::cast_slice_mut(&mut out)[..bytes];
        crate::backend::reduce::reduce_bytes(out, &views[..n], dtype, op);
        self.inner.backend.write_bytes(dest, out)
    }

    pub(in crate::ops::coll) fn reduce_from_all(
        &self,
        dst: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        with_sources(
            self.n(),
            |j| self.at(j, src),
            |srcs| self.inner.backend.reduce(dst, srcs, count, dtype, op),
        )
    }
}

/// Whether a host-driven broadcast or all_reduce of `bytes` takes one pass through the sync
/// area's payloads: up to [`PAYLOAD`] bytes, on the host backend only, where the payloads and
/// the heap are both host memory the CPU copies between (on CUDA the heap is device memory and
/// the payloads are not, so the backend's copy and reduce cannot join them).
pub(in crate::ops::coll) fn one_pass(cx: &Context, bytes: usize) -> bool {
    bytes as u64 <= PAYLOAD && matches!(cx.inner.backend, AnyBackend::Host(_))
}

/// Checks that `[addr, addr + bytes)` is a symmetric range of this PE's heap, as `call`'s
/// `what` (destination or source).
#[inline]
pub(in crate::ops::coll) fn check_len(
    inner: &Inner,
    call: &'static str,
    what: &str,
    addr: u64,
    bytes: usize,
) -> Result<()> {
    match inner.own_offset(addr, bytes as u64, call) {
        Ok(_) => Ok(()),
        Err(e) => Err(len_error(inner, call, what, addr, bytes, &e)),
    }
}

#[cold]
#[inline(never)]
fn len_error(
    inner: &Inner,
    call: &'static str,
    what: &str,
    addr: u64,
    bytes: usize,
    e: &Error,
) -> Error {
    invalid(
        call,
        format!(
            "the {what} ({bytes} bytes needed at {addr:#x}) is not a symmetric range of that size: {}",
            e.kind()
        ),
    )
    .with_pe(inner.rank)
}
