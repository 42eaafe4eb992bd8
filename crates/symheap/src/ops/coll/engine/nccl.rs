//! The NCCL engine: collectives of a team whose members are on several nodes (CUDA backend).
//! Stream-ordered, and capturable in a CUDA graph once the first collective across nodes
//! (which sets up NCCL) and the largest workspace ran eagerly.
//!
//! The world across nodes runs hierarchically where the layout allows (see
//! `context/span.rs`): symheap's kernels among the PEs of each node, NCCL between nodes over
//! the communicator of the PEs with the same node index (one per node); otherwise NCCL over
//! the whole world. Each kind's steps are its `Collective::nccl_world`, written with
//! [`SpanCall`]. A split of the world that spans nodes runs each collective as one NCCL call
//! over its own communicator instead (`Collective::nccl_team`, see `nccl_team.rs`), ranked as
//! the team.
//!
//! The host form meets first (the world over the rendezvous, which checks the ledgers across
//! the job; a split across nodes has no place to meet but its NCCL collective), then runs on
//! the backend's own stream and waits for it. Collective-order rule: as for every collective,
//! the same calls in the same order on every PE; the team's ledger records each call and the
//! next host collective point compares them across the job.

use std::sync::MutexGuard;

use super::super::request::{Collective, Plan, Request};
use super::Engine;
use crate::backend::cuda::driver;
use crate::backend::cuda::nccl::{self, Comm};
use crate::backend::ReduceOp;
use crate::context::span::Span;
use crate::context::team::{Team, TeamInner};
use crate::context::Context;
use crate::element::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::coll::AllReduceAlgo;
use crate::stream::Stream;

/// NCCL's code for bytes.
pub(in crate::ops::coll) const BYTES: i32 = 1;

/// The NCCL engine (see the module documentation).
pub(in crate::ops::coll) struct NcclEngine;

impl Engine for NcclEngine {
    /// CUDA, a team across nodes (the world with a PE this one cannot reach, or a split of it
    /// that spans nodes).
    fn accepts<K: Collective>(&self, cx: &Context, _: &Request<'_, K>, p: &Plan<'_>) -> bool {
        p.cuda.is_some() && cx.inner.spans_nodes(p.t)
    }

    fn run<K: Collective>(&self, cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> Result<()> {
        let call = r.call();
        if r.kind.reduces() {
            nccl_code(cx, call, r.dtype)?;
        }
        let cu = p.cuda.expect("accepted on CUDA only");
        let (s, raw) = match r.stream {
            Some(s) => (s, p.raw),
            None => {
                let s = cu.internal_stream();
                (s, cx.inner.stream_handle(s, call)?)
            }
        };
        p.check_ranges(r, false, |_, addr, len| {
            cx.check_range(call, addr, len as u64, s)
        })?;
        let host_form = r.stream.is_none();
        // The host form over the world meets over the rendezvous first (recording the call);
        // otherwise the call is recorded as it is enqueued.
        let args = if host_form && !p.t.spans {
            cx.inner.collective(call, r.text(cx, p, None, false), &[])?;
            None
        } else {
            Some(r.text(cx, p, Some("across nodes"), false))
        };
        if p.t.spans {
            cx.team_span_run(p.t, call, args, s, raw, |comm, raw| {
                r.kind.nccl_team(cx, comm, r, p, raw)
            })?;
        } else {
            let mut c = cx.span_begin(p.t, call, args, s, raw)?;
            r.kind.nccl_world(&mut c, r, p)?;
        }
        if host_form {
            cx.sync_stream(s)?;
        }
        Ok(())
    }
}

/// NCCL's code for `dtype`, or the error of `call` saying NCCL has no such type.
pub(in crate::ops::coll) fn nccl_code(
    cx: &Context,
    call: &'static str,
    dtype: DType,
) -> Result<i32> {
    nccl::dtype(dtype).ok_or_else(|| {
        Error::new(
            Some(cx.my_pe()),
            call,
            ErrorKind::Unsupported(format!(
                "collectives across nodes run through NCCL, which has no {dtype}"
            )),
        )
    })
}

/// One collective of the world across nodes in flight: the set-up state, locked for the call
/// (NCCL wants one call at a time on a communicator), and the stream.
pub(in crate::ops::coll) struct SpanCall<'a> {
    pub(in crate::ops::coll) ctx: &'a Context,
    pub(in crate::ops::coll) call: &'static str,
    g: MutexGuard<'a, Option<Span>>,
    /// The stream, and its handle.
    pub(in crate::ops::coll) stream: &'a Stream,
    pub(in crate::ops::coll) raw: u64,
}

