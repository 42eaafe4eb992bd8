//! The command line: parsing and dispatch of every subcommand.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::{bench, selftest};

#[derive(Parser)]
#[command(
    name = "symheap",
    version,
    about = "Symmetric memory across GPUs and CPU processes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start N PEs of PROGRAM on this machine with a torchrun-style environment.
    Launch {
        /// Number of PEs.
        #[arg(short = 'n', long = "nproc", default_value_t = 1)]
        n: usize,
        /// Seconds the other PEs get to exit on their own after one fails (then SIGTERM, then
        /// SIGKILL).
        #[arg(long, default_value_t = 3.0)]
        grace: f64,
        /// Do not prefix output lines with `[PE r]`.
        #[arg(long)]
        no_prefix: bool,
        /// Split the PEs into K simulated nodes (consecutive ranks, as even as possible) that
        /// share no memory, to test what crosses nodes on one machine: sets SYMHEAP_NODE_ID per
        /// node and NCCL_HOSTID per PE (NCCL over its network transport on loopback). Default:
        /// SYMHEAP_SIMULATE_NODES, else none.
        #[arg(long, value_name = "K")]
        simulate_nodes: Option<usize>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<OsString>,
    },
    /// Initialise symheap (one PE, or every PE under a launcher) and print what it sees.
    Info {
        /// Also list every environment variable symheap reads.
        #[arg(long)]
        vars: bool,
        /// Also list every place a library that could not be loaded (NVRTC) was looked for.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Run the multi-PE self-test scenarios at several PE counts.
    Selftest {
        /// PE counts to run at.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        pes: Vec<usize>,
        /// Only these scenarios (comma separated).
        #[arg(long)]
        only: Option<String>,
        /// Not these scenarios (comma separated).
        #[arg(long)]
        skip: Option<String>,
        /// Random seed shared by all PEs (default: from the clock).
        #[arg(long)]
        seed: Option<u64>,
        /// List the scenarios and exit.
        #[arg(long)]
        list: bool,
        /// Run every PE on the CUDA backend and include the GPU-only scenarios.
        #[arg(long)]
        gpu: bool,
    },
    /// The main job: start PEs on whatever this machine has and run the standard sweep against
    /// the peer available there, printing the comparison table.
    Bench(BenchArgs),
    /// Compile symheap's own kernels to cubins ahead of time (NVRTC, no GPU needed), for a build
    /// with `SYMHEAP_PREBUILT_KERNELS=DIR` to embed (the wheel and release builds do).
    Kernels {
        /// Folder to write `kernels-<hash>-sm<arch>.cubin` into.
        #[arg(long)]
        out: std::path::PathBuf,
        /// Architectures (comma separated sm numbers).
        #[arg(long, value_delimiter = ',', default_value = "80,90,100,120")]
        arch: Vec<u32>,
    },
    /// One PE of the benchmark (started by `bench`).
    #[command(hide = true)]
    BenchPe {
        #[arg(long)]
        out: std::path::PathBuf,
        #[arg(long, value_delimiter = ',')]
        rma_sizes: Vec<u64>,
        #[arg(long)]
        barrier: bool,
        #[arg(long, value_delimiter = ',')]
        ops: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        coll_sizes: Vec<u64>,
        #[arg(long)]
        dtype: String,
    },
    /// One PE of the GPU benchmark (started by `bench`).
    #[command(hide = true)]
    BenchPeGpu {
        #[arg(long)]
        out: std::path::PathBuf,
        #[arg(long, value_delimiter = ',')]
        ops: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<u64>,
        #[arg(long)]
        dtype: String,
        #[arg(long)]
        rma: bool,
    },
    /// One PE of a self-test scenario (started by `selftest`).
    #[command(hide = true)]
    SelftestPe {
        scenario: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 0)]
        victim: usize,
    },
}

/// The options of `symheap bench`.
#[derive(Args)]
struct BenchArgs {
    /// What to run: `all` (the standard sweep), `coll` (collectives only) or `rma`.
    #[arg(default_value = "all")]
    what: String,
    /// Number of PEs (default: every GPU; on the host one per CPU, 2 to 8).
    #[arg(short = 'n', long)]
    pes: Option<usize>,
    /// Collectives to sweep (comma separated): all_reduce, all_gather, reduce_scatter,
    /// broadcast, alltoall.
    #[arg(long, value_delimiter = ',')]
    op: Vec<String>,
    /// Message sizes (comma separated, e.g. 8K,512K,4M,1G).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<String>,
    /// Element type of the collectives (default bf16 on GPUs, f32 on the host).
    #[arg(long)]
    dtype: Option<String>,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Also draw a PNG chart here (needs python3 with matplotlib).
    #[arg(long)]
    png: Option<std::path::PathBuf>,
    /// Merge peer numbers measured in the same run by other programs (`bench/*.py` JSON);
    /// repeat for several files.
    #[arg(long)]
    peer_json: Vec<std::path::PathBuf>,
    /// Force the host backend even when GPUs are visible.
    #[arg(long)]
    host: bool,
}

