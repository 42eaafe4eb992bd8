//! The context: init and finalize, rank information, the heap, the ledger and host collective
//! points. Everything a PE does goes through one [`Context`].

mod banner;
mod buffer;

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use buffer::{PeerView, SymmetricBuffer};

use crate::backend::host::{HostBackend, SharedArea};
use crate::backend::{Backend, BackendKind};
use crate::bootstrap::{
    Bootstrap, LaunchEnv, Launcher, NodeChannel, NodeInfo, SingleBootstrap, TcpBootstrap,
};
use crate::config::{BackendChoice, Config, DebugLevel, DEFAULT_ALIGNMENT};
use crate::element::Element;
use crate::error::{err, invalid, Error, ErrorKind, Result};
use crate::heap::{align_up, Block, Heap, HeapState, RangeError};
use crate::ledger::human_bytes;
use crate::ops::area::SyncArea;
use crate::ops::team::TeamInner;
use crate::table::{PeerMask, SymmetricAddressMap};

/// How much of the heap is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapUsage {
    /// Bytes allocated and not yet reclaimed (block sizes rounded to the allocator's granule).
    pub in_use: u64,
    /// Bytes backed by memory.
    pub mapped: u64,
    /// Address space per PE (the most the heap can grow to).
    pub capacity: u64,
    /// Allocations not yet reclaimed.
    pub live_blocks: usize,
    /// Allocations so far that could not be placed at once and met the other PEs to reclaim
    /// released blocks or grow the heap (a host round trip each; the rest need no
    /// communication).
    pub allocation_syncs: u64,
    /// Released on this PE but not yet offered for reclaim: device work on the streams they
    /// were used on had not finished at the last look (see stream-ordered release).
    pub waiting_releases: usize,
}

pub(crate) struct Inner {
    pub(crate) cfg: Config,
    pub(crate) launcher: Launcher,
    pub(crate) token_is_secret: bool,
    /// How the PEs met, for the banner.
    pub(crate) rendezvous: String,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) boot: Arc<dyn Bootstrap>,
    pub(crate) node: NodeInfo,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) heap: Heap,
    /// The world team; its ledger records allocation, growth, reclaim, barriers and finalize.
    pub(crate) world_team: Arc<TeamInner>,
    /// Host shared memory for symheap's own synchronisation.
    pub(crate) control: SharedArea,
    /// Layout of the sync area inside `control`.
    pub(crate) area: SyncArea,
    /// Device collective state (CUDA backend only), set at init.
    pub(crate) dteams: std::sync::OnceLock<crate::ops::coll_stream::DeviceTeams>,
    /// Device barrier state (CUDA backend only), set at init.
    pub(crate) dsync: std::sync::OnceLock<crate::ops::stream::DeviceSync>,
    /// Team slots in use on this PE (bit 0: the world).
    pub(crate) slots_used: Mutex<u64>,
    /// The teams this PE belongs to (the world and live splits), for the watchdog.
    pub(crate) teams: Mutex<Vec<std::sync::Weak<TeamInner>>>,
    /// Where init's time went, for the banner (set once init is done).
    pub(crate) init_phases: std::sync::OnceLock<crate::util::Phases>,
    finalized: AtomicBool,
}

/// Builds a [`Context`] with settings other than the environment's.
#[derive(Clone)]
pub struct ContextBuilder {
    cfg: Config,
    bootstrap: Option<Arc<dyn Bootstrap>>,
}

impl ContextBuilder {
    /// Starts from the defaults overridden by the `SYMHEAP_*` environment.
    pub fn from_env() -> Result<ContextBuilder> {
        Ok(ContextBuilder {
            cfg: Config::from_env()?,
            bootstrap: None,
        })
    }

