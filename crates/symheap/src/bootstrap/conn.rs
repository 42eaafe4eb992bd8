//! The rendezvous transports and connection setup: a TCP socket at MASTER_ADDR, or, when the
//! launcher says every PE runs on this node, a Unix socket in the 0700 runtime directory (the
//! kernel lets only this user reach it, and both ends check the other's uid).
//!
//! This file holds what PE 0 listens on and how the other PEs reach it and say Hello; PE 0's
//! admission of the connections is `accept.rs`, what runs over them afterwards `tcp.rs`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::auth::{self, Side, Transcript};
use super::wire::Msg;
use super::{unix, LaunchEnv};
use crate::error::{bootstrap, Error, ErrorKind, Result};

/// How long one TCP connection attempt may take before the next try.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);
/// Pause between attempts while PE 0 is not listening yet.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// One rendezvous connection, over either transport.
pub(super) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    pub(super) fn try_clone(&self) -> std::io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
        })
    }

    pub(super) fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.shutdown(how),
            Conn::Unix(s) => s.shutdown(how),
        }
    }

    /// TCP_NODELAY on TCP; nothing to do on a Unix socket.
    pub(super) fn set_nodelay(&self, on: bool) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_nodelay(on),
            Conn::Unix(_) => Ok(()),
        }
    }

    pub(super) fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(t),
            Conn::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub(super) fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_write_timeout(t),
            Conn::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub(super) fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_nonblocking(on),
            Conn::Unix(s) => s.set_nonblocking(on),
        }
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Conn::Tcp(s) => s.as_fd(),
            Conn::Unix(s) => s.as_fd(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.flush(),
            Conn::Unix(s) => s.flush(),
        }
    }
}

/// Where the rendezvous of a job is.
#[derive(Debug, Clone)]
pub(super) enum Target {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(a) => write!(f, "{a}"),
            Target::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

impl Target {
    /// The rendezvous `env` describes: the Unix socket when every PE is on this node.
    pub(super) fn of(env: &LaunchEnv) -> Result<Target> {
        if env.one_node {
            let dir = unix::runtime_dir_path();
            Ok(Target::Unix(unix::rendezvous_path(&dir, &env.token)?))
        } else {
            Ok(Target::Tcp(resolve(&env.addr, env.port)?))
        }
    }
}

fn io_err(what: impl std::fmt::Display) -> Error {
    bootstrap("init", what.to_string())
}

fn resolve(addr: &str, port: u16) -> Result<SocketAddr> {
    (addr, port)
        .to_socket_addrs()
        .map_err(|e| {
            io_err(format!(
                "cannot resolve the rendezvous address MASTER_ADDR={addr} (port {port}): {e}"
            ))
        })?
        .next()
        .ok_or_else(|| {
            io_err(format!(
                "the rendezvous address MASTER_ADDR={addr} (port {port}) resolves to nothing"
            ))
        })
}

/// What PE 0 listens on, for the whole life of the job: as long as it exists no other PE 0 of
/// this rendezvous can start (a TCP port binds once; a Unix socket is replaced only by the
/// holder of the lock file beside it). A Unix listener's socket file is removed when it is
/// dropped, before its lock is released.
pub(super) enum Listener {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
        _lock: unix::RendezvousLock,
    },
}

impl Listener {
    /// PE 0's listener for `env`, non-blocking; `None` when a live listener of the same
    /// rendezvous holds it (another PE 0: the caller presents itself there, see
    /// [`second_root`]).
    pub(super) fn bind(env: &LaunchEnv) -> Result<Option<Listener>> {
        let l = match Target::of(env)? {
            Target::Tcp(addr) => match bind_tcp(env, addr)? {
                Some(l) => Listener::Tcp(l),
                None => return Ok(None),
            },
            Target::Unix(path) => match bind_unix(&path)? {
                Some((listener, lock)) => Listener::Unix {
                    listener,
                    path,
                    _lock: lock,
                },
                None => return Ok(None),
            },
        };
        let nb = match &l {
            Listener::Tcp(t) => t.set_nonblocking(true),
            Listener::Unix { listener, .. } => listener.set_nonblocking(true),
        };
        nb.map_err(io_err)?;
        Ok(Some(l))
    }

