//! The control area: a small block of host shared memory per PE, mapped by every PE of the node,
//! that symheap's own host-side synchronisation (barriers, doorbells, ledger boards) runs on
//! whatever backend holds the data. Words are accessed only with atomics.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::host::reservation::{memfd, Reservation};
use super::host::{futex, membarrier};
use crate::bootstrap::{Bootstrap, NodeChannel, NodeInfo};
use crate::error::{backend, Result};

/// Every node-local PE's control block, mapped in this process.
pub struct SharedArea {
    res: Reservation,
    /// Bytes between two PEs' blocks: a power of two, so finding the PE of an address (checked
    /// on every word access) is a shift, not a division.
    stride: u64,
    shift: u32,
    direct: Vec<bool>,
    /// Every block is direct (one node): a range inside the reservation needs no lookup.
    all_direct: bool,
    /// This process is registered for the sleepers' membarriers: a waker's fence is then a
    /// compiler fence (see `backend/host/membarrier.rs`).
    light_wake: bool,
}

impl SharedArea {
    /// Collective over the node: each PE creates its block of `bytes` (zeroed) and maps every
    /// node-local PE's block; PEs on other nodes get none.
    pub fn new(
        node: &NodeInfo,
        channel: &NodeChannel,
        boot: &dyn Bootstrap,
        rank: usize,
        bytes: u64,
    ) -> Result<SharedArea> {
        // Only address space: the memfd's pages beyond `bytes` are never touched.
        let stride = bytes.next_power_of_two().max(4096);
        let world = node.node_of.len();
        let res = Reservation::new(stride * world as u64, "control area")?;
        let fd = memfd(&format!("symheap-control-pe{rank}"), stride)?;
        let all = channel.exchange_fds(std::slice::from_ref(&fd), boot)?;
        for (lr, fds) in all.iter().enumerate() {
            let pe = node.local_peers[lr];
            let f = fds
                .first()
                .ok_or_else(|| backend("init", format!("PE {pe} passed no control block")))?;
            res.map_fixed(pe as u64 * stride, stride, f)?;
        }
        let direct: Vec<bool> = (0..world)
            .map(|r| node.node_of[r] == node.node_index)
            .collect();
        Ok(SharedArea {
            res,
            stride,
            shift: stride.trailing_zeros(),
            all_direct: direct.iter().all(|&d| d),
            direct,
            light_wake: membarrier::register(),
        })
    }

    /// Start of PE `pe`'s block, or 0 when it lives on another node.
    pub fn base(&self, pe: usize) -> u64 {
        if self.direct.get(pe).copied().unwrap_or(false) {
            self.res.base() + pe as u64 * self.stride
        } else {
            0
        }
    }

    #[inline]
    fn word<const W: u64>(&self, addr: u64) -> u64 {
        let lo = self.res.base();
        assert!(
            addr >= lo && addr + W <= lo + self.res.len() && addr % W == 0,
            "control word {addr:#x} outside the control area or misaligned"
        );
        if !self.all_direct {
            let pe = ((addr - lo) >> self.shift) as usize;
            assert!(self.direct[pe], "control word of PE {pe} on another node");
        }
        addr
    }

    /// Atomic 64-bit load (acquire).
    #[inline]
    pub fn load64(&self, addr: u64) -> u64 {
        let a = self.word::<8>(addr);
        // SAFETY: `word` checked the address is an aligned 8-byte word inside a mapped block of
        // the reservation, which lives as long as `self`; these words are only ever accessed
        // atomically, by every process that maps them.
        unsafe { AtomicU64::from_ptr(a as *mut u64) }.load(Ordering::SeqCst)
    }

    /// Atomic 64-bit store (sequentially consistent).
    pub fn store64(&self, addr: u64, v: u64) {
        let a = self.word::<8>(addr);
        // SAFETY: as in `load64`.
        unsafe { AtomicU64::from_ptr(a as *mut u64) }.store(v, Ordering::SeqCst)
    }

