//! PE 0's admission of the other PEs: every connection's handshake is read concurrently, in one
//! poll loop, each within a short window of its own, with a cap on how many may wait at once.
//!
//! So no stranger can hold up the job: one that stays silent, drips a byte now and then or
//! sends garbage is dropped after [`HELLO_WINDOW`] at the latest, while the PEs' own Hellos (sent
//! the moment they connect) are read as they arrive; a flood past [`MAX_WAITING`] pushes out the
//! oldest waiting connection, never a new one; and the whole admission ends at the job's
//! timeout whatever strangers do. Every refused connection is logged at `warn` with its address.
//!
//! The handshake (`auth.rs`): a Hello naming another job's fingerprint is refused at once, with
//! both job identities; one of this job is answered with a Challenge (PE 0's nonce and proof of
//! the token) and admitted only once its own Proof checks out. A connection that proves the
//! token but claims rank 0, or a rank already admitted, belongs to a second job with the same
//! identity: PE 0 then fails its whole job ("two jobs share the rendezvous"), since it may
//! already have admitted PEs of the other job, and tells the newcomer the same. PE 0 goes on
//! watching the rendezvous after admission ([`watch`]) until it finalizes, so a second job that
//! arrives later is caught the same way.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::auth::{self, Side, Transcript, MAC_LEN, NONCE_LEN};
use super::conn::{Conn, Listener};
use super::wire::{AbortClass, Msg, HEADER_LEN};
use super::LaunchEnv;
use crate::error::{bootstrap, Error, ErrorKind, Result};

/// How long a new connection may take to complete its handshake (Hello, then Proof).
pub(super) const HELLO_WINDOW: Duration = Duration::from_secs(2);
/// Connections waiting to complete a handshake at once; past it the oldest is dropped.
pub(super) const MAX_WAITING: usize = 64;
/// Largest handshake frame accepted (a Hello is two numbers, a nonce and a few short strings).
const MAX_HELLO: usize = 64 << 10;
/// New connections taken per turn of the loop, so waiting ones are read in between.
const ACCEPTS_PER_TURN: usize = 32;

/// What PE 0 knows of a connection whose Hello named this job: what its Proof must bind.
struct Claim {
    rank: u32,
    client_nonce: Vec<u8>,
    server_nonce: Vec<u8>,
}

/// What a connecting PE says about itself in its Proof, once PE 0 proved the token to it.
struct Told<'m> {
    pid: u32,
    host: &'m str,
    /// Why it knows a second job shares the rendezvous (empty: it does not).
    conflict: &'m str,
}

/// Where a connection is in its handshake.
enum Stage {
    Hello,
    Proof(Claim),
}

/// A connection that has not proved who it is yet.
struct Caller {
    conn: Conn,
    peer: String,
    buf: Vec<u8>,
    until: Instant,
    stage: Stage,
}

/// What a connection's bytes amount to so far.
enum Verdict {
    /// Needs more bytes.
    Incomplete,
    /// Its Hello names this job: send it PE 0's challenge, then wait for its proof.
    Challenge(Claim),
    /// A PE of this job, with its rank.
    Admit(usize),
    /// Refused; `reply`: tell it why (it spoke our protocol, so it may be a misconfigured PE).
    Refuse { reason: String, reply: bool },
    /// It proved the token but its rank is taken: a second job shares the rendezvous.
    Conflict(String),
}

/// PE 0's side of the rendezvous, during admission and after it.
struct Gate<'a> {
    env: &'a LaunchEnv,
    fingerprint: String,
    place: String,
    conns: Vec<Option<Conn>>,
    joined: Vec<bool>,
    admitted: usize,
    waiting: VecDeque<Caller>,
    refused: usize,
    conflict: Option<String>,
}

/// Connections still in their handshake when admission ended, handed on to [`watch`]: one that
/// proves the token now is a second job's PE, and must not escape by being dropped (it would
/// retry, perhaps after this job has ended, and meet a second PE 0 of the other job).
pub(super) struct Pending(VecDeque<Caller>);

