//! What each PE does in a self-test scenario. Only the public symheap API is used; every check
//! compares against exact expected values computed from the shared seed.

use std::time::{Duration, Instant};

use symheap::{Context, ErrorKind, SymmetricBuffer};

/// Arguments every PE of a scenario receives (the same on all PEs).
#[derive(Debug, Clone, Copy)]
pub struct PeArgs {
    /// Shared random seed.
    pub seed: u64,
    /// For failure scenarios: the PE that misbehaves.
    pub victim: usize,
}

pub type Outcome = Result<(), String>;

/// A symheap error as a scenario failure.
pub(super) fn e2s(e: symheap::Error) -> String {
    e.to_string()
}

/// A deterministic value for word `i` written by PE `from` into PE `to`'s copy.
pub(super) fn pattern(seed: u64, from: usize, to: usize, i: usize) -> u64 {
    let mut x = seed ^ ((from as u64) << 48) ^ ((to as u64) << 32) ^ i as u64;
    // splitmix64 finaliser: spreads nearby inputs over all bits.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Checks the contract for one buffer: local entry, shared per-peer deltas, map, translate.
fn check_table(ctx: &Context, b: &SymmetricBuffer) -> Outcome {
    let me = ctx.my_pe();
    let t = b.peer_bases();
    let hb = ctx.heap_bases();
    ensure!(t.len() == ctx.n_pes(), "table has {} entries", t.len());
    ensure!(
        t[me] == b.addr(),
        "peer_bases[me] {:#x} != addr {:#x}",
        t[me],
        b.addr()
    );
    ensure!(
        ctx.is_symmetric(b.addr()),
        "own buffer not reported symmetric"
    );
    for r in 0..ctx.n_pes() {
        if hb[r] == 0 {
            ensure!(t[r] == 0, "non-direct PE {r} has a table entry");
            continue;
        }
        ensure!(
            t[r].wrapping_sub(t[me]) == hb[r].wrapping_sub(hb[me]),
            "per-peer delta for PE {r} differs from the heap's"
        );
        let tr = ctx.translate(b.addr(), me, r).map_err(e2s)?;
        ensure!(
            tr == Some(t[r]),
            "translate to PE {r} gave {tr:?}, table says {:#x}",
            t[r]
        );
    }
    let m = b.address_map();
    ensure!(m.peer_bases == t, "address map table differs");
    ensure!(
        m.local_rank == me && m.allocation_base == b.addr(),
        "address map base"
    );
    ensure!(m.allocation_bytes == b.len_bytes(), "address map size");
    ensure!(m.direct.get(me), "self not direct");
    Ok(())
}

/// Writes into every peer's copy of `target` through `table` (another allocation's table),
/// then checks what arrived locally.
fn cross_write(
    ctx: &Context,
    table: &[u64],
    target: &SymmetricBuffer,
    seed: u64,
    words: usize,
) -> Outcome {
    let me = ctx.my_pe();
    let n = ctx.n_pes();
    ensure!(
        target.len_bytes() as usize >= n * words * 8,
        "target too small"
    );
    // Poison our own copy first so an unwritten slot cannot pass.
    target
        .write(0, &vec![0xdead_beef_dead_beefu64; n * words])
        .map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    for to in 0..n {
        if table[to] == 0 {
            continue;
        }
        // Translate the address of our slot in `target` with `table`, made for another
        // allocation: this works because the per-peer delta is constant over the heap.
        let local_slot = target.addr() + (me * words * 8) as u64;
        let remote = table[to].wrapping_add(local_slot.wrapping_sub(table[me]));
        let data: Vec<u64> = (0..words).map(|i| pattern(seed, me, to, i)).collect();
        ctx.write_at(remote, &data).map_err(e2s)?;
    }
    ctx.barrier_all().map_err(e2s)?;
    let got = target.to_vec::<u64>().map_err(e2s)?;
    for from in 0..n {
        if ctx.heap_bases()[from] == 0 {
            continue;
        }
        for i in 0..words {
            let want = pattern(seed, from, me, i);
            let have = got[from * words + i];
            ensure!(
                have == want,
                "word {i} from PE {from}: {have:#x}, expected {want:#x}"
            );
        }
    }
    ctx.barrier_all().map_err(e2s)
}

/// The contract: tables, shared offsets, cross-allocation translation, before and after the
/// heap grows past its first chunk.
pub fn contract(ctx: &Context, a: PeArgs) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(a.seed);
    let n = ctx.n_pes();
    let first_mapped = ctx.heap_usage().mapped;
    let mut bufs = Vec::new();
    for _ in 0..rng.usize(5..12) {
        let bytes = rng.u64(1..256 * 1024);
        let align = 1u64 << rng.u32(0..13);
        let b = ctx.align(align, bytes).map_err(e2s)?;
        ensure!(b.addr() % align == 0, "alignment {align} not kept");
        check_table(ctx, &b)?;
        bufs.push(b);
    }
    // Typed contract form.
    let (typed, t) = ctx.allocate_symmetric::<u64>(n * 64).map_err(e2s)?;
    ensure!(t[ctx.my_pe()] == typed.addr(), "typed table");
    check_table(ctx, &typed)?;
    cross_write(ctx, &bufs[0].peer_bases(), &typed, a.seed, 64)?;

    // Grow past the first chunk (the test runs with a small chunk size).
    let big_bytes = first_mapped * 2 + rng.u64(1..4096);
    let big = ctx.malloc(big_bytes).map_err(e2s)?;
    let grown = ctx.heap_usage().mapped;
    ensure!(
        grown > first_mapped,
        "heap did not grow ({first_mapped} -> {grown})"
    );
    check_table(ctx, &big)?;
    for b in &bufs {
        check_table(ctx, b)?;
    }
    // A table made before the growth translates into memory mapped after it, both ways.
    cross_write(ctx, &bufs[1].peer_bases(), &big, a.seed ^ 1, 128)?;
    let late = ctx.malloc(4096 * n as u64).map_err(e2s)?;
    cross_write(ctx, &big.peer_bases(), &typed, a.seed ^ 2, 64)?;
    cross_write(ctx, &late.peer_bases(), &big, a.seed ^ 3, 32)?;

    // Every PE computed the same offsets.
    let mut offs: Vec<u8> = Vec::new();
    for b in bufs.iter().chain([&typed, &big, &late]) {
        offs.extend_from_slice(&b.offset().to_le_bytes());
    }
    let all = ctx.all_gather_bytes(&offs).map_err(e2s)?;
    ensure!(
        all.iter().all(|o| *o == offs),
        "PEs computed different offsets"
    );
    Ok(())
}

