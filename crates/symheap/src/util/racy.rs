//! Copies to and from memory that other threads and processes may access at the same time:
//! the host backend's shared heap and control area.
//!
//! With plain `copy_nonoverlapping`, two threads of one process that touch the same heap bytes
//! through safe calls (a `put` and a `get` racing, as SHMEM programs may) would be a data race,
//! which Rust's memory model makes undefined behaviour. Relaxed atomic accesses of the shared
//! side make the race well defined: a racing reader sees each aligned 8-byte word either old or
//! new, as device memory behaves. Ordering with other PEs stays the program's business
//! (barriers, signals, fences), as for the stores this mirrors. No well-kept crate does this
//! for runtime-length byte ranges (the `atomic-memcpy` crate copies one fixed-size `T`), hence
//! these few lines.
//!
//! On x86_64 the bulk of a range of at least [`VEC_MIN`](super::vcopy::VEC_MIN) bytes is
//! copied by the vector loops of [`super::vcopy`] (inline assembly, defined under races for
//! the same reason; 2-3x faster), and only its ends word by word.

use super::vcopy;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

const W: usize = 8;

/// Bytes from `at` up to the next 8-byte boundary (at most `len`).
fn head(at: usize, len: usize) -> usize {
    ((W - at % W) % W).min(len)
}

/// Stores `src` at `dst`.
///
/// Index loops rather than iterator chains: for an aligned 8-byte store 42 instructions under
/// callgrind against 51, of the 130 a whole put takes.
///
/// # Safety
/// `dst..dst + src.len()` must be mapped, writable memory that is accessed by others only
/// atomically or through these functions, and that stays mapped during the call.
pub(crate) unsafe fn store(dst: *mut u8, src: &[u8]) {
    let (len, s) = (src.len(), src.as_ptr());
    if (dst as usize | len) % W == 0 && len < vcopy::VEC_MIN {
        // Whole aligned words, too few for the vector loop (a scalar, a small header): the
        // general path's head, vector and tail steps cost an 8-byte store 30 instructions.
        // One word (a flag, a counter, a scalar broadcast) skips even the loop, which the
        // compiler unrolls with a setup of its own.
        if len == W {
            // SAFETY: `dst` is 8-byte aligned and the word is the caller's whole range.
            unsafe {
                AtomicU64::from_ptr(dst.cast::<u64>())
                    .store(s.cast::<u64>().read_unaligned(), Relaxed)
            };
            return;
        }
        let mut i = 0;
        while i < len {
            // SAFETY: `dst + i` is 8-byte aligned and the word lies inside the caller's range;
            // the private side is read unaligned.
            unsafe {
                AtomicU64::from_ptr(dst.add(i).cast::<u64>())
                    .store(s.add(i).cast::<u64>().read_unaligned(), Relaxed)
            };
            i += W;
        }
        return;
    }
    let h = head(dst as usize, len);
    let mut i = 0;
    while i < h {
        // SAFETY: `i < len`: inside `dst..dst + len`, the caller's mapped range, and `src`.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(*s.add(i), Relaxed) };
        i += 1;
    }
    // SAFETY: `dst + h` is 8-byte aligned (the head was skipped); the rest of both ranges
    // is the caller's.
    i += unsafe { vcopy::bulk(dst.add(i), s.add(i), len - i) };
    while i + W <= len {
        // SAFETY: `dst + i` is 8-byte aligned (the head and the vector part were whole words)
        // and the word lies inside the caller's range; the private side is read unaligned.
        unsafe {
            AtomicU64::from_ptr(dst.add(i).cast::<u64>())
                .store(s.add(i).cast::<u64>().read_unaligned(), Relaxed)
        };
        i += W;
    }
    while i < len {
        // SAFETY: as for the head.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(*s.add(i), Relaxed) };
        i += 1;
    }
}

