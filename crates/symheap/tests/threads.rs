//! Threads of one PE racing on the same symmetric bytes through safe calls (host backend, one
//! PE): the heap's bytes are touched only with atomic accesses, so the race is defined
//! behaviour, and every aligned 8-byte word a reader sees is one some writer stored whole.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use symheap::{BackendChoice, Context, DType};

mod common;
use common::host_pe;

#[test]
fn racing_puts_gets_and_copies_see_whole_words() {
    let ctx = host_pe();
    const WORDS: usize = 4096;
    let buf = ctx.malloc((WORDS * 8) as u64).unwrap();
    let other = ctx.malloc((WORDS * 8) as u64).unwrap();
    let patterns: [u64; 3] = [
        0x1111_1111_1111_1111,
        0xa5a5_a5a5_a5a5_a5a5,
        0x0f0f_0f0f_0f0f_0f0f,
    ];
    buf.write(0, &vec![patterns[0]; WORDS]).unwrap();
    other.write(0, &vec![patterns[2]; WORDS]).unwrap();
    let stop = AtomicBool::new(false);
    let landed = AtomicUsize::new(0);
    let torn = std::thread::scope(|s| {
        for (i, &p) in patterns[..2].iter().enumerate() {
            let (ctx, buf, stop, landed) = (&ctx, &buf, &stop, &landed);
            s.spawn(move || {
                let bytes: Vec<u8> = std::iter::repeat_n(p.to_le_bytes(), WORDS)
                    .flatten()
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    ctx.put_bytes(buf.addr(), &bytes, 0).unwrap();
                    ctx.write_at(buf.addr() + 8, &[p; 7]).unwrap();
                    landed.fetch_or(1 << i, Ordering::Release);
                }
            });
        }
        {
            let (ctx, buf, other, stop, landed) = (&ctx, &buf, &other, &stop, &landed);
            s.spawn(move || {
                let s = ctx.create_stream().unwrap();
                while !stop.load(Ordering::Relaxed) {
                    ctx.put_on_stream(buf.addr(), other.addr(), 64, 0, &s)
                        .unwrap();
                    landed.fetch_or(1 << 2, Ordering::Release);
                }
            });
        }
        wait_for_puts(&landed, 0b111, &stop);
        let mut torn = 0usize;
        let mut out = vec![0u8; WORDS * 8];
        for _ in 0..300 {
            ctx.get_bytes(&mut out, buf.addr(), 0).unwrap();
            torn += out
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                .filter(|v| !patterns.contains(v))
                .count();
        }
        stop.store(true, Ordering::Relaxed);
        torn
    });
    assert_eq!(torn, 0, "words mixing two writers' bytes were read");
    ctx.finalize().unwrap();
}

/// Puts of 8 MiB and more take the streaming-store path (`util::vcopy`): racing it with gets
/// still shows only whole words, and its head of words (an unaligned start) and tail too.
#[test]
fn racing_streaming_puts_see_whole_words() {
    racing_big_puts_see_whole_words((8 << 20) / 8 + 5);
}

/// Puts from 512 KiB to 8 MiB take the string path (`rep movsq` after a head of words up to a
/// line boundary, where the CPU has fast strings): the same check.
#[test]
fn racing_string_puts_see_whole_words() {
    racing_big_puts_see_whole_words((1 << 20) / 8 + 5);
}

/// Two threads put `words` words of one pattern each while a third gets them: every word read
/// is one pattern or the other, and the last put reads back exactly.
fn racing_big_puts_see_whole_words(words: usize) {
    let ctx: Context = Context::builder()
        .unwrap()
        .backend(BackendChoice::Host)
        .capacity(64 << 20)
        .init()
        .unwrap();
    let buf = ctx.malloc((words * 8 + 8) as u64).unwrap();
    // One word in: the destination is 8- but not 16-byte aligned (the allocation is 256-byte
    // aligned), so every loop starts after a head of seven words up to a line boundary.
    let at = buf.addr() + 8;
    let patterns: [u64; 2] = [0x1111_1111_1111_1111, 0xa5a5_a5a5_a5a5_a5a5];
    let stop = AtomicBool::new(false);
    let landed = AtomicUsize::new(0);
    let torn = std::thread::scope(|s| {
        for (i, &p) in patterns.iter().enumerate() {
            let (ctx, stop, landed) = (&ctx, &stop, &landed);
            s.spawn(move || {
                let bytes: Vec<u8> = std::iter::repeat_n(p.to_le_bytes(), words)
                    .flatten()
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    ctx.put_bytes(at, &bytes, 0).unwrap();
                    landed.fetch_or(1 << i, Ordering::Release);
                }
            });
        }
        // On a loaded two-core machine the writers may not have started when the reader's gets
        // are over (CI saw "no put landed"): read only once both have put at least once each,
        // so every get races a writer.
        wait_for_puts(&landed, 0b11, &stop);
        let mut torn = 0usize;
        let mut out = vec![0u8; words * 8];
        let mut seen = 0;
        for _ in 0..20 {
            ctx.get_bytes(&mut out, at, 0).unwrap();
            let words = out
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()));
            for v in words {
                if v != 0 {
                    seen += 1;
                    torn += usize::from(!patterns.contains(&v));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(seen > 0, "no put landed");
        torn
    });
    assert_eq!(torn, 0, "words mixing two writers' bytes were read");
    // Exact once nobody races: one more put, read back byte for byte.
    let data: Vec<u8> = (0..words * 8).map(|i| (i * 131 + 7) as u8).collect();
    ctx.put_bytes(at, &data, 0).unwrap();
    let mut out = vec![0u8; words * 8];
    ctx.get_bytes(&mut out, at, 0).unwrap();
    assert!(out == data, "a streaming put or get changed the bytes");
    ctx.finalize().unwrap();
}

