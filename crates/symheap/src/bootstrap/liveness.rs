//! Noticing that a PE on this node died, for rendezvous that have no connection that closes
//! when a PE's process ends (a key-value store, a communicator).
//!
//! Every PE publishes its [`ProcId`]: where its pid means something (the kernel's boot id and
//! the PID namespace) and which process it is (pid and start time, so a reused pid is not taken
//! for the PE). A [`PeerWatch`] holds the PEs that share this PE's node and PID namespace and
//! tells, within a poll, when one of their processes ended: through a pidfd (readable once
//! the process exits) where the kernel has `pidfd_open`, by reading `/proc/PID/stat` at every
//! poll otherwise. PEs elsewhere are not watched here; their node's PEs see them.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Which process a PE is, and where that identity holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcId {
    /// Boot id and PID namespace: pids compare only between equal scopes.
    pub scope: String,
    /// The process id in that namespace.
    pub pid: i32,
    /// The process's start time (clock ticks since boot, `/proc/PID/stat` field 22).
    pub start: u64,
}

/// Field `n` (1-based, as in proc(5)) of a `/proc/PID/stat` line, from field 3 on.
fn stat_field(stat: &str, n: usize) -> Option<&str> {
    // The command name in parentheses may hold spaces: the fields after it are fixed.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n - 3)
}

/// What `/proc/PID/stat` says of a process: its state letter and start time.
fn proc_state(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat_field(&stat, 3)?.chars().next()?;
    let start = stat_field(&stat, 22)?.parse().ok()?;
    Some((state, start))
}

impl ProcId {
    /// This process, or None where its identity cannot be told (no `/proc`, or a `/proc` of
    /// another PID namespace, whose pids would name other processes).
    pub fn me() -> Option<ProcId> {
        let pid = i32::try_from(std::process::id()).ok()?;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        if stat.split_whitespace().next()?.parse::<i32>().ok()? != pid {
            return None;
        }
        let start = stat_field(&stat, 22)?.parse().ok()?;
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let boot = boot.trim();
        if boot.is_empty() {
            return None;
        }
        Some(ProcId {
            scope: format!("{boot}/{}", ns.display()),
            pid,
            start,
        })
    }

    /// The bytes another PE reads back with [`ProcId::decode`].
    pub fn encode(&self) -> Vec<u8> {
        format!("{} {} {}", self.pid, self.start, self.scope).into_bytes()
    }

    /// Reads [`ProcId::encode`]'s bytes; None for anything else (a PE that could not tell).
    pub fn decode(raw: &[u8]) -> Option<ProcId> {
        let text = std::str::from_utf8(raw).ok()?;
        let mut it = text.splitn(3, ' ');
        let pid = it.next()?.parse().ok()?;
        let start = it.next()?.parse().ok()?;
        let scope = it.next()?.to_string();
        (pid > 0 && !scope.is_empty()).then_some(ProcId { scope, pid, start })
    }

    /// The process is still the one this identity names, and has not ended (a zombie has).
    fn alive(&self) -> bool {
        matches!(proc_state(self.pid), Some((s, start)) if start == self.start && s != 'Z' && s != 'X')
    }
}

/// A PE watched from this one.
struct Watched {
    rank: usize,
    id: ProcId,
    /// A pidfd of the PE's process; None where `pidfd_open` is not available.
    fd: Option<OwnedFd>,
}

/// The PEs of this node (and PID namespace) whose end this PE notices.
pub struct PeerWatch {
    peers: Vec<Watched>,
    /// A PE already gone when the watch was made.
    gone: Option<usize>,
}

