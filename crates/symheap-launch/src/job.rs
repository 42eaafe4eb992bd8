//! Supervising the PEs of one launch: collecting their ends in the order they happen, and
//! stopping the job on the first failure or on a signal (grace period, SIGTERM, SIGKILL).

use std::io::Read;
use std::process::Child;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use symheap::Result;

use crate::outcome::signal_name;
use crate::output::{say, start_pump, wait_closed, Sink};
use crate::{spawn, LaunchOptions, LaunchOutcome, PeEnd};

/// How often the children are polled. Short enough that the summary follows a failure at once.
const POLL: Duration = Duration::from_millis(10);

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
pub(crate) struct Job<'a> {
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
    pub(crate) fn new(opts: &'a LaunchOptions, err: Sink) -> Self {
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

    /// Starts PE `rank`, the thread that waits for it to end and those that forward its output.
    pub(crate) fn spawn(
        &mut self,
        rank: usize,
        port: u16,
        token: &str,
        out: &Sink,
        err: &Sink,
    ) -> Result<()> {
        let mut child = spawn::start(self.opts, rank, port, token)?;
        spawn::watch_exit(rank, child.id(), self.exits_tx.clone())?;
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
            self.pumps.push(start_pump(rank, stream, sink, done)?);
        }
        Ok(())
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

    pub(crate) fn kill_all(&mut self) {
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
    pub(crate) fn run(&mut self, signals: &Receiver<i32>) {
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
    pub(crate) fn reap_blocking(&mut self) {
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
    pub(crate) fn drain_output(&mut self) {
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

    pub(crate) fn outcome(&self) -> LaunchOutcome {
        LaunchOutcome {
            ends: self.ends.iter().map(|e| e.unwrap_or(PeEnd::Lost)).collect(),
            first_failure: self.first_failure,
            interrupted: self.interrupted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervise;
    use crate::test_util::{run, sh, sinks, text};
    use signal_hook::consts::SIGTERM;

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
}
