//! The CUDA backend: a GPU symmetric heap with the same slot layout as the host backend.
//!
//! Each PE reserves `world × capacity` bytes of device virtual address space in its device's
//! primary context (so PyTorch and the CUDA runtime share it). Growing creates this PE's next
//! chunk with `cuMemCreate` (exportable as a POSIX file descriptor), passes the descriptor to
//! the node's other PEs over the node channel, imports theirs and maps every chunk at its
//! owner's slot; peers whose memory this device cannot reach (no peer-to-peer path) are not
//! direct and get 0 in every table. Kernels are CUDA C++ compiled at run time by NVRTC for the
//! device's own arch and cached on disk.

mod cache;
pub(crate) mod driver;
pub mod nccl;
pub mod nvrtc;
mod nvrtc_sys;
mod prebuilt;
pub mod topology;

pub use topology::{Protocols, TopologyChoice};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::driver::{Device, Function, MappedHost, Module, Stream};
use super::reduce::reduce_bytes;
use super::{AtomicOp, Backend, BackendKind, ChunkInfo, GrowVote, ReduceOp};
use crate::bootstrap::{Bootstrap, NodeChannel, NodeInfo};
use crate::element::DType;
use crate::error::{backend, err, invalid, ErrorKind, Result};

use driver::Arg;
pub use driver::{Arg as KernelArg, DeviceBuffer, Event, Graph, PeerCopy};

/// Oldest arch whose memory model (release/acquire at system scope) the kernels rely on.
const MIN_ARCH: (i32, i32) = (7, 0);

/// Offsets in the mapped host block that kernels report through.
const ERR_WAIT: usize = 0;
const ERR_BARRIER: usize = 4;
const ATOMIC_OLD: usize = 8;
const ERR_COLL: usize = 16;
/// The abort word every kernel's long waits poll (`symheap_abort_word` in kernels.cu and
/// coll.cu): raised when the job fails, or by a kernel whose wait timed out.
const ABORT: usize = 24;
/// The kernels' module variable that holds the abort word's device address.
const ABORT_VAR: &str = "symheap_abort_word";

/// How a stream copy is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// The copy engines, at every size: over NVLink (2 x H200) they finished back-to-back puts
    /// and gets sooner than the SM kernel at every size measured, 64 B to 1 GiB (BENCHMARKS.md),
    /// and they leave the SMs to the caller's kernels.
    #[default]
    Auto,
    /// A kernel whose threads load and store: for callers that keep the copy engines busy
    /// with their own transfers, or want the copy to queue with their kernels.
    Sm,
    /// The DMA copy engines (`cuMemcpyAsync`), leaving the SMs free.
    CopyEngine,
}

/// Largest put with signal done by one single-block launch (data, then the signal). One block
/// moves 64 KiB in about 1.2 us more than 8 bytes (the ping-pong in BENCHMARKS.md), less than
/// the second launch (copy, then a signal kernel) that larger puts take.
pub const FUSED_PUT_SIGNAL_MAX: u64 = 64 << 10;

/// Threads of the single-block put with signal: one 16-byte vector per thread and step, at least
/// one warp, at most 512.
fn fused_put_signal_threads(bytes: u64) -> u32 {
    bytes.div_ceil(16).next_multiple_of(32).clamp(32, 512) as u32
}

struct Kernels {
    _module: Module,
    copy: Function,
    put_signal: Function,
    signal: Function,
    wait: Function,
    barrier: Function,
    atomic: Function,
    /// Where the cubin came from, for the banner.
    origin: String,
}

struct Mapping {
    addr: u64,
    bytes: u64,
    handle: u64,
}

struct HeapMaps {
    chunks: Vec<ChunkInfo>,
    maps: Vec<Mapping>,
}

/// The CUDA backend (see the module documentation).
pub struct CudaBackend {
    rank: usize,
    capacity: u64,
    gran: u64,
    dev: Device,
    driver_version: i32,
    base: u64,
    reserved: u64,
    direct: Mutex<Vec<bool>>,
    node: NodeInfo,
    channel: NodeChannel,
    boot: Arc<dyn Bootstrap>,
    state: Mutex<HeapMaps>,
    kernels: Kernels,
    coll: CollKernels,
    stream: Stream,
    /// Error words, the abort word and the atomics' result, shared with the health callback
    /// that raises the abort word (it may outlive the backend).
    flags: Arc<MappedHost>,
    /// Serialises users of the internal stream and the mapped host block.
    ops: Mutex<()>,
    timeout: Duration,
    /// `SYMHEAP_COLL_DEFINES`, compiled into the collective kernels.
    coll_defines: Vec<(String, u64)>,
    /// Where `new`'s time went, for the banner.
    init_phases: crate::util::Phases,
    /// The collective protocols every PE agreed on (LL128 only over verified links); set by
    /// [`agree_protocols`](Self::agree_protocols) right after the PEs agreed on the backend.
    protocols: std::sync::OnceLock<Protocols>,
}

