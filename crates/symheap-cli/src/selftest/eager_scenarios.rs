//! Self-test scenarios for the eager broadcasts (small host broadcasts whose root does not wait
//! for its receivers): exact data under flow control, and divergences over who is the root
//! named on every PE.

use std::time::{Duration, Instant};

use symheap::{BackendKind, Context, ErrorKind};

use super::ops_scenarios::{data, rng};
use super::scenarios::{e2s, Outcome, PeArgs};

/// Bursts of eager broadcasts from one root, longer than the slots a root may run ahead, while
/// the receivers start late (the root must wait for slots, never overwrite one unread); then
/// rotating roots on the world and on a sub-team, sizes up to the eager limit, in and out of
/// place: every receiver gets exactly each root's data.
pub fn eager(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let src = ctx.malloc(96).map_err(e2s)?;
    let dst = ctx.malloc(96).map_err(e2s)?;
    // More than the most slots a root has (32, `SyncArea::eager_slots`), twice over.
    let burst = 2 * 32 + 1;
    for root in 0..n {
        ctx.barrier_all().map_err(e2s)?;
        if me != root {
            // Late receivers: the root runs into the slot limit and must wait.
            std::thread::sleep(Duration::from_millis(20));
        }
        for k in 0..burst {
            let tag = (root * 1000 + k) as u64;
            let c = 1 + k % 12;
            src.write(0, &data::<f64>(a.seed, me, tag, c))
                .map_err(e2s)?;
            ctx.broadcast::<f64>(&world, &dst, &src, c, root)
                .map_err(e2s)?;
            let got = dst.to_vec::<f64>().map_err(e2s)?;
            ensure!(
                got[..c] == data::<f64>(a.seed, root, tag, c)[..],
                "eager broadcast {k} of {c} from {root}"
            );
        }
    }
    // Rotating roots at random sizes, on the world and on the team of every other PE, in place
    // half the time (the root's data stays; the others' is replaced).
    let odd = ctx
        .team_split_strided(&world, 0, 2, n.div_ceil(2))
        .map_err(e2s)?;
    let mut r = rng(a.seed, 77, 0);
    for step in 0..60u64 {
        let sub = step % 3 == 2;
        let team = if sub { &odd } else { &world };
        let c = r.usize(1..=12);
        let in_place = r.bool();
        let root = r.usize(..team.n_pes().max(1));
        if !team.is_valid() {
            continue;
        }
        let tag = 5000 + step;
        src.write(0, &data::<f64>(a.seed, me, tag, c))
            .map_err(e2s)?;
        let out = if in_place { &src } else { &dst };
        ctx.broadcast::<f64>(team, out, &src, c, root)
            .map_err(e2s)?;
        let root_pe = team.world_pe(root).expect("member");
        ensure!(
            out.to_vec::<f64>().map_err(e2s)?[..c] == data::<f64>(a.seed, root_pe, tag, c)[..],
            "step {step}: broadcast of {c} from team member {root} (in place {in_place})"
        );
    }
    ctx.team_destroy(odd).map_err(e2s)?;
    reused_slot(ctx, a, &src, &dst)
}

/// A team made in the slot of a destroyed one, with a member the old team lacked, counts its
/// eager broadcasts from zero on every member: PEs 0 and 1 run a burst on their pair, destroy
/// it, then PEs 0 and 2 (the same free slot) broadcast both ways. A member that kept the old
/// team's count would wait for a broadcast number its new peer never sends.
fn reused_slot(
    ctx: &Context,
    a: PeArgs,
    src: &symheap::SymmetricBuffer,
    dst: &symheap::SymmetricBuffer,
) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    if n < 3 {
        return Ok(());
    }
    let world = ctx.world_team();
    let round = |team: &symheap::Team, k: u64| -> Outcome {
        let Some(i) = team.my_pe() else {
            return Ok(());
        };
        for root in 0..team.n_pes() {
            let tag = 9000 + 10 * k + root as u64;
            let c = 1 + (k as usize + root) % 12;
            src.write(0, &data::<f64>(a.seed, me, tag, c))
                .map_err(e2s)?;
            ctx.broadcast::<f64>(team, dst, src, c, root).map_err(e2s)?;
            let root_pe = team.world_pe(root).expect("member");
            ensure!(
                dst.to_vec::<f64>().map_err(e2s)?[..c] == data::<f64>(a.seed, root_pe, tag, c)[..],
                "broadcast {k} of {c} from member {root} on {team} (I am member {i})"
            );
        }
        Ok(())
    };
    let pair = ctx.team_split_strided(&world, 0, 1, 2).map_err(e2s)?;
    for k in 0..40 {
        round(&pair, k)?;
    }
    ctx.team_destroy(pair).map_err(e2s)?;
    let apart = ctx.team_split_strided(&world, 0, 2, 2).map_err(e2s)?;
    for k in 0..40 {
        round(&apart, k)?;
    }
    ctx.team_destroy(apart).map_err(e2s)
}

/// PEs 0 and 1 each take themselves for the root of the same small broadcast, and the program
/// ends. On the host backend both roots return at once (an eager root does not wait), so
/// finalize must not end the job quietly: every PE fails there, within a second, with a named
/// mismatch naming both calls. Where the broadcast is not eager (the CUDA backend's staged
/// broadcast meets every member) the roots' own calls fail with that error instead.
pub fn eager_diverge(ctx: &Context, _a: PeArgs) -> Outcome {
    let me = ctx.my_pe();
    let world = ctx.world_team();
    let b = ctx.malloc(64).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let root = if me == 1 { 1 } else { 0 };
    // A receiver (PE 2 and up) takes PE 0's data; eager roots return without meeting anyone.
    if let Err(e) = ctx.broadcast::<u32>(&world, &b, &b, 4, root) {
        let eager = ctx.backend_kind() == BackendKind::Host;
        ensure!(me > 1 || !eager, "root {me}'s eager broadcast failed: {e}");
        return check_named(&e);
    }
    let t0 = Instant::now();
    let e = match ctx.finalize() {
        Ok(()) => return Err("two PEs took themselves for the root and finalize succeeded".into()),
        Err(e) => e,
    };
    ensure!(
        t0.elapsed() < Duration::from_secs(1),
        "the divergence took {:?} to be named",
        t0.elapsed()
    );
    check_named(&e)
}

fn check_named(e: &symheap::Error) -> Outcome {
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_)),
        "wrong kind: {e}"
    );
    let s = e.to_string();
    ensure!(
        s.contains("broadcast(root 0") && s.contains("broadcast(root 1"),
        "both roots' calls are not named: {s}"
    );
    println!("got the expected error: {s}");
    Ok(())
}