/// Admits the `env.world - 1` other PEs on `listener` within `timeout`; the connections come
/// back by rank (index 0 empty), blocking, Welcome sent, with those still in their handshake.
pub(super) fn admit_all(
    listener: &Listener,
    env: &LaunchEnv,
    timeout: Duration,
) -> Result<(Vec<Option<Conn>>, Pending)> {
    let deadline = Instant::now() + timeout;
    let mut a = Gate::new(listener, env, false);
    while a.admitted + 1 < env.world {
        let now = Instant::now();
        a.expire(now);
        if now >= deadline {
            return Err(a.timeout_error(listener, timeout));
        }
        a.turn(listener, None, deadline - now)?;
        if let Some(why) = a.conflict.take() {
            return Err(a.conflict_error(why));
        }
    }
    Ok((a.conns, Pending(a.waiting)))
}

/// After admission, until `stop` is readable: serves the rendezvous so that a PE of a second
/// job with this identity (which proves the token but finds its rank taken) is caught, and
/// calls `on_conflict` with the message every PE of this job must fail with. Strangers are
/// refused as during admission.
pub(super) fn watch(
    listener: &Listener,
    env: &LaunchEnv,
    pending: Pending,
    stop: BorrowedFd<'_>,
    mut on_conflict: impl FnMut(String),
) {
    let mut a = Gate::new(listener, env, true);
    a.waiting = pending.0;
    loop {
        a.expire(Instant::now());
        match a.turn(listener, Some(stop), Duration::from_secs(1)) {
            Ok(true) => {
                for c in std::mem::take(&mut a.waiting) {
                    a.refuse(c, "the job ended before it completed its handshake", false);
                }
                return;
            }
            Ok(false) => {}
            Err(e) => {
                super::warn(&format!("rendezvous watch ended: {e}"));
                return;
            }
        }
        if let Some(why) = a.conflict.take() {
            on_conflict(why);
        }
    }
}

/// Polls the listener, the waiting connections and `stop` for at most `wait`; returns whether
/// `stop` fired, whether new connections wait and which waiting ones have bytes (or a
/// hang-up) to read.
fn wait_readable(
    listener: &Listener,
    waiting: &VecDeque<Caller>,
    stop: Option<BorrowedFd<'_>>,
    wait: Duration,
) -> Result<(bool, bool, Vec<usize>)> {
    let mut fds = Vec::with_capacity(waiting.len() + 2);
    fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
    for c in waiting {
        fds.push(PollFd::new(c.conn.as_fd(), PollFlags::POLLIN));
    }
    if let Some(s) = stop {
        fds.push(PollFd::new(s, PollFlags::POLLIN));
    }
    // Round up so a wait shorter than a millisecond does not spin.
    let ms = (wait.as_micros().div_ceil(1000)).min(1000) as u16;
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => return Err(bootstrap("init", format!("rendezvous poll: {e}"))),
    }
    let hit = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
    let stopped = stop.is_some() && hit(&fds[fds.len() - 1]);
    let new = hit(&fds[0]);
    let ready = (1..=waiting.len())
        .filter(|&i| hit(&fds[i]))
        .map(|i| i - 1)
        .collect();
    Ok((stopped, new, ready))
}