    /// The next waiting connection and a description of who made it (address, or pid and uid).
    pub(super) fn accept(&self) -> std::io::Result<(Conn, String, Option<u32>)> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, a)| (Conn::Tcp(s), a.to_string(), None)),
            Listener::Unix { listener, .. } => listener.accept().map(|(s, _)| {
                let cred = unix::peer_cred(&s);
                let who = match cred {
                    Some((uid, pid)) => format!("pid {pid} (uid {uid})"),
                    None => "a process of unknown identity".to_string(),
                };
                (Conn::Unix(s), who, Some(cred.map_or(u32::MAX, |c| c.0)))
            }),
        }
    }

    /// Where it listens, for messages.
    pub(super) fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            Listener::Unix { path, .. } => path.display().to_string(),
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix { listener, .. } => listener.as_fd(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds only the address MASTER_ADDR names (never every interface). `None`: something
/// listens there already.
fn bind_tcp(env: &LaunchEnv, addr: SocketAddr) -> Result<Option<TcpListener>> {
    let l = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return Ok(None),
        Err(e) => {
            let hint = match e.kind() {
                std::io::ErrorKind::AddrNotAvailable => format!(
                    "MASTER_ADDR={} is not an address of this host: set it to PE 0's address \
                     on the network the PEs share",
                    env.addr
                ),
                _ => "check MASTER_ADDR and MASTER_PORT".to_string(),
            };
            return Err(io_err(format!(
                "PE 0 cannot listen on {addr} for the rendezvous: {e} ({hint})"
            )));
        }
    };
    let named_loopback = addr.ip().is_loopback()
        && env.addr.parse::<std::net::IpAddr>().is_err()
        && env.addr != "localhost";
    if named_loopback {
        super::warn(&format!(
            "MASTER_ADDR={} resolves to {} on PE 0, a loopback address PEs on other nodes cannot \
             reach; set MASTER_ADDR to PE 0's IP address if the job spans nodes",
            env.addr,
            addr.ip()
        ));
    }
    Ok(Some(l))
}

/// Takes the rendezvous lock and binds the socket; `None`: a live PE 0 holds the lock. The
/// holder of the lock owns the path, so a socket found there is a killed PE 0's and goes.
fn bind_unix(path: &std::path::Path) -> Result<Option<(UnixListener, unix::RendezvousLock)>> {
    let dir = unix::runtime_dir()?;
    unix::remove_stale_sockets(&dir);
    let Some(lock) = unix::RendezvousLock::take(path)? else {
        return Ok(None);
    };
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).map_err(|e| {
        io_err(format!(
            "PE 0 cannot listen on {} for the rendezvous: {e}",
            path.display()
        ))
    })?;
    Ok(Some((l, lock)))
}

/// How one attempt to say Hello to PE 0 ended, when it did not end in a Welcome.
enum Attempt {
    /// Not there yet or dropped us without a word: try again until the deadline.
    Retry(String),
    /// A definitive answer or a condition retrying cannot change.
    Fail(Error),
}

/// On a PE other than 0: connects to PE 0's rendezvous and is welcomed, retrying until
/// `timeout` while PE 0 is not listening yet or drops the connection unanswered.
pub(super) fn join(env: &LaunchEnv, timeout: Duration) -> Result<Conn> {
    let start = Instant::now();
    let deadline = start + timeout;
    let target = Target::of(env)?;
    loop {
        let why = match attempt(env, &target, deadline, "") {
            Ok(c) => return Ok(c),
            Err(Attempt::Fail(e)) => return Err(e.with_pe(env.rank)),
            Err(Attempt::Retry(why)) => why,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::new(
                Some(env.rank),
                "init",
                ErrorKind::Timeout {
                    what: format!("PE 0's rendezvous at {target} ({why})"),
                    waited: now - start,
                    missing: vec![0],
                },
            ));
        }
        std::thread::sleep(RETRY_PAUSE.min(deadline - now));
    }
}

