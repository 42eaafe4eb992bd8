//! `SymmetricBuffer` (one allocation, owned) and `HeapView` (a view of symmetric memory made
//! from another object, which it keeps alive), both exportable through DLPack and the array
//! interfaces.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use symheap::DType;

// `parse_dtype` is named through this module by context.rs too.
pub(crate) use crate::convert::parse_dtype;
use crate::dlpack::{contiguous_strides, DLDevice, Mem, Share, DEVICE_CPU, DEVICE_CUDA};
use crate::errors::{value_error, IntoPyResult};

/// The device memory of this context lives on.
pub fn context_device(ctx: &symheap::Context) -> DLDevice {
    match ctx.cuda() {
        Some(c) => DLDevice {
            device_type: DEVICE_CUDA,
            device_id: c.device_ordinal() as i32,
        },
        None => DLDevice {
            device_type: DEVICE_CPU,
            device_id: 0,
        },
    }
}

/// Number of elements of `shape`, checked.
pub fn numel(shape: &[i64]) -> PyResult<u64> {
    shape.iter().try_fold(1u64, |acc, &n| {
        if n < 0 {
            return Err(value_error(format!(
                "negative dimension {n} in shape {shape:?}"
            )));
        }
        acc.checked_mul(n as u64)
            .ok_or_else(|| value_error(format!("shape {shape:?} is too large")))
    })
}

/// The PE whose mapped heap holds all of `[addr, addr + bytes)`, if any.
pub fn heap_owner(ctx: &symheap::Context, addr: u64, bytes: u64) -> Option<usize> {
    let last = addr.checked_add(bytes.max(1) - 1)?;
    (0..ctx.n_pes()).find(|&pe| {
        matches!(ctx.translate(addr, pe, pe), Ok(Some(_)))
            && matches!(ctx.translate(last, pe, pe), Ok(Some(_)))
    })
}

/// What a `SymmetricBuffer` object holds.
enum State {
    /// Usable.
    Live(Share),
    /// Freed: every access by any address in it is refused (the allocation is revoked). The
    /// share is kept (until this object dies) when the memory was handed out through an array
    /// interface, whose arrays point back to this object, not to a share of their own.
    Freed {
        /// Held only to be dropped with this object.
        _keep: Option<Share>,
    },
}

/// One symmetric allocation of this PE, typed with a shape and dtype.
///
/// Made by `Context.allocate` (collective). Exports its memory through `__dlpack__` (NumPy,
/// PyTorch, CuPy...), `__array_interface__` on the host backend and `__cuda_array_interface__`
/// on CUDA. Arrays and tensors made from it keep it alive; dropping the last reference releases
/// it (local, never blocks; reclaimed at a later collective point once every PE released it).
/// `free()` revokes it at once: every later use of the buffer, and of any array, tensor or
/// pointer into its memory, raises. Its memory goes back to the heap once nothing made from
/// it remains (so no alias can ever reach a later allocation that reuses it).
///
/// The Python buffer protocol (`memoryview(buf)`) is not implemented: the wheel is built for the
/// stable ABI of Python 3.9, whose limited API has no `Py_buffer` (PyO3 offers `__getbuffer__`
/// under abi3 only from Python 3.11). NumPy takes the memory through `__array_interface__` or
/// DLPack instead, without a copy; `tobytes()` copies.
#[pyclass(module = "symheap._native", name = "SymmetricBuffer", frozen, weakref)]
pub struct SymmetricBuffer {
    pub(crate) ctx: Arc<symheap::Context>,
    state: Mutex<State>,
    /// Whether `__array_interface__`/`__cuda_array_interface__` handed the memory out: the
    /// arrays made so hold this object, not a share, so a freed buffer then keeps its share.
    exported: AtomicBool,
    addr: u64,
    nbytes: u64,
    offset: u64,
    table_addr: u64,
    shape: Vec<i64>,
    dtype: DType,
    device: DLDevice,
}

