//! NCCL as the reference the command checks and measures symheap's GPU collectives against: a
//! communicator built over a symheap context (the unique id goes through the context's
//! `all_gather_bytes`, so no MPI or torch is needed) on the runtime's own NCCL binding. Buffers
//! are typed ([`DeviceMem`]) and their sizes checked against what each call moves, so a safe
//! caller cannot make NCCL read or write past them.

use crate::backend::cuda::nccl::{self, Comm, UNIQUE_ID_BYTES};
use crate::error::{err, ErrorKind};
use crate::{Context, DType, Error, ReduceOp, Result, Stream};

use super::DeviceMem;

fn nccl_error(why: String) -> Error {
    err("nccl", ErrorKind::Backend(why))
}

fn unsupported(why: impl Into<String>) -> Error {
    err("nccl", ErrorKind::Unsupported(why.into()))
}

fn dtype(d: DType) -> Result<std::ffi::c_int> {
    nccl::dtype(d).ok_or_else(|| unsupported(format!("NCCL has no {d}")))
}

/// NCCL's version code as `major.minor.patch`.
pub fn nccl_version_string(code: i32) -> String {
    nccl::version_string(code)
}

/// An NCCL communicator over PEs of a symheap context, on this PE's CUDA device.
pub struct Nccl {
    comm: Comm,
    me: usize,
}

impl Nccl {
    /// NCCL's version code (e.g. 22803), or why libnccl cannot be loaded.
    pub fn version() -> Result<i32> {
        nccl::load()
            .map(|api| api.version)
            .map_err(|why| unsupported(format!("NCCL ({}): {why}", nccl::NCCL.file)))
    }

    /// Collective over the world: a communicator over every PE.
    pub fn new(ctx: &Context) -> Result<Nccl> {
        let all: Vec<usize> = (0..ctx.n_pes()).collect();
        Nccl::among(ctx, &all)
    }

    /// Collective over the world (every PE calls it, each with its own group): a communicator
    /// over `group` (world PEs, this one among them, ranked in that order). The groups of all
    /// PEs must partition the world; each group's first PE makes the unique id.
    pub fn among(ctx: &Context, group: &[usize]) -> Result<Nccl> {
        Nccl::version()?;
        let api = nccl::load().map_err(nccl_error)?;
        let cu = ctx
            .cuda()
            .ok_or_else(|| unsupported("NCCL needs the CUDA backend"))?;
        let me = group
            .iter()
            .position(|&p| p == ctx.my_pe())
            .ok_or_else(|| {
                err(
                    "nccl",
                    ErrorKind::InvalidArgument("not in the group".into()),
                )
            })?;
        cu.bind()?;
        let mine = if me == 0 {
            api.unique_id().map_err(nccl_error)?
        } else {
            [0; UNIQUE_ID_BYTES]
        };
        let all = ctx.all_gather_bytes(&mine)?;
        let id: [u8; UNIQUE_ID_BYTES] = all[group[0]]
            .as_slice()
            .try_into()
            .map_err(|_| nccl_error("a unique id of the wrong size arrived".into()))?;
        let comm = Comm::init(api, group.len(), me, &id).map_err(nccl_error)?;
        Ok(Nccl { comm, me })
    }

    /// ncclAllReduce of `count` elements on `stream`.
    pub fn all_reduce(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = (count * d.size()) as u64;
        let dst = dst.span(bytes, "ncclAllReduce")?;
        let src = src.span(bytes, "ncclAllReduce")?;
        // Both ranges hold `count` elements of `d` (checked) and outlive the call; `Stream`
        // holds a live stream: the contract of `Comm`.
        self.comm
            .all_reduce(dst, src, count, dtype(d)?, op, stream.raw())
            .map_err(nccl_error)
    }

    /// ncclAllGather: `count` elements per PE into `dst` (n × count).
    pub fn all_gather(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = (count * d.size()) as u64;
        let dst = dst.span(bytes * self.comm.n as u64, "ncclAllGather")?;
        let src = src.span(bytes, "ncclAllGather")?;
        self.comm
            .all_gather(dst, src, count, dtype(d)?, stream.raw())
            .map_err(nccl_error)
    }

    /// ncclReduceScatter: `src` holds n × count, `dst` gets `count`.
    pub fn reduce_scatter(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = (count * d.size()) as u64;
        let dst = dst.span(bytes, "ncclReduceScatter")?;
        let src = src.span(bytes * self.comm.n as u64, "ncclReduceScatter")?;
        self.comm
            .reduce_scatter(dst, src, count, dtype(d)?, op, stream.raw())
            .map_err(nccl_error)
    }

    /// ncclBroadcast of `count` elements from `root`.
    pub fn broadcast(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = (count * d.size()) as u64;
        let dst = dst.span(bytes, "ncclBroadcast")?;
        let src = src.span(bytes, "ncclBroadcast")?;
        if root >= self.comm.n {
            return Err(err(
                "nccl",
                ErrorKind::InvalidArgument(format!("root {root} of {} ranks", self.comm.n)),
            ));
        }
        self.comm
            .broadcast(dst, src, count, dtype(d)?, root, stream.raw())
            .map_err(nccl_error)
    }

    /// Alltoall of `count` elements per PE pair, as grouped send/recv.
    pub fn alltoall(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        stream: &Stream,
    ) -> Result<()> {
        dtype(d)?;
        let bytes = (count * d.size()) as u64;
        let dst = dst.span(bytes * self.comm.n as u64, "alltoall")?;
        let src = src.span(bytes * self.comm.n as u64, "alltoall")?;
        self.comm
            .alltoall(dst, src, bytes, stream.raw())
            .map_err(nccl_error)
    }

    /// Ping-pong step of `bytes` bytes: PE 0 sends to PE 1 and receives back, PE 1 the reverse.
    pub fn ping_pong(&mut self, buf: &impl DeviceMem, bytes: u64, stream: &Stream) -> Result<()> {
        if self.comm.n < 2 {
            return Err(unsupported("a ping-pong needs two ranks"));
        }
        let buf = buf.span(bytes, "ping_pong")?;
        let peer = usize::from(self.me == 0);
        let s = stream.raw();
        // `buf` holds `bytes` bytes (checked) that the caller keeps alive until the stream has
        // run this step; the receive lands after the send on the same stream.
        if self.me == 0 {
            self.comm.send(buf, bytes, peer, s).map_err(nccl_error)?;
            self.comm.recv(buf, bytes, peer, s).map_err(nccl_error)
        } else {
            self.comm.recv(buf, bytes, peer, s).map_err(nccl_error)?;
            self.comm.send(buf, bytes, peer, s).map_err(nccl_error)
        }
    }
}