    /// Address space per PE: the most the heap can grow to.
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.cfg.capacity = bytes;
        self
    }

    /// Physical growth step.
    pub fn chunk_size(mut self, bytes: u64) -> Self {
        self.cfg.chunk_size = bytes;
        self
    }

    /// Limit on every wait (0.001 s to 1e9 s; `init` refuses others).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.cfg.timeout = t;
        self
    }

    /// Backend selection.
    pub fn backend(mut self, b: BackendChoice) -> Self {
        self.cfg.backend = b;
        self
    }

    /// Runs on a caller-provided rendezvous (for example one over torch.distributed's store)
    /// instead of reading the launcher environment.
    pub fn bootstrap(mut self, b: Arc<dyn Bootstrap>) -> Self {
        self.bootstrap = Some(b);
        self
    }

    /// Collective: every PE calls it once. Connects the PEs, maps the first heap chunk.
    pub fn init(self) -> Result<Context> {
        let mut cfg = self.cfg;
        if cfg.capacity == 0 || cfg.chunk_size == 0 {
            return Err(invalid("init", "capacity and chunk size must be positive"));
        }
        // The builder takes any Duration; the same range as SYMHEAP_TIMEOUT applies (a wait
        // limit near Duration::MAX would overflow every deadline).
        crate::config::timeout_from_secs(cfg.timeout.as_secs_f64()).map_err(|range| {
            invalid(
                "init",
                format!("timeout {:?} is out of range: {range}", cfg.timeout),
            )
        })?;
        let mut phases = crate::util::Phases::start();
        let (boot, launcher, token, token_is_secret, rendezvous): (Arc<dyn Bootstrap>, _, _, _, _) =
            match self.bootstrap {
                Some(b) => {
                    let token = format!("custom-bootstrap:{}", b.size()).into_bytes();
                    let what = "the caller's bootstrap".to_string();
                    (b, Launcher::TorchStyle, token, false, what)
                }
                None => {
                    let env = LaunchEnv::detect(&mut cfg)?;
                    let (b, what): (Arc<dyn Bootstrap>, String) = if env.world == 1 {
                        (
                            Arc::new(SingleBootstrap::new(cfg.timeout)),
                            "none (one PE)".into(),
                        )
                    } else {
                        let what = if env.one_node {
                            "a Unix socket in the runtime directory (every PE on this node)".into()
                        } else {
                            format!("TCP at {}:{}", env.addr, env.port)
                        };
                        (Arc::new(TcpBootstrap::connect(&env, cfg.timeout)?), what)
                    };
                    (
                        b,
                        env.launcher,
                        env.token.clone(),
                        env.token_is_secret,
                        what,
                    )
                }
            };
        let rank = boot.rank();
        let world = boot.size();
        let with_pe = |e: Error| e.with_pe(rank);
        phases.mark("rendezvous");

        let node = NodeInfo::discover(boot.as_ref()).map_err(with_pe)?;
        agree_on_settings(boot.as_ref(), &cfg).map_err(with_pe)?;
        let channel = NodeChannel::connect(boot.as_ref(), &node, &token).map_err(with_pe)?;
        let control = SharedArea::new(&node, &channel, boot.health(), rank, SyncArea::bytes(world))
            .map_err(with_pe)?;
        let area = SyncArea::new((0..world).map(|pe| control.base(pe)).collect());
        phases.mark("node");

        let use_cuda = match cfg.backend {
            BackendChoice::Host => false,
            BackendChoice::Cuda => true,
            BackendChoice::Auto => crate::backend::cuda::gpu_visible(),
        };
        phases.mark("probe");
        let backend: Arc<dyn Backend> = if use_cuda {
            // LOCAL_RANK as the launcher numbers it, else our own node-local rank.
            let local = std::env::var("LOCAL_RANK")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(node.local_rank);
            let device = crate::backend::cuda::choose_device(cfg.device, local).map_err(with_pe)?;
            Arc::new(
                crate::backend::cuda::CudaBackend::new(
                    boot.clone(),
                    node.clone(),
                    channel,
                    device,
                    &cfg,
                )
                .map_err(with_pe)?,
            )
        } else {
            Arc::new(
                HostBackend::new(boot.clone(), node.clone(), channel, cfg.capacity)
                    .map_err(with_pe)?,
            )
        };
        phases.mark("backend");
        agree_on_backend(boot.as_ref(), backend.as_ref()).map_err(with_pe)?;
        if let Some(cu) = backend.as_cuda() {
            cu.agree_protocols(cfg.topology).map_err(with_pe)?;
        }
        let inner = Arc::new(Inner {
            cfg,
            launcher,
            token_is_secret,
            rendezvous,
            rank,
            world,
            boot,
            node,
            backend,
            heap: Heap::new(world),
            world_team: Arc::new(TeamInner::new(
                0,
                (0..world).collect(),
                rank,
                "the world team".into(),
                0,
            )),
            control,
            area,
            dsync: std::sync::OnceLock::new(),
            dteams: std::sync::OnceLock::new(),
            slots_used: Mutex::new(1),
            teams: Mutex::new(Vec::new()),
            init_phases: std::sync::OnceLock::new(),
            finalized: AtomicBool::new(false),
        });
        let ctx = Context { inner };
        {
            let mut st = ctx.inner.lock_heap();
            let first = ctx.inner.grow_target(0, 1).ok_or_else(|| {
                invalid("init", "heap capacity is smaller than one page").with_pe(rank)
            })?;
            ctx.inner.grow(&mut st, first, first)?;
        }
        phases.mark("first chunk");
        ctx.inner.init_device_sync()?;
        ctx.inner.init_device_teams()?;
        phases.mark("device state");
        ctx.barrier_all()?;
        phases.mark("barrier");
        ctx.inner.register_team(&ctx.inner.world_team);
        if ctx.inner.backend.as_cuda().is_some() {
            crate::ops::watch::start_watchdog(&ctx.inner);
        }
        let _ = ctx.inner.init_phases.set(phases);
        if ctx.inner.cfg.debug >= DebugLevel::Info {
            eprintln!("{}", ctx.banner());
        }
        tracing::debug!(rank, world, "symheap context ready");
        Ok(ctx)
    }
}

/// Collective at init: every PE describes a setting in `mine`; if any PE's description differs
/// from PE 0's, every PE fails with both named (`what` says what differs and how to fix it).
fn agree(boot: &dyn Bootstrap, label: &str, what: &str, mine: &str) -> Result<()> {
    let all = boot.all_gather(label, mine.as_bytes())?;
    if let Some((r, other)) = all.iter().enumerate().find(|(_, s)| *s != &all[0]) {
        let msg = format!(
            "{what}: PE 0 has {}, PE {r} has {}",
            String::from_utf8_lossy(&all[0]),
            String::from_utf8_lossy(other)
        );
        boot.health()
            .fail(ErrorKind::CollectiveMismatch(msg.clone()));
        return Err(err("init", ErrorKind::CollectiveMismatch(msg)));
    }
    Ok(())
}

