//! Operations enqueued on a CUDA stream: put and get (SM kernel or copy engine), put with
//! signal, signal waits, barriers and quiet. On the host backend the "stream" is the calling
//! thread: each call completes before it returns, which satisfies the same ordering.
//!
//! Streams are raw `CUstream` handles as integers (`torch.cuda.current_stream().cuda_stream`,
//! or 0 for the legacy default stream). Every enqueued operation is capturable in a CUDA graph:
//! nothing here synchronises with the host, and the barrier's epoch lives in device memory so a
//! replayed graph stays in step.

use super::area::MAX_TEAMS;
use crate::backend::cuda::Engine;
use crate::context::{Context, Inner};
use crate::error::{err, invalid, ErrorKind, Result};
use crate::heap::align_up;
use crate::ops::rma::{Cmp, SignalOp};

/// Per-team barrier state in device memory, one slot per team: the arrival flags (indexed by
/// team member), the address of every member's flags, and this PE's barrier counter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceSync {
    offset: u64,
    world: usize,
    stride: u64,
}

impl DeviceSync {
    fn stride(world: usize) -> u64 {
        align_up((2 * world as u64 + 1) * 8, 256).expect("small")
    }

    /// Bytes for `world` PEs.
    pub(crate) fn bytes(world: usize) -> u64 {
        MAX_TEAMS as u64 * Self::stride(world)
    }

    pub(crate) fn new(offset: u64, world: usize) -> DeviceSync {
        DeviceSync {
            offset,
            world,
            stride: Self::stride(world),
        }
    }

    /// Heap offset of `slot`'s flags.
    pub(crate) fn flags(&self, slot: usize) -> u64 {
        self.offset + slot as u64 * self.stride
    }

    /// Heap offset of `slot`'s table of member flag addresses.
    pub(crate) fn peer_flags(&self, slot: usize) -> u64 {
        self.flags(slot) + 8 * self.world as u64
    }

    /// Heap offset of `slot`'s barrier counter.
    pub(crate) fn epoch(&self, slot: usize) -> u64 {
        self.flags(slot) + 16 * self.world as u64
    }
}

impl Inner {
    /// CUDA only: allocates and initialises the device barrier state (collective, at init).
    pub(crate) fn init_device_sync(&self) -> Result<()> {
        if self.backend.as_cuda().is_none() {
            return Ok(());
        }
        let block = self.allocate_internal(DeviceSync::bytes(self.world), 256)?;
        let ds = DeviceSync::new(block.offset, self.world);
        let own = self.backend.slot_base(self.rank).expect("own heap");
        self.backend
            .write_bytes(own + block.offset, &vec![0u8; block.bytes as usize])?;
        let table: Vec<u8> = (0..self.world)
            .flat_map(|pe| {
                self.backend
                    .slot_base(pe)
                    .map_or(0, |b| b + ds.flags(0))
                    .to_le_bytes()
            })
            .collect();
        self.backend.write_bytes(own + ds.peer_flags(0), &table)?;
        let _ = self.dsync.set(ds);
        Ok(())
    }
}

fn cmp_code(c: Cmp) -> i32 {
    match c {
        Cmp::Eq => 0,
        Cmp::Ne => 1,
        Cmp::Gt => 2,
        Cmp::Ge => 3,
        Cmp::Lt => 4,
        Cmp::Le => 5,
    }
}

impl Context {
    /// Enqueues a put of `bytes` from local memory `src` (device memory on CUDA; on the host
    /// backend it must lie in this PE's symmetric heap) to PE `pe`'s copy of the symmetric
    /// range at `dest`, by the copy engines (`Engine::Auto`; `put_on_stream_with` chooses).
    pub fn put_on_stream(
        &self,
        dest: u64,
        src: u64,
        bytes: u64,
        pe: usize,
        stream: u64,
    ) -> Result<()> {
        self.put_on_stream_with(dest, src, bytes, pe, stream, Engine::Auto)
    }

    /// `put_on_stream` with the engine chosen by the caller.
    pub fn put_on_stream_with(
        &self,
        dest: u64,
        src: u64,
        bytes: u64,
        pe: usize,
        stream: u64,
        engine: Engine,
    ) -> Result<()> {
        const CALL: &str = "put_on_stream";
        self.inner.check(CALL)?;
        let remote = self.inner.remote(dest, bytes, pe, CALL)?;
        self.inner.note_stream_addr(dest, stream);
        self.inner.note_stream_addr(src, stream);
        match self.inner.backend.as_cuda() {
            Some(cu) => cu.copy_on_stream(remote, src, bytes, stream, engine),
            None => {
                self.inner.own_offset(src, bytes, CALL)?;
                self.inner.backend.copy(remote, src, bytes as usize)?;
                self.inner.ring(pe);
                Ok(())
            }
        }
    }

    /// Enqueues a get of `bytes` from PE `pe`'s copy of the symmetric range at `src` into local
    /// memory `dest` (device memory on CUDA; the symmetric heap on the host backend).
    pub fn get_on_stream(
        &self,
        dest: u64,
        src: u64,
        bytes: u64,
        pe: usize,
        stream: u64,
    ) -> Result<()> {
        self.get_on_stream_with(dest, src, bytes, pe, stream, Engine::Auto)
    }

