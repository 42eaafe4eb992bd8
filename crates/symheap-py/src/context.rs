//! `Context`: init and finalize, rank information, allocation, and every host operation on raw
//! symmetric addresses (the Python layer turns arrays and tensors into addresses). Every call
//! that can block (init, finalize, barriers, waits, collectives, copies) runs with the GIL
//! released.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use symheap::{BackendChoice, DType, Team};

use crate::buffer::{numel, parse_dtype, HeapView, SymmetricBuffer};
use crate::coll;
use crate::convert::{atomic_args, from_bits, parse_cmp, parse_signal_op, stream_or};
use crate::errors::{is_symheap_error, to_py, value_error, IntoPyResult};
use crate::store::{PyBootstrap, Source, Watcher};
use crate::team::{py_exchange, ranks_arg, PyTeam};

/// This PE's handle on the job. Made by `Context.init` (collective); `finalize()` (collective)
/// leaves the job.
///
/// The methods taking addresses work on raw symmetric addresses; `symheap`'s Python functions
/// take arrays and tensors and call these. Local host pointers given to the `*_from_host` /
/// `*_to_host` methods are trusted: pass only pointers of live arrays of at least `nbytes`
/// bytes. Local pointers of the `*_on_stream` methods are checked (a live symmetric
/// allocation, or on CUDA device memory of this PE's GPU).
#[pyclass(module = "symheap._native", name = "Context", frozen)]
pub struct PyContext {
    pub(crate) ctx: Arc<symheap::Context>,
    finalized: AtomicBool,
    /// The store watcher thread, when the rendezvous runs over a Python store.
    watcher: Option<Arc<Watcher>>,
}

impl PyContext {
    fn c(&self) -> &symheap::Context {
        &self.ctx
    }

    fn team_or_world(&self, team: Option<&PyTeam>) -> Team {
        match team {
            Some(t) => t.team.clone(),
            None => self.ctx.world_team(),
        }
    }
}

