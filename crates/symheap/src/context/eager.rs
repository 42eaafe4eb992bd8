//! The eager channel: small broadcasts whose root does not wait for its receivers.
//!
//! A synchronous broadcast costs its root a meeting with every receiver per call; MPI's eager
//! protocol costs it one push into a queue the receivers drain. Here the root of a team's eager
//! broadcast `j` (the team's `j`-th, counted alike by every member) writes the data, its ledger
//! digest and the sequence `j + 1` into slot `j % S` of its `S` slots in every receiver's
//! area, and returns. A receiver waits for that sequence in its own area, checks the digest
//! against its own (the ledger check a barrier makes), copies the data and counts the broadcast
//! consumed. A root reuses a slot only once every receiver has consumed the broadcast that last
//! used it, so it runs at most `S` broadcasts ahead of the slowest receiver (`S` is
//! `SyncArea::eager_slots`: 32 in worlds of up to 8 PEs, fewer in larger ones).
//!
//! Slots are per root, so no two PEs write one line even when they diverged over who is the
//! root. A divergence a receiver sees is named from the published rings of recent calls (as the
//! watch names one: nobody has to meet anybody) and fails the whole job. A root learns of one at
//! its next call that waits, or at finalize, which waits until every receiver has consumed its
//! last eager broadcast on each team with the same ledger hash (a receiver that made another
//! call never does, and the watch names it).
//!
//! The channel's state on this PE is its own (`eager_state.rs`'s `EagerTeams`, one entry per
//! team slot in `Inner::teams`): a team's state knows nothing of it. Every eager call holds the
//! team's lock (it records in the team's ledger), which orders every access to the entry, so its
//! words are plain relaxed atomics: no second lock on the path a small broadcast in a loop takes.

use super::area::{EAGER_HEADER_WORDS, EAGER_INLINE, EAGER_SLOT};
use super::eager_state::{EagerBody, EagerTeam, Word};
use super::team::{TeamInner, TeamState};
use super::watch::Watching;
use super::Inner;
use crate::backend::host::HostBackend;
use crate::error::{Error, Result};

impl Inner {
    /// The host backend, when a broadcast of `bytes` may go eager: it fits a slot, the host
    /// backend holds the data, and every PE of the job is on this node (a divergence is then
    /// named from the rings, without a meeting).
    pub(crate) fn eager_host(&self, bytes: usize) -> Option<&HostBackend> {
        if bytes as u64 > EAGER_INLINE || !self.area.all_direct() {
            return None;
        }
        self.backend.as_host()
    }

    /// Member `m`'s count of consumed eager broadcasts on `team`, and its ledger hash after the
    /// last of them (consistent: read between two loads of the count that agree).
    fn consumed(&self, team: &TeamInner, m: usize) -> (u64, u64) {
        let w = self
            .control
            .words(self.area.eager_consumed(m, team.slot), 3);
        loop {
            let c = w.load(0);
            let h = w.load(1 + (c.wrapping_sub(1) % 2) as usize);
            if w.load(0) == c {
                return (c, h);
            }
        }
    }

    /// Counts eager broadcast `j` consumed by this PE, its ledger hash then being `hash`. The
    /// count is published every `S / 2` broadcasts only (`S` slots): a root waiting for slots
    /// polls the counter's line, and every store into it would then cost its writer a line
    /// transfer. That granularity never holds a root up for good: a receiver that consumed
    /// everything before broadcast `j` has published at least `j - S / 2`, which frees the slot
    /// of `j` (it needs `j + 1 - S`). Finalize publishes the exact count.
    fn mark_consumed(&self, team: &TeamInner, e: &EagerTeam, j: u64, hash: u64) {
        e.total.set(j + 1);
        e.hash.set(hash);
        if (j + 1) & (self.area.eager_slots() / 2 - 1) == 0 {
            self.publish_consumed_of(team, e);
        }
    }

    /// Publishes this PE's exact count of consumed eager broadcasts on `team`, and the ledger
    /// hash after the last (in word `1 + b % 2` for broadcast `b`, so a reader that sees the
    /// count unchanged around its load of the hash read the matching one).
    /// `st` is the team's locked state.
    pub(crate) fn publish_consumed(&self, team: &TeamInner, st: &TeamState) {
        self.publish_consumed_of(team, self.teams.eager.of(team, st));
    }

