//! Waiting and barriers among PEs, the machinery under every host collective point:
//! doorbells and waits (spin, yield, then sleep on the doorbell), the team barrier with its
//! ledger check, and the world's fast path.
//!
//! A barrier on a team pushes this PE's arrival (epoch, ledger digest, flags, aux and up to
//! [`NARROW`] payload bytes in one cache line; up to [`INLINE`] with a second line when the
//! barrier is wide) into every member's sync area, rings their doorbells and waits for every
//! member's arrival in its own area: what it waits for and what it then reads arrive in one
//! line transfer per member and line (overlapping), and no two members write one line.
//! Entries are double-buffered by epoch parity: a PE can be at most one barrier ahead of the
//! slowest member, so the entry being read is never the one being rewritten.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::area::{SyncArea, INLINE, MAILBOX, NARROW};
use super::spin::SPINS;
use super::team::{Team, TeamInner, TeamState};
use super::watch::{ScanState, Watching};
use super::Inner;
use crate::error::{invalid, Error, ErrorKind, Result};

/// Yields this often before sleeping on the doorbell.
const YIELDS: u32 = 16;
/// Longest single sleep: waits re-check failure and deadline at least this often.
const NAP: Duration = Duration::from_millis(10);

/// What the members' arrivals at a barrier carried, folded over the members (this PE too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Met {
    /// Every member's ledger digest (calls recorded, running hash) equals this PE's.
    pub agreed: bool,
    /// The members' flags, OR-ed.
    pub flags: u64,
    /// The members' aux words, AND-ed.
    pub aux: u64,
}

impl Inner {
    /// Member `src`'s inline payload of this PE's last barrier on team slot `slot` with
    /// parity `parity` (see `barrier_staged`), into `out` (at most [`INLINE`] bytes).
    pub(crate) fn read_inline(&self, slot: usize, src: usize, parity: u64, out: &mut [u8]) {
        let at = self.area.entry(self.rank, slot, src, parity);
        let mut words = [0u64; INLINE as usize / 8];
        for (k, w) in words.iter_mut().enumerate().take(out.len().div_ceil(8)) {
            *w = self.load64(at + SyncArea::inline_word(k as u64));
        }
        out.copy_from_slice(&bytemuck::cast_slice::<u64, u8>(&words)[..out.len()]);
    }
}

/// Arrival flag: this PE has releases the world has not heard of yet.
pub(crate) const FLAG_RELEASES: u64 = 1;

impl Inner {
    pub(crate) fn area(&self) -> &SyncArea {
        &self.area
    }

    fn load64(&self, addr: u64) -> u64 {
        self.control.load64(addr)
    }

    /// Rings PE `pe` after stores into its heap (puts, atomics): only sleepers waiting for
    /// heap data (`signal_wait_until`) need it, not a PE asleep in a barrier.
    pub(crate) fn ring_data(&self, pe: usize) {
        self.ring_if(pe, |a| a.data_sleepers(pe));
    }

    /// Rings every direct PE that has a sleeper waiting for heap data, after the caller's
    /// sequentially consistent fence (the backend's, in `quiet` and `fence`): what those do for
    /// the plain puts before them. A put rings no one itself, so that it costs no fence; a
    /// waiter that still spins sees the bytes at once, and one asleep re-reads every nap even if
    /// no quiet ever comes.
    pub(crate) fn ring_data_all(&self) {
        for pe in 0..self.world {
            self.ring_fenced(pe, |a| a.data_sleepers(pe));
        }
    }

    /// How a PE tells PE `pe` that something it may wait for changed (a barrier arrival, a
    /// store into its heap), in `ring_if` and `ring_fenced`.
    ///
    /// Only a sleeping waiter needs the doorbell; spinning ones see the change themselves. The
    /// check is the two-sided fence handshake of `sleep_until`: this PE stores (the change),
    /// fences, then loads the sleeper count; a sleeper stores the count, fences, then loads the
    /// condition. With both fences ordering store before load, at least one side sees the
    /// other's store, so either the sleeper sees the change and does not sleep, or this PE sees
    /// the sleeper and bumps the doorbell it sleeps on (it read the doorbell before counting
    /// itself, so the futex returns at once). That spares every put and arrival a
    /// read-modify-write of a line the other PE owns. The fences are asymmetric where Linux
    /// allows (`SharedArea::waker_fence`, `sleeper_fence`): the sleeper's membarrier makes
    /// every running PE fence, so this side, on every call's path, needs none of its own.
    fn ring_if(&self, pe: usize, count: impl Fn(&SyncArea) -> u64) {
        if pe != self.rank && self.area().is_direct(pe) {
            self.control.waker_fence();
            self.ring_fenced(pe, count);
        }
    }

