//! Self-test scenarios for a world that spans nodes (simulated on one machine: `symheap launch
//! --simulate-nodes`): every collective through the hierarchical path or NCCL over the world,
//! CUDA-graph replays, teams inside one node, splits of the world across nodes (NCCL over their
//! own communicators), and the clear errors for what does not cross nodes. On the host backend
//! the same layout runs the team checks only (its collectives across nodes need mpirun, see
//! `multi_pe.rs`).

use half::{bf16, f16};
use symheap::{AllReduceAlgo, Context, DType, ErrorKind, ReduceOp, Team};

use symheap::tools::Graph;

use super::coll_scenarios::{graph_replays, sum_case, team_cases, world_cases};
use super::ops_scenarios::with_roundings;
use super::scenarios::{e2s, Outcome, PeArgs};
use super::team_ranks_scenarios;

/// The path this job's layout and settings must take: NCCL over the world when asked for or
/// when the nodes hold different numbers of PEs, else hierarchical.
fn expected_path(ctx: &Context) -> &'static str {
    let nccl = std::env::var("SYMHEAP_NODES_ALGO").is_ok_and(|v| v.trim() == "nccl");
    if nccl || !even_nodes(ctx) {
        "NCCL over the world"
    } else {
        "hierarchical"
    }
}

/// Whether every node holds the same number of PEs.
fn even_nodes(ctx: &Context) -> bool {
    let node = ctx.node();
    let count = |k: usize| node.node_of.iter().filter(|&&n| n == k).count();
    (0..node.node_count).all(|k| count(k) == count(0))
}

/// Expects `r` to be the refusal of a split, naming `what`.
fn refused_split(r: symheap::Result<Team>, what: &str) -> Outcome {
    match r {
        Err(e) if matches!(e.kind(), ErrorKind::Unsupported(_)) => {
            ensure!(
                e.to_string().contains(what),
                "a refused split should say {what:?}: {e}"
            );
            Ok(())
        }
        Err(e) => Err(format!("a refused split failed otherwise: {e}")),
        Ok(_) => Err(format!("a split was accepted, expected a refusal ({what})")),
    }
}

/// Whether Open MPI's mpirun started this PE.
fn under_mpirun() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
}

/// Teams inside one node work as on one node. A team across nodes runs through NCCL on CUDA
/// and through Open MPI on the host backend (`spanning_teams`), refused on every PE there
/// without mpirun.
fn node_teams(ctx: &Context, a: PeArgs, s: &symheap::Stream) -> Outcome {
    let world = ctx.world_team();
    let node = ctx.node().clone();
    let n = ctx.n_pes();
    if ctx.cuda().is_none() && !under_mpirun() {
        // The host backend runs a team across nodes through Open MPI, which needs mpirun.
        refused_split(ctx.team_split_strided(&world, 0, 1, n), "mpirun")?;
    }
    // One split per node, every PE taking part in each (splits are collective over the world).
    let mut mine = Team::INVALID;
    for k in 0..node.node_count {
        let peers: Vec<usize> = (0..n).filter(|&r| node.node_of[r] == k).collect();
        let contiguous = peers.windows(2).all(|w| w[1] == w[0] + 1);
        ensure!(
            contiguous,
            "node {k}'s PEs {peers:?} are not consecutive ranks"
        );
        let t = ctx
            .team_split_strided(&world, peers[0], 1, peers.len())
            .map_err(e2s)?;
        if t.is_valid() {
            mine = t;
        }
    }
    ensure!(
        mine.n_pes() == node.local_peers.len(),
        "my node team has {} PEs, my node {}",
        mine.n_pes(),
        node.local_peers.len()
    );
    // Allocation is collective over the world: teams of different sizes would allocate
    // different sizes in team_cases, so uneven nodes only meet.
    if even_nodes(ctx) {
        team_cases(ctx, &mine, s, a)?;
    }
    ctx.barrier(&mine).map_err(e2s)?;
    ctx.team_destroy(mine).map_err(e2s)?;
    members_alone(ctx, a)?;
    ctx.barrier_all().map_err(e2s)
}