/// Every PE must run with the same heap geometry, or the heap is not symmetric.
fn agree_on_settings(boot: &dyn Bootstrap, cfg: &Config) -> Result<()> {
    let mine = format!(
        "capacity {} | chunk size {} | backend {:?}",
        human_bytes(cfg.capacity),
        human_bytes(cfg.chunk_size),
        cfg.backend
    );
    agree(
        boot,
        "init settings",
        "PEs run with different heap settings (SYMHEAP_HEAP_CAPACITY, SYMHEAP_CHUNK_SIZE, SYMHEAP_BACKEND)",
        &mine,
    )
}

/// Every PE must have picked the same backend with the same granularity and capacity (under
/// `SYMHEAP_BACKEND=auto`, PEs that see different hardware would not).
fn agree_on_backend(boot: &dyn Bootstrap, be: &dyn Backend) -> Result<()> {
    let mine = format!(
        "{} backend, granularity {}, capacity {}",
        be.kind().name(),
        human_bytes(be.granularity()),
        human_bytes(be.capacity())
    );
    agree(
        boot,
        "init backend",
        "PEs chose different backends (set SYMHEAP_BACKEND)",
        &mine,
    )
}

impl Inner {
    fn lock_heap(&self) -> MutexGuard<'_, HeapState> {
        self.heap.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn check(&self, call: &'static str) -> Result<()> {
        self.boot.health().check(self.rank, call)
    }

    fn record(&self, call: &str, args: String) {
        self.record_on(&self.world_team, call, args);
    }

    /// A host collective point: exchanges the ledger (failing every PE on divergence) and the
    /// releases (reclaiming what every PE released), plus `payload`. Returns every PE's payload.
    fn sync_point(
        &self,
        st: &mut HeapState,
        call: &'static str,
        payload: &[u8],
    ) -> Result<Vec<Vec<u8>>> {
        // Every PE meets at the shared-memory barrier first, whatever it exchanges next: a PE
        // in a different call meets it there too and the mismatch is named, instead of one PE
        // waiting on the bootstrap while another waits on the barrier.
        if self.world_fast_sync(call)? && payload.is_empty() {
            return Ok(Vec::new());
        }
        let ledger = self.world_team.ledger().encode();
        self.poll_releases();
        let releases = self.heap.take_releases();
        let mut msg = Vec::with_capacity(ledger.len() + releases.len() + payload.len() + 8);
        for part in [&ledger, &releases] {
            msg.extend_from_slice(&(part.len() as u32).to_le_bytes());
            msg.extend_from_slice(part);
        }
        msg.extend_from_slice(payload);
        fence(Ordering::SeqCst);
        let parts = self
            .boot
            .all_gather(call, &msg)
            .map_err(|e| e.during(call).with_pe(self.rank))?;
        fence(Ordering::SeqCst);
        let mut ledgers = Vec::with_capacity(parts.len());
        let mut rels = Vec::with_capacity(parts.len());
        let mut payloads = Vec::with_capacity(parts.len());
        for (r, p) in parts.iter().enumerate() {
            let (l, rest) = split_part(p).ok_or_else(|| garbled(self.rank, call, r))?;
            let (rl, rest) = split_part(rest).ok_or_else(|| garbled(self.rank, call, r))?;
            ledgers.push(l);
            rels.push(rl);
            payloads.push(rest.to_vec());
        }
        let verdict = self.world_team.ledger().compare(&ledgers);
        if let Err(msg) = verdict {
            let kind = ErrorKind::CollectiveMismatch(msg);
            // Every PE computes the same verdict from the same bytes, so nobody needs telling;
            // recording it poisons this context so no later call runs on a diverged heap.
            self.boot.health().fail(kind.clone());
            return Err(Error::new(Some(self.rank), call, kind));
        }
        self.heap.apply_releases(st, &rels);
        Ok(payloads)
    }

    /// A host collective point for `call`: records `call(args)` in the world ledger, then
    /// exchanges ledgers (failing every PE, with the first differing call named, when they
    /// diverged), reclaims what every PE released, and gathers `payload` from every PE (an
    /// empty payload may come back as an empty vector). Every PE must reach it, in the same
    /// order as its other collective calls; a PE that does not is named by the timeout error.
    pub(crate) fn collective(
        &self,
        call: &'static str,
        args: String,
        payload: &[u8],
    ) -> Result<Vec<Vec<u8>>> {
        self.check(call)?;
        let mut st = self.lock_heap();
        self.record(call, args);
        self.sync_point(&mut st, call, payload)
    }

    /// The heap size to grow to so that a block ending at `need_end` fits: whole chunks when
    /// they fit under the capacity, the exact need otherwise. None when even that does not fit.
    fn grow_target(&self, mapped: u64, need_end: u64) -> Option<u64> {
        let g = self.backend.granularity();
        let cap = self.backend.capacity();
        let chunk = align_up(self.cfg.chunk_size, g)?;
        let exact = align_up(need_end, g)?;
        let whole = align_up(need_end.max(mapped.checked_add(chunk)?), g)?;
        if whole <= cap {
            Some(whole)
        } else if exact <= cap {
            Some(cap.min(whole).max(exact))
        } else {
            None
        }
    }

