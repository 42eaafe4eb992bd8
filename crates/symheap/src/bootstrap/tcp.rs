//! The built-in rendezvous: a star around PE 0, over TCP, or over a Unix socket when every PE
//! runs on one node (`conn.rs`).
//!
//! PE 0 listens at the rendezvous address; every other PE connects, presents the job token and
//! keeps the connection for the life of the job (admission: `accept.rs`). On PE 0 a hub thread owns all connections: it
//! gathers contributions, answers them, starts the clock on every collective when its first
//! contribution arrives (so a timeout can name who did not come, even when PE 0's own thread is
//! the one stuck), and turns a closed connection into "PE r exited" on every PE. A reader thread
//! on every other PE does the same for PE 0's connection. The hub is in `tcp/hub.rs`.

mod hub;

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::conn::{self, Conn, Listener};
use super::wire::{AbortClass, Msg};
use super::{accept, census};
use super::{Bootstrap, Health, LaunchEnv};
use crate::error::{bootstrap, Error, ErrorKind, Result};
use hub::Hub;

/// How long after the root's timeout a non-root PE gives up waiting for the root's verdict.
const LEAF_GRACE: Duration = Duration::from_secs(5);
/// How long PE 0's `fail_all` waits for the hub to send the failure to every PE.
const TELL_GRACE: Duration = Duration::from_secs(1);

/// State shared between the API thread and the rendezvous threads.
struct Shared {
    rank: usize,
    health: Arc<Health>,
    results: Mutex<HashMap<u64, Vec<Vec<u8>>>>,
    cv: Condvar,
    finalizing: AtomicBool,
    /// On PE 0: the hub has sent the job's failure to every other PE (see [`Shared::told_all`]).
    told: AtomicBool,
}