/// Allocation and release alternating on a full heap (a temporary buffer per step): the first
/// allocation meets the other PEs to reclaim the one released block, which makes just enough
/// room; the heap then grows by one chunk of headroom, so the following steps are placed
/// without meeting anyone until it is used up. Checked through `allocation_syncs`, the heap
/// size, and the data written into every step's buffer.
pub fn alloc_churn(ctx: &Context, a: PeArgs) -> Outcome {
    const MIB: u64 = 1 << 20;
    const STEPS: u64 = 48;
    let me = ctx.my_pe();
    ctx.barrier_all().map_err(e2s)?;
    let x = ctx.malloc(MIB).map_err(e2s)?;
    // Larger than everything free: the heap grows to exactly what it needs (to the
    // granularity), then a second buffer takes what that leaves at the end, less 1 KiB for
    // its peer table and alignment.
    let u = ctx.heap_usage();
    let chunk = 8 * MIB; // the scenario's SYMHEAP_CHUNK_SIZE
    let big = ctx.malloc(u.mapped - u.in_use + chunk).map_err(e2s)?;
    let grown = ctx.heap_usage();
    let big_span = grown.in_use - u.in_use;
    let slack = grown.mapped - (big.offset() + big_span);
    let rest = if slack > 2048 {
        Some(ctx.malloc(slack - 1024).map_err(e2s)?)
    } else {
        None
    };
    let full = ctx.heap_usage();
    ensure!(
        full.mapped - full.in_use < MIB,
        "setup: {} bytes still free after filling a {}-byte heap",
        full.mapped - full.in_use,
        full.mapped
    );
    drop(x);
    let before = ctx.heap_usage();
    for step in 0..STEPS {
        let b = ctx.malloc(MIB).map_err(e2s)?;
        let word = pattern(a.seed, me, me, step as usize);
        let at = (step * 4099 % (MIB / 8)) as usize;
        b.write(at, &[word]).map_err(e2s)?;
        let mut back = [0u64];
        b.read(at, &mut back).map_err(e2s)?;
        ensure!(
            back[0] == word,
            "step {step}: the buffer did not keep its data"
        );
    }
    let after = ctx.heap_usage();
    let syncs = after.allocation_syncs - before.allocation_syncs;
    // One to reclaim x and grow the headroom, then one per chunk's worth of steps.
    let most = 1 + STEPS.div_ceil(chunk / MIB - 1);
    ensure!(
        syncs <= most,
        "{syncs} of {STEPS} allocations met the other PEs (at most {most} expected)"
    );
    ensure!(
        after.mapped <= before.mapped + chunk,
        "the heap grew from {} to {} bytes for {STEPS} steps of 1 MiB",
        before.mapped,
        after.mapped
    );
    drop((big, rest));
    ctx.barrier_all().map_err(e2s)
}