fn ceil_to(x: u64, g: u64) -> u64 {
    x.div_ceil(g) * g
}

/// Picks the device: `SYMHEAP_DEVICE` (or the builder's), else LOCAL_RANK modulo the count.
pub(crate) fn choose_device(explicit: Option<usize>, local_rank: usize) -> Result<usize> {
    let n = driver::device_count()?;
    if n == 0 {
        return Err(err(
            "init",
            ErrorKind::Unsupported("no CUDA device is visible".into()),
        ));
    }
    match explicit {
        Some(d) if d >= n => Err(invalid(
            "init",
            format!("CUDA device {d} requested, only {n} visible"),
        )),
        Some(d) => Ok(d),
        None => Ok(local_rank % n),
    }
}

/// Whether a CUDA device is visible (for `SYMHEAP_BACKEND=auto`). Never fails.
pub fn gpu_visible() -> bool {
    gpu_count() > 0
}

/// Number of visible CUDA devices (0 without a driver). Never fails.
pub fn gpu_count() -> usize {
    driver::device_count().unwrap_or(0)
}

/// Loads one of symheap's kernel sources for `dev`: the image embedded at build time when there
/// is one for this arch ([`prebuilt`]), else the on-disk cache, else NVRTC (then cached).
/// Returns the module and where its image came from (for the banner).
fn build(dev: &Device, driver_version: i32, source: &str, name: &str) -> Result<(Module, String)> {
    let arch = (dev.cc.0 * 10 + dev.cc.1) as u32;
    let hash = prebuilt::source_hash(&[nvrtc::HEADER, source]);
    let mut skipped = String::new();
    if let Some((image_arch, image)) = prebuilt::find(hash, arch) {
        match Module::load(image) {
            Ok(m) => return Ok((m, format!("prebuilt for sm_{image_arch}"))),
            // A driver older than the NVRTC that built the image: compile here instead.
            Err(e) => skipped = format!("; the prebuilt sm_{image_arch} image did not load: {e}"),
        }
    }
    let nv = nvrtc::version().map_err(|m| {
        let shipped = prebuilt::archs();
        let have = if shipped.is_empty() {
            "this build carries no prebuilt kernels".to_string()
        } else {
            let list: Vec<String> = shipped.iter().map(|a| format!("sm_{a}")).collect();
            format!(
                "this build carries prebuilt kernels for {}",
                list.join(", ")
            )
        };
        err(
            "init",
            ErrorKind::Unsupported(format!(
                "{} is sm_{arch} and {have}{skipped}, so NVRTC must compile {name}: {m}",
                dev.name
            )),
        )
    })?;
    let path = cache::path(hash, arch, driver_version, nv);
    let (image, origin) = match cache::load(&path) {
        Some(img) => (img, format!("cached {}", path.display())),
        None => {
            let img = nvrtc::compile_cubin(source, name, arch, &[("symheap.cuh", nvrtc::HEADER)])
                .map_err(|log| {
                err(
                    "init",
                    ErrorKind::Unsupported(format!(
                        "NVRTC {}.{} cannot compile {name} for sm_{arch} ({}): {log}",
                        nv.0, nv.1, dev.name
                    )),
                )
            })?;
            cache::store(&path, &img);
            (
                img,
                format!("compiled by NVRTC {}.{} for sm_{arch}", nv.0, nv.1),
            )
        }
    };
    let module = Module::load(&image).map_err(|e| {
        err(
            "init",
            ErrorKind::Unsupported(format!(
                "the driver ({driver_version}) cannot load kernels built for sm_{arch}: {e}"
            )),
        )
    })?;
    Ok((module, origin))
}

/// symheap's own kernel sources as the backend compiles them with no tuning overrides: (program
/// name, source). `symheap kernels` compiles these ahead of time for the wheel.
pub fn shipped_sources() -> Vec<(&'static str, String)> {
    vec![
        ("symheap_kernels.cu", nvrtc::KERNELS.to_string()),
        ("symheap_coll.cu", coll_source(&[])),
    ]
}

/// The file name under which the image of `source` (from [`shipped_sources`]) for `arch` is
/// embedded by a build with `SYMHEAP_PREBUILT_KERNELS`.
pub fn prebuilt_file_name(source: &str, arch: u32) -> String {
    prebuilt::file_name(prebuilt::source_hash(&[nvrtc::HEADER, source]), arch)
}

/// The architectures this build carries prebuilt kernels for.
pub fn prebuilt_archs() -> Vec<u32> {
    prebuilt::archs()
}

