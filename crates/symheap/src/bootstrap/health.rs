//! The job's failure state, shared by the rendezvous threads and every wait in symheap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::{Error, ErrorKind, Result};

/// What ended the job, as first noticed here.
pub type Failure = ErrorKind;

/// Failed-or-not, readable with one atomic load so spin-waits can poll it cheaply.
#[derive(Debug, Default)]
pub struct Health {
    failed: AtomicBool,
    finalized: AtomicBool,
    failure: Mutex<Option<Failure>>,
}

impl Health {
    /// A healthy job.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the first failure; later ones are dropped (the first is the cause, the rest
    /// are consequences). Returns true if this call recorded it.
    pub fn fail(&self, kind: Failure) -> bool {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_some() {
            return false;
        }
        *f = Some(kind);
        self.failed.store(true, Ordering::Release);
        true
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
    pub fn check(&self, pe: usize, call: &'static str) -> Result<()> {
        if let Some(kind) = self.failure() {
            return Err(Error::new(Some(pe), call, kind));
        }
        if self.is_finalized() {
            return Err(Error::new(Some(pe), call, ErrorKind::Finalized));
        }
        Ok(())
    }
}
