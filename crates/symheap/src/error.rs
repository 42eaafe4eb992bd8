//! The one error type of symheap.
//!
//! Every failure carries the PE it happened on, the public call that failed and the cause, so a
//! message read out of a log of eight interleaved processes still says where it came from.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// Result type used by every public symheap call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a call failed. Matching on this is how callers (and the Python layer, which maps each kind
/// to an exception class) tell failures apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument was rejected before any memory was touched.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The symmetric heap cannot hold the request, on any PE (the heap is symmetric, so every PE
    /// fails the same request).
    #[error(
        "out of symmetric memory: requested {requested} bytes, {in_use} of {capacity} bytes per PE in use ({hint})"
    )]
    OutOfMemory {
        /// Bytes asked for (after alignment padding).
        requested: u64,
        /// Bytes currently allocated on the heap.
        in_use: u64,
        /// Heap capacity per PE.
        capacity: u64,
        /// What to change to make it fit.
        hint: String,
    },
    /// Another PE's process ended without finalizing.
    #[error("PE {peer} exited ({how})")]
    PeerExited {
        /// The PE that is gone.
        peer: usize,
        /// How it was noticed.
        how: String,
    },
    /// A wait ran out of time.
    #[error("timed out after {:.1} s waiting for {what}{}", waited.as_secs_f64(), missing_list(missing))]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// The PEs that did not arrive, when known.
        missing: Vec<usize>,
    },
    /// PEs made different collective calls, or the same call with different arguments.
    #[error("collective calls diverged: {0}")]
    CollectiveMismatch(String),
    /// Another PE failed and the whole job is stopping.
    #[error("aborted because PE {origin} failed: {reason}")]
    Aborted {
        /// The PE where the failure started.
        origin: usize,
        /// Its message.
        reason: String,
    },
    /// Rendezvous or wire protocol failure.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// The memory/execution backend failed (mmap, memfd, CUDA driver, NVRTC...).
    #[error("backend: {0}")]
    Backend(String),
    /// The request is valid but this build, backend or machine cannot do it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The context was finalized (or is finalizing) and cannot be used any more.
    #[error("the symheap context is finalized")]
    Finalized,
}

fn missing_list(missing: &[usize]) -> String {
    if missing.is_empty() {
        String::new()
    } else {
        let pes: Vec<String> = missing.iter().map(|p| p.to_string()).collect();
        format!(
            "; PE{} {} did not arrive",
            if missing.len() == 1 { "" } else { "s" },
            pes.join(", ")
        )
    }
}

/// A symheap failure: which PE, which call, and why.
///
/// One pointer wide (the parts live in a box), so that `Result<u64>` and `Result<()>` come back
/// in registers. Unboxed, the error was 104 bytes and every call on a put's way returned its
/// `Result` through memory: an 8-byte put ran 227 instructions, 152 after boxing and inlining
/// its range checks (callgrind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(Box<Parts>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Parts {
    pe: Option<usize>,
    call: Cow<'static, str>,
    kind: ErrorKind,
}

impl Error {
    /// Makes an error for `call` on PE `pe` (None before the PE's rank is known).
    pub fn new(pe: Option<usize>, call: impl Into<Cow<'static, str>>, kind: ErrorKind) -> Self {
        Error(Box::new(Parts {
            pe,
            call: call.into(),
            kind,
        }))
    }

    /// The PE the error happened on, when known.
    pub fn pe(&self) -> Option<usize> {
        self.0.pe
    }

    /// The public call that failed.
    pub fn call(&self) -> &str {
        &self.0.call
    }

    /// Why it failed.
    pub fn kind(&self) -> &ErrorKind {
        &self.0.kind
    }

    /// Re-labels an internal error with the public call that surfaced it, keeping the cause.
    pub(crate) fn during(mut self, call: impl Into<Cow<'static, str>>) -> Self {
        self.0.call = call.into();
        self
    }

    pub(crate) fn with_pe(mut self, pe: usize) -> Self {
        self.0.pe.get_or_insert(pe);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.0;
        match p.pe {
            Some(pe) => write!(f, "symheap PE {pe}: {}: {}", p.call, p.kind),
            None => write!(f, "symheap: {}: {}", p.call, p.kind),
        }
    }
}

impl std::error::Error for Error {}

/// Shorthand for internal code: an error whose PE is filled in later by `with_pe`.
pub(crate) fn err(call: impl Into<Cow<'static, str>>, kind: ErrorKind) -> Error {
    Error::new(None, call, kind)
}

pub(crate) fn invalid(call: impl Into<Cow<'static, str>>, why: impl Into<String>) -> Error {
    err(call, ErrorKind::InvalidArgument(why.into()))
}

pub(crate) fn backend(call: impl Into<Cow<'static, str>>, why: impl Into<String>) -> Error {
    err(call, ErrorKind::Backend(why.into()))
}

pub(crate) fn bootstrap(call: impl Into<Cow<'static, str>>, why: impl Into<String>) -> Error {
    err(call, ErrorKind::Bootstrap(why.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_pe_call_and_missing_pes() {
        let e = Error::new(
            Some(2),
            "barrier_all",
            ErrorKind::Timeout {
                what: "barrier_all #3".into(),
                waited: Duration::from_secs(2),
                missing: vec![1, 3],
            },
        );
        let s = e.to_string();
        assert!(s.contains("PE 2"), "{s}");
        assert!(s.contains("barrier_all"), "{s}");
        assert!(s.contains("PEs 1, 3 did not arrive"), "{s}");
    }
}
