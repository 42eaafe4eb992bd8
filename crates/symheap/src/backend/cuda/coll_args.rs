//! The collective kernels (coll.cu) as Rust sees them: their one argument block ([`CollArgs`],
//! with the team part [`CollTeam`]), mirrored by coll.cu's `coll::Args` and `coll::Team` and
//! checked against them when the program compiles (see `arg_block.rs`); the kernels' typed keys
//! ([`CollKernel`]: a kind, and an element type for the reducing ones); and the table of loaded
//! kernels indexed by key.

use super::arg_block::{arg_block, layout, BlockLayout, Kernel};
use super::driver::Module;
use crate::element::DType;
use crate::error::{backend, Result};

arg_block! {
    /// The team part of every collective launch (coll.cu's `coll::Team`; the launch contract
    /// at the top of coll/common.cu says what each field holds).
    pub struct CollTeam as "coll::Team" {
        /// Device array [n]: each member's heap base in this process's address space.
        pub bases: u64,
        /// My flag area: u64 [2 rounds][1024 blocks][n], zeroed once.
        pub flags: u64,
        /// Device array [n]: the address of member j's flag area.
        pub peer_flags: u64,
        /// ctl[0] = epoch (completed launches on this team), ctl[1] = blocks-done counter.
        pub ctl: u64,
        /// My team index.
        pub me: i32,
        /// Team size (1 <= n <= 64).
        pub n: i32,
        /// Bound on every wait (`%globaltimer` ns).
        pub timeout_ns: u64,
        /// Host-mapped word: 3 on a timeout, 4 on a launch outside the kernel's preconditions.
        pub error: u64,
    }
}

arg_block! {
    /// The arguments of every collective kernel (coll.cu's `coll::Args`). A kernel reads the
    /// fields its family uses (see [`ReduceKernel`] and [`ByteKernel`]); the others are zero.
    pub struct CollArgs as "coll::Args" {
        /// Source (symmetric, or this PE's own memory for the kernels that stay local).
        pub src: u64,
        /// Destination.
        pub dst: u64,
        /// Elements for the reducing kernels; bytes per member for the byte kernels.
        pub count: u64,
        /// One-shot family: element stride between the members' blocks of `src` (0 for
        /// all_reduce, `count` for reduce_scatter).
        pub stride: u64,
        /// Scratch kernels: device array [n] of the members' scratch bases.
        pub peer_scratch: u64,
        /// Scratch kernels: my scratch.
        pub scratch: u64,
        /// LL and flag kernels: the scratch slot size in bytes.
        pub slot_bytes: u64,
        /// LL128 kernels: where the LL128 region starts in every member's scratch.
        pub ll_off: u64,
        /// LL128 kernels: the LL128 region's bytes per parity.
        pub part: u64,
        /// Uneven alltoall with device counts: every member's send counts (int64 [n] rows,
        /// symmetric).
        pub splits: u64,
        /// Uneven alltoall with device counts: this PE's received rows and their offsets
        /// (int64 [2 n]), or 0.
        pub out: u64,
        /// Uneven alltoall with device counts: rows every member's source holds.
        pub src_rows: u64,
        /// Uneven alltoall with device counts: rows every member's destination holds.
        pub dst_rows: u64,
        /// Reducing kernels: 0 sum, 1 min, 2 max, 3 prod.
        pub op: i32,
        /// Exchange kernels: 0 all_gather, 1 alltoall, 2 broadcast.
        pub mode: i32,
        /// Broadcast and the exchange kernels: the root's team index.
        pub root: i32,
        /// Zero.
        pub reserved: i32,
        /// The team.
        pub team: CollTeam,
    }
}

/// Every block coll.cu declares, for its layout checks.
pub(super) fn blocks() -> [BlockLayout; 2] {
    [layout::<CollTeam>(), layout::<CollArgs>()]
}

