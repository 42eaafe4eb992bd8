//! A collective call as one value, and what every call passes once before an engine runs it.
//!
//! Every entry (typed, `*_raw`, `*_on_stream`, the bindings' table) builds a [`Request`]: the
//! kind with its parameters ([`Collective`], one type per kind in its own file), the buffers,
//! count, dtype, team and, for the stream forms, the stream. The pipeline (`mod.rs`) checks it
//! here ([`Context::check_request`]: alignment, the stream, sizes that do not overflow, the
//! kind's own arguments and the aliasing rules of `ops/alias.rs`), which yields the [`Plan`]
//! every engine works from; the ledger's text of the call is made here too
//! ([`Request::text`]), the same on every member for the same call.

use std::sync::Arc;

use super::params::Params;
use super::transport::device::{DevicePlan, Launch};
use super::transport::nccl::{SpanCall, BYTES};
use crate::backend::cuda::nccl::{self, Comm};
use crate::backend::cuda::CudaBackend;
use crate::backend::host::mpi::{Mpi, MpiComm};
use crate::backend::{AnyBackend, ReduceOp};
use crate::context::team::{Team, TeamInner};
use crate::context::Context;
use crate::element::DType;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::ops::alias::{self, ByteRange, CollBuffers, CollKind, Placement};
use crate::stream::Stream;

/// One kind of collective with its parameters (a broadcast's root, a reduction's op): how it
/// is named, checked and recorded, and its steps on each engine. Each engine offers its
/// transport (barriers and copies, Open MPI, NCCL, kernel launches); the kind says what to do
/// with it. Collective-order rule: every member of the team calls each collective in the same
/// order with the same parameters; the ledger's text ([`Collective::text`]) is what they are
/// compared by.
pub(crate) trait Collective: Sized {
    /// The call's name (host form), in errors and the ledger.
    const NAME: &'static str;
    /// The stream form's name.
    const STREAM_NAME: &'static str;
    /// Its buffers' shapes, for the aliasing rules and the default lengths.
    const SHAPE: CollKind;

