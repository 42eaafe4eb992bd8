//! A `symheap::bootstrap::Bootstrap` over a Python object: a key-value store with
//! `set/get/wait` (torch.distributed's store), or a communicator with `allgather` (mpi4py).
//!
//! Over a store, all_gather number `seq` has every PE set `symheap/{gen}/{seq}/{rank}` and read
//! every PE's key; a barrier is an all_gather of nothing. The GIL is taken only around the
//! calls into the Python object. A PE waits for a key by polling the store's `check` (a
//! blocking `wait` that times out makes torch log a warning per slice), so it notices between
//! polls that the job failed (the `abort` key, or its own health), and gives up after the
//! store's timeout.
//!
//! A store has no connection that closes when a PE dies, so at the first all_gather every PE
//! publishes which process it is ([`ProcId`]), and a watcher thread watches the PEs of its node
//! ([`PeerWatch`]): a PE whose process ends is named ("PE r exited") within a poll on every PE
//! of its node, and through the `abort` key, which every PE's watcher reads, on the other
//! nodes. A PE alone on its node that dies is noticed only at the timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use symheap::bootstrap::{Bootstrap, Health, PeerWatch, ProcId};
use symheap::{Error, ErrorKind, Result};

use crate::errors::value_error;

/// Where the rendezvous runs.
pub enum Source {
    /// A key-value store with `set(key, value)`, `get(key) -> bytes` and optionally
    /// `wait(keys, timedelta)`, `check(keys) -> bool`, `delete_key(key)`, `timeout`.
    Store(Py<PyAny>),
    /// A communicator with `allgather(obj) -> list` (and `Get_rank`/`Get_size`).
    Comm(Py<PyAny>),
}

/// Distinguishes successive contexts of one process on the same store: PEs initialise in the
/// same order, so the n-th init of every PE uses the same generation.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// How long one store wait lasts before the failure state is checked again, on a store that
/// has `wait` but no `check`.
const SLICE: Duration = Duration::from_millis(100);

/// The longest pause between two polls of a key with `check`: how late a PE may see a key
/// (or the job's failure) while it waits on the store.
const POLL_MAX: Duration = Duration::from_millis(10);

/// How often the watcher thread looks for a failure another PE published; also the longest a
/// watched PE's death goes unseen where the kernel has no pidfds.
const WATCH: Duration = Duration::from_millis(200);

/// The bootstrap over a Python store or communicator.
pub struct PyBootstrap {
    shared: Arc<Shared>,
    watcher: Arc<Watcher>,
}

/// The watcher thread's handle, kept by the Python context so that it can stop the thread and
/// wait for it with the GIL released (the thread takes the GIL to poll the store).
pub struct Watcher {
    shared: Arc<Shared>,
    handle: Mutex<Option<JoinHandle<()>>>,
    /// Set once the PEs' identities were exchanged (at the first all_gather).
    started: Mutex<bool>,
}