impl<'a> Gate<'a> {
    /// `complete`: every PE has joined already (the watch after admission).
    fn new(listener: &Listener, env: &'a LaunchEnv, complete: bool) -> Gate<'a> {
        let mut joined = vec![complete; env.world];
        joined[0] = true;
        Gate {
            env,
            fingerprint: env.fingerprint(),
            place: listener.describe(),
            conns: (0..env.world).map(|_| None).collect(),
            joined,
            admitted: 0,
            waiting: VecDeque::new(),
            refused: 0,
            conflict: None,
        }
    }

    /// One turn: waits at most `wait` for something to happen and handles it. True if `stop`
    /// fired.
    fn turn(
        &mut self,
        listener: &Listener,
        stop: Option<BorrowedFd<'_>>,
        wait: Duration,
    ) -> Result<bool> {
        let wake = self
            .waiting
            .iter()
            .map(|c| c.until.saturating_duration_since(Instant::now()))
            .min()
            .unwrap_or(wait)
            .min(wait);
        let (stopped, new, ready) = wait_readable(listener, &self.waiting, stop, wake)?;
        if stopped {
            return Ok(true);
        }
        // Highest index first, so removing one leaves the others' indices valid.
        for i in ready.into_iter().rev() {
            self.read_frame(i);
        }
        if new {
            self.accept_new(listener);
        }
        Ok(false)
    }

    fn refuse(&mut self, c: Caller, reason: &str, reply: bool) {
        self.refused += 1;
        super::warn(&format!(
            "rendezvous: refused a connection from {}: {reason}",
            c.peer
        ));
        let mut conn = c.conn;
        if reply {
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = Msg::Reject {
                reason: reason.to_string(),
            }
            .write_to(&mut conn);
        }
        let _ = conn.shutdown(Shutdown::Both);
    }

    /// Drops the connections whose handshake window has passed. They get no Reject: a PE that
    /// was merely slow sees the connection close and tries again.
    fn expire(&mut self, now: Instant) {
        let (late, on_time): (Vec<Caller>, Vec<Caller>) =
            self.waiting.drain(..).partition(|c| now >= c.until);
        self.waiting = on_time.into();
        for c in late {
            let got = c.buf.len();
            let what = match c.stage {
                Stage::Hello => "Hello",
                Stage::Proof(_) => "proof of the job token",
            };
            let why = format!(
                "no complete {what} within {} s ({got} bytes received)",
                HELLO_WINDOW.as_secs_f64()
            );
            self.refuse(c, &why, false);
        }
    }

    fn accept_new(&mut self, listener: &Listener) {
        let me = nix::unistd::getuid().as_raw();
        for _ in 0..ACCEPTS_PER_TURN {
            let (conn, peer, uid) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    // Out of descriptors, most likely: let waiting connections expire first.
                    super::warn(&format!("rendezvous: accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            let c = Caller {
                conn,
                peer,
                buf: Vec::new(),
                until: Instant::now() + HELLO_WINDOW,
                stage: Stage::Hello,
            };
            if uid.is_some_and(|u| u != me) {
                self.refuse(
                    c,
                    &format!("it runs as another user (this is uid {me})"),
                    false,
                );
                continue;
            }
            if c.conn.set_nonblocking(true).is_err() {
                continue;
            }
            if self.waiting.len() >= MAX_WAITING {
                if let Some(old) = self.waiting.pop_front() {
                    let why = format!("{MAX_WAITING} connections were waiting to send a Hello");
                    self.refuse(old, &why, false);
                }
            }
            self.waiting.push_back(c);
        }
    }

    /// Reads what waiting connection `i` has sent and acts once a whole frame is in.
    fn read_frame(&mut self, i: usize) {
        let c = &mut self.waiting[i];
        let need = frame_len(&c.buf).unwrap_or(HEADER_LEN);
        let mut chunk = vec![0u8; need.saturating_sub(c.buf.len()).max(1)];
        let closed = match c.conn.read(&mut chunk) {
            Ok(0) => Some("it closed the connection before completing its handshake".to_string()),
            Ok(n) => {
                c.buf.extend_from_slice(&chunk[..n]);
                None
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                return
            }
            Err(e) => Some(format!("its connection failed: {e}")),
        };
        let verdict = match closed {
            Some(why) => Verdict::Refuse {
                reason: why,
                reply: false,
            },
            None => self.judge(i),
        };
        self.act(i, verdict);
    }

    fn act(&mut self, i: usize, verdict: Verdict) {
        match verdict {
            Verdict::Incomplete => {}
            Verdict::Refuse { reason, reply } => {
                let c = self.waiting.remove(i).expect("index from poll");
                self.refuse(c, &reason, reply);
            }
            Verdict::Challenge(claim) => {
                let tr = self.transcript(&claim);
                let msg = Msg::Challenge {
                    nonce: claim.server_nonce.clone(),
                    mac: tr.mac(&self.env.token, Side::Root),
                };
                let c = &mut self.waiting[i];
                c.buf.clear();
                c.stage = Stage::Proof(claim);
                // A frame this small fits any fresh socket's buffer; failing to send it means
                // the connection is gone.
                if msg.write_to(&mut c.conn).is_err() {
                    let c = self.waiting.remove(i).expect("index from poll");
                    self.refuse(
                        c,
                        "its connection failed before the challenge went out",
                        false,
                    );
                }
            }
            Verdict::Conflict(why) => {
                let c = self.waiting.remove(i).expect("index from poll");
                self.refuse(c, &why, true);
                self.conflict.get_or_insert(why);
            }
            Verdict::Admit(rank) => {
                let mut c = self.waiting.remove(i).expect("index from poll");
                let sent = c.conn.set_nonblocking(false).is_ok()
                    && Msg::Welcome.write_to(&mut c.conn).is_ok()
                    && c.conn.flush().is_ok();
                if sent {
                    tracing::debug!("rendezvous: PE {rank} joined from {}", c.peer);
                    self.conns[rank] = Some(c.conn);
                    self.joined[rank] = true;
                    self.admitted += 1;
                }
            }
        }
    }

    fn transcript<'c>(&'c self, claim: &'c Claim) -> Transcript<'c> {
        Transcript {
            client_nonce: &claim.client_nonce,
            server_nonce: &claim.server_nonce,
            rank: claim.rank,
            world: self.env.world as u32,
            fingerprint: &self.fingerprint,
        }
    }

    /// Decides on waiting connection `i` from the bytes it has sent.
    fn judge(&self, i: usize) -> Verdict {
        let c = &self.waiting[i];
        let buf = &c.buf;
        if buf.len() < HEADER_LEN {
            return Verdict::Incomplete;
        }
        let refuse = |reason: String| Verdict::Refuse {
            reason,
            reply: true,
        };
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&buf[..HEADER_LEN]);
        let len = match Msg::decode_header(&h) {
            Ok((_, len)) => len,
            Err(e) => return refuse(format!("no valid Hello: {e}")),
        };
        if len > MAX_HELLO {
            return refuse(format!(
                "its frame declares {len} bytes, more than a handshake"
            ));
        }
        if buf.len() < HEADER_LEN + len {
            return Verdict::Incomplete;
        }
        match (&c.stage, Msg::decode(buf)) {
            (_, Err(e)) => refuse(format!("no valid handshake: {e}")),
            (Stage::Hello, Ok(m @ Msg::Hello { .. })) => self.check_hello(m, &c.peer),
            (
                Stage::Proof(claim),
                Ok(Msg::Proof {
                    mac,
                    pid,
                    host,
                    conflict,
                }),
            ) => {
                let told = Told {
                    pid,
                    host: &host,
                    conflict: &conflict,
                };
                self.check_proof(claim, &mac, &told)
            }
            (Stage::Hello, Ok(_)) => refuse("its first message was not a Hello".into()),
            (Stage::Proof(_), Ok(_)) => refuse("it answered the challenge with no proof".into()),
        }
    }

    /// `peer`: who connected, as the listener tells (address, or pid and uid).
    fn check_hello(&self, hello: Msg, peer: &str) -> Verdict {
        let Msg::Hello {
            rank,
            world,
            nonce,
            fingerprint,
            source,
        } = hello
        else {
            return Verdict::Refuse {
                reason: "its first message was not a Hello".into(),
                reply: true,
            };
        };
        let env = self.env;
        let refuse = |reason: String| Verdict::Refuse {
            reason,
            reply: true,
        };
        if fingerprint != self.fingerprint {
            return refuse(format!(
                "this rendezvous at {} belongs to job {} (token from {}), and PE {rank} (from \
                 {peer}) is of job {fingerprint} (token from {source}): two jobs on \
                 one port? give each job its own MASTER_PORT (or SYMHEAP_BOOTSTRAP_PORT); the \
                 PEs of one job need the same SYMHEAP_TOKEN, or, without it, the same launch \
                 environment and user secret file",
                self.place,
                self.fingerprint,
                env.token_source.kind(),
            ));
        }
        if world as usize != env.world {
            return refuse(format!(
                "world size {world} differs from PE 0's {}",
                env.world
            ));
        }
        if rank as usize >= env.world {
            return refuse(format!("rank {rank} is not a rank of {} PEs", env.world));
        }
        if nonce.len() != NONCE_LEN {
            return refuse(format!(
                "its nonce is {} bytes, not {NONCE_LEN}",
                nonce.len()
            ));
        }
        match auth::nonce() {
            Ok(server_nonce) => Verdict::Challenge(Claim {
                rank,
                client_nonce: nonce,
                server_nonce,
            }),
            Err(e) => Verdict::Refuse {
                reason: e.to_string(),
                reply: false,
            },
        }
    }

    fn check_proof(&self, claim: &Claim, mac: &[u8], told: &Told<'_>) -> Verdict {
        if mac.len() != MAC_LEN
            || !self
                .transcript(claim)
                .verify(&self.env.token, Side::Peer, mac)
        {
            return Verdict::Refuse {
                reason: "its proof of the job token is wrong".into(),
                reply: true,
            };
        }
        let rank = claim.rank as usize;
        // A PE that found a twin of itself on its node (`census.rs`) says so: its job is a
        // second one with this identity even where its rank is still free.
        if told.conflict.is_empty() && !self.joined[rank] {
            return Verdict::Admit(rank);
        }
        let when = if !told.conflict.is_empty() {
            ", having found a twin of itself on its node"
        } else if self.joined.iter().all(|&j| j) {
            " after every PE of this job had joined"
        } else {
            " when this job's PE had joined already"
        };
        Verdict::Conflict(format!(
            "two jobs share the rendezvous at {}: PE {rank} (pid {} on {}) of a second job with \
             this identity (job {}) arrived{when}; give each job its own MASTER_PORT or \
             SYMHEAP_TOKEN",
            self.place, told.pid, told.host, self.fingerprint
        ))
    }

    /// Ends admission on a second job's PE: every admitted PE, and every connection still
    /// waiting, is told why; PE 0 fails with the same message.
    fn conflict_error(&mut self, why: String) -> Error {
        for c in std::mem::take(&mut self.waiting) {
            self.refuse(c, &why, true);
        }
        let abort = Msg::Abort {
            origin: 0,
            class: AbortClass::Error,
            reason: why.clone(),
            missing: vec![],
            waited_ms: 0,
        };
        for c in self.conns.iter_mut().flatten() {
            let _ = abort.write_to(c);
            let _ = c.flush();
        }
        Error::new(Some(0), "init", ErrorKind::Bootstrap(why))
    }

    fn timeout_error(&mut self, listener: &Listener, timeout: Duration) -> Error {
        for c in std::mem::take(&mut self.waiting) {
            self.refuse(c, "the rendezvous timed out before it sent a Hello", false);
        }
        let missing: Vec<usize> = (1..self.env.world)
            .filter(|&r| self.conns[r].is_none())
            .collect();
        let strangers = if self.refused > 0 {
            format!(
                "; {} other connections were refused (see the warnings)",
                self.refused
            )
        } else {
            String::new()
        };
        let what = format!(
            "{} PEs to connect to the rendezvous at {}{strangers}",
            self.env.world,
            listener.describe()
        );
        // The PEs that did join learn why the job ends (which PEs never started), instead of
        // only seeing PE 0's connection close ("PE 0 exited").
        let abort = Msg::Abort {
            origin: 0,
            class: AbortClass::Timeout,
            reason: what.clone(),
            missing: missing.iter().map(|&m| m as u32).collect(),
            waited_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
        };
        for c in self.conns.iter_mut().flatten() {
            let _ = abort.write_to(c);
            let _ = c.flush();
        }
        Error::new(
            Some(0),
            "init",
            ErrorKind::Timeout {
                what,
                waited: timeout,
                missing,
            },
        )
    }
}

/// The whole frame's length once its header is in `buf`.
fn frame_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let len = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    Some(HEADER_LEN + len.min(MAX_HELLO + 1))
}