/// Element types of the reducing kernels (each is built once per type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollDType {
    /// float.
    F32,
    /// IEEE half, accumulated in f32.
    F16,
    /// bfloat16, accumulated in f32.
    BF16,
    /// int32 (sum and prod wrap).
    I32,
}

impl CollDType {
    /// Every type, in table order.
    pub const ALL: [CollDType; 4] = [Self::F32, Self::F16, Self::BF16, Self::I32];

    /// The reducing kernels' type for `d`, if they are built for it.
    pub fn of(d: DType) -> Option<CollDType> {
        Self::ALL.into_iter().find(|c| c.dtype() == d)
    }

    /// The element type.
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F16 => DType::F16,
            Self::BF16 => DType::BF16,
            Self::I32 => DType::I32,
        }
    }

    /// The kernels' symbol suffix (coll.cu's `COLL_REDUCTIONS`).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::I32 => "i32",
        }
    }
}

/// The reducing kernels, one per [`CollDType`]. Arguments: `src`, `dst`, `count` (elements),
/// `op`; the one-shot family (`ArOneshot`, `ArFlag`, `ArLl128`) also `stride`, `peer_scratch`,
/// `scratch` and `slot_bytes` (LL and flag) or `ll_off` and `part` (LL128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKernel {
    /// One-shot all_reduce / reduce_scatter, LL lines in scratch.
    ArOneshot,
    /// One-shot through scratch with one flag round.
    ArFlag,
    /// One-shot, LL128 lines in scratch.
    ArLl128,
    /// Two-shot all_reduce (bandwidth path).
    ArTwoshot,
    /// reduce_scatter, each member pulling its block.
    ReduceScatter,
}

impl ReduceKernel {
    /// Every kind, in table order.
    pub const ALL: [ReduceKernel; 5] = [
        Self::ArOneshot,
        Self::ArFlag,
        Self::ArLl128,
        Self::ArTwoshot,
        Self::ReduceScatter,
    ];

    /// The symbol without its type suffix.
    pub fn stem(self) -> &'static str {
        match self {
            Self::ArOneshot => "symheap_ar_oneshot",
            Self::ArFlag => "symheap_ar_flag",
            Self::ArLl128 => "symheap_ar_ll128",
            Self::ArTwoshot => "symheap_ar_twoshot",
            Self::ReduceScatter => "symheap_reduce_scatter",
        }
    }
}

/// The kernels that move bytes, whatever the element type. Arguments: `src`, `dst`, `count`
/// (bytes per member); `Broadcast` also `root`; the exchange kernels also `mode`, `root`,
/// `peer_scratch`, `scratch` and `slot_bytes` (LL) or `ll_off` and `part` (LL128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteKernel {
    /// all_gather after an entry round.
    AllGather,
    /// broadcast (push or pull).
    Broadcast,
    /// alltoall after an entry round.
    Alltoall,
    /// Small all_gather / alltoall / broadcast, LL lines in scratch.
    ExchangeLl,
    /// Mid-size all_gather / alltoall / broadcast, LL128 lines in scratch.
    ExchangeLl128,
    /// Uneven alltoall, counts in device memory (`count` is the row's bytes).
    Alltoallv,
    /// A barrier of the team on the stream (no data).
    TeamBarrier,
}

impl ByteKernel {
    /// Every kind, in table order.
    pub const ALL: [ByteKernel; 7] = [
        Self::AllGather,
        Self::Broadcast,
        Self::Alltoall,
        Self::ExchangeLl,
        Self::ExchangeLl128,
        Self::Alltoallv,
        Self::TeamBarrier,
    ];

    /// The symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::AllGather => "symheap_allgather",
            Self::Broadcast => "symheap_broadcast",
            Self::Alltoall => "symheap_alltoall",
            Self::ExchangeLl => "symheap_exchange_ll",
            Self::ExchangeLl128 => "symheap_exchange_ll128",
            Self::Alltoallv => "symheap_alltoallv",
            Self::TeamBarrier => "symheap_team_barrier",
        }
    }
}

