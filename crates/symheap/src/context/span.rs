//! Collectives of a team that spans nodes, on the CUDA backend: where the PEs sit
//! ([`Layout`]), and what those collectives need, made at the first of them ([`Span`]): this
//! PE's node team (symheap's kernels among the PEs of one node), the NCCL communicators between
//! nodes, and a workspace in the heap. The algorithms are in `ops/coll/engine/nccl.rs` and each kind's `nccl_world`.
//!
//! Teams other than the world that span nodes have a communicator of their own instead
//! (`team_span.rs`). symheap moves no byte between nodes itself; NCCL does.

use std::sync::{Arc, MutexGuard};

use super::comms::{Layout, Span};
use super::team::{Team, TeamInner};
use super::Inner;
use crate::backend::cuda::driver;
use crate::backend::cuda::nccl::{self, Comm, UNIQUE_ID_BYTES};
use crate::config::NodesAlgo;
use crate::error::{Error, ErrorKind, Result};

/// What each PE tells the others when the span state is made.
struct Hello {
    /// Why NCCL is unusable here (None: usable).
    broken: Option<String>,
    /// This PE may run the hierarchical algorithms.
    hier: bool,
    /// Team slots free on this PE.
    free: u64,
    /// The id of the communicator this PE starts among the PEs with its node index (it is on
    /// node 0), and of the world communicator (it is PE 0).
    inter_id: Option<[u8; UNIQUE_ID_BYTES]>,
    all_id: Option<[u8; UNIQUE_ID_BYTES]>,
}

impl Hello {
    const FIXED: usize = 1 + 1 + 8 + 2 + 2 * UNIQUE_ID_BYTES;

    fn encode(&self) -> Vec<u8> {
        let mut b = vec![self.broken.is_none() as u8, self.hier as u8];
        b.extend_from_slice(&self.free.to_le_bytes());
        b.push(self.inter_id.is_some() as u8);
        b.push(self.all_id.is_some() as u8);
        b.extend_from_slice(&self.inter_id.unwrap_or([0; UNIQUE_ID_BYTES]));
        b.extend_from_slice(&self.all_id.unwrap_or([0; UNIQUE_ID_BYTES]));
        b.extend_from_slice(self.broken.as_deref().unwrap_or("").as_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Hello> {
        if b.len() < Self::FIXED {
            return None;
        }
        let id = |at: usize, has: u8| {
            (has == 1)
                .then(|| <[u8; UNIQUE_ID_BYTES]>::try_from(&b[at..at + UNIQUE_ID_BYTES]).ok())?
        };
        Some(Hello {
            broken: (b[0] == 0).then(|| String::from_utf8_lossy(&b[Self::FIXED..]).into_owned()),
            hier: b[1] == 1,
            free: u64::from_le_bytes(b[2..10].try_into().ok()?),
            inter_id: id(12, b[10]),
            all_id: id(12 + UNIQUE_ID_BYTES, b[11]),
        })
    }
}

fn unsupported(rank: usize, call: &'static str, why: String) -> Error {
    Error::new(Some(rank), call, ErrorKind::Unsupported(why))
}

impl Inner {
    /// Whether `team`'s stream collectives run across nodes on the CUDA backend: the world team
    /// with a PE whose memory this one cannot reach, or a split of it that spans nodes.
    pub(crate) fn spans_nodes(&self, team: &TeamInner) -> bool {
        self.backend.as_cuda().is_some()
            && (team.spans || (team.slot == 0 && !team.scratch && self.world > 1))
    }

    /// The state of the collectives across nodes, made at the first of them: a collective
    /// over the world, which every PE reaches in the same call. Not under CUDA graph capture
    /// (NCCL's communicators allocate device memory): the first such collective runs eagerly.
    pub(crate) fn span(
        &self,
        call: &'static str,
        stream: u64,
    ) -> Result<MutexGuard<'_, Option<Span>>> {
        let mut g = self.comms.span.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            if driver::is_capturing(stream)? {
                return Err(unsupported(
                    self.rank,
                    call,
                    "the first collective across nodes sets up NCCL, which cannot happen while a \
                     CUDA graph is being captured: run one collective across nodes (any size) \
                     before capturing"
                        .into(),
                ));
            }
            *g = Some(self.span_setup(call)?);
        }
        Ok(g)
    }

