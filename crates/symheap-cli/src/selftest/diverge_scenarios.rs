//! The divergence property test: a random program of collective and synchronising calls
//! (barriers, all_reduce and broadcast on random buffers, counts and roots, on the world or on
//! a team of the same PEs, team splits and destroys, allocations), the same on every PE from the
//! shared seed, where one PE may diverge at a random step in a random way. An identical program
//! must finish with exact results; a diverging one must fail on every PE with a named mismatch
//! within a second of reaching the step, never a timeout and never a wrong result.

use std::time::{Duration, Instant};

use symheap::{AllReduceAlgo, Context, DType, ErrorKind, ReduceOp, SymmetricBuffer, Team};

use super::scenarios::{e2s, Outcome, PeArgs};

/// Buffers the program works on, elements per buffer.
const BUFS: usize = 4;
const ELEMS: usize = 64;
const STEPS: usize = 14;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Barrier,
    AllReduce { buf: usize, count: usize, sub: bool },
    Broadcast { buf: usize, root: usize, sub: bool },
    SplitUseDestroy,
    Allocate { bytes: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Twist {
    Skip,
    Barrier,
    Count,
    Root,
    Buffer,
    Team,
}

fn random_op(r: &mut fastrand::Rng, n: usize) -> Op {
    match r.usize(..10) {
        0 | 1 => Op::Barrier,
        2..=4 => Op::AllReduce {
            buf: r.usize(..BUFS),
            count: r.usize(1..=ELEMS),
            sub: r.usize(..4) == 0,
        },
        5 | 6 => Op::Broadcast {
            buf: r.usize(..BUFS),
            root: r.usize(..n),
            sub: r.usize(..4) == 0,
        },
        7 => Op::SplitUseDestroy,
        _ => Op::Allocate {
            bytes: [64u64, 4096, 3 << 20][r.usize(..3)],
        },
    }
}

/// The op PE `victim` runs instead of `op` under `twist` (None: it skips the call).
fn twisted(op: Op, twist: Twist, n: usize) -> Option<Op> {
    Some(match (twist, op) {
        (Twist::Skip, _) => return None,
        (Twist::Barrier, Op::Barrier) => Op::AllReduce {
            buf: 0,
            count: ELEMS,
            sub: false,
        },
        (Twist::Barrier, _) => Op::Barrier,
        (Twist::Count, Op::AllReduce { buf, count, sub }) => Op::AllReduce {
            buf,
            count: if count > 1 { count - 1 } else { 2 },
            sub,
        },
        (Twist::Root, Op::Broadcast { buf, root, sub }) => Op::Broadcast {
            buf,
            root: (root + 1) % n,
            sub,
        },
        (Twist::Buffer, Op::AllReduce { buf, count, sub }) => Op::AllReduce {
            buf: (buf + 1) % BUFS,
            count,
            sub,
        },
        (Twist::Buffer, Op::Broadcast { buf, root, sub }) => Op::Broadcast {
            buf: (buf + 1) % BUFS,
            root,
            sub,
        },
        (Twist::Team, Op::AllReduce { buf, count, sub }) => Op::AllReduce {
            buf,
            count,
            sub: !sub,
        },
        (Twist::Team, Op::Broadcast { buf, root, sub }) => Op::Broadcast {
            buf,
            root,
            sub: !sub,
        },
        (Twist::Count | Twist::Root | Twist::Buffer | Twist::Team, Op::Allocate { bytes }) => {
            Op::Allocate { bytes: bytes + 256 }
        }
        // Nothing to change in this op's arguments: call something else instead.
        (_, Op::Barrier | Op::SplitUseDestroy) => Op::Allocate { bytes: 64 },
        (_, _) => Op::Barrier,
    })
}

/// Every PE's contents of the program's buffers, simulated on the host from the shared seed.
struct Model {
    vals: Vec<Vec<Vec<i32>>>,
}

impl Model {
    fn new(n: usize, seed: u64) -> Model {
        let vals = (0..n)
            .map(|p| {
                (0..BUFS)
                    .map(|k| init(seed, p, k))
                    .collect::<Vec<Vec<i32>>>()
            })
            .collect();
        Model { vals }
    }

    fn apply(&mut self, op: Op) {
        let n = self.vals.len();
        match op {
            Op::AllReduce { buf, count, .. } => {
                for i in 0..count {
                    let s = (0..n).fold(0i32, |acc, p| acc.wrapping_add(self.vals[p][buf][i]));
                    for p in 0..n {
                        self.vals[p][buf][i] = s;
                    }
                }
            }
            Op::Broadcast { buf, root, .. } => {
                let r = self.vals[root][buf].clone();
                for p in 0..n {
                    self.vals[p][buf].clone_from(&r);
                }
            }
            Op::Barrier | Op::SplitUseDestroy | Op::Allocate { .. } => {}
        }
    }
}

fn init(seed: u64, pe: usize, k: usize) -> Vec<i32> {
    let mut r = fastrand::Rng::with_seed(seed ^ ((pe as u64) << 32) ^ (k as u64) << 48);
    (0..ELEMS).map(|_| r.i32(-1000..1000)).collect()
}

struct Program<'a> {
    ctx: &'a Context,
    bufs: Vec<SymmetricBuffer>,
    same: Team,
}

