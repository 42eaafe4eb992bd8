//! `NvshmemProvider`: NVSHMEM as an allocator satisfying symheap's contract (the Rust
//! `symheap::Nvshmem` provider). Every call that can block (init, allocate, free, barrier,
//! finalize) runs with the GIL released.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use symheap::{Allocation, Nvshmem, Provider};

use crate::context::PyContext;
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
    /// Live allocations by address (`free` takes the address).
    live: Mutex<HashMap<u64, Allocation>>,
}

impl PyNvshmem {
    fn usable(&self) -> PyResult<&Arc<Nvshmem>> {
        if self.nv.is_finalized() {
            return Err(raise(Class::Base, "the NVSHMEM provider was finalized"));
        }
        Ok(&self.nv)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Allocation>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
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
        self.live().insert(a.ptr(), a);
        Ok(out)
    }

    /// Collective: `nvshmem_free` of the allocation at `addr` (from `allocate`).
    fn free(&self, py: Python<'_>, addr: u64) -> PyResult<()> {
        let nv = self.usable()?.clone();
        let a = self.live().remove(&addr).ok_or_else(|| {
            value_error(format!(
                "no live NVSHMEM allocation starts at {addr:#x} (already freed, or not from this provider)"
            ))
        })?;
        py.detach(move || nv.free(a)).py()
    }

    /// Collective: a ledger-checked symheap barrier, then `nvshmem_barrier_all`.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let nv = self.usable()?.clone();
        py.detach(move || nv.barrier()).py()
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