/// One round of `release`: allocates `sizes` (no two live buffers may overlap), then releases
/// them all in an order drawn from `mine`; returns the offsets they had, which a fully
/// reclaimed heap gives again.
fn release_round(
    ctx: &Context,
    sizes: &[u64],
    mine: &mut fastrand::Rng,
) -> Result<Vec<u64>, String> {
    let mut bufs: Vec<SymmetricBuffer> = Vec::new();
    for &s in sizes {
        bufs.push(ctx.malloc(s).map_err(e2s)?);
    }
    let offsets: Vec<u64> = bufs.iter().map(|b| b.offset()).collect();
    for (i, x) in bufs.iter().enumerate() {
        for y in &bufs[i + 1..] {
            let (xa, xe) = (x.offset(), x.offset() + x.len_bytes());
            let (ya, ye) = (y.offset(), y.offset() + y.len_bytes());
            ensure!(xe <= ya || ye <= xa, "live buffers overlap");
        }
    }
    mine.shuffle(&mut bufs);
    // Release half here, half from another thread (as a finalizer or GC would).
    let other: Vec<SymmetricBuffer> = bufs.split_off(bufs.len() / 2);
    let t = std::thread::spawn(move || drop(other));
    for b in bufs {
        b.free();
    }
    t.join()
        .map_err(|_| "release thread panicked".to_string())?;
    Ok(offsets)
}

/// A block released by some PEs only must not be reused; once all have released it, nothing
/// is left in use beyond `start_in_use`.
fn partial_release(ctx: &Context, start_in_use: u64) -> Outcome {
    let me = ctx.my_pe();
    let held = ctx.malloc(64 * 1024).map_err(e2s)?;
    let held_range = (held.offset(), held.offset() + held.len_bytes());
    let keep = if me % 2 == 1 {
        Some(held)
    } else {
        drop(held);
        None
    };
    ctx.barrier_all().map_err(e2s)?;
    let fresh: Vec<SymmetricBuffer> = (0..8)
        .map(|_| ctx.malloc(16 * 1024))
        .collect::<Result<_, _>>()
        .map_err(e2s)?;
    if ctx.n_pes() > 1 {
        for f in &fresh {
            let (s, e) = (f.offset(), f.offset() + f.len_bytes());
            ensure!(
                e <= held_range.0 || s >= held_range.1,
                "reused a block PE 1 still holds"
            );
        }
    }
    drop(fresh);
    drop(keep);
    ctx.barrier_all().map_err(e2s)?;
    ensure!(
        ctx.heap_usage().in_use == start_in_use,
        "leak after partial release"
    );
    Ok(())
}

/// Reclaim happens at an allocation that would otherwise grow, without a barrier. Sizes come
/// from the free space (backends keep different amounts of their own state in the heap).
fn reclaim_at_allocation(ctx: &Context) -> Outcome {
    let usage = ctx.heap_usage();
    let (mapped, free) = (usage.mapped, usage.mapped - usage.in_use);
    let filler = ctx.malloc(free / 2).map_err(e2s)?;
    drop(filler);
    let again = ctx.malloc(free / 2 + free / 8).map_err(e2s)?;
    // It lands in the memory the heap had (the released block's); the heap may add one chunk
    // of headroom after such a reclaim (see alloc_churn), nothing more.
    ensure!(
        again.offset() + again.len_bytes() <= mapped,
        "placed in new memory instead of the released block"
    );
    ensure!(
        ctx.heap_usage().mapped <= mapped + (4 << 20),
        "grew by more than one chunk of headroom at a reclaim"
    );
    drop(again);
    Ok(())
}

