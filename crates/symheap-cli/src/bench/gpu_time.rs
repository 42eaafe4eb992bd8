//! How the GPU sweep times an operation, and the row it fills: the median over trials of an
//! event-timed loop of K back-to-back operations, divided by K, launched eagerly or replayed
//! from a CUDA graph. Shared by the sweep (`gpu.rs`) and the stage rows of the hierarchical
//! all_reduce (`nodes.rs`).

use serde::{Deserialize, Serialize};
use symheap::tools::{Event, Graph};

/// One measured configuration.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct GpuRow {
    /// `coll`, `rma` or `alloc`.
    pub group: String,
    /// Operation and variant (`all_reduce`, `put SM`, ...).
    pub op: String,
    /// Element type.
    pub dtype: String,
    /// Message size in bytes (NCCL-tests convention: the larger of send and receive buffers).
    pub bytes: u64,
    /// Microseconds per op, symheap, CUDA graph replay (None when not measured).
    pub graph_us: Option<f64>,
    /// Microseconds per op, symheap, eager launches.
    pub eager_us: Option<f64>,
    /// The peer measured in the same run.
    pub peer: String,
    /// Peer, graph replay.
    pub peer_graph_us: Option<f64>,
    /// Peer, eager.
    pub peer_eager_us: Option<f64>,
    /// Bus-bandwidth factor (NCCL-tests): busbw = factor × bytes / time.
    pub bus_factor: f64,
    /// Other peers merged in later (`bench/*.py`, see `gpu_table`), name → microseconds, CUDA
    /// graph (eager for RMA rows).
    #[serde(default)]
    pub others: Vec<(String, f64)>,
    /// The same peers' eager numbers, where they measured them.
    #[serde(default)]
    pub others_eager: Vec<(String, f64)>,
}

fn e2s(e: symheap::Error) -> String {
    e.to_string()
}

/// Median over `trials` of (time of `k` calls of `f` enqueued on `stream`) / k, in µs.
pub(super) fn time_stream(
    stream: &symheap::Stream,
    trials: usize,
    k: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let (a, b) = (Event::new().map_err(e2s)?, Event::new().map_err(e2s)?);
    let mut t = Vec::with_capacity(trials);
    // Host time to enqueue the k calls: when it exceeds the GPU time, the loop measures the host.
    let mut host = Vec::with_capacity(trials);
    for _ in 0..trials {
        a.record(stream).map_err(e2s)?;
        let t0 = std::time::Instant::now();
        for _ in 0..k {
            f()?;
        }
        host.push(t0.elapsed().as_secs_f64() * 1e6 / k as f64);
        b.record(stream).map_err(e2s)?;
        t.push(a.elapsed_ms(&b).map_err(e2s)? as f64 * 1e3 / k as f64);
    }
    t.sort_by(|x, y| x.partial_cmp(y).unwrap());
    host.sort_by(|x, y| x.partial_cmp(y).unwrap());
    if std::env::var_os("SYMHEAP_BENCH_TRACE").is_some() {
        eprintln!(
            "bench: {:.2} us per call on the stream, {:.2} us per call to enqueue",
            t[t.len() / 2],
            host[host.len() / 2]
        );
    }
    Ok(t[t.len() / 2])
}

/// The same for a graph of `k` captured calls, replayed once per trial.
pub(super) fn time_graph(
    stream: &symheap::Stream,
    trials: usize,
    k: usize,
    mut f: impl FnMut() -> symheap::Result<()>,
) -> Result<f64, String> {
    let g = Graph::capture(stream, || {
        for _ in 0..k {
            f()?;
        }
        Ok(())
    })
    .map_err(e2s)?;
    g.launch(stream).map_err(e2s)?; // warm-up replay
    time_stream(stream, trials, 1, || g.launch(stream).map_err(e2s)).map(|t| t / k as f64)
}

/// Calls per timed loop and trials, for a message of `bytes`.
pub(super) fn k_for(bytes: u64) -> (usize, usize) {
    match bytes {
        0..=1_048_576 => (50, 11),
        1_048_577..=67_108_864 => (20, 7),
        _ => (3, 5),
    }
}
