//! Whether symheap's NVSHMEM provider initialises NVSHMEM or attaches to the one another library
//! of the process (torch's NVSHMEM backend, DeepEP, nvshmem4py) initialised: what each PE finds
//! ([`Found`]) and the decision every PE takes alike on what all found ([`plan`]).

use super::{Api, STATUS_IS_INITIALIZED};

/// What one PE found of NVSHMEM in its process before the provider starts it: whether another
/// library (torch's NVSHMEM backend, DeepEP, nvshmem4py) initialised it already, and as which
/// PE of how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    /// `nvshmemx_init_status()`: 0 not initialised, 1 bootstrapped only, 2 and above
    /// initialised on a GPU.
    pub(crate) status: i32,
    /// `nvshmem_my_pe()` and `nvshmem_n_pes()` when `status` is above 0 (else -1).
    pub(crate) my_pe: i64,
    pub(crate) n_pes: i64,
}

impl Found {
    /// Bytes on the wire between PEs.
    pub(crate) const BYTES: usize = 20;

    /// NVSHMEM's state in this process (`api` loaded, not necessarily initialised).
    pub(crate) fn probe(api: &'static Api) -> Found {
        // SAFETY: reads NVSHMEM's state; valid at any time after loading.
        let status = unsafe { (api.init_status)() };
        if status <= 0 {
            return Found {
                status,
                my_pe: -1,
                n_pes: -1,
            };
        }
        // SAFETY: NVSHMEM is at least bootstrapped (status above), so its PE numbering is set;
        // the calls only read it.
        let (me, n) = unsafe { ((api.my_pe)(), (api.n_pes)()) };
        Found {
            status,
            my_pe: i64::from(me),
            n_pes: i64::from(n),
        }
    }

    pub(crate) fn to_bytes(self) -> [u8; Found::BYTES] {
        let mut b = [0u8; Found::BYTES];
        b[..4].copy_from_slice(&self.status.to_le_bytes());
        b[4..12].copy_from_slice(&self.my_pe.to_le_bytes());
        b[12..].copy_from_slice(&self.n_pes.to_le_bytes());
        b
    }

    pub(crate) fn from_bytes(b: &[u8]) -> Option<Found> {
        let b: &[u8; Found::BYTES] = b.get(..Found::BYTES)?.try_into().ok()?;
        Some(Found {
            status: i32::from_le_bytes(b[..4].try_into().ok()?),
            my_pe: i64::from_le_bytes(b[4..12].try_into().ok()?),
            n_pes: i64::from_le_bytes(b[12..].try_into().ok()?),
        })
    }
}

/// How the provider gets its NVSHMEM, decided alike on every PE from what every PE found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// NVSHMEM is initialised nowhere: the provider initialises it (and finalises it later).
    Init,
    /// Another library initialised it on every PE with symheap's PE numbering: the provider
    /// uses it and leaves its finalisation to that library.
    Attach,
}

