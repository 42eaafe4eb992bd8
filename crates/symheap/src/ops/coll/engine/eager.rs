//! The host engine's eager broadcast, as the ops layer drives the channel of
//! `context/eager.rs`: at most [`EAGER_INLINE`] bytes, every PE of the job on this node. The
//! broadcast entries take it before building a request (see `broadcast.rs`).
//!
//! A broadcast in a loop is the case worth its own path. The first call with given arguments on
//! a team validates its ranges, formats its text and records it; the channel then remembers that
//! call (`Inner::eager_remember`). A repeat of it (the same numbers, and no block released or
//! reclaimed since, so the ranges still hold) goes straight to the ledger's running hash and the
//! channel: no range lookups, no search of the recent calls, no argument closure. Under
//! callgrind that took an 8-byte broadcast in a loop from 1028 to 868 instructions on its root
//! and from 858 to 709 on a receiver (2 PEs; see BENCHMARKS.md, sixteenth session).
//!
//! Each side's own instructions are what such a loop costs (the slot line's transfer overlaps
//! them: BENCHMARKS.md, seventeenth session), so the path is kept short: `broadcast_raw` comes
//! here first, the host backend's copies are static calls, and the data stays in the slot's
//! words. That took the loop to about 550 instructions on the root and 450-470 on a receiver.

use crate::backend::host::HostBackend;
use crate::backend::Backend;
use crate::context::area::EAGER_INLINE;
use crate::context::eager_state::EagerBody;
use crate::context::team::{Team, TeamInner, TeamState};
use crate::context::watch::CallKey;
use crate::context::Context;
use crate::element::DType;
use crate::error::Result;

use super::super::transport::host::check_len;
use crate::ops::alias::CollKind;

const CALL: &str = "broadcast";

impl Context {
    /// A broadcast small enough for the eager channel: the root pushes its data into every
    /// receiver's sync area and returns without waiting for them (unless it is as many
    /// broadcasts ahead of one as it has slots); a receiver waits for it, checks the root made
    /// the same call, and copies it out. On return this PE's destination is complete and its
    /// source reusable, as for the one-pass broadcast. The arguments are `broadcast_raw`'s,
    /// `count` elements of `dtype` making at most `EAGER_INLINE` bytes; `host` is the backend.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::ops::coll) fn broadcast_eager(
        &self,
        host: &HostBackend,
        team: &Team,
        dest: u64,
        src: u64,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        self.inner.aligned_pair(CALL, dest, src, dtype)?;
        let Some(t) = self.inner.team_inner(team, CALL)? else {
            return Ok(());
        };
        // `broadcast_raw` checked this product.
        let bytes = count * dtype.size();
        let call = [root as u64, count as u64, dtype as u64, dest, src];
        {
            let mut st = t.lock();
            if let Some(i) = self.inner.eager_repeat(t, &st, call) {
                self.inner.record_again(&mut st, i);
                return self.eager_run(host, t, &mut st, dest, src, bytes, root, i);
            }
        }
        let n = t.members.len();
        if root >= n {
            return Err(self.bad_root(CALL, root, n));
        }
        // Read before the checks: a release during them leaves the memory stale, not wrong.
        let generation = self.inner.mem.heap.generation();
        check_len(&self.inner, CALL, "destination", dest, bytes)?;
        check_len(&self.inner, CALL, "source", src, bytes)?;
        // Once, with the ranges: a repeat has the same arguments, hence the same answer.
        self.placement(CALL, CollKind::Broadcast, team, dest, src, count, dtype)?;
        let mut st = t.lock();
        let args = || {
            self.inner
                .coll_args(format!("root {root}, {count} x {dtype}"), dest, src)
        };
        // The ledger's key, laid out as the synchronised broadcast's (the same text either way).
        let [r, c, d, to, from] = call;
        let key = CallKey {
            call: CALL,
            nums: [r, c, d, 0, 0, 0, to, from],
        };
        let i = self.inner.record_keyed_unpublished(&mut st, key, args);
        self.inner.eager_remember(t, &st, call, generation, i);
        self.eager_run(host, t, &mut st, dest, src, bytes, root, i)
    }

    /// The channel, once the call is recorded in the ledger as `st.recent[recorded]`.
    #[allow(clippy::too_many_arguments)]
    fn eager_run(
        &self,
        be: &HostBackend,
        t: &TeamInner,
        st: &mut TeamState,
        dest: u64,
        src: u64,
        bytes: usize,
        root: usize,
        recorded: usize,
    ) -> Result<()> {
        // Words, as the slot holds them: no copy between a byte buffer and the slot's words.
        let mut body: EagerBody = [0; (EAGER_INLINE / 8) as usize];
        if t.me == root {
            be.read_bytes(src, &mut bytemuck::cast_slice_mut(&mut body)[..bytes])?;
            // The root publishes the call in its ring after storing its slots (see eager_send).
            self.inner.eager_send(t, st, CALL, &body, bytes, recorded)?;
            if dest == src {
                return Ok(());
            }
        } else {
            self.inner.publish_recent(t, st, recorded);
            self.inner.eager_recv(t, st, CALL, root, &mut body, bytes)?;
        }
        be.write_bytes(dest, &bytemuck::cast_slice(&body)[..bytes])
    }
}
