//! The benchmark's scratch folder (`$TMPDIR/symheap-bench-<pid>`: the PEs' results, the MPI
//! peer, the chart's data) and the programs it runs, so that neither outlives the benchmark
//! however it ends: a return or an error removes the folder on drop, and SIGTERM, SIGINT or
//! SIGHUP is forwarded to the program running (`symheap launch` stops its PEs, mpirun its ranks)
//! before the folder is removed and the benchmark exits with 128 + the signal.
//!
//! Why a watcher thread and not the default disposition: a signal used to end the process
//! where it stood, leaving the folder behind in /tmp.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// How long the programs running get to stop after the forwarded signal (`symheap launch`
/// gives its PEs twice its 3 s grace) before the folder is removed anyway.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// What a signal has to clean up.
struct State {
    /// Scratch folders alive.
    dirs: Vec<PathBuf>,
    /// Programs running (process ids).
    children: Vec<u32>,
    /// A signal arrived: start nothing more.
    stopping: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    dirs: Vec::new(),
    children: Vec::new(),
    stopping: false,
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the watcher thread once; the error says why signals cannot be watched.
fn watch_signals() -> Result<(), String> {
    static WATCHING: OnceLock<Result<(), String>> = OnceLock::new();
    WATCHING
        .get_or_init(|| {
            let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
                .map_err(|e| format!("cannot watch for SIGTERM/SIGINT/SIGHUP: {e}"))?;
            std::thread::Builder::new()
                .name("bench-signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        stop(sig);
                    }
                })
                .map(|_| ())
                .map_err(|e| format!("cannot start the signal watcher: {e}"))
        })
        .clone()
}

/// Forwards `sig` to the programs running, waits for them ([`STOP_WAIT`] at most), removes the
/// scratch folders and exits with 128 + `sig`.
fn stop(sig: i32) -> ! {
    let children = {
        let mut s = state();
        s.stopping = true;
        s.children.clone()
    };
    let name = Signal::try_from(sig)
        .map(|s| s.as_str())
        .unwrap_or("a signal");
    eprintln!("bench: interrupted by {name}: stopping and removing the scratch folder");
    if let Ok(signal) = Signal::try_from(sig) {
        for pid in &children {
            let _ = kill(Pid::from_raw(*pid as i32), signal);
        }
    }
    let t0 = Instant::now();
    while !state().children.is_empty() && t0.elapsed() < STOP_WAIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dirs = state().dirs.clone();
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    std::process::exit(128 + sig)
}

/// The scratch folder of this benchmark run, removed on drop and on a signal.
pub(crate) struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Creates `$TMPDIR/symheap-bench-<pid>` (emptied first if a run with the same process id
    /// left one) and starts watching for signals.
    pub(crate) fn new() -> Result<Scratch, String> {
        watch_signals()?;
        let path = std::env::temp_dir().join(format!("symheap-bench-{}", std::process::id()));
        // Registered before it exists: a signal from here on removes it.
        state().dirs.push(path.clone());
        let scratch = Scratch { path };
        let _ = std::fs::remove_dir_all(&scratch.path);
        std::fs::create_dir_all(&scratch.path)
            .map_err(|e| format!("cannot create {}: {e}", scratch.path.display()))?;
        Ok(scratch)
    }

    /// The folder.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        state().dirs.retain(|d| d != &self.path);
    }
}

/// A running program's entry with the signal watcher, removed once it has been waited for.
struct Registered(u32);

impl Drop for Registered {
    fn drop(&mut self) {
        state().children.retain(|p| *p != self.0);
    }
}

/// Once a signal arrived, the watcher ends the process: the benchmark's own thread waits for
/// that rather than carry on with a step that was stopped (and print it as a result).
fn halt() -> ! {
    loop {
        std::thread::park();
    }
}

fn halt_if_stopping() {
    if state().stopping {
        halt();
    }
}

fn spawn(cmd: &mut Command) -> io::Result<(Child, Registered)> {
    let mut s = state();
    if s.stopping {
        drop(s);
        halt();
    }
    // Spawned under the lock, so a signal either sees it or keeps it from starting.
    let child = cmd.spawn()?;
    let id = child.id();
    s.children.push(id);
    Ok((child, Registered(id)))
}

/// `cmd.status()`, with the program stopped by a signal to the benchmark.
pub(crate) fn status(cmd: &mut Command) -> io::Result<ExitStatus> {
    let (mut child, registered) = spawn(cmd)?;
    let r = child.wait();
    drop(registered);
    halt_if_stopping();
    r
}

/// `cmd.output()` (stdin closed, stdout and stderr captured), with the program stopped by a
/// signal to the benchmark.
pub(crate) fn output(cmd: &mut Command) -> io::Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (child, registered) = spawn(cmd)?;
    let r = child.wait_with_output();
    drop(registered);
    halt_if_stopping();
    r
}
