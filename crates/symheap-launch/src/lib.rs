//! Starts the PEs of a job on this machine and supervises them (`symheap launch`).
//!
//! Each PE is a child process that gets a torchrun-style environment (`RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`...) plus a fresh `SYMHEAP_TOKEN`, so the runtime's bootstrap finds
//! its peers with no further configuration. The launcher's job after that is to make a failing job
//! end promptly and legibly: when one PE dies, the others are given a grace period to report the
//! failure themselves (the runtime names the dead PE), then they are stopped, and one summary line
//! names the PE that failed first and how.

mod job;
mod outcome;
mod output;
mod spawn;

use std::ffi::OsString;
use std::io;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use symheap::{Error, ErrorKind, Result};

use job::Job;
pub use outcome::{LaunchOutcome, PeEnd};
use output::{say, Sink};

fn invalid(call: &'static str, why: impl Into<String>) -> Error {
    Error::new(None, call, ErrorKind::InvalidArgument(why.into()))
}

fn backend(call: &'static str, why: impl Into<String>) -> Error {
    Error::new(None, call, ErrorKind::Backend(why.into()))
}

/// How long PEs get to end on their own after the first failure, and again after SIGTERM, unless
/// [`LaunchOptions::grace`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// What to start and how.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Number of PEs (at least 1).
    pub n: usize,
    /// Program every PE runs; looked up in `PATH` like a shell would.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment for every PE, applied last, so it may override the launcher's variables.
    pub env: Vec<(String, String)>,
    /// After the first PE fails (or the launcher is interrupted), how long the others get to end
    /// on their own before SIGTERM, and then again before SIGKILL.
    pub grace: Duration,
    /// Prefix every line the PEs print with `[PE r] `. When false the PEs write straight to the
    /// launcher's stdout and stderr.
    pub prefix_output: bool,
    /// Split the PEs into this many simulated nodes (0: `SYMHEAP_SIMULATE_NODES`, else none):
    /// see [`simulated_node`].
    pub simulate_nodes: usize,
}

/// `opts` with `simulate_nodes` taken from `SYMHEAP_SIMULATE_NODES` when the options leave it
/// at 0, and checked (1 to `n` nodes).
fn with_simulated_nodes(opts: &LaunchOptions) -> Result<LaunchOptions> {
    let mut o = opts.clone();
    if o.simulate_nodes == 0 {
        if let Ok(v) = std::env::var("SYMHEAP_SIMULATE_NODES") {
            if !v.trim().is_empty() {
                o.simulate_nodes = v.trim().parse().map_err(|_| {
                    invalid(
                        "launch",
                        format!("SYMHEAP_SIMULATE_NODES={v:?} is not a number of nodes"),
                    )
                })?;
            }
        }
    }
    if o.simulate_nodes > o.n {
        return Err(invalid(
            "launch",
            format!(
                "{} simulated nodes for {} PEs: expected 1 to {} (the number of PEs)",
                o.simulate_nodes, o.n, o.n
            ),
        ));
    }
    Ok(o)
}

/// The simulated node of PE `rank` of `n` split into `k` nodes: consecutive ranks, as even as
/// possible (`rank × k / n`). Such a PE gets `SYMHEAP_NODE_ID=simulated-node-<node>`, so it
/// maps no memory of PEs on other simulated nodes, and `NCCL_HOSTID` of its own, so NCCL takes
/// every PE for a host of its own and connects them over its network transport (on the
/// loopback interface, `NCCL_SOCKET_IFNAME=lo`, unless set) even when they share a GPU; NCCL
/// then uses no NVLink or shared memory between PEs of one simulated node either.
pub fn simulated_node(rank: usize, n: usize, k: usize) -> usize {
    rank * k / n.max(1)
}

impl LaunchOptions {
    /// Options for `n` PEs of `program` with no arguments, the default grace and prefixed output.
    pub fn new(n: usize, program: impl Into<OsString>) -> Self {
        LaunchOptions {
            n,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            grace: DEFAULT_GRACE,
            prefix_output: true,
            simulate_nodes: 0,
        }
    }
}

/// Starts `opts.n` PEs of `opts.program` on this machine, waits for all of them and returns how
/// they ended. If any failed, or the launcher was interrupted, a summary line is printed to stderr.
///
/// While it runs, SIGINT, SIGTERM and SIGHUP sent to this process are forwarded to every PE's
/// process group instead of ending this process; a second one stops the PEs with SIGKILL at once.
/// The handlers chain to the ones installed before (so Python still sees its KeyboardInterrupt),
/// but the signal-hook crate cannot reinstate a default disposition: in a process that had none,
/// the three signals are ignored after the first launch. A launcher that dies without running
/// a handler (SIGKILL, the OOM killer) takes its PEs with it: each PE gets SIGKILL from the
/// kernel (its parent-death signal).
///
/// Errors: `n == 0`, a program that cannot be started, or no way to set up the supervision.
pub fn launch(opts: &LaunchOptions) -> Result<LaunchOutcome> {
    let out: Sink = Arc::new(Mutex::new(io::stdout()));
    let err: Sink = Arc::new(Mutex::new(io::stderr()));
    launch_with_output(opts, out, err)
}

