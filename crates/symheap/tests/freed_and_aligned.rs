//! Issue 40 on one host PE: a revoked (freed) allocation is refused by every call through any
//! address inside it, and its memory is not reused until the buffer is dropped; every data
//! operation refuses an address not aligned to its element size, naming the alignment; an
//! atomic's operand bits must fit its word.

use symheap::{AllReduceAlgo, AtomicOp, Cmp, DType, ReduceOp, SignalOp, Stream};

mod common;
use common::host_pe;

fn err(r: symheap::Result<()>) -> String {
    r.expect_err("the call was accepted").to_string()
}

#[test]
fn a_revoked_allocation_is_refused_at_every_address_and_kept_until_dropped() {
    let ctx = host_pe();
    let (w, s) = (ctx.world_team(), Stream::legacy_default());
    let a = ctx.malloc(256).unwrap();
    let other = ctx.malloc(256).unwrap();
    let words: Vec<u64> = (0..32u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    a.write(0, &words).unwrap();
    let addr = a.addr();
    a.revoke();
    assert!(a.is_revoked());
    let mut out = [0u8; 8];
    let mid = addr + 64; // any address inside it, not only its start
    let sum = (ReduceOp::Sum, AllReduceAlgo::Auto);
    let calls: Vec<(&str, String)> = vec![
        ("put_bytes", err(ctx.put_bytes(mid, &[1; 8], 0))),
        ("get_bytes", err(ctx.get_bytes(&mut out, mid, 0))),
        ("write_at", err(ctx.write_at(mid, &[1u64]))),
        ("read_at", err(ctx.read_at(mid, &mut [0u64]))),
        ("check_symmetric", err(ctx.check_symmetric(mid, 8))),
        (
            "check_host_range",
            err(ctx.check_host_range("put", mid, 8, false)),
        ),
        (
            "atomic",
            err(ctx
                .atomic_op(mid, 0, AtomicOp::Add, DType::U64, 1, 0)
                .map(drop)),
        ),
        (
            "signal_wait_until",
            err(ctx.signal_wait_until_addr(mid, Cmp::Eq, 0).map(drop)),
        ),
        (
            "put_on_stream",
            err(ctx.put_on_stream(other.addr(), mid, 8, 0, &s)),
        ),
        (
            "all_reduce",
            err(ctx.all_reduce_raw(&w, mid, mid, 4, DType::U64, sum.0, sum.1)),
        ),
        (
            "broadcast",
            err(ctx.broadcast_raw(&w, mid, mid, 4, DType::U64, 0)),
        ),
        ("signal_fetch", err(ctx.signal_fetch(&a, 8).map(drop))),
        ("write", err(a.write(0, &[1u64]))),
        ("read", err(a.read(0, &mut [0u64]))),
    ];
    for (name, e) in calls {
        assert!(e.contains("freed"), "{name}: {e}");
    }
    // A host pointer outside every heap is the caller's own memory.
    let mine = [0u8; 64];
    ctx.check_host_range("put", mine.as_ptr() as u64, 64, false)
        .unwrap();
    // Every PE released it, but it is only revoked: the reclaim point leaves it alone.
    ctx.barrier_all().unwrap();
    let b = ctx.malloc(256).unwrap();
    assert_ne!(b.addr(), addr, "a revoked allocation was reused");
    drop(a);
    ctx.barrier_all().unwrap();
    let c = ctx.malloc(256).unwrap();
    assert_eq!(c.addr(), addr, "the dropped allocation was not reclaimed");
    // The address is live again, as the new allocation's: it works, and holds only its data.
    ctx.put_bytes(c.addr(), &7u64.to_le_bytes(), 0).unwrap();
    assert_eq!(c.to_vec::<u64>().unwrap()[0], 7);
    ctx.check_host_range("put", c.addr(), 256, false).unwrap();
    ctx.finalize().unwrap();
}

#[test]
fn every_operation_refuses_a_misaligned_address() {
    let ctx = host_pe();
    let (w, s) = (ctx.world_team(), Stream::legacy_default());
    let buf = ctx.malloc(512).unwrap();
    let pattern: Vec<u64> = (0..64u64).map(|i| i ^ 0x5a5a_a5a5_0f0f_f0f0).collect();
    buf.write(0, &pattern).unwrap();
    let a = buf.addr();
    let (m2, m4) = (a + 2, a + 4); // 2: aligned for no 4-byte type; 4: for no 8-byte type
    let (sum, auto) = (ReduceOp::Sum, AllReduceAlgo::Auto);
    let calls: Vec<(&str, usize, String)> = vec![
        (
            "all_reduce dest",
            4,
            err(ctx.all_reduce_raw(&w, m2, a, 4, DType::F32, sum, auto)),
        ),
        (
            "all_reduce src",
            8,
            err(ctx.all_reduce_raw(&w, a, m4, 4, DType::F64, sum, auto)),
        ),
        (
            "broadcast",
            4,
            err(ctx.broadcast_raw(&w, m2, m2, 4, DType::I32, 0)),
        ),
        (
            "broadcast big",
            2,
            err(ctx.broadcast_raw(&w, a + 1, a + 1, 100, DType::F16, 0)),
        ),
        (
            "all_gather",
            4,
            err(ctx.all_gather_raw(&w, m2, a, 4, DType::U32)),
        ),
        (
            "reduce_scatter",
            8,
            err(ctx.reduce_scatter_raw(&w, a, m4, 4, DType::I64, sum)),
        ),
        (
            "alltoall",
            4,
            err(ctx.alltoall_raw(&w, a + 256, m2, 4, DType::F32)),
        ),
        (
            "all_reduce_on_stream",
            4,
            err(ctx.all_reduce_on_stream(&w, m2, a, 4, DType::F32, sum, auto, &s)),
        ),
        (
            "broadcast_on_stream",
            8,
            err(ctx.broadcast_on_stream(&w, m4, a, 4, DType::U64, 0, &s)),
        ),
        (
            "all_gather_on_stream",
            4,
            err(ctx.all_gather_on_stream(&w, a, m2, 4, DType::I32, &s)),
        ),
        (
            "reduce_scatter_on_stream",
            4,
            err(ctx.reduce_scatter_on_stream(&w, m2, a, 4, DType::F32, sum, &s)),
        ),
        (
            "alltoall_on_stream",
            8,
            err(ctx.alltoall_on_stream(&w, m4, a + 256, 4, DType::F64, &s)),
        ),
        (
            "atomic",
            4,
            err(ctx
                .atomic_op(m2, 0, AtomicOp::Store, DType::I32, 1, 0)
                .map(drop)),
        ),
        (
            "atomic 8",
            8,
            err(ctx
                .atomic_op(m4, 0, AtomicOp::Add, DType::U64, 1, 0)
                .map(drop)),
        ),
        (
            "signal_wait_until",
            8,
            err(ctx.signal_wait_until_addr(m4, Cmp::Eq, 0).map(drop)),
        ),
        (
            "signal_wait_until_on_stream",
            8,
            err(ctx.signal_wait_until_on_stream(m4, Cmp::Eq, 0, &s)),
        ),
        (
            "put_signal_on_stream",
            8,
            err(ctx.put_signal_on_stream(a, a + 128, 8, m4, 1, SignalOp::Set, 0, &s)),
        ),
        (
            "check_aligned",
            8,
            err(ctx.check_aligned("put", "destination", m4, DType::F64)),
        ),
    ];
    for (name, align, e) in calls {
        let want = format!("aligned to {align} bytes");
        assert!(
            e.contains(&want) && e.contains("invalid argument"),
            "{name}: {e}"
        );
    }
    assert_eq!(
        buf.to_vec::<u64>().unwrap(),
        pattern,
        "a refused call wrote"
    );
    // The same calls on aligned addresses run.
    ctx.check_aligned("put", "destination", m4, DType::F32)
        .unwrap();
    ctx.all_reduce_raw(&w, a + 256, a, 4, DType::F32, sum, auto)
        .unwrap();
    ctx.atomic_op(m4, 0, AtomicOp::Store, DType::U32, 9, 0)
        .unwrap();
    ctx.finalize().unwrap();
}

#[test]
fn an_atomic_operand_must_fit_its_word() {
    let ctx = host_pe();
    let buf = ctx.malloc(64).unwrap();
    let a = buf.addr();
    buf.write(0, &[0x1234_5678u32, 0xdead_beef]).unwrap();
    for (dt, op, operand, compare) in [
        (DType::I32, AtomicOp::Store, 1u64 << 32, 0u64),
        (DType::U32, AtomicOp::Add, u64::MAX, 0),
        (DType::U32, AtomicOp::CompareSwap, 1, 1 << 40),
        (DType::F32, AtomicOp::Swap, f64::MAX.to_bits(), 0),
    ] {
        let e = err(ctx.atomic_op(a, 0, op, dt, operand, compare).map(drop));
        assert!(e.contains("do not fit a 4-byte"), "{dt} {op:?}: {e}");
    }
    assert_eq!(
        buf.to_vec::<u32>().unwrap()[..2],
        [0x1234_5678, 0xdead_beef]
    );
    let top = u64::from(u32::MAX);
    ctx.atomic_op(a, 0, AtomicOp::Store, DType::U32, top, 0)
        .unwrap();
    let got = ctx
        .atomic_op(a, 0, AtomicOp::Load, DType::U32, 0, 0)
        .unwrap();
    assert_eq!(got, top);
    ctx.finalize().unwrap();
}

/// An empty range one past an allocation's last byte (the empty slice `buf[n:]`, a PE that
/// sends nothing from the end of its buffer) is part of that allocation; one byte there is
/// not, nor is an empty range past a freed allocation's end.
#[test]
fn an_empty_range_at_the_end_of_an_allocation_is_accepted() {
    let ctx = host_pe();
    let (w, s) = (ctx.world_team(), Stream::legacy_default());
    let a = ctx.malloc(256).unwrap();
    let end = a.addr() + 256;
    ctx.check_symmetric(end, 0).unwrap();
    ctx.check_symmetric(a.addr(), 256).unwrap();
    ctx.put_on_stream(end, end, 0, 0, &s).unwrap();
    ctx.all_reduce_raw(
        &w,
        end,
        end,
        0,
        DType::U64,
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
    )
    .unwrap();
    assert!(err(ctx.check_symmetric(end, 1)).contains("not in a live allocation"));
    assert!(err(ctx.check_symmetric(a.addr(), 257)).contains("run past the end"));
    a.revoke();
    assert!(ctx.check_symmetric(end, 0).is_err());
}