    /// The check of `ring_if` after the caller's own fence (`SharedArea::waker_fence`, or a
    /// sequentially consistent one; one fence after stores to several PEs serves them all).
    pub(super) fn ring_fenced(&self, pe: usize, count: impl Fn(&SyncArea) -> u64) {
        let a = self.area();
        if pe == self.rank || !a.is_direct(pe) {
            return;
        }
        if self.control.load32(count(a)) != 0 {
            let bell = a.doorbell(pe);
            self.control.add32(bell, 1);
            self.control.wake(bell);
        }
    }

    /// Waits until `cond()` holds: spins briefly, then yields, then sleeps on this PE's doorbell.
    /// Fails when the job fails or after the timeout, naming `missing()`. A collective wait
    /// (`watch`) is published while it sleeps and watches the other PEs, failing at once with a
    /// named mismatch when they diverged (see `context/watch.rs`).
    #[inline(never)]
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
            self.control.sleeper_fence();
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

    /// The barrier among `team`'s members (see the module documentation). Returns what the
    /// members' arrivals carried.
    pub(crate) fn barrier_core(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        flags: u64,
        aux: u64,
    ) -> Result<Met> {
        self.barrier_staged(team, st, call, flags, aux, false, &mut |_| Ok(0))
    }

    /// `barrier_core` that first hands `stage` this PE's payload for this barrier (an address
    /// in its sync area, [`PAYLOAD`](super::area::PAYLOAD) bytes) to fill; `stage` returns how
    /// many of the bytes it wrote (at most [`NARROW`], or [`INLINE`] when `wide`; 0 for none)
    /// ride inline in the arrival itself. `wide` (the same on every member) makes every
    /// arrival fill its entry's second line too, and every member wait for both. The members
    /// may read the payload (at `area().payload`, or inline in their own area, see
    /// `read_inline`) once the barrier completes, until this PE's barrier after next (payloads
    /// are double-buffered by parity, as the entries; reaching that barrier needs every
    /// member's arrival at the next one, which each makes only after it is done with this one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn barrier_staged(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        flags: u64,
        aux: u64,
        wide: bool,
        stage: &mut dyn FnMut(u64) -> Result<usize>,
    ) -> Result<Met> {
        let a = self.area();
        let e = st.epoch + 1;
        let parity = e & 1;
        let staged = a.payload(self.rank, team.slot, parity);
        let inline_bytes = stage(staged)?;
        let max = if wide { INLINE } else { NARROW };
        debug_assert!(inline_bytes as u64 <= max);
        let nw = inline_bytes.div_ceil(8).min(max as usize / 8);
        // Line 0: count, hash, flags, aux and the first payload words; line 1 the rest.
        let (count, hash) = st.ledger.digest();
        let mut line0 = [count, hash, flags, aux, 0, 0, 0];
        let mut line1 = [0u64; 7];
        for k in 0..nw {
            let w = self.load64(staged + 8 * k as u64);
            match k.checked_sub(NARROW as usize / 8) {
                None => line0[4 + k] = w,
                Some(i) => line1[i] = w,
            }
        }
        let n0 = 4 + nw.min(NARROW as usize / 8);
        let n1 = nw.saturating_sub(NARROW as usize / 8);
        let me = team.my_global();
        // Each line's epoch goes last, with release: a member that sees it sees the words
        // before it and this PE's earlier stores to any memory (its heap data too), which needs
        // no other fence. The words themselves need no ordering of their own.
        for &m in &team.members {
            if m != me {
                let at = a.entry(m, team.slot, me, parity);
                if wide {
                    self.control.store64s_release(at + 72, &line1[..n1]);
                    self.control.store64_release(at + 64, e);
                }
                self.control.store64s_release(at + 8, &line0[..n0]);
                self.control.store64_release(at, e);
            }
        }
        self.control.waker_fence();
        for &m in &team.members {
            self.ring_fenced(m, |a| a.sleepers(m));
        }
        // Both lines are loaded whatever the first shows, so their transfers overlap.
        let arrived = |m: usize| {
            if m == me {
                return true;
            }
            let at = a.entry(me, team.slot, m, parity);
            let (e0, e1) = (self.load64(at), if wide { self.load64(at + 64) } else { e });
            e0 >= e && e1 >= e
        };
        // Members found arrived stay arrived (epochs only grow): each check resumes at the
        // first member not yet seen.
        let mut seen = 0;
        self.wait_until(
            call,
            &|| format!("{call} on {}", team.name),
            &mut || {
                while seen < team.members.len() && arrived(team.members[seen]) {
                    seen += 1;
                }
                seen == team.members.len()
            },
            &|| team.members_where(|m| !arrived(m)),
            Some(Watching {
                team,
                pos: count,
                hash,
            }),
        )?;
        st.epoch = e;
        let mut met = Met {
            agreed: true,
            flags,
            aux,
        };
        for &m in &team.members {
            if m != me {
                let at = a.entry(me, team.slot, m, parity);
                let w = |k: u64| self.load64(at + 8 * k);
                met.agreed &= w(1) == count && w(2) == hash;
                met.flags |= w(3);
                met.aux &= w(4);
            }
        }
        Ok(met)
    }

    /// A team collective point: barrier plus ledger check. On divergence every member fails
    /// with the first differing call named (the members exchange ledgers through their
    /// mailboxes). Returns what the arrivals carried.
    pub(crate) fn team_sync_point(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        aux: u64,
    ) -> Result<Met> {
        self.team_sync_staged(team, st, call, aux, false, &mut |_| Ok(0))
    }

    /// `team_sync_point` whose barrier publishes a payload (see `barrier_staged`); the members'
    /// payloads of it are readable once it returns, and only then: a PE reads them after the
    /// ledgers were found to agree.
    pub(crate) fn team_sync_staged(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        aux: u64,
        wide: bool,
        stage: &mut dyn FnMut(u64) -> Result<usize>,
    ) -> Result<Met> {
        let met = self.barrier_staged(team, st, call, 0, aux, wide, stage)?;
        if met.agreed {
            st.ledger.mark_agreed();
            return Ok(met);
        }
        Err(self.diverged(team, st, call))
    }

    /// Every member found the ledgers differ: exchange them through the mailboxes and fail with
    /// the same message on every member.
    fn diverged(&self, team: &TeamInner, st: &mut TeamState, call: &'static str) -> Error {
        let a = self.area();
        let mine = st.ledger.encode_limited(MAILBOX as usize);
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
                let msg = match st.ledger.compare_named(&refs, &team.members) {
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
    /// bootstrap path (the same answer on every PE, since all saw the same arrivals); a named
    /// mismatch on every PE when the ledgers differ (whatever call each PE is in, they all met
    /// at this barrier, so they all take the mailbox exchange: none is left waiting on the
    /// bootstrap for the others).
    /// `ts` is the world team's state, locked by the caller.
    pub(crate) fn world_fast_sync(&self, ts: &mut TeamState, call: &'static str) -> Result<bool> {
        if !self.area.all_direct() {
            return Ok(false);
        }
        self.poll_releases();
        let flags = if self.mem.heap.has_pending_releases() {
            FLAG_RELEASES
        } else {
            0
        };
        let team = &self.teams.world_team;
        let met = self.barrier_core(team, ts, call, flags, 0)?;
        if !met.agreed {
            return Err(self.diverged(team, ts, call));
        }
        ts.ledger.mark_agreed();
        Ok(met.flags & FLAG_RELEASES == 0)
    }

    /// The team's state, or `None` for a team this PE is not in; fails when the job failed
    /// or the team was destroyed. Inline: every team operation starts here.
    #[inline]
    pub(crate) fn team_inner<'t>(
        &self,
        team: &'t Team,
        call: &'static str,
    ) -> Result<Option<&'t Arc<TeamInner>>> {
        self.check(call)?;
        match &team.0 {
            None => Ok(None),
            Some(t) if t.is_destroyed() => Err(self.team_destroyed(t, call)),
            Some(t) => Ok(Some(t)),
        }
    }

    #[cold]
    fn team_destroyed(&self, t: &TeamInner, call: &'static str) -> Error {
        invalid(call, format!("{} was destroyed", t.name)).with_pe(self.rank)
    }
}
