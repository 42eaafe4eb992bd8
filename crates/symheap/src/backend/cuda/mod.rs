//! The CUDA backend: a GPU symmetric heap with the same slot layout as the host backend.
//!
//! Each PE reserves `world × capacity` bytes of device virtual address space in its device's
//! primary context (so PyTorch and the CUDA runtime share it). Growing creates this PE's next
//! chunk with `cuMemCreate` (exportable as a POSIX file descriptor), passes the descriptor to
//! the node's other PEs over the node channel, imports theirs and maps every chunk at its
//! owner's slot; peers whose memory this device cannot reach (no peer-to-peer path) are not
//! direct and get 0 in every table. Kernels are CUDA C++ compiled at run time by NVRTC for the
//! device's own arch and cached on disk.

mod arg_block;
mod cache;
pub(crate) mod coll_args;
mod compat;
pub(crate) mod driver;
mod kernel_args;
mod kernels;
mod module;
pub(crate) mod nccl;

pub mod nvrtc;
mod nvrtc_sys;
mod prebuilt;
mod stream_ops;
pub mod topology;

use coll_args::CollKernels;
use kernel_args::AtomicArgs;
pub use kernels::{
    coll_source, coll_supports, compile_shipped, kernel_entries, kernels_source, prebuilt_archs,
    prebuilt_file_name, prebuilt_images, shipped_sources, KernelEntry, COLL_DTYPES,
};
use kernels::{compile_coll, compile_kernels, Kernels};
pub use module::CudaModule;
pub use prebuilt::KernelImage;
pub use stream_ops::FUSED_PUT_SIGNAL_MAX;

pub use crate::config::TopologyChoice;
pub use topology::Protocols;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::driver::{Device, MappedHost, Stream};
use super::reduce::reduce_bytes;
use super::{AtomicOp, Backend, BackendKind, ChunkInfo, GrowVote, ReduceOp};
use crate::bootstrap::{Bootstrap, NodeChannel, NodeInfo};
use crate::element::DType;
use crate::error::{backend, err, invalid, ErrorKind, Result};

pub use driver::Arg as KernelArg;

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
    /// `stream` as the handle the ops layer enqueues on.
    internal: crate::Stream,
    /// Error words, the abort word and the atomics' result, shared with the health callback
    /// that raises the abort word (it may outlive the backend).
    flags: Arc<MappedHost>,
    /// Serialises users of the internal stream and the mapped host block.
    ops: Mutex<()>,
    /// The events of release fences (one per `free` of a buffer a stream used), reused.
    events: Arc<driver::EventPool>,
    timeout: Duration,
    /// `SYMHEAP_COLL_DEFINES`, compiled into the collective kernels.
    coll_defines: Vec<(String, u64)>,
    /// Where `new`'s time went, for the banner.
    init_phases: crate::util::Phases,
    /// symheap's own device memory outside the heap (the modules' globals, which hold the
    /// abort word's address): no user range may overlap it.
    internal_ranges: Vec<(u64, u64)>,
    /// The collective protocols every PE agreed on (LL128 only over verified links); set by
    /// [`agree_protocols`](Self::agree_protocols) right after the PEs agreed on the backend.
    protocols: std::sync::OnceLock<Protocols>,
    /// Last: fields drop in order, so the modules, the events and the mapped block above go
    /// while this retain of the context still stands (in a process where nothing else retains
    /// it, releasing it destroys the context and everything made in it).
    dev: Device,
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

impl CudaBackend {
    /// Opens the device, compiles (or loads) the kernels and reserves the slots.
    /// Collective at init (the PEs agree on the collective protocols).
    pub(crate) fn new(
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
        let kernels = compile_kernels(&dev, driver_version, cfg.kernel_image)?;
        phases.mark("kernels");
        let coll = compile_coll(&dev, driver_version, cfg.kernel_image, &coll_defines)?;
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
        let flags = Arc::new(MappedHost::new(64, dev.hold())?);
        let mut internal_ranges = Vec::new();
        for m in [&kernels._module, &coll._module] {
            m.set_global_u64(ABORT_VAR, flags.dev + ABORT as u64)?;
            internal_ranges.push(m.global_range(ABORT_VAR)?);
        }
        // A failure noticed anywhere (a PE exited, aborted or diverged) ends every device-side
        // wait of this PE within microseconds, instead of at SYMHEAP_TIMEOUT.
        let word = flags.clone();
        boot.health()
            .on_fail(Box::new(move || word.write_u32(ABORT, 1)));
        let events = driver::EventPool::new(dev.hold());
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
            // SAFETY: the backend's own stream, destroyed only in the backend's Drop, after
            // every user of this view (the ops layer, the heap's release fences) is done.
            internal: unsafe { crate::Stream::from_raw(stream.0) },
            stream,
            flags,
            ops: Mutex::new(()),
            events,
            timeout,
            coll_defines,
            init_phases: phases,
            internal_ranges,
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

    /// The device's UUID (as NVML and `nvidia-smi -L` name it): two PEs with the same UUID
    /// share one GPU.
    pub fn device_uuid(&self) -> [u8; 16] {
        self.dev.uuid
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
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn describe(&self) -> String {
        let arch = (self.dev.cc.0 * 10 + self.dev.cc.1) as u32;
        // The NVRTC that `compile_module` (and kernels not prebuilt) would use on this GPU.
        let nvrtc = match nvrtc::for_arch(arch) {
            Ok((v, path)) => format!("NVRTC {}.{} at {}", v.0, v.1, path.display()),
            Err(_) => "no usable NVRTC".to_string(),
        };
        format!(
            "CUDA device {} ({}, GPU-{:02x}{:02x}{:02x}{:02x}, sm_{}{}, {} SMs), driver supports CUDA {}.{}, kernels: {}, {nvrtc}, VMM granularity {} KiB",
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
            .exchange_fds(std::slice::from_ref(&fd), self.boot.as_ref())
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
        let args = AtomicArgs {
            addr,
            operand,
            compare,
            old_out: self.flags.dev + ATOMIC_OLD as u64,
            op: code,
            width: width as i32,
        };
        // SAFETY: `addr` is a heap word of a direct PE the ops layer checked, aligned to `width`
        // (above); `old_out` is this backend's mapped block; the stream is the backend's own.
        unsafe { self.kernels.atomic.launch(1, 1, 0, self.stream.0, &args) }?;
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
        // Host-issued operations on this backend complete before they return; what is left is
        // the ordering of this thread's host stores (the doorbell handshake, see the trait).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    fn fence_streams(&self, streams: &[u64]) -> Option<Box<dyn crate::backend::Fence>> {
        self.stream_fence(streams)
    }

    fn poll_interval(&self) -> Option<Duration> {
        Some(Duration::from_micros(100))
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
