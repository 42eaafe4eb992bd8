//! Allocation: placing blocks, growing the heap on every PE or none, the peer table in each
//! block's trailer, and releases (stream-ordered on CUDA).

use super::Inner;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::heap::{align_up, Block, HeapState};
use crate::util::human_bytes;

impl Inner {
    /// The heap size to grow to so that a block ending at `need_end` fits: whole chunks when
    /// they fit under the capacity, the exact need otherwise. None when even that does not fit.
    pub(super) fn grow_target(&self, mapped: u64, need_end: u64) -> Option<u64> {
        let g = self.backend.granularity();
        let cap = self.backend.capacity();
        let chunk = align_up(self.cfg.chunk_size, g)?;
        let exact = align_up(need_end, g)?;
        let whole = align_up(need_end.max(mapped.checked_add(chunk)?), g)?;
        if whole <= cap {
            Some(whole)
        } else if exact <= cap {
            Some(cap.min(whole).max(exact))
        } else {
            None
        }
    }

    /// Collective: every PE's heap grows to `target` bytes, or none does. A PE that cannot get
    /// the memory makes every PE fail with the same OutOfMemory error naming it (`requested`:
    /// the allocation the growth is for) instead of leaving them waiting for its handles.
    pub(super) fn grow(&self, st: &mut HeapState, target: u64, requested: u64) -> Result<()> {
        let from = self.backend.mapped();
        self.record(
            "grow",
            format!("{} to {}", human_bytes(from), human_bytes(target)),
        );
        const CALL: &str = "allocate (heap growth)";
        let (in_use, cap) = (st.in_use(), self.backend.capacity());
        let vote = |mine: Option<&Error>| -> Result<()> {
            // A ballot is 0 when this PE got its memory, else 1 and why not.
            let mut ballot = vec![u8::from(mine.is_some())];
            if let Some(e) = mine {
                ballot.extend_from_slice(e.kind().to_string().as_bytes());
            }
            let all = self
                .boot
                .all_gather(CALL, &ballot)
                .map_err(|e| e.during(CALL).with_pe(self.rank))?;
            let short: Vec<String> = all
                .iter()
                .enumerate()
                .filter(|(_, b)| b.first() != Some(&0))
                .map(|(pe, b)| {
                    format!("PE {pe}: {}", String::from_utf8_lossy(&b[b.len().min(1)..]))
                })
                .collect();
            if short.is_empty() {
                return Ok(());
            }
            Err(Error::new(
                Some(self.rank),
                CALL,
                ErrorKind::OutOfMemory {
                    requested,
                    in_use,
                    capacity: cap,
                    hint: format!(
                        "growing every PE's heap by {} failed on {}; no PE grew. Free memory there or lower SYMHEAP_CHUNK_SIZE",
                        human_bytes(target - from),
                        short.join("; ")
                    ),
                },
            ))
        };
        self.backend
            .grow(target, &vote)
            .map_err(|e| match e.kind() {
                ErrorKind::OutOfMemory { .. } => e,
                _ => e.during(CALL).with_pe(self.rank),
            })?;
        st.extend(target);
        tracing::debug!(rank = self.rank, from, to = target, "symmetric heap grew");
        Ok(())
    }

    /// Collective: an allocation for symheap's own state (device tables): users' addresses never
    /// reach it.
    pub(crate) fn allocate_internal(&self, bytes: u64, align: u64) -> Result<Block> {
        let b = self.allocate(bytes, align, "init")?;
        self.mem.lock_heap().mark_internal(b.id);
        self.mem.heap.invalidate_lookups();
        Ok(b)
    }