    /// `get_on_stream` with the engine chosen by the caller.
    pub fn get_on_stream_with(
        &self,
        dest: u64,
        src: u64,
        bytes: u64,
        pe: usize,
        stream: u64,
        engine: Engine,
    ) -> Result<()> {
        const CALL: &str = "get_on_stream";
        self.inner.check(CALL)?;
        let remote = self.inner.remote(src, bytes, pe, CALL)?;
        self.inner.note_stream_addr(src, stream);
        self.inner.note_stream_addr(dest, stream);
        match self.inner.backend.as_cuda() {
            Some(cu) => cu.copy_on_stream(dest, remote, bytes, stream, engine),
            None => {
                self.inner.own_offset(dest, bytes, CALL)?;
                self.inner.backend.copy(dest, remote, bytes as usize)
            }
        }
    }

    /// Enqueues a put followed by an update of PE `pe`'s u64 signal word at `sig` (a symmetric
    /// address): whoever observes the signal also observes the data.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_on_stream(
        &self,
        dest: u64,
        src: u64,
        bytes: u64,
        sig: u64,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: u64,
    ) -> Result<()> {
        const CALL: &str = "put_signal_on_stream";
        self.inner.check(CALL)?;
        if sig % 8 != 0 {
            return Err(invalid(
                CALL,
                format!("signal address {sig:#x} is not 8-byte aligned"),
            )
            .with_pe(self.my_pe()));
        }
        let remote_sig = self.inner.remote(sig, 8, pe, CALL)?;
        for a in [dest, src, sig] {
            self.inner.note_stream_addr(a, stream);
        }
        match self.inner.backend.as_cuda() {
            Some(cu) => {
                let remote = self.inner.remote(dest, bytes, pe, CALL)?;
                cu.put_signal_on_stream(
                    remote,
                    src,
                    bytes,
                    remote_sig,
                    value,
                    op == SignalOp::Add,
                    stream,
                )
            }
            None => {
                self.put_on_stream(dest, src, bytes, pe, stream)?;
                self.inner.backend.fence();
                let aop = match op {
                    SignalOp::Set => crate::AtomicOp::Store,
                    SignalOp::Add => crate::AtomicOp::Add,
                };
                self.inner.backend.atomic(remote_sig, 8, aop, value, 0)?;
                self.inner.ring(pe);
                Ok(())
            }
        }
    }

    /// Enqueues a wait until this PE's u64 signal word at `sig` satisfies `word CMP value`.
    /// Work enqueued after it on `stream` sees the data published before the signal. A
    /// device-side wait gives up after `SYMHEAP_TIMEOUT` and is reported by `sync_stream`.
    pub fn signal_wait_until_on_stream(
        &self,
        sig: u64,
        cmp: Cmp,
        value: u64,
        stream: u64,
    ) -> Result<()> {
        const CALL: &str = "signal_wait_until_on_stream";
        self.inner.check(CALL)?;
        let off = self.inner.own_offset(sig, 8, CALL)?;
        self.inner.note_stream(off, stream);
        match self.inner.backend.as_cuda() {
            Some(cu) => {
                if sig % 8 != 0 {
                    return Err(
                        invalid(CALL, "signal address is not 8-byte aligned").with_pe(self.my_pe())
                    );
                }
                cu.wait_on_stream(sig, cmp_code(cmp), value, stream)
            }
            None => self.signal_wait_until_addr(sig, cmp, value).map(drop),
        }
    }

    /// Collective over the world: enqueues a barrier on `stream`. Work after it on any PE's
    /// stream sees every PE's stream work before it. Capturable in a CUDA graph.
    pub fn barrier_all_on_stream(&self, stream: u64) -> Result<()> {
        const CALL: &str = "barrier_all_on_stream";
        self.inner.check(CALL)?;
        let Some(cu) = self.inner.backend.as_cuda() else {
            return self.barrier_all();
        };
        if !self.direct_peers().iter().eq(0..self.n_pes()) {
            return Err(err(
                CALL,
                ErrorKind::Unsupported(
                    "a stream barrier needs every PE's memory directly reachable".into(),
                ),
            )
            .with_pe(self.my_pe()));
        }
        let ds = self
            .inner
            .dsync
            .get()
            .expect("device sync state is set up at init on CUDA");
        let own = self
            .inner
            .backend
            .slot_base(self.my_pe())
            .expect("own heap");
        cu.bind()?;
        crate::ops::coll_stream::order_team(&self.inner.world_team, stream)?;
        self.inner
            .record_on(&self.inner.world_team, CALL, String::new());
        cu.barrier_on_stream(
            own + ds.flags(0),
            own + ds.peer_flags(0),
            own + ds.epoch(0),
            self.my_pe(),
            self.n_pes(),
            stream,
        )
    }

    /// Enqueues completion of this PE's earlier stream operations: later work on `stream`, and
    /// peers that synchronise with it, see them. Stream order already completes copies and
    /// kernels before later work starts, so this enqueues nothing; it exists so code written for
    /// NVSHMEM's `quiet_on_stream` ports unchanged.
    pub fn quiet_on_stream(&self, stream: u64) -> Result<()> {
        let _ = stream;
        self.inner.check("quiet_on_stream")
    }

    /// Waits for `stream` to finish and reports any device-side wait that timed out.
    pub fn sync_stream(&self, stream: u64) -> Result<()> {
        self.inner.check("sync_stream")?;
        match self.inner.backend.as_cuda() {
            Some(cu) => cu.sync_stream(stream).map_err(|e| e.with_pe(self.my_pe())),
            None => Ok(()),
        }
    }
}
