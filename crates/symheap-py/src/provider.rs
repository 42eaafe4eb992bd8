//! `NvshmemProvider`: NVSHMEM as an allocator satisfying symheap's contract (the Rust
//! `symheap::Nvshmem` provider). Every call that can block (init, allocate, free, barrier,
//! finalize) runs with the GIL released.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use symheap::{Allocation, At, DType, Nvshmem, Provider};

use crate::context::PyContext;
use crate::convert::{atomic_args, from_bits, parse_cmp, parse_signal_op, stream_or};
use crate::errors::{raise, value_error, Class, IntoPyResult};

/// What `allocate` returns: `(addr, nbytes, table_addr, peer_bases, direct)`.
type AllocTuple = (u64, u64, u64, Vec<u64>, Vec<bool>);

/// NVSHMEM 3.x, loaded at run time and initialised over the context's bootstrap (CUDA backend).
///
/// Collective: the constructor, `allocate`, `free`, `barrier` and `finalize` must be called by
/// every PE in the same order (interleaved the same way with the context's other collective
/// calls); a divergence or a missing PE is an error on every PE instead of a hang.
/// `free` is explicit because `nvshmem_free` is itself a collective barrier: running it from a
/// garbage-collector callback, at different moments on different PEs, would deadlock.
#[pyclass(module = "symheap._native", name = "NvshmemProvider", frozen)]
pub struct PyNvshmem {
    nv: Arc<Nvshmem>,
    /// Keeps the context alive while the provider is (NVSHMEM finalises before it).
    _ctx: Arc<symheap::Context>,
    /// Live allocations by address (`free` takes the address). Shared so that a host wait can
    /// hold its signal's allocation without holding this table.
    live: Mutex<HashMap<u64, Arc<Allocation>>>,
}

impl PyNvshmem {
    fn usable(&self) -> PyResult<&Arc<Nvshmem>> {
        if self.nv.is_finalized() {
            return Err(raise(Class::Base, "the NVSHMEM provider was finalized"));
        }
        Ok(&self.nv)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Allocation>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The place `[addr, addr + len)` in one of `live`'s allocations (the Rust side checks the
/// length against it again).
fn place<'a>(
    live: &'a HashMap<u64, Arc<Allocation>>,
    addr: u64,
    len: u64,
    what: &str,
) -> PyResult<At<'a>> {
    holder(live, addr, len, what).map(|a| a.at(addr - a.ptr()))
}

/// The allocation holding `[addr, addr + len)`.
fn holder<'a>(
    live: &'a HashMap<u64, Arc<Allocation>>,
    addr: u64,
    len: u64,
    what: &str,
) -> PyResult<&'a Arc<Allocation>> {
    live.values()
        .find(|a| addr >= a.ptr() && addr.saturating_add(len) <= a.ptr() + a.bytes())
        .ok_or_else(|| {
            value_error(format!(
                "the {what} ({len} bytes at {addr:#x}) is not inside one live NVSHMEM allocation of this provider (NVSHMEM moves data only between its own allocations)"
            ))
        })
}

