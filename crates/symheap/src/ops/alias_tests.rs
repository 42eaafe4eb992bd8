//! Tests of the aliasing rules: against a byte-by-byte model on small addresses, the exact
//! in-place forms, zero counts, and arguments at the ends of the address space.

use super::*;
use proptest::prelude::*;

const KINDS: [CollKind; 5] = [
    CollKind::Broadcast,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::AllReduce,
    CollKind::AllToAll,
];

fn kind() -> impl Strategy<Value = CollKind> {
    (0..KINDS.len()).prop_map(|i| KINDS[i])
}

/// The rules written out independently of `check`: byte sets for the overlap, the in-place
/// forms spelt from the definitions (small numbers only: no overflow here).
fn model(b: &CollBuffers) -> Result<Placement, ()> {
    let block = b.count * b.elem;
    let (d_blocks, s_blocks) = match b.kind {
        CollKind::Broadcast | CollKind::AllReduce => (1, 1),
        CollKind::AllGather => (b.n, 1),
        CollKind::ReduceScatter => (1, b.n),
        CollKind::AllToAll => (b.n, b.n),
    };
    let dest: Vec<u64> = (b.dest.start..b.dest.start + block * d_blocks).collect();
    let src: Vec<u64> = (b.src.start..b.src.start + block * s_blocks).collect();
    let in_place = match b.kind {
        CollKind::Broadcast | CollKind::AllReduce => b.dest.start == b.src.start,
        CollKind::AllGather => b.src.start == b.dest.start + b.me * block,
        CollKind::ReduceScatter => b.dest.start == b.src.start + b.me * block,
        CollKind::AllToAll => false,
    };
    if in_place {
        Ok(Placement::InPlace)
    } else if dest.iter().any(|x| src.contains(x)) {
        Err(())
    } else {
        Ok(Placement::Apart)
    }
}

