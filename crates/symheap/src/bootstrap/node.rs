//! Node membership and the node-local file-descriptor channel.
//!
//! PEs on one node share physical memory by passing the file descriptors of their memory chunks
//! (memfd on the host backend, CUDA VMM POSIX handles on the GPU backend) over Unix sockets with
//! SCM_RIGHTS. The node leader (lowest rank on the node) listens on a socket inside a directory
//! only this user can enter, admits only connections from the same uid that present the job
//! token, and unlinks the socket as soon as its node is complete, so no other job or user can
//! reach it afterwards.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    getsockopt, recvmsg, sendmsg, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
};

use super::Bootstrap;
use crate::error::{bootstrap, Error, ErrorKind, Result};
use crate::util::fnv1a;

/// Where this PE sits among the nodes of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// This node's identity string (hostname and boot id, or `SYMHEAP_NODE_ID`).
    pub node_id: String,
    /// Index of this node, in order of each node's lowest rank.
    pub node_index: usize,
    /// Number of nodes in the job.
    pub node_count: usize,
    /// Node index of every PE.
    pub node_of: Vec<usize>,
    /// Global ranks of the PEs on this node, ascending.
    pub local_peers: Vec<usize>,
    /// This PE's position in `local_peers`.
    pub local_rank: usize,
}

impl NodeInfo {
    /// Number of PEs on this node.
    pub fn local_size(&self) -> usize {
        self.local_peers.len()
    }

    /// Collective: exchanges node identities over `boot`.
    pub fn discover(boot: &dyn Bootstrap) -> Result<NodeInfo> {
        let me = node_identity();
        let all = boot.all_gather("node discovery", me.as_bytes())?;
        let ids: Vec<String> = all
            .into_iter()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect();
        Ok(Self::from_ids(&ids, boot.rank()))
    }

    /// Groups PEs by identity; pure, so it is tested directly.
    pub fn from_ids(ids: &[String], rank: usize) -> NodeInfo {
        let mut order: Vec<&String> = Vec::new();
        let node_of: Vec<usize> = ids
            .iter()
            .map(|id| match order.iter().position(|o| *o == id) {
                Some(i) => i,
                None => {
                    order.push(id);
                    order.len() - 1
                }
            })
            .collect();
        let node_index = node_of[rank];
        let local_peers: Vec<usize> = (0..ids.len())
            .filter(|&r| node_of[r] == node_index)
            .collect();
        let local_rank = local_peers.iter().position(|&r| r == rank).unwrap_or(0);
        NodeInfo {
            node_id: ids[rank].clone(),
            node_index,
            node_count: order.len(),
            node_of,
            local_peers,
            local_rank,
        }
    }
}

/// Hostname plus the kernel's boot id: two PEs share memory only if both match.
fn node_identity() -> String {
    if let Ok(v) = std::env::var("SYMHEAP_NODE_ID") {
        if !v.is_empty() {
            return v;
        }
    }
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{host}/{}", boot.trim())
}

/// The channel over which PEs of one node pass file descriptors.
pub struct NodeChannel {
    local_rank: usize,
    local_size: usize,
    rank: usize,
    /// World rank of every PE of this node, by local rank.
    peers: Vec<usize>,
    timeout: Duration,
    /// On the leader: one stream per other local PE, by local rank (index 0 unused).
    /// Elsewhere: one stream to the leader at index 0.
    streams: Vec<Option<UnixStream>>,
}

const HELLO_MAGIC: &[u8; 4] = b"SHfd";
/// SCM_RIGHTS carries at most 253 descriptors per message on Linux; stay below it.
const FDS_PER_MESSAGE: usize = 200;

fn nerr(what: impl std::fmt::Display) -> Error {
    bootstrap("node channel", what.to_string())
}

/// The PE at the other end of a stream, before [`peer_gone`] names it.
const UNKNOWN_PEER: usize = usize::MAX;

/// The other end of a node-channel stream closed: the PE there died (or is dying).
fn closed(what: impl std::fmt::Display) -> Error {
    Error::new(
        None,
        "node channel",
        ErrorKind::PeerExited {
            peer: UNKNOWN_PEER,
            how: format!("its node channel to this PE closed: {what}"),
        },
    )
}

/// Names the PE behind a [`closed`] stream, so every survivor is told which PE died rather
/// than given a socket error; other errors pass unchanged.
fn peer_gone(peer: usize, e: Error) -> Error {
    match e.kind() {
        ErrorKind::PeerExited {
            peer: UNKNOWN_PEER,
            how,
        } => Error::new(
            None,
            "node channel",
            ErrorKind::PeerExited {
                peer,
                how: how.clone(),
            },
        ),
        _ => e,
    }
}

