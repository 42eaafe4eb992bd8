//! Element-wise reduction arithmetic on byte buffers of any supported dtype.
//!
//! Inputs are combined in the order given (rank order in the collectives), so every PE that
//! reduces the same chunk gets bit-identical results. Half-precision inputs accumulate in f32 and
//! round once at the end, which is at least as accurate as per-step rounding.

use half::{bf16, f16};

use crate::element::DType;

/// Reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Product (wrapping for integers).
    Prod,
}

impl ReduceOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Prod => "prod",
        }
    }

    /// Parses `sum`, `min`, `max`, `prod`.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sum" | "add" => Some(ReduceOp::Sum),
            "min" => Some(ReduceOp::Min),
            "max" => Some(ReduceOp::Max),
            "prod" | "product" | "mul" => Some(ReduceOp::Prod),
            _ => None,
        }
    }
}

/// Typed view of a byte slice: borrowed when aligned, copied otherwise (heap addresses are
/// aligned, so the copy only happens for odd host buffers).
fn typed<T: bytemuck::Pod>(b: &[u8]) -> std::borrow::Cow<'_, [T]> {
    match bytemuck::try_cast_slice(b) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(b)),
    }
}

/// Elements per step: the accumulator and output live on the stack, so no call allocates.
const BLOCK: usize = 1024;
/// The step for short vectors: initialising two [`BLOCK`]-element arrays (8 KiB of memset
/// for f32) was a third of an 8-byte all_reduce's time.
const SMALL_BLOCK: usize = 32;

/// Reduces with the accumulator type `A`: `load` widens an element, `store` narrows the result.
/// Each block folds one source at a time, which keeps the inner loops simple enough for the
/// compiler to vectorise.
fn fold<T: bytemuck::Pod, A: Copy + Default>(
    dst: &mut [u8],
    srcs: &[&[u8]],
    load: impl Fn(T) -> A,
    store: impl Fn(A) -> T,
    combine: impl Fn(A, A) -> A,
) {
    if dst.len() / std::mem::size_of::<T>() <= SMALL_BLOCK {
        fold_in::<T, A, SMALL_BLOCK>(dst, srcs, load, store, combine)
    } else {
        fold_in::<T, A, BLOCK>(dst, srcs, load, store, combine)
    }
}

/// `fold` in steps of `B` elements.
fn fold_in<T: bytemuck::Pod, A: Copy + Default, const B: usize>(
    dst: &mut [u8],
    srcs: &[&[u8]],
    load: impl Fn(T) -> A,
    store: impl Fn(A) -> T,
    combine: impl Fn(A, A) -> A,
) {
    let w = std::mem::size_of::<T>();
    let n = dst.len() / w;
    let mut acc = [A::default(); B];
    let mut out = [T::zeroed(); B];
    let mut i = 0;
    while i < n {
        let m = B.min(n - i);
        let range = i * w..(i + m) * w;
        let first = typed::<T>(&srcs[0][range.clone()]);
        for (a, &x) in acc[..m].iter_mut().zip(first.iter()) {
            *a = load(x);
        }
        for s in &srcs[1..] {
            let v = typed::<T>(&s[range.clone()]);
            for (a, &x) in acc[..m].iter_mut().zip(v.iter()) {
                *a = combine(*a, load(x));
            }
        }
        for (o, &a) in out[..m].iter_mut().zip(acc[..m].iter()) {
            *o = store(a);
        }
        dst[range].copy_from_slice(bytemuck::cast_slice(&out[..m]));
        i += m;
    }
}

macro_rules! int_reduce {
    ($t:ty, $dst:expr, $srcs:expr, $op:expr) => {
        match $op {
            ReduceOp::Sum => fold::<$t, $t>($dst, $srcs, |x| x, |x| x, |a, b| a.wrapping_add(b)),
            ReduceOp::Prod => fold::<$t, $t>($dst, $srcs, |x| x, |x| x, |a, b| a.wrapping_mul(b)),
            ReduceOp::Min => fold::<$t, $t>($dst, $srcs, |x| x, |x| x, |a, b| a.min(b)),
            ReduceOp::Max => fold::<$t, $t>($dst, $srcs, |x| x, |x| x, |a, b| a.max(b)),
        }
    };
}

macro_rules! float_reduce {
    ($t:ty, $acc:ty, $to:expr, $from:expr, $dst:expr, $srcs:expr, $op:expr) => {
        match $op {
            ReduceOp::Sum => fold::<$t, $acc>($dst, $srcs, $to, $from, |a, b| a + b),
            ReduceOp::Prod => fold::<$t, $acc>($dst, $srcs, $to, $from, |a, b| a * b),
            ReduceOp::Min => fold::<$t, $acc>($dst, $srcs, $to, $from, |a, b| a.min(b)),
            ReduceOp::Max => fold::<$t, $acc>($dst, $srcs, $to, $from, |a, b| a.max(b)),
        }
    };
}

/// `dst[i] = srcs[0][i] op srcs[1][i] op ...` for every element. `dst` may not alias a source
/// (the caller copies first when reducing in place). All slices have the same length, a
/// multiple of the element size.
pub fn reduce_bytes(dst: &mut [u8], srcs: &[&[u8]], dtype: DType, op: ReduceOp) {
    assert!(!srcs.is_empty(), "reduction over no inputs");
    debug_assert!(srcs.iter().all(|s| s.len() == dst.len()));
    match dtype {
        DType::U8 => int_reduce!(u8, dst, srcs, op),
        DType::I8 => int_reduce!(i8, dst, srcs, op),
        DType::U16 => int_reduce!(u16, dst, srcs, op),
        DType::I16 => int_reduce!(i16, dst, srcs, op),
        DType::U32 => int_reduce!(u32, dst, srcs, op),
        DType::I32 => int_reduce!(i32, dst, srcs, op),
        DType::U64 => int_reduce!(u64, dst, srcs, op),
        DType::I64 => int_reduce!(i64, dst, srcs, op),
        DType::F32 => float_reduce!(f32, f32, |x: f32| x, |x: f32| x, dst, srcs, op),
        DType::F64 => float_reduce!(f64, f64, |x: f64| x, |x: f64| x, dst, srcs, op),
        DType::F16 => float_reduce!(f16, f32, |x: f16| x.to_f32(), f16::from_f32, dst, srcs, op),
        DType::BF16 => float_reduce!(
            bf16,
            f32,
            |x: bf16| x.to_f32(),
            bf16::from_f32,
            dst,
            srcs,
            op
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_and_halves() {
        let a: Vec<u8> = [1i32, -5, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [2i32, 3, -9].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut d = vec![0u8; 12];
        reduce_bytes(&mut d, &[&a, &b], DType::I32, ReduceOp::Sum);
        let got: Vec<i32> = d
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![3, -2, -2]);
        reduce_bytes(&mut d, &[&a, &b], DType::I32, ReduceOp::Min);
        let got: Vec<i32> = d
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![1, -5, -9]);
        let h: Vec<u8> = [bf16::from_f32(1.5), bf16::from_f32(2.0)]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut d = vec![0u8; 4];
        reduce_bytes(&mut d, &[&h, &h, &h], DType::BF16, ReduceOp::Prod);
        assert_eq!(bf16::from_le_bytes([d[0], d[1]]).to_f32(), 3.375);
        assert_eq!(bf16::from_le_bytes([d[2], d[3]]).to_f32(), 8.0);
    }
}
