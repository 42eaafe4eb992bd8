//! The bodies of `Context`'s collective methods (`context.rs` keeps their Python signatures and
//! documentation): a collective by name, the kernel's local-buffer question, the aliasing
//! rules, and the fast path that asks where the buffers may stay and launches in one call.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use symheap::alias::{ByteRange, CollBuffers, CollKind, Placement};
use symheap::{StreamColl, Team};

use crate::buffer::parse_dtype;
use crate::convert::{coll_params, parse_algo, stream_or};
use crate::errors::{value_error, IntoPyResult};

/// The message of an unknown collective name.
fn unknown(coll: &str) -> PyErr {
    value_error(format!(
        "unknown collective {coll:?} (all_reduce, reduce_scatter, all_gather, broadcast, \
         alltoall)"
    ))
}

/// `coll` (all_reduce with algorithm `algo`, reduce_scatter, all_gather, broadcast, alltoall)
/// as a stream collective.
pub(crate) fn stream_coll(coll: &str, algo: &str) -> PyResult<StreamColl> {
    Ok(match coll {
        "all_reduce" => StreamColl::AllReduce(parse_algo(algo)?),
        "reduce_scatter" => StreamColl::ReduceScatter,
        "all_gather" => StreamColl::AllGather,
        "broadcast" => StreamColl::Broadcast,
        "alltoall" => StreamColl::Alltoall,
        other => return Err(unknown(other)),
    })
}

/// The aliasing rules of `coll` on `team` for the two byte ranges: whether it is the kind's
/// in-place form (False when apart, or when this PE is not a member); the invalid-argument
/// error naming both ranges otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_buffers(
    ctx: &symheap::Context,
    coll: &str,
    team: &Team,
    dest: (u64, u64),
    src: (u64, u64),
    count: u64,
    dtype: &str,
) -> PyResult<bool> {
    let kind = CollKind::from_name(coll).ok_or_else(|| unknown(coll))?;
    let Some(me) = team.my_pe() else {
        return Ok(false);
    };
    let b = CollBuffers {
        kind,
        dest: ByteRange::new(dest.0, dest.1.into()),
        src: ByteRange::new(src.0, src.1.into()),
        count,
        elem: parse_dtype(dtype)?.size() as u64,
        n: team.n_pes() as u64,
        me: me as u64,
    };
    let placed = ctx.check_coll_buffers(kind.name(), &b).py()?;
    Ok(placed == Placement::InPlace)
}

/// One collective call: `kind` of `count` `dtype` elements per block, from `src` into `dest`,
/// on `stream` when given, the GIL released while it runs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    py: Python<'_>,
    ctx: &Arc<symheap::Context>,
    kind: &str,
    team: Team,
    dest: u64,
    src: u64,
    count: usize,
    dtype: &str,
    stream: Option<u64>,
    params: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let dt = parse_dtype(dtype)?;
    let params = coll_params(params)?;
    let (ctx, kind) = (ctx.clone(), kind.to_string());
    py.detach(move || {
        let s = stream.map(|s| stream_or(Some(s)));
        ctx.collective(&kind, &team, dest, src, count, dt, s.as_ref(), &params)
    })
    .py()
}

/// [`run`] when both buffers can go to the kernel as they are
/// (`symheap::Context::coll_direct_buffers`): then `(dest_symmetric, src_symmetric)`; None,
/// with nothing run, when one must be staged first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_direct(
    py: Python<'_>,
    ctx: &Arc<symheap::Context>,
    kind: &str,
    team: Team,
    dest: u64,
    src: u64,
    count: usize,
    dtype: &str,
    stream: Option<u64>,
    params: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<(bool, bool)>> {
    let algo = match params.map(|p| p.get_item("algo")).transpose()?.flatten() {
        Some(a) => Some(a.extract::<String>().map_err(|_| {
            value_error(format!(
                "algo must be a string (auto, one_shot, two_shot), not {a}"
            ))
        })?),
        None => None,
    };
    let coll = stream_coll(kind, algo.as_deref().unwrap_or("auto"))?;
    let dt = parse_dtype(dtype)?;
    let Some(placed) = ctx.coll_direct_buffers(coll, &team, dest, src, count, dt) else {
        return Ok(None);
    };
    run(py, ctx, kind, team, dest, src, count, dtype, stream, params)?;
    Ok(Some(placed))
}