/// Names of the collective kernels (coll.cu), looked up once at init.
const COLL_KERNELS: &[&str] = &[
    "symheap_allgather",
    "symheap_broadcast",
    "symheap_alltoall",
    "symheap_exchange_ll",
    "symheap_exchange_ll128",
];
/// Reduction kernels exist per dtype suffix.
const COLL_REDUCING: &[&str] = &[
    "symheap_ar_oneshot",
    "symheap_ar_flag",
    "symheap_ar_ll128",
    "symheap_ar_twoshot",
    "symheap_reduce_scatter",
];
/// Dtypes the reducing kernels are built for.
pub const COLL_DTYPES: &[(DType, &str)] = &[
    (DType::F32, "f32"),
    (DType::F16, "f16"),
    (DType::BF16, "bf16"),
    (DType::I32, "i32"),
];

/// Whether the GPU reduction kernels handle `d`.
pub fn coll_supports(d: DType) -> bool {
    COLL_DTYPES.iter().any(|(t, _)| *t == d)
}

struct CollKernels {
    _module: Module,
    fns: HashMap<String, Function>,
}

/// The collective kernels' source with `defines` (already validated: `SYMHEAP_COLL_*` names,
/// integer values) ahead of it; they change the cache key with the source.
fn coll_source(defines: &[(String, u64)]) -> String {
    let mut src = String::new();
    for (name, value) in defines {
        // A plain decimal literal: it takes the smallest integer type that holds it, so it also
        // fits `int` template arguments (an `ull` suffix would be a narrowing conversion there).
        src.push_str(&format!("#define {name} {value}\n"));
    }
    src.push_str(nvrtc::COLL);
    src
}

fn compile_coll(
    dev: &Device,
    driver_version: i32,
    defines: &[(String, u64)],
) -> Result<CollKernels> {
    let source = coll_source(defines);
    let (module, _) = build(dev, driver_version, &source, "symheap_coll.cu")?;
    let mut fns = HashMap::new();
    for k in COLL_KERNELS {
        fns.insert(k.to_string(), module.function(k)?);
    }
    for k in COLL_REDUCING {
        for (_, sfx) in COLL_DTYPES {
            let name = format!("{k}_{sfx}");
            let f = module.function(&name)?;
            fns.insert(name, f);
        }
    }
    Ok(CollKernels {
        _module: module,
        fns,
    })
}

fn compile_kernels(dev: &Device, driver_version: i32) -> Result<Kernels> {
    let (module, origin) = build(dev, driver_version, nvrtc::KERNELS, "symheap_kernels.cu")?;
    Ok(Kernels {
        copy: module.function("symheap_copy")?,
        put_signal: module.function("symheap_put_signal")?,
        signal: module.function("symheap_signal")?,
        wait: module.function("symheap_wait")?,
        barrier: module.function("symheap_barrier")?,
        atomic: module.function("symheap_atomic")?,
        _module: module,
        origin,
    })
}

impl CudaBackend {
    /// Opens the device, compiles (or loads) the kernels and reserves the slots.
    /// Collective at init (the PEs agree on the collective protocols).
    pub fn new(
        boot: Arc<dyn Bootstrap>,
        node: NodeInfo,
        channel: NodeChannel,
        device: usize,
        cfg: &crate::config::Config,
    ) -> Result<CudaBackend> {
        let (capacity, timeout) = (cfg.capacity, cfg.timeout);
        let coll_defines = cfg.coll_defines.clone();
        let mut phases = crate::util::Phases::start();
        let driver_version = driver::init()?;
        phases.mark("driver");
        let dev = Device::open(device)?;
        phases.mark("device");
        if dev.cc < MIN_ARCH {
            return Err(err(
                "init",
                ErrorKind::Unsupported(format!(
                    "{} is sm_{}{}; symheap's kernels need sm_{}{} or newer",
                    dev.name, dev.cc.0, dev.cc.1, MIN_ARCH.0, MIN_ARCH.1
                )),
            ));
        }
        let kernels = compile_kernels(&dev, driver_version)?;
        phases.mark("kernels");
        let coll = compile_coll(&dev, driver_version, &coll_defines)?;
        phases.mark("collective kernels");
        let gran = dev.granularity()?;
        let capacity = ceil_to(capacity, gran);
        let world = boot.size();
        let reserved = capacity
            .checked_mul(world as u64)
            .ok_or_else(|| backend("init", format!("{world} PEs x {capacity} bytes overflow")))?;
        let base = driver::reserve(reserved, gran).map_err(|e| {
            backend(
                "init",
                format!(
                    "{} (lower SYMHEAP_HEAP_CAPACITY)",
                    match e.kind() {
                        ErrorKind::Backend(m) => m.clone(),
                        k => k.to_string(),
                    }
                ),
            )
        })?;
        let direct = (0..world)
            .map(|r| node.node_of[r] == node.node_index)
            .collect();

        let stream = driver::stream_create()?;
        let flags = Arc::new(MappedHost::new(64)?);
        for m in [&kernels._module, &coll._module] {
            m.set_global_u64(ABORT_VAR, flags.dev + ABORT as u64)?;
        }
        // A failure noticed anywhere (a PE exited, aborted or diverged) ends every device-side
        // wait of this PE within microseconds, instead of at SYMHEAP_TIMEOUT.
        let word = flags.clone();
        boot.health()
            .on_fail(Box::new(move || word.write_u32(ABORT, 1)));
        phases.mark("address space and stream");
        Ok(CudaBackend {
            rank: boot.rank(),
            capacity,
            gran,
            dev,
            driver_version,
            base,
            reserved,
            direct: Mutex::new(direct),
            node,
            channel,
            boot,
            state: Mutex::new(HeapMaps {
                chunks: Vec::new(),
                maps: Vec::new(),
            }),
            kernels,
            coll,
            stream,
            flags,
            ops: Mutex::new(()),
            timeout,
            coll_defines,
            init_phases: phases,
            protocols: std::sync::OnceLock::new(),
        })
    }

