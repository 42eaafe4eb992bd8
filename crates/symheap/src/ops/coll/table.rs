//! Every collective by name: one entry for bindings (the Python extension) that dispatch one
//! call with the kind's parameters by name, instead of one method per collective and form.
//! Each kind reads its own parameters (`Collective::from_params`, in its file), so a new
//! parameter of a kind needs no change here or in the bindings.

use super::all_gather::AllGather;
use super::all_reduce::AllReduce;
use super::alltoall::AllToAll;
use super::broadcast::Broadcast;
use super::params::{CollParams, Params};
use super::reduce_scatter::ReduceScatter;
use super::request::{Collective, Request};
use crate::context::team::Team;
use crate::context::Context;
use crate::element::DType;
use crate::error::{invalid, Result};
use crate::stream::Stream;

/// The kinds [`Context::collective`] takes, by name.
pub const COLLECTIVES: [&str; 5] = [
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "alltoall",
];

/// The arguments every collective takes, for [`Context::collective`].
struct Call<'a> {
    team: &'a Team,
    dest: u64,
    src: u64,
    count: usize,
    dtype: DType,
    stream: Option<&'a Stream>,
}

impl Context {
    /// Collective `kind` (one of [`COLLECTIVES`]) over `team`, with the kind's parameters by
    /// name in `params` (see [`CollParams`]): on `stream` when given (the `*_on_stream` form),
    /// else complete on return (the `*_raw` form). The same call as the kind's own entry, for
    /// bindings that dispatch every collective through one. Collective-order rule: as for each
    /// kind, every member of the team calls it in the same order with the same arguments.
    #[allow(clippy::too_many_arguments)]
    pub fn collective(
        &self,
        kind: &str,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        stream: Option<&Stream>,
        params: &CollParams,
    ) -> Result<()> {
        let c = Call {
            team,
            dest,
            src,
            count,
            dtype,
            stream,
        };
        match kind {
            "broadcast" => self.by_name::<Broadcast>(c, params),
            "all_gather" => self.by_name::<AllGather>(c, params),
            "reduce_scatter" => self.by_name::<ReduceScatter>(c, params),
            "all_reduce" => self.by_name::<AllReduce>(c, params),
            "alltoall" => self.by_name::<AllToAll>(c, params),
            other => Err(invalid(
                "collective",
                format!("unknown collective {other:?} ({})", COLLECTIVES.join(", ")),
            )
            .with_pe(self.my_pe())),
        }
    }

    /// Builds the kind from `params` (`Collective::from_params`), then runs the request.
    fn by_name<K: Collective>(&self, c: Call<'_>, params: &CollParams) -> Result<()> {
        let call = if c.stream.is_some() {
            K::STREAM_NAME
        } else {
            K::NAME
        };
        let mut p = Params::new(call, self.my_pe(), params);
        let kind = K::from_params(&mut p)?;
        p.finish()?;
        let r = Request {
            kind,
            team: c.team,
            dest: c.dest,
            src: c.src,
            count: c.count,
            dtype: c.dtype,
            stream: c.stream,
        };
        self.run_collective(r)
    }
}
