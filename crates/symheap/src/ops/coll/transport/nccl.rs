//! The NCCL engine's transport for the world across nodes: one collective in flight
//! ([`SpanCall`]: the set-up state locked for the call, the communicators between nodes and of
//! the whole world, the workspace, strided copies), how it starts ([`Context::span_begin`]:
//! the record, the order after the world's previous collective, NCCL set up at the first call),
//! and NCCL's codes. The kinds' `Collective::nccl_world` steps are written with it; a split of
//! the world that spans nodes runs on `nccl_team.rs`.

use std::sync::MutexGuard;

use crate::backend::cuda::nccl::{self, Comm};
use crate::backend::cuda::{driver, CudaBackend};
use crate::backend::ReduceOp;
use crate::context::comms::Span;
use crate::context::team::{Team, TeamInner};
use crate::context::Context;
use crate::element::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::coll::AllReduceAlgo;
use crate::stream::Stream;

/// NCCL's code for bytes.
pub(in crate::ops::coll) const BYTES: i32 = 1;

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
    pub(in crate::ops::coll) fn span_begin<'a>(
        &'a self,
        cu: &CudaBackend,
        t: &TeamInner,
        call: &'static str,
        args: Option<String>,
        stream: &'a Stream,
        raw: u64,
    ) -> Result<SpanCall<'a>> {
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
    pub(in crate::ops) fn barrier_span(&self, cu: &CudaBackend, stream: &Stream) -> Result<()> {
        const CALL: &str = "barrier_all_on_stream";
        let t = self.inner.teams.world_team.clone();
        let raw = self.inner.stream_handle(stream, CALL)?;
        let mut c = self.span_begin(cu, &t, CALL, Some(String::new()), stream, raw)?;
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
        let g = self
            .inner
            .comms
            .span
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(Span::describe)
    }
}
