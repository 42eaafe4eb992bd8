//! The job's failure state, shared by the rendezvous threads and every wait in symheap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::{Error, ErrorKind, Result};

/// What ended the job, as first noticed here.
pub type Failure = ErrorKind;

/// Something to do the moment the job fails (for example raise the device's abort word, so
/// kernels waiting for a dead PE stop at once).
pub type OnFail = Box<dyn Fn() + Send + Sync>;

/// Failed-or-not, readable with one atomic load so spin-waits can poll it cheaply.
#[derive(Default)]
pub struct Health {
    failed: AtomicBool,
    finalized: AtomicBool,
    failure: Mutex<Option<Failure>>,
    on_fail: Mutex<Vec<OnFail>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("failed", &self.is_failed())
            .field("finalized", &self.is_finalized())
            .finish()
    }
}

impl Health {
    /// A healthy job.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the first failure; later ones are dropped (the first is the cause, the rest
    /// are consequences). Returns true if this call recorded it.
    pub fn fail(&self, kind: Failure) -> bool {
        {
            let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
            if f.is_some() {
                return false;
            }
            *f = Some(kind);
            self.failed.store(true, Ordering::Release);
        }
        for cb in self
            .on_fail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            cb();
        }
        true
    }

    /// Runs `cb` when the job fails (at once if it already has). `cb` runs on whichever thread
    /// records the failure, so it must not block.
    pub fn on_fail(&self, cb: OnFail) {
        let mut list = self.on_fail.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_failed() {
            cb();
        }
        list.push(cb);
    }

    /// Marks the context finalized: later calls fail with `Finalized` unless a real failure
    /// came first.
    pub fn set_finalized(&self) {
        self.finalized.store(true, Ordering::Release);
    }

    /// True once finalized.
    pub fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// True once any failure was recorded.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The recorded failure, if any.
    pub fn failure(&self) -> Option<Failure> {
        if !self.is_failed() {
            return None;
        }
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `Ok` while healthy; the failure as an error of `call` on PE `pe` otherwise.
    #[inline]
    pub fn check(&self, pe: usize, call: &'static str) -> Result<()> {
        // The healthy case in two loads, inlined into every call's entry.
        if !self.failed.load(Ordering::Acquire) && !self.finalized.load(Ordering::Acquire) {
            return Ok(());
        }
        self.check_failed(pe, call)
    }

    #[cold]
    fn check_failed(&self, pe: usize, call: &'static str) -> Result<()> {
        if let Some(kind) = self.failure() {
            return Err(Error::new(Some(pe), call, kind));
        }
        if self.is_finalized() {
            return Err(Error::new(Some(pe), call, ErrorKind::Finalized));
        }
        Ok(())
    }
}
