//! `symheap bench`: the standard sweep against the peer measured in the same run.
//!
//! On the host backend: put/get against a plain memcpy in the same process and Open MPI's
//! one-sided MPI_Put/MPI_Get, barrier latency against MPI_Barrier, all_reduce against
//! MPI_Allreduce and broadcast against MPI_Bcast (Open MPI, when `mpicc` and `mpirun` are
//! installed: the peer program is compiled on the spot). Latency is the median over
//! trials of a timed loop of K back-to-back operations, divided by K; bandwidth is bytes over
//! that time. Every row reports the ratio `peer time / symheap time` (above 1: symheap faster).

pub mod gpu;
mod gpu_table;
mod gpu_time;
mod host;
mod mpi;
mod nodes;
mod scratch;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub use host::{bench_pe_host, HostPlan};

/// One measured comparison.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// Operation (`put`, `get`, `barrier`, `all_reduce`...).
    pub op: String,
    /// Message size in bytes (0 for barriers).
    pub bytes: u64,
    /// Seconds per operation, symheap.
    pub symheap_s: f64,
    /// The peer's name.
    pub peer: String,
    /// Seconds per operation, the peer (None when the peer is not available here).
    pub peer_s: Option<f64>,
}

impl Row {
    /// peer time / symheap time.
    pub fn ratio(&self) -> Option<f64> {
        self.peer_s.map(|p| p / self.symheap_s)
    }
}

/// Median over `trials` of the per-op time of `k` back-to-back calls of `f`.
pub fn time_loop(
    trials: usize,
    k: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let mut t = Vec::with_capacity(trials);
    for _ in 0..trials {
        let t0 = Instant::now();
        for _ in 0..k {
            f()?;
        }
        t.push(t0.elapsed().as_secs_f64() / k as f64);
    }
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(t[t.len() / 2])
}

/// Iterations per trial for a message of `bytes`: enough to dwarf the clock, few for big ones.
pub fn iters(bytes: u64) -> usize {
    match bytes {
        0..=65536 => 200,
        65537..=1048576 => 40,
        1048577..=16777216 => 8,
        _ => 3,
    }
}

fn human(b: u64) -> String {
    symheap::human_bytes(b)
}

fn fmt_time(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.2} us", s * 1e6)
    } else {
        format!("{:.3} ms", s * 1e3)
    }
}

/// Prints the comparison table (markdown, so it pastes into BENCHMARKS.md).
pub fn print_table(title: &str, rows: &[Row]) {
    println!("\n{title}\n");
    println!("| op | size | symheap | peer | peer time | symheap speed / peer | symheap GB/s |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let bw = if r.bytes > 0 {
            format!("{:.2}", r.bytes as f64 / r.symheap_s / 1e9)
        } else {
            "-".into()
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.op,
            if r.bytes == 0 {
                "-".into()
            } else {
                human(r.bytes)
            },
            fmt_time(r.symheap_s),
            r.peer,
            r.peer_s
                .map(fmt_time)
                .unwrap_or_else(|| "not available".into()),
            r.ratio()
                .map(|x| format!("{x:.2}x"))
                .unwrap_or_else(|| "-".into()),
            bw
        );
    }
}

/// Sizes of the host sweep, collectives and put/get alike: 8 B to 16 MiB, every 8x.
pub const HOST_SIZES: [u64; 8] = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20];
/// Collectives of the default host sweep (each with its MPI peer).
pub const HOST_DEFAULT_OPS: [&str; 2] = ["all_reduce", "broadcast"];

/// What `symheap bench` was asked for on a machine without GPUs.
pub struct HostOptions {
    /// `all`, `coll` or `rma`.
    pub what: String,
    /// PEs (CPU processes).
    pub n: usize,
    /// Collectives (empty: all_reduce and broadcast, and the barrier).
    pub ops: Vec<String>,
    /// Sizes as typed (empty: the standard sweep).
    pub sizes: Vec<String>,
    /// Element type of the collectives (None: f32).
    pub dtype: Option<String>,
    /// JSON output.
    pub json: Option<PathBuf>,
    /// PNG output.
    pub png: Option<PathBuf>,
    /// Peer numbers from other programs (GPU sweeps only: refused here).
    pub peer_json: Vec<PathBuf>,
}

