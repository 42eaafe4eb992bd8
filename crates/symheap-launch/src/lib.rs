//! Starts the PEs of a job on this machine and supervises them (`symheap launch`).
//!
//! Each PE is a child process that gets a torchrun-style environment (`RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`...) plus a fresh `SYMHEAP_TOKEN`, so the runtime's bootstrap finds
//! its peers with no further configuration. The launcher's job after that is to make a failing job
//! end promptly and legibly: when one PE dies, the others are given a grace period to report the
//! failure themselves (the runtime names the dead PE), then they are stopped, and one summary line
//! names the PE that failed first and how.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use symheap::{Error, ErrorKind, Result};

fn invalid(call: &'static str, why: impl Into<String>) -> Error {
    Error::new(None, call, ErrorKind::InvalidArgument(why.into()))
}

fn backend(call: &'static str, why: impl Into<String>) -> Error {
    Error::new(None, call, ErrorKind::Backend(why.into()))
}

/// How long PEs get to end on their own after the first failure, and again after SIGTERM, unless
/// [`LaunchOptions::grace`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// How often the children are polled. Short enough that the summary follows a failure at once.
const POLL: Duration = Duration::from_millis(10);

/// Longest piece of output forwarded as one line; a longer line is split so that a PE printing
/// megabytes without a newline cannot make the launcher buffer without bound.
const MAX_LINE: u64 = 1 << 20;

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
        }
    }
}

/// How one PE's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeEnd {
    /// It exited with this status.
    Exited(i32),
    /// It was killed by this signal (not sent by the launcher's own stopping of the job; a
    /// forwarded SIGINT/SIGTERM counts as the PE's own end).
    Signaled(i32),
    /// It was still running when the launcher stopped the job, and ended after the launcher's
    /// SIGTERM or SIGKILL.
    StoppedByLauncher,
    /// It ended but its status could not be collected (something else in this process reaped
    /// it, e.g. SIGCHLD is ignored). Counted as a failure.
    Lost,
}

impl PeEnd {
    /// True for a zero exit status.
    pub fn success(&self) -> bool {
        *self == PeEnd::Exited(0)
    }

    /// The status a shell would report for a process that ended like this.
    fn shell_status(&self) -> i32 {
        match *self {
            PeEnd::Exited(c) => c,
            PeEnd::Signaled(s) => 128 + s,
            PeEnd::StoppedByLauncher | PeEnd::Lost => 1,
        }
    }

    /// The predicate of a sentence about one PE (`plural` for several).
    fn describe(&self, plural: bool) -> String {
        let was = if plural { "were" } else { "was" };
        match *self {
            PeEnd::Exited(c) => format!("exited with status {c}"),
            PeEnd::Signaled(s) => format!("{was} killed by {}", signal_desc(s)),
            PeEnd::StoppedByLauncher => format!("{was} stopped by the launcher"),
            PeEnd::Lost => "ended with an unknown status".to_string(),
        }
    }
}

impl fmt::Display for PeEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(false))
    }
}

/// How a launch went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// How each PE ended, indexed by rank.
    pub ends: Vec<PeEnd>,
    /// The PE that failed first, while the job was still running normally, and how.
    pub first_failure: Option<(usize, PeEnd)>,
    /// The signal (SIGINT or SIGTERM) the launcher received and forwarded to the PEs, if any.
    pub interrupted: Option<i32>,
}

impl LaunchOutcome {
    /// True when every PE exited with status 0 and the launcher was not interrupted.
    pub fn success(&self) -> bool {
        self.first_failure.is_none()
            && self.interrupted.is_none()
            && self.ends.iter().all(PeEnd::success)
    }

    /// The launcher's exit status, following what ended the job first: the first failure's status
    /// (128+signo if it was killed by a signal), else 128+signo of a forwarded interrupt, else 0.
    pub fn exit_code(&self) -> i32 {
        // first_failure is only recorded before the launcher starts stopping the job, so when both
        // are set the failure came first.
        if let Some((_, end)) = self.first_failure {
            end.shell_status()
        } else if let Some(sig) = self.interrupted {
            128 + sig
        } else if self.ends.iter().all(PeEnd::success) {
            0
        } else {
            1
        }
    }

