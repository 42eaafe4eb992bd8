//! DLPack and the NumPy / CUDA array interfaces, for memory described by [`Mem`].
//!
//! `__dlpack__` returns the v0.8 `DLManagedTensor` capsule named "dltensor"; a consumer that
//! asks for `max_version >= (1, 0)` gets a v1 `DLManagedTensorVersioned` capsule named
//! "dltensor_versioned" instead (NumPy 2 marks arrays from unversioned capsules read-only, since
//! those carry no read-only flag).
//!
//! The structs are the few of `dlpack.h` a producer needs, written out with `#[repr(C)]`. A
//! capsule's tensor holds a strong reference to an owner object (the `SymmetricBuffer`, or the
//! object a view was made from), dropped by the tensor's deleter: a tensor made from a buffer
//! keeps the allocation alive.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use symheap::DType;

use crate::errors::{raise, Class};

/// A share of one allocation: the allocation goes back to the heap when the last share is
/// dropped. The buffer object holds one until it is freed; every export of its memory (a
/// DLPack tensor, a view) holds its own, so memory that an array or tensor still shows is
/// never reused by another allocation.
pub type Share = Arc<symheap::SymmetricBuffer>;

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub const DEVICE_CUDA: i32 = 2;

const CAPSULE_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLDevice {
    /// `DLDeviceType`.
    pub device_type: i32,
    /// Device ordinal.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLDataType {
    /// `DLDataTypeCode`: 0 int, 1 uint, 2 float, 4 bfloat.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Start of the data.
    pub data: *mut c_void,
    /// Where it lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` sizes.
    pub shape: *mut i64,
    /// `ndim` strides in elements (never NULL here).
    pub strides: *mut i64,
    /// Offset of the first element from `data`, in bytes.
    pub byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context: a `Box<Holder>`.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor and releases the owner.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLPackVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.x).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version this tensor follows.
    pub version: DLPackVersion,
    /// The producer's context: a `Box<Holder>`.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor and releases the owner.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// Bit 0: read-only; bit 1: is a copy. Zero here: writable, no copy.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// What a managed tensor owns besides itself.
struct Holder {
    shape: Vec<i64>,
    strides: Vec<i64>,
    owner: Option<Py<PyAny>>,
    /// Dropped by the deleter (with the owner), from whatever thread the consumer frees the
    /// tensor on: releasing an allocation is local and never blocks.
    keep: Option<Share>,
}

/// The DLPack code and bits of a dtype.
pub fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::I8 => (0, 8),
        DType::I16 => (0, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
        DType::U16 => (1, 16),
        DType::U32 => (1, 32),
        DType::U64 => (1, 64),
        DType::F16 => (2, 16),
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::BF16 => (4, 16),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// NumPy's type string of a dtype; None for bfloat16, which NumPy does not have.
pub fn typestr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::U16 => "<u2",
        DType::I16 => "<i2",
        DType::U32 => "<u4",
        DType::I32 => "<i4",
        DType::U64 => "<u8",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::BF16 => return None,
    })
}

/// Row-major strides (in elements) of `shape`.
pub fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

/// A described piece of memory: address, shape, strides (elements), dtype, device.
#[derive(Debug, Clone)]
pub struct Mem {
    /// First element.
    pub addr: u64,
    /// Sizes.
    pub shape: Vec<i64>,
    /// Strides in elements.
    pub strides: Vec<i64>,
    /// Element type.
    pub dtype: DType,
    /// Device type and ordinal.
    pub device: DLDevice,
}

impl Mem {
    /// Whether the strides are the row-major ones of the shape.
    pub fn is_contiguous(&self) -> bool {
        self.shape.contains(&0)
            || self
                .shape
                .iter()
                .zip(self.strides.iter().zip(contiguous_strides(&self.shape)))
                .all(|(&n, (&s, c))| n == 1 || s == c)
    }