/// Turns the options into the PEs' plan, or says which argument cannot be honoured and why.
fn host_plan(o: &HostOptions) -> Result<host::HostPlan, String> {
    let (coll, rma) = match o.what.as_str() {
        "all" => (true, true),
        "coll" => (true, false),
        "rma" => (false, true),
        other => return Err(format!("unknown sweep {other:?} (all, coll or rma)")),
    };
    if !o.peer_json.is_empty() {
        return Err(
            "--peer-json merges peers measured next to a GPU sweep; the host backend \
                    has none to merge (run it on GPUs, or drop --peer-json)"
                .into(),
        );
    }
    if !coll && (!o.ops.is_empty() || o.dtype.is_some()) {
        return Err(
            "--op and --dtype choose collectives, and `bench rma` runs none (use \
                    `bench coll --op ...`)"
                .into(),
        );
    }
    for op in &o.ops {
        if !gpu::COLL_OPS.contains(&op.as_str()) {
            return Err(format!(
                "unknown collective {op:?}; known: {}",
                gpu::COLL_OPS.join(", ")
            ));
        }
    }
    let dtype_name = o.dtype.as_deref().unwrap_or("f32");
    let dtype = symheap::DType::parse(dtype_name).ok_or_else(|| {
        let known: Vec<&str> = symheap::DType::ALL.iter().map(|d| d.name()).collect();
        format!("unknown dtype {dtype_name:?}; known: {}", known.join(", "))
    })?;
    let sizes = o
        .sizes
        .iter()
        .map(|s| symheap::config::parse_size(s))
        .collect::<Result<Vec<u64>, String>>()?;
    let ops: Vec<String> = match (coll, o.ops.is_empty()) {
        (false, _) => vec![],
        (true, true) => HOST_DEFAULT_OPS.iter().map(|s| s.to_string()).collect(),
        (true, false) => o.ops.clone(),
    };
    let pick = |defaults: &[u64]| {
        if sizes.is_empty() {
            defaults.to_vec()
        } else {
            sizes.clone()
        }
    };
    let coll_sizes = if coll { pick(&HOST_SIZES) } else { vec![] };
    for op in &ops {
        let split = matches!(op.as_str(), "all_gather" | "reduce_scatter" | "alltoall");
        let unit = dtype.size() as u64 * if split { o.n as u64 } else { 1 };
        if let Some(bad) = coll_sizes.iter().find(|&&b| b % unit != 0) {
            return Err(format!(
                "{op} of {bad} bytes on {} PEs: the size must be a multiple of {unit} bytes \
                 ({}{dtype} elements)",
                o.n,
                if split { "one block per PE of " } else { "" }
            ));
        }
    }
    Ok(host::HostPlan {
        rma_sizes: if rma { pick(&HOST_SIZES) } else { vec![] },
        barrier: coll && o.ops.is_empty(),
        ops,
        coll_sizes,
        dtype,
    })
}