/// [`launch`] writing the PEs' prefixed output and the launcher's messages to `out` and `err`.
pub(crate) fn launch_with_output(
    opts: &LaunchOptions,
    out: Sink,
    err: Sink,
) -> Result<LaunchOutcome> {
    if opts.n == 0 {
        return Err(invalid("launch", "the number of PEs must be at least 1"));
    }
    let opts = &with_simulated_nodes(opts)?;
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| {
        backend(
            "launch",
            format!("cannot watch SIGINT, SIGTERM and SIGHUP: {e}"),
        )
    })?;
    let handle = signals.handle();
    let (tx, rx) = mpsc::channel();
    let watcher = thread::Builder::new()
        .name("symheap-launch-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| backend("launch", format!("cannot start a thread: {e}")))?;
    let result = supervise(opts, out, err, &rx);
    // Closing also unregisters the handlers once the watcher drops `signals`.
    handle.close();
    let _ = watcher.join();
    result
}

/// The body of a launch, with the received signals coming from `signals` so that tests can
/// interrupt a launch without signalling the whole test process.
fn supervise(
    opts: &LaunchOptions,
    out: Sink,
    err: Sink,
    signals: &Receiver<i32>,
) -> Result<LaunchOutcome> {
    let port = spawn::free_port()?;
    let token = spawn::token()?;
    let mut job = Job::new(opts, err.clone());
    for rank in 0..opts.n {
        if let Err(e) = job.spawn(rank, port, &token, &out, &err) {
            job.kill_all();
            job.reap_blocking();
            job.drain_output();
            return Err(e);
        }
    }
    job.run(signals);
    job.drain_output();
    let outcome = job.outcome();
    if !outcome.success() {
        say(&err, &format!("symheap launch: {}", outcome.summary()));
    }
    Ok(outcome)
}

/// What the tests of every module share: a launch of `/bin/sh` PEs into buffers.
#[cfg(test)]
mod test_util {
    use super::*;

    pub(crate) type Buf = Arc<Mutex<Vec<u8>>>;

    pub(crate) fn sh(n: usize, script: &str, grace_ms: u64) -> LaunchOptions {
        let mut o = LaunchOptions::new(n, "/bin/sh");
        o.args = vec!["-c".into(), script.into()];
        o.grace = Duration::from_millis(grace_ms);
        o
    }

    pub(crate) fn sinks() -> (Buf, Buf, Sink, Sink) {
        let out: Buf = Arc::default();
        let err: Buf = Arc::default();
        (out.clone(), err.clone(), out, err)
    }

    pub(crate) fn text(b: &Buf) -> String {
        String::from_utf8_lossy(&b.lock().unwrap()).into_owned()
    }

    pub(crate) fn run(opts: &LaunchOptions) -> (LaunchOutcome, String, String) {
        let (out, err, o, e) = sinks();
        let outcome = launch_with_output(opts, o, e).expect("launch");
        (outcome, text(&out), text(&err))
    }
}

#[cfg(test)]
mod simulated_nodes_tests {
    use super::test_util::{run, sh};
    use super::*;

    #[test]
    fn simulated_nodes_are_runs_of_consecutive_ranks_as_even_as_possible() {
        let nodes = |n: usize, k: usize| -> Vec<usize> {
            (0..n).map(|r| simulated_node(r, n, k)).collect()
        };
        assert_eq!(nodes(4, 2), [0, 0, 1, 1]);
        assert_eq!(nodes(3, 2), [0, 0, 1]);
        assert_eq!(nodes(8, 3), [0, 0, 0, 1, 1, 1, 2, 2]);
        assert_eq!(nodes(2, 2), [0, 1]);
        assert_eq!(nodes(5, 1), [0; 5]);
    }

    #[test]
    fn each_pe_gets_its_node_id_and_an_nccl_host_of_its_own() {
        let mut o = sh(4, "echo \"$RANK $SYMHEAP_NODE_ID $NCCL_HOSTID\"", 500);
        o.simulate_nodes = 2;
        let (outcome, out, err) = run(&o);
        assert!(outcome.success(), "{err}");
        for (r, node) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
            let line =
                format!("[PE {r}] {r} simulated-node-{node} symheap-simulated-node-{node}-pe-{r}");
            assert!(out.contains(&line), "{line} missing from:\n{out}");
        }
    }

    #[test]
    fn more_simulated_nodes_than_pes_are_refused() {
        let mut o = sh(2, "true", 500);
        o.simulate_nodes = 3;
        let (_, _, o2, e2) = super::test_util::sinks();
        let e = launch_with_output(&o, o2, e2).expect_err("3 nodes for 2 PEs");
        assert!(e.to_string().contains("expected 1 to 2"), "{e}");
    }
}