/// An exit status in the range a process can return.
fn code(c: i32) -> i32 {
    c.clamp(0, 255)
}

/// `e` with the hidden subcommands (the PEs `bench` and `selftest` start) taken out of its
/// "similar subcommands" tip: clap suggests from every subcommand, hidden or not, so `symheap
/// bnech` used to suggest `bench-pe-gpu` and `bench-pe`.
fn without_hidden_suggestions(e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory;
    if e.kind() != ErrorKind::InvalidSubcommand {
        return e;
    }
    let cmd = Cli::command();
    let hidden: Vec<&str> = cmd
        .get_subcommands()
        .filter(|c| c.is_hide_set())
        .flat_map(|c| std::iter::once(c.get_name()).chain(c.get_all_aliases()))
        .collect();
    let mut out = clap::Error::new(ErrorKind::InvalidSubcommand).with_cmd(&cmd);
    for (kind, value) in e.context() {
        let value = match (kind, value) {
            (ContextKind::SuggestedSubcommand, ContextValue::Strings(names)) => {
                let kept: Vec<String> = names
                    .iter()
                    .filter(|n| !hidden.contains(&n.as_str()))
                    .cloned()
                    .collect();
                if kept.is_empty() {
                    continue;
                }
                ContextValue::Strings(kept)
            }
            _ => value.clone(),
        };
        out.insert(kind, value);
    }
    out
}

/// Parses `args` (the program name first) and runs the subcommand; returns the exit status.
pub(crate) fn run(args: Vec<OsString>) -> i32 {
    crate::init_logging();
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let e = without_hidden_suggestions(e);
            // --help and --version are "errors" that print to stdout and exit 0.
            let _ = e.print();
            return code(e.exit_code());
        }
    };
    match cli.cmd {
        Cmd::Launch {
            n,
            grace,
            no_prefix,
            simulate_nodes,
            program,
        } => launch_cmd(n, grace, no_prefix, simulate_nodes, program),
        Cmd::Info { vars, verbose } => info(vars, verbose),
        Cmd::Selftest {
            pes,
            only,
            skip,
            seed,
            list,
            gpu,
        } => selftest_cmd(&pes, only, skip, seed, list, gpu),
        Cmd::Bench(args) => bench_cmd(args),
        Cmd::Kernels { out, arch } => code(crate::kernels::build(&out, &arch)),
        Cmd::BenchPe {
            out,
            rma_sizes,
            barrier,
            ops,
            coll_sizes,
            dtype,
        } => bench_pe(&out, rma_sizes, barrier, ops, coll_sizes, &dtype),
        Cmd::BenchPeGpu {
            out,
            ops,
            sizes,
            dtype,
            rma,
        } => bench_pe_gpu(&out, ops, sizes, &dtype, rma),
        Cmd::SelftestPe {
            scenario,
            seed,
            victim,
        } => code(selftest::run_pe(&scenario, seed, victim)),
    }
}

/// `symheap launch`.
fn launch_cmd(
    n: usize,
    grace: f64,
    no_prefix: bool,
    simulate_nodes: Option<usize>,
    mut program: Vec<OsString>,
) -> i32 {
    let prog = program.remove(0);
    let mut opts = symheap_launch::LaunchOptions::new(n, prog);
    opts.args = program;
    opts.prefix_output = !no_prefix;
    opts.simulate_nodes = simulate_nodes.unwrap_or(0);
    if !(0.0..=symheap::config::MAX_TIMEOUT_SECS).contains(&grace) {
        eprintln!("symheap launch: --grace {grace} is not accepted: expected 0 to 1e9 seconds");
        return code(2);
    }
    opts.grace = Duration::from_secs_f64(grace);
    match symheap_launch::launch(&opts) {
        Ok(outcome) => code(outcome.exit_code()),
        Err(e) => {
            eprintln!("{e}");
            code(1)
        }
    }
}