/// Teams made by their members alone: this node's PEs in reverse order (every collective
/// exact); on the host backend, the whole world (across nodes) refused on every PE before
/// any exchange, since Open MPI's split needs every PE of the job.
fn members_alone(ctx: &Context, a: PeArgs) -> Outcome {
    let me = ctx.my_pe();
    if ctx.cuda().is_none() {
        let all: Vec<usize> = (0..ctx.n_pes()).collect();
        let mut never = |_: &[u8]| -> symheap::Result<Vec<Vec<u8>>> {
            panic!("exchange called for a refused team")
        };
        refused_split(ctx.team_from_world_ranks(&all, &mut never), "Open MPI")?;
    }
    let b = team_ranks_scenarios::bufs(ctx)?;
    let dir = team_ranks_scenarios::exchange_dir(ctx, "nodes-members")?;
    let node = ctx.node().clone();
    let mut peers: Vec<usize> = node.local_peers.clone();
    peers.reverse();
    let group = format!("node{}", node.node_index);
    let mut x = team_ranks_scenarios::FileExchange::new(&dir, &group, me);
    let t = ctx
        .team_from_world_ranks(&peers, &mut |m| x.all_gather(&peers, m))
        .map_err(e2s)?;
    ensure!(
        t.members() == peers,
        "node team {:?}, expected {peers:?}",
        t.members()
    );
    team_ranks_scenarios::collectives(ctx, &t, &peers, &b, a.seed, 300)?;
    ctx.team_destroy(t).map_err(e2s)?;
    team_ranks_scenarios::done_dir(ctx, &dir)
}

/// Splits of the world across nodes, through their own communicators (NCCL on CUDA, Open MPI
/// on the host backend): the whole world as a team, then the PEs with each node index (a
/// data-parallel group, node-major layouts): every collective exact (i64 and bf16 too),
/// barriers, on CUDA a graph replayed; a split of such a team is refused; destroyed at the
/// end. On the host backend, last, members that diverge on such a team get a named error.
fn spanning_teams(ctx: &Context, a: PeArgs, s: &symheap::Stream) -> Outcome {
    let world = ctx.world_team();
    let node = ctx.node().clone();
    let n = ctx.n_pes();
    let all = ctx.team_split_strided(&world, 0, 1, n).map_err(e2s)?;
    ensure!(
        all.n_pes() == n,
        "the world as a team has {} PEs",
        all.n_pes()
    );
    refused_split(
        ctx.team_split_strided(&all, 0, 1, 1),
        "only the world may be split",
    )?;
    with_roundings(n as u32 - 1, || team_cases(ctx, &all, s, a))?;
    ctx.barrier(&all).map_err(e2s)?;
    ctx.team_destroy(all).map_err(e2s)?;
    // The world in reverse order: its communicator ranks the members in team order.
    let reversed: Vec<usize> = (0..n).rev().collect();
    let back = ctx.team_split_ranks(&world, &reversed).map_err(e2s)?;
    ensure!(
        back.members() == reversed && back.my_pe() == Some(n - 1 - ctx.my_pe()),
        "the world reversed as a team: {:?}, PE {:?}",
        back.members(),
        back.my_pe()
    );
    with_roundings(n as u32 - 1, || team_cases(ctx, &back, s, a))?;
    ctx.team_destroy(back).map_err(e2s)?;
    let ppn = node.local_peers.len();
    let nodes = node.node_count;
    if !even_nodes(ctx) || (0..n).any(|r| node.node_of[r] != r / ppn) {
        return ctx.barrier_all().map_err(e2s);
    }
    // The PEs with node index j: j, j + ppn, ... (one split per index, every PE in each).
    let mut dp = Team::INVALID;
    for j in 0..ppn {
        let t = ctx.team_split_strided(&world, j, ppn, nodes).map_err(e2s)?;
        if t.is_valid() {
            dp = t;
        }
    }
    ensure!(
        dp.n_pes() == nodes && dp.my_pe() == Some(node.node_index),
        "my data-parallel team: {} PEs, index {:?}",
        dp.n_pes(),
        dp.my_pe()
    );
    with_roundings(nodes as u32 - 1, || -> Outcome {
        team_cases(ctx, &dp, s, a)?;
        sum_case::<i64>(ctx, &dp, s, a, 10_007, 7101)?;
        sum_case::<bf16>(ctx, &dp, s, a, 70_001, 7102)
    })?;
    if ctx.cuda().is_some() {
        spanning_graph(ctx, &dp, s)?;
    }
    ctx.barrier(&dp).map_err(e2s)?;
    if ctx.cuda().is_none() {
        diverged_spanning(ctx, &dp)?;
    } else {
        ctx.team_destroy(dp).map_err(e2s)?;
    }
    ctx.barrier_all().map_err(e2s)
}

