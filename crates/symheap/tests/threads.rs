//! Threads of one PE racing on the same symmetric bytes through safe calls (host backend, one
//! PE): the heap's bytes are touched only with atomic accesses, so the race is defined
//! behaviour, and every aligned 8-byte word a reader sees is one some writer stored whole.

use std::sync::atomic::{AtomicBool, Ordering};

use symheap::{BackendChoice, Context};

#[test]
fn racing_puts_gets_and_copies_see_whole_words() {
    let ctx: Context = Context::builder()
        .unwrap()
        .backend(BackendChoice::Host)
        .init()
        .unwrap();
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
    let torn = std::thread::scope(|s| {
        for &p in &patterns[..2] {
            let (ctx, buf, stop) = (&ctx, &buf, &stop);
            s.spawn(move || {
                let bytes: Vec<u8> = std::iter::repeat_n(p.to_le_bytes(), WORDS)
                    .flatten()
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    ctx.put_bytes(buf.addr(), &bytes, 0).unwrap();
                    ctx.write_at(buf.addr() + 8, &[p; 7]).unwrap();
                }
            });
        }
        {
            let (ctx, buf, other, stop) = (&ctx, &buf, &other, &stop);
            s.spawn(move || {
                let s = ctx.create_stream().unwrap();
                while !stop.load(Ordering::Relaxed) {
                    ctx.put_on_stream(buf.addr(), other.addr(), 64, 0, &s)
                        .unwrap();
                }
            });
        }
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
