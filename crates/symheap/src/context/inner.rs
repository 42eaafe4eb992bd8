//! A context's state ([`Inner`]) and its host collective points: the ledger exchange, the
//! agreed reclaim, finalize.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use super::area::SyncArea;
use super::{comms, memory, recent, team, teams};
use crate::backend::shared::SharedArea;
use crate::backend::AnyBackend;
use crate::bootstrap::{Bootstrap, Launcher, NodeInfo};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::heap::HeapState;

/// A context's state. Settings, bootstrap, backend and the host sync area are held here; the
/// rest is in parts with one role each, in their own files: the heap ([`memory::Memory`]), the
/// teams and the watchdog ([`teams::Teams`]), device state and communicators
/// ([`comms::Comms`]).
pub(crate) struct Inner {
    pub(crate) cfg: Config,
    /// How long waits spin before yielding (see `spin::SpinBudget`).
    pub(crate) spin: super::spin::SpinBudget,
    pub(crate) launcher: Launcher,
    pub(crate) token_source: String,
    /// How the PEs met, for the banner.
    pub(crate) rendezvous: String,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) boot: Arc<dyn Bootstrap>,
    /// `boot`'s failure state, held here for the check at every call's entry.
    pub(crate) health: Arc<crate::bootstrap::Health>,
    pub(crate) node: NodeInfo,
    pub(crate) backend: AnyBackend,
    /// Host shared memory for symheap's own synchronisation.
    pub(crate) control: SharedArea,
    /// Layout of the sync area inside `control`.
    pub(crate) area: SyncArea,
    /// Where init's time went, for the banner (set once init is done).
    pub(crate) init_phases: std::sync::OnceLock<crate::util::Phases>,
    pub(super) finalized: AtomicBool,
    /// Allocation: the heap and every PE's slot base.
    pub(crate) mem: memory::Memory,
    /// The world team, the team slots, the live teams and the watchdog.
    pub(crate) teams: teams::Teams,
    /// Device state (CUDA) and the communicators made on demand (NCCL, Open MPI).
    pub(crate) comms: comms::Comms,
}

impl Inner {
    #[inline]
    pub(crate) fn check(&self, call: &'static str) -> Result<()> {
        self.health.check(self.rank, call)
    }

    /// Records `call(args)` in the world team's ledger (locking the world team: the caller
    /// must not hold it).
    pub(super) fn record(&self, call: &'static str, args: String) {
        self.record_on(
            &self.teams.world_team,
            &mut self.teams.world_team.lock(),
            call,
            args,
        );
    }

    /// A host collective point: exchanges the ledger (failing every PE on divergence) and the
    /// releases (reclaiming what every PE released), plus `payload`. Returns every PE's payload.
    /// `ts` is the world team's state, locked by the caller after `st`.
    pub(super) fn sync_point(
        &self,
        st: &mut HeapState,
        ts: &mut team::TeamState,
        call: &'static str,
        payload: Option<&[u8]>,
    ) -> Result<Vec<Vec<u8>>> {
        // Every PE meets at the shared-memory barrier first, whatever it exchanges next: a PE
        // in a different call meets it there too and the mismatch is named, instead of one PE
        // waiting on the bootstrap while another waits on the barrier. Only a barrier (no
        // payload on any PE: the call decides, never the bytes) may end there; an exchange
        // whose payload happened to be empty on one PE once skipped the bootstrap on that PE
        // alone and left the others waiting for it.
        if self.world_fast_sync(ts, call)? && payload.is_none() {
            return Ok(Vec::new());
        }
        let payload = payload.unwrap_or_default();
        let ledger = ts.ledger.encode();
        self.poll_releases();
        let releases = self.mem.heap.take_releases();
        let mut msg = Vec::with_capacity(ledger.len() + releases.len() + payload.len() + 8);
        for part in [&ledger, &releases] {
            msg.extend_from_slice(&(part.len() as u32).to_le_bytes());
            msg.extend_from_slice(part);
        }
        msg.extend_from_slice(payload);
        fence(Ordering::SeqCst);
        let parts = self
            .boot
            .all_gather(call, &msg)
            .map_err(|e| e.during(call).with_pe(self.rank))?;
        fence(Ordering::SeqCst);
        let mut ledgers = Vec::with_capacity(parts.len());
        let mut rels = Vec::with_capacity(parts.len());
        let mut payloads = Vec::with_capacity(parts.len());
        for (r, p) in parts.iter().enumerate() {
            let (l, rest) = split_part(p).ok_or_else(|| garbled(self.rank, call, r))?;
            let (rl, rest) = split_part(rest).ok_or_else(|| garbled(self.rank, call, r))?;
            ledgers.push(l);
            rels.push(rl);
            payloads.push(rest.to_vec());
        }
        let verdict = ts.ledger.compare(&ledgers);
        if let Err(msg) = verdict {
            let kind = ErrorKind::CollectiveMismatch(msg);
            // Every PE computes the same verdict from the same bytes, so nobody needs telling;
            // recording it poisons this context so no later call runs on a diverged heap.
            self.boot.health().fail(kind.clone());
            return Err(Error::new(Some(self.rank), call, kind));
        }
        self.mem.heap.apply_releases(st, &rels);
        Ok(payloads)
    }