impl SymmetricBuffer {
    pub(crate) fn new(
        ctx: Arc<symheap::Context>,
        buf: symheap::SymmetricBuffer,
        shape: Vec<i64>,
        dtype: DType,
    ) -> Self {
        let device = context_device(&ctx);
        SymmetricBuffer {
            addr: buf.addr(),
            nbytes: numel(&shape).unwrap_or(0) * dtype.size() as u64,
            offset: buf.offset(),
            table_addr: buf.peer_bases_addr(),
            state: Mutex::new(State::Live(Arc::new(buf))),
            exported: AtomicBool::new(false),
            ctx,
            shape,
            dtype,
            device,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A share of the allocation (for an export that must keep its memory from being reused);
    /// fails once freed.
    pub(crate) fn share(&self) -> PyResult<Share> {
        match &*self.lock() {
            State::Live(b) => Ok(b.clone()),
            State::Freed { .. } => Err(self.freed_error()),
        }
    }

    /// `share`, for callers that only need the check.
    fn check_live(&self) -> PyResult<()> {
        self.share().map(drop)
    }

    fn freed_error(&self) -> PyErr {
        value_error(format!(
            "this SymmetricBuffer (at {:#x}) was freed; nothing made from a freed buffer may be used",
            self.addr
        ))
    }

    fn mem(&self) -> Mem {
        Mem {
            addr: self.addr,
            strides: contiguous_strides(&self.shape),
            shape: self.shape.clone(),
            dtype: self.dtype,
            device: self.device,
        }
    }
}

#[pymethods]
impl SymmetricBuffer {
    /// Address of this PE's copy (host pointer on the host backend, device pointer on CUDA).
    #[getter]
    fn addr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes of the typed contents (`numel * itemsize`).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Offset of the allocation from the heap base: the same on every PE.
    #[getter]
    fn offset(&self) -> u64 {
        self.offset
    }

    /// Shape as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// dtype name (`float32`, `bfloat16`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// Bytes per element.
    #[getter]
    fn itemsize(&self) -> usize {
        self.dtype.size()
    }

    /// `"cpu"` on the host backend, `"cuda:N"` on CUDA.
    #[getter]
    fn device(&self) -> String {
        match self.device.device_type {
            DEVICE_CUDA => format!("cuda:{}", self.device.device_id),
            _ => "cpu".into(),
        }
    }

    /// True once `free()` was called.
    #[getter]
    fn freed(&self) -> bool {
        matches!(*self.lock(), State::Freed { .. })
    }

    /// The contract's peer table: `peer_bases[r]` is PE r's copy of this allocation in this
    /// process (0 when not directly addressable); `peer_bases[my_pe] == addr`.
    fn peer_bases(&self) -> PyResult<Vec<u64>> {
        Ok(self.share()?.peer_bases())
    }

    /// Address of the allocation's peer table in this PE's heap (`n_pes` int64, device memory
    /// on CUDA), ready for a kernel.
    #[getter]
    fn peer_bases_addr(&self) -> PyResult<u64> {
        self.check_live()?;
        Ok(self.table_addr)
    }

    /// The in-heap peer table as a `HeapView` of `n_pes` int64 (on the buffer's device); it
    /// keeps this buffer alive. `torch.from_dlpack(buf.peer_bases_view())` makes the table a
    /// tensor with no copy and no device synchronisation.
    fn peer_bases_view(slf: &Bound<'_, Self>) -> PyResult<HeapView> {
        let me = slf.get();
        let keep = me.share()?;
        let n = me.ctx.n_pes() as i64;
        Ok(HeapView {
            _ctx: me.ctx.clone(),
            keep: Some(keep),
            mem: Mem {
                addr: me.table_addr,
                shape: vec![n],
                strides: vec![1],
                dtype: DType::I64,
                device: me.device,
            },
            owner: Some(slf.clone().into_any().unbind()),
        })
    }

    /// The richer descriptor: `{local_rank, allocation_base, allocation_bytes, peer_bases,
    /// direct}` (`direct` is a list of bools, one per PE).
    fn address_map<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.share()?.address_map();
        let d = PyDict::new(py);
        d.set_item("local_rank", m.local_rank)?;
        d.set_item("allocation_base", m.allocation_base)?;
        d.set_item("allocation_bytes", m.allocation_bytes)?;
        d.set_item("peer_bases", m.peer_bases.clone())?;
        let direct: Vec<bool> = (0..m.peer_bases.len()).map(|p| m.direct.get(p)).collect();
        d.set_item("direct", direct)?;
        Ok(d)
    }

    /// A copy of this PE's contents as bytes.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.share()?;
        let mut out = vec![0u8; self.nbytes as usize];
        b.read(0, &mut out).py()?;
        Ok(PyBytes::new(py, &out))
    }