fn join_sizes(v: &[u64]) -> String {
    v.iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs the PEs of `plan` and returns PE 0's rows, with the MPI peer merged where it has one,
/// and why there is no MPI column when there is none.
fn host_rows(
    plan: &host::HostPlan,
    n: usize,
    tmp: &Path,
) -> Result<(Vec<Row>, Option<String>), String> {
    let out = tmp.join("host.json");
    let mut cmd = crate::selfcmd::command();
    cmd.arg("launch")
        .arg("-n")
        .arg(n.to_string())
        .arg("--")
        .args(crate::selfcmd::argv())
        .arg("bench-pe")
        .arg("--out")
        .arg(&out)
        .arg("--dtype")
        .arg(plan.dtype.name());
    if !plan.rma_sizes.is_empty() {
        cmd.arg("--rma-sizes").arg(join_sizes(&plan.rma_sizes));
    }
    if !plan.ops.is_empty() {
        cmd.arg("--ops").arg(plan.ops.join(","));
        cmd.arg("--coll-sizes").arg(join_sizes(&plan.coll_sizes));
    }
    if plan.barrier {
        cmd.arg("--barrier");
    }
    if !matches!(scratch::status(&mut cmd), Ok(s) if s.success()) {
        return Err("the symheap PEs failed".into());
    }
    let rows: Vec<Row> = std::fs::read(&out)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("no results from the PEs")?;
    let f32_label = host::coll_label("all_reduce", symheap::DType::F32);
    let sizes_of = |keep: &dyn Fn(&str) -> bool| -> Vec<u64> {
        rows.iter()
            .filter(|r| keep(&r.op))
            .map(|r| r.bytes)
            .collect()
    };
    let sz = mpi::MpiSizes {
        ar: sizes_of(&|op| op == f32_label),
        bc: sizes_of(&mpi::is_broadcast),
        // One-sided MPI needs a second rank to put into.
        rma: if n > 1 {
            plan.rma_sizes.clone()
        } else {
            Vec::new()
        },
    };
    let wants_mpi = plan.barrier || !sz.ar.is_empty() || !sz.bc.is_empty() || !sz.rma.is_empty();
    if !wants_mpi {
        return Ok((rows, None));
    }
    match mpi::times(tmp, n, &sz) {
        Ok(t) => Ok((mpi::with_mpi_times(rows, &t, &f32_label), None)),
        Err(why) => Ok((rows, Some(why))),
    }
}

/// The one-line warning for `n` PEs on a host with `cores` CPU cores, when they are more.
fn oversubscribed(n: usize, cores: usize) -> Option<String> {
    (n > cores).then(|| {
        format!(
            "bench: warning: {n} PEs on {cores} CPU cores: the PEs take turns on the cores, so \
             the host timings measure the scheduler more than symheap (use -n {cores} or fewer)"
        )
    })
}

/// The main job on a machine without GPUs: host backend, `o.n` PEs, what `o` asks for.
pub fn run_host(o: &HostOptions) -> i32 {
    let plan = match host_plan(o) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench: {e}");
            return 2;
        }
    };
    let Ok(chart) = chart_for(o.png.as_deref()) else {
        return 2;
    };
    let scratch = match scratch::Scratch::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e}");
            return 1;
        }
    };
    if let Some(w) = oversubscribed(o.n, cpus()) {
        eprintln!("{w}");
    }
    eprintln!(
        "bench: host backend, {} PEs (each bound to a CPU when there are enough, as mpirun \
         binds the MPI peer's ranks): {}{}",
        o.n,
        if plan.rma_sizes.is_empty() {
            ""
        } else {
            "put/get vs memcpy; "
        },
        if plan.ops.is_empty() {
            String::new()
        } else {
            format!(
                "{} ({}) vs Open MPI where it has one",
                plan.ops.join(", "),
                plan.dtype
            )
        }
    );
    let (rows, no_mpi) = match host_rows(&plan, o.n, scratch.path()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench: {e}");
            return 1;
        }
    };
    print_table(
        &format!(
            "symheap host backend, {} PEs on {} ({} CPUs)",
            o.n,
            hostname(),
            cpus()
        ),
        &rows,
    );
    if let Some(why) = no_mpi {
        // After the table, where it is read: the rows it concerns say "not available".
        eprintln!("bench: no Open MPI peer in this table: {why}");
    }
    if let Some(p) = &o.json {
        let doc = serde_json::json!({
            "backend": "host",
            "pes": o.n,
            "host": hostname(),
            "cpus": cpus(),
            "rows": rows,
        });
        if let Err(e) = std::fs::write(p, serde_json::to_vec_pretty(&doc).unwrap_or_default()) {
            eprintln!("bench: cannot write {}: {e}", p.display());
            return 1;
        }
        eprintln!("bench: wrote {}", p.display());
    }
    match (&o.png, chart) {
        (Some(png), Some(py)) => draw_png(
            &py,
            &serde_json::to_vec(&rows).unwrap_or_default(),
            png,
            scratch.path(),
        ),
        _ => 0,
    }
}

/// The Python that draws the chart asked for (`None` when no `--png`). A chart that cannot be
/// drawn is refused now, with the reason printed, not after the sweep.
fn chart_for(png: Option<&Path>) -> Result<Option<std::ffi::OsString>, ()> {
    match png.map(|_| chart_python()).transpose() {
        Ok(c) => Ok(c),
        Err(e) => {
            let png = png.unwrap_or(Path::new(""));
            eprintln!("bench: cannot draw {}: {e}", png.display());
            Err(())
        }
    }
}

/// The Python that draws charts: the interpreter running this command when it runs from the
/// Python package (`symheap` installed by pip, `python -m symheap`), else `python3`; checked to
/// have matplotlib.
fn chart_python() -> Result<std::ffi::OsString, String> {
    let py = crate::selfcmd::python().unwrap_or_else(|| "python3".into());
    let shown = py.to_string_lossy().into_owned();
    match Command::new(&py).args(["-c", "import matplotlib"]).output() {
        Ok(o) if o.status.success() => Ok(py),
        Ok(_) => Err(format!(
            "{shown} has no matplotlib (install it: {shown} -m pip install matplotlib)"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "{shown} is not on PATH (charts need python3 with matplotlib)"
        )),
        Err(e) => Err(format!("cannot run {shown}: {e}")),
    }
}