impl Watcher {
    /// Stops the thread and waits for it. Call with the GIL released.
    pub fn stop_and_join(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let h = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

/// The state the bootstrap and its watcher thread share.
struct Shared {
    stop: AtomicBool,
    source: Source,
    rank: usize,
    size: usize,
    timeout: Duration,
    health: Arc<Health>,
    prefix: String,
    seq: AtomicU64,
    has_wait: bool,
    has_check: bool,
    has_delete: bool,
}

fn get_usize(obj: &Bound<'_, PyAny>, names: &[&str]) -> Option<usize> {
    for n in names {
        if let Ok(v) = obj.getattr(*n) {
            let v = if v.is_callable() {
                v.call0().ok()
            } else {
                Some(v)
            };
            if let Some(x) = v.and_then(|v| v.extract::<usize>().ok()) {
                return Some(x);
            }
        }
    }
    None
}

fn is_timeout(py: Python<'_>, e: &PyErr) -> bool {
    if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) {
        return true;
    }
    let name = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    let msg = e.to_string().to_ascii_lowercase();
    name.contains("Timeout") || msg.contains("timeout") || msg.contains("timed out")
}

impl PyBootstrap {
    /// Checks the object and the rank/world it implies.
    pub fn new(
        py: Python<'_>,
        source: Source,
        rank: Option<usize>,
        world: Option<usize>,
        fallback_timeout: Duration,
    ) -> PyResult<PyBootstrap> {
        let (obj, what) = match &source {
            Source::Store(s) => (s.bind(py).clone(), "store"),
            Source::Comm(c) => (c.bind(py).clone(), "comm"),
        };
        let (rank, size) = match &source {
            Source::Store(_) => {
                for m in ["set", "get"] {
                    if !obj.hasattr(m)? {
                        return Err(value_error(format!(
                            "store has no {m}() method (expected torch.distributed's store or an object with set/get/wait)"
                        )));
                    }
                }
                match (rank, world) {
                    (Some(r), Some(w)) => (r, w),
                    _ => return Err(value_error("init(store=...) needs rank= and world_size=")),
                }
            }
            Source::Comm(_) => {
                if !obj.hasattr("allgather")? {
                    return Err(value_error(
                        "comm has no allgather() method (expected an mpi4py communicator)",
                    ));
                }
                let r = rank.or_else(|| get_usize(&obj, &["Get_rank", "rank"]));
                let w = world.or_else(|| get_usize(&obj, &["Get_size", "size"]));
                match (r, w) {
                    (Some(r), Some(w)) => (r, w),
                    _ => {
                        return Err(value_error(
                            "cannot tell the rank and size of comm; pass rank= and world_size=",
                        ))
                    }
                }
            }
        };
        if size == 0 || rank >= size {
            return Err(value_error(format!(
                "rank {rank} is not in a world of {size} PEs"
            )));
        }
        let timeout = match &source {
            Source::Store(_) => obj
                .getattr("timeout")
                .and_then(|t| t.call_method0("total_seconds"))
                .and_then(|t| t.extract::<f64>())
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                // A store's "forever" (timedelta.max) becomes the longest wait symheap takes.
                .map(|s| {
                    s.clamp(
                        symheap::config::MIN_TIMEOUT_SECS,
                        symheap::config::MAX_TIMEOUT_SECS,
                    )
                })
                .map(Duration::from_secs_f64)
                .unwrap_or(fallback_timeout),
            Source::Comm(_) => fallback_timeout,
        };
        let _ = what;
        let gen = GENERATION.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            has_wait: obj.hasattr("wait")?,
            has_check: obj.hasattr("check")?,
            has_delete: obj.hasattr("delete_key")?,
            source,
            rank,
            size,
            timeout,
            health: Arc::new(Health::new()),
            prefix: format!("symheap/{gen}"),
            seq: AtomicU64::new(0),
        });
        Ok(PyBootstrap {
            watcher: Arc::new(Watcher {
                shared: shared.clone(),
                handle: Mutex::new(None),
                started: Mutex::new(false),
            }),
            shared,
        })
    }

    /// The handle that stops the watcher thread.
    pub fn watcher(&self) -> Arc<Watcher> {
        self.watcher.clone()
    }

    /// Collective, at the first all_gather of every PE: exchanges the PEs' process identities
    /// and starts the watcher thread over the PEs of this node (and the `abort` key).
    fn start_watch(&self) -> Result<()> {
        let mut started = self
            .watcher
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *started {
            return Ok(());
        }
        *started = true;
        let s = &self.shared;
        let me = ProcId::me().map(|p| p.encode()).unwrap_or_default();
        let all = s.gather("process identities", &me)?;
        let ids: Vec<Option<ProcId>> = all.iter().map(|b| ProcId::decode(b)).collect();
        let peers = PeerWatch::new(&ids, s.rank);
        let reads_abort = matches!(s.source, Source::Store(_)) && s.has_check;
        if peers.is_empty() && !reads_abort {
            return Ok(());
        }
        let sh = s.clone();
        let handle = std::thread::Builder::new()
            .name("symheap-store-watch".into())
            .spawn(move || sh.watch(peers, reads_abort))
            .ok();
        *self
            .watcher
            .handle
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = handle;
        Ok(())
    }
}

impl Drop for PyBootstrap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
    }
}

impl Shared {
    /// True while the watcher has work: the job runs and this context was not closed.
    fn watching(&self) -> bool {
        !self.stop.load(Ordering::Acquire)
            && !self.health.is_failed()
            && !self.health.is_finalized()
    }

    /// The watcher thread: while the job is healthy, waits for a PE of this node to die
    /// (`peers`) and looks for a failure another PE published on the store (`reads_abort`),
    /// so PEs waiting in shared memory (barriers, signals) notice a death or an abort instead
    /// of waiting for their timeout. A death seen here is published like any failure, so the
    /// PEs of other nodes learn it from the `abort` key.
    fn watch(&self, mut peers: PeerWatch, reads_abort: bool) {
        while self.watching() {
            let gone = peers.wait(WATCH);
            if !self.watching() {
                break;
            }
            if let Some((peer, how)) = gone {
                let kind = ErrorKind::PeerExited { peer, how };
                if self.health.fail(kind.clone()) {
                    self.publish(&kind);
                }
                break;
            }
            if !reads_abort {
                continue;
            }
            let found = Python::try_attach(|py| {
                let key = self.abort_key();
                self.obj()
                    .bind(py)
                    .call_method1("check", (vec![key],))
                    .and_then(|r| r.extract::<bool>())
                    .unwrap_or(false)
            });
            match found {
                None => break,
                Some(false) => {}
                Some(true) => {
                    if let Ok(Some(kind)) = self.peer_failure("watch") {
                        self.health.fail(kind);
                    }
                    break;
                }
            }
        }
    }