/// `symheap selftest`.
fn selftest_cmd(
    pes: &[usize],
    only: Option<String>,
    skip: Option<String>,
    seed: Option<u64>,
    list: bool,
    gpu: bool,
) -> i32 {
    if list {
        for s in selftest::SCENARIOS {
            println!("{:<10} {}", s.name, s.about);
        }
        return code(0);
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let sel = selftest::Selection {
        only: only.as_deref(),
        skip: skip.as_deref(),
    };
    code(selftest::run_suite(pes, &sel, seed, gpu))
}

/// `symheap bench`: on the GPUs when there are any (and `--host` is not given), else on the
/// host backend.
fn bench_cmd(a: BenchArgs) -> i32 {
    let gpus = if a.host {
        0
    } else {
        symheap::cuda::gpu_count()
    };
    if gpus == 0 {
        let opts = bench::HostOptions {
            what: a.what,
            n: a.pes.unwrap_or_else(|| bench::cpus().clamp(2, 8)),
            ops: a.op,
            sizes: a.sizes,
            dtype: a.dtype,
            json: a.json,
            png: a.png,
            peer_json: a.peer_json,
        };
        return code(bench::run_host(&opts));
    }
    let opts = bench::GpuOptions {
        what: a.what,
        n: a.pes.unwrap_or(gpus),
        ops: a.op,
        sizes: a.sizes,
        dtype: a.dtype.unwrap_or_else(|| "bf16".into()),
        json: a.json,
        png: a.png,
        peer_json: a.peer_json,
    };
    code(bench::run_gpu(&opts))
}

/// One PE of the host benchmark.
fn bench_pe(
    out: &Path,
    rma_sizes: Vec<u64>,
    barrier: bool,
    ops: Vec<String>,
    coll_sizes: Vec<u64>,
    dtype: &str,
) -> i32 {
    let Some(dtype) = symheap::DType::parse(dtype) else {
        eprintln!("unknown dtype {dtype}");
        return code(2);
    };
    let plan = bench::HostPlan {
        rma_sizes,
        barrier,
        ops,
        coll_sizes,
        dtype,
    };
    code(bench::bench_pe_host(&plan, out))
}

/// One PE of the GPU benchmark.
fn bench_pe_gpu(out: &Path, ops: Vec<String>, sizes: Vec<u64>, dtype: &str, rma: bool) -> i32 {
    let Some(dtype) = symheap::DType::parse(dtype) else {
        eprintln!("unknown dtype {dtype}");
        return code(2);
    };
    let plan = bench::gpu::GpuPlan {
        ops,
        sizes,
        dtype,
        rma,
    };
    code(bench::gpu::bench_pe_gpu(&plan, out))
}

/// The longest line `symheap info` prints of its own (a path the user set may be longer).
const INFO_LINE_MAX: usize = 160;

/// Which kernels this build carries compiled and whether NVRTC (for the rest) is loadable, as
/// the line after `prefix`; with the places NVRTC was looked for when it is not, one per line.
fn kernel_sources(prefix: &str) -> (String, Vec<String>) {
    let archs = symheap::cuda::prebuilt_archs();
    let prebuilt = if archs.is_empty() {
        "none prebuilt in this build".to_string()
    } else {
        let a: Vec<String> = archs.iter().map(|a| format!("sm_{a}")).collect();
        format!("prebuilt for {}", a.join(", "))
    };
    match symheap::cuda::nvrtc::version() {
        Ok((major, minor)) => {
            let at = symheap::cuda::nvrtc::library_path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            (
                format!("{prebuilt} | NVRTC {major}.{minor} at {at}"),
                Vec::new(),
            )
        }
        Err(e) => {
            // NVRTC is needed only for other GPUs, tuning overrides and users' own kernels: on
            // most machines its absence is worth a line, not the search's whole story.
            let room = INFO_LINE_MAX.saturating_sub(prefix.len() + prebuilt.len() + 3);
            let line = crate::load_error::one_line("NVRTC", &e, room, "symheap info -v");
            (
                format!("{prebuilt} | {line}"),
                crate::load_error::places(&e),
            )
        }
    }
}

fn info(vars: bool, verbose: bool) -> i32 {
    let ctx = match symheap::Context::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return code(1);
        }
    };
    println!("{}", ctx.banner());
    let prefix = "  kernels   : ";
    let (kernels, looked) = kernel_sources(prefix);
    println!("{prefix}{kernels}");
    if verbose && !looked.is_empty() {
        println!("  NVRTC looked in:");
        for l in looked {
            println!("    {l}");
        }
    }
    if vars && ctx.my_pe() == 0 {
        println!("variables symheap reads:");
        for (name, what) in symheap::config::SYMHEAP_VARIABLES {
            println!("  {name:<24} {what}");
        }
        println!("  launcher variables: RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT (torchrun, symheap launch), OMPI_COMM_WORLD_* (Open MPI), PMI_RANK PMI_SIZE (MPICH), SLURM_PROCID SLURM_STEP_NUM_TASKS SLURM_LOCALID (srun)");
        println!(
            "  command variables: {} {} (set by the Python package's `symheap` for this executable: its interpreter and sys.path)",
            crate::selfcmd::PYTHON_VAR,
            crate::selfcmd::PYTHON_PATH_VAR
        );
    }
    match ctx.finalize() {
        Ok(()) => code(0),
        Err(e) => {
            eprintln!("{e}");
            code(1)
        }
    }
}
