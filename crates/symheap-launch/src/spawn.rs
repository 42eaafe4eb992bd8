//! Starting one PE: the rendezvous port and job token every PE is given, the process with its
//! torchrun-style environment, and the thread that reports at once how it ended.

use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Sender;
use std::thread;

use nix::errno::Errno;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;
use symheap::Result;

use crate::{backend, invalid, LaunchOptions, PeEnd};

/// Where `free_port` looks first: below Linux's ephemeral range (32768 and up by default),
/// from which the kernel picks the local port of every outgoing connection.
const LAUNCH_PORTS: std::ops::Range<u16> = 20000..32000;

/// A port that was free a moment ago, for rank 0's rendezvous listener (and torch's store when
/// the program starts torch.distributed itself). It comes from below the ephemeral range: a
/// port the kernel handed out by `bind(0)` is one it can also give to any outgoing connection
/// before the PE listens on it (seen: torch's TCPStore failing with EADDRINUSE). The window in
/// which another listener could take it remains; torchrun has the same one.
pub(crate) fn free_port() -> Result<u16> {
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
pub(crate) fn token() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| backend("launch", format!("cannot get random bytes: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `No such file or directory`, without Rust's `(os error 2)` suffix.
fn io_reason(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => Errno::from_raw(code).desc().to_string(),
        None => e.to_string(),
    }
}

/// Starts PE `rank` of `opts.program` in its own process group, with its output piped when it
/// is to be prefixed.
pub(crate) fn start(opts: &LaunchOptions, rank: usize, port: u16, token: &str) -> Result<Child> {
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
    // NVSHMEM reads its settings from the environment, which symheap never changes inside a
    // running program; its defaults for symheap's jobs go in here instead: never NVLink
    // multicast, and (one node) no network transport to probe. A value already set is kept.
    for (k, v) in [
        ("NVSHMEM_DISABLE_NVLS", "1"),
        ("NVSHMEM_REMOTE_TRANSPORT", "none"),
    ] {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
    if opts.simulate_nodes > 0 {
        let node = crate::simulated_node(rank, opts.n, opts.simulate_nodes);
        cmd.env("SYMHEAP_NODE_ID", format!("simulated-node-{node}"))
            .env(
                "NCCL_HOSTID",
                format!("symheap-simulated-node-{node}-pe-{rank}"),
            );
        for (k, v) in [("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1")] {
            if std::env::var_os(k).is_none() {
                cmd.env(k, v);
            }
        }
    }
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    if opts.prefix_output {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    die_with_launcher(&mut cmd);
    let child = cmd.spawn().map_err(|e| {
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
    Ok(child)
}

/// Makes the PE get SIGKILL when the launcher dies, however it dies: a launcher killed with
/// SIGKILL (or by the OOM killer) runs no handler, and a PE in its own process group gets no
/// terminal signal either, so without this its PEs ran on as orphans (seen: 4 of 4 alive 30 s
/// after the launcher's SIGKILL). SIGKILL, not SIGTERM: nobody is left to escalate to SIGKILL for
/// a PE that ignores SIGTERM, and nobody reads its output any more.
///
/// The kernel sends the signal when the *thread* that forked the child exits, so PEs must be
/// spawned from the thread that supervises them until they end, as `supervise` does.
fn die_with_launcher(cmd: &mut Command) {
    let launcher = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: prctl(2), getppid(2) and raise(3) are, and it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            // The launcher may have died between fork and the prctl: then no signal will come.
            if nix::unistd::getppid() != launcher {
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            Ok(())
        });
    }
}

/// A thread that waits for PE `pe` (process `pid`) to end and reports how on `tx`, at once.
pub(crate) fn watch_exit(pe: usize, pid: u32, tx: Sender<(usize, PeEnd)>) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch_with_output;
    use crate::test_util::{run, sh, sinks};

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
    fn nvshmem_defaults_reach_every_pe_unless_set() {
        let opts = sh(
            2,
            r#"echo "nv $NVSHMEM_DISABLE_NVLS $NVSHMEM_REMOTE_TRANSPORT""#,
            300,
        );
        let (outcome, out, err) = run(&opts);
        assert!(outcome.success(), "{outcome:?} {err}");
        // What the launcher's own environment already says wins.
        let want = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
        let line = format!(
            "nv {} {}",
            want("NVSHMEM_DISABLE_NVLS", "1"),
            want("NVSHMEM_REMOTE_TRANSPORT", "none")
        );
        for r in 0..2 {
            let expect = format!("[PE {r}] {line}");
            assert!(out.lines().any(|l| l == expect), "{out}");
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
}
