//! This PE's state of each team's eager channel (see `eager.rs`): counts, acknowledgements and
//! the last checked call, in words ordered by the team's lock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::area::{EAGER_INLINE, MAX_TEAMS};
use super::team::{TeamInner, TeamState};

/// An eager broadcast's data, as the words of its slot.
pub(crate) type EagerBody = [u64; (EAGER_INLINE / 8) as usize];

/// One word of an [`EagerTeam`]: a relaxed load or store (a plain move), ordered by the team's
/// lock, which every caller holds.
#[derive(Debug, Default)]
pub(super) struct Word(AtomicU64);

impl Word {
    #[inline(always)]
    pub(super) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }

    #[inline(always)]
    pub(super) fn set(&self, v: u64) {
        self.0.store(v, Relaxed)
    }
}

/// This PE's eager-broadcast state on one team.
#[derive(Debug, Default)]
pub(crate) struct EagerTeam {
    /// The id of the team this entry counts for (`TeamInner::id`; the world's is 0, as a fresh
    /// entry's): a slot reused by a new team starts again from zero.
    pub(super) owner: Word,
    /// Eager broadcasts on the team so far (every member counts them alike).
    pub(super) total: Word,
    /// A lower bound of the eager broadcasts every other member has consumed (refreshed from
    /// their counters only when this PE, as a root, needs more).
    pub(super) acked: Word,
    /// The ledger hash after the last eager broadcast this PE consumed (published with the
    /// count, see `Inner::publish_consumed`).
    pub(super) hash: Word,
    /// This PE's last eager broadcast as root until every receiver is known to have consumed
    /// it: its number on the team plus one (0: none), and the ledger digest it carried.
    pub(super) unsettled: [Word; 3],
    /// The last eager broadcast whose arguments were checked (see `ops/coll_eager.rs`): root,
    /// count, dtype code, destination and source; the heap generation they were checked at;
    /// its record's index in `TeamState::recent` plus one (0: none); and
    /// `TeamState::recent_inserts` then. A repeat while all of it holds needs neither the
    /// checks nor a search of the recent calls again.
    pub(super) call: [Word; 5],
    pub(super) generation: Word,
    pub(super) recorded: Word,
    pub(super) inserts: Word,
}

/// Every team slot's [`EagerTeam`] on this PE.
#[derive(Debug)]
pub(crate) struct EagerTeams([EagerTeam; MAX_TEAMS]);

impl Default for EagerTeams {
    fn default() -> Self {
        EagerTeams(std::array::from_fn(|_| EagerTeam::default()))
    }
}

impl EagerTeams {
    /// `team`'s entry, emptied first when it last counted for another team. `_held` is the
    /// team's locked state: the caller holds the lock that orders the entry's words.
    #[inline(always)]
    pub(super) fn of(&self, team: &TeamInner, _held: &TeamState) -> &EagerTeam {
        let e = &self.0[team.slot];
        if e.owner.get() != team.id {
            e.reset(team.id);
        }
        e
    }
}

impl EagerTeam {
    /// Empties the entry for team `owner`.
    #[cold]
    fn reset(&self, owner: u64) {
        let single = [&self.total, &self.acked, &self.hash];
        let checked = [&self.generation, &self.recorded, &self.inserts];
        for w in single
            .into_iter()
            .chain(&self.unsettled)
            .chain(&self.call)
            .chain(checked)
        {
            w.set(0);
        }
        self.owner.set(owner);
    }
}
