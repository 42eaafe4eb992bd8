//! Collectives on a team: broadcast, all_gather, reduce_scatter, all_reduce, alltoall.
//!
//! Each is a sequence of backend steps between team barriers: an entry barrier (every member's
//! source is ready and its destination free; also where the ledger catches diverging calls),
//! member-to-member copies or reductions read straight from peers' copies, and an exit barrier
//! (every destination is complete and every source may be reused). all_reduce is one-shot
//! (every member reduces the whole vector from every peer) for small messages and two-shot
//! (reduce-scatter, then all-gather of the reduced chunks) for large ones, the same structure
//! the GPU kernels use.
//!
//! Up to [`PAYLOAD`] bytes on the host backend, broadcast and all_reduce take one pass instead:
//! the data rides on each member's arrival at the entry barrier (in its sync area,
//! double-buffered like the arrivals; up to [`INLINE`] bytes inside the arrival itself,
//! pushed to every member), and every member, once the ledgers are known to agree,
//! reads it from there into its own destination; there is no exit barrier. On return this PE's destination
//! is complete and its source reusable (what MPI and OpenSHMEM promise); other PEs' accesses
//! to it are ordered by a barrier, as for any heap data. A broadcast of at most
//! [`EAGER_INLINE`] bytes, with every PE of the job on this node, does not even meet: its root
//! pushes the data to every receiver and returns (see `context/eager.rs`).
//!
//! Collective-order rule: every member of the team calls each collective in the same order with
//! the same arguments (root, count, dtype, op); symheap checks it at the entry barrier (the
//! root of an eager broadcast: at its next call that waits, or at finalize).

use std::sync::Arc;

use super::alias::CollKind;
use super::coll_check::host_form;
use super::coll_nodes::NodesOp;
use crate::backend::ReduceOp;
use crate::context::area::{INLINE, NARROW, PAYLOAD};
use crate::context::team::{Team, TeamGuard, TeamInner};
use crate::context::watch::CallKey;
use crate::context::{Context, Inner};
use crate::element::{DType, Element};
use crate::error::{invalid, Error, Result};
use crate::SymmetricBuffer;

/// all_reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllReduceAlgo {
    /// One-shot up to `ONE_SHOT_MAX_BYTES` out of place, two-shot otherwise.
    #[default]
    Auto,
    /// Every member reads every peer's whole vector.
    OneShot,
    /// Reduce-scatter then all-gather.
    TwoShot,
}

impl AllReduceAlgo {
    /// Name in ledger records and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            AllReduceAlgo::Auto => "auto",
            AllReduceAlgo::OneShot => "one-shot",
            AllReduceAlgo::TwoShot => "two-shot",
        }
    }
}

/// Most members whose inline payloads a one-pass all_reduce reduces on the stack.
const INLINE_MEMBERS: usize = 16;

/// Across nodes (CUDA backend), an all_reduce of up to this many bytes runs whole inside each
/// node, then whole between nodes (two latencies); a larger one reduce-scatters inside the node
/// first, so that each PE sends only its shard between nodes (see `ops/coll_span.rs`).
pub const NODES_ALL_REDUCE_SMALL: u64 = 256 << 10;

/// Largest message `Auto` sends one-shot on the host backend.
pub const ONE_SHOT_MAX_BYTES: usize = 64 << 10;

/// A collective in flight: the team, its lock, and the member addresses of symmetric ranges.
struct Coll<'a> {
    inner: &'a Inner,
    team: &'a TeamInner,
    st: TeamGuard<'a>,
    call: &'static str,
    /// The entry barrier's payloads rode inline in the arrivals (see `Coll::payload`).
    inline: bool,
}

