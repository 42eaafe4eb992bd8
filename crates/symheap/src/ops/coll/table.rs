//! Every collective by name: one entry for bindings (the Python extension) that dispatch one
//! call with the kind's parameters by name, instead of one method per collective and form.
//! Each kind reads its own parameters (`Collective::from_params`, in its file), so a new
//! parameter of a kind needs no change here or in the bindings.

use super::all_gather::AllGather;
use super::all_reduce::AllReduce;
use super::alltoall::AllToAll;
use super::broadcast::Broadcast;
use super::reduce_scatter::ReduceScatter;
use super::request::{Collective, Request};
use super::AllReduceAlgo;
use crate::backend::ReduceOp;
use crate::context::team::Team;
use crate::context::Context;
use crate::element::DType;
use crate::error::{invalid, Error, Result};
use crate::stream::Stream;

/// The kinds [`Context::collective`] takes, by name.
pub const COLLECTIVES: [&str; 5] = [
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "alltoall",
];

/// A collective's parameter given by name (see [`CollParams`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CollParam {
    /// A number (a root, a count).
    Int(i64),
    /// A name (a reduction, an algorithm).
    Str(String),
    /// A list of numbers (per-member counts).
    Ints(Vec<i64>),
}

/// A collective's parameters by name: `root` (broadcast), `op` (reductions: sum, min, max,
/// prod), `algo` (all_reduce: auto, one_shot, two_shot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollParams(Vec<(String, CollParam)>);

impl CollParams {
    /// No parameters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets parameter `name` (replacing an earlier value).
    pub fn set(&mut self, name: &str, value: CollParam) -> &mut Self {
        self.0.retain(|(n, _)| n != name);
        self.0.push((name.to_string(), value));
        self
    }
}

/// Reads a call's parameters, each at most once; [`Params::finish`] refuses any left unread.
pub(super) struct Params<'a> {
    call: &'static str,
    pe: usize,
    all: &'a CollParams,
    read: Vec<&'a str>,
}

impl<'a> Params<'a> {
    /// Parameter `name`, if given (marked as read).
    pub(super) fn get(&mut self, name: &'static str) -> Option<&'a CollParam> {
        let v = self.all.0.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        if v.is_some() {
            self.read.push(name);
        }
        v
    }

    /// The error of this call for a parameter.
    pub(super) fn error(&self, why: String) -> Error {
        invalid(self.call, why).with_pe(self.pe)
    }

    /// Parameter `name` as a number, if given.
    pub(super) fn int(&mut self, name: &'static str) -> Result<Option<i64>> {
        match self.get(name) {
            None => Ok(None),
            Some(CollParam::Int(v)) => Ok(Some(*v)),
            Some(other) => Err(self.error(format!("{name} must be an integer, not {other:?}"))),
        }
    }

    /// Parameter `name` as a name, if given.
    pub(super) fn str(&mut self, name: &'static str) -> Result<Option<&'a str>> {
        match self.get(name) {
            None => Ok(None),
            Some(CollParam::Str(v)) => Ok(Some(v)),
            Some(other) => Err(self.error(format!("{name} must be a string, not {other:?}"))),
        }
    }

    /// The all_reduce algorithm `algo` (auto when not given).
    pub(super) fn algo(&mut self) -> Result<AllReduceAlgo> {
        match self.str("algo")? {
            None => Ok(AllReduceAlgo::Auto),
            Some(s) => AllReduceAlgo::parse(s).ok_or_else(|| {
                self.error(format!(
                    "unknown all_reduce algorithm {s:?}; use auto, one_shot, two_shot"
                ))
            }),
        }
    }

    /// The reduction `op` (sum when not given).
    pub(super) fn op(&mut self) -> Result<ReduceOp> {
        match self.str("op")? {
            None => Ok(ReduceOp::Sum),
            Some(s) => ReduceOp::parse(s).ok_or_else(|| {
                self.error(format!("unknown reduction {s:?}; use sum, min, max, prod"))
            }),
        }
    }

    /// Refuses a parameter the kind does not take.
    fn finish(self) -> Result<()> {
        match self
            .all
            .0
            .iter()
            .find(|(n, _)| !self.read.contains(&n.as_str()))
        {
            None => Ok(()),
            Some((n, _)) => Err(self.error(format!("{} takes no parameter {n:?}", self.call))),
        }
    }
}

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
        let mut p = Params {
            call: if c.stream.is_some() {
                K::STREAM_NAME
            } else {
                K::NAME
            },
            pe: self.my_pe(),
            all: params,
            read: Vec::new(),
        };
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