impl NodeChannel {
    /// Collective over `boot` (every PE of the job calls it). Connects the PEs of each node.
    pub fn connect(boot: &dyn Bootstrap, node: &NodeInfo, token: &[u8]) -> Result<NodeChannel> {
        Self::connect_node(boot, node, token).map_err(|e| settle(boot, boot.rank(), e))
    }

    fn connect_node(boot: &dyn Bootstrap, node: &NodeInfo, token: &[u8]) -> Result<NodeChannel> {
        let rank = boot.rank();
        let timeout = boot.timeout();
        let leader = node.local_rank == 0;
        let mut listener = None;
        let mut path = PathBuf::new();
        if leader && node.local_size() > 1 {
            let dir = super::unix::runtime_dir()?;
            super::unix::remove_stale_sockets(&dir);
            path = dir.join(format!(
                "{:016x}-{}-{}.sock",
                fnv1a(token),
                rank,
                std::process::id()
            ));
            super::unix::check_path_len(&path)?;
            let _ = std::fs::remove_file(&path);
            let l = UnixListener::bind(&path)
                .map_err(|e| nerr(format!("bind {}: {e}", path.display())))?;
            l.set_nonblocking(true).map_err(nerr)?;
            listener = Some(l);
        }
        let paths = boot.all_gather("node channel", path.as_os_str().as_encoded_bytes())?;
        let leader_rank = node.local_peers[0];
        let leader_path = PathBuf::from(String::from_utf8_lossy(&paths[leader_rank]).into_owned());
        let mut streams: Vec<Option<UnixStream>> =
            (0..node.local_size().max(1)).map(|_| None).collect();
        let deadline = Instant::now() + timeout;
        if let Some(l) = listener {
            let result = Self::accept_all(&l, node, token, &mut streams, deadline, boot);
            let _ = std::fs::remove_file(&path);
            result?;
        } else if !leader {
            let s = Self::dial(&leader_path, deadline, boot)?;
            let mut hello = HELLO_MAGIC.to_vec();
            hello.extend_from_slice(&(node.local_rank as u32).to_le_bytes());
            hello.extend_from_slice(&(token.len() as u32).to_le_bytes());
            hello.extend_from_slice(token);
            (&s).write_all(&hello)
                .map_err(|e| nerr(format!("hello to node leader: {e}")))?;
            let mut ack = [0u8; 1];
            s.set_read_timeout(Some(timeout)).map_err(nerr)?;
            (&s).read_exact(&mut ack).map_err(|e| {
                nerr(format!(
                    "node leader (PE {leader_rank}) refused or did not answer: {e}"
                ))
            })?;
            streams[0] = Some(s);
        }
        // Everyone is connected before anyone uses the channel.
        boot.barrier("node channel ready")?;
        Ok(NodeChannel {
            local_rank: node.local_rank,
            local_size: node.local_size(),
            rank,
            peers: node.local_peers.clone(),
            timeout,
            streams,
        })
    }

