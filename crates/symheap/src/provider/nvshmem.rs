//! [`Nvshmem`]: NVSHMEM 3.x as a [`Provider`], loaded at run time and initialised over
//! symheap's own bootstrap (unique id), so no MPI, launcher plugin or torch is needed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::nvshmem_sys::{self as sys, Found, Plan, Session};
use super::{next_provider_id, table_bytes, table_from_bytes, Allocation, Provider};
use crate::context::Inner;
use crate::error::{err, invalid, Error, ErrorKind, Result};
use crate::heap::align_up;
use crate::util::human_bytes;
use crate::Context;

/// An NVSHMEM host library found and loaded (not initialised).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvshmemLibrary {
    /// The path it was loaded from (or the bare loader name when the loader found it).
    pub path: PathBuf,
    /// (major, minor, patch).
    pub version: (i32, i32, i32),
}

pub(super) struct State {
    pub(super) session: Option<Session>,
    /// Allocations made so far (the same on every PE: allocation is collective).
    serial: u64,
}

/// NVSHMEM as a provider (CUDA backend only).
///
/// * Loading: `libnvshmem_host.so.3` from the path given, else `$SYMHEAP_NVSHMEM_LIB`, else
///   the `nvidia-nvshmem-cu13` wheel under the `python3` on PATH's `sys.path`, else the
///   loader's search path. A missing library is an `Unsupported` error naming every place
///   searched. The library is never unloaded, and one process initialises NVSHMEM once.
/// * Initialisation (collective over the world): when another library of the process (torch's
///   NVSHMEM backend, DeepEP, nvshmem4py) initialised NVSHMEM already on every PE, with
///   NVSHMEM's PE numbering symheap's (`nvshmem_my_pe() == rank`, `nvshmem_n_pes() == world`;
///   `nvshmemx_init_status` tells), the provider attaches to it ([`attached`](Self::attached));
///   with another layout, or initialised on some PEs only, every PE fails with an
///   `Unsupported` error saying which PE found what. An NVSHMEM library already loaded in the
///   process is the one used. Otherwise PE 0 makes a unique id, symheap's bootstrap hands it to
///   every PE, each calls `nvshmemx_hostlib_init_attr` on the context's CUDA device (its
///   primary context is made current first). NVSHMEM reads its settings from the environment,
///   which a running Rust program must not change (another thread may be reading it), so the
///   Rust side sets none: `symheap launch` puts `NVSHMEM_DISABLE_NVLS=1` (symheap never uses
///   NVLink multicast) and, for a single-node job, `NVSHMEM_REMOTE_TRANSPORT=none` (no network
///   transport to probe) into its PEs' environment, and Python's `symheap.providers.nvshmem()`
///   sets them (where unset) only while NVSHMEM initialises, removing them after. A Rust
///   program started otherwise gets NVSHMEM's own defaults for them, and a log line at `info`
///   says so.
/// * Allocation: `nvshmem_malloc` of the request rounded up to 16 bytes plus an `int64` table
///   per PE, written after the data on this PE's device. `peer_bases[r] = nvshmem_ptr(ptr, r)`
///   (NULL becomes 0, not direct). The per-peer offsets are measured once, at initialisation
///   (with a probe allocation), and every later table is checked against them, so
///   [`Provider::peer_offsets`] is `Some`.
/// * Release: [`Provider::free`] is explicit and collective. It is not done on drop because
///   `nvshmem_free` is a collective barrier: a destructor runs at different points on
///   different PEs (garbage collection, unwinding), and a barrier started there would deadlock.
///   An allocation dropped without `free` stays allocated until [`finalize`](Self::finalize).
/// * Data path (not collective): [`put`](Self::put), [`get`](Self::get),
///   [`put_signal`](Self::put_signal), [`signal_wait_until`](Self::signal_wait_until),
///   [`atomic_i64`](Self::atomic_i64), [`quiet`](Self::quiet) and their `*_on_stream` forms move
///   data between places of this provider's allocations ([`Allocation::at`]) to any PE, direct
///   or on another node (NVSHMEM's network transport); see `nvshmem_rma.rs`. A PE whose peers
///   on other nodes are not direct is fine; one that reaches none of its own node's PEs
///   directly is refused at initialisation.
/// * Finalisation: [`finalize`](Self::finalize) (collective); dropping the provider finalises
///   it too, after a symheap collective point confirms every PE is finalising (when that
///   fails, NVSHMEM is left initialised rather than risk a hang). An attached provider frees
///   its own allocations and leaves NVSHMEM initialised for the library that started it.
///
/// Collective-order rule: `new`, `allocate`, `free`, `barrier` and `finalize` are collective.
/// Each first passes a ledger-checked symheap collective point (recorded as
/// `Nvshmem::allocate(size #n)` etc.), so a PE calling in another order, with another size, or
/// not at all, fails every PE with the call named, or a timeout naming the missing PE, instead
/// of hanging inside NVSHMEM (which has no timeout).
pub struct Nvshmem {
    pub(super) inner: Arc<Inner>,
    pub(super) id: u64,
    pub(super) rank: usize,
    pub(super) world: usize,
    device: usize,
    attached: bool,
    lib: NvshmemLibrary,
    /// `nvshmem_ptr(p, r) - p` for every PE (None: not direct), measured at initialisation.
    pub(super) offsets: Vec<Option<i64>>,
    state: Mutex<State>,
}