    /// Atomic 64-bit store with release ordering only: a plain store on x86, for words whose
    /// readers synchronise through a later release store (barrier boards before the arrival,
    /// seqlock-published records) instead of through a sequentially consistent order.
    #[inline]
    pub fn store64_release(&self, addr: u64, v: u64) {
        let a = self.word::<8>(addr);
        // SAFETY: as in `load64`.
        unsafe { AtomicU64::from_ptr(a as *mut u64) }.store(v, Ordering::Release)
    }

    /// `store64_release` of `vals` into the consecutive words from `addr`, with one range check
    /// for them all (a barrier's arrival, a published call).
    #[inline]
    pub fn store64s_release(&self, addr: u64, vals: &[u64]) {
        self.words(addr, vals.len()).store_all_release(0, vals);
    }

    /// Writes a seqlock-protected record at `addr` (one range check for it all): word 0 set to
    /// `seq` (odd: being written), then `head` from word 1 and `tail` after it, then word 0 set
    /// to `seq + 1`. A release fence keeps the words from being seen before the odd sequence,
    /// the final release store keeps them before the even one; a reader loads the sequence,
    /// the words and the sequence again (a published call, `Inner::publish`).
    #[inline]
    pub fn store_seqlocked(&self, addr: u64, seq: u64, head: &[u64], tail: &[u64]) {
        let w = self.words(addr, 1 + head.len() + tail.len());
        w.store_release(0, seq);
        std::sync::atomic::fence(Ordering::Release);
        w.store_all_release(1, head);
        w.store_all_release(1 + head.len(), tail);
        w.store_release(0, seq + 1);
    }

    /// The `n` consecutive words from `addr`, checked once (aligned, inside directly mapped
    /// blocks): a record read or written word by word (a ring entry, an eager slot) then
    /// costs one range check instead of one per word. Panics as `load64` does on a bad range.
    /// Always inline: an eager broadcast takes three runs a call, and the compiler, left to
    /// choose, made this a call of its own (40 instructions more on the root).
    #[inline(always)]
    pub fn words(&self, addr: u64, n: usize) -> Words<'_> {
        self.check_range(addr, 8 * n);
        assert!(addr % 8 == 0, "control word {addr:#x} misaligned");
        Words {
            base: addr as *const AtomicU64,
            n,
            _area: std::marker::PhantomData,
        }
    }

    /// Atomic 64-bit compare-and-swap; returns the value found (`current` when it swapped).
    pub fn cas64(&self, addr: u64, current: u64, new: u64) -> u64 {
        let a = self.word::<8>(addr);
        // SAFETY: as in `load64`.
        match unsafe { AtomicU64::from_ptr(a as *mut u64) }.compare_exchange(
            current,
            new,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(v) | Err(v) => v,
        }
    }

    /// Atomic 32-bit load.
    #[inline]
    pub fn load32(&self, addr: u64) -> u32 {
        let a = self.word::<4>(addr);
        // SAFETY: as in `load64`, for a 4-byte word.
        unsafe { AtomicU32::from_ptr(a as *mut u32) }.load(Ordering::SeqCst)
    }

    /// Atomic 32-bit add (wrapping); returns the old value.
    pub fn add32(&self, addr: u64, v: u32) -> u32 {
        let a = self.word::<4>(addr);
        // SAFETY: as in `load32`.
        unsafe { AtomicU32::from_ptr(a as *mut u32) }.fetch_add(v, Ordering::SeqCst)
    }

    /// Sleeps while the 32-bit word at `addr` reads `seen` (at most `timeout`).
    pub fn sleep(&self, addr: u64, seen: u32, timeout: Duration) {
        futex::wait(self.word::<4>(addr), seen, timeout);
    }

    /// The waker's fence of the sleep handshake, between its stores (what a sleeper waits
    /// for) and its load of the sleeper count: see `Inner::ring_if`.
    #[inline]
    pub fn waker_fence(&self) {
        membarrier::light(self.light_wake);
    }

    /// The sleeper's fence of the sleep handshake, between its store of the sleeper count and
    /// its load of the condition.
    pub fn sleeper_fence(&self) {
        membarrier::heavy();
    }

    /// Wakes every sleeper on the word at `addr`.
    pub fn wake(&self, addr: u64) {
        futex::wake_all(self.word::<4>(addr));
    }

    #[inline]
    fn check_range(&self, addr: u64, len: usize) {
        let lo = self.res.base();
        assert!(
            addr >= lo && addr + len as u64 <= lo + self.res.len(),
            "outside the control area"
        );
        if self.all_direct {
            return;
        }
        let first = ((addr - lo) >> self.shift) as usize;
        let last = ((addr + len.max(1) as u64 - 1 - lo) >> self.shift) as usize;
        // One block, as every record is: one lookup, no loop.
        let direct = if first == last {
            self.direct[first]
        } else {
            (first..=last).all(|pe| self.direct[pe])
        };
        assert!(direct, "control block on another node");
    }

    /// Copies bytes into the area (for mailboxes).
    pub fn write(&self, addr: u64, data: &[u8]) {
        self.check_range(addr, data.len());
        // SAFETY: the range lies inside the mapped reservation (checked above). Mailbox bytes are
        // published by a barrier before anyone reads them.
        unsafe { crate::util::racy::store(addr as *mut u8, data) }
    }

    /// Copies bytes out of the area.
    pub fn read(&self, addr: u64, out: &mut [u8]) {
        self.check_range(addr, out.len());
        // SAFETY: as in `write`.
        unsafe { crate::util::racy::load(addr as *const u8, out) }
    }
}

