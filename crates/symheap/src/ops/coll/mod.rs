//! Collectives on a team: broadcast, all_gather, reduce_scatter, all_reduce, alltoall, through
//! one pipeline.
//!
//! Every entry (the typed form on buffers, `*_raw` on addresses, `*_on_stream`, and the
//! bindings' [`Context::collective`] by name) builds one [`request::Request`]: the kind with its
//! parameters, destination, source, count, dtype, team and, for the stream forms, the stream.
//! The pipeline then, once for every call:
//!
//! 1. checks it (`request.rs`: alignment, the stream, sizes, the kind's own arguments, the
//!    aliasing rules of `ops/alias.rs`), which yields the plan every engine works from;
//! 2. offers it to the engines in order (`engine/mod.rs`: NCCL across nodes, symheap's kernels
//!    on CUDA, Open MPI across nodes on the host backend, the host engine otherwise); the first
//!    that accepts records the call in the team's ledger (its text made by
//!    `Request::text`), meets the other members where its transport needs it, and runs the
//!    kind's steps on its transport.
//!
//! Each kind is one file ([`broadcast`], [`all_gather`], [`reduce_scatter`], [`all_reduce`],
//! [`alltoall`]): its parameters, its ledger text, its entries, and its steps on each engine
//! (`request::Collective`). Which kernel and grid a stream collective runs is `plan.rs`.
//!
//! Collective-order rule: every member of the team calls each collective in the same order with
//! the same arguments (root, count, dtype, op); symheap checks it at the entry barrier (the
//! stream forms: at the next host collective point; the root of an eager broadcast: at its next
//! call that waits, or at finalize).

mod all_gather;
mod all_reduce;
mod alltoall;
mod broadcast;
mod engine;
mod params;
pub(crate) mod plan;
mod reduce_scatter;
mod request;
mod table;
mod transport;

pub use params::{CollParam, CollParams};
pub use plan::StreamColl;
pub use table::COLLECTIVES;
pub(crate) use transport::device::order_team;

use crate::context::Context;
use crate::error::Result;
use request::{Collective, Request};

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

    /// The algorithm named `s` (auto, one_shot or one-shot, two_shot; any case).
    pub fn parse(s: &str) -> Option<AllReduceAlgo> {
        match s
            .trim()
            .to_ascii_lowercase()
            .replace(['-', '_'], "")
            .as_str()
        {
            "auto" => Some(AllReduceAlgo::Auto),
            "oneshot" => Some(AllReduceAlgo::OneShot),
            "twoshot" => Some(AllReduceAlgo::TwoShot),
            _ => None,
        }
    }
}

/// Across nodes (CUDA backend), an all_reduce of up to this many bytes runs whole inside each
/// node, then whole between nodes (two latencies); a larger one reduce-scatters inside the node
/// first, so that each PE sends only its shard between nodes (see `all_reduce.rs`).
pub const NODES_ALL_REDUCE_SMALL: u64 = 256 << 10;

/// Largest message `Auto` sends one-shot on the host backend.
pub const ONE_SHOT_MAX_BYTES: usize = 64 << 10;

impl Context {
    /// Runs `r`: through the kind's entry (`Collective::enter`, which may take a shortcut, as
    /// the eager broadcast does), then the pipeline.
    #[inline]
    fn run_collective<K: Collective>(&self, r: Request<'_, K>) -> Result<()> {
        K::enter(self, r)
    }

    /// The pipeline (see the module documentation): the checks, then the first engine that
    /// accepts the request.
    fn pipeline<K: Collective>(&self, r: Request<'_, K>) -> Result<()> {
        let Some(p) = self.check_request(&r)? else {
            return Ok(());
        };
        engine::run(self, &r, &p)
    }
}
