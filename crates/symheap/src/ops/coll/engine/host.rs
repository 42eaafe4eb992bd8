//! The host engine: a collective as a sequence of backend steps between team barriers, on the
//! PEs of one node. An entry barrier (every member's source is ready and its destination free;
//! also where the ledger catches diverging calls), member-to-member copies or reductions read
//! straight from peers' copies, and an exit barrier (every destination is complete and every
//! source may be reused). Each kind's steps are in its own file ([`Collective::host`]), written
//! with `transport/host.rs`'s `Coll`.
//!
//! Up to `PAYLOAD` bytes on the host backend, broadcast and all_reduce take one pass instead:
//! the data rides on each member's arrival at the entry barrier (in its sync area,
//! double-buffered like the arrivals; up to `INLINE` bytes inside the arrival itself, pushed
//! to every member), and every member, once the ledgers are known to agree, reads it from there
//! into its own destination; there is no exit barrier. On return this PE's destination is
//! complete and its source reusable (what MPI and OpenSHMEM promise); other PEs' accesses to it
//! are ordered by a barrier, as for any heap data. A broadcast of at most `EAGER_INLINE` bytes,
//! with every PE of the job on this node, does not even meet (`eager.rs`).
//!
//! The engine of last resort: it takes every request the others decline (on CUDA, reductions
//! of dtypes the kernels lack, run through the backend's copies and reductions).

use super::super::request::{Collective, Plan, Request};
use super::super::transport::host::check_len;
use super::Engine;
use crate::context::Context;
use crate::error::Result;

/// The host engine (see the module documentation).
pub(in crate::ops::coll) struct HostEngine;

impl Engine for HostEngine {
    fn accepts<K: Collective>(&self, _: &Context, _: &Request<'_, K>, _: &Plan<'_>) -> bool {
        true
    }

    fn run<K: Collective>(&self, cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> Result<()> {
        p.check_ranges(r, true, |what, addr, len| {
            check_len(&cx.inner, K::NAME, what, addr, len)
        })?;
        r.kind.host(cx, r, p)
    }
}