#[cfg(test)]
pub(super) mod tests {
    use std::io::Write;
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::bootstrap::{Bootstrap, Launcher, TcpBootstrap};

    fn env(rank: usize, world: usize, port: u16, token: &str, one_node: bool) -> LaunchEnv {
        LaunchEnv {
            launcher: Launcher::TorchStyle,
            rank,
            world,
            local_rank: Some(rank),
            addr: "127.0.0.1".into(),
            port,
            token: token.as_bytes().to_vec(),
            token_source: crate::bootstrap::TokenSource::Given,
            one_node,
        }
    }

    /// A Hello as a PE of the job whose token is `token` sends it.
    pub(in crate::bootstrap) fn hello_for(token: &[u8], rank: u32, world: u32) -> Msg {
        Msg::Hello {
            rank,
            world,
            nonce: auth::nonce().unwrap(),
            fingerprint: auth::fingerprint(token),
            source: "SYMHEAP_TOKEN".into(),
        }
    }

    /// A Proof carrying `mac`, from a PE that found no twin.
    pub(in crate::bootstrap) fn proof_with(mac: Vec<u8>) -> Msg {
        Msg::Proof {
            mac,
            pid: 1,
            host: "test".into(),
            conflict: String::new(),
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Connects strangers of every kind to `port` until `stop`: idle ones, one dripping a byte
    /// every 300 ms, garbage, a wrong token, and a Hello of another world size.
    fn strangers(
        port: u16,
        idle: usize,
        stop: Arc<AtomicBool>,
    ) -> Vec<std::thread::JoinHandle<()>> {
        let connect = move || loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut held = Vec::new();
        let mut hs = Vec::new();
        let s2 = stop.clone();
        hs.push(std::thread::spawn(move || {
            for _ in 0..idle {
                held.push(connect());
            }
            while !s2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
        let s3 = stop.clone();
        hs.push(std::thread::spawn(move || {
            let mut s = connect();
            let frame = hello_for(b"t", 1, 3).encode();
            for b in frame.iter().cycle() {
                if s3.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        }));
        hs.push(std::thread::spawn(move || {
            let mut s = connect();
            let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
            std::thread::sleep(Duration::from_millis(200));
        }));
        for (token, world) in [("wrong", 3u32), ("t", 7)] {
            hs.push(std::thread::spawn(move || {
                let mut s = connect();
                let _ = hello_for(token.as_bytes(), 1, world).write_to(&mut s);
                let reply = Msg::read_from(&mut s);
                assert!(matches!(reply, Ok(Msg::Reject { .. })), "{reply:?}");
            }));
        }
        // A forger: it knows the job's public fingerprint but not the token, so its proof
        // fails and it is refused (or, pushed out by the flood or left over when the job ends,
        // dropped); it is never welcomed.
        hs.push(std::thread::spawn(move || {
            let mut s = connect();
            let _ = hello_for(b"t", 2, 3).write_to(&mut s);
            let mut reply = Msg::read_from(&mut s);
            if matches!(reply, Ok(Msg::Challenge { .. })) {
                let _ = proof_with(vec![7; 32]).write_to(&mut s);
                reply = Msg::read_from(&mut s);
            }
            assert!(
                !matches!(reply, Ok(Msg::Welcome | Msg::Challenge { .. })),
                "{reply:?}"
            );
        }));
        hs
    }

    /// A PE of a job of `world`: connects, meets the others, finalizes; returns how long it
    /// took to be connected.
    fn pe(r: usize, world: usize, port: u16, token: String, one_node: bool) -> Duration {
        let t0 = Instant::now();
        let e = env(r, world, port, &token, one_node);
        let b = TcpBootstrap::connect(&e, Duration::from_secs(20)).unwrap();
        let took = t0.elapsed();
        let got = b.all_gather("g", &[r as u8]).unwrap();
        assert_eq!(got, (0..world as u8).map(|x| vec![x]).collect::<Vec<_>>());
        b.finalize().unwrap();
        took
    }

    #[test]
    fn strangers_do_not_hold_up_the_pes() {
        let port = free_port();
        let root = std::thread::spawn(move || pe(0, 3, port, "t".into(), false));
        let stop = Arc::new(AtomicBool::new(false));
        // More idle strangers than may wait at once: the oldest are pushed out.
        let attack = strangers(port, MAX_WAITING + 40, stop.clone());
        std::thread::sleep(Duration::from_millis(500));
        let pes: Vec<_> = (1..3)
            .map(|r| std::thread::spawn(move || pe(r, 3, port, "t".into(), false)))
            .collect();
        for h in pes {
            let joined = h.join().unwrap();
            assert!(joined < Duration::from_secs(2), "a PE took {joined:?}");
        }
        root.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        for h in attack {
            h.join().unwrap();
        }
    }

    #[test]
    fn the_timeout_bounds_the_rendezvous_whatever_strangers_do() {
        let port = free_port();
        let t = Duration::from_millis(2500);
        let root = std::thread::spawn(move || {
            let t0 = Instant::now();
            let e = TcpBootstrap::connect(&env(0, 3, port, "t", false), t)
                .err()
                .expect("PE 2 never comes");
            (t0.elapsed(), e)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let attack = strangers(port, 20, stop.clone());
        let pe1 = TcpBootstrap::connect(&env(1, 3, port, "t", false), t);
        let (took, e) = root.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        for h in attack {
            h.join().unwrap();
        }
        assert!(took < t + Duration::from_millis(500), "took {took:?}");
        let s = e.to_string();
        assert!(
            matches!(e.kind(), ErrorKind::Timeout { missing, .. } if missing == &vec![2]),
            "{s}"
        );
        assert!(s.contains("other connections were refused"), "{s}");
        // PE 1 was admitted, then learns that PE 0 is gone.
        let pe1 = pe1.unwrap();
        assert!(pe1.barrier("b").is_err());
    }

    #[test]
    fn an_unreachable_pe_0_is_named_clearly() {
        let port = free_port();
        let t0 = Instant::now();
        let e = TcpBootstrap::connect(&env(1, 2, port, "t", false), Duration::from_secs(1))
            .err()
            .unwrap();
        let s = e.to_string();
        assert!(t0.elapsed() < Duration::from_millis(1500));
        assert!(
            s.contains("connection refused: nothing listens there; is PE 0 running"),
            "{s}"
        );
        assert!(s.contains(&format!("127.0.0.1:{port}")), "{s}");
        assert!(s.contains("PE 0 did not arrive"), "{s}");
        assert!(!s.contains("os error"), "{s}");
    }

    #[test]
    fn one_node_jobs_meet_on_a_unix_socket_not_tcp() {
        // No TCP listener anywhere on this port: a stranger there finds nothing.
        let port = free_port();
        let token = format!("unix-test-{}", std::process::id());
        let path = crate::bootstrap::unix::rendezvous_path(
            &crate::bootstrap::unix::runtime_dir().unwrap(),
            token.as_bytes(),
        )
        .unwrap();
        // A socket left by an earlier, killed PE 0 of the same job identity.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let token = token.clone();
                std::thread::spawn(move || pe(r, 4, port, token, true))
            })
            .collect();
        let stranger = std::thread::spawn(move || TcpStream::connect(("127.0.0.1", port)).is_ok());
        for h in hs {
            h.join().unwrap();
        }
        assert!(!stranger.join().unwrap(), "something listens on TCP");
        assert!(
            !path.exists(),
            "the rendezvous socket outlived the rendezvous"
        );
        assert!(
            !path.with_extension("lock").exists(),
            "the rendezvous lock file outlived the rendezvous"
        );
    }
}