    /// `__dlpack__`: a capsule whose tensor keeps `owner` alive, and `keep` (a share of the
    /// allocation, so its memory is not reused while the tensor exists); versioned when
    /// `versioned`.
    pub fn capsule<'py>(
        &self,
        py: Python<'py>,
        owner: Py<PyAny>,
        keep: Option<Share>,
        versioned: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut holder = Box::new(Holder {
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            owner: Some(owner),
            keep,
        });
        let tensor = DLTensor {
            data: self.addr as *mut c_void,
            device: self.device,
            ndim: self.shape.len() as i32,
            dtype: dl_dtype(self.dtype),
            shape: holder.shape.as_mut_ptr(),
            strides: holder.strides.as_mut_ptr(),
            byte_offset: 0,
        };
        // The holder's vectors keep their heap buffers when the Box moves, so the tensor's
        // `shape`/`strides` pointers stay valid until the deleter frees the holder.
        let ctx = Box::into_raw(holder) as *mut c_void;
        if versioned {
            let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: ctx,
                deleter: Some(versioned_deleter),
                flags: 0,
                dl_tensor: tensor,
            }));
            // SAFETY: the name is a static C string; the destructor frees `managed` only if no
            // consumer took it. On failure no capsule owns `managed`, so it is freed here.
            unsafe {
                let cap = ffi::PyCapsule_New(
                    managed as *mut c_void,
                    VERSIONED_NAME.as_ptr(),
                    Some(versioned_capsule_destructor),
                );
                if cap.is_null() {
                    versioned_deleter(managed);
                    return Err(PyErr::fetch(py));
                }
                Ok(Bound::from_owned_ptr(py, cap))
            }
        } else {
            let managed = Box::into_raw(Box::new(DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: ctx,
                deleter: Some(managed_deleter),
            }));
            // SAFETY: as above, for the unversioned capsule.
            unsafe {
                let cap = ffi::PyCapsule_New(
                    managed as *mut c_void,
                    CAPSULE_NAME.as_ptr(),
                    Some(capsule_destructor),
                );
                if cap.is_null() {
                    managed_deleter(managed);
                    return Err(PyErr::fetch(py));
                }
                Ok(Bound::from_owned_ptr(py, cap))
            }
        }
    }

    /// `__array_interface__` (version 3) for host memory.
    pub fn array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.device.device_type != DEVICE_CPU {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__array_interface__ is only defined for host memory; this is GPU memory (use __cuda_array_interface__ or DLPack)",
            ));
        }
        self.interface(py, false)
    }

    /// `__cuda_array_interface__` (version 3) for device memory.
    pub fn cuda_array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.device.device_type != DEVICE_CUDA {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__cuda_array_interface__ is only defined for GPU memory; this is host memory",
            ));
        }
        self.interface(py, true)
    }

    fn interface<'py>(&self, py: Python<'py>, cuda: bool) -> PyResult<Bound<'py, PyDict>> {
        let Some(ts) = typestr(self.dtype) else {
            return Err(raise(
                Class::Unsupported,
                "bfloat16 has no array-interface type string; use DLPack (torch.from_dlpack)",
            ));
        };
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", ts)?;
        d.set_item("data", (self.addr, false))?;
        if self.is_contiguous() {
            d.set_item("strides", py.None())?;
        } else {
            let sz = self.dtype.size() as i64;
            let bytes: Vec<i64> = self.strides.iter().map(|s| s * sz).collect();
            d.set_item("strides", PyTuple::new(py, bytes)?)?;
        }
        if cuda {
            // Nothing of ours is pending on any stream: the consumer need not synchronise.
            d.set_item("stream", py.None())?;
        }
        Ok(d)
    }
}

/// Releases the owner and the share with the interpreter attached; leaks them when the
/// interpreter is gone (as the owner's own release of the allocation would not run then
/// either: the process is ending).
fn release_owner(owner: Option<Py<PyAny>>, keep: Option<Share>) {
    let mut slot = (owner, keep);
    let _ = Python::try_attach(|_py| {
        drop(slot.1.take());
        drop(slot.0.take());
    });
    if let Some(o) = slot.0 {
        // The interpreter is shutting down: dropping a reference now is not allowed.
        std::mem::forget(o);
    }
    std::mem::forget(slot.1);
}

/// Releases the `Holder` a tensor made here points to with its `manager_ctx` (its shape and
/// strides arrays, and the owner reference), never unwinding into the C caller.
///
/// # Safety
/// `ctx` came from `Box::into_raw` of a `Holder` in `Mem::capsule` and is released only once.
unsafe fn release_holder(ctx: *mut c_void) {
    // SAFETY: the caller's contract.
    let holder = unsafe { Box::from_raw(ctx as *mut Holder) };
    let Holder { owner, keep, .. } = *holder;
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| release_owner(owner, keep)));
}

/// The `deleter` of every tensor made here.
unsafe extern "C" fn managed_deleter(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its manager_ctx were made by Box::into_raw in `Mem::capsule`, and DLPack
    // consumers call the deleter exactly once.
    unsafe {
        let ctx = Box::from_raw(m).manager_ctx;
        release_holder(ctx);
    }
}

/// The `deleter` of every versioned tensor made here.
unsafe extern "C" fn versioned_deleter(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in `managed_deleter`.
    unsafe {
        let ctx = Box::from_raw(m).manager_ctx;
        release_holder(ctx);
    }
}

/// The versioned capsule's destructor (see `capsule_destructor`).
unsafe extern "C" fn versioned_capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_destructor`.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, VERSIONED_NAME.as_ptr()) != 1 {
            return;
        }
        let mut t = std::ptr::null_mut();
        let mut v = std::ptr::null_mut();
        let mut tb = std::ptr::null_mut();
        ffi::PyErr_Fetch(&mut t, &mut v, &mut tb);
        let p = ffi::PyCapsule_GetPointer(cap, VERSIONED_NAME.as_ptr())
            as *mut DLManagedTensorVersioned;
        if !p.is_null() {
            if let Some(d) = (*p).deleter {
                d(p);
            }
        }
        ffi::PyErr_Restore(t, v, tb);
    }
}

/// The capsule's destructor: frees the tensor unless a consumer took it (and renamed the
/// capsule "used_dltensor").
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: called by the interpreter with the GIL held on a live capsule. IsValid never sets
    // an error; any pending error is saved and restored around the deleter.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, CAPSULE_NAME.as_ptr()) != 1 {
            return;
        }
        let mut t = std::ptr::null_mut();
        let mut v = std::ptr::null_mut();
        let mut tb = std::ptr::null_mut();
        ffi::PyErr_Fetch(&mut t, &mut v, &mut tb);
        let p = ffi::PyCapsule_GetPointer(cap, CAPSULE_NAME.as_ptr()) as *mut DLManagedTensor;
        if !p.is_null() {
            if let Some(d) = (*p).deleter {
                d(p);
            }
        }
        ffi::PyErr_Restore(t, v, tb);
    }
}