    /// The kind with its parameters read from `p` (for [`Context::collective`], by name).
    fn from_params(p: &mut Params<'_>) -> Result<Self>;

    /// How a request of this kind enters the pipeline: a kind may take a shortcut first (the
    /// eager broadcast does).
    #[inline]
    fn enter(cx: &Context, r: Request<'_, Self>) -> Result<()> {
        cx.pipeline(r)
    }

    /// The kind's own argument checks (a broadcast's root), after the common ones.
    fn check(&self, _cx: &Context, _r: &Request<'_, Self>) -> Result<()> {
        Ok(())
    }

    /// Bytes of (destination, source) on this PE for `bytes` per block on a team of `n`;
    /// None when they overflow.
    fn lens(&self, bytes: usize, n: usize) -> Option<(usize, usize)> {
        let (d, s) = match Self::SHAPE {
            CollKind::Broadcast | CollKind::AllReduce => (1, 1),
            CollKind::AllGather => (n, 1),
            CollKind::ReduceScatter => (1, n),
            CollKind::AllToAll => (n, n),
        };
        Some((bytes.checked_mul(d)?, bytes.checked_mul(s)?))
    }

    /// The start of the ledger's text: the parameters, count and dtype.
    fn text(&self, cx: &Context, count: usize, dtype: DType) -> String;

    /// Whether the kind reduces (symheap's kernels then run only the dtypes they have, and
    /// NCCL needs an NCCL type).
    fn reduces(&self) -> bool {
        false
    }

    /// The steps on the host engine (`engine/host.rs`), ranges checked.
    fn host(&self, cx: &Context, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()>;

    /// What the kind is as one call of Open MPI or of NCCL (the default [`Collective::mpi`]
    /// and [`Collective::nccl_team`]).
    fn one_call(&self) -> OneCall;

    /// The call through Open MPI over `comm` (`engine/mpi.rs`), ranges checked, the call met.
    /// By default the kind's [`OneCall`].
    fn mpi(
        &self,
        cx: &Context,
        mpi: &Mpi,
        comm: MpiComm,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
    ) -> Result<()> {
        self.one_call().mpi(cx, mpi, comm, r, p)
    }

    /// The call as one NCCL collective over the communicator of a split of the world that
    /// spans nodes, enqueued on `stream` (`engine/nccl.rs`). By default the kind's
    /// [`OneCall`].
    fn nccl_team(
        &self,
        comm: &Comm,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        stream: u64,
    ) -> std::result::Result<(), String> {
        self.one_call().nccl_team(comm, r, p, stream)
    }

    /// The call over the world across nodes (`engine/nccl.rs`): NCCL between nodes, symheap's
    /// kernels inside each node where the layout allows.
    fn nccl_world(&self, c: &mut SpanCall<'_>, r: &Request<'_, Self>, p: &Plan<'_>) -> Result<()>;

    /// Which kernel runs and whether it touches its buffers on this PE only (decided from the
    /// team, the size and the tuning: the same on every PE for the same call).
    fn device_plan(&self, cu: &CudaBackend, r: &Request<'_, Self>, p: &Plan<'_>) -> DevicePlan;

    /// The device engine's call on a team of one: a copy of the one block by the copy engine.
    fn device_alone(
        &self,
        _cx: &Context,
        l: &Launch<'_>,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
    ) -> Result<()> {
        l.copy_local(r.dest, r.src, p.bytes as u64)
    }

    /// The kernel launch on a team of two or more (`engine/device.rs`).
    fn device(
        &self,
        cx: &Context,
        l: &Launch<'_>,
        r: &Request<'_, Self>,
        p: &Plan<'_>,
        dp: &DevicePlan,
    ) -> Result<()>;
}

/// A kind as one collective call of Open MPI or of NCCL (see [`Collective::one_call`]): the
/// kinds' default steps on those transports.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OneCall {
    /// Broadcast from team member `root`.
    Broadcast { root: usize },
    /// all_gather.
    AllGather,
    /// reduce_scatter with this reduction.
    ReduceScatter(ReduceOp),
    /// all_reduce with this reduction.
    AllReduce(ReduceOp),
    /// alltoall of equal blocks.
    AllToAll,
}

impl OneCall {
    /// The call through Open MPI over `comm`, on the host form's buffers.
    pub(crate) fn mpi<K: Collective>(
        self,
        cx: &Context,
        mpi: &Mpi,
        comm: MpiComm,
        r: &Request<'_, K>,
        p: &Plan<'_>,
    ) -> Result<()> {
        let (d, s, me) = (p.hd, p.hs, p.t.me);
        match self {
            Self::Broadcast { root } => mpi.broadcast(comm, d, s, p.bytes, root, me),
            Self::AllGather => mpi.all_gather(comm, d, s, p.bytes),
            Self::ReduceScatter(op) => mpi.reduce_scatter(comm, d, s, r.count, r.dtype, op, me),
            Self::AllReduce(op) => mpi.all_reduce(comm, d, s, r.count, r.dtype, op),
            Self::AllToAll => mpi.alltoall(comm, d, s, p.bytes),
        }
        .map_err(|why| r.mpi_error(cx, why))
    }

    /// The call as one NCCL collective over `comm`, enqueued on `stream`.
    pub(crate) fn nccl_team<K: Collective>(
        self,
        comm: &Comm,
        r: &Request<'_, K>,
        p: &Plan<'_>,
        stream: u64,
    ) -> std::result::Result<(), String> {
        let (d, s, n) = (r.dest, r.src, p.bytes);
        match self {
            Self::Broadcast { root } => comm.broadcast(d, s, n, BYTES, root, stream),
            Self::AllGather => comm.all_gather(d, s, n, BYTES, stream),
            Self::ReduceScatter(op) => {
                comm.reduce_scatter(d, s, r.count, r.nccl_type()?, op, stream)
            }
            Self::AllReduce(op) => comm.all_reduce(d, s, r.count, r.nccl_type()?, op, stream),
            Self::AllToAll => comm.alltoall(d, s, n as u64, stream),
        }
    }
}

/// A collective call: the kind with its parameters, and where and what it moves.
pub(crate) struct Request<'a, K> {
    pub(crate) kind: K,
    pub(crate) team: &'a Team,
    /// Destination and source, this PE's addresses.
    pub(crate) dest: u64,
    pub(crate) src: u64,
    /// Elements per block.
    pub(crate) count: usize,
    pub(crate) dtype: DType,
    /// The stream of a `*_on_stream` call; None for the host form (waited for on return).
    pub(crate) stream: Option<&'a Stream>,
}

impl<'a, K: Collective> Request<'a, K> {
    /// The host form's request.
    pub(crate) fn host(
        kind: K,
        team: &'a Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
    ) -> Self {
        Request {
            kind,
            team,
            dest,
            src,
            count,
            dtype,
            stream: None,
        }
    }

