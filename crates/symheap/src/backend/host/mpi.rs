//! The host backend's path between nodes: Open MPI's collectives, loaded at run time.
//!
//! PEs on different nodes share no memory, so a host collective over a team that spans nodes
//! cannot read peers' copies. Rather than a TCP data path of its own, symheap hands such a
//! collective to the MPI the job was launched with (`mpirun`), which has shared-memory and
//! network transports tuned for it. The library is opened with `dlopen` when the first such
//! collective runs, not linked: symheap's wheel and binary must build and run where no MPI is
//! installed (and the `mpi` crate needs MPI's headers and `mpicc` at build time). The ABI is
//! Open MPI's (handles are pointers to its predefined objects, `MPI_IN_PLACE` is `(void *)1`);
//! MPICH's integer handles are not supported and say so.
//!
//! Reductions use MPI's predefined operations, except for float16 and bfloat16, which MPI does
//! not have: those run as user operations over 16-bit words that widen to f32 per pair (a
//! tree of pairwise roundings, where the shared-memory path rounds once).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

use half::{bf16, f16};

use crate::backend::ReduceOp;
use crate::element::DType;

/// An Open MPI handle (`MPI_Comm`, `MPI_Datatype`, `MPI_Op`): a pointer to its object.
type Handle = *mut c_void;
type IntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type InitThread =
    unsafe extern "C" fn(*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int) -> c_int;
type Finalize = unsafe extern "C" fn() -> c_int;
type CommInt = unsafe extern "C" fn(Handle, *mut c_int) -> c_int;
type Allreduce =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, Handle, Handle, Handle) -> c_int;
type Bcast = unsafe extern "C" fn(*mut c_void, c_int, Handle, c_int, Handle) -> c_int;
type Gather =
    unsafe extern "C" fn(*const c_void, c_int, Handle, *mut c_void, c_int, Handle, Handle) -> c_int;
type ReduceScatter =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, Handle, Handle, Handle) -> c_int;
/// MPI_Alltoallv: send buffer, counts, displacements, type; receive the same; communicator.
type Alltoallv = unsafe extern "C" fn(
    *const c_void,
    *const c_int,
    *const c_int,
    Handle,
    *mut c_void,
    *const c_int,
    *const c_int,
    Handle,
    Handle,
) -> c_int;
type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut Handle);
type OpCreate = unsafe extern "C" fn(UserFn, c_int, *mut Handle) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int, *mut c_char, *mut c_int) -> c_int;
type CommSplit = unsafe extern "C" fn(Handle, c_int, c_int, *mut Handle) -> c_int;
type CommFree = unsafe extern "C" fn(*mut Handle) -> c_int;

const MPI_SUCCESS: c_int = 0;
const MPI_THREAD_SERIALIZED: c_int = 2;
/// Open MPI's `MPI_UNDEFINED` (the color of a rank that joins no communicator in a split).
const MPI_UNDEFINED: c_int = -32766;
/// Open MPI's `MPI_IN_PLACE`: the address 1.
const MPI_IN_PLACE: *mut c_void = std::ptr::without_provenance_mut(1);
const LIB_ENV: &str = "SYMHEAP_MPI_LIB";
const LIB_NAME: &str = "libmpi.so.40";

/// An Open MPI communicator: MPI's world, or one a team spanning nodes split off it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpiComm(Handle);

// SAFETY: a handle is an address Open MPI owns; symheap uses it only in MPI calls, serialized
// as for `Mpi` below.
unsafe impl Send for MpiComm {}
// SAFETY: as for Send.
unsafe impl Sync for MpiComm {}

/// Open MPI, initialised, with the handles symheap uses.
pub struct Mpi {
    allreduce: Allreduce,
    bcast: Bcast,
    allgather: Gather,
    alltoall: Gather,
    alltoallv: Alltoallv,
    reduce_scatter: ReduceScatter,
    finalize: Finalize,
    finalized: IntOut,
    error_string: ErrorString,
    comm_split: CommSplit,
    comm_free: CommFree,
    world: Handle,
    byte: Handle,
    types: [Handle; 12],
    ops: [Handle; 4],
    /// User operations for f16/bf16, by (is bf16, op), made at first use.
    half_ops: Mutex<[[Handle; 4]; 2]>,
    op_create: OpCreate,
    /// Whether symheap called MPI_Init (then it calls MPI_Finalize at finalize).
    ours: bool,
    _lib: std::mem::ManuallyDrop<libloading::Library>,
}

