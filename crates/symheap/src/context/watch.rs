//! The watch: how a divergence that no barrier meets is still named within milliseconds.
//!
//! A barrier catches PEs that made different calls only when they all reach the same barrier.
//! When they wait in different places (one PE in a barrier of the world team, another in a
//! collective of a sub-team, or in a collective whose kernel waits on the device), nobody meets
//! anybody and the job would wait for `SYMHEAP_TIMEOUT`. So every PE publishes, in its sync area
//! (host shared memory every PE of the node maps):
//!
//! * for each team, its recent calls: a ring of (position in the team's ledger, the ledger's
//!   running hash there, the call as text), written under a sequence word so a reader never
//!   takes half an entry;
//! * the collective wait it is blocked in, if any: the team (slot, identity and members) and its
//!   position there.
//!
//! A PE blocked in a collective wait reads these every few milliseconds. Two members whose
//! hashes differ at the same position of one team made different calls there: that is certain,
//! whatever each is doing now. And when a set of PEs is blocked, each waiting for members that
//! have not reached its call and are themselves blocked in the set, none of them can ever go on:
//! a deadlock, reported with every blocked PE's call. Either way the first PE to find it writes
//! its message into PE 0's verdict and every other finder reports that same text, which
//! `fail_all` then carries to every PE of the job.
//!
//! All of this needs every PE of the job on this node (their sync areas mapped); across nodes
//! the host collective points compare ledgers as before.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::area::{RING, TEXT_WORDS, VERDICT_WORDS, WAIT_WORDS};
use super::recent::{call_words, Recorded, RECENT_CALLS};
use super::team::{ranks_text, TeamInner, TeamState};
use crate::context::Inner;
use crate::error::ErrorKind;

// ops/ names the key through this module.
pub(crate) use super::recent::CallKey;

const _: () = assert!(WAIT_WORDS >= 5, "the wait record has 5 words");

/// Words of text in the verdict (after owner, ready, length).
const VERDICT_TEXT: u64 = VERDICT_WORDS - 3;
/// How long a PE that lost the race to write the verdict waits for the winner's text.
const VERDICT_WAIT: Duration = Duration::from_millis(500);

/// A team as PEs outside it see it: its members (world ranks, in team order) as the PE holding
/// it published them in its team record for the slot (see [`Inner::publish_team`]), or None
/// when that record holds another team by now.
fn team_name(slot: u64, members: Option<&[usize]>, world: usize) -> String {
    match members {
        _ if slot == 0 => "the world team".into(),
        // Every PE in world order; in another order the list says which.
        Some(m) if m.len() == world && world > 1 && m.iter().enumerate().all(|(i, &p)| i == p) => {
            format!("team slot {slot} (every PE)")
        }
        Some(m) => format!("team slot {slot} (PEs {})", ranks_text(m)),
        None => format!("team slot {slot}"),
    }
}

/// One published call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    hash: u64,
    text: String,
}

/// What a PE publishes while it is blocked in a collective wait (the team's members are in the
/// PE's team record for the slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wait {
    seq: u64,
    slot: u64,
    pos: u64,
    hash: u64,
    team: u64,
}

/// The wait a waiting PE is in, for [`Inner::watch_scan`].
#[derive(Clone, Copy)]
pub(crate) struct Watching<'a> {
    pub(crate) team: &'a TeamInner,
    pub(crate) pos: u64,
    pub(crate) hash: u64,
}

/// What the previous scan saw, so a deadlock is reported only when every PE of it was blocked
/// in the same wait across two scans (a PE between two waits is not blocked).
#[derive(Debug, Default)]
pub(crate) struct ScanState {
    waits: Vec<Option<Wait>>,
    /// When this PE first saw a mismatch some member had not published yet.
    partial_since: Option<Instant>,
}

/// How long a PE that sees a mismatch waits for the members that have not published the call
/// yet, so the message names every PE's call when they come within it.
const COMPLETE_WAIT: Duration = Duration::from_millis(100);