fn small() -> impl Strategy<Value = CollBuffers> {
    (
        kind(),
        0u64..96,
        0u64..96,
        0u64..6,
        prop::sample::select(vec![1u64, 2, 4, 8]),
        1u64..6,
    )
        .prop_flat_map(|(kind, d, s, count, elem, n)| {
            (0..n).prop_map(move |me| CollBuffers::contiguous(kind, d, s, count, elem, n, me))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Every placement of small buffers (partial overlaps, exact blocks, neighbours, zero
    /// counts) is judged as the byte-by-byte model judges it.
    #[test]
    fn agrees_with_the_byte_model(b in small()) {
        prop_assert_eq!(check(&b).map_err(|_| ()), model(&b), "{:?}", b);
    }

    /// Any arguments at all, at the ends of the address space: no panic, and the answer is
    /// consistent (in place is the exact form; a refusal is a real overlap, whose message
    /// names both ranges; apart shares no byte).
    #[test]
    fn any_arguments_are_safe(
        kind in kind(),
        dest in any::<u64>(),
        src in any::<u64>(),
        count in any::<u64>(),
        elem in prop::sample::select(vec![1u64, 2, 4, 8, 16]),
        n in 1u64..=u64::MAX,
        me_frac in any::<u64>(),
    ) {
        let me = me_frac % n;
        let b = CollBuffers::contiguous(kind, dest, src, count, elem, n, me);
        match check(&b) {
            Ok(Placement::InPlace) => prop_assert_eq!(b.in_place_range(), Some((b.dest, b.src))),
            Ok(Placement::Apart) => prop_assert!(!b.dest.overlaps(&b.src)),
            Err(e) => {
                prop_assert!(b.dest.overlaps(&b.src));
                let text = e.to_string();
                prop_assert!(text.contains(&b.dest.to_string()), "{}", text);
                prop_assert!(text.contains(&b.src.to_string()), "{}", text);
            }
        }
    }

    /// The in-place forms users rely on are accepted on every member of any team.
    #[test]
    fn in_place_forms_are_accepted(
        base in 0u64..(1 << 40),
        count in 0u64..(1 << 20),
        elem in prop::sample::select(vec![1u64, 2, 4, 8]),
        n in 1u64..64,
        me_frac in any::<u64>(),
    ) {
        let me = me_frac % n;
        let own = base + me * count * elem;
        let forms = [
            (CollKind::AllGather, base, own),
            (CollKind::ReduceScatter, own, base),
            (CollKind::AllReduce, base, base),
            (CollKind::Broadcast, base, base),
        ];
        for (kind, d, s) in forms {
            let b = CollBuffers::contiguous(kind, d, s, count, elem, n, me);
            prop_assert_eq!(check(&b), Ok(Placement::InPlace), "{:?}", b);
        }
    }

    /// A source at another member's block of an all_gather's destination (and the same for
    /// reduce_scatter) is an overlap, not in place: the issue's `all_gather(d, d[:count])` on
    /// every member but 0.
    #[test]
    fn another_members_block_is_refused(
        base in 0u64..(1 << 40),
        count in 1u64..(1 << 20),
        elem in prop::sample::select(vec![1u64, 2, 4, 8]),
        n in 2u64..64,
        me_frac in any::<u64>(),
        other_frac in any::<u64>(),
    ) {
        let me = me_frac % n;
        let other = (me + 1 + other_frac % (n - 1)) % n;
        let theirs = base + other * count * elem;
        for (kind, d, s) in [
            (CollKind::AllGather, base, theirs),
            (CollKind::ReduceScatter, theirs, base),
        ] {
            let b = CollBuffers::contiguous(kind, d, s, count, elem, n, me);
            prop_assert!(check(&b).is_err(), "{:?}", b);
        }
    }
}

#[test]
fn alltoall_is_never_in_place() {
    let b = CollBuffers::contiguous(CollKind::AllToAll, 4096, 4096, 16, 4, 4, 1);
    let e = check(&b).unwrap_err();
    assert_eq!(e.dest, ByteRange::new(4096, 256));
    assert!(e.to_string().contains("cannot run in place"), "{e}");
    // A team of one too: the rule does not depend on the team's size.
    let one = CollBuffers::contiguous(CollKind::AllToAll, 4096, 4096, 16, 4, 1, 0);
    assert!(check(&one).is_err());
    // Nothing to move, nothing refused.
    let empty = CollBuffers::contiguous(CollKind::AllToAll, 4096, 4096, 0, 4, 4, 1);
    assert_eq!(check(&empty), Ok(Placement::Apart));
}

#[test]
fn messages_name_both_ranges_and_the_in_place_form() {
    // all_gather(d, d[16..]) on member 2 of 4, 16 f32 per block: block 1, not its own.
    let b = CollBuffers::contiguous(CollKind::AllGather, 0x1000, 0x1040, 16, 4, 4, 2);
    let e = check(&b).unwrap_err().to_string();
    assert!(e.contains("[0x1000, 0x1100)"), "{e}");
    assert!(e.contains("[0x1040, 0x1080)"), "{e}");
    assert!(
        e.contains("this PE's block of the destination, [0x1080, 0x10c0)"),
        "{e}"
    );
    let b = CollBuffers::contiguous(CollKind::ReduceScatter, 0x1000, 0x1000, 16, 4, 4, 2);
    let e = check(&b).unwrap_err().to_string();
    assert!(
        e.contains("this PE's block of the source, [0x1080, 0x10c0)"),
        "{e}"
    );
    let b = CollBuffers::contiguous(CollKind::AllReduce, 0x1000, 0x1004, 16, 4, 4, 2);
    let e = check(&b).unwrap_err().to_string();
    assert!(e.contains("pass the same range as both"), "{e}");
}

#[test]
fn ranges_at_the_end_of_the_address_space_do_not_wrap() {
    // The destination runs past u64::MAX; a wrapping end would make it miss the source.
    let b = CollBuffers::contiguous(CollKind::AllGather, u64::MAX - 8, 0, 8, 8, 4, 3);
    assert_eq!(b.dest.end(), u64::MAX as u128 - 8 + 256);
    assert_eq!(check(&b), Ok(Placement::Apart));
    let near = CollBuffers::contiguous(CollKind::AllGather, u64::MAX - 8, u64::MAX - 6, 1, 1, 4, 3);
    assert!(check(&near).is_err());
    // This PE's block lies past the address space: nothing is its in-place form.
    let past = CollBuffers::contiguous(CollKind::ReduceScatter, u64::MAX, u64::MAX - 4, 8, 8, 4, 3);
    assert!(check(&past).is_err());
    // Saturated lengths (n x count x elem past u128) still compare.
    let huge = CollBuffers::contiguous(CollKind::AllToAll, 0, u64::MAX, u64::MAX, 16, u64::MAX, 0);
    assert_eq!(huge.dest.len, u128::MAX);
    assert!(check(&huge).is_err());
}

#[test]
fn kinds_round_trip_by_name() {
    for k in KINDS {
        assert_eq!(CollKind::from_name(k.name()), Some(k));
    }
    assert_eq!(CollKind::from_name("gather"), None);
}