    /// Collective at init, once every PE is known to run this backend: the PEs agree on the
    /// collective protocols (LL128 only if every PE's links and GPU allow it).
    pub(crate) fn agree_protocols(&self, choice: TopologyChoice) -> Result<()> {
        let direct = self
            .direct
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let p = topology::agree(self.boot.as_ref(), &self.dev, &direct, choice)?;
        let _ = self.protocols.set(p);
        Ok(())
    }

    /// The collective protocols in use and why (LL128 only where the links are verified).
    pub fn protocols(&self) -> Protocols {
        self.protocols.get().cloned().unwrap_or(Protocols {
            ll128: false,
            why: "not agreed yet".into(),
        })
    }

    /// Where the backend's start-up time went (driver, device, kernels, ...), for the banner.
    pub fn init_breakdown(&self) -> String {
        self.init_phases.render()
    }

    fn slot(&self, pe: usize) -> u64 {
        self.base + pe as u64 * self.capacity
    }

    fn is_direct(&self, pe: usize) -> bool {
        self.direct
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(pe)
            .copied()
            .unwrap_or(false)
    }

    /// The device ordinal in use.
    pub fn device_ordinal(&self) -> usize {
        self.dev.ordinal
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.dev.cc
    }

    /// Number of SMs.
    pub fn sm_count(&self) -> i32 {
        self.dev.sm_count
    }

    /// A collective tuning constant: its `SYMHEAP_COLL_DEFINES` value, else `default` (which
    /// must equal the kernel source's own default where the kernels read the name too).
    pub fn coll_tuning(&self, name: &str, default: u64) -> u64 {
        // Without verified links LL128 is off whatever the tuning says: its whole-line stores
        // are not promised to arrive whole (see topology.rs).
        if !self.protocols.get().is_some_and(|p| p.ll128)
            && matches!(
                name,
                "SYMHEAP_COLL_LL128_MAX" | "SYMHEAP_COLL_XCHG_LL128_MAX"
            )
        {
            return 0;
        }
        self.coll_defines
            .iter()
            .find(|(n, _)| n == name)
            .map_or(default, |&(_, v)| v)
    }