/// "0, 1, 3".
fn list(pes: &[usize]) -> String {
    pes.iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// "PE 3" / "PEs 0, 2".
fn pes_named(pes: &[usize]) -> String {
    if pes.len() == 1 {
        format!("PE {}", pes[0])
    } else {
        format!("PEs {}", list(pes))
    }
}

fn text_words(text: &str, max_words: u64) -> (u64, Vec<u64>) {
    let bytes = text.as_bytes();
    let mut n = bytes.len().min(8 * max_words as usize);
    while n > 0 && !text.is_char_boundary(n) {
        n -= 1;
    }
    let words = bytes[..n]
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect();
    (n as u64, words)
}

fn words_text(len: u64, words: &[u64]) -> String {
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(len as usize);
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Inner {
    /// Whether the watch can run: every PE's sync area is mapped here.
    fn watch_on(&self) -> bool {
        self.area.all_direct()
    }

    /// Records `call(args)` in `team`'s ledger and publishes it in this PE's ring for the team.
    pub(crate) fn record_on(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        call: &'static str,
        args: String,
    ) {
        let (len, words) = call_words(call, &args);
        let text = crate::ledger::call_hash(call, &args);
        let args = if args.is_empty() {
            crate::ledger::no_args()
        } else {
            Arc::from(args)
        };
        st.ledger.record_hashed(call, &args, text);
        let (pos, hash) = st.ledger.digest();
        self.publish(team, pos, hash, text, len, &words);
    }

    /// `record_on` for a call that repeats: `key` says everything its argument text does
    /// (the same key, the same text), and `args` formats that text only the first time a key
    /// is seen among the team's last few calls (`st` holds them). A collective in a loop then
    /// records and publishes its call without formatting, hashing or allocating text.
    pub(crate) fn record_keyed(
        &self,
        team: &TeamInner,
        st: &mut TeamState,
        key: CallKey,
        args: impl FnOnce() -> String,
    ) {
        let i = self.record_keyed_unpublished(st, key, args);
        self.publish_recent(team, st, i);
    }

    /// The ledger part of [`record_keyed`](Self::record_keyed): returns the index, in
    /// `st.recent`, of the call to publish with [`publish_recent`](Self::publish_recent)
    /// before the team is unlocked (an eager root stores its slots first, so the line
    /// transfers they start overlap the publishing).
    pub(crate) fn record_keyed_unpublished(
        &self,
        st: &mut TeamState,
        key: CallKey,
        args: impl FnOnce() -> String,
    ) -> usize {
        let i = match st.recent.iter().position(|r| r.key == key) {
            Some(i) => i,
            None => {
                let text = args();
                let (len, words) = call_words(key.call, &text);
                let r = Recorded {
                    key,
                    hash: crate::ledger::call_hash(key.call, &text),
                    args: Arc::from(text),
                    len,
                    words,
                };
                if st.recent.len() == RECENT_CALLS {
                    st.recent.pop();
                }
                st.recent.insert(0, r);
                st.recent_inserts += 1;
                0
            }
        };
        let r = &st.recent[i];
        st.ledger.record_hashed(key.call, &r.args, r.hash);
        i
    }

    /// Records `st.recent[i]` in the ledger again, unpublished (a repeat of a known call).
    pub(crate) fn record_again(&self, st: &mut TeamState, i: usize) {
        let r = &st.recent[i];
        st.ledger.record_hashed(r.key.call, &r.args, r.hash);
    }

    /// Publishes the call last recorded in `st`'s ledger, `st.recent[i]`, in this PE's ring.
    #[inline(always)]
    pub(crate) fn publish_recent(&self, team: &TeamInner, st: &TeamState, i: usize) {
        let r = &st.recent[i];
        let (pos, hash) = st.ledger.digest();
        self.publish(team, pos, hash, r.hash, r.len, &r.words);
    }

    /// Publishes call `pos` (running ledger hash `hash`; `text` the hash of its text, `len`
    /// bytes in `words`) in this PE's ring for `team`.
    ///
    /// Inline up to the header's stores: a call in a loop takes only that much, and publishing
    /// was an eighth of an eager broadcast's instructions while it was a call of its own.
    #[inline(always)]
    fn publish(&self, team: &TeamInner, pos: u64, hash: u64, text: u64, len: u64, words: &[u64]) {
        if !self.area.is_direct(self.rank) {
            return;
        }
        let i = pos % RING;
        let at = self.area.ring_word(self.rank, team.slot, i, 0);
        // A call in a loop lands on ring entries that already hold its text: only the header
        // changes then (most of a small collective's publishing cost was rewriting the text).
        let cached = &team.ring_text[i as usize];
        if cached.load(Ordering::Relaxed) == text {
            let head = [pos, hash, team.id, len];
            self.control.store_seqlocked(at, 2 * pos + 1, &head, &[]);
        } else {
            self.publish_text(team, at, [pos, hash, len], text, words);
        }
    }

    /// `publish` of a call whose text the ring entry at `at` does not hold yet.
    #[inline(never)]
    fn publish_text(
        &self,
        team: &TeamInner,
        at: u64,
        pos_hash_len: [u64; 3],
        text: u64,
        words: &[u64],
    ) {
        let [pos, hash, len] = pos_hash_len;
        let body = &words[..(len as usize).div_ceil(8)];
        self.control
            .store_seqlocked(at, 2 * pos + 1, &[pos, hash, team.id, len], body);
        team.ring_text[(pos % RING) as usize].store(text, Ordering::Relaxed);
    }

    /// PE `pe`'s published call at `pos` on team `team` (slot `slot`), if its ring still holds
    /// it complete.
    fn entry(&self, pe: usize, slot: usize, team: u64, pos: u64) -> Option<Entry> {
        let a = &self.area;
        let w = |k: u64| a.ring_word(pe, slot, pos % RING, k);
        let seq = self.control.load64(w(0));
        if seq != 2 * pos + 2 || self.control.load64(w(3)) != team {
            return None;
        }
        let hash = self.control.load64(w(2));
        let len = self.control.load64(w(4)).min(8 * TEXT_WORDS);
        let words: Vec<u64> = (0..len.div_ceil(8))
            .map(|k| self.control.load64(w(5 + k)))
            .collect();
        (self.control.load64(w(0)) == seq).then(|| Entry {
            hash,
            text: words_text(len, &words),
        })
    }

    /// The last position PE `pe` recorded on team `team` (slot `slot`); 0 before any.
    fn latest(&self, pe: usize, slot: usize, team: u64) -> u64 {
        let a = &self.area;
        (0..RING)
            .filter(|&i| self.control.load64(a.ring_word(pe, slot, i, 3)) == team)
            .map(|i| self.control.load64(a.ring_word(pe, slot, i, 0)))
            .filter(|&seq| seq > 0)
            .map(|seq| (seq - 1) / 2)
            .max()
            .unwrap_or(0)
    }

    /// Publishes `team` (its id and members) in this PE's team record for its slot, where PEs
    /// outside the team read whom it waits for when this PE is blocked on it. Written before
    /// the team's first call is published; the id goes last, so a reader that finds it
    /// unchanged around the members read them whole (a slot's ids never repeat).
    pub(crate) fn publish_team(&self, team: &TeamInner) {
        if !self.area.is_direct(self.rank) {
            return;
        }
        let a = &self.area;
        let at = |w: u64| a.team_word(self.rank, team.slot, w);
        self.control.store64(at(0), 0);
        self.control.store64(at(1), team.members.len() as u64);
        for (k, pair) in team.members.chunks(2).enumerate() {
            let lo = pair[0] as u64 & 0xffff_ffff;
            let hi = pair.get(1).map_or(0, |&m| m as u64 & 0xffff_ffff);
            self.control.store64(at(2 + k as u64), lo | hi << 32);
        }
        self.control.store64(at(0), team.id);
    }

    /// The members of team `team` as PE `pe` published them for `slot`; None when its record
    /// holds another team (or is being rewritten).
    fn team_of(&self, pe: usize, slot: usize, team: u64) -> Option<Vec<usize>> {
        if slot == 0 {
            // The world (id 0, which the record's "being written" mark cannot tell apart).
            return Some((0..self.world).collect());
        }
        let a = &self.area;
        let at = |w: u64| self.control.load64(a.team_word(pe, slot, w));
        if at(0) != team {
            return None;
        }
        let n = (at(1) as usize).min(self.world);
        let members = (0..n)
            .map(|k| (at(2 + k as u64 / 2) >> (32 * (k % 2))) as u32 as usize)
            .collect();
        (at(0) == team).then_some(members)
    }

    /// Publishes that this PE is blocked at `w` (until [`end_wait`](Self::end_wait)).
    pub(crate) fn begin_wait(&self, w: &Watching<'_>) {
        if !self.area.is_direct(self.rank) {
            return;
        }
        let a = &self.area;
        let at = |k: u64| a.wait_word(self.rank, k);
        let seq = self.control.load64(at(0));
        let seq = if seq % 2 == 0 { seq + 1 } else { seq + 2 };
        for (k, v) in [w.team.slot as u64, w.pos, w.hash, w.team.id]
            .into_iter()
            .enumerate()
        {
            self.control.store64(at(1 + k as u64), v);
        }
        self.control.store64(at(0), seq);
    }

    /// Publishes that this PE is no longer blocked.
    pub(crate) fn end_wait(&self) {
        if !self.area.is_direct(self.rank) {
            return;
        }
        let at = self.area.wait_word(self.rank, 0);
        let seq = self.control.load64(at);
        if seq % 2 == 1 {
            self.control.store64(at, seq + 1);
        }
    }

    fn wait_of(&self, pe: usize) -> Option<Wait> {
        let a = &self.area;
        let at = |k: u64| self.control.load64(a.wait_word(pe, k));
        let seq = at(0);
        if seq % 2 == 0 {
            return None;
        }
        let w = Wait {
            seq,
            slot: at(1),
            pos: at(2),
            hash: at(3),
            team: at(4),
        };
        (at(0) == seq && (w.slot as usize) < super::area::MAX_TEAMS).then_some(w)
    }

    /// One look at the other PEs from a PE blocked at `w`: the divergence message when the
    /// PEs certainly diverged (different calls at one position of a team) or are blocked on
    /// each other for good; None while either may still be a matter of time.
    pub(crate) fn watch_scan(&self, w: &Watching<'_>, prev: &mut ScanState) -> Option<String> {
        if !self.watch_on() {
            return None;
        }
        if let Some((m, complete)) = self.mismatch_on(w.team, w.pos) {
            let since = *prev.partial_since.get_or_insert_with(Instant::now);
            if complete || since.elapsed() >= COMPLETE_WAIT {
                return Some(m);
            }
            return None;
        }
        let waits: Vec<Option<Wait>> = (0..self.world).map(|pe| self.wait_of(pe)).collect();
        let stable: Vec<Option<Wait>> = waits
            .iter()
            .enumerate()
            .map(|(pe, now)| now.filter(|n| prev.waits.get(pe).copied().flatten() == Some(*n)))
            .collect();
        prev.waits = waits;
        self.deadlock(&stable)
    }

    /// The first position (among those both rings still hold) where members of `team` made
    /// different calls, up to `pos`, as the message every PE will report, and whether every
    /// member had published its call there.
    pub(crate) fn mismatch_on(&self, team: &TeamInner, pos: u64) -> Option<(String, bool)> {
        let first = pos.saturating_sub(RING - 1).max(1);
        for p in first..=pos {
            let at: Vec<Option<Entry>> = team
                .members
                .iter()
                .map(|&m| self.entry(m, team.slot, team.id, p))
                .collect();
            let mut hashes = at.iter().flatten().map(|e| e.hash);
            let Some(h0) = hashes.next() else { continue };
            if hashes.all(|h| h == h0) {
                continue;
            }
            let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
            let mut behind = Vec::new();
            for (k, e) in at.iter().enumerate() {
                let pe = team.members[k];
                match e {
                    Some(e) => match groups.iter_mut().find(|(t, _)| *t == e.text) {
                        Some((_, g)) => g.push(pe),
                        None => groups.push((e.text.clone(), vec![pe])),
                    },
                    None => behind.push(pe),
                }
            }
            let mut msg = format!(
                "collective call #{p} on {} differs between PEs: ",
                team_name(team.slot as u64, Some(&team.members), self.world)
            );
            let parts: Vec<String> = groups
                .iter()
                .map(|(t, g)| format!("{} called {t}", pes_named(g)))
                .collect();
            msg.push_str(&parts.join("; "));
            if !behind.is_empty() {
                let _ = write!(msg, "; {} had not made that call yet", pes_named(&behind));
            }
            return Some((msg, behind.is_empty()));
        }
        None
    }

    /// Among the PEs stably blocked in collective waits (`stable[pe]`), the set that can never
    /// go on: each waits for members that have not reached its call and are blocked in the set
    /// themselves. The message names every such PE and its call, when this PE is one of them.
    fn deadlock(&self, stable: &[Option<Wait>]) -> Option<String> {
        let mut stuck: Vec<bool> = stable.iter().map(Option::is_some).collect();
        if !stuck[self.rank] {
            return None;
        }
        // Each blocked PE's team as it published it; a record already holding another team
        // (the PE moved on) names no one, so that PE is taken as not stuck.
        let members: Vec<Option<Vec<usize>>> = stable
            .iter()
            .enumerate()
            .map(|(pe, w)| w.and_then(|w| self.team_of(pe, w.slot as usize, w.team)))
            .collect();
        let lagging = |w: &Wait, pe: usize| -> Vec<usize> {
            members[pe]
                .iter()
                .flatten()
                .copied()
                .filter(|&m| m != pe && m < self.world)
                .filter(|&m| self.latest(m, w.slot as usize, w.team) < w.pos)
                .collect()
        };
        loop {
            let mut changed = false;
            for pe in 0..self.world {
                let Some(w) = stable[pe].filter(|_| stuck[pe]) else {
                    continue;
                };
                let lag = lagging(&w, pe);
                if lag.is_empty() || lag.iter().any(|&m| !stuck[m]) {
                    stuck[pe] = false;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        if !stuck[self.rank] {
            return None;
        }
        // PEs in the same call waiting for the same PEs are one group of the message.
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for pe in (0..self.world).filter(|&p| stuck[p]) {
            let w = stable[pe].expect("stuck PEs are blocked");
            let call = self
                .entry(pe, w.slot as usize, w.team, w.pos)
                .map_or_else(|| "a collective call".to_string(), |e| e.text);
            let what = format!(
                "{call} (call #{} on {}) for {}",
                w.pos,
                team_name(w.slot, members[pe].as_deref(), self.world),
                pes_named(&lagging(&w, pe))
            );
            match groups.iter_mut().find(|(t, _)| *t == what) {
                Some((_, g)) => g.push(pe),
                None => groups.push((what, vec![pe])),
            }
        }
        let parts: Vec<String> = groups
            .iter()
            .map(|(what, g)| {
                let verb = if g.len() == 1 { "waits" } else { "wait" };
                format!("{} {verb} in {what}", pes_named(g))
            })
            .collect();
        Some(format!(
            "PEs are blocked in different collective calls, each waiting for another: {}",
            parts.join("; ")
        ))
    }

    /// The message every PE reports for a divergence this PE found: its own when it is the
    /// first to find one, else the first finder's (PE 0's verdict), so no two PEs word the same
    /// failure differently.
    pub(crate) fn settle(&self, msg: String) -> String {
        if !self.watch_on() {
            return msg;
        }
        let a = &self.area;
        let v = |k: u64| a.verdict_word(0, k);
        let me = self.rank as u64 + 1;
        if self.control.cas64(v(0), 0, me) == 0 {
            let (len, words) = text_words(&msg, VERDICT_TEXT);
            for (k, w) in words.iter().enumerate() {
                self.control.store64(v(3 + k as u64), *w);
            }
            self.control.store64(v(2), len);
            self.control.store64(v(1), 1);
            return msg;
        }
        let deadline = Instant::now() + VERDICT_WAIT;
        while self.control.load64(v(1)) == 0 {
            if Instant::now() >= deadline {
                return msg;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let len = self.control.load64(v(2)).min(8 * VERDICT_TEXT);
        let words: Vec<u64> = (0..len.div_ceil(8))
            .map(|k| self.control.load64(v(3 + k)))
            .collect();
        words_text(len, &words)
    }

    /// A divergence found by this PE: settles the message and fails every PE with it.
    pub(crate) fn diverged_for_good(&self, msg: String) -> ErrorKind {
        let kind = ErrorKind::CollectiveMismatch(self.settle(msg));
        self.boot.fail_all(kind.clone());
        kind
    }
}

/// How often the watchdog looks.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(20);

impl Inner {
    /// Adds `team` to the teams the watchdog looks at, and publishes its members for PEs
    /// outside it (before any call of it is published).
    pub(crate) fn register_team(&self, team: &Arc<TeamInner>) {
        self.publish_team(team);
        self.teams.remember(team);
    }

    /// One look of the watchdog: a certain mismatch on any of this PE's teams at the position
    /// it last published there. `partial` remembers, per slot, since when a mismatch was seen
    /// with members that had not published yet.
    fn watchdog_look(&self, partial: &mut [Option<Instant>]) -> Option<String> {
        for t in &self.teams.live() {
            let pos = self.latest(self.rank, t.slot, t.id);
            let Some((msg, complete)) = (pos > 0).then(|| self.mismatch_on(t, pos)).flatten()
            else {
                partial[t.slot] = None;
                continue;
            };
            let since = *partial[t.slot].get_or_insert_with(Instant::now);
            if complete || since.elapsed() >= COMPLETE_WAIT {
                return Some(msg);
            }
        }
        None
    }
}

/// CUDA backend: a thread that watches for mismatches while no host wait of this PE does. A
/// collective enqueued on a stream waits on the device, where no host code looks at the other
/// PEs; if another PE made a different call at that position, this finds it within tens of
/// milliseconds, and failing the job raises the abort word, which ends the kernel's waits. The
/// thread ends when the context is gone or the job failed or finalized.
pub(crate) fn start_watchdog(inner: &Arc<Inner>) {
    if !inner.watch_on() || inner.world < 2 {
        return;
    }
    let weak = Arc::downgrade(inner);
    let spawned = std::thread::Builder::new()
        .name("symheap-watch".into())
        .spawn(move || {
            let mut partial = vec![None; super::area::MAX_TEAMS];
            loop {
                std::thread::park_timeout(WATCHDOG_PERIOD);
                let Some(inner) = weak.upgrade() else { return };
                let h = inner.boot.health();
                if h.is_failed()
                    || h.is_finalized()
                    || inner.teams.watchdog_stop.load(Ordering::Acquire)
                {
                    return;
                }
                if let Some(msg) = inner.watchdog_look(&mut partial) {
                    inner.diverged_for_good(msg);
                    return;
                }
            }
        });
    match spawned {
        Ok(h) => {
            *inner
                .teams
                .watchdog
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(h)
        }
        Err(e) => tracing::warn!(
            "symheap: no watchdog thread ({e}); device-side divergences end at SYMHEAP_TIMEOUT"
        ),
    }
}

/// Ends the watchdog and waits (up to a second) until it has: a watchdog that still held the
/// context when `main` returned would drop it on its own thread while the process exits, and
/// the CUDA driver tears itself down then (a SIGSEGV at exit). Never waits on itself.
pub(crate) fn stop_watchdog(inner: &Inner) {
    let Some(h) = inner
        .teams
        .watchdog
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    else {
        return;
    };
    if h.thread().id() == std::thread::current().id() {
        return;
    }
    inner.teams.watchdog_stop.store(true, Ordering::Release);
    h.thread().unpark();
    let deadline = Instant::now() + Duration::from_secs(1);
    while !h.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if h.is_finished() {
        let _ = h.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn team_names_list_members_in_team_order() {
        assert_eq!(
            team_name(2, Some(&[1, 3, 5]), 8),
            "team slot 2 (PEs 1, 3, 5)"
        );
        assert_eq!(
            team_name(4, Some(&[2, 0, 3]), 4),
            "team slot 4 (PEs 2, 0, 3)"
        );
        assert_eq!(
            team_name(1, Some(&[3, 1, 0, 2]), 4),
            "team slot 1 (PEs 3, 1, 0, 2)"
        );
        assert_eq!(
            team_name(1, Some(&[0, 1, 2, 3]), 4),
            "team slot 1 (every PE)"
        );
        assert_eq!(team_name(0, Some(&[0, 1]), 2), "the world team");
        assert_eq!(team_name(3, None, 4), "team slot 3");
    }

    #[test]
    fn text_round_trips_through_words_and_truncates_on_a_char_boundary() {
        let (len, w) = text_words("all_reduce(sum 4 x f32)", 4);
        assert_eq!(words_text(len, &w), "all_reduce(sum 4 x f32)");
        let long = "é".repeat(40);
        let (len, w) = text_words(&long, 2);
        assert!(len <= 16 && words_text(len, &w).chars().all(|c| c == 'é'));
    }
}