    /// `publish_consumed` from the team's entry `e`.
    fn publish_consumed_of(&self, team: &TeamInner, e: &EagerTeam) {
        let n = e.total.get();
        if n == 0 {
            return;
        }
        let at = self.area.eager_consumed(self.rank, team.slot);
        let b = n - 1;
        self.control
            .store64_release(at + 8 * (1 + b % 2), e.hash.get());
        self.control.store64_release(at, n);
    }

    /// The index in `st.recent` of the record of the eager broadcast with arguments `args`
    /// (root, count, dtype code, destination, source) when it repeats the last one remembered
    /// on `team` and what was checked then still holds: no block released or reclaimed since
    /// (the heap generation), and its record not moved (`st.recent_inserts`). `st` is the
    /// team's locked state.
    #[inline(always)]
    pub(crate) fn eager_repeat(
        &self,
        team: &TeamInner,
        st: &TeamState,
        args: [u64; 5],
    ) -> Option<usize> {
        let e = self.teams.eager.of(team, st);
        // OR of the XORs, as `CallKey`'s comparison (no memcmp), of five words, not eight.
        let differ = (e.call.iter().zip(&args)).fold(0, |d, (w, a)| d | (w.get() ^ a));
        let recorded = e.recorded.get();
        let valid = differ == 0
            && recorded != 0
            && e.inserts.get() == st.recent_inserts
            && e.generation.get() == self.mem.heap.generation();
        valid.then(|| recorded as usize - 1)
    }

    /// Remembers, for [`eager_repeat`](Self::eager_repeat), the eager broadcast with arguments
    /// `args` whose ranges were checked at heap generation `generation` and whose call is
    /// recorded as `st.recent[recorded]`.
    pub(crate) fn eager_remember(
        &self,
        team: &TeamInner,
        st: &TeamState,
        args: [u64; 5],
        generation: u64,
        recorded: usize,
    ) {
        let e = self.teams.eager.of(team, st);
        for (w, a) in e.call.iter().zip(args) {
            w.set(a);
        }
        e.generation.set(generation);
        e.recorded.set(recorded as u64 + 1);
        e.inserts.set(st.recent_inserts);
    }

    /// Root of the team's next eager broadcast: `bytes` bytes (at most `EAGER_INLINE`), the
    /// start of `body`, to every other member, without waiting for them unless the slot is
    /// still unconsumed. The call is already recorded in the team's ledger, as
    /// `st.recent[recorded]`, and is published in this PE's ring here: before a wait for a
    /// slot (whose watch compares rings), else right after the slots are stored, so the
    /// transfers of their lines to this PE, which the stores start, overlap the publishing
    /// instead of following it.
    pub(crate) fn eager_send(
        &self,
        team: &TeamInner,
        st: &TeamState,
        call: &'static str,
        body: &EagerBody,
        bytes: usize,
        recorded: usize,
    ) -> Result<()> {
        debug_assert!(bytes as u64 <= EAGER_INLINE);
        let e = self.teams.eager.of(team, st);
        let j = e.total.get();
        let (count, hash) = st.ledger.digest();
        let me = team.my_global();
        let a = &self.area;
        // The slot was last used by broadcast j - S: every receiver must be past it.
        let need = (j + 1).saturating_sub(self.area.eager_slots());
        let mut published = false;
        if e.acked.get() < need {
            let least = || {
                team.members
                    .iter()
                    .filter(|&&m| m != me)
                    .map(|&m| self.consumed(team, m).0)
                    .min()
                    .unwrap_or(u64::MAX)
            };
            let mut seen = least();
            if seen < need {
                self.publish_recent(team, st, recorded);
                published = true;
                self.wait_until(
                    call,
                    &|| {
                        format!(
                            "{call} on {}: a slot for eager broadcast #{}",
                            team.name,
                            j + 1
                        )
                    },
                    &mut || {
                        seen = least();
                        seen >= need
                    },
                    &|| team.members_where(|m| m != me && self.consumed(team, m).0 < need),
                    Some(Watching {
                        team,
                        pos: count,
                        hash,
                    }),
                )?;
            }
            e.acked.set(seen);
        }
        let h = EAGER_HEADER_WORDS as usize;
        let mut words = [0u64; (EAGER_SLOT / 8) as usize];
        words[1..h].copy_from_slice(&[count, hash, bytes as u64]);
        // The whole body, a fixed size: a copy of only the used words was a call to memcpy.
        words[h..].copy_from_slice(body);
        let used = h + bytes.div_ceil(8);
        // The sequence goes last, with release: a receiver that sees it sees the rest. One
        // run of stores per receiver, from a staged slot: writing the header and the body as
        // two runs made a 64-byte broadcast 15-50 % slower on the 2-vCPU VM (twice measured).
        for &m in &team.members {
            if m != me {
                let s = self.control.words(a.eager_slot(m, team.slot, me, j), used);
                s.store_all_release(1, &words[1..used]);
                s.store_release(0, j + 1);
            }
        }
        if !published {
            self.publish_recent(team, st, recorded);
        }
        self.control.waker_fence();
        for &m in &team.members {
            if m != me {
                self.ring_fenced(m, |a| a.sleepers(m));
            }
        }
        self.mark_consumed(team, e, j, hash);
        for (w, v) in e.unsettled.iter().zip([j + 1, count, hash]) {
            w.set(v);
        }
        Ok(())
    }