/// One collective kernel: a reducing kind for one element type, or a byte kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKernel {
    /// A reducing kernel for one element type.
    Reduce(ReduceKernel, CollDType),
    /// A byte kernel.
    Bytes(ByteKernel),
}

/// Number of collective kernels.
const COUNT: usize = ReduceKernel::ALL.len() * CollDType::ALL.len() + ByteKernel::ALL.len();

impl CollKernel {
    /// Every kernel, in table order (`index` of the i-th is i).
    pub fn all() -> impl Iterator<Item = CollKernel> {
        let reducing = ReduceKernel::ALL
            .into_iter()
            .flat_map(|k| CollDType::ALL.into_iter().map(move |d| Self::Reduce(k, d)));
        reducing.chain(ByteKernel::ALL.into_iter().map(Self::Bytes))
    }

    /// The kernel's position in the table.
    fn index(self) -> usize {
        match self {
            Self::Reduce(k, d) => k as usize * CollDType::ALL.len() + d as usize,
            Self::Bytes(k) => ReduceKernel::ALL.len() * CollDType::ALL.len() + k as usize,
        }
    }

    /// The `extern "C"` symbol in coll.cu.
    pub fn symbol(self) -> String {
        match self {
            Self::Reduce(k, d) => format!("{}_{}", k.stem(), d.suffix()),
            Self::Bytes(k) => k.symbol().to_string(),
        }
    }
}

/// The collective kernels of one loaded module, indexed by [`CollKernel`].
pub(super) struct CollKernels {
    pub(super) _module: Module,
    fns: [Kernel<CollArgs>; COUNT],
}

impl CollKernels {
    /// Looks every collective kernel up in `module` (coll.cu).
    pub(super) fn load(module: Module) -> Result<CollKernels> {
        let mut fns = Vec::with_capacity(COUNT);
        for k in CollKernel::all() {
            // SAFETY: every kernel of coll.cu takes `coll::Args` by value, whose layout is
            // CollArgs' (the program's layout checks; nvrtc_compile's
            // `every_kernel_takes_its_argument_block` checks each symbol's parameter); the
            // module is kept alongside the handles.
            fns.push(unsafe { Kernel::load(&module, &k.symbol())? });
        }
        let fns = fns.try_into().map_err(|_| {
            backend(
                "init",
                "the collective kernel table is incomplete".to_string(),
            )
        })?;
        Ok(CollKernels {
            _module: module,
            fns,
        })
    }

    /// The kernel for `key`.
    pub(super) fn get(&self, key: CollKernel) -> Kernel<CollArgs> {
        self.fns[key.index()]
    }
}

/// coll.cu's kernels: (symbol, the size of its argument block).
pub(super) fn symbols() -> Vec<(String, usize)> {
    CollKernel::all()
        .map(|k| (k.symbol(), std::mem::size_of::<CollArgs>()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_index_the_table_in_order() {
        let all: Vec<CollKernel> = CollKernel::all().collect();
        assert_eq!(all.len(), COUNT);
        for (i, k) in all.iter().enumerate() {
            assert_eq!(k.index(), i, "{k:?}");
        }
        let mut symbols: Vec<String> = all.iter().map(|k| k.symbol()).collect();
        symbols.sort();
        symbols.dedup();
        assert_eq!(symbols.len(), COUNT, "every kernel has its own symbol");
        assert_eq!(
            CollKernel::Reduce(ReduceKernel::ArLl128, CollDType::BF16).symbol(),
            "symheap_ar_ll128_bf16"
        );
        assert_eq!(
            CollKernel::Bytes(ByteKernel::ExchangeLl128).symbol(),
            "symheap_exchange_ll128"
        );
    }

    #[test]
    fn dtypes_are_the_reducing_kernels() {
        for d in CollDType::ALL {
            assert_eq!(CollDType::of(d.dtype()), Some(d));
        }
        assert_eq!(CollDType::of(DType::F64), None);
        assert_eq!(CollDType::of(DType::I64), None);
    }
}
