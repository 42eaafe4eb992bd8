//! Init: the builder, the rendezvous, the node, the backend, and the settings every PE must
//! agree on.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use super::comms::Comms;
use super::memory::Memory;
use super::teams::Teams;
use super::{Context, Inner};
use crate::backend::host::HostBackend;
use crate::backend::shared::SharedArea;
use crate::backend::{AnyBackend, Backend};
use crate::bootstrap::{
    Bootstrap, LaunchEnv, Launcher, NodeChannel, NodeInfo, SingleBootstrap, TcpBootstrap,
};
use crate::config::{BackendChoice, Config, DebugLevel};
use crate::context::area::SyncArea;
use crate::context::team::TeamInner;
use crate::error::{err, invalid, Error, ErrorKind, Result};
use crate::util::human_bytes;

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

    /// The CUDA device ordinal this PE runs on (instead of `SYMHEAP_DEVICE`, else LOCAL_RANK
    /// modulo the device count); `init` refuses one that is not visible. Ignored on the host
    /// backend.
    pub fn device(mut self, ordinal: usize) -> Self {
        self.cfg.device = Some(ordinal);
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
        let met = rendezvous(&mut cfg, self.bootstrap)?;
        phases.mark("rendezvous");
        let (rank, world) = (met.boot.rank(), met.boot.size());
        let with_pe = |e: Error| e.with_pe(rank);
        let boot = met.boot.as_ref();
        let node = NodeInfo::discover(boot).map_err(with_pe)?;
        agree_on_settings(boot, &cfg).map_err(with_pe)?;
        let channel = NodeChannel::connect(boot, &node, &met.token).map_err(with_pe)?;
        let control = SharedArea::new(&node, &channel, boot, rank, SyncArea::bytes(world))
            .map_err(with_pe)?;
        let area = SyncArea::new((0..world).map(|pe| control.base(pe)).collect());
        phases.mark("node");
        let backend =
            open_backend(&met.boot, &node, channel, &cfg, &mut phases).map_err(with_pe)?;
        phases.mark("backend");
        agree_on_backend(boot, &*backend).map_err(with_pe)?;
        if let Some(cu) = backend.as_cuda() {
            cu.agree_protocols(cfg.topology).map_err(with_pe)?;
        }
        let spin = super::spin::SpinBudget::new(node.local_size());
        let all_direct = (0..world).all(|pe| backend.slot_base(pe).is_some());
        let own_base = backend.slot_base(rank).ok_or_else(|| {
            with_pe(crate::error::backend(
                "init",
                "the backend did not map this PE's own heap",
            ))
        })?;
        let bases = (0..world).map(|pe| backend.slot_base(pe)).collect();
        let inner = Arc::new(Inner {
            spin,
            cfg,
            launcher: met.launcher,
            token_source: met.token_source,
            rendezvous: met.what,
            rank,
            world,
            health: met.boot.health().clone(),
            boot: met.boot,
            node,
            backend,
            control,
            area,
            init_phases: std::sync::OnceLock::new(),
            finalized: AtomicBool::new(false),
            mem: Memory::new(world, bases, own_base),
            teams: Teams::new(
                TeamInner::new(0, (0..world).collect(), rank, "the world team".into(), 0)
                    .with_scratch(all_direct),
            ),
            comms: Comms::default(),
        });
        finish(Context { inner }, phases)
    }
}

// Made here, where a context is made: the context's module does not name its builder.
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
}

/// How the PEs met: the bootstrap, who launched them, the job token, and a description for
/// the banner.
struct Met {
    boot: Arc<dyn Bootstrap>,
    launcher: Launcher,
    token: Vec<u8>,
    token_source: String,
    what: String,
}

/// Collective: the rendezvous (the caller's bootstrap, or the launcher environment's).
fn rendezvous(cfg: &mut Config, given: Option<Arc<dyn Bootstrap>>) -> Result<Met> {
    if let Some(b) = given {
        return Ok(Met {
            token: format!("custom-bootstrap:{}", b.size()).into_bytes(),
            boot: b,
            launcher: Launcher::TorchStyle,
            token_source: "the caller's bootstrap (no rendezvous token)".into(),
            what: "the caller's bootstrap".into(),
        });
    }
    let env = LaunchEnv::detect(cfg)?;
    let (boot, what): (Arc<dyn Bootstrap>, String) = if env.world == 1 {
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
    Ok(Met {
        boot,
        launcher: env.launcher,
        token: env.token.clone(),
        token_source: match &env.token_source {
            crate::bootstrap::TokenSource::Derived => {
                "derived from the launch environment (one node: only this user reaches the rendezvous)".into()
            }
            other => format!("secret, from {other}"),
        },
        what,
    })
}

/// The memory and execution backend the settings choose (CUDA when a GPU is visible under
/// `auto`), on the device the launcher's local rank picks.
fn open_backend(
    boot: &Arc<dyn Bootstrap>,
    node: &NodeInfo,
    channel: NodeChannel,
    cfg: &Config,
    phases: &mut crate::util::Phases,
) -> Result<AnyBackend> {
    let use_cuda = match cfg.backend {
        BackendChoice::Host => false,
        BackendChoice::Cuda => true,
        BackendChoice::Auto => crate::backend::cuda::gpu_visible(),
    };
    phases.mark("probe");
    if !use_cuda {
        let be = HostBackend::new(boot.clone(), node.clone(), channel, cfg.capacity)?;
        return Ok(AnyBackend::Host(be));
    }
    // LOCAL_RANK as the launcher numbers it, else our own node-local rank.
    let local = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(node.local_rank);
    let device = crate::backend::cuda::choose_device(cfg.device, local)?;
    let be =
        crate::backend::cuda::CudaBackend::new(boot.clone(), node.clone(), channel, device, cfg)?;
    Ok(AnyBackend::Cuda(be))
}

/// The rest of init, collective: the heap's first chunk, the device state, a first barrier,
/// the watchdog, and the banner when asked for.
fn finish(ctx: Context, mut phases: crate::util::Phases) -> Result<Context> {
    let rank = ctx.inner.rank;
    {
        let mut st = ctx.inner.mem.lock_heap();
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
    ctx.inner.register_team(&ctx.inner.teams.world_team);
    if ctx.inner.backend.as_cuda().is_some() {
        crate::context::watch::start_watchdog(&ctx.inner);
    }
    let _ = ctx.inner.init_phases.set(phases);
    if ctx.inner.cfg.debug >= DebugLevel::Info {
        eprintln!("{}", ctx.banner());
    }
    tracing::debug!(rank, world = ctx.inner.world, "symheap context ready");
    Ok(ctx)
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
