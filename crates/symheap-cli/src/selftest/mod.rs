//! `symheap selftest`: runs the multi-PE scenarios under `symheap launch` at several PE counts
//! and checks each outcome exactly. The same binary is the PE program (`selftest-pe`), so an
//! installed `symheap` can check itself on a new machine.

/// Returns `Err(format!(...))` from the enclosing scenario function when `$cond` is false
/// (defined before the scenario modules so that all of them see it).
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

mod alias_scenarios;
mod alltoallv_scenarios;
mod coll_scenarios;
mod diverge_scenarios;
mod eager_scenarios;
mod gpu_scenarios;
mod judge;
mod nodes_scenarios;
mod ops_scenarios;
mod provider_scenarios;
mod safety_scenarios;
mod scenarios;
mod sound_scenarios;
mod stream_scenarios;
mod team_ranks_scenarios;
mod team_scenarios;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use judge::{all_skipped, case_problems};
use scenarios::{Outcome, PeArgs};
use symheap::Context;

/// How a scenario must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Every PE prints PASS; the launcher exits 0.
    AllPass,
    /// The victim dies by SIGKILL; every other PE prints PASS; the launcher names the victim.
    VictimKilled,
}

/// One scenario.
pub struct Scenario {
    /// Name on the command line.
    pub name: &'static str,
    /// One line on what it checks.
    pub about: &'static str,
    min_pes: usize,
    env: &'static [(&'static str, &'static str)],
    expect: Expect,
    /// Runs again with the victim at PE 0 (the rendezvous root) as well as the last PE.
    victims: bool,
    /// Only meaningful on the CUDA backend: runs only with `--gpu`.
    gpu: bool,
    run: fn(&Context, PeArgs) -> Outcome,
}