    /// Makes this backend's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.dev.bind()
    }

    fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos().min(u64::MAX as u128) as u64
    }

    fn launch_copy(&self, dst: u64, src: u64, bytes: u64, stream: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let block = 512u32;
        // Each thread moves four 16-byte vectors per step; enough blocks to keep every SM busy,
        // no more than the data needs.
        let per_block = block as u64 * 16 * 4;
        let grid = bytes
            .div_ceil(per_block)
            .clamp(1, (self.dev.sm_count.max(1) as u64) * 8) as u32;
        driver::launch(
            self.kernels.copy,
            grid,
            block,
            0,
            stream,
            &[Arg::U64(dst), Arg::U64(src), Arg::U64(bytes)],
        )
    }

    /// Enqueues a copy of `bytes` from `src` to `dst` (device addresses, any direct PE) on
    /// `stream`, by the copy engines (`Auto`, `CopyEngine`) or an SM kernel (`Sm`).
    pub fn copy_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: u64,
        engine: Engine,
    ) -> Result<()> {
        self.bind()?;
        match engine {
            _ if bytes == 0 => Ok(()),
            Engine::Sm => self.launch_copy(dst, src, bytes, stream),
            Engine::Auto | Engine::CopyEngine => driver::copy_async(dst, src, bytes, stream),
        }
    }

    /// Enqueues a signal update on `stream`: set (op 0) or add (op 1), ordered after everything
    /// earlier on the stream and released at system scope.
    pub fn signal_on_stream(&self, sig: u64, value: u64, add: bool, stream: u64) -> Result<()> {
        self.bind()?;
        driver::launch(
            self.kernels.signal,
            1,
            1,
            0,
            stream,
            &[Arg::U64(sig), Arg::U64(value), Arg::I32(i32::from(add))],
        )
    }

    /// Enqueues a copy of `bytes` from `src` to `dst` followed by a signal update as
    /// `signal_on_stream` does: whoever observes the signal observes the data. Up to
    /// `FUSED_PUT_SIGNAL_MAX` bytes this is one single-block launch; above, a copy-engine copy,
    /// then the signal.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        sig: u64,
        value: u64,
        add: bool,
        stream: u64,
    ) -> Result<()> {
        if bytes > FUSED_PUT_SIGNAL_MAX {
            self.copy_on_stream(dst, src, bytes, stream, Engine::Auto)?;
            return self.signal_on_stream(sig, value, add, stream);
        }
        self.bind()?;
        driver::launch(
            self.kernels.put_signal,
            1,
            fused_put_signal_threads(bytes),
            0,
            stream,
            &[
                Arg::U64(dst),
                Arg::U64(src),
                Arg::U64(bytes),
                Arg::U64(sig),
                Arg::U64(value),
                Arg::I32(i32::from(add)),
            ],
        )
    }

    /// Enqueues a wait until `*sig CMP value` (cmp per symheap.cuh's constants) on `stream`. A
    /// wait longer than the timeout stops and raises the device error flag.
    pub fn wait_on_stream(&self, sig: u64, cmp: i32, value: u64, stream: u64) -> Result<()> {
        self.bind()?;
        driver::launch(
            self.kernels.wait,
            1,
            1,
            0,
            stream,
            &[
                Arg::U64(sig),
                Arg::I32(cmp),
                Arg::U64(value),
                Arg::U64(self.timeout_ns()),
                Arg::U64(self.flags.dev + ERR_WAIT as u64),
            ],
        )
    }

    /// Enqueues a barrier among `n` members on `stream`. `flags` is this PE's flag array,
    /// `peer_flags` a device array of every member's flag array address, `epoch_ptr` this PE's
    /// barrier counter (advanced by the kernel, so a captured graph stays correct on replay).
    #[allow(clippy::too_many_arguments)]
    pub fn barrier_on_stream(
        &self,
        flags: u64,
        peer_flags: u64,
        epoch_ptr: u64,
        me: usize,
        n: usize,
        stream: u64,
    ) -> Result<()> {
        self.bind()?;
        let threads = (n as u32).next_multiple_of(32).max(32);
        driver::launch(
            self.kernels.barrier,
            1,
            threads,
            0,
            stream,
            &[
                Arg::U64(flags),
                Arg::U64(peer_flags),
                Arg::U64(epoch_ptr),
                Arg::I32(me as i32),
                Arg::I32(n as i32),
                Arg::U64(self.timeout_ns()),
                Arg::U64(self.flags.dev + ERR_BARRIER as u64),
            ],
        )
    }

    /// Launches collective kernel `name` (from coll.cu) with `grid` blocks of 512 threads.
    pub(crate) fn launch_coll(
        &self,
        name: &str,
        grid: u32,
        stream: u64,
        args: &[Arg],
    ) -> Result<()> {
        self.bind()?;
        let f = *self
            .coll
            .fns
            .get(name)
            .ok_or_else(|| backend("collective", format!("no kernel {name}")))?;
        driver::launch(f, grid, 512, 0, stream, args)
    }

    /// The backend's own non-blocking stream (host-level calls run their kernels on it).
    pub fn internal_stream(&self) -> u64 {
        self.stream.0
    }

    /// The mapped word collective kernels raise on a timeout.
    pub(crate) fn coll_error_word(&self) -> u64 {
        self.flags.dev + ERR_COLL as u64
    }

    /// The device-side wait bound, in nanoseconds.
    pub(crate) fn wait_bound_ns(&self) -> u64 {
        self.timeout_ns()
    }

    /// At finalize: waits for every stream's work of this device (the only point where that is
    /// the right thing: nothing may still run on the heap when it is unmapped) and reports a
    /// device-side wait that gave up since the last check.
    pub(crate) fn finish_device_work(&self) -> Result<()> {
        self.bind()?;
        driver::ctx_synchronize()?;
        self.check_device_errors()
    }

    /// Waits for `stream` and reports a device-side wait that timed out since the last check.
    pub fn sync_stream(&self, stream: u64) -> Result<()> {
        self.bind()?;
        driver::stream_sync(stream)?;
        self.check_device_errors()
    }

    /// A device-side wait or barrier that gave up raises a flag; this turns it into an error
    /// (once).
    pub fn check_device_errors(&self) -> Result<()> {
        if self.flags.read_u32(ABORT) != 0 {
            if let Some(kind) = self.boot.health().failure() {
                for off in [ERR_WAIT, ERR_BARRIER, ERR_COLL] {
                    self.flags.write_u32(off, 0);
                }
                return Err(err("sync_stream", kind));
            }
        }
        for (off, what) in [
            (ERR_WAIT, "a signal_wait_until on a stream"),
            (ERR_BARRIER, "a barrier on a stream"),
            (ERR_COLL, "a collective on a stream"),
        ] {
            let code = self.flags.read_u32(off);
            if code != 0 {
                self.flags.write_u32(off, 0);
                // coll.cu's SYMHEAP_ERR_COLL_LAUNCH: a kernel launched outside its preconditions
                // (a launcher bug, not a peer's absence).
                if off == ERR_COLL && code == 4 {
                    return Err(backend(
                        "sync_stream",
                        "a collective kernel was launched outside its preconditions".to_string(),
                    ));
                }
                let kind = ErrorKind::Timeout {
                    what: format!("{what} (device side, SYMHEAP_TIMEOUT)"),
                    waited: self.timeout,
                    missing: vec![],
                };
                // A signal wait is this PE's own; a barrier or collective that timed out has left
                // the other members stuck or out of step, so the whole job fails alike.
                if off != ERR_WAIT {
                    self.boot.fail_all(kind.clone());
                }
                return Err(err("sync_stream", kind));
            }
        }
        Ok(())
    }

    /// Whether `stream` is being captured into a CUDA graph.
    pub fn is_capturing(&self, stream: u64) -> Result<bool> {
        self.bind()?;
        driver::is_capturing(stream)
    }
}