fn unsupported(call: &'static str, why: impl Into<String>) -> Error {
    err(call, ErrorKind::Unsupported(why.into()))
}

fn load_api(
    lib: Option<&Path>,
    site_dirs: Option<&[PathBuf]>,
) -> std::result::Result<&'static sys::Api, String> {
    let env = std::env::var_os(sys::ENV_LIB);
    let explicit_or_env = lib.is_some() || env.as_ref().is_some_and(|v| !v.is_empty());
    let (dirs, note) = match site_dirs {
        Some(d) => (d.to_vec(), None),
        None if explicit_or_env => (Vec::new(), None),
        None => crate::util::libsearch::python_sys_path(),
    };
    let cands = sys::NVSHMEM.candidates(lib, env.as_deref(), &dirs);
    sys::load(&cands, note.as_deref())
}

/// Says (at `info`) that `name` is unset, so NVSHMEM uses its own default instead of the
/// `value` symheap's launchers put there.
fn note_unset_env(name: &str, value: &str) {
    if std::env::var_os(name).is_none() {
        tracing::info!(
            "{name} is not set: NVSHMEM uses its own default (symheap launch and Python's \
             symheap.providers.nvshmem() set {name}={value}; export it to get the same here)"
        );
    }
}

impl Nvshmem {
    /// Not collective: finds and loads the NVSHMEM host library without initialising it (see
    /// [`Nvshmem`] for the search order; `site_dirs`, when given, replaces asking `python3`
    /// for its `sys.path`). A missing library is an `Unsupported` error naming every place
    /// searched.
    pub fn load_library(
        lib: Option<&Path>,
        site_dirs: Option<&[PathBuf]>,
    ) -> Result<NvshmemLibrary> {
        let api = load_api(lib, site_dirs).map_err(|m| unsupported("Nvshmem::load_library", m))?;
        Ok(NvshmemLibrary {
            path: api.path.clone(),
            version: api.version,
        })
    }

    /// Collective over the world: loads NVSHMEM (`lib`, or the search described on
    /// [`Nvshmem`]) and initialises it on this context's CUDA device. Every PE fails if any PE
    /// cannot load it, naming that PE and why. On the host backend it fails at once with
    /// `Unsupported` (NVSHMEM allocates GPU memory).
    pub fn new(ctx: &Context, lib: Option<&Path>) -> Result<Nvshmem> {
        Nvshmem::with_search_path(ctx, lib, None)
    }