    /// Collective: every PE's heap grows to `target` bytes, or none does. A PE that cannot get
    /// the memory makes every PE fail with the same OutOfMemory error naming it (`requested`:
    /// the allocation the growth is for) instead of leaving them waiting for its handles.
    fn grow(&self, st: &mut HeapState, target: u64, requested: u64) -> Result<()> {
        let from = self.backend.mapped();
        self.record(
            "grow",
            format!("{} to {}", human_bytes(from), human_bytes(target)),
        );
        const CALL: &str = "allocate (heap growth)";
        let (in_use, cap) = (st.in_use(), self.backend.capacity());
        let vote = |mine: Option<&Error>| -> Result<()> {
            // A ballot is 0 when this PE got its memory, else 1 and why not.
            let mut ballot = vec![u8::from(mine.is_some())];
            if let Some(e) = mine {
                ballot.extend_from_slice(e.kind().to_string().as_bytes());
            }
            let all = self
                .boot
                .all_gather(CALL, &ballot)
                .map_err(|e| e.during(CALL).with_pe(self.rank))?;
            let short: Vec<String> = all
                .iter()
                .enumerate()
                .filter(|(_, b)| b.first() != Some(&0))
                .map(|(pe, b)| {
                    format!("PE {pe}: {}", String::from_utf8_lossy(&b[b.len().min(1)..]))
                })
                .collect();
            if short.is_empty() {
                return Ok(());
            }
            Err(Error::new(
                Some(self.rank),
                CALL,
                ErrorKind::OutOfMemory {
                    requested,
                    in_use,
                    capacity: cap,
                    hint: format!(
                        "growing every PE's heap by {} failed on {}; no PE grew. Free memory there or lower SYMHEAP_CHUNK_SIZE",
                        human_bytes(target - from),
                        short.join("; ")
                    ),
                },
            ))
        };
        self.backend
            .grow(target, &vote)
            .map_err(|e| match e.kind() {
                ErrorKind::OutOfMemory { .. } => e,
                _ => e.during(CALL).with_pe(self.rank),
            })?;
        st.extend(target);
        tracing::debug!(rank = self.rank, from, to = target, "symmetric heap grew");
        Ok(())
    }

    /// Collective: an allocation for symheap's own state (device tables): users' addresses never
    /// reach it.
    pub(crate) fn allocate_internal(&self, bytes: u64, align: u64) -> Result<Block> {
        let b = self.allocate(bytes, align, "init")?;
        self.lock_heap().mark_internal(b.id);
        Ok(b)
    }

    pub(crate) fn allocate(&self, bytes: u64, align: u64, call: &'static str) -> Result<Block> {
        self.check(call)?;
        if bytes == 0 {
            return Err(invalid(call, "size must be at least 1 byte").with_pe(self.rank));
        }
        if !align.is_power_of_two() {
            return Err(
                invalid(call, format!("alignment {align} is not a power of two"))
                    .with_pe(self.rank),
            );
        }
        let cap = self.backend.capacity();
        if align > cap {
            return Err(invalid(
                call,
                format!(
                    "alignment {align} exceeds the heap capacity {}",
                    human_bytes(cap)
                ),
            )
            .with_pe(self.rank));
        }
        let mut st = self.lock_heap();
        self.record("allocate", format!("{}, align {align}", human_bytes(bytes)));
        // The allocation's own peer table lives right after it, so device code can be handed a
        // table in device memory without a separate allocation.
        let span = align_up(bytes, 16).and_then(|b| b.checked_add(8 * self.world as u64));
        let Some(span) = span else {
            return Err(invalid(call, "size overflows").with_pe(self.rank));
        };
        let oom = |st: &HeapState| {
            Error::new(
                Some(self.rank),
                call,
                ErrorKind::OutOfMemory {
                    requested: bytes,
                    in_use: st.in_use(),
                    capacity: cap,
                    hint: "raise SYMHEAP_HEAP_CAPACITY (or ContextBuilder::capacity) or free buffers on every PE".into(),
                },
            )
        };
        if span > cap {
            return Err(oom(&st));
        }
        let block = match st.try_alloc(bytes, span, align) {
            Some(b) => b,
            None => {
                // Would grow or fail: first reclaim what every PE has released, and learn
                // whether every PE could spare a chunk of headroom.
                st.note_allocation_sync();
                let chunk = align_up(self.cfg.chunk_size, self.backend.granularity())
                    .ok_or_else(|| oom(&st))?;
                let spare = [u8::from(self.backend.can_spare(chunk))];
                let votes = self.sync_point(&mut st, call, &spare)?;
                match st.try_alloc(bytes, span, align) {
                    Some(b) => {
                        // Reclaiming made just enough room: with frees and allocations
                        // alternating, every further allocation would meet the other PEs
                        // again (one host round trip each). Half a chunk left free keeps
                        // that to one in many. Every PE decides alike: same heap, same votes.
                        let mapped = self.backend.mapped();
                        let all_spare =
                            !votes.is_empty() && votes.iter().all(|v| v.as_slice() == [1]);
                        if all_spare
                            && st.free_bytes() < chunk / 2
                            && mapped.checked_add(chunk).is_some_and(|t| t <= cap)
                        {
                            match self.grow(&mut st, mapped + chunk, bytes) {
                                // The allocation fits without the headroom, and every PE saw
                                // the same ballots, so every PE goes on without it alike.
                                Err(e) if matches!(e.kind(), ErrorKind::OutOfMemory { .. }) => {
                                    tracing::debug!(rank = self.rank, "no heap headroom: {e}");
                                }
                                r => r?,
                            }
                        }
                        b
                    }
                    None => {
                        let need = st.end_needed_for(span, align).ok_or_else(|| oom(&st))?;
                        let mapped = self.backend.mapped();
                        let target = self.grow_target(mapped, need).ok_or_else(|| oom(&st))?;
                        self.grow(&mut st, target, bytes)?;
                        st.try_alloc(bytes, span, align).ok_or_else(|| oom(&st))?
                    }
                }
            }
        };
        drop(st);
        self.write_table(&block)?;
        Ok(block)
    }

