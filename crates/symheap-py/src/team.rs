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