    /// Copies `data` into this PE's copy starting at byte `offset`.
    #[pyo3(signature = (data, offset = None))]
    fn write_bytes(&self, data: &[u8], offset: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let offset = offset.map_or(Ok(0), |o| crate::convert::index_arg(o, "offset"))?;
        let b = self.share()?;
        if offset as u64 + data.len() as u64 > self.nbytes {
            return Err(value_error(format!(
                "{} bytes at offset {offset} exceed the buffer's {} bytes",
                data.len(),
                self.nbytes
            )));
        }
        b.write(offset, data).py()
    }

    /// Releases the allocation now (local, non-blocking). From here on every use of this
    /// buffer, and every symheap call given an array, tensor or address inside its memory,
    /// raises `SymheapValueError`; the memory goes back to the heap (at a later collective
    /// point, once every PE released it) when no array, tensor or view made from it is left,
    /// so none of them can reach an allocation that reuses it. Freeing a buffer that is
    /// already freed raises `SymheapValueError`.
    fn free(&self) -> PyResult<()> {
        let mut g = self.lock();
        let b = match &*g {
            State::Live(b) => b.clone(),
            State::Freed { .. } => {
                return Err(value_error(format!(
                    "this SymmetricBuffer (at {:#x}) was already freed; a buffer is freed once",
                    self.addr
                )))
            }
        };
        b.revoke();
        let keep = self.exported.load(Ordering::Acquire).then(|| b.clone());
        *g = State::Freed { _keep: keep };
        drop(g);
        // The last share, unless an export holds one: the memory goes back to the heap.
        drop(b);
        Ok(())
    }

    /// Notes that work on CUDA stream `stream` (an int handle, or an object with
    /// `.cuda_stream`) uses this buffer, as `torch.Tensor.record_stream` does: the release then
    /// waits for everything enqueued there until the release. symheap's own operations note
    /// their streams themselves. Does nothing on the host backend.
    fn record_stream(&self, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        // An int handle first (what symheap's own Python passes): asking an int for
        // `.cuda_stream` first made an AttributeError on every allocation.
        let s: u64 = if stream.is_instance_of::<pyo3::types::PyInt>() {
            stream.extract()?
        } else {
            stream.getattr("cuda_stream")?.extract()?
        };
        let b = self.share()?;
        b.record_stream(&crate::convert::stream_or(Some(s))).py()
    }

    /// DLPack export: a v0.8 "dltensor" capsule, or a v1 "dltensor_versioned" one when the
    /// consumer passes `max_version >= (1, 0)`. The tensor holds a reference to this buffer.
    /// `stream` is accepted and ignored: nothing of symheap's is pending on any stream.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let me = slf.get();
        let keep = me.share()?;
        check_export(me.device, dl_device, copy)?;
        let versioned = wants_versioned(max_version.as_ref());
        me.mem().capsule(
            slf.py(),
            slf.clone().into_any().unbind(),
            Some(keep),
            versioned,
        )
    }

    /// `(device_type, device_id)`: `(1, 0)` for host memory, `(2, ordinal)` for CUDA.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.device.device_type, self.device.device_id)
    }

    /// NumPy's array interface (host backend only). The array's base is this buffer. The
    /// dict also holds the buffer (key `symheap_buffer`), so an object that passes the dict on
    /// keeps the memory from being reused and lets symheap find the buffer it came from.
    #[getter]
    fn __array_interface__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let me = slf.get();
        me.check_live()?;
        let d = me.mem().array_interface(slf.py())?;
        d.set_item("symheap_buffer", slf)?;
        me.exported.store(true, Ordering::Release);
        Ok(d)
    }

    /// The CUDA array interface (CUDA backend only).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.check_live()?;
        let d = self.mem().cuda_array_interface(py)?;
        self.exported.store(true, Ordering::Release);
        Ok(d)
    }

    fn __len__(&self) -> PyResult<usize> {
        match self.shape.first() {
            Some(&n) => Ok(n as usize),
            None => Err(pyo3::exceptions::PyTypeError::new_err(
                "len() of a 0-d SymmetricBuffer",
            )),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "SymmetricBuffer(shape={:?}, dtype={}, device={}, addr={:#x}{})",
            self.shape,
            self.dtype.name(),
            self.device(),
            self.addr,
            if self.freed() { ", freed" } else { "" }
        )
    }
}

/// Whether the consumer accepts a DLPack 1.x versioned capsule (`max_version >= (1, 0)`).
fn wants_versioned(max_version: Option<&Bound<'_, PyAny>>) -> bool {
    max_version
        .and_then(|v| v.extract::<(u32, u32)>().ok())
        .is_some_and(|(major, _)| major >= 1)
}