    /// Collective: like [`new`](Self::new), with the Python search directories given (for a
    /// caller that is itself a Python interpreter and knows its `sys.path`) instead of asked
    /// of `python3`.
    pub fn with_search_path(
        ctx: &Context,
        lib: Option<&Path>,
        site_dirs: Option<&[PathBuf]>,
    ) -> Result<Nvshmem> {
        const CALL: &str = "Nvshmem::new";
        let inner = ctx.inner.clone();
        let (rank, world) = (inner.rank, inner.world);
        inner.check(CALL)?;
        // Every PE runs on the same backend (agreed at init), so this fails symmetrically.
        let cu = ctx.cuda().ok_or_else(|| {
            unsupported(
                CALL,
                format!(
                    "the NVSHMEM provider needs the CUDA backend, and this context runs on the {} backend (NVSHMEM allocates GPU memory)",
                    ctx.backend_kind().name()
                ),
            )
            .with_pe(rank)
        })?;
        cu.bind()?;
        let (api, plan, uid) = exchange_unique_id(&inner, lib, site_dirs)?;
        if plan == Plan::Init {
            note_unset_env("NVSHMEM_DISABLE_NVLS", "1");
            if ctx
                .node()
                .node_of
                .iter()
                .all(|&n| n == ctx.node().node_index)
            {
                note_unset_env("NVSHMEM_REMOTE_TRANSPORT", "none");
            }
        }
        cu.bind()?;
        let session = start_session(&inner, api, plan, &uid)?;
        let (session, offsets) = probe_offsets(&inner, session)?;
        tracing::debug!(rank, path = %api.path.display(), ?plan, "NVSHMEM ready");
        Ok(Nvshmem {
            id: next_provider_id(),
            rank,
            world,
            device: cu.device_ordinal(),
            attached: plan == Plan::Attach,
            lib: NvshmemLibrary {
                path: api.path.clone(),
                version: api.version,
            },
            offsets,
            state: Mutex::new(State {
                session: Some(session),
                serial: 0,
            }),
            inner,
        })
    }

    /// The CUDA device ordinal NVSHMEM runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Whether the provider uses an NVSHMEM another library of the process initialised (and
    /// so leaves it initialised at [`finalize`](Self::finalize)), rather than its own.
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// The library in use.
    pub fn library(&self) -> &NvshmemLibrary {
        &self.lib
    }

    /// Not collective: sets up NVSHMEM's device state in `module`, a CUDA module (a `CUmodule`
    /// handle as an integer) whose kernels use NVSHMEM's device API: compiled with
    /// `nvcc -rdc=true` and device-linked with `libnvshmem_device` (see README, "NVSHMEM's
    /// device library in your kernel"). NVSHMEM's device functions read state that lives in
    /// each module; before this call a kernel of `module` reads it uninitialised (a wrong PE,
    /// a fault).
    /// Call it once per module after [`new`](Self::new), before any launch; release with
    /// [`finalize_module`](Self::finalize_module) before unloading the module. A module that
    /// was not linked with the device library, a handle of 0 or a finalized provider is an
    /// error.
    ///
    /// # Safety
    /// `module` must be a live `CUmodule` loaded in the primary context of this provider's
    /// device (the context CUDA's runtime, torch, CuPy and Triton use), not unloaded before
    /// this call returns. A handle symheap cannot check: the driver may crash on a dangling
    /// one.
    pub unsafe fn init_module(&self, module: u64) -> Result<()> {
        // SAFETY: the caller's contract; `on_session` made this device's primary context
        // current.
        self.on_session("Nvshmem::init_module", |s| unsafe {
            s.cumodule(module, true)
        })
    }

    /// Not collective: releases what [`init_module`](Self::init_module) set up in `module`;
    /// call it before unloading the module.
    ///
    /// # Safety
    /// As for [`init_module`](Self::init_module).
    pub unsafe fn finalize_module(&self, module: u64) -> Result<()> {
        // SAFETY: as in `init_module`.
        self.on_session("Nvshmem::finalize_module", |s| unsafe {
            s.cumodule(module, false)
        })
    }

