//! A team made by its members alone ([`Context::team_from_world_ranks`]): the PEs outside it
//! never call anything, which is how torch.distributed makes a process group's backend. The
//! members meet through an all-gather of bytes the caller supplies (torch's: over the group's
//! store), agree there on a team slot free on all of them and on the team's id, and check that
//! they all passed the same list; then the team is installed as a split's would be
//! (`ops/team.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::team::{check_ranks, pick_slot, NewTeam};
use crate::backend::cuda::nccl::{self, UNIQUE_ID_BYTES};
use crate::context::team::{ranks_text, Team};
use crate::context::Context;
use crate::error::{invalid, Error, ErrorKind, Result};

const CALL: &str = "team_from_world_ranks";

/// The first bytes of every member's message: "SHTM" and a format version.
const MAGIC: [u8; 5] = *b"SHTM1";

/// Teams this process asked for so far, part of each member's nonce.
static ASKED: AtomicU64 = AtomicU64::new(0);

/// What each member sends in the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hello {
    /// The sender's world rank.
    rank: usize,
    /// The list the sender passed.
    ranks: Vec<usize>,
    /// Team slots free on the sender.
    free: u64,
    /// Different for every call of every process: the team id is made from the members'.
    nonce: u64,
    /// CUDA, a team across nodes: why the sender cannot use NCCL.
    broken: Option<String>,
    /// CUDA, a team across nodes, from its first member: the NCCL id of its communicator.
    nccl_id: Option<[u8; UNIQUE_ID_BYTES]>,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        let mut word = |v: u64| b.extend_from_slice(&v.to_le_bytes());
        word(self.rank as u64);
        word(self.ranks.len() as u64);
        self.ranks.iter().for_each(|&r| word(r as u64));
        word(self.free);
        word(self.nonce);
        b.push(self.nccl_id.is_some() as u8);
        b.extend_from_slice(&self.nccl_id.unwrap_or([0; UNIQUE_ID_BYTES]));
        b.extend_from_slice(self.broken.as_deref().unwrap_or("").as_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Hello> {
        let rest = b.strip_prefix(&MAGIC)?;
        let mut words = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()));
        let rank = usize::try_from(words.next()?).ok()?;
        let n = usize::try_from(words.next()?).ok()?;
        if n > rest.len() / 8 {
            return None;
        }
        let fixed = 8 * (4 + n) + 1 + UNIQUE_ID_BYTES;
        if rest.len() < fixed {
            return None;
        }
        let ranks = (0..n)
            .map(|_| words.next().and_then(|w| usize::try_from(w).ok()))
            .collect::<Option<Vec<usize>>>()?;
        let (free, nonce) = (words.next()?, words.next()?);
        let at = 8 * (4 + n);
        let nccl_id = (rest[at] == 1).then(|| rest[at + 1..fixed].try_into().expect("sized"));
        let why = String::from_utf8_lossy(&rest[fixed..]).into_owned();
        Some(Hello {
            rank,
            ranks,
            free,
            nonce,
            broken: (!why.is_empty()).then_some(why),
            nccl_id,
        })
    }
}

/// "[2, 0, 3]", every rank (two lists that differ must read differently).
fn bracketed(ranks: &[usize]) -> String {
    let all: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    format!("[{}]", all.join(", "))
}

/// When the members passed different lists: the message every member reports alike (the
/// lists grouped by who passed them, the groups in order of their lowest PE).
fn lists_differ(all: &[Hello]) -> Option<String> {
    if all.windows(2).all(|w| w[0].ranks == w[1].ranks) {
        return None;
    }
    let mut groups: Vec<(&[usize], Vec<usize>)> = Vec::new();
    for h in all {
        match groups.iter_mut().find(|(l, _)| *l == h.ranks.as_slice()) {
            Some((_, pes)) => pes.push(h.rank),
            None => groups.push((&h.ranks, vec![h.rank])),
        }
    }
    for (_, pes) in groups.iter_mut() {
        pes.sort_unstable();
    }
    groups.sort_by_key(|(_, pes)| pes[0]);
    let parts: Vec<String> = groups
        .iter()
        .map(|(l, pes)| {
            let who = if pes.len() == 1 {
                format!("PE {}", pes[0])
            } else {
                format!("PEs {}", ranks_text(pes))
            };
            format!("{who} passed {}", bracketed(l))
        })
        .collect();
    Some(format!(
        "{CALL}: the members passed different lists of world ranks: {}",
        parts.join("; ")
    ))
}