    fn span_setup(&self, call: &'static str) -> Result<Span> {
        let layout = Layout::of(&self.node.node_of, self.rank);
        let cu = self.backend.as_cuda().expect("CUDA only");
        cu.bind()?;
        let direct_node = layout.peers[layout.node]
            .iter()
            .all(|&p| self.mem.slot_base(p).is_some());
        let api = nccl::load();
        let ids = api.as_ref().map_err(Clone::clone).and_then(|a| {
            let inter = (layout.node == 0).then(|| a.unique_id()).transpose()?;
            let all = (self.rank == 0).then(|| a.unique_id()).transpose()?;
            Ok((inter, all))
        });
        let hello = Hello {
            broken: ids.as_ref().err().cloned(),
            hier: self.cfg.nodes_algo == NodesAlgo::Auto && direct_node,
            free: !*self.teams.slots(),
            inter_id: ids.as_ref().ok().and_then(|i| i.0),
            all_id: ids.as_ref().ok().and_then(|i| i.1),
        };
        let parts = self.collective(
            call,
            "setup across nodes (NCCL)".into(),
            Some(&hello.encode()),
        )?;
        let all: Vec<Hello> = parts
            .iter()
            .enumerate()
            .map(|(r, p)| {
                Hello::decode(p).ok_or_else(|| {
                    Error::new(
                        Some(self.rank),
                        call,
                        ErrorKind::Bootstrap(format!("PE {r} sent a malformed setup message")),
                    )
                })
            })
            .collect::<Result<_>>()?;
        // Every PE decides from the same messages, so all fail alike or go on alike.
        if let Some((r, why)) = all
            .iter()
            .enumerate()
            .find_map(|(r, h)| h.broken.as_ref().map(|w| (r, w)))
        {
            return Err(unsupported(
                self.rank,
                call,
                format!(
                    "collectives across nodes run through NCCL, which PE {r} cannot use: {why}"
                ),
            ));
        }
        let api = api.map_err(|e| unsupported(self.rank, call, e))?;
        let hier = layout.ppn > 0 && all.iter().all(|h| h.hier);
        let node_team = if hier && layout.ppn > 1 {
            Some(self.make_node_team(call, &layout, &all)?)
        } else {
            None
        };
        let nccl_err = |e: String| {
            let kind = ErrorKind::Backend(format!("setting up NCCL across nodes: {e}"));
            // A PE whose communicator failed leaves the others waiting in theirs: fail the job.
            self.boot.fail_all(kind.clone());
            Error::new(Some(self.rank), call, kind)
        };
        let inter = if hier && layout.nodes > 1 {
            let id = all[layout.rank_of(0, layout.local)]
                .inter_id
                .expect("node 0's PEs sent ids");
            Some(Comm::init(api, layout.nodes, layout.node, &id).map_err(nccl_err)?)
        } else {
            None
        };
        let id = all[0].all_id.expect("PE 0 sent an id");
        let all_comm = Comm::init(api, self.world, self.rank, &id).map_err(nccl_err)?;
        let aborters: Vec<_> = inter
            .iter()
            .chain(std::iter::once(&all_comm))
            .map(Comm::aborter)
            .collect();
        // A failed job aborts the communicators, so no stream stays stuck in NCCL waiting for a
        // dead PE; the abort may take a while, so it runs on a thread of its own.
        self.health.on_fail(Box::new(move || {
            let a = aborters.clone();
            let _ = std::thread::Builder::new()
                .name("symheap-nccl-abort".into())
                .spawn(move || a.iter().for_each(nccl::Aborter::abort));
        }));
        Ok(Span {
            layout,
            hier,
            node_team,
            inter,
            all: all_comm,
            side: cu.create_stream()?,
            work: None,
            nccl: (api.version, api.path.clone()),
        })
    }