/// Release in different orders (some from other threads), then reuse: no overlap, no leak.
pub fn release(ctx: &Context, a: PeArgs) -> Outcome {
    let me = ctx.my_pe();
    let mut shared = fastrand::Rng::with_seed(a.seed);
    let mut mine = fastrand::Rng::with_seed(a.seed ^ ((me as u64 + 1) * 0x1234_5678));
    ctx.barrier_all().map_err(e2s)?;
    let start = ctx.heap_usage();
    let sizes: Vec<u64> = (0..40).map(|_| shared.u64(1..64 * 1024)).collect();

    let first = release_round(ctx, &sizes, &mut mine)?;
    ctx.barrier_all().map_err(e2s)?;
    let after = ctx.heap_usage();
    ensure!(
        after.in_use == start.in_use,
        "leak: {} bytes in use, started at {}",
        after.in_use,
        start.in_use
    );
    ensure!(
        after.live_blocks == start.live_blocks,
        "leak: {} live blocks",
        after.live_blocks
    );
    // Fully reclaimed means the allocator is back where it was: the same offsets again.
    let second = release_round(ctx, &sizes, &mut mine)?;
    ensure!(
        first == second,
        "offsets after reclaim differ from the first round"
    );
    ctx.barrier_all().map_err(e2s)?;

    partial_release(ctx, start.in_use)?;
    reclaim_at_allocation(ctx)?;
    ctx.barrier_all().map_err(e2s)?;
    Ok(())
}

/// PE 0 allocates 1 MiB, the others 2 MiB: the next barrier fails on every PE, naming the call.
pub fn mismatch(ctx: &Context, _a: PeArgs) -> Outcome {
    ctx.barrier_all().map_err(e2s)?;
    let t0 = Instant::now();
    let size = if ctx.my_pe() == 0 { 1 << 20 } else { 2 << 20 };
    let _b = ctx.malloc(size).map_err(e2s)?;
    let e = match ctx.barrier_all() {
        Ok(()) => return Err("barrier after diverging allocations succeeded".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_)),
        "wrong kind: {e}"
    );
    let s = e.to_string();
    ensure!(
        s.contains("PE 0 called allocate(1 MiB"),
        "message does not name PE 0's call: {s}"
    );
    ensure!(
        s.contains("allocate(2 MiB"),
        "message does not name the others' call: {s}"
    );
    ensure!(
        t0.elapsed() < ctx.config().timeout,
        "took longer than the timeout"
    );
    // The context stays failed: no later call runs on a diverged heap.
    ensure!(
        ctx.malloc(64).is_err(),
        "allocation after a mismatch succeeded"
    );
    Ok(())
}