    /// One line: what ended the job, then how the PEs ended, grouped. For example `PE 3 was
    /// killed by signal 9 (SIGKILL); PEs 0-2 exited with status 1`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some((pe, end)) = self.first_failure {
            parts.push(format!("PE {pe} {}", end.describe(false)));
        }
        if let Some(sig) = self.interrupted {
            let first = if parts.is_empty() { "" } else { "then " };
            parts.push(format!(
                "{first}interrupted by {} and forwarded it to the PEs",
                signal_name(sig)
            ));
        }
        if parts.is_empty() && self.ends.len() > 1 && self.ends.iter().all(PeEnd::success) {
            return format!("all {} PEs exited with status 0", self.ends.len());
        }
        // Group the rest by how they ended, in order of the lowest PE of each group.
        let mut groups: Vec<(PeEnd, Vec<usize>)> = Vec::new();
        for (pe, end) in self.ends.iter().enumerate() {
            if self.first_failure.map(|(f, _)| f) == Some(pe) {
                continue;
            }
            match groups.iter_mut().find(|(e, _)| e == end) {
                Some((_, pes)) => pes.push(pe),
                None => groups.push((*end, vec![pe])),
            }
        }
        for (end, pes) in groups {
            parts.push(format!("{} {}", pe_list(&pes), end.describe(pes.len() > 1)));
        }
        parts.join("; ")
    }
}

/// `SIGKILL`, or the number for signals without a name.
fn signal_name(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("signal {sig}"),
    }
}

/// `signal 9 (SIGKILL)`.
fn signal_desc(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => format!("signal {sig} ({})", s.as_str()),
        Err(_) => format!("signal {sig}"),
    }
}

/// `PE 3`, or `PEs 0-2, 5, 7` with runs of three or more shortened, which keeps the summary of a
/// large job on one readable line.
fn pe_list(pes: &[usize]) -> String {
    if let [pe] = pes {
        return format!("PE {pe}");
    }
    let mut items = Vec::new();
    let mut i = 0;
    while i < pes.len() {
        let mut j = i;
        while j + 1 < pes.len() && pes[j + 1] == pes[j] + 1 {
            j += 1;
        }
        if j - i >= 2 {
            items.push(format!("{}-{}", pes[i], pes[j]));
        } else {
            items.extend(pes[i..=j].iter().map(|p| p.to_string()));
        }
        i = j + 1;
    }
    format!("PEs {}", items.join(", "))
}

/// Where forwarded output and the launcher's own messages go.
type Sink = Arc<Mutex<dyn Write + Send>>;

/// Starts `opts.n` PEs of `opts.program` on this machine, waits for all of them and returns how
/// they ended. If any failed, or the launcher was interrupted, a summary line is printed to stderr.
///
/// While it runs, SIGINT and SIGTERM sent to this process are forwarded to every PE's process
/// group instead of ending this process; a second one stops the PEs with SIGKILL at once. The
/// handlers chain to the ones installed before (so Python still sees its KeyboardInterrupt), but
/// the signal-hook crate cannot reinstate a default disposition: in a process that had none, the
/// two signals are ignored after the first launch.
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
    let mut signals = Signals::new([SIGINT, SIGTERM])
        .map_err(|e| backend("launch", format!("cannot watch SIGINT and SIGTERM: {e}")))?;
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
    let port = free_port()?;
    let token = token()?;
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

/// Where `free_port` looks first: below Linux's ephemeral range (32768 and up by default),
/// from which the kernel picks the local port of every outgoing connection.
const LAUNCH_PORTS: std::ops::Range<u16> = 20000..32000;

