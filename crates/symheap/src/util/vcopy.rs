//! The bulk of a racing-safe copy in vector instructions (x86_64), for [`super::racy`].
//!
//! Relaxed atomic 8-byte words (the portable path in `racy`) are well defined under races but
//! do not vectorise: a 4 KiB put took 2.5x a memcpy. The loops here are inline assembly, which
//! the Rust abstract machine treats as opaque code: what the block does to memory is what the
//! hardware does, and its effect (each byte, indeed each aligned 8-byte word of an 8-byte
//! aligned destination, ends up old or new) is one that relaxed atomic accesses in Rust could
//! produce, so two threads or processes racing through it are not undefined behaviour.
//! x86 makes every aligned 8-byte access atomic, and vector accesses are made of such parts
//! (Intel SDM vol. 3 §8.1.1; AMD APM vol. 2 §7.3.2), which `tests/threads.rs` checks.
//!
//! Measured on the 2-core AMD EPYC (Zen, AVX2, ERMSB) this was written on, buffers in cache,
//! per copy: 4 KiB 0.05 us (memcpy 0.07, racy words 0.17-0.20), 32 KiB 0.70 (0.76, 1.7);
//! 16 MiB 0.9-1.0 ms with non-temporal stores (memcpy 1.6-1.9, racy words 1.6-1.9). `rep
//! movsb` was no faster than the AVX2 loop there and promises nothing about access sizes, so
//! it is not used; `rep movsq`, whose elements are aligned quadwords, is, for copies that spill
//! out of L2 on the 2-core Xeon (family 6 model 207, ERMSB, FSRM) the project builds on now
//! (see [`REP_MIN`]).

/// Below this many bytes the word loop is as fast (the vector loop's setup dominates).
pub(crate) const VEC_MIN: usize = 256;
/// From this many bytes on, stores bypass the caches (non-temporal): source and destination
/// of a copy this large no longer both fit in the last-level cache with everything else, and
/// avoiding the read-for-ownership of every destination line nearly halves the time (measured:
/// 2 MiB is faster with ordinary stores, 16 MiB 1.7x faster without them).
pub(crate) const NT_MIN: usize = 8 << 20;

/// Copies a prefix of `[src, src + len)` to `dst` and returns its length (a multiple of 8; 0
/// when `len` is below [`VEC_MIN`] or there is no vector path on this architecture). The
/// caller copies the rest.
///
/// # Safety
/// The shared side (`dst` of a store, `src` of a load, both of a shared-to-shared copy) is
/// 8-byte aligned; both ranges are mapped for `len` bytes, `dst` writable, and do not overlap;
/// memory others may touch concurrently is accessed by them only atomically or through `racy`.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) unsafe fn bulk(dst: *mut u8, src: *const u8, len: usize) -> usize {
    if len < VEC_MIN {
        return 0;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { bulk_vector(dst, src, len) }
}

/// [`bulk`] from [`VEC_MIN`] bytes on.
///
/// # Safety
/// As for [`bulk`], with `len >= VEC_MIN`.
#[cfg(target_arch = "x86_64")]
unsafe fn bulk_vector(dst: *mut u8, src: *const u8, len: usize) -> usize {
    // An unaligned destination (private, of a load) is written the cached way, as it is:
    // moving it to a boundary would misalign the shared source, whose words must be read whole.
    if dst as usize % 8 != 0 {
        // SAFETY: the caller's contract, passed on.
        return unsafe { vector(dst, src, len) };
    }
    // An 8-byte aligned destination is brought to a cache-line boundary first, in whole
    // words, whatever loop follows: a vector store that straddles two lines costs about two.
    // Measured on the 2-core Xeon (AVX2 loop, destination 16 bytes past a line against on
    // one): 4 KiB 95 ns against 48, 64 KiB 4.0 us against 1.8, 1 MiB 97 us against 59; glibc's
    // memcpy aligns its destination the same way, which is why `get` into a private buffer at
    // such an offset ran at 0.7x a memcpy.
    let pre = (64 - dst as usize % 64) % 64;
    // SAFETY: `pre` is at most 56 < VEC_MIN <= len bytes, in whole 8-byte words of the
    // caller's ranges; the rest of them is passed on with `dst + pre` on a line boundary.
    unsafe {
        words(dst, src, pre);
        let (dst, src, rest) = (dst.add(pre), src.add(pre), len - pre);
        pre + if len >= NT_MIN {
            nontemporal(dst, src, rest)
        } else if len >= REP_MIN && std::arch::is_x86_feature_detected!("ermsb") {
            quads(dst, src, rest)
        } else {
            vector(dst, src, rest)
        }
    }
}

/// The cached vector loop this CPU has: AVX2, else SSE2; returns the bytes copied.
///
/// # Safety
/// As for [`bulk`], with `len >= 32`.
#[cfg(target_arch = "x86_64")]
unsafe fn vector(dst: *mut u8, src: *const u8, len: usize) -> usize {
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked); the caller's contract, passed on.
        unsafe { avx2(dst, src, len) }
    } else {
        // SAFETY: the caller's contract, passed on; SSE2 is part of x86_64.
        unsafe { sse2(dst, src, len) }
    }
}

