//! Remote atomics on symmetric memory: the OpenSHMEM matrix.
//!
//! fetch, set and swap on i32, u32, i64, u64, f32, f64; compare_swap, fetch_add, add,
//! fetch_inc, inc on the four integer types; and, or, xor and their fetch forms on u32 and u64.

use crate::backend::AtomicOp;
use crate::context::Context;
use crate::element::{DType, Element};
use crate::error::{invalid, Result};
use crate::ops::rma::elem_range;
use crate::SymmetricBuffer;

mod sealed {
    pub trait Sealed {}
}

/// Types the fetch/set/swap atomics work on.
pub trait AtomicElement: Element + sealed::Sealed {
    /// The value as the bits of a 4- or 8-byte word.
    fn to_bits(self) -> u64;
    /// The value from such bits.
    fn from_bits(b: u64) -> Self;
}

/// Integer types: compare_swap, add and increment.
pub trait AtomicInt: AtomicElement {}

/// Unsigned types: and, or, xor.
pub trait AtomicBitwise: AtomicInt {}

macro_rules! atomic_el {
    ($($t:ty => |$x:ident| $to:expr, |$b:ident| $from:expr);* $(;)?) => {$(
        impl sealed::Sealed for $t {}
        impl AtomicElement for $t {
            fn to_bits(self) -> u64 { let $x = self; $to }
            fn from_bits($b: u64) -> Self { $from }
        }
    )*};
}

atomic_el! {
    i32 => |x| x as u32 as u64, |b| b as u32 as i32;
    u32 => |x| x as u64, |b| b as u32;
    i64 => |x| x as u64, |b| b as i64;
    u64 => |x| x, |b| b;
    f32 => |x| x.to_bits() as u64, |b| f32::from_bits(b as u32);
    f64 => |x| x.to_bits(), |b| f64::from_bits(b);
}
impl AtomicInt for i32 {}
impl AtomicInt for u32 {}
impl AtomicInt for i64 {}
impl AtomicInt for u64 {}
impl AtomicBitwise for u32 {}
impl AtomicBitwise for u64 {}

/// Which dtypes an atomic accepts, for the untyped entry point.
fn check_dtype(op: AtomicOp, dtype: DType) -> std::result::Result<(), String> {
    let ints = matches!(dtype, DType::I32 | DType::U32 | DType::I64 | DType::U64);
    let ok = match op {
        AtomicOp::Load | AtomicOp::Store | AtomicOp::Swap => {
            ints || matches!(dtype, DType::F32 | DType::F64)
        }
        AtomicOp::CompareSwap | AtomicOp::Add => ints,
        AtomicOp::And | AtomicOp::Or | AtomicOp::Xor => matches!(dtype, DType::U32 | DType::U64),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("atomic {} is not defined on {dtype}", op.name()))
    }
}

/// Refuses operand or compare bits wider than a 4-byte word: they would be cut to the word
/// (a value that does not fit its dtype), not stored.
fn check_operand_bits(dtype: DType, operand: u64, compare: u64) -> std::result::Result<(), String> {
    if dtype.size() == 4 {
        for (what, bits) in [("operand", operand), ("compare value", compare)] {
            if bits > u64::from(u32::MAX) {
                return Err(format!(
                    "the atomic {what} bits {bits:#x} do not fit a 4-byte {dtype} word \
                     (at most 0xffffffff)"
                ));
            }
        }
    }
    Ok(())
}