    pub(crate) fn allocate(&self, bytes: u64, align: u64, call: &'static str) -> Result<Block> {
        self.check(call)?;
        if bytes == 0 {
            return Err(invalid(call, "size must be at least 1 byte").with_pe(self.rank));
        }
        if !align.is_power_of_two() {
            return Err(
                invalid(call, format!("alignment {align} is not a power of two"))
                    .with_pe(self.rank),
            );
        }
        let cap = self.backend.capacity();
        if align > cap {
            return Err(invalid(
                call,
                format!(
                    "alignment {align} exceeds the heap capacity {}",
                    human_bytes(cap)
                ),
            )
            .with_pe(self.rank));
        }
        let mut st = self.mem.lock_heap();
        self.record("allocate", format!("{}, align {align}", human_bytes(bytes)));
        // The allocation's own peer table lives right after it, so device code can be handed a
        // table in device memory without a separate allocation.
        let span = align_up(bytes, 16).and_then(|b| b.checked_add(8 * self.world as u64));
        let Some(span) = span else {
            return Err(invalid(call, "size overflows").with_pe(self.rank));
        };
        let oom = |st: &HeapState| {
            Error::new(
                Some(self.rank),
                call,
                ErrorKind::OutOfMemory {
                    requested: bytes,
                    in_use: st.in_use(),
                    capacity: cap,
                    hint: "raise SYMHEAP_HEAP_CAPACITY (or ContextBuilder::capacity) or free buffers on every PE".into(),
                },
            )
        };
        if span > cap {
            return Err(oom(&st));
        }
        let block = match st.try_alloc(bytes, span, align) {
            Some(b) => b,
            None => {
                // Would grow or fail: first reclaim what every PE has released, and learn
                // whether every PE could spare a chunk of headroom.
                st.note_allocation_sync();
                let chunk = align_up(self.cfg.chunk_size, self.backend.granularity())
                    .ok_or_else(|| oom(&st))?;
                let spare = [u8::from(self.backend.can_spare(chunk))];
                let votes = {
                    let mut ts = self.teams.world_team.lock();
                    self.sync_point(&mut st, &mut ts, call, Some(&spare))?
                };
                match st.try_alloc(bytes, span, align) {
                    Some(b) => {
                        // Reclaiming made just enough room: with frees and allocations
                        // alternating, every further allocation would meet the other PEs
                        // again (one host round trip each). Half a chunk left free keeps
                        // that to one in many. Every PE decides alike: same heap, same votes.
                        let mapped = self.backend.mapped();
                        let all_spare =
                            !votes.is_empty() && votes.iter().all(|v| v.as_slice() == [1]);
                        if all_spare
                            && st.free_bytes() < chunk / 2
                            && mapped.checked_add(chunk).is_some_and(|t| t <= cap)
                        {
                            match self.grow(&mut st, mapped + chunk, bytes) {
                                // The allocation fits without the headroom, and every PE saw
                                // the same ballots, so every PE goes on without it alike.
                                Err(e) if matches!(e.kind(), ErrorKind::OutOfMemory { .. }) => {
                                    tracing::debug!(rank = self.rank, "no heap headroom: {e}");
                                }
                                r => r?,
                            }
                        }
                        b
                    }
                    None => {
                        let need = st.end_needed_for(span, align).ok_or_else(|| oom(&st))?;
                        let mapped = self.backend.mapped();
                        let target = self.grow_target(mapped, need).ok_or_else(|| oom(&st))?;
                        self.grow(&mut st, target, bytes)?;
                        st.try_alloc(bytes, span, align).ok_or_else(|| oom(&st))?
                    }
                }
            }
        };
        let in_place = st.table_in_place(&block, 8 * self.world as u64);
        drop(st);
        if !in_place {
            self.write_table(&block)?;
            self.mem.lock_heap().note_table(&block);
        }
        Ok(block)
    }

    /// Writes `block`'s peer table into its trailer (this PE's copy).
    pub(super) fn write_table(&self, block: &Block) -> Result<()> {
        let own = self.backend.slot_base(self.rank).expect("own heap");
        let table: Vec<u8> = (0..self.world)
            .flat_map(|pe| {
                self.backend
                    .slot_base(pe)
                    .map_or(0, |b| b + block.offset)
                    .to_le_bytes()
            })
            .collect();
        self.backend
            .write_bytes(own + block.table_offset(), &table)
            .map_err(|e| e.during("allocate").with_pe(self.rank))
    }

    /// Releases block `id` on this PE (never blocks): at once refused to every access here,
    /// and announced to the other PEs (for reclaim) once the device work that may still use it
    /// has finished: a fence over the streams it was used on, checked at every collective point
    /// without waiting, so a `del x` right after an asynchronous collective cannot let any PE
    /// reuse the memory while kernels still read or write it.
    pub(crate) fn release_block(&self, id: crate::heap::BlockId) {
        self.mem.heap.mark_freed(id);
        let uses = self.mem.heap.take_uses(id);
        let streams: Vec<u64> = uses.iter().map(|u| u.raw).collect();
        // `uses` keeps owned streams alive until their events are recorded here.
        match self.backend.fence_streams(&streams) {
            Some(f) => self.mem.heap.defer(id, f),
            None => self.mem.heap.announce(id),
        }
    }

    /// Notes that device work on `stream` uses the live block at heap offset `off`.
    pub(crate) fn note_stream(&self, off: u64, stream: &crate::Stream) {
        if self.backend.as_cuda().is_none() {
            return;
        }
        if let Some(b) = self.mem.lock_heap().block_at(off) {
            self.mem
                .heap
                .note_use(b.id, stream.raw(), stream.keep_alive());
        }
    }

    /// Notes that device work on `stream` uses the live block holding this-PE address `addr`,
    /// if any (a local source or destination outside the heap is nobody's block).
    pub(crate) fn note_stream_addr(&self, addr: u64, stream: &crate::Stream) {
        if let Some(base) = self.backend.slot_base(self.rank) {
            if addr >= base && addr < base + self.backend.mapped() {
                self.note_stream(addr - base, stream);
            }
        }
    }

    /// Announces released blocks whose device work has finished (at collective points).
    pub(crate) fn poll_releases(&self) {
        if self.mem.heap.deferred_count() == 0 {
            return;
        }
        if let Some(cu) = self.backend.as_cuda() {
            if cu.bind().is_err() {
                return;
            }
        }
        self.mem.heap.poll_deferred();
    }
}
