//! The device engine: on CUDA, a team inside one node runs each collective as one kernel
//! (`backend/cuda/coll/*.cu`) that synchronises with the other members through flags in
//! symmetric memory, so it can be captured in a CUDA graph. Which kernel, and whether it
//! touches its buffers on this PE only, is the kind's `Collective::device_plan` (from
//! `plan.rs`); its launch is the kind's `Collective::device`, written with `transport/device.rs`'s `Launch`. A team
//! of one copies with the copy engine.
//!
//! The stream form records the call in the team's ledger as it is enqueued. The host form
//! meets first (the entry barrier, which checks the ledgers, so diverging calls fail naming
//! the call), then runs on the backend's own stream and waits for it.
//!
//! Collective-order rule: every member of the team calls each collective in the same order with
//! the same arguments; the calls are recorded in the team's ledger and compared at the next host
//! collective point.

use super::super::request::{Collective, Plan, Request};
use super::super::transport::device::{order_team, Launch};
use super::Engine;
use crate::backend::cuda::coll_args::CollDType;
use crate::backend::cuda::CudaBackend;
use crate::context::Context;
use crate::error::{err, ErrorKind, Result};
use crate::stream::Stream;

/// The device engine (see the module documentation).
pub(in crate::ops::coll) struct DeviceEngine;

impl Engine for DeviceEngine {
    /// CUDA, a team inside one node; a reduction only of the dtypes the kernels have.
    fn accepts<K: Collective>(&self, cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> bool {
        p.cuda.is_some()
            && !cx.inner.spans_nodes(p.t)
            && (!r.kind.reduces() || CollDType::of(r.dtype).is_some())
    }

    fn run<K: Collective>(&self, cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> Result<()> {
        let cu = p.cuda.expect("accepted on CUDA only");
        let (call, t) = (r.call(), p.t);
        let (s, raw) = match r.stream {
            Some(s) => (s, p.raw),
            None => {
                let s = cu.internal_stream();
                (s, cx.inner.stream_handle(s, call)?)
            }
        };
        let dp = r.kind.device_plan(cu, r, p);
        p.check_ranges(r, false, |_, addr, len| {
            cx.check_buf(cu, call, addr, len as u64, s, dp.local)
        })?;
        if let Some(&m) = t
            .members
            .iter()
            .find(|&&m| cx.inner.backend.slot_base(m).is_none())
        {
            return Err(err(
                call,
                ErrorKind::Unsupported(format!(
                    "PE {m}'s GPU memory is not directly reachable from this GPU"
                )),
            )
            .with_pe(cx.my_pe()));
        }
        cu.bind()?;
        order_team(t, s, raw)?;
        if r.stream.is_none() {
            // The members meet before the launch, where the ledgers are compared.
            let mut st = t.lock();
            cx.inner
                .record_on(t, &mut st, call, r.text(cx, p, None, false));
            cx.inner.team_sync_point(t, &mut st, call, 0)?;
        } else {
            let args = r.text(cx, p, dp.detail, dp.local);
            cx.inner.record_on(t, &mut t.lock(), call, args);
        }
        let l = Launch::new(cx, cu, t, raw);
        if t.members.len() == 1 {
            r.kind.device_alone(cx, &l, r, p)?;
        } else {
            r.kind.device(cx, &l, r, p, &dp)?;
        }
        if r.stream.is_none() {
            cx.sync_stream(s)?;
        }
        Ok(())
    }
}

impl Context {
    /// Checks a collective's buffer: symmetric memory as [`Context::check_range`]; with `local`
    /// (the kernel touches the buffer only on this PE) also any device memory of this PE's GPU
    /// outside every heap, which the caller keeps alive until the stream has run the kernel.
    fn check_buf(
        &self,
        cu: &CudaBackend,
        call: &'static str,
        addr: u64,
        bytes: u64,
        stream: &Stream,
        local: bool,
    ) -> Result<()> {
        if local && !self.inner.in_any_heap(addr) {
            cu.check_local_range(addr, bytes, call)
                .map_err(|e| e.with_pe(self.my_pe()))
        } else {
            self.check_range(call, addr, bytes, stream)
        }
    }
}