    fn dial(path: &Path, deadline: Instant, boot: &dyn Bootstrap) -> Result<UnixStream> {
        loop {
            match UnixStream::connect(path) {
                Ok(s) => return Ok(s),
                Err(e) => {
                    boot.check()?;
                    if Instant::now() >= deadline {
                        return Err(nerr(format!(
                            "cannot reach node leader at {}: {e}",
                            path.display()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    fn accept_all(
        l: &UnixListener,
        node: &NodeInfo,
        token: &[u8],
        streams: &mut [Option<UnixStream>],
        deadline: Instant,
        boot: &dyn Bootstrap,
    ) -> Result<()> {
        let me = nix::unistd::getuid().as_raw();
        let mut admitted = 1;
        while admitted < node.local_size() {
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(nerr)?;
                    s.set_read_timeout(Some(Duration::from_secs(10)))
                        .map_err(nerr)?;
                    let uid = getsockopt(&s, sockopt::PeerCredentials)
                        .map(|c| c.uid())
                        .unwrap_or(u32::MAX);
                    if uid != me {
                        tracing::warn!("node channel: refused a connection from uid {uid}");
                        continue;
                    }
                    let mut head = [0u8; 12];
                    if (&s).read_exact(&mut head).is_err() || &head[0..4] != HELLO_MAGIC {
                        continue;
                    }
                    let lr = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
                    let tl = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
                    if tl > 4096 {
                        continue;
                    }
                    let mut t = vec![0u8; tl];
                    if (&s).read_exact(&mut t).is_err() || t != token {
                        tracing::warn!("node channel: refused a connection with a wrong job token");
                        continue;
                    }
                    if lr == 0 || lr >= node.local_size() || streams[lr].is_some() {
                        continue;
                    }
                    (&s).write_all(&[1]).map_err(nerr)?;
                    streams[lr] = Some(s);
                    admitted += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    boot.check()?;
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> = (1..node.local_size())
                            .filter(|&i| streams[i].is_none())
                            .map(|i| node.local_peers[i])
                            .collect();
                        return Err(Error::new(
                            None,
                            "node channel",
                            ErrorKind::Timeout {
                                what: "node-local PEs to connect".into(),
                                waited: boot.timeout(),
                                missing,
                            },
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(nerr(format!("accept: {e}"))),
            }
        }
        Ok(())
    }

    /// This PE's index among the PEs of its node.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Collective among the PEs of this node (all must pass the same number of descriptors).
    /// Returns, for every local PE in local-rank order, the descriptors it passed; this PE's
    /// own come back as duplicates.
    ///
    /// A failure here is the job's failure: it is sent to every PE (a channel closed by a PE
    /// that failed first defers to the cause the rendezvous delivers).
    pub fn exchange_fds(
        &self,
        mine: &[OwnedFd],
        boot: &dyn Bootstrap,
    ) -> Result<Vec<Vec<OwnedFd>>> {
        self.exchange(mine, boot.health())
            .map_err(|e| settle(boot, self.rank, e))
    }

    fn exchange(&self, mine: &[OwnedFd], health: &super::Health) -> Result<Vec<Vec<OwnedFd>>> {
        let k = mine.len();
        let dup = |fds: &[OwnedFd]| -> Result<Vec<OwnedFd>> {
            fds.iter()
                .map(|f| f.try_clone().map_err(|e| nerr(format!("dup: {e}"))))
                .collect()
        };
        if self.local_size == 1 {
            return Ok(vec![dup(mine)?]);
        }
        let deadline = Instant::now() + self.timeout;
        if self.local_rank == 0 {
            let mut all: Vec<Vec<OwnedFd>> = Vec::with_capacity(self.local_size);
            all.push(dup(mine)?);
            for lr in 1..self.local_size {
                let s = self.streams[lr]
                    .as_ref()
                    .ok_or_else(|| nerr("missing stream"))?;
                let got = recv_fds(s, k, deadline, health, self.rank)
                    .map_err(|e| peer_gone(self.peers[lr], e))?;
                all.push(got);
            }
            for lr in 1..self.local_size {
                let s = self.streams[lr]
                    .as_ref()
                    .ok_or_else(|| nerr("missing stream"))?;
                for fds in &all {
                    send_fds(s, fds).map_err(|e| peer_gone(self.peers[lr], e))?;
                }
            }
            Ok(all)
        } else {
            let s = self.streams[0]
                .as_ref()
                .ok_or_else(|| nerr("missing stream"))?;
            let leader = self.peers[0];
            send_fds(s, mine).map_err(|e| peer_gone(leader, e))?;
            let mut all = Vec::with_capacity(self.local_size);
            for _ in 0..self.local_size {
                all.push(
                    recv_fds(s, k, deadline, health, self.rank)
                        .map_err(|e| peer_gone(leader, e))?,
                );
            }
            Ok(all)
        }
    }
}

/// How long a PE whose node-channel peer closed waits for the job's rendezvous to deliver the
/// cause. The leader that notices a death first fails and exits; without this wait the
/// others would blame the leader, whose channel closed, for a death it only passed on.
const CAUSE_GRACE: Duration = Duration::from_millis(300);

/// Turns a node-channel failure into the job's failure. A closed channel defers to the cause
/// the rendezvous delivers within [`CAUSE_GRACE`] (the first failure is the cause, the closed
/// channel a consequence); any other failure is sent to every PE, so none waits for a PE that
/// already gave up.
fn settle(boot: &dyn Bootstrap, rank: usize, e: Error) -> Error {
    if matches!(e.kind(), ErrorKind::PeerExited { .. }) {
        let until = Instant::now() + CAUSE_GRACE;
        loop {
            if let Err(cause) = boot.health().check(rank, "node channel") {
                return cause;
            }
            if Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    boot.fail_all(e.kind().clone());
    e
}

/// Sends `fds` as one or more messages: a 4-byte count, then the descriptors as SCM_RIGHTS.
fn send_fds(s: &UnixStream, fds: &[OwnedFd]) -> Result<()> {
    let count = (fds.len() as u32).to_le_bytes();
    (&*s).write_all(&count).map_err(closed)?;
    for batch in fds.chunks(FDS_PER_MESSAGE) {
        let raw: Vec<RawFd> = batch.iter().map(|f| f.as_raw_fd()).collect();
        let n = [batch.len() as u8];
        let iov = [IoSlice::new(&n)];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).map_err(
            |e| match e {
                nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET => closed(e),
                e => nerr(format!("sendmsg: {e}")),
            },
        )?;
    }
    Ok(())
}

fn wait_readable(
    s: &UnixStream,
    deadline: Instant,
    health: &super::Health,
    rank: usize,
) -> Result<()> {
    loop {
        health.check(rank, "node channel")?;
        let now = Instant::now();
        if now >= deadline {
            return Err(nerr(
                "timed out waiting for a node-local PE to pass its memory handles",
            ));
        }
        let ms = (deadline - now).min(Duration::from_millis(100)).as_millis() as u16;
        let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(s), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(nerr(format!("poll: {e}"))),
        }
    }
}

fn recv_fds(
    s: &UnixStream,
    expect: usize,
    deadline: Instant,
    health: &super::Health,
    rank: usize,
) -> Result<Vec<OwnedFd>> {
    wait_readable(s, deadline, health, rank)?;
    let mut count = [0u8; 4];
    (&*s).read_exact(&mut count).map_err(closed)?;
    let count = u32::from_le_bytes(count) as usize;
    if count != expect {
        return Err(nerr(format!(
            "a node-local PE passed {count} handles, expected {expect}"
        )));
    }
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        wait_readable(s, deadline, health, rank)?;
        let mut n = [0u8; 1];
        let mut iov = [IoSliceMut::new(&mut n)];
        let mut space = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| match e {
            nix::errno::Errno::ECONNRESET => closed(e),
            e => nerr(format!("recvmsg: {e}")),
        })?;
        if msg.bytes == 0 {
            return Err(closed("end of stream"));
        }
        let mut got = 0;
        for c in msg.cmsgs().map_err(|e| nerr(format!("cmsg: {e}")))? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for fd in fds {
                    got += 1;
                    // SAFETY: the kernel just installed `fd` in this process for this message
                    // (SCM_RIGHTS); nothing else refers to it, so ownership moves here.
                    out.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) || got != n[0] as usize {
            return Err(nerr(
                "file descriptors were truncated in transit (descriptor limit reached?)",
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(peer: usize) -> Error {
        Error::new(
            None,
            "node channel",
            ErrorKind::PeerExited {
                peer,
                how: "its node channel to this PE closed".into(),
            },
        )
    }

    /// The leader that notices PE 3's death fails and exits; the others must name PE 3 (the
    /// cause the rendezvous delivers a moment later), not the leader whose channel closed.
    #[test]
    fn a_closed_channel_defers_to_the_cause_that_arrives() {
        let boot = std::sync::Arc::new(crate::bootstrap::SingleBootstrap::new(
            Duration::from_secs(5),
        ));
        let b = boot.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b.health().fail(ErrorKind::PeerExited {
                peer: 3,
                how: "killed".into(),
            });
        });
        let e = settle(boot.as_ref(), 1, exited(0));
        t.join().unwrap();
        assert!(
            matches!(e.kind(), ErrorKind::PeerExited { peer: 3, .. }),
            "{e}"
        );
        assert_eq!(e.pe(), Some(1));
    }

    /// With no other cause, the closed channel is the failure, and the job is told of it.
    #[test]
    fn a_closed_channel_without_a_cause_fails_the_job() {
        let boot = crate::bootstrap::SingleBootstrap::new(Duration::from_secs(5));
        let started = Instant::now();
        let e = settle(&boot, 1, exited(0));
        assert!(started.elapsed() >= CAUSE_GRACE);
        assert!(
            matches!(e.kind(), ErrorKind::PeerExited { peer: 0, .. }),
            "{e}"
        );
        assert!(matches!(
            boot.health().failure(),
            Some(ErrorKind::PeerExited { peer: 0, .. })
        ));
    }

    #[test]
    fn grouping_by_identity() {
        let ids: Vec<String> = ["a", "b", "a", "b", "c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let n = NodeInfo::from_ids(&ids, 3);
        assert_eq!(n.node_index, 1);
        assert_eq!(n.node_count, 3);
        assert_eq!(n.local_peers, vec![1, 3]);
        assert_eq!(n.local_rank, 1);
        assert_eq!(n.node_of, vec![0, 1, 0, 1, 2]);
    }
}