/// A run of control words checked once by [`SharedArea::words`]; borrowing the area keeps the
/// mapping alive while the run is used. Each access checks only its index against the run.
#[derive(Clone, Copy)]
pub struct Words<'a> {
    base: *const AtomicU64,
    n: usize,
    _area: std::marker::PhantomData<&'a SharedArea>,
}

impl Words<'_> {
    fn at(&self, k: usize) -> &AtomicU64 {
        assert!(k < self.n, "control word {k} outside a run of {}", self.n);
        // SAFETY: `SharedArea::words` checked that the run's `n` words are aligned and lie in
        // mapped blocks of the reservation, which outlives `'a`; `k < n`. Control words are only
        // ever accessed atomically, by every process that maps them.
        unsafe { &*self.base.add(k) }
    }

    /// Word `k`, sequentially consistent (as [`SharedArea::load64`]).
    #[inline]
    pub fn load(&self, k: usize) -> u64 {
        self.at(k).load(Ordering::SeqCst)
    }

    /// Word `k`, acquire: for a word whose writer stored it last with release.
    #[inline]
    pub fn load_acquire(&self, k: usize) -> u64 {
        self.at(k).load(Ordering::Acquire)
    }

    /// Stores `v` in word `k` with release: a reader that acquires it sees every store made
    /// before it (as [`SharedArea::store64_release`]).
    #[inline]
    pub fn store_release(&self, k: usize, v: u64) {
        self.at(k).store(v, Ordering::Release)
    }

    /// Stores `vals` in words `k..k + vals.len()` with release, in order; the run is checked
    /// once, not per word.
    #[inline]
    pub fn store_all_release(&self, k: usize, vals: &[u64]) {
        assert!(
            k <= self.n && vals.len() <= self.n - k,
            "control words {k}..{} outside a run of {}",
            k + vals.len(),
            self.n
        );
        for (i, &v) in vals.iter().enumerate() {
            // SAFETY: as in `at`: `k + i < n` (checked above for the whole run).
            unsafe { &*self.base.add(k + i) }.store(v, Ordering::Release);
        }
    }
}