impl Context {
    /// Collective over the PEs `ranks` only (world ranks, in team order, each at most once,
    /// this PE among them): a new team whose member `i` is world PE `ranks[i]`, made without
    /// the other PEs, which never call it (this is how a torch.distributed process group
    /// makes its backend). Every member calls it with the same list, in the same order as its
    /// other team creations.
    ///
    /// `exchange` is the caller's all-gather among exactly these members: called once with
    /// this PE's message, it returns every member's message in the order of `ranks` (this
    /// PE's own included). Through it the members agree on a team slot free on all of them
    /// (at most 32 teams exist at once) and on the team's id, and check that they passed the
    /// same list: when they did not, every member fails with both lists named (as far as the
    /// exchange brought every member's message; an invalid list fails here before it is
    /// called). An error of `exchange` is returned as it is.
    ///
    /// The new team is like a split team: collectives, barriers, nested splits, destroy,
    /// translation and the checks of its members' calls. Its creation is recorded in no
    /// existing ledger (the other PEs never make it, and the world's ledger must stay the same
    /// on every PE): the team's own ledger starts empty and checks its members' calls from
    /// there, and the list check above stands for the creation's own entry. Team creations on
    /// this PE run one at a time (`exchange` must not create a team).
    ///
    /// Across nodes (members on different nodes): CUDA backend only, through an NCCL
    /// communicator of the team made here (its id travels in the exchange); such a team
    /// cannot be split further. The host backend's teams across nodes use Open MPI's split,
    /// which every PE of the job must enter: refused there (split the world with
    /// [`team_split_ranks`](Self::team_split_ranks) instead).
    #[allow(clippy::type_complexity)]
    pub fn team_from_world_ranks(
        &self,
        ranks: &[usize],
        exchange: &mut dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>>,
    ) -> Result<Team> {
        let (rank, world) = (self.inner.rank, self.inner.world);
        self.inner.check(CALL)?;
        check_ranks(ranks, world, "the world").map_err(|why| invalid(CALL, why).with_pe(rank))?;
        let Some(me) = ranks.iter().position(|&r| r == rank) else {
            return Err(invalid(
                CALL,
                format!("this PE ({rank}) is not in the list {}", bracketed(ranks)),
            )
            .with_pe(rank));
        };
        let node_of = &self.inner.node.node_of;
        let spans = ranks.iter().any(|&m| node_of[m] != node_of[ranks[0]]);
        if spans && self.inner.backend.is_host() {
            // Decided from the node map, which every member has: all fail alike.
            return Err(Error::new(
                Some(rank),
                CALL,
                ErrorKind::Unsupported(format!(
                    "the world PEs {} are on more than one node, and on the host backend a team \
                     across nodes runs through Open MPI, whose split every PE of the job must \
                     enter: make it with team_split_ranks over the world instead",
                    bracketed(ranks)
                )),
            ));
        }
        let creating = self.creating();
        let hello = self.hello(ranks, me, spans);
        let parts = exchange(&hello.encode())?;
        let all = self.decode_all(ranks, &parts)?;
        if let Some(why) = lists_differ(&all) {
            return Err(Error::new(
                Some(rank),
                CALL,
                ErrorKind::CollectiveMismatch(why),
            ));
        }
        if let Some(i) = (0..ranks.len()).find(|&i| all[i].rank != ranks[i]) {
            return Err(invalid(
                CALL,
                format!(
                    "the exchange returned PE {}'s message in place {i}, which is PE {}'s: it \
                     must return the members' messages in the order of the list",
                    all[i].rank, ranks[i]
                ),
            )
            .with_pe(rank));
        }
        let nccl_id = if spans { self.nccl_agreed(&all)? } else { None };
        let label = format!("world PEs {}", ranks_text(ranks));
        let common = all.iter().fold(!0u64, |c, h| c & h.free);
        let slot = pick_slot(rank, CALL, common, &label)?;
        let mut key: Vec<u8> = b"members".to_vec();
        for v in ranks
            .iter()
            .map(|&r| r as u64)
            .chain(all.iter().map(|h| h.nonce))
            .chain([slot as u64])
        {
            key.extend_from_slice(&v.to_le_bytes());
        }
        let made = NewTeam {
            call: CALL,
            slot,
            members: ranks.to_vec(),
            me,
            name: format!("team {slot} ({label})"),
            id: crate::util::fnv1a(&key).max(1),
            spans,
            nccl_id,
            mpi: None,
        };
        self.install_team(made, creating)
    }