/// One handshake with what listens at `target`; `conflict`: why this PE knows a second job
/// shares the rendezvous (empty when it does not), for PE 0 to end its job with.
fn attempt(
    env: &LaunchEnv,
    target: &Target,
    deadline: Instant,
    conflict: &str,
) -> std::result::Result<Conn, Attempt> {
    let mut conn = connect(target, deadline)?;
    let _ = conn.set_nodelay(true);
    let fingerprint = env.fingerprint();
    let client_nonce = auth::nonce().map_err(Attempt::Fail)?;
    let hello = Msg::Hello {
        rank: env.rank as u32,
        world: env.world as u32,
        nonce: client_nonce.clone(),
        fingerprint: fingerprint.clone(),
        source: env.token_source.kind().to_string(),
    };
    if let Err(e) = hello.write_to(&mut conn) {
        return Err(Attempt::Retry(format!(
            "PE 0 closed the connection before this PE's Hello went through: {e}"
        )));
    }
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    conn.set_read_timeout(Some(left))
        .map_err(|e| Attempt::Fail(io_err(e)))?;
    let server_nonce = match reply(&mut conn, target, env)? {
        Msg::Challenge { nonce, mac } => {
            let tr = Transcript {
                client_nonce: &client_nonce,
                server_nonce: &nonce,
                rank: env.rank as u32,
                world: env.world as u32,
                fingerprint: &fingerprint,
            };
            // Nothing more goes to a peer that has not proved the token: not the proof (which
            // a forger could try to replay), not this process's pid, host or twins, not node
            // information.
            if !tr.verify(&env.token, Side::Root, &mac) {
                return Err(Attempt::Fail(io_err(format!(
                    "what answers at {target} did not prove it holds this job's token (job {}): \
                     it is not this job's PE 0 (another job's, or a process impersonating it); \
                     this PE sent it nothing but its Hello",
                    fingerprint
                ))));
            }
            nonce
        }
        other => return Err(unexpected(target, &other)),
    };
    let proof = Transcript {
        client_nonce: &client_nonce,
        server_nonce: &server_nonce,
        rank: env.rank as u32,
        world: env.world as u32,
        fingerprint: &fingerprint,
    }
    .mac(&env.token, Side::Peer);
    let proof = Msg::Proof {
        mac: proof,
        pid: std::process::id(),
        host: host_name(),
        conflict: conflict.to_string(),
    };
    if let Err(e) = proof.write_to(&mut conn) {
        return Err(Attempt::Retry(format!(
            "PE 0 closed the connection during the handshake: {e}"
        )));
    }
    match reply(&mut conn, target, env)? {
        Msg::Welcome => {
            conn.set_read_timeout(None)
                .map_err(|e| Attempt::Fail(io_err(e)))?;
            Ok(conn)
        }
        other => Err(unexpected(target, &other)),
    }
}

/// The next handshake message from PE 0; a Reject ends the attempt for good.
fn reply(conn: &mut Conn, target: &Target, env: &LaunchEnv) -> std::result::Result<Msg, Attempt> {
    match Msg::read_from(conn) {
        Ok(Msg::Reject { reason }) => Err(Attempt::Fail(io_err(format!(
            "PE 0 at {target} refused this PE (job {}, token from {}): {reason}",
            env.fingerprint(),
            env.token_source
        )))),
        Ok(m) => Ok(m),
        Err(e) => Err(classify_reply_error(target, e)),
    }
}

fn unexpected(target: &Target, m: &Msg) -> Attempt {
    Attempt::Fail(io_err(format!(
        "unexpected {} from {target} during the rendezvous handshake: not this job's PE 0; \
         this PE sent it nothing but its Hello",
        m.name()
    )))
}

/// This host's name, for messages.
pub(super) fn host_name() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "an unknown host".into())
}

/// On a PE 0 whose rendezvous is held by a live listener: presents itself there as PE 0 of
/// this job, so that a PE 0 of the same job identity ends its job (two jobs would mix) and
/// says why; returns the error this PE fails with, which names the rendezvous and both jobs.
/// `patience`: how long to wait for the holder to listen (it may be between taking the
/// rendezvous and listening).
pub(super) fn second_root(env: &LaunchEnv, patience: Duration, conflict: &str) -> Error {
    let target = match Target::of(env) {
        Ok(t) => t,
        Err(e) => return e,
    };
    let deadline = Instant::now() + patience;
    let held = |why: String| {
        io_err(format!(
            "PE 0 cannot host the rendezvous at {target}: another process holds it ({why}); \
             another job on this port? give each job its own MASTER_PORT or \
             SYMHEAP_BOOTSTRAP_PORT"
        ))
    };
    loop {
        match attempt(env, &target, deadline, conflict) {
            Ok(_) => return held("it admitted a second PE 0, which no symheap PE 0 does".into()),
            Err(Attempt::Fail(e)) => {
                return match e.kind() {
                    ErrorKind::Bootstrap(m) => io_err(format!(
                        "PE 0 cannot host the rendezvous, another process holds it: {m}"
                    )),
                    _ => e,
                }
            }
            Err(Attempt::Retry(why)) if Instant::now() >= deadline => return held(why),
            Err(Attempt::Retry(_)) => std::thread::sleep(RETRY_PAUSE),
        }
    }
}

