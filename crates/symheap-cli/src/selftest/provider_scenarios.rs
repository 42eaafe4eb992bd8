//! Provider scenarios: the contract checked through the `Provider` trait, on the native heap
//! (every backend) and, on GPUs, on NVSHMEM, with one kernel over both providers' memory.

use symheap::cuda::KernelArg;
use symheap::{Allocation, BackendKind, Context, ErrorKind, NativeHeap, Nvshmem, Provider};

use super::scenarios::{e2s, pattern, Outcome, PeArgs};

fn to_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The contract for one allocation of `p`: table shape, own entry, direct mask, the table in
/// memory, the provider's per-peer offsets, translation.
fn check_alloc(p: &dyn Provider, a: &Allocation, offsets: &[i64], what: &str) -> Outcome {
    let (me, n) = (p.my_pe(), p.n_pes());
    let t = a.peer_bases();
    ensure!(
        t.len() == n,
        "{what}: table has {} entries for {n} PEs",
        t.len()
    );
    ensure!(
        t[me] == a.ptr(),
        "{what}: peer_bases[me] {:#x} != ptr {:#x}",
        t[me],
        a.ptr()
    );
    ensure!(a.direct().len() == n, "{what}: direct mask length");
    for r in 0..n {
        ensure!(
            a.direct()[r] == (t[r] != 0),
            "{what}: direct[{r}] disagrees with peer_bases[{r}] = {:#x}",
            t[r]
        );
        if t[r] != 0 {
            ensure!(
                t[r].wrapping_sub(a.ptr()) as i64 == offsets[r],
                "{what}: PE {r}'s offset {} differs from the provider's {}",
                t[r].wrapping_sub(a.ptr()) as i64,
                offsets[r]
            );
            ensure!(
                a.translate(a.ptr() + 8, me, r) == Some(t[r] + 8),
                "{what}: translate to PE {r}"
            );
        }
    }
    ensure!(a.direct()[me], "{what}: this PE is not direct to itself");
    let in_memory = p.read_table(a).map_err(e2s)?;
    ensure!(
        in_memory == t,
        "{what}: the table at {:#x} holds {in_memory:x?}, peer_bases is {t:x?}",
        a.table_addr()
    );
    let m = a.address_map();
    ensure!(
        m.peer_bases == t && m.allocation_base == a.ptr() && m.local_rank == me,
        "{what}: address map"
    );
    Ok(())
}

/// `e` must be an invalid-argument error; `what` says which misuse it answers.
fn rejected(e: Option<symheap::Error>, what: &str) -> Outcome {
    ensure!(
        matches!(
            e.as_ref().map(|e| e.kind()),
            Some(ErrorKind::InvalidArgument(_))
        ),
        "{what}: {e:?}"
    );
    Ok(())
}

/// The native heap's identity, and its promise of constant per-peer offsets, which every
/// later allocation is checked against.
fn native_offsets(ctx: &Context, p: &NativeHeap) -> Result<Vec<i64>, String> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    ensure!(
        p.name() == "native" && p.my_pe() == me && p.n_pes() == n,
        "identity"
    );
    let offsets = p
        .peer_offsets()
        .ok_or("the native heap must promise constant offsets")?;
    ensure!(
        offsets.len() == n && offsets[me] == 0,
        "offsets {offsets:?}"
    );
    Ok(offsets)
}

