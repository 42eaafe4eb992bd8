//! The collectives' side of the aliasing rules (`ops/alias.rs`): the check as every collective
//! entry makes it, with the error it returns, and the one spelling of "in place" the host
//! paths and the ledger work with.

use super::alias::{self, CollBuffers, CollKind, Placement};
use crate::context::team::Team;
use crate::context::Context;
use crate::element::DType;
use crate::error::{invalid, Error, Result};

impl Context {
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
pub(super) fn host_form(kind: CollKind, placed: Placement, dest: u64, src: u64) -> (u64, u64) {
    match (placed, kind) {
        (Placement::InPlace, CollKind::ReduceScatter) => (src, src),
        (Placement::InPlace, _) => (dest, dest),
        (Placement::Apart, _) => (dest, src),
    }
}
