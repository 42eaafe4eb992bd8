//! Futex wait and wake on words of the shared heap, so waiting PEs sleep instead of spinning
//! (CI runs 8 PEs on 2 cores; spinning waiters would starve the PE they wait for).

use std::time::Duration;

/// Sleeps while the 32-bit word at `addr` equals `expected`, at most `timeout`. Spurious wake-ups
/// and an already-changed word return at once; callers re-check their condition.
///
/// The futex is shared (not `FUTEX_PRIVATE_FLAG`) because the word lives in memory mapped by
/// several processes.
pub(crate) fn wait(addr: u64, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `addr` is a 4-byte aligned word inside a mapped, shared heap chunk (checked by the
    // caller); FUTEX_WAIT only reads it, and `ts` outlives the call. Errors (EAGAIN when the word
    // already changed, EINTR, ETIMEDOUT) all mean "re-check", which every caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr as *const u32,
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every process sleeping on the word at `addr`.
pub(crate) fn wake_all(addr: u64) {
    // SAFETY: as for `wait`; FUTEX_WAKE does not access the word's contents at all.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr as *const u32,
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}
