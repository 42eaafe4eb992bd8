//! Operations enqueued on a CUDA stream: put and get (SM kernel or copy engine), put with
//! signal, signal waits, barriers and quiet. On the host backend the "stream" is the calling
//! thread: each call completes before it returns, which satisfies the same ordering.
//!
//! Streams are [`Stream`] handles (made by `Context::create_stream`, the default streams, or
//! `unsafe Stream::from_raw` around a handle such as `torch.cuda.current_stream().cuda_stream`);
//! each call checks the stream belongs to this PE's device. Local (non-symmetric) addresses
//! must be device memory of this PE's GPU or a live symmetric allocation, and are checked too.
//! Every enqueued operation is capturable in a CUDA graph: nothing here synchronises with the
//! host, and the barrier's epoch lives in device memory so a replayed graph stays in step.

use crate::backend::cuda::Engine;
use crate::backend::{AnyBackend, Backend};
use crate::context::Context;
use crate::element::DType;
use crate::error::{err, ErrorKind, Result};
use crate::ops::rma::{Cmp, SignalOp};
use crate::stream::Stream;

pub(crate) fn cmp_code(c: Cmp) -> i32 {
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
        stream: &Stream,
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
        stream: &Stream,
        engine: Engine,
    ) -> Result<()> {
        const CALL: &str = "put_on_stream";
        self.inner.check(CALL)?;
        let raw = self.inner.stream_handle(stream, CALL)?;
        let remote = self.inner.remote(dest, bytes, pe, CALL)?;
        self.inner.local_range(src, bytes, false, CALL)?;
        self.inner.note_stream_addr(dest, stream);
        self.inner.note_stream_addr(src, stream);
        match &self.inner.backend {
            AnyBackend::Cuda(cu) => cu.copy_on_stream(remote, src, bytes, raw, engine),
            AnyBackend::Host(host) => {
                host.copy(remote, src, bytes as usize)?;
                self.inner.ring_data(pe);
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
        stream: &Stream,
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
        stream: &Stream,
        engine: Engine,
    ) -> Result<()> {
        const CALL: &str = "get_on_stream";
        self.inner.check(CALL)?;
        let raw = self.inner.stream_handle(stream, CALL)?;
        let remote = self.inner.remote(src, bytes, pe, CALL)?;
        self.inner.local_range(dest, bytes, true, CALL)?;
        self.inner.note_stream_addr(src, stream);
        self.inner.note_stream_addr(dest, stream);
        match &self.inner.backend {
            AnyBackend::Cuda(cu) => cu.copy_on_stream(dest, remote, bytes, raw, engine),
            AnyBackend::Host(host) => host.copy(dest, remote, bytes as usize),
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
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "put_signal_on_stream";
        self.inner.check(CALL)?;
        let raw = self.inner.stream_handle(stream, CALL)?;
        self.inner.aligned(CALL, "signal word", sig, DType::U64)?;
        let remote_sig = self.inner.remote(sig, 8, pe, CALL)?;
        for a in [dest, src, sig] {
            self.inner.note_stream_addr(a, stream);
        }
        // Counted when enqueued: a timed-out wait on PE `pe` then names PEs that never asked.
        self.inner.tally_signal(pe, sig - self.inner.mem.own_base);
        match &self.inner.backend {
            AnyBackend::Cuda(cu) => {
                let remote = self.inner.remote(dest, bytes, pe, CALL)?;
                self.inner.local_range(src, bytes, false, CALL)?;
                cu.put_signal_on_stream(
                    remote,
                    src,
                    bytes,
                    remote_sig,
                    value,
                    op == SignalOp::Add,
                    raw,
                )
            }
            AnyBackend::Host(host) => {
                self.put_on_stream(dest, src, bytes, pe, stream)?;
                host.fence();
                let aop = match op {
                    SignalOp::Set => crate::AtomicOp::Store,
                    SignalOp::Add => crate::AtomicOp::Add,
                };
                host.atomic(remote_sig, 8, aop, value, 0)?;
                self.inner.ring_data(pe);
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
        stream: &Stream,
    ) -> Result<()> {
        const CALL: &str = "signal_wait_until_on_stream";
        self.inner.check(CALL)?;
        let raw = self.inner.stream_handle(stream, CALL)?;
        self.inner.aligned(CALL, "signal word", sig, DType::U64)?;
        let off = self.inner.own_offset(sig, 8, CALL)?;
        self.inner.note_stream(off, stream);
        let stream = raw;
        match &self.inner.backend {
            AnyBackend::Cuda(cu) => cu.wait_on_stream(sig, cmp_code(cmp), value, stream),
            AnyBackend::Host(_) => self.signal_wait_until_addr(sig, cmp, value).map(drop),
        }
    }

    /// Collective over the world: enqueues a barrier on `stream`. Work after it on any PE's
    /// stream sees every PE's stream work before it. Capturable in a CUDA graph.
    pub fn barrier_all_on_stream(&self, stream: &Stream) -> Result<()> {
        const CALL: &str = "barrier_all_on_stream";
        self.inner.check(CALL)?;
        let AnyBackend::Cuda(cu) = &self.inner.backend else {
            return self.barrier_all();
        };
        if self.inner.spans_nodes(&self.inner.teams.world_team) {
            return self.barrier_span(cu, stream);
        }
        let (s, stream) = (stream, self.inner.stream_handle(stream, CALL)?);
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
            .comms
            .dsync
            .get()
            .expect("device sync state is set up at init on CUDA");
        let own = self
            .inner
            .backend
            .slot_base(self.my_pe())
            .expect("own heap");
        cu.bind()?;
        crate::ops::coll::order_team(&self.inner.teams.world_team, s, stream)?;
        let world = &self.inner.teams.world_team;
        self.inner
            .record_on(world, &mut world.lock(), CALL, String::new());
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
    pub fn quiet_on_stream(&self, stream: &Stream) -> Result<()> {
        const CALL: &str = "quiet_on_stream";
        self.inner.check(CALL)?;
        self.inner.stream_handle(stream, CALL).map(drop)
    }

    /// Waits for `stream` to finish and reports any device-side wait that timed out.
    pub fn sync_stream(&self, stream: &Stream) -> Result<()> {
        const CALL: &str = "sync_stream";
        self.inner.check(CALL)?;
        match &self.inner.backend {
            AnyBackend::Cuda(cu) => {
                let stream = self.inner.stream_handle(stream, CALL)?;
                cu.sync_stream(stream).map_err(|e| e.with_pe(self.my_pe()))
            }
            AnyBackend::Host(_) => Ok(()),
        }
    }

    /// A new stream for this PE's work: on CUDA a non-blocking stream of this PE's device,
    /// destroyed when the value is dropped (work already enqueued still completes); on the host
    /// backend, where stream work runs on the calling thread, the default stream.
    pub fn create_stream(&self) -> Result<Stream> {
        const CALL: &str = "create_stream";
        self.inner.check(CALL)?;
        match &self.inner.backend {
            AnyBackend::Cuda(cu) => cu.new_stream().map_err(|e| e.with_pe(self.my_pe())),
            AnyBackend::Host(_) => Ok(Stream::legacy_default()),
        }
    }
}
