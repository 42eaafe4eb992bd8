//! The command's own CUDA tools: what the benchmarks and self-tests measure symheap against or
//! time it with (NCCL, plain peer copies, `cuMemAlloc` buffers, events, graphs). They live here,
//! not in the runtime crate, because only the command uses them. Each talks to the driver
//! through cudarc's `sys` layer directly; every safe function checks its buffers' sizes and
//! takes symheap's [`Stream`](symheap::Stream), so safe callers cannot reach memory outside
//! the buffers they pass.

pub(crate) mod cuda;
pub(crate) mod nccl;

use cudarc::driver::sys::{self, CUresult};
use symheap::{Error, ErrorKind, Result};

/// A driver result as symheap's error type (the name and text the driver gives).
pub(crate) fn check(r: CUresult, what: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: writes a pointer to a static string owned by the driver (or leaves it null).
    let _ = unsafe { sys::cuGetErrorName(r, &mut name) };
    let name = if name.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null pointers from cuGetErrorName are NUL-terminated static strings.
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    Err(backend(format!("{what} failed: {name}")))
}

/// A tool's failure, as a backend error of the call "tools".
pub(crate) fn backend(msg: String) -> Error {
    Error::new(None, "tools", ErrorKind::Backend(msg))
}

/// Device memory a tool may hand to the driver: an address and how many bytes are there.
///
/// # Safety
/// An implementation promises that `len_bytes()` bytes at `addr()` are device memory of the
/// current device that stay allocated while the value is borrowed.
pub(crate) unsafe trait DeviceMem {
    /// Device address of the first byte.
    fn addr(&self) -> u64;
    /// Bytes at `addr`.
    fn len_bytes(&self) -> u64;

    /// `addr`, once `bytes` fit.
    fn span(&self, bytes: u64, what: &str) -> Result<u64> {
        if bytes > self.len_bytes() {
            return Err(backend(format!(
                "{what}: {bytes} bytes asked of a {}-byte buffer",
                self.len_bytes()
            )));
        }
        Ok(self.addr())
    }
}

// SAFETY: a live symmetric allocation of `len_bytes()` bytes, released only when dropped.
unsafe impl DeviceMem for symheap::SymmetricBuffer {
    fn addr(&self) -> u64 {
        symheap::SymmetricBuffer::addr(self)
    }
    fn len_bytes(&self) -> u64 {
        symheap::SymmetricBuffer::len_bytes(self)
    }
}