    /// Writes `block`'s peer table into its trailer (this PE's copy).
    fn write_table(&self, block: &Block) -> Result<()> {
        let own = self.backend.slot_base(self.rank).expect("own heap");
        let table: Vec<u8> = (0..self.world)
            .flat_map(|pe| {
                self.backend
                    .slot_base(pe)
                    .map_or(0, |b| b + block.offset)
                    .to_le_bytes()
            })
            .collect();
        self.backend
            .write_bytes(own + table_offset(block), &table)
            .map_err(|e| e.during("allocate").with_pe(self.rank))
    }

    /// Checks `[addr, addr+len)` lies in one live user allocation of a directly reachable PE's
    /// heap (any PE's copy: the heaps are symmetric, so this PE's allocator knows every PE's
    /// allocations); returns that PE.
    /// `read` also admits an allocation's own peer table (its trailer), which is documented as
    /// readable ([`SymmetricBuffer::peer_bases_addr`]); nothing may write it.
    fn locate(&self, addr: u64, len: u64, read: bool, call: &'static str) -> Result<usize> {
        let mapped = self.backend.mapped();
        for pe in 0..self.world {
            if let Some(base) = self.backend.slot_base(pe) {
                if addr >= base && addr < base + mapped {
                    let off = addr - base;
                    return match self.user_range(pe, off, len, call) {
                        Ok(_) => Ok(pe),
                        Err(_) if read && self.in_user_table(off, len) => Ok(pe),
                        Err(e) => Err(e),
                    };
                }
            }
        }
        Err(invalid(
            call,
            format!("address {addr:#x} is not in the symmetric heap of any directly reachable PE"),
        )
        .with_pe(self.rank))
    }

    /// Whether `[off, off + len)` lies in the peer table of a live user allocation.
    fn in_user_table(&self, off: u64, len: u64) -> bool {
        let st = self.lock_heap();
        let Some(b) = st.block_before(off) else {
            return false;
        };
        let t = table_offset(&b);
        !st.is_internal(b.id)
            && !self.heap.is_freed_here(b.id)
            && off >= t
            && off.saturating_add(len) <= t + 8 * self.world as u64
    }

    /// Checks `[off, off+bytes)` of the heap is a range of one live user allocation (not freed
    /// on this PE, not symheap's own), naming what is wrong otherwise; `pe` is whose copy the
    /// address was in, for the message.
    fn user_range(&self, pe: usize, off: u64, bytes: u64, call: &'static str) -> Result<Block> {
        let base = self.backend.slot_base(pe).unwrap_or(0);
        let addr = base + off;
        let st = self.lock_heap();
        let whose = if pe == self.rank {
            "this PE's".to_string()
        } else {
            format!("PE {pe}'s")
        };
        let why = match self.heap.user_block(&st, off, bytes) {
            Ok(b) => return Ok(b),
            Err(RangeError::NotAllocated) => format!(
                "address {addr:#x} is in {whose} symmetric heap but not in a live allocation"
            ),
            Err(RangeError::Freed(b)) => format!(
                "address {addr:#x} is in a {}-byte allocation (at {:#x}) that was freed on this PE; nothing made from a freed buffer may be used",
                b.bytes,
                base + b.offset
            ),
            Err(RangeError::Internal) => format!(
                "address {addr:#x} is in symheap's own state, not in an allocation of yours"
            ),
            Err(RangeError::PastEnd(b)) => format!(
                "{bytes} bytes at {addr:#x} run past the end of their {}-byte allocation (which starts at {:#x})",
                b.bytes,
                base + b.offset
            ),
        };
        Err(invalid(call, why).with_pe(self.rank))
    }

    /// Checks `[addr, addr+bytes)` lies inside one live user allocation of this PE's heap and
    /// returns its heap offset.
    pub(crate) fn own_offset(&self, addr: u64, bytes: u64, call: &'static str) -> Result<u64> {
        let base = self
            .backend
            .slot_base(self.rank)
            .expect("own heap is always mapped");
        let mapped = self.backend.mapped();
        if addr < base || addr >= base + mapped {
            return Err(invalid(
                call,
                format!(
                    "address {addr:#x} is not in this PE's symmetric heap ({base:#x}..{:#x})",
                    base + mapped
                ),
            )
            .with_pe(self.rank));
        }
        let off = addr - base;
        self.user_range(self.rank, off, bytes, call)?;
        Ok(off)
    }

