//! Argument errors of the public API that one PE can reach (host backend): each is a typed
//! error naming the call, never a wrapped size or a panic.

use symheap::{AllReduceAlgo, DType, ReduceOp, Stream};

mod common;
use common::host_pe;

/// A small (eager) broadcast checks its root before anything else, as a large one does; and
/// every collective, host or stream form, refuses a count whose byte size overflows (it
/// wrapped, or panicked where overflow checks are on) instead of working with it.
#[test]
fn collectives_refuse_a_bad_root_and_an_overflowing_count() {
    let ctx = host_pe();
    let w = ctx.world_team();
    let buf = ctx.malloc(64).unwrap();
    let a = buf.addr();
    let e = ctx.broadcast_raw(&w, a, a, 8, DType::U8, 1).unwrap_err();
    assert!(e.to_string().contains("root 1 is not a member"), "{e}");
    let (huge, t) = (usize::MAX / 2, DType::U64);
    let s = Stream::legacy_default();
    let (sum, algo) = (ReduceOp::Sum, AllReduceAlgo::Auto);
    let calls: [(&str, symheap::Result<()>); 10] = [
        ("broadcast", ctx.broadcast_raw(&w, a, a, huge, t, 0)),
        (
            "all_reduce",
            ctx.all_reduce_raw(&w, a, a, huge, t, sum, algo),
        ),
        ("all_gather", ctx.all_gather_raw(&w, a, a, huge, t)),
        (
            "reduce_scatter",
            ctx.reduce_scatter_raw(&w, a, a, huge, t, sum),
        ),
        ("alltoall", ctx.alltoall_raw(&w, a, a, huge, t)),
        (
            "broadcast_on_stream",
            ctx.broadcast_on_stream(&w, a, a, huge, t, 0, &s),
        ),
        (
            "all_reduce_on_stream",
            ctx.all_reduce_on_stream(&w, a, a, huge, t, sum, algo, &s),
        ),
        (
            "all_gather_on_stream",
            ctx.all_gather_on_stream(&w, a, a, huge, t, &s),
        ),
        (
            "reduce_scatter_on_stream",
            ctx.reduce_scatter_on_stream(&w, a, a, huge, t, sum, &s),
        ),
        (
            "alltoall_on_stream",
            ctx.alltoall_on_stream(&w, a, a, huge, t, &s),
        ),
    ];
    for (name, r) in calls {
        let e = r.unwrap_err();
        assert!(e.to_string().contains("overflows"), "{name}: {e}");
    }
    ctx.broadcast_raw(&w, a, a, 8, DType::U8, 0).unwrap();
    ctx.finalize().unwrap();
}