    /// Receiver of the team's next eager broadcast, from member `root` (an index in the team):
    /// waits for it, checks the root made this same call (`bytes` bytes), and copies its data
    /// into the start of `out`.
    pub(crate) fn eager_recv(
        &self,
        team: &TeamInner,
        st: &TeamState,
        call: &'static str,
        root: usize,
        out: &mut EagerBody,
        bytes: usize,
    ) -> Result<()> {
        let e = self.teams.eager.of(team, st);
        let j = e.total.get();
        let (count, hash) = st.ledger.digest();
        let r = team.members[root];
        let h = EAGER_HEADER_WORDS as usize;
        let s = self.control.words(
            self.area.eager_slot(self.rank, team.slot, r, j),
            h + bytes.div_ceil(8),
        );
        // Ready already when the root runs ahead, as in a loop: no wait set up at all.
        let ready = |s: &crate::backend::shared::Words<'_>| s.load_acquire(0) == j + 1;
        if !ready(&s) {
            self.wait_until(
                call,
                &|| {
                    format!(
                        "{call} on {}: eager broadcast #{} from PE {r}",
                        team.name,
                        j + 1
                    )
                },
                &mut || ready(&s),
                &|| vec![r],
                Some(Watching {
                    team,
                    pos: count,
                    hash,
                }),
            )?;
        }
        if (s.load(1), s.load(2), s.load(3)) != (count, hash, bytes as u64) {
            return Err(self.eager_diverged(team, call, count, r));
        }
        for (k, v) in out[..bytes.div_ceil(8)].iter_mut().enumerate() {
            *v = s.load(h + k);
        }
        self.mark_consumed(team, e, j, hash);
        Ok(())
    }

    /// Waits until every other member of `team` has consumed this PE's last eager broadcast
    /// there, with the ledger hash it carried (finalize: a root's last broadcasts are checked
    /// like any collective before the job ends).
    pub(crate) fn eager_settle(
        &self,
        team: &TeamInner,
        st: &TeamState,
        call: &'static str,
    ) -> Result<()> {
        let e = self.teams.eager.of(team, st);
        let [j1, count, hash] = e.unsettled.each_ref().map(Word::get);
        let Some(j) = j1.checked_sub(1) else {
            return Ok(());
        };
        let me = team.my_global();
        let others = || team.members.iter().copied().filter(move |&m| m != me);
        self.wait_until(
            call,
            &|| {
                format!(
                    "{call}: eager broadcast #{} on {} to be consumed",
                    j + 1,
                    team.name
                )
            },
            &mut || others().all(|m| self.consumed(team, m).0 > j),
            &|| team.members_where(|m| m != me && self.consumed(team, m).0 <= j),
            Some(Watching {
                team,
                pos: count,
                hash,
            }),
        )?;
        // A member that counted the broadcast with another hash made another call there (it
        // took itself for the root): it consumed nothing of ours.
        if let Some(m) = others().find(|&m| {
            let (c, h) = self.consumed(team, m);
            c == j + 1 && h != hash
        }) {
            return Err(self.eager_diverged(team, call, count, m));
        }
        e.unsettled[0].set(0);
        Ok(())
    }

    /// A divergence over an eager broadcast at ledger position `pos` of `team`, seen against PE
    /// `other`: named from the rings and reported to every PE.
    fn eager_diverged(
        &self,
        team: &TeamInner,
        call: &'static str,
        pos: u64,
        other: usize,
    ) -> Error {
        let msg = match self.mismatch_on(team, pos) {
            Some((m, _)) => m,
            None => format!(
                "collective call #{pos} on {} differs between PEs: PE {other} made another call \
                 there than PE {} (an eager broadcast)",
                team.name, self.rank
            ),
        };
        Error::new(Some(self.rank), call, self.diverged_for_good(msg))
    }
}