    /// A host collective point for `call`: records `call(args)` in the world ledger, then
    /// exchanges ledgers (failing every PE, with the first differing call named, when they
    /// diverged), reclaims what every PE released, and with `Some(payload)` gathers it from
    /// every PE (one part per PE, empty ones included); `None` is a barrier (which may come
    /// back as an empty vector). Whether there is a payload must be the same on every PE for
    /// the same call: it decides whether the PEs exchange through the bootstrap after the
    /// shared-memory barrier. Every PE must reach it, in the same order as its other collective
    /// calls; a PE that does not is named by the timeout error.
    pub(crate) fn collective(
        &self,
        call: &'static str,
        args: String,
        payload: Option<&[u8]>,
    ) -> Result<Vec<Vec<u8>>> {
        self.check(call)?;
        let mut st = self.mem.lock_heap();
        let mut ts = self.teams.world_team.lock();
        if args.is_empty() {
            // A call without arguments (barrier_all in a loop) is recorded from its cached text.
            let key = recent::CallKey { call, nums: [0; 8] };
            self.record_keyed(&self.teams.world_team, &mut ts, key, String::new);
        } else {
            self.record_on(&self.teams.world_team, &mut ts, call, args);
        }
        self.sync_point(&mut st, &mut ts, call, payload)
    }

    pub(super) fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.check("finalize")?;
        // Device work still running, or a device-side wait that gave up unreported, is this
        // PE's failure: it is reported here (and to every PE) instead of lost at exit.
        if let Some(cu) = self.backend.as_cuda() {
            if let Err(e) = cu.finish_device_work() {
                self.boot.fail_all(e.kind().clone());
                return Err(e.during("finalize").with_pe(self.rank));
            }
        }
        // A root's last eager broadcasts on each team are checked before the job ends: every
        // PE publishes how many it consumed, then waits until its own were taken.
        let teams = self.teams.live();
        for t in &teams {
            self.publish_consumed(t, &t.lock());
        }
        for t in &teams {
            self.eager_settle(t, &t.lock(), "finalize")?;
        }
        let mut st = self.mem.lock_heap();
        let mut ts = self.teams.world_team.lock();
        self.record_on(&self.teams.world_team, &mut ts, "finalize", String::new());
        self.sync_point(&mut st, &mut ts, "finalize", None)?;
        drop((ts, st));
        if let Some(Ok(mpi)) = self.comms.mpi.get() {
            mpi.finish();
        }
        self.boot.finalize().map_err(|e| e.during("finalize"))
    }
}

fn split_part(p: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
    let rest = &p[4..];
    (rest.len() >= n).then(|| rest.split_at(n))
}

fn garbled(rank: usize, call: &'static str, from: usize) -> Error {
    Error::new(
        Some(rank),
        call,
        ErrorKind::Bootstrap(format!("PE {from} sent a malformed collective message")),
    )
}