/// Loads `out.len()` bytes from `src` into `out`.
///
/// # Safety
/// `src..src + out.len()` must be mapped memory that is accessed by others only atomically or
/// through these functions, and that stays mapped during the call.
pub(crate) unsafe fn load(src: *const u8, out: &mut [u8]) {
    let (len, d) = (out.len(), out.as_mut_ptr());
    let src = src.cast_mut();
    if (src as usize | len) % W == 0 && len < vcopy::VEC_MIN {
        // As in `store`: whole aligned words, too few for the vector loop; one word alone.
        if len == W {
            // SAFETY: as in `store`, with the roles of the two sides swapped.
            unsafe {
                d.cast::<u64>()
                    .write_unaligned(AtomicU64::from_ptr(src.cast::<u64>()).load(Relaxed))
            };
            return;
        }
        let mut i = 0;
        while i < len {
            // SAFETY: as in `store`, with the roles of the two sides swapped.
            unsafe {
                d.add(i)
                    .cast::<u64>()
                    .write_unaligned(AtomicU64::from_ptr(src.add(i).cast::<u64>()).load(Relaxed))
            };
            i += W;
        }
        return;
    }
    let h = head(src as usize, len);
    let mut i = 0;
    while i < h {
        // SAFETY: `i < len`: inside the caller's mapped range (atomics only read here) and
        // `out`, which is private and exclusively borrowed.
        unsafe { *d.add(i) = AtomicU8::from_ptr(src.add(i)).load(Relaxed) };
        i += 1;
    }
    // SAFETY: `src + h` is 8-byte aligned; the rest of both ranges is the caller's.
    i += unsafe { vcopy::bulk(d.add(i), src.add(i), len - i) };
    while i + W <= len {
        // SAFETY: as in `store`, with the roles of the two sides swapped; the private side is
        // written unaligned.
        unsafe {
            d.add(i)
                .cast::<u64>()
                .write_unaligned(AtomicU64::from_ptr(src.add(i).cast::<u64>()).load(Relaxed))
        };
        i += W;
    }
    while i < len {
        // SAFETY: as for the head.
        unsafe { *d.add(i) = AtomicU8::from_ptr(src.add(i)).load(Relaxed) };
        i += 1;
    }
}

/// Copies `len` bytes from `src` to `dst`, both shared (see the module documentation), through
/// a small bounce buffer so each side is accessed in aligned words whatever their alignments.
///
/// # Safety
/// Both ranges must satisfy the contracts of [`load`] and [`store`]; they may overlap only if
/// they are equal (the bytes are then rewritten with their own values).
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    if (dst as usize) % W == (src as usize) % W {
        // SAFETY: the caller's ranges.
        unsafe { copy_coaligned(dst, src.cast_mut(), len) };
        return;
    }
    let mut tmp = [0u8; 4096];
    let mut off = 0;
    while off < len {
        let n = tmp.len().min(len - off);
        // SAFETY: sub-ranges of the caller's ranges.
        unsafe {
            load(src.add(off), &mut tmp[..n]);
            store(dst.add(off), &tmp[..n]);
        }
        off += n;
    }
}

/// `copy` for ranges with the same alignment: both sides in aligned words, no bounce.
///
/// # Safety
/// As for [`copy`], with `dst % 8 == src % 8`.
unsafe fn copy_coaligned(dst: *mut u8, src: *mut u8, len: usize) {
    let h = head(dst as usize, len);
    for i in 0..h {
        // SAFETY: inside both of the caller's ranges.
        unsafe {
            AtomicU8::from_ptr(dst.add(i))
                .store(AtomicU8::from_ptr(src.add(i)).load(Relaxed), Relaxed)
        };
    }
    // SAFETY: both sides are 8-byte aligned after the head; the rest is the caller's.
    let h = h + unsafe { vcopy::bulk(dst.add(h), src.add(h), len - h) };
    let words = (len - h) / W;
    // SAFETY: both sides are 8-byte aligned after the head (same alignment) and hold `words`
    // words inside the caller's ranges.
    let (d, s) = unsafe { (dst.add(h).cast::<u64>(), src.add(h).cast::<u64>()) };
    for k in 0..words {
        // SAFETY: word `k` of both ranges.
        unsafe {
            AtomicU64::from_ptr(d.add(k))
                .store(AtomicU64::from_ptr(s.add(k)).load(Relaxed), Relaxed)
        };
    }
    for i in h + words * W..len {
        // SAFETY: inside both of the caller's ranges.
        unsafe {
            AtomicU8::from_ptr(dst.add(i))
                .store(AtomicU8::from_ptr(src.add(i)).load(Relaxed), Relaxed)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alignment_and_length_copies_exactly() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 37 + 11) as u8).collect();
        for a in 0..9 {
            for b in 0..9 {
                // Past 255 bytes the vector loops copy the middle (see `vcopy`).
                for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 150, 255, 256, 300, 4097] {
                    let mut src = vec![0u8; 5000];
                    let mut dst = vec![0u8; 5000];
                    // SAFETY: both Vecs are private to this test and hold the ranges.
                    unsafe { store(src.as_mut_ptr().add(a), &data[..len]) };
                    assert_eq!(&src[a..a + len], &data[..len]);
                    // SAFETY: as above.
                    unsafe { copy(dst.as_mut_ptr().add(b), src.as_ptr().add(a), len) };
                    assert_eq!(&dst[b..b + len], &data[..len]);
                    assert!(dst[..b].iter().all(|&x| x == 0));
                    assert!(dst[b + len..].iter().all(|&x| x == 0));
                    let mut out = vec![0u8; len];
                    // SAFETY: as above.
                    unsafe { load(dst.as_ptr().add(b), &mut out) };
                    assert_eq!(out, &data[..len]);
                }
            }
        }
    }
}