    /// The stream form's request.
    pub(crate) fn on(mut self, stream: &'a Stream) -> Self {
        self.stream = Some(stream);
        self
    }

    /// The name of the call the user made, for errors.
    pub(crate) fn call(&self) -> &'static str {
        if self.stream.is_some() {
            K::STREAM_NAME
        } else {
            K::NAME
        }
    }

    /// NCCL's code for the request's dtype, or the reason NCCL has none.
    pub(crate) fn nccl_type(&self) -> std::result::Result<i32, String> {
        nccl::dtype(self.dtype).ok_or_else(|| format!("NCCL has no {}", self.dtype))
    }

    /// A failure `why` of Open MPI as this call's error.
    pub(crate) fn mpi_error(&self, cx: &Context, why: String) -> Error {
        Error::new(Some(cx.my_pe()), K::NAME, ErrorKind::Backend(why))
    }

    /// The ledger's text of the call: the kind's, then `detail` (the algorithm, "across
    /// nodes"), then where the buffers lie in the heap unless the kernel touches them on this
    /// PE only (`local`), in place recorded as such (see [`host_form`]).
    pub(crate) fn text(
        &self,
        cx: &Context,
        p: &Plan<'_>,
        detail: Option<&str>,
        local: bool,
    ) -> String {
        let mut args = self.kind.text(cx, self.count, self.dtype);
        if let Some(d) = detail {
            args.push_str(", ");
            args.push_str(d);
        }
        if local {
            args
        } else {
            cx.inner.coll_args(args, p.hd, p.hs)
        }
    }
}

/// What the checks found and every engine works from.
pub(crate) struct Plan<'a> {
    /// The team (this PE is a member).
    pub(crate) t: &'a Arc<TeamInner>,
    /// Bytes of one block.
    pub(crate) bytes: usize,
    /// Bytes of the destination and the source on this PE.
    pub(crate) dest_len: usize,
    pub(crate) src_len: usize,
    /// `(dest, src)` in the host paths' and the ledger's spelling (see [`host_form`]).
    pub(crate) hd: u64,
    pub(crate) hs: u64,
    /// The stream's handle (0 in the host form).
    pub(crate) raw: u64,
    /// The CUDA backend, when it is this context's.
    pub(crate) cuda: Option<&'a CudaBackend>,
}

impl Plan<'_> {
    /// Members of the team.
    pub(crate) fn n(&self) -> usize {
        self.t.members.len()
    }

    /// The two buffers as `check(what, addr, bytes)` is asked about them: the longer first (a
    /// reduce_scatter's source, an all_gather's destination), and in the host form
    /// (`host_form`) or as the caller passed them.
    pub(crate) fn check_ranges<K>(
        &self,
        r: &Request<'_, K>,
        host_form: bool,
        mut check: impl FnMut(&'static str, u64, usize) -> Result<()>,
    ) -> Result<()> {
        let (d, s) = if host_form {
            (self.hd, self.hs)
        } else {
            (r.dest, r.src)
        };
        if self.src_len > self.dest_len {
            check("source", s, self.src_len)?;
            check("destination", d, self.dest_len)
        } else {
            check("destination", d, self.dest_len)?;
            check("source", s, self.src_len)
        }
    }
}