    fn obj(&self) -> &Py<PyAny> {
        match &self.source {
            Source::Store(s) | Source::Comm(s) => s,
        }
    }

    fn abort_key(&self) -> String {
        format!("{}/abort", self.prefix)
    }

    /// Runs `f` on the object with the GIL held; a Python error becomes a bootstrap error that
    /// fails the job here.
    fn call<T>(
        &self,
        what: &str,
        method: &str,
        f: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyAny>) -> PyResult<T>,
    ) -> Result<T> {
        let r = Python::attach(|py| {
            f(py, self.obj().bind(py)).map_err(|e| format!("{method}() failed: {e}"))
        });
        r.map_err(|m| {
            let kind = ErrorKind::Bootstrap(m);
            self.health.fail(kind.clone());
            Error::new(Some(self.rank), what.to_string(), kind)
        })
    }

    /// Waits a while (at most `left`) for `key`; true once it is set. With `check`, one poll
    /// and then a pause of `nap`, which doubles up to [`POLL_MAX`]; with only `wait`, a slice.
    fn wait_slice(
        &self,
        what: &str,
        key: &str,
        nap: &mut Duration,
        left: Duration,
    ) -> Result<bool> {
        if self.has_check {
            let present = self.call(what, "check", |_py, s| {
                s.call_method1("check", (vec![key.to_string()],))?
                    .extract::<bool>()
            })?;
            if !present {
                std::thread::sleep((*nap).min(left));
                *nap = (*nap * 2).min(POLL_MAX);
            }
            Ok(present)
        } else if self.has_wait {
            let slice = SLICE.min(left.max(Duration::from_millis(1)));
            let r = Python::attach(|py| -> PyResult<std::result::Result<bool, String>> {
                let td = py
                    .import("datetime")?
                    .getattr("timedelta")?
                    .call1((0, slice.as_secs_f64()))?;
                match self
                    .obj()
                    .bind(py)
                    .call_method1("wait", (vec![key.to_string()], td))
                {
                    Ok(_) => Ok(Ok(true)),
                    Err(e) if is_timeout(py, &e) => Ok(Ok(false)),
                    Err(e) => Ok(Err(format!("wait() failed: {e}"))),
                }
            });
            match r {
                Ok(Ok(b)) => Ok(b),
                Ok(Err(m)) => Err(self.fail_here(what, ErrorKind::Bootstrap(m))),
                Err(e) => {
                    Err(self.fail_here(what, ErrorKind::Bootstrap(format!("wait() failed: {e}"))))
                }
            }
        } else {
            // Only a blocking get: it waits as long as the store lets it.
            Ok(true)
        }
    }

    fn fail_here(&self, what: &str, kind: ErrorKind) -> Error {
        self.health.fail(kind.clone());
        Error::new(Some(self.rank), what.to_string(), kind)
    }

    /// The failure another PE published, if any.
    fn peer_failure(&self, what: &str) -> Result<Option<ErrorKind>> {
        if !self.has_check {
            return Ok(None);
        }
        let key = self.abort_key();
        let found = self.call(what, "check", |_py, s| {
            s.call_method1("check", (vec![key.clone()],))?
                .extract::<bool>()
        })?;
        if !found {
            return Ok(None);
        }
        let raw = self.call(what, "get", |_py, s| {
            Ok(s.call_method1("get", (key.as_str(),))?
                .cast::<PyBytes>()?
                .as_bytes()
                .to_vec())
        })?;
        let text = String::from_utf8_lossy(&raw).to_string();
        let (origin, reason) = text.split_once('\n').unwrap_or(("0", text.as_str()));
        if let Some(peer) = origin.strip_prefix("exited ").and_then(|p| p.parse().ok()) {
            return Ok(Some(ErrorKind::PeerExited {
                peer,
                how: reason.to_string(),
            }));
        }
        Ok(Some(ErrorKind::Aborted {
            origin: origin.parse().unwrap_or(0),
            reason: reason.to_string(),
        }))
    }

    /// Publishes the job's failure for the others (best effort, never blocks for long): a PE's
    /// death as `exited PEER\nHOW`, so other nodes name that PE, anything else as
    /// `ORIGIN\nREASON`.
    fn publish(&self, kind: &ErrorKind) {
        let msg = match kind {
            ErrorKind::PeerExited { peer, how } => format!("exited {peer}\n{how}"),
            other => format!("{}\n{other}", self.rank),
        };
        self.publish_raw(msg);
    }

    fn publish_raw(&self, msg: String) {
        if !matches!(self.source, Source::Store(_)) {
            return;
        }
        let key = self.abort_key();
        let _ = Python::try_attach(|py| {
            let _ = self
                .obj()
                .bind(py)
                .call_method1("set", (key, PyBytes::new(py, msg.as_bytes())));
        });
    }

    fn gather_store(&self, what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let key = |r: usize| format!("{}/{seq}/{r}", self.prefix);
        let mine = key(self.rank);
        self.call(what, "set", |py, s| {
            s.call_method1("set", (mine.as_str(), PyBytes::new(py, data)))
                .map(drop)
        })?;
        let start = Instant::now();
        let mut out = Vec::with_capacity(self.size);
        for r in 0..self.size {
            if r == self.rank {
                out.push(data.to_vec());
                continue;
            }
            let k = key(r);
            let mut nap = Duration::from_micros(100);
            let mut looked = Instant::now();
            loop {
                self.health.check(self.rank, "bootstrap")?;
                let left = self.timeout.saturating_sub(start.elapsed());
                if self.wait_slice(what, &k, &mut nap, left)? {
                    break;
                }
                // The watcher thread reads the abort key too; this covers a PE whose watcher
                // could not start, at the same pace.
                if looked.elapsed() >= WATCH {
                    looked = Instant::now();
                    if let Some(kind) = self.peer_failure(what)? {
                        return Err(self.fail_here(what, kind));
                    }
                }
                if start.elapsed() >= self.timeout {
                    let kind = ErrorKind::Timeout {
                        what: format!("{what} (rendezvous over the store)"),
                        waited: start.elapsed(),
                        missing: (r..self.size).filter(|&p| p != self.rank).collect(),
                    };
                    self.publish(&kind);
                    return Err(self.fail_here(what, kind));
                }
            }
            let v = self.call(what, "get", |_py, s| {
                Ok(s.call_method1("get", (k.as_str(),))?
                    .cast::<PyBytes>()?
                    .as_bytes()
                    .to_vec())
            })?;
            out.push(v);
        }
        // Every PE has set its key of this round, so all finished reading the previous one.
        if seq > 0 && self.has_delete {
            let old = format!("{}/{}/{}", self.prefix, seq - 1, self.rank);
            Python::attach(|py| {
                let _ = self.obj().bind(py).call_method1("delete_key", (old,));
            });
        }
        Ok(out)
    }

    fn gather(&self, what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self.source {
            Source::Store(_) => self.gather_store(what, data),
            Source::Comm(_) => self.gather_comm(what, data),
        }
    }

    fn gather_comm(&self, what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let parts = self.call(what, "allgather", |py, c| {
            let list = c.call_method1("allgather", (PyBytes::new(py, data),))?;
            let list = list.cast::<PyList>()?;
            list.iter()
                .map(|p| Ok(p.cast::<PyBytes>()?.as_bytes().to_vec()))
                .collect::<PyResult<Vec<Vec<u8>>>>()
        })?;
        if parts.len() != self.size {
            return Err(self.fail_here(
                what,
                ErrorKind::Bootstrap(format!(
                    "allgather returned {} parts for {} PEs",
                    parts.len(),
                    self.size
                )),
            ));
        }
        Ok(parts)
    }
}

impl Bootstrap for PyBootstrap {
    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn all_gather(&self, what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let s = &self.shared;
        s.health.check(s.rank, "bootstrap")?;
        self.start_watch()?;
        s.gather(what, data)
    }

    fn abort(&self, reason: &str) {
        let s = &self.shared;
        s.health.fail(ErrorKind::Aborted {
            origin: s.rank,
            reason: reason.to_string(),
        });
        s.publish_raw(format!("{}\n{reason}", s.rank));
        self.shared.stop.store(true, Ordering::Release);
    }

    fn fail_all(&self, kind: ErrorKind) {
        let s = &self.shared;
        if s.health.fail(kind.clone()) {
            s.publish(&kind);
        }
        self.shared.stop.store(true, Ordering::Release);
    }

    fn check(&self) -> Result<()> {
        self.shared.health.check(self.shared.rank, "check")
    }

    fn health(&self) -> &Arc<Health> {
        &self.shared.health
    }

    fn finalize(&self) -> Result<()> {
        self.shared.health.set_finalized();
        self.shared.stop.store(true, Ordering::Release);
        Ok(())
    }
}