/// Allocations of many sizes (odd ones too), each checked against the contract; every PE draws
/// the same sizes from `rng`.
fn allocate_many(
    ctx: &Context,
    p: &NativeHeap,
    offsets: &[i64],
    rng: &mut fastrand::Rng,
) -> Result<Vec<Allocation>, String> {
    let n = ctx.n_pes();
    let mut allocs = Vec::new();
    for k in 0..rng.usize(6..12) {
        let bytes = match k % 4 {
            0 => rng.u64(1..16),
            1 => rng.u64(16..4096),
            2 => rng.u64(4096..(256 << 10)),
            _ => rng.u64(1..64) * 4096 + 1,
        };
        let al = p.allocate(bytes).map_err(e2s)?;
        ensure!(
            al.bytes() == bytes,
            "allocation of {bytes} reports {}",
            al.bytes()
        );
        check_alloc(p, &al, offsets, &format!("allocation {k} ({bytes} bytes)"))?;
        // Raw: the table is readable at table_addr with the context's own accessors too.
        let mut raw = vec![0u64; n];
        ctx.read_at(al.table_addr(), &mut raw).map_err(e2s)?;
        ensure!(raw == al.peer_bases(), "raw table read differs");
        ensure!(
            al.direct().iter().all(|&d| d),
            "on one node every PE must be direct: {:?}",
            al.direct()
        );
        allocs.push(al);
    }
    Ok(allocs)
}

/// Cross-allocation translation: a new allocation B, into every peer's copy of which this PE
/// writes through the table of one of `allocs` (drawn from `rng`); returns B once every PE's
/// words in it are checked.
fn cross_translation(
    ctx: &Context,
    p: &NativeHeap,
    offsets: &[i64],
    allocs: &[Allocation],
    seed: u64,
    rng: &mut fastrand::Rng,
) -> Result<Allocation, String> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let words = rng.usize(1..2000);
    let b = p.allocate((n * words * 8) as u64).map_err(e2s)?;
    check_alloc(p, &b, offsets, "target B")?;
    let ta = allocs[rng.usize(0..allocs.len())].peer_bases().to_vec();
    p.write_bytes(&b, 0, &to_bytes(&vec![0xdead_beef_dead_beef; n * words]))
        .map_err(e2s)?;
    p.barrier().map_err(e2s)?;
    let my_slot = b.ptr() + (me * words * 8) as u64;
    for (to, &base) in ta.iter().enumerate() {
        let remote = base.wrapping_add(my_slot.wrapping_sub(ta[me]));
        ensure!(
            b.translate(my_slot, me, to) == Some(remote),
            "A's table and B's table translate B's slot to PE {to} differently"
        );
        let data: Vec<u64> = (0..words).map(|i| pattern(seed, me, to, i)).collect();
        ctx.write_at(remote, &data).map_err(e2s)?;
    }
    p.barrier().map_err(e2s)?;
    let mut got = vec![0u8; n * words * 8];
    p.read_bytes(&b, 0, &mut got).map_err(e2s)?;
    let got = from_bytes(&got);
    for from in 0..n {
        for i in 0..words {
            let want = pattern(seed, from, me, i);
            ensure!(
                got[from * words + i] == want,
                "B word {i} from PE {from}: {:#x}, expected {want:#x}",
                got[from * words + i]
            );
        }
    }
    Ok(b)
}

/// Places reused by blocks of other sizes: each round fills every block's user bytes (over the
/// tables earlier blocks had there), frees them all and meets the other PEs so the next round
/// reuses the places. Allocation skips writing a table that is still in place, so a stale one
/// would show here, in the table in memory.
fn reuse_churn(p: &NativeHeap, offsets: &[i64], rng: &mut fastrand::Rng) -> Outcome {
    // A few sizes, so places and table offsets recur: short blocks whose tables a longer one
    // covers, then short ones again.
    const SIZES: [u64; 5] = [7, 100, 1000, 4000, 20_000];
    for round in 0..16 {
        let mut live = Vec::new();
        for k in 0..rng.usize(2..6) {
            let bytes = SIZES[rng.usize(0..SIZES.len())];
            let al = p.allocate(bytes).map_err(e2s)?;
            let what = format!("round {round}, allocation {k} ({bytes} bytes)");
            check_alloc(p, &al, offsets, &what)?;
            p.write_bytes(&al, 0, &vec![0xab; bytes as usize])
                .map_err(e2s)?;
            live.push(al);
        }
        for al in live {
            p.free(al).map_err(e2s)?;
        }
        p.barrier().map_err(e2s)?;
    }
    Ok(())
}