// SAFETY: the handles are addresses of Open MPI's process-global predefined objects (or of
// operations created once and never freed); MPI is initialised for serialized use from any
// thread, and symheap calls it only under the world team's lock (collectives are serialized).
unsafe impl Send for Mpi {}
// SAFETY: as for Send; `half_ops` is behind a Mutex.
unsafe impl Sync for Mpi {}

/// The element types in `DType` order (see `element.rs`), as Open MPI's symbols.
const TYPE_SYMBOLS: [&str; 12] = [
    "ompi_mpi_uint8_t",
    "ompi_mpi_int8_t",
    "ompi_mpi_uint16_t",
    "ompi_mpi_int16_t",
    "ompi_mpi_uint32_t",
    "ompi_mpi_int32_t",
    "ompi_mpi_uint64_t",
    "ompi_mpi_int64_t",
    "ompi_mpi_uint16_t", // float16: 16-bit words under a user operation
    "ompi_mpi_uint16_t", // bfloat16: likewise
    "ompi_mpi_float",
    "ompi_mpi_double",
];

fn type_index(d: DType) -> usize {
    match d {
        DType::U8 => 0,
        DType::I8 => 1,
        DType::U16 => 2,
        DType::I16 => 3,
        DType::U32 => 4,
        DType::I32 => 5,
        DType::U64 => 6,
        DType::I64 => 7,
        DType::F16 => 8,
        DType::BF16 => 9,
        DType::F32 => 10,
        DType::F64 => 11,
    }
}

fn op_index(op: ReduceOp) -> usize {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Min => 1,
        ReduceOp::Max => 2,
        ReduceOp::Prod => 3,
    }
}

fn count(n: usize, what: &str) -> Result<c_int, String> {
    c_int::try_from(n).map_err(|_| {
        format!(
            "{what} of {n} elements is more than MPI's int count ({}) allows",
            c_int::MAX
        )
    })
}

