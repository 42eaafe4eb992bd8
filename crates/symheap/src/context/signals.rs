//! Signal tallies: who signalled whom, so that a `signal_wait_until` that times out names the
//! PEs whose signal never came instead of only the word it waited on.
//!
//! Every `put_signal` (host and stream forms) counts itself in the sender's sync area: per target
//! PE, how many signals it sent there and the heap offset of the last one. A waiter that times
//! out compares those counts with what they were when its wait began. A PE that sent this PE
//! nothing during the wait is named as missing; where some PEs' last signal here was to the word
//! waited on (the PEs that feed it), only the silent ones among them are named. Counted are the
//! signals host code asks for (`put_signal*`); a signal a user's kernel stores from the device,
//! or an atomic used as a signal, is not, and the message says what it counts. Only PEs of this
//! node are seen (the tallies live in host shared memory, like the watch).

use super::Inner;

/// What every PE had sent this PE when a wait began: `(count, last offset)` per PE, None where
/// its sync area is not mapped here.
pub(crate) type Tallies = Vec<Option<(u64, u64)>>;

impl Inner {
    /// Counts a signal this PE sends to PE `to`, updating the word at heap offset `off`.
    #[inline]
    pub(crate) fn tally_signal(&self, to: usize, off: u64) {
        let a = self.area();
        if to >= self.world || !a.is_direct(self.rank) {
            return;
        }
        // Only this PE writes its own tallies, so a load and a store do (threads of this PE
        // racing can lose a count, but never leave it unchanged: the waiter asks "did it
        // change").
        let count = a.tally_word(self.rank, to, 0);
        self.control
            .store64(count, self.control.load64(count).wrapping_add(1));
        self.control.store64(a.tally_word(self.rank, to, 1), off);
    }

    /// What every PE has sent this PE so far.
    pub(crate) fn tallies_to_me(&self) -> Tallies {
        let a = self.area();
        (0..self.world)
            .map(|pe| {
                (pe != self.rank && a.is_direct(pe)).then(|| {
                    let w = |k| self.control.load64(a.tally_word(pe, self.rank, k));
                    (w(0), w(1))
                })
            })
            .collect()
    }

    /// For a signal wait on heap offset `off` that began with `before`: the PEs to name as
    /// missing, and a sentence on what the others sent.
    pub(crate) fn silent_signallers(&self, off: u64, before: &Tallies) -> (Vec<usize>, String) {
        let now = self.tallies_to_me();
        let mut silent = Vec::new();
        let mut feeders = Vec::new();
        let mut sent = Vec::new();
        for (pe, (b, n)) in before.iter().zip(&now).enumerate() {
            let (Some((c0, last)), Some((c1, _))) = (b, n) else {
                continue;
            };
            if c1 == c0 {
                silent.push(pe);
                if *c0 > 0 && *last == off {
                    feeders.push(pe);
                }
            } else {
                sent.push(format!("PE {pe} sent {}", c1.wrapping_sub(*c0)));
            }
        }
        let counted = "put_signal calls to this PE during the wait";
        let text = if sent.is_empty() {
            format!("no {counted}")
        } else {
            format!("{counted}: {}", sent.join(", "))
        };
        // The PEs that fed this word before are the ones it waits for, when there are any.
        let missing = if feeders.is_empty() { silent } else { feeders };
        (missing, text)
    }
}