    /// Whether [`finalize`](Self::finalize) has run (every later call fails).
    pub fn is_finalized(&self) -> bool {
        self.lock().session.is_none()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn finalized_error(&self, call: &'static str) -> Error {
        invalid(call, "the NVSHMEM provider was finalized").with_pe(self.rank)
    }

    pub(super) fn bind(&self) -> Result<()> {
        match self.inner.backend.as_cuda() {
            Some(cu) => cu.bind(),
            None => Ok(()),
        }
    }

    /// Collective: frees every NVSHMEM allocation and finalises NVSHMEM
    /// (`nvshmemx_hostlib_finalize`). Later calls fail; calling it again does nothing. When
    /// the collective check before it fails (a PE is gone or diverged), NVSHMEM is left
    /// initialised rather than risk a hang, and the error is returned.
    pub fn finalize(&self) -> Result<()> {
        const CALL: &str = "Nvshmem::finalize";
        let mut st = self.lock();
        let Some(session) = st.session.take() else {
            return Ok(());
        };
        if let Err(e) = self.inner.collective(CALL, String::new(), None) {
            // Dropping a Session leaves NVSHMEM initialised (see `Session`).
            drop(session);
            return Err(e);
        }
        self.bind()?;
        session.finalize();
        Ok(())
    }
}

fn version(v: (i32, i32, i32)) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

/// Collective (first step of [`Nvshmem::with_search_path`]): every PE loads NVSHMEM, PE 0 makes
/// the unique id, and one exchange tells every PE whether all could and hands it the id, so a PE
/// that cannot load NVSHMEM makes every PE fail instead of leaving the others waiting in
/// NVSHMEM's bootstrap.
fn exchange_unique_id(
    inner: &Arc<Inner>,
    lib: Option<&Path>,
    site_dirs: Option<&[PathBuf]>,
) -> Result<(&'static sys::Api, Plan, [u8; sys::UNIQUEID_BYTES])> {
    const CALL: &str = "Nvshmem::new";
    let rank = inner.rank;
    // Local preparation (load, look at NVSHMEM's state, PE 0 makes an id when NVSHMEM is not
    // up yet), then one exchange, so a PE that cannot load NVSHMEM makes every PE fail instead
    // of leaving the others waiting in NVSHMEM's bootstrap, and every PE takes the same
    // decision to initialise or attach.
    let prepared = load_api(lib, site_dirs).and_then(|api| {
        let found = Found::probe(api);
        let uid = if rank == 0 && found.status <= 0 {
            sys::unique_id(api)?
        } else {
            [0u8; sys::UNIQUEID_BYTES]
        };
        Ok((api, found, uid))
    });
    let payload = match &prepared {
        Ok((_, found, uid)) => [&[1u8][..], &found.to_bytes()[..], &uid[..]].concat(),
        Err(m) => [&[0u8][..], m.as_bytes()].concat(),
    };
    let all = inner.collective(CALL, String::new(), Some(&payload))?;
    let (api, _, _) = prepared.map_err(|m| unsupported(CALL, m).with_pe(rank))?;
    for (r, p) in all.iter().enumerate() {
        if p.first() != Some(&1) {
            return Err(unsupported(
                CALL,
                format!(
                    "PE {r} could not start NVSHMEM: {}",
                    String::from_utf8_lossy(p.get(1..).unwrap_or_default())
                ),
            )
            .with_pe(rank));
        }
    }
    let malformed = || {
        err(
            CALL,
            ErrorKind::Bootstrap("a PE sent a malformed NVSHMEM start-up message".into()),
        )
        .with_pe(rank)
    };
    let found: Vec<Found> = all
        .iter()
        .map(|p| p.get(1..).and_then(Found::from_bytes))
        .collect::<Option<_>>()
        .ok_or_else(malformed)?;
    let plan = sys::plan(&found).map_err(|m| unsupported(CALL, m).with_pe(rank))?;
    let uid: [u8; sys::UNIQUEID_BYTES] = all[0]
        .get(1 + Found::BYTES..)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(malformed)?;
    Ok((api, plan, uid))
}

/// Collective (second step): NVSHMEM's initialisation on every PE, then an exchange so that no
/// PE allocates before every PE is up (a collective NVSHMEM call with a PE missing would hang).
fn start_session(
    inner: &Arc<Inner>,
    api: &'static sys::Api,
    plan: Plan,
    uid: &[u8; sys::UNIQUEID_BYTES],
) -> Result<Session> {
    const CALL: &str = "Nvshmem::new";
    let (rank, world) = (inner.rank, inner.world);
    let started = match plan {
        Plan::Init => Session::init(api, rank, world, uid),
        Plan::Attach => Session::attach(api, rank, world),
    };
    // Every PE learns whether every PE is fully up before anyone allocates (a collective
    // NVSHMEM call with a PE missing would hang).
    let status = match &started {
        Ok(_) => vec![1u8],
        Err(m) => [&[0u8][..], m.as_bytes()].concat(),
    };
    let all = inner.collective("Nvshmem::new (started)", String::new(), Some(&status))?;
    let session = started.map_err(|m| {
        err(
            CALL,
            ErrorKind::Backend(format!(
                "NVSHMEM {} from {}: {m}",
                version(api.version),
                api.path.display()
            )),
        )
        .with_pe(rank)
    })?;
    for (r, p) in all.iter().enumerate() {
        if p.first() != Some(&1) {
            // NVSHMEM is left as it is: finalising needs every PE.
            drop(session);
            return Err(err(
                CALL,
                ErrorKind::Backend(format!(
                    "PE {r} could not start NVSHMEM: {}",
                    String::from_utf8_lossy(p.get(1..).unwrap_or_default())
                )),
            )
            .with_pe(rank));
        }
    }
    Ok(session)
}

/// Collective (third step): the per-peer offsets, measured once on a probe allocation every PE
/// makes; every PE reports how that went before the next collective NVSHMEM call (the probe's
/// free). A PE that reaches none of the other PEs of its own node directly fails every PE
/// alike: on one node that is a missing P2P path, not a layout NVSHMEM's transports are for.
/// PEs on other nodes may be unreachable by load/store; the data-path calls
/// (`nvshmem_rma.rs`) reach them through NVSHMEM's network transport.
fn probe_offsets(inner: &Arc<Inner>, mut session: Session) -> Result<(Session, Vec<Option<i64>>)> {
    const CALL: &str = "Nvshmem::new";
    let (rank, world) = (inner.rank, inner.world);
    // Measure the per-peer offsets once, on a probe allocation every PE makes here. Every
    // PE reports how that went before the next collective NVSHMEM call (the probe's free).
    let probe = session.malloc(256);
    let offsets: Vec<Option<i64>> = (0..world)
        .map(|r| {
            let q = probe.map_or(0, |p| session.ptr(p, r));
            (q != 0).then(|| q.wrapping_sub(probe.unwrap_or(0)) as i64)
        })
        .collect();
    let node_of = &inner.node.node_of;
    let on_my_node: Vec<usize> = (0..world)
        .filter(|&r| r != rank && node_of.get(r) == node_of.get(rank))
        .collect();
    let reach = on_my_node.iter().filter(|&&r| offsets[r].is_some()).count();
    // 0: no probe; 1: fine; 2: no other PE of this node directly addressable.
    let verdict = match probe {
        None => 0u8,
        Some(_) if !on_my_node.is_empty() && reach == 0 => 2,
        Some(_) => 1,
    };
    let verdicts = inner.collective("Nvshmem::new (probe)", String::new(), Some(&[verdict]))?;
    let with = |code: u8| -> Vec<usize> {
        (0..world)
            .filter(|&r| verdicts.get(r).and_then(|v| v.first()) == Some(&code))
            .collect()
    };
    let list = |pes: &[usize]| {
        let s: Vec<String> = pes.iter().map(|r| r.to_string()).collect();
        format!(
            "PE{} {}",
            if pes.len() == 1 { "" } else { "s" },
            s.join(", ")
        )
    };
    let failed = with(0);
    if !failed.is_empty() || verdicts.len() != world {
        // Some PE has no probe to free: NVSHMEM is left as it is (finalising needs every
        // PE to be able to take part).
        drop(session);
        return Err(err(
            CALL,
            ErrorKind::Backend(format!(
                "nvshmem_malloc of a 256-byte probe returned NULL on {} (NVSHMEM_DEBUG=WARN shows why)",
                list(&failed)
            )),
        )
        .with_pe(rank));
    }
    if let Some(p) = probe {
        session.free(p);
    }
    let blind = with(2);
    if !blind.is_empty() {
        // Every PE is here, so finalising together cannot hang.
        session.finalize();
        return Err(unsupported(
            CALL,
            format!(
                "NVSHMEM reports none of the other PEs of the same node as load/store-addressable from {} (nvshmem_ptr returned NULL for each): the GPUs have no peer-to-peer path, or NVSHMEM's P2P transport is off (NVSHMEM_DISABLE_P2P); symheap's kernels need direct access within a node",
                list(&blind)
            ),
        )
        .with_pe(rank));
    }
    Ok((session, offsets))
}

impl Provider for Nvshmem {
    fn name(&self) -> &str {
        "nvshmem"
    }