/// The decision on what every PE found (`found[r]` is PE r's), for a job of `found.len()` PEs:
/// initialise when no PE has NVSHMEM initialised, attach when every PE has it initialised on a
/// GPU as its own symheap PE (`my_pe == r`, `n_pes == world`), else why neither is possible.
pub(crate) fn plan(found: &[Found]) -> Result<Plan, String> {
    let world = found.len() as i64;
    let list = |pes: &[usize]| {
        pes.iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let initialised: Vec<usize> = (0..found.len()).filter(|&r| found[r].status > 0).collect();
    if initialised.is_empty() {
        return Ok(Plan::Init);
    }
    if initialised.len() != found.len() {
        let none: Vec<usize> = (0..found.len()).filter(|&r| found[r].status <= 0).collect();
        return Err(format!(
            "NVSHMEM is already initialised in the processes of PEs {} but not in those of PEs {}: symheap can use an NVSHMEM another library started only when every PE has it, and cannot start one beside it",
            list(&initialised),
            list(&none)
        ));
    }
    let mut why = Vec::new();
    for (r, f) in found.iter().enumerate() {
        if f.my_pe != r as i64 || f.n_pes != world {
            why.push(format!(
                "PE {r} of {world} is NVSHMEM's PE {} of {}",
                f.my_pe, f.n_pes
            ));
        } else if f.status < STATUS_IS_INITIALIZED {
            why.push(format!(
                "on PE {r} NVSHMEM is only bootstrapped, not set up on a GPU (nvshmemx_init_status = {})",
                f.status
            ));
        }
    }
    if why.is_empty() {
        return Ok(Plan::Attach);
    }
    Err(format!(
        "NVSHMEM was already initialised in this job by another library (torch's NVSHMEM backend, DeepEP, nvshmem4py) with another PE layout: {}. symheap attaches to an NVSHMEM only when NVSHMEM's PE numbering is symheap's (my_pe == symheap's PE, n_pes == its PE count): initialise it over the same ranks (e.g. torch's default process group), or let symheap initialise it",
        why.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(my_pe: i64, n_pes: i64) -> Found {
        Found {
            status: STATUS_IS_INITIALIZED,
            my_pe,
            n_pes,
        }
    }

    const NONE: Found = Found {
        status: 0,
        my_pe: -1,
        n_pes: -1,
    };

    #[test]
    fn initialises_when_no_pe_has_nvshmem() {
        for n in [1, 2, 4, 8] {
            assert_eq!(plan(&vec![NONE; n]), Ok(Plan::Init));
        }
    }

    #[test]
    fn attaches_when_every_pe_is_its_own_nvshmem_pe() {
        for n in [1usize, 2, 4, 8] {
            let found: Vec<Found> = (0..n).map(|r| up(r as i64, n as i64)).collect();
            assert_eq!(plan(&found), Ok(Plan::Attach));
        }
        // The multiple-PEs-per-GPU modes are initialised too.
        let mpg = Found {
            status: 3,
            ..up(0, 1)
        };
        assert_eq!(plan(&[mpg]), Ok(Plan::Attach));
    }

    #[test]
    fn refuses_another_numbering_naming_each_pe_that_differs() {
        // NVSHMEM over ranks in another order.
        let why = plan(&[up(1, 2), up(0, 2)]).unwrap_err();
        assert!(why.contains("PE 0 of 2 is NVSHMEM's PE 1 of 2"), "{why}");
        assert!(why.contains("PE 1 of 2 is NVSHMEM's PE 0 of 2"), "{why}");
        assert!(why.contains("my_pe == symheap's PE"), "{why}");
        // NVSHMEM over a subgroup: 4 symheap PEs, NVSHMEM jobs of 2.
        let why = plan(&[up(0, 2), up(1, 2), up(0, 2), up(1, 2)]).unwrap_err();
        assert!(why.contains("PE 2 of 4 is NVSHMEM's PE 0 of 2"), "{why}");
        assert!(why.contains("PE 0 of 4 is NVSHMEM's PE 0 of 2"), "{why}");
        // NVSHMEM over more PEs than symheap's job.
        let why = plan(&[up(0, 8)]).unwrap_err();
        assert!(why.contains("PE 0 of 1 is NVSHMEM's PE 0 of 8"), "{why}");
    }

    #[test]
    fn refuses_nvshmem_on_some_pes_only() {
        let why = plan(&[up(0, 4), NONE, up(2, 4), NONE]).unwrap_err();
        assert!(
            why.contains("processes of PEs 0, 2 but not in those of PEs 1, 3"),
            "{why}"
        );
    }

    #[test]
    fn refuses_an_nvshmem_only_bootstrapped() {
        let boot = Found {
            status: 1,
            ..up(1, 2)
        };
        let why = plan(&[up(0, 2), boot]).unwrap_err();
        assert!(
            why.contains("on PE 1 NVSHMEM is only bootstrapped") && !why.contains("PE 0 "),
            "{why}"
        );
    }

    #[test]
    fn found_round_trips_through_bytes() {
        for f in [
            NONE,
            up(3, 8),
            Found {
                status: 4,
                my_pe: 0,
                n_pes: 1,
            },
        ] {
            assert_eq!(Found::from_bytes(&f.to_bytes()), Some(f));
        }
        assert_eq!(Found::from_bytes(&[0u8; Found::BYTES - 1]), None);
    }
}