impl Program<'_> {
    fn run(&self, op: Op) -> symheap::Result<()> {
        let ctx = self.ctx;
        let team = |sub: bool| {
            if sub {
                self.same.clone()
            } else {
                ctx.world_team()
            }
        };
        match op {
            Op::Barrier => ctx.barrier_all(),
            Op::AllReduce { buf, count, sub } => {
                let a = self.bufs[buf].addr();
                ctx.all_reduce_raw(
                    &team(sub),
                    a,
                    a,
                    count,
                    DType::I32,
                    ReduceOp::Sum,
                    AllReduceAlgo::Auto,
                )
            }
            Op::Broadcast { buf, root, sub } => {
                let a = self.bufs[buf].addr();
                ctx.broadcast_raw(&team(sub), a, a, ELEMS, DType::I32, root)
            }
            Op::SplitUseDestroy => {
                let t = ctx.team_split_strided(&ctx.world_team(), 0, 1, ctx.n_pes())?;
                ctx.barrier(&t)?;
                ctx.team_destroy(t)
            }
            Op::Allocate { bytes } => ctx.malloc(bytes).map(drop),
        }
    }
}

/// One random program; `a.victim` diverges when the seed says so.
pub fn diverge_random(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let mut r = fastrand::Rng::with_seed(a.seed);
    let ops: Vec<Op> = (0..STEPS).map(|_| random_op(&mut r, n)).collect();
    let twist = [
        Twist::Skip,
        Twist::Barrier,
        Twist::Count,
        Twist::Root,
        Twist::Buffer,
        Twist::Team,
    ][r.usize(..6)];
    // One program in five runs identically everywhere; one PE of the others diverges.
    let diverge = (n > 1 && r.usize(..5) != 0).then(|| (r.usize(..STEPS), r.usize(..n)));
    let mut bufs = Vec::new();
    for k in 0..BUFS {
        let b = ctx.malloc((ELEMS * 4) as u64).map_err(e2s)?;
        b.write(0, &init(a.seed, me, k)).map_err(e2s)?;
        bufs.push(b);
    }
    let same = ctx
        .team_split_strided(&ctx.world_team(), 0, 1, n)
        .map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    let prog = Program { ctx, bufs, same };
    let mut model = Model::new(n, a.seed);
    for (step, &op) in ops.iter().enumerate() {
        let mine = match diverge {
            Some((d, v)) if d == step && v == me => twisted(op, twist, n),
            _ => Some(op),
        };
        let t0 = Instant::now();
        let done = match mine {
            Some(o) => prog.run(o),
            None => Ok(()),
        };
        if let Err(e) = done {
            return judge(ctx, e, diverge, step, t0, &ops, twist);
        }
        model.apply(op);
    }
    // The program ends with a barrier and finalize: a PE that skipped the last call of its
    // program meets the others' last call with its own next one and learns only there.
    let t0 = Instant::now();
    if let Err(e) = ctx.barrier_all() {
        return judge(ctx, e, diverge, STEPS, t0, &ops, twist);
    }
    if diverge.is_none() {
        for (k, b) in prog.bufs.iter().enumerate() {
            let got = b.to_vec::<i32>().map_err(e2s)?;
            ensure!(
                got == model.vals[me][k],
                "buffer {k} differs from the model after {ops:?}"
            );
        }
    }
    drop(prog);
    let t0 = Instant::now();
    if let Err(e) = ctx.finalize() {
        return judge(ctx, e, diverge, STEPS, t0, &ops, twist);
    }
    if let Some((d, v)) = diverge {
        return Err(format!(
            "PE {v} diverged at step {d} ({:?} of {:?}) and nothing was reported",
            twist, ops[d]
        ));
    }
    Ok(())
}

/// A failure of the program: right only when a PE diverged at or before this step, it is a
/// named mismatch, and it came within a second of this PE reaching its failing call.
fn judge(
    ctx: &Context,
    e: symheap::Error,
    diverge: Option<(usize, usize)>,
    step: usize,
    t0: Instant,
    ops: &[Op],
    twist: Twist,
) -> Outcome {
    let dt = t0.elapsed();
    let Some((d, v)) = diverge else {
        return Err(format!("an identical program failed at step {step}: {e}"));
    };
    ensure!(
        step >= d,
        "failed at step {step}, before PE {v} diverged at step {d}: {e}"
    );
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_)),
        "PE {} got {e} for PE {v}'s {twist:?} of {:?} at step {d}",
        ctx.my_pe(),
        ops[d]
    );
    ensure!(
        dt < Duration::from_secs(1),
        "named {:.2} s after reaching step {step}: {e}",
        dt.as_secs_f64()
    );
    println!(
        "named in {:.3} s: PE {v} {twist:?} at step {d}: {e}",
        dt.as_secs_f64()
    );
    Ok(())
}
