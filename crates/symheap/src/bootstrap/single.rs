//! The rendezvous of a job with one PE: every collective completes at once.

use std::sync::Arc;
use std::time::Duration;

use super::{Bootstrap, Health};
use crate::error::{ErrorKind, Result};

/// A world of one PE.
#[derive(Debug)]
pub struct SingleBootstrap {
    timeout: Duration,
    health: Arc<Health>,
}

impl SingleBootstrap {
    /// A one-PE world whose waits give up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        SingleBootstrap {
            timeout,
            health: Arc::new(Health::new()),
        }
    }
}

impl Bootstrap for SingleBootstrap {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn all_gather(&self, _what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.health.check(0, "all_gather")?;
        Ok(vec![data.to_vec()])
    }
    fn abort(&self, reason: &str) {
        self.health.fail(ErrorKind::Aborted {
            origin: 0,
            reason: reason.to_string(),
        });
    }
    fn fail_all(&self, kind: ErrorKind) {
        self.health.fail(kind);
    }
    fn check(&self) -> Result<()> {
        self.health.check(0, "check")
    }
    fn health(&self) -> &Arc<Health> {
        &self.health
    }
    fn finalize(&self) -> Result<()> {
        self.health.set_finalized();
        Ok(())
    }
}