    /// Releases block `id` on this PE (never blocks): at once refused to every access here,
    /// and announced to the other PEs (for reclaim) once the device work that may still use it
    /// has finished: a fence over the streams it was used on, checked at every collective point
    /// without waiting, so a `del x` right after an asynchronous collective cannot let any PE
    /// reuse the memory while kernels still read or write it.
    pub(crate) fn release_block(&self, id: crate::heap::BlockId) {
        self.heap.mark_freed(id);
        let streams = self.heap.take_uses(id);
        match self.backend.fence_streams(&streams) {
            Some(f) => self.heap.defer(id, f),
            None => self.heap.announce(id),
        }
    }

    /// Notes that device work on `stream` uses the live block at heap offset `off`.
    pub(crate) fn note_stream(&self, off: u64, stream: u64) {
        if self.backend.as_cuda().is_none() {
            return;
        }
        if let Some(b) = self.lock_heap().block_at(off) {
            self.heap.note_use(b.id, stream);
        }
    }

    /// Notes that device work on `stream` uses the live block holding this-PE address `addr`,
    /// if any (a local source or destination outside the heap is nobody's block).
    pub(crate) fn note_stream_addr(&self, addr: u64, stream: u64) {
        if let Some(base) = self.backend.slot_base(self.rank) {
            if addr >= base && addr < base + self.backend.mapped() {
                self.note_stream(addr - base, stream);
            }
        }
    }

    /// Announces released blocks whose device work has finished (at collective points).
    pub(crate) fn poll_releases(&self) {
        if self.heap.deferred_count() == 0 {
            return;
        }
        if let Some(cu) = self.backend.as_cuda() {
            if cu.bind().is_err() {
                return;
            }
        }
        self.heap.poll_deferred();
    }

    /// A collective's ledger arguments with the heap offsets of its buffers appended: the same
    /// symmetric buffer is at the same offset on every PE, so a PE that passes a different
    /// buffer of the same size is a named mismatch instead of a silent wrong result.
    pub(crate) fn coll_args(&self, args: String, dest: u64, src: u64) -> String {
        let base = self.backend.slot_base(self.rank).unwrap_or(0);
        let end = base + self.backend.mapped();
        // An address outside the heap (refused later) is shown as given, the same on every PE
        // that passes the same value, instead of as an offset that differs per PE.
        let at = |a: u64| {
            if (base..end).contains(&a) {
                format!("heap+{:#x}", a - base)
            } else {
                format!("{a:#x} (not in the heap)")
            }
        };
        if dest == src {
            format!("{args}, in place at {}", at(dest))
        } else {
            format!("{args}, dest {}, src {}", at(dest), at(src))
        }
    }

    /// PE `pe`'s copy of the symmetric range `[addr, addr+bytes)` of this PE's heap.
    pub(crate) fn remote(
        &self,
        addr: u64,
        bytes: u64,
        pe: usize,
        call: &'static str,
    ) -> Result<u64> {
        self.pe_in_range(pe, call)?;
        let off = self.own_offset(addr, bytes, call)?;
        match self.backend.slot_base(pe) {
            Some(b) => Ok(b + off),
            None => Err(Error::new(
                Some(self.rank),
                call,
                ErrorKind::Unsupported(format!(
                    "PE {pe} is on another node; the {} backend reaches only PEs of this node",
                    self.backend.kind().name()
                )),
            )),
        }
    }

    pub(crate) fn pe_in_range(&self, pe: usize, call: &'static str) -> Result<()> {
        if pe >= self.world {
            return Err(invalid(
                call,
                format!("PE {pe} is out of range (n_pes = {})", self.world),
            )
            .with_pe(self.rank));
        }
        Ok(())
    }

    fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.check("finalize")?;
        // Device work still running, or a device-side wait that gave up unreported, is this
        // PE's failure: it is reported here (and to every PE) instead of lost at exit.
        if let Some(cu) = self.backend.as_cuda() {
            if let Err(e) = cu.finish_device_work() {
                self.boot.fail_all(e.kind().clone());
                return Err(e.during("finalize").with_pe(self.rank));
            }
        }
        let mut st = self.lock_heap();
        self.record("finalize", String::new());
        self.sync_point(&mut st, "finalize", &[])?;
        drop(st);
        self.boot.finalize().map_err(|e| e.during("finalize"))
    }
}

/// Where a block's trailer table starts, relative to the heap base.
pub(crate) fn table_offset(b: &Block) -> u64 {
    b.offset + b.bytes.div_ceil(16) * 16
}

fn split_part(p: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
    let rest = &p[4..];
    (rest.len() >= n).then(|| rest.split_at(n))
}

fn garbled(rank: usize, call: &'static str, from: usize) -> Error {
    Error::new(
        Some(rank),
        call,
        ErrorKind::Bootstrap(format!("PE {from} sent a malformed collective message")),
    )
}

