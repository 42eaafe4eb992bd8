//! Synchronisation: doorbells and waits, the team barrier with its ledger check, team
//! creation and destruction.
//!
//! A barrier on a team publishes this PE's ledger digest on its board, stores its arrival epoch
//! into every member's sync area, rings their doorbells and waits for every member's arrival.
//! Boards are double-buffered by epoch parity: a PE can be at most one barrier ahead of the
//! slowest member, so the board being read is never the one being rewritten.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::area::{SyncArea, MAILBOX, MAX_TEAMS};
use super::team::{Team, TeamInner, TeamState};
use super::watch::{ScanState, Watching};
use crate::context::{Context, Inner};
use crate::error::{invalid, Error, ErrorKind, Result};

/// Spins this often (checking the condition) before yielding the CPU.
const SPINS: u32 = 64;
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

    fn store64(&self, addr: u64, v: u64) {
        self.control.store64(addr, v)
    }

    /// Tells PE `pe` that something it may wait for changed.
    pub(crate) fn ring(&self, pe: usize) {
        let a = self.area();
        if pe == self.rank || !a.is_direct(pe) {
            return;
        }
        let bell = a.doorbell(pe);
        self.control.add32(bell, 1);
        if self.control.load32(a.sleepers(pe)) != 0 {
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
        for _ in 0..SPINS {
            std::hint::spin_loop();
            if cond() {
                return Ok(());
            }
        }
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

    /// The sleeping phase of `wait_until`.
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
        let sleepers = a.sleepers(self.rank);
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
            self.control.add32(sleepers, 1);
            // The doorbell is re-read by the kernel under the futex: a ring between `seen` and
            // here makes the sleep return at once.
            if !cond() {
                self.control.sleep(bell, seen, nap.min(deadline - now));
            }
            self.control.add32(sleepers, u32::MAX);
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
        let a = self.area();
        let e = st.epoch + 1;
        let parity = e & 1;
        let (count, hash) = team.ledger().digest();
        for (w, v) in [count, hash, flags, aux].into_iter().enumerate() {
            self.store64(a.board(self.rank, team.slot, parity, w as u64), v);
        }
        self.backend.fence();
        let me = team.my_global();
        for &m in &team.members {
            if m != me {
                self.store64(a.arrival(m, team.slot, me), e);
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
        let boards = self.barrier_core(team, st, call, 0, aux)?;
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

impl Context {
    /// The team of all PEs.
    pub fn world_team(&self) -> Team {
        Team(Some(self.inner.world_team.clone()))
    }

    /// Collective over `team`: returns once every member has called it, with every member's
    /// earlier stores and atomics complete and visible. A no-op on INVALID.
    pub fn barrier(&self, team: &Team) -> Result<()> {
        self.team_sync_impl(team, "barrier")
    }

    /// Collective over `team`: synchronises the members' execution and orders memory like
    /// `barrier` (on this backend every store completes when issued, so the two coincide).
    pub fn team_sync(&self, team: &Team) -> Result<()> {
        self.team_sync_impl(team, "team_sync")
    }

    /// Collective over the world: like `barrier_all` (OpenSHMEM's `sync_all`).
    pub fn sync_all(&self) -> Result<()> {
        self.barrier_all()
    }

    fn team_sync_impl(&self, team: &Team, call: &'static str) -> Result<()> {
        let Some(t) = self.inner.team_inner(team, call)? else {
            return Ok(());
        };
        if t.slot == 0 {
            return self.barrier_all();
        }
        let mut st = t.lock();
        self.inner.record_on(t, call, String::new());
        self.inner.backend.fence();
        self.inner.team_sync_point(t, &mut st, call, 0).map(|_| ())
    }

    /// Collective over `parent`: a new team of the members `start, start + stride, ...`
    /// (`size` of them, indices in `parent`). Members get the team, other members of `parent`
    /// get [`Team::INVALID`]. Recorded in `parent`'s ledger. At most 32 teams exist at once.
    pub fn team_split_strided(
        &self,
        parent: &Team,
        start: usize,
        stride: usize,
        size: usize,
    ) -> Result<Team> {
        const CALL: &str = "team_split_strided";
        let Some(p) = self.inner.team_inner(parent, CALL)? else {
            return Ok(Team::INVALID);
        };
        let n = p.members.len();
        if size == 0 || stride == 0 || start >= n || start + (size - 1) * stride >= n {
            return Err(invalid(
                CALL,
                format!("start {start}, stride {stride}, size {size} do not select members of a team of {n}"),
            )
            .with_pe(self.inner.rank));
        }
        let mut st = p.lock();
        self.inner.record_on(
            p,
            CALL,
            format!("start {start}, stride {stride}, size {size}"),
        );
        let split_at = p.ledger().digest();
        let free = !*self
            .inner
            .slots_used
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let boards = self.inner.team_sync_point(p, &mut st, CALL, free)?;
        let common = boards.iter().fold(u64::MAX, |acc, b| acc & b.aux) & ((1u64 << MAX_TEAMS) - 1);
        if common == 0 {
            return Err(Error::new(
                Some(self.inner.rank),
                CALL,
                ErrorKind::Unsupported(format!("no free team slot common to the members of {} (at most {MAX_TEAMS} teams; destroy unused teams)", p.name)),
            ));
        }
        let slot = common.trailing_zeros() as usize;
        let members: Vec<usize> = (0..size).map(|k| p.members[start + k * stride]).collect();
        let Some(me) = members.iter().position(|&m| m == self.inner.rank) else {
            return Ok(Team::INVALID);
        };
        *self
            .inner
            .slots_used
            .lock()
            .unwrap_or_else(|e| e.into_inner()) |= 1 << slot;
        let name = format!(
            "team {slot} (start {start}, stride {stride}, size {size} of {})",
            p.name
        );
        let id = crate::util::fnv1a(
            &[p.id, split_at.0, split_at.1, slot as u64]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .max(1);
        let inner = Arc::new(TeamInner::new(slot, members, me, name, id));
        self.inner.register_team(&inner);
        // This PE's copy of the slot's member tables for the collective kernels; peers only
        // write our (zeroed) flags, so no further agreement is needed before the first launch.
        self.inner.init_device_team(&inner)?;
        Ok(Team(Some(inner)))
    }

    /// Collective over `team`: destroys it, freeing its slot. A no-op on INVALID; the world team
    /// cannot be destroyed.
    pub fn team_destroy(&self, team: Team) -> Result<()> {
        const CALL: &str = "team_destroy";
        let Some(t) = self.inner.team_inner(&team, CALL)? else {
            return Ok(());
        };
        if t.slot == 0 {
            return Err(
                invalid(CALL, "the world team cannot be destroyed").with_pe(self.inner.rank)
            );
        }
        let mut st = t.lock();
        self.inner.record_on(t, CALL, String::new());
        self.inner.team_sync_point(t, &mut st, CALL, 0)?;
        // Once a second barrier completes, every member has finished reading the first one's
        // boards and has made its last write into this slot, so clearing our copy is safe.
        self.inner.barrier_raw(t, &mut st, CALL, 0, 0, false)?;
        let (at, len) = self.inner.area().slot_range(self.inner.rank, t.slot);
        self.inner.control.write(at, &vec![0u8; len as usize]);
        self.inner.clear_device_team(t.slot)?;
        t.destroyed.store(true, Ordering::Release);
        *self
            .inner
            .slots_used
            .lock()
            .unwrap_or_else(|e| e.into_inner()) &= !(1 << t.slot);
        Ok(())
    }
}