    fn my_pe(&self) -> usize {
        self.rank
    }

    fn n_pes(&self) -> usize {
        self.world
    }

    /// Collective: `nvshmem_malloc` (see [`Nvshmem`]).
    fn allocate(&self, bytes: u64) -> Result<Allocation> {
        const CALL: &str = "Nvshmem::allocate";
        if bytes == 0 {
            return Err(invalid(CALL, "size must be at least 1 byte").with_pe(self.rank));
        }
        let table_off = align_up(bytes, 16).ok_or_else(|| invalid(CALL, "size overflows"))?;
        let span = table_off
            .checked_add(8 * self.world as u64)
            .ok_or_else(|| invalid(CALL, "size overflows").with_pe(self.rank))?;
        let mut st = self.lock();
        if st.session.is_none() {
            return Err(self.finalized_error(CALL));
        }
        let serial = st.serial;
        st.serial += 1;
        self.inner
            .collective(CALL, format!("{} #{serial}", human_bytes(bytes)), None)?;
        self.bind()?;
        let session = st.session.as_mut().expect("checked above");
        let ptr = session.malloc(span).ok_or_else(|| {
            err(
                CALL,
                ErrorKind::Backend(format!(
                    "nvshmem_malloc of {} returned NULL: NVSHMEM's symmetric heap is full (raise NVSHMEM_SYMMETRIC_SIZE) or NVSHMEM failed (NVSHMEM_DEBUG=WARN shows why)",
                    human_bytes(span)
                )),
            )
            .with_pe(self.rank)
        })?;
        let mut peer_bases = Vec::with_capacity(self.world);
        for r in 0..self.world {
            let q = session.ptr(ptr, r);
            let cached = self.offsets[r].map_or(0, |o| ptr.wrapping_add(o as u64));
            if q != cached {
                // Never seen; the allocation is kept (freeing is collective and the other PEs
                // may not have noticed anything).
                return Err(err(
                    CALL,
                    ErrorKind::Backend(format!(
                        "nvshmem_ptr for PE {r} gave {q:#x}, but the offset measured at init predicts {cached:#x}: NVSHMEM's per-peer offsets are not constant here, so cross-allocation translation would be wrong"
                    )),
                )
                .with_pe(self.rank));
            }
            peer_bases.push(q);
        }
        let table_addr = ptr + table_off;
        self.inner
            .backend
            .write_bytes(table_addr, &table_bytes(&peer_bases))
            .map_err(|e| e.during(CALL).with_pe(self.rank))?;
        Ok(Allocation {
            provider: self.id,
            serial,
            my_pe: self.rank,
            ptr,
            bytes,
            direct: peer_bases.iter().map(|&b| b != 0).collect(),
            peer_bases,
            table_addr,
            native: None,
        })
    }

