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

/// The collectives by name (the bindings' one entry) run the same request as the kind's own
/// entry, read each kind's parameters by name, and refuse an unknown kind, an unknown or
/// mistyped parameter and an unknown reduction or algorithm, naming the call.
#[test]
fn collectives_by_name_take_their_parameters_and_refuse_others() {
    use symheap::{CollParam, CollParams, COLLECTIVES};
    let ctx = host_pe();
    let w = ctx.world_team();
    let (src, dst) = (ctx.malloc(64).unwrap(), ctx.malloc(64).unwrap());
    let data: Vec<i32> = (0..16).map(|i| i * 7 - 20).collect();
    src.write(0, &data).unwrap();
    let (s, d, t) = (src.addr(), dst.addr(), DType::I32);
    let p = |kv: &[(&str, CollParam)]| {
        let mut p = CollParams::new();
        for (k, v) in kv {
            p.set(k, v.clone());
        }
        p
    };
    let none = CollParams::new();
    let stream = Stream::legacy_default();
    for kind in COLLECTIVES {
        for on in [None, Some(&stream)] {
            dst.write(0, &[0i32; 16]).unwrap();
            ctx.collective(kind, &w, d, s, 16, t, on, &none).unwrap();
            let mut got = [0i32; 16];
            dst.read(0, &mut got).unwrap();
            // One PE: every kind copies its one block (every reduction of one value is it).
            assert_eq!(got.as_slice(), data.as_slice(), "{kind} {on:?}");
        }
    }
    let max = p(&[
        ("op", CollParam::Str("max".into())),
        ("algo", CollParam::Str("two_shot".into())),
    ]);
    ctx.collective("all_reduce", &w, d, s, 16, t, None, &max)
        .unwrap();
    let root = p(&[("root", CollParam::Int(0))]);
    ctx.collective("broadcast", &w, d, s, 16, t, None, &root)
        .unwrap();
    let bad: [(&str, CollParams, &str); 7] = [
        ("gather", none.clone(), "unknown collective \"gather\""),
        (
            "all_reduce",
            p(&[("op", CollParam::Str("median".into()))]),
            "unknown reduction \"median\"",
        ),
        (
            "all_reduce",
            p(&[("algo", CollParam::Str("ring".into()))]),
            "unknown all_reduce algorithm \"ring\"",
        ),
        (
            "all_gather",
            p(&[("op", CollParam::Str("sum".into()))]),
            "all_gather takes no parameter \"op\"",
        ),
        (
            "broadcast",
            p(&[("root", CollParam::Str("0".into()))]),
            "root must be an integer",
        ),
        (
            "broadcast",
            p(&[("root", CollParam::Int(-1))]),
            "root -1 is not a team member",
        ),
        (
            "broadcast",
            p(&[("root", CollParam::Int(1))]),
            "root 1 is not a member of a team of 1",
        ),
    ];
    for (kind, params, want) in bad {
        let e = ctx
            .collective(kind, &w, d, s, 16, t, None, &params)
            .unwrap_err();
        assert!(e.to_string().contains(want), "{kind}: {e}");
        assert!(
            matches!(e.kind(), symheap::ErrorKind::InvalidArgument(_)),
            "{kind}: {e}"
        );
    }
    ctx.finalize().unwrap();
}

/// alltoall by name: split sizes (`send_counts`, `recv_counts`) and counts in symmetric memory
/// (`in_splits`, `out_splits_offsets`, `src_rows`, `dst_rows`) run; a list of the wrong type,
/// a negative size, a count for every member but the team's, and any other combination of
/// them are invalid arguments naming what is wrong.
#[test]
fn alltoall_by_name_takes_split_sizes_or_device_counts_and_refuses_the_rest() {
    use symheap::{CollParam, CollParams};
    let ctx = host_pe();
    let w = ctx.world_team();
    let (src, dst) = (ctx.malloc(64).unwrap(), ctx.malloc(64).unwrap());
    let (ins, out) = (ctx.malloc(8).unwrap(), ctx.malloc(16).unwrap());
    let data: Vec<i32> = (0..16).map(|i| 3 - i * 5).collect();
    src.write(0, &data).unwrap();
    let (s, d, t) = (src.addr(), dst.addr(), DType::I32);
    let p = |kv: &[(&str, CollParam)]| {
        let mut p = CollParams::new();
        for (k, v) in kv {
            p.set(k, v.clone());
        }
        p
    };
    let sizes = p(&[
        ("send_counts", CollParam::Ints(vec![16])),
        ("recv_counts", CollParam::Ints(vec![16])),
    ]);
    ctx.collective("alltoall", &w, d, s, 1, t, None, &sizes)
        .unwrap();
    let mut got = [0i32; 16];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got.as_slice(), data.as_slice());
    dst.write(0, &[0i32; 16]).unwrap();
    ins.write(0, &[4i64]).unwrap();
    out.write(0, &[-1i64, -1]).unwrap();
    let counts = p(&[
        ("in_splits", CollParam::Int(ins.addr() as i64)),
        ("out_splits_offsets", CollParam::Int(out.addr() as i64)),
        ("src_rows", CollParam::Int(4)),
        ("dst_rows", CollParam::Int(4)),
    ]);
    // Rows of 4 elements: the 4 rows this PE sends itself land at row 0.
    ctx.collective("alltoall", &w, d, s, 4, t, None, &counts)
        .unwrap();
    dst.read(0, &mut got).unwrap();
    assert_eq!(got.as_slice(), data.as_slice());
    let mut rows = [0i64; 2];
    out.read(0, &mut rows).unwrap();
    assert_eq!(rows, [4, 0]);
    let both = "alltoall takes send_counts with recv_counts, or in_splits with";
    let bad: [(CollParams, &str); 7] = [
        (p(&[("send_counts", CollParam::Ints(vec![16]))]), both),
        (
            p(&[
                ("send_counts", CollParam::Ints(vec![16])),
                ("recv_counts", CollParam::Ints(vec![16])),
                ("in_splits", CollParam::Int(ins.addr() as i64)),
            ]),
            both,
        ),
        (
            p(&[("in_splits", CollParam::Int(ins.addr() as i64))]),
            "in_splits needs out_splits_offsets",
        ),
        (
            p(&[
                ("send_counts", CollParam::Ints(vec![-1])),
                ("recv_counts", CollParam::Ints(vec![16])),
            ]),
            "send_counts has a negative size, -1",
        ),
        (
            p(&[
                ("send_counts", CollParam::Int(16)),
                ("recv_counts", CollParam::Ints(vec![16])),
            ]),
            "send_counts must be a list of integers",
        ),
        (
            p(&[("in_splits", CollParam::Int(-8))]),
            "in_splits must not be negative, it is -8",
        ),
        (
            p(&[
                ("send_counts", CollParam::Ints(vec![8, 8])),
                ("recv_counts", CollParam::Ints(vec![8, 8])),
            ]),
            "2 send sizes and 2 receive sizes for a team of 1",
        ),
    ];
    for (params, want) in bad {
        let e = ctx
            .collective("alltoall", &w, d, s, 1, t, None, &params)
            .unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert!(
            matches!(e.kind(), symheap::ErrorKind::InvalidArgument(_)),
            "{want}: {e}"
        );
    }
    ctx.finalize().unwrap();
}
