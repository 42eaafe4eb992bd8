//! A collective's parameters by name ([`CollParams`], from the bindings) and how a kind reads
//! them ([`Params`], in its `Collective::from_params`): below both the kinds and the table of
//! them (`table.rs`), which only passes them on.

use super::AllReduceAlgo;
use crate::backend::ReduceOp;
use crate::error::{invalid, Error, Result};

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
    /// The parameters `all` of `call` on PE `pe`, none read yet.
    pub(super) fn new(call: &'static str, pe: usize, all: &'a CollParams) -> Self {
        Params {
            call,
            pe,
            all,
            read: Vec::new(),
        }
    }

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
    pub(super) fn finish(self) -> Result<()> {
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
