//! PE 0's hub thread: it owns the connections to every other PE, gathers the contributions to
//! each collective and answers them, times every collective from its first contribution, and
//! turns a failure anywhere into an abort on every PE.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::net::Shutdown;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{abort_kind, kind_to_abort, Event, Shared};
use crate::bootstrap::conn::Conn;
use crate::bootstrap::wire::Msg;
use crate::error::ErrorKind;

struct Pending {
    what: String,
    parts: Vec<Option<Vec<u8>>>,
    since: Instant,
}

/// PE 0's coordinator thread.
pub(super) struct Hub {
    world: usize,
    timeout: Duration,
    shared: Arc<Shared>,
    writers: Vec<Option<BufWriter<Conn>>>,
    bye: Vec<bool>,
    closed: Vec<bool>,
    pending: BTreeMap<u64, Pending>,
    failed: bool,
    finalize: Option<(Sender<Result<(), String>>, Instant)>,
}

impl Hub {
    pub(super) fn new(
        world: usize,
        timeout: Duration,
        shared: Arc<Shared>,
        writers: Vec<Option<BufWriter<Conn>>>,
    ) -> Hub {
        Hub {
            world,
            timeout,
            shared,
            writers,
            bye: vec![false; world],
            closed: vec![false; world],
            pending: BTreeMap::new(),
            failed: false,
            finalize: None,
        }
    }

    fn send(&mut self, to: usize, msg: &Msg) {
        if let Some(w) = self.writers[to].as_mut() {
            let frame = msg.encode();
            if w.write_all(&frame).and_then(|_| w.flush()).is_err() {
                self.writers[to] = None;
            }
        }
    }

    fn broadcast(&mut self, msg: &Msg) {
        for to in 1..self.world {
            self.send(to, msg);
        }
    }

    fn fail(&mut self, kind: ErrorKind, origin: usize) {
        if self.failed {
            return;
        }
        self.failed = true;
        let msg = kind_to_abort(origin, &kind);
        self.broadcast(&msg);
        self.shared.fail(kind);
        self.shared.mark_told();
    }

    fn contribute(&mut self, from: usize, seq: u64, what: String, data: Vec<u8>) {
        let world = self.world;
        let p = self.pending.entry(seq).or_insert_with(|| Pending {
            what,
            parts: vec![None; world],
            since: Instant::now(),
        });
        p.parts[from] = Some(data);
        if p.parts.iter().all(Option::is_some) {
            let p = self.pending.remove(&seq).expect("present");
            let parts: Vec<Vec<u8>> = p.parts.into_iter().map(|x| x.unwrap_or_default()).collect();
            let msg = Msg::Gathered { seq, parts };
            self.broadcast(&msg);
            if let Msg::Gathered { parts, .. } = msg {
                self.shared.deliver(seq, parts);
            }
        }
    }

    fn all_left(&self) -> bool {
        (1..self.world).all(|r| self.bye[r] || self.closed[r])
    }

    /// Serves events until finalize completes (every other PE said Bye or closed, or the
    /// timeout passed) or every sender of `rx` is gone.
    pub(super) fn run(mut self, rx: Receiver<Event>) {
        loop {
            if self.finish_finalize() {
                return;
            }
            match rx.recv_timeout(self.next_wait()) {
                Ok(ev) => self.on_event(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if !self.failed {
                self.check_timeouts();
            }
        }
    }

    /// Once finalize was asked for and every other PE has left (or the timeout passed): closes
    /// every connection, answers the finalizing thread and returns true.
    fn finish_finalize(&mut self) -> bool {
        let Some((_, until)) = &self.finalize else {
            return false;
        };
        if !(self.all_left() || Instant::now() >= *until) {
            return false;
        }
        let (tx, _) = self.finalize.take().expect("present");
        let stragglers: Vec<usize> = (1..self.world)
            .filter(|&r| !(self.bye[r] || self.closed[r]))
            .collect();
        for w in self.writers.iter_mut().flatten() {
            let _ = w.flush();
            let _ = w.get_ref().shutdown(Shutdown::Both);
        }
        let _ = tx.send(if stragglers.is_empty() {
            Ok(())
        } else {
            Err(format!("PEs {stragglers:?} did not finalize"))
        });
        true
    }

    /// How long to wait for the next event: until the oldest pending collective times out, at
    /// most half a second (so that finalize's deadline is noticed too).
    fn next_wait(&self) -> Duration {
        self.pending
            .values()
            .map(|p| (p.since + self.timeout).saturating_duration_since(Instant::now()))
            .min()
            .unwrap_or(Duration::from_millis(500))
            .min(Duration::from_millis(500))
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Local { seq, what, data } => self.contribute(0, seq, what, data),
            Event::Remote { from, msg } => match msg {
                Msg::Contribute { seq, what, data } => self.contribute(from, seq, what, data),
                Msg::Abort {
                    origin,
                    class,
                    reason,
                    missing,
                    waited_ms,
                } => {
                    let kind = abort_kind(origin, class, reason, missing, waited_ms);
                    self.fail(kind, origin as usize);
                }
                Msg::Bye => self.bye[from] = true,
                _ => {}
            },
            Event::Closed { from, why } => {
                self.closed[from] = true;
                self.writers[from] = None;
                if !self.bye[from] {
                    self.fail(
                        ErrorKind::PeerExited {
                            peer: from,
                            how: why,
                        },
                        from,
                    );
                }
            }
            Event::Abort(msg) => {
                if let Msg::Abort {
                    origin,
                    class,
                    reason,
                    missing,
                    waited_ms,
                } = msg
                {
                    let kind = abort_kind(origin, class, reason, missing, waited_ms);
                    self.fail(kind, origin as usize);
                }
            }
            Event::Fail(kind) => self.fail(kind, 0),
            Event::Finalize(tx) => {
                self.finalize = Some((tx, Instant::now() + self.timeout));
            }
        }
    }

    /// Fails the job, naming the PEs that did not contribute, when a pending collective has
    /// waited longer than the timeout.
    fn check_timeouts(&mut self) {
        let now = Instant::now();
        let late = self
            .pending
            .iter()
            .find(|(_, p)| now >= p.since + self.timeout)
            .map(|(&seq, p)| {
                (
                    seq,
                    p.what.clone(),
                    p.parts
                        .iter()
                        .enumerate()
                        .filter(|(_, x)| x.is_none())
                        .map(|(r, _)| r)
                        .collect::<Vec<_>>(),
                )
            });
        if let Some((seq, what, missing)) = late {
            let kind = ErrorKind::Timeout {
                what: format!("{what} (collective #{seq})"),
                waited: self.timeout,
                missing,
            };
            self.fail(kind, 0);
        }
    }
}