/// Every scenario, in the order the suite runs them.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "contract",
        about: "peer tables, shared per-peer offsets, cross-allocation translation, growth",
        min_pes: 1,
        env: &[("SYMHEAP_CHUNK_SIZE", "1M")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: scenarios::contract,
    },
    Scenario {
        name: "release",
        about: "release in different orders and threads, reuse, no leak, agreed reclaim",
        min_pes: 1,
        env: &[("SYMHEAP_CHUNK_SIZE", "4M")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: scenarios::release,
    },
    Scenario {
        name: "alloc-churn",
        about: "allocate/release alternating on a full heap: one chunk of headroom, few syncs",
        min_pes: 1,
        env: &[("SYMHEAP_CHUNK_SIZE", "8M")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: scenarios::alloc_churn,
    },
    Scenario {
        name: "bad-input",
        about: "invalid arguments and out-of-memory are errors on every PE; context stays usable",
        min_pes: 1,
        env: &[
            ("SYMHEAP_HEAP_CAPACITY", "64M"),
            ("SYMHEAP_CHUNK_SIZE", "4M"),
        ],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: scenarios::bad_input,
    },
    Scenario {
        name: "mismatch",
        about: "diverging allocations fail every PE with the first differing call named",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: scenarios::mismatch,
    },
    Scenario {
        name: "diverge",
        about: "a random program, one PE diverging at a random step: named within 1 s, else exact",
        min_pes: 1,
        env: &[("SYMHEAP_TIMEOUT", "30"), ("SYMHEAP_CHUNK_SIZE", "4M")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: diverge_scenarios::diverge_random,
    },
    Scenario {
        name: "kill",
        about: "a PE killed with SIGKILL makes every other PE fail naming it",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::VictimKilled,
        victims: true,
        gpu: false,
        run: scenarios::kill,
    },
    Scenario {
        name: "timeout",
        about: "a PE late past SYMHEAP_TIMEOUT is named by every PE's timeout error",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "2")],
        expect: Expect::AllPass,
        victims: true,
        gpu: false,
        run: scenarios::timeout,
    },
    Scenario {
        name: "ring",
        about: "ring put and get, blocking and non-blocking, typed and byte forms",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: ops_scenarios::ring,
    },
    Scenario {
        name: "alltoall",
        about: "alltoall: PE p receives peer*100+p, then random blocks",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_scenarios::alltoall,
    },
    Scenario {
        name: "alltoallv",
        about: "uneven alltoall: split sizes and device counts, host and stream forms, random splits with zeros: exact; disagreements refused on every PE",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: alltoallv_scenarios::alltoallv,
    },
    Scenario {
        name: "broadcast",
        about: "broadcast from every root (in and out of place), all_gather",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_scenarios::broadcast,
    },
    Scenario {
        name: "all-reduce",
        about: "all_reduce and reduce_scatter against a sequential reference, every op and dtype",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_scenarios::all_reduce,
    },
    Scenario {
        name: "coll-alias",
        about: "in-place collectives exact through host and stream forms, no false mismatch; other overlaps refused naming both ranges",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: alias_scenarios::coll_alias,
    },
    Scenario {
        name: "atomics",
        about: "contended fetch_add counter, the whole atomics matrix with exact values",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: ops_scenarios::atomics,
    },
    Scenario {
        name: "lock",
        about: "compare_swap spin lock protecting a counter updated with get and put",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: ops_scenarios::lock,
    },
    Scenario {
        name: "signal",
        about: "put_signal producer/consumer over many rounds; every wait comparison",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: ops_scenarios::signal,
    },
    Scenario {
        name: "put-wake",
        about: "a put wakes a PE asleep on its bytes at the putter's quiet, and within a nap without one",
        min_pes: 2,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: ops_scenarios::put_wake,
    },
    Scenario {
        name: "teams",
        about: "split, INVALID non-members, nesting, translate_pe, team collectives, destroy",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_scenarios::teams,
    },
    Scenario {
        name: "teams-any",
        about: "splits by lists of ranks in any order: membership, translate_pe, every collective, nested, errors, slot reuse",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_ranks_scenarios::teams_any,
    },
    Scenario {
        name: "team-ranks-mismatch",
        about: "a split by a list that one PE passes in another order is named on every PE",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_ranks_scenarios::team_ranks_mismatch,
    },
    Scenario {
        name: "team-from-ranks",
        about: "teams made by their members alone (two groups at once, any order): every collective, nested, slots",
        min_pes: 1,
        env: &[("SYMHEAP_TIMEOUT", "60")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_ranks_scenarios::team_from_ranks,
    },
    Scenario {
        name: "team-from-ranks-errors",
        about: "teams made by their members alone: different lists named on every member, bad lists, bad exchanges",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "60")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_ranks_scenarios::team_from_ranks_errors,
    },
    Scenario {
        name: "team-from-ranks-deadlock",
        about: "a deadlock between a team made by its members and the world, named with the team's members in order",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_ranks_scenarios::team_from_ranks_deadlock,
    },
    Scenario {
        name: "coll-errors",
        about: "collective argument errors; diverging collectives named on every PE",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_scenarios::coll_errors,
    },
    Scenario {
        name: "team-mismatch",
        about: "diverging calls inside a sub-team are named; the non-member is not held up",
        min_pes: 3,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: team_scenarios::team_mismatch,
    },
    Scenario {
        name: "eager",
        about: "small broadcasts whose root does not wait: bursts past the slot limit, rotating roots, sub-teams, in place: exact",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: eager_scenarios::eager,
    },
    Scenario {
        name: "eager-diverge",
        about: "two PEs each the root of one small broadcast, then finalize: a named mismatch on every PE within 1 s",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: eager_scenarios::eager_diverge,
    },
    Scenario {
        name: "stream-ring",
        about: "put and get on a stream with the SM and copy engines, odd sizes and offsets",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: stream_scenarios::stream_ring,
    },
    Scenario {
        name: "stream-signal",
        about:
            "put_signal / signal_wait_until on streams: data complete whenever the signal is seen",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: stream_scenarios::stream_signal,
    },
    Scenario {
        name: "stream-barrier",
        about: "barrier_all_on_stream orders every PE's stream work",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: stream_scenarios::stream_barrier,
    },
    Scenario {
        name: "stream-timeout",
        about: "an unsatisfied device-side wait is reported as a timeout; the context survives",
        min_pes: 1,
        env: &[("SYMHEAP_TIMEOUT", "2")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: stream_scenarios::stream_timeout,
    },
    Scenario {
        name: "release-order",
        about: "a buffer released while a stream still writes it is reused only after that",
        min_pes: 1,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: safety_scenarios::release_order,
    },
    Scenario {
        name: "multi-stream",
        about: "one team's collectives from 2-4 streams in random order, eager and graph: exact",
        min_pes: 1,
        env: &[("SYMHEAP_TIMEOUT", "20")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: safety_scenarios::multi_stream,
    },
    Scenario {
        name: "device-divergence",
        about: "different stream collectives on one PE: a named mismatch on every PE within 1 s",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "30")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: safety_scenarios::device_divergence,
    },
    Scenario {
        name: "kill-device",
        about: "a PE killed while the others wait for it on the device: named within 2 s",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "120")],
        expect: Expect::VictimKilled,
        victims: true,
        gpu: true,
        run: safety_scenarios::kill_device,
    },
    Scenario {
        name: "kill-nodes",
        about: "kill-device across 2 simulated nodes: the survivors' NCCL steps are aborted, the victim named within 2 s",
        min_pes: 2,
        env: &[("SYMHEAP_TIMEOUT", "120"), ("SYMHEAP_SIMULATE_NODES", "2")],
        expect: Expect::VictimKilled,
        victims: true,
        gpu: true,
        run: safety_scenarios::kill_device,
    },
    Scenario {
        name: "coll-local",
        about: "stream collectives take plain device buffers where the kernel stays local (one-shot, exchange), refuse them elsewhere",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: sound_scenarios::coll_local,
    },
    Scenario {
        name: "local-ranges",
        about: "stream copies refuse host memory, unmapped addresses and ranges past a device buffer",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: sound_scenarios::local_ranges,
    },
    Scenario {
        name: "internal-state",
        about: "raw-address calls cannot reach symheap's own device state",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: safety_scenarios::internal_state,
    },
    Scenario {
        name: "protocols-pcie",
        about: "SYMHEAP_TOPOLOGY=pcie turns LL128 off on every PE; collectives stay exact",
        min_pes: 1,
        env: &[("SYMHEAP_TOPOLOGY", "pcie")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: safety_scenarios::protocols_pcie,
    },
    Scenario {
        name: "protocols-nvlink",
        about: "SYMHEAP_TOPOLOGY=nvlink on a verified GPU turns LL128 on; collectives exact",
        min_pes: 1,
        env: &[("SYMHEAP_TOPOLOGY", "nvlink")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: safety_scenarios::protocols_nvlink,
    },
    Scenario {
        name: "kernel-translate",
        about: "a kernel writes every peer's copy of B through A's device peer table",
        min_pes: 1,
        env: &[("SYMHEAP_CHUNK_SIZE", "64M")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: gpu_scenarios::kernel_translate,
    },
    Scenario {
        name: "kernel-atomics",
        about: "atomics from kernels on peers' memory: exact totals, distinct fetched values",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: gpu_scenarios::kernel_atomics,
    },
    Scenario {
        name: "example-kernel",
        about: "examples/cuda/ring_put.cu: put_block + signal_add + signal_wait_until in a kernel",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: gpu_scenarios::example_kernel,
    },
    Scenario {
        name: "provider-native",
        about: "the contract through the Provider trait on the native heap; NVSHMEM refused clearly",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: provider_scenarios::provider_native,
    },
    Scenario {
        name: "providers",
        about: "one kernel over native-heap and NVSHMEM buffers (each, and mixed), cross-allocation tables",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: provider_scenarios::providers,
    },
    Scenario {
        name: "coll-stream",
        about: "every collective on a stream, dtype, size class, in and out of place, world and sub-team",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: coll_scenarios::coll_stream,
    },
    Scenario {
        name: "coll-nodes",
        about: "the world across 2 simulated nodes: every collective (hierarchical or NCCL), graph replays, node teams, refusals",
        min_pes: 2,
        env: &[("SYMHEAP_SIMULATE_NODES", "2")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: nodes_scenarios::coll_nodes,
    },
    Scenario {
        name: "teams-nodes",
        about: "splits of the world across 2 simulated nodes (NCCL on GPUs; Open MPI on the host, under mpirun): every collective, barriers, divergence",
        min_pes: 2,
        env: &[("SYMHEAP_SIMULATE_NODES", "2")],
        expect: Expect::AllPass,
        victims: false,
        gpu: false,
        run: nodes_scenarios::teams_nodes,
    },
    Scenario {
        name: "coll-nodes-nccl",
        about: "coll-nodes with SYMHEAP_NODES_ALGO=nccl: every collective through NCCL over the world",
        min_pes: 2,
        env: &[("SYMHEAP_SIMULATE_NODES", "2"), ("SYMHEAP_NODES_ALGO", "nccl")],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: nodes_scenarios::coll_nodes,
    },
    Scenario {
        name: "coll-graph",
        about: "all_reduces and push broadcasts captured in a CUDA graph stay exact over many replays",
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: coll_scenarios::coll_graph,
    },
    Scenario {
        name: "coll-nccl",
        about: "GPU collectives agree with NCCL for every op, dtype and size class",
        // One PE too: NCCL runs at one rank, so a machine of one GPU still checks the loading
        // and the comparison (NCCL refuses two ranks on one GPU).
        min_pes: 1,
        env: &[],
        expect: Expect::AllPass,
        victims: false,
        gpu: true,
        run: coll_scenarios::coll_nccl,
    },
];

/// What a PE prints when its scenario passed.
const PASS: &str = "SELFTEST-PASS";
/// What a PE prints when its scenario cannot run on this machine (with the reason).
const SKIP: &str = "SELFTEST-SKIP";

/// Why scenario `name` cannot run on this machine (every PE reaches the same answer), or None.
/// A skip is reported with its reason and is not a pass: the runner counts it apart.
fn not_here(name: &str, ctx: &Context) -> Result<Option<String>, String> {
    match name {
        "coll-nccl" => coll_scenarios::nccl_not_here(ctx),
        _ => Ok(None),
    }
}

/// PE mode: initialise, run one scenario, report. Returns the process exit code.
pub fn run_pe(name: &str, seed: u64, victim: usize) -> i32 {
    let Some(s) = SCENARIOS.iter().find(|s| s.name == name) else {
        eprintln!("unknown scenario {name:?}");
        return 2;
    };
    let ctx = match Context::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SELFTEST-FAIL {name}: init: {e}");
            return 1;
        }
    };
    let me = ctx.my_pe();
    let victim = victim.min(ctx.n_pes() - 1);
    match not_here(name, &ctx) {
        Ok(None) => {}
        Ok(Some(why)) => {
            println!("{SKIP} {name} PE {me}: {why}");
            return 0;
        }
        Err(msg) => {
            eprintln!("SELFTEST-FAIL {name} PE {me}: {msg}");
            return 1;
        }
    }
    match (s.run)(&ctx, PeArgs { seed, victim }) {
        Ok(()) => {
            println!("{PASS} {name} PE {me}");
            0
        }
        Err(msg) => {
            eprintln!("SELFTEST-FAIL {name} PE {me}: {msg}");
            1
        }
    }
}

/// One run's verdict.
struct Verdict {
    label: String,
    ok: bool,
    /// Every PE said the scenario cannot run here, and why (the first PE's words).
    skipped: Option<String>,
    secs: f64,
    detail: String,
}

/// The name a run is reported under: runs that pick a victim say which PE it was.
fn case_label(s: &Scenario, victim: usize) -> String {
    if s.victims || s.expect == Expect::VictimKilled {
        format!("{} (victim PE {victim})", s.name)
    } else {
        s.name.to_string()
    }
}

/// `symheap launch` of `n` PEs running scenario `s`, its output piped back for judging.
fn case_command(
    s: &Scenario,
    n: usize,
    victim: usize,
    seed: u64,
    gpu: bool,
    exe: &[std::ffi::OsString],
) -> std::process::Command {
    let mut cmd = crate::selfcmd::command();
    cmd.arg("launch")
        .arg("-n")
        .arg(n.to_string())
        .arg("--")
        .args(exe)
        .arg("selftest-pe")
        .arg(s.name)
        .arg("--seed")
        .arg(seed.to_string())
        .arg("--victim")
        .arg(victim.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in s.env {
        cmd.env(k, v);
    }
    if gpu {
        cmd.env("SYMHEAP_BACKEND", "cuda");
        // The driver layer's release log (a CUDA object released after its context went, see
        // judge::released_late), unless the user chose what to log.
        if std::env::var_os("SYMHEAP_LOG").is_none() {
            cmd.env("SYMHEAP_LOG", judge::RELEASE_LOG);
        }
    }
    cmd
}

/// Reads `r` to the end on a thread of its own: while the caller waits for the launcher to
/// exit, a pipe nobody read would fill and stall it.
fn read_in_background(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// The launcher's exit status, or None when it ran past `limit` from `t0` (then it is killed)
/// or could not be waited for.
fn wait_within(
    child: &mut std::process::Child,
    t0: Instant,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if t0.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break None,
        }
    }
}

/// One run of `s` on `n` PEs under `symheap launch`, judged.
fn run_case(s: &Scenario, n: usize, victim: usize, seed: u64, gpu: bool) -> Verdict {
    let exe = crate::selfcmd::argv();
    let label = case_label(s, victim);
    let t0 = Instant::now();
    let mut cmd = case_command(s, n, victim, seed, gpu, &exe);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Verdict {
                label,
                ok: false,
                skipped: None,
                secs: 0.0,
                detail: format!("cannot start {:?}: {e}", exe),
            }
        }
    };
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let to = read_in_background(out);
    let te = read_in_background(err);
    // Nothing in the suite should take this long; a hang is a failure, not a stuck CI.
    let limit = Duration::from_secs(180);
    let status = wait_within(&mut child, t0, limit);
    let stdout = to.join().unwrap_or_default();
    let stderr = te.join().unwrap_or_default();
    let secs = t0.elapsed().as_secs_f64();
    let skipped = all_skipped(s, n, status, &stdout);
    let problems = if skipped.is_some() {
        Vec::new()
    } else {
        case_problems(s, n, victim, status, limit, &stdout, &stderr)
    };
    Verdict {
        label,
        ok: problems.is_empty(),
        skipped,
        secs,
        detail: if problems.is_empty() {
            String::new()
        } else {
            format!(
                "{}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
                problems.join("; ")
            )
        },
    }
}