    /// Collective: `nvshmem_free` (see [`Nvshmem`] for why it is explicit).
    fn free(&self, a: Allocation) -> Result<()> {
        const CALL: &str = "Nvshmem::free";
        a.check_owner(self.id, CALL)?;
        let mut st = self.lock();
        if st.session.is_none() {
            return Err(self.finalized_error(CALL));
        }
        self.inner.collective(
            CALL,
            format!("{} #{}", human_bytes(a.bytes), a.serial),
            None,
        )?;
        self.bind()?;
        let session = st.session.as_mut().expect("checked above");
        if !session.free(a.ptr) {
            return Err(invalid(CALL, format!("{:#x} was already freed", a.ptr)).with_pe(self.rank));
        }
        Ok(())
    }

    /// Collective: a symheap collective point (ledger check, timeout), then
    /// `nvshmem_barrier_all`.
    fn barrier(&self) -> Result<()> {
        const CALL: &str = "Nvshmem::barrier";
        let st = self.lock();
        let Some(session) = st.session.as_ref() else {
            return Err(self.finalized_error(CALL));
        };
        self.inner.collective(CALL, String::new(), None)?;
        self.bind()?;
        session.barrier_all();
        Ok(())
    }

    fn peer_offsets(&self) -> Option<Vec<i64>> {
        Some(self.offsets.iter().map(|o| o.unwrap_or(0)).collect())
    }

