//! Waiting and barriers among PEs, the machinery under every host collective point:
//! doorbells and waits (spin, yield, then sleep on the doorbell), the team barrier with its
//! ledger check, and the world's fast path.
//!
//! A barrier on a team publishes this PE's ledger digest on its board, stores its arrival epoch
//! into every member's sync area, rings their doorbells and waits for every member's arrival.
//! Boards are double-buffered by epoch parity: a PE can be at most one barrier ahead of the
//! slowest member, so the board being read is never the one being rewritten.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::area::{SyncArea, MAILBOX};
use super::team::{Team, TeamInner, TeamState};
use super::watch::{ScanState, Watching};
use super::Inner;
use crate::error::{invalid, Error, ErrorKind, Result};

/// Spins this often (checking the condition) before yielding the CPU, or before looking at
/// the clock when spinning longer (see [`SpinBudget`]).
const SPINS: u32 = 64;
/// The longest a wait spins before yielding: longer than a peer's part of a collective up to
/// a few MiB (a PE bound to its CPU that yields while its peer reduces 256 KiB gives its CPU
/// to other work for a whole time slice: 4.9 ms instead of 60 us, measured).
const SPIN_MAX: Duration = Duration::from_micros(1000);

/// How long waits spin before yielding, adapted to what spinning achieved lately.
///
/// A PE that yields or sleeps while its peer is about to arrive pays a scheduler round trip (a
/// 2-PE barrier on 2 cores measured 5 us instead of 0.5 us); but where the PEs share a CPU
/// (CI runs 8 on 2; other work may crowd them onto one core) a spinning PE holds the CPU its
/// peer needs to arrive. So the budget doubles (up to [`SPIN_MAX`]) after each wait that spinning
/// ended, and halves after each wait it did not: PEs with CPUs of their own spin like Open
/// MPI's busy polling, crowded ones soon yield at once. It starts at zero when the node has
/// more PEs than this process has CPUs (Open MPI also yields when oversubscribed).
#[derive(Debug)]
pub(crate) struct SpinBudget {
    nanos: std::sync::atomic::AtomicU64,
}

impl SpinBudget {
    /// The starting budget for `local_pes` PEs on this node.
    pub(crate) fn new(local_pes: usize) -> SpinBudget {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let start = if local_pes <= cpus {
            SPIN_MAX
        } else {
            Duration::ZERO
        };
        SpinBudget {
            nanos: std::sync::atomic::AtomicU64::new(start.as_nanos() as u64),
        }
    }

    fn get(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Notes whether the last wait ended while spinning.
    fn adapt(&self, spinning_ended_it: bool) {
        let n = self.nanos.load(Ordering::Relaxed);
        let max = SPIN_MAX.as_nanos() as u64;
        let next = if spinning_ended_it {
            (n * 2).clamp(1_000, max)
        } else if n < 1_000 {
            0
        } else {
            n / 2
        };
        if next != n {
            self.nanos.store(next, Ordering::Relaxed);
        }
    }
}

/// Yields this often before sleeping on the doorbell.
const YIELDS: u32 = 16;
/// Longest single sleep: waits re-check failure and deadline at least this often.
const NAP: Duration = Duration::from_millis(10);

/// One member's published state at a barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Board {
    pub count: u64,
    pub hash: u64,
    pub flags: u64,
    pub aux: u64,
}

/// Board flag: this PE has releases the world has not heard of yet.
pub(crate) const FLAG_RELEASES: u64 = 1;

impl Inner {
    pub(crate) fn area(&self) -> &SyncArea {
        &self.area
    }

    fn load64(&self, addr: u64) -> u64 {
        self.control.load64(addr)
    }