/// Calls `f` with the addresses `at(0..n)`: on the stack for small teams (the common case, which
/// then allocates nothing), else in a Vec.
fn with_sources<R>(n: usize, at: impl Fn(usize) -> u64, f: impl FnOnce(&[u64]) -> R) -> R {
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
    fn begin(
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
        let reachable = |m: usize| inner.slot_base(m).is_some();
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
    fn begin_staged(
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

    fn n(&self) -> usize {
        self.team.members.len()
    }

    fn me(&self) -> usize {
        self.team.me
    }

    /// Member `j`'s copy of the byte at own-heap address `addr`.
    fn at(&self, j: usize, addr: u64) -> u64 {
        let own = self.inner.slot_base(self.inner.rank).expect("own heap");
        let theirs = self
            .inner
            .slot_base(self.team.members[j])
            .expect("checked direct");
        theirs + (addr - own)
    }

    /// Member `j`'s payload of the entry barrier in its own area (see `begin_staged`; this
    /// PE's own, also when the payloads rode inline).
    fn payload(&self, j: usize) -> u64 {
        let m = self.team.members[j];
        self.inner.area().payload(m, self.team.slot, self.st.epoch)
    }

    /// Member `j`'s inline payload of the entry barrier into `out` (from its arrival in this
    /// PE's area; this PE's own from its payload).
    fn read_inline(&self, j: usize, out: &mut [u8]) {
        debug_assert!(self.inline);
        if j == self.me() {
            self.inner.control.read(self.payload(j), out);
        } else {
            let m = self.team.members[j];
            self.inner
                .read_inline(self.team.slot, m, self.st.epoch, out);
        }
    }

    fn barrier(&mut self) -> Result<()> {
        self.inner
            .barrier_core(self.team, &mut self.st, self.call, 0, 0)
            .map(drop)
    }

    fn end(mut self) -> Result<()> {
        self.barrier()
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if dst == src || bytes == 0 {
            return Ok(());
        }
        self.inner.backend.copy(dst, src, bytes)
    }

    /// The reduction of a one-pass all_reduce whose payloads rode inline (`mine` is this PE's,
    /// at most [`INLINE`] bytes; at most [`INLINE_MEMBERS`] members): every input copied onto
    /// the stack (8-byte aligned, so the reduction reads them in place), one store into
    /// `dest`. The general path's per-source reads and scratch buffers cost more than the data.
    fn reduce_inline(&self, dest: u64, mine: &[u8], dtype: DType, op: ReduceOp) -> Result<()> {
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

    fn reduce_from_all(
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

#[inline]
pub(super) fn check_len(
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

impl Context {
    /// Whether a host-level reduction of `dtype` on `team` runs as a stream collective: on the
    /// CUDA backend where its kernels have the dtype, and for every dtype NCCL has across nodes.
    fn on_gpu(&self, team: &Team, dtype: DType) -> bool {
        self.inner.backend.as_cuda().is_some()
            && (crate::backend::cuda::coll_supports(dtype) || self.span_team(team).is_some())
    }

    /// A host-level collective on the CUDA backend: the entry barrier and ledger check the host
    /// path has (so diverging calls fail here, naming the call), then the stream kernel on the
    /// backend's own stream, waited for.
    fn on_device(
        &self,
        team: &Team,
        call: &'static str,
        args: String,
        launch: impl FnOnce(&crate::Stream) -> Result<()>,
    ) -> Result<()> {
        let cu = self.inner.backend.as_cuda().expect("called on CUDA only");
        let Some(t) = self.inner.team_inner(team, call)? else {
            return Ok(());
        };
        if t.spans {
            // A split across nodes has no place to meet but its NCCL collective, which its
            // stream path records in the team's ledger.
        } else if self.inner.spans_nodes(t) {
            // The world across nodes meets over the rendezvous, not in shared memory.
            self.inner.collective(call, args, &[])?;
        } else {
            let mut st = t.lock();
            self.inner.record_on(t, &mut st, call, args);
            self.inner.team_sync_point(t, &mut st, call, 0)?;
        }
        let s = cu.internal_stream();
        launch(s)?;
        self.sync_stream(s)
    }

    /// Collective over `team`: every member's `dest` gets `count` elements of `dtype` from
    /// team member `root`'s `src`. Addresses are in this PE's heap; in place when `dest == src`,
    /// any other overlap an invalid argument (see `ops/alias.rs`).
    /// On the host backend a broadcast of at most 96 bytes is eager: the root returns without
    /// waiting for the receivers, and learns of a divergence (a member making another call)
    /// at its next call that waits, or at finalize, instead of in this call.
    pub fn broadcast_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        const CALL: &str = "broadcast";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        // `coll_bytes` of one block, written out: this is the eager broadcast's path, and the
        // call cost it 10-20 instructions a side.
        let Some(bytes) = count.checked_mul(dtype.size()) else {
            return Err(self.overflows(CALL, count, dtype));
        };
        // First, with nothing else worked out: a small broadcast in a loop is this path, and
        // each instruction before it was a measurable part of its cost (see coll_eager.rs).
        if let Some(host) = self.inner.eager_host(bytes) {
            return self.broadcast_eager(host, team, dest, src, count, dtype, root);
        }
        self.broadcast_synced(team, dest, src, count, dtype, root, bytes)
    }

    /// `count` elements of `dtype` in bytes, for `call`: refused when `blocks` such runs (a
    /// collective's `n` blocks) overflow `usize`, so that no size or offset worked out from
    /// them later wraps (or, in a build with overflow checks, panics).
    #[inline]
    pub(super) fn coll_bytes(
        &self,
        call: &'static str,
        count: usize,
        dtype: DType,
        blocks: usize,
    ) -> Result<usize> {
        match count.checked_mul(dtype.size()) {
            Some(b) if b.checked_mul(blocks.max(1)).is_some() => Ok(b),
            _ => Err(self.overflows(call, count, dtype)),
        }
    }

    /// The error of `call` when `count` elements of `dtype` (times its blocks) overflow.
    #[cold]
    fn overflows(&self, call: &'static str, count: usize, dtype: DType) -> Error {
        invalid(call, format!("{count} x {dtype} overflows")).with_pe(self.my_pe())
    }

    /// The error of a broadcast whose `root` is not a member of its team of `n`.
    pub(super) fn bad_root(&self, call: &'static str, root: usize, n: usize) -> Error {
        invalid(
            call,
            format!("root {root} is not a member of a team of {n}"),
        )
        .with_pe(self.my_pe())
    }

    /// `broadcast_raw` of `bytes` bytes when it is not eager. Not inlined into it: its frame
    /// and saved registers were a tenth of an eager broadcast's instructions.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn broadcast_synced(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        root: usize,
        bytes: usize,
    ) -> Result<()> {
        const CALL: &str = "broadcast";
        let n = team.n_pes();
        if team.is_valid() && root >= n {
            return Err(self.bad_root(CALL, root, n));
        }
        self.placement(CALL, CollKind::Broadcast, team, dest, src, count, dtype)?;
        if self.inner.backend.as_cuda().is_some() {
            return self.on_device(
                team,
                CALL,
                self.inner
                    .coll_args(format!("root {root}, {count} x {dtype}"), dest, src),
                |s| self.broadcast_on_stream(team, dest, src, count, dtype, root, s),
            );
        }
        let nums = [root as u64, count as u64, dtype as u64, 0, 0, 0, dest, src];
        let args = || {
            self.inner
                .coll_args(format!("root {root}, {count} x {dtype}"), dest, src)
        };
        if team.is_valid() {
            check_len(&self.inner, CALL, "destination", dest, bytes)?;
            check_len(&self.inner, CALL, "source", src, bytes)?;
        }
        if self.across_nodes(
            team,
            CALL,
            args,
            dest,
            src,
            NodesOp::Broadcast { bytes, root },
        )? {
            return Ok(());
        }
        if self.one_pass(bytes) {
            // One pass: the root's data rides on its arrival at the entry barrier, which also
            // checks the ledgers; no exit barrier (see `all_reduce_one_pass`).
            let be = &self.inner.backend;
            let is_root = team.my_pe() == Some(root);
            let inline = if bytes as u64 <= INLINE { bytes } else { 0 };
            let mut stage = |at: u64| {
                if !is_root {
                    return Ok(0);
                }
                be.copy(at, src, bytes)?;
                Ok(inline)
            };
            let Some(c) =
                Coll::begin_staged(&self.inner, team, CALL, nums, args, inline, &mut stage)?
            else {
                return Ok(());
            };
            if inline == 0 {
                return c.copy(dest, c.payload(root), bytes);
            }
            let mut buf = [0u8; INLINE as usize];
            c.read_inline(root, &mut buf[..bytes]);
            return be.write_bytes(dest, &buf[..bytes]);
        }
        let Some(c) = Coll::begin(&self.inner, team, CALL, nums, args)? else {
            return Ok(());
        };
        c.copy(dest, c.at(root, src), bytes)?;
        c.end()
    }

    /// Collective over `team`: member j's `count` elements at `src` land at
    /// `dest + j × count` on every member. In place when `src == dest + me × count` (this PE's
    /// contribution already sits at its own block of `dest`); any other overlap of `src` and
    /// `dest` is an invalid argument (see `ops/alias.rs`).
    pub fn all_gather_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
    ) -> Result<()> {
        const CALL: &str = "all_gather";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let bytes = self.coll_bytes(CALL, count, dtype, team.n_pes())?;
        let kind = CollKind::AllGather;
        let placed = self.placement(CALL, kind, team, dest, src, count, dtype)?;
        // In place is recorded as such, the same on every PE (each passes its own block).
        let (hd, hs) = host_form(kind, placed, dest, src);
        if self.inner.backend.as_cuda().is_some() {
            let args = self.inner.coll_args(format!("{count} x {dtype}"), hd, hs);
            return self.on_device(team, CALL, args, |s| {
                self.all_gather_on_stream(team, dest, src, count, dtype, s)
            });
        }
        let (dest, src) = (hd, hs);
        if team.is_valid() {
            check_len(&self.inner, CALL, "destination", dest, bytes * team.n_pes())?;
            check_len(&self.inner, CALL, "source", src, bytes)?;
        }
        let args = || {
            self.inner
                .coll_args(format!("{count} x {dtype}"), dest, src)
        };
        if self.across_nodes(team, CALL, args, dest, src, NodesOp::AllGather { bytes })? {
            return Ok(());
        }
        let nums = [count as u64, dtype as u64, 0, 0, 0, 0, dest, src];
        let Some(c) = Coll::begin(&self.inner, team, CALL, nums, || {
            self.inner
                .coll_args(format!("{count} x {dtype}"), dest, src)
        })?
        else {
            return Ok(());
        };
        // In place, member j's contribution is its block j of `dest` (the host form's dest == src).
        let in_place = dest == src;
        for j in 0..c.n() {
            let from = if in_place {
                c.at(j, dest + (j * bytes) as u64)
            } else {
                c.at(j, src)
            };
            c.copy(dest + (j * bytes) as u64, from, bytes)?;
        }
        c.end()
    }

    /// Collective over `team`: `src` holds `n × count` elements on every member; member j's
    /// `dest` gets the reduction of every member's block j. In place when
    /// `dest == src + me × count` (the result replaces this PE's own block of `src`); any other
    /// overlap is an invalid argument (see `ops/alias.rs`).
    pub fn reduce_scatter_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const CALL: &str = "reduce_scatter";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let bytes = self.coll_bytes(CALL, count, dtype, team.n_pes())?;
        let kind = CollKind::ReduceScatter;
        let placed = self.placement(CALL, kind, team, dest, src, count, dtype)?;
        let (hd, hs) = host_form(kind, placed, dest, src);
        if self.on_gpu(team, dtype) {
            let args = self
                .inner
                .coll_args(format!("{} {count} x {dtype}", op.name()), hd, hs);
            return self.on_device(team, CALL, args, |s| {
                self.reduce_scatter_on_stream(team, dest, src, count, dtype, op, s)
            });
        }
        let (dest, src) = (hd, hs);
        if team.is_valid() {
            check_len(&self.inner, CALL, "source", src, bytes * team.n_pes())?;
            check_len(&self.inner, CALL, "destination", dest, bytes)?;
        }
        let args = || {
            self.inner
                .coll_args(format!("{} {count} x {dtype}", op.name()), dest, src)
        };
        let what = NodesOp::ReduceScatter { count, dtype, op };
        if self.across_nodes(team, CALL, args, dest, src, what)? {
            return Ok(());
        }
        let nums = [count as u64, dtype as u64, op as u64, 0, 0, 0, dest, src];
        let Some(c) = Coll::begin(&self.inner, team, CALL, nums, || {
            self.inner
                .coll_args(format!("{} {count} x {dtype}", op.name()), dest, src)
        })?
        else {
            return Ok(());
        };
        let block = src + (c.me() * bytes) as u64;
        // In place (the host form's dest == src), the result goes to this PE's block.
        let out = if dest == src { block } else { dest };
        c.reduce_from_all(out, block, count, dtype, op)?;
        c.end()
    }

    /// Collective over `team`: every member's `dest` gets the element-wise reduction of all
    /// members' `src` (`count` elements). In place when `dest == src`; any other overlap is an
    /// invalid argument (see `ops/alias.rs`).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<()> {
        const CALL: &str = "all_reduce";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let bytes = self.coll_bytes(CALL, count, dtype, 1)?;
        self.placement(CALL, CollKind::AllReduce, team, dest, src, count, dtype)?;
        if self.on_gpu(team, dtype) {
            let args = self
                .inner
                .coll_args(format!("{} {count} x {dtype}", op.name()), dest, src);
            return self.on_device(team, CALL, args, |s| {
                self.all_reduce_on_stream(team, dest, src, count, dtype, op, algo, s)
            });
        }
        if team.is_valid() {
            check_len(&self.inner, CALL, "destination", dest, bytes)?;
            check_len(&self.inner, CALL, "source", src, bytes)?;
        }
        let nodes_args = || {
            let args = format!("{} {count} x {dtype}", op.name());
            self.inner.coll_args(args, dest, src)
        };
        let what = NodesOp::AllReduce { count, dtype, op };
        if self.across_nodes(team, CALL, nodes_args, dest, src, what)? {
            return Ok(());
        }
        // One-shot reads peers' sources while they write their destinations, so in place it
        // would read half-reduced data; two-shot only ever writes chunks no one else reads.
        let algo = match algo {
            // One pass through the payloads: in place is fine (every source is copied before
            // any destination is written).
            AllReduceAlgo::Auto | AllReduceAlgo::OneShot if self.one_pass(bytes) => {
                AllReduceAlgo::OneShot
            }
            AllReduceAlgo::Auto if dest != src && bytes <= ONE_SHOT_MAX_BYTES => {
                AllReduceAlgo::OneShot
            }
            AllReduceAlgo::Auto | AllReduceAlgo::TwoShot => AllReduceAlgo::TwoShot,
            AllReduceAlgo::OneShot if dest == src => AllReduceAlgo::TwoShot,
            AllReduceAlgo::OneShot => AllReduceAlgo::OneShot,
        };
        let nums = [
            count as u64,
            dtype as u64,
            op as u64,
            algo as u64,
            0,
            0,
            dest,
            src,
        ];
        let args = || {
            let args = format!("{} {count} x {dtype}, {}", op.name(), algo.name());
            self.inner.coll_args(args, dest, src)
        };
        if algo == AllReduceAlgo::OneShot && self.one_pass(bytes) {
            return self.all_reduce_one_pass(team, dest, src, count, dtype, op, nums, args);
        }
        let Some(mut c) = Coll::begin(&self.inner, team, CALL, nums, args)? else {
            return Ok(());
        };
        if algo == AllReduceAlgo::OneShot {
            c.reduce_from_all(dest, src, count, dtype, op)?;
            return c.end();
        }
        let n = c.n();
        let per = count.div_ceil(n);
        let chunk = |j: usize| {
            let lo = (j * per).min(count);
            let hi = ((j + 1) * per).min(count);
            ((lo * dtype.size()) as u64, hi - lo)
        };
        let (off, len) = chunk(c.me());
        c.reduce_from_all(dest + off, src + off, len, dtype, op)?;
        c.barrier()?;
        for j in 0..n {
            if j != c.me() {
                let (off, len) = chunk(j);
                c.copy(dest + off, c.at(j, dest + off), len * dtype.size())?;
            }
        }
        c.end()
    }

    /// Whether a host-driven broadcast or all_reduce of `bytes` takes one pass through the
    /// sync area's payloads: up to [`PAYLOAD`] bytes, on the host backend only, where the
    /// payloads and the heap are both host memory the CPU copies between (on CUDA the heap is
    /// device memory and the payloads are not, so the backend's copy and reduce cannot join
    /// them).
    fn one_pass(&self, bytes: usize) -> bool {
        bytes as u64 <= PAYLOAD && self.inner.backend.as_cuda().is_none()
    }

    /// A small all_reduce in one pass: every member's source rides on its arrival at the
    /// entry barrier (after which the ledgers are known to agree), and each member reduces
    /// the payloads into its own destination. No exit barrier: on return this PE's
    /// destination is complete and its source reusable (what MPI_Allreduce and OpenSHMEM
    /// promise; order other PEs' accesses to it with a barrier, as for any heap data). Nobody
    /// reads this PE's heap, and its payload stays until its barrier after next, which needs
    /// every member's arrival at the next one.
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_one_pass(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        nums: [u64; 8],
        args: impl FnOnce() -> String,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let be = &self.inner.backend;
        let inline = if bytes as u64 <= INLINE && team.n_pes() <= INLINE_MEMBERS {
            bytes
        } else {
            0
        };
        // Inline, this PE's source is read once, onto the stack, and reduced from there.
        let mut mine = [0u64; INLINE as usize / 8];
        let mut stage = |at: u64| {
            if inline > 0 {
                let m = &mut bytemuck::cast_slice_mut(&mut mine)[..bytes];
                be.read_bytes(src, m)?;
                self.inner.control.write(at, m);
                return Ok(bytes);
            }
            be.copy(at, src, bytes).map(|_| 0)
        };
        let Some(c) = Coll::begin_staged(
            &self.inner,
            team,
            "all_reduce",
            nums,
            args,
            inline,
            &mut stage,
        )?
        else {
            return Ok(());
        };
        if count == 0 {
            return Ok(());
        }
        if inline > 0 {
            return c.reduce_inline(dest, &bytemuck::cast_slice(&mine)[..bytes], dtype, op);
        }
        with_sources(
            c.n(),
            |j| c.payload(j),
            |srcs| be.reduce(dest, srcs, count, dtype, op),
        )
    }

    /// Collective over `team`: member i's block j (`count` elements at `src + j × count`)
    /// lands at member j's `dest + i × count`. Never in place: `dest` and `src` must not
    /// overlap (see `ops/alias.rs`).
    pub fn alltoall_raw(
        &self,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
    ) -> Result<()> {
        const CALL: &str = "alltoall";
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let bytes = self.coll_bytes(CALL, count, dtype, team.n_pes())?;
        self.placement(CALL, CollKind::AllToAll, team, dest, src, count, dtype)?;
        if self.inner.backend.as_cuda().is_some() {
            return self.on_device(
                team,
                CALL,
                self.inner
                    .coll_args(format!("{count} x {dtype}"), dest, src),
                |s| self.alltoall_on_stream(team, dest, src, count, dtype, s),
            );
        }
        if team.is_valid() {
            check_len(&self.inner, CALL, "destination", dest, bytes * team.n_pes())?;
            check_len(&self.inner, CALL, "source", src, bytes * team.n_pes())?;
        }
        let args = || {
            self.inner
                .coll_args(format!("{count} x {dtype}"), dest, src)
        };
        if self.across_nodes(team, CALL, args, dest, src, NodesOp::AllToAll { bytes })? {
            return Ok(());
        }
        let nums = [count as u64, dtype as u64, 0, 0, 0, 0, dest, src];
        let Some(c) = Coll::begin(&self.inner, team, CALL, nums, || {
            self.inner
                .coll_args(format!("{count} x {dtype}"), dest, src)
        })?
        else {
            return Ok(());
        };
        let me = c.me();
        for j in 0..c.n() {
            c.copy(
                dest + (j * bytes) as u64,
                c.at(j, src + (me * bytes) as u64),
                bytes,
            )?;
        }
        c.end()
    }

    /// Typed `broadcast_raw` on buffers.
    pub fn broadcast<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
        root: usize,
    ) -> Result<()> {
        self.broadcast_raw(team, dest.addr(), src.addr(), count, T::DTYPE, root)
    }

    /// Typed `all_gather_raw` on buffers (`dest` holds `n × count`).
    pub fn all_gather<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
    ) -> Result<()> {
        self.all_gather_raw(team, dest.addr(), src.addr(), count, T::DTYPE)
    }

    /// Typed `reduce_scatter_raw` on buffers (`src` holds `n × count`).
    pub fn reduce_scatter<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_raw(team, dest.addr(), src.addr(), count, T::DTYPE, op)
    }

    /// Typed `all_reduce_raw` on buffers, algorithm chosen by size.
    pub fn all_reduce<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_raw(
            team,
            dest.addr(),
            src.addr(),
            count,
            T::DTYPE,
            op,
            AllReduceAlgo::Auto,
        )
    }

    /// Typed `alltoall_raw` on buffers (both hold `n × count`).
    pub fn alltoall<T: Element>(
        &self,
        team: &Team,
        dest: &SymmetricBuffer,
        src: &SymmetricBuffer,
        count: usize,
    ) -> Result<()> {
        self.alltoall_raw(team, dest.addr(), src.addr(), count, T::DTYPE)
    }
}