/// From this many bytes on (below [`NT_MIN`]), an 8-byte aligned destination is written by
/// `rep movsq` where the CPU has fast strings (ERMSB). Copies this large spill out of the
/// core's L2 (source and destination together), and the string unit writes whole lines
/// without reading them first, as the vector loop's stores must. Measured on the 2-core Xeon
/// (2 MiB L2), one copy: 1 MiB 41 us against the AVX2 loop's 47 (glibc's memcpy, which uses
/// `rep movsb` there, 39); 256-512 KiB alike; `symheap bench rma --host` put of 1 MiB went
/// from 58-59 to 50-51 us, get from 62-64 to 53 us (BENCHMARKS.md, thirteenth session).
pub(crate) const REP_MIN: usize = 512 << 10;

/// `rep movsq` of `len / 8` quadwords; returns the bytes copied. Its elements are aligned
/// quadwords of an aligned destination. Intel's SDM ("Fast-String Operation and Out-of-Order
/// Stores") lets fast-string stores complete out of order and says nothing of splitting an
/// element: that each stays whole is the same assumption the vector loops make of their parts.
///
/// # Safety
/// As for [`bulk`], with `dst` 8-byte aligned.
#[cfg(target_arch = "x86_64")]
unsafe fn quads(dst: *mut u8, src: *const u8, len: usize) -> usize {
    let n = len / 8;
    // SAFETY: moves `n` quadwords from `src` to `dst`, inside the caller's ranges; the
    // direction flag is clear on entry to any function (System V ABI).
    unsafe {
        std::arch::asm!(
            "rep movsq",
            inout("rcx") n => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags),
        );
    }
    n * 8
}

/// Copies `len` bytes (a multiple of 8) in 8-byte moves: each store to an 8-byte aligned
/// destination is one aligned (atomic) quadword.
///
/// # Safety
/// As for [`bulk`], for `len` bytes, `len % 8 == 0`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn words(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len % 8 == 0);
    if len == 0 {
        return;
    }
    // SAFETY: reads `[src, src + len)` and writes `[dst, dst + len)`, the caller's ranges, in
    // quadword moves; no other memory, no stack. As for the vector loops, the effect is that of
    // relaxed atomic accesses, so racing accessors are defined behaviour.
    unsafe {
        std::arch::asm!(
            "2:",
            "mov {t}, [{s}]",
            "mov [{d}], {t}",
            "add {s}, 8",
            "add {d}, 8",
            "sub {n}, 8",
            "jnz 2b",
            s = inout(reg) src => _,
            d = inout(reg) dst => _,
            n = inout(reg) len => _,
            t = out(reg) _,
            options(nostack),
        );
    }
}

/// No vector path here: the caller's word loop copies everything.
///
/// # Safety
/// None needed; kept `unsafe` to match the x86_64 signature.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn bulk(_dst: *mut u8, _src: *const u8, _len: usize) -> usize {
    0
}

/// 128 bytes per round in four 32-byte loads and stores, then 32-byte rounds; returns the
/// bytes copied (`len` rounded down to 32).
///
/// # Safety
/// As for [`bulk`], with AVX2 available and `len >= 32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2(dst: *mut u8, src: *const u8, len: usize) -> usize {
    let big = len & !127;
    let done = len & !31;
    // SAFETY: reads `[src, src + done)` and writes `[dst, dst + done)`, inside the caller's
    // ranges (`done <= len`); the block touches no other memory and no stack, and clobbers only
    // the registers it names. Its memory effect is that of relaxed atomic accesses (see the
    // module documentation), so racing accessors are defined behaviour.
    unsafe {
        std::arch::asm!(
            "test {big}, {big}",
            "jz 3f",
            "2:",
            "vmovdqu ymm0, [{s}]",
            "vmovdqu ymm1, [{s} + 32]",
            "vmovdqu ymm2, [{s} + 64]",
            "vmovdqu ymm3, [{s} + 96]",
            "vmovdqu [{d}], ymm0",
            "vmovdqu [{d} + 32], ymm1",
            "vmovdqu [{d} + 64], ymm2",
            "vmovdqu [{d} + 96], ymm3",
            "add {s}, 128",
            "add {d}, 128",
            "sub {big}, 128",
            "jnz 2b",
            "3:",
            "test {rest}, {rest}",
            "jz 5f",
            "4:",
            "vmovdqu ymm0, [{s}]",
            "vmovdqu [{d}], ymm0",
            "add {s}, 32",
            "add {d}, 32",
            "sub {rest}, 32",
            "jnz 4b",
            "5:",
            "vzeroupper",
            s = inout(reg) src => _,
            d = inout(reg) dst => _,
            big = inout(reg) big => _,
            rest = inout(reg) done - big => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
            options(nostack),
        );
    }
    done
}