    /// Tells PE `pe` that something it may wait for changed (a barrier arrival).
    ///
    /// Only a sleeping waiter needs the doorbell; spinning ones see the change themselves. The
    /// check is the two-sided fence handshake of `sleep_until`: this PE stores (the change),
    /// fences, then loads the sleeper count; a sleeper stores the count, fences, then loads the
    /// condition. With both fences sequentially consistent at least one side sees the other's
    /// store, so either the sleeper sees the change and does not sleep, or this PE sees the
    /// sleeper and bumps the doorbell it sleeps on (it read the doorbell before counting
    /// itself, so the futex returns at once). That spares every put and arrival a
    /// read-modify-write of a line the other PE owns.
    pub(crate) fn ring(&self, pe: usize) {
        self.ring_if(pe, |a| a.sleepers(pe));
    }

    /// `ring` for stores into PE `pe`'s heap (puts, atomics): only sleepers waiting for heap
    /// data (`signal_wait_until`) need them, not a PE asleep in a barrier.
    pub(crate) fn ring_data(&self, pe: usize) {
        self.ring_if(pe, |a| a.data_sleepers(pe));
    }

    fn ring_if(&self, pe: usize, count: impl Fn(&SyncArea) -> u64) {
        let a = self.area();
        if pe == self.rank || !a.is_direct(pe) {
            return;
        }
        fence(Ordering::SeqCst);
        if self.control.load32(count(a)) != 0 {
            let bell = a.doorbell(pe);
            self.control.add32(bell, 1);
            self.control.wake(bell);
        }
    }

    /// Waits until `cond()` holds: spins briefly, then yields, then sleeps on this PE's doorbell.
    /// Fails when the job fails or after the timeout, naming `missing()`. A collective wait
    /// (`watch`) is published while it sleeps and watches the other PEs, failing at once with a
    /// named mismatch when they diverged (see `ops/watch.rs`).
    pub(crate) fn wait_until(
        &self,
        call: &'static str,
        what: &dyn Fn() -> String,
        cond: &mut dyn FnMut() -> bool,
        missing: &dyn Fn() -> Vec<usize>,
        watch: Option<Watching<'_>>,
    ) -> Result<()> {
        if cond() {
            return Ok(());
        }
        let budget = self.spin.get();
        let spin_start = (!budget.is_zero()).then(Instant::now);
        loop {
            for _ in 0..SPINS {
                std::hint::spin_loop();
                if cond() {
                    self.spin.adapt(true);
                    return Ok(());
                }
            }
            if spin_start.is_none_or(|t| t.elapsed() >= budget) {
                break;
            }
        }
        self.spin.adapt(false);
        for _ in 0..YIELDS {
            std::thread::yield_now();
            if cond() {
                return Ok(());
            }
        }
        if let Some(w) = &watch {
            self.begin_wait(w);
        }
        let r = self.sleep_until(call, what, cond, missing, watch.as_ref());
        if watch.is_some() {
            self.end_wait();
        }
        r
    }

