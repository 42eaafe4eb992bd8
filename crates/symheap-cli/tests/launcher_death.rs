//! The PEs of `symheap launch` never outlive it: killed with SIGKILL (no handler runs) or hung
//! up on (SIGHUP, a closed terminal), the launcher takes its PEs with it within a second.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const SYMHEAP: &str = env!("CARGO_BIN_EXE_symheap");
const PES: usize = 4;

/// A fresh directory for the PEs' pid files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("symheap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `symheap launch` of PEs that write their pid, then sleep silently for a minute.
fn launch_sleepers(dir: &Path) -> Child {
    Command::new(SYMHEAP)
        .args(["launch", "-n", &PES.to_string(), "--", "/bin/sh", "-c"])
        .arg(format!(
            "echo $$ > {}/pe$RANK.tmp && mv {0}/pe$RANK.tmp {0}/pe$RANK && exec sleep 60",
            dir.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start symheap launch")
}

/// The PEs' pids, once every PE has written its own.
fn pe_pids(dir: &Path) -> Vec<Pid> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let pids: Vec<Pid> = (0..PES)
            .filter_map(|r| std::fs::read_to_string(dir.join(format!("pe{r}"))).ok())
            .filter_map(|s| s.trim().parse().ok())
            .map(Pid::from_raw)
            .collect();
        if pids.len() == PES {
            return pids;
        }
        assert!(Instant::now() < until, "the PEs did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` still runs: a zombie (dead, waiting for a parent to reap it) does not.
fn running(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Sends `sig` to the launcher and checks that no PE runs 2 s later.
fn no_pe_outlives(name: &str, sig: Signal) {
    let dir = scratch(name);
    let mut launcher = launch_sleepers(&dir);
    let pids = pe_pids(&dir);
    assert!(pids.iter().all(|&p| running(p)));
    kill(Pid::from_raw(launcher.id() as i32), sig).unwrap();
    let _ = launcher.wait();
    let until = Instant::now() + Duration::from_secs(2);
    let mut left: Vec<Pid> = pids.clone();
    while !left.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
        left.retain(|&p| running(p));
    }
    for &p in &left {
        let _ = kill(p, Signal::SIGKILL);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        left.is_empty(),
        "PEs {left:?} of {pids:?} still ran 2 s after the launcher got {sig}"
    );
}

#[test]
fn pes_die_with_a_launcher_killed_by_sigkill() {
    no_pe_outlives("sigkill", Signal::SIGKILL);
}

#[test]
fn pes_die_with_a_launcher_hung_up_on() {
    no_pe_outlives("sighup", Signal::SIGHUP);
}