#[pymethods]
impl PyContext {
    /// Collective: joins the job and returns this PE's context.
    ///
    /// With no `store`/`comm`, the launcher environment decides (torchrun, `symheap launch`,
    /// Open MPI, MPICH, Slurm; nothing set = a single PE). `store` is an object with
    /// `set(key, bytes)`, `get(key) -> bytes` and `wait(keys, timedelta)` (torch.distributed's
    /// store): the rendezvous runs over it, with `rank` and `world_size` required. `comm` is an
    /// object with `allgather(obj) -> list` (mpi4py's `MPI.COMM_WORLD`), with `rank` and
    /// `world_size` taken from it when not given. `backend` is "host", "cuda" or "auto";
    /// `device` the CUDA ordinal (instead of `SYMHEAP_DEVICE`; the environment is left as it
    /// is); `capacity`/`chunk_size` are bytes; `timeout` is seconds. Releases the GIL while it
    /// waits.
    #[staticmethod]
    #[pyo3(signature = (*, store = None, comm = None, rank = None, world_size = None, backend = None, device = None, capacity = None, chunk_size = None, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn init(
        py: Python<'_>,
        store: Option<Py<PyAny>>,
        comm: Option<Py<PyAny>>,
        rank: Option<usize>,
        world_size: Option<usize>,
        backend: Option<&str>,
        device: Option<usize>,
        capacity: Option<u64>,
        chunk_size: Option<u64>,
        timeout: Option<f64>,
    ) -> PyResult<PyContext> {
        let mut b = symheap::Context::builder().py()?;
        if let Some(be) = backend {
            let choice = match be.trim().to_ascii_lowercase().as_str() {
                "host" => BackendChoice::Host,
                "cuda" => BackendChoice::Cuda,
                "auto" => BackendChoice::Auto,
                _ => {
                    return Err(value_error(format!(
                        "backend={be:?} is not accepted: expected \"host\", \"cuda\" or \"auto\""
                    )))
                }
            };
            b = b.backend(choice);
        }
        if let Some(d) = device {
            b = b.device(d);
        }
        if let Some(c) = capacity {
            symheap::config::check_capacity(c)
                .map_err(|e| value_error(format!("capacity={c} bytes is not accepted: {e}")))?;
            b = b.capacity(c);
        }
        if let Some(c) = chunk_size {
            if c == 0 {
                return Err(value_error(
                    "chunk_size=0 is not accepted: expected a positive number of bytes",
                ));
            }
            b = b.chunk_size(c);
        }
        let timeout = timeout
            .map(|t| {
                symheap::config::timeout_from_secs(t)
                    .map_err(|e| value_error(format!("timeout={t:?} is not accepted: {e}")))
            })
            .transpose()?;
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        let mut watcher = None;
        let source = match (store, comm) {
            (Some(_), Some(_)) => {
                return Err(value_error("pass either store or comm, not both"));
            }
            (Some(s), None) => Some(Source::Store(s)),
            (None, Some(c)) => Some(Source::Comm(c)),
            (None, None) => None,
        };
        if let Some(src) = source {
            let fallback = timeout.unwrap_or(symheap::config::DEFAULT_TIMEOUT);
            let boot = PyBootstrap::new(py, src, rank, world_size, fallback)?;
            watcher = Some(boot.watcher());
            b = b.bootstrap(Arc::new(boot));
        } else if rank.is_some() || world_size.is_some() {
            return Err(value_error(
                "rank and world_size are only used with store= or comm=; under a launcher they come from the environment",
            ));
        }
        let ctx = match py.detach(move || b.init()) {
            Ok(c) => c,
            Err(e) => {
                if let Some(w) = watcher {
                    py.detach(move || w.stop_and_join());
                }
                return Err(to_py(e));
            }
        };
        Ok(PyContext {
            ctx: Arc::new(ctx),
            finalized: AtomicBool::new(false),
            watcher,
        })
    }

    /// This PE's rank.
    #[getter]
    fn my_pe(&self) -> usize {
        self.c().my_pe()
    }

    /// Number of PEs.
    #[getter]
    fn n_pes(&self) -> usize {
        self.c().n_pes()
    }

    /// Raises the job's failure (a PE that exited, an abort, a divergence) as an error of
    /// `new_group`, does nothing while the job is healthy; local, never waits. The
    /// torch.distributed backend polls it while it waits on torch's store for the members of a
    /// group being made, which symheap's watch does not see.
    fn check_alive_new_group(&self) -> PyResult<()> {
        self.c().check_alive("new_group").py()
    }

    /// How long any wait may take (`SYMHEAP_TIMEOUT` or `init(timeout=)`), in nanoseconds: the
    /// bound a user kernel's waits should use, like symheap's own.
    #[getter]
    fn timeout_ns(&self) -> u64 {
        self.c().config().timeout.as_nanos().min(u64::MAX as u128) as u64
    }

    /// This PE's index among the PEs of its node.
    #[getter]
    fn local_rank(&self) -> usize {
        self.c().local_rank()
    }

    /// Number of PEs on this node.
    #[getter]
    fn local_size(&self) -> usize {
        self.c().local_size()
    }

    /// `"host"` or `"cuda"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.c().backend_kind().name()
    }

    /// CUDA device ordinal of this PE (None on the host backend).
    #[getter]
    fn device_ordinal(&self) -> Option<usize> {
        self.c().cuda().map(|c| c.device_ordinal())
    }

    /// True once `finalize()` was called through this object.
    #[getter]
    fn finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Collective: leaves the job. Buffers stay readable in this process, but every later
    /// symheap call fails. Calling it again does nothing.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let ctx = self.ctx.clone();
        let watcher = self.watcher.clone();
        py.detach(move || {
            let r = ctx.finalize();
            if let Some(w) = watcher {
                w.stop_and_join();
            }
            r
        })
        .py()
    }

    /// Not collective: makes every PE fail with `reason` (they notice within milliseconds).
    fn abort(&self, py: Python<'_>, reason: &str) {
        let ctx = self.ctx.clone();
        let watcher = self.watcher.clone();
        let reason = reason.to_string();
        py.detach(move || {
            ctx.abort(&reason);
            if let Some(w) = watcher {
                w.stop_and_join();
            }
        })
    }

    /// The diagnostic banner (version, backend, PEs, heap layout, environment read).
    fn banner(&self) -> String {
        self.c().banner()
    }

    /// Heap occupancy on this PE: `{in_use, mapped, capacity, live_blocks, allocation_syncs}`
    /// (bytes, blocks, and allocations that met the other PEs to reclaim or grow).
    fn heap_usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = self.c().heap_usage();
        let d = PyDict::new(py);
        d.set_item("in_use", u.in_use)?;
        d.set_item("mapped", u.mapped)?;
        d.set_item("capacity", u.capacity)?;
        d.set_item("live_blocks", u.live_blocks)?;
        d.set_item("allocation_syncs", u.allocation_syncs)?;
        d.set_item("waiting_releases", u.waiting_releases)?;
        Ok(d)
    }

    /// Start of every PE's heap in this process (0 where not directly addressable).
    fn heap_bases(&self) -> Vec<u64> {
        self.c().heap_bases()
    }

    /// PEs whose heaps this process can load from and store to directly.
    fn direct_peers(&self) -> Vec<usize> {
        self.c().direct_peers().iter().collect()
    }

    /// Whether `[addr, addr + nbytes)` lies in this PE's mapped symmetric heap.
    #[pyo3(signature = (addr, nbytes = 1))]
    fn is_symmetric(&self, addr: u64, nbytes: u64) -> bool {
        let c = self.c();
        match addr.checked_add(nbytes.max(1) - 1) {
            Some(last) => c.is_symmetric(addr) && c.is_symmetric(last),
            None => false,
        }
    }

    /// Whether the stream collective `coll` (all_reduce, reduce_scatter, all_gather, broadcast,
    /// alltoall) of `nbytes` per member on `team` takes any device memory of this PE's GPU for
    /// its source and destination (its kernel touches them on this PE only), so an ordinary
    /// tensor needs no staging copy. The same answer on every PE for the same call.
    #[pyo3(signature = (coll, team, nbytes, algo = "auto"))]
    fn coll_takes_local_buffers(
        &self,
        coll: &str,
        team: Option<&PyTeam>,
        nbytes: u64,
        algo: &str,
    ) -> PyResult<bool> {
        let c = coll::stream_coll(coll, algo)?;
        let t = self.team_or_world(team);
        Ok(self.c().coll_takes_local_buffers(c, &t, nbytes))
    }

    /// The collectives' aliasing rules (`symheap::alias`) for `coll` (all_reduce,
    /// reduce_scatter, all_gather, broadcast, alltoall) on `team` with destination bytes
    /// `[dest, dest + dest_len)`, source bytes `[src, src + src_len)` and `count` elements of
    /// `dtype` per block: True when it is the kind's in-place form, False when the two are
    /// apart (or this PE is not a member), `SymheapValueError` naming both ranges otherwise.
    /// For callers that stage their buffers (the torch ops), so that the rules hold whatever
    /// the path.
    #[pyo3(signature = (coll, team, dest, dest_len, src, src_len, count, dtype))]
    #[allow(clippy::too_many_arguments)]
    fn check_coll_buffers(
        &self,
        coll: &str,
        team: Option<&PyTeam>,
        dest: u64,
        dest_len: u64,
        src: u64,
        src_len: u64,
        count: u64,
        dtype: &str,
    ) -> PyResult<bool> {
        let t = self.team_or_world(team);
        let (d, s) = ((dest, dest_len), (src, src_len));
        coll::check_buffers(self.c(), coll, &t, d, s, count, dtype)
    }

    /// Raises `SymheapValueError` (naming `what` and the reason) unless `[addr, addr + nbytes)`
    /// lies in one live allocation of this PE's heap that was not freed here.
    #[pyo3(signature = (addr, nbytes, what))]
    fn check_symmetric(&self, addr: u64, nbytes: u64, what: &str) -> PyResult<()> {
        self.c()
            .check_symmetric(addr, nbytes)
            .map_err(|e| {
                let symheap::ErrorKind::InvalidArgument(why) = e.kind() else {
                    return e;
                };
                symheap::Error::new(
                    e.pe(),
                    "check_symmetric",
                    symheap::ErrorKind::InvalidArgument(format!("{what}: {why}")),
                )
            })
            .py()
    }

    /// Translates `addr` (in PE `src_pe`'s heap) to the same byte of PE `dst_pe`'s heap; None
    /// when PE `dst_pe` is not directly addressable. Raises for an address outside the heap.
    fn translate(&self, addr: u64, src_pe: usize, dst_pe: usize) -> PyResult<Option<u64>> {
        self.c().translate(addr, src_pe, dst_pe).py()
    }

    /// The peer table of the symmetric address `addr` of this PE:
    /// `table[r] = translate(addr, my_pe, r)` (0 when PE r is not direct).
    fn peer_bases_for(&self, addr: u64) -> PyResult<Vec<u64>> {
        let c = self.c();
        (0..c.n_pes())
            .map(|r| c.translate(addr, c.my_pe(), r).map(|a| a.unwrap_or(0)))
            .collect::<symheap::Result<Vec<u64>>>()
            .py()
    }

    /// Collective: allocates an array of `shape` and `dtype` on the symmetric heap (at least one
    /// byte), aligned to `align`; `zero` clears this PE's copy. Contents are otherwise
    /// unspecified; a peer may write into it only after a barrier. `stream` (a raw CUDA stream
    /// handle) is recorded as using the buffer, as `SymmetricBuffer.record_stream` does, in
    /// the same call.
    #[pyo3(signature = (shape, dtype, align = 256, zero = false, stream = None))]
    fn allocate(
        &self,
        py: Python<'_>,
        shape: Vec<i64>,
        dtype: &str,
        align: u64,
        zero: bool,
        stream: Option<u64>,
    ) -> PyResult<SymmetricBuffer> {
        let dt = parse_dtype(dtype)?;
        let n = numel(&shape)?;
        let bytes = n
            .checked_mul(dt.size() as u64)
            .ok_or_else(|| value_error(format!("shape {shape:?} is too large")))?;
        let ctx = self.ctx.clone();
        let buf = py
            .detach(move || {
                let b = ctx.allocate_bytes(bytes.max(1), align)?;
                if zero {
                    b.write(0, &vec![0u8; bytes as usize])?;
                }
                if let Some(s) = stream {
                    b.record_stream(&crate::convert::stream_or(Some(s)))?;
                }
                Ok::<_, symheap::Error>(b)
            })
            .py()?;
        Ok(SymmetricBuffer::new(self.ctx.clone(), buf, shape, dt))
    }

    /// A `HeapView` of `shape`/`dtype` (strides in elements, row-major when None) at `addr`,
    /// which must lie in the mapped symmetric heap of a directly reachable PE. The view keeps
    /// `owner` alive; pass the `SymmetricBuffer` whose memory it shows (not a torch tensor:
    /// PyTorch crashes when a tensor is released from inside another tensor's DLPack deleter).
    /// A view of a `SymmetricBuffer` (or of another view of one) holds a share of the
    /// allocation, so its memory is not reused while the view exists; a freed buffer is
    /// refused.
    #[pyo3(signature = (addr, shape, dtype, strides = None, owner = None))]
    fn view(
        &self,
        py: Python<'_>,
        addr: u64,
        shape: Vec<i64>,
        dtype: &str,
        strides: Option<Vec<i64>>,
        owner: Option<Py<PyAny>>,
    ) -> PyResult<HeapView> {
        let keep = match owner.as_ref().map(|o| o.bind(py)) {
            Some(o) => {
                if let Ok(b) = o.cast::<SymmetricBuffer>() {
                    Some(b.get().share()?)
                } else if let Ok(v) = o.cast::<HeapView>() {
                    v.get().keep.clone()
                } else {
                    None
                }
            }
            None => None,
        };
        HeapView::checked(
            self.ctx.clone(),
            addr,
            shape,
            strides,
            parse_dtype(dtype)?,
            owner,
            keep,
        )
    }

    // ---- RMA --------------------------------------------------------------------------------

    /// Copies `nbytes` of host memory at `src_ptr` into PE `pe`'s copy of the symmetric range at
    /// `dest`. `src_ptr` is trusted (see the class documentation), except that where it lies
    /// in a symmetric heap it must be a live allocation. With `dtype` (the data's), both
    /// addresses must be aligned to its element size.
    #[pyo3(signature = (dest, src_ptr, nbytes, pe, dtype = None))]
    fn put_from_host(
        &self,
        py: Python<'_>,
        dest: u64,
        src_ptr: usize,
        nbytes: usize,
        pe: usize,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let dt = dtype.map(parse_dtype).transpose()?;
        let ctx = self.ctx.clone();
        py.detach(move || {
            aligned(&ctx, "put", dt, dest, src_ptr as u64)?;
            ctx.check_host_range("put", src_ptr as u64, nbytes as u64, false)?;
            // SAFETY: the caller passes the pointer of a live host array of at least `nbytes`
            // bytes (the Python layer takes it from the array itself and holds the array),
            // and not one into freed symmetric memory (checked just above).
            let src = unsafe { host_slice(src_ptr, nbytes) };
            ctx.put_bytes(dest, src, pe)
        })
        .py()
    }

    /// Copies PE `pe`'s copy of the symmetric range at `src` into `nbytes` of host memory at
    /// `dest_ptr` (trusted, as in `put_from_host`; `dtype` as there).
    #[pyo3(signature = (dest_ptr, src, nbytes, pe, dtype = None))]
    fn get_to_host(
        &self,
        py: Python<'_>,
        dest_ptr: usize,
        src: u64,
        nbytes: usize,
        pe: usize,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let dt = dtype.map(parse_dtype).transpose()?;
        let ctx = self.ctx.clone();
        py.detach(move || {
            aligned(&ctx, "get", dt, dest_ptr as u64, src)?;
            ctx.check_host_range("get", dest_ptr as u64, nbytes as u64, true)?;
            // SAFETY: as in `put_from_host`, for a writable array.
            let dst = unsafe { host_slice_mut(dest_ptr, nbytes) };
            ctx.get_bytes(dst, src, pe)
        })
        .py()
    }

    /// `put_from_host`, then updates PE `pe`'s u64 signal word at symmetric address `sig` with
    /// `op` ("set"/"add") and `value`: a PE that sees the signal also sees the data.
    #[pyo3(signature = (dest, src_ptr, nbytes, sig, value, op, pe, dtype = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_signal_from_host(
        &self,
        py: Python<'_>,
        dest: u64,
        src_ptr: usize,
        nbytes: usize,
        sig: u64,
        value: u64,
        op: &str,
        pe: usize,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let op = parse_signal_op(op)?;
        let dt = dtype.map(parse_dtype).transpose()?;
        let ctx = self.ctx.clone();
        py.detach(move || {
            // Check the signal word (a live, aligned u64 of this PE's heap, and the PE) and the
            // data's addresses before moving any data.
            ctx.check_aligned("put_signal", "signal word", sig, DType::U64)?;
            ctx.check_symmetric(sig, 8)?;
            ctx.translate(sig, ctx.my_pe(), pe)?;
            aligned(&ctx, "put_signal", dt, dest, src_ptr as u64)?;
            ctx.check_host_range("put_signal", src_ptr as u64, nbytes as u64, false)?;
            // SAFETY: as in `put_from_host`.
            let src = unsafe { host_slice(src_ptr, nbytes) };
            ctx.put_signal_bytes(dest, src, sig, value, op, pe)
        })
        .py()
    }

    /// Enqueues on `stream` (CUDA; completes at once on the host backend, where `src` must be
    /// symmetric) a put of `nbytes` from local `src` to PE `pe`'s copy of `dest` (`dtype` as
    /// in `put_from_host`).
    #[pyo3(signature = (dest, src, nbytes, pe, stream = None, dtype = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_on_stream(
        &self,
        py: Python<'_>,
        dest: u64,
        src: u64,
        nbytes: u64,
        pe: usize,
        stream: Option<u64>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let dt = dtype.map(parse_dtype).transpose()?;
        let ctx = self.ctx.clone();
        py.detach(move || {
            aligned(&ctx, "put", dt, dest, src)?;
            ctx.put_on_stream(dest, src, nbytes, pe, &stream_or(stream))
        })
        .py()
    }

    /// Enqueues a get of `nbytes` from PE `pe`'s copy of symmetric `src` into local `dest`
    /// (`dtype` as in `put_from_host`).
    #[pyo3(signature = (dest, src, nbytes, pe, stream = None, dtype = None))]
    #[allow(clippy::too_many_arguments)]
    fn get_on_stream(
        &self,
        py: Python<'_>,
        dest: u64,
        src: u64,
        nbytes: u64,
        pe: usize,
        stream: Option<u64>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let dt = dtype.map(parse_dtype).transpose()?;
        let ctx = self.ctx.clone();
        py.detach(move || {
            aligned(&ctx, "get", dt, dest, src)?;
            ctx.get_on_stream(dest, src, nbytes, pe, &stream_or(stream))
        })
        .py()
    }

    /// Enqueues a put then a signal update (see `put_signal_from_host`).
    #[pyo3(signature = (dest, src, nbytes, sig, value, op, pe, stream = None, dtype = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_signal_on_stream(
        &self,
        py: Python<'_>,
        dest: u64,
        src: u64,
        nbytes: u64,
        sig: u64,
        value: u64,
        op: &str,
        pe: usize,
        stream: Option<u64>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let op = parse_signal_op(op)?;
        let dt = dtype.map(parse_dtype).transpose()?;
        let ctx = self.ctx.clone();
        py.detach(move || {
            aligned(&ctx, "put_signal", dt, dest, src)?;
            ctx.put_signal_on_stream(dest, src, nbytes, sig, value, op, pe, &stream_or(stream))
        })
        .py()
    }

    /// Waits (GIL released) until this PE's u64 signal word at `sig` satisfies
    /// `word CMP value`; returns the word. Fails after SYMHEAP_TIMEOUT or when the job fails.
    fn signal_wait_until(&self, py: Python<'_>, sig: u64, cmp: &str, value: u64) -> PyResult<u64> {
        let cmp = parse_cmp(cmp)?;
        let ctx = self.ctx.clone();
        py.detach(move || ctx.signal_wait_until_addr(sig, cmp, value))
            .py()
    }

    /// Enqueues the signal wait on `stream` (host backend: waits now).
    #[pyo3(signature = (sig, cmp, value, stream = None))]
    fn signal_wait_until_on_stream(
        &self,
        py: Python<'_>,
        sig: u64,
        cmp: &str,
        value: u64,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let cmp = parse_cmp(cmp)?;
        let ctx = self.ctx.clone();
        py.detach(move || ctx.signal_wait_until_on_stream(sig, cmp, value, &stream_or(stream)))
            .py()
    }

    /// Atomic `op` on PE `pe`'s copy of the `dtype` word at symmetric address `addr`; returns
    /// the old value. `value` is the operand (the new value for compare_swap), `compare` the
    /// expected value of compare_swap.
    #[pyo3(signature = (addr, pe, op, dtype, value = None, compare = None))]
    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &self,
        py: Python<'_>,
        addr: u64,
        pe: usize,
        op: &str,
        dtype: &str,
        value: Option<Bound<'_, PyAny>>,
        compare: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let (op, dt, v, c) = atomic_args(op, dtype, value, compare)?;
        let ctx = self.ctx.clone();
        let old = py
            .detach(move || ctx.atomic_op(addr, pe, op, dt, v, c))
            .py()?;
        from_bits(py, old, dt)
    }

    /// Completes every put, get and atomic this PE issued.
    fn quiet(&self) -> PyResult<()> {
        self.c().quiet().py()
    }

    /// Orders this PE's puts to each PE.
    fn fence(&self) -> PyResult<()> {
        self.c().fence().py()
    }

    /// Enqueues completion of this PE's stream operations on `stream`.
    #[pyo3(signature = (stream = None))]
    fn quiet_on_stream(&self, stream: Option<u64>) -> PyResult<()> {
        self.c().quiet_on_stream(&stream_or(stream)).py()
    }

    /// Waits (GIL released) for `stream` to finish; reports device-side wait timeouts.
    #[pyo3(signature = (stream = None))]
    fn sync_stream(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<()> {
        let ctx = self.ctx.clone();
        py.detach(move || ctx.sync_stream(&stream_or(stream))).py()
    }

    // ---- synchronisation and teams ---------------------------------------------------------

    /// Collective over the world (host): returns once every PE called it; memory operations
    /// before it are visible after it. Also checks the collective ledger and reclaims buffers
    /// every PE released.
    fn barrier_all(&self, py: Python<'_>) -> PyResult<()> {
        let ctx = self.ctx.clone();
        py.detach(move || ctx.barrier_all()).py()
    }

    /// Collective over the world: enqueues a barrier on `stream` (CUDA; host barrier on the
    /// host backend).
    #[pyo3(signature = (stream = None))]
    fn barrier_all_on_stream(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<()> {
        let ctx = self.ctx.clone();
        py.detach(move || ctx.barrier_all_on_stream(&stream_or(stream)))
            .py()
    }

    /// Collective over the world: like `barrier_all`.
    fn sync_all(&self, py: Python<'_>) -> PyResult<()> {
        let ctx = self.ctx.clone();
        py.detach(move || ctx.sync_all()).py()
    }

    /// Collective over `team` (the world when None): a barrier among its members.
    #[pyo3(signature = (team = None))]
    fn barrier(&self, py: Python<'_>, team: Option<&PyTeam>) -> PyResult<()> {
        let (ctx, t) = (self.ctx.clone(), self.team_or_world(team));
        py.detach(move || ctx.barrier(&t)).py()
    }

    /// Collective over `team`: synchronises its members.
    #[pyo3(signature = (team = None))]
    fn team_sync(&self, py: Python<'_>, team: Option<&PyTeam>) -> PyResult<()> {
        let (ctx, t) = (self.ctx.clone(), self.team_or_world(team));
        py.detach(move || ctx.team_sync(&t)).py()
    }

    /// Collective over `team` (None: the world): the largest of the members' `value`s, met on
    /// the host with no device work. Raises SymheapUnsupportedError for a team spanning nodes.
    #[pyo3(signature = (team, value))]
    fn team_max(&self, py: Python<'_>, team: Option<&PyTeam>, value: u64) -> PyResult<u64> {
        let (ctx, t) = (self.ctx.clone(), self.team_or_world(team));
        py.detach(move || ctx.team_max(&t, value)).py()
    }

    /// The team of all PEs.
    fn world_team(&self) -> PyTeam {
        PyTeam {
            team: self.c().world_team(),
        }
    }

    /// Collective over `parent`: the team of members `start, start + stride, ...` (`size` of
    /// them); other members get an invalid team.
    fn team_split_strided(
        &self,
        py: Python<'_>,
        parent: &PyTeam,
        start: usize,
        stride: usize,
        size: usize,
    ) -> PyResult<PyTeam> {
        let (ctx, p) = (self.ctx.clone(), parent.team.clone());
        let team = py
            .detach(move || ctx.team_split_strided(&p, start, stride, size))
            .py()?;
        Ok(PyTeam { team })
    }

    /// Collective over `parent`: the team of members `ranks` of `parent` (member indices, any
    /// order, team PE i = ranks[i]); other members get an invalid team.
    fn team_split_ranks(
        &self,
        py: Python<'_>,
        parent: &PyTeam,
        ranks: &Bound<'_, PyAny>,
    ) -> PyResult<PyTeam> {
        let ranks = ranks_arg(ranks, "ranks")?;
        let (ctx, p) = (self.ctx.clone(), parent.team.clone());
        let team = py.detach(move || ctx.team_split_ranks(&p, &ranks)).py()?;
        Ok(PyTeam { team })
    }

    /// Collective over the world PEs `ranks` only (team PE i = ranks[i]; the other PEs never
    /// call it): `exchange(bytes) -> list[bytes]` is the members' all-gather, in the order of
    /// `ranks`, called with the GIL; an exception it raises becomes a `SymheapError` of this
    /// call, with the exception as its cause.
    fn team_from_ranks(
        &self,
        py: Python<'_>,
        ranks: &Bound<'_, PyAny>,
        exchange: Py<PyAny>,
    ) -> PyResult<PyTeam> {
        const CALL: &str = "team_from_ranks";
        let ranks = ranks_arg(ranks, "ranks")?;
        let (ctx, mut raised) = (self.ctx.clone(), None);
        let r = py.detach(|| {
            let mut xchg = py_exchange(&exchange, CALL, ctx.my_pe(), &mut raised);
            ctx.team_from_world_ranks(&ranks, &mut xchg)
                .map_err(|e| symheap::Error::new(e.pe(), CALL, e.kind().clone()))
        });
        match r {
            Ok(team) => Ok(PyTeam { team }),
            // A symheap error of the exchange itself (the torch backend's wait on its store
            // names a PE that exited, or times out naming who did not join) is the failure the
            // caller should see, class and all, not a bootstrap error wrapped around it.
            Err(_) if raised.as_ref().is_some_and(|c| is_symheap_error(py, c)) => {
                Err(raised.expect("checked above"))
            }
            Err(e) => {
                let err = to_py(e);
                if let Some(cause) = raised {
                    err.set_cause(py, Some(cause));
                }
                Err(err)
            }
        }
    }

    /// Collective over `team`: destroys it (a no-op on an invalid team).
    fn team_destroy(&self, py: Python<'_>, team: &PyTeam) -> PyResult<()> {
        let (ctx, t) = (self.ctx.clone(), team.team.clone());
        py.detach(move || ctx.team_destroy(t)).py()
    }

    // ---- collectives ------------------------------------------------------------------------

    /// Collective over `team` (the world when None): collective `kind` (broadcast, all_gather,
    /// reduce_scatter, all_reduce, alltoall) of `count` `dtype` elements per block from `src`
    /// into `dest`, with the kind's parameters by keyword (`root`; `op`: sum, min, max, prod;
    /// `algo`: auto, one_shot, two_shot). With `stream`, enqueued on it (CUDA); otherwise
    /// complete on return. Releases the GIL while it runs.
    #[pyo3(signature = (kind, team, dest, src, count, dtype, stream = None, **params))]
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        py: Python<'_>,
        kind: &str,
        team: Option<&PyTeam>,
        dest: u64,
        src: u64,
        count: usize,
        dtype: &str,
        stream: Option<u64>,
        params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let t = self.team_or_world(team);
        coll::run(
            py, &self.ctx, kind, t, dest, src, count, dtype, stream, params,
        )
    }

    /// `collective` when both buffers can go to its kernel as they are: each symmetric memory
    /// of this PE, or device memory of this PE's GPU where the kernel touches its buffers on
    /// this PE only (see `coll_takes_local_buffers`; the call checks such a range, and fails
    /// naming it when it is not). Returns `(dest_symmetric, src_symmetric)` once enqueued
    /// (complete without `stream`), or None with nothing run when a buffer must first be
    /// staged into symmetric memory. For callers that stage ordinary buffers (the torch ops):
    /// one call where asking about each buffer, then launching, took three.
    #[pyo3(signature = (kind, team, dest, src, count, dtype, stream = None, **params))]
    #[allow(clippy::too_many_arguments)]
    fn collective_direct(
        &self,
        py: Python<'_>,
        kind: &str,
        team: Option<&PyTeam>,
        dest: u64,
        src: u64,
        count: usize,
        dtype: &str,
        stream: Option<u64>,
        params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<(bool, bool)>> {
        let t = self.team_or_world(team);
        coll::run_direct(
            py, &self.ctx, kind, t, dest, src, count, dtype, stream, params,
        )
    }

    /// Collective over the world: every PE contributes `data`, every PE gets all contributions
    /// in rank order (small control data: seeds, sizes).
    fn all_gather_bytes<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let ctx = self.ctx.clone();
        let data = data.to_vec();
        let parts = py.detach(move || ctx.all_gather_bytes(&data)).py()?;
        Ok(parts.iter().map(|p| PyBytes::new(py, p)).collect())
    }

    fn __repr__(&self) -> String {
        format!(
            "Context(pe={}, n_pes={}, backend={})",
            self.c().my_pe(),
            self.c().n_pes(),
            self.c().backend_kind().name()
        )
    }
}

/// Checks a data operation's two addresses against the element size of `dtype` (its data's
/// dtype, when the caller gave it).
fn aligned(
    ctx: &symheap::Context,
    call: &'static str,
    dtype: Option<DType>,
    dest: u64,
    src: u64,
) -> symheap::Result<()> {
    if let Some(dt) = dtype {
        ctx.check_aligned(call, "destination", dest, dt)?;
        ctx.check_aligned(call, "source", src, dt)?;
    }
    Ok(())
}

/// # Safety
/// `ptr` must point to `len` readable bytes that stay valid and unmodified for `'a`.
unsafe fn host_slice<'a>(ptr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
}

/// # Safety
/// `ptr` must point to `len` writable bytes that nothing else accesses for `'a`.
unsafe fn host_slice_mut<'a>(ptr: usize, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
}