    /// The sleeping phase of `wait_until`. A wait without `watch` waits for heap data and
    /// counts itself among the data sleepers too, so puts and atomics ring it (`ring_data`).
    fn sleep_until(
        &self,
        call: &'static str,
        what: &dyn Fn() -> String,
        cond: &mut dyn FnMut() -> bool,
        missing: &dyn Fn() -> Vec<usize>,
        watch: Option<&Watching<'_>>,
    ) -> Result<()> {
        let a = self.area();
        let bell = a.doorbell(self.rank);
        let counts = [
            Some(a.sleepers(self.rank)),
            watch.is_none().then(|| a.data_sleepers(self.rank)),
        ];
        let start = Instant::now();
        let deadline = start + self.cfg.timeout;
        let nap = self.backend.poll_interval().unwrap_or(NAP).min(NAP);
        let mut scan = ScanState::default();
        loop {
            let seen = self.control.load32(bell);
            if cond() {
                return Ok(());
            }
            self.check(call)?;
            if let Some(w) = watch {
                if let Some(msg) = self.watch_scan(w, &mut scan) {
                    if cond() {
                        return Ok(());
                    }
                    let kind = self.diverged_for_good(msg);
                    return Err(Error::new(Some(self.rank), call, kind));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let kind = ErrorKind::Timeout {
                    what: what(),
                    waited: now - start,
                    missing: missing(),
                };
                // Everyone else is stuck in the same wait or about to be; make it one failure.
                self.boot.fail_all(kind.clone());
                return Err(Error::new(Some(self.rank), call, kind));
            }
            for c in counts.iter().flatten() {
                self.control.add32(*c, 1);
            }
            // The other half of `ring`'s handshake: the count is visible before the condition
            // is read again, so a writer either sees this sleeper or this sleeper sees the
            // change. A ring between `seen` and here makes the futex return at once (the
            // kernel re-reads the doorbell).
            fence(Ordering::SeqCst);
            if !cond() {
                self.control.sleep(bell, seen, nap.min(deadline - now));
            }
            for c in counts.iter().flatten() {
                self.control.add32(*c, u32::MAX);
            }
            if cond() {
                return Ok(());
            }
        }
    }

    /// The barrier among `team`'s members (see the module documentation). Returns every
    /// member's board, in team order.
    pub(crate) fn barrier_core(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        flags: u64,
        aux: u64,
    ) -> Result<Vec<Board>> {
        self.barrier_raw(team, st, call, flags, aux, true)
    }

    /// `barrier_core`; with `read_boards` false the boards are neither read nor returned, so
    /// once it completes no member reads this PE's boards of the previous barrier any more.
    pub(crate) fn barrier_raw(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        flags: u64,
        aux: u64,
        read_boards: bool,
    ) -> Result<Vec<Board>> {
        self.barrier_staged(team, st, call, flags, aux, read_boards, &mut |_| Ok(()))
    }

    /// `barrier_raw` that first hands `stage` this PE's payload for this barrier (an address
    /// in its sync area, [`PAYLOAD`](super::area::PAYLOAD) bytes) to fill: the arrival
    /// publishes it, and the members may read it once the barrier completes, until this PE's
    /// barrier after next (payloads are double-buffered by parity, as the boards; reaching
    /// that barrier needs every member's arrival at the next one, which each makes only after
    /// it is done with this one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn barrier_staged(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        flags: u64,
        aux: u64,
        read_boards: bool,
        stage: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<Vec<Board>> {
        let a = self.area();
        let e = st.epoch + 1;
        let parity = e & 1;
        stage(a.payload(self.rank, team.slot, parity))?;
        let (count, hash) = team.ledger().digest();
        // The board is published by the arrival stores below (release; members read it after
        // seeing the arrival), so its words need no ordering of their own.
        for (w, v) in [count, hash, flags, aux].into_iter().enumerate() {
            self.control
                .store64_release(a.board(self.rank, team.slot, parity, w as u64), v);
        }
        self.backend.fence();
        let me = team.my_global();
        for &m in &team.members {
            if m != me {
                self.control.store64_release(a.arrival(m, team.slot, me), e);
                self.ring(m);
            }
        }
        let arrived = |m: usize| m == me || self.load64(a.arrival(me, team.slot, m)) >= e;
        self.wait_until(
            call,
            &|| format!("{call} on {}", team.name),
            &mut || team.members.iter().all(|&m| arrived(m)),
            &|| {
                team.members
                    .iter()
                    .copied()
                    .filter(|&m| !arrived(m))
                    .collect()
            },
            Some(Watching {
                team,
                pos: count,
                hash,
            }),
        )?;
        st.epoch = e;
        if !read_boards {
            return Ok(Vec::new());
        }
        Ok(team
            .members
            .iter()
            .map(|&m| Board {
                count: self.load64(a.board(m, team.slot, parity, 0)),
                hash: self.load64(a.board(m, team.slot, parity, 1)),
                flags: self.load64(a.board(m, team.slot, parity, 2)),
                aux: self.load64(a.board(m, team.slot, parity, 3)),
            })
            .collect())
    }

    /// A team collective point: barrier plus ledger check. On divergence every member fails
    /// with the first differing call named (the members exchange ledgers through their
    /// mailboxes). Returns the boards.
    pub(crate) fn team_sync_point(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        aux: u64,
    ) -> Result<Vec<Board>> {
        self.team_sync_staged(team, st, call, aux, &mut |_| Ok(()))
    }

    /// `team_sync_point` whose barrier publishes a payload (see `barrier_staged`); the members'
    /// payloads of it are at `area().payload(member, team.slot, st.epoch)` once it returns,
    /// and only then: a PE reads them after the ledgers were found to agree.
    pub(crate) fn team_sync_staged(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        aux: u64,
        stage: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<Vec<Board>> {
        let boards = self.barrier_staged(team, st, call, 0, aux, true, stage)?;
        if boards
            .iter()
            .all(|b| b.count == boards[0].count && b.hash == boards[0].hash)
        {
            team.ledger().mark_agreed();
            return Ok(boards);
        }
        Err(self.diverged(team, st, call))
    }

    /// Every member found the ledgers differ: exchange them through the mailboxes and fail with
    /// the same message on every member.
    fn diverged(&self, team: &TeamInner, st: &mut TeamState, call: &'static str) -> Error {
        let a = self.area();
        let mine = team.ledger().encode_limited(MAILBOX as usize);
        self.control.write(a.mailbox(self.rank), &mine);
        self.control
            .store64(a.mailbox_len(self.rank), mine.len() as u64);
        let msg = match self.barrier_core(team, st, call, 0, 0) {
            Err(e) => format!(
                "the ledgers of {} differ, and exchanging them failed: {e}",
                team.name
            ),
            Ok(_) => {
                let mut parts = Vec::with_capacity(team.members.len());
                for &m in &team.members {
                    let len = self.control.load64(a.mailbox_len(m)) as usize;
                    let mut buf = vec![0u8; len.min(MAILBOX as usize)];
                    self.control.read(a.mailbox(m), &mut buf);
                    parts.push(buf);
                }
                let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
                let msg = match team.ledger().compare_named(&refs, &team.members) {
                    Err(m) => format!("on {}: {m}", team.name),
                    Ok(()) => format!("the ledgers of {} differ", team.name),
                };
                // Nobody returns (and perhaps exits, which fails the others' waits) before every
                // member has read the mailboxes; the message is complete here, so a failure of
                // this last barrier no longer changes it.
                let _ = self.barrier_core(team, st, call, 0, 0);
                msg
            }
        };
        // Every member computed this text from the same ledgers; the PEs outside the team
        // learn it too instead of waiting for members that are gone.
        let kind = self.diverged_for_good(msg);
        Error::new(Some(self.rank), call, kind)
    }

    /// The world's collective point fast path: a shared-memory barrier. Returns true when the
    /// ledgers agree and nobody has releases to exchange; false when every PE must take the
    /// bootstrap path (the same answer on every PE, since all read the same boards); a named
    /// mismatch on every PE when the ledgers differ (whatever call each PE is in, they all met
    /// at this barrier, so they all take the mailbox exchange: none is left waiting on the
    /// bootstrap for the others).
    pub(crate) fn world_fast_sync(&self, call: &'static str) -> Result<bool> {
        if !self.area.all_direct() {
            return Ok(false);
        }
        self.poll_releases();
        let flags = if self.heap.has_pending_releases() {
            FLAG_RELEASES
        } else {
            0
        };
        let team = &self.world_team;
        let mut st = team.lock();
        let boards = self.barrier_core(team, &mut st, call, flags, 0)?;
        let agreed = boards
            .iter()
            .all(|b| b.count == boards[0].count && b.hash == boards[0].hash);
        if !agreed {
            return Err(self.diverged(team, &mut st, call));
        }
        team.ledger().mark_agreed();
        let releases = boards.iter().any(|b| b.flags & FLAG_RELEASES != 0);
        Ok(!releases)
    }

    pub(crate) fn team_inner<'t>(
        &self,
        team: &'t Team,
        call: &'static str,
    ) -> Result<Option<&'t Arc<TeamInner>>> {
        self.check(call)?;
        match &team.0 {
            None => Ok(None),
            Some(t) if t.is_destroyed() => {
                Err(invalid(call, format!("{} was destroyed", t.name)).with_pe(self.rank))
            }
            Some(t) => Ok(Some(t)),
        }
    }
}