/// The victim kills itself with SIGKILL; every other PE must fail naming it.
pub fn kill(ctx: &Context, a: PeArgs) -> Outcome {
    ctx.barrier_all().map_err(e2s)?;
    if ctx.my_pe() == a.victim {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        std::thread::sleep(Duration::from_secs(60));
        return Err("SIGKILL did not kill".into());
    }
    let t0 = Instant::now();
    let e = match ctx.barrier_all() {
        Ok(()) => return Err("barrier with a dead PE succeeded".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    match e.kind() {
        ErrorKind::PeerExited { peer, .. } => {
            ensure!(
                *peer == a.victim,
                "blamed PE {peer}, victim was {}",
                a.victim
            )
        }
        _ => return Err(format!("wrong kind: {e}")),
    }
    ensure!(
        e.to_string().contains(&format!("PE {} exited", a.victim)),
        "message: {e}"
    );
    ensure!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    Ok(())
}

/// The victim arrives late at a barrier; everyone fails with a timeout naming it.
pub fn timeout(ctx: &Context, a: PeArgs) -> Outcome {
    ctx.barrier_all().map_err(e2s)?;
    let limit = ctx.config().timeout;
    if ctx.my_pe() == a.victim {
        std::thread::sleep(limit * 2 + Duration::from_millis(500));
    }
    let t0 = Instant::now();
    let e = match ctx.barrier_all() {
        Ok(()) => return Err("barrier with a late PE succeeded".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    match e.kind() {
        ErrorKind::Timeout { missing, .. } => {
            ensure!(
                missing == &vec![a.victim],
                "named {missing:?}, late PE was {}",
                a.victim
            )
        }
        _ => return Err(format!("wrong kind: {e}")),
    }
    ensure!(
        e.to_string()
            .contains(&format!("PE {} did not arrive", a.victim)),
        "message: {e}"
    );
    if ctx.my_pe() != a.victim {
        ensure!(
            t0.elapsed() < limit + Duration::from_secs(5),
            "took {:?}",
            t0.elapsed()
        );
    }
    Ok(())
}

/// Bad arguments return errors of the right kind and leave the context usable.
pub fn bad_input(ctx: &Context, _a: PeArgs) -> Outcome {
    let me = ctx.my_pe();
    let n = ctx.n_pes();
    let invalid = |r: Result<(), symheap::Error>, what: &str| -> Outcome {
        match r {
            Err(e) if matches!(e.kind(), ErrorKind::InvalidArgument(_)) => {
                ensure!(e.pe() == Some(me), "{what}: error lacks the PE");
                Ok(())
            }
            Err(e) => Err(format!("{what}: wrong kind: {e}")),
            Ok(()) => Err(format!("{what}: accepted")),
        }
    };
    invalid(ctx.malloc(0).map(drop), "zero size")?;
    invalid(ctx.align(3, 64).map(drop), "alignment 3")?;
    invalid(
        ctx.align(1 << 20 | 1 << 4, 64).map(drop),
        "alignment not a power of two",
    )?;
    let b = ctx.malloc(4096).map_err(e2s)?;
    let outside = ctx.heap_bases()[me] + ctx.heap_usage().capacity + 4096 * 1024 * 1024;
    let stack_var = 5u64;
    let on_stack = &stack_var as *const u64 as u64;
    invalid(
        ctx.translate(on_stack, me, 0).map(drop),
        "translate of a stack address",
    )?;
    invalid(
        ctx.translate(outside, me, 0).map(drop),
        "translate outside the heap",
    )?;
    invalid(
        ctx.translate(b.addr(), n, 0).map(drop),
        "translate from PE n",
    )?;
    invalid(
        ctx.translate(b.addr(), me, n + 3).map(drop),
        "translate to PE n+3",
    )?;
    invalid(b.peer_view(n).map(drop), "peer view of PE n")?;
    invalid(ctx.write_at(on_stack, &[1u64]), "write_at a stack address")?;
    let end = b.addr() + ctx.heap_usage().mapped - b.offset() - 4;
    invalid(
        ctx.write_at(end, &[1u64]),
        "write_at across the end of the heap",
    )?;
    invalid(b.write(510, &[1u64, 2, 3]), "write past the buffer end")?;
    let mut out = [0u32; 2];
    invalid(b.read(1023, &mut out), "read past the buffer end")?;

    // Over capacity: an OutOfMemory error on every PE, and nothing changes.
    let before = ctx.heap_usage();
    match ctx.malloc(before.capacity + 1) {
        Err(e) if matches!(e.kind(), ErrorKind::OutOfMemory { .. }) => {
            ensure!(
                e.to_string().contains("SYMHEAP_HEAP_CAPACITY"),
                "OOM message lacks the fix: {e}"
            )
        }
        Err(e) => return Err(format!("over capacity: wrong kind: {e}")),
        Ok(_) => return Err("over-capacity allocation succeeded".into()),
    }
    ensure!(
        ctx.heap_usage() == before,
        "a failed allocation changed the heap"
    );
    // Fill the heap until it is full: every PE fails at the same allocation.
    let mut held = Vec::new();
    let step = before.capacity / 5;
    let failed_at = loop {
        match ctx.malloc(step) {
            Ok(b) => held.push(b),
            Err(e) if matches!(e.kind(), ErrorKind::OutOfMemory { .. }) => break held.len(),
            Err(e) => return Err(format!("filling the heap: {e}")),
        }
        ensure!(held.len() < 10, "heap never filled");
    };
    let all = ctx
        .all_gather_bytes(&(failed_at as u64).to_le_bytes())
        .map_err(e2s)?;
    ensure!(
        all.iter()
            .all(|x| x[..] == (failed_at as u64).to_le_bytes()),
        "PEs ran out at different allocations"
    );
    drop(held);
    ctx.barrier_all().map_err(e2s)?;
    // Still healthy.
    let c = ctx.calloc(16, 8).map_err(e2s)?;
    ensure!(
        c.to_vec::<u64>().map_err(e2s)? == vec![0u64; 16],
        "calloc not zeroed"
    );
    ctx.barrier_all().map_err(e2s)
}