/// A PE's handle on the job: rank information, the symmetric heap, and collective calls.
///
/// Collective-order rule: the calls documented as collective (init, allocation, barrier,
/// finalize, and later the team and collective operations) must be made by every PE in the
/// same order with the same arguments. symheap checks this at every host collective point and
/// fails every PE with the first differing call named.
///
/// Dropping a context finalizes it (collectively); dropping it while panicking aborts the job
/// instead, so the other PEs fail at once rather than wait.
pub struct Context {
    pub(crate) inner: Arc<Inner>,
}

impl Context {
    /// Collective: joins the job described by the environment (torchrun, `symheap launch`,
    /// Open MPI, Slurm, or nothing for a single PE). Same as `ContextBuilder::from_env()?.init()`.
    pub fn init() -> Result<Context> {
        ContextBuilder::from_env()?.init()
    }

    /// Settings other than the environment's.
    pub fn builder() -> Result<ContextBuilder> {
        ContextBuilder::from_env()
    }

    /// This PE's rank.
    pub fn my_pe(&self) -> usize {
        self.inner.rank
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> usize {
        self.inner.world
    }

    /// This PE's index among the PEs of its node.
    pub fn local_rank(&self) -> usize {
        self.inner.node.local_rank
    }

    /// Number of PEs on this node.
    pub fn local_size(&self) -> usize {
        self.inner.node.local_size()
    }

    /// Node membership.
    pub fn node(&self) -> &NodeInfo {
        &self.inner.node
    }

    /// The backend this context runs on.
    pub fn backend_kind(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// The CUDA backend, for CUDA-specific calls (user kernels, streams); None on the host
    /// backend.
    pub fn cuda(&self) -> Option<&crate::backend::cuda::CudaBackend> {
        self.inner.backend.as_cuda()
    }

    /// The settings in effect.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Collective: allocates `bytes` with the default 256-byte alignment.
    /// Contents are unspecified; a peer may write only after a barrier.
    pub fn malloc(&self, bytes: u64) -> Result<SymmetricBuffer> {
        self.allocate_bytes(bytes, DEFAULT_ALIGNMENT)
    }

    /// Collective: allocates `count × size` bytes and zeroes this PE's copy. Peers must still
    /// reach a barrier before writing into it.
    pub fn calloc(&self, count: u64, size: u64) -> Result<SymmetricBuffer> {
        let bytes = count
            .checked_mul(size)
            .ok_or_else(|| invalid("calloc", "count x size overflows").with_pe(self.my_pe()))?;
        let b = self.allocate_bytes(bytes, DEFAULT_ALIGNMENT)?;
        b.fill_zero()?;
        Ok(b)
    }

    /// Collective: allocates `bytes` aligned to `alignment` (any power of two).
    pub fn align(&self, alignment: u64, bytes: u64) -> Result<SymmetricBuffer> {
        self.allocate_bytes(bytes, alignment)
    }

    /// Collective: allocates `bytes` aligned to `alignment`. Allocation needs no communication
    /// unless the heap must grow or reclaim; it is not a synchronisation point.
    ///
    /// Fails with [`ErrorKind::OutOfMemory`] on every PE alike when the request does not fit
    /// the heap's capacity, or when some PE could not get the memory to grow its heap (the
    /// error names it; no PE's heap grows and the context stays usable).
    pub fn allocate_bytes(&self, bytes: u64, alignment: u64) -> Result<SymmetricBuffer> {
        let block = self.inner.allocate(bytes, alignment, "allocate")?;
        Ok(SymmetricBuffer::new(self.inner.clone(), block))
    }

    /// Collective: the contract. Allocates `count` elements of `T` and returns the buffer and
    /// its peer table (`peer_bases[my_pe()] == buffer.addr()`, 0 for PEs not directly
    /// addressable).
    pub fn allocate_symmetric<T: Element>(
        &self,
        count: usize,
    ) -> Result<(SymmetricBuffer, Vec<u64>)> {
        let bytes = (count as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .ok_or_else(|| invalid("allocate_symmetric", "size overflows").with_pe(self.my_pe()))?;
        let block = self
            .inner
            .allocate(bytes, DEFAULT_ALIGNMENT, "allocate_symmetric")?;
        let b = SymmetricBuffer::new(self.inner.clone(), block);
        let t = b.peer_bases();
        Ok((b, t))
    }

    /// Collective: like `allocate_symmetric`, returning the richer address map.
    pub fn allocate_symmetric_map<T: Element>(
        &self,
        count: usize,
    ) -> Result<(SymmetricBuffer, SymmetricAddressMap)> {
        let (b, _) = self.allocate_symmetric::<T>(count)?;
        let m = b.address_map();
        Ok((b, m))
    }

    /// Start of every PE's heap in this process (0 where not directly addressable).
    pub fn heap_bases(&self) -> Vec<u64> {
        (0..self.inner.world)
            .map(|pe| self.inner.backend.slot_base(pe).unwrap_or(0))
            .collect()
    }

    /// PEs whose heaps this process can load from and store to directly.
    pub fn direct_peers(&self) -> PeerMask {
        let mut m = PeerMask::new(self.inner.world);
        for pe in 0..self.inner.world {
            if self.inner.backend.slot_base(pe).is_some() {
                m.set(pe);
            }
        }
        m
    }

    /// Whether `addr` lies in this PE's own mapped heap.
    pub fn is_symmetric(&self, addr: u64) -> bool {
        match self.inner.backend.slot_base(self.inner.rank) {
            Some(base) => addr >= base && addr < base + self.inner.backend.mapped(),
            None => false,
        }
    }

    /// Checks that `[addr, addr + bytes)` lies in one live allocation of this PE's heap made by
    /// the caller (not released on this PE, not symheap's own state); the error says which of
    /// those it is not.
    pub fn check_symmetric(&self, addr: u64, bytes: u64) -> Result<()> {
        self.inner.check("check_symmetric")?;
        self.inner
            .own_offset(addr, bytes.max(1), "check_symmetric")
            .map(drop)
    }

    /// Translates `addr`, an address in PE `from`'s heap, to the same byte of PE `to`'s heap.
    /// `Ok(None)` when PE `to` is not directly addressable from here.
    pub fn translate(&self, addr: u64, from: usize, to: usize) -> Result<Option<u64>> {
        const CALL: &str = "translate";
        self.inner.pe_in_range(from, CALL)?;
        self.inner.pe_in_range(to, CALL)?;
        let Some(fb) = self.inner.backend.slot_base(from) else {
            return Err(invalid(
                CALL,
                format!("PE {from}'s heap is not directly addressable from this PE"),
            )
            .with_pe(self.my_pe()));
        };
        let mapped = self.inner.backend.mapped();
        if addr < fb || addr >= fb + mapped {
            return Err(invalid(
                CALL,
                format!("address {addr:#x} is not in PE {from}'s symmetric heap"),
            )
            .with_pe(self.my_pe()));
        }
        Ok(self.inner.backend.slot_base(to).map(|tb| tb + (addr - fb)))
    }

    /// Stores `data` at heap address `addr` of any directly addressable PE (for example an
    /// address from a peer table or `translate`). Not ordered with other PEs' accesses:
    /// synchronise with a barrier or a signal.
    pub fn write_at<T: Element>(&self, addr: u64, data: &[T]) -> Result<()> {
        self.inner.check("write_at")?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.inner
            .locate(addr, bytes.len() as u64, false, "write_at")?;
        self.inner.backend.write_bytes(addr, bytes)
    }

    /// Loads from heap address `addr` of any directly addressable PE into `out`.
    pub fn read_at<T: Element>(&self, addr: u64, out: &mut [T]) -> Result<()> {
        self.inner.check("read_at")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.inner
            .locate(addr, bytes.len() as u64, true, "read_at")?;
        self.inner.backend.read_bytes(addr, bytes)
    }

    /// Collective: returns once every PE has called it; all memory operations issued before it
    /// on any PE are visible after it on every PE. Also a point where the ledger is checked and
    /// released buffers are reclaimed.
    pub fn barrier_all(&self) -> Result<()> {
        self.inner
            .collective("barrier_all", String::new(), &[])
            .map(|_| ())
    }

    /// Collective: every PE contributes `data`, every PE gets all contributions in rank order.
    /// A host-side exchange for small control data (seeds, sizes, pickled objects), ledger-
    /// checked; the contributions may differ in length (gathering them is what it is for).
    pub fn all_gather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.inner
            .collective("all_gather_bytes", String::new(), data)
    }

    /// Heap occupancy on this PE (the same on every PE at collective points).
    pub fn heap_usage(&self) -> HeapUsage {
        let st = self.inner.lock_heap();
        HeapUsage {
            in_use: st.in_use(),
            mapped: self.inner.backend.mapped(),
            capacity: self.inner.backend.capacity(),
            live_blocks: st.live_blocks(),
            allocation_syncs: st.allocation_syncs(),
            waiting_releases: self.inner.heap.deferred_count(),
        }
    }

    /// Not collective: makes every PE fail with `reason` (they notice within milliseconds).
    pub fn abort(&self, reason: &str) {
        self.inner.boot.abort(reason);
    }

    /// The diagnostic banner: version, backend, PEs, node, heap layout, environment read.
    pub fn banner(&self) -> String {
        banner::render(&self.inner)
    }

    /// Collective: leaves the job. Buffers stay readable in this process until dropped, but
    /// every later symheap call fails with `Finalized`.
    pub fn finalize(&self) -> Result<()> {
        self.inner.finalize()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.inner
                .boot
                .abort(&format!("PE {} panicked", self.inner.rank));
            return;
        }
        if let Err(e) = self.inner.finalize() {
            tracing::debug!("finalize on drop: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builder_timeout_out_of_range_is_refused_not_a_panic() {
        for t in [
            Duration::MAX,
            Duration::from_secs(u64::MAX / 2),
            Duration::ZERO,
        ] {
            let e = ContextBuilder {
                cfg: Config::default(),
                bootstrap: Some(Arc::new(crate::bootstrap::SingleBootstrap::new(
                    Duration::from_secs(5),
                ))),
            }
            .timeout(t)
            .init()
            .err()
            .expect("out of range");
            assert!(
                matches!(e.kind(), ErrorKind::InvalidArgument(m) if m.contains("0.001 to 1e9")),
                "{e}"
            );
        }
    }
}