/// NVSHMEM where it cannot run (a missing library; the host backend): a clear error, never a
/// panic or a hang.
fn nvshmem_refused(ctx: &Context) -> Outcome {
    let bogus = std::path::Path::new("/nonexistent/symheap-test/libnvshmem_host.so.3");
    match Nvshmem::load_library(Some(bogus), None) {
        Ok(l) => return Err(format!("loaded NVSHMEM from a nonexistent path: {l:?}")),
        Err(e) => {
            let s = e.to_string();
            ensure!(
                matches!(e.kind(), ErrorKind::Unsupported(_))
                    && s.contains("/nonexistent/symheap-test")
                    && s.contains("SYMHEAP_NVSHMEM_LIB"),
                "missing library error: {s}"
            );
        }
    }
    if ctx.backend_kind() == BackendKind::Host {
        match Nvshmem::new(ctx, None) {
            Ok(_) => return Err("NVSHMEM started on the host backend".into()),
            Err(e) => ensure!(
                matches!(e.kind(), ErrorKind::Unsupported(_))
                    && e.to_string().contains("CUDA backend"),
                "NVSHMEM on the host backend: {e}"
            ),
        }
    }
    Ok(())
}

/// The contract through the `Provider` trait on the native heap: tables, the table in memory,
/// constant per-peer offsets over allocations of many sizes, cross-allocation translation with
/// random data; and NVSHMEM's clear refusal on the host backend.
pub fn provider_native(ctx: &Context, a: PeArgs) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(a.seed);
    let p = NativeHeap::new(ctx);
    let offsets = native_offsets(ctx, &p)?;
    let mut allocs = allocate_many(ctx, &p, &offsets, &mut rng)?;
    let b = cross_translation(ctx, &p, &offsets, &allocs, a.seed, &mut rng)?;
    reuse_churn(&p, &offsets, &mut rng)?;

    // Range checks and ownership.
    rejected(
        p.write_bytes(&b, b.bytes(), &[1]).err(),
        "a write past the end must be rejected",
    )?;
    let other = NativeHeap::new(ctx);
    let stray = allocs.pop().ok_or("no allocation")?;
    rejected(
        other.read_table(&stray).err(),
        "another provider must refuse the allocation",
    )?;
    rejected(p.allocate(0).err(), "a 0-byte allocation must be rejected")?;
    p.free(stray).map_err(e2s)?;
    p.free(b).map_err(e2s)?;
    for al in allocs {
        p.free(al).map_err(e2s)?;
    }

    nvshmem_refused(ctx)?;
    p.barrier().map_err(e2s)
}

/// The value `provider_mix` (examples/cuda/provider_mix.cu) writes.
fn mix_value(seed: u64, tag: u64, from: usize, to: usize, i: usize) -> u32 {
    let mut x = seed ^ (tag << 56) ^ ((from as u64) << 40) ^ ((to as u64) << 24) ^ i as u64;
    x = (x ^ (x >> 31)).wrapping_mul(0x7fb5_d329_728e_a185);
    x = (x ^ (x >> 27)).wrapping_mul(0x81da_def4_bc2d_d44d);
    (x ^ (x >> 33)) as u32
}

/// One buffer of a launch: its allocation, the provider that made it, and the table the kernel
/// translates it with (possibly another allocation's).
struct Target<'a> {
    p: &'a dyn Provider,
    buf: &'a Allocation,
    table: &'a Allocation,
}

/// What every launch of `provider_mix` shares.
struct Mixer<'a> {
    ctx: &'a Context,
    m: &'a symheap::cuda::CudaModule,
    stream: &'a symheap::Stream,
    nv: &'a Nvshmem,
    words: usize,
}