/// A port that was free a moment ago, for rank 0's rendezvous listener (and torch's store when
/// the program starts torch.distributed itself). It comes from below the ephemeral range: a
/// port the kernel handed out by `bind(0)` is one it can also give to any outgoing connection
/// before the PE listens on it (seen: torch's TCPStore failing with EADDRINUSE). The window in
/// which another listener could take it remains; torchrun has the same one.
fn free_port() -> Result<u16> {
    let mut seed = [0u8; 2];
    let start = match getrandom::fill(&mut seed) {
        Ok(()) => u16::from_le_bytes(seed),
        Err(_) => std::process::id() as u16,
    };
    let span = LAUNCH_PORTS.end - LAUNCH_PORTS.start;
    (0..span)
        .map(|i| LAUNCH_PORTS.start + (start.wrapping_add(i)) % span)
        .find(|&p| TcpListener::bind(("0.0.0.0", p)).is_ok())
        .map(Ok)
        .unwrap_or_else(|| {
            TcpListener::bind(("127.0.0.1", 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| backend("launch", format!("cannot find a free TCP port: {e}")))
        })
}

/// The job secret every rendezvous connection must present: 32 random bytes as hex.
fn token() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| backend("launch", format!("cannot get random bytes: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes one whole line under the sink's lock. Failures are ignored: the launcher's own output
/// going away must not stop it from supervising the PEs.
fn say(sink: &Sink, line: &str) {
    let mut w = sink.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(w, "{line}");
    let _ = w.flush();
}

/// `No such file or directory`, without Rust's `(os error 2)` suffix.
fn io_reason(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => Errno::from_raw(code).desc().to_string(),
        None => e.to_string(),
    }
}

/// Copies one output stream of one PE to `sink`, a whole line per locked write so that lines of
/// different PEs never mix.
fn pump(prefix: String, src: impl Read, sink: Sink, _done: Sender<()>) {
    let mut reader = BufReader::with_capacity(64 * 1024, src);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let mut w = sink.lock().unwrap_or_else(|p| p.into_inner());
                // Keep reading even if writing fails, so the PE never blocks on a full pipe.
                let _ = w.write_all(&line).and_then(|()| w.flush());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // Dropping `_done` tells the launcher this stream is finished.
}

/// Where the job is in stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No failure yet.
    Running,
    /// A PE failed; the others may still end on their own.
    Grace,
    /// A terminating signal (SIGTERM or a forwarded one) was sent.
    Terminated,
    /// SIGKILL was sent.
    Killed,
}

/// The PEs of one launch.
struct Job<'a> {
    opts: &'a LaunchOptions,
    err: Sink,
    children: Vec<Child>,
    /// Each PE's end as its waiter thread saw it, in the order the PEs ended: the first
    /// failure is the one that really came first, even when several PEs end within one poll
    /// (a PE that fails because another died often exits a few milliseconds after it).
    exits_tx: Sender<(usize, PeEnd)>,
    exits_rx: Receiver<(usize, PeEnd)>,
    ends: Vec<Option<PeEnd>>,
    /// Whether the launcher sent this PE its own SIGTERM/SIGKILL.
    stopped: Vec<bool>,
    first_failure: Option<(usize, PeEnd)>,
    interrupted: Option<i32>,
    phase: Phase,
    deadline: Option<Instant>,
    pumps: Vec<JoinHandle<()>>,
    /// Cloned into every pump; when all clones are gone all output has been copied.
    done_tx: Option<Sender<()>>,
    done_rx: Receiver<()>,
}

impl<'a> Job<'a> {
    fn new(opts: &'a LaunchOptions, err: Sink) -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        let (exits_tx, exits_rx) = mpsc::channel();
        Job {
            opts,
            err,
            children: Vec::with_capacity(opts.n),
            exits_tx,
            exits_rx,
            ends: Vec::with_capacity(opts.n),
            stopped: Vec::with_capacity(opts.n),
            first_failure: None,
            interrupted: None,
            phase: Phase::Running,
            deadline: None,
            pumps: Vec::new(),
            done_tx: Some(done_tx),
            done_rx,
        }
    }