impl SpanCall<'_> {
    pub(in crate::ops::coll) fn sp(&mut self) -> &mut Span {
        self.g.as_mut().expect("set up by Inner::span")
    }

    /// The state, for the side stream and the layout.
    pub(in crate::ops::coll) fn span(&self) -> &Span {
        self.g.as_ref().expect("set up by Inner::span")
    }

    /// An NCCL call's result as this call's error, with NCCL's own asynchronous error if any.
    pub(in crate::ops::coll) fn nccl(&self, r: std::result::Result<(), String>) -> Result<()> {
        r.map_err(|e| {
            let sp = self.span();
            let more = sp
                .inter
                .iter()
                .chain(std::iter::once(&sp.all))
                .find_map(Comm::async_error)
                .map_or(String::new(), |a| format!(" (NCCL reports: {a})"));
            Error::new(
                Some(self.ctx.my_pe()),
                self.call,
                ErrorKind::Backend(format!("NCCL between nodes: {e}{more}")),
            )
        })
    }

    /// The communicator between nodes (the PEs with this PE's node index).
    pub(in crate::ops::coll) fn inter(&self) -> &Comm {
        self.span()
            .inter
            .as_ref()
            .expect("hierarchical with several nodes")
    }

    /// The communicator of the whole world.
    pub(in crate::ops::coll) fn all(&self) -> &Comm {
        &self.span().all
    }

    /// The team of this node's PEs.
    pub(in crate::ops::coll) fn node(&self) -> Team {
        self.span()
            .node_team
            .clone()
            .expect("hierarchical with several PEs per node")
    }

    /// The workspace, at least `bytes` long.
    pub(in crate::ops::coll) fn work(&mut self, bytes: u64) -> Result<u64> {
        let (inner, call, raw) = (&self.ctx.inner, self.call, self.raw);
        let sp = self.g.as_mut().expect("set up");
        inner.span_work(sp, bytes, call, raw)
    }

    /// `rows` blocks of `width` bytes from `src + r × spitch` to `dst + r × dpitch`.
    pub(in crate::ops::coll) fn strided(
        &self,
        dst: u64,
        dpitch: u64,
        src: u64,
        spitch: u64,
        width: u64,
        rows: u64,
    ) -> Result<()> {
        driver::copy_2d_async(dst, dpitch, src, spitch, width, rows, self.raw)
            .map_err(|e| e.during(self.call).with_pe(self.ctx.my_pe()))
    }
}

impl Context {
    /// Starts `call` on the world team `t` across nodes on `stream` (handle `raw`, buffers
    /// checked): records `args` in the world's ledger (None: the call met and recorded
    /// already), orders the stream after the world's previous collective and sets up NCCL at
    /// the first call.
    fn span_begin<'a>(
        &'a self,
        t: &TeamInner,
        call: &'static str,
        args: Option<String>,
        stream: &'a Stream,
        raw: u64,
    ) -> Result<SpanCall<'a>> {
        let cu = self.inner.backend.as_cuda().expect("CUDA only");
        cu.bind()?;
        super::device::order_team(t, stream, raw)?;
        if let Some(args) = args {
            self.inner.record_on(t, &mut t.lock(), call, args);
        }
        let g = self.inner.span(call, raw)?;
        Ok(SpanCall {
            ctx: self,
            call,
            g,
            stream,
            raw,
        })
    }

    /// barrier_all_on_stream across nodes: a one-element all_reduce (in the node, then between
    /// nodes; or NCCL over the world).
    pub(in crate::ops) fn barrier_span(&self, stream: &Stream) -> Result<()> {
        const CALL: &str = "barrier_all_on_stream";
        let t = self.inner.world_team.clone();
        let raw = self.inner.stream_handle(stream, CALL)?;
        let mut c = self.span_begin(&t, CALL, Some(String::new()), stream, raw)?;
        let w = c.work(256)?;
        let (i32c, sum) = (
            nccl::dtype(DType::I32).expect("NCCL has i32"),
            ReduceOp::Sum,
        );
        if !c.sp().hier {
            return c.nccl(c.all().all_reduce(w, w, 1, i32c, sum, c.raw));
        }
        if c.sp().layout.ppn > 1 {
            let node = c.node();
            self.all_reduce_on_stream(
                &node,
                w,
                w,
                1,
                DType::I32,
                sum,
                AllReduceAlgo::Auto,
                stream,
            )?;
        }
        c.nccl(c.inter().all_reduce(w, w, 1, i32c, sum, c.raw))
    }

    /// How the world's collectives reach PEs on other nodes, once the first of them set it up
    /// (None before, and when every PE's memory is reachable from this one): hierarchical or
    /// NCCL over the world, the layout, and the NCCL used.
    pub fn nodes_path(&self) -> Option<String> {
        let g = self.inner.span.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(Span::describe)
    }
}
