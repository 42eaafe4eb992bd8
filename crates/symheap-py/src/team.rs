//! `Team`: a handle on a team of PEs, as Python sees it.

use pyo3::prelude::*;
use symheap::Team;

use crate::convert::index_arg;

/// A team handle (`Team.INVALID`-like when `is_valid` is false: operations on it do nothing).
#[pyclass(module = "symheap._native", name = "Team", frozen)]
pub struct PyTeam {
    pub(crate) team: Team,
}

#[pymethods]
impl PyTeam {
    /// False for the invalid team non-members get from a split.
    #[getter]
    fn is_valid(&self) -> bool {
        self.team.is_valid()
    }

    /// This PE's index in the team (None when invalid).
    fn my_pe(&self) -> Option<usize> {
        self.team.my_pe()
    }

    /// Number of members (0 when invalid).
    fn n_pes(&self) -> usize {
        self.team.n_pes()
    }

    /// World ranks of the members, in team order.
    #[getter]
    fn members(&self) -> Vec<usize> {
        self.team.members().to_vec()
    }

    /// World rank of team member `pe` (None if there is no such member).
    fn world_pe(&self, pe: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        Ok(self.team.world_pe(index_arg(pe, "team member")?))
    }

    /// Team member `pe` of this team as a member index of `dest` (None if not a member).
    fn translate_pe(&self, pe: &Bound<'_, PyAny>, dest: &PyTeam) -> PyResult<Option<usize>> {
        Ok(self
            .team
            .translate_pe(index_arg(pe, "team member")?, &dest.team))
    }

    fn __eq__(&self, other: &PyTeam) -> bool {
        self.team.same_as(&other.team)
    }

    fn __hash__(&self) -> u64 {
        self.team
            .members()
            .iter()
            .fold(self.team.n_pes() as u64, |h, &m| {
                h.wrapping_mul(1_000_003).wrapping_add(m as u64)
            })
    }

    fn __repr__(&self) -> String {
        format!("Team({}, members={:?})", self.team, self.team.members())
    }
}

/// A list of ranks from Python (any iterable of non-negative ints), `what` naming it in the
/// error.
pub(crate) fn ranks_arg(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    let items = v.try_iter().map_err(|_| {
        crate::errors::value_error(format!("{what} must be a list of ranks, not {v}"))
    })?;
    items
        .map(|item| index_arg(&item?, &format!("a rank of {what}")))
        .collect()
}

/// The exchange of `Context::team_from_world_ranks` through a Python callable
/// `exchange(bytes) -> list[bytes]`, called with the GIL. An exception it raises (or a result
/// that is not a list of bytes) fails the call as a symheap error naming `call`, and the
/// exception is kept in `raised` to become the cause of the one Python sees.
pub(crate) fn py_exchange<'a>(
    exchange: &'a Py<PyAny>,
    call: &'static str,
    rank: usize,
    raised: &'a mut Option<PyErr>,
) -> impl FnMut(&[u8]) -> symheap::Result<Vec<Vec<u8>>> + 'a {
    move |mine: &[u8]| {
        Python::attach(|py| -> PyResult<Vec<Vec<u8>>> {
            let got = exchange.call1(py, (pyo3::types::PyBytes::new(py, mine),))?;
            let got = got.bind(py);
            let mut parts = Vec::new();
            for item in got.try_iter()? {
                let item = item?;
                let bytes: std::borrow::Cow<'_, [u8]> = item.extract()?;
                parts.push(bytes.into_owned());
            }
            Ok(parts)
        })
        .map_err(|e| {
            let why = Python::attach(|py| {
                let name = e
                    .get_type(py)
                    .name()
                    .map_or_else(|_| "an exception".to_string(), |n| n.to_string());
                format!("exchange raised {name}: {}", e.value(py))
            });
            *raised = Some(e);
            symheap::Error::new(Some(rank), call, symheap::ErrorKind::Bootstrap(why))
        })
    }
}
