//! The argument blocks of the backend's stream kernels (kernels.cu: copy, signal, put with
//! signal, wait, barrier, atomic), mirrored by kernels.cu's `kern::*Args` structs and checked
//! against them when the program compiles (see `arg_block.rs`). Addresses are device addresses
//! (`u64`); the C side types them.

use super::arg_block::{arg_block, layout, ArgBlock, BlockLayout};

arg_block! {
    /// `symheap_copy`: `bytes` bytes from `src` to `dst`.
    pub struct CopyArgs as "kern::CopyArgs" {
        /// Destination (any direct PE's memory).
        pub dst: u64,
        /// Source.
        pub src: u64,
        /// Bytes to copy.
        pub bytes: u64,
    }
}

arg_block! {
    /// `symheap_signal`: a signal update released at system scope.
    pub struct SignalArgs as "kern::SignalArgs" {
        /// The signal word.
        pub sig: u64,
        /// The value to set or add.
        pub value: u64,
        /// 0 set, 1 add (another value: nothing).
        pub op: i32,
        /// Zero.
        pub reserved: i32,
    }
}

arg_block! {
    /// `symheap_put_signal`: a one-block copy, then the signal update.
    pub struct PutSignalArgs as "kern::PutSignalArgs" {
        /// Destination.
        pub dst: u64,
        /// Source.
        pub src: u64,
        /// Bytes to copy.
        pub bytes: u64,
        /// The signal word.
        pub sig: u64,
        /// The value to set or add.
        pub value: u64,
        /// 0 set, 1 add.
        pub op: i32,
        /// Zero.
        pub reserved: i32,
    }
}

arg_block! {
    /// `symheap_wait`: one thread waits until `*sig` compares `cmp` to `value`.
    pub struct WaitArgs as "kern::WaitArgs" {
        /// The signal word.
        pub sig: u64,
        /// The value compared with.
        pub value: u64,
        /// Bound on the wait (`%globaltimer` ns).
        pub timeout_ns: u64,
        /// Host-mapped word the kernel reports a timeout in.
        pub error: u64,
        /// `SYMHEAP_CMP_*` (symheap.cuh).
        pub cmp: i32,
        /// Zero.
        pub reserved: i32,
    }
}

arg_block! {
    /// `symheap_barrier`: one block, a barrier among `n` members.
    pub struct BarrierArgs as "kern::BarrierArgs" {
        /// My flag array, one word per member.
        pub flags: u64,
        /// Device array [n]: member j's flag array.
        pub peer_flags: u64,
        /// This PE's barrier counter (advanced by the kernel, so a graph replays correctly).
        pub epoch_ptr: u64,
        /// Bound on the wait (`%globaltimer` ns).
        pub timeout_ns: u64,
        /// Host-mapped word the kernel reports a timeout in.
        pub error: u64,
        /// My team index.
        pub me: i32,
        /// Team size.
        pub n: i32,
    }
}

arg_block! {
    /// `symheap_atomic`: one atomic at system scope on a 4- or 8-byte word.
    pub struct AtomicArgs as "kern::AtomicArgs" {
        /// The word.
        pub addr: u64,
        /// The operand.
        pub operand: u64,
        /// Compare-swap's expected value.
        pub compare: u64,
        /// Where the word's previous value is written.
        pub old_out: u64,
        /// 0 load, 1 store, 2 swap, 3 compare-swap, 4 add, 5 and, 6 or, 7 xor.
        pub op: i32,
        /// 4 or 8.
        pub width: i32,
    }
}

/// A block that exactly one kernel of kernels.cu takes: the kernel's symbol, tied to its block.
pub(super) trait OneKernel: ArgBlock {
    /// The kernel's `extern "C"` name.
    const SYMBOL: &'static str;
}

macro_rules! one_kernel {
    ($($block:ident => $symbol:literal),* $(,)?) => {
        $(impl OneKernel for $block {
            const SYMBOL: &'static str = $symbol;
        })*

        /// Every block kernels.cu declares, for its layout checks.
        pub(super) fn blocks() -> Vec<BlockLayout> {
            vec![$(layout::<$block>()),*]
        }

        /// kernels.cu's kernels: (symbol, the size of its argument block).
        pub(super) fn symbols() -> Vec<(&'static str, usize)> {
            vec![$(($symbol, std::mem::size_of::<$block>())),*]
        }
    };
}

one_kernel! {
    CopyArgs => "symheap_copy",
    SignalArgs => "symheap_signal",
    PutSignalArgs => "symheap_put_signal",
    WaitArgs => "symheap_wait",
    BarrierArgs => "symheap_barrier",
    AtomicArgs => "symheap_atomic",
}