fn check_export(have: DLDevice, want: Option<(i32, i32)>, copy: Option<bool>) -> PyResult<()> {
    if copy == Some(true) {
        return Err(pyo3::exceptions::PyBufferError::new_err(
            "symheap memory is exported without copying (copy=True is not supported)",
        ));
    }
    if let Some((t, i)) = want {
        if (t, i) != (have.device_type, have.device_id) {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "the memory is on DLPack device ({}, {}), not ({t}, {i})",
                have.device_type, have.device_id
            )));
        }
    }
    Ok(())
}

/// A view of symmetric memory (this PE's or a directly reachable peer's) with a shape, strides
/// and dtype, made by `Context.view`. It holds a reference to the object it was made from (so a
/// view of a peer's copy keeps the local allocation and the mapping alive) and exports like
/// `SymmetricBuffer`.
#[pyclass(module = "symheap._native", name = "HeapView", frozen, weakref)]
pub struct HeapView {
    /// Keeps the context, and so every PE's heap mapping, alive while the view exists.
    _ctx: Arc<symheap::Context>,
    /// A share of the allocation it shows, when made from one: its memory is not reused
    /// while the view (or anything made from it) exists.
    pub(crate) keep: Option<Share>,
    pub(crate) mem: Mem,
    pub(crate) owner: Option<Py<PyAny>>,
}

impl HeapView {
    /// Checks that the view lies in the mapped heap of one directly reachable PE.
    pub(crate) fn checked(
        ctx: Arc<symheap::Context>,
        addr: u64,
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
        dtype: DType,
        owner: Option<Py<PyAny>>,
        keep: Option<Share>,
    ) -> PyResult<HeapView> {
        let strides = strides.unwrap_or_else(|| contiguous_strides(&shape));
        if strides.len() != shape.len() {
            return Err(value_error(format!(
                "strides {strides:?} do not match shape {shape:?}"
            )));
        }
        let n = numel(&shape)?;
        let mut last: u64 = 0;
        if n > 0 {
            for (&d, &s) in shape.iter().zip(&strides) {
                if s < 0 {
                    return Err(value_error("negative strides are not supported"));
                }
                let span = (d as u64 - 1)
                    .checked_mul(s as u64)
                    .ok_or_else(|| value_error("view too large"))?;
                last = last
                    .checked_add(span)
                    .ok_or_else(|| value_error("view too large"))?;
            }
        }
        let bytes = if n == 0 {
            0
        } else {
            (last + 1)
                .checked_mul(dtype.size() as u64)
                .ok_or_else(|| value_error("view too large"))?
        };
        if heap_owner(&ctx, addr, bytes).is_none() {
            return Err(value_error(format!(
                "{bytes} bytes at {addr:#x} are not inside the mapped symmetric heap of any directly reachable PE"
            )));
        }
        let device = context_device(&ctx);
        Ok(HeapView {
            _ctx: ctx,
            keep,
            mem: Mem {
                addr,
                shape,
                strides,
                dtype,
                device,
            },
            owner,
        })
    }
}

#[pymethods]
impl HeapView {
    /// Address of the first element.
    #[getter]
    fn addr(&self) -> u64 {
        self.mem.addr
    }

    /// Shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.mem.shape)
    }

    /// Strides in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.mem.strides)
    }

    /// dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.mem.dtype.name()
    }

    /// The object this view keeps alive.
    #[getter]
    fn owner(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.owner.as_ref().map(|o| o.clone_ref(py))
    }

    /// DLPack export; the tensor keeps this view (and so its owner) alive.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let me = slf.get();
        check_export(me.mem.device, dl_device, copy)?;
        let versioned = wants_versioned(max_version.as_ref());
        me.mem
            .capsule(slf.py(), slf.clone().into_any().unbind(), None, versioned)
    }

    /// `(device_type, device_id)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.mem.device.device_type, self.mem.device.device_id)
    }

    /// NumPy's array interface (host memory only).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.mem.array_interface(py)
    }

    /// The CUDA array interface (GPU memory only).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.mem.cuda_array_interface(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "HeapView(addr={:#x}, shape={:?}, strides={:?}, dtype={})",
            self.mem.addr,
            self.mem.shape,
            self.mem.strides,
            self.mem.dtype.name()
        )
    }
}