/// Host backend: the members of `team` (a team across nodes) call all_reduce with counts that
/// differ between its first member and the others: every member gets the same named
/// mismatch, before Open MPI moves anything. The team is left diverged (not destroyed).
fn diverged_spanning(ctx: &Context, team: &Team) -> Outcome {
    let me = team.my_pe().ok_or("not a member")?;
    let b = ctx.malloc(64).map_err(e2s)?;
    let count = if me == 0 { 4 } else { 5 };
    let r = ctx.all_reduce_raw(
        team,
        b.addr(),
        b.addr(),
        count,
        DType::I32,
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
    );
    match r {
        Err(e) if matches!(e.kind(), ErrorKind::CollectiveMismatch(_)) => {
            let text = e.to_string();
            ensure!(
                text.contains("4 x int32") && text.contains("5 x int32"),
                "the mismatch should name both calls: {text}"
            );
        }
        Err(e) => return Err(format!("diverged all_reduce on a team across nodes: {e}")),
        Ok(()) => return Err("diverged all_reduce on a team across nodes succeeded".into()),
    }
    ctx.barrier_all().map_err(e2s)
}

/// The stream of a scenario across nodes, after checking the PEs are on several nodes.
fn nodes_stream(ctx: &Context) -> Result<symheap::Stream, String> {
    ensure!(
        ctx.node().node_count > 1,
        "every PE is on one node: launch with --simulate-nodes K (or SYMHEAP_SIMULATE_NODES=K, \
         or SYMHEAP_NODE_ID per PE)"
    );
    ctx.create_stream().map_err(e2s)
}

/// The spanning-team checks alone (CUDA, or the host backend under Open MPI's mpirun; without
/// it, the refusal).
pub fn teams_nodes(ctx: &Context, a: PeArgs) -> Outcome {
    let s = nodes_stream(ctx)?;
    if ctx.cuda().is_none() && !under_mpirun() {
        let world = ctx.world_team();
        refused_split(ctx.team_split_strided(&world, 0, 1, ctx.n_pes()), "mpirun")?;
        return ctx.barrier_all().map_err(e2s);
    }
    spanning_teams(ctx, a, &s)
}

/// An all_reduce and a broadcast on `team` (a team across nodes) captured in a CUDA graph
/// and replayed; exact.
fn spanning_graph(ctx: &Context, team: &Team, s: &symheap::Stream) -> Outcome {
    let (me, n) = (team.my_pe().ok_or("not a member")?, team.n_pes());
    let c = 4097;
    let b = ctx.malloc((c * 4) as u64).map_err(e2s)?;
    let init: Vec<i32> = (0..c).map(|i| ((i + me) % 3) as i32).collect();
    b.write(0, &init).map_err(e2s)?;
    ctx.barrier(team).map_err(e2s)?;
    let body = || -> symheap::Result<()> {
        ctx.all_reduce_on_stream(
            team,
            b.addr(),
            b.addr(),
            c,
            DType::I32,
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            s,
        )?;
        ctx.broadcast_on_stream(team, b.addr(), b.addr(), c, DType::I32, n - 1, s)
    };
    let graph = Graph::capture(s, body).map_err(e2s)?;
    let replays = 3u32;
    for _ in 0..replays {
        graph.launch(s).map_err(e2s)?;
    }
    ctx.sync_stream(s).map_err(e2s)?;
    let got = b.to_vec::<i32>().map_err(e2s)?;
    for (i, &g) in got.iter().enumerate() {
        let sum: i32 = (0..n).map(|p| ((i + p) % 3) as i32).sum();
        let want = sum * (n as i32).pow(replays - 1);
        ensure!(
            g == want,
            "replayed all_reduce + broadcast on {n} PEs element {i}: {g}, expected {want}"
        );
    }
    ctx.barrier(team).map_err(e2s)
}