/// As [`avx2`] in 16-byte SSE2 registers (every x86_64 has them): 64-byte rounds, then 16-byte
/// ones; returns `len` rounded down to 16.
///
/// # Safety
/// As for [`bulk`], with `len >= 16`.
#[cfg(target_arch = "x86_64")]
unsafe fn sse2(dst: *mut u8, src: *const u8, len: usize) -> usize {
    let big = len & !63;
    let done = len & !15;
    // SAFETY: as in `avx2`, for `[.., + done)`.
    unsafe {
        std::arch::asm!(
            "test {big}, {big}",
            "jz 3f",
            "2:",
            "movdqu xmm0, [{s}]",
            "movdqu xmm1, [{s} + 16]",
            "movdqu xmm2, [{s} + 32]",
            "movdqu xmm3, [{s} + 48]",
            "movdqu [{d}], xmm0",
            "movdqu [{d} + 16], xmm1",
            "movdqu [{d} + 32], xmm2",
            "movdqu [{d} + 48], xmm3",
            "add {s}, 64",
            "add {d}, 64",
            "sub {big}, 64",
            "jnz 2b",
            "3:",
            "test {rest}, {rest}",
            "jz 5f",
            "4:",
            "movdqu xmm0, [{s}]",
            "movdqu [{d}], xmm0",
            "add {s}, 16",
            "add {d}, 16",
            "sub {rest}, 16",
            "jnz 4b",
            "5:",
            s = inout(reg) src => _,
            d = inout(reg) dst => _,
            big = inout(reg) big => _,
            rest = inout(reg) done - big => _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            options(nostack),
        );
    }
    done
}

/// Non-temporal copy: 64-byte rounds of unaligned loads and aligned streaming stores, then
/// `sfence`, which orders the streaming stores before every later store (they are weakly
/// ordered otherwise: a flag or barrier arrival stored after this copy would not be seen after
/// the data). Returns the bytes copied.
///
/// # Safety
/// As for [`bulk`], with `dst` 16-byte aligned (as `movntdq` needs; [`bulk_vector`] hands it a
/// line boundary) and `len >= 64`.
#[cfg(target_arch = "x86_64")]
unsafe fn nontemporal(dst: *mut u8, src: *const u8, len: usize) -> usize {
    let big = len & !63;
    // SAFETY: as in `avx2`, for `[.., + big)`.
    unsafe {
        std::arch::asm!(
            "2:",
            "movdqu xmm0, [{s}]",
            "movdqu xmm1, [{s} + 16]",
            "movdqu xmm2, [{s} + 32]",
            "movdqu xmm3, [{s} + 48]",
            "movntdq [{d}], xmm0",
            "movntdq [{d} + 16], xmm1",
            "movntdq [{d} + 32], xmm2",
            "movntdq [{d} + 48], xmm3",
            "add {s}, 64",
            "add {d}, 64",
            "sub {big}, 64",
            "jnz 2b",
            "sfence",
            s = inout(reg) src => _,
            d = inout(reg) dst => _,
            big = inout(reg) big => _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            options(nostack),
        );
    }
    big
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_copies_exactly() {
        let data: Vec<u8> = (0..(NT_MIN + 300)).map(|i| (i * 131 + 7) as u8).collect();
        for len in [
            0,
            255,
            256,
            257,
            300,
            4096 + 24,
            70_001,
            REP_MIN + 40,
            REP_MIN + 3,
            NT_MIN,
            NT_MIN + 200,
        ] {
            // Destinations at every word offset in a line (the head that aligns them), and
            // one not word-aligned (a private destination of a load, copied as it is).
            for (da, sa) in [
                (0usize, 0usize),
                (8, 3),
                (16, 8),
                (24, 1),
                (32, 0),
                (40, 16),
                (56, 5),
                (3, 0),
                (21, 8),
            ] {
                let mut dst = vec![0u8; len + 64];
                let base = dst.as_mut_ptr();
                // SAFETY: at most 7 + 56 bytes into `dst`, which has 64 spare ones.
                let d = unsafe { base.add((8 - base as usize % 8) % 8 + da) };
                let src = &data[sa..sa + len.min(data.len() - sa)];
                // SAFETY: `d` lies inside the private `dst` with `len` bytes of room (at most
                // 63 bytes of offset in 64 spare ones); where it is not 8-byte aligned, `src`
                // is (`sa` 0 or 8 into a heap allocation), as `bulk` asks of a load's source.
                let n = unsafe { bulk(d, src.as_ptr(), src.len()) };
                assert_eq!(n % 8, 0);
                assert!(n <= src.len());
                if cfg!(target_arch = "x86_64") && src.len() >= VEC_MIN {
                    assert!(src.len() - n < 72, "{n} of {}", src.len());
                }
                // SAFETY: as above, reading back what was written.
                let got = unsafe { std::slice::from_raw_parts(d, n) };
                assert_eq!(got, &src[..n]);
                let off = d as usize - base as usize;
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + n..].iter().all(|&b| b == 0));
            }
        }
    }
}