impl Context {
    /// Untyped atomic on PE `pe`'s copy of the `dtype` word at `dest` (an address in this PE's
    /// heap): returns the old value's bits. `operand`/`compare` are the value's bits.
    pub fn atomic_op(
        &self,
        dest: u64,
        pe: usize,
        op: AtomicOp,
        dtype: DType,
        operand: u64,
        compare: u64,
    ) -> Result<u64> {
        const CALL: &str = "atomic";
        self.inner.check(CALL)?;
        check_dtype(op, dtype).map_err(|m| invalid(CALL, m).with_pe(self.my_pe()))?;
        check_operand_bits(dtype, operand, compare)
            .map_err(|m| invalid(CALL, m).with_pe(self.my_pe()))?;
        let w = dtype.size();
        self.inner.aligned(CALL, "atomic word", dest, dtype)?;
        let remote = self.inner.remote(dest, w as u64, pe, CALL)?;
        let old = self.inner.backend.atomic(remote, w, op, operand, compare)?;
        if op != AtomicOp::Load {
            self.inner.ring_data(pe);
        }
        Ok(old)
    }

    fn typed<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        pe: usize,
        op: AtomicOp,
        v: T,
        c: T,
    ) -> Result<T> {
        let at = elem_range::<T>(buf, index, 1, "atomic")?;
        self.atomic_op(at, pe, op, T::DTYPE, v.to_bits(), c.to_bits())
            .map(T::from_bits)
    }

    /// Reads PE `pe`'s element `index` of `buf` atomically.
    pub fn atomic_fetch<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::Load, T::zeroed(), T::zeroed())
    }

    /// Writes `value` atomically.
    pub fn atomic_set<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        self.typed(buf, index, pe, AtomicOp::Store, value, T::zeroed())
            .map(drop)
    }

    /// Writes `value`, returns the old value.
    pub fn atomic_swap<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::Swap, value, T::zeroed())
    }

    /// Writes `value` if the element equals `cond`; returns the old value either way.
    pub fn atomic_compare_swap<T: AtomicInt>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        cond: T,
        value: T,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::CompareSwap, value, cond)
    }

    /// Adds `value` (wrapping), returns the old value.
    pub fn atomic_fetch_add<T: AtomicInt>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::Add, value, T::zeroed())
    }

    /// Adds `value` (wrapping).
    pub fn atomic_add<T: AtomicInt>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_add(buf, index, value, pe).map(drop)
    }

    /// Adds one, returns the old value.
    pub fn atomic_fetch_inc<T: AtomicInt>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::Add, T::from_bits(1), T::zeroed())
    }

    /// Adds one.
    pub fn atomic_inc<T: AtomicInt>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_inc::<T>(buf, index, pe).map(drop)
    }

    /// Bitwise and, returns the old value.
    pub fn atomic_fetch_and<T: AtomicBitwise>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::And, value, T::zeroed())
    }

    /// Bitwise and.
    pub fn atomic_and<T: AtomicBitwise>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_and(buf, index, value, pe).map(drop)
    }

    /// Bitwise or, returns the old value.
    pub fn atomic_fetch_or<T: AtomicBitwise>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::Or, value, T::zeroed())
    }

    /// Bitwise or.
    pub fn atomic_or<T: AtomicBitwise>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_or(buf, index, value, pe).map(drop)
    }

    /// Bitwise xor, returns the old value.
    pub fn atomic_fetch_xor<T: AtomicBitwise>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        self.typed(buf, index, pe, AtomicOp::Xor, value, T::zeroed())
    }

    /// Bitwise xor.
    pub fn atomic_xor<T: AtomicBitwise>(
        &self,
        buf: &SymmetricBuffer,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_xor(buf, index, value, pe).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_matrix() {
        assert!(check_dtype(AtomicOp::Swap, DType::F64).is_ok());
        assert!(check_dtype(AtomicOp::Add, DType::F32).is_err());
        assert!(check_dtype(AtomicOp::Xor, DType::I64).is_err());
        assert!(check_dtype(AtomicOp::Xor, DType::U32).is_ok());
        assert!(check_dtype(AtomicOp::Load, DType::BF16).is_err());
        assert_eq!(i32::from_bits((-7i32).to_bits()), -7);
        assert_eq!(
            <f32 as AtomicElement>::from_bits(AtomicElement::to_bits(1.5f32)),
            1.5
        );
    }
}