impl Mpi {
    /// Opens Open MPI (`SYMHEAP_MPI_LIB`, else `libmpi.so.40` on the loader's path) and
    /// initialises it unless the program already did; checks that MPI's world is symheap's
    /// (`rank` of `size`).
    pub(crate) fn open(rank: usize, size: usize) -> Result<Mpi, String> {
        let path = std::env::var(LIB_ENV).unwrap_or_else(|_| LIB_NAME.to_string());
        // SAFETY: loading runs Open MPI's static initialisers, which only set up its globals;
        // no MPI call is made before MPI_Initialized below.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
            format!(
                "cannot load Open MPI ({path}: {}): install it (apt-get install openmpi-bin, or your \
                 cluster's module) and launch with mpirun, or set {LIB_ENV}",
                crate::util::libsearch::with_source(&e)
            )
        })?;
        // Never unloaded: MPI registers exit handlers.
        let lib = std::mem::ManuallyDrop::new(lib);
        macro_rules! sym {
            ($name:expr, $ty:ty) => {{
                let name = format!("{}\0", $name);
                // SAFETY: `$ty` is the symbol's C signature in Open MPI's mpi.h (4.x and 5.x);
                // the value is copied out and stays valid since the library stays loaded.
                let s = unsafe { lib.get::<$ty>(name.as_bytes()) };
                *s.map_err(|e| {
                    format!(
                        "{path} lacks {} ({}); symheap supports Open MPI's ABI only",
                        $name,
                        crate::util::libsearch::with_source(&e)
                    )
                })?
            }};
        }
        macro_rules! object {
            ($name:expr) => {{
                let name = format!("{}\0", $name);
                // SAFETY: the address of one of Open MPI's predefined objects: the handle
                // itself (Open MPI's MPI_COMM_WORLD is `&ompi_mpi_comm_world`, and so on).
                let s = unsafe { lib.get::<*mut c_void>(name.as_bytes()) };
                let s = s.map_err(|e| {
                    format!(
                        "{path} lacks {} ({}); symheap supports Open MPI's ABI only",
                        $name,
                        crate::util::libsearch::with_source(&e)
                    )
                })?;
                // SAFETY: the raw value of the platform symbol is what dlsym returned: the object's address
                // (never dereferenced here; Open MPI reads it as the handle).
                unsafe { s.into_raw() }.into_raw() as Handle
            }};
        }
        let initialized = sym!("MPI_Initialized", IntOut);
        let init_thread = sym!("MPI_Init_thread", InitThread);
        let mut flag: c_int = 0;
        // SAFETY: writes one int; callable before MPI_Init.
        unsafe { initialized(&mut flag) };
        let ours = flag == 0;
        if ours {
            let mut provided: c_int = 0;
            // SAFETY: null argc/argv are allowed by MPI-2 and later; `provided` is one int.
            let rc = unsafe {
                init_thread(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    MPI_THREAD_SERIALIZED,
                    &mut provided,
                )
            };
            if rc != MPI_SUCCESS {
                return Err(format!("MPI_Init_thread failed (error {rc})"));
            }
        }
        let mut types = [std::ptr::null_mut(); 12];
        for (t, name) in types.iter_mut().zip(TYPE_SYMBOLS) {
            *t = object!(name);
        }
        let mut ops = [std::ptr::null_mut(); 4];
        for (o, name) in ops.iter_mut().zip([
            "ompi_mpi_op_sum",
            "ompi_mpi_op_min",
            "ompi_mpi_op_max",
            "ompi_mpi_op_prod",
        ]) {
            *o = object!(name);
        }
        let (comm_rank, comm_size) = (
            sym!("MPI_Comm_rank", CommInt),
            sym!("MPI_Comm_size", CommInt),
        );
        let mpi = Mpi {
            allreduce: sym!("MPI_Allreduce", Allreduce),
            bcast: sym!("MPI_Bcast", Bcast),
            allgather: sym!("MPI_Allgather", Gather),
            alltoall: sym!("MPI_Alltoall", Gather),
            alltoallv: sym!("MPI_Alltoallv", Alltoallv),
            reduce_scatter: sym!("MPI_Reduce_scatter_block", ReduceScatter),
            finalize: sym!("MPI_Finalize", Finalize),
            finalized: sym!("MPI_Finalized", IntOut),
            error_string: sym!("MPI_Error_string", ErrorString),
            comm_split: sym!("MPI_Comm_split", CommSplit),
            comm_free: sym!("MPI_Comm_free", CommFree),
            op_create: sym!("MPI_Op_create", OpCreate),
            world: object!("ompi_mpi_comm_world"),
            byte: object!("ompi_mpi_byte"),
            types,
            ops,
            half_ops: Mutex::new([[std::ptr::null_mut(); 4]; 2]),
            ours,
            _lib: lib,
        };
        mpi.check_world(rank, size, comm_rank, comm_size)?;
        Ok(mpi)
    }

    fn check_world(
        &self,
        rank: usize,
        size: usize,
        rank_fn: CommInt,
        size_fn: CommInt,
    ) -> Result<(), String> {
        let (mut r, mut s): (c_int, c_int) = (-1, -1);
        // SAFETY: MPI is initialised; each call writes one int.
        unsafe {
            rank_fn(self.world, &mut r);
            size_fn(self.world, &mut s);
        }
        if r as usize != rank || s as usize != size {
            return Err(format!(
                "MPI's world is rank {r} of {s}, symheap's PE {rank} of {size}: launch the job with \
                 Open MPI's mpirun (one process per PE) for collectives across nodes"
            ));
        }
        Ok(())
    }

    fn result(&self, rc: c_int, what: &str) -> Result<(), String> {
        if rc == MPI_SUCCESS {
            return Ok(());
        }
        let mut buf = [0 as c_char; 512];
        let mut len: c_int = 0;
        // SAFETY: MPI_MAX_ERROR_STRING is 256 in Open MPI; the buffer is larger and the
        // string it writes is NUL-terminated.
        unsafe { (self.error_string)(rc, buf.as_mut_ptr(), &mut len) };
        // SAFETY: NUL-terminated within `buf` (zeroed, and MPI writes less than its size).
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        Err(format!("{what}: Open MPI error {rc}: {msg}"))
    }

    fn op(&self, dtype: DType, op: ReduceOp) -> Result<Handle, String> {
        let which = match dtype {
            DType::F16 => 0,
            DType::BF16 => 1,
            _ => return Ok(self.ops[op_index(op)]),
        };
        let mut made = self.half_ops.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut made[which][op_index(op)];
        if slot.is_null() {
            let f = HALF_OPS[which][op_index(op)];
            let mut h: Handle = std::ptr::null_mut();
            // SAFETY: `f` has MPI_User_function's signature; `h` receives the new handle.
            let rc = unsafe { (self.op_create)(f, 1, &mut h) };
            self.result(rc, "MPI_Op_create")?;
            *slot = h;
        }
        Ok(*slot)
    }

    /// MPI's world.
    pub(crate) fn world(&self) -> MpiComm {
        MpiComm(self.world)
    }

    /// Collective over MPI's world: a communicator of the ranks with `member`, ordered by
    /// `key` (None on the others).
    pub(crate) fn split(&self, member: bool, key: usize) -> Result<Option<MpiComm>, String> {
        let color = if member { 0 } else { MPI_UNDEFINED };
        let mut out: Handle = std::ptr::null_mut();
        // SAFETY: MPI is initialised; writes one handle (MPI_COMM_NULL for MPI_UNDEFINED).
        let rc = unsafe { (self.comm_split)(self.world, color, key as c_int, &mut out) };
        self.result(rc, "MPI_Comm_split")?;
        Ok(member.then_some(MpiComm(out)))
    }

    /// Collective over `comm`'s ranks: frees a communicator `split` made.
    pub(crate) fn free(&self, comm: MpiComm) -> Result<(), String> {
        let mut h = comm.0;
        // SAFETY: `comm` came from `split` and is freed once (its team is destroyed once).
        let rc = unsafe { (self.comm_free)(&mut h) };
        self.result(rc, "MPI_Comm_free")
    }

    /// `count` elements reduced over `comm` into `dst` (`dst == src`: in place).
    /// The ops layer checked: `src` and `dst` are valid for `count` elements of `dtype` on this PE.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_reduce(
        &self,
        comm: MpiComm,
        dst: u64,
        src: u64,
        n: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), String> {
        let c = count(n, "all_reduce")?;
        let s = if dst == src {
            MPI_IN_PLACE
        } else {
            src as *mut c_void
        };
        let h = self.op(dtype, op)?;
        // SAFETY: the ops layer checked both ranges are this PE's mapped heap of `count` elements;
        // handles are predefined or created above.
        let rc = unsafe {
            (self.allreduce)(
                s,
                dst as *mut c_void,
                c,
                self.types[type_index(dtype)],
                h,
                comm.0,
            )
        };
        self.result(rc, "MPI_Allreduce")
    }

    /// `bytes` of `root`'s `src` into every rank's `dst` (`me`: this rank in `comm`).
    /// The ops layer checked: `dst` is valid for `bytes` (and `src` on the root).
    pub(crate) fn broadcast(
        &self,
        comm: MpiComm,
        dst: u64,
        src: u64,
        bytes: usize,
        root: usize,
        me: usize,
    ) -> Result<(), String> {
        let c = count(bytes, "broadcast")?;
        if me == root && dst != src {
            // SAFETY: the ops layer checked both are mapped heap ranges of `bytes`; `copy` allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        }
        // SAFETY: the ops layer checked `dst` is a mapped heap range of `bytes`.
        let rc = unsafe { (self.bcast)(dst as *mut c_void, c, self.byte, root as c_int, comm.0) };
        self.result(rc, "MPI_Bcast")
    }

    /// Every rank's `bytes` at `src` into `dst + rank * bytes` (`dst == src`: in place).
    /// The ops layer checked: `src` valid for `bytes`, `dst` for `size * bytes`.
    pub(crate) fn all_gather(
        &self,
        comm: MpiComm,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<(), String> {
        self.exchange(comm, self.allgather, "MPI_Allgather", dst, src, bytes)
    }

    /// Block `j` (of `bytes`) of every PE's `src` into block `pe` of PE `j`'s `dst`.
    /// The ops layer checked: `src` and `dst` valid for `size * bytes` (`dst == src`: in place).
    pub(crate) fn alltoall(
        &self,
        comm: MpiComm,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<(), String> {
        self.exchange(comm, self.alltoall, "MPI_Alltoall", dst, src, bytes)
    }

    /// Bytes `send[j] = (offset, len)` of `src` to rank j, and from rank j into
    /// `recv[j] = (offset, len)` of `dst`, for every j of `comm` (MPI_Alltoallv of bytes).
    /// Every pair's lengths must agree (what rank i sends rank j is what rank j receives).
    /// The ops layer checked: every range lies in the checked `src` and `dst` ranges, which do
    /// not overlap.
    pub(crate) fn alltoallv(
        &self,
        comm: MpiComm,
        dst: u64,
        src: u64,
        send: &[(usize, usize)],
        recv: &[(usize, usize)],
    ) -> Result<(), String> {
        let ints = |v: &[(usize, usize)]| -> Result<(Vec<c_int>, Vec<c_int>), String> {
            let mut off = Vec::with_capacity(v.len());
            let mut len = Vec::with_capacity(v.len());
            for &(o, l) in v {
                off.push(count(o, "alltoallv displacement")?);
                len.push(count(l, "alltoallv")?);
            }
            Ok((off, len))
        };
        let ((soff, slen), (roff, rlen)) = (ints(send)?, ints(recv)?);
        let b = self.byte;
        // SAFETY: four arrays of one int per rank of `comm` (the ops layer passes one entry per
        // member), alive for the call; the ranges they name were checked (see above).
        let rc = unsafe {
            (self.alltoallv)(
                src as *const c_void,
                slen.as_ptr(),
                soff.as_ptr(),
                b,
                dst as *mut c_void,
                rlen.as_ptr(),
                roff.as_ptr(),
                b,
                comm.0,
            )
        };
        self.result(rc, "MPI_Alltoallv")
    }

    /// MPI_Allgather or MPI_Alltoall of `bytes` per PE, with the ranges its caller checked.
    fn exchange(
        &self,
        comm: MpiComm,
        f: Gather,
        name: &str,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<(), String> {
        let c = count(bytes, name)?;
        let s = if dst == src {
            MPI_IN_PLACE
        } else {
            src as *mut c_void
        };
        let (b, w) = (self.byte, comm.0);
        // SAFETY: the calling function's doc says which ranges the ops layer checked.
        let rc = unsafe { f(s, c, b, dst as *mut c_void, c, b, w) };
        self.result(rc, name)
    }

    /// Block `pe` of the reduction of every PE's `src` (`size * n` elements) into `dst`.
    /// The ops layer checked: `src` valid for `size * n` elements, `dst` for `n` (in place,
    /// `dst == src`: the result goes to block `me`, as the shared-memory path puts it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce_scatter(
        &self,
        comm: MpiComm,
        dst: u64,
        src: u64,
        n: usize,
        dtype: DType,
        op: ReduceOp,
        me: usize,
    ) -> Result<(), String> {
        let c = count(n, "reduce_scatter")?;
        let h = self.op(dtype, op)?;
        let bytes = n * dtype.size();
        // MPI forbids a receive buffer inside the send buffer: in place goes through a copy.
        let mut tmp = if dst == src {
            vec![0u8; bytes]
        } else {
            Vec::new()
        };
        let out = if dst == src {
            tmp.as_mut_ptr() as *mut c_void
        } else {
            dst as *mut c_void
        };
        let t = self.types[type_index(dtype)];
        // SAFETY: the ops layer checked the ranges (see this function's doc); `tmp` holds
        // `bytes` when used.
        let rc = unsafe { (self.reduce_scatter)(src as *mut c_void, out, c, t, h, comm.0) };
        self.result(rc, "MPI_Reduce_scatter_block")?;
        if dst == src {
            // SAFETY: block `me` of the checked `size * n`-element range at `src`.
            unsafe {
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), (dst as *mut u8).add(me * bytes), bytes)
            };
        }
        Ok(())
    }

    /// Collective: MPI_Finalize, when symheap initialised MPI and nobody finalized it yet.
    pub(crate) fn finish(&self) {
        if !self.ours {
            return;
        }
        let mut done: c_int = 0;
        // SAFETY: writes one int; callable at any time.
        unsafe { (self.finalized)(&mut done) };
        if done == 0 {
            // SAFETY: every PE reaches this from symheap's finalize, after its last collective.
            unsafe { (self.finalize)() };
        }
    }
}

