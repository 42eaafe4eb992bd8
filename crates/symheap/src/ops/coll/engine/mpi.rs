//! The Open MPI engine: host collectives over a team that spans nodes. The call is checked
//! across the job (the world ledger, exchanged over the rendezvous, so diverging calls are
//! still named on every PE), then Open MPI moves the data (`backend/host/mpi.rs`: no TCP data
//! path of symheap's own; each kind's call is its `Collective::mpi`). The world team, or a
//! split of it that spans nodes (over the communicator Open MPI split off for it, its ledger
//! compared among its members over that communicator), and only under Open MPI's mpirun:
//! otherwise every PE gets the same error saying what is missing.

use super::super::request::{Collective, Plan, Request};
use super::super::transport::host::check_len;
use super::Engine;
use crate::backend::host::mpi::{Mpi, MpiComm};
use crate::context::comms::TeamComm;
use crate::context::team::TeamInner;
use crate::context::Context;
use crate::error::{Error, ErrorKind, Result};

/// The Open MPI engine (see the module documentation).
pub(in crate::ops::coll) struct MpiEngine;

fn unsupported(rank: usize, call: &'static str, why: String) -> Error {
    Error::new(Some(rank), call, ErrorKind::Unsupported(why))
}

impl Engine for MpiEngine {
    /// The host backend, on a team with members whose memory this PE cannot reach.
    fn accepts<K: Collective>(&self, cx: &Context, _: &Request<'_, K>, p: &Plan<'_>) -> bool {
        let inner = &cx.inner;
        // The common case first, in a few loads: the whole job on one node.
        !inner.area.all_direct()
            && p.cuda.is_none()
            && p.t
                .members
                .iter()
                .any(|&m| inner.mem.slot_base(m).is_none())
    }

    /// Checks the call against every member's ledger, then runs it through Open MPI: over the
    /// world's communicator, or the one Open MPI split off for a split of the world.
    fn run<K: Collective>(&self, cx: &Context, r: &Request<'_, K>, p: &Plan<'_>) -> Result<()> {
        let (inner, call, t) = (&cx.inner, K::NAME, p.t);
        p.check_ranges(r, true, |what, addr, len| {
            check_len(inner, call, what, addr, len)
        })?;
        let args = || r.text(cx, p, None, false);
        let (mpi, comm) = if t.spans {
            // A split of the world across nodes: its own communicator, made at the split.
            let comm = cx.mpi_team_point(t, call, args())?;
            let mpi = inner
                .mpi()
                .map_err(|e| unsupported(inner.rank, call, e.clone()))?;
            (mpi, comm)
        } else {
            let mpi = world_mpi(cx, call, args())?;
            (mpi, mpi.world())
        };
        r.kind.mpi(cx, mpi, comm, r, p)
    }
}

/// Opens Open MPI at the first collective over the world across nodes, checking `call(args)`
/// against every PE's ledger: every PE says whether it has MPI with the ledger check, so all
/// fail alike rather than some entering MPI and waiting there for the others.
fn world_mpi<'a>(cx: &'a Context, call: &'static str, args: String) -> Result<&'a Mpi> {
    let inner = &cx.inner;
    let opened = inner
        .comms
        .mpi
        .get_or_init(|| Mpi::open(inner.rank, inner.world));
    let status: &[u8] = if opened.is_ok() { &[1] } else { &[0] };
    let all = inner.collective(call, args, Some(status))?;
    let missing: Vec<usize> = (0..all.len())
        .filter(|&r| all[r].first() != Some(&1))
        .collect();
    match (opened, missing.is_empty()) {
        (Ok(m), true) => Ok(m),
        (Err(why), _) => Err(unsupported(inner.rank, call, nodes_why(why))),
        (Ok(_), false) => {
            let why = format!("PEs {missing:?} could not open Open MPI (their errors say why)");
            Err(unsupported(inner.rank, call, nodes_why(&why)))
        }
    }
}

impl Context {
    /// A meeting point of `t`, a split of the world that spans nodes (host backend): records
    /// `call(args)` in the team's ledger and compares every member's ledger digest over the
    /// team's communicator (an MPI all_gather), so members that made different calls get the
    /// same named error instead of meeting in different MPI collectives. Returns the
    /// communicator.
    pub(in crate::ops) fn mpi_team_point(
        &self,
        t: &TeamInner,
        call: &'static str,
        args: String,
    ) -> Result<MpiComm> {
        let inner = &self.inner;
        let comm = match inner.comms.team_comms().get(&t.slot) {
            Some(TeamComm::Mpi(c)) => *c,
            _ => {
                let why = format!("{} has no Open MPI communicator", t.name);
                return Err(Error::new(Some(inner.rank), call, ErrorKind::Backend(why)));
            }
        };
        let mpi = inner
            .mpi()
            .map_err(|e| unsupported(inner.rank, call, e.clone()))?;
        let mut st = t.lock();
        inner.record_on(t, &mut st, call, args);
        let (n, h) = st.ledger.digest();
        let digest = [n, h];
        let mut all = vec![[0u64; 2]; t.members.len()];
        mpi.all_gather(
            comm,
            all.as_mut_ptr() as u64,
            digest.as_ptr() as u64,
            std::mem::size_of_val(&digest),
        )
        .map_err(|why| Error::new(Some(inner.rank), call, ErrorKind::Backend(why)))?;
        if all.iter().any(|d| *d != digest) {
            // Every member sees the same digests, so every member takes this path: exchange
            // the ledgers themselves (fixed-size, length-prefixed) and name the first
            // differing call, the same text on every member.
            const MAX: usize = 4096;
            let enc = st.ledger.encode_limited(MAX - 4);
            let mut mine = vec![0u8; MAX];
            mine[..4].copy_from_slice(&(enc.len() as u32).to_le_bytes());
            mine[4..4 + enc.len()].copy_from_slice(&enc);
            let mut every = vec![0u8; MAX * t.members.len()];
            mpi.all_gather(comm, every.as_mut_ptr() as u64, mine.as_ptr() as u64, MAX)
                .map_err(|why| Error::new(Some(inner.rank), call, ErrorKind::Backend(why)))?;
            let parts: Vec<&[u8]> = every
                .chunks(MAX)
                .map(|c| {
                    let len = u32::from_le_bytes(c[..4].try_into().expect("4 bytes")) as usize;
                    &c[4..4 + len.min(MAX - 4)]
                })
                .collect();
            let why = match st.ledger.compare_named(&parts, &t.members) {
                Err(why) => why,
                Ok(()) => format!("the ledgers of {} differ", t.name),
            };
            return Err(Error::new(
                Some(inner.rank),
                call,
                ErrorKind::CollectiveMismatch(why),
            ));
        }
        st.ledger.mark_agreed();
        Ok(comm)
    }
}

fn nodes_why(why: &str) -> String {
    format!("members of this team are on other nodes, where the host backend's collectives run through Open MPI: {why}")
}