/// Everything enqueued on the streams a released block was used on, at its release.
struct StreamFence {
    events: Vec<driver::DoneEvent>,
    /// Streams that were being captured at the release: their events are recorded once the
    /// capture ends (an event recorded inside a capture would be a node of the graph).
    capturing: Vec<u64>,
}

impl StreamFence {
    /// A stream the driver no longer knows (destroyed since it was used): its work may still
    /// run, and only the whole device can be waited for.
    fn lost_stream(&mut self, stream: u64, why: &crate::Error) {
        tracing::warn!(
            "stream {stream:#x} of a released buffer is unusable ({why}); waiting for the whole device"
        );
        let _ = driver::ctx_synchronize();
    }
}

impl crate::backend::Fence for StreamFence {
    fn done(&mut self) -> bool {
        let mut still = Vec::new();
        for s in std::mem::take(&mut self.capturing) {
            match driver::is_capturing(s) {
                Ok(true) => still.push(s),
                Ok(false) => match driver::DoneEvent::record(s) {
                    Ok(e) => self.events.push(e),
                    Err(e) => self.lost_stream(s, &e),
                },
                Err(e) => self.lost_stream(s, &e),
            }
        }
        self.capturing = still;
        self.capturing.is_empty() && self.events.iter().all(driver::DoneEvent::is_done)
    }
}

/// A module of user kernels compiled by NVRTC against `symheap.cuh` for this device.
pub struct CudaModule {
    module: Module,
    dev: usize,
}

impl CudaModule {
    /// Launches `kernel` with a 1-D grid on `stream`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and size, and every pointer
    /// argument must be valid for the accesses the kernel makes (device memory of this context,
    /// or symmetric addresses from a peer table). A wrong argument makes the kernel read or
    /// write arbitrary device memory.
    pub unsafe fn launch(
        &self,
        kernel: &str,
        grid: u32,
        block: u32,
        shared: u32,
        stream: u64,
        args: &[KernelArg],
    ) -> Result<()> {
        let f = self.module.function(kernel)?;
        driver::launch(f, grid, block, shared, stream, args)
    }

    /// The device ordinal it was compiled for.
    pub fn device(&self) -> usize {
        self.dev
    }
}

impl CudaBackend {
    /// Compiles user CUDA C++ (which may `#include "symheap.cuh"`) for this device, using the
    /// kernel cache, and loads it.
    pub fn compile_module(&self, source: &str, name: &str) -> Result<CudaModule> {
        self.bind()?;
        let arch = (self.dev.cc.0 * 10 + self.dev.cc.1) as u32;
        let nv = nvrtc::version().map_err(|m| err("compile_module", ErrorKind::Unsupported(m)))?;
        let hash = prebuilt::source_hash(&[nvrtc::HEADER, source]);
        let path = cache::path(hash, arch, self.driver_version, nv);
        let image = match cache::load(&path) {
            Some(i) => i,
            None => {
                let i = nvrtc::compile_cubin(source, name, arch, &[("symheap.cuh", nvrtc::HEADER)])
                    .map_err(|log| {
                        invalid(
                            "compile_module",
                            format!("{name} does not compile for sm_{arch}: {log}"),
                        )
                    })?;
                cache::store(&path, &i);
                i
            }
        };
        Ok(CudaModule {
            module: Module::load(&image)?,
            dev: self.dev.ordinal,
        })
    }

