//! Bootstrap: who my peers are, all_gather of bytes, barrier, abort, and node-local fd passing.
//!
//! The [`Bootstrap`] trait is what the rest of symheap needs from a rendezvous; [`TcpBootstrap`]
//! is the built-in one (a star around PE 0, over a Unix socket when the launcher says every PE
//! runs on one node, over TCP otherwise), [`SingleBootstrap`] the world of one, and the
//! Python layer can implement it over torch.distributed's store.

mod accept;
mod auth;
mod census;
mod conn;
mod env;
mod health;
#[cfg(test)]
mod jobs_tests;
mod liveness;
mod node;
mod secret;
mod single;
mod tcp;
pub(crate) mod unix;
pub(crate) mod wire;

pub use env::{first_host, LaunchEnv, Launcher, TokenSource};
pub use health::{Failure, Health};
pub use liveness::{PeerWatch, ProcId};
pub use node::{NodeChannel, NodeInfo};
pub use single::SingleBootstrap;
pub use tcp::TcpBootstrap;

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;

/// A warning the user must see: through `tracing` when the program installed a subscriber (the
/// `symheap` command and the Python package do, filtered by `SYMHEAP_LOG`), on stderr otherwise.
pub(crate) fn warn(msg: &str) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{msg}");
    } else {
        eprintln!("symheap warning: {msg}");
    }
}

/// The rendezvous symheap runs on: a fixed set of PEs that can exchange bytes and notice
/// failures.
///
/// Collective-order rule: `all_gather`, `barrier` and `broadcast` are collective and must be
/// called by every PE in the same order. Implementations must make a failed or exited PE fail
/// every other PE's pending and future calls instead of letting them wait forever.
pub trait Bootstrap: Send + Sync {
    /// This PE's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of PEs.
    fn size(&self) -> usize;
    /// How long a collective may wait before failing.
    fn timeout(&self) -> Duration;
    /// Collective. Every PE contributes `data`; every PE receives all contributions in rank
    /// order. `what` labels the call in timeout messages.
    fn all_gather(&self, what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Collective. Returns once every PE has called it.
    fn barrier(&self, what: &str) -> Result<()> {
        self.all_gather(what, &[]).map(|_| ())
    }
    /// Collective. Every PE receives `root`'s `data` (other PEs' `data` is ignored).
    fn broadcast(&self, what: &str, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        let mine = if self.rank() == root { data } else { &[] };
        let mut all = self.all_gather(what, mine)?;
        if root >= all.len() {
            return Err(crate::error::invalid(
                "broadcast",
                format!("root {root} is not a PE"),
            ));
        }
        Ok(std::mem::take(&mut all[root]))
    }
    /// Not collective. Makes every PE fail with `reason`, as soon as each next checks; never
    /// blocks.
    fn abort(&self, reason: &str);
    /// Not collective. Records `kind` as the job's failure here and tells every other PE, so a
    /// failure one PE notices locally (a data-plane timeout) fails the whole job alike.
    fn fail_all(&self, kind: crate::error::ErrorKind);
    /// Cheap. `Err` once this PE knows the job failed (a PE exited, aborted or timed out).
    fn check(&self) -> Result<()>;
    /// The failure state that data-plane waits poll, shared: a context keeps its own handle so
    /// that the check at the entry of every call is two loads, not a dynamic call.
    fn health(&self) -> &Arc<Health>;
    /// Collective. Leaves the rendezvous cleanly; later calls fail with `Finalized`.
    fn finalize(&self) -> Result<()>;
}