    fn spawn(&mut self, rank: usize, port: u16, token: &str, out: &Sink, err: &Sink) -> Result<()> {
        let opts = self.opts;
        let n = opts.n.to_string();
        let rank_s = rank.to_string();
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .stdin(Stdio::null())
            // Its own group, so that stopping a PE also stops whatever it started, and so that a
            // Ctrl-C at the terminal reaches the PEs only through the launcher.
            .process_group(0)
            .env("RANK", &rank_s)
            .env("WORLD_SIZE", &n)
            .env("LOCAL_RANK", &rank_s)
            .env("LOCAL_WORLD_SIZE", &n)
            .env("GROUP_RANK", "0")
            .env("NODE_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("SYMHEAP_TOKEN", token)
            .env("SYMHEAP_LAUNCHER", "1");
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        if opts.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = cmd.spawn().map_err(|e| {
            let which = if rank == 0 {
                String::new()
            } else {
                format!(" (PE {rank})")
            };
            invalid(
                "launch",
                format!(
                    "cannot start {}{which}: {}",
                    opts.program.to_string_lossy(),
                    io_reason(&e)
                ),
            )
        })?;
        tracing::debug!(rank, pid = child.id(), "started PE");
        self.watch_exit(rank, child.id())?;
        let streams: [(Option<Box<dyn Read + Send>>, &Sink); 2] = [
            (child.stdout.take().map(|s| Box::new(s) as _), out),
            (child.stderr.take().map(|s| Box::new(s) as _), err),
        ];
        self.children.push(child);
        self.ends.push(None);
        self.stopped.push(false);
        for (stream, sink) in streams {
            let Some(stream) = stream else { continue };
            let sink = sink.clone();
            let done = self
                .done_tx
                .clone()
                .expect("PEs are spawned before drain_output");
            let prefix = format!("[PE {rank}] ");
            let spawned = thread::Builder::new()
                .name(format!("symheap-launch-pe{rank}"))
                .spawn(move || pump(prefix, stream, sink, done));
            match spawned {
                Ok(h) => self.pumps.push(h),
                Err(e) => return Err(backend("launch", format!("cannot start a thread: {e}"))),
            }
        }
        Ok(())
    }

    /// A thread that waits for PE `pe` (process `pid`) to end and reports how, at once.
    fn watch_exit(&mut self, pe: usize, pid: u32) -> Result<()> {
        let tx = self.exits_tx.clone();
        let pid = Pid::from_raw(pid as i32);
        thread::Builder::new()
            .name(format!("symheap-launch-wait{pe}"))
            .spawn(move || {
                let end = loop {
                    match nix::sys::wait::waitpid(pid, None) {
                        Ok(WaitStatus::Exited(_, c)) => break PeEnd::Exited(c),
                        Ok(WaitStatus::Signaled(_, sig, _)) => break PeEnd::Signaled(sig as i32),
                        Ok(_) | Err(Errno::EINTR) => continue,
                        Err(e) => {
                            tracing::warn!(pe, "cannot collect the exit status of PE {pe}: {e}");
                            break PeEnd::Lost;
                        }
                    }
                };
                let _ = tx.send((pe, end));
            })
            .map(drop)
            .map_err(|e| backend("launch", format!("cannot start a thread: {e}")))
    }

    fn pgid(&self, pe: usize) -> Pid {
        // process_group(0) made each PE the leader of a group with its own pid.
        Pid::from_raw(self.children[pe].id() as i32)
    }

    /// Takes in every end the waiter threads reported, in the order the PEs ended. Returns
    /// true when PE `pe` has ended.
    fn reap(&mut self, pe: usize) -> bool {
        while let Ok((p, end)) = self.exits_rx.try_recv() {
            self.record_end(p, end);
        }
        self.ends[pe].is_some()
    }

    fn record_end(&mut self, pe: usize, end: PeEnd) {
        if self.ends[pe].is_some() {
            return;
        }
        let end = if self.stopped[pe] {
            PeEnd::StoppedByLauncher
        } else {
            end
        };
        self.ends[pe] = Some(end);
        if self.phase == Phase::Running && !end.success() {
            self.first_failure = Some((pe, end));
            self.phase = Phase::Grace;
            self.deadline = Some(Instant::now() + self.opts.grace);
            if self.ends.iter().any(Option::is_none) {
                say(
                    &self.err,
                    &format!(
                        "symheap launch: PE {pe} {}; giving the other PEs {:.1} s to exit",
                        end.describe(false),
                        self.opts.grace.as_secs_f64()
                    ),
                );
            }
        }
    }

    /// Sends `sig` to the process group of every PE still running. `by_launcher` marks them as
    /// stopped by the launcher, as opposed to a forwarded signal whose effect is the PE's own end.
    fn signal_live(&mut self, sig: Signal, by_launcher: bool) {
        for pe in 0..self.children.len() {
            // Reaping first keeps the real end of a PE that finished just before the signal.
            if self.reap(pe) {
                continue;
            }
            if by_launcher {
                self.stopped[pe] = true;
            }
            match killpg(self.pgid(pe), sig) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => tracing::warn!(pe, "cannot send {sig} to PE {pe}: {e}"),
            }
        }
    }