    /// Creates a non-blocking stream (for programs without a framework that owns streams).
    pub fn create_stream(&self) -> Result<u64> {
        self.bind()?;
        Ok(driver::stream_create()?.0)
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn describe(&self) -> String {
        format!(
            "CUDA device {} ({}, GPU-{:02x}{:02x}{:02x}{:02x}, sm_{}{}, {} SMs), driver {}.{}, kernels {}, VMM granularity {} KiB",
            self.dev.ordinal,
            self.dev.name,
            self.dev.uuid[0],
            self.dev.uuid[1],
            self.dev.uuid[2],
            self.dev.uuid[3],
            self.dev.cc.0,
            self.dev.cc.1,
            self.dev.sm_count,
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10,
            self.kernels.origin,
            self.gran >> 10
        )
    }

    fn granularity(&self) -> u64 {
        self.gran
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn mapped(&self) -> u64 {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.chunks.last().map(|c| c.offset + c.bytes).unwrap_or(0)
    }

    fn chunks(&self) -> Vec<ChunkInfo> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .clone()
    }

    fn slot_base(&self, pe: usize) -> Option<u64> {
        self.is_direct(pe).then(|| self.slot(pe))
    }

    fn can_spare(&self, bytes: u64) -> bool {
        // Headroom only while the device keeps four times as much free besides, so it never
        // takes memory PyTorch or the user's own allocations are about to need.
        self.bind().is_ok() && driver::mem_info().is_ok_and(|(free, _)| free / 5 >= bytes)
    }

    fn grow(&self, new_mapped: u64, vote: GrowVote<'_>) -> Result<()> {
        if let Err(e) = self.bind() {
            vote(Some(&e))?;
            return Err(e);
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let from = st.chunks.last().map(|c| c.offset + c.bytes).unwrap_or(0);
        if new_mapped <= from || new_mapped > self.capacity || new_mapped % self.gran != 0 {
            return Err(backend(
                "grow",
                format!(
                    "cannot grow from {from} to {new_mapped} bytes (capacity {})",
                    self.capacity
                ),
            ));
        }
        let len = new_mapped - from;
        let handle = match self.dev.create(len) {
            Ok(h) => h,
            Err(e) => {
                let e = backend(
                    "grow",
                    format!(
                        "{} (GPU memory exhausted? the chunk was {} MiB)",
                        e.kind(),
                        len >> 20
                    ),
                );
                vote(Some(&e))?;
                return Err(e);
            }
        };
        let own = self.slot(self.rank) + from;
        // Everything up to the vote is local and undone the same way whether this PE failed
        // or another one did.
        let fd = driver::map(own, len, handle)
            .and_then(|_| self.dev.set_access(own, len))
            .and_then(|_| driver::export_fd(handle))
            .map_err(|e| e.during("grow"));
        let fd = match vote(fd.as_ref().err()).and(fd) {
            Ok(fd) => fd,
            Err(e) => {
                driver::unmap(own, len);
                driver::release(handle);
                return Err(e);
            }
        };
        st.maps.push(Mapping {
            addr: own,
            bytes: len,
            handle,
        });
        let all = self
            .channel
            .exchange_fds(std::slice::from_ref(&fd), self.boot.health())
            .map_err(|e| e.during("grow"))?;
        let first_grow = from == 0;
        for (lr, fds) in all.iter().enumerate() {
            let pe = self.node.local_peers[lr];
            if pe == self.rank || !self.is_direct(pe) {
                continue;
            }
            let f = fds
                .first()
                .ok_or_else(|| backend("grow", format!("PE {pe} passed no chunk")))?;
            let h = driver::import_fd(f).map_err(|e| e.during("grow"))?;
            let at = self.slot(pe) + from;
            driver::map(at, len, h).map_err(|e| e.during("grow"))?;
            match self.dev.set_access(at, len) {
                Ok(()) => st.maps.push(Mapping {
                    addr: at,
                    bytes: len,
                    handle: h,
                }),
                Err(e) if first_grow => {
                    // No peer-to-peer path to that GPU: it stays reachable only through the
                    // host, so its table entries are 0.
                    tracing::info!(pe, "peer memory not accessible from this GPU: {e}");
                    driver::unmap(at, len);
                    driver::release(h);
                    self.direct.lock().unwrap_or_else(|p| p.into_inner())[pe] = false;
                }
                Err(e) => {
                    driver::unmap(at, len);
                    driver::release(h);
                    return Err(e.during("grow"));
                }
            }
        }
        st.chunks.push(ChunkInfo {
            offset: from,
            bytes: len,
        });
        Ok(())
    }

    fn write_bytes(&self, addr: u64, src: &[u8]) -> Result<()> {
        self.bind()?;
        let _g = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        driver::htod(addr, src, self.stream.0)
    }

    fn read_bytes(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        let _g = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        driver::dtoh(dst, addr, self.stream.0)
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        let _g = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        driver::copy_async(dst, src, bytes as u64, self.stream.0)?;
        driver::stream_sync(self.stream.0)
    }

    fn atomic(
        &self,
        addr: u64,
        width: usize,
        op: AtomicOp,
        operand: u64,
        compare: u64,
    ) -> Result<u64> {
        if !(width == 4 || width == 8) || addr % width as u64 != 0 {
            return Err(invalid(
                "atomic",
                format!("address {addr:#x} is not aligned to {width} bytes"),
            ));
        }
        self.bind()?;
        let code = match op {
            AtomicOp::Load => 0,
            AtomicOp::Store => 1,
            AtomicOp::Swap => 2,
            AtomicOp::CompareSwap => 3,
            AtomicOp::Add => 4,
            AtomicOp::And => 5,
            AtomicOp::Or => 6,
            AtomicOp::Xor => 7,
        };
        let _g = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        driver::launch(
            self.kernels.atomic,
            1,
            1,
            0,
            self.stream.0,
            &[
                Arg::U64(addr),
                Arg::I32(code),
                Arg::I32(width as i32),
                Arg::U64(operand),
                Arg::U64(compare),
                Arg::U64(self.flags.dev + ATOMIC_OLD as u64),
            ],
        )?;
        driver::stream_sync(self.stream.0)?;
        Ok(self.flags.read_u64(ATOMIC_OLD))
    }

    fn reduce(
        &self,
        dst: u64,
        srcs: &[u64],
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        // The host-driven collective path; the GPU collectives run their own kernels on streams.
        let bytes = count * dtype.size();
        let mut inputs = Vec::with_capacity(srcs.len());
        for &s in srcs {
            let mut b = vec![0u8; bytes];
            self.read_bytes(s, &mut b)?;
            inputs.push(b);
        }
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![0u8; bytes];
        reduce_bytes(&mut out, &refs, dtype, op);
        self.write_bytes(dst, &out)
    }

    fn fence(&self) {
        // Host-issued operations on this backend complete before they return.
    }

    fn fence_streams(&self, streams: &[u64]) -> Option<Box<dyn crate::backend::Fence>> {
        if streams.is_empty() {
            return None;
        }
        let mut f = StreamFence {
            events: Vec::new(),
            capturing: Vec::new(),
        };
        if self.bind().is_err() {
            return None;
        }
        for &s in streams {
            match driver::is_capturing(s) {
                Ok(true) => f.capturing.push(s),
                Ok(false) => match driver::DoneEvent::record(s) {
                    Ok(e) => f.events.push(e),
                    Err(e) => f.lost_stream(s, &e),
                },
                Err(e) => f.lost_stream(s, &e),
            }
        }
        tracing::debug!(
            ?streams,
            events = f.events.len(),
            capturing = f.capturing.len(),
            "release fenced"
        );
        Some(Box::new(f))
    }

    fn poll_interval(&self) -> Option<Duration> {
        Some(Duration::from_micros(100))
    }

    fn as_cuda(&self) -> Option<&CudaBackend> {
        Some(self)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = driver::stream_sync(self.stream.0);
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for m in st.maps.drain(..) {
            driver::unmap(m.addr, m.bytes);
            driver::release(m.handle);
        }
        driver::release_reservation(self.base, self.reserved);
        driver::stream_destroy(self.stream);
    }
}

#[cfg(test)]
mod coll_source_tests {
    use super::*;

    #[test]
    fn defines_go_ahead_of_the_kernels() {
        let src = coll_source(&[
            ("SYMHEAP_COLL_LL_MAX".to_string(), 128 << 10),
            ("SYMHEAP_COLL_BCAST_PUSH".to_string(), 0),
        ]);
        assert!(src.starts_with(
            "#define SYMHEAP_COLL_LL_MAX 131072\n#define SYMHEAP_COLL_BCAST_PUSH 0\n"
        ));
        assert!(src.ends_with(nvrtc::COLL));
        assert_eq!(coll_source(&[]), nvrtc::COLL);
    }
}

#[cfg(test)]
mod put_signal_tests {
    use super::*;

    #[test]
    fn fused_put_signal_block_fits_the_data() {
        // A signal alone or a word: one warp; one vector per thread up to 512 threads.
        assert_eq!(fused_put_signal_threads(0), 32);
        assert_eq!(fused_put_signal_threads(8), 32);
        assert_eq!(fused_put_signal_threads(32 * 16), 32);
        assert_eq!(fused_put_signal_threads(32 * 16 + 1), 64);
        assert_eq!(fused_put_signal_threads(4096), 256);
        assert_eq!(fused_put_signal_threads(8192), 512);
        assert_eq!(fused_put_signal_threads(FUSED_PUT_SIGNAL_MAX), 512);
    }
}
