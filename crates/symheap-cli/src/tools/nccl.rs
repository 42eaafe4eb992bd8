//! NCCL, loaded at run time, as the reference symheap's GPU collectives are checked and
//! measured against. Buffers are typed ([`DeviceMem`]) and their sizes checked against what
//! each call moves, so a safe caller cannot make NCCL read or write past them. A communicator is built over symheap's own bootstrap (the unique id goes
//! through `all_gather_bytes`), so no MPI or torch is needed.

use cudarc::nccl::sys::{self, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use symheap::{Context, DType, Error, ErrorKind, ReduceOp, Result, Stream};

use super::DeviceMem;

fn err(call: &'static str, kind: ErrorKind) -> Error {
    Error::new(None, call, kind)
}

fn check(r: ncclResult_t, what: &str) -> Result<()> {
    if r == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any result code.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(r)) }
        .to_string_lossy()
        .into_owned();
    Err(err(
        "nccl",
        ErrorKind::Backend(format!("{what} failed: {r:?}: {text}")),
    ))
}

fn dtype(d: DType) -> Result<ncclDataType_t> {
    Ok(match d {
        DType::I8 => ncclDataType_t::ncclInt8,
        DType::U8 => ncclDataType_t::ncclUint8,
        DType::I32 => ncclDataType_t::ncclInt32,
        DType::U32 => ncclDataType_t::ncclUint32,
        DType::I64 => ncclDataType_t::ncclInt64,
        DType::U64 => ncclDataType_t::ncclUint64,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F64 => ncclDataType_t::ncclFloat64,
        other => {
            return Err(err(
                "nccl",
                ErrorKind::Unsupported(format!("NCCL has no {other}")),
            ))
        }
    })
}

fn redop(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Prod => ncclRedOp_t::ncclProd,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
    }
}

/// NCCL's version code as `major.minor.patch` (codes since 2.9 are `major*10000 + minor*100 +
/// patch`; older ones `major*1000 + minor*100 + patch`).
pub(crate) fn version_string(code: i32) -> String {
    if code >= 20900 {
        format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100)
    }
}