/// Which scenarios a run takes: `only` (comma separated) or all, less `skip`.
pub struct Selection<'a> {
    /// Only these scenarios, when given.
    pub only: Option<&'a str>,
    /// Not these (e.g. `coll-nccl` where NCCL cannot run: several PEs on one GPU).
    pub skip: Option<&'a str>,
}

/// Runner mode: every selected scenario at every PE count. Returns the process exit code.
/// With `gpu`, every PE runs on the CUDA backend and the GPU-only scenarios are included.
pub fn run_suite(pes: &[usize], sel: &Selection<'_>, seed: u64, gpu: bool) -> i32 {
    let listed =
        |list: Option<&str>, name: &str| list.is_some_and(|l| l.split(',').any(|x| x == name));
    let only = sel.only;
    let selected: Vec<&Scenario> = SCENARIOS
        .iter()
        .filter(|s| gpu || !s.gpu)
        .filter(|s| only.is_none() || listed(only, s.name))
        .filter(|s| !listed(sel.skip, s.name))
        .collect();
    if selected.is_empty() {
        eprintln!(
            "no scenario matches {only:?}; known: {}",
            SCENARIOS
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
        return 2;
    }
    println!(
        "symheap selftest on the {} backend, seed {seed} (rerun with --seed {seed})",
        if gpu { "cuda" } else { "host" }
    );
    let mut failures = 0;
    let mut skips = 0;
    let mut rows = Vec::new();
    for s in selected {
        for &n in pes {
            if n < s.min_pes {
                continue;
            }
            let victims: Vec<usize> = if s.victims && n > 1 {
                vec![n - 1, 0]
            } else {
                vec![n - 1]
            };
            for v in victims {
                let verdict = run_case(s, n, v, seed, gpu);
                let result = match (&verdict.skipped, verdict.ok) {
                    (Some(why), _) => format!("skipped: {why}"),
                    (None, true) => "pass".to_string(),
                    (None, false) => "FAIL".to_string(),
                };
                eprintln!(
                    "  {:<28} {n} PEs  {:>6.2} s  {}",
                    verdict.label,
                    verdict.secs,
                    if verdict.ok { &result } else { "FAILED" }
                );
                if !verdict.ok {
                    failures += 1;
                    eprintln!("{}", verdict.detail);
                }
                skips += usize::from(verdict.skipped.is_some());
                rows.push((verdict.label, n, result, verdict.secs));
            }
        }
    }
    println!("| scenario | PEs | result | seconds |");
    println!("|---|---|---|---|");
    for (label, n, result, secs) in &rows {
        println!("| {label} | {n} | {result} | {secs:.2} |");
    }
    let ran = rows.len() - skips;
    println!("{} of {ran} runs passed", ran - failures);
    if skips > 0 {
        println!("skipped: {skips} (the table gives each reason)");
    }
    if ran == 0 && skips > 0 {
        // Only skips: nothing was checked, which is not a pass either.
        eprintln!("no runs: every selected scenario was skipped on this machine");
        return 2;
    }
    if rows.is_empty() {
        // A run of nothing is not a pass: every selected scenario needs more PEs than given.
        eprintln!("no runs: the selected scenarios need more PEs than --pes {pes:?}");
        return 2;
    }
    i32::from(failures > 0)
}