/// Waits (bounded: 60 s) until every writer bit in `all` is set in `landed` (writer `i` sets
/// bit `i` after each put); on timeout stops the writers and fails.
fn wait_for_puts(landed: &AtomicUsize, all: usize, stop: &AtomicBool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while landed.load(Ordering::Acquire) & all != all {
        if Instant::now() > deadline {
            stop.store(true, Ordering::Relaxed);
            panic!("the writer threads did not put within 60 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A buffer this thread just used (so its validation is remembered) is refused as soon as it
/// is released, and a buffer allocated later in its place is accepted.
#[test]
fn a_released_buffer_is_refused_right_after_use() {
    let ctx = host_pe();
    let buf = ctx.malloc(4096).unwrap();
    let addr = buf.addr();
    for _ in 0..3 {
        ctx.put_bytes(addr, &[7u8; 64], 0).unwrap();
        let mut out = [0u8; 64];
        ctx.get_bytes(&mut out, addr, 0).unwrap();
        assert_eq!(out, [7u8; 64]);
    }
    drop(buf);
    let e = ctx.put_bytes(addr, &[1u8; 64], 0).unwrap_err();
    assert!(e.to_string().contains("freed"), "{e}");
    let mut out = [0u8; 8];
    assert!(ctx.get_bytes(&mut out, addr, 0).is_err());
    ctx.finalize().unwrap();
}

/// A small broadcast repeated in a loop skips its range checks (`ops/coll/engine/eager.rs`) only while
/// nothing was released: once its source or destination is freed, the next repeat is refused.
#[test]
fn a_repeated_broadcast_is_refused_once_its_buffer_is_released() {
    let ctx = host_pe();
    let w = ctx.world_team();
    for freed in ["source", "destination"] {
        let src = ctx.malloc(64).unwrap();
        let dst = ctx.malloc(64).unwrap();
        let (s, d) = (src.addr(), dst.addr());
        for round in 0..4u8 {
            ctx.put_bytes(s, &[round + 1; 8], 0).unwrap();
            ctx.broadcast_raw(&w, d, s, 8, DType::U8, 0).unwrap();
            let mut out = [0u8; 8];
            ctx.get_bytes(&mut out, d, 0).unwrap();
            assert_eq!(out, [round + 1; 8]);
        }
        if freed == "source" {
            drop(src);
        } else {
            drop(dst);
        }
        let e = ctx.broadcast_raw(&w, d, s, 8, DType::U8, 0).unwrap_err();
        assert!(e.to_string().contains(freed), "{freed}: {e}");
    }
    ctx.finalize().unwrap();
}

/// Threads of one PE making broadcasts on one team at once take turns at the team's lock and
/// every broadcast completes with its own data.
#[test]
fn threads_sharing_a_team_take_turns() {
    let ctx = host_pe();
    let w = ctx.world_team();
    std::thread::scope(|sc| {
        for t in 0..3u64 {
            let (ctx, w) = (&ctx, &w);
            sc.spawn(move || {
                let src = ctx.malloc(8).unwrap();
                let dst = ctx.malloc(8).unwrap();
                for i in 0..20_000u64 {
                    let v = (t << 32) | i;
                    src.write(0, &[v]).unwrap();
                    ctx.broadcast::<u64>(w, &dst, &src, 1, 0).unwrap();
                    let mut out = [0u64];
                    dst.read(0, &mut out).unwrap();
                    assert_eq!(out[0], v);
                }
            });
        }
    });
    ctx.finalize().unwrap();
}