    fn write_bytes(&self, a: &Allocation, offset: u64, data: &[u8]) -> Result<()> {
        const CALL: &str = "Nvshmem::write_bytes";
        a.check_range(self.id, CALL, offset, data.len())?;
        let st = self.lock();
        if st.session.is_none() {
            return Err(self.finalized_error(CALL));
        }
        self.inner
            .backend
            .write_bytes(a.ptr + offset, data)
            .map_err(|e| e.during(CALL).with_pe(self.rank))
    }

    fn read_bytes(&self, a: &Allocation, offset: u64, out: &mut [u8]) -> Result<()> {
        const CALL: &str = "Nvshmem::read_bytes";
        a.check_range(self.id, CALL, offset, out.len())?;
        let st = self.lock();
        if st.session.is_none() {
            return Err(self.finalized_error(CALL));
        }
        self.inner
            .backend
            .read_bytes(a.ptr + offset, out)
            .map_err(|e| e.during(CALL).with_pe(self.rank))
    }

    fn read_table(&self, a: &Allocation) -> Result<Vec<u64>> {
        const CALL: &str = "Nvshmem::read_table";
        a.check_owner(self.id, CALL)?;
        let st = self.lock();
        if st.session.is_none() {
            return Err(self.finalized_error(CALL));
        }
        let mut b = vec![0u8; 8 * self.world];
        self.inner
            .backend
            .read_bytes(a.table_addr, &mut b)
            .map_err(|e| e.during(CALL).with_pe(self.rank))?;
        Ok(table_from_bytes(&b))
    }
}

impl Drop for Nvshmem {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The context's drop aborts the job; a barrier here could only hang.
            // Dropping the Session leaves NVSHMEM initialised (see `Session`).
            drop(self.lock().session.take());
            return;
        }
        if let Err(e) = self.finalize() {
            tracing::debug!("NVSHMEM finalize on drop: {e}");
        }
    }
}
