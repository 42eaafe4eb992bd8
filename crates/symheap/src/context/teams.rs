//! The context's teams part: the world team (whose ledger records allocation, growth, reclaim,
//! barriers and finalize), the team slots in use, the live teams the watchdog looks at, the
//! eager broadcast channels' state, and the watchdog thread. Team creation (`ops/team.rs`,
//! `ops/team_members.rs`) and the watchdog (`watch.rs`) go through it.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::eager_state::EagerTeams;
use super::team::TeamInner;

/// This PE's teams, owned by the context.
pub(crate) struct Teams {
    /// The world team; its ledger records allocation, growth, reclaim, barriers and finalize.
    pub(crate) world_team: Arc<TeamInner>,
    /// Team slots in use on this PE (bit 0: the world).
    slots_used: Mutex<u64>,
    /// Held by a team creation on this PE from reading the free slots to claiming one
    /// (`ops/team.rs`), so two threads never agree on the same slot for two teams.
    team_create: Mutex<()>,
    /// The teams this PE belongs to (the world and live splits), for the watchdog.
    pub(crate) list: Mutex<Vec<Weak<TeamInner>>>,
    /// The host backend's eager broadcasts: this PE's state of each team's channel.
    pub(crate) eager: EagerTeams,
    /// The watchdog thread (2 PEs or more), joined when the context is dropped.
    pub(crate) watchdog: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Tells the watchdog to end.
    pub(crate) watchdog_stop: AtomicBool,
}

impl Teams {
    /// Only the world team, in slot 0.
    pub(crate) fn new(world_team: TeamInner) -> Teams {
        Teams {
            world_team: Arc::new(world_team),
            slots_used: Mutex::new(1),
            team_create: Mutex::new(()),
            list: Mutex::new(Vec::new()),
            eager: Default::default(),
            watchdog: Mutex::new(None),
            watchdog_stop: AtomicBool::new(false),
        }
    }

    /// The team slots in use on this PE (bit 0: the world), locked.
    pub(crate) fn slots(&self) -> MutexGuard<'_, u64> {
        self.slots_used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The team-creation lock, held from reading the free slots to claiming one.
    pub(crate) fn creating(&self) -> MutexGuard<'_, ()> {
        self.team_create.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The teams this PE belongs to that are still alive (the world first).
    pub(crate) fn live(&self) -> Vec<Arc<TeamInner>> {
        let t = self.list.lock().unwrap_or_else(|p| p.into_inner());
        t.iter()
            .filter_map(Weak::upgrade)
            .filter(|t| !t.is_destroyed())
            .collect()
    }

    /// Adds `team` to the list (dropping the entries of teams no longer held).
    pub(crate) fn remember(&self, team: &Arc<TeamInner>) {
        let mut t = self.list.lock().unwrap_or_else(|p| p.into_inner());
        t.retain(|w| w.strong_count() > 0);
        t.push(Arc::downgrade(team));
    }
}