impl Context {
    /// The checks every collective passes once, in this order: alignment, the stream,
    /// sizes that do not overflow, the kind's own arguments, the aliasing rules (on the
    /// lengths the kind reports). Then the plan, or None on a team this PE is not a member of
    /// (the call does nothing there).
    pub(super) fn check_request<'a, K: Collective>(
        &'a self,
        r: &Request<'a, K>,
    ) -> Result<Option<Plan<'a>>> {
        let call = r.call();
        self.inner.aligned_pair(call, r.dest, r.src, r.dtype)?;
        let raw = match r.stream {
            Some(s) => self.inner.stream_handle(s, call)?,
            None => 0,
        };
        let n = r.team.n_pes();
        let lens = r
            .count
            .checked_mul(r.dtype.size())
            .and_then(|b| Some((b, r.kind.lens(b, n.max(1))?)));
        let Some((bytes, (dest_len, src_len))) = lens else {
            return Err(self.overflows(call, r.count, r.dtype));
        };
        r.kind.check(self, r)?;
        let placed = match r.team.my_pe() {
            // Not a member: the call does nothing here.
            None => Placement::Apart,
            Some(me) => self.check_coll_buffers(
                call,
                &CollBuffers {
                    kind: K::SHAPE,
                    dest: ByteRange::new(r.dest, dest_len as u128),
                    src: ByteRange::new(r.src, src_len as u128),
                    count: r.count as u64,
                    elem: r.dtype.size() as u64,
                    n: n as u64,
                    me: me as u64,
                },
            )?,
        };
        let (hd, hs) = host_form(K::SHAPE, placed, r.dest, r.src);
        let Some(t) = self.inner.team_inner(r.team, call)? else {
            return Ok(None);
        };
        Ok(Some(Plan {
            t,
            bytes,
            dest_len,
            src_len,
            hd,
            hs,
            raw,
            cuda: match &self.inner.backend {
                AnyBackend::Cuda(cu) => Some(cu),
                AnyBackend::Host(_) => None,
            },
        }))
    }

    /// The error of `call` when `count` elements of `dtype` (times its blocks) overflow.
    #[cold]
    pub(super) fn overflows(&self, call: &'static str, count: usize, dtype: DType) -> Error {
        invalid(call, format!("{count} x {dtype} overflows")).with_pe(self.my_pe())
    }

    /// The error of a broadcast whose `root` is not a member of its team of `n`.
    #[cold]
    pub(super) fn bad_root(&self, call: &'static str, root: usize, n: usize) -> Error {
        invalid(
            call,
            format!("root {root} is not a member of a team of {n}"),
        )
        .with_pe(self.my_pe())
    }

    /// The aliasing rules for `call`, a collective of `kind` on `team` with `count` elements of
    /// `dtype` per block at `dest` and `src` (this PE's addresses): how the two lie, or the
    /// invalid-argument error naming both ranges. Apart on a team this PE is not a member of
    /// (the call does nothing there).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn placement(
        &self,
        call: &'static str,
        kind: CollKind,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
    ) -> Result<Placement> {
        let Some(me) = team.my_pe() else {
            return Ok(Placement::Apart);
        };
        let (n, elem) = (team.n_pes() as u64, dtype.size() as u64);
        let b = CollBuffers::contiguous(kind, dest, src, count as u64, elem, n, me as u64);
        self.check_coll_buffers(call, &b)
    }

    /// [`alias::check`] of `b` as `call` reports it: the placement, or an invalid-argument
    /// error naming both ranges (for callers whose buffers are not contiguous runs of the
    /// kind's length, such as the torch ops' entries, which stage strided tensors).
    pub fn check_coll_buffers(&self, call: &'static str, b: &CollBuffers) -> Result<Placement> {
        alias::check(b).map_err(|e| self.overlap_error(call, &e))
    }

    #[cold]
    fn overlap_error(&self, call: &'static str, e: &alias::Overlap) -> Error {
        invalid(call, e.to_string()).with_pe(self.my_pe())
    }
}

/// `(dest, src)` in the host paths' and the ledger's spelling: an in-place call as
/// `dest == src`, whatever the kind (all_gather: both the destination; reduce_scatter: both the
/// source), so that the ledger records it as in place, the same on every PE, and the host and
/// Open MPI paths see one form. Apart calls are unchanged (and then `dest != src`, or nothing
/// moves).
#[inline]
pub(crate) fn host_form(kind: CollKind, placed: Placement, dest: u64, src: u64) -> (u64, u64) {
    match (placed, kind) {
        (Placement::InPlace, CollKind::ReduceScatter) => (src, src),
        (Placement::InPlace, _) => (dest, dest),
        (Placement::Apart, _) => (dest, src),
    }
}
