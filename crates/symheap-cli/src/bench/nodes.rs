//! The stages of the hierarchical all_reduce, timed alone, when the world spans nodes
//! (`symheap launch --simulate-nodes`, or real nodes): what the in-node steps (symheap's kernels
//! on the node team) and the between-nodes step (NCCL among the PEs with the same node index)
//! cost, next to the whole collective (the `all_reduce` rows, whose peer is NCCL over the
//! world). Same method as every GPU row: event-timed loops, eager and CUDA graph.

use symheap::{AllReduceAlgo, Context, DType, ReduceOp, Team, NODES_ALL_REDUCE_SMALL};

use super::gpu_time::{k_for, time_graph, time_stream, GpuRow};
use symheap::tools::Nccl;

fn e2s(e: symheap::Error) -> String {
    e.to_string()
}

/// This PE's node team and the NCCL communicator among the PEs with its node index, when every
/// node holds the same number of consecutive ranks (the layout the hierarchical algorithms
/// serve); None otherwise. Collective over the world.
fn node_groups(ctx: &Context) -> Result<Option<(Team, Nccl, usize)>, String> {
    let node = ctx.node().clone();
    let n = ctx.n_pes();
    let ppn = n / node.node_count;
    let node_major = n % node.node_count == 0 && (0..n).all(|r| node.node_of[r] == r / ppn);
    if node.node_count < 2 || !node_major {
        return Ok(None);
    }
    let world = ctx.world_team();
    let mut mine = Team::INVALID;
    for k in 0..node.node_count {
        let t = ctx
            .team_split_strided(&world, k * ppn, 1, ppn)
            .map_err(e2s)?;
        if t.is_valid() {
            mine = t;
        }
    }
    let local = ctx.my_pe() % ppn;
    let group: Vec<usize> = (0..node.node_count).map(|k| k * ppn + local).collect();
    let inter = Nccl::among(ctx, &group).map_err(e2s)?;
    Ok(Some((mine, inter, ppn)))
}

/// Rows for the stages of an all_reduce of each of `sizes`: in the node (reduce_scatter and
/// all_gather, or a whole all_reduce up to `NODES_ALL_REDUCE_SMALL`) and between nodes (NCCL's
/// all_reduce of a shard, or of the whole vector), as the hierarchical path runs them.
pub(super) fn stage_rows(
    ctx: &Context,
    s: &symheap::Stream,
    sizes: &[u64],
    dtype: DType,
    rows: &mut Vec<GpuRow>,
) -> Result<(), String> {
    let Some((node, mut inter, ppn)) = node_groups(ctx)? else {
        return Ok(());
    };
    let es = dtype.size() as u64;
    for &bytes in sizes {
        let small = bytes <= NODES_ALL_REDUCE_SMALL || bytes / es < ppn as u64;
        let shard = if small {
            bytes
        } else {
            bytes / es / ppn as u64 * es
        };
        let buf = ctx.malloc(bytes.max(256)).map_err(e2s)?;
        let part = ctx.malloc(shard.max(256)).map_err(e2s)?;
        let (count, scount) = ((bytes / es) as usize, (shard / es) as usize);
        let in_node = || -> symheap::Result<()> {
            if small {
                let algo = AllReduceAlgo::Auto;
                let sum = ReduceOp::Sum;
                ctx.all_reduce_on_stream(&node, buf.addr(), buf.addr(), count, dtype, sum, algo, s)
            } else {
                let (p, b) = (part.addr(), buf.addr());
                ctx.reduce_scatter_on_stream(&node, p, b, scount, dtype, ReduceOp::Sum, s)?;
                ctx.all_gather_on_stream(&node, b, p, scount, dtype, s)
            }
        };
        let target = if small { &buf } else { &part };
        let mut between = || -> symheap::Result<()> {
            inter.all_reduce(target, target, scount, dtype, ReduceOp::Sum, s)
        };
        let (k, trials) = k_for(bytes);
        let mut row = |op: String, eager: f64, graph: f64| {
            rows.push(GpuRow {
                group: "coll".into(),
                op,
                dtype: dtype.name().into(),
                bytes,
                graph_us: Some(graph),
                eager_us: Some(eager),
                peer: "-".into(),
                ..Default::default()
            })
        };
        for _ in 0..3 {
            in_node().map_err(e2s)?;
            between().map_err(e2s)?;
        }
        settle(ctx, s)?;
        let e = time_stream(s, trials, k, || in_node().map_err(e2s))?;
        settle(ctx, s)?;
        let g = time_graph(s, trials, k, in_node)?;
        settle(ctx, s)?;
        let what = if small {
            "all_reduce"
        } else {
            "reduce_scatter + all_gather"
        };
        row(
            format!("all_reduce stage: in the node, {what} (symheap, {ppn} PEs)"),
            e,
            g,
        );
        let e = time_stream(s, trials, k, || between().map_err(e2s))?;
        settle(ctx, s)?;
        let g = time_graph(s, trials, k, &mut between)?;
        settle(ctx, s)?;
        let what = if small {
            "the whole vector"
        } else {
            "a 1/PEs-per-node shard"
        };
        row(
            format!("all_reduce stage: between nodes, NCCL all_reduce of {what}"),
            e,
            g,
        );
    }
    ctx.barrier_all().map_err(e2s)?;
    ctx.team_destroy(node).map_err(e2s)
}

fn settle(ctx: &Context, s: &symheap::Stream) -> Result<(), String> {
    ctx.sync_stream(s).map_err(e2s)?;
    ctx.barrier_all().map_err(e2s)
}
