//! Asymmetric fences through Linux's `membarrier(2)`: the waker of a sleeping PE runs on every
//! collective's fast path, the sleeper only after it has spun and yielded in vain.
//!
//! A PE that might sleep and one that might wake it make a two-sided handshake (see
//! `Inner::ring_if`): each stores, fences, then loads what the other stored. With a full fence
//! on both sides, the waker pays a sequentially consistent fence per call, which waits for
//! its stores (lines the sleeper holds) to reach it: on the 2-vCPU VM a loop of 8-byte eager
//! broadcasts took 155 ns a call with it, 144 without. `MEMBARRIER_CMD_GLOBAL_EXPEDITED` moves
//! that cost to the sleeper:
//! it makes every running thread of every registered process execute a full barrier before it
//! returns, so a registered waker needs only a compiler fence (the pattern of liburcu and
//! folly's asymmetric barriers). Linux 4.16 and later; where registration fails (older kernels,
//! a seccomp filter), the waker keeps its full fence.

use std::sync::atomic::{compiler_fence, fence, Ordering};

/// From `linux/membarrier.h`, which the `libc` crate does not carry.
const CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

/// Registers this process for the sleepers' barriers; true when it may then use
/// [`light`] with `registered == true`.
pub(crate) fn register() -> bool {
    // SAFETY: membarrier takes plain integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) };
    r == 0
}

/// The waker's side of the handshake, between its stores and its load of the sleeper count:
/// a compiler fence when this process is registered (the sleeper's [`heavy`] orders it),
/// else a full fence.
#[inline]
pub(crate) fn light(registered: bool) {
    if registered {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The sleeper's side, between its store of the sleeper count and its load of the condition:
/// a full fence here, then one on every registered process's running threads. A failure (no
/// membarrier where some PE registered: a seccomp filter on this process only) costs a
/// lost wake-up at most, which the sleeper's bounded nap turns into a delay, not a hang.
pub(crate) fn heavy() {
    fence(Ordering::SeqCst);
    // SAFETY: as in `register`.
    unsafe { libc::syscall(libc::SYS_membarrier, CMD_GLOBAL_EXPEDITED, 0, 0) };
}