#[pymethods]
impl PyNvshmem {
    /// Collective over the world: loads `libnvshmem_host.so.3` (from `lib`, else
    /// `$SYMHEAP_NVSHMEM_LIB`, else the `nvidia-nvshmem-cu13` package on this interpreter's
    /// `sys.path`, else the loader's path) and initialises NVSHMEM on the context's CUDA device.
    /// A missing library or the host backend raises `SymheapUnsupportedError`.
    #[new]
    #[pyo3(signature = (ctx, lib = None))]
    fn new(py: Python<'_>, ctx: &PyContext, lib: Option<PathBuf>) -> PyResult<Self> {
        let site_dirs: Option<Vec<PathBuf>> = if lib.is_none() {
            let sys = py.import("sys")?;
            let paths: Vec<String> = sys.getattr("path")?.extract().unwrap_or_default();
            Some(
                paths
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from)
                    .collect(),
            )
        } else {
            None
        };
        let c = ctx.ctx.clone();
        let nv = py
            .detach(move || Nvshmem::with_search_path(&c, lib.as_deref(), site_dirs.as_deref()))
            .py()?;
        Ok(PyNvshmem {
            nv: Arc::new(nv),
            _ctx: ctx.ctx.clone(),
            live: Mutex::new(HashMap::new()),
        })
    }

    /// Collective: `nvshmem_malloc` of `nbytes` (plus the peer table after it). Returns
    /// `(addr, nbytes, table_addr, peer_bases, direct)`: `peer_bases[my_pe] == addr`, 0 and
    /// `False` for PEs not load/store-addressable from here; `table_addr` is a device `int64`
    /// array holding `peer_bases`.
    fn allocate(&self, py: Python<'_>, nbytes: u64) -> PyResult<AllocTuple> {
        let nv = self.usable()?.clone();
        let a = py.detach(move || nv.allocate(nbytes)).py()?;
        let out = (
            a.ptr(),
            a.bytes(),
            a.table_addr(),
            a.peer_bases().to_vec(),
            a.direct().to_vec(),
        );
        self.live().insert(a.ptr(), Arc::new(a));
        Ok(out)
    }

    /// Collective: `nvshmem_free` of the allocation at `addr` (from `allocate`).
    fn free(&self, py: Python<'_>, addr: u64) -> PyResult<()> {
        let nv = self.usable()?.clone();
        let mut live = self.live();
        let a = live.remove(&addr).ok_or_else(|| {
            value_error(format!(
                "no live NVSHMEM allocation starts at {addr:#x} (already freed, or not from this provider)"
            ))
        })?;
        let a = Arc::try_unwrap(a).map_err(|a| {
            live.insert(addr, a);
            value_error(format!(
                "the NVSHMEM allocation at {addr:#x} is in use by a signal wait of another thread"
            ))
        })?;
        drop(live);
        py.detach(move || nv.free(a)).py()
    }

    /// Collective: a ledger-checked symheap barrier, then `nvshmem_barrier_all`.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let nv = self.usable()?.clone();
        py.detach(move || nv.barrier()).py()
    }

    /// `nbytes` from this PE's `src` to PE `pe`'s `dest` through NVSHMEM (both addresses in
    /// this provider's allocations); returns once `src` may be reused, complete after `quiet`.
    fn put(&self, py: Python<'_>, dest: u64, src: u64, nbytes: u64, pe: usize) -> PyResult<()> {
        let nv = self.usable()?.clone();
        let live = self.live();
        let (d, s) = (
            place(&live, dest, nbytes, "destination")?,
            place(&live, src, nbytes, "source")?,
        );
        py.detach(|| nv.put(d, s, nbytes, pe)).py()
    }

    /// `nbytes` from PE `pe`'s `src` into this PE's `dest`; the data is there on return.
    fn get(&self, py: Python<'_>, dest: u64, src: u64, nbytes: u64, pe: usize) -> PyResult<()> {
        let nv = self.usable()?.clone();
        let live = self.live();
        let (d, s) = (
            place(&live, dest, nbytes, "destination")?,
            place(&live, src, nbytes, "source")?,
        );
        py.detach(|| nv.get(d, s, nbytes, pe)).py()
    }

    /// Enqueues a put (`nvshmemx_putmem_on_stream`) on `stream` (0: the legacy default).
    #[pyo3(signature = (dest, src, nbytes, pe, stream = None))]
    fn put_on_stream(
        &self,
        dest: u64,
        src: u64,
        nbytes: u64,
        pe: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let nv = self.usable()?;
        let live = self.live();
        let (d, s) = (
            place(&live, dest, nbytes, "destination")?,
            place(&live, src, nbytes, "source")?,
        );
        nv.put_on_stream(d, s, nbytes, pe, &stream_or(stream)).py()
    }

    /// Enqueues a get (`nvshmemx_getmem_on_stream`) on `stream`.
    #[pyo3(signature = (dest, src, nbytes, pe, stream = None))]
    fn get_on_stream(
        &self,
        dest: u64,
        src: u64,
        nbytes: u64,
        pe: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let nv = self.usable()?;
        let live = self.live();
        let (d, s) = (
            place(&live, dest, nbytes, "destination")?,
            place(&live, src, nbytes, "source")?,
        );
        nv.get_on_stream(d, s, nbytes, pe, &stream_or(stream)).py()
    }

    /// A put, then PE `pe`'s 64-bit signal word at `sig` updated with `op` ("set" or "add") and
    /// `value`; with `stream`, enqueued there (`nvshmemx_putmem_signal_on_stream`), else from
    /// the host (put, fence, atomic).
    #[pyo3(signature = (dest, src, nbytes, sig, value, op, pe, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_signal(
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
    ) -> PyResult<()> {
        let op = parse_signal_op(op)?;
        let nv = self.usable()?.clone();
        let live = self.live();
        let (d, s) = (
            place(&live, dest, nbytes, "destination")?,
            place(&live, src, nbytes, "source")?,
        );
        let g = place(&live, sig, 8, "signal")?;
        match stream {
            Some(st) => nv
                .put_signal_on_stream(d, s, nbytes, g, value, op, pe, &stream_or(Some(st)))
                .py(),
            None => py
                .detach(|| nv.put_signal(d, s, nbytes, g, value, op, pe))
                .py(),
        }
    }

    /// Enqueues on `stream` the update of PE `pe`'s signal word at `sig` with `op` and `value`.
    #[pyo3(signature = (sig, value, op, pe, stream = None))]
    fn signal_on_stream(
        &self,
        sig: u64,
        value: u64,
        op: &str,
        pe: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let op = parse_signal_op(op)?;
        let nv = self.usable()?;
        let live = self.live();
        let g = place(&live, sig, 8, "signal")?;
        nv.signal_on_stream(g, value, op, pe, &stream_or(stream))
            .py()
    }

    /// Waits until this PE's 64-bit word at `sig` satisfies `word CMP value`: on `stream`
    /// (symheap's bounded wait kernel; `sync_stream` reports a timeout) or, without a stream,
    /// on the host (GIL released), returning the word.
    #[pyo3(signature = (sig, cmp, value, stream = None))]
    fn signal_wait_until(
        &self,
        py: Python<'_>,
        sig: u64,
        cmp: &str,
        value: u64,
        stream: Option<u64>,
    ) -> PyResult<Option<u64>> {
        let cmp = parse_cmp(cmp)?;
        let nv = self.usable()?.clone();
        // The wait must not hold the allocation table: a put it waits for may come from
        // another thread. The address is checked now; a free before the wait ends is the
        // program's error (as freeing memory a kernel still reads).
        let a = holder(&self.live(), sig, 8, "signal")?.clone();
        let g = a.at(sig - a.ptr());
        match stream {
            Some(st) => nv
                .signal_wait_until_on_stream(g, cmp, value, &stream_or(Some(st)))
                .map(|()| None)
                .py(),
            None => py
                .detach(|| nv.signal_wait_until(g, cmp, value))
                .map(Some)
                .py(),
        }
    }

    /// Atomic `op` (fetch, set, swap, compare_swap, add, and, or, xor) on PE `pe`'s int64 or
    /// uint64 word at `addr` through NVSHMEM; returns the old value.
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
        if !matches!(dt, DType::I64 | DType::U64) {
            return Err(value_error(format!(
                "NVSHMEM's host atomics are int64 here; the word is {dt} (use an int64 or uint64 tensor)"
            )));
        }
        let (v, c) = (v as i64, c as i64);
        let nv = self.usable()?.clone();
        let live = self.live();
        let d = place(&live, addr, 8, "atomic word")?;
        let old = py.detach(|| nv.atomic_i64(d, op, v, c, pe)).py()?;
        from_bits(py, old as u64, dt)
    }

    /// Completes every put and atomic this PE issued from the host through NVSHMEM.
    fn quiet(&self, py: Python<'_>) -> PyResult<()> {
        let nv = self.usable()?.clone();
        py.detach(move || nv.quiet()).py()
    }

    /// Orders this PE's host-issued NVSHMEM puts to each PE.
    fn fence(&self) -> PyResult<()> {
        self.usable()?.fence().py()
    }

    /// Enqueues on `stream` the completion of this PE's stream-ordered NVSHMEM operations.
    #[pyo3(signature = (stream = None))]
    fn quiet_on_stream(&self, stream: Option<u64>) -> PyResult<()> {
        self.usable()?.quiet_on_stream(&stream_or(stream)).py()
    }

    /// Sets up NVSHMEM's device state in `module` (a `CUmodule` handle of this device's primary
    /// context, its code device-linked with `libnvshmem_device`); before any launch of its
    /// kernels. The handle must be live: the driver cannot tell a dangling one.
    fn init_module(&self, py: Python<'_>, module: u64) -> PyResult<()> {
        let nv = self.usable()?.clone();
        // SAFETY: Python cannot prove the handle live; the method's documented contract (as
        // for every raw CUDA handle a Python library takes) is that it is a loaded CUmodule of
        // this device's primary context.
        py.detach(move || unsafe { nv.init_module(module) }).py()
    }

    /// Releases what `init_module` set up in `module`; before unloading it.
    fn finalize_module(&self, py: Python<'_>, module: u64) -> PyResult<()> {
        let nv = self.usable()?.clone();
        // SAFETY: as in `init_module`.
        py.detach(move || unsafe { nv.finalize_module(module) })
            .py()
    }

    /// This PE's rank.
    fn my_pe(&self) -> PyResult<usize> {
        Ok(self.usable()?.my_pe())
    }

    /// Number of PEs.
    fn n_pes(&self) -> PyResult<usize> {
        Ok(self.usable()?.n_pes())
    }

    /// CUDA device ordinal NVSHMEM runs on.
    fn device(&self) -> PyResult<usize> {
        Ok(self.usable()?.device())
    }

    /// Whether the provider uses an NVSHMEM another library of this process initialised (torch's
    /// NVSHMEM backend, DeepEP, nvshmem4py), which its finalize leaves initialised.
    fn attached(&self) -> PyResult<bool> {
        Ok(self.usable()?.attached())
    }

    /// Path the NVSHMEM host library was loaded from.
    fn lib_path(&self) -> PyResult<String> {
        Ok(self.usable()?.library().path.display().to_string())
    }

    /// `peer_bases[r] - addr` for every PE, the same for every allocation (0 for PEs that are
    /// not direct).
    fn peer_offsets(&self) -> PyResult<Vec<i64>> {
        Ok(self.usable()?.peer_offsets().unwrap_or_default())
    }

    /// Collective: frees every allocation and finalises NVSHMEM. Every later call except
    /// `finalize` raises; calling `finalize` again does nothing.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        let nv = self.nv.clone();
        let r = py.detach(move || nv.finalize());
        self.live().clear();
        r.py()
    }

    fn __repr__(&self) -> String {
        let l = self.nv.library();
        format!(
            "NvshmemProvider(pe={}, n_pes={}, device={}, nvshmem={}.{}.{}, lib={:?}{})",
            self.nv.my_pe(),
            self.nv.n_pes(),
            self.nv.device(),
            l.version.0,
            l.version.1,
            l.version.2,
            l.path.display().to_string(),
            if self.nv.is_finalized() {
                ", finalized"
            } else {
                ""
            }
        )
    }
}
