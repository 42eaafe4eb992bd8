//! How long a PE's waits spin before yielding the CPU, adapted to what spinning achieved.

use std::sync::atomic::Ordering;
use std::time::Duration;

/// Spins this often (checking the condition) before yielding the CPU, or before looking at
/// the clock when spinning longer (see [`SpinBudget`]).
pub(crate) const SPINS: u32 = 64;
/// The longest a wait spins before yielding: longer than a peer's part of a collective up to
/// a few MiB (a PE bound to its CPU that yields while its peer reduces 256 KiB gives its CPU
/// to other work for a whole time slice: 4.9 ms instead of 60 us, measured).
const SPIN_MAX: Duration = Duration::from_micros(1000);

/// How long waits spin before yielding, adapted to what spinning achieved lately.
///
/// A PE that yields or sleeps while its peer is about to arrive pays a scheduler round trip (a
/// 2-PE barrier on 2 cores measured 5 us instead of 0.5 us); but where the PEs share a CPU
/// (CI runs 8 on 2; other work may crowd them onto one core) a spinning PE holds the CPU its
/// peer needs to arrive. So the budget doubles (up to [`SPIN_MAX`]) after each wait that spinning
/// ended, and halves after each wait it did not: PEs with CPUs of their own spin like Open
/// MPI's busy polling, crowded ones soon yield at once. It starts at zero when the node has
/// more PEs than this process has CPUs (Open MPI also yields when oversubscribed).
#[derive(Debug)]
pub(crate) struct SpinBudget {
    nanos: std::sync::atomic::AtomicU64,
}

impl SpinBudget {
    /// The starting budget for `local_pes` PEs on this node.
    pub(crate) fn new(local_pes: usize) -> SpinBudget {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let start = if local_pes <= cpus {
            SPIN_MAX
        } else {
            Duration::ZERO
        };
        SpinBudget {
            nanos: std::sync::atomic::AtomicU64::new(start.as_nanos() as u64),
        }
    }

    pub(crate) fn get(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Notes whether the last wait ended while spinning.
    pub(crate) fn adapt(&self, spinning_ended_it: bool) {
        let n = self.nanos.load(Ordering::Relaxed);
        let max = SPIN_MAX.as_nanos() as u64;
        let next = if spinning_ended_it {
            (n * 2).clamp(1_000, max)
        } else if n < 1_000 {
            0
        } else {
            n / 2
        };
        if next != n {
            self.nanos.store(next, Ordering::Relaxed);
        }
    }
}