/// MPI_User_function bodies for 16-bit floats: `inout[i] = op(in[i], inout[i])` through f32.
macro_rules! half_op {
    ($name:ident, $t:ty, $f:expr) => {
        unsafe extern "C" fn $name(
            inv: *mut c_void,
            inout: *mut c_void,
            len: *mut c_int,
            _dt: *mut Handle,
        ) {
            // SAFETY: MPI passes `*len` elements of the 16-bit type in both vectors.
            let n = unsafe { *len } as usize;
            // SAFETY: as above; the two vectors do not overlap (MPI-4 §6.9.5).
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(inv as *const $t, n),
                    std::slice::from_raw_parts_mut(inout as *mut $t, n),
                )
            };
            let f = $f;
            for (x, y) in a.iter().zip(b.iter_mut()) {
                *y = <$t>::from_f32(f(x.to_f32(), y.to_f32()));
            }
        }
    };
}

half_op!(f16_sum, f16, |x: f32, y: f32| x + y);
half_op!(f16_min, f16, |x: f32, y: f32| x.min(y));
half_op!(f16_max, f16, |x: f32, y: f32| x.max(y));
half_op!(f16_prod, f16, |x: f32, y: f32| x * y);
half_op!(bf16_sum, bf16, |x: f32, y: f32| x + y);
half_op!(bf16_min, bf16, |x: f32, y: f32| x.min(y));
half_op!(bf16_max, bf16, |x: f32, y: f32| x.max(y));
half_op!(bf16_prod, bf16, |x: f32, y: f32| x * y);

const HALF_OPS: [[UserFn; 4]; 2] = [
    [f16_sum, f16_min, f16_max, f16_prod],
    [bf16_sum, bf16_min, bf16_max, bf16_prod],
];