    /// This member's message: its list, free slots and nonce; for a team across nodes, whether
    /// it can use NCCL and (the first member) the communicator's id.
    fn hello(&self, ranks: &[usize], me: usize, spans: bool) -> Hello {
        let free = !*self.inner.teams.slots();
        let asked = ASKED.fetch_add(1, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let nonce = crate::util::fnv1a(
            &[
                u64::from(std::process::id()),
                now,
                asked,
                self.inner.rank as u64,
            ]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
        );
        let mut hello = Hello {
            rank: self.inner.rank,
            ranks: ranks.to_vec(),
            free,
            nonce,
            broken: None,
            nccl_id: None,
        };
        if spans {
            match nccl::load() {
                Err(why) => hello.broken = Some(why),
                Ok(api) if me == 0 => match api.unique_id() {
                    Ok(id) => hello.nccl_id = Some(id),
                    Err(why) => hello.broken = Some(why),
                },
                Ok(_) => {}
            }
        }
        hello
    }

    /// The members' messages as `exchange` returned them, decoded.
    fn decode_all(&self, ranks: &[usize], parts: &[Vec<u8>]) -> Result<Vec<Hello>> {
        let rank = self.inner.rank;
        if parts.len() != ranks.len() {
            return Err(invalid(
                CALL,
                format!(
                    "the exchange returned {} messages for the {} members {}",
                    parts.len(),
                    ranks.len(),
                    bracketed(ranks)
                ),
            )
            .with_pe(rank));
        }
        parts
            .iter()
            .enumerate()
            .map(|(i, b)| {
                Hello::decode(b)
                    .filter(|h| h.rank < self.inner.world)
                    .ok_or_else(|| {
                        Error::new(
                            Some(rank),
                            CALL,
                            ErrorKind::Bootstrap(format!(
                                "message {i} of the exchange (from PE {}) is not a member's \
                                 message",
                                ranks[i]
                            )),
                        )
                    })
            })
            .collect()
    }

    /// CUDA, a team across nodes: the NCCL id from its first member once every member said it
    /// can use NCCL (else the same error on every member).
    fn nccl_agreed(&self, all: &[Hello]) -> Result<Option<[u8; UNIQUE_ID_BYTES]>> {
        let rank = self.inner.rank;
        if let Some(h) = all.iter().find(|h| h.broken.is_some()) {
            return Err(Error::new(
                Some(rank),
                CALL,
                ErrorKind::Unsupported(format!(
                    "a team across nodes runs its collectives through NCCL, which PE {} cannot \
                     use: {}",
                    h.rank,
                    h.broken.as_deref().unwrap_or_default()
                )),
            ));
        }
        all[0].nccl_id.map(Some).ok_or_else(|| {
            Error::new(
                Some(rank),
                CALL,
                ErrorKind::Bootstrap(format!("PE {} sent no NCCL id", all[0].rank)),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(rank: usize, ranks: &[usize]) -> Hello {
        Hello {
            rank,
            ranks: ranks.to_vec(),
            free: 0xfff0,
            nonce: 77 + rank as u64,
            broken: None,
            nccl_id: None,
        }
    }

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let mut h = hello(3, &[2, 0, 3]);
        assert_eq!(Hello::decode(&h.encode()), Some(h.clone()));
        h.broken = Some("no libnccl".into());
        h.nccl_id = Some([7; UNIQUE_ID_BYTES]);
        assert_eq!(Hello::decode(&h.encode()), Some(h.clone()));
        let b = h.encode();
        for cut in [0, 4, 5, 12, 30, b.len() - 11] {
            assert_eq!(Hello::decode(&b[..cut]), None, "cut at {cut}");
        }
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(Hello::decode(&huge), None);
    }

    #[test]
    fn differing_lists_are_named_alike_whatever_the_order() {
        let a = [
            hello(0, &[0, 1, 2]),
            hello(1, &[0, 1, 2]),
            hello(2, &[2, 1, 0]),
        ];
        let want = "team_from_world_ranks: the members passed different lists of world ranks: \
                    PEs 0, 1 passed [0, 1, 2]; PE 2 passed [2, 1, 0]";
        assert_eq!(lists_differ(&a).as_deref(), Some(want));
        let b = [a[2].clone(), a[1].clone(), a[0].clone()];
        assert_eq!(lists_differ(&b).as_deref(), Some(want));
        assert_eq!(lists_differ(&a[..2]), None);
    }
}