    fn kill_all(&mut self) {
        self.signal_live(Signal::SIGKILL, true);
        self.phase = Phase::Killed;
        self.deadline = None;
    }

    fn on_signal(&mut self, sig: i32) {
        self.interrupted.get_or_insert(sig);
        match self.phase {
            Phase::Running | Phase::Grace => {
                let name = signal_name(sig);
                say(
                    &self.err,
                    &format!("symheap launch: got {name}, forwarding it to the PEs"),
                );
                // The phase first: a PE that dies of the forwarded signal while it is being
                // sent to the others is not the job's first failure.
                self.phase = Phase::Terminated;
                match Signal::try_from(sig) {
                    Ok(s) => self.signal_live(s, false),
                    Err(_) => self.signal_live(Signal::SIGTERM, false),
                }
                self.deadline = Some(Instant::now() + self.opts.grace);
            }
            // The user insists: no more waiting.
            Phase::Terminated | Phase::Killed => self.kill_all(),
        }
    }

    fn on_deadline(&mut self) {
        match self.phase {
            Phase::Grace => {
                self.signal_live(Signal::SIGTERM, true);
                self.phase = Phase::Terminated;
                self.deadline = Some(Instant::now() + self.opts.grace);
            }
            Phase::Terminated => self.kill_all(),
            Phase::Running | Phase::Killed => self.deadline = None,
        }
    }

    /// Waits until every PE has ended, stopping the job on the first failure or on a signal.
    fn run(&mut self, signals: &Receiver<i32>) {
        loop {
            let mut all = true;
            for pe in 0..self.children.len() {
                all &= self.reap(pe);
            }
            if all {
                return;
            }
            match signals.recv_timeout(POLL) {
                Ok(sig) => self.on_signal(sig),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => thread::sleep(POLL),
            }
            while let Ok(sig) = signals.try_recv() {
                self.on_signal(sig);
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                self.on_deadline();
            }
        }
    }