impl Mixer<'_> {
    /// Poisons both buffers, launches `provider_mix` once over them, checks every slot
    /// exactly.
    fn round(&self, seed: u64, x: Target<'_>, y: Target<'_>, what: &str) -> Outcome {
        let Mixer {
            ctx,
            m,
            stream,
            nv,
            words,
        } = *self;
        let (me, n) = (ctx.my_pe(), ctx.n_pes());
        for t in [&x, &y] {
            let poison: Vec<u8> = std::iter::repeat_n([0xa5u8, 0x5a, 0xc3, 0x3c], n * words)
                .flatten()
                .collect();
            t.p.write_bytes(t.buf, 0, &poison).map_err(e2s)?;
        }
        // Both barriers: symheap's (native) and NVSHMEM's (which also passes a symheap point).
        ctx.barrier_all().map_err(e2s)?;
        nv.barrier().map_err(e2s)?;
        let slot = |t: &Target<'_>| t.buf.ptr() + (me * words * 4) as u64;
        // SAFETY: provider_mix(const int64_t*, uint32_t*, const int64_t*, uint32_t*, int, int, int,
        // uint64_t) matches these arguments; each table holds n entries and each buffer holds
        // n*words uint32 on every PE, so every translated slot lies inside the peer's copy.
        unsafe {
            m.launch(
                "provider_mix",
                16,
                256,
                0,
                stream,
                &[
                    KernelArg::U64(x.table.table_addr()),
                    KernelArg::U64(slot(&x)),
                    KernelArg::U64(y.table.table_addr()),
                    KernelArg::U64(slot(&y)),
                    KernelArg::I32(me as i32),
                    KernelArg::I32(n as i32),
                    KernelArg::I32(words as i32),
                    KernelArg::U64(seed),
                ],
            )
        }
        .map_err(e2s)?;
        ctx.sync_stream(stream).map_err(e2s)?;
        nv.barrier().map_err(e2s)?;
        for (tag, t) in [(0u64, &x), (1, &y)] {
            let label = format!("{what}: buffer {tag} ({})", t.p.name());
            let mut raw = vec![0u8; n * words * 4];
            t.p.read_bytes(t.buf, 0, &mut raw).map_err(e2s)?;
            // PE `from` reached this PE when its table had it direct; on one node with P2P
            // that is every PE, and the tables are symmetric.
            for from in (0..n).filter(|&f| t.table.direct()[f]) {
                for i in 0..words {
                    let k = (from * words + i) * 4;
                    let have = u32::from_le_bytes(raw[k..k + 4].try_into().unwrap());
                    let want = mix_value(seed, tag, from, me, i);
                    ensure!(
                        have == want,
                        "{label} word {i} from PE {from}: {have:#x}, expected {want:#x}"
                    );
                }
            }
        }
        Ok(())
    }
}

impl Mixer<'_> {
    /// The three launches: each provider alone (the second buffer translated with a table of
    /// another allocation), then both providers in one launch with two tables.
    fn all_rounds(
        &self,
        native: &NativeHeap,
        nat: &[Allocation],
        nvs: &[Allocation],
        seed: u64,
    ) -> Outcome {
        let nv = self.nv;
        let nt = |buf, table| Target {
            p: native,
            buf,
            table,
        };
        let vt = |buf, table| Target { p: nv, buf, table };
        // The native heap alone: x with its own table, y (allocation 1) with allocation 2's table.
        self.round(seed, nt(&nat[0], &nat[0]), nt(&nat[1], &nat[2]), "native")?;
        // NVSHMEM alone, the same way.
        self.round(
            seed ^ 1,
            vt(&nvs[0], &nvs[0]),
            vt(&nvs[1], &nvs[2]),
            "NVSHMEM",
        )?;
        // Both in one launch, two tables, each of another allocation of its own provider.
        self.round(
            seed ^ 2,
            nt(&nat[3], &nat[1]),
            vt(&nvs[3], &nvs[1]),
            "native + NVSHMEM",
        )
    }
}