/// What does not cross nodes fails clearly: a put to a PE on another node.
fn refused_rma(ctx: &Context) -> Outcome {
    let node = ctx.node().clone();
    let far = (0..ctx.n_pes()).find(|&r| node.node_of[r] != node.node_index);
    let b = ctx.malloc(64).map_err(e2s)?;
    if let Some(far) = far {
        match ctx.put(&b, 0, &[1u8; 8], far) {
            Err(e) => ensure!(
                e.to_string().contains("another node"),
                "put to PE {far} on another node: {e}"
            ),
            Ok(()) => return Err(format!("a put to PE {far} on another node was accepted")),
        }
    }
    ctx.barrier_all().map_err(e2s)
}

/// The host-level collective calls (not on a stream) across nodes, exact.
fn host_level(ctx: &Context) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let b = ctx.malloc(8 * 1000).map_err(e2s)?;
    let mine: Vec<i64> = (0..1000).map(|i| (i * 7 + me as i64) << 33).collect();
    b.write(0, &mine).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)?;
    ctx.all_reduce::<i64>(&world, &b, &b, 1000, ReduceOp::Max)
        .map_err(e2s)?;
    let got = b.to_vec::<i64>().map_err(e2s)?;
    for (i, &g) in got.iter().enumerate() {
        let want = (i as i64 * 7 + n as i64 - 1) << 33;
        ensure!(
            g == want,
            "host-level i64 max all_reduce element {i}: {g}, expected {want}"
        );
    }
    ctx.barrier_all().map_err(e2s)
}

/// Every collective across (simulated) nodes, exact against the reference; CUDA-graph replays;
/// teams inside a node; the errors for what does not cross nodes.
pub fn coll_nodes(ctx: &Context, a: PeArgs) -> Outcome {
    let s = nodes_stream(ctx)?;
    if ctx.cuda().is_none() {
        // The host backend's collectives across nodes need mpirun (see multi_pe.rs); the
        // teams and the refusals need nothing.
        node_teams(ctx, a, &s)?;
        return refused_rma(ctx);
    }
    ensure!(ctx.nodes_path().is_none(), "set up before any collective");
    ctx.barrier_all_on_stream(&s).map_err(e2s)?;
    ctx.sync_stream(&s).map_err(e2s)?;
    let path = ctx
        .nodes_path()
        .ok_or("no path across nodes after a barrier on a stream")?;
    let want = expected_path(ctx);
    ensure!(
        path.starts_with(want),
        "collectives across nodes run as {path:?}, expected {want}"
    );
    if ctx.my_pe() == 0 {
        println!("collectives across nodes: {path}");
    }
    let world = ctx.world_team();
    // NCCL rounds f16/bf16 sums to the dtype at each of its steps (symheap's kernels once):
    // at most one per other PE.
    with_roundings(ctx.n_pes() as u32 - 1, || -> Outcome {
        world_cases(ctx, &world, &s, a)?;
        // i64 and f64 (which symheap's kernels lack) run through NCCL over the world; f16 and
        // bf16 past the small path, with ragged tails.
        sum_case::<i64>(ctx, &world, &s, a, 100_003, 7001)?;
        sum_case::<f64>(ctx, &world, &s, a, 1001, 7002)?;
        sum_case::<f16>(ctx, &world, &s, a, 300_001, 7003)?;
        sum_case::<bf16>(ctx, &world, &s, a, 65_536 * 5 + 3, 7004)?;
        // Past the pipeline's piece size: NCCL's steps on a stream of their own, in pieces.
        sum_case::<f32>(ctx, &world, &s, a, 5_000_003, 7005)?;
        sum_case::<bf16>(ctx, &world, &s, a, 12_000_001, 7006)
    })?;
    host_level(ctx)?;
    graph_replays(ctx, true)?;
    node_teams(ctx, a, &s)?;
    spanning_teams(ctx, a, &s)?;
    refused_rma(ctx)?;
    // Still usable after the refusals.
    ctx.barrier_all_on_stream(&s).map_err(e2s)?;
    ctx.sync_stream(&s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)
}