    /// This PE's node team: a team slot free on every PE of the node (each node picks its own
    /// from the slots every PE reported, and every PE checks every node has one, so all fail
    /// alike), owning the one-shot scratch (the world, which spans nodes, does not use it).
    fn make_node_team(&self, call: &'static str, layout: &Layout, all: &[Hello]) -> Result<Team> {
        let common = |node: usize| {
            layout.peers[node]
                .iter()
                .fold(!1u64, |m, &p| m & all[p].free)
                & ((1u64 << super::area::MAX_TEAMS) - 1)
        };
        if let Some(n) = (0..layout.nodes).find(|&n| common(n) == 0) {
            return Err(unsupported(
                self.rank,
                call,
                format!(
                    "no team slot is free on every PE of node {n}, which the collectives across \
                     nodes need (at most {} teams; destroy unused teams)",
                    super::area::MAX_TEAMS
                ),
            ));
        }
        let slot = common(layout.node).trailing_zeros() as usize;
        *self.teams.slots() |= 1 << slot;
        let (count, hash) = self.teams.world_team.lock().ledger.digest();
        let id = crate::util::fnv1a(
            &[u64::MAX, count, hash, layout.node as u64, slot as u64]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .max(1);
        let name = format!("node team {} (collectives across nodes)", layout.node);
        let members = layout.peers[layout.node].clone();
        let t = Arc::new(TeamInner::new(slot, members, layout.local, name, id).with_scratch(true));
        self.register_team(&t);
        self.init_device_team(&t)?;
        Ok(Team(Some(t)))
    }

    /// The workspace, at least `bytes` long: the one made so far, or a larger one (a
    /// collective allocation, which every PE makes in the same call with the same size). Not
    /// under CUDA graph capture, where a collective of a size not run eagerly before fails.
    pub(crate) fn span_work(
        &self,
        sp: &mut Span,
        bytes: u64,
        call: &'static str,
        stream: u64,
    ) -> Result<u64> {
        if let Some((addr, have)) = sp.work {
            if have >= bytes {
                return Ok(addr);
            }
        }
        let have = sp.work.map_or(0, |w| w.1);
        if driver::is_capturing(stream)? {
            return Err(unsupported(
                self.rank,
                call,
                format!(
                    "this collective across nodes stages {} through a workspace, larger than the \
                     {} made so far, which cannot grow while a CUDA graph is being captured: run \
                     it once at this size before capturing",
                    crate::util::human_bytes(bytes),
                    crate::util::human_bytes(have)
                ),
            ));
        }
        let want = bytes.max(2 * have).max(1 << 20);
        let b = self.allocate(want, 256, call)?;
        let own = self.mem.slot_base(self.rank).expect("own heap");
        sp.work = Some((own + b.offset, want));
        Ok(own + b.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_read_from_the_node_map() {
        let l = Layout::of(&[0, 0, 1, 1], 3);
        assert_eq!(
            (l.nodes, l.ppn, l.node, l.local, l.node_major),
            (2, 2, 1, 1, true)
        );
        assert_eq!(l.rank_of(1, 0), 2);
        // Round-robin placement: uniform, not node-major.
        let l = Layout::of(&[0, 1, 0, 1], 1);
        assert_eq!((l.ppn, l.node, l.local, l.node_major), (2, 1, 0, false));
        assert_eq!(l.peers, vec![vec![0, 2], vec![1, 3]]);
        // Uneven nodes: no PEs-per-node.
        let l = Layout::of(&[0, 0, 1], 2);
        assert_eq!(
            (l.nodes, l.ppn, l.node, l.local, l.node_major),
            (2, 0, 1, 0, false)
        );
        let l = Layout::of(&[0], 0);
        assert_eq!((l.nodes, l.ppn, l.node_major), (1, 1, true));
    }

    #[test]
    fn setup_messages_round_trip() {
        let h = Hello {
            broken: None,
            hier: true,
            free: 0xfff0,
            inter_id: Some([7; UNIQUE_ID_BYTES]),
            all_id: None,
        };
        let d = Hello::decode(&h.encode()).unwrap();
        assert_eq!(
            (d.hier, d.free, d.inter_id, d.all_id),
            (true, 0xfff0, h.inter_id, None)
        );
        assert!(d.broken.is_none());
        let h = Hello {
            broken: Some("cannot load libnccl.so.2".into()),
            hier: false,
            free: 1,
            inter_id: None,
            all_id: Some([9; UNIQUE_ID_BYTES]),
        };
        let d = Hello::decode(&h.encode()).unwrap();
        assert_eq!(d.broken.as_deref(), Some("cannot load libnccl.so.2"));
        assert_eq!(d.all_id, Some([9; UNIQUE_ID_BYTES]));
        assert!(Hello::decode(&[1, 2, 3]).is_none());
    }
}