/// NVSHMEM runs as this PE on this PE's GPU; PE 0 says which library it loaded.
fn nvshmem_identity(ctx: &Context, cu: &symheap::cuda::CudaBackend, nv: &Nvshmem) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    ensure!(
        nv.my_pe() == me && nv.n_pes() == n && nv.device() == cu.device_ordinal(),
        "NVSHMEM identity: PE {} of {} on device {}",
        nv.my_pe(),
        nv.n_pes(),
        nv.device()
    );
    let lib = nv.library();
    if me == 0 {
        println!(
            "NVSHMEM {}.{}.{} from {}",
            lib.version.0,
            lib.version.1,
            lib.version.2,
            lib.path.display()
        );
    }
    Ok(())
}

/// Four allocations from each provider, all of `bytes` or more (extra drawn from `rng`), each
/// checked against its provider's offsets.
fn allocate_both(
    ctx: &Context,
    native: &NativeHeap,
    n_off: &[i64],
    nv: &Nvshmem,
    v_off: &[i64],
    bytes: u64,
    rng: &mut fastrand::Rng,
) -> Result<(Vec<Allocation>, Vec<Allocation>), String> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let mut nat = Vec::new();
    let mut nvs = Vec::new();
    for k in 0..4 {
        // Different sizes on purpose: the offsets must not depend on them.
        let extra = rng.u64(0..100_000);
        let na = native
            .allocate(bytes + if k == 0 { 0 } else { extra })
            .map_err(e2s)?;
        check_alloc(native, &na, n_off, &format!("native allocation {k}"))?;
        nat.push(na);
        let va = nv
            .allocate(bytes + if k == 0 { 0 } else { extra })
            .map_err(e2s)?;
        check_alloc(nv, &va, v_off, &format!("NVSHMEM allocation {k}"))?;
        if n > 1 {
            ensure!(
                (0..n).any(|r| r != me && va.direct()[r]),
                "NVSHMEM reports no direct peer"
            );
        }
        nvs.push(va);
    }
    Ok((nat, nvs))
}

/// One CUDA kernel over the native heap and NVSHMEM: each provider alone (with a table of
/// another allocation: cross-allocation translation), then both in one launch with two tables.
/// NVSHMEM is required: a machine without it fails, naming every place searched.
pub fn providers(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let cu = ctx.cuda().ok_or("this scenario needs the CUDA backend")?;
    let native = NativeHeap::new(ctx);
    let nv = Nvshmem::new(ctx, None)
        .map_err(|e| format!("NVSHMEM is required on GPU machines for this scenario: {e}"))?;
    nvshmem_identity(ctx, cu, &nv)?;
    let n_off = native.peer_offsets().ok_or("native offsets")?;
    let v_off = nv
        .peer_offsets()
        .ok_or("NVSHMEM must promise constant offsets")?;
    ensure!(
        v_off.len() == n && v_off[me] == 0,
        "NVSHMEM offsets {v_off:?}"
    );

    let src = include_str!("../../../../examples/cuda/provider_mix.cu");
    let m = cu.compile_module(src, "provider_mix.cu").map_err(e2s)?;
    let stream = cu.create_stream().map_err(e2s)?;
    let mut rng = fastrand::Rng::with_seed(a.seed);
    let words = rng.usize(1000..50_000);
    let bytes = (n * words * 4) as u64;
    let (nat, nvs) = allocate_both(ctx, &native, &n_off, &nv, &v_off, bytes, &mut rng)?;
    let mixer = Mixer {
        ctx,
        m: &m,
        stream: &stream,
        nv: &nv,
        words,
    };
    mixer.all_rounds(&native, &nat, &nvs, a.seed)?;

    for va in nvs {
        nv.free(va).map_err(e2s)?;
    }
    for na in nat {
        native.free(na).map_err(e2s)?;
    }
    // After a free, a new allocation still follows the same offsets.
    let again = nv.allocate(12345).map_err(e2s)?;
    check_alloc(&nv, &again, &v_off, "NVSHMEM allocation after free")?;
    nv.free(again).map_err(e2s)?;
    nv.finalize().map_err(e2s)?;
    let e = nv.allocate(8).err();
    ensure!(e.is_some(), "allocate after finalize must fail");
    ctx.barrier_all().map_err(e2s)
}
