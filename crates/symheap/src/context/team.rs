//! Teams: ordered subsets of the PEs with their own barrier state and their own ledger.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ledger::Ledger;

/// A locked team's state (see [`TeamInner::state`]).
pub(crate) type TeamGuard<'a> = MutexGuard<'a, TeamState>;

/// Barrier progress of one team on this PE. Held locked for the whole of a team operation,
/// which also keeps two threads of one PE from interleaving calls on the same team.
#[derive(Debug, Default)]
pub(crate) struct TeamState {
    /// Barriers completed on this team.
    pub epoch: u64,
    /// The team's collective ledger on this PE (under the same lock as the rest: every call
    /// records and checks it while holding the team).
    pub ledger: Ledger,
    /// The last calls recorded with `Inner::record_keyed`, newest first.
    pub recent: Vec<super::recent::Recorded>,
    /// Calls ever put in front of `recent`: while it is unchanged, no entry of `recent` moved.
    pub recent_inserts: u64,
}

#[derive(Debug)]
pub(crate) struct TeamInner {
    /// Slot in the sync area (0 is WORLD).
    pub slot: usize,
    /// Global ranks of the members, in team order.
    pub members: Vec<usize>,
    /// This PE's index in `members`.
    pub me: usize,
    /// Readable description for messages.
    pub name: String,
    /// The same on every member and different for every team a slot ever holds (the world: 0),
    /// so published calls of a destroyed team are never taken for this one's.
    pub id: u64,
    /// Locked by every team operation on this PE; a second thread of this PE on the same team
    /// (a program's own race) waits until the first is done. (A spin lock, whose release is a
    /// plain store, was within 4 % of this on the host bench, alternated: not worth its own
    /// lock type.)
    pub state: Mutex<TeamState>,
    pub destroyed: AtomicBool,
    /// CUDA: the stream of this team's last stream collective or barrier, kept alive when
    /// symheap made it. The device state of a team (epochs, flags) admits one launch at a
    /// time, so a launch on another stream first waits for that stream's work (see
    /// `ops::coll::order_team`).
    pub last_stream: Mutex<Option<(u64, Option<crate::heap::KeepAlive>)>>,
    /// The text hash of the call this PE last published in each entry of its ring of recent
    /// calls for the team (see `Inner::publish`): an unchanged text is not rewritten.
    pub ring_text: [AtomicU64; super::area::RING as usize],
    /// CUDA: this team's one-shot and exchange kernels may use the scratch and LL128 region
    /// (`DeviceTeams`). One team per PE owns them, since their double buffering follows that
    /// team's epochs: the world when every PE is direct, else this PE's node team (the world
    /// then runs its collectives across nodes, see `context/span.rs`).
    pub scratch: bool,
    /// CUDA: a team other than the world whose members are on more than one node (a split of
    /// the world across nodes, e.g. the PEs with one node index: a data-parallel group). Its
    /// collectives and barriers run through an NCCL communicator of its own, made with the
    /// team (see `context/span.rs`); it cannot be split further.
    pub spans: bool,
}

impl TeamInner {
    pub(crate) fn new(slot: usize, members: Vec<usize>, me: usize, name: String, id: u64) -> Self {
        TeamInner {
            slot,
            members,
            me,
            name,
            id,
            state: Mutex::new(TeamState {
                ledger: Ledger::new(),
                ..TeamState::default()
            }),
            destroyed: AtomicBool::new(false),
            last_stream: Mutex::new(None),
            ring_text: std::array::from_fn(|_| Default::default()),
            scratch: false,
            spans: false,
        }
    }

    /// The team, spanning nodes when `spans` (see [`TeamInner::spans`]).
    pub(crate) fn with_spans(mut self, spans: bool) -> Self {
        self.spans = spans;
        self
    }

    /// The team, owning the scratch when `owns` (see [`TeamInner::scratch`]).
    pub(crate) fn with_scratch(mut self, owns: bool) -> Self {
        self.scratch = owns;
        self
    }

    pub(crate) fn lock(&self) -> TeamGuard<'_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn my_global(&self) -> usize {
        self.members[self.me]
    }

    /// The members (world PEs, in member order) for which `pred` holds: whom a wait that timed
    /// out names.
    pub(crate) fn members_where(&self, pred: impl Fn(usize) -> bool) -> Vec<usize> {
        self.members.iter().copied().filter(|&m| pred(m)).collect()
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }
}

/// A team handle. [`Team::INVALID`] is what non-members get from a split; every operation on it
/// is a no-op, so non-members never block. The world team comes from
/// [`crate::Context::world_team`].
#[derive(Debug, Clone)]
pub struct Team(pub(crate) Option<Arc<TeamInner>>);

impl Team {
    /// The team of nobody: operations on it do nothing and succeed.
    pub const INVALID: Team = Team(None);

    /// False for [`Team::INVALID`].
    pub fn is_valid(&self) -> bool {
        self.0.is_some()
    }

    /// This PE's index in the team; None for INVALID.
    pub fn my_pe(&self) -> Option<usize> {
        self.0.as_ref().map(|t| t.me)
    }

    /// Number of members; 0 for INVALID.
    pub fn n_pes(&self) -> usize {
        self.0.as_ref().map_or(0, |t| t.members.len())
    }

    /// World rank of team member `pe`, if it exists.
    pub fn world_pe(&self, pe: usize) -> Option<usize> {
        self.0.as_ref().and_then(|t| t.members.get(pe).copied())
    }

    /// World ranks of all members, in team order (empty for INVALID).
    pub fn members(&self) -> &[usize] {
        self.0.as_ref().map_or(&[], |t| t.members.as_slice())
    }

    /// Team `pe` of `self` as a member index of `dest` (None if it is not a member there, or
    /// either team is INVALID). OpenSHMEM's `team_translate_pe`.
    pub fn translate_pe(&self, pe: usize, dest: &Team) -> Option<usize> {
        let g = self.world_pe(pe)?;
        dest.0.as_ref()?.members.iter().position(|&m| m == g)
    }

    /// Whether two handles name the same team.
    pub fn same_as(&self, other: &Team) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

/// World ranks (or member indices) as text for names and messages: ascending runs of three or
/// more as ranges, at most 16 items before an ellipsis with the total ("0-3, 9, 5, 6").
pub(crate) fn ranks_text(ranks: &[usize]) -> String {
    const MAX_ITEMS: usize = 16;
    let mut items: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() && items.len() < MAX_ITEMS {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            items.push(format!("{}-{}", ranks[i], ranks[j]));
            i = j + 1;
        } else {
            items.push(ranks[i].to_string());
            i += 1;
        }
    }
    let mut s = items.join(", ");
    if i < ranks.len() {
        s.push_str(&format!(", ... ({} in all)", ranks.len()));
    }
    s
}

impl std::fmt::Display for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(t) => f.write_str(&t.name),
            None => f.write_str("INVALID"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ranks_text;

    #[test]
    fn ranks_text_folds_ascending_runs_and_keeps_order() {
        assert_eq!(ranks_text(&[2, 0, 3]), "2, 0, 3");
        assert_eq!(ranks_text(&[0, 1, 2, 3, 9, 5, 6]), "0-3, 9, 5, 6");
        assert_eq!(ranks_text(&[]), "");
        let many: Vec<usize> = (0..40).map(|k| 2 * k).collect();
        assert_eq!(
            ranks_text(&many),
            "0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, ... (40 in all)"
        );
    }
}