/// A pidfd of `pid`, or None (no such process, or no `pidfd_open` in this kernel).
fn pidfd(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it reads
    // and writes no memory of this process.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|&f| f >= 0)?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nothing else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl PeerWatch {
    /// The PEs in `ids` (every PE's published identity, by rank; None where a PE could not
    /// tell) that share this PE's scope, `me` excluded. Without an identity of its own this
    /// PE watches nothing.
    pub fn new(ids: &[Option<ProcId>], me: usize) -> PeerWatch {
        let mut w = PeerWatch {
            peers: Vec::new(),
            gone: None,
        };
        let Some(Some(mine)) = ids.get(me) else {
            return w;
        };
        for (rank, id) in ids.iter().enumerate() {
            let Some(id) = id.clone().filter(|i| rank != me && i.scope == mine.scope) else {
                continue;
            };
            let fd = pidfd(id.pid);
            // Checked after opening: a pidfd opened on a reused pid names another process,
            // whose start time differs.
            if !id.alive() {
                w.gone.get_or_insert(rank);
                continue;
            }
            w.peers.push(Watched { rank, id, fd });
        }
        w
    }

    /// How many PEs are watched.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// True when no PE is watched from here.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty() && self.gone.is_none()
    }

    /// Waits up to `dt` for a watched PE's process to end; returns that PE and how it was
    /// seen, or None if all still run.
    pub fn wait(&mut self, dt: Duration) -> Option<(usize, String)> {
        if let Some(r) = self.gone.take() {
            return Some((
                r,
                "its process had ended when this PE began watching it".into(),
            ));
        }
        if self.peers.is_empty() {
            std::thread::sleep(dt);
            return None;
        }
        let with_fd: Vec<&Watched> = self.peers.iter().filter(|p| p.fd.is_some()).collect();
        if with_fd.len() == self.peers.len() {
            let mut fds: Vec<PollFd<'_>> = with_fd
                .iter()
                .filter_map(|p| p.fd.as_ref())
                .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
                .collect();
            let ms = u16::try_from(dt.as_millis()).unwrap_or(u16::MAX);
            // EINTR and the like: the next call polls again.
            let _ = poll(&mut fds, PollTimeout::from(ms));
            let ready = fds.iter().position(|f| {
                f.revents()
                    .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP))
            });
            if let Some(i) = ready {
                let p = with_fd[i];
                return Some((
                    p.rank,
                    format!("its process {} on this node ended", p.id.pid),
                ));
            }
            return None;
        }
        std::thread::sleep(dt);
        self.peers.iter().find(|p| !p.id.alive()).map(|p| {
            (
                p.rank,
                format!("its process {} on this node ended", p.id.pid),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Instant;

    /// The first exit `w` sees, waiting at most 5 s.
    fn first_exit(w: &mut PeerWatch) -> Option<(usize, String)> {
        let t0 = Instant::now();
        let mut seen = None;
        while seen.is_none() && t0.elapsed() < Duration::from_secs(5) {
            seen = w.wait(Duration::from_millis(200));
        }
        seen
    }

    fn id_of(pid: u32) -> ProcId {
        let me = ProcId::me().expect("this test needs /proc");
        let (_, start) = proc_state(pid as i32).expect("child's stat");
        ProcId {
            scope: me.scope,
            pid: pid as i32,
            start,
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let me = ProcId::me().expect("this test needs /proc");
        assert_eq!(ProcId::decode(&me.encode()), Some(me.clone()));
        assert_eq!(ProcId::decode(b""), None);
        assert_eq!(ProcId::decode(b"12 x y"), None);
        assert!(me.alive());
    }

    #[test]
    fn a_child_that_exits_is_seen_at_once() {
        let mut child = Command::new("sleep")
            .arg("0.3")
            .spawn()
            .expect("spawn sleep");
        let ids = vec![ProcId::me(), Some(id_of(child.id()))];
        let mut w = PeerWatch::new(&ids, 0);
        assert_eq!(w.len(), 1);
        let t0 = Instant::now();
        let seen = first_exit(&mut w);
        // The child is a zombie until reaped: its end is seen before the wait.
        let (rank, how) = seen.expect("the exit was not seen");
        assert_eq!(rank, 1);
        assert!(how.contains(&child.id().to_string()), "{how}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        child.wait().expect("reap");
    }

    #[test]
    fn without_pidfds_proc_sees_the_exit() {
        let mut child = Command::new("sleep")
            .arg("0.3")
            .spawn()
            .expect("spawn sleep");
        let ids = vec![ProcId::me(), Some(id_of(child.id()))];
        let mut w = PeerWatch::new(&ids, 0);
        // As on a kernel without pidfd_open.
        for p in &mut w.peers {
            p.fd = None;
        }
        assert_eq!(w.wait(Duration::from_millis(1)), None);
        let t0 = Instant::now();
        let seen = first_exit(&mut w);
        assert_eq!(seen.map(|s| s.0), Some(1));
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        child.wait().expect("reap");
    }

    #[test]
    fn a_reused_or_other_scope_pid_is_not_taken_for_the_pe() {
        let mut child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let mut wrong = id_of(child.id());
        wrong.start += 1;
        let mut other = id_of(child.id());
        other.scope.push_str("-elsewhere");
        let mut w = PeerWatch::new(&[ProcId::me(), Some(wrong), Some(other)], 0);
        assert_eq!(w.len(), 0);
        let (rank, _) = w.wait(Duration::from_millis(1)).expect("reused pid");
        assert_eq!(rank, 1);
        assert_eq!(w.wait(Duration::from_millis(1)), None);
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn without_an_identity_nothing_is_watched() {
        let w = PeerWatch::new(&[None, ProcId::me()], 0);
        assert!(w.is_empty());
    }
}