/// Draws `rows` (JSON of host or GPU rows) into `png` with `py`, through files in `tmp`;
/// returns the exit status.
fn draw_png(py: &std::ffi::OsStr, rows: &[u8], png: &Path, tmp: &Path) -> i32 {
    let data = tmp.join("plot.json");
    let script = tmp.join("plot.py");
    let result = std::fs::write(&data, rows)
        .and_then(|()| std::fs::write(&script, include_str!("plot.py")))
        .map_err(|e| e.to_string())
        .and_then(|()| {
            scratch::output(Command::new(py).arg(&script).arg(&data).arg(png))
                .map_err(|e| e.to_string())
        });
    match result {
        Ok(o) if o.status.success() && png.exists() => {
            eprintln!("bench: drew {}", png.display());
            0
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("no message");
            eprintln!("bench: could not draw {}: {last}", png.display());
            1
        }
        Err(e) => {
            eprintln!("bench: could not draw {}: {e}", png.display());
            1
        }
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// CPUs this process may use.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Options of the GPU sweep.
pub struct GpuOptions {
    /// `all`, `coll` or `rma`.
    pub what: String,
    /// PEs (one per GPU).
    pub n: usize,
    /// Collectives (empty: all).
    pub ops: Vec<String>,
    /// Sizes as typed (empty: the standard sweep).
    pub sizes: Vec<String>,
    /// Element type.
    pub dtype: String,
    /// JSON output.
    pub json: Option<PathBuf>,
    /// PNG output.
    pub png: Option<PathBuf>,
    /// Peer numbers from other programs of the same run (any number of JSON files).
    pub peer_json: Vec<PathBuf>,
}

/// Sizes of the standard GPU sweep.
pub const GPU_SIZES: [u64; 7] = [
    8 << 10,
    64 << 10,
    512 << 10,
    4 << 20,
    32 << 20,
    256 << 20,
    1 << 30,
];

/// What the GPU PEs are asked to run, checked before any of them starts.
struct GpuSweep {
    /// Collectives (empty: none, an RMA-only sweep).
    ops: Vec<String>,
    /// Sizes of the collectives, in bytes.
    sizes: Vec<u64>,
    /// Also the RMA and allocation rows.
    rma: bool,
}

/// Turns the options into the sweep, or says which argument cannot be honoured.
fn gpu_sweep(o: &GpuOptions) -> Result<GpuSweep, String> {
    let coll = matches!(o.what.as_str(), "all" | "coll");
    let rma = matches!(o.what.as_str(), "all" | "rma");
    if !coll && !rma {
        return Err(format!("unknown sweep {:?} (all, coll or rma)", o.what));
    }
    if symheap::DType::parse(&o.dtype).is_none() {
        return Err(format!("unknown dtype {:?}", o.dtype));
    }
    let ops: Vec<String> = if !coll {
        vec![]
    } else if o.ops.is_empty() {
        gpu::COLL_OPS.iter().map(|s| s.to_string()).collect()
    } else {
        for op in &o.ops {
            if !gpu::COLL_OPS.contains(&op.as_str()) {
                return Err(format!(
                    "unknown collective {op:?}; known: {}",
                    gpu::COLL_OPS.join(", ")
                ));
            }
        }
        o.ops.clone()
    };
    let mut sizes = o
        .sizes
        .iter()
        .map(|s| symheap::config::parse_size(s))
        .collect::<Result<Vec<u64>, String>>()?;
    if sizes.is_empty() {
        sizes = GPU_SIZES.to_vec();
    }
    Ok(GpuSweep { ops, sizes, rma })
}

/// Runs one PE per GPU on `sweep` and returns PE 0's rows, read back from `out`.
fn gpu_rows(o: &GpuOptions, sweep: &GpuSweep, out: &Path) -> Result<Vec<gpu_time::GpuRow>, String> {
    let GpuSweep { ops, sizes, rma } = sweep;
    let exe = crate::selfcmd::argv();
    let mut cmd = crate::selfcmd::command();
    cmd.arg("launch")
        .arg("-n")
        .arg(o.n.to_string())
        .arg("--")
        .args(&exe)
        .arg("bench-pe-gpu")
        .arg("--out")
        .arg(out)
        .arg("--dtype")
        .arg(&o.dtype)
        .env("SYMHEAP_BACKEND", "cuda");
    if !ops.is_empty() {
        cmd.arg("--ops").arg(ops.join(","));
        cmd.arg("--sizes").arg(
            sizes
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    if *rma {
        cmd.arg("--rma");
    }
    if !matches!(scratch::status(&mut cmd), Ok(s) if s.success()) {
        return Err("the symheap PEs failed".into());
    }
    std::fs::read(out)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| "no results from the PEs".into())
}

/// Prints the GPU rows (with the peers of every `o.peer_json` file merged in), writes the JSON
/// and the chart asked for; returns the exit status. A peer file that cannot be read is named
/// and skipped: the other peers still print.
fn report_gpu(
    o: &GpuOptions,
    mut rows: Vec<gpu_time::GpuRow>,
    chart: Option<std::ffi::OsString>,
    tmp: &Path,
) -> i32 {
    let mut unmatched = Vec::new();
    for p in &o.peer_json {
        match gpu_table::load_peers(p) {
            Ok(peers) => unmatched.extend(gpu_table::merge_peers(&mut rows, peers)),
            Err(e) => eprintln!("bench: peer numbers not merged: {e}"),
        }
    }
    gpu_table::print_tables(
        &format!("symheap CUDA backend, {} PEs on {}", o.n, hostname()),
        &rows,
        &unmatched,
    );
    if let Some(p) = &o.json {
        let best: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let b = gpu_table::best_peer(r);
                serde_json::json!({ "op": r.op, "bytes": r.bytes,
                    "best_peer": b.as_ref().map(|b| &b.0), "best_peer_us": b.map(|b| b.1) })
            })
            .collect();
        let doc = serde_json::json!({ "backend": "cuda", "pes": o.n, "host": hostname(),
            "rows": rows, "best_peer": best, "peers_without_symheap_row": unmatched });
        if let Err(e) = std::fs::write(p, serde_json::to_vec_pretty(&doc).unwrap()) {
            eprintln!("bench: cannot write {}: {e}", p.display());
            return 1;
        }
    }
    if let (Some(png), Some(py)) = (&o.png, chart) {
        return draw_png(
            &py,
            &serde_json::to_vec(&rows).unwrap_or_default(),
            png,
            tmp,
        );
    }
    0
}

/// The main job on a machine with GPUs: one PE per GPU, symheap against NCCL.
pub fn run_gpu(o: &GpuOptions) -> i32 {
    let sweep = match gpu_sweep(o) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e}");
            return 2;
        }
    };
    let Ok(chart) = chart_for(o.png.as_deref()) else {
        return 2;
    };
    let scratch = match scratch::Scratch::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e}");
            return 1;
        }
    };
    let out = scratch.path().join("gpu.json");
    eprintln!(
        "bench: CUDA backend, {} PEs, {} against NCCL{}",
        o.n,
        if sweep.ops.is_empty() {
            "RMA".to_string()
        } else {
            format!("{} ({})", sweep.ops.join(", "), o.dtype)
        },
        if sweep.rma {
            ", RMA and allocation"
        } else {
            ""
        }
    );
    let rows = match gpu_rows(o, &sweep, &out) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench: {e}");
            return 1;
        }
    };
    report_gpu(o, rows, chart, scratch.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_pes_than_cores_warns_in_one_line() {
        assert_eq!(oversubscribed(2, 2), None);
        assert_eq!(oversubscribed(1, 8), None);
        let w = oversubscribed(64, 2).unwrap();
        assert!(
            w.starts_with("bench: warning: 64 PEs on 2 CPU cores") && w.contains("-n 2 or fewer"),
            "{w}"
        );
        assert!(!w.contains('\n'), "{w}");
    }

    #[test]
    fn the_default_host_sweep_covers_8_bytes_to_16_mib_with_broadcast() {
        let o = HostOptions {
            what: "all".into(),
            n: 2,
            ops: vec![],
            sizes: vec![],
            dtype: None,
            json: None,
            png: None,
            peer_json: vec![],
        };
        let p = host_plan(&o).unwrap();
        assert_eq!(p.ops, vec!["all_reduce", "broadcast"]);
        assert!(p.barrier);
        for s in [&p.rma_sizes, &p.coll_sizes] {
            assert_eq!(s.first(), Some(&8));
            assert_eq!(s.last(), Some(&(16 << 20)));
        }
    }
}