    /// Waits for PEs already sent SIGKILL, where run() was not used.
    fn reap_blocking(&mut self) {
        while self.ends.iter().any(Option::is_none) {
            match self.exits_rx.recv() {
                Ok((pe, _)) if self.ends[pe].is_none() => {
                    self.ends[pe] = Some(PeEnd::StoppedByLauncher);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }

    /// Waits until the PEs' output has been copied. A process a PE left behind can hold the pipes
    /// open after the PE ended; it is in the PE's process group unless it escaped it, so after a
    /// while that group is killed, and if even that does not close the pipes the copying threads
    /// are left to finish on their own rather than hanging the launcher.
    fn drain_output(&mut self) {
        self.done_tx = None;
        let wait = self.opts.grace.max(Duration::from_millis(200));
        let mut finished = wait_closed(&self.done_rx, wait);
        if !finished {
            for pe in 0..self.children.len() {
                // The group cannot have been recycled while its members hold our pipes.
                let _ = killpg(self.pgid(pe), Signal::SIGKILL);
            }
            finished = wait_closed(&self.done_rx, Duration::from_secs(1));
        }
        if finished {
            for h in self.pumps.drain(..) {
                let _ = h.join();
            }
        } else {
            self.pumps.clear();
            say(
                &self.err,
                "symheap launch: a process outside the PEs still holds their output open; not waiting for it",
            );
        }
    }

    fn outcome(&self) -> LaunchOutcome {
        LaunchOutcome {
            ends: self.ends.iter().map(|e| e.unwrap_or(PeEnd::Lost)).collect(),
            first_failure: self.first_failure,
            interrupted: self.interrupted,
        }
    }
}

/// True once every sender of `rx` is gone, false if `wait` passes first.
fn wait_closed(rx: &Receiver<()>, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Disconnected) => return true,
            Err(RecvTimeoutError::Timeout) => return false,
            Ok(()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Buf = Arc<Mutex<Vec<u8>>>;

    fn sh(n: usize, script: &str, grace_ms: u64) -> LaunchOptions {
        let mut o = LaunchOptions::new(n, "/bin/sh");
        o.args = vec!["-c".into(), script.into()];
        o.grace = Duration::from_millis(grace_ms);
        o
    }

    fn sinks() -> (Buf, Buf, Sink, Sink) {
        let out: Buf = Arc::default();
        let err: Buf = Arc::default();
        (out.clone(), err.clone(), out, err)
    }

    fn text(b: &Buf) -> String {
        String::from_utf8_lossy(&b.lock().unwrap()).into_owned()
    }

    fn run(opts: &LaunchOptions) -> (LaunchOutcome, String, String) {
        let (out, err, o, e) = sinks();
        let outcome = launch_with_output(opts, o, e).expect("launch");
        (outcome, text(&out), text(&err))
    }

    #[test]
    fn launch_ports_stay_below_the_ephemeral_range_and_are_free() {
        let held: Vec<TcpListener> = (0..20)
            .map(|_| {
                let p = free_port().expect("a port");
                assert!(LAUNCH_PORTS.contains(&p), "port {p}");
                // Free when chosen: this test can listen on it (and holds it, so the next
                // choice must differ).
                TcpListener::bind(("0.0.0.0", p)).expect("the chosen port is free")
            })
            .collect();
        let ports: std::collections::HashSet<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert_eq!(ports.len(), held.len());
    }

    #[test]
    fn every_pe_gets_the_environment_and_a_prefix() {
        let mut opts = sh(
            4,
            r#"echo "hello $RANK of $WORLD_SIZE"
               echo "env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK $MASTER_ADDR $MASTER_PORT $SYMHEAP_TOKEN $SYMHEAP_LAUNCHER $EXTRA"
               echo "to stderr" >&2"#,
            300,
        );
        opts.env.push(("EXTRA".into(), "extra-value".into()));
        let (outcome, out, err) = run(&opts);
        assert!(outcome.success(), "{outcome:?} {err}");
        assert_eq!(outcome.exit_code(), 0);
        assert_eq!(outcome.ends, vec![PeEnd::Exited(0); 4]);
        assert_eq!(outcome.summary(), "all 4 PEs exited with status 0");
        assert!(err.lines().all(|l| l.starts_with("[PE ")), "{err}");

        let mut ports = Vec::new();
        let mut tokens = Vec::new();
        for r in 0..4 {
            let hello = format!("[PE {r}] hello {r} of 4");
            assert_eq!(out.lines().filter(|l| *l == hello).count(), 1, "{out}");
            assert_eq!(
                err.lines()
                    .filter(|l| *l == format!("[PE {r}] to stderr"))
                    .count(),
                1
            );
            let env = out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("[PE {r}] env ")))
                .expect("env line");
            let f: Vec<&str> = env.split(' ').collect();
            assert_eq!(f.len(), 11, "{env}");
            assert_eq!(f[0], r.to_string());
            assert_eq!(f[1], r.to_string());
            assert_eq!(&f[2..8], ["4", "4", "0", "0", "127.0.0.1", f[7]]);
            assert!(f[7].parse::<u16>().unwrap() > 0);
            assert_eq!(f[8].len(), 64);
            assert!(f[8].bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(&f[9..], ["1", "extra-value"]);
            ports.push(f[7].to_string());
            tokens.push(f[8].to_string());
        }
        assert!(ports.iter().all(|p| *p == ports[0]));
        assert!(tokens.iter().all(|t| *t == tokens[0]));
    }

    #[test]
    fn a_killed_pe_stops_the_others() {
        let opts = sh(
            4,
            r#"if [ "$RANK" = 2 ]; then kill -9 $$; fi; sleep 30"#,
            300,
        );
        let t = Instant::now();
        let (outcome, _, err) = run(&opts);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(outcome.first_failure, Some((2, PeEnd::Signaled(9))));
        assert_eq!(
            outcome.ends,
            [
                PeEnd::StoppedByLauncher,
                PeEnd::StoppedByLauncher,
                PeEnd::Signaled(9),
                PeEnd::StoppedByLauncher
            ]
        );
        assert_eq!(outcome.exit_code(), 137);
        assert_eq!(outcome.interrupted, None);
        let summary = outcome.summary();
        assert_eq!(
            summary,
            "PE 2 was killed by signal 9 (SIGKILL); PEs 0, 1, 3 were stopped by the launcher"
        );
        assert!(
            err.contains(&format!("symheap launch: {summary}\n")),
            "{err}"
        );
    }

    #[test]
    fn the_first_failing_exit_status_is_the_exit_code() {
        let opts = sh(3, r#"if [ "$RANK" = 1 ]; then exit 3; fi"#, 2000);
        let (outcome, _, err) = run(&opts);
        assert_eq!(outcome.first_failure, Some((1, PeEnd::Exited(3))));
        assert_eq!(outcome.exit_code(), 3);
        assert_eq!(
            outcome.summary(),
            "PE 1 exited with status 3; PEs 0, 2 exited with status 0"
        );
        assert!(err.contains("PE 1 exited with status 3"), "{err}");
    }

    #[test]
    fn pes_ending_on_their_own_in_the_grace_period_keep_their_real_end() {
        // PE 0 fails at once; the others notice and fail within the grace period, except PE 3,
        // which ignores it all (and SIGTERM) and must be killed.
        let opts = sh(
            4,
            r#"case $RANK in
                 0) exit 5;;
                 1) sleep 0.2; exit 7;;
                 2) sleep 0.2; kill -ABRT $$;;
                 3) trap "" TERM; sleep 30;;
               esac"#,
            700,
        );
        let t = Instant::now();
        let (outcome, _, _) = run(&opts);
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        assert_eq!(outcome.first_failure, Some((0, PeEnd::Exited(5))));
        assert_eq!(
            outcome.ends,
            [
                PeEnd::Exited(5),
                PeEnd::Exited(7),
                PeEnd::Signaled(6),
                PeEnd::StoppedByLauncher
            ]
        );
        assert_eq!(outcome.exit_code(), 5);
        assert_eq!(
            outcome.summary(),
            "PE 0 exited with status 5; PE 1 exited with status 7; \
             PE 2 was killed by signal 6 (SIGABRT); PE 3 was stopped by the launcher"
        );
    }

    #[test]
    fn partial_lines_and_raw_bytes_are_forwarded() {
        let mut opts = sh(2, r#"printf 'partial\377line'; printf 'x\ny' >&2"#, 300);
        opts.prefix_output = true;
        let (out, err, o, e) = sinks();
        let outcome = launch_with_output(&opts, o, e).unwrap();
        assert!(outcome.success());
        let out = out.lock().unwrap().clone();
        let err = err.lock().unwrap().clone();
        for r in 0..2 {
            let mut want = format!("[PE {r}] partial").into_bytes();
            want.push(0xff);
            want.extend_from_slice(b"line\n");
            assert!(out.windows(want.len()).any(|w| w == want), "{out:?}");
            let x = format!("[PE {r}] x\n").into_bytes();
            let y = format!("[PE {r}] y\n").into_bytes();
            assert!(err.windows(x.len()).any(|w| w == x), "{err:?}");
            assert!(err.windows(y.len()).any(|w| w == y), "{err:?}");
        }
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 2);
    }

    #[test]
    fn lines_of_different_pes_do_not_mix() {
        let opts = sh(
            4,
            r#"i=0; while [ $i -lt 200 ]; do echo "$RANK-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-$RANK"; i=$((i+1)); done"#,
            300,
        );
        let (outcome, out, _) = run(&opts);
        assert!(outcome.success());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 800);
        for l in lines {
            let r = &l[4..5];
            assert_eq!(
                l,
                format!("[PE {r}] {r}-{}-{r}", "a".repeat(62)),
                "mixed line"
            );
        }
    }

    #[test]
    fn a_missing_program_is_named() {
        let opts = LaunchOptions::new(2, "/nonexistent/symheap-no-such-program");
        let (_, _, o, e) = sinks();
        let err = launch_with_output(&opts, o, e).unwrap_err().to_string();
        assert!(
            err.contains(
                "cannot start /nonexistent/symheap-no-such-program: No such file or directory"
            ),
            "{err}"
        );

        let opts = LaunchOptions::new(0, "/bin/true");
        let (_, _, o, e) = sinks();
        let err = launch_with_output(&opts, o, e).unwrap_err().to_string();
        assert!(err.contains("at least 1"), "{err}");
    }

    #[test]
    fn an_interrupt_is_forwarded_then_escalated() {
        // PE 0 handles SIGTERM and exits cleanly, PE 1 dies of it, PE 2 ignores it and is
        // killed after the grace period.
        let opts = sh(
            3,
            r#"case $RANK in
                 0) trap "echo caught; exit 0" TERM; sleep 30 & wait;;
                 1) sleep 30;;
                 2) trap "" TERM; sleep 30;;
               esac"#,
            300,
        );
        let (out, err, o, e) = sinks();
        let (tx, rx) = mpsc::channel();
        let sender = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            tx.send(SIGTERM).unwrap();
            // Keep the channel open: a closed one must not look like an interrupt.
            thread::sleep(Duration::from_secs(2));
        });
        let t = Instant::now();
        let outcome = supervise(&opts, o, e, &rx).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(outcome.interrupted, Some(SIGTERM));
        assert_eq!(outcome.first_failure, None);
        assert_eq!(
            outcome.ends,
            [
                PeEnd::Exited(0),
                PeEnd::Signaled(15),
                PeEnd::StoppedByLauncher
            ]
        );
        assert_eq!(outcome.exit_code(), 143);
        let out = text(&out);
        let err = text(&err);
        assert!(out.contains("[PE 0] caught\n"), "{out}");
        assert!(err.contains("got SIGTERM, forwarding it"), "{err}");
        assert!(
            err.contains(
                "symheap launch: interrupted by SIGTERM and forwarded it to the PEs; \
                 PE 0 exited with status 0; PE 1 was killed by signal 15 (SIGTERM); \
                 PE 2 was stopped by the launcher"
            ),
            "{err}"
        );
        drop(sender);
    }

    #[test]
    fn pe_lists_shorten_runs() {
        assert_eq!(pe_list(&[3]), "PE 3");
        assert_eq!(pe_list(&[0, 1]), "PEs 0, 1");
        assert_eq!(pe_list(&[0, 1, 2, 5, 7, 8, 9, 10]), "PEs 0-2, 5, 7-10");
        assert_eq!(signal_desc(11), "signal 11 (SIGSEGV)");
        assert_eq!(signal_desc(77), "signal 77");
    }
}