/// An NCCL communicator over all PEs of a symheap context.
pub(crate) struct Nccl {
    comm: sys::ncclComm_t,
    n: usize,
    me: usize,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; every method takes `&mut self` and `Nccl` is not `Sync`, so they cannot.
unsafe impl Send for Nccl {}

impl Nccl {
    /// NCCL's version code (e.g. 22803), or an error if libnccl cannot be loaded.
    pub(crate) fn version() -> Result<i32> {
        // SAFETY: probing the library has no side effect beyond loading it.
        if !unsafe { sys::is_culib_present() } {
            return Err(err(
                "nccl",
                ErrorKind::Unsupported("libnccl.so.2 was not found".into()),
            ));
        }
        let mut v = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::ncclGetVersion(&mut v) }, "ncclGetVersion")?;
        Ok(v)
    }

    /// Collective over the world: creates a communicator on this PE's CUDA device.
    pub(crate) fn new(ctx: &Context) -> Result<Nccl> {
        let all: Vec<usize> = (0..ctx.n_pes()).collect();
        Nccl::among(ctx, &all)
    }

    /// Collective over the world (every PE calls it, each with its own group): a communicator
    /// over `group` (world PEs, this one among them, ranked in that order). The groups of all
    /// PEs must partition the world; each group's first PE makes the unique id.
    pub(crate) fn among(ctx: &Context, group: &[usize]) -> Result<Nccl> {
        Nccl::version()?;
        let cu = ctx.cuda().ok_or_else(|| {
            err(
                "nccl",
                ErrorKind::Unsupported("NCCL needs the CUDA backend".into()),
            )
        })?;
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
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        if me == 0 {
            // SAFETY: writes one unique id.
            check(unsafe { sys::ncclGetUniqueId(&mut id) }, "ncclGetUniqueId")?;
        }
        let mine: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        let all = ctx.all_gather_bytes(&mine)?;
        for (i, b) in all[group[0]].iter().enumerate().take(128) {
            id.internal[i] = *b as std::ffi::c_char;
        }
        let mut comm = std::ptr::null_mut();
        let n = group.len();
        check(
            // SAFETY: every member passes the same id, its own rank and the group size; the
            // device's context is current (bound above). Writes one communicator, destroyed in
            // Drop.
            unsafe { sys::ncclCommInitRank(&mut comm, n as i32, id, me as i32) },
            "ncclCommInitRank",
        )?;
        Ok(Nccl { comm, n, me })
    }

    /// ncclAllReduce of `count` elements on `stream` (device pointers).
    pub(crate) fn all_reduce(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = (count * d.size()) as u64;
        let (dst, src) = (
            dst.span(bytes, "ncclAllReduce")?,
            src.span(bytes, "ncclAllReduce")?,
        );
        // SAFETY: `src` and `dst` hold `count` elements of `d` (checked above) of device memory
        // that outlives the call; `Stream` holds a live stream handle.
        check(
            unsafe {
                sys::ncclAllReduce(
                    src as *const _,
                    dst as *mut _,
                    count,
                    dtype(d)?,
                    redop(op),
                    self.comm,
                    stream.raw() as _,
                )
            },
            "ncclAllReduce",
        )
    }

    /// ncclAllGather: `count` elements per PE into `dst` (n × count).
    pub(crate) fn all_gather(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = (count * d.size()) as u64;
        let dst = dst.span(bytes * self.n as u64, "ncclAllGather")?;
        let src = src.span(bytes, "ncclAllGather")?;
        // SAFETY: as in `all_reduce`, with dst holding n × count elements (checked).
        check(
            unsafe {
                sys::ncclAllGather(
                    src as *const _,
                    dst as *mut _,
                    count,
                    dtype(d)?,
                    self.comm,
                    stream.raw() as _,
                )
            },
            "ncclAllGather",
        )
    }

    /// ncclReduceScatter: `src` holds n × count, `dst` gets `count`.
    pub(crate) fn reduce_scatter(
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
        let src = src.span(bytes * self.n as u64, "ncclReduceScatter")?;
        // SAFETY: as in `all_reduce`, with src holding n × count elements (checked).
        check(
            unsafe {
                sys::ncclReduceScatter(
                    src as *const _,
                    dst as *mut _,
                    count,
                    dtype(d)?,
                    redop(op),
                    self.comm,
                    stream.raw() as _,
                )
            },
            "ncclReduceScatter",
        )
    }

    /// ncclBroadcast of `count` elements from `root`.
    pub(crate) fn broadcast(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = (count * d.size()) as u64;
        let (dst, src) = (
            dst.span(bytes, "ncclBroadcast")?,
            src.span(bytes, "ncclBroadcast")?,
        );
        // SAFETY: as in `all_reduce` (NCCL checks `root` against the communicator).
        check(
            unsafe {
                sys::ncclBroadcast(
                    src as *const _,
                    dst as *mut _,
                    count,
                    dtype(d)?,
                    root as i32,
                    self.comm,
                    stream.raw() as _,
                )
            },
            "ncclBroadcast",
        )
    }

    /// Alltoall of `count` elements per PE pair, as grouped send/recv.
    pub(crate) fn alltoall(
        &mut self,
        dst: &impl DeviceMem,
        src: &impl DeviceMem,
        count: usize,
        d: DType,
        stream: &Stream,
    ) -> Result<()> {
        let t = dtype(d)?;
        let bytes = (count * d.size()) as u64;
        let dst = dst.span(bytes * self.n as u64, "alltoall")?;
        let src = src.span(bytes * self.n as u64, "alltoall")?;
        // SAFETY: group calls only batch the operations inside them.
        check(unsafe { sys::ncclGroupStart() }, "ncclGroupStart")?;
        for j in 0..self.n {
            // SAFETY: src and dst hold n × count elements; block j of each is in range.
            let r = unsafe {
                let s = sys::ncclSend(
                    (src + j as u64 * bytes) as *const _,
                    count,
                    t,
                    j as i32,
                    self.comm,
                    stream.raw() as _,
                );
                if s != ncclResult_t::ncclSuccess {
                    s
                } else {
                    sys::ncclRecv(
                        (dst + j as u64 * bytes) as *mut _,
                        count,
                        t,
                        j as i32,
                        self.comm,
                        stream.raw() as _,
                    )
                }
            };
            if r != ncclResult_t::ncclSuccess {
                // SAFETY: close the group opened above before reporting.
                let _ = unsafe { sys::ncclGroupEnd() };
                return check(r, "ncclSend/ncclRecv");
            }
        }
        // SAFETY: closes the group opened above.
        check(unsafe { sys::ncclGroupEnd() }, "ncclGroupEnd")
    }

    /// Ping-pong step of `bytes` bytes: PE 0 sends to PE 1 and receives back, PE 1 the reverse.
    pub(crate) fn ping_pong(
        &mut self,
        buf: &impl DeviceMem,
        bytes: u64,
        stream: &Stream,
    ) -> Result<()> {
        let buf = buf.span(bytes, "ping_pong")?;
        let peer = if self.me == 0 { 1 } else { 0 };
        let send = || {
            // SAFETY: `buf` holds at least `bytes` bytes of device memory (checked), which the
            // caller keeps alive until the stream has run this step.
            check(
                unsafe {
                    sys::ncclSend(
                        buf as *const _,
                        bytes as usize,
                        ncclDataType_t::ncclUint8,
                        peer,
                        self.comm,
                        stream.raw() as _,
                    )
                },
                "ncclSend",
            )
        };
        let recv = || {
            // SAFETY: as for the send; the receive lands after the send on the same stream.
            check(
                unsafe {
                    sys::ncclRecv(
                        buf as *mut _,
                        bytes as usize,
                        ncclDataType_t::ncclUint8,
                        peer,
                        self.comm,
                        stream.raw() as _,
                    )
                },
                "ncclRecv",
            )
        };
        if self.me == 0 {
            send()?;
            recv()
        } else {
            recv()?;
            send()
        }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; callers synchronise their streams first.
        let _ = unsafe { sys::ncclCommDestroy(self.comm) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_codes_read_as_major_minor_patch() {
        assert_eq!(super::version_string(22803), "2.28.3");
        assert_eq!(super::version_string(23203), "2.32.3");
        assert_eq!(super::version_string(2804), "2.8.4");
    }
}
