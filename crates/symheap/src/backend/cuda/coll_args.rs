//! The collective kernels (coll.cu) as Rust sees them: their one argument block ([`CollArgs`],
//! with the team part [`CollTeam`]), mirrored by coll.cu's `coll::Args` and `coll::Team` and
//! checked against them when the program compiles (see `arg_block.rs`); the kernels' typed keys
//! ([`CollKernel`]: a kind, and an element type for the reducing ones); and the table of loaded
//! kernels indexed by key.

use super::arg_block::{arg_block, layout, BlockLayout, Kernel};
use super::driver::{Arg, Module};
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

    /// The kernel named `symbol`, if coll.cu has it.
    pub fn from_symbol(symbol: &str) -> Option<CollKernel> {
        if let Some(k) = ByteKernel::ALL.into_iter().find(|k| k.symbol() == symbol) {
            return Some(Self::Bytes(k));
        }
        let (stem, sfx) = symbol.rsplit_once('_')?;
        let k = ReduceKernel::ALL.into_iter().find(|k| k.stem() == stem)?;
        let d = CollDType::ALL.into_iter().find(|d| d.suffix() == sfx)?;
        Some(Self::Reduce(k, d))
    }

    /// The argument fields this kernel reads before the team, in the order of its former
    /// parameter list (for [`CollArgs::from_positional`]).
    fn head(self) -> &'static [Param] {
        use Param::*;
        match self {
            Self::Reduce(ReduceKernel::ArOneshot | ReduceKernel::ArFlag, _) => {
                &[Src, Dst, Count, Stride, Op, PeerScratch, Scratch, SlotBytes]
            }
            Self::Reduce(ReduceKernel::ArLl128, _) => &[
                Src,
                Dst,
                Count,
                Stride,
                Op,
                PeerScratch,
                Scratch,
                LlOff,
                Part,
            ],
            Self::Reduce(ReduceKernel::ArTwoshot | ReduceKernel::ReduceScatter, _) => {
                &[Src, Dst, Count, Op]
            }
            Self::Bytes(ByteKernel::AllGather | ByteKernel::Alltoall) => &[Src, Dst, Count],
            Self::Bytes(ByteKernel::Broadcast) => &[Src, Dst, Count, Root],
            Self::Bytes(ByteKernel::Alltoallv) => &[Src, Dst, Splits, Out, Count, SrcRows, DstRows],
            Self::Bytes(ByteKernel::TeamBarrier) => &[],
            Self::Bytes(ByteKernel::ExchangeLl) => {
                &[Src, Dst, Count, Mode, Root, PeerScratch, Scratch, SlotBytes]
            }
            Self::Bytes(ByteKernel::ExchangeLl128) => &[
                Src,
                Dst,
                Count,
                Mode,
                Root,
                PeerScratch,
                Scratch,
                LlOff,
                Part,
            ],
        }
    }
}

/// A field of [`CollArgs`] a positional argument fills.
#[derive(Debug, Clone, Copy)]
enum Param {
    Src,
    Dst,
    Count,
    Stride,
    Op,
    Mode,
    Root,
    PeerScratch,
    Scratch,
    SlotBytes,
    LlOff,
    Part,
    Splits,
    Out,
    SrcRows,
    DstRows,
}