fn classify_reply_error(target: &Target, e: std::io::Error) -> Attempt {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock | K::TimedOut => Attempt::Retry(format!(
            "it accepted this PE's connection but did not answer its Hello (is PE 0 stalled, \
             or is another program listening at {target}?)"
        )),
        K::InvalidData => Attempt::Fail(io_err(format!(
            "what answers at {target} is not a symheap rendezvous ({e}): another program on this \
             port? set MASTER_PORT or SYMHEAP_BOOTSTRAP_PORT"
        ))),
        _ => Attempt::Retry(format!(
            "PE 0 closed the connection without answering this PE's Hello: {e}"
        )),
    }
}

/// On a PE that found a twin of itself (`census.rs`): tells whoever holds the rendezvous, so
/// that a PE 0 of the same job identity ends its job, which may hold PEs of the other job;
/// returns the error this PE fails with. No waiting: a rendezvous nobody holds has no job to end.
pub(super) fn announce(env: &LaunchEnv, why: String, timeout: Duration) -> Error {
    let fail = |why: String| Error::new(Some(env.rank), "init", ErrorKind::Bootstrap(why));
    if env.rank == 0 {
        return match Listener::bind(env) {
            Ok(None) => {
                // A twin holding it may be failing too: not worth a long wait.
                second_root(env, timeout.min(Duration::from_secs(1)), &why);
                fail(why)
            }
            Ok(Some(_)) => fail(why),
            Err(e) => e,
        };
    }
    if let Ok(target) = Target::of(env) {
        let deadline = Instant::now() + timeout.min(Duration::from_secs(2));
        let _ = attempt(env, &target, deadline, &why);
    }
    fail(why)
}

/// One connection attempt; the reasons to retry are worded for the final timeout message.
fn connect(target: &Target, deadline: Instant) -> std::result::Result<Conn, Attempt> {
    use std::io::ErrorKind as K;
    match target {
        Target::Tcp(addr) => {
            let left = deadline.saturating_duration_since(Instant::now());
            let t = left.clamp(Duration::from_millis(1), CONNECT_ATTEMPT);
            TcpStream::connect_timeout(addr, t)
                .map(Conn::Tcp)
                .map_err(|e| {
                    Attempt::Retry(match e.kind() {
                        K::ConnectionRefused => "connection refused: nothing listens there; is \
                                                 PE 0 running, with the same MASTER_ADDR and \
                                                 MASTER_PORT as this PE?"
                            .to_string(),
                        K::TimedOut | K::WouldBlock => format!(
                            "no answer to the connection attempt: is {addr} reachable from this \
                             node? ({e})"
                        ),
                        _ => format!("cannot connect: {e}"),
                    })
                })
        }
        Target::Unix(path) => {
            let dir = path.parent().unwrap_or(path);
            match unix::check_dir(dir, false) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Attempt::Retry(format!(
                        "{} does not exist yet: PE 0 has not started its rendezvous (the launcher \
                         says every PE runs on this node: do they?)",
                        dir.display()
                    )))
                }
                Err(e) => return Err(Attempt::Fail(e)),
            }
            let s = UnixStream::connect(path).map_err(|e| {
                Attempt::Retry(match e.kind() {
                    K::NotFound => "no socket there yet: PE 0 has not started its rendezvous \
                                    (the launcher says every PE runs on this node: do they?)"
                        .to_string(),
                    K::ConnectionRefused => "nobody listens on it: a socket left by an earlier \
                                             job, or PE 0 exited"
                        .to_string(),
                    _ => format!("cannot connect: {e}"),
                })
            })?;
            let me = nix::unistd::getuid().as_raw();
            match unix::peer_cred(&s) {
                Some((uid, _)) if uid == me => Ok(Conn::Unix(s)),
                other => Err(Attempt::Fail(io_err(format!(
                    "the process listening on {} is not this user's (uid {:?}, this user is \
                     {me}): refusing to talk to it",
                    path.display(),
                    other.map(|c| c.0)
                )))),
            }
        }
    }
}
