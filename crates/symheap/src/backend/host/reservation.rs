//! A reserved range of address space into which shared memory is mapped at fixed places.

use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};

use crate::error::{backend, Result};

/// `len` bytes of `PROT_NONE` address space, unmapped as a whole when dropped.
pub(crate) struct Reservation {
    base: NonNull<std::ffi::c_void>,
    len: usize,
}

// SAFETY: the reservation is a plain address range; the pointer is never dereferenced through
// this struct, only used to compute addresses and to unmap once in Drop.
unsafe impl Send for Reservation {}
// SAFETY: as above; shared references only read `base` and `len`.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Reserves `len` bytes anywhere. `what` names the purpose in errors.
    pub(crate) fn new(len: u64, what: &str) -> Result<Reservation> {
        let nz = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| backend("init", format!("{what}: {len} bytes cannot be reserved")))?;
        // SAFETY: an anonymous PROT_NONE reservation at an address the kernel picks touches no
        // existing mapping; MAP_NORESERVE keeps it from counting against memory.
        let base = unsafe {
            mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(|e| {
            backend(
                "init",
                format!(
                    "{what}: cannot reserve {} MiB of address space: {e}",
                    len >> 20
                ),
            )
        })?;
        Ok(Reservation {
            base,
            len: nz.get(),
        })
    }

    /// First address.
    pub(crate) fn base(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// Maps `len` bytes of `fd` (from its start) read-write and shared at `offset`. Each range
    /// may be mapped once.
    pub(crate) fn map_fixed(&self, offset: u64, len: u64, fd: &OwnedFd) -> Result<()> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.len as u64)
        {
            return Err(backend(
                "map",
                format!(
                    "{len} bytes at {offset} exceed the {}-byte reservation",
                    self.len
                ),
            ));
        }
        let nz = NonZeroUsize::new(len as usize).ok_or_else(|| backend("map", "empty range"))?;
        let at = NonZeroUsize::new((self.base() + offset) as usize)
            .ok_or_else(|| backend("map", "null address"))?;
        // SAFETY: `offset..offset+len` lies inside our own PROT_NONE reservation (checked
        // above) and callers map each range once, so MAP_FIXED replaces only reserved, unused
        // pages; the mapping lives until the reservation is unmapped in Drop.
        unsafe {
            mmap(
                Some(at),
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                fd,
                0,
            )
        }
        .map_err(|e| backend("map", format!("mmap of a shared chunk: {e}")))?;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` came from mmap in `new` and is unmapped exactly once, here;
        // every fixed mapping lies inside it and goes with it. The owner is being dropped, so
        // nothing uses the addresses afterwards.
        let _ = unsafe { munmap(self.base, self.len) };
    }
}

/// A new memfd of `len` bytes named `name` (visible in /proc/PID/fd for diagnosis).
pub(crate) fn memfd(name: &str, len: u64) -> Result<OwnedFd> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let cname = std::ffi::CString::new(name).map_err(|e| backend("memfd", e.to_string()))?;
    let fd = memfd_create(cname.as_c_str(), MFdFlags::MFD_CLOEXEC)
        .map_err(|e| backend("memfd", format!("memfd_create: {e}")))?;
    nix::unistd::ftruncate(&fd, len as i64).map_err(|e| {
        backend(
            "memfd",
            format!("sizing a {len}-byte shared chunk: {e} (is memory limited?)"),
        )
    })?;
    Ok(fd)
}
