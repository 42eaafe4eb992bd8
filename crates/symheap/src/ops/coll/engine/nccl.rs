//! The NCCL engine: collectives of a team whose members are on several nodes (CUDA backend).
//! Stream-ordered, and capturable in a CUDA graph once the first collective across nodes
//! (which sets up NCCL) and the largest workspace ran eagerly.
//!
//! The world across nodes runs hierarchically where the layout allows (see
//! `context/span.rs`): symheap's kernels among the PEs of each node, NCCL between nodes over
//! the communicator of the PEs with the same node index (one per node); otherwise NCCL over
//! the whole world. Each kind's steps are its `Collective::nccl_world`, written with
//! `transport/nccl.rs`'s `SpanCall`. A split of the world that spans nodes runs each
//! collective as one NCCL call over its own communicator instead (`Collective::nccl_team`, see
//! `transport/nccl_team.rs`), ranked as the team.
//!
//! The host form meets first (the world over the rendezvous, which checks the ledgers across
//! the job; a split across nodes has no place to meet but its NCCL collective), then runs on
//! the backend's own stream and waits for it. Collective-order rule: as for every collective,
//! the same calls in the same order on every PE; the team's ledger records each call and the
//! next host collective point compares them across the job.

use super::super::request::{Collective, Plan, Request};
use super::super::transport::nccl::nccl_code;
use super::Engine;
use crate::context::Context;
use crate::error::Result;

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
            cx.inner
                .collective(call, r.text(cx, p, None, false), None)?;
            None
        } else {
            Some(r.text(cx, p, Some("across nodes"), false))
        };
        if p.t.spans {
            cx.team_span_run(cu, p.t, call, args, s, raw, |comm, raw| {
                r.kind.nccl_team(comm, r, p, raw)
            })?;
        } else {
            let mut c = cx.span_begin(cu, p.t, call, args, s, raw)?;
            r.kind.nccl_world(&mut c, r, p)?;
        }
        if host_form {
            cx.sync_stream(s)?;
        }
        Ok(())
    }
}