impl CollArgs {
    /// The block for `kernel` from a positional argument list in the kernel's former parameter
    /// order: its own arguments ([`CollKernel::head`]: `U64` for addresses and sizes, `I32` for
    /// op, mode and root), then the team's 8 (bases, flags, peer_flags, ctl as `U64`, me and n
    /// as `I32`, timeout_ns and error as `U64`). Only for callers that still build such lists;
    /// an argument of the wrong count or kind is an error, not a launch.
    pub(crate) fn from_positional(kernel: CollKernel, args: &[Arg]) -> Result<CollArgs> {
        let head = kernel.head();
        let bad = |why: String| backend("collective", format!("{}: {why}", kernel.symbol()));
        if args.len() != head.len() + 8 {
            return Err(bad(format!(
                "{} arguments, expected {} and the team's 8",
                args.len(),
                head.len()
            )));
        }
        let word = |i: usize| match args[i] {
            Arg::U64(v) => Ok(v),
            a => Err(bad(format!("argument {i} is {a:?}, expected U64"))),
        };
        let int = |i: usize| match args[i] {
            Arg::I32(v) => Ok(v),
            a => Err(bad(format!("argument {i} is {a:?}, expected I32"))),
        };
        let mut a = CollArgs::default();
        for (i, param) in head.iter().enumerate() {
            match param {
                Param::Src => a.src = word(i)?,
                Param::Dst => a.dst = word(i)?,
                Param::Count => a.count = word(i)?,
                Param::Stride => a.stride = word(i)?,
                Param::Op => a.op = int(i)?,
                Param::Mode => a.mode = int(i)?,
                Param::Root => a.root = int(i)?,
                Param::PeerScratch => a.peer_scratch = word(i)?,
                Param::Scratch => a.scratch = word(i)?,
                Param::SlotBytes => a.slot_bytes = word(i)?,
                Param::LlOff => a.ll_off = word(i)?,
                Param::Part => a.part = word(i)?,
                Param::Splits => a.splits = word(i)?,
                Param::Out => a.out = word(i)?,
                Param::SrcRows => a.src_rows = word(i)?,
                Param::DstRows => a.dst_rows = word(i)?,
            }
        }
        let t = head.len();
        a.team = CollTeam {
            bases: word(t)?,
            flags: word(t + 1)?,
            peer_flags: word(t + 2)?,
            ctl: word(t + 3)?,
            me: int(t + 4)?,
            n: int(t + 5)?,
            timeout_ns: word(t + 6)?,
            error: word(t + 7)?,
        };
        Ok(a)
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
            assert_eq!(CollKernel::from_symbol(&k.symbol()), Some(*k));
        }
        assert_eq!(
            CollKernel::from_symbol("symheap_ar_ll128_bf16"),
            Some(CollKernel::Reduce(ReduceKernel::ArLl128, CollDType::BF16))
        );
        assert_eq!(
            CollKernel::from_symbol("symheap_exchange_ll128"),
            Some(CollKernel::Bytes(ByteKernel::ExchangeLl128))
        );
        for bad in [
            "",
            "symheap_ar_oneshot",
            "symheap_ar_oneshot_f64",
            "symheap_allgather_f32",
        ] {
            assert_eq!(CollKernel::from_symbol(bad), None, "{bad}");
        }
    }

    #[test]
    fn dtypes_are_the_reducing_kernels() {
        for d in CollDType::ALL {
            assert_eq!(CollDType::of(d.dtype()), Some(d));
        }
        assert_eq!(CollDType::of(DType::F64), None);
        assert_eq!(CollDType::of(DType::I64), None);
    }

    fn team_args() -> [Arg; 8] {
        [
            Arg::U64(0x100),
            Arg::U64(0x200),
            Arg::U64(0x300),
            Arg::U64(0x400),
            Arg::I32(1),
            Arg::I32(4),
            Arg::U64(5_000_000_000),
            Arg::U64(0x500),
        ]
    }

    #[test]
    fn positional_arguments_fill_their_fields() {
        let k = CollKernel::Reduce(ReduceKernel::ArLl128, CollDType::F16);
        let mut args = vec![
            Arg::U64(0xa0),
            Arg::U64(0xb0),
            Arg::U64(1000),
            Arg::U64(1000),
            Arg::I32(2),
            Arg::U64(0xc0),
            Arg::U64(0xd0),
            Arg::U64(4096),
            Arg::U64(8192),
        ];
        args.extend(team_args());
        let a = CollArgs::from_positional(k, &args).expect("valid");
        let want = CollArgs {
            src: 0xa0,
            dst: 0xb0,
            count: 1000,
            stride: 1000,
            op: 2,
            peer_scratch: 0xc0,
            scratch: 0xd0,
            ll_off: 4096,
            part: 8192,
            team: CollTeam {
                bases: 0x100,
                flags: 0x200,
                peer_flags: 0x300,
                ctl: 0x400,
                me: 1,
                n: 4,
                timeout_ns: 5_000_000_000,
                error: 0x500,
            },
            ..CollArgs::default()
        };
        assert_eq!(a, want);
        let b = CollKernel::Bytes(ByteKernel::Broadcast);
        let mut args = vec![Arg::U64(1), Arg::U64(2), Arg::U64(3), Arg::I32(3)];
        args.extend(team_args());
        let a = CollArgs::from_positional(b, &args).expect("valid");
        assert_eq!((a.src, a.dst, a.count, a.root, a.op), (1, 2, 3, 3, 0));
    }

    #[test]
    fn positional_arguments_of_the_wrong_shape_are_refused() {
        let k = CollKernel::Bytes(ByteKernel::AllGather);
        let mut args = vec![Arg::U64(1), Arg::U64(2), Arg::U64(3)];
        args.extend(team_args());
        assert!(CollArgs::from_positional(k, &args).is_ok());
        // One too few, one too many, an int where an address goes, an address where me goes.
        assert!(CollArgs::from_positional(k, &args[1..]).is_err());
        let mut more = args.clone();
        more.push(Arg::U64(0));
        assert!(CollArgs::from_positional(k, &more).is_err());
        let mut wrong = args.clone();
        wrong[1] = Arg::I32(2);
        let e = CollArgs::from_positional(k, &wrong).unwrap_err();
        assert!(e.to_string().contains("symheap_allgather"), "{e}");
        let mut wrong = args.clone();
        wrong[3 + 4] = Arg::U64(1);
        assert!(CollArgs::from_positional(k, &wrong).is_err());
    }
}