impl Shared {
    fn fail(&self, kind: ErrorKind) {
        self.health.fail(kind);
        // Take the lock so a waiter between its check and its wait cannot miss the wake-up.
        let _g = self.results.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    /// Called by the hub once it has sent the abort to every other PE.
    fn mark_told(&self) {
        self.told.store(true, Ordering::Release);
        let _g = self.results.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    /// Waits (at most `grace`) until the hub has sent the failure on, so a PE 0 that fails
    /// and then exits does not take the cause with it: the others would see only PE 0's
    /// connection close and blame PE 0 for a death it merely noticed first.
    fn told_all(&self, grace: Duration) {
        let until = Instant::now() + grace;
        let mut r = self.results.lock().unwrap_or_else(|p| p.into_inner());
        while !self.told.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= until {
                return;
            }
            r = self
                .cv
                .wait_timeout(r, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn deliver(&self, seq: u64, parts: Vec<Vec<u8>>) {
        let mut r = self.results.lock().unwrap_or_else(|p| p.into_inner());
        r.insert(seq, parts);
        self.cv.notify_all();
    }

    /// Waits for the result of collective `seq` until `deadline`.
    fn wait(
        &self,
        seq: u64,
        what: &str,
        deadline: Instant,
        call: &'static str,
    ) -> Result<Vec<Vec<u8>>> {
        let started = Instant::now();
        let mut r = self.results.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(parts) = r.remove(&seq) {
                return Ok(parts);
            }
            if let Some(kind) = self.health.failure() {
                return Err(Error::new(Some(self.rank), call, kind));
            }
            let now = Instant::now();
            if now >= deadline {
                let kind = ErrorKind::Timeout {
                    what: format!("{what} (no answer from PE 0, which coordinates the rendezvous)"),
                    waited: now - started,
                    missing: vec![0],
                };
                self.health.fail(kind.clone());
                return Err(Error::new(Some(self.rank), call, kind));
            }
            r = self
                .cv
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn abort_kind(
    origin: u32,
    class: AbortClass,
    reason: String,
    missing: Vec<u32>,
    waited_ms: u64,
) -> ErrorKind {
    match class {
        AbortClass::Exited => ErrorKind::PeerExited {
            peer: origin as usize,
            how: reason,
        },
        AbortClass::Error => ErrorKind::Aborted {
            origin: origin as usize,
            reason,
        },
        AbortClass::Timeout => ErrorKind::Timeout {
            what: reason,
            waited: Duration::from_millis(waited_ms),
            missing: missing.into_iter().map(|m| m as usize).collect(),
        },
        AbortClass::Mismatch => ErrorKind::CollectiveMismatch(reason),
    }
}

fn kind_to_abort(origin: usize, kind: &ErrorKind) -> Msg {
    let (origin, class, reason, missing, waited_ms) = match kind {
        ErrorKind::PeerExited { peer, how } => (*peer, AbortClass::Exited, how.clone(), vec![], 0),
        ErrorKind::Aborted { origin, reason } => {
            (*origin, AbortClass::Error, reason.clone(), vec![], 0)
        }
        ErrorKind::Timeout {
            what,
            waited,
            missing,
        } => (
            origin,
            AbortClass::Timeout,
            what.clone(),
            missing.iter().map(|&m| m as u32).collect(),
            waited.as_millis() as u64,
        ),
        ErrorKind::CollectiveMismatch(m) => (origin, AbortClass::Mismatch, m.clone(), vec![], 0),
        other => (origin, AbortClass::Error, other.to_string(), vec![], 0),
    };
    Msg::Abort {
        origin: origin as u32,
        class,
        reason,
        missing,
        waited_ms,
    }
}

enum Event {
    Local {
        seq: u64,
        what: String,
        data: Vec<u8>,
    },
    Remote {
        from: usize,
        msg: Msg,
    },
    Closed {
        from: usize,
        why: String,
    },
    Abort(Msg),
    /// A failure PE 0 noticed outside the hub (a second job at the rendezvous).
    Fail(ErrorKind),
    Finalize(Sender<Result<(), String>>),
}

/// PE 0's thread that keeps the rendezvous after admission (`accept::watch`) until finalize,
/// so that no other PE 0 can take it and a second job's PE is caught.
struct Watcher {
    stop: std::os::fd::OwnedFd,
    thread: JoinHandle<()>,
}

impl Watcher {
    fn start(
        listener: Listener,
        env: LaunchEnv,
        pending: accept::Pending,
        tx: Sender<Event>,
        shared: Arc<Shared>,
    ) -> Result<Watcher> {
        let (rd, wr) = nix::unistd::pipe().map_err(|e| io_err("init", e))?;
        let thread = std::thread::Builder::new()
            .name("symheap-rdv-watch".into())
            .spawn(move || {
                let stop = std::os::fd::AsFd::as_fd(&rd);
                accept::watch(&listener, &env, pending, stop, |why| {
                    let kind = ErrorKind::Bootstrap(why);
                    // Once the hub has finished, PE 0 alone can still report it.
                    if let Err(mpsc::SendError(Event::Fail(kind))) = tx.send(Event::Fail(kind)) {
                        shared.fail(kind);
                    }
                });
                drop(listener);
            })
            .map_err(|e| io_err("init", e))?;
        Ok(Watcher { stop: wr, thread })
    }

    /// Stops watching and gives the rendezvous up (the socket goes, the port is free).
    fn stop(self) {
        let _ = nix::unistd::write(&self.stop, &[1]);
        let _ = self.thread.join();
    }
}

enum Role {
    Root {
        hub_tx: Mutex<Sender<Event>>,
        hub: Mutex<Option<JoinHandle<()>>>,
        watcher: Mutex<Option<Watcher>>,
    },
    Leaf {
        writer: Mutex<BufWriter<Conn>>,
        stream: Conn,
        reader: Mutex<Option<JoinHandle<()>>>,
    },
}

/// The built-in TCP rendezvous (see the module documentation).
pub struct TcpBootstrap {
    rank: usize,
    world: usize,
    timeout: Duration,
    seq: AtomicU64,
    shared: Arc<Shared>,
    role: Role,
}

fn io_err(call: &'static str, what: impl std::fmt::Display) -> Error {
    bootstrap(call, what.to_string())
}

impl TcpBootstrap {
    /// Joins (or, on rank 0, hosts) the rendezvous described by `env`, waiting at most
    /// `timeout` for every PE to connect.
    pub fn connect(env: &LaunchEnv, timeout: Duration) -> Result<TcpBootstrap> {
        let twins = census::twins(env, timeout);
        if !twins.is_empty() {
            let place = conn::Target::of(env)?.to_string();
            let why = census::message(env, &place, &twins);
            return Err(conn::announce(env, why, timeout));
        }
        let shared = Arc::new(Shared {
            rank: env.rank,
            health: Arc::new(Health::new()),
            results: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            finalizing: AtomicBool::new(false),
            told: AtomicBool::new(false),
        });
        let role = if env.rank == 0 {
            Self::host(env, timeout, &shared)?
        } else {
            Self::join(env, timeout, &shared)?
        };
        Ok(TcpBootstrap {
            rank: env.rank,
            world: env.world,
            timeout,
            seq: AtomicU64::new(0),
            shared,
            role,
        })
    }

    fn host(env: &LaunchEnv, timeout: Duration, shared: &Arc<Shared>) -> Result<Role> {
        let Some(listener) = Listener::bind(env)? else {
            // The holder may be between taking the rendezvous and listening: a few seconds.
            let patience = timeout.min(Duration::from_secs(5));
            return Err(conn::second_root(env, patience, "").with_pe(0));
        };
        let world = env.world;
        let (conns, pending) = accept::admit_all(&listener, env, timeout)?;

        let (tx, rx) = mpsc::channel();
        let mut writers: Vec<Option<BufWriter<Conn>>> = (0..world).map(|_| None).collect();
        for (rank, c) in conns.into_iter().enumerate() {
            let Some(stream) = c else { continue };
            stream
                .set_nonblocking(false)
                .map_err(|e| io_err("init", e))?;
            stream
                .set_read_timeout(None)
                .map_err(|e| io_err("init", e))?;
            let _ = stream.set_nodelay(true);
            writers[rank] = Some(BufWriter::new(
                stream.try_clone().map_err(|e| io_err("init", e))?,
            ));
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("symheap-rdv-{rank}"))
                .spawn(move || {
                    let mut r = BufReader::new(stream);
                    loop {
                        match Msg::read_from(&mut r) {
                            Ok(msg) => {
                                if tx.send(Event::Remote { from: rank, msg }).is_err() {
                                    return;
                                }
                            }
                            Err(e) => {
                                let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                                    "its connection closed".to_string()
                                } else {
                                    format!("its connection failed: {e}")
                                };
                                let _ = tx.send(Event::Closed { from: rank, why });
                                return;
                            }
                        }
                    }
                })
                .map_err(|e| io_err("init", e))?;
        }
        let hub_shared = shared.clone();
        let hub = std::thread::Builder::new()
            .name("symheap-hub".into())
            .spawn(move || Hub::new(world, timeout, hub_shared, writers).run(rx))
            .map_err(|e| io_err("init", e))?;
        let watcher = Watcher::start(listener, env.clone(), pending, tx.clone(), shared.clone())?;
        Ok(Role::Root {
            hub_tx: Mutex::new(tx),
            hub: Mutex::new(Some(hub)),
            watcher: Mutex::new(Some(watcher)),
        })
    }

    fn join(env: &LaunchEnv, timeout: Duration, shared: &Arc<Shared>) -> Result<Role> {
        let stream = conn::join(env, timeout)?;
        let read_half = stream.try_clone().map_err(|e| io_err("init", e))?;
        let writer = BufWriter::new(stream.try_clone().map_err(|e| io_err("init", e))?);
        let sh = shared.clone();
        let reader = std::thread::Builder::new()
            .name("symheap-rdv".into())
            .spawn(move || {
                let mut r = BufReader::new(read_half);
                loop {
                    match Msg::read_from(&mut r) {
                        Ok(Msg::Gathered { seq, parts }) => sh.deliver(seq, parts),
                        Ok(Msg::Abort {
                            origin,
                            class,
                            reason,
                            missing,
                            waited_ms,
                        }) => sh.fail(abort_kind(origin, class, reason, missing, waited_ms)),
                        Ok(_) => {}
                        Err(e) => {
                            if !sh.finalizing.load(Ordering::Acquire) {
                                let how = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                                    "its connection to this PE closed".to_string()
                                } else {
                                    format!("its connection to this PE failed: {e}")
                                };
                                sh.fail(ErrorKind::PeerExited { peer: 0, how });
                            }
                            return;
                        }
                    }
                }
            })
            .map_err(|e| io_err("init", e))?;
        Ok(Role::Leaf {
            writer: Mutex::new(writer),
            stream,
            reader: Mutex::new(Some(reader)),
        })
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.world
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_gather(&self, what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.shared.health.check(self.rank, "all_gather")?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let deadline = match &self.role {
            Role::Root { hub_tx, .. } => {
                let ev = Event::Local {
                    seq,
                    what: what.to_string(),
                    data: data.to_vec(),
                };
                hub_tx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .send(ev)
                    .map_err(|_| io_err("all_gather", "the rendezvous hub has stopped"))?;
                // The hub enforces the timeout and names the missing PEs; this bound only
                // guards against the hub itself being gone.
                Instant::now() + self.timeout + LEAF_GRACE
            }
            Role::Leaf { writer, .. } => {
                let msg = Msg::Contribute {
                    seq,
                    what: what.to_string(),
                    data: data.to_vec(),
                };
                let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = msg.write_to(&mut *w) {
                    drop(w);
                    // The reader thread usually explains this better (PE 0 exited).
                    std::thread::sleep(Duration::from_millis(50));
                    self.shared.health.check(self.rank, "all_gather")?;
                    return Err(
                        io_err("all_gather", format!("sending to PE 0: {e}")).with_pe(self.rank)
                    );
                }
                Instant::now() + self.timeout + LEAF_GRACE
            }
        };
        let parts = self.shared.wait(seq, what, deadline, "all_gather")?;
        if parts.len() != self.world {
            return Err(io_err(
                "all_gather",
                format!(
                    "collective #{seq} returned {} parts for {} PEs",
                    parts.len(),
                    self.world
                ),
            )
            .with_pe(self.rank));
        }
        Ok(parts)
    }

    fn abort(&self, reason: &str) {
        self.fail_all(ErrorKind::Aborted {
            origin: self.rank,
            reason: reason.to_string(),
        });
    }

    fn fail_all(&self, kind: ErrorKind) {
        let first = self.shared.health.fail(kind.clone());
        if !first {
            return;
        }
        let msg = kind_to_abort(self.rank, &kind);
        match &self.role {
            Role::Root { hub_tx, .. } => {
                let sent = hub_tx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .send(Event::Abort(msg));
                if sent.is_ok() {
                    self.shared.told_all(TELL_GRACE);
                }
            }
            Role::Leaf { writer, .. } => {
                if let Ok(mut w) = writer.try_lock() {
                    let _ = msg.write_to(&mut *w);
                }
            }
        }
        self.shared.fail(kind);
    }

    fn check(&self) -> Result<()> {
        self.shared.health.check(self.rank, "check")
    }

    fn health(&self) -> &Arc<Health> {
        &self.shared.health
    }

    fn finalize(&self) -> Result<()> {
        if self.shared.finalizing.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let result = match &self.role {
            Role::Root {
                hub_tx,
                hub,
                watcher,
            } => {
                let (tx, rx) = mpsc::channel();
                let sent = hub_tx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .send(Event::Finalize(tx))
                    .is_ok();
                let r = if sent {
                    rx.recv_timeout(self.timeout + LEAF_GRACE)
                        .unwrap_or_else(|_| Err("the rendezvous hub did not finish".into()))
                } else {
                    Ok(())
                };
                if let Some(h) = hub.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    let _ = h.join();
                }
                if let Some(w) = watcher.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    w.stop();
                }
                r.map_err(|e| io_err("finalize", e).with_pe(0))
            }
            Role::Leaf {
                writer,
                stream,
                reader,
            } => {
                {
                    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = Msg::Bye.write_to(&mut *w);
                }
                let _ = stream.shutdown(Shutdown::Write);
                // PE 0 closes once every PE said Bye; waiting for that keeps PE 0's listener
                // from outliving us by surprise and makes a clean exit order.
                if let Some(h) = reader.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    let (done_tx, done_rx) = mpsc::channel::<()>();
                    let waiter = std::thread::spawn(move || {
                        let _ = h.join();
                        let _ = done_tx.send(());
                    });
                    if done_rx.recv_timeout(self.timeout).is_err() {
                        let _ = stream.shutdown(Shutdown::Both);
                    }
                    let _ = waiter.join();
                }
                Ok(())
            }
        };
        // A failure that arrived while the job was finalizing (PE 0 found a second job at its
        // rendezvous) is this finalize's: the job's results cannot be trusted.
        let result = match self.shared.health.failure() {
            Some(kind) => Err(Error::new(Some(self.rank), "finalize", kind)),
            None => result,
        };
        self.shared.health.set_finalized();
        result
    }
}

impl Drop for TcpBootstrap {
    fn drop(&mut self) {
        match &self.role {
            Role::Root {
                hub_tx,
                hub,
                watcher,
            } => {
                if let Some(w) = watcher.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    w.stop();
                }
                if !self.shared.finalizing.load(Ordering::Acquire) {
                    // Dropped without finalize: tell the others why they are losing PE 0.
                    let msg = Msg::Abort {
                        origin: 0,
                        class: AbortClass::Exited,
                        reason: "it shut down its symheap context without finalize".into(),
                        missing: vec![],
                        waited_ms: 0,
                    };
                    let tx = hub_tx.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = tx.send(Event::Abort(msg));
                    let (ftx, frx) = mpsc::channel();
                    let _ = tx.send(Event::Finalize(ftx));
                    drop(tx);
                    let _ = frx.recv_timeout(Duration::from_millis(200));
                }
                if let Some(h) = hub.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    if self.shared.finalizing.load(Ordering::Acquire) {
                        let _ = h.join();
                    }
                }
            }
            Role::Leaf { stream, .. } => {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::Launcher;

    fn env(rank: usize, world: usize, port: u16, token: &str) -> LaunchEnv {
        LaunchEnv {
            launcher: Launcher::TorchStyle,
            rank,
            world,
            local_rank: Some(rank),
            addr: "127.0.0.1".into(),
            port,
            token: token.as_bytes().to_vec(),
            token_source: crate::bootstrap::TokenSource::Given,
            one_node: false,
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn threads_gather_and_finalize() {
        let port = free_port();
        let world = 4;
        let handles: Vec<_> = (0..world)
            .map(|r| {
                std::thread::spawn(move || {
                    let b =
                        TcpBootstrap::connect(&env(r, world, port, "t"), Duration::from_secs(20))
                            .unwrap();
                    for round in 0..20u8 {
                        let parts = b.all_gather("test", &[r as u8, round]).unwrap();
                        for (p, part) in parts.iter().enumerate() {
                            assert_eq!(part, &vec![p as u8, round]);
                        }
                    }
                    let got = b.broadcast("bcast", 2, &[r as u8 * 10]).unwrap();
                    assert_eq!(got, vec![20]);
                    b.barrier("last").unwrap();
                    b.finalize().unwrap();
                    assert!(matches!(
                        b.check().unwrap_err().kind(),
                        ErrorKind::Finalized
                    ));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    /// PE 0 that notices a failure first and exits right after must not take the cause with
    /// it: `fail_all` returns only once the hub has sent it to every PE.
    #[test]
    fn root_fail_all_returns_once_every_pe_was_told() {
        let port = free_port();
        let t = Duration::from_secs(10);
        let leaf = std::thread::spawn(move || {
            let b = TcpBootstrap::connect(&env(1, 2, port, "f"), t).unwrap();
            b.barrier("up").unwrap();
            let until = Instant::now() + Duration::from_secs(5);
            while b.check().is_ok() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            b.check().unwrap_err()
        });
        let root = TcpBootstrap::connect(&env(0, 2, port, "f"), t).unwrap();
        root.barrier("up").unwrap();
        root.fail_all(ErrorKind::PeerExited {
            peer: 7,
            how: "killed".into(),
        });
        assert!(root.shared.told.load(Ordering::Acquire));
        let e = leaf.join().unwrap();
        assert!(
            matches!(e.kind(), ErrorKind::PeerExited { peer: 7, .. }),
            "{e}"
        );
    }

    #[test]
    fn wrong_token_is_refused() {
        let port = free_port();
        let root = std::thread::spawn(move || {
            TcpBootstrap::connect(&env(0, 2, port, "right"), Duration::from_secs(3)).err()
        });
        std::thread::sleep(Duration::from_millis(100));
        let e = TcpBootstrap::connect(&env(1, 2, port, "wrong"), Duration::from_secs(3))
            .err()
            .unwrap();
        // Refused at once, naming the port and both job identities.
        let s = e.to_string();
        for want in [
            format!("127.0.0.1:{port}"),
            crate::bootstrap::auth::fingerprint(b"right"),
            crate::bootstrap::auth::fingerprint(b"wrong"),
        ] {
            assert!(s.contains(&want), "{want} not in {s}");
        }
        // The root never got its PE 1 and says so.
        let e = root.join().unwrap().unwrap();
        assert!(
            matches!(e.kind(), ErrorKind::Timeout { missing, .. } if missing == &vec![1]),
            "{e}"
        );
    }

    #[test]
    fn timeout_names_the_missing_pe() {
        let port = free_port();
        let t = Duration::from_millis(1500);
        let a = std::thread::spawn(move || {
            let b = TcpBootstrap::connect(&env(0, 3, port, "x"), t).unwrap();
            b.barrier("barrier_all").unwrap_err()
        });
        let c = std::thread::spawn(move || {
            let b = TcpBootstrap::connect(&env(1, 3, port, "x"), t).unwrap();
            b.barrier("barrier_all").unwrap_err()
        });
        let b2 = TcpBootstrap::connect(&env(2, 3, port, "x"), t).unwrap();
        let e0 = a.join().unwrap();
        let e1 = c.join().unwrap();
        for e in [e0, e1] {
            match e.kind() {
                ErrorKind::Timeout { missing, .. } => assert_eq!(missing, &vec![2]),
                k => panic!("{k}"),
            }
        }
        assert!(b2.check().is_err());
    }
}
